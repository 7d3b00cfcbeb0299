"""A kernel that declares `num_splits` uses the split count the batch asks for: the same
request at 1 and at 4 splits must both be right, and must not be the same bits (a kernel that
ignored the request would run one configuration twice; decode_conformance/scenarios.py,
"num-splits")."""
import pytest

from decode_conformance.plugin import conformance_failure


@pytest.mark.dc_scenario("num-splits")
def test_forced_split_count_is_honoured(dc_kernel, dc_case, dc_run):
    result = dc_run(dc_kernel, dc_case)
    if not result.ok:
        conformance_failure(result, dc_case)

"""Batch invariance: a request's output and LSE do not depend on the other requests in its
batch or on its position. The same request alone, first, last, and between two 0-length rows:
bitwise-identical rows for kernels that declare `batch_invariant`, rows within the per-row
error budget for the others (decode_conformance/scenarios.py, "batch-invariance")."""
import pytest

from decode_conformance.plugin import conformance_failure


@pytest.mark.dc_scenario("batch-invariance")
def test_request_is_independent_of_its_batch(dc_kernel, dc_case, dc_run):
    result = dc_run(dc_kernel, dc_case)
    if not result.ok:
        conformance_failure(result, dc_case)

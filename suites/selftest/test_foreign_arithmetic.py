"""The judge on arithmetic another team's kernel legitimately uses: the fp8 MLA decode of
sglang's Triton backend, emulated in torch from its source (suites/selftest/oot/toy_decode/
fp8_mla.py), on the two sglang_decode rows the H200 runs failed (docs/conformance-matrix.md,
triage). Both forms compute the declared `fp8-q-and-p` tier; only the rounding of q's rope
dims differs. The tier's torch computation rounds q over every dim, so on a few rows its own
error is, by chance, far below what rounding only the no-rope dims costs, and 3x it is not
enough: a correct computation judged wrong. Strict xfail until the tier's realizations
include the rope dims at q's precision."""
from __future__ import annotations

import pytest

from decode_conformance.case_sets import build_set
from decode_conformance.runner import run_case
from decode_conformance.scenarios import case_by_id

from suites.selftest import planted  # noqa: F401  (puts the out-of-tree package on sys.path)
from toy_decode import fp8_mla  # noqa: E402

SGLANG_ROWS = (  # built on the CPU: the same recipes as the GPU's, other random draws
    "determinism-e4m3-paged64-h128g128-d576v512-mla-B4[32769,7,16384,1]-s6",
    "e4m3-contig-h32g32-d288v256-mla-B2[131072,65537]-win131079-s1867245505",
)


def _case(case_id):
    found = case_by_id(case_id, "gpu")
    if found is not None:
        return found[1]
    return next(c for c in build_set("parity", "gpu") if c.id == case_id)


@pytest.mark.parametrize("case_id", SGLANG_ROWS)
def test_q_rounded_over_every_dim_passes_its_tier(case_id):
    res = run_case(fp8_mla.AllDims(), _case(case_id), "cpu")
    assert res.status == "passed", res.message


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="the fp8-q-and-p tier rounds q over every dim; sglang keeps the rope dims at q's precision "
                          "(docs/conformance-matrix.md, sglang_decode e4m3 MLA)")
@pytest.mark.parametrize("case_id", SGLANG_ROWS)
def test_rope_dims_at_q_precision_pass_their_tier(case_id):
    res = run_case(fp8_mla.RopeAtQ(), _case(case_id), "cpu")
    if res.status != "passed" and "over their error budget" not in res.message:
        pytest.fail(f"failed for another reason than the row budget: {res.message}")  # not the expected failure
    assert res.status == "passed", res.message

"""The judge on arithmetic other teams' kernels use by design, emulated in torch from their
source as out-of-tree kernels (suites/selftest/oot/toy_decode/: fp8_mla.py, tiled.py), on what the H200 runs showed
(docs/conformance-matrix.md, triage). Each is a correct computation of its own arithmetic that
today's tiers do not model; strict xfails until they do.

  fp8_mla     sglang's Triton MLA decode: q's no-rope dims rounded to fp8, the rope dims at q's
              precision. The `fp8-q-and-p` tier rounds q over every dim, so on a few rows its
              own error is by chance far below what sglang's rounding costs, and 3x it is not
              enough.
  RowSum*     flashinfer's fa2 kernel (tiled.py) (its tensor-core decode, its fa2 MLA): the softmax
              denominator summed from P cast to the query dtype. The outputs stay within
              budget; the LSE carries the rounding, up to the query dtype's unit roundoff, and
              the LSE budget models fp32 statistics."""
from __future__ import annotations

import pytest

from decode_conformance.case_sets import build_set
from decode_conformance.runner import run_case
from decode_conformance.scenarios import case_by_id

from suites.selftest import planted  # noqa: F401  (puts the out-of-tree package on sys.path)
from toy_decode import fp8_mla, tiled  # noqa: E402

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


# ---- flashinfer fa2: the row sum of rounded P ------------------------------------------------

UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}  # half an ulp at 1, relative


def _lse_cases():
    """bf16 / fp16 cases without MLA, soft-cap or sinks (what the toy declares), and not
    low-scores: there |LSE| ~ 5e5, where an fp32 LSE's own ulp (0.03) exceeds the roundoff."""
    return [c for c in build_set("parity", "interpreter") if c.kv_dtype in UNIT_ROUNDOFF and not c.mla
            and c.softcap is None and not c.sinks and c.data != "low-scores"][:12]


def test_rowsum_in_fp32_passes():
    for case in _lse_cases():
        res = run_case(tiled.RowSumInFp32(), case, "cpu")
        assert res.status == "passed", (case.id, res.message)


def test_rowsum_of_rounded_p_keeps_the_output_and_moves_the_lse_within_a_roundoff():
    """What the H200 run showed for flashinfer's tensor-core path, on the CPU: outputs within
    their budgets, LSEs off, each by at most the query dtype's unit roundoff (a sum of terms each
    rounded to it is off by at most that, relatively: that much in natural log)."""
    lse_failed = 0
    for case in _lse_cases():
        res = run_case(tiled.RowSumOfRounded(), case, "cpu")
        v = res.verdict
        assert v is not None and v.rows_over == 0 and v.nonfinite == 0, (case.id, res.message)
        assert v.lse_err <= UNIT_ROUNDOFF[case.kv_dtype], (case.id, v.lse_err)
        lse_failed += res.status != "passed"
    assert lse_failed > 0  # the rounding is visible to the LSE budget at all


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="no tier models a denominator summed from P rounded to the query dtype "
                          "(docs/conformance-matrix.md, flashinfer_decode_tc)")
def test_rowsum_of_rounded_p_passes_its_tier():
    for case in _lse_cases():
        res = run_case(tiled.RowSumOfRounded(), case, "cpu")
        assert res.status == "passed", (case.id, res.message)

"""GPU-class deselection: a kernel that runs fp8 MMAs skips fp8 cases on a class without fp8
tensor cores (sm_80) with a reason, and runs them on one that has them (sm_90)."""
from suites.selftest._subpytest import PARITY, run_pytest

from decode_conformance.case_sets import build_set

FP8_CASE = next(c.id for c in sorted(build_set("parity", "interpreter"), key=lambda c: c.total_keys)
                if c.is_fp8 and not c.mla)
BF16_CASE = next(c.id for c in sorted(build_set("parity", "interpreter"), key=lambda c: c.total_keys)
                 if c.kv_dtype == "bf16" and not c.mla)


def _run(gpu_class, tmp_path):
    return run_pytest(PARITY, "-rs", "--kernel=suites.selftest.faulty_kernels:fp8_mma", f"--gpu-class={gpu_class}",
                      f"--case-id={FP8_CASE}", f"--case-id={BF16_CASE}", report=tmp_path / "r")


def test_fp8_mma_kernel_is_deselected_on_sm80(tmp_path):
    r = _run("sm_80", tmp_path)
    status = {row["case"]: row["status"] for row in r.report["results"]}
    assert status == {FP8_CASE: "skipped", BF16_CASE: "passed"}, r.out[-2000:]
    assert "fp8_mma runs fp8 MMAs; class sm_80 has no fp8 tensor cores" in r.out


def test_fp8_mma_kernel_runs_on_sm90(tmp_path):
    r = _run("sm_90", tmp_path)
    status = {row["case"]: row["status"] for row in r.report["results"]}
    assert status == {FP8_CASE: "passed", BF16_CASE: "passed"}, r.out[-2000:]

"""Configuration mistakes are usage errors: reported once, before any case runs, naming what
was wrong and what was expected, with pytest's usage-error exit code (4). And a run that
tested nothing says so (and fails under --require-cases)."""
from __future__ import annotations

import pytest

from suites.selftest._subpytest import GOOD, PARITY, run_pytest, small_case_ids

USAGE = 4


def _usage(*args, **kw):
    run = run_pytest(PARITY, *args, **kw)
    assert run.rc == USAGE, f"exit code {run.rc}\n{run.out[-3000:]}"
    assert "passed" not in run.out and "failed" not in run.out.splitlines()[-1], "cases ran"
    return run.out


@pytest.mark.parametrize("spec,expected", [
    ("no_such_package.mod:k", "cannot import no_such_package.mod"),
    ("decode_conformance_kernels.registry:nope", "has no attribute 'nope'"),
    ("decode_conformance.cases:DTYPES", "names a dict, not a kernel"),
    ("decode_conformance_kernels", "expected 'package.module:object', or the bare name of a registered kernel"),
    ("lean2", "or the bare name of a registered kernel (--list-kernels without --kernel: ours, the adapters, "
              "entry points); did you mean 'lean'?"),
    ("sglang_decod", "did you mean 'sglang_decode'"),
])
def test_bad_kernel_spec(spec, expected):
    out = _usage(f"--kernel={spec}", "-n", "2")
    assert expected in out and out.count(expected) == 1, out[-2000:]  # once, not per worker or per case


def test_a_listed_kernel_name_is_a_spec():
    """A name --list-kernels prints is accepted bare: a registered kernel's (entry points) and an
    adapter's or opt-in kernel's of the shipped registry, which no default run includes; an unknown
    bare name is still the usage error above."""
    from decode_conformance.discovery import kernel_specs
    assert kernel_specs(["lean", "sglang_decode", "adaptive_split_graph"], env="") == [
        "decode_conformance_kernels.registry:lean", "decode_conformance_kernels.registry:sglang_decode",
        "decode_conformance_kernels.registry:adaptive_split_graph"]
    assert kernel_specs(["no_such_kernel"], env="") == ["no_such_kernel"]
    assert "decode_conformance_kernels.registry:sglang_decode" not in kernel_specs(env="")  # not in a default run


def test_kernel_may_be_a_class_a_factory_or_an_instance():
    """README's example names a class: it is instantiated, never planned as an instance."""
    cases = small_case_ids(1)
    run = run_pytest(PARITY, "-q", "--kernel=toy_decode:ToyDecode", "--kernel=suites.selftest.faulty_kernels:nan",
                     "--kernel=decode_conformance_kernels.registry:torch_gather",
                     *[f"--case-id={c}" for c in cases], env={"PYTHONPATH": "suites/selftest/oot"})
    assert run.rc == 1 and "1 failed, 2 passed" in run.out, run.out[-2000:]  # only faulty_nan fails


def test_malformed_ledger_names_file_and_line(tmp_path):
    bad = tmp_path / "ledger.toml"
    bad.write_text('[[entry]]\nkernel = "k"\ncase = "x*\n')
    out = _usage(f"--ledger={bad}")
    assert f"{bad}: not valid TOML" in out and "line 3" in out, out[-2000:]


def test_ledger_rule_names_file_line_and_field(tmp_path):
    bad = tmp_path / "ledger.toml"
    bad.write_text('# mine\n\n[[entry]]\nkernel = "k"\ncase = "x*"\nkind = "skip"\nreason = "r"\n'
                   'issue = "https://example.com/1"\n')
    out = _usage(f"--ledger={bad}")
    assert f"{bad}: entry 0 (line 3): field 'kind' must be one of ('xfail', 'quarantine'), got 'skip'" in out, out


def test_unknown_case_set_lists_the_valid_ones():
    out = _usage("--case-set=bogus", "-n", "2")
    assert "unknown case set 'bogus'; expected one of" in out and "parity" in out, out[-2000:]
    assert out.count("unknown case set") == 1


def test_unknown_case_id_suggests_the_nearest():
    real = small_case_ids(1)[0]
    typo = real[:-3] + "999"
    out = _usage(f"--case-id={typo}")
    assert f"{typo}: not in case set 'parity' (interpreter); nearest: {real}" in out, out[-2000:]


def test_gpu_profile_case_id_on_cpu_says_so():
    from decode_conformance.case_sets import build_set
    interp = {c.id for c in build_set("parity", "interpreter")}
    gpu_only = next(c.id for c in build_set("parity", "gpu") if c.id not in interp)
    out = _usage(f"--case-id={gpu_only}")
    assert f"{gpu_only}: a gpu-profile case" in out and "run it on a GPU" in out, out[-2000:]


def test_cuda_device_without_a_gpu():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = _usage("--device=cuda")
    assert "--device=cuda: this machine has no CUDA/ROCm GPU" in out


def test_without_xdist():
    case = small_case_ids(1)[0]
    run = run_pytest(PARITY, "-p", "no:xdist", "-q", f"--kernel={GOOD}", f"--case-id={case}")
    assert run.rc == 0 and "1 passed" in run.out and "INTERNALERROR" not in run.out, run.out[-2000:]


def test_broken_library_is_an_error_not_a_skip(tmp_path):
    """An installed library whose import raises (an ABI mismatch) must not read as 'not installed'."""
    pkg = tmp_path / "flashinfer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('undefined symbol: _ZN3c104cuda9SetDevice')\n")
    out = _usage("--kernel=decode_conformance_kernels.registry:flashinfer_decode",
                 env={"PYTHONPATH": str(tmp_path)})
    assert "flashinfer is installed but failed to import" in out and "undefined symbol" in out, out[-2000:]


def test_every_case_skipped_is_loud_and_fails_when_required(tmp_path):
    cases = [f"--case-id={c}" for c in small_case_ids(2)]
    cuda_only = "--kernel=suites.selftest.faulty_kernels:cuda_only"
    run = run_pytest(PARITY, "-q", cuda_only, *cases, report=tmp_path / "r")
    assert run.rc in (0, 5) and "EVERY parity case of kernel 'faulty_cuda_only' was skipped" in run.out, run.out[-2000:]
    assert "Every parity case of `faulty_cuda_only` was skipped" in run.md
    run = run_pytest(PARITY, "-q", cuda_only, *cases, "--require-cases")
    assert run.rc == 1, run.out[-2000:]

"""The suite as an adopter meets it: installed, not cloned.

- The wheel carries the library, the suites, the shipped kernels with their adapters and
  every data file; installed into a fresh virtual environment, it runs README's adopter path
  as written: the kernel module README shows, copied into an empty folder, and README's
  commands: green for the correct kernel, red for its planted bug, with reproduce lines in
  the `--pyargs` form the run used; the one-case command, the trace and fuzz commands and a slower perf cell likewise.
- Loading the plugin (its pytest11 entry point) changes nothing for unrelated tests.
- A kernel module imported before the plugin could switch on Triton's interpreter is a usage
  error, never a silently compiled run.

The fresh environment borrows torch, triton and pytest from this one through a .pth line
(installing a 700 MB torch again would only cost CI minutes); everything of ours comes from
the wheels.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import textwrap

import pytest

from decode_conformance.device_memory import SlotLock

from suites.selftest._subpytest import OOT, ROOT, paste

CLEAN_ENV = {k: v for k, v in os.environ.items()
             if not k.startswith(("PYTEST_", "DECODE_CONFORMANCE_", "TRITON_")) and k != "PYTHONPATH"}


def _run(cmd, cwd, env=None, timeout=600):
    e = dict(CLEAN_ENV)
    e.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)


def _building_in(src: pathlib.Path) -> SlotLock:
    """One wheel build at a time per source folder: setuptools builds in the folder itself
    (`build/`), and under xdist this module's tests may land on two workers that each build the
    module fixture at once; one then fails with "No such file or directory" as the other cleans up."""
    key = hashlib.sha256(str(src.resolve()).encode()).hexdigest()[:16]  # hash() differs between workers
    return SlotLock(pathlib.Path(tempfile.gettempdir()) / f"decode-conformance-build-{key}", slots=1)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    """A new venv with our two wheels installed (non-editable), dependencies borrowed."""
    tmp = tmp_path_factory.mktemp("installed")
    dist = tmp / "dist"
    for src in (ROOT, OOT):
        with _building_in(src):
            r = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                      str(dist), str(src)], cwd=tmp)
        assert r.returncode == 0, r.stdout + r.stderr
    venv = tmp / "venv"
    r = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    site = pathlib.Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             cwd=tmp).stdout.strip())
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheels = sorted(str(w) for w in dist.glob("*.whl"))
    assert len(wheels) == 2, wheels
    r = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
              *wheels], cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    empty = tmp / "adopter"
    empty.mkdir()
    return py, empty


def test_wheel_carries_the_data_and_the_suites(fresh_venv):
    py, empty = fresh_venv
    code = textwrap.dedent("""
        import importlib.util, decode_conformance, decode_conformance.resources as r
        assert "site-packages" in decode_conformance.__file__, decode_conformance.__file__
        for f in ("gpu_classes.toml", "perf_cells.toml", "perf_machine_spread.toml", "baselines/sm_90/lean.json",
                  "smoke_set.txt", "known_failures.toml",
                  "gates/lean_calibration.toml"):
            assert r.data_path(f).is_file(), f
        for m in ("decode_conformance.suites.parity.test_parity", "decode_conformance.suites.gates", "decode_conformance.perf.guard",
                  "decode_conformance.suites.perf", "decode_conformance_kernels.adapters.flashinfer_decode"):
            assert importlib.util.find_spec(m) is not None, m
        assert importlib.util.find_spec("decode_conformance.suites.selftest") is None, "self-tests are not shipped"
        print("ok")
    """)
    r = _run([str(py), "-c", code], cwd=empty)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_the_docs_the_messages_name_are_in_the_wheel(fresh_venv):
    """Capabilities' docstring, README and error messages name docs/kernel-contract.md and
    docs/ledger.md; an adopter with the wheel alone reads them through the guide."""
    py, empty = fresh_venv
    listed = _run([str(py), "-m", "decode_conformance.guide"], cwd=empty)
    assert listed.returncode == 0 and "kernel-contract" in listed.stdout and "ledger" in listed.stdout, listed.stdout
    contract = _run([str(py), "-m", "decode_conformance.guide", "docs/kernel-contract.md"], cwd=empty)
    assert contract.returncode == 0, contract.stderr
    assert contract.stdout == (ROOT / "docs" / "kernel-contract.md").read_text(), "the checkout's own text"
    assert "gpu-runs" not in listed.stdout, "the run records stay in the repository"


def _readme_adopter_module() -> str:
    """The kernel module README's "Run it on your kernel" shows, verbatim."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n# mypkg/conformance.py\n") + len("```python\n")
    return text[start:text.index("```", start)]


@pytest.fixture(scope="module")
def readme_folder(fresh_venv):
    py, empty = fresh_venv
    (empty / "mypkg").mkdir()
    (empty / "mypkg" / "__init__.py").write_text("")
    (empty / "mypkg" / "conformance.py").write_text(_readme_adopter_module())
    return py, empty


@pytest.mark.parametrize("kernel,green", [("MyDecode", True), ("MyDecodeDropsLastKey", False)])
def test_readme_adopter_path_from_an_empty_folder(readme_folder, kernel, green):
    py, folder = readme_folder
    spec = f"mypkg.conformance:{kernel}"
    assert f"--kernel={spec}" in (ROOT / "README.md").read_text(), "README runs this command"
    r = _run([str(py), "-m", "pytest", "--pyargs", "decode_conformance.suites.parity", f"--kernel={spec}",
              "--case-set=smoke", "-n", "2", "--require-cases", "-p", "no:cacheprovider",
              f"--conformance-report=report-{kernel}"], cwd=folder)
    out = r.stdout + r.stderr
    if green:
        assert r.returncode == 0, out[-3000:]
        assert "failed" not in out.splitlines()[-1], out[-2000:]
    else:
        assert r.returncode == 1, out[-3000:]
        assert ("reproduce: python -m pytest -p decode_conformance.plugin --pyargs "
                f"decode_conformance.suites.parity.test_parity::test_parity --kernel={spec}") in out, out[-3000:]
        assert "rows over their error budget" in out and "LSE over budget" in out
        # the first reproduce line, as printed, re-runs its one case (the -p names the plugin the
        # entry point has already loaded: loaded once, not twice)
        line = next(ln.split("reproduce: ", 1)[1] for ln in out.splitlines() if "reproduce: python -m pytest" in ln)
        again = _run([str(py)] + shlex.split(line)[1:] + ["-p", "no:cacheprovider"], cwd=folder)
        assert again.returncode == 1 and re.search(r"^=* ?1 failed in [\d.]+s", again.stdout.splitlines()[-1]), \
            again.stdout[-2000:] + again.stderr[-2000:]
    assert (folder / f"report-{kernel}.md").exists() and "decode-conformance report:" in out


def test_readme_one_case_command(readme_folder):
    py, folder = readme_folder
    from decode_conformance.case_sets import build_set
    case = min((c for c in build_set("parity", "interpreter") if min(c.seq_lens) >= 2 and not c.mla),
               key=lambda c: (c.total_keys, c.id)).id  # every request loses a key it needs
    r = _run([str(py), "-m", "decode_conformance.inspect", case, "--kernel=mypkg.conformance:MyDecodeDropsLastKey",
              "--save", "case.pt"], cwd=folder)
    assert r.returncode == 1 and "FAIL" in r.stdout and (folder / "case.pt").exists(), r.stdout + r.stderr
    r = _run([str(py), "-m", "decode_conformance.inspect", case, "--kernel=mypkg.conformance:MyDecode"], cwd=folder)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr


def test_trace_command_reproduce_lines_use_the_installed_suites(readme_folder):
    """The trace command's reproduce lines name the installed test module (an adopter's folder
    has no suites/), and the first re-runs its one case."""
    py, folder = readme_folder
    r = _run([str(py), "-m", "decode_conformance.trace", "run", "workloads/gqa_paged_decode_h4_kv2_d64_ps16.jsonl",
              "--kernel", "mypkg.conformance:MyDecodeDropsLastKey", "--out", "verdicts.jsonl"], cwd=folder)
    lines = [ln.split("reproduce: ", 1)[1] for ln in r.stdout.splitlines() if "reproduce: " in ln]
    assert r.returncode == 1 and len(lines) == 3, r.stdout[-3000:] + r.stderr[-3000:]
    assert all(" --pyargs decode_conformance.suites.parity.test_parity::test_parity " in ln for ln in lines), lines
    again = _run([str(py)] + shlex.split(lines[0])[1:] + ["-p", "no:cacheprovider"], cwd=folder)
    assert again.returncode == 1 and re.search(r"^=* ?1 failed in [\d.]+s", again.stdout.splitlines()[-1]), \
        again.stdout[-2000:] + again.stderr[-2000:]


def test_fuzz_command_search_line_uses_the_installed_suites(readme_folder):
    py, folder = readme_folder
    r = _run([str(py), "-m", "decode_conformance.fuzz", "--kernel", "mypkg.conformance:MyDecodeDropsLastKey",
              "--examples", "20"], cwd=folder)
    search = [ln.split("reproduce the search:", 1)[1].strip() for ln in r.stdout.splitlines()
              if "reproduce the search:" in ln]
    assert r.returncode == 1 and len(search) == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert " --pyargs decode_conformance.suites.parity.test_fuzz::test_fuzz " in search[0], search
    again = _run([str(py)] + shlex.split(search[0])[1:] + ["-p", "no:cacheprovider"], cwd=folder)
    assert again.returncode == 1 and re.search(r"^=* ?1 failed in [\d.]+s", again.stdout.splitlines()[-1]), \
        again.stdout[-2000:] + again.stderr[-2000:]


def test_perf_reproduce_line_uses_the_installed_suites(readme_folder):
    """A slower A/B cell (the fake timing source of the perf self-tests) prints its line in the
    --pyargs form, and the line re-runs that one cell."""
    import json
    py, folder = readme_folder
    slow = {"DECODE_CONFORMANCE_PERF_FAKE": json.dumps({"seed": 2, "slowdown": 0.05})}
    kernel = "decode_conformance_kernels.registry:torch_gather"
    r = _run([str(py), "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "decode_conformance.suites.perf",
              f"--kernel={kernel}", f"--perf-reference={kernel}", "--gpu-class=sm_90", "-k", "b1-128k"],
             cwd=folder, env=slow)
    # set: with CI set in the environment, pytest's short summary repeats the whole message
    lines = sorted({ln.split("reproduce: ", 1)[1] for ln in r.stdout.splitlines()
                    if ln.strip().startswith("reproduce: ")})
    assert r.returncode == 1 and len(lines) == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "--pyargs 'decode_conformance.suites.perf.test_perf::test_perf[torch_gather-b1-128k-32x8x128]'" in lines[0]
    assert lines[0].startswith("DECODE_CONFORMANCE_PERF_FAKE="), lines[0]  # the modelled timing, kept
    # pasted as it is, in a shell whose python is the adopter's environment's
    again = paste(lines[0], folder, CLEAN_ENV, python_dir=str(py.parent), timeout=600)
    assert again.returncode == 1 and re.search(r"^=* ?1 failed in [\d.]+s", again.stdout.splitlines()[-1]), \
        again.stdout[-2000:] + again.stderr[-2000:]


def test_perf_record_hint_runs_in_the_adopter_folder(readme_folder):
    """With no record of the adopter's kernel, the A/B run's "record one with:" line, pasted in
    the adopter's folder, records it into a folder of that repository (the installed package's
    records folder is refused for writing), and a run naming that folder then reads it."""
    import json
    py, folder = readme_folder
    fake = {"DECODE_CONFORMANCE_PERF_FAKE": json.dumps({"seed": 1})}
    spec = "mypkg.conformance:MyDecode"
    ab = [str(py), "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "decode_conformance.suites.perf",
          f"--kernel={spec}", f"--perf-reference={spec}", "-k", "b1-4k"]
    r = _run(ab, cwd=folder, env=fake)
    said = re.search(r"record one (.*?)with: (python -m pytest [^\n]+?)(?: \| |\n|$)", r.stdout)
    assert r.returncode == 0 and said, r.stdout[-3000:] + r.stderr[-3000:]
    # this run read the installed records: the line says the folder it writes is read only when named
    hint, command = said[1], said[2]
    assert "--perf-baseline-dir=perf-baselines" in hint, said[0]
    rec = _run([str(py)] + shlex.split(command)[1:] + ["-p", "no:cacheprovider"], cwd=folder, env=fake)
    records = list((folder / "perf-baselines").glob("*/my_decode.json"))
    assert rec.returncode == 0 and len(records) == 1, command + "\n" + rec.stdout[-3000:] + rec.stderr[-3000:]
    again = _run(ab + ["--perf-baseline-dir=perf-baselines", "-rA"], cwd=folder, env=fake)
    assert again.returncode == 0 and "no record" not in again.stdout, again.stdout[-3000:]


def test_plugin_leaves_unrelated_tests_alone(tmp_path):
    """Installed (its entry point loads it into every pytest run), the plugin must not set
    TRITON_INTERPRET, patch Triton or import any kernel in a run that is not a conformance run."""
    (tmp_path / "test_mine.py").write_text(textwrap.dedent("""
        import os, sys
        def test_nothing_leaked(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("decode_conformance.plugin")
            assert "TRITON_INTERPRET" not in os.environ
            leaked = [m for m in ("torch", "triton", "decode_conformance_kernels", "decode_conformance.interpreter_compat")
                      if m in sys.modules]
            assert not leaked, leaked
    """))
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark",
              "-p", "no:hypothesispytest", str(tmp_path)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_kernel_imported_before_the_interpreter_is_a_usage_error(tmp_path):
    pkg = tmp_path / "early_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import triton, triton.language as tl
        from toy_decode import ToyDecode

        @triton.jit
        def _noop(x):
            pass

        class Early(ToyDecode):
            name = "early"
    """))
    (tmp_path / "conftest.py").write_text("import early_kernel  # imports Triton kernels at collection start\n")
    r = _run([sys.executable, "-m", "pytest", "--pyargs", "decode_conformance.suites.parity",
              "--kernel=early_kernel:Early", "--device=cpu", "-p", "no:cacheprovider", "-q"], cwd=tmp_path,
             env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(OOT)])})
    out = r.stdout + r.stderr
    assert r.returncode == 4, out[-3000:]
    assert "before decode-conformance could switch on Triton's interpreter" in out and "early_kernel._noop" in out
    r = _run([sys.executable, "-m", "pytest", "--pyargs", "decode_conformance.suites.parity",
              "--kernel=early_kernel:Early", "--device=cpu", "-p", "no:cacheprovider", "-q",
              f"--case-id={_one_case()}"], cwd=tmp_path,
             env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(OOT)]), "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]  # set in the environment: fine


def _one_case() -> str:
    from suites.selftest._subpytest import small_case_ids
    return small_case_ids(1)[0]

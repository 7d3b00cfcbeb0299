"""The mistakes a new adopter makes, each stopped before any case with one message naming the
field and what was expected (pytest's usage-error exit code 4), and quickly: the checks that
need no torch run before torch is imported."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from suites.selftest._subpytest import GOOD, PARITY, ROOT, run_pytest

USAGE = 4


def _usage(*args, **kw):
    run = run_pytest(PARITY, *args, **kw)
    assert run.rc == USAGE, f"exit code {run.rc}\n{run.out[-3000:]}"
    assert "passed" not in run.out and "Traceback" not in run.out, run.out[-3000:]
    return run.out


@pytest.mark.parametrize("where", ["file", "dir-is-file", "proc"])
def test_unwritable_report_path_is_a_usage_error_before_any_case(tmp_path, where):
    """'proc': a place whose permission bits say writable to root (an adopter's container) but
    where nothing can be created; the check tries, rather than reading the bits."""
    blocker = tmp_path / "taken"
    blocker.write_text("a file where a directory is needed")
    if where == "file":
        path, expected = blocker / "sub" / "report", "is a file, not a directory"
    elif where == "dir-is-file":
        (tmp_path / "r.json").mkdir()
        path, expected = tmp_path / "r", "is a directory"
    else:
        if not pathlib.Path("/proc/self").is_dir():
            pytest.skip("no /proc here")
        path, expected = "/proc/nope/report", "cannot write in /proc/nope"
    out = _usage(f"--kernel={GOOD}", f"--conformance-report={path}")
    assert f"--conformance-report={path}" in out and expected in out, out[-2000:]


def test_writable_report_path_passes_the_check(tmp_path):
    """The other side: a path in a directory still to be created is fine (and written)."""
    from suites.selftest._subpytest import small_case_ids
    run = run_pytest(PARITY, f"--kernel={GOOD}", f"--case-id={small_case_ids(1)[0]}",
                     report=tmp_path / "new" / "dir" / "report")
    assert run.rc == 0 and run.report is not None, run.out[-2000:]


def test_bad_spec_in_the_environment_names_the_variable():
    out = _usage(env={"DECODE_CONFORMANCE_KERNELS": "no_such_package.mod:K"})
    assert "DECODE_CONFORMANCE_KERNELS: kernel spec 'no_such_package.mod:K'" in out, out[-2000:]
    assert "--kernel:" not in out
    out = _usage("--kernel=no_such_package.mod:K")
    assert "--kernel: kernel spec 'no_such_package.mod:K'" in out, out[-2000:]


def test_bad_capabilities_value_leads_with_the_field(tmp_path):
    (tmp_path / "bad_caps.py").write_text(
        "from decode_conformance import Capabilities\n"
        "class K:\n"
        "    name = 'k'\n"
        "    caps = Capabilities(layouts=frozenset({'page'}))\n"
        "    def plan(self, batch):\n"
        "        return lambda: None\n")
    out = _usage("--kernel=bad_caps:K", env={"PYTHONPATH": str(tmp_path)})
    first = next(ln for ln in out.splitlines() if "kernel spec" in ln)
    assert "Capabilities.layouts: expected a non-empty subset of ['contig', 'paged'], got ['page']" in first, out
    assert "bad_caps.py" in out, "the adopter's own line is shown"


def test_a_usage_error_does_not_import_torch():
    """Start-up: a mistyped kernel spec is reported before torch (seconds) is imported."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "pytest", "-p", "no:cacheprovider", PARITY,
                        "--kernel=no_such_package.mod:K"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == USAGE, p.stdout[-2000:]
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")}
    assert "decode_conformance.state" in imported, "the check ran"
    assert "torch" not in imported and "triton" not in imported, sorted(m for m in imported if "torch" in m)[:5]


@pytest.fixture
def adopter_package(tmp_path, monkeypatch):
    """An adopter's package with a kernel function and a kernel class that needs an argument."""
    pkg = tmp_path / "pagedattn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "conformance.py").write_text(
        "def paged_decode(q, k_cache, v_cache, block_table, seq_lens):\n"
        "    return q\n"
        "class PagedAttn:\n"
        "    def __init__(self, scale):\n"
        "        self.scale = scale\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for name in [m for m in sys.modules if m.split(".")[0] == "pagedattn"]:
        del sys.modules[name]


@pytest.mark.parametrize("spec,expected", [
    ("pagedattn.conformnce:PagedAttn",
     "cannot import pagedattn.conformnce: no module named 'pagedattn.conformnce'; pagedattn ({pkg}) has "
     "'conformance' - did you mean "
     "pagedattn.conformance?"),
    ("pagedattn.conformance:PagedAtn", "pagedattn.conformance has no attribute 'PagedAtn'; did you mean 'PagedAttn'?"),
    ("pagedattn.conformance:paged_decode",
     "names a callable that needs arguments (q, k_cache, v_cache, block_table, seq_lens): not a kernel"),
    ("pagedattn.conformance:PagedAttn", "names a class that needs arguments (scale): not a kernel"),
])
def test_a_near_miss_spec_names_what_is_there(adopter_package, spec, expected):
    """Before: importlib's own traceback frame for a misspelled module, no suggestion for a
    misspelled name, and 'calling the factory failed: TypeError ... missing 5 required positional
    arguments' for the kernel function itself."""
    from decode_conformance.kernel_api import KernelLoadError, load_kernel
    with pytest.raises(KernelLoadError) as info:
        load_kernel(spec)
    message = str(info.value)
    assert message.startswith(f"kernel spec {spec!r}: " + expected.format(pkg=adopter_package)), message
    assert "importlib" not in message and "Traceback" not in message, message


def test_an_unknown_capabilities_field_lists_the_fields(tmp_path):
    (tmp_path / "typo_caps.py").write_text(
        "from decode_conformance import Capabilities\n"
        "class K:\n"
        "    name = 'k'\n"
        "    caps = Capabilities(fp8=False, kv_dtype=frozenset({'bf16'}))\n"
        "    def plan(self, batch):\n"
        "        return lambda: None\n")
    out = _usage("--kernel=typo_caps:K", env={"PYTHONPATH": str(tmp_path)})
    assert "Capabilities: no field 'fp8', 'kv_dtype' (did you mean 'kv_dtypes'?); its fields: kv_dtypes, layouts," \
        in out, out[-2000:]
    assert "typo_caps.py" in out, "the adopter's own line is shown"


def test_a_kernel_declared_but_not_yet_installed_says_reinstall(tmp_path):
    """An adopter adds an entry point to their pyproject.toml and runs `--kernel=NAME` without
    reinstalling: entry points are written at install time, so the name is unknown. Before: only
    'did you mean' the other names."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "pagedattn"\nversion = "0"\n'
        '[project.entry-points."decode_conformance.kernels"]\n'
        'pagedattn = "pagedattn.conformance:PagedAttn"\n')
    out = _usage("--kernel=pagedattn", cwd=tmp_path)
    assert ("./pyproject.toml declares pagedattn = 'pagedattn.conformance:PagedAttn' in [project.entry-points."
            "\"decode_conformance.kernels\"], but the installed package does not register it yet: reinstall it "
            "(pip install -e .)") in out, out[-2000:]
    assert "reinstall" not in _usage("--kernel=pagedattn2")

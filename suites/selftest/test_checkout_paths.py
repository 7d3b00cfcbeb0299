"""A checkout tests its own kernels and data, never another copy's that happens to be importable.

The trap these guard, found by a contributor's run: with an editable install of one checkout,
`python -m pytest` in a second checkout imported the second one's library but the first one's
`kernels/` and `fixtures/` (the editable install's finder answers for those names), and its
`pytest` script imported the first one whole; both ran green on the wrong code.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from suites.selftest._subpytest import ROOT, child_env


def _python(code: str, pythonpath: list[pathlib.Path], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = child_env(PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def other_kernels(tmp_path) -> pathlib.Path:
    """Another, empty `decode_conformance_kernels` importable from the folder returned."""
    (tmp_path / "elsewhere" / "decode_conformance_kernels").mkdir(parents=True)
    (tmp_path / "elsewhere" / "decode_conformance_kernels" / "__init__.py").write_text("")
    return tmp_path / "elsewhere"


def test_the_checkout_kernels_win_over_another_importable_copy(tmp_path, other_kernels):
    code = ("from decode_conformance import _paths; _paths.alias_checkout()\n"
            "import decode_conformance_kernels, decode_conformance.fixtures as f\n"
            "print(decode_conformance_kernels.__file__); print(list(f.__path__)[0])")
    r = _python(code, [other_kernels, ROOT], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    kernels, fixtures = r.stdout.split()
    assert pathlib.Path(kernels).resolve() == (ROOT / "kernels" / "__init__.py").resolve(), r.stdout
    assert pathlib.Path(fixtures).resolve() == (ROOT / "fixtures").resolve(), r.stdout


def test_a_copy_imported_before_the_alias_is_named(tmp_path, other_kernels):
    code = ("import decode_conformance_kernels\n"
            "from decode_conformance import _paths; _paths.alias_checkout()")
    r = _python(code, [other_kernels, ROOT], cwd=tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    other = other_kernels / "decode_conformance_kernels"
    assert last.startswith("ImportError: decode_conformance_kernels was imported from ") and str(other) in last, r.stderr
    assert str(ROOT / "kernels") in last, r.stderr


def test_pytest_in_a_checkout_refuses_another_copys_library(tmp_path):
    """A checkout whose conftest finds decode_conformance imported from elsewhere stops with a
    usage error (exit 4) naming both places, instead of testing the other copy."""
    checkout = tmp_path / "second_checkout"
    (checkout / "kernels").mkdir(parents=True)
    shutil.copy(ROOT / "conftest.py", checkout / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    (checkout / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    code = "import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'test_nothing.py']))"
    r = _python(code, [ROOT], cwd=checkout)
    assert r.returncode == 4, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert f"this checkout is {checkout.resolve()}, but the decode_conformance this pytest imported is {ROOT / 'decode_conformance'}" in out, out

"""Run the suite's own pytest in a child process, for selftests of whole-run behaviour
(isolation, the ledger, --list-kernels). The child gets --device=cpu, no cache, and an
environment cleared of the variables that would leak the parent's run into it."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOOD = "decode_conformance_kernels.registry:torch_gather"
FAULTY = "suites.selftest.faulty_kernels"
PARITY = "suites/parity/test_parity.py"
OOT = ROOT / "suites" / "selftest" / "oot"  # the out-of-tree kernels: correct ones that are not ours

_LEAKY_ENV = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
              "PYTEST_CURRENT_TEST", "DECODE_CONFORMANCE_KERNELS", "DECODE_CONFORMANCE_LEDGER",
              "DECODE_CONFORMANCE_CASE_SET", "DECODE_CONFORMANCE_EXTRA_CASES")


@dataclass
class Run:
    rc: int
    out: str
    report: Optional[dict]
    md: str
    seconds: float

    def rows(self, test: str = "test_parity") -> list[dict]:
        """Report rows of one test function (other tests of the suite may add rows)."""
        rows = (self.report or {}).get("results", [])
        return [r for r in rows if r.get("test", "").endswith("::" + test)]


def faulty(name: str) -> str:
    return f"{FAULTY}:{name}"


def child_env(**extra: str) -> dict:
    """This process's environment without what would leak the running pytest into a child."""
    e = {k: v for k, v in os.environ.items() if k not in _LEAKY_ENV}
    e.update(extra)
    return e


def run_pytest(*args: str, report: Optional[pathlib.Path] = None, env: Optional[dict] = None,
               timeout: float = 300, cwd: pathlib.Path = ROOT) -> Run:
    import time
    e = child_env(**(env or {}))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--device=cpu", *args]
    if report is not None:
        cmd.append(f"--conformance-report={report}")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
    secs = time.perf_counter() - t0
    rep, md = None, ""
    if report is not None and report.with_suffix(".json").exists():
        rep = json.loads(report.with_suffix(".json").read_text())
        md = report.with_suffix(".md").read_text()
    return Run(rc=p.returncode, out=p.stdout + p.stderr, report=rep, md=md, seconds=secs)


def paste(line: str, cwd, env: dict, python_dir: Optional[str] = None, timeout: float = 300):
    """`line` (a printed reproduce line) run by a shell as pasted, with `python_dir`'s python
    (default: this one's) first on PATH."""
    python_dir = python_dir or os.path.dirname(sys.executable)
    path = os.pathsep.join([python_dir, env.get("PATH", os.environ.get("PATH", ""))])
    return subprocess.run(["bash", "-c", line + " -p no:cacheprovider"], cwd=cwd, env={**env, "PATH": path},
                          capture_output=True, text=True, timeout=timeout)


def small_case_ids(n: int = 2) -> list[str]:
    """The n parity cases (interpreter profile) with the fewest keys: cheap, and picked by
    property rather than by id so they follow changes to the case tables."""
    from decode_conformance.case_sets import build_set
    cases = [c for c in build_set("parity", "interpreter") if not c.mla]
    return [c.id for c in sorted(cases, key=lambda c: (c.total_keys, c.id))[:n]]

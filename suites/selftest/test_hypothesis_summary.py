"""A conformance run that never used hypothesis does not pay for its pytest plugin's terminal
summary (plugin.py, `_skip_idle_hypothesis_summary`): that summary imports the whole hypothesis
package (1.0-1.4 s a process on a 2-core CPU) in each xdist worker after its last test and again in the controller, to report
nothing. Where hypothesis was used the summary stays. Whole runs in a child process, with Python's
import log on stderr (xdist workers' stderr reaches the same output)."""
from __future__ import annotations

import pytest

from suites.selftest._subpytest import GOOD, PARITY, run_pytest, small_case_ids

pytest.importorskip("xdist")
pytest.importorskip("_hypothesis_pytestplugin")

IMPORT_LOG = {"PYTHONPROFILEIMPORTTIME": "1"}


def _imported(out: str, module: str) -> bool:
    return any(line.rstrip().endswith(f" {module}") for line in out.splitlines() if line.startswith("import time:"))


def test_a_run_without_hypothesis_never_imports_it():
    run = run_pytest(PARITY, "-n", "2", "--kernel", GOOD, "--case-id", small_case_ids(1)[0], env=IMPORT_LOG)
    assert run.rc == 0, run.out[-2000:]
    # the plugin's own import (pytest's assertion rewriter loads it, past the import log) brings this one
    assert _imported(run.out, "_hypothesis_globals"), "hypothesis's plugin was not loaded: nothing shown"
    assert not _imported(run.out, "hypothesis.internal.observability"), \
        "a process imported hypothesis for its terminal summary in a run that never used it"


def test_the_summary_stays_where_hypothesis_is_used():
    """--hypothesis-show-statistics has the plugin import hypothesis at configure: its section is printed."""
    run = run_pytest(PARITY, "-n", "2", "--kernel", GOOD, "--case-id", small_case_ids(1)[0],
                     "--hypothesis-show-statistics", env=IMPORT_LOG)
    assert run.rc == 0, run.out[-2000:]
    assert "Hypothesis Statistics" in run.out, run.out[-2000:]

"""Perf-regression guard: device time per kernel and perf cell (fixtures/perf_cells.toml)
against the stored baseline of this GPU class and kernel, with a per-cell threshold derived
from measured noise. GPU only; never under xdist. Design and threshold arithmetic:
decode_conformance/perf_guard.py and docs/perf-guard.md.

    pytest suites/perf                          # compare (a missing baseline is reported)
    pytest suites/perf --perf-require-baseline  # CI: a missing baseline fails
    pytest suites/perf --perf-record            # record this GPU class's baselines
    pytest --pyargs decode_conformance.suites.perf --kernel=pkg.mod:obj \\
           --perf-baseline-dir=perf-baselines [--perf-record | --perf-require-baseline]

Each kernel is measured once per run, all its cells interleaved (the first of its tests pays
for it); each test then reports one cell: fails on a slowdown beyond the cell's threshold,
reports speed-ups, and carries bytes moved, TB/s and the percentage of the read roofline.
The table at the end of the run lists every cell (suites/perf/conftest.py).
"""
import json
import os

import pytest

from decode_conformance import perf_guard

CELLS = perf_guard.load_cells()

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("PYTEST_XDIST_WORKER")),
    reason="the perf guard does not time under xdist (-n): workers would share the GPU and each other's "
           "noise; run suites/perf without -n")


@pytest.mark.parametrize("cell", [c.name for c in CELLS])
def test_perf(request, dc_kernel, cell, perf_run):
    v = perf_run.verdict(dc_kernel, cell)
    request.node.user_properties.append(("dc_result", json.dumps({"message": v.message, "verdict": v.to_dict()})))
    if v.status == "skipped":
        pytest.skip(v.message)
    if v.fail:
        pytest.fail(v.message, pytrace=False)
    if v.status == "no-baseline":
        pytest.skip(v.message)

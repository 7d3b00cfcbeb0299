"""Perf-regression guard: device time per kernel and perf cell (fixtures/perf_cells.toml),
timed through pytest-benchmark's `benchmark` fixture on a device-time clock, judged against a
reference kernel timed beside it (--perf-reference, A/B) or against the record of this GPU
class and kernel, with a per-cell threshold derived from measured noise. GPU only; never
under xdist. docs/perf-guard.md is the long form.

    pytest suites/perf                                   # compare with the records
    pytest suites/perf --perf-reference=base_pkg.mod:obj # A/B: the gate that holds on any runner
    pytest suites/perf --perf-record                     # record this GPU's records
    pytest suites/perf --benchmark-save=NAME | --benchmark-json=F | --benchmark-compare ...

Each kernel is measured once per run, all its cells interleaved (the first of its tests pays
for it); each test then hands its cell's device-time statistics to the `benchmark` fixture
and reports one verdict.
"""
import json
import os

import pytest

from decode_conformance.perf import bench, reproduce
from decode_conformance.perf.cells import load_cells

CELLS = load_cells()

pytestmark = [
    pytest.mark.skipif(bool(os.environ.get("PYTEST_XDIST_WORKER")),
                       reason="the perf guard does not time under xdist (-n): workers would share the GPU and each "
                              "other's noise; run suites/perf without -n"),
    pytest.mark.benchmark(timer=bench.CLOCK, disable_gc=True, warmup=False),
]


@pytest.mark.parametrize("cell", [c.name for c in CELLS])
def test_perf(request, dc_kernel, dc_state, cell, perf_run, benchmark):
    r = perf_run.result(dc_kernel, cell)
    repro = reproduce.command(request.node, dc_kernel.spec, dc_state) if r.fail else ""
    request.node.user_properties.append(("dc_result", json.dumps({"message": r.message, "verdict": r.to_dict(),
                                                                   "repro": repro})))
    if r.status == "skipped":
        pytest.skip(r.message)
    if r.values_us:
        bench.feed(benchmark, r.values_us, r.extra, group=dc_kernel.name)
    if r.fail:
        pytest.fail(f"{r.message}\n  reproduce: {repro}", pytrace=False)
    if r.status == "no-baseline":
        pytest.skip(r.message)

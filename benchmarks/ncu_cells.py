"""Launch kernels once each, eagerly, on cells of the peer table (benchmarks/sweep.py
target_cells), for Nsight Compute to read their hardware counters. Only the timed launch is
profiled: it runs between cudaProfilerStart and Stop, after a first launch that compiles and
plans, so ncu needs `--profile-from-start off`:

    ncu --profile-from-start off --clock-control none --nvtx --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats \\
        --section WarpStateStats --section LaunchStats \\
        python3 benchmarks/ncu_cells.py --cell b32-8k-32x8x128 --kernel dispatch --kernel flashinfer_decode_tc

Kernels are registry names, as the peer table's `--kernel` (its adapters included), and
`sdpa_dense`, the peer table's floor row. ncu's own cache control flushes the L2 between its
passes. Before each profiled launch a line `profile: CELL KERNEL` is printed, so the report
(every kernel of that launch: split-K's two stages, a library's merge kernel) can be read
against it; ncu prints its report after the program's own output, so each profiled launch is also
an NVTX range "CELL KERNEL", which `--nvtx` prints under every kernel of that launch. A kernel that
does not declare a cell is named and left out of it.
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()

from benchmarks.peer_table import _load  # noqa: E402
from benchmarks.sweep import target_cells  # noqa: E402
from decode_conformance.runner import prepare  # noqa: E402


@contextlib.contextmanager
def nvtx_range(label: str):
    """An NVTX range around the profiled launch (ncu --nvtx prints it under each kernel); a torch
    built without NVTX profiles the launch unnamed rather than failing the run."""
    try:
        torch.cuda.nvtx.range_push(label)
        named = True
    except RuntimeError:  # torch built without NVTX
        named = False
    try:  # outside the except: a failing launch's traceback is its own, not "during handling of"
        yield
    finally:
        if named:
            torch.cuda.nvtx.range_pop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", action="append", help="peer-table cell names (default: all)")
    ap.add_argument("--kernel", action="append", help="registry names or sdpa_dense (default: dispatch, sdpa_dense)")
    a = ap.parse_args(argv)
    cells = {c.name: c for c in target_cells()}
    unknown = sorted(set(a.cell or ()) - set(cells))
    if unknown:
        ap.error(f"--cell: unknown {unknown}; expected one of {sorted(cells)}")
    kernels = [_load(n) for n in (a.kernel or ["dispatch", "sdpa_dense"])]
    for name in a.cell or list(cells):
        case = cells[name].case
        for k in kernels:
            missing = k.caps.missing_for(case, "cuda")
            if missing:
                print(f"skip: {name} {k.name}: {'; '.join(missing)}", flush=True)
                continue
            batch = prepare(k, case, "cuda")
            launch = k.plan(batch)
            launch()  # compiles, plans, warms
            torch.cuda.synchronize()
            print(f"profile: {name} {k.name}", flush=True)
            torch.cuda.profiler.start()
            with nvtx_range(f"{name} {k.name}"):
                launch()
                torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            del batch, launch
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Launch the adaptive split-K kernel and torch SDPA (dense KV) once each, eagerly, on a few
cells of the kernel table (benchmarks/kernel_table.py), for Nsight Compute to read their hardware counters:

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section Occupancy --section WarpStateStats --section LaunchStats \\
        -k 'regex:adaptive|flash|fmha|attention|sdpa|cudnn' python3 benchmarks/ncu_cells.py

Each cell is launched twice (the first compiles); ncu's own cache control flushes the L2
between its passes. Prints which launch is which, in order, so the report can be read
against it.
"""
from __future__ import annotations

import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()

from decode_conformance.batch import Workspace  # noqa: E402
from decode_conformance_kernels import registry  # noqa: E402
from sweep import _case, dense_sdpa, shared_batch  # noqa: E402

K = 1024
CELLS = [((32, 8, 128), 1, 128 * K), ((16, 2, 256), 1, 128 * K), ((32, 8, 128), 16, 16 * K)]


def main():
    for shape, bsz, ctx in CELLS:
        case = _case(shape, [ctx] * bsz)
        batch = shared_batch(case)
        batch.workspace = Workspace(batch.device)
        launch = registry.adaptive_split().plan(batch)
        sdpa, _ = dense_sdpa(batch, batched=True)
        for name, fn in (("adaptive", launch), ("sdpa", sdpa)):
            for i in range(2):
                print(f"launch: {'/'.join(map(str, shape))} {bsz}x{ctx} {name} #{i}", flush=True)
                fn()
                torch.cuda.synchronize()
        del batch
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

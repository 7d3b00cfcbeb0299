"""Is a kernel's time a property of the kernel, or of the batch and of what ran before it?
Per cell: two preparations of the same case (A, then B, both alive); on each, adaptive split-K
and fixed-split timed in the order ad, fx, ad, fx (graph replay, L2 flushed, median of 20).

    python docs/gpu-runs/2026-12-01-h200/probe5/order.py > order.jsonl
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()
import torch  # noqa: E402

from decode_conformance import timing  # noqa: E402
from decode_conformance.batch import Workspace  # noqa: E402
from decode_conformance.runner import prepare  # noqa: E402
from decode_conformance_kernels import registry  # noqa: E402
from sweep import _case  # noqa: E402

K = 1024
CELLS = [((16, 2, 256), (64 * K,) * 16), ((32, 8, 128), (16 * K,) * 32), ((32, 8, 128), (128 * K,) * 4),
         ((32, 8, 128), (64 * K,) * 16), ((32, 8, 128), (128 * K,)), ((16, 2, 256), (128 * K,))]


def t(name, batch):
    batch.workspace = Workspace(batch.device)
    launch = getattr(registry, name)().plan(batch)
    return round(timing.graph_median_us(launch, "cuda", reps=20), 1)


for shape, lens in CELLS:
    case = _case(shape, lens)
    a = prepare(registry.adaptive_split(), case, "cuda")
    b = prepare(registry.adaptive_split(), case, "cuda")
    row = {"cell": f"{'/'.join(map(str, shape))} {len(lens)}x{lens[0]}"}
    for tag, batch in (("A", a), ("B", b)):
        row[tag] = [(n, t(n, batch)) for n in ("adaptive_split", "fixed_split", "adaptive_split", "fixed_split")]
    print(json.dumps(row), flush=True)
    del a, b
    torch.cuda.empty_cache()

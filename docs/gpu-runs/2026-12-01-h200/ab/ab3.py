"""One-off: programs per SM 4 vs 5 vs 6 for 4-warp programs (32/8/128), adapter path, and stage-1 occupancy."""
import json, sys, pathlib
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent)); sys.path.insert(0, str(HERE))
from decode_conformance import _paths
_paths.alias_checkout()
import torch
from decode_conformance import timing
from decode_conformance.runner import prepare
from decode_conformance_kernels import adaptive_split as new, registry, split_rule
from sweep import _case
K = 1024
for shape, b, ctx in [((32, 8, 128), 16, 64 * K), ((32, 8, 128), 32, 16 * K), ((32, 8, 128), 4, 128 * K),
                      ((32, 8, 128), 1, 128 * K), ((32, 8, 128), 1, 32 * K), ((32, 8, 128), 16, 16 * K),
                      ((32, 8, 128), 32, 1 * K), ((32, 8, 128), 4, 16 * K)]:
    case = _case(shape, [ctx] * b)
    row = {"cell": f"{shape} {b}x{ctx}"}
    batch = prepare(registry.adaptive_split(), case, "cuda")
    row["fixed"] = round(timing.graph_median_us(registry.fixed_split().plan(batch), "cuda", reps=20), 1)
    batch.workspace.buffers.clear()
    for pps in (4, 5, 6, 4):
        split_rule.PROGRAMS_PER_SM = pps
        batch.workspace.buffers.clear()
        launch = registry.adaptive_split().plan(batch)
        row[f"pps{pps}" + ("b" if f"pps{pps}" in row else "")] = round(timing.graph_median_us(launch, "cuda", reps=20), 1)
    split_rule.PROGRAMS_PER_SM = 4
    print(json.dumps(row), flush=True)
    del batch; torch.cuda.empty_cache()

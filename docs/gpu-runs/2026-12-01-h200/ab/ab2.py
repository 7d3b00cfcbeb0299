"""One-off: adapter path vs direct call vs old kernel on one batch (sweep harness)."""
import json, sys, pathlib
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent)); sys.path.insert(0, str(HERE))
from decode_conformance import _paths
_paths.alias_checkout()
import torch
from decode_conformance import timing
from decode_conformance.runner import prepare
from decode_conformance_kernels import adaptive_split as new, registry
from _old_kernels import adaptive_split as old
from sweep import _case
K = 1024
for shape, b, ctx in [((32, 8, 128), 16, 64 * K), ((32, 8, 128), 32, 16 * K), ((32, 8, 128), 1, 128 * K)]:
    case = _case(shape, [ctx] * b)
    row = {"cell": f"{shape} {b}x{ctx}"}
    for rep in range(2):
        kern = registry.adaptive_split()
        batch = prepare(kern, case, "cuda")
        launch = kern.plan(batch)
        row[f"adapter{rep}"] = round(timing.graph_median_us(launch, "cuda", reps=20), 1)
        args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)
        row[f"direct{rep}"] = round(timing.graph_median_us(lambda: new.decode_attention_adaptive(
            *args, sm_scale=case.sm_scale, lse=batch.lse, max_visible=ctx), "cuda", reps=20), 1)
        row[f"old{rep}"] = round(timing.graph_median_us(lambda: old.decode_attention_adaptive(
            *args, sm_scale=case.sm_scale, lse=batch.lse), "cuda", reps=20), 1)
        row[f"fixed{rep}"] = round(timing.graph_median_us(registry.fixed_split().plan(batch), "cuda", reps=20), 1)
        del batch, launch; torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)

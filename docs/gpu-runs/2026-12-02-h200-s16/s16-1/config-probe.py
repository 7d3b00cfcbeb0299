"""Device probe: launch configs and formulations of the e4m3 path on the perf cell b4-32k (and bf16 beside it)."""
import json, sys, time, pathlib
sys.path.insert(0, ".")
from decode_conformance import _paths
_paths.alias_checkout()
import torch
from decode_conformance.perf import timing
from decode_conformance.perf.cells import load_cells
from decode_conformance.runner import prepare
from decode_conformance_kernels import registry
from decode_conformance_kernels.adaptive_split import decode_attention_adaptive, plan_splits, chunk_axis, workspace_shapes
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
cells = {c.name: c for c in load_cells()}
names = ["b4-32k-e4m3-32x8x128", "b32-8k-32x8x128", "b1-128k-32x8x128", "b8-32k-mla"]
CFGS = [None, (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 3), (128, 8, 3), (128, 8, 2), (128, 4, 2), (32, 4, 3), (32, 4, 5), (64, 4, 5), (256, 8, 2), (64, 8, 4)]
MLA_CFGS = [None, (32, 8, 3), (64, 8, 2), (16, 8, 3), (32, 8, 2), (32, 4, 3), (64, 8, 3), (16, 4, 3)]
rows = []
deadline = time.time() + float(sys.argv[2] if len(sys.argv) > 2 else 150)
print("read TB/s", timing.read_bandwidth_tbs(), flush=True)
QUICK = __import__("os").environ.get("PROBE_QUICK")
for name in names:
    cell = cells[name]
    case = cell.case
    k = registry.adaptive_split()
    batch = prepare(k, case, "cuda")
    args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)
    ref = None
    for fp8mma in ([False, True] if "e4m3" in name else [False]):
        for cfg in ([None] if QUICK else (MLA_CFGS if "mla" in name else CFGS)):
            if time.time() > deadline: break
            kw = dict(sm_scale=case.sm_scale, lse=batch.lse, k_scale=getattr(batch, "k_scale", 1.0) or 1.0,
                      v_scale=getattr(batch, "v_scale", 1.0) or 1.0, fp8_mma=fp8mma)
            if cfg: kw.update(block_n=cfg[0], num_warps=cfg[1], num_stages=cfg[2])
            row = dict(cell=name, cfg=cfg, fp8_mma=fp8mma)
            try:
                fn = lambda: decode_attention_adaptive(*args, **kw)
                fn(); torch.cuda.synchronize()
                o = batch.out.float().clone()
                if ref is None: ref = o
                row["cos"] = float(torch.nn.functional.cosine_similarity(o.flatten(), ref.flatten(), dim=0))
                row["us"] = timing.graph_median_us(fn, "cuda", reps=30)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(row, flush=True); rows.append(row)
    del batch; torch.cuda.empty_cache()
(out / "fp8probe.json").write_text(json.dumps(rows, indent=1))

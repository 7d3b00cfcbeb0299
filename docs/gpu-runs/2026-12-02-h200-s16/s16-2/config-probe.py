"""Device probe: launch configs of the adaptive kernel on e4m3 and MLA cells."""
import json, sys, time, pathlib, os
sys.path.insert(0, ".")
from decode_conformance import _paths
_paths.alias_checkout()
import torch
from decode_conformance.perf import timing
from decode_conformance.cases import Case
from decode_conformance.runner import prepare
from decode_conformance_kernels import registry
from decode_conformance_kernels.adaptive_split import decode_attention_adaptive
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
deadline = time.time() + float(sys.argv[2])
K = 1024
def case(hq, hkv, d, lens, dt="bf16", dv=None):
    return Case(kv_dtype=dt, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, v_head_dim=dv, mla=dv is not None,
                seq_lens=tuple(lens), layout="paged", page_size=16, seed=7)
FP8 = [None, (64, 4, 5), (64, 4, 6), (64, 4, 7), (32, 4, 8), (128, 4, 3), (128, 4, 4), (64, 8, 6)]
MLA = [None, (64, 8, 2), (64, 8, 3), (64, 4, 2), (32, 8, 4)]
FP8W = [None, (64, 8, 5), (64, 8, 6), (32, 4, 6), (128, 8, 3), (32, 8, 6)]
cells = [("e4m3 32x8x128 b4-32k", case(32, 8, 128, [32 * K] * 4, "e4m3"), FP8, [False, True]),
         ("e4m3 32x8x128 b1-128k", case(32, 8, 128, [128 * K], "e4m3"), FP8, [False]),
         ("e4m3 32x8x128 b32-8k", case(32, 8, 128, [8 * K] * 32, "e4m3"), FP8, [False]),
         ("e4m3 32x8x128 b1-4k", case(32, 8, 128, [4 * K], "e4m3"), FP8, [False]),
         ("e4m3 16x2x256 b1-32k", case(16, 2, 256, [32 * K], "e4m3"), FP8W, [False]),
         ("mla b8-32k", case(128, 1, 576, [32 * K] * 8, "bf16", 512), MLA, [False]),
         ("mla b1-16k", case(128, 1, 576, [16 * K], "bf16", 512), MLA, [False]),
         ("mla b32-8k", case(128, 1, 576, [8 * K] * 32, "bf16", 512), MLA, [False]),
         ("mla b8-4k", case(128, 1, 576, [4 * K] * 8, "bf16", 512), MLA, [False]),
         ("mla e4m3 b8-32k", case(128, 1, 576, [32 * K] * 8, "e4m3", 512), MLA, [False])]
rows = []
for name, c, cfgs, modes in cells:
    batch = prepare(registry.adaptive_split(), c, "cuda")
    args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)
    ref = None
    for fp8mma in modes:
        for cfg in cfgs:
            if time.time() > deadline: break
            kw = dict(sm_scale=c.sm_scale, lse=batch.lse, k_scale=batch.k_scale, v_scale=batch.v_scale, fp8_mma=fp8mma)
            if cfg: kw.update(block_n=cfg[0], num_warps=cfg[1], num_stages=cfg[2])
            row = dict(cell=name, cfg=cfg, fp8_mma=fp8mma)
            try:
                fn = lambda: decode_attention_adaptive(*args, **kw)
                fn(); torch.cuda.synchronize()
                o = batch.out.float().clone()
                ref = o if ref is None else ref
                row["cos"] = float(torch.nn.functional.cosine_similarity(o.flatten(), ref.flatten(), dim=0))
                row["us"] = round(timing.graph_median_us(fn, "cuda", reps=30), 1)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(row, flush=True); rows.append(row)
    del batch; torch.cuda.empty_cache()
(out / "cfgprobe.json").write_text(json.dumps(rows, indent=1))

"""One-off: why 32/8/128 batched long cells got slower (old = 3e41a79's kernels)."""
import json, sys, pathlib, statistics
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent)); sys.path.insert(0, str(HERE))
from decode_conformance import _paths
_paths.alias_checkout()
import torch
from decode_conformance import timing
from decode_conformance.metrics import cosine
from decode_conformance.runner import prepare
from decode_conformance_kernels import adaptive_split as new, registry
from decode_conformance_kernels import triton_common as ntc
from _old_kernels import adaptive_split as old
from sweep import _case

class NoLaunch:
    def __getitem__(self, g): return lambda *a, **k: None

K = 1024
CELLS = [((32, 8, 128), 16, 64 * K), ((32, 8, 128), 4, 128 * K), ((32, 8, 128), 32, 16 * K), ((32, 8, 128), 1, 128 * K),
         ((16, 2, 256), 32, 4 * K)]
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
rows = []
for shape, b, ctx in CELLS:
    case = _case(shape, [ctx] * b)
    kern = registry.adaptive_split()
    batch = prepare(kern, case, "cuda")
    args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)
    base = dict(sm_scale=case.sm_scale, lse=batch.lse)
    row = dict(cell=f"{shape} {b}x{ctx}")
    var = {"old": (old, {}, False), "old_s1": (old, {}, True), "new": (new, dict(max_visible=ctx), False),
           "new_s1": (new, dict(max_visible=ctx), True), "new_S64": (new, dict(max_visible=ctx, splits=64), False),
           "new_nobound": (new, {}, False), "new_slices1": (new, dict(max_visible=ctx, stage2_slices=1), False),
           "new_nosmall": (new, dict(max_visible=ctx, _nosmall=True), False)}
    ref = None
    for name, (mod, kw, s1) in var.items():
        kw = dict(kw)
        nosmall = kw.pop("_nosmall", False)
        saved2, savedsm = mod._adaptive_stage2, ntc.STAGE2_SMALL_TILE
        try:
            if s1: mod._adaptive_stage2 = NoLaunch()
            if nosmall: ntc.STAGE2_SMALL_TILE = 1024
            fn = lambda: mod.decode_attention_adaptive(*args, **base, **kw)
            row[name] = round(timing.graph_median_us(fn, "cuda", reps=20), 1)
            if not s1:
                fn(); torch.cuda.synchronize()
                if ref is None: ref = batch.out.float().clone()
                else: row[name + "_cos"] = round(float(cosine(batch.out.float(), ref)), 6)
        except Exception as e:
            row[name + "_err"] = repr(e)[:200]
        finally:
            mod._adaptive_stage2, ntc.STAGE2_SMALL_TILE = saved2, savedsm
    print(json.dumps(row), flush=True); rows.append(row)
    del batch; torch.cuda.empty_cache()
meta = {}
for tag, fn in (("old", old._adaptive_stage1), ("new", new._adaptive_stage1)):
    ks = []
    for cache in fn.device_caches.values():
        for c in cache[0].values():
            ks.append(dict(regs=c.n_regs, spills=c.n_spills, smem=c.metadata.shared, warps=c.metadata.num_warps,
                           stages=c.metadata.num_stages))
    meta[tag] = ks
print(json.dumps(meta))
(out / "regress.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))

"""The split rule's programs per SM for e4m3 32/8/128 (stage 1 at 168 registers: 3 fit an SM by
registers) against the 5 it assumes: the adaptive kernel through its adapter, interleaved."""
import json, sys, pathlib
sys.path.insert(0, str(pathlib.Path("benchmarks").resolve())); sys.path.insert(0, ".")
import sweep  # noqa  (aliases the checkout)
import torch
from decode_conformance.perf import timing
from decode_conformance.batch import Workspace
from decode_conformance.cases import Case
from decode_conformance.metrics import cosine
from decode_conformance.runner import prepare
from decode_conformance_kernels import registry, split_rule as sr
out = pathlib.Path(sys.argv[1]); rows = []
cells = [("e4m3", 1, 131072), ("e4m3", 1, 32768), ("e4m3", 4, 32768), ("e4m3", 4, 131072), ("e4m3", 16, 8192),
         ("e4m3", 32, 8192), ("e4m3", 64, 2048), ("bf16", 4, 32768), ("bf16", 32, 8192)]
timing.set_bench_flush("read")
for dt, b, ctx in cells:
    case = Case(kv_dtype=dt, num_q_heads=32, num_kv_heads=8, head_dim=128, seq_lens=(ctx,) * b, layout="paged",
                page_size=16, seed=7)
    batch = prepare(registry.adaptive_split(), case, "cuda")
    res = {p: [] for p in (5, 4, 3)}; outs = {}
    for rnd in range(3):
        for p in res:
            sr.PROGRAMS_PER_SM = p
            batch.workspace = Workspace(batch.device)
            launch = registry.adaptive_split().plan(batch)
            res[p].append(timing.graph_median_us(launch, "cuda", reps=30))
            if rnd == 0:
                batch.repoison_outputs(); launch(); torch.cuda.synchronize(); outs[p] = batch.out.clone()
    sr.PROGRAMS_PER_SM = 5
    row = dict(kv=dt, batch=b, ctx=ctx, **{f"pps{p}_us": sorted(v)[1] for p, v in res.items()},
               **{f"cos{p}": float(cosine(outs[p], outs[5])) for p in (4, 3)})
    rows.append(row); print(json.dumps(row), flush=True)
(out / "pps.json").write_text(json.dumps(rows, indent=1))
with open(out / "pps.md", "w") as f:
    f.write("| kv | B x ctx | pps 5 (us) | pps 4 | pps 3 | 3 vs 5 |\n|---|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r['kv']} | {r['batch']} x {r['ctx']} | {r['pps5_us']:.1f} | {r['pps4_us']:.1f} | {r['pps3_us']:.1f} | {(r['pps3_us']/r['pps5_us']-1)*100:+.1f} % |\n")

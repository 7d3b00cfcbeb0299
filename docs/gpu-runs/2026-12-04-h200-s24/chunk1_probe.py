"""b32-8k's merge: adaptive_split at its rule's chunk count against fewer chunks (max_splits 1: no
stage 2) and a 128-key block, one process, interleaved rounds, CUDA-graph replay after the read flush."""
import json, sys, pathlib
sys.path.insert(0, str(pathlib.Path("benchmarks").resolve())); sys.path.insert(0, ".")
import sweep  # noqa
import torch
from decode_conformance.perf import timing
from decode_conformance.batch import Workspace
from decode_conformance.metrics import cosine
from decode_conformance.runner import prepare
from decode_conformance_kernels import adaptive_split as ad

out = pathlib.Path(sys.argv[1]); rows = []
timing.set_bench_flush("read")
want = ["b32-8k-32x8x128", "b32-8k-16x2x256", "b64-2k-32x8x128", "b4-32k-32x8x128"]
cells = {c.name: c for c in sweep.target_cells(False)}
variants = {"rule": {}, "s1": dict(max_splits=1), "s2": dict(max_splits=2), "s1-b128": dict(max_splits=1, block_n=128),
            "s3": dict(max_splits=3)}
for name in want:
    case = cells[name].case
    kerns = {v: ad.AdaptiveSplitKernel(**kw) for v, kw in variants.items()}
    batch = prepare(kerns["rule"], case, "cuda")
    res = {v: [] for v in kerns}; outs = {}
    for rnd in range(3):
        for v, k in kerns.items():
            batch.workspace = Workspace(batch.device)
            try:
                launch = k.plan(batch)
                res[v].append(timing.graph_median_us(launch, "cuda", reps=30))
                if rnd == 0:
                    batch.repoison_outputs(); launch(); torch.cuda.synchronize(); outs[v] = batch.out.clone()
            except Exception as e:
                res[v].append(float("nan")); print(name, v, repr(e)[:300], flush=True)
    row = dict(cell=name, us={v: sorted(r)[1] for v, r in res.items()}, rounds=res,
               cos={v: float(cosine(o, outs["rule"])) for v, o in outs.items()})
    rows.append(row); print(json.dumps(row), flush=True)
(out / "chunk1.json").write_text(json.dumps(rows, indent=1))
with open(out / "chunk1.md", "w") as f:
    f.write("| cell | " + " | ".join(variants) + " |\n|---|" + "---|" * len(variants) + "\n")
    for r in rows:
        base = r["us"]["rule"]
        f.write(f"| {r['cell']} | " + " | ".join(f"{r['us'][v]:.1f} ({(r['us'][v] / base - 1) * 100:+.1f} %)" for v in variants) + " |\n")

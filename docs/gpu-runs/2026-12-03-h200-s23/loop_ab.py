"""The chunk axis sized for the planned lengths (programs loop over chunks past it; the tree in
.carry/newtree) against main's budget-sized axis, through each tree's own adapter, one process,
rounds interleaved old / new, CUDA-graph replay after the suite's read flush. Also: registers of
every compiled stage-1 variant of each tree, and a skewed replay of a uniform plan (looping path)."""
import importlib.util, json, sys, pathlib
sys.path.insert(0, str(pathlib.Path("benchmarks").resolve())); sys.path.insert(0, ".")
import sweep  # noqa  (aliases the checkout)
import torch
from decode_conformance.perf import timing
from decode_conformance.batch import Workspace
from decode_conformance.metrics import cosine
from decode_conformance.runner import prepare
from decode_conformance_kernels import registry as old_reg, adaptive_split as old_ad

spec = importlib.util.spec_from_file_location("kernels_new", ".carry/newtree/kernels/__init__.py",
                                              submodule_search_locations=[".carry/newtree/kernels"])
kn = importlib.util.module_from_spec(spec); sys.modules["kernels_new"] = kn; spec.loader.exec_module(kn)
import kernels_new.registry as new_reg, kernels_new.adaptive_split as new_ad  # noqa

out = pathlib.Path(sys.argv[1]); rows = []
timing.set_bench_flush("read")
cells = sweep.target_cells(False)
for cell in cells:
    case = cell.case
    res = {"old": [], "new": []}; outs = {}
    for kname in ("adaptive_split", "dispatch"):
        kern = {"old": getattr(old_reg, kname)(), "new": getattr(new_reg, kname)()}
        try:
            batch = prepare(kern["old"], case, "cuda")
        except Exception as e:
            print("skip", cell.name, kname, repr(e)[:200], flush=True); continue
        res = {"old": [], "new": []}
        for rnd in range(3):
            for tree in ("old", "new"):
                batch.workspace = Workspace(batch.device)
                launch = kern[tree].plan(batch)
                res[tree].append(timing.graph_median_us(launch, "cuda", reps=30))
                if rnd == 0:
                    batch.repoison_outputs(); launch(); torch.cuda.synchronize(); outs[tree] = batch.out.clone()
        row = dict(cell=cell.name, kernel=kname, old_us=sorted(res["old"])[1], new_us=sorted(res["new"])[1],
                   rounds=res, cos_new_old=float(cosine(outs["new"], outs["old"])))
        rows.append(row); print(json.dumps(row), flush=True)


def regs(fn):
    found = []
    for v in getattr(fn, "device_caches", {}).values():
        cache = v[0] if isinstance(v, tuple) else v
        for k in (cache.values() if hasattr(cache, "values") else []):
            found.append((getattr(k, "n_regs", None), getattr(k, "n_spills", None),
                          getattr(getattr(k, "metadata", None), "num_warps", None),
                          getattr(getattr(k, "metadata", None), "num_stages", None)))
    return sorted(found, key=str)


reg = {"old": regs(old_ad._adaptive_stage1), "new": regs(new_ad._adaptive_stage1)}
(out / "loop_ab.json").write_text(json.dumps(dict(rows=rows, regs=reg), indent=1))
with open(out / "loop_ab.md", "w") as f:
    f.write("| cell | kernel | old us | new us | new vs old | cos |\n|---|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r['cell']} | {r['kernel']} | {r['old_us']:.1f} | {r['new_us']:.1f} | "
                f"{(r['new_us'] / r['old_us'] - 1) * 100:+.1f} % | {r['cos_new_old']:.6f} |\n")
    f.write(f"\nstage-1 variants (n_regs, n_spills, warps, stages): old {reg['old']}\n\nnew {reg['new']}\n")

"""The split rule of this commit (fp8 programs per SM 3; a one-chunk count in part of one wave
raised to the first count up to 4 filling >= 90 %) against the rule before it (5 per SM for every
16-bit-or-fp8 4-warp program; one chunk always stays one), through the adaptive adapter, one
process, rounds interleaved old / new. Only the host-side counts differ (the device code is one)."""
import json, sys, pathlib
sys.path.insert(0, str(pathlib.Path("benchmarks").resolve())); sys.path.insert(0, ".")
import sweep  # noqa  (aliases the checkout)
import torch
from decode_conformance.perf import timing
from decode_conformance.batch import Workspace
from decode_conformance.cases import Case
from decode_conformance.metrics import cosine
from decode_conformance.runner import prepare
from decode_conformance_kernels import registry, split_rule as sr, adaptive_split as ad

NEW_SHAPE, NEW_OCC = sr.launch_shape, sr.occupancy_splits


def old_shape(head_dim, mla, kv_bytes=2):
    return NEW_SHAPE(head_dim, mla, 2)


def old_occ(batch, tiles, sms, cap=sr.MAX_SPLITS, pps=sr.PROGRAMS_PER_SM):
    floor_count = max(1, min(cap, pps * sms // (batch * tiles)))
    return floor_count if floor_count < 2 else NEW_OCC(batch, tiles, sms, cap, pps)


def use(rule):
    sr.launch_shape, sr.occupancy_splits = (NEW_SHAPE, NEW_OCC) if rule == "new" else (old_shape, old_occ)


RAGGED16 = (1600, 65536, 4096, 32768, 2048, 48000, 8192, 16384, 24576, 1700, 40000, 60000, 12000, 30000, 57000, 28144)
G = dict(num_q_heads=32, num_kv_heads=8, head_dim=128)
W = dict(num_q_heads=16, num_kv_heads=2, head_dim=256)
M = dict(num_q_heads=128, num_kv_heads=1, head_dim=576, v_head_dim=512, mla=True)
CELLS = [("e4m3", G, (131072,)), ("e4m3", G, (32768,)), ("e4m3", G, (4096,)), ("e4m3", G, (32768,) * 4),
         ("e4m3", G, (131072,) * 4), ("e4m3", G, (32768,) * 8), ("e4m3", G, (8192,) * 16), ("e4m3", G, (8192,) * 32),
         ("e4m3", G, (2048,) * 64), ("e4m3", G, RAGGED16), ("e5m2", G, (32768,) * 4), ("e5m2", G, (8192,) * 32),
         ("bf16", G, (2048,) * 56), ("bf16", G, (8192,) * 56), ("bf16", G, (4096,) * 52), ("bf16", G, (2048,) * 80),
         ("bf16", G, (2048,) * 64), ("bf16", W, (2048,) * 90), ("bf16", W, (8192,) * 120), ("bf16", M, (4096,) * 48),
         ("e4m3", W, (32768,) * 4)]
out = pathlib.Path(sys.argv[1]); rows = []
timing.set_bench_flush("read")
for dt, shape, lens in CELLS:
    case = Case(kv_dtype=dt, seq_lens=lens, layout="paged", page_size=16, seed=7, **shape)
    kernel = registry.adaptive_split()
    batch = prepare(kernel, case, "cuda")
    kvb = batch.k_cache.element_size()
    counts = {}
    for rule in ("old", "new"):
        use(rule)
        counts[rule] = ad.plan_splits(len(lens), case.num_q_heads, case.num_kv_heads, device="cuda", mla=case.mla,
                                      head_dim=case.head_dim, kv_bytes=kvb)
    res = {"old": [], "new": []}; outs = {}
    for rnd in range(3):
        for rule in res:
            use(rule)
            batch.workspace = Workspace(batch.device)
            launch = kernel.plan(batch)
            res[rule].append(timing.graph_median_us(launch, "cuda", reps=30))
            if rnd == 0:
                batch.repoison_outputs(); launch(); torch.cuda.synchronize(); outs[rule] = batch.out.clone()
    use("new")
    name = f"{dt} {case.num_q_heads}/{case.num_kv_heads}/{case.head_dim} " + (
        f"{len(lens)} x {lens[0]}" if len(set(lens)) == 1 else f"ragged {len(lens)}")
    row = dict(cell=name, old_grid_occ=counts["old"], new_grid_occ=counts["new"],
               old_us=sorted(res["old"])[1], new_us=sorted(res["new"])[1], rounds=res,
               cos_new_old=float(cosine(outs["new"], outs["old"])))
    rows.append(row); print(json.dumps(row), flush=True)
(out / "rule_ab.json").write_text(json.dumps(rows, indent=1))
with open(out / "rule_ab.md", "w") as f:
    f.write("| cell | (budget, occupancy) old | new | old us | new us | new vs old |\n|---|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r['cell']} | {tuple(r['old_grid_occ'])} | {tuple(r['new_grid_occ'])} | {r['old_us']:.1f} | "
                f"{r['new_us']:.1f} | {(r['new_us'] / r['old_us'] - 1) * 100:+.1f} % |\n")

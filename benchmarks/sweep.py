"""Kernel-time sweeps on a GPU: CUDA-graph replay with the L2 flushed (--flush), median of repeats.

    python benchmarks/sweep.py split --out results/   # adaptive split-K vs fixed-split vs SDPA, uniform lengths
    python benchmarks/sweep.py lean  --out results/   # Lean vs adaptive split-K, uniform and ragged batches
    python benchmarks/sweep.py chunks --out results/  # the split rule's chunk count vs exact counts and wider blocks
    python benchmarks/sweep.py chunks --dry-run       # no GPU: the cells, variants and the chunk counts each launches

Writes <out>/<sweep>.json (every cell, with versions and the measured copy bandwidth) and
<out>/<sweep>.md (the table). Each kernel output is checked against torch SDPA (or the
other kernel) on the same inputs before it is timed: a fast wrong kernel is not a result.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()

from decode_conformance.perf import timing  # noqa: E402
from decode_conformance.batch import Workspace  # noqa: E402
from decode_conformance.cases import Case  # noqa: E402
from decode_conformance.metrics import cosine  # noqa: E402
from decode_conformance.runner import prepare  # noqa: E402
from decode_conformance_kernels import registry, split_rule  # noqa: E402

SPLIT_SHAPES = [(32, 8, 128), (16, 2, 256)]
SPLIT_BATCHES = [1, 4, 16, 32]
SPLIT_CTX = [1024, 4096, 16384, 65536, 131072]
MLA = (128, 1, 576, 512)
MLA_BATCHES = [1, 8, 32]

# The chunks sweep: batches whose stage-1 programs per chunk are a large share of a wave, where
# the rule's count is small and often decided by its wave-fill raise (`split_rule.occupancy_splits`).
CHUNK_SHAPES = [(32, 8, 128), (16, 2, 256)]
CHUNK_BATCHES = [8, 16, 24, 32, 48, 64, 96, 128]
CHUNK_CTX = [2048, 4096, 8192, 16384, 32768]
CHUNK_MAX_KEYS = 2 ** 19  # batch x ctx per cell: 2 GiB of bf16 K/V at 32/8/128
CHUNK_COUNTS = (1, 2, 3, 4, 5, 6, 8)
# One and two chunks again with 128-key blocks, at head dims up to 128 (s24-7, 32/8/128 b32-8k:
# one chunk of 64-key blocks ran 12 % slower than the rule, of 128-key blocks 6 % faster; at
# 16/2/256 the 128-key block ran 1.8x the rule).
CHUNK_WIDE_BLOCK = 128
# 4 as well since s27-1 (32/8/128): 128-key blocks beat 64-key ones at the same count at batch 8-24
# (c1, c2), and batch 8 has no count of them near two programs per SM without it.
CHUNK_WIDE_COUNTS = (1, 2, 4)

LEAN_SHAPES = [(32, 8, 128), (28, 4, 128)]
LEAN_BATCHES = [1, 8, 16, 32]
LEAN_CTX = [16384, 65536, 131072]
LEAN_RATIOS = [1.0, 0.5, 0.1]


def _case(shape, lens, seed=7) -> Case:
    hq, hkv, d = shape[:3]
    mla = len(shape) == 4
    return Case(kv_dtype="bf16", num_q_heads=hq, num_kv_heads=hkv, head_dim=d, v_head_dim=shape[3] if mla else None,
                mla=mla, seq_lens=tuple(lens), layout="paged", page_size=16, seed=seed)


def add_flush_option(ap: argparse.ArgumentParser) -> None:
    """--flush: the L2 flush before each replay (timing.set_bench_flush)."""
    ap.add_argument("--flush", choices=timing.FLUSH_MODES, default="read",
                    help="L2 flush before each replay: read (clean lines; the perf guard's) or zero (a memset: "
                         "dirty lines the timed kernel writes back; the records before the option)")


TARGET_CELLS = ROOT / "benchmarks" / "target_cells.toml"


def target_cells(guard_only: bool = False) -> list:
    """The perf guard's cells (fixtures/perf_cells.toml) and then the speed targets' other cells
    (benchmarks/target_cells.toml): every cell the peer table and the kernel table time. A name
    in both files is an error naming it."""
    from decode_conformance.perf.cells import load_cells
    cells = load_cells() + ([] if guard_only else load_cells(TARGET_CELLS))
    seen = set()
    for c in cells:
        if c.name in seen:
            raise ValueError(f"{TARGET_CELLS}: cell {c.name!r} is already a perf-guard cell (fixtures/perf_cells.toml)")
        seen.add(c.name)
    return cells


def shared_batch(case, device="cuda"):
    """One prepared batch per cell, shared by every kernel timed on it (kernels compared on the
    same inputs at the same addresses; `timing.warm_up` covers the idle GPU's slow first
    replays that once looked like a difference between preparations)."""
    return prepare(registry.adaptive_split(), case, device)


def time_on_batch(name, batch, reps):
    """`name`'s median time on the shared batch, and the output of one more launch after the
    outputs are re-poisoned (a copy)."""
    batch.workspace = Workspace(batch.device)  # each kernel plans its own scratch
    launch = getattr(registry, name)().plan(batch)
    us = timing.graph_median_us(launch, "cuda", reps=reps)
    batch.repoison_outputs()
    launch()
    torch.cuda.synchronize()
    return us, batch.out.clone()


def dense_sdpa(batch, out=None, batched=None):
    """torch SDPA on dense, contiguous [Hkv, L, D] copies of each request's keys, made here, not in
    the launch: attention without the cost of paging. batched: one call for the whole batch
    (requests of one length only), else one call per request (a padded batch would read more
    than the floor); None: batched when every request has the same length. A request with no
    key is zeroed. Returns (launch, out): out [B, Hq, Dv] (allocated when not given) is what
    the launch writes."""
    lens, indptr = batch.seq_lens_host, batch.kv_indptr.tolist()
    out = torch.empty_like(batch.out) if out is None else out
    uniform = len(set(lens)) == 1 and lens[0] > 0
    if batched is None:
        batched = uniform
    if batched and not uniform:
        raise ValueError(f"dense_sdpa: batched needs requests of one length > 0, got {sorted(set(lens))}")

    def dense(slots_of, b):
        return slots_of[batch.kv_indices[indptr[b]:indptr[b + 1]].long()].transpose(0, 1).contiguous()

    if batched:
        k = torch.stack([dense(batch.k_slots(), b) for b in range(len(lens))])
        v = torch.stack([dense(batch.v_slots(), b) for b in range(len(lens))])
        q = batch.q[:, :, None, :].contiguous()

        def launch():
            out.copy_(F.scaled_dot_product_attention(q, k, v, scale=batch.sm_scale, enable_gqa=True)[:, :, 0])
        return launch, out
    # 4-D per request, [1, H, L, D], as the batched call: SDPA's fused backends take 4-D inputs
    kv = {b: (batch.q[b:b + 1, :, None, :].contiguous(), dense(batch.k_slots(), b)[None],
              dense(batch.v_slots(), b)[None]) for b, L in enumerate(lens) if L > 0}

    def launch():
        for b in range(len(lens)):
            if b in kv:
                out[b] = F.scaled_dot_product_attention(*kv[b], scale=batch.sm_scale, enable_gqa=True)[0, :, 0]
            else:
                out[b].zero_()
    return launch, out


def _measure_cells(cells, deadline, describe, measure):
    """One row per cell: `describe(cell)` gives the row's labels and the case, `measure(cell,
    case)` the timed fields. A cell that runs out of GPU memory is recorded as such and the
    sweep goes on; past the deadline no new cell starts, so a cut sweep still writes its rows."""
    rows = []
    for cell in cells:
        if time.time() > deadline:
            print(f"deadline reached: {len(rows)} of {len(cells)} cells measured", flush=True)
            break
        row, case = describe(cell)
        try:
            row.update(measure(cell, case))
        except torch.cuda.OutOfMemoryError as e:
            row["error"] = f"OOM: {e}"[:200]
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    return rows


def split_sweep(reps, tbs, quick=False, deadline=float("inf")):
    cells = [(s, b, c) for s in SPLIT_SHAPES for b in SPLIT_BATCHES for c in SPLIT_CTX]
    cells += [(MLA, b, c) for b in MLA_BATCHES for c in SPLIT_CTX]
    if quick:
        cells = cells[::7]

    def describe(cell):
        shape, bsz, ctx = cell
        mla = len(shape) == 4
        floor = timing.kv_floor_us(bsz, ctx, shape[1], shape[2], 2, tbs, v_head_dim=0 if mla else None)
        return ({"shape": "/".join(map(str, shape)), "batch": bsz, "ctx": ctx, "floor_us": floor},
                _case(shape, [ctx] * bsz))

    def measure(cell, case):
        batch = shared_batch(case)
        ad_us, ad_out = time_on_batch("adaptive_split", batch, reps)
        fx_us, fx_out = time_on_batch("fixed_split", batch, reps)
        sd_launch, sd_out = dense_sdpa(batch, batched=True)
        sd_us = timing.graph_median_us(sd_launch, "cuda", reps=reps)
        sd_launch()
        torch.cuda.synchronize()
        return dict(adaptive_us=ad_us, fixed_us=fx_us, sdpa_us=sd_us,
                    cos_adaptive=cosine(ad_out, sd_out), cos_fixed=cosine(fx_out, sd_out))
    return _measure_cells(cells, deadline, describe, measure)


def _ragged_lens(bsz, ctx, ratio, seed):
    g = torch.Generator().manual_seed(seed)
    lo = max(1, int(ratio * ctx))
    return torch.randint(lo, ctx + 1, (bsz,), generator=g).tolist() if ratio < 1.0 else [ctx] * bsz


def lean_sweep(reps, tbs, quick=False, deadline=float("inf")):
    shapes = LEAN_SHAPES + [MLA]
    cells = [(s, b, c, r) for s in shapes for b in LEAN_BATCHES for c in LEAN_CTX for r in LEAN_RATIOS]
    # the target cells (ragged, batch >= 16) first, so a deadline cuts the least important
    cells.sort(key=lambda x: (not (x[1] >= 16 and x[3] < 1.0), x[0] == MLA))
    if quick:
        cells = cells[::9]

    def describe(cell):
        shape, bsz, ctx, ratio = cell
        lens = _ragged_lens(bsz, ctx, ratio, seed=1000 * bsz + ctx % 997 + int(ratio * 10))
        return ({"shape": "/".join(map(str, shape)), "batch": bsz, "ctx": ctx, "ratio": ratio,
                 "mean_len": sum(lens) / len(lens), "max_len": max(lens)}, _case(shape, lens))

    def measure(cell, case):
        batch = shared_batch(case)
        ln_us, ln_out = time_on_batch("lean", batch, reps)
        ad_us, ad_out = time_on_batch("adaptive_split", batch, reps)
        return dict(lean_us=ln_us, adaptive_us=ad_us, speedup=ad_us / ln_us, cos=cosine(ln_out, ad_out))
    return _measure_cells(cells, deadline, describe, measure)


def ForcedChunks(chunks: int, block_n=None):
    """`adaptive_split` with the rule bypassed (`AdaptiveSplitKernel(chunks=...)`): every request
    cut into exactly `chunks` chunks, `block_n` keys per step."""
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    return AdaptiveSplitKernel(chunks=chunks, block_n=block_n)


def chunk_cells(quick: bool = False, only=None) -> list:
    """The sweep's (shape, batch, ctx) cells; `only`: `Hq/Hkv/D` or `Hq/Hkv/D:batch` filters (a cut
    sweep's next call resumes where it stopped). A filter's batch need not be one of CHUNK_BATCHES:
    `32/8/128:40` sweeps batch 40 of that shape (a rule's boundary between two listed batches)."""
    wanted = [_parse_cell_filter(f) for f in only] if only else []
    batches = sorted(set(CHUNK_BATCHES) | {b for s, b in wanted if b is not None and s in CHUNK_SHAPES})
    cells = [(s, b, c) for s in CHUNK_SHAPES for b in batches for c in CHUNK_CTX if b * c <= CHUNK_MAX_KEYS]
    if only:
        cells = [(s, b, c) for s, b, c in cells if any(s == fs and fb in (None, b) for fs, fb in wanted)]
        if not cells:
            raise SystemExit(f"--only {' '.join(only)}: no cell of the sweep matches "
                             f"(shapes {['/'.join(map(str, s)) for s in CHUNK_SHAPES]}, batches {CHUNK_BATCHES})")
    return cells[::5] if quick else cells


def _parse_cell_filter(text: str):
    shape_text, _, batch_text = text.partition(":")
    try:
        shape = tuple(int(x) for x in shape_text.split("/"))
        batch = int(batch_text) if batch_text else None
    except ValueError:
        shape = batch = None
    if shape is None or len(shape) != 3:
        raise SystemExit(f"--only {text!r}: expected Hq/Hkv/D or Hq/Hkv/D:batch, e.g. 16/2/256:48")
    return shape, batch


def planned_chunks(shape, lens, *, chunks=None, block_n=None, num_sms=None, max_smem=None) -> dict:
    """What a launch of the chunks sweep does, from the host mirror of the device rule
    (`split_rule`): the chunk count of every request, the key block, the stage-1 programs and
    whether stage 2 runs, and, at the launch config's own block, the share of their waves'
    program slots they fill (the rule's programs per SM; None at another block, whose programs
    per SM were not measured). chunks None: the rule's count (`adaptive_split.plan_splits`); else
    `ForcedChunks(chunks)`. num_sms / max_smem default to this machine's GPU, else an H200's
    (132 SMs, 227 KiB per program)."""
    from decode_conformance_kernels import triton_common as tc
    from decode_conformance_kernels.adaptive_split import plan_splits, stage1_merge_plan, stage1_merge_up_to
    hq, hkv, d = shape[:3]
    sms = num_sms if num_sms is not None else split_rule.num_sms()
    if max_smem is None:
        max_smem = tc.device_max_smem("cuda") if torch.cuda.is_available() else 232448
    own_block = tc.gpu_config(d, d, False, max_smem)["block_n"]
    bn = block_n or own_block
    pps = split_rule.launch_shape(d, False)[0]
    tiles = tc.head_tiling(hq, hkv)["kv_head_tiles"]
    if chunks is None:
        S, occ = plan_splits(len(lens), hq, hkv, num_sms=sms, head_dim=d)
    else:
        S = occ = int(chunks)
    total = sum(lens)
    counts = [split_rule.chunk_count_for_cap(L, split_rule.request_cap(L, total, S, occ), split_rule.MIN_CHUNK, bn)
              for L in lens]
    programs = len(lens) * tiles * max(counts)
    # the adapter's plan passes merge counters where `stage1_merge_up_to` has a count; the kernel's
    # own decision (`stage1_merge_plan`) says whether stage 1 merges at this launch's programs
    up_to = stage1_merge_up_to(d, False, 2)
    heads = tc.next_pow2(tc.head_tiling(hq, hkv)["heads_per_tile"])
    in_stage1 = up_to is not None and stage1_merge_plan(max(counts), up_to, heads, tc.next_pow2(d)) > 0
    return dict(counts=sorted(set(counts)), block_n=bn, programs=programs,
                fill=split_rule.wave_fill(programs, pps * sms) if bn == own_block else None,
                stage2=max(counts) >= 2 and not in_stage1, merge_in_stage1=in_stage1)


def chunk_variants(shape, lens, **machine) -> dict:
    """{label: (kernel factory, planned_chunks)}: the rule, every count of CHUNK_COUNTS and
    CHUNK_WIDE_COUNTS chunks of CHUNK_WIDE_BLOCK keys; a variant that launches what an earlier one does (the
    same counts and block) is left out, so no launch is timed twice under two names."""
    out, seen = {}, set()
    specs = [("rule", None, None)] + [(f"c{c}", c, None) for c in CHUNK_COUNTS]
    if shape[2] <= split_rule.WIDE_HEAD_DIM:
        specs += [(f"c{c}-b{CHUNK_WIDE_BLOCK}", c, CHUNK_WIDE_BLOCK) for c in CHUNK_WIDE_COUNTS]
    for label, c, bn in specs:
        plan = planned_chunks(shape, lens, chunks=c, block_n=bn, **machine)
        key = (tuple(plan["counts"]), plan["block_n"])
        if key in seen:
            continue
        seen.add(key)
        make = registry.adaptive_split if c is None else (lambda c=c, bn=bn: ForcedChunks(c, bn))
        out[label] = (make, plan)
    return out


def chunk_sweep(reps, tbs, quick=False, deadline=float("inf"), rounds=3, only=None):
    """Per cell, the rule's launch against the other variants of `chunk_variants`, interleaved
    over `rounds` rounds on one prepared batch (median of the rounds' medians); each variant's
    output compared with the rule's (cosine)."""
    def describe(cell):
        shape, bsz, ctx = cell
        floor = timing.kv_floor_us(bsz, ctx, shape[1], shape[2], 2, tbs)
        return ({"shape": "/".join(map(str, shape)), "batch": bsz, "ctx": ctx, "floor_us": floor},
                _case(shape, [ctx] * bsz))

    def measure(cell, case):
        shape, bsz, ctx = cell
        variants = chunk_variants(shape, [ctx] * bsz)
        batch = shared_batch(case)
        kernels = {label: make() for label, (make, _) in variants.items()}
        times = {label: [] for label in kernels}
        outs = {}
        for rnd in range(rounds):
            for label, k in kernels.items():
                batch.workspace = Workspace(batch.device)
                launch = k.plan(batch)
                times[label].append(timing.graph_median_us(launch, "cuda", reps=reps))
                if rnd == 0:
                    batch.repoison_outputs()
                    launch()
                    torch.cuda.synchronize()
                    outs[label] = batch.out.clone()
        us = {label: statistics.median(t) for label, t in times.items()}
        rows = {label: dict(plan, us=us[label], rounds_us=times[label], vs_rule=us[label] / us["rule"],
                            cos=cosine(outs[label], outs["rule"])) for label, (_, plan) in variants.items()}
        ok = {lb: r for lb, r in rows.items() if r["cos"] > 0.999}
        return dict(variants=rows, best=min(ok, key=lambda lb: ok[lb]["us"]))
    return _measure_cells(chunk_cells(quick, only), deadline, describe, measure)


def _plan_label(plan) -> str:
    counts = "/".join(map(str, plan["counts"]))
    fill = "" if plan["fill"] is None else f" {100 * plan['fill']:.0f}%"
    merge = ", s1-merge" if plan.get("merge_in_stage1") else ("" if plan["stage2"] else ", no-s2")
    return f"{counts}x{plan['block_n']}, {plan['programs']} programs{fill}" + merge


def chunk_dry_run(quick=False, only=None) -> str:
    """The chunks sweep's plan, without a GPU: per cell, each variant's chunk counts, key block,
    stage-1 programs, wave fill and whether stage 2 runs (or stage 1 merges)."""
    lines = ["| shape | batch | ctx | variants (counts x block, stage-1 programs, wave fill) |", "|---|---|---|---|"]
    for shape, bsz, ctx in chunk_cells(quick, only):
        vs = chunk_variants(shape, [ctx] * bsz)
        lines.append(f"| {'/'.join(map(str, shape))} | {bsz} | {ctx} | "
                     + "; ".join(f"{lb}: {_plan_label(p)}" for lb, (_, p) in vs.items()) + " |")
    return "\n".join(lines) + "\n"


def _md_head(title, meta, method, columns) -> list:
    """A sweep table's title, its run line (`method` after the versions) and its header row;
    `columns` start with shape | batch | ctx."""
    return [f"# {title} ({meta['gpu']}, {meta['date']})", "",
            f"torch {meta['torch']}, triton {meta['triton']}, copy bandwidth {meta['copy_tbs']:.2f} TB/s; bf16, "
            f"paged 16, CUDA-graph replay after an L2 flush ({meta.get('flush', 'zero')}); {method}", "",
            "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _md_chunks(rows, meta):
    out = _md_head("Chunk-count sweep", meta,
                   "uniform lengths, median us of the rounds' medians, variants interleaved. Each entry: us (against "
                   "the rule), chunk counts x key block, stage-1 programs and their wave fill (at the launch "
                   "config's block); `no-s2`: no stage 2; `s1-merge`: stage 1 merges (no stage 2). "
                   "WRONG: cosine to the rule's output <= 0.999.",
                   ["shape", "batch", "ctx", "floor", "rule", "other variants", "best"])
    for r in rows:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | | {r['error']} | | |")
            continue
        v = r["variants"]

        def entry(lb):
            x = v[lb]
            bad = "" if x["cos"] > 0.999 else " WRONG"
            rel = "" if lb == "rule" else f" ({100 * (x['vs_rule'] - 1):+.1f} %)"
            return f"{lb} {x['us']:.1f}{rel} [{_plan_label(x)}]{bad}"
        others = "; ".join(entry(lb) for lb in v if lb != "rule")
        out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | {r['floor_us']:.1f} | {entry('rule')} | {others} | "
                   f"{r['best']} |")
    return "\n".join(out) + "\n"


def _md_split(rows, meta):
    out = _md_head("Split-K sweep", meta, "uniform lengths, median us. % = floor / time (floor: K+V bytes once at "
                   "the copy bandwidth).", ["shape", "batch", "ctx", "floor", "adaptive", "fixed (8)",
                                            "torch SDPA (contig)", "adaptive/fixed"])
    for r in rows:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | | {r['error']} | | | |")
            continue
        pct = lambda t: f"{t:.1f} ({100 * r['floor_us'] / t:.0f} %)"  # noqa: E731
        out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | {r['floor_us']:.1f} | {pct(r['adaptive_us'])} | "
                   f"{pct(r['fixed_us'])} | {pct(r['sdpa_us'])} | {r['adaptive_us'] / r['fixed_us']:.3f} |")
    return "\n".join(out) + "\n"


def _md_lean(rows, meta):
    out = _md_head("Lean sweep", meta, "lengths uniform (r = 1.0) or drawn from [r x ctx, ctx] (seeded), median us.",
                   ["shape", "batch", "ctx", "r", "mean len", "lean", "adaptive split-K", "speedup (split/lean)",
                    "cosine"])
    for r in rows:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | {r['ratio']} | | {r['error']} | | | |")
            continue
        out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | {r['ratio']} | {r['mean_len']:.0f} | "
                   f"{r['lean_us']:.1f} | {r['adaptive_us']:.1f} | {r['speedup']:.2f} | {r['cos']:.6f} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", choices=["split", "lean", "chunks"])
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=float("inf"),
                    help="stop starting new cells after this long; what was measured is written")
    ap.add_argument("--rounds", type=int, default=3, help="chunks: interleaved rounds per cell")
    ap.add_argument("--dry-run", action="store_true",
                    help="chunks: print the cells and what each variant launches (chunk counts, block, wave fill), "
                         "no GPU needed")
    ap.add_argument("--only", action="append", metavar="Hq/Hkv/D[:batch]",
                    help="chunks: only these shapes (and batches), repeatable")
    add_flush_option(ap)
    args = ap.parse_args()
    if args.dry_run:
        if args.sweep != "chunks":
            ap.error(f"--dry-run: only the chunks sweep has one, not {args.sweep}")
        print(chunk_dry_run(args.quick, args.only), end="")
        return
    timing.set_bench_flush(args.flush)
    import triton
    tbs = timing.copy_bandwidth_tbs()
    meta = {"gpu": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat(), "copy_tbs": tbs, "flush": timing.BENCH_FLUSH,
            "command": " ".join(sys.argv)}
    print(json.dumps(meta), flush=True)
    t0 = time.time()
    deadline = t0 + args.max_seconds
    if args.sweep == "chunks":
        rows = chunk_sweep(args.reps, tbs, args.quick, deadline, args.rounds, args.only)
    else:
        rows = (split_sweep if args.sweep == "split" else lean_sweep)(args.reps, tbs, args.quick, deadline)
    meta["seconds"] = time.time() - t0
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.sweep}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = {"split": _md_split, "lean": _md_lean, "chunks": _md_chunks}[args.sweep](rows, meta)
    (out / f"{args.sweep}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

"""Kernel-time sweeps on a GPU: CUDA-graph replay with the L2 flushed (--flush), median of repeats.

    python benchmarks/sweep.py split --out results/   # adaptive split-K vs fixed-split vs SDPA, uniform lengths
    python benchmarks/sweep.py lean  --out results/   # Lean vs adaptive split-K, uniform and ragged batches

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
from decode_conformance_kernels import registry  # noqa: E402

SPLIT_SHAPES = [(32, 8, 128), (16, 2, 256)]
SPLIT_BATCHES = [1, 4, 16, 32]
SPLIT_CTX = [1024, 4096, 16384, 65536, 131072]
MLA = (128, 1, 576, 512)
MLA_BATCHES = [1, 8, 32]

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


def _md_split(rows, meta):
    out = [f"# Split-K sweep ({meta['gpu']}, {meta['date']})", "",
           f"torch {meta['torch']}, triton {meta['triton']}, copy bandwidth {meta['copy_tbs']:.2f} TB/s; "
           f"bf16, paged 16, uniform lengths, CUDA-graph replay after an L2 flush ({meta.get('flush', 'zero')}), "
           "median us. "
           "% = floor / time (floor: K+V bytes once at the copy bandwidth).", "",
           "| shape | batch | ctx | floor | adaptive | fixed (8) | torch SDPA (contig) | adaptive/fixed |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | | {r['error']} | | | |")
            continue
        pct = lambda t: f"{t:.1f} ({100 * r['floor_us'] / t:.0f} %)"  # noqa: E731
        out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | {r['floor_us']:.1f} | {pct(r['adaptive_us'])} | "
                   f"{pct(r['fixed_us'])} | {pct(r['sdpa_us'])} | {r['adaptive_us'] / r['fixed_us']:.3f} |")
    return "\n".join(out) + "\n"


def _md_lean(rows, meta):
    out = [f"# Lean sweep ({meta['gpu']}, {meta['date']})", "",
           f"torch {meta['torch']}, triton {meta['triton']}; bf16, paged 16, lengths uniform (r = 1.0) or drawn "
           f"from [r x ctx, ctx] (seeded); CUDA-graph replay after an L2 flush ({meta.get('flush', 'zero')}), "
           "median us.", "",
           "| shape | batch | ctx | r | mean len | lean | adaptive split-K | speedup (split/lean) | cosine |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | {r['ratio']} | | {r['error']} | | | |")
            continue
        out.append(f"| {r['shape']} | {r['batch']} | {r['ctx']} | {r['ratio']} | {r['mean_len']:.0f} | "
                   f"{r['lean_us']:.1f} | {r['adaptive_us']:.1f} | {r['speedup']:.2f} | {r['cos']:.6f} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", choices=["split", "lean"])
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=float("inf"),
                    help="stop starting new cells after this long; what was measured is written")
    add_flush_option(ap)
    args = ap.parse_args()
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
    sweep = split_sweep if args.sweep == "split" else lean_sweep
    rows = sweep(args.reps, tbs, args.quick, deadline)
    meta["seconds"] = time.time() - t0
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.sweep}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = (_md_split if args.sweep == "split" else _md_lean)(rows, meta)
    (out / f"{args.sweep}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()

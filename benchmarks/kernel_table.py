"""The kernels' speed on the bf16 cells their speed targets are stated on (the peer table's cells:
batch 1 to 64, 2k to 128k keys, ragged batches), side by side, in one harness: CUDA-graph replay
of one launch, the L2 flushed (a 256 MB read; --flush zero: a memset) before every replay, events around the replay
alone, median of repeats (decode_conformance.perf.timing). bf16, paged KV (16-key pages, shuffled),
torch SDPA on a dense contiguous copy as the peer.

    python benchmarks/kernel_table.py table --out DIR        # the table (+ plot)
    python benchmarks/kernel_table.py tune --out DIR         # launch-config candidates per cell

Each kernel's output is checked against SDPA's on the same inputs before it is timed: a fast
wrong kernel is not a result. Writes DIR/<mode>.json and DIR/<mode>.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()

from decode_conformance.perf import timing  # noqa: E402
from decode_conformance.metrics import cosine  # noqa: E402
from decode_conformance.runner import prepare  # noqa: E402
from decode_conformance_kernels import registry  # noqa: E402
from sweep import add_flush_option, dense_sdpa, shared_batch, target_cells, time_on_batch  # noqa: E402

KERNELS = ("adaptive_split", "fixed_split", "lean", "dispatch")


def table_cells() -> list:
    """The bf16 GQA cells of the peer table (benchmarks/sweep.py target_cells): the shapes and
    lengths the split-K kernel's targets name; SDPA on a dense copy is their peer."""
    return [c for c in target_cells() if c.case.kv_dtype == "bf16" and not c.case.mla]


def _floor_us(case, tbs):
    return timing.kv_floor_us(1, case.total_keys, case.num_kv_heads, case.head_dim, 2, tbs)


def table(reps, tbs, deadline):
    rows = []
    for cell in table_cells():
        if time.time() > deadline:
            break
        case = cell.case
        row = dict(cell=cell.name, shape=cell.shape, lens=list(case.seq_lens), floor_us=_floor_us(case, tbs))
        ref_launch, ref_out = None, None
        batch = shared_batch(case)
        for name in KERNELS:
            try:
                if ref_launch is None:
                    # per request on dense copies, as the table's SDPA column always was
                    ref_launch, ref_out = dense_sdpa(batch, batched=False)
                    row["sdpa_us"] = timing.graph_median_us(ref_launch, "cuda", reps=reps)
                    ref_launch()
                us, out = time_on_batch(name, batch, reps)
                row[f"{name}_us"] = us
                row[f"{name}_cos"] = cosine(out.float(), ref_out.float())
            except Exception as e:  # one kernel's failure must not take the table down
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        del batch, ref_out
        torch.cuda.empty_cache()
        rows.append(row)
        print(_md_row(row), flush=True)
    return rows


def _md_row(r):
    def cell(name):
        us = r.get(f"{name}_us")
        if us is None:
            return "err" if f"{name}_error" in r else "-"
        bad = "" if r.get(f"{name}_cos", 1.0) > 0.999 else " (WRONG)"
        return f"{us:.1f}{bad}"
    pct = f"{100 * r['floor_us'] / r['adaptive_split_us']:.0f}%" if r.get("adaptive_split_us") else "-"
    return (f"| {r['cell']} | {r['floor_us']:.1f} | {cell('adaptive_split')} ({pct}) | {cell('fixed_split')} | "
            f"{cell('lean')} | {cell('dispatch')} | {r.get('sdpa_us', float('nan')):.1f} |")


# Launch configurations to try on the adaptive kernel: (block_n, num_warps, num_stages).
TUNE_CONFIGS = [(64, 8, 3), (64, 4, 3), (32, 4, 3), (32, 4, 4), (32, 8, 3), (128, 4, 2), (128, 8, 2), (64, 4, 4),
                (32, 4, 2), (16, 4, 3)]
TUNE_SPLITS = (None, 128, 256)


def tune(reps, tbs, deadline):
    from decode_conformance_kernels.adaptive_split import decode_attention_adaptive, plan_splits
    rows = []
    for cell in table_cells():
        case = cell.case
        kernel = registry.adaptive_split()
        batch = prepare(kernel, case, "cuda")
        ref_launch, ref = dense_sdpa(batch, batched=False)
        ref_launch()
        base_S = plan_splits(case.batch, case.num_q_heads, case.num_kv_heads, device="cuda", mla=batch.v_from_k,
                             head_dim=batch.head_dim, kv_bytes=batch.k_cache.element_size())[0]
        for (bn, warps, stages) in TUNE_CONFIGS:
            for S in TUNE_SPLITS:
                if time.time() > deadline:
                    return rows
                splits = S or base_S
                kw = dict(sm_scale=case.sm_scale, lse=batch.lse, splits=splits, block_n=bn, num_warps=warps,
                          num_stages=stages)
                args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)
                row = dict(cell=cell.name, block_n=bn, warps=warps, stages=stages, splits=splits,
                           floor_us=_floor_us(case, tbs))
                try:
                    p = torch.empty((case.batch, case.num_q_heads, splits, case.v_head_dim), device="cuda")
                    pl = torch.empty((case.batch, case.num_q_heads, splits), device="cuda")
                    fn = lambda: decode_attention_adaptive(*args, partials=p, partial_lse=pl, **kw)  # noqa: E731
                    row["us"] = timing.graph_median_us(fn, "cuda", reps=reps)
                    fn()
                    torch.cuda.synchronize()
                    row["cos"] = cosine(batch.out.float(), ref.float())
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                rows.append(row)
        best = min((r for r in rows if r["cell"] == cell.name and "us" in r and r.get("cos", 0) > 0.999),
                   key=lambda r: r["us"], default=None)
        if best:
            print(f"{best['cell']}: best {best['us']:.1f} us ({100 * best['floor_us'] / best['us']:.0f}% of floor) "
                  f"with BLOCK_N {best['block_n']}, {best['warps']} warps, {best['stages']} stages, "
                  f"{best['splits']} splits (plan: {base_S})", flush=True)
        torch.cuda.empty_cache()
    return rows


def run_meta(reps: int, copy_tbs: float, **extra) -> dict:
    """What a benchmark's JSON records about its run: date, GPU, versions, bandwidths, method."""
    import triton
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                copy_tbs=copy_tbs, read_tbs=timing.read_bandwidth_tbs(), reps=reps, flush=timing.BENCH_FLUSH,
                method=f"CUDA-graph replay, 256 MB L2 flush ({timing.BENCH_FLUSH}) before each, events around "
                       "the replay, median", **extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("table", "tune"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--max-seconds", type=float, default=240)
    add_flush_option(ap)
    a = ap.parse_args()
    timing.set_bench_flush(a.flush)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + a.max_seconds
    tbs = timing.copy_bandwidth_tbs()
    meta = run_meta(a.reps, tbs)
    print(f"copy {tbs:.2f} TB/s, read {meta['read_tbs']:.2f} TB/s, flush {timing.BENCH_FLUSH}", flush=True)
    if a.mode == "table":
        print("| cell | floor us | adaptive (% floor) | fixed-8 | lean | dispatch | SDPA dense |\n|---|---|---|---|---|---|---|")
    rows = table(a.reps, tbs, deadline) if a.mode == "table" else tune(a.reps, tbs, deadline)
    (out / f"{a.mode}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    if a.mode == "table":
        md = ["| cell | floor us | adaptive (% floor) | fixed-8 | lean | dispatch | SDPA dense |",
              "|---|---|---|---|---|---|---|"] + [_md_row(r) for r in rows]
        (out / "table.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()

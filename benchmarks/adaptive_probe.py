"""Where the adaptive split-K kernel's time goes, and which launch knobs move it (one H200 run,
to choose defaults from measurements): per cell, the kernel of the previous commit (from
`benchmarks/_old_kernels`, a copy made before the run, when present) next to this one with
stage 2 removed (its cost), with the grid sized from the host lengths (the eager path), with
stage-2 column slices 1/2/4/8, the chunk budget 64/128/256 and launch configurations, plus the
fixed-split kernel and torch SDPA on dense KV as peers. CUDA-graph replay, 256 MB L2 flush
before each replay, median (decode_conformance.timing). Each variant's output is checked
against SDPA's (or fixed-split's for MLA) before its time counts.

    python benchmarks/adaptive_probe.py --out DIR [--variants launch|chunks|waves|pipeline|lean|stage2|pdl|layout|empties] [--reps 20] [--max-seconds 420]

Round 5 (`--variants pipeline`): key-block pipelining. Compiled for sm_90, the stage-1 loop of
the shipped configs (num_stages 3, and Lean's 2) keeps one K and one V buffer and waits for
every copy at the top of each step (the slot-id load feeding the K/V addresses takes one of
the pipeline's stages): a step's loads do not overlap its math. num_stages 5 gives two
buffers per operand and a real prefetch. This round times launch configurations that
double-buffer, each with the programs per SM its shared memory and registers allow, for the
split-K kernels and Lean, on the kernel table's cells and a few batched ones.

Round 6 (`--variants lean`): Lean's launch configuration and head tile on the Lean sweep's
cells (ragged batches of 16-32, MLA). Lean's MLA tile held 16 query heads, so a request's
latent cache was read once per 16 heads (8 times for 128 heads; split-K's 64-head tiles read
it twice); `head_rows` 32 halves that. Lean's combine keeps three [rows, Dv] fp32 tiles live,
so 64 rows spill on sm_90 (368-696 bytes per thread at 8 or 16 warps, compiled on CPU).

Round 7 (`--variants stage2`): stage 2's cost at batch 1, where a request's 82-128 partials are
merged 64 at a time (`triton_common.STAGE2_MAX_TILE`): two dependent load rounds. Times the
shipped adaptive kernel with the merge tile capped at 64 and at 128 (one round), alternating
A / B / A / B on one prepared batch, and with stage 2 removed (its whole cost).

Round 8 (`--variants pdl`): stage 2 as a programmatic dependent launch (sm_90+,
`triton_common.USE_PDL`): the shipped kernel without it, with it triggered at the start of
each stage-1 program, at its end, and where `adaptive_split.trigger_early` says, twice each
on one prepared batch, on the cells where adaptive trailed SDPA (batch 1 at 4k-128k, batches
4-32) and the perf guard's b4-ragged and b32-8k cells.

Round 9 (`--variants layout`): how much of stage 1's distance to SDPA on batched cells is the
cache layout. The same keys timed through the same kernel from the suite's paged cache
(16-key pages, shuffled, [page, slot, head, dim]), from those pages stored head-major
([page, head, slot, dim]), and from a dense cache in token order, token-major ([token, head,
dim]) and head-major ([head, token, dim], SDPA's layout), each addressed by slot ids.

Round 10 (`--variants empties`): what the batched cells' distance is made of. The stage-1 grid
is B x tiles x the whole chunk budget, so a uniform batch launches mostly empty programs (16 x
16k at 32/8/128: 10,496 for 640 chunks). On uniform batches the budget set to the occupancy
count gives the same chunks with no empty program (valid only there: a longer request could
not take its share). Alternating three rounds on one prepared batch: the shipped launch, that
compact grid, each once with stage 2 removed (unchecked: the outputs are partials), and the
fixed-split kernel, on the cells where adaptive trails fixed-split (target 8) or SDPA at batch
4-32, and a few of the kernel table's. (Run on `e024b6e`, the round also timed stage 1 in two
launches - the occupancy count's rows, then the budget's slots owned in proportion to the
lengths - tried and reverted: docs/gpu-runs/2026-12-01-h200/README.md, probe13.)
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()

from decode_conformance.perf import timing  # noqa: E402
from decode_conformance.metrics import cosine  # noqa: E402
from decode_conformance.runner import prepare  # noqa: E402
from decode_conformance_kernels import adaptive_split as new  # noqa: E402
from decode_conformance_kernels import registry  # noqa: E402
from kernel_table import _sdpa, run_meta  # noqa: E402
from sweep import _case, _ragged_lens, add_flush_option, shared_batch, time_on_batch  # noqa: E402

try:
    from _old_kernels import adaptive_split as old  # noqa: E402
except ImportError:
    old = None

K = 1024
RAGGED16 = (1600, 65536, 4096, 32768, 2048, 48000, 8192, 16384, 24576, 1700, 40000, 60000, 12000, 30000, 57000, 28144)
LONG = [((16, 2, 256), (128 * K,)), ((16, 2, 256), (32 * K,)), ((32, 8, 128), (128 * K,)), ((32, 8, 128), (32 * K,)),
        ((16, 2, 256), (32 * K,) * 4), ((32, 8, 128), RAGGED16), ((128, 1, 576, 512), (16 * K,)),
        ((128, 1, 576, 512), (64 * K,))]
SHORT = [((32, 8, 128), (4 * K,)), ((16, 2, 256), (4 * K,)), ((32, 8, 128), (K,)), ((32, 8, 128), (K,) * 4),
         ((32, 8, 128), (K,) * 16), ((32, 8, 128), (K,) * 32), ((16, 2, 256), (K,) * 32), ((16, 2, 256), (4 * K,) * 32),
         ((16, 2, 256), (4 * K,) * 16), ((128, 1, 576, 512), (K,) * 8), ((128, 1, 576, 512), (4 * K,) * 8),
         # one chunk per request (occupancy 1): the direct path
         ((32, 8, 128), (K,) * 128), ((32, 8, 128), (4 * K,) * 96), ((16, 2, 256), (2 * K,) * 300),
         ((32, 8, 128), (200,) * 32)]


def _ragged(n, ctx, r, seed=11):
    g = torch.Generator().manual_seed(seed)
    lo = int(r * ctx)
    return tuple(int(x) for x in torch.randint(lo, ctx + 1, (n,), generator=g))


# Round 4: batched cells, where the occupancy count leaves part of a wave empty (batch 32 at
# 32/8/128: 256 programs per chunk, 660 slots, 2 chunks = 78 % of one wave).
WAVES = [((32, 8, 128), (c,) * b) for b in (8, 16, 32, 64) for c in (K, 4 * K, 16 * K, 64 * K) if b * c <= 2048 * K] + \
        [((16, 2, 256), (c,) * b) for b in (16, 32, 64) for c in (K, 4 * K, 16 * K)] + \
        [((28, 4, 128), (c,) * b) for b in (16, 32) for c in (4 * K, 16 * K)] + \
        [((32, 8, 128), _ragged(b, c, r)) for b in (16, 32) for c in (16 * K, 64 * K) for r in (0.5, 0.1)] + \
        [((128, 1, 576, 512), (c,) * b) for b in (8, 32) for c in (K, 4 * K)]


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *a, **k: None


def _label(shape, lens):
    s = "/".join(map(str, shape))
    return f"{s} {len(lens)}x{lens[0]}" if len(set(lens)) == 1 else f"{s} {len(lens)} ragged ({sum(lens)} keys)"


def _time_checked(row, name, fn, out, ref, device, reps, check=True):
    """row[name] = fn's median replay time; with `check`, fn runs once more on a NaN-poisoned
    `out`, which must match `ref` (cosine > 0.999, else row[name + "_WRONG"]). An exception is
    recorded as row[name + "_error"], so one variant's failure leaves the others measured."""
    try:
        row[name] = timing.graph_median_us(fn, device, reps=reps)
        if check:
            out.fill_(float("nan"))
            fn()
            if out.is_cuda:
                torch.cuda.synchronize()
            c = cosine(out.float(), ref)
            if not c > 0.999:
                row[name + "_WRONG"] = c
    except Exception as e:
        row[name + "_error"] = f"{type(e).__name__}: {str(e)[:160]}"


def _sdpa_reference(row, case, batch, device, reps):
    """Times SDPA on the cell's dense copy into row["sdpa"]; returns its output (fp32), the
    reference every variant is checked against."""
    s_launch, s_get = _sdpa(case, batch)
    row["sdpa"] = timing.graph_median_us(s_launch, device, reps=reps)
    s_launch()
    return s_get().float().clone()


def _print_row(row):
    print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)


def _probe_cells(cells, rows, reps, tbs, deadline, device):
    """Per cell (shape, lens) until the deadline: yields (shape, lens, case, row, batch, ref) -
    the row with its label and copy floor, the prepared batch, SDPA's time in the row and its
    output as the reference - then files and prints the row the caller filled."""
    for shape, lens in cells:
        if time.time() > deadline:
            break
        case = _case(shape, lens)
        row = dict(cell=_label(shape, lens), floor_us=timing.kv_floor_us(1, case.total_keys, case.num_kv_heads,
                                                                          shape[2], 2, tbs))
        batch = shared_batch(case, device)
        ref = _sdpa_reference(row, case, batch, device, reps)
        yield shape, lens, case, row, batch, ref
        rows.append(row)
        _print_row(row)
        del batch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _ir_counts(fn):
    """Op counts of the compiled stage-1 kernels (is the K/V load pipelined? which MMA?)."""
    out = []
    try:
        for cache in fn.device_caches.values():
            for compiled in cache[0].values():
                ir = compiled.asm.get("ttgir", "")
                out.append({k: ir.count(k) for k in ("async_copy_global_to_local", "warp_group_dot", "ttg.local_alloc",
                                                     "tt.dot", "async_wait", "mma")}
                           | {"smem": compiled.metadata.shared, "warps": compiled.metadata.num_warps,
                              "stages": compiled.metadata.num_stages})
    except Exception as e:  # introspection only
        out.append({"error": repr(e)[:200]})
    return out


def _launch_variants(variants, bound, kind, shape, mla, case):
    """Round 1-2: stage-2 slices, the chunk budget, launch configurations, programs per SM."""
    if kind == "long" or case.batch == 1:
        variants |= {f"slices{n}": dict(bound, stage2_slices=n) for n in (1, 4)}
    if kind == "long":
        variants["S128"] = dict(bound, splits=128)
        variants["S128_s1only"] = dict(bound, splits=128, _s1only=True)
        if shape[2] == 256:
            for S in (64, 128, 256):
                for bn, w, st in ((64, 4, 3), (64, 8, 3), (32, 4, 3), (64, 4, 4)):
                    variants[f"S{S}_{bn}x{w}x{st}"] = dict(bound, splits=S, block_n=bn, num_warps=w, num_stages=st)
        elif not mla:
            for bn, w, st in ((64, 4, 4), (128, 4, 2), (64, 8, 3)):
                variants[f"S64_{bn}x{w}x{st}"] = dict(bound, block_n=bn, num_warps=w, num_stages=st)
                variants[f"S128_{bn}x{w}x{st}"] = dict(bound, splits=128, block_n=bn, num_warps=w, num_stages=st)
    else:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for mult in (2, 4):
            variants[f"pps_x{mult}"] = dict(bound, num_sms=sms * mult, _replan=True)


def _chunk_variants(variants, bound, shape, mla):
    """Round 3: the smallest chunk and the programs per SM (fewer, longer programs)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for mc in (256, 512, 1024):
        variants[f"mc{mc}"] = dict(bound, min_chunk=mc)
    for frac in (2, 3):  # programs per SM x frac / 4
        variants[f"pps_{frac}of4"] = dict(bound, num_sms=sms * frac // 4, _replan=True)
    if not mla and shape[2] == 256:
        variants["S128"] = dict(bound, splits=128)


def _wave_variants(variants, bound, occ0, S0):
    """Round 4: occupancy counts 3-16 and the rule's count + 1, besides the rule's own (at most S0)."""
    for c in sorted({occ0, occ0 + 1, 3, 4, 5, 6, 8, 10, 12, 16} - {occ0}):
        if 1 <= c <= S0:
            variants[f"occ{c}"] = dict(bound, occupancy=c)


# Round 5 cells: the kernel table's, and batched / ragged ones where many programs share an SM.
PIPE_CELLS = [((32, 8, 128), (128 * K,)), ((16, 2, 256), (128 * K,)), ((32, 8, 128), (32 * K,)),
              ((16, 2, 256), (32 * K,)), ((16, 2, 256), (32 * K,) * 4), ((32, 8, 128), (128 * K,) * 4),
              ((32, 8, 128), RAGGED16), ((32, 8, 128), (4 * K,)), ((16, 2, 256), (4 * K,)),
              ((32, 8, 128), (16 * K,) * 32), ((16, 2, 256), (4 * K,) * 32), ((32, 8, 128), (K,))]
# (BLOCK_N, warps, stages, programs per SM) per head dim; the first is the shipped config.
# Programs per SM from the sm_90 compile: shared memory (227 KB per SM) and registers.
PIPE_SPLIT = {128: ((64, 4, 3, 5), (32, 4, 5, 5), (64, 4, 5, 3), (32, 4, 7, 4), (64, 8, 5, 3)),
              256: ((64, 8, 3, 2), (32, 8, 5, 2), (32, 4, 5, 3), (32, 4, 7, 2), (64, 8, 6, 1))}
PIPE_LEAN = {128: ((128, 4, 2, 2), (64, 4, 5, 2), (32, 4, 5, 3), (128, 4, 5, 1)),
             256: ((64, 4, 2, 2), (32, 4, 5, 2), (32, 8, 5, 2), (64, 8, 6, 1))}


def pipeline_probe(reps, tbs, deadline, device="cuda", cells=None):
    from decode_conformance_kernels import fixed_split, lean, split_rule
    sms = split_rule.num_sms(device)
    rows = []
    for shape, lens, case, row, batch, ref in _probe_cells(cells or PIPE_CELLS, rows, reps, tbs, deadline, device):
        d = shape[2]
        args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)
        lse = torch.empty(case.batch, shape[0], device=device)

        def timed(name, fn):
            if time.time() <= deadline:
                _time_checked(row, name, fn, batch.out, ref, device, reps)

        tiles = new.tc.head_tiling(shape[0], shape[1])["kv_head_tiles"]
        for bn, w, st, pps in PIPE_SPLIT[d]:
            S = split_rule.grid_splits(case.batch, tiles, sms, split_rule.MAX_SPLITS, pps)
            occ = split_rule.occupancy_splits(case.batch, tiles, sms, split_rule.MAX_SPLITS, pps)
            chunks = new.chunk_axis(batch.q, batch.k_cache, batch.v_cache, S, max(lens), block_n=bn)
            p = torch.empty((case.batch, shape[0], chunks, d), device=device)
            pl = torch.empty((case.batch, shape[0], chunks), device=device)
            kw = dict(sm_scale=case.sm_scale, lse=lse, splits=S, occupancy=occ, max_visible=max(lens),
                      partials=p, partial_lse=pl, block_n=bn, num_warps=w, num_stages=st)
            timed(f"ad_{bn}x{w}x{st}_p{pps}", lambda kw=kw: new.decode_attention_adaptive(*args, **kw))
            if (bn, w, st, pps) == PIPE_SPLIT[d][0] and max(lens) >= 32 * K:  # the budget one wave up
                occ2 = split_rule.occupancy_splits(case.batch, tiles, sms, split_rule.MAX_SPLITS, pps + 1)
                timed(f"ad_{bn}x{w}x{st}_p{pps + 1}", lambda kw=kw: new.decode_attention_adaptive(
                    *args, **dict(kw, occupancy=occ2)))
        fp = torch.empty((case.batch, shape[0], 8, d), device=device)
        fpl = torch.empty((case.batch, shape[0], 8), device=device)
        for bn, w, st, _ in PIPE_SPLIT[d][:3]:
            timed(f"fx_{bn}x{w}x{st}", lambda bn=bn, w=w, st=st: fixed_split.decode_attention_fixed(
                *args, sm_scale=case.sm_scale, lse=lse, partials=fp, partial_lse=fpl, block_n=bn, num_warps=w,
                num_stages=st))
        for bn, w, st, mult in PIPE_LEAN[d]:
            launch = lean.plan_lean(*args, lse, sm_scale=case.sm_scale, programs=sms * mult, block_n=bn,
                                    num_warps=w, num_stages=st)
            timed(f"lean_{bn}x{w}x{st}_g{mult}", launch)
    return rows


# (BLOCK_N, warps, stages, programs per SM, head rows) per head dim (576: MLA); the first is shipped.
LEAN_VARIANTS = {128: ((128, 4, 2, 2, 16), (64, 4, 5, 2, 16), (32, 4, 5, 3, 16), (64, 8, 5, 1, 16)),
                 256: ((64, 4, 2, 2, 16), (64, 8, 6, 1, 16), (32, 4, 5, 2, 16), (32, 8, 5, 2, 16)),
                 576: ((64, 4, 2, 2, 16), (32, 8, 5, 1, 32), (32, 16, 5, 1, 32), (64, 8, 5, 1, 32),
                       (32, 4, 5, 2, 16), (32, 8, 5, 1, 16))}
LEAN_CELLS = [((32, 8, 128), 16, 16 * K, 0.5), ((32, 8, 128), 16, 16 * K, 0.1), ((32, 8, 128), 32, 16 * K, 0.5),
              ((28, 4, 128), 16, 16 * K, 0.5), ((28, 4, 128), 32, 16 * K, 0.1), ((32, 8, 128), 16, 64 * K, 0.5),
              ((16, 2, 256), 16, 16 * K, 0.5), ((128, 1, 576, 512), 1, 16 * K, 1.0),
              ((128, 1, 576, 512), 8, 16 * K, 1.0), ((128, 1, 576, 512), 32, 4 * K, 1.0),
              ((128, 1, 576, 512), 16, 16 * K, 0.1), ((128, 1, 576, 512), 32, 16 * K, 0.5),
              ((128, 1, 576, 512), 8, 64 * K, 1.0)]


def lean_probe(reps, tbs, deadline, device="cuda", cells=None):
    from decode_conformance_kernels import lean, split_rule
    sms = split_rule.num_sms(device)
    rows = []
    for shape, bsz, ctx, ratio in cells or LEAN_CELLS:
        if time.time() > deadline:
            break
        lens = _ragged_lens(bsz, ctx, ratio, seed=1000 * bsz + ctx % 997 + int(ratio * 10))
        case = _case(shape, lens)
        mla = len(shape) == 4
        row = dict(cell=f"{_label(shape, lens)} r={ratio}",
                   floor_us=timing.kv_floor_us(1, case.total_keys, case.num_kv_heads, shape[2], 2, tbs,
                                               v_head_dim=0 if mla else None))
        batch = shared_batch(case, device)
        row["adaptive"], ref = time_on_batch("adaptive_split", batch, reps)
        ref = ref.float()
        args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)
        lse = torch.empty(case.batch, shape[0], device=device)
        for bn, w, st, mult, hr in LEAN_VARIANTS[576 if mla else shape[2]]:
            if time.time() > deadline:
                break
            name = f"lean_{bn}x{w}x{st}_g{mult}_h{hr}"
            try:
                launch = lean.plan_lean(*args, lse, sm_scale=case.sm_scale, programs=sms * mult, block_n=bn,
                                        num_warps=w, num_stages=st, head_rows=hr)
            except Exception as e:
                row[name + "_error"] = f"{type(e).__name__}: {str(e)[:160]}"
                continue
            _time_checked(row, name, launch, batch.out, ref, device, reps)
        rows.append(row)
        _print_row(row)
        if batch.out.is_cuda:
            torch.cuda.empty_cache()
    return rows


def _shipped_args(case, batch, device):
    """Positional and keyword arguments of a shipped-plan adaptive launch on `batch` (its own
    scratch, preallocated: graph capture then allocates nothing)."""
    shape = (case.num_q_heads, case.num_kv_heads, case.head_dim)
    S, occ = new.plan_splits(case.batch, *shape[:2], device=device, head_dim=shape[2], mla=case.mla)
    longest = max(case.seq_lens)
    chunks = new.chunk_axis(batch.q, batch.k_cache, batch.v_cache, S, longest)
    p_shape, l_shape = new.workspace_shapes(case.batch, shape[0], case.v_head_dim, chunks)
    kw = dict(sm_scale=case.sm_scale, lse=batch.lse, splits=S, occupancy=occ, max_visible=longest,
              partials=torch.empty(p_shape, device=device), partial_lse=torch.empty(l_shape, device=device))
    return [batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out], kw


STAGE2_CELLS = [((32, 8, 128), (128 * K,)), ((32, 8, 128), (32 * K,)), ((32, 8, 128), (8 * K,)),
                ((16, 2, 256), (128 * K,)), ((16, 2, 256), (32 * K,)), ((32, 8, 128), (64 * K,) * 2),
                ((16, 2, 256), (64 * K,) * 2)]


def stage2_probe(reps, tbs, deadline, device="cuda", cells=None):
    rows = []
    for _, _, case, row, batch, ref in _probe_cells(cells or STAGE2_CELLS, rows, reps, tbs, deadline, device):
        args, kw = _shipped_args(case, batch, device)
        row["chunks"] = kw["partials"].shape[2]
        shipped = new.tc.STAGE2_MAX_TILE
        for rnd, cap in enumerate((64, 128, 64, 128)):
            new.tc.STAGE2_MAX_TILE = cap
            try:
                _time_checked(row, f"tile{cap}_{rnd // 2}", lambda: new.decode_attention_adaptive(*args, **kw),
                              batch.out, ref, device, reps)
            finally:
                new.tc.STAGE2_MAX_TILE = shipped
        saved = new._adaptive_stage2
        new._adaptive_stage2 = _NoLaunch()
        try:
            row["s1only"] = timing.graph_median_us(lambda: new.decode_attention_adaptive(*args, **kw), device, reps=reps)
        finally:
            new._adaptive_stage2 = saved
    return rows


PDL_CELLS = [((32, 8, 128), (4 * K,)), ((16, 2, 256), (4 * K,)), ((32, 8, 128), (8 * K,)),
             ((32, 8, 128), (16 * K,)), ((32, 8, 128), (32 * K,)), ((32, 8, 128), (64 * K,)),
             ((32, 8, 128), (128 * K,)), ((16, 2, 256), (32 * K,)), ((16, 2, 256), (128 * K,)),
             ((32, 8, 128), (16 * K,) * 4), ((32, 8, 128), (16 * K,) * 16), ((32, 8, 128), (4 * K,) * 32),
             # the perf guard's b4-ragged and b32-8k cells (fixtures/perf_cells.toml)
             ((32, 8, 128), (128 * K, K, 64 * K, 7)), ((32, 8, 128), (8 * K,) * 32)]


def _rule_says_early(batch, kw):
    """What the shipped trigger rule decides for this launch (recorded next to the times)."""
    saved, seen = new.trigger_early, []
    new.trigger_early = lambda *a: seen.append(saved(*a)) or seen[-1]
    try:
        new.decode_attention_adaptive(batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices,
                                      batch.out, **kw)
    finally:
        new.trigger_early = saved
    return bool(seen and seen[-1])


def pdl_probe(reps, tbs, deadline, device="cuda", cells=None):
    rows = []
    for _, _, case, row, batch, ref in _probe_cells(cells or PDL_CELLS, rows, reps, tbs, deadline, device):
        args, kw = _shipped_args(case, batch, device)
        shipped = new.tc.USE_PDL, new.trigger_early
        row["rule"] = "start" if _rule_says_early(batch, kw) else "end"
        for rnd in range(2):
            for name, use, early in (("plain", False, None), ("pdl_start", True, True), ("pdl_end", True, False),
                                     ("shipped", True, None)):
                new.tc.USE_PDL = use
                if early is not None:
                    new.trigger_early = lambda *_a, e=early: e
                try:
                    _time_checked(row, f"{name}_{rnd}", lambda: new.decode_attention_adaptive(*args, **kw),
                                  batch.out, ref, device, reps)
                finally:
                    new.tc.USE_PDL, new.trigger_early = shipped
    return rows


LAYOUT_CELLS = [((32, 8, 128), (128 * K,)), ((16, 2, 256), (128 * K,)), ((32, 8, 128), (16 * K,) * 16),
                ((32, 8, 128), (64 * K,) * 16), ((32, 8, 128), (16 * K,) * 32)]


def _layouts(batch):
    """(name, k, v, slot ids) of the same keys in four layouts (see the module doc)."""
    def head_major(x):  # same logical tensor, the head axis stored outermost (below the page)
        return x.movedim(-2, -3).contiguous().movedim(-3, -2)
    idx = batch.kv_indices
    seq_k, seq_v = batch.k_slots()[idx.long()].contiguous(), batch.v_slots()[idx.long()].contiguous()
    order = torch.arange(idx.numel(), dtype=idx.dtype, device=idx.device)
    return [("paged_tok_major", batch.k_cache, batch.v_cache, idx),
            ("paged_head_major", head_major(batch.k_cache), head_major(batch.v_cache), idx),
            ("dense_tok_major", seq_k, seq_v, order),
            ("dense_head_major", seq_k.transpose(0, 1).contiguous().transpose(0, 1),
             seq_v.transpose(0, 1).contiguous().transpose(0, 1), order)]


def layout_probe(reps, tbs, deadline, device="cuda", cells=None):
    rows = []
    for _, _, case, row, batch, ref in _probe_cells(cells or LAYOUT_CELLS, rows, reps, tbs, deadline, device):
        args, kw = _shipped_args(case, batch, device)
        for name, k, v, idx in _layouts(batch):
            a = list(args)
            a[1], a[2], a[4] = k, v, idx
            _time_checked(row, name, lambda: new.decode_attention_adaptive(*a, **kw), batch.out, ref, device, reps)
    return rows


EMPTIES_CELLS = [((16, 2, 256), (K,) * 4), ((128, 1, 576, 512), (4 * K,) * 8), ((32, 8, 128), (16 * K,) * 4),
                 ((32, 8, 128), (16 * K,) * 16), ((32, 8, 128), (16 * K,) * 32), ((32, 8, 128), (64 * K,) * 16),
                 ((32, 8, 128), RAGGED16), ((32, 8, 128), (128 * K, K, 64 * K, 7)), ((32, 8, 128), (8 * K,) * 32),
                 ((32, 8, 128), (128 * K,)), ((16, 2, 256), (32 * K,) * 4), ((32, 8, 128), (4 * K,))]


def empties_probe(reps, tbs, deadline, device="cuda", cells=None):
    from decode_conformance_kernels import fixed_split
    rows = []
    for shape, lens, case, row, batch, ref in _probe_cells(cells or EMPTIES_CELLS, rows, reps, tbs, deadline, device):
        args, kw = _shipped_args(case, batch, device)
        occ = kw["occupancy"]
        chunks = new.chunk_axis(batch.q, batch.k_cache, batch.v_cache, occ, max(lens))
        p_shape, l_shape = new.workspace_shapes(case.batch, shape[0], case.v_head_dim, chunks)
        compact = dict(kw, splits=occ, partials=torch.empty(p_shape, device=device),
                       partial_lse=torch.empty(l_shape, device=device))
        row["chunks_shipped"], row["chunks_compact"], row["occupancy"] = kw["partials"].shape[2], chunks, occ
        fixed_kw = dict(sm_scale=case.sm_scale, lse=batch.lse,
                        partials=torch.empty((case.batch, shape[0], fixed_split.DEFAULT_SPLITS, case.v_head_dim),
                                             device=device),
                        partial_lse=torch.empty((case.batch, shape[0], fixed_split.DEFAULT_SPLITS), device=device))
        variants = [("shipped", kw)]
        if len(set(lens)) == 1:  # the compact grid is valid for uniform batches only
            variants.append(("compact", compact))
        for rnd in range(3):
            for name, launch_kw in variants:
                _time_checked(row, f"{name}_{rnd}", lambda k=launch_kw: new.decode_attention_adaptive(*args, **k),
                              batch.out, ref, device, reps)
                if rnd > 0:
                    continue
                saved = new._adaptive_stage2
                new._adaptive_stage2 = _NoLaunch()
                try:
                    _time_checked(row, f"{name}_s1only", lambda k=launch_kw: new.decode_attention_adaptive(*args, **k),
                                  batch.out, ref, device, reps, check=False)
                finally:
                    new._adaptive_stage2 = saved
            _time_checked(row, f"fixed_{rnd}", lambda: fixed_split.decode_attention_fixed(*args, **fixed_kw),
                          batch.out, ref, device, reps)
    return rows


def probe(reps, tbs, deadline, group="launch"):
    rows = []
    lists = (("waves", WAVES),) if group == "waves" else (("long", LONG), ("short", SHORT))
    for kind, cells in lists:
        for shape, lens in cells:
            if time.time() > deadline:
                return rows
            case = _case(shape, lens)
            mla = len(shape) == 4
            row = dict(cell=_label(shape, lens), kind=kind,
                       floor_us=timing.kv_floor_us(1, case.total_keys, case.num_kv_heads, case.head_dim, 2, tbs,
                                                   v_head_dim=0 if mla else None))
            try:
                kernel = registry.adaptive_split()
                batch = prepare(kernel, case, "cuda")
                fx = registry.fixed_split()
                fb = prepare(fx, case, "cuda")
                f_launch = fx.plan(fb)
                row["fixed"] = timing.graph_median_us(f_launch, "cuda", reps=reps)
                f_launch()
                ref = fb.out.float().clone()
                if not mla:
                    s_launch, s_get = _sdpa(case, batch)
                    row["sdpa"] = timing.graph_median_us(s_launch, "cuda", reps=reps)
                    s_launch()
                    ref = s_get().float()
                del fb
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
                continue
            S0, occ0 = new.plan_splits(case.batch, shape[0], shape[1], device="cuda", mla=mla, head_dim=shape[2])
            longest = max(lens)
            args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)
            base = dict(sm_scale=case.sm_scale, lse=batch.lse)
            bound = dict(max_visible=longest)
            variants = {"new": {}, "new_bound": bound, "new_s1only": dict(bound, _s1only=True)}
            if old is not None:
                variants["old"] = dict(_old=True)
            if group == "launch":
                _launch_variants(variants, bound, kind, shape, mla, case)
            elif group == "waves":
                variants.pop("new_s1only")
                _wave_variants(variants, bound, occ0, S0)
            else:
                _chunk_variants(variants, bound, shape, mla)
            row["S0"], row["occ0"] = S0, occ0
            for name, kw in variants.items():
                if time.time() > deadline:
                    break
                kw = dict(kw)
                mod = old if kw.pop("_old", False) else new
                s1only = kw.pop("_s1only", False)
                replan = kw.pop("_replan", False)
                if replan:
                    S, occ = new.plan_splits(case.batch, shape[0], shape[1], num_sms=kw.pop("num_sms"), mla=mla)
                    kw |= dict(splits=S, occupancy=occ)
                splits = kw.get("splits", S0)
                if kw.get("max_visible") is not None:  # the partials stop at the bound's chunk count
                    splits = new.chunk_axis(batch.q, batch.k_cache, batch.v_cache, splits, kw["max_visible"],
                                            kw.get("min_chunk", new.split_rule.MIN_CHUNK), kw.get("block_n"))
                p = torch.empty((case.batch, shape[0], splits, case.v_head_dim), device="cuda")
                pl = torch.empty((case.batch, shape[0], splits), device="cuda")
                saved = mod._adaptive_stage2
                try:
                    if s1only:
                        mod._adaptive_stage2 = _NoLaunch()
                    fn = lambda: mod.decode_attention_adaptive(*args, partials=p, partial_lse=pl, **base, **kw)  # noqa: E731
                    _time_checked(row, name, fn, batch.out, ref, "cuda", reps, check=not s1only)
                finally:
                    mod._adaptive_stage2 = saved
            rows.append(row)
            _print_row(row)
            del batch
            torch.cuda.empty_cache()
    return rows


# The rounds with a function of their own (the others are variant groups of `probe`).
ROUNDS = {"pipeline": pipeline_probe, "lean": lean_probe, "stage2": stage2_probe, "pdl": pdl_probe,
          "layout": layout_probe, "empties": empties_probe}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=420)
    ap.add_argument("--variants", choices=("launch", "chunks", "waves", *ROUNDS),
                    default="launch",
                    help="launch: slices, budget, configs (rounds 1-2); chunks: smallest chunk, programs per SM; "
                         "waves: the occupancy count on batched cells; pipeline: double-buffered launch configs; "
                         "lean: Lean's launch config and head tile; stage2: the merge tile at batch 1; "
                         "pdl: stage 2 as a dependent launch; layout: the cache layout's share; "
                         "empties: empty stage-1 programs and stage 2 on batched cells")
    add_flush_option(ap)
    a = ap.parse_args()
    timing.set_bench_flush(a.flush)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + a.max_seconds
    tbs = timing.copy_bandwidth_tbs()
    meta = run_meta(a.reps, tbs, old_kernels=old is not None)
    print(json.dumps(meta), flush=True)
    if a.variants in ROUNDS:
        rows = ROUNDS[a.variants](a.reps, tbs, deadline)
    else:
        rows = probe(a.reps, tbs, deadline, a.variants)
    meta["ir"] = _ir_counts(new._adaptive_stage1)
    (out / "probe.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()

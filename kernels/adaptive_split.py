"""Adaptive split-K decode attention: chunk count from the request length and the SM count
(the split-K rule of FlashML PR #729; the rule itself is in `split_rule`).

Stage 1, grid (B, KV-head tiles, chunks): the host sizes the chunk axis for the most chunks
any request can take (`split_rule.grid_splits`, the chunk budget, or fewer when it knows a
bound on the lengths). Each program reads its request's current length and the batch's total
from kv_indptr, computes the request's cap (its share of the budget, at least the batch's
occupancy count), its chunk count and its chunk's [start, end) with `request_cap_device` /
`chunk_count_device` / `chunk_bounds_device` (mirrors of the pure-python rule), and does
nothing when its chunk is past the end: no host sync, so one captured CUDA graph serves every
length. A request of one chunk (or none) is finished in stage 1: out and lse written there,
no partial round trip (the direct path).
Stage 2, grid (B, Hq, column slices): recomputes the count, leaves rows of fewer than two
chunks alone and merges the others SPLIT_TILE partials per step (the most chunks a request of
the launch can take, at least 8, rounded up to a power of two, <= 128 partials and <= 8192 fp32
elements); a batch with fewer rows than SMs cuts the columns into slices
(`triton_common.stage2_slices`). When the host knows no request can take two chunks, stage 2
is not launched. On NVIDIA sm_90+ stage 2 is a programmatic
dependent launch: its programs wait on the SMs for stage 1 to finish (`tc.wait_for_primary`)
instead of being launched after it.
Stage 1's own merge (`merge_counters`): the last program of a (request, head tile) to finish
merges the tile's partials and stage 2 is not launched. The adapter's plans use it in the 16-bit
4-warp row at up to STAGE1_MERGE_UP_TO programs per request (`stage1_merge_up_to`).

Usable outside the suite through `decode_attention_adaptive(...)`; adapter `AdaptiveSplitKernel`.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from decode_conformance.reference import FP8_Q_AND_P

from . import kv_layout, split_rule
from . import triton_common as tc
from .split_k_adapter import SPLIT_K_CAPS, plan_launch


@triton.jit
def chunk_count_device(length, cap, MIN_CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Mirror of split_rule.chunk_count_for_cap: min(max(1, L // MIN_CHUNK), cap, ceil(L / BLOCK));
    0 when length is 0. int32: lengths up to 2**31 - 1 - BLOCK."""
    nblocks = (length + BLOCK - 1) // BLOCK
    n = tl.maximum(length // MIN_CHUNK, 1)
    n = tl.minimum(n, cap)
    return tl.minimum(n, nblocks)


@triton.jit
def axis_cap_device(length, total, grid, occupancy, ceiling):
    """Mirror of min(split_rule.request_cap, ceiling): min(ceiling, max(occupancy, floor(grid *
    length / total))), with ceiling = min(grid, the stage-1 chunk axis) from the host (int64
    products: a 2^31-key batch times a 128-chunk budget). The axis bound takes the place of the
    grid's in the one `min`: as a second `min` it took bf16 32/8/128 stage 1 from 96 registers
    to 106, one program per SM fewer (docs/gpu-runs/2026-12-03-h200-s23; folded: 96, s24)."""
    # (no .to() on grid / occupancy / ceiling: an int argument equal to 1 arrives as a constexpr)
    share = (length.to(tl.int64) * grid) // tl.maximum(total, 1).to(tl.int64)
    return tl.minimum(tl.maximum(share, occupancy), ceiling).to(tl.int32)


@triton.jit
def request_cap_device(length, total, grid, occupancy):
    """Mirror of split_rule.request_cap: min(grid, max(occupancy, floor(grid * length / total)))."""
    return axis_cap_device(length, total, grid, occupancy, grid)


@triton.jit
def _request_cap_probe(lengths, totals, caps, grid, occupancy):
    i = tl.program_id(0)
    tl.store(caps + i, request_cap_device(tl.load(lengths + i), tl.load(totals + i), grid, occupancy))


def device_request_caps(lengths, totals, grid: int, occupancy: int):
    """Run request_cap_device for every (length, total) pair (tests hold it to the host rule)."""
    lengths = lengths.to(torch.int32).contiguous()
    totals = totals.to(device=lengths.device, dtype=torch.int32).contiguous()
    caps = torch.full_like(lengths, -1)
    if lengths.numel():
        _request_cap_probe[(lengths.numel(),)](lengths, totals, caps, grid, occupancy)
    return caps


@triton.jit
def chunk_bounds_device(i, n, length, BLOCK: tl.constexpr):
    """Mirror of split_rule.chunk_bounds (int64: i * nblocks cannot overflow). Needs n >= 1."""
    nblocks = ((length + BLOCK - 1) // BLOCK).to(tl.int64)
    i64 = i.to(tl.int64)
    start = (i64 * nblocks // n) * BLOCK
    end = ((i64 + 1) * nblocks // n) * BLOCK
    return tl.minimum(start, length).to(tl.int32), tl.minimum(end, length).to(tl.int32)


@triton.jit
def _split_rule_probe(lengths, caps, counts, starts, ends, MIN_CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                      MAX_CHUNKS: tl.constexpr):
    """Writes the device formula's count and chunk bounds for lengths[i] under caps[i]
    (row i of starts/ends holds MAX_CHUNKS entries; those >= count are left alone)."""
    i = tl.program_id(0)
    length = tl.load(lengths + i)
    n = chunk_count_device(length, tl.load(caps + i), MIN_CHUNK, BLOCK)
    tl.store(counts + i, n)
    c = tl.arange(0, MAX_CHUNKS)
    c0, c1 = chunk_bounds_device(c, tl.maximum(n, 1), length, BLOCK)
    row = i.to(tl.int64) * MAX_CHUNKS + c
    tl.store(starts + row, c0, mask=c < n)
    tl.store(ends + row, c1, mask=c < n)


def device_split_table(lengths, caps, min_chunk: int = split_rule.MIN_CHUNK, block: int = split_rule.KEY_BLOCK):
    """Run the device formula for every (length, cap) pair: (counts [N], starts [N, M], ends [N, M])
    with M = next power of two >= max(caps); entries past a row's count are -1. For tests that
    hold the host and device formulas together."""
    device = lengths.device
    lengths = lengths.to(torch.int32).contiguous()
    caps = caps.to(device=device, dtype=torch.int32).contiguous()
    n = lengths.numel()
    m = tc.next_pow2(max(2, int(caps.max()) if n else 2))
    counts = torch.full((n,), -1, dtype=torch.int32, device=device)
    starts = torch.full((n, m), -1, dtype=torch.int32, device=device)
    ends = torch.full((n, m), -1, dtype=torch.int32, device=device)
    if n:
        _split_rule_probe[(n,)](lengths, caps, counts, starts, ends, MIN_CHUNK=int(min_chunk), BLOCK=int(block),
                                MAX_CHUNKS=m)
    return counts, starts, ends


# Runtime flags, and the per-program scalars that Triton need not specialize (triton_common)
@triton.jit(do_not_specialize=["has_sinks", "store_lse", "pdl_early", "visible", "grid", "occupancy", "B",
                             "ceiling", *tc.LSE_STRIDES, *tc.HEAD_TILING_INTS])
def _adaptive_stage1(
    Q, stride_qb, stride_qh, stride_qd,
    K, stride_kp, stride_kt, stride_kh, stride_kd,
    V, stride_vp, stride_vt, stride_vh, stride_vd,
    page_size, kv_indptr, kv_indices,
    Part, stride_pb, stride_ph, stride_ps,
    PartLse, stride_lb, stride_lh,
    Out, stride_ob, stride_oh, stride_od,
    Lse, stride_lseb, stride_lseh,
    Sinks, v_scale, has_sinks, store_lse,
    group, heads_per_tile, tiles_per_kv,
    qk_scale, softcap, visible, grid, occupancy, B, ceiling, pdl_early, Counters,
    D_MAIN: tl.constexpr, D_PE: tl.constexpr, DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    SOFTCAP: tl.constexpr, SHARE_KV: tl.constexpr, E4M3_BITS: tl.constexpr,
    MIN_CHUNK: tl.constexpr, CHUNK_BLOCK: tl.constexpr, FP8_MMA: tl.constexpr, PDL: tl.constexpr,
    MERGE_HEADS: tl.constexpr, MERGE_SPLITS: tl.constexpr, GROUP_DIV16: tl.constexpr, TILE_DIV16: tl.constexpr,
):
    tc.allow_dependents(PDL, pdl_early != 0)
    group, heads_per_tile = tc.hinted_head_tiling(group, heads_per_tile, GROUP_DIV16, TILE_DIV16)
    b = tl.program_id(0)
    tile = tl.program_id(1)
    chunk = tl.program_id(2)
    lo = tl.load(kv_indptr + b)
    L = tl.load(kv_indptr + b + 1) - lo
    vis_start = tl.maximum(L - visible, 0)
    L_vis = L - vis_start
    total = tl.load(kv_indptr + B) - tl.load(kv_indptr)
    n = chunk_count_device(L_vis, axis_cap_device(L_vis, total, grid, occupancy, ceiling), MIN_CHUNK,
                           CHUNK_BLOCK)
    if chunk < tl.maximum(n, 1):
        # A request of one chunk (or none: an empty range) is finished here, out and lse
        # written directly (no partial; stage 2 skips the row). Otherwise chunk `chunk` of n.
        c0, c1 = chunk_bounds_device(chunk, tl.maximum(n, 1), L_vis, CHUNK_BLOCK)
        acc, m_i, l_i, head0 = tc.attend_tile(
            b, tile, vis_start + c0, vis_start + c1,
            Q, stride_qb, stride_qh, stride_qd,
            K, stride_kp, stride_kt, stride_kh, stride_kd,
            V, stride_vp, stride_vt, stride_vh, stride_vd,
            page_size, kv_indices + lo.to(tl.int64),
            group, heads_per_tile, tiles_per_kv, qk_scale, softcap,
            D_MAIN, D_PE, DV, BLOCK_H, BLOCK_N, BLOCK_DMODEL, BLOCK_DPE, BLOCK_DV, SOFTCAP, SHARE_KV, E4M3_BITS,
            FP8_MMA)
        if n <= 1:
            tc.store_final(b, head0, acc, m_i, l_i, Out, stride_ob, stride_oh, stride_od,
                           Lse, stride_lseb, stride_lseh, Sinks, v_scale, heads_per_tile, has_sinks, store_lse,
                           DV, BLOCK_H, BLOCK_DV)
        else:
            tc.store_partial(b, head0, chunk, acc, m_i, l_i, Part, stride_pb, stride_ph, stride_ps,
                             PartLse, stride_lb, stride_lh, heads_per_tile, DV, BLOCK_H, BLOCK_DV)
            if MERGE_SPLITS > 0:  # merged here by the last of the n programs, not by a stage 2
                tc.merge_if_last(b, head0, n, Counters + b * tl.num_programs(1) + tile,
                                 Part, stride_pb, stride_ph, stride_ps, PartLse, stride_lb, stride_lh,
                                 Out, stride_ob, stride_oh, stride_od, Lse, stride_lseb, stride_lseh, Sinks,
                                 v_scale, heads_per_tile, has_sinks, store_lse, DV, MERGE_HEADS, MERGE_SPLITS, BLOCK_DV)
    tc.allow_dependents(PDL, pdl_early == 0)


@triton.jit(do_not_specialize=["has_sinks", "store_lse", "visible", "grid", "occupancy", "B", "ceiling",
                             *tc.LSE_STRIDES])
def _adaptive_stage2(
    kv_indptr, visible, grid, occupancy, B, ceiling,
    Part, stride_pb, stride_ph, stride_ps,
    PartLse, stride_lb, stride_lh,
    Out, stride_ob, stride_oh, stride_od,
    Lse, stride_lseb, stride_lseh,
    Sinks, v_scale, has_sinks, store_lse,
    DV: tl.constexpr, SPLIT_TILE: tl.constexpr, SLICE_DV: tl.constexpr, SMALL_TILE: tl.constexpr,
    MIN_CHUNK: tl.constexpr, CHUNK_BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    # kv_indptr is an input of both stages (stage 1 does not write it): read before the wait
    L = tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b)
    L_vis = L - tl.maximum(L - visible, 0)
    total = tl.load(kv_indptr + B) - tl.load(kv_indptr)
    n = chunk_count_device(L_vis, axis_cap_device(L_vis, total, grid, occupancy, ceiling), MIN_CHUNK,
                           CHUNK_BLOCK)
    tc.wait_for_primary(PDL)
    if n >= 2:  # rows of 0 or 1 chunk were finished in stage 1
        tc.stage2_row(b, h, n, tl.program_id(2) * SLICE_DV,
                      Part, stride_pb, stride_ph, stride_ps,
                      PartLse, stride_lb, stride_lh,
                      Out, stride_ob, stride_oh, stride_od,
                      Lse, stride_lseb, stride_lseh,
                      Sinks, v_scale, has_sinks, store_lse, DV, SPLIT_TILE, SLICE_DV, SMALL_TILE)


# Where stage 1 lets its dependent stage 2 launch (PDL, sm_90+). A stage-2 program launched
# early is placed at once on whatever SM has room, and waits there for stage 1 to finish: when
# stage 1 leaves room for all of them they are spread over the GPU, otherwise they pile onto
# the few free SMs and merge there, slower than a stage 2 launched after stage 1. H200 (probe
# round 8, docs/gpu-runs/2026-12-01-h200/probe9): triggered at the start, 32/8/128 and
# 16/2/256 at 1 x 4k and 32/8/128 at 1 x 8k ran 0.8-0.9 us faster (room for both grids), but
# 16/2/256 at 1 x 32k and 1 x 128k (256 of 264 slots taken by stage 1) 0.5 us slower;
# triggered at the end of each program, those ran 0.2-0.7 us faster and the short cells gained
# 0-0.5 us. With this rule (close15, 12 cells from 1 x 4k to 32 x 4k) every cell ran within
# 0.7 us of the better of the two triggers and none slower than without PDL.
def trigger_early(stage1_programs: int, stage2_programs: int, slots: int) -> bool:
    """True: stage 1 triggers the dependent launch at each program's start, because stage 2's
    programs fit in the program slots (`programs per SM x SMs` of stage 1) stage 1 leaves
    free; False: at each program's end."""
    return stage1_programs + stage2_programs <= slots


def plan_splits(batch: int, num_q_heads: int, num_kv_heads: int, *, device=None, num_sms: Optional[int] = None,
                max_splits: Optional[int] = None, mla: bool = False, head_dim: int = 128,
                kv_bytes: int = 2, fp8_mma: bool = False, planned_seq_lens: Optional[Sequence[int]] = None,
                window: Optional[int] = None) -> tuple[int, int]:
    """(the stage-1 grid's split axis = the chunk budget, the batch's occupancy count);
    kv_bytes: the cache's element size (1: fp8); fp8_mma: an fp8 cache's dots stay fp8;
    planned_seq_lens (cache lengths, before the `window`): the lengths the launch is planned for,
    when known: a ragged batch's budget is then `split_rule.share_budget`'s."""
    tiles = tc.head_tiling(num_q_heads, num_kv_heads)["kv_head_tiles"]
    sms = num_sms if num_sms is not None else split_rule.num_sms(device)
    pps, rule_cap = split_rule.launch_shape(head_dim, mla, kv_bytes, fp8_mma)
    split_pps = split_rule.split_programs_per_sm(head_dim, mla, kv_bytes)
    cap = max_splits or rule_cap
    budget = split_rule.grid_splits(batch, tiles, sms, cap, pps, split_pps)
    occupancy = split_rule.occupancy_splits(batch, tiles, sms, cap, pps, split_pps)
    if planned_seq_lens is not None and split_pps is not None:
        lens = [int(x) for x in planned_seq_lens]
        budget = split_rule.share_budget(kv_layout.visible_lengths(lens, window), sum(lens), budget, occupancy,
                                         split_rule.grid_splits(batch, tiles, sms, cap, pps))
    return budget, occupancy


workspace_shapes = tc.partial_shapes

# Stage 1's own merge (merge_counters) has a round of [query heads of a tile, Dv] fp32 loads in
# flight, one per partial: at most this many elements in all (16 per thread of a 4-warp program)
# and STAGE2_SMALL_TILE partials. 32/8/128: 4 partials of 4 heads x 128; 16/2/256: 1 of 8 x 256;
# MLA's 16 or more heads x 512 columns do not fit and keep stage 2. Why 2048: compiled for sm_90
# (ci/compile_check.py's recorded launches), the merging bf16 32/8/128 stage 1 keeps the shipped
# variant's registers at 2048 on triton 3.6 and 3.9 (96 and 94: 5 programs per SM); at 4096 it
# took 114 on 3.9 (and 146 as one [heads, partials, Dv] load), 4 programs per SM.
STAGE1_MERGE_ELEMS = 2048


# The adapter's plans (AdaptiveSplitKernel) have stage 1 merge where it launches at most this many
# programs per request, in the 16-bit 4-warp row (`split_rule.split_programs_per_sm`), where it was
# timed: H200, one process (docs/gpu-runs/2026-12-05-h200-s30, s30-2), with that row's counts, 32/8/128
# b32-8k (2 chunks) 251.1 us against 256.5 for the same counts' two stages (-2.1 %). 8 is two rounds
# of 4-partial loads at 32/8/128; merging up to 24 (b4-32k's 16 chunks too) cost b4-32k 2 % (s30-1).
# Elsewhere (the fp8, 8-warp and MLA rows: not timed) the two stages run as before.
STAGE1_MERGE_UP_TO = 8


def stage1_merge_up_to(head_dim: int, mla: bool, kv_bytes: int) -> Optional[int]:
    """The most stage-1 programs per request at which a plan has stage 1 merge (STAGE1_MERGE_UP_TO
    in the 16-bit 4-warp row), or None: no merge in stage 1."""
    return STAGE1_MERGE_UP_TO if split_rule.split_programs_per_sm(head_dim, mla, kv_bytes) else None


def stage1_merge_splits(merge_heads: int, block_dv: int) -> int:
    """Partials per head in one of stage 1's merge loads; 0 where a tile's heads do not fit."""
    return min(tc.STAGE2_SMALL_TILE, STAGE1_MERGE_ELEMS // (merge_heads * block_dv))


def stage1_merge_plan(programs: int, up_to: Optional[int], merge_heads: int, block_dv: int) -> int:
    """Partials per head in one of stage 1's merge loads for a launch with merge counters and
    `programs` stage-1 programs per request (`merge_in_stage1_up_to` = up_to; None: any count), or
    0: stage 1 does not merge (fewer than two programs, more than up_to, or heads that do not fit)."""
    if programs < 2 or (up_to is not None and programs > up_to):
        return 0
    return stage1_merge_splits(merge_heads, block_dv)


def merge_counter_shape(batch: int, num_q_heads: int, num_kv_heads: int) -> tuple[int, int]:
    """The shape of `decode_attention_adaptive`'s merge_counters: one per (request, KV-head tile)."""
    return batch, tc.head_tiling(num_q_heads, num_kv_heads)["kv_head_tiles"]


def check_merge_counters(counters, batch: int, tiles: int, device) -> None:
    if counters.dtype != torch.int32 or tuple(counters.shape) != (batch, tiles) or not counters.is_contiguous():
        raise ValueError(f"merge_counters: expected a contiguous int32 tensor of shape {(batch, tiles)} (requests, "
                         f"KV-head tiles), got {counters.dtype} {tuple(counters.shape)}")
    if counters.device != torch.device(device):
        raise ValueError(f"merge_counters: expected a tensor on {torch.device(device)} (q's device), "
                         f"got {counters.device}")


def chunk_axis(q, k_cache, v_cache, splits: int, max_visible: Optional[int], min_chunk: int = split_rule.MIN_CHUNK,
               block_n: Optional[int] = None) -> int:
    """The stage-1 grid's chunk axis, and the partials' split dimension: the chunk budget
    `splits`, or, under a bound on the visible lengths, the chunk count of a request that long
    (counts grow with length, so none takes more)."""
    if max_visible is None:
        return int(splits)
    if block_n is None:
        dims = tc.head_dims(q.shape[-1], v_cache.shape[-1])
        block_n = tc.kernel_config(q.device, q.shape[-1], v_cache.shape[-1], tc.shares_kv(k_cache, v_cache, dims),
                                   kv_bytes=k_cache.element_size())["block_n"]
    return max(1, split_rule.chunk_count_for_cap(int(max_visible), int(splits), min_chunk, block_n))


def decode_attention_adaptive(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, out: torch.Tensor, *,
    sm_scale: float, lse: Optional[torch.Tensor] = None,
    k_scale: float = 1.0, v_scale: float = 1.0, softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None, window: Optional[int] = None,
    splits: Optional[int] = None, occupancy: Optional[int] = None, max_splits: Optional[int] = None,
    num_sms: Optional[int] = None,
    min_chunk: int = split_rule.MIN_CHUNK,
    partials: Optional[torch.Tensor] = None, partial_lse: Optional[torch.Tensor] = None,
    block_n: Optional[int] = None, num_warps: Optional[int] = None, num_stages: Optional[int] = None,
    fp8_mma: bool = False, max_visible: Optional[int] = None, stage2_slices: Optional[int] = None,
    planned_seq_lens: Optional[Sequence[int]] = None,
    merge_counters: Optional[torch.Tensor] = None, merge_in_stage1_up_to: Optional[int] = None,
) -> None:
    """Adaptive split-K decode attention; same tensors as `fixed_split.decode_attention_fixed`.

    splits: the chunk budget, the most chunks any request takes; default that of
    `plan_splits(B, Hq, Hkv, num_sms=..., max_splits=..., head_dim=Dk, mla=Dv < Dk, kv_bytes=...,
    fp8_mma=..., planned_seq_lens=..., window=...)`.
    occupancy: the least cap of a request (default the batch's occupancy count, at most
    `splits`). Keep both (and the scratch, `workspace_shapes(B, Hq, Dv, chunk_axis(...))`)
    fixed across calls of one CUDA graph: the chunk counts follow the lengths on the device.
    min_chunk: smallest chunk of the length rule.
    fp8_mma: on an fp8 cache, quantize q and P to the fp8 type and run both dots fp8 x fp8
    (faster MMAs, the precision tier "fp8-q-and-p"); needs sm_89+ / gfx942 / gfx950.
    max_visible: a bound on the visible length of every request of every launch of these
    buffers, when the caller has one (a CUDA graph: the capacity it serves). The grid's
    chunk axis then stops at the chunk count of a request that long, and when no request can
    take two chunks (max_visible < 2 x min_chunk, or a budget of one) stage 2 is not
    launched: each request is finished in stage 1 (one chunk, or none, takes the direct path
    on the device either way). A request past the bound is still computed in full, in no
    more chunks than the axis has programs (fewer, longer ones: slower, not wrong).
    stage2_slices: stage-2 programs per (request, head), each merging a slice of the output
    columns (default `tc.stage2_slices`).
    planned_seq_lens: the cache lengths (before the window) this launch is sized for, when the
    caller knows them (a plan, or an eager call): stage 1 then launches as many programs per
    request and head tile as the most chunks one of them takes, not one per chunk the budget
    allows (the partials keep room for those), and stage 2 is launched only when one of them
    takes two or more, with a tile for that many. Other lengths (a graph's replays) stay right:
    a request is then cut into at most that many chunks, longer ones. A chunk axis sized for
    the budget was mostly programs with nothing to do (32 x 8k: 16384 launched, 1280 with work).
    merge_counters: int32 [B, KV-head tiles] (`merge_counter_shape`), all 0; every launch leaves
    them 0 again. Stage 1 then merges the partials itself, in the last of a request's programs
    to finish each head tile (`tc.merge_if_last`), and stage 2 is not launched. Only where a
    tile's query heads x Dv fit one merge load (`stage1_merge_splits`) and, with
    merge_in_stage1_up_to, where stage 1 has at most that many programs per request; elsewhere
    the two stages run as without it.
    """
    B, Hq, Hkv, Dk, Dv = tc.check_inputs(q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, sinks)
    if splits is None or occupancy is None:
        grid, occ = plan_splits(B, Hq, Hkv, device=q.device, num_sms=num_sms, max_splits=splits or max_splits,
                                mla=Dv < Dk, head_dim=Dk, kv_bytes=k_cache.element_size(), fp8_mma=fp8_mma,
                                planned_seq_lens=planned_seq_lens, window=window)
        splits = grid if splits is None else splits
        occupancy = occ if occupancy is None else occupancy
    S = int(splits)
    occupancy = max(1, min(int(occupancy), S))
    if S < 1 or min_chunk < 1:
        raise ValueError(f"splits={splits} and min_chunk={min_chunk} must be >= 1")
    ctx = tc.split_k_setup(q, k_cache, v_cache, block_n, num_warps, num_stages, fp8_mma=fp8_mma)
    tiling, dims, block_n = ctx.tiling, ctx.dims, ctx.block_n
    grid_chunks = chunk_axis(q, k_cache, v_cache, S, max_visible, min_chunk, block_n)
    programs = grid_chunks  # stage 1's chunk axis; the partials keep grid_chunks
    if planned_seq_lens is not None:
        lens = [int(x) for x in planned_seq_lens]
        if len(lens) != B:
            raise ValueError(f"planned_seq_lens: expected {B} lengths (the batch), got {len(lens)}")
        programs = min(grid_chunks, split_rule.most_chunks(kv_layout.visible_lengths(lens, window), sum(lens), S,
                                                           occupancy, min_chunk, block_n))
    partials, partial_lse = tc.split_k_scratch(q, partials, partial_lse, workspace_shapes(B, Hq, Dv, grid_chunks))
    # No request of any launch of these buffers takes more chunks than stage 1 has programs (the device's cap
    # stops at the `ceiling`, `programs`: never more than the axis, which never exceeds the budget S), so stage
    # 2 and its tile follow the programs, not the partials' room. A plan whose requests all take one chunk
    # launches no stage 2 (docs/gpu-runs/2026-12-04-h200-s24, s24-7, 32/8/128 b64-2k, one chunk each: 130.8 and
    # 130.6 us with a stage 2 that has nothing to merge, 127.7 with a budget of one, which launches none); one
    # of at most 8 chunks merges with the 8-wide tile alone (sized for the partials' 64 at b32-8k, stage 2 ran
    # 8-warp programs in two waves: 14.5 us in s24-6).
    merge_heads = tc.next_pow2(tiling["heads_per_tile"])
    merge_splits = 0  # partials per head in one of stage 1's merge loads; 0: no merge in stage 1
    if merge_counters is not None:
        check_merge_counters(merge_counters, B, tiling["kv_head_tiles"], q.device)
        merge_splits = stage1_merge_plan(programs, merge_in_stage1_up_to, merge_heads, dims["BLOCK_DV"])
    merge = programs >= 2 and not merge_splits  # stage 2 runs; else stage 1 finished every request
    pdl = tc.dependent_launch(q)  # stage 1 takes the flag whether or not stage 2 follows: one variant
    slices = (stage2_slices or tc.stage2_slices(B * Hq, dims["BLOCK_DV"], q.device)) if merge else 0
    early = merge and pdl and trigger_early(B * tiling["kv_head_tiles"] * programs, B * Hq * slices,
                                            split_rule.launch_shape(Dk, Dv < Dk, k_cache.element_size(), fp8_mma)[0]
                                            * split_rule.num_sms(q.device))
    visible = tc.visible_arg(window)
    outputs = tc.output_args(out, lse, sinks, v_scale, partial_lse)
    _adaptive_stage1[(B, tiling["kv_head_tiles"], programs)](
        *tc.cache_args(q, ctx, kv_indptr, kv_indices), *tc.partial_args(partials, partial_lse), *outputs,
        *tc.tile_args(ctx, sm_scale, k_scale, softcap), visible, S, occupancy, B, programs, int(early),
        merge_counters if merge_splits else kv_indptr,  # (not read without the merge)
        **tc.stage1_constexprs(ctx, softcap),
        MIN_CHUNK=int(min_chunk), CHUNK_BLOCK=block_n, FP8_MMA=tc.fp8_mma_code(k_cache, fp8_mma), PDL=int(pdl),
        MERGE_HEADS=merge_heads if merge_splits else 0, MERGE_SPLITS=merge_splits)
    if not merge:
        return
    slice_dv = dims["BLOCK_DV"] // slices
    tile = tc.split_tile(max(programs, tc.STAGE2_SMALL_TILE), slice_dv)  # counts <= 8: the 8-wide tile, as before
    _adaptive_stage2[(B, Hq, slices)](
        kv_indptr, visible, S, occupancy, B, programs, *tc.partial_args(partials, partial_lse), *outputs,
        DV=Dv, SPLIT_TILE=tile, SLICE_DV=slice_dv, SMALL_TILE=min(tile, tc.STAGE2_SMALL_TILE),
        MIN_CHUNK=int(min_chunk), CHUNK_BLOCK=block_n, PDL=int(pdl),
        num_warps=4 if tile * slice_dv <= 4096 else 8, num_stages=1, **({"launch_pdl": True} if pdl else {}))


CAPS = SPLIT_K_CAPS


class AdaptiveSplitKernel:
    """Adapter for the suite. The chunk budget is `split_rule.grid_splits` for the batch's
    size, head tiling and the device's SM count (`split_rule.share_budget`'s for a ragged batch
    sized for its lengths); batch.num_splits, when set, caps it.

    chunks: every request cut into exactly that many chunks (fewer only where it has fewer than
    chunks x min_chunk keys), whatever the batch and the SM count: a sweep's fixed count.
    (`max_splits` is not that: it caps the budget, and the rule then picks the occupancy count
    under it - at 32/8/128 b32-8k max_splits=3 ran 2 chunks.)

    sized_for_lengths=False launches as dispatch does under CUDA-graph capture (and as a
    caller of `decode_attention_adaptive` that passes neither `max_visible` nor
    `planned_seq_lens`): the chunk axis and the partials at the budget, every request's chunk
    count left to the device. A plan sized for its lengths bounds both stages' counts by the
    longest request's, which hides a stage-2 count that disagrees with stage 1's on every
    planned launch (vLLM #47188 in fixtures/mutants.toml); this configuration is where such
    a count shows on a CPU (registry `adaptive_split_graph`, opt-in)."""

    name = "adaptive_split"
    caps = CAPS

    fp8_mma = False

    def __init__(self, num_sms: Optional[int] = None, max_splits: Optional[int] = None,
                 min_chunk: int = split_rule.MIN_CHUNK, block_n: Optional[int] = None,
                 sized_for_lengths: bool = True, chunks: Optional[int] = None):
        self.num_sms = num_sms
        self.max_splits = max_splits
        self.chunks = chunks
        self.min_chunk = min_chunk
        self.block_n = block_n
        self.sized_for_lengths = sized_for_lengths
        if not sized_for_lengths:
            self.name = f"{type(self).name}_graph"

    def chunk_budget(self, batch) -> tuple[int, int]:
        """(chunk budget, occupancy count) for this batch: the rule's (`plan_splits`), or with
        `chunks` both that count. A subclass that overrides this times another rule through the
        same launch (the device takes both as arguments, whatever their values)."""
        if self.chunks:  # the rule bypassed: budget and occupancy count both `chunks`
            return int(self.chunks), int(self.chunks)
        return plan_splits(batch.batch_size, batch.num_q_heads, batch.num_kv_heads, device=batch.device,
                           num_sms=self.num_sms, max_splits=batch.num_splits or self.max_splits,
                           mla=batch.v_from_k, head_dim=batch.head_dim,
                           kv_bytes=batch.k_cache.element_size(), fp8_mma=self.fp8_mma,
                           planned_seq_lens=batch.seq_lens_host if self.sized_for_lengths else None,
                           window=batch.window)

    def plan(self, batch):
        S, occ = self.chunk_budget(batch)
        # The planned lengths bound every launch of this plan (a graph-safe plan is made at the
        # capacity its graph serves): the grid's chunk axis and the partials stop at the
        # longest one's chunk count, and stage 2 is not launched when none can take two chunks.
        longest = max(kv_layout.visible_lengths(batch.seq_lens_host, batch.window), default=0)
        bound = longest if self.sized_for_lengths else None
        chunks = chunk_axis(batch.q, batch.k_cache, batch.v_cache, S, bound, self.min_chunk, self.block_n)
        shapes = workspace_shapes(batch.batch_size, batch.num_q_heads, batch.v_head_dim, chunks)
        return plan_launch(batch, "adaptive_split", shapes, decode_attention_adaptive, splits=S, occupancy=occ,
                           min_chunk=self.min_chunk, block_n=self.block_n, fp8_mma=self.fp8_mma, max_visible=bound,
                           planned_seq_lens=tuple(batch.seq_lens_host) if self.sized_for_lengths else None,
                           **self.launch_options(batch))

    def launch_options(self, batch) -> dict:
        """More keyword arguments of `decode_attention_adaptive` for this batch's launches: stage
        1's merge where `stage1_merge_up_to` has it (its counters zeroed scratch of the batch's
        workspace, which every launch leaves zero). A subclass times another launch option through
        the same plan, its scratch taken from `batch.workspace`."""
        up_to = stage1_merge_up_to(batch.head_dim, batch.v_from_k, batch.k_cache.element_size())
        return {} if up_to is None else self.merge_options(batch, up_to)

    @staticmethod
    def merge_options(batch, up_to: Optional[int]) -> dict:
        """Stage 1's merge for this batch's launches, up to `up_to` programs per request (None: at
        any count): its counters, zeroed scratch of the batch's workspace."""
        shape = merge_counter_shape(batch.batch_size, batch.num_q_heads, batch.num_kv_heads)
        counters = batch.workspace.alloc("adaptive_split.merge_counters", shape, torch.int32, fill=0)
        return dict(merge_counters=counters, merge_in_stage1_up_to=up_to)


class AdaptiveSplitFp8MmaKernel(AdaptiveSplitKernel):
    """The same split-K kernel computing fp8 x fp8: q and P quantized to the cache's fp8 type
    (a widely used design for fp8 KV caches: faster MMAs, lower precision). Declares the
    precision tier it computes at, so the suite judges it against that arithmetic; only fp8
    caches, and only GPU classes with fp8 matrix cores (the plugin deselects the others)."""

    name = "adaptive_split_fp8mma"
    caps = dataclasses.replace(CAPS, kv_dtypes=frozenset({"e4m3", "e5m2"}), fp8_math=FP8_Q_AND_P)
    fp8_mma = True

"""Classic two-stage split-K decode attention with a fixed split count (sglang style).

Stage 1, grid (B, KV-head tiles, S): split i of a request covers visible keys
[i*len, min((i+1)*len, L_vis)) with len = ceil(ceil(L_vis / S) / 32) * 32 (sglang's rule), the
visible range being [max(0, L - window), L). A split past the end neither loads nor stores.
Stage 2, grid (B, Hq): recomputes the same ranges and merges only the non-empty splits (a
prefix 0..ceil(L_vis/len)-1), adds the sink to the denominator, writes out and lse.

Usable outside the suite through `decode_attention_fixed(...)` (raw tensors); the suite's
adapter is `FixedSplitKernel`.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import kv_layout
from . import triton_common as tc
from .launch_constants import FIXED_DEFAULT_SPLITS as DEFAULT_SPLITS, FIXED_SPLIT_ALIGN as SPLIT_ALIGN
from .split_k_adapter import SPLIT_K_CAPS, plan_launch


@triton.jit
def _fixed_split_len(L_vis, num_splits, SPLIT_ALIGN: tl.constexpr):
    per = (L_vis + num_splits - 1) // num_splits
    return (per + SPLIT_ALIGN - 1) // SPLIT_ALIGN * SPLIT_ALIGN


# The per-program scalars that Triton need not specialize (triton_common)
@triton.jit(do_not_specialize=["visible", "num_splits", *tc.PARTIAL_LSE_STRIDES, *tc.HEAD_TILING_INTS])
def _fixed_stage1(
    Q, stride_qb, stride_qh, stride_qd,
    K, stride_kp, stride_kt, stride_kh, stride_kd,
    V, stride_vp, stride_vt, stride_vh, stride_vd,
    page_size, kv_indptr, kv_indices,
    Part, stride_pb, stride_ph, stride_ps,
    PartLse, stride_lb, stride_lh,
    group, heads_per_tile, tiles_per_kv,
    qk_scale, softcap, visible, num_splits,
    D_MAIN: tl.constexpr, D_PE: tl.constexpr, DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    SOFTCAP: tl.constexpr, SHARE_KV: tl.constexpr, E4M3_BITS: tl.constexpr, SPLIT_ALIGN: tl.constexpr,
    FP8_MMA: tl.constexpr, GROUP_DIV16: tl.constexpr, TILE_DIV16: tl.constexpr,
):
    group, heads_per_tile = tc.hinted_head_tiling(group, heads_per_tile, GROUP_DIV16, TILE_DIV16)
    b = tl.program_id(0)
    tile = tl.program_id(1)
    split = tl.program_id(2)
    lo = tl.load(kv_indptr + b)
    L = tl.load(kv_indptr + b + 1) - lo
    vis_start = tl.maximum(L - visible, 0)
    split_len = _fixed_split_len(L - vis_start, num_splits, SPLIT_ALIGN)
    start = vis_start + split * split_len
    end = tl.minimum(start + split_len, L)
    if start < end:
        acc, m_i, l_i, head0 = tc.attend_tile(
            b, tile, start, end,
            Q, stride_qb, stride_qh, stride_qd,
            K, stride_kp, stride_kt, stride_kh, stride_kd,
            V, stride_vp, stride_vt, stride_vh, stride_vd,
            page_size, kv_indices + lo.to(tl.int64),
            group, heads_per_tile, tiles_per_kv, qk_scale, softcap,
            D_MAIN, D_PE, DV, BLOCK_H, BLOCK_N, BLOCK_DMODEL, BLOCK_DPE, BLOCK_DV, SOFTCAP, SHARE_KV, E4M3_BITS,
            FP8_MMA)
        tc.store_partial(b, head0, split, acc, m_i, l_i, Part, stride_pb, stride_ph, stride_ps,
                         PartLse, stride_lb, stride_lh, heads_per_tile, DV, BLOCK_H, BLOCK_DV)


@triton.jit(do_not_specialize=["has_sinks", "store_lse", "visible", "num_splits",
                             *tc.LSE_STRIDES])
def _fixed_stage2(
    kv_indptr, visible, num_splits,
    Part, stride_pb, stride_ph, stride_ps,
    PartLse, stride_lb, stride_lh,
    Out, stride_ob, stride_oh, stride_od,
    Lse, stride_lseb, stride_lseh,
    Sinks, v_scale, has_sinks, store_lse,
    DV: tl.constexpr, SPLIT_TILE: tl.constexpr, BLOCK_DV: tl.constexpr, SPLIT_ALIGN: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    L = tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b)
    L_vis = L - tl.maximum(L - visible, 0)
    split_len = _fixed_split_len(L_vis, num_splits, SPLIT_ALIGN)
    # non-empty splits (a prefix); 0 when nothing is visible
    count = tl.where(L_vis > 0, (L_vis + split_len - 1) // tl.maximum(split_len, 1), 0)
    tc.stage2_row(b, h, count, 0,
                  Part, stride_pb, stride_ph, stride_ps,
                  PartLse, stride_lb, stride_lh,
                  Out, stride_ob, stride_oh, stride_od,
                  Lse, stride_lseb, stride_lseh,
                  Sinks, v_scale, has_sinks, store_lse, DV, SPLIT_TILE, BLOCK_DV, SPLIT_TILE)


workspace_shapes = tc.partial_shapes


def non_empty_splits(visible: int, num_splits: int) -> int:
    """Splits with keys for a request of `visible` keys (the kernels' own rule, on the host)."""
    if visible <= 0:
        return 0
    per = -(-visible // num_splits)
    split_len = -(-per // SPLIT_ALIGN) * SPLIT_ALIGN
    return -(-visible // split_len)


def decode_attention_fixed(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, out: torch.Tensor, *,
    sm_scale: float, lse: Optional[torch.Tensor] = None,
    k_scale: float = 1.0, v_scale: float = 1.0, softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None, window: Optional[int] = None,
    num_splits: int = DEFAULT_SPLITS,
    partials: Optional[torch.Tensor] = None, partial_lse: Optional[torch.Tensor] = None,
    block_n: Optional[int] = None, num_warps: Optional[int] = None, num_stages: Optional[int] = None,
    visible_lengths: Optional[list] = None,
) -> None:
    """Fixed-split decode attention; writes `out` [B, Hq, Dv] (q dtype) and `lse` [B, Hq] fp32.

    q [B, Hq, Dk]; k_cache/v_cache [pages, page_size, Hkv, D] or [slots, Hkv, D] (any strides;
    v may be a view of k's first Dv columns: MLA); kv_indptr int32 [B+1]; kv_indices int32 slot
    ids (page * page_size + offset) in token order. window = keys visible including the current
    one (None = all). sinks fp32 [Hq] (denominator only). partials/partial_lse: scratch of
    `workspace_shapes(...)` (allocated here when omitted - pass them for CUDA graphs).
    visible_lengths: every request's visible length for every launch of these buffers, when the
    caller knows them: the grid's split axis then stops at the most non-empty splits any of
    them has (no program past it could have work). Leave it unset under CUDA-graph replay.
    """
    B, Hq, Hkv, Dk, Dv = tc.check_inputs(q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, sinks)
    S = int(num_splits)
    if S < 1:
        raise ValueError(f"num_splits: expected >= 1, got {num_splits}")
    partials, partial_lse = tc.split_k_scratch(q, partials, partial_lse, workspace_shapes(B, Hq, Dv, S))
    ctx = tc.split_k_setup(q, k_cache, v_cache, block_n, num_warps, num_stages)
    grid_splits = S if visible_lengths is None else max([1] + [non_empty_splits(n, S) for n in visible_lengths])
    _fixed_stage1[(B, ctx.tiling["kv_head_tiles"], grid_splits)](
        *tc.cache_args(q, ctx, kv_indptr, kv_indices), *tc.partial_args(partials, partial_lse),
        *tc.tile_args(ctx, sm_scale, k_scale, softcap), tc.visible_arg(window), S,
        **tc.stage1_constexprs(ctx, softcap), SPLIT_ALIGN=SPLIT_ALIGN, FP8_MMA=0)
    tile = tc.split_tile(S, ctx.dims["BLOCK_DV"])
    _fixed_stage2[(B, Hq)](
        kv_indptr, tc.visible_arg(window), S,
        *tc.partial_args(partials, partial_lse), *tc.output_args(out, lse, sinks, v_scale, partial_lse),
        DV=Dv, SPLIT_TILE=tile, BLOCK_DV=ctx.dims["BLOCK_DV"], SPLIT_ALIGN=SPLIT_ALIGN,
        num_warps=4 if tile * ctx.dims["BLOCK_DV"] <= 4096 else 8, num_stages=1)


CAPS = SPLIT_K_CAPS


class FixedSplitKernel:
    """Adapter for the suite: S = batch.num_splits when set, else `num_splits` (8)."""

    name = "fixed_split"
    caps = CAPS

    def __init__(self, num_splits: int = DEFAULT_SPLITS, block_n: Optional[int] = None):
        self.num_splits = num_splits
        self.block_n = block_n

    def plan(self, batch):
        S = batch.num_splits or self.num_splits
        # Under Triton's CPU interpreter programs run one after another and an empty one still
        # costs ~20 ms, so the split axis stops at the most non-empty splits of these requests.
        # On a GPU it stays S: a graph captured from this plan may replay longer requests.
        visible = None
        if batch.device.type == "cpu":
            visible = kv_layout.visible_lengths(batch.seq_lens_host, batch.window)
        shapes = workspace_shapes(batch.batch_size, batch.num_q_heads, batch.v_head_dim, S)
        return plan_launch(batch, "fixed_split", shapes, decode_attention_fixed, num_splits=S,
                           block_n=self.block_n, visible_lengths=visible)

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

from decode_conformance.kernel_api import Capabilities

from . import triton_common as tc

DEFAULT_SPLITS = 8
SPLIT_ALIGN = 32  # sglang: split lengths are multiples of 32 keys


@triton.jit
def _fixed_split_len(L_vis, num_splits, SPLIT_ALIGN: tl.constexpr):
    per = (L_vis + num_splits - 1) // num_splits
    return (per + SPLIT_ALIGN - 1) // SPLIT_ALIGN * SPLIT_ALIGN


@triton.jit
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
    FP8_MMA: tl.constexpr,
):
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


@triton.jit(do_not_specialize=["has_sinks", "store_lse"])
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
    tiling, dims = ctx.tiling, ctx.dims
    kpage, (kp, kt, kh, kd), (vp, vt, vh, vd) = ctx.page_size, ctx.k_strides, ctx.v_strides
    k_arg, v_arg, e4m3_bits, share_kv = ctx.k_arg, ctx.v_arg, ctx.e4m3_bits, ctx.share_kv
    block_n, cfg = ctx.block_n, ctx.cfg
    grid_splits = S if visible_lengths is None else max([1] + [non_empty_splits(n, S) for n in visible_lengths])
    grid1 = (B, tiling["kv_head_tiles"], grid_splits)
    _fixed_stage1[grid1](
        q, q.stride(0), q.stride(1), q.stride(2),
        k_arg, kp, kt, kh, kd,
        v_arg, vp, vt, vh, vd,
        kpage, kv_indptr, kv_indices,
        partials, partials.stride(0), partials.stride(1), partials.stride(2),
        partial_lse, partial_lse.stride(0), partial_lse.stride(1),
        tiling["group"], tiling["heads_per_tile"], tiling["tiles_per_kv"],
        float(sm_scale) * float(k_scale), float(softcap) if softcap else 1.0, tc.visible_arg(window), S,
        BLOCK_H=tiling["BLOCK_H"], BLOCK_N=block_n, SOFTCAP=bool(softcap),
        SHARE_KV=share_kv, E4M3_BITS=e4m3_bits, SPLIT_ALIGN=SPLIT_ALIGN, FP8_MMA=0,
        **dims, **cfg)
    tile = tc.split_tile(S, dims["BLOCK_DV"])
    lse_t = lse if lse is not None else partial_lse  # dummy pointer when not stored
    _fixed_stage2[(B, Hq)](
        kv_indptr, tc.visible_arg(window), S,
        partials, partials.stride(0), partials.stride(1), partials.stride(2),
        partial_lse, partial_lse.stride(0), partial_lse.stride(1),
        out, out.stride(0), out.stride(1), out.stride(2),
        lse_t, lse_t.stride(0), lse_t.stride(1),
        sinks if sinks is not None else partial_lse, float(v_scale),
        int(sinks is not None), int(lse is not None),  # has_sinks, store_lse: runtime, not constexprs
        DV=Dv, SPLIT_TILE=tile, BLOCK_DV=dims["BLOCK_DV"], SPLIT_ALIGN=SPLIT_ALIGN,
        num_warps=4 if tile * dims["BLOCK_DV"] <= 4096 else 8, num_stages=1)


CAPS = Capabilities(
    kv_dtypes=frozenset({"bf16", "fp16", "e4m3", "e5m2"}),
    layouts=frozenset({"contig", "paged"}),
    page_sizes=None,
    window_convention="counts-current",
    mla=True, softcap=True, sinks=True, lse=True,
    num_splits=True, cuda_graph_safe=True, deterministic=True,
)


class FixedSplitKernel:
    """Adapter for the suite: S = batch.num_splits when set, else `num_splits` (8)."""

    name = "fixed_split"
    caps = CAPS

    def __init__(self, num_splits: int = DEFAULT_SPLITS, block_n: Optional[int] = None):
        self.num_splits = num_splits
        self.block_n = block_n

    def plan(self, batch):
        S = batch.num_splits or self.num_splits
        B, Hq, Dv = batch.batch_size, batch.num_q_heads, batch.v_head_dim
        p_shape, l_shape = workspace_shapes(B, Hq, Dv, S)
        partials = batch.workspace.alloc("fixed_split.partials", p_shape, torch.float32)
        partial_lse = batch.workspace.alloc("fixed_split.partial_lse", l_shape, torch.float32)
        sinks = batch.sinks.to(device=batch.device, dtype=torch.float32).contiguous() if batch.sinks is not None else None
        # Under Triton's CPU interpreter programs run one after another and an empty one still
        # costs ~20 ms, so the split axis stops at the most non-empty splits of these requests.
        # On a GPU it stays S: a graph captured from this plan may replay longer requests.
        visible = None
        if batch.device.type == "cpu":
            visible = [min(n, batch.window) if batch.window else n for n in batch.seq_lens_host]
        kw = dict(sm_scale=batch.sm_scale, lse=batch.lse, k_scale=batch.k_scale, v_scale=batch.v_scale,
                  softcap=batch.softcap, sinks=sinks, window=batch.window, num_splits=S,
                  partials=partials, partial_lse=partial_lse, block_n=self.block_n, visible_lengths=visible)
        args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)

        def launch():
            decode_attention_fixed(*args, **kw)

        return launch

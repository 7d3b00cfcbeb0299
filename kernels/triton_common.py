"""Shared pieces of the split-K decode kernels (fixed_split, adaptive_split).

Device side (@triton.jit, called from the kernels' own stage-1/stage-2 programs):
  tanh_safe        tanh that cannot overflow (soft-cap with s/cap >> 88)
  attend_range     online softmax of one (request, KV head, head tile) over keys [start, end)
  attend_tile      attend_range for one (request, head tile): the tile's KV head and query heads
  store_partial    the normalised partial and its LSE, at a split index
  flag_mask        a runtime flag (sinks, lse) as a load / store mask
  store_final      the direct path: a one-chunk request's out / lse written in stage 1
  merge_partials   stage 2: merge `count` partials, SPLIT_TILE of them per step
  finalize_rows    sinks + zero-length rows + normalisation, for stage 2 and the direct path
  stage2_row       merge_partials + finalize_rows + store of out / lse (one column slice)
  merge_tile_partials / merge_if_last   stage 1's own merge: the last program of a (request, head
                   tile) to finish, found by a ticket on its counter, merges the tile's partials
  allow_dependents / wait_for_primary   programmatic dependent launch of stage 2 (sm_90+)

Host side (plain python): launch configs, fp8 operands; GQA head tiling, cache addressing and the
window argument come from kv_layout (shared with the Lean kernel).

Numerics: scores, softmax state and accumulators are fp32. 16-bit K/V: p is cast to the V
dtype for the P@V dot as sglang does. fp8 K/V (never q down to fp8, unless the fp8-MMA tier
is asked for): both dots run in fp16, K/V converted exactly, q and p scaled by powers of two
into fp16's range first (`P_F16_SCALE`, `fp16_row_scale`); an fp8 V of its own is read as
byte pairs (`v_byte_pairs`). k_scale is folded into the score scale and v_scale multiplies
the output. Keys outside [start, end) are masked at the load (other=0.0), so NaN in slots
a request does not own never enters a product, and their scores are set to -inf.
Slot addresses are int64: page * stride_page + offset * stride_token.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import kv_layout
from .kv_layout import MIN_DOT, cache_addressing, next_pow2, visible_arg  # noqa: F401 (visible_arg: the kernels' tc.visible_arg)

MAX_HEADS_PER_TILE = 64  # query heads sharing one K/V load (rows of the score tile)
# Which int arguments of the split-K kernels Triton may specialize (a variant per value class:
# equal to 1, divisible by 16, other). Four per-launch scalars do not: the window, the chunk
# budget and occupancy, and the batch (fixed split: the window and the split count). They only
# bound loops and pick chunks, once per program; specialized, each value class the parity set
# meets was another compile of the same code. H200, s16 (docs/gpu-runs/2026-12-02-h200-s16/):
# adaptive stage 1 212 -> 167 variants in a cold main job, the same speed on the 4 cells timed.
# The LSE strides do not either (partial LSE [B, Hq, splits]: its strides follow the split
# count; final LSE: the caller's tensor): they address a store of one float per query head
# and the stage-2 load of a row's partial LSEs, never the K/V stream (s20 measured the
# variants and the speed: docs/gpu-runs/2026-12-03-h200-s20/).
# The rest stay specialized, measured twice: page size, group, tiling, batch and window
# unspecialized made the split-K kernels 10-69 % slower (close 8, docs/gpu-runs/2026-12-01-h200/);
# the head tiling (group, heads per tile, tiles per KV head) and the LSE strides unspecialized
# on top of the four scalars, 92 variants but 27 % slower at 32/8/128 1 x 128k (s16).
# Since then the group and the heads per tile are not specialized by Triton either. Their one
# value class that changes the code, a multiple of 16, reaches stage 1 as the constexprs
# GROUP_DIV16 / TILE_DIV16 (head_hints); Triton's own three classes (1, a multiple of 16,
# other) gave the parity set's MHA cases (group 1) variants of their own. H100, cold main jobs
# (docs/gpu-runs/2026-12-06-h100-s40): the two stage-1 kernels compiled 204 variants, 173 with
# these hints. The GQA cells timed (groups 4 and 8) compile to the same PTX as before (sm_90,
# triton 3.6.0). Dropping the multiple-of-16 class as well (165 variants) made the MLA cell
# (group 128, 64 heads a tile) 37 % slower; with the hints it ran 2.4 % faster than before.
HEAD_TILING_INTS = ("group", "heads_per_tile")
PARTIAL_LSE_STRIDES = ("stride_lb", "stride_lh")  # the partials' LSE [B, Hq, splits]
FINAL_LSE_STRIDES = ("stride_lseb", "stride_lseh")  # the caller's LSE [B, Hq]
LSE_STRIDES = PARTIAL_LSE_STRIDES + FINAL_LSE_STRIDES
STAGE2_TILE_ELEMS = 8192  # FlashML PR #729: a stage-2 tile holds at most 8192 fp32 elements
# ... and at most 128 partials: a batch of one merges its 82-128 partials in one round of loads
# when its columns are sliced to <= 64 (the PR's 64 took two dependent rounds). H200
# (docs/gpu-runs/2026-12-01-h200/probe8, A/B/A/B on one batch): 32/8/128 1 x 128k 142.4 us
# against 143.6, 1 x 32k 52.8 against 53.8, 16/2/256 1 x 128k 84.0 against 85.0, 1 x 32k 35.5
# against 36.4; stage 2 alone 2.2 us instead of 3.5 at 1 x 128k.
STAGE2_MAX_TILE = 128
STAGE2_SMALL_TILE = 8  # counts up to this are merged with a tile this wide (the fixed kernel's 8 splits)


# ----------------------------------------------------------------------------------------
# device helpers
# ----------------------------------------------------------------------------------------
@triton.jit
def tanh_safe(x):
    # tanh|x| = (1 - e) / (1 + e) with e = exp(-2|x|) in (0, 1]: e underflows to 0 for huge
    # |x| (tanh -> 1), never overflows, so x = s/cap >> 88 stays finite.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def upcast_kv(x, dtype, E4M3_BITS: tl.constexpr):
    """K/V tile -> the query dtype. E4M3_BITS: x holds float8_e4m3fn bytes as uint8 (GPUs where
    Triton has no e4m3 type, e.g. sm_80): rebuilt as fp16 bits, exact, then scaled by 2^8."""
    if E4M3_BITS:
        u = x.to(tl.uint16)
        h = (((u & 0x80) << 8) | ((u & 0x7F) << 7)).to(tl.float16, bitcast=True)
        return (h.to(tl.float32) * 256.0).to(dtype)
    else:
        return x.to(dtype)


@triton.jit
def fp8_operand(x, kv_ptr, FP8_MMA: tl.constexpr):
    """x as an fp8 MMA operand. FP8_MMA 1: the cache's own fp8 type (NVIDIA sm_89+, gfx950);
    2 / 3: the FNUZ e4m3 / e5m2 types gfx942's matrix cores take (via fp32: exact for e5m2,
    e4m3 values past 240 saturate). The cast saturates at the type's largest finite value."""
    if FP8_MMA == 1:
        return x.to(kv_ptr.dtype.element_ty)
    elif FP8_MMA == 2:
        return x.to(tl.float32).to(tl.float8e4b8)
    else:
        return x.to(tl.float32).to(tl.float8e5b16)


@triton.jit
def kv_tile(x, kv_ptr, q_dtype, E4M3_BITS: tl.constexpr, FP8_MMA: tl.constexpr):
    """A loaded K/V tile as a dot operand: upcast to q's dtype, or (FP8_MMA) kept in fp8."""
    if FP8_MMA == 0:
        return upcast_kv(x, q_dtype, E4M3_BITS)
    elif FP8_MMA == 1:
        return x
    else:
        return fp8_operand(x, kv_ptr, FP8_MMA)


# Hopper's fp8 MMA (wgmma) adds products into an accumulator of reduced precision, and Triton
# on sm_90 lets that run over the whole K of a dot unless told otherwise (its CUDA backend sets
# max_num_imprecise_acc_default = 2**30 for capability 90; 0 elsewhere). Promoting into the fp32
# accumulator every 32 products (one wgmma k-step for fp8) keeps an fp8 x fp8 dot the fp32
# accumulation the "fp8-q-and-p" tier and the LSE budget model. Seen on an H200: without it,
# one row of 512 of an e4m3 MLA-576 case had its LSE at 1.22x the derived budget.
FP8_PROMOTE_EVERY = tl.constexpr(32)


@triton.jit
def mma(a, b, FP8_MMA: tl.constexpr):
    """a @ b with an fp32 accumulator; fp8 operands (FP8_MMA) promoted every FP8_PROMOTE_EVERY
    products (at most K, which tl.dot requires)."""
    if FP8_MMA:
        out = tl.dot(a, b, max_num_imprecise_acc=FP8_PROMOTE_EVERY if a.shape[1] >= FP8_PROMOTE_EVERY else a.shape[1])
    else:
        out = tl.dot(a, b)
    return out


# fp8 caches (not the fp8-MMA tier): both dots run as fp16 x fp16 MMAs. e4m3 and e5m2 become
# fp16 exactly in one packed conversion (e5m2 is fp16's top byte, e4m3 fits its range), where a
# bf16 operand took that conversion and then a second, one instruction per element (sm_90 has no
# e4m3 -> bf16 conversion): 128 F2F.BF16.F16 per thread and key step at 32/8/128 (SASS of the
# triton 3.6 build). A bf16 q is scaled per row by a power of two that puts its largest
# magnitude in [2^14, 2^15) and then rounded to fp16, exactly for every element within 2^31 of
# the row's largest (fp16 keeps 11 bits down to 2^-24; bf16 has 8); the score takes the inverse
# scale. P, in [0, 1], is scaled by 2^15 before its fp16 rounding (11 bits where bf16 kept 8,
# and nothing above 2^-39 flushed) and the accumulator is scaled back once. Both are powers of
# two, so the products stay those of the tier's arithmetic, with P rounded more finely.
# H200, same launch config (64/4/6), with V read as byte pairs (`v_byte_pairs`): 32/8/128 e4m3
# b4-32k 144.4 -> 116.6 us, b32-8k 280.5 -> 204.1, b1-128k 139.4 -> 111.8, 16/2/256 b4-32k
# 103.0 -> 61.6, e5m2 b4-32k 134.9 -> 112.2; the loop went from 936 to 676 SASS instructions
# and 158 to 128 registers (docs/gpu-runs/2026-12-03-h200-s18/).
P_F16_SCALE = tl.constexpr(32768.0)


@triton.jit
def fp16_row_scale(q, q_pe, HAS_PE: tl.constexpr):
    """Per row of q (and q_pe): 2^(14 - e), e the exponent of the row's largest magnitude, at
    most 2^126 (an all-zero or subnormal row: its inverse stays a normal fp32)."""
    amax = tl.max(tl.abs(q.to(tl.float32)), 1)
    if HAS_PE:
        amax = tl.maximum(amax, tl.max(tl.abs(q_pe.to(tl.float32)), 1))
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    s = tl.minimum(14 - e, 126)
    return ((s + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def fp8_pair_halves(w, E5M2: tl.constexpr, E4M3_BITS: tl.constexpr):
    """uint16 pairs of fp8 bytes [N, D/2] -> the fp16 values of the low bytes (even columns) and
    of the high bytes (odd columns), each [N, D/2], exactly: e5m2 is the top byte of its fp16;
    e4m3 through the hardware conversion, or (E4M3_BITS: no e4m3 type) its sign, exponent and
    mantissa placed one bit lower in fp16, 2^-8 times the value (the caller scales by 256)."""
    if E5M2:
        lo = (w << 8).to(tl.float16, bitcast=True)
        hi = (w & 0xFF00).to(tl.float16, bitcast=True)
    elif E4M3_BITS:
        lo = (((w & 0x80) << 8) | ((w & 0x7F) << 7)).to(tl.float16, bitcast=True)
        hi = ((w & 0x8000) | ((w >> 1) & 0x3F80)).to(tl.float16, bitcast=True)
    else:
        lo = w.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        hi = (w >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return lo, hi


@triton.jit
def attend_range(
    q_ptr, stride_qh, stride_qd,  # q_ptr: first query head of the tile in request b
    k_ptr, stride_kp, stride_kt, stride_kd,  # k_ptr/v_ptr: already offset to the KV head
    v_ptr, stride_vp, stride_vt, stride_vd,
    page_size,
    idx_ptr,  # kv_indices + kv_indptr[b]: slot ids of request b in token order
    start, end,  # key positions [start, end) of the request
    n_rows,  # valid query heads in the tile (<= BLOCK_H)
    qk_scale,  # sm_scale * k_scale
    softcap,
    D_MAIN: tl.constexpr, D_PE: tl.constexpr, DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    SOFTCAP: tl.constexpr, SHARE_KV: tl.constexpr, E4M3_BITS: tl.constexpr, FP8_MMA: tl.constexpr,
):
    """Returns (acc [BLOCK_H, BLOCK_DV] fp32 unnormalised, m [BLOCK_H], l [BLOCK_H]).
    An empty range returns acc = 0, m = -inf, l = 0. FP8_MMA (fp8 caches only): q and P are
    quantized to the MMA's fp8 type and both dots run fp8 x fp8 (Capabilities.fp8_math
    "fp8-q-and-p"); else K/V are upcast to q's dtype."""
    rows = tl.arange(0, BLOCK_H)
    row_mask = rows < n_rows
    offs_d = tl.arange(0, BLOCK_DMODEL)
    dmask = offs_d < D_MAIN
    offs_v = tl.arange(0, BLOCK_DV)
    vmask = offs_v < DV

    q = tl.load(q_ptr + rows[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=row_mask[:, None] & dmask[None, :], other=0.0)
    if BLOCK_DPE > 0:
        offs_pe = tl.arange(0, BLOCK_DPE)
        pemask = offs_pe < D_PE
        q_pe = tl.load(q_ptr + rows[:, None] * stride_qh + (D_MAIN + offs_pe[None, :]) * stride_qd,
                       mask=row_mask[:, None] & pemask[None, :], other=0.0)

    q_dtype = q.dtype
    if FP8_MMA:
        q = fp8_operand(q, k_ptr, FP8_MMA)
        if BLOCK_DPE > 0:
            q_pe = fp8_operand(q_pe, k_ptr, FP8_MMA)
    # not for MLA (SHARE_KV): its 512 + 64 K tile is also the P @ V operand, and there the fp16
    # form ran 10 % slower (H200, e4m3 128 x 576/512 b8-32k: 524 us against 476)
    F16_DOTS: tl.constexpr = ((FP8_MMA == 0) & (not SHARE_KV) & (E4M3_BITS | k_ptr.dtype.element_ty.is_fp8())
                              & ((q.dtype == tl.bfloat16) | (q.dtype == tl.float16)))
    V_E5M2: tl.constexpr = k_ptr.dtype.element_ty == tl.float8e5
    if F16_DOTS:
        q_dtype = tl.float16
        if q.dtype == tl.bfloat16:
            q_scale = fp16_row_scale(q, q_pe if BLOCK_DPE > 0 else q, BLOCK_DPE > 0)
            q = (q.to(tl.float32) * q_scale[:, None]).to(tl.float16)
            if BLOCK_DPE > 0:
                q_pe = (q_pe.to(tl.float32) * q_scale[:, None]).to(tl.float16)
            row_qk_scale = qk_scale / q_scale
        else:
            row_qk_scale = tl.full([BLOCK_H], 1.0, dtype=tl.float32) * qk_scale

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    V_PAIRS: tl.constexpr = v_ptr.dtype.element_ty == tl.uint16
    if V_PAIRS:
        offs_pair = tl.arange(0, BLOCK_DV // 2)
        pmask = offs_pair < DV // 2
        acc_lo = tl.zeros([BLOCK_H, BLOCK_DV // 2], dtype=tl.float32)
        acc_hi = tl.zeros([BLOCK_H, BLOCK_DV // 2], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)

    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        nmask = offs_n < end
        slot = tl.load(idx_ptr + offs_n, mask=nmask, other=0).to(tl.int64)
        page = slot // page_size
        tok = slot - page * page_size
        k_row = page * stride_kp + tok * stride_kt
        k = tl.load(k_ptr + k_row[:, None] + offs_d[None, :] * stride_kd,
                    mask=nmask[:, None] & dmask[None, :], other=0.0)
        k = kv_tile(k, k_ptr, q_dtype, E4M3_BITS, FP8_MMA)
        qk = mma(q, tl.trans(k), FP8_MMA)
        if BLOCK_DPE > 0:
            k_pe = tl.load(k_ptr + k_row[:, None] + (D_MAIN + offs_pe[None, :]) * stride_kd,
                           mask=nmask[:, None] & pemask[None, :], other=0.0)
            k_pe = kv_tile(k_pe, k_ptr, q_dtype, E4M3_BITS, FP8_MMA)
            qk += mma(q_pe, tl.trans(k_pe), FP8_MMA)
        if F16_DOTS:
            qk = qk * row_qk_scale[:, None]
        else:
            qk = qk * qk_scale
        if SOFTCAP:
            qk = softcap * tanh_safe(qk / softcap)
        qk = tl.where(nmask[None, :], qk, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        if V_PAIRS:
            v_row = page * stride_vp + tok * stride_vt
            w = tl.load(v_ptr + v_row[:, None] + offs_pair[None, :] * stride_vd,
                        mask=nmask[:, None] & pmask[None, :], other=0)
            v_lo, v_hi = fp8_pair_halves(w, V_E5M2, E4M3_BITS)
            p16 = (p * P_F16_SCALE).to(tl.float16)
            acc_lo = acc_lo * alpha[:, None] + tl.dot(p16, v_lo)
            acc_hi = acc_hi * alpha[:, None] + tl.dot(p16, v_hi)
        else:
            if SHARE_KV:
                v = k  # MLA: V is the first DV (= D_MAIN) columns of K, already loaded and masked
            else:
                v_row = page * stride_vp + tok * stride_vt
                v = tl.load(v_ptr + v_row[:, None] + offs_v[None, :] * stride_vd,
                            mask=nmask[:, None] & vmask[None, :], other=0.0)
                v = kv_tile(v, v_ptr, q_dtype, E4M3_BITS, FP8_MMA)
            if F16_DOTS:
                acc = acc * alpha[:, None] + mma((p * P_F16_SCALE).to(tl.float16), v, FP8_MMA)
            else:
                acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, FP8_MMA)
        m_i = m_new
    if V_PAIRS:
        acc = tl.reshape(tl.join(acc_lo, acc_hi), (BLOCK_H, BLOCK_DV))
        if E4M3_BITS:  # fp8_pair_halves' e4m3 bit path gives 2^-8 x the values
            acc = acc * (256.0 / P_F16_SCALE)
        else:
            acc = acc * (1.0 / P_F16_SCALE)
    elif F16_DOTS:
        acc = acc * (1.0 / P_F16_SCALE)
    return acc, m_i, l_i


@triton.jit
def attend_tile(
    b, tile, start, end,
    Q, stride_qb, stride_qh, stride_qd,
    K, stride_kp, stride_kt, stride_kh, stride_kd,
    V, stride_vp, stride_vt, stride_vh, stride_vd,
    page_size, idx_ptr,
    group, heads_per_tile, tiles_per_kv,
    qk_scale, softcap,
    D_MAIN: tl.constexpr, D_PE: tl.constexpr, DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DMODEL: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    SOFTCAP: tl.constexpr, SHARE_KV: tl.constexpr, E4M3_BITS: tl.constexpr, FP8_MMA: tl.constexpr,
):
    """attend_range for head tile `tile` of request b (its KV head and first query head found
    from the GQA tiling): returns (acc, m, l, first query head)."""
    kv_head = tile // tiles_per_kv
    head0 = kv_head * group + (tile - kv_head * tiles_per_kv) * heads_per_tile
    b64 = b.to(tl.int64)
    acc, m_i, l_i = attend_range(
        Q + b64 * stride_qb + head0.to(tl.int64) * stride_qh, stride_qh, stride_qd,
        K + kv_head.to(tl.int64) * stride_kh, stride_kp, stride_kt, stride_kd,
        V + kv_head.to(tl.int64) * stride_vh, stride_vp, stride_vt, stride_vd,
        page_size, idx_ptr, start, end, heads_per_tile, qk_scale, softcap,
        D_MAIN, D_PE, DV, BLOCK_H, BLOCK_N, BLOCK_DMODEL, BLOCK_DPE, BLOCK_DV, SOFTCAP, SHARE_KV, E4M3_BITS, FP8_MMA)
    return acc, m_i, l_i, head0


@triton.jit
def store_partial(b, head0, split, acc, m_i, l_i,
                  Part, stride_pb, stride_ph, stride_ps,
                  PartLse, stride_lb, stride_lh,
                  heads_per_tile, DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr):
    """partial = acc / l and lse = m + ln l of the tile's query heads, at split index `split`."""
    rows = tl.arange(0, BLOCK_H)
    row_mask = rows < heads_per_tile
    heads = (head0 + rows).to(tl.int64)
    b64 = b.to(tl.int64)
    offs_v = tl.arange(0, BLOCK_DV)
    vmask = offs_v < DV
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    part = acc / l_safe[:, None]
    p_ptr = Part + b64 * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_v[None, :]
    tl.store(p_ptr, part, mask=row_mask[:, None] & vmask[None, :])
    lse = m_i + tl.log(l_safe)
    tl.store(PartLse + b64 * stride_lb + heads * stride_lh + split, lse, mask=row_mask)


@triton.jit
def flag_mask(idx, flag):
    """A runtime 0/1 flag as a mask shaped like the int tensor `idx` (Triton's interpreter
    rejects a scalar mask)."""
    return (idx * 0 + flag) != 0


@triton.jit
def store_final(b, head0, acc, m_i, l_i,
                Out, stride_ob, stride_oh, stride_od,
                Lse, stride_lseb, stride_lseh,
                Sinks, v_scale, heads_per_tile, has_sinks, store_lse,
                DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The direct path of a request that takes one chunk (or none): its rows finished in stage 1
    (`finalize_rows`), out and lse written here; no partial, and stage 2 leaves the row alone.
    has_sinks / store_lse are runtime flags (see `finalize_rows`)."""
    rows = tl.arange(0, BLOCK_H)
    row_mask = rows < heads_per_tile
    heads = head0 + rows
    sink = tl.load(Sinks + heads, mask=row_mask & flag_mask(rows, has_sinks), other=float("-inf")).to(tl.float32)
    out, lse = finalize_rows(acc, l_i, m_i, sink, v_scale)
    b64 = b.to(tl.int64)
    heads64 = heads.to(tl.int64)
    offs_v = tl.arange(0, BLOCK_DV)
    tl.store(Out + b64 * stride_ob + heads64[:, None] * stride_oh + offs_v[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=row_mask[:, None] & (offs_v[None, :] < DV))
    tl.store(Lse + b64 * stride_lseb + heads64 * stride_lseh, lse, mask=row_mask & flag_mask(rows, store_lse))


@triton.jit
def merge_partials(part_ptr, stride_ps, lse_ptr, count, n_cols,
                   SPLIT_TILE: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Merge partials 0..count-1 of one (request, head), columns [0, n_cols) of part_ptr's
    rows: SPLIT_TILE of them are loaded at once and folded in with one online-softmax update.
    Entries >= count are never read.
    Returns (acc [BLOCK_DV] = sum_i w_i o_i, denom = sum_i w_i, m) with w_i = exp(lse_i - m)."""
    offs_s = tl.arange(0, SPLIT_TILE)
    offs_v = tl.arange(0, BLOCK_DV)
    vmask = offs_v < n_cols
    m = float("-inf")
    denom = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, count, SPLIT_TILE):
        idx = s0 + offs_s
        smask = idx < count
        lse = tl.load(lse_ptr + idx, mask=smask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, 0))
        scale = tl.exp(m - m_new)
        w = tl.exp(lse - m_new)
        o = tl.load(part_ptr + idx[:, None] * stride_ps + offs_v[None, :],
                    mask=smask[:, None] & vmask[None, :], other=0.0)
        acc = acc * scale + tl.sum(w[:, None] * o, 0)
        denom = denom * scale + tl.sum(w, 0)
        m = m_new
    return acc, denom, m


@triton.jit
def finalize_rows(acc, denom, m, sink, v_scale):
    """Rows of (acc [R, DV] = sum of exp(score - m) v, denom [R], m [R]) -> (out [R, DV] fp32,
    lse [R]): the sink joins the denominator only, a row with nothing visible gets out = 0
    exactly and lse = -inf (or the sink). Shared by stage 2 and the one-chunk direct path.
    No sinks = a sink of -inf: it adds exactly 0 and rescales by exactly 1, so the bits are
    those of the same kernel without the sink term, and one compiled kernel serves launches
    with and without sinks (the flag is a runtime argument, not a constexpr: fewer variants)."""
    m_new = tl.maximum(m, sink)
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # empty row, no sink: nothing to rescale
    scale = tl.exp(m - m_ref)
    acc = acc * scale[:, None]
    denom = denom * scale + tl.exp(sink - m_ref)
    m = m_new
    has = denom > 0
    d_safe = tl.where(has, denom, 1.0)
    out = tl.where(has[:, None], acc * (v_scale / d_safe)[:, None], 0.0)
    lse = tl.where(has, m + tl.log(d_safe), float("-inf"))
    return out, lse


@triton.jit
def allow_dependents(PDL: tl.constexpr, now):
    """Stage 1: when `now`, lets the stage-2 grid launch once every stage-1 program has done
    so (PDL 1), instead of after the last one exits. Called at a program's start and at its
    end with complementary conditions (`adaptive_split.trigger_early`)."""
    if PDL:
        if now:
            gdc_launch_dependents()


@triton.jit
def wait_for_primary(PDL: tl.constexpr):
    """Stage 2, before it reads a partial or writes an output: waits until the stage-1 grid
    has finished and its writes are visible (PDL 1). Every stage-2 program calls it, also
    those with nothing to merge, so stage 2 never completes before stage 1 does."""
    if PDL:
        gdc_wait()


@triton.jit
def stage2_row(
    b, h, count, dv0,
    Part, stride_pb, stride_ph, stride_ps,
    PartLse, stride_lb, stride_lh,
    Out, stride_ob, stride_oh, stride_od,
    Lse, stride_lseb, stride_lseh,
    Sinks, v_scale, has_sinks, store_lse,
    DV: tl.constexpr, SPLIT_TILE: tl.constexpr, BLOCK_DV: tl.constexpr, SMALL_TILE: tl.constexpr,
):
    """Stage 2 for one (request, query head) and output columns [dv0, dv0 + BLOCK_DV): merge
    `count` partials, finish the row (`finalize_rows`), store out and, from the slice at
    column 0, lse (natural log). A count of at most SMALL_TILE (< SPLIT_TILE) is merged with
    a tile that small: a short request in a launch sized for long ones does not pay for a
    wide, mostly masked tile. The tile follows the count alone, so the bits do too."""
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    part_ptr = Part + b64 * stride_pb + h64 * stride_ph + dv0
    lse_ptr = PartLse + b64 * stride_lb + h64 * stride_lh
    if SMALL_TILE < SPLIT_TILE:
        if count <= SMALL_TILE:
            acc, denom, m = merge_partials(part_ptr, stride_ps, lse_ptr, count, DV - dv0, SMALL_TILE, BLOCK_DV)
        else:
            acc, denom, m = merge_partials(part_ptr, stride_ps, lse_ptr, count, DV - dv0, SPLIT_TILE, BLOCK_DV)
    else:
        acc, denom, m = merge_partials(part_ptr, stride_ps, lse_ptr, count, DV - dv0, SPLIT_TILE, BLOCK_DV)
    one = tl.zeros([1], dtype=tl.float32)
    first = tl.zeros([1], dtype=tl.int32) + dv0
    sink = tl.load(Sinks + h + first * 0, mask=flag_mask(first, has_sinks), other=float("-inf")).to(tl.float32)
    out, lse = finalize_rows(acc[None, :], one + denom, one + m, sink, v_scale)
    offs_v = dv0 + tl.arange(0, BLOCK_DV)
    tl.store(Out + b64 * stride_ob + h64 * stride_oh + offs_v[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=offs_v[None, :] < DV)
    tl.store(Lse + b64 * stride_lseb + h64 * stride_lseh + first * 0, lse,
             mask=(first == 0) & flag_mask(first, store_lse))


@triton.jit
def merge_tile_partials(b, head0, count, Part, stride_pb, stride_ph, stride_ps, PartLse, stride_lb, stride_lh,
                        heads_per_tile, DV: tl.constexpr, HEADS: tl.constexpr, SPLITS: tl.constexpr,
                        BLOCK_DV: tl.constexpr):
    """Merge partials 0..count-1 of the tile's query heads (head0 ..), in chunk order, one online
    update per partial; the SPLITS partials of a round are unrolled, so their [HEADS, BLOCK_DV]
    loads are all in flight before the first update (sm_90 SASS of the triton 3.6 build). Read
    past L1 (`.cg`): other SMs wrote them.
    Returns (acc [HEADS, BLOCK_DV] = sum_i w_i o_i, denom [HEADS] = sum_i w_i, m [HEADS]), with
    w_i = exp(lse_i - m): `finalize_rows`' operands. Padding heads stay at m = -inf, denom 0."""
    offs_h = tl.arange(0, HEADS)
    hmask = offs_h < heads_per_tile
    heads = (head0 + offs_h).to(tl.int64)
    offs_s = tl.arange(0, SPLITS)
    offs_v = tl.arange(0, BLOCK_DV)
    b64 = b.to(tl.int64)
    lse_row = PartLse + b64 * stride_lb + heads * stride_lh
    part_row = Part + b64 * stride_pb + heads[:, None] * stride_ph + offs_v[None, :]
    vmask = (offs_v < DV)[None, :]
    m = tl.full([HEADS], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([HEADS], dtype=tl.float32)
    acc = tl.zeros([HEADS, BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, count, SPLITS):
        for s in tl.static_range(SPLITS):
            ok = hmask & (offs_h * 0 + (s0 + s) < count)  # (a tensor: the interpreter rejects a scalar mask)
            lse = tl.load(lse_row + s0 + s, mask=ok, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(part_row + (s0 + s) * stride_ps, mask=ok[:, None] & vmask, other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, lse)
            m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
            scale = tl.exp(m - m_ref)
            w = tl.exp(lse - m_ref)
            acc = acc * scale[:, None] + w[:, None] * o
            denom = denom * scale + w
            m = m_new
    return acc, denom, m


@triton.jit
def merge_if_last(b, head0, count, counter,
                  Part, stride_pb, stride_ph, stride_ps,
                  PartLse, stride_lb, stride_lh,
                  Out, stride_ob, stride_oh, stride_od,
                  Lse, stride_lseb, stride_lseh,
                  Sinks, v_scale, heads_per_tile, has_sinks, store_lse,
                  DV: tl.constexpr, HEADS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Stage 1's merge, after a program stored its partial: it draws a ticket on its (request,
    head tile)'s counter, and the program that draws the last of `count` merges every partial in
    chunk order (not arrival order: the bits do not depend on which program finished last),
    writes out and lse, and sets the counter back to 0 for the next launch or graph replay.
    Nobody waits on anybody (the protocol of Lean's combine): no spinning, so Triton's
    interpreter, which runs programs one after another, cannot deadlock."""
    tl.debug_barrier()  # every thread's partial is written before the ticket (release)
    ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    if ticket == count - 1:
        acc, denom, m = merge_tile_partials(b, head0, count, Part, stride_pb, stride_ph, stride_ps,
                                            PartLse, stride_lb, stride_lh, heads_per_tile, DV, HEADS, SPLITS,
                                            BLOCK_DV)
        store_final(b, head0, acc, m, denom, Out, stride_ob, stride_oh, stride_od, Lse, stride_lseb, stride_lseh,
                    Sinks, v_scale, heads_per_tile, has_sinks, store_lse, DV, HEADS, BLOCK_DV)
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


# ----------------------------------------------------------------------------------------
# host helpers
# ----------------------------------------------------------------------------------------
def head_tiling(num_q_heads: int, num_kv_heads: int) -> dict:
    """kv_layout.head_tiling with this kernel family's tile cap (MAX_HEADS_PER_TILE)."""
    return kv_layout.head_tiling(num_q_heads, num_kv_heads, MAX_HEADS_PER_TILE)


def head_dims(dk: int, dv: int) -> dict:
    """K is split as D_MAIN + D_PE when Dv < Dk (MLA: 576 = 512 + 64, 288 = 256 + 32), each
    part padded to a power of two >= 16 and masked."""
    d_main = dv if dv < dk else dk
    d_pe = dk - d_main
    return dict(D_MAIN=d_main, D_PE=d_pe, DV=dv,
                BLOCK_DMODEL=max(MIN_DOT, next_pow2(d_main)),
                BLOCK_DPE=max(MIN_DOT, next_pow2(d_pe)) if d_pe else 0,
                BLOCK_DV=max(MIN_DOT, next_pow2(dv)))


def shares_kv(k_cache, v_cache, dims: dict) -> bool:
    """V is the first DV columns of K (MLA view): the kernel reuses the loaded K tile."""
    if dims["DV"] != dims["D_MAIN"] or k_cache.data_ptr() != v_cache.data_ptr():
        return False
    return cache_addressing(k_cache) == cache_addressing(v_cache)


# Tests set this to run the uint8 e4m3 path where Triton has the real type (CPU interpreter).
FORCE_E4M3_BITS = False


def kv_operand(cache):
    """(tensor to pass, E4M3_BITS): float8_e4m3fn caches go in as uint8 bytes on CUDA GPUs
    below sm_89, where Triton has no e4m3 type (the kernel rebuilds the value exactly)."""
    import torch
    if cache.dtype != torch.float8_e4m3fn:
        return cache, False
    bits = FORCE_E4M3_BITS
    if cache.device.type == "cuda" and torch.version.hip is None:
        bits = bits or torch.cuda.get_device_capability(cache.device) < (8, 9)
    return (cache.view(torch.uint8), True) if bits else (cache, False)


def fp8_mma_code(cache, requested: bool) -> int:
    """The FP8_MMA constexpr for a launch: 0 (K/V upcast to q's dtype) unless `requested` and the
    cache is fp8; then 1 (MMAs in the cache's own fp8 type) or, on gfx942, 2 / 3 (its FNUZ
    e4m3 / e5m2). Asking for fp8 MMAs on a GPU without them (below sm_89, CDNA2) is an error."""
    import torch
    if not requested or cache.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return 0
    if cache.device.type == "cuda":
        if torch.version.hip is not None:
            arch = torch.cuda.get_device_properties(cache.device).gcnArchName.split(":")[0]
            if arch == "gfx942":
                return 2 if cache.dtype == torch.float8_e4m3fn else 3
            if arch not in ("gfx950",):
                raise ValueError(f"fp8 MMAs: {arch} has no fp8 matrix cores this kernel targets (gfx942, gfx950)")
        elif torch.cuda.get_device_capability(cache.device) < (8, 9):
            raise ValueError("fp8 MMAs need sm_89 or newer (this GPU is "
                             f"sm_{''.join(map(str, torch.cuda.get_device_capability(cache.device)))})")
    return 1


# Programmatic dependent launch (PDL) of stage 2 on NVIDIA sm_90+: stage 2's programs are
# placed on the SMs while stage 1's last programs run and wait there (griddepcontrol), so the
# launch gap between the two kernels is not on the critical path. A measurement turns it off
# here to compare (the on / off record: docs/gpu-runs/2026-12-01-h200/probe9).
USE_PDL = True


def dependent_launch(tensor) -> bool:
    """Whether stage 2 is launched as a programmatic dependent of stage 1 on `tensor`'s device:
    CUDA (not ROCm) sm_90 or newer, and USE_PDL. Never on the CPU interpreter."""
    import torch
    if not USE_PDL or tensor.device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(tensor.device) >= (9, 0)


def split_tile(cap: int, block_dv: int) -> int:
    """Stage-2 tile: the split cap rounded up to a power of two, at most STAGE2_MAX_TILE
    splits and STAGE2_TILE_ELEMS fp32 elements."""
    t = min(next_pow2(max(1, cap)), STAGE2_MAX_TILE, max(1, STAGE2_TILE_ELEMS // block_dv))
    return max(2, t)  # a 1-wide tile is legal but 2 keeps reductions 1-D on every backend


STAGE2_MIN_SLICE = 32  # output columns per stage-2 program at the finest slicing (128-byte fp32 rows)


def stage2_slices(rows: int, block_dv: int, device) -> int:
    """Stage-2 programs per (request, head): on a GPU, when the batch's rows (B x Hq) are fewer
    than its SMs, the output columns are cut into a power-of-two number of slices (each at
    least STAGE2_MIN_SLICE wide) until the rows x slices cover the SMs, so a batch of one does
    not merge its many partials on a handful of SMs. 1 on the CPU interpreter (programs run
    one after another there)."""
    import torch
    from . import split_rule
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    sms = split_rule.num_sms(device)
    slices = 1
    while rows * slices < sms and block_dv // (2 * slices) >= STAGE2_MIN_SLICE:
        slices *= 2
    return slices


# GPU launch configurations, in order of preference: (BLOCK_N, num_warps, num_stages). Measured
# on an H200 (triton 3.6, bf16, CUDA-graph replay): a 3-deep key pipeline is what makes few
# programs per SM fast (16/2/256 at 1 x 128k: 229 us with 32/4/2, 101 us with 64/8/3; 32/8/128
# at 4 x 128k: 1041 -> 558 us with 64/4/3). The first that fits the device's shared memory wins.
# MLA 576 (s16 probe, docs/gpu-runs/2026-12-02-h200-s16/): 64 keys in 2 stages against 32 in 3,
# 128 x 576/512 bf16 b8-32k 329 against 448 us, b1-16k 43 against 49, b32-8k 344 against 461,
# b8-4k 63 against 76, e4m3 b8-32k 474 against 667.
GPU_CONFIGS = {
    "small": ((64, 4, 3), (64, 4, 2), (32, 4, 2), (16, 4, 1)),  # Dk <= 128
    "medium": ((64, 8, 3), (32, 4, 3), (32, 4, 2), (16, 4, 1)),  # Dk <= 320 (256, MLA 288)
    "large": ((64, 8, 2), (32, 8, 3), (32, 4, 2), (16, 4, 1)),  # MLA 576
}
# fp8 caches: their own preference order for the small class. 128 keys in 3 stages wins with the
# fp16-dot path (`attend_range`), H200, 32/8/128 e4m3 (docs/gpu-runs/2026-12-03-h200-s18/, us,
# 128/4/3 against the 64/4/6 used before): b1-4k 15.1 / 16.3, b1-32k 37.0 / 43.5, b1-128k 94.9 /
# 111.6, b4-32k 96.8 / 116.5, b32-8k 180.1 / 202.4, b64-2k 122.5 / 134.0, b16 ragged 290.4 /
# 391.7; e5m2 b4-32k 97.5 / 111.6, b1-4k 14.7 / 15.7. The medium and large classes keep the
# 16-bit rows: 16/2/256 e4m3 b1-32k 24.8 with 64/8/3, 26.1 with 128/8/2 (which won b32-8k, 105.5
# against 111.8), and MLA e4m3 ran 479 with 64/8/3 against 474 with 64/8/2 (s16).
FP8_GPU_CONFIGS = {
    "small": ((128, 4, 3), (64, 4, 6), (64, 4, 4), (32, 4, 2), (16, 4, 1)),
}
HIP_MAX_STAGES = 2  # AMD's stream pipeliner: keep to its default depth
SMEM_SLACK = 16384  # layout-conversion scratch the compiler adds on top of the K/V buffers


def config_class(dk: int) -> str:
    return "small" if dk <= 128 else "medium" if dk <= 320 else "large"


def gpu_config(dk: int, dv: int, share_kv: bool, max_smem: int, is_hip: bool = False, kv_bytes: int = 2) -> dict:
    """BLOCK_N / num_warps / num_stages for a GPU with `max_smem` bytes of shared memory per
    program: the first preferred config whose K/V stage buffers (`kv_bytes` per element: 2, or
    1 for an fp8 cache, whose small class has its own order, FP8_GPU_CONFIGS) fit."""
    if kv_bytes not in (1, 2):
        raise ValueError(f"kv_bytes: expected 1 (fp8) or 2 (bf16 / fp16), got {kv_bytes!r}")
    cls = config_class(dk)
    table = FP8_GPU_CONFIGS.get(cls, GPU_CONFIGS[cls]) if kv_bytes == 1 else GPU_CONFIGS[cls]
    width = dk + (0 if share_kv else dv)
    for bn, warps, stages in table:
        stages = min(stages, HIP_MAX_STAGES) if is_hip else stages
        if stages * bn * width * kv_bytes + SMEM_SLACK <= max_smem:
            return dict(block_n=bn, num_warps=warps, num_stages=stages)
    bn, warps, _ = table[-1]
    return dict(block_n=bn, num_warps=warps, num_stages=1)


_SMEM_CACHE: dict = {}


def device_max_smem(device) -> int:
    """Shared memory a program may use on `device` (Triton's driver query, cached)."""
    import torch
    device = torch.device(device)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMEM_CACHE:
        try:
            props = triton.runtime.driver.active.utils.get_device_properties(idx)
            _SMEM_CACHE[idx] = int(props["max_shared_mem"])
        except Exception:  # an older driver API: assume the smallest current part (consumer cards)
            _SMEM_CACHE[idx] = 101376
    return _SMEM_CACHE[idx]


def kernel_config(device, dk: int, dv: int, share_kv: bool, kv_bytes: int = 2) -> dict:
    """Launch configuration for `device`: on the CPU interpreter 64 keys per step (about 3 ms
    per program x step, so fewer, larger steps) and no pipelining; on a GPU `gpu_config`."""
    import torch
    device = torch.device(device)
    if device.type == "cpu":
        return dict(block_n=64, num_warps=4, num_stages=1)
    return gpu_config(dk, dv, share_kv, device_max_smem(device), is_hip=torch.version.hip is not None,
                      kv_bytes=kv_bytes)


def check_inputs(q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, sinks):
    if q.dim() != 3:
        raise ValueError(f"q: expected [B, Hq, Dk], got {tuple(q.shape)}")
    B, Hq, Dk = q.shape
    if k_cache.shape[-1] != Dk:
        raise ValueError(f"k_cache last dim {k_cache.shape[-1]} != q head dim {Dk}")
    if k_cache.shape[-2] != v_cache.shape[-2]:
        raise ValueError("k_cache and v_cache disagree on the KV head count")
    Dv = v_cache.shape[-1]
    if tuple(out.shape) != (B, Hq, Dv):
        raise ValueError(f"out: expected {(B, Hq, Dv)}, got {tuple(out.shape)}")
    if lse is not None and tuple(lse.shape) != (B, Hq):
        raise ValueError(f"lse: expected {(B, Hq)}, got {tuple(lse.shape)}")
    if kv_indptr.numel() != B + 1:
        raise ValueError(f"kv_indptr: expected {B + 1} entries, got {kv_indptr.numel()}")
    if sinks is not None and sinks.numel() != Hq:
        raise ValueError(f"sinks: expected {Hq} entries, got {sinks.numel()}")
    return B, Hq, k_cache.shape[-2], Dk, Dv


def partial_shapes(batch: int, num_q_heads: int, v_head_dim: int, splits: int):
    """Split-K scratch: (partials [B, Hq, splits, Dv], partial lse [B, Hq, splits]), both fp32."""
    return (batch, num_q_heads, splits, v_head_dim), (batch, num_q_heads, splits)


def v_byte_pairs(q, k_cache, v_cache, dims: dict, share_kv: bool, fp8_mma: bool):
    """V as uint16 pairs of its fp8 bytes, or None. With a 16-bit q, an fp8 V of its own (not
    the fp8-MMA tier) is read two bytes at a time, which Triton loads from shared memory with
    transposing ldmatrix for the P @ V operand; as bytes it took one 1-byte shared load per
    element (sm_90 SASS of the triton 3.6 build: 64 LDS.U8 per thread and key step at
    32/8/128). The even and odd columns then run as two dots (`attend_range`). Needs unit
    column stride, even strides and offset, and at least 16 columns per half (tl.dot)."""
    import torch
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    if share_kv or fp8_mma or v_cache.dtype not in fp8 or k_cache.dtype != v_cache.dtype:
        return None
    if q.dtype not in (torch.bfloat16, torch.float16) or dims["DV"] % 2 or dims["BLOCK_DV"] < 2 * MIN_DOT:
        return None
    if v_cache.stride(-1) != 1 or any(st % 2 for st in v_cache.stride()[:-1]) or v_cache.storage_offset() % 2:
        return None
    return v_cache.view(torch.uint16)


def split_k_setup(q, k_cache, v_cache, block_n, num_warps, num_stages, fp8_mma: bool = False):
    """Host work shared by the two-stage split-K launchers: GQA tiling, head-dim split, cache
    addressing, fp8 operand form and the launch config (block_n: the caller's, else the
    config's)."""
    import types
    B, Hq, Dk = q.shape
    Hkv, Dv = k_cache.shape[-2], v_cache.shape[-1]
    dims = head_dims(Dk, Dv)
    share_kv = shares_kv(k_cache, v_cache, dims)
    k_arg, e4m3_bits = kv_operand(k_cache)
    v_arg = v_byte_pairs(q, k_cache, v_cache, dims, share_kv, fp8_mma)
    if v_arg is None:
        v_arg, _ = kv_operand(v_cache)
    # addressed in the form passed (byte pairs halve V's strides)
    page_size, k_strides, v_strides = kv_layout.pair_addressing(k_cache, v_arg)
    cfg = kernel_config(q.device, Dk, Dv, share_kv, kv_bytes=k_arg.element_size())
    default_block_n = cfg.pop("block_n")
    if num_warps:
        cfg["num_warps"] = num_warps
    if num_stages:
        cfg["num_stages"] = num_stages
    return types.SimpleNamespace(
        tiling=head_tiling(Hq, Hkv), dims=dims, page_size=page_size,
        k_strides=k_strides, v_strides=v_strides, share_kv=share_kv, k_arg=k_arg, v_arg=v_arg,
        e4m3_bits=e4m3_bits, block_n=block_n or default_block_n, cfg=cfg)


# Launch-argument groups, in the order the split-K kernels' signatures take them: one place for
# the long pointer-and-stride lists, so the two kernels' launches cannot disagree on them.
def cache_args(q, ctx, kv_indptr, kv_indices) -> tuple:
    """q, K and V (operand form from `split_k_setup`) with their strides, the page size and the
    request / slot indices."""
    (kp, kt, kh, kd), (vp, vt, vh, vd) = ctx.k_strides, ctx.v_strides
    return (q, q.stride(0), q.stride(1), q.stride(2),
            ctx.k_arg, kp, kt, kh, kd,
            ctx.v_arg, vp, vt, vh, vd,
            ctx.page_size, kv_indptr, kv_indices)


def partial_args(partials, partial_lse) -> tuple:
    return (partials, partials.stride(0), partials.stride(1), partials.stride(2),
            partial_lse, partial_lse.stride(0), partial_lse.stride(1))


def output_args(out, lse, sinks, v_scale, partial_lse) -> tuple:
    """out, lse and sinks with their strides, v_scale, and the has_sinks / store_lse flags
    (runtime ints, not constexprs: one variant serves both); an absent lse or sinks is a
    dummy pointer (partial_lse) behind a false flag."""
    lse_t = lse if lse is not None else partial_lse
    sinks_t = sinks if sinks is not None else partial_lse
    return (out, out.stride(0), out.stride(1), out.stride(2),
            lse_t, lse_t.stride(0), lse_t.stride(1),
            sinks_t, float(v_scale), int(sinks is not None), int(lse is not None))


def tile_args(ctx, sm_scale, k_scale, softcap) -> tuple:
    """The head tiling and the score scale (k_scale folded in) and soft-cap."""
    t = ctx.tiling
    return (t["group"], t["heads_per_tile"], t["tiles_per_kv"],
            float(sm_scale) * float(k_scale), float(softcap) if softcap else 1.0)


def head_hints(tiling: dict) -> dict:
    """Whether the group and the heads per tile are multiples of 16 (HEAD_TILING_INTS)."""
    return dict(GROUP_DIV16=tiling["group"] % 16 == 0, TILE_DIV16=tiling["heads_per_tile"] % 16 == 0)


@triton.jit
def hinted_head_tiling(group, heads_per_tile, GROUP_DIV16: tl.constexpr, TILE_DIV16: tl.constexpr):
    """group and heads_per_tile with the divisibility head_hints found on the host, written as
    arithmetic Triton's alignment analysis reads (with tl.multiple_of on the argument the row
    masks stayed one predicate a row, not one per 16 rows: sm_90 PTX, triton 3.6.0)."""
    if GROUP_DIV16:
        group = group // 16 * 16
    if TILE_DIV16:
        heads_per_tile = heads_per_tile // 16 * 16
    return group, heads_per_tile


def stage1_constexprs(ctx, softcap) -> dict:
    """Stage 1's tile sizes, feature switches, head-dim split, head hints and launch config."""
    return dict(BLOCK_H=ctx.tiling["BLOCK_H"], BLOCK_N=ctx.block_n, SOFTCAP=bool(softcap),
                SHARE_KV=ctx.share_kv, E4M3_BITS=ctx.e4m3_bits, **head_hints(ctx.tiling), **ctx.dims, **ctx.cfg)


def split_k_scratch(q, partials, partial_lse, shapes):
    """The partials and their LSEs: allocated when not given, else checked against `shapes` =
    (partials shape, partial-lse shape)."""
    import torch
    p_shape, l_shape = shapes
    if partials is None:
        partials = torch.empty(p_shape, dtype=torch.float32, device=q.device)
    if partial_lse is None:
        partial_lse = torch.empty(l_shape, dtype=torch.float32, device=q.device)
    if tuple(partials.shape) != p_shape or tuple(partial_lse.shape) != l_shape:
        raise ValueError(f"partials {tuple(partials.shape)} / partial_lse {tuple(partial_lse.shape)}: "
                         f"expected {p_shape} / {l_shape}")
    if partials.stride(-1) != 1 or partial_lse.stride(-1) != 1:
        raise ValueError("partials and partial_lse need a unit last stride")
    return partials, partial_lse

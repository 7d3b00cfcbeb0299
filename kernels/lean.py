"""Lean (work-centric, persistent) decode attention: one fixed grid, work split on device.

After sglang PR #33576 ("[AMD] Add Work-Centric (Lean) Attention"): a fixed number
of programs (device SM/CU count x multiplier) walks one global list of key tiles; long
requests are split across programs, short ones finish inside one program. The schedule is
derived on the device from ``kv_indptr`` (a one-program pre-pass writes per-request tile
offsets), so a launch needs no host sync, can be captured in a CUDA graph, and adapts to
the real lengths at replay.

Work list. A *segment* is one (request b, head tile t) pair; it owns
``n_b = ceil(visible_b / BLOCK_N)`` key tiles. Segments are laid out request-major, head
tile next, key tile innermost: segment (b, t) occupies global tiles
``[HT * off[b] + t * n_b, HT * off[b] + (t + 1) * n_b)`` with ``off`` the prefix sum of
``n_b`` and ``HT`` the head tiles per request. Program p owns global tiles
``[p * T // P', (p + 1) * T // P')`` (``T = HT * off[B]``, ``P' = min(P, T)``), a
contiguous slice of at least one tile; it walks the segments of that slice and runs an
online softmax over each.

Combine (deterministic, interpreter-safe). Only a program's first and last segment can be
cut by a slice boundary, so each program needs two scratch slots: slot 0 for the segment
containing its slice start, slot 1 for a segment that runs past its slice end. A segment
whose tiles all lie in one program is finished there and written straight to ``out``.
Otherwise every contributor stores its partial (acc, m, l) in its slot, takes a ticket
with an acq_rel atomic on the segment's counter, and the program that draws the last
ticket merges the partials of programs ``p_first .. p_last`` in that fixed order
(never arrival order), writes ``out`` and ``lse``, and resets the counter to 0 for the
next launch or graph replay. Nobody waits on anybody: no spinning, so the Triton
interpreter (which runs programs one after another) cannot deadlock, and the result is
bitwise identical from run to run for a given grid size.

Not implemented (``caps`` say so; ``dispatch`` routes such calls to split-K): soft-cap,
attention sinks, a forced split count.
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from decode_conformance.kernel_api import Capabilities

from . import kv_layout
from . import triton_common as tc
from .launch_constants import LEAN_BLOCK_H as BLOCK_H, LEAN_CPU_BLOCK_N, LEAN_GPU_CONFIGS, config_class

GRID_MULT_ENV = "DECODE_CONFORMANCE_LEAN_GRID_MULT"
BLOCK_N_ENV = "DECODE_CONFORMANCE_LEAN_BLOCK_N"
CPU_PROGRAMS = 8  # small, so CPU tests split requests across programs
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453  # (the kernel inlines it)

__all__ = [
    "LeanKernel", "lean", "lean_decode", "plan_lean", "num_programs", "default_grid_mult",
    "launch_defaults", "head_tile_shape",
    "lean_tile_offsets_kernel", "lean_decode_kernel",
]


# ----------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["B", "window"])
def lean_tile_offsets_kernel(kv_indptr, tile_off, B, window, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: tile_off[0] = 0, tile_off[b + 1] = sum_{b' <= b} ceil(visible_b' / BLOCK_N)."""
    offs = tl.arange(0, BLOCK_B)
    tl.store(tile_off + offs, tl.zeros([BLOCK_B], tl.int32), mask=offs < 1)
    carry = tl.sum(tl.zeros([BLOCK_B], tl.int32), 0)
    for b0 in range(0, B, BLOCK_B):
        idx = b0 + offs
        m = idx < B
        lo = tl.load(kv_indptr + idx, mask=m, other=0)
        hi = tl.load(kv_indptr + idx + 1, mask=m, other=0)
        length = hi - lo
        vis = tl.minimum(length, window)
        n = (vis + (BLOCK_N - 1)) // BLOCK_N
        tl.store(tile_off + 1 + idx, tl.cumsum(n, 0) + carry, mask=m)
        carry += tl.sum(n, 0)


@triton.jit
def _lean_store_final(O, LSE, b, heads, hmask, offs_dv, acc, m_i, l_i, v_scale,
                      stride_ob, stride_oh, stride_lb, stride_lh, DV: tl.constexpr):
    out = acc / l_i[:, None] * v_scale
    o_ptr = O + b * stride_ob + heads[:, None] * stride_oh + offs_dv[None, :]
    tl.store(o_ptr, out.to(O.dtype.element_ty), mask=hmask[:, None] & (offs_dv[None, :] < DV))
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + b * stride_lb + heads * stride_lh, lse, mask=hmask)


# The head counts and the LSE batch stride are runtime values, read once per segment and never in
# the key loop. As compile-time constants every GQA group size of the parity set was a variant of
# its own: 97 variants cold, a third of the main job's compile time
# (docs/gpu-runs/2026-12-02-h200-s16/). TILES_PER_KV stays constant: it divides the head-tile
# index, and it is 1 on every fast-path cell.
@triton.jit(do_not_specialize=["B", "window", "NUM_KV_HEADS", "GROUP", "HPT", "stride_lb"])
def lean_decode_kernel(
    Q, K, V, O, LSE,
    kv_indptr, kv_indices, tile_off,
    PO, PM, PL, counters,
    B, window, qk_scale, v_scale,
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_oh, stride_lb, stride_lh,
    NUM_KV_HEADS,
    GROUP,  # query heads per KV head
    HPT,  # query heads per head tile = min(BLOCK_H, GROUP)
    TILES_PER_KV: tl.constexpr,  # head tiles per KV head = ceil(GROUP / HPT)
    D1: tl.constexpr,  # K columns [0, D1) (MLA: the latent part, = Dv)
    DPE: tl.constexpr,  # K columns [D1, D1 + DPE) (MLA: the rope part), 0 if none
    DV: tl.constexpr,
    BLOCK_D1: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    V_FROM_K: tl.constexpr,  # V is K's first DV columns (MLA): reuse the loaded K tile
    E4M3_BITS: tl.constexpr,  # e4m3 cache passed as uint8 bytes (GPUs below sm_89 have no e4m3 type)
):
    HT = NUM_KV_HEADS * TILES_PER_KV
    NUM_Q_HEADS = NUM_KV_HEADS * GROUP
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D1)
    offs_dv = tl.arange(0, BLOCK_DV)
    dmask = offs_d < D1
    dvmask = offs_dv < DV

    # Requests with no key: out = 0 exactly, lse = -inf (CUDA-graph padding rows).
    for bb in range(pid, B, P):
        empty = (tl.load(kv_indptr + bb + 1) - tl.load(kv_indptr + bb)) == 0
        head_limit = tl.where(empty, NUM_Q_HEADS, 0)  # no rows to write unless the request is empty
        for h0 in range(0, NUM_Q_HEADS, BLOCK_H):
            hh = h0 + offs_h
            hm = hh < head_limit
            tl.store(O + bb * stride_ob + hh[:, None] * stride_oh + offs_dv[None, :],
                     tl.zeros([BLOCK_H, BLOCK_DV], O.dtype.element_ty), mask=hm[:, None] & dvmask[None, :])
            tl.store(LSE + bb * stride_lb + hh * stride_lh,
                     tl.full([BLOCK_H], float("-inf"), tl.float32), mask=hm)

    T = tl.load(tile_off + B).to(tl.int64) * HT  # all tiles of all segments
    # Work programs: min(P, T), so every one of them owns >= 1 tile (the combine counts
    # contributors as p_last - p_first + 1); programs past that have an empty slice.
    PW = tl.maximum(tl.minimum(T, P), 1)
    g_begin = tl.minimum(pid.to(tl.int64) * T // PW, T)
    g_end = tl.minimum((pid + 1).to(tl.int64) * T // PW, T)
    g = g_begin
    while g < g_end:
        # Segment holding global tile g: request = largest b with HT * off[b] <= g.
        lo = pid * 0
        hi = B - 1 + pid * 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            ok = tl.load(tile_off + mid).to(tl.int64) * HT <= g
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        b = lo
        off_b = tl.load(tile_off + b).to(tl.int64)
        n_b = tl.load(tile_off + b + 1).to(tl.int64) - off_b
        local = g - off_b * HT
        ht = local // n_b
        seg_s = off_b * HT + ht * n_b
        seg_e = seg_s + n_b
        stop = tl.minimum(seg_e, g_end)
        j0 = (g - seg_s).to(tl.int32)
        j1 = (stop - seg_s).to(tl.int32)

        kv_lo = tl.load(kv_indptr + b)
        length = tl.load(kv_indptr + b + 1) - kv_lo
        start = length - tl.minimum(length, window)
        kvh = (ht // TILES_PER_KV).to(tl.int32)
        in_grp = (ht % TILES_PER_KV).to(tl.int32) * HPT + offs_h
        hmask = (offs_h < HPT) & (in_grp < GROUP)
        heads = kvh * GROUP + in_grp

        q_ptr = Q + b * stride_qb + heads[:, None] * stride_qh
        q = tl.load(q_ptr + offs_d[None, :], mask=hmask[:, None] & dmask[None, :], other=0.0)
        if BLOCK_DPE > 0:
            offs_pe = tl.arange(0, BLOCK_DPE)
            pemask = offs_pe < DPE
            qpe = tl.load(q_ptr + D1 + offs_pe[None, :], mask=hmask[:, None] & pemask[None, :], other=0.0)

        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
        for j in range(j0, j1):
            pos = start + j * BLOCK_N + offs_n
            kmask = pos < length
            slot = tl.load(kv_indices + kv_lo + pos, mask=kmask, other=0).to(tl.int64)
            page = slot // PAGE_SIZE
            tok = slot % PAGE_SIZE
            k_row = page * stride_kp + tok * stride_ks + kvh * stride_kh
            # Masked loads (other=0): a NaN in a slot the request does not own is never read.
            k = tl.load(K + k_row[:, None] + offs_d[None, :] * stride_kd,
                        mask=kmask[:, None] & dmask[None, :], other=0.0)
            k = tc.upcast_kv(k, q.dtype, E4M3_BITS)
            qk = tl.dot(q, tl.trans(k))
            if BLOCK_DPE > 0:
                kpe = tl.load(K + k_row[:, None] + (D1 + offs_pe[None, :]) * stride_kd,
                              mask=kmask[:, None] & pemask[None, :], other=0.0)
                qk += tl.dot(qpe, tl.trans(tc.upcast_kv(kpe, qpe.dtype, E4M3_BITS)))
            qk = tl.where(kmask[None, :], qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if V_FROM_K:
                v = k  # already upcast
            else:
                v_row = page * stride_vp + tok * stride_vs + kvh * stride_vh
                v = tc.upcast_kv(tl.load(V + v_row[:, None] + offs_dv[None, :] * stride_vd,
                                      mask=kmask[:, None] & dvmask[None, :], other=0.0), q.dtype, E4M3_BITS)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
            m_i = m_new

        # Programs holding tiles seg_s and seg_e - 1 (owner of tile x: ((x + 1) * PW - 1) // T).
        p_first = ((seg_s + 1) * PW - 1) // T
        p_last = (seg_e * PW - 1) // T
        if p_first == p_last:
            _lean_store_final(O, LSE, b, heads, hmask, offs_dv, acc, m_i, l_i, v_scale,
                              stride_ob, stride_oh, stride_lb, stride_lh, DV)
        else:
            # Slot 0: the segment holding this program's first tile; slot 1: one running past its end.
            slot_id = pid * 2 + tl.where(seg_s <= g_begin, 0, 1)
            tl.store(PO + (slot_id * BLOCK_H + offs_h[:, None]) * BLOCK_DV + offs_dv[None, :], acc)
            tl.store(PM + slot_id * BLOCK_H + offs_h, m_i)
            tl.store(PL + slot_id * BLOCK_H + offs_h, l_i)
            tl.debug_barrier()  # every thread's partial is written before the ticket (release)
            cnt_ptr = counters + b * HT + ht
            ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
            tl.debug_barrier()
            if ticket == (p_last - p_first).to(tl.int32):
                # Last to arrive: merge every contributor in program order (not arrival order).
                m_t = tl.full([BLOCK_H], float("-inf"), tl.float32)
                l_t = tl.zeros([BLOCK_H], tl.float32)
                acc_t = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
                for pp in range(p_first.to(tl.int32), p_last.to(tl.int32) + 1):
                    src = pp * 2 + tl.where(seg_s <= (pp * T) // PW, 0, 1)
                    acc_p = tl.load(PO + (src * BLOCK_H + offs_h[:, None]) * BLOCK_DV + offs_dv[None, :],
                                    cache_modifier=".cg")
                    m_p = tl.load(PM + src * BLOCK_H + offs_h, cache_modifier=".cg")
                    l_p = tl.load(PL + src * BLOCK_H + offs_h, cache_modifier=".cg")
                    m_n = tl.maximum(m_t, m_p)
                    a_t = tl.exp2(m_t - m_n)
                    a_p = tl.exp2(m_p - m_n)
                    l_t = l_t * a_t + l_p * a_p
                    acc_t = acc_t * a_t[:, None] + acc_p * a_p[:, None]
                    m_t = m_n
                _lean_store_final(O, LSE, b, heads, hmask, offs_dv, acc_t, m_t, l_t, v_scale,
                                  stride_ob, stride_oh, stride_lb, stride_lh, DV)
                tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")  # ready for the next launch / replay
        g = stop


# ----------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------
def head_tile_shape(num_q_heads: int, num_kv_heads: int, head_rows: int = BLOCK_H) -> tuple[int, int, int]:
    """(group, heads per tile, tiles per KV head): kv_layout's tiling (the split-K kernels' too)
    with at most `head_rows` heads per tile (a power of two >= 16: the score tile's rows)."""
    t = kv_layout.head_tiling(num_q_heads, num_kv_heads, head_rows)
    return t["group"], t["heads_per_tile"], t["tiles_per_kv"]


def _is_hip() -> bool:
    return getattr(torch.version, "hip", None) is not None


def default_grid_mult(device) -> float:
    """Programs per SM/CU when neither DECODE_CONFORMANCE_LEAN_GRID_MULT nor the launch
    configuration (`launch_defaults`) says. ROCm: 1.0 (sglang PR #33576: one CTA per CU beat 2x on
    MI300X and MI355X). NVIDIA: 2.0, from an H200 run (triton 3.6, CUDA-graph replay, 1x / 2x /
    4x SMs): 2x was fastest at 9 of 10 shapes, e.g. B1 x 128K GQA 32/8: 213 / 155 / 210 us,
    B32 x 8K: 405 / 279 / 287 us, MLA B16 x 16K: 168 / 131 / 177 us; the exception, B2 x 64K
    with 8 query heads (one head tile): 65 / 84 / 143 us."""
    if torch.device(device).type != "cuda" or _is_hip():
        return 1.0
    return 2.0


def num_programs(device, per_sm: Optional[float] = None) -> int:
    """Persistent grid size: SM/CU count x DECODE_CONFORMANCE_LEAN_GRID_MULT, else x `per_sm`
    (the launch configuration's programs per SM), else x `default_grid_mult`; on CPU
    (interpreter) a small fixed count, so that requests are split across programs."""
    device = torch.device(device)
    if device.type != "cuda":
        units = CPU_PROGRAMS
        mult = float(os.environ.get(GRID_MULT_ENV, "1.0"))
    else:
        units = torch.cuda.get_device_properties(device).multi_processor_count
        mult = float(os.environ.get(GRID_MULT_ENV, "") or per_sm or default_grid_mult(device))
    return max(1, int(round(units * mult)))


def launch_defaults(device, block_d1: int, mla: bool = False, max_smem: Optional[int] = None) -> dict:
    """block_n / num_warps / num_stages / head_rows / programs_per_sm. NVIDIA: the first of the
    class's LEAN_GPU_CONFIGS whose shared memory fits `max_smem` (default: the device's). ROCm:
    not measured here; conservative tiles (64 / 32 keys), 16 heads per tile. CPU: BLOCK_N 64 (the
    interpreter costs ~3 ms per program x key block). $DECODE_CONFORMANCE_LEAN_BLOCK_N overrides
    the key tile."""
    env = os.environ.get(BLOCK_N_ENV)
    device = torch.device(device)
    if device.type != "cuda":
        cfg = dict(block_n=LEAN_CPU_BLOCK_N, num_warps=4, num_stages=2, head_rows=BLOCK_H, programs_per_sm=None)
    elif _is_hip():
        cfg = dict(block_n=64 if block_d1 <= 128 else 32, num_warps=4 if block_d1 <= 128 else 8, num_stages=2,
                   head_rows=BLOCK_H, programs_per_sm=None)
    else:
        table = LEAN_GPU_CONFIGS[config_class(block_d1, mla)]
        if len(table) > 1:
            limit = tc.device_max_smem(device) if max_smem is None else int(max_smem)
            table = [c for c in table if c[5] <= limit] or table[-1:]
        bn, warps, stages, per_sm, rows, _ = table[0]
        cfg = dict(block_n=bn, num_warps=warps, num_stages=stages, head_rows=rows, programs_per_sm=per_sm)
    if env:
        cfg["block_n"] = int(env)
    return cfg


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _torch_allocator(device) -> Callable:
    def alloc(name, shape, dtype, fill=None):
        if fill is None:
            return torch.empty(shape, dtype=dtype, device=device)
        return torch.full(shape, fill, dtype=dtype, device=device)
    return alloc


def plan_lean(q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, *, sm_scale: float,
              k_scale: float = 1.0, v_scale: float = 1.0, window: Optional[int] = None,
              page_size: Optional[int] = None, alloc: Optional[Callable] = None,
              programs: Optional[int] = None, block_n: Optional[int] = None,
              num_warps: Optional[int] = None, num_stages: Optional[int] = None,
              head_rows: Optional[int] = None) -> Callable[[], None]:
    """Host work for one batch shape; returns a no-argument launch (no host sync inside).

    q [B, Hq, Dk]; k_cache [pages, page_size, Hkv, Dk] (or [slots, Hkv, Dk]); v_cache likewise
    with Dv (may be a strided view of k_cache, MLA); kv_indptr int32 [B+1]; kv_indices int32
    flat slot ids; out [B, Hq, Dv]; lse fp32 [B, Hq] (natural log). window = visible keys,
    current one included (None = all). alloc(name, shape, dtype, fill) supplies scratch
    (counters need fill 0); default torch. The launch may be captured in a CUDA graph and
    replayed with new kv_indptr/kv_indices contents (same B). programs (the persistent grid),
    block_n, num_warps, num_stages and head_rows (most query heads per tile, a power of two
    >= 16) default to `launch_defaults` for the device, key width and attention kind.
    """
    B, Hq, Dk = q.shape
    if page_size is None:
        page_size = k_cache.shape[1] if k_cache.dim() == 4 else 1
    Hkv = k_cache.shape[-2]
    Dv = v_cache.shape[-1]
    if out.shape != (B, Hq, Dv):
        raise ValueError(f"out shape {tuple(out.shape)} != {(B, Hq, Dv)}")
    if q.stride(2) != 1 or out.stride(2) != 1:
        raise ValueError("q and out need a unit stride in the head dim")
    d1 = min(Dk, Dv)
    dpe = Dk - d1
    if k_cache.dim() == 4 and k_cache.shape[1] != page_size:
        raise ValueError(f"cache page dim {k_cache.shape[1]} != page_size {page_size}")
    if k_cache.dim() == 3 and page_size != 1:
        raise ValueError("a 3-D [slots, H, D] cache needs page_size 1")
    kpage, (ksp, kss, ksh, ksd), (vsp, vss, vsh, vsd) = kv_layout.pair_addressing(k_cache, v_cache)
    BLOCK_D1, BLOCK_DV = _pow2(d1), _pow2(Dv)
    BLOCK_DPE = _pow2(dpe) if dpe else 0
    v_from_k = (v_cache.data_ptr() == k_cache.data_ptr() and (vsp, vss, vsh, vsd) == (ksp, kss, ksh, ksd)
                and d1 == Dv and v_cache.dtype == k_cache.dtype)
    dev = q.device
    cfg = launch_defaults(dev, BLOCK_D1, mla=v_from_k)
    rows = int(head_rows or cfg["head_rows"])
    if rows < 16 or rows & (rows - 1):
        raise ValueError(f"head_rows: expected a power of two >= 16, got {head_rows}")
    group, hpt, tiles_per_kv = head_tile_shape(Hq, Hkv, rows)
    block_h = _pow2(hpt)  # one tile's rows; K/V are read once per tile, so fewer tiles read less
    ht = Hkv * tiles_per_kv
    P = programs or num_programs(dev, cfg["programs_per_sm"])
    BLOCK_N = block_n or cfg["block_n"]
    num_warps = num_warps or cfg["num_warps"]
    num_stages = num_stages or cfg["num_stages"]
    if alloc is None:
        alloc = _torch_allocator(dev)
    tile_off = alloc("lean.tile_off", (B + 1,), torch.int32, 0)
    po = alloc("lean.partial_o", (P, 2, block_h, BLOCK_DV), torch.float32, None)
    pm = alloc("lean.partial_m", (P, 2, block_h), torch.float32, None)
    pl = alloc("lean.partial_l", (P, 2, block_h), torch.float32, None)
    counters = alloc("lean.counters", (max(1, B * ht),), torch.int32, 0)
    win = kv_layout.visible_arg(window)
    qk_scale = float(sm_scale) * float(k_scale) * LOG2E
    vs = float(v_scale)
    block_b = min(1024, max(16, triton.next_power_of_2(B)))

    k_arg, e4m3_bits = tc.kv_operand(k_cache)  # e4m3 as bytes below sm_89 (shared with split-K)
    v_arg, _ = tc.kv_operand(v_cache)

    def launch():
        lean_tile_offsets_kernel[(1,)](kv_indptr, tile_off, B, win, BLOCK_B=block_b, BLOCK_N=BLOCK_N)
        lean_decode_kernel[(P,)](
            q, k_arg, v_arg, out, lse, kv_indptr, kv_indices, tile_off, po, pm, pl, counters,
            B, win, qk_scale, vs,
            q.stride(0), q.stride(1), ksp, kss, ksh, ksd, vsp, vss, vsh, vsd,
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
            NUM_KV_HEADS=Hkv, GROUP=group, HPT=hpt, TILES_PER_KV=tiles_per_kv,
            D1=d1, DPE=dpe, DV=Dv, BLOCK_D1=BLOCK_D1, BLOCK_DPE=BLOCK_DPE, BLOCK_DV=BLOCK_DV,
            BLOCK_H=block_h, BLOCK_N=BLOCK_N, PAGE_SIZE=kpage, V_FROM_K=v_from_k, E4M3_BITS=e4m3_bits,
            num_warps=num_warps, num_stages=num_stages,
        )

    return launch


def lean_decode(q, k_cache, v_cache, kv_indptr, kv_indices, out, lse=None, **kwargs) -> torch.Tensor:
    """Plain call outside the suite: plan (scratch from torch) and launch once; returns out.
    Keyword arguments as plan_lean (sm_scale required)."""
    if lse is None:
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    plan_lean(q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, **kwargs)()
    return out


# ----------------------------------------------------------------------------------------
# Suite adapter
# ----------------------------------------------------------------------------------------
class LeanKernel:
    name = "lean"
    caps = Capabilities(
        kv_dtypes=frozenset({"bf16", "fp16", "e4m3", "e5m2"}),
        layouts=frozenset({"contig", "paged"}),
        window_convention="counts-current",
        mla=True,
        softcap=False,
        sinks=False,
        lse=True,
        num_splits=False,
        cuda_graph_safe=True,
        deterministic=True,
    )

    def __init__(self, programs: Optional[int] = None, block_n: Optional[int] = None,
                 head_rows: Optional[int] = None):
        self.programs = programs
        self.block_n = block_n
        self.head_rows = head_rows

    def plan(self, batch) -> Callable[[], None]:
        if batch.softcap or batch.sinks is not None:
            raise NotImplementedError("lean: soft-cap and attention sinks are not implemented (use dispatch)")
        return plan_lean(
            batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out, batch.lse,
            sm_scale=batch.sm_scale, k_scale=batch.k_scale, v_scale=batch.v_scale, window=batch.window,
            page_size=batch.page_size, alloc=batch.workspace.alloc, programs=self.programs, block_n=self.block_n,
            head_rows=self.head_rows,
        )


lean = LeanKernel()

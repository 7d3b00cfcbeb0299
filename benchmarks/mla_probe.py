"""What moves the MLA stage-1 loop's time on a GPU: probe kernels, timed beside the shipped kernel
and flashinfer's MLA wrappers in one process by the peer table.

    python3 benchmarks/peer_table.py --out DIR --cell b8-32k-mla --rounds 5 --baseline dispatch \
        --kernel dispatch --kernel benchmarks.mla_probe:gather_64 --kernel benchmarks.mla_probe:tma_64 ... \
        --kernel flashinfer_mla_fa3

The MLA cell (128 query heads on one 576-wide latent head, V the first 512 columns of K) is the one
where the shipped split-K kernel trails flashinfer's FA3 MLA by 2.3x. Its stage 1 holds a 64-head
tile of q in shared memory and a 64 x 512 fp32 accumulator in registers (255 a thread at 8 warps, no
spill: `ci/compile_check.py` at 128/1/576/512), one program an SM, and each program's loads, MMAs
and softmax take turns. The probes keep that loop's arithmetic (64-head tiles, online softmax with
one rescale per step of keys, K shared as V, the shipped row's one wave of programs) and change one
thing each:
  - `gather_64`: the shipped tiles and launch config (64 keys a step, 8 warps, 2 stages), rows found
    by page id from the block table, no masks, scores scaled by scale x log2 e into `exp2`; `gather_64_masked`,
    `gather_64_exp`, `gather_64_masked_exp` put the shipped loop's masks and `tl.exp` back;
  - `*_dv2`: the 512 output columns over two programs, 256 each (QK recomputed by both: 1.5x the
    MMA work for half the accumulator); `gather_32_dv2_w4` fits two 4-warp programs an SM;
  - `tma_*`: K by Hopper's tensor-memory copy, one 16-row box a page (a host tensor descriptor over
    the pool as [slots, 576]; no per-element addresses in registers).
  - `*_w16`: 16 warps (four warpgroups, 64 accumulator registers a thread), the probe's loop and
    the shipped kernel's own launch (`shipped_launch`): 1.8x-2.9x slower on an H100 (session 42).
Partials go to a scratch of [B, Hq, chunks, 512] and a small merge kernel folds them (the shipped
stage 2's job), so the probe's time compares with `dispatch`'s whole launch. What they measured:
docs/peer-table.md, "The MLA cell".

Probe-only: bf16, page size 16, the MLA split (576 / 512), one latent head, equal lengths that are
whole key steps, no soft-cap, sinks, window or LSE (its Capabilities and `plan` say so; other cells
skip it). Nothing here is shipped; a probe that wins is the lead for a kernel change, not the change.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from decode_conformance.kernel_api import Capabilities, ShapeRule
from decode_conformance_kernels import split_rule

try:  # host-side tensor descriptors (Triton >= 3.4); without them the TMA probes say so
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None

LOG2E = tl.constexpr(1.4426950408889634)  # one constant for the host's scale and the kernel's LSE
D_MAIN, D_PE, PAGE = 512, 64, 16
HEAD_TILE = 64  # query heads a program: the shipped MLA tiling of 128 heads (two tiles)
MAX_CHUNKS = split_rule.MLA_MAX_SPLITS  # the shipped MLA split cap


@triton.jit
def _page_scores(q, q_pe, bt, page_idx, KDesc, PeDesc, VDesc, sl, DM: tl.constexpr, DVS: tl.constexpr,
                 SLICES: tl.constexpr):
    """Raw scores of one 16-key page (box loads by tensor-memory copy) and its V tile."""
    row0 = tl.load(bt + page_idx) * 16
    k = KDesc.load([row0, 0])
    qk = tl.dot(q, tl.trans(k)) + tl.dot(q_pe, tl.trans(PeDesc.load([row0, DM])))
    if SLICES > 1:
        v = VDesc.load([row0, sl * DVS])
    else:
        v = k
    return qk, v


@triton.jit
def _mla_probe_stage1(Q, stride_qb, stride_qh, Kc, stride_kslot, KDesc, PeDesc, VDesc,
                      BlockTable, stride_bt, Part, stride_pb, stride_ph, stride_ps, PartLse, stride_lb, stride_lh,
                      chunk_pages, qk_scale_log2,
                      BLOCK_H: tl.constexpr, PAGES: tl.constexpr, DM: tl.constexpr, DPE: tl.constexpr,
                      DVS: tl.constexpr, SLICES: tl.constexpr, TMA: tl.constexpr,
                      MASKED: tl.constexpr = False, NAT_EXP: tl.constexpr = False):
    b = tl.program_id(0)
    tile = tl.program_id(1) // SLICES
    sl = tl.program_id(1) % SLICES
    chunk = tl.program_id(2)
    rows = tl.arange(0, BLOCK_H)
    heads = tile * BLOCK_H + rows
    cols = tl.arange(0, DM)
    cols_pe = tl.arange(0, DPE)
    cols_v = tl.arange(0, DVS)
    q_row = Q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    q = tl.load(q_row + cols[None, :])
    q_pe = tl.load(q_row + DM + cols_pe[None, :])
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DVS], tl.float32)
    bt = BlockTable + b.to(tl.int64) * stride_bt
    first = chunk * chunk_pages
    for p in range(first, first + chunk_pages, PAGES):
        if TMA:  # one 16-row box a page; the pages' score tiles share one softmax step
            qk0, v0 = _page_scores(q, q_pe, bt, p, KDesc, PeDesc, VDesc, sl, DM, DVS, SLICES)
            qk1, v1 = _page_scores(q, q_pe, bt, p + 1, KDesc, PeDesc, VDesc, sl, DM, DVS, SLICES)
            m_new = tl.maximum(m, tl.maximum(tl.max(qk0, 1), tl.max(qk1, 1)) * qk_scale_log2)
            if PAGES == 4:
                qk2, v2 = _page_scores(q, q_pe, bt, p + 2, KDesc, PeDesc, VDesc, sl, DM, DVS, SLICES)
                qk3, v3 = _page_scores(q, q_pe, bt, p + 3, KDesc, PeDesc, VDesc, sl, DM, DVS, SLICES)
                m_new = tl.maximum(m_new, tl.maximum(tl.max(qk2, 1), tl.max(qk3, 1)) * qk_scale_log2)
            alpha = tl.math.exp2(m - m_new)
            p0 = tl.math.exp2(qk0 * qk_scale_log2 - m_new[:, None])
            p1 = tl.math.exp2(qk1 * qk_scale_log2 - m_new[:, None])
            denom = denom * alpha + tl.sum(p0, 1) + tl.sum(p1, 1)
            acc = acc * alpha[:, None] + tl.dot(p0.to(v0.dtype), v0)
            acc += tl.dot(p1.to(v1.dtype), v1)
            if PAGES == 4:
                p2 = tl.math.exp2(qk2 * qk_scale_log2 - m_new[:, None])
                p3 = tl.math.exp2(qk3 * qk_scale_log2 - m_new[:, None])
                denom += tl.sum(p2, 1) + tl.sum(p3, 1)
                acc += tl.dot(p2.to(v2.dtype), v2)
                acc += tl.dot(p3.to(v3.dtype), v3)
            m = m_new
        else:  # PAGES x 16 rows a step, gathered by page id from the block table (the shipped loop
            # reads a slot id per key from its request's index list)
            offs = tl.arange(0, PAGES * 16)
            page = tl.load(bt + p + offs // 16).to(tl.int64)
            slot = page * 16 + offs % 16
            k_row = Kc + slot[:, None] * stride_kslot
            if MASKED:  # as the shipped loop: loads masked at the chunk's end, masked scores -inf
                keep = (p * 16 + offs) < (first + chunk_pages) * 16
                k = tl.load(k_row + cols[None, :], mask=keep[:, None], other=0.0)
                k_pe = tl.load(k_row + DM + cols_pe[None, :], mask=keep[:, None], other=0.0)
            else:
                k = tl.load(k_row + cols[None, :])
                k_pe = tl.load(k_row + DM + cols_pe[None, :])
            qk = tl.dot(q, tl.trans(k)) + tl.dot(q_pe, tl.trans(k_pe))
            if NAT_EXP:  # as the shipped loop: natural-log scores, tl.exp
                qk = qk * (qk_scale_log2 / LOG2E)
            else:
                qk = qk * qk_scale_log2
            if MASKED:
                qk = tl.where(keep[None, :], qk, float("-inf"))
            m_new = tl.maximum(m, tl.max(qk, 1))
            if NAT_EXP:
                alpha = tl.exp(m - m_new)
                pj = tl.exp(qk - m_new[:, None])
            else:
                alpha = tl.math.exp2(m - m_new)
                pj = tl.math.exp2(qk - m_new[:, None])
            denom = denom * alpha + tl.sum(pj, 1)
            if SLICES > 1:
                v = tl.load(k_row + sl * DVS + cols_v[None, :])
            else:
                v = k
            acc = acc * alpha[:, None] + tl.dot(pj.to(v.dtype), v)
            m = m_new
    heads64 = heads.to(tl.int64)
    base = b.to(tl.int64) * stride_pb + heads64[:, None] * stride_ph + chunk * stride_ps
    tl.store(Part + base + sl * DVS + cols_v[None, :], acc / denom[:, None])
    if NAT_EXP:
        lse = m + tl.log(denom)
    else:  # log2-domain running max -> natural-log LSE
        lse = (m + tl.log2(denom)) / LOG2E
    tl.store(PartLse + b.to(tl.int64) * stride_lb + heads64 * stride_lh + chunk, lse, mask=(rows * 0 + sl) == 0)  # a tensor mask: the interpreter rejects a scalar one


@triton.jit
def _mla_probe_merge(Part, stride_pb, stride_ph, stride_ps, PartLse, stride_lb, stride_lh, Out, stride_ob,
                     stride_oh, chunks, CHUNKS: tl.constexpr, DV: tl.constexpr, STEP: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, CHUNKS)
    lse = tl.load(PartLse + b * stride_lb + h * stride_lh + offs_s, mask=offs_s < chunks, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))
    w = w / tl.sum(w, 0)
    cols = tl.arange(0, DV)
    acc = tl.zeros([DV], tl.float32)
    for s0 in range(0, chunks, STEP):
        idx = s0 + tl.arange(0, STEP)
        ws = tl.sum(tl.where(offs_s[None, :] == idx[:, None], w[None, :], 0.0), 1)
        part = tl.load(Part + b * stride_pb + h * stride_ph + idx[:, None] * stride_ps + cols[None, :],
                       mask=(idx < chunks)[:, None], other=0.0)
        acc += tl.sum(ws[:, None] * part, 0)
    tl.store(Out + b * stride_ob + h * stride_oh + cols, acc.to(Out.dtype.element_ty))


class MlaProbe:
    """A probe kernel (module docstring): `tma` loads, `pages` pages a key step, `slices` output-column
    programs, `warps` / `stages` the launch config."""

    def __init__(self, name: str, tma: bool, pages: int, stages: int, slices: int = 1, warps: int = 8,
                 per_sm: int = split_rule.MLA_PROGRAMS_PER_SM, masked: bool = False, nat_exp: bool = False):
        self.masked, self.nat_exp = masked, nat_exp
        self.name = name
        self.tma, self.pages, self.stages, self.slices, self.warps = tma, pages, stages, slices, warps
        self.per_sm = per_sm  # programs an SM holds: the chunk count fills one wave of them
        why = "the MLA stage-1 probe: the MLA split (576 / 512) only"
        self.caps = Capabilities(
            kv_dtypes=frozenset({"bf16"}), layouts=frozenset({"paged"}), page_sizes=frozenset({PAGE}),
            head_dims=frozenset({D_MAIN + D_PE}), window_convention=None, softcap=False, sinks=False, lse=False,
            devices=frozenset({"cpu", "cuda"}), cuda_graph_safe=True,
            shape_rules=(ShapeRule("v_head_dim", allowed=frozenset({D_MAIN}), why=why),
                         ShapeRule("num_kv_heads", allowed=frozenset({1}), why=why)),
            unavailable=None if TensorDescriptor is not None or not tma else "triton without tensor descriptors")

    def plan(self, batch):
        B, Hq, Dk = batch.q.shape
        lens = batch.seq_lens_host
        step = self.pages * PAGE
        if Hq % HEAD_TILE or len(set(lens)) != 1 or lens[0] % step or batch.v_cache.data_ptr() != batch.k_cache.data_ptr():
            raise ValueError(f"MlaProbe: needs query heads in {HEAD_TILE}s, equal lengths that are whole {step}-key "
                             f"steps and V as K's view; got Hq {Hq}, lengths {sorted(set(lens))[:4]}")
        cache = batch.k_cache
        if cache.dim() != 4 or cache.shape[1] != PAGE or cache.shape[2] != 1 or not cache.is_contiguous():
            raise ValueError(f"MlaProbe: needs a contiguous [pages, 16, 1, 576] pool, got {tuple(cache.shape)}")
        slots = cache.view(-1, Dk)
        pages = lens[0] // PAGE
        # one wave, as the shipped MLA row plans (kernels/split_rule.py: one program an SM there)
        sms = split_rule.num_sms(cache.device)
        chunks = max(1, min(MAX_CHUNKS, lens[0] // step, sms * self.per_sm // (B * (Hq // HEAD_TILE) * self.slices)))
        while pages % chunks or (pages // chunks) % self.pages:
            chunks -= 1
        chunk_pages = pages // chunks
        dvs = D_MAIN // self.slices
        part = torch.empty((B, Hq, chunks, D_MAIN), dtype=torch.float32, device=cache.device)
        part_lse = torch.empty((B, Hq, chunks), dtype=torch.float32, device=cache.device)
        if self.tma:
            kd = TensorDescriptor.from_tensor(slots, [PAGE, D_MAIN])
            pd = TensorDescriptor.from_tensor(slots, [PAGE, D_PE])
            vd = TensorDescriptor.from_tensor(slots, [PAGE, dvs])
        else:
            kd = pd = vd = slots  # unused by the gather form
        bt, q, out = batch.block_table, batch.q, batch.out
        scale = float(batch.sm_scale) * float(batch.k_scale) * LOG2E.value
        grid1 = (B, (Hq // HEAD_TILE) * self.slices, chunks)
        merge_chunks = triton.next_power_of_2(chunks)

        def launch():
            _mla_probe_stage1[grid1](
                q, q.stride(0), q.stride(1), slots, slots.stride(0), kd, pd, vd, bt, bt.stride(0),
                part, part.stride(0), part.stride(1), part.stride(2), part_lse, part_lse.stride(0),
                part_lse.stride(1), chunk_pages, scale,
                BLOCK_H=HEAD_TILE, PAGES=self.pages, DM=D_MAIN, DPE=D_PE, DVS=dvs, SLICES=self.slices, TMA=self.tma,
                MASKED=self.masked, NAT_EXP=self.nat_exp,
                num_warps=self.warps, num_stages=self.stages)
            _mla_probe_merge[(B, Hq)](
                part, part.stride(0), part.stride(1), part.stride(2), part_lse, part_lse.stride(0),
                part_lse.stride(1), out, out.stride(0), out.stride(1), chunks,
                CHUNKS=merge_chunks, DV=D_MAIN, STEP=4, num_warps=8)
        return launch


def gather_64():
    """The shipped tiles and launch config: 64 keys a step (by page id), 8 warps, 2 stages, one program an SM."""
    return MlaProbe("mla_probe_gather_64", tma=False, pages=4, stages=2)


def gather_64_masked():
    """gather_64 with the shipped loop's masks: loads masked at the chunk's end, scores -inf there."""
    return MlaProbe("mla_probe_gather_64_masked", tma=False, pages=4, stages=2, masked=True)


def gather_64_exp():
    """gather_64 with the shipped loop's natural-log scores and tl.exp."""
    return MlaProbe("mla_probe_gather_64_exp", tma=False, pages=4, stages=2, nat_exp=True)


def gather_64_masked_exp():
    """gather_64 with both of the shipped loop's forms."""
    return MlaProbe("mla_probe_gather_64_masked_exp", tma=False, pages=4, stages=2, masked=True, nat_exp=True)


def gather_32_dv2():
    """Two programs split the 512 output columns, 32 keys a step (8 warps, 2 stages)."""
    return MlaProbe("mla_probe_gather_32_dv2", tma=False, pages=2, stages=2, slices=2)


def gather_16_dv2():
    """As gather_32_dv2 with 16 keys a step: 128 registers a thread."""
    return MlaProbe("mla_probe_gather_16_dv2", tma=False, pages=1, stages=2, slices=2)


def gather_32_dv2_w4():
    """Two programs an SM: one warpgroup each, 256 output columns, 32 keys a step in one stage
    (110,592 bytes of shared memory and 255 registers a thread, so two fit an SM)."""
    return MlaProbe("mla_probe_gather_32_dv2_w4", tma=False, pages=2, stages=1, slices=2, warps=4, per_sm=2)


def tma_64():
    """64 keys a step as four page boxes by tensor-memory copy, 8 warps, 2 stages."""
    return MlaProbe("mla_probe_tma_64", tma=True, pages=4, stages=2)


def tma_32_dv2():
    return MlaProbe("mla_probe_tma_32_dv2", tma=True, pages=2, stages=2, slices=2)


def gather_64_w16():
    """gather_64 at 16 warps: four warpgroups, 64 accumulator registers a thread, so more warps
    an SM to hide each other's loads and softmax (128 registers at most a thread; sm_90 compile,
    triton 3.9.0 on a CPU: 448 bytes of spill in the shipped loop's form)."""
    return MlaProbe("mla_probe_gather_64_w16", tma=False, pages=4, stages=2, warps=16)


def gather_32_w16():
    """32 keys a step in 3 stages at 16 warps."""
    return MlaProbe("mla_probe_gather_32_w16", tma=False, pages=2, stages=3, warps=16)


def shipped_launch(name: str, block_n: int, warps: int, stages: int):
    """The shipped split-K kernel (`adaptive_split`) with another launch config on the MLA row
    (576 / 512): `block_n` keys a step, `warps`, `stages`; other rows keep the shipped launch."""
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel

    class ShippedLaunch(AdaptiveSplitKernel):
        def launch_options(self, batch):
            opts = super().launch_options(batch)
            if batch.v_from_k and batch.head_dim == D_MAIN + D_PE:
                opts.update(num_warps=warps, num_stages=stages)
            return opts

    kernel = ShippedLaunch(block_n=block_n)
    kernel.name = name
    return kernel


def shipped_64_w16():
    """The shipped MLA stage 1 (masks, `tl.exp`, slot-id addressing) at 16 warps, 64 keys, 2 stages."""
    return shipped_launch("adaptive_mla_64_w16", 64, 16, 2)


def shipped_32_w16():
    """The shipped MLA stage 1 at 16 warps, 32 keys, 3 stages (147,712 bytes of shared memory)."""
    return shipped_launch("adaptive_mla_32_w16", 32, 16, 3)

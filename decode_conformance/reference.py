"""The ground truth every kernel is judged against, and the error budget's yardstick.

`reference` is high-precision decode attention computed on exactly the values the kernel
sees: fp8 caches are dequantized from their stored bytes (design principle 3), so a
tolerance measures kernel error and not quantization error. Keys are processed in chunks
with an online softmax in float64, so batch 32 x 128k fits on one GPU.

`tier_attention` is the same attention done the way a kernel of a declared precision tier
does it (plain torch in the case's own dtype, or with q and P quantized to the cache's fp8
type): the error *it* makes on a row is what a kernel of that tier is allowed, up to a
multiple (metrics.py).

Semantics, for request b with length L and query head h (KV head h // group):
  visible keys p in [max(0, L - W), L), W = keys under the window counting the current one
  s_p = (q . k_p) * k_scale * sm_scale;  s_p = cap * tanh(s_p / cap) if soft-capped
  out = sum_p exp(s_p) v_p v_scale / Z,  Z = sum_p exp(s_p) (+ exp(sink_h) with sinks)
  lse = ln Z.  A row with no visible key outputs zeros (lse -inf, or sink_h with sinks).

Both read only the inputs, and the runner calls them before the kernel runs: what the
kernel does to its inputs cannot move the yardstick.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .batch import DecodeBatch
from .cases import Case

CHUNK_KEYS = 16384

# How a kernel computes on an fp8 KV cache (Capabilities.fp8_math). Named after what they do.
DEQUANT_KV = "dequant-kv"  # K/V bytes upcast (dequantized) to the query dtype; q and P stay in it
FP8_Q_AND_P = "fp8-q-and-p"  # q and the probabilities P quantized to the cache's fp8 type: fp8 x fp8 MMAs
FP8_MATH = (DEQUANT_KV, FP8_Q_AND_P)


@dataclass
class Reference:
    out: torch.Tensor  # [B, Hq, Dv] float64
    lse: torch.Tensor  # [B, Hq] float64 (natural log)
    visible: torch.Tensor  # [B] int64: keys each request attends to (on the batch's device)


@dataclass
class TierResult:
    out: torch.Tensor  # [B, Hq, Dv] in the output dtype
    # [B, Hq] float64: the LSE as the tier computes it (metrics.lse_budget's yardstick); None
    # only from callers that build a TierResult by hand.
    lse: Optional[torch.Tensor]
    # [B, Hq] float64: a bound on what rounding the Dk products of each score to fp32 moves the
    # LSE by (`score_rounding_bound`); part of the LSE budget's floor.
    lse_slack: Optional[torch.Tensor] = None
    # Further realizations of the same arithmetic (FP8_Q_AND_P: other quantization grids for P);
    # a row's yardstick is the largest error over all of them.
    more: tuple = ()

    @property
    def outs(self) -> tuple:
        return (self.out,) + tuple(self.more)


def visible_range(length: int, visible_keys) -> tuple[int, int]:
    start = 0 if visible_keys is None else max(0, length - visible_keys)
    return start, length


def _request_slots(case: Case, batch: DecodeBatch, b: int, indptr: list) -> torch.Tensor:
    L = case.seq_lens[b]
    start, end = visible_range(L, case.visible_keys)
    return batch.kv_indices[indptr[b] + start: indptr[b] + end].long()


def _scores(case: Case, qg: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """qg [Hkv, G, Dk], k [n, Hkv, Dk] -> scaled, capped scores [Hkv, G, n]."""
    s = torch.einsum("hgd,nhd->hgn", qg, k) * case.sm_scale
    if case.softcap is not None:
        s = case.softcap * torch.tanh(s / case.softcap)
    return s


def reference(case: Case, batch: DecodeBatch, dtype: torch.dtype = torch.float64) -> Reference:
    B, Hq, Hkv, G, Dk, Dv = case.batch, case.num_q_heads, case.num_kv_heads, case.group, case.head_dim, case.v_head_dim
    k_scale, v_scale = case.scales
    dev = batch.device
    k_slots, v_slots = batch.k_slots(), batch.v_slots()
    indptr = batch.kv_indptr.tolist()
    out = torch.zeros((B, Hq, Dv), dtype=dtype, device=dev)
    lse = torch.full((B, Hq), float("-inf"), dtype=dtype, device=dev)
    visible = torch.zeros(B, dtype=torch.int64)
    sinks = batch.sinks.to(dtype).view(Hkv, G) if batch.sinks is not None else None
    for b in range(B):
        slots = _request_slots(case, batch, b, indptr)
        visible[b] = slots.numel()
        qg = batch.q[b].to(dtype).view(Hkv, G, Dk)
        m = torch.full((Hkv, G), float("-inf"), dtype=dtype, device=dev)
        z = torch.zeros((Hkv, G), dtype=dtype, device=dev)
        acc = torch.zeros((Hkv, G, Dv), dtype=dtype, device=dev)
        for chunk in (slots.split(CHUNK_KEYS) if slots.numel() else ()):
            k = k_slots[chunk].to(dtype) * k_scale
            v = v_slots[chunk].to(dtype) * v_scale
            s = _scores(case, qg, k)
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp(m - m_new).nan_to_num(0.0)  # -inf - -inf on the first chunk
            p = torch.exp(s - m_new[..., None])
            z = z * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + torch.einsum("hgn,nhd->hgd", p, v)
            m = m_new
        if sinks is not None:
            m_new = torch.maximum(m, sinks)
            alpha = torch.exp(m - m_new).nan_to_num(0.0)
            z = z * alpha + torch.exp(sinks - m_new)
            acc = acc * alpha[..., None]
            m = m_new
        has = z > 0
        out[b] = torch.where(has[..., None], acc / z.clamp_min(torch.finfo(dtype).tiny)[..., None], 0.0).view(Hq, Dv)
        lse[b] = torch.where(has, m + torch.log(z), float("-inf")).view(Hq)
    return Reference(out=out, lse=lse, visible=visible.to(dev))


def saturating_cast(x: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """x cast to an fp8 type clamping to its largest finite value first, as Triton's cast does
    on a GPU (cvt.rn.satfinite); torch's own `.to()` is not relied on past the range (it
    gives NaN or inf on some versions and devices, e.g. e5m2 has an inf)."""
    big = torch.finfo(fp8).max
    return x.float().clamp(-big, big).to(fp8)


def tier_attention(case: Case, batch: DecodeBatch, fp8_math: str = DEQUANT_KV) -> TierResult:
    """The attention a kernel of tier `fp8_math` computes, done by plain torch.

    Non-fp8 caches, and fp8 caches under DEQUANT_KV: bf16/fp16 matmuls and softmax in the
    query dtype on the dequantized cache (the way FlashAttention's tests build their
    low-precision reference). FP8_Q_AND_P: q saturated to the cache's fp8 type, scores from
    fp8 x fp8 products accumulated in fp32, P = exp(s - row max) quantized to the fp8 type
    once per row for the P @ V product, the denominator summed from the unquantized P (as
    split-K kernels with fp8 MMAs do); its LSE carries q's quantization, so it is returned
    too. A kernel quantizes P against its running max of a tile, not the row's: P is scaled
    by exp(m_row - m_tile) >= 1 before rounding, which moves it on the fp8 grid. So P is
    quantized four times, scaled by 2^(j/4) (j = 0..3: the grid positions one factor of 2
    spans), giving four equally valid realizations of the tier's rounding; the budget takes
    the largest error among them (one realization alone can land near zero on a short row,
    where a kernel's equally legitimate rounding does not)."""
    if fp8_math not in FP8_MATH:
        raise ValueError(f"fp8_math: expected one of {FP8_MATH}, got {fp8_math!r}")
    if fp8_math == FP8_Q_AND_P and case.is_fp8:
        return _fp8_q_and_p(case, batch)
    lse, slack = _lse_in_fp32(case, batch)
    return TierResult(out=_in_query_dtype(case, batch), lse=lse, lse_slack=slack)


def dot_rounding_terms(head_dim: int) -> int:
    """gamma in |fl(q . k) - q . k| <= gamma * u * sum_i |q_i k_i| (u = eps32 / 2) for a
    kernel's fp32 score, to first order: bf16 x bf16 and fp16 x fp16 products are exact in fp32;
    the Dk of them are summed blockwise (MMA instructions reduce 16 at a time, blocks
    accumulate in order: (b + n/b) u at b = 16, metrics.blocked_sum_terms); the products with
    sm_scale and log2 e and the subtraction of the running max round four times more."""
    from .metrics import blocked_sum_terms
    return blocked_sum_terms(head_dim) + 4


def score_rounding_bound(qg: torch.Tensor, k: torch.Tensor, s: torch.Tensor, scale: float,
                         sinks: Optional[torch.Tensor] = None, softcap: Optional[float] = None) -> torch.Tensor:
    """The LSE's sensitivity to fp32 score rounding on one request, [Hkv, G] float64: d lse / d s_p
    = P_p, so |d lse| <= sum_p P_p gamma u scale sum_i |q_i k_pi|, times the soft-cap's slope
    1 - tanh^2 (near 0 for scores far past the cap) where there is one. Kernels compute it from an exponential, (1 - e) / (1 + e) with e = exp(-2|x|)
    (no overflow for s/cap >> 88): accurate to a few u absolute (the exponential, the
    subtraction, the division, the product with cap), so 4 u cap more. qg [Hkv, G, Dk], k
    [n, Hkv, Dk] as the scores saw them, s their scores [Hkv, G, n]."""
    # A bound needs no precision of its own: fp32 throughout (a few % at most).
    mass = torch.matmul(qg.abs().float(), k.abs().float().permute(1, 2, 0)) * abs(scale)
    logits = s.float() if sinks is None else torch.cat([s.float(), sinks.float()], dim=-1)
    p = torch.softmax(logits, dim=-1)[..., :s.shape[-1]]
    u = torch.finfo(torch.float32).eps / 2
    capped = 0.0
    if softcap:
        mass = mass * (1 - (s.float() / softcap) ** 2).clamp_min(0)  # d cap tanh(x / cap) / dx = 1 - tanh^2
        capped = 4 * u * abs(softcap)
    return dot_rounding_terms(qg.shape[-1]) * u * (p * mass).sum(-1).double() + capped


def _lse_in_fp32(case: Case, batch: DecodeBatch) -> torch.Tensor:
    """The LSE of the query-dtype tier the way its kernels compute it: q and K in the query
    dtype (K dequantized to it, as `_in_query_dtype` does), scores, exponentials, their sum and
    the log in fp32 (MMAs accumulate in fp32 and every kernel keeps its softmax statistics
    there). Its error against the float64 LSE is what fp32 arithmetic costs on that row. Also
    returns `score_rounding_bound` per row."""
    dt = case.q_dtype
    Hkv, G, Dk = case.num_kv_heads, case.group, case.head_dim
    k_scale, _ = case.scales
    k_slots = batch.k_slots()
    indptr = batch.kv_indptr.tolist()
    lse = torch.full((case.batch, case.num_q_heads), float("-inf"), dtype=torch.float64, device=batch.device)
    slack = torch.zeros((case.batch, case.num_q_heads), dtype=torch.float64, device=batch.device)
    sinks = batch.sinks.float().view(Hkv, G, 1) if batch.sinks is not None else None
    for b in range(case.batch):
        slots = _request_slots(case, batch, b, indptr)
        if slots.numel() == 0:
            if sinks is not None:
                lse[b] = sinks.double().reshape(-1)
            continue
        k = (k_slots[slots].to(dt) * k_scale).to(dt).float()
        qg = batch.q[b].float().view(Hkv, G, Dk)
        s = torch.matmul(qg, k.permute(1, 2, 0)) * case.sm_scale  # [Hkv, G, n] fp32
        if case.softcap is not None:
            s = case.softcap * torch.tanh(s / case.softcap)
        slack[b] = score_rounding_bound(qg, k, s, case.sm_scale, sinks, case.softcap).reshape(-1)
        if sinks is not None:
            s = torch.cat([s, sinks], dim=-1)
        lse[b] = torch.logsumexp(s, dim=-1).double().reshape(-1)
    return lse, slack


def _in_query_dtype(case: Case, batch: DecodeBatch) -> torch.Tensor:
    dt = case.q_dtype
    Hkv, G, Dk, Dv = case.num_kv_heads, case.group, case.head_dim, case.v_head_dim
    k_scale, v_scale = case.scales
    k_slots, v_slots = batch.k_slots(), batch.v_slots()
    indptr = batch.kv_indptr.tolist()
    out = torch.zeros((case.batch, case.num_q_heads, Dv), dtype=dt, device=batch.device)
    for b in range(case.batch):
        slots = _request_slots(case, batch, b, indptr)
        if slots.numel() == 0:
            continue
        k = (k_slots[slots].to(dt) * k_scale).to(dt)
        v = (v_slots[slots].to(dt) * v_scale).to(dt)
        qg = batch.q[b].view(Hkv, G, Dk)
        s = torch.matmul(qg, k.permute(1, 2, 0)) * case.sm_scale  # [Hkv, G, n] in dt
        if case.softcap is not None:
            s = case.softcap * torch.tanh(s / case.softcap)
        if batch.sinks is not None:
            s = torch.cat([s, batch.sinks.to(dt).view(Hkv, G, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)
        if batch.sinks is not None:
            p = p[..., :-1]
        out[b] = torch.matmul(p, v.permute(1, 0, 2)).view(case.num_q_heads, Dv)
    return out


def _fp8_q_and_p(case: Case, batch: DecodeBatch) -> TierResult:
    fp8 = case.cache_dtype
    Hkv, G, Dk, Dv = case.num_kv_heads, case.group, case.head_dim, case.v_head_dim
    k_scale, v_scale = case.scales
    k_slots, v_slots = batch.k_slots(), batch.v_slots()
    indptr = batch.kv_indptr.tolist()
    dev = batch.device
    grids = [2.0 ** (j / 4) for j in range(4)]
    outs = [torch.zeros((case.batch, case.num_q_heads, Dv), dtype=case.q_dtype, device=dev) for _ in grids]
    lse = torch.full((case.batch, case.num_q_heads), float("-inf"), dtype=torch.float64, device=dev)
    slack = torch.zeros((case.batch, case.num_q_heads), dtype=torch.float64, device=dev)
    sinks = batch.sinks.float().view(Hkv, G) if batch.sinks is not None else None
    for b in range(case.batch):
        slots = _request_slots(case, batch, b, indptr)
        q8 = saturating_cast(batch.q[b], fp8).float().view(Hkv, G, Dk)
        if slots.numel() == 0:
            if sinks is not None:
                lse[b] = sinks.double().reshape(-1)
            continue
        k = k_slots[slots].float()  # stored fp8 values, exactly
        v = v_slots[slots].float()
        s = torch.einsum("hgd,nhd->hgn", q8, k) * (case.sm_scale * k_scale)
        if case.softcap is not None:
            s = case.softcap * torch.tanh(s / case.softcap)
        slack[b] = score_rounding_bound(q8, k, s, case.sm_scale * k_scale,
                                        sinks[..., None] if sinks is not None else None, case.softcap).reshape(-1)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        z = p.sum(-1, keepdim=True)
        if sinks is not None:
            z = z + torch.exp(sinks[..., None] - m)
        for out, scale in zip(outs, grids):
            p8 = (p * scale).to(fp8).float() / scale  # P <= 1 (x 2^0.75): in range for both fp8 types
            o = torch.einsum("hgn,nhd->hgd", p8, v) * v_scale / z
            out[b] = o.reshape(case.num_q_heads, Dv).to(case.q_dtype)
        s64 = torch.einsum("hgd,nhd->hgn", q8.double(), k.double()) * (case.sm_scale * k_scale)
        if case.softcap is not None:
            s64 = case.softcap * torch.tanh(s64 / case.softcap)
        if sinks is not None:
            s64 = torch.cat([s64, sinks.double()[..., None]], dim=-1)
        lse[b] = torch.logsumexp(s64, dim=-1).reshape(-1)
    return TierResult(out=outs[0], lse=lse, more=tuple(outs[1:]), lse_slack=slack)

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

# How a kernel sums the softmax denominator Z (Capabilities.softmax_sum): the LSE's tier.
SUM_FP32 = "fp32"  # Z sums the unrounded P in fp32
# Z sums P as rounded for the P @ V product: to the query dtype (fp8 under FP8_Q_AND_P), e.g.
# flashinfer's fa2 kernel, whose row sum is an MMA over the cast P.
SUM_ROUNDED_P = "rounded-p"
SOFTMAX_SUMS = (SUM_FP32, SUM_ROUNDED_P)

# A kernel rounds P against the running max of a tile, not the row's: P is scaled by
# exp(m_row - m_tile) >= 1 first, which moves it on the grid. Scaling by 2^(j/4), j = 0..3 (the
# grid positions one factor of 2 spans), gives four equally valid realizations of that rounding.
P_GRIDS = tuple(2.0 ** (j / 4) for j in range(4))

# The rounded-P LSE takes more realizations than the output. A denominator summed from rounded
# terms is off by a sum of independent roundings, close to normal; the budget allows R = 3 x
# the largest of K realizations, and a kernel's own draw (its tiles' maxima put its P on a grid
# of its own) exceeds that with probability E[erf(|X| / (3 sqrt 2))^K]: 1.1e-2 per row at K = 4
# (one row of 256 in an H200 graph replay of flashinfer's tensor-core form went over, at
# 1.01x), 6.0e-9 at K = 64. Each realization is one rounding pass over P, no P @ V product.
SUM_GRIDS = tuple(2.0 ** (j / 64) for j in range(64))


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
    # Further realizations of the same arithmetic (other quantization grids for P, the other
    # way of rounding an MLA q); a row's yardstick is the largest error over all of them.
    more: tuple = ()
    more_lse: tuple = ()  # the same for the LSE

    @property
    def outs(self) -> tuple:
        return (self.out,) + tuple(self.more)

    @property
    def lses(self) -> tuple:
        return ((self.lse,) if self.lse is not None else ()) + tuple(self.more_lse)


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


def tier_attention(case: Case, batch: DecodeBatch, fp8_math: str = DEQUANT_KV,
                   softmax_sum: str = SUM_FP32) -> TierResult:
    """The attention a kernel of tier (`fp8_math`, `softmax_sum`) computes, done by plain torch.

    Non-fp8 caches, and fp8 caches under DEQUANT_KV: bf16/fp16 matmuls and softmax in the
    query dtype on the dequantized cache (the way FlashAttention's tests build their
    low-precision reference); on a row whose scores leave the query dtype's range (fp16
    low-scores), scores and softmax in fp32 as a kernel's accumulator holds them, P still
    rounded to the query dtype. FP8_Q_AND_P: q saturated to the cache's fp8 type, scores from
    fp8 x fp8 products accumulated in fp32, P = exp(s - row max) quantized to the fp8 type
    once per row for the P @ V product, the denominator summed from the unquantized P (as
    split-K kernels with fp8 MMAs do); its LSE carries q's quantization, so it is returned
    too. P is quantized on each of the P_GRIDS, and the budget takes the largest error among
    them (one realization alone can land near zero on a short row, where a kernel's equally
    legitimate rounding does not). On an MLA case q may be rounded over every dim or over
    the no-rope ones only (the rope dims meeting K's in a product of their own at q's
    precision, as sglang's Triton MLA decode does): both are realizations too.

    softmax_sum SUM_ROUNDED_P: the LSE's denominator sums P as rounded for P @ V, on each of
    the SUM_GRIDS (the outputs are unchanged: numerator and denominator share the rounding)."""
    if fp8_math not in FP8_MATH:
        raise ValueError(f"fp8_math: expected one of {FP8_MATH}, got {fp8_math!r}")
    if softmax_sum not in SOFTMAX_SUMS:
        raise ValueError(f"softmax_sum: expected one of {SOFTMAX_SUMS}, got {softmax_sum!r}")
    rounded = softmax_sum == SUM_ROUNDED_P
    if fp8_math == FP8_Q_AND_P and case.is_fp8:
        return _fp8_q_and_p(case, batch, rounded)
    lses, slack = _lse_in_fp32(case, batch, rounded)
    return TierResult(out=_in_query_dtype(case, batch), lse=lses[0], more_lse=tuple(lses[1:]), lse_slack=slack)


def _rounded_sum_shifts(p: torch.Tensor, extra: Optional[torch.Tensor], dtype: torch.dtype) -> list:
    """log(Z_j / Z) per row for Z_j the denominator summed from P rounded to `dtype` on grid j
    (SUM_GRIDS), Z from the unrounded P; `extra` the unrounded terms (a sink's) both add."""
    exact = p.double().sum(-1)
    if extra is not None:
        exact = exact + extra.double()
    shifts = []
    for g in SUM_GRIDS:
        z = ((p * g).to(dtype).double() / g).sum(-1)
        if extra is not None:
            z = z + extra.double()
        shifts.append(torch.log(z / exact))
    return shifts


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


def _lse_in_fp32(case: Case, batch: DecodeBatch, rounded: bool = False) -> tuple[list, torch.Tensor]:
    """The LSE of the query-dtype tier the way its kernels compute it: q and K in the query
    dtype (K dequantized to it, as `_in_query_dtype` does), scores, exponentials, their sum and
    the log in fp32 (MMAs accumulate in fp32 and every kernel keeps its softmax statistics
    there). Its error against the float64 LSE is what fp32 arithmetic costs on that row.
    Returns its realizations (one; with `rounded`, one per P grid with the denominator summed
    from P rounded to the query dtype) and `score_rounding_bound` per row."""
    dt = case.q_dtype
    Hkv, G, Dk = case.num_kv_heads, case.group, case.head_dim
    k_scale, _ = case.scales
    k_slots = batch.k_slots()
    indptr = batch.kv_indptr.tolist()
    count = len(SUM_GRIDS) if rounded else 1
    lses = [torch.full((case.batch, case.num_q_heads), float("-inf"), dtype=torch.float64, device=batch.device)
            for _ in range(count)]
    slack = torch.zeros((case.batch, case.num_q_heads), dtype=torch.float64, device=batch.device)
    sinks = batch.sinks.float().view(Hkv, G, 1) if batch.sinks is not None else None
    for b in range(case.batch):
        slots = _request_slots(case, batch, b, indptr)
        if slots.numel() == 0:
            if sinks is not None:
                for lse in lses:
                    lse[b] = sinks.double().reshape(-1)
            continue
        k = (k_slots[slots].to(dt) * k_scale).to(dt).float()
        qg = batch.q[b].float().view(Hkv, G, Dk)
        s = torch.matmul(qg, k.permute(1, 2, 0)) * case.sm_scale  # [Hkv, G, n] fp32
        if case.softcap is not None:
            s = case.softcap * torch.tanh(s / case.softcap)
        slack[b] = score_rounding_bound(qg, k, s, case.sm_scale, sinks, case.softcap).reshape(-1)
        full = torch.cat([s, sinks], dim=-1) if sinks is not None else s
        lse = torch.logsumexp(full, dim=-1).double()
        lses[0][b] = lse.reshape(-1)
        if rounded:
            m = full.amax(-1, keepdim=True)
            extra = torch.exp(sinks - m)[..., 0] if sinks is not None else None
            for out, shift in zip(lses, _rounded_sum_shifts(torch.exp(s - m), extra, dt)):
                out[b] = (lse + shift).reshape(-1)
    return lses, slack


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
        o = _plain_rows(case, batch, qg, k, v, dt)
        overflow = ~torch.isfinite(o).all(-1)  # [Hkv, G]
        if bool(overflow.any()):
            # Scores past the query dtype's range (fp16 tops out at 65504; the low-scores data
            # reach -5e5): plain torch returns NaN there, and a NaN yardstick would allow any
            # error. A kernel holds scores in its MMA's fp32 accumulator, so on those rows the
            # realization does too, with P rounded to the query dtype for P @ V as before.
            o = torch.where(overflow[..., None], _plain_rows(case, batch, qg, k, v, torch.float32), o)
        out[b] = o.view(case.num_q_heads, Dv)
    return out


def _plain_rows(case: Case, batch: DecodeBatch, qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                score_dtype: torch.dtype) -> torch.Tensor:
    """One request's [Hkv, G, Dv] output: scores and softmax in `score_dtype`, P @ V in the
    value dtype."""
    Hkv, G = qg.shape[:2]
    s = torch.matmul(qg.to(score_dtype), k.to(score_dtype).permute(1, 2, 0)) * case.sm_scale  # [Hkv, G, n]
    if case.softcap is not None:
        s = case.softcap * torch.tanh(s / case.softcap)
    if batch.sinks is not None:
        s = torch.cat([s, batch.sinks.to(score_dtype).view(Hkv, G, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    if batch.sinks is not None:
        p = p[..., :-1]
    return torch.matmul(p.to(v.dtype), v.permute(1, 0, 2))


def _q_forms(case: Case, q: torch.Tensor, fp8: torch.dtype) -> list:
    """The ways a kernel of the FP8_Q_AND_P tier may round q [Hq, Dk] (float32 values): every dim
    to fp8; on an MLA case also the no-rope dims only, the rope dims left at q's precision."""
    every = saturating_cast(q, fp8).float()
    if not case.mla:
        return [every]
    nope = case.head_dim - case.rope_dim
    return [every, torch.cat([every[:, :nope], q[:, nope:].float()], dim=-1)]


def _fp8_q_and_p(case: Case, batch: DecodeBatch, rounded: bool = False) -> TierResult:
    fp8 = case.cache_dtype
    Hkv, G, Dk, Dv = case.num_kv_heads, case.group, case.head_dim, case.v_head_dim
    k_scale, v_scale = case.scales
    k_slots, v_slots = batch.k_slots(), batch.v_slots()
    indptr = batch.kv_indptr.tolist()
    dev = batch.device
    forms = len(_q_forms(case, batch.q[0], fp8))
    shape = (case.batch, case.num_q_heads)
    outs = [torch.zeros(shape + (Dv,), dtype=case.q_dtype, device=dev) for _ in range(forms * len(P_GRIDS))]
    lses = [torch.full(shape, float("-inf"), dtype=torch.float64, device=dev)
            for _ in range(forms * (len(SUM_GRIDS) if rounded else 1))]
    slack = torch.zeros(shape, dtype=torch.float64, device=dev)
    sinks = batch.sinks.float().view(Hkv, G) if batch.sinks is not None else None
    scale = case.sm_scale * k_scale
    for b in range(case.batch):
        slots = _request_slots(case, batch, b, indptr)
        if slots.numel() == 0:
            if sinks is not None:
                for lse in lses:
                    lse[b] = sinks.double().reshape(-1)
            continue
        k = k_slots[slots].float()  # stored fp8 values, exactly
        v = v_slots[slots].float()
        out_at, lse_at = iter(outs), iter(lses)
        for q in _q_forms(case, batch.q[b], fp8):
            qg = q.view(Hkv, G, Dk)
            s = torch.einsum("hgd,nhd->hgn", qg, k) * scale
            if case.softcap is not None:
                s = case.softcap * torch.tanh(s / case.softcap)
            slack[b] = torch.maximum(slack[b], score_rounding_bound(
                qg, k, s, scale, sinks[..., None] if sinks is not None else None, case.softcap).reshape(-1))
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            z = p.sum(-1, keepdim=True)
            extra = torch.exp(sinks - m[..., 0]) if sinks is not None else None
            if extra is not None:
                z = z + extra[..., None]
            for g in P_GRIDS:
                p8 = (p * g).to(fp8).float() / g  # P <= 1 (x 2^0.75): in range for both fp8 types
                o = torch.einsum("hgn,nhd->hgd", p8, v) * v_scale / z
                next(out_at)[b] = o.reshape(case.num_q_heads, Dv).to(case.q_dtype)
            s64 = torch.einsum("hgd,nhd->hgn", qg.double(), k.double()) * scale
            if case.softcap is not None:
                s64 = case.softcap * torch.tanh(s64 / case.softcap)
            if sinks is not None:
                s64 = torch.cat([s64, sinks.double()[..., None]], dim=-1)
            lse = torch.logsumexp(s64, dim=-1)
            for shift in (_rounded_sum_shifts(p, extra, fp8) if rounded else [0.0]):
                next(lse_at)[b] = (lse + shift).reshape(-1)
    return TierResult(out=outs[0], lse=lses[0], more=tuple(outs[1:]), more_lse=tuple(lses[1:]), lse_slack=slack)

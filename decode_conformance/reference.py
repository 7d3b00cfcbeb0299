"""High-precision decode attention, the ground truth every kernel is judged against.

Computed on exactly the values the kernel sees: fp8 caches are dequantized from their
stored bytes (design principle 3), so a tolerance measures kernel error and not
quantization error. Keys are processed in chunks with an online softmax in float64, so
batch 32 x 128k fits on one GPU.

Semantics, for request b with length L and query head h (KV head h // group):
  visible keys p in [max(0, L - W), L), W = keys under the window counting the current one
  s_p = (q . k_p) * k_scale * sm_scale;  s_p = cap * tanh(s_p / cap) if soft-capped
  out = sum_p exp(s_p) v_p v_scale / Z,  Z = sum_p exp(s_p) (+ exp(sink_h) with sinks)
  lse = ln Z.  A row with no visible key outputs zeros (lse -inf, or sink_h with sinks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import DecodeBatch

CHUNK_KEYS = 16384


@dataclass
class Reference:
    out: torch.Tensor  # [B, Hq, Dv] float64
    lse: torch.Tensor  # [B, Hq] float64 (natural log)
    visible: torch.Tensor  # [B] int64: keys each request attends to


def visible_range(length: int, visible_keys) -> tuple[int, int]:
    start = 0 if visible_keys is None else max(0, length - visible_keys)
    return start, length


def _request_slots(batch: DecodeBatch, b: int) -> torch.Tensor:
    lo = int(batch.kv_indptr[b])
    L = int(batch.seq_lens[b])
    start, end = visible_range(L, batch.case.visible_keys)
    return batch.kv_indices[lo + start: lo + end].long()


def _scores(case, qg: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """qg [Hkv, G, Dk], k [n, Hkv, Dk] -> scaled, capped scores [Hkv, G, n]."""
    s = torch.einsum("hgd,nhd->hgn", qg, k) * case.sm_scale
    if case.softcap is not None:
        s = case.softcap * torch.tanh(s / case.softcap)
    return s


def reference(batch: DecodeBatch, dtype: torch.dtype = torch.float64) -> Reference:
    case = batch.case
    B, Hq, Hkv, G, Dk, Dv = case.batch, case.num_q_heads, case.num_kv_heads, case.group, case.head_dim, case.v_head_dim
    k_scale, v_scale = case.scales
    dev = batch.device
    k_slots, v_slots = batch.k_slots(), batch.v_slots()
    out = torch.zeros((B, Hq, Dv), dtype=dtype, device=dev)
    lse = torch.full((B, Hq), float("-inf"), dtype=dtype, device=dev)
    visible = torch.zeros(B, dtype=torch.int64)
    sinks = batch.sinks.to(dtype).view(Hkv, G) if batch.sinks is not None else None
    for b in range(B):
        slots = _request_slots(batch, b)
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
    return Reference(out=out, lse=lse, visible=visible)


def low_precision_attention(batch: DecodeBatch) -> torch.Tensor:
    """The same attention done by plain torch in the case's own dtype (bf16/fp16 matmuls and
    softmax): the error budget. A kernel is held to a multiple of this error, the way
    FlashAttention's tests hold theirs to 2-3x a reordered fp16 reference."""
    case = batch.case
    dt = case.q_dtype
    Hkv, G, Dk, Dv = case.num_kv_heads, case.group, case.head_dim, case.v_head_dim
    k_scale, v_scale = case.scales
    k_slots, v_slots = batch.k_slots(), batch.v_slots()
    out = torch.zeros_like(batch.out, dtype=dt)
    for b in range(case.batch):
        slots = _request_slots(batch, b)
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

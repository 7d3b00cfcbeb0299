"""The toy team's tensor-core decode: the softmax arithmetic of flashinfer's fa2 prefill kernel,
the one its tensor-core decode and its fa2 MLA wrapper run (0.7.2.post1,
include/flashinfer/attention/prefill.cuh, `compute_sfm_v`; mla.cuh the same). In torch, against
decode-conformance's public contract only.

The probabilities P = exp(s - max) are cast to the query dtype once (`vec_cast<DTypeQ, float>`)
and both the P @ V product and the softmax denominator use the cast values: the denominator is
a row sum taken by an MMA over them (`mma::m16k16_rowsum_f16f16f32`). So the output stays
consistent - numerator and denominator share each rounding - while the LSE, max + log(sum),
carries the rounding of every term. Keys are processed in TILE-key tiles against a running max,
as the kernel does.

`RowSumOfRounded` is that kernel. `RowSumInFp32` is the same with the denominator summed from
the unrounded P, as the CUDA-core decode does. suites/selftest/test_foreign_arithmetic.py
judges both.
"""
from __future__ import annotations

import dataclasses

import torch

from . import CAPS as _TOY_CAPS

TILE = 64
CAPS = dataclasses.replace(_TOY_CAPS, mla=False, sinks=False, softcap=False, cuda_graph_safe=False)


def decode(batch, round_sum: bool) -> None:
    B, Hq, Dk = batch.q.shape
    Hkv, Dv, G = batch.num_kv_heads, batch.v_head_dim, batch.group
    qdt = batch.q.dtype
    k_all, v_all = batch.k_slots(), batch.v_slots()
    indptr = batch.kv_indptr.tolist()
    out = torch.zeros((B, Hkv, G, Dv))
    lse = torch.full((B, Hkv, G), float("-inf"))
    for b in range(B):
        L = indptr[b + 1] - indptr[b]
        start = max(0, L - batch.window) if batch.window is not None else 0
        slots = batch.kv_indices[indptr[b] + start:indptr[b + 1]].long()
        if slots.numel() == 0:
            continue
        q = batch.q[b].float().view(Hkv, G, Dk)
        k = k_all[slots].float() * batch.k_scale
        v = v_all[slots].float() * batch.v_scale
        m = torch.full((Hkv, G), float("-inf"))
        d = torch.zeros((Hkv, G))
        acc = torch.zeros((Hkv, G, Dv))
        for t0 in range(0, slots.numel(), TILE):
            s = torch.einsum("hgd,nhd->hgn", q, k[t0:t0 + TILE]) * batch.sm_scale
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp(m - m_new).nan_to_num(0.0)
            p = torch.exp(s - m_new[..., None])
            p_q = p.to(qdt).float()  # the cast both the MMA row sum and P @ V read
            d = d * alpha + (p_q if round_sum else p).sum(-1)
            acc = acc * alpha[..., None] + torch.einsum("hgn,nhd->hgd", p_q, v[t0:t0 + TILE])
            m = m_new
        out[b] = acc / d[..., None]
        lse[b] = m + torch.log(d)
    batch.out.copy_(out.reshape(B, Hq, Dv).to(batch.out.dtype))
    batch.lse.copy_(lse.reshape(B, Hq))


class RowSumOfRounded:
    """flashinfer fa2's arithmetic: the denominator summed from P cast to the query dtype."""
    name = "toy_rowsum_of_rounded_p"
    caps = CAPS
    round_sum = True

    def plan(self, batch):
        return lambda: decode(batch, self.round_sum)


class RowSumInFp32(RowSumOfRounded):
    """The denominator from the unrounded P (P @ V still reads the cast values)."""
    name = "toy_rowsum_in_fp32"
    round_sum = False

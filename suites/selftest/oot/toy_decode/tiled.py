"""The toy team's second kernel: split-K decode the way GPU kernels do it, in torch. Each
request's visible keys are cut into SPLITS splits of TILE-key tiles; a split runs an online
softmax over its tiles (running max, rescale when it moves, float32), stage 2 merges the
splits' (max, sum, unnormalized output) partials against their largest max. Written against decode-conformance's
public contract only, like `toy_decode.ToyDecode`.

`TiledDecode` is correct. The other classes are the same kernel with one realistic numerics
bug, each invisible to inputs whose scores stay within a few nats of each other, as the
self-tests show (suites/selftest/test_distributions.py):

  NoMaxSubtract    exp(s) with no running max at all: fine while raw scores stay below ~88,
                   the float32 exp limit; inf / inf = NaN above it (large raw scores without a
                   soft-cap), 0 / 0 far below it
  FirstTileMax     a fixed max taken from the request's first tile and never moved (a preset
                   "unified max" without the overflow fallback): exact while later scores stay
                   within 88 nats of the first tile's, inf once a late key jumps far above it
  Fp16TileSum      each tile's P @ V product summed in fp16 (an MMA with a half-precision
                   accumulator) before the float32 running sum: fine for |V| of a few units,
                   inf once a tile's weighted V sum passes 65504

Two more are not bugs but the softmax arithmetic of flashinfer's fa2 kernel, the one its
tensor-core decode and its fa2 MLA wrapper run (0.7.2.post1, include/flashinfer/attention/
prefill.cuh, `compute_sfm_v`; mla.cuh the same): each tile's P is cast to the query dtype once
(`vec_cast<DTypeQ, float>`), and P @ V reads the cast values.

  RowSumOfRounded  the denominator too is a row sum of the cast values, taken by an MMA
                   (`mma::m16k16_rowsum_f16f16f32`): the output stays consistent, numerator and
                   denominator sharing each rounding, while the LSE carries every term's;
                   declared as the LSE tier "rounded-p"
  RowSumInFp32     the denominator summed from the unrounded P, as the CUDA-core decode does

  FmaRescale       the exponents as that kernel forms them (prefill.cuh, `update_mdo_states`):
                   scores kept raw, m_scaled = fl(m * c) with c = sm_scale * log2 e, then
                   p = exp2(s * c - m_scaled) and the tile's rescale exp2(m_prev * c - m_scaled),
                   each compiled to one fused multiply-add: an unrounded s * c minus a rounded
                   m * c. Where a key's score equals the running max the exponent is the
                   product's rounding residual r, not 0 (|r| <= ulp(|s c|) / 2: 1/32 at
                   |s c| ~ 7e5), and every tile rescales the accumulator by 2^r although the max
                   did not move: tile t of N ends up weighted 2^(r (N - t)) against the last.
                   One split per request, 128-key tiles (the graph form, split-KV off).

suites/selftest/test_foreign_arithmetic.py judges those.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from decode_conformance.reference import SUM_ROUNDED_P

from . import CAPS

TILE = 64
SPLITS = 4
F32_MAX = torch.finfo(torch.float32).max


def _scores(batch, q, k):
    """q [Hkv, G, Dk], k [n, Hkv, Dk] -> float32 scores [Hkv, G, n]."""
    s = torch.einsum("hgd,nhd->hgn", q, k) * batch.sm_scale
    if batch.softcap:
        s = batch.softcap * torch.tanh(s / batch.softcap)
    return s


def _split(batch, q, k, v, bug, m_fixed):
    """One split's (unnormalized acc [Hkv, G, Dv], sum [Hkv, G], max [Hkv, G])."""
    Hkv, G = q.shape[0], q.shape[1]
    m = torch.full((Hkv, G), float("-inf"))
    z = torch.zeros((Hkv, G))
    acc = torch.zeros((Hkv, G, v.shape[-1]))
    for t0 in range(0, k.shape[0], TILE):
        s = _scores(batch, q, k[t0:t0 + TILE])
        vt = v[t0:t0 + TILE]
        if bug == "no_max":
            m_new = torch.zeros_like(m)
        elif bug == "first_tile_max":
            m_new = m_fixed
        else:
            m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new).nan_to_num(0.0)  # the first tile: exp(-inf - finite) = 0
        p = torch.exp(s - m_new[..., None])
        p_pv = p.to(batch.q.dtype).float() if bug in ("rowsum_of_rounded_p", "rowsum_in_fp32") else p
        pv = torch.einsum("hgn,nhd->hgd", p_pv, vt)
        if bug == "fp16_tile_sum":
            pv = pv.half().float()
        z = z * alpha + (p_pv if bug == "rowsum_of_rounded_p" else p).sum(-1)
        acc = acc * alpha[..., None] + pv
        m = m_new
    return acc, z, m


def _fma_rescale_split(batch, q, k, v, tile=128):
    """flashinfer fa2's online softmax with fused multiply-adds in the exponents (FmaRescale):
    scores of the stored K, its scale folded into c as flashinfer folds it into sm_scale. A
    fused a * b - c is emulated in float64 (a float32 product is exact there), rounded once."""
    c = torch.tensor(batch.sm_scale * batch.k_scale * math.log2(math.e), dtype=torch.float32).double()
    Hkv, G = q.shape[0], q.shape[1]
    m = torch.full((Hkv, G), float("-inf"), dtype=torch.float64)
    z = torch.zeros((Hkv, G))
    acc = torch.zeros((Hkv, G, v.shape[-1]))

    def fma_exp2(a, m_scaled):
        return torch.exp2((a * c - m_scaled).float())

    for t0 in range(0, k.shape[0], tile):
        s = torch.einsum("hgd,nhd->hgn", q, k[t0:t0 + tile]).double()  # fp32-exact here: raw scores
        m_new = torch.maximum(m, s.amax(-1))
        m_scaled = (m_new * c).float().double()  # the rounded product
        alpha = torch.where(torch.isfinite(m), fma_exp2(m, m_scaled), torch.zeros_like(z))
        p = fma_exp2(s, m_scaled[..., None])
        z = z * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.einsum("hgn,nhd->hgd", p, v[t0:t0 + tile])
        m = m_new
    return acc, z, (m * batch.sm_scale * batch.k_scale).float()  # the max in natural-log units


def decode(batch, bug=None):
    B, Hq, Dk = batch.q.shape
    Hkv, Dv, G = batch.num_kv_heads, batch.v_head_dim, batch.group
    k_all, v_all = batch.k_slots(), batch.v_slots()
    indptr = batch.kv_indptr.tolist()
    out = torch.zeros((B, Hkv, G, Dv))
    lse = torch.full((B, Hkv, G), float("-inf"))
    for b in range(B):
        L = indptr[b + 1] - indptr[b]
        start = max(0, L - batch.window) if batch.window is not None else 0
        slots = batch.kv_indices[indptr[b] + start:indptr[b + 1]].long()
        q = batch.q[b].float().view(Hkv, G, Dk)
        k = k_all[slots].float() * batch.k_scale
        v = v_all[slots].float() * batch.v_scale
        n = slots.numel()
        m_fixed = _scores(batch, q, k[:TILE]).amax(-1) if n else None
        per = -(-n // SPLITS) if n else 0
        if bug == "fma_rescale":  # one split (the graph form plans no split-KV)
            parts = [_fma_rescale_split(batch, q, k_all[slots].float(), v)] if n else []
        else:
            parts = [_split(batch, q, k[i:i + per], v[i:i + per], bug, m_fixed) for i in range(0, n, per or 1)]
        if batch.sinks is not None:  # the sink joins the merge as a partial with no V
            sink = batch.sinks.float().view(Hkv, G)
            parts.append((torch.zeros((Hkv, G, Dv)), torch.ones((Hkv, G)), sink))
        if not parts:
            continue
        # Merged on (max, sum) pairs, not on LSEs: at scores near -5e5 an fp32 LSE has lost
        # the sum's low bits (its ulp there is 0.03).
        ms = torch.stack([m for _, _, m in parts])
        top = ms.amax(0)
        top = torch.where(torch.isfinite(top), top, 0.0)
        w = torch.exp(ms - top)
        z_all = sum(wi * zi for wi, (_, zi, _) in zip(w, parts))
        acc = sum(wi[..., None] * a for wi, (a, _, _) in zip(w, parts))
        out[b] = torch.where((z_all > 0)[..., None], acc / z_all.clamp_min(1e-30)[..., None], 0.0)
        lse[b] = torch.where(z_all > 0, top + torch.log(z_all), float("-inf"))
    batch.out.copy_(out.reshape(B, Hq, Dv).to(batch.out.dtype))
    batch.lse.copy_(lse.reshape(B, Hq))


class TiledDecode:
    """Correct."""
    name = "toy_tiled"
    caps = CAPS
    bug = None

    def plan(self, batch):
        return lambda: decode(batch, self.bug)


class NoMaxSubtract(TiledDecode):
    name = "toy_tiled_no_max"
    bug = "no_max"


class FirstTileMax(TiledDecode):
    name = "toy_tiled_first_tile_max"
    bug = "first_tile_max"


class Fp16TileSum(TiledDecode):
    name = "toy_tiled_fp16_tile_sum"
    bug = "fp16_tile_sum"


class RowSumOfRounded(TiledDecode):
    """flashinfer fa2's arithmetic: the denominator summed from P cast to the query dtype, and
    declared so (softmax_sum "rounded-p", as the flashinfer fa2 adapters do)."""
    name = "toy_tiled_rowsum_of_rounded_p"
    caps = dataclasses.replace(CAPS, softmax_sum=SUM_ROUNDED_P)
    bug = "rowsum_of_rounded_p"


class RowSumInFp32(TiledDecode):
    """The same with the denominator from the unrounded P (P @ V still reads the cast values)."""
    name = "toy_tiled_rowsum_in_fp32"
    bug = "rowsum_in_fp32"


class FmaRescale(TiledDecode):
    """flashinfer fa2's exponents, each one fused multiply-add of an unrounded s * c and a
    rounded m * c (no soft-cap: the emulation leaves the logits transform out)."""
    name = "toy_tiled_fma_rescale"
    caps = dataclasses.replace(CAPS, softmax_sum=SUM_ROUNDED_P)
    bug = "fma_rescale"

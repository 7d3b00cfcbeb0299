"""The toy team's fp8 MLA decode: the arithmetic of sglang's Triton MLA decode (0.5.23,
decode_attention.py, `_fwd_grouped_kernel_stage1` and stage 2), written in torch from that
source and against decode-conformance's public contract only. It declares the `fp8-q-and-p`
tier, as the sglang adapter does.

  - q's no-rope dims (the first 512 of 576, 256 of 288) are rounded to the cache's fp8 type
    and meet K's in an fp8 x fp8 product; the rope dims stay at q's precision
    (`qk += dot(qpe, kpe.to(qpe.dtype))`);
  - SPLITS splits of whole 32-key blocks, each an online softmax over 32-key tiles: the tile's
    P = exp(s - running max) is rounded to fp8 for P @ V, the denominator sums the unrounded
    P, in float32;
  - stage 2 merges the splits' (output, LSE) pairs and applies v_scale.

`RopeAtQ` is that kernel. `AllDims` is the same kernel with every dim of q rounded to fp8, the
form the tier's torch computation takes. Both are correct computations of the declared tier;
suites/selftest/test_foreign_arithmetic.py judges them.
"""
from __future__ import annotations

import math

import torch

from decode_conformance import Capabilities
from decode_conformance.kernel_api import FP8_Q_AND_P

TILE = 32
SPLITS = 8
ROPE = {576: 64, 288: 32}

CAPS = Capabilities(kv_dtypes=frozenset({"e4m3", "e5m2"}), head_dims=frozenset(ROPE), mla=True,
                    fp8_math=FP8_Q_AND_P, lse=False, window_convention="counts-current",
                    deterministic=True)


def _fp8(x: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """Round to fp8 with saturation (Triton's cast on sm_90 saturates to the finite range)."""
    big = torch.finfo(fp8).max
    return x.float().clamp(-big, big).to(fp8).float()


def _split(s: torch.Tensor, v: torch.Tensor, fp8: torch.dtype):
    """One split of scores s [H, n] and V [n, Dv]: (output [H, Dv], lse [H]), tile by tile."""
    H, n = s.shape
    t = -(-n // TILE)
    pad = t * TILE - n
    sp = torch.nn.functional.pad(s, (0, pad), value=float("-inf")).view(H, t, TILE)
    vp = torch.nn.functional.pad(v, (0, 0, 0, pad)).view(t, TILE, -1)
    running = sp.amax(-1).cummax(-1).values  # [H, t]: the running max after each tile
    p = torch.exp(sp - running[..., None])  # each tile against the max known when it ran
    last = running[:, -1:]
    carry = torch.exp(running - last)  # what the later rescales multiply each tile's terms by
    pv = torch.einsum("htk,tkd->htd", _fp8(p, fp8), vp)
    acc = (carry[..., None] * pv).sum(1)
    e_sum = (carry * p.sum(-1)).sum(1)
    return acc / e_sum[:, None], last[:, 0] + torch.log(e_sum)


def decode(batch, round_rope: bool) -> None:
    B, Hq, Dk = batch.q.shape
    Dv, fp8 = batch.v_head_dim, batch.kv_dtype
    dm = Dk - ROPE[Dk]
    k_all, v_all = batch.k_slots(), batch.v_slots()
    indptr = batch.kv_indptr.tolist()
    out = torch.zeros((B, Hq, Dv))
    for b in range(B):
        L = indptr[b + 1] - indptr[b]
        start = max(0, L - batch.window) if batch.window is not None else 0
        slots = batch.kv_indices[indptr[b] + start:indptr[b + 1]].long()
        n = slots.numel()
        if n == 0:
            continue
        k = k_all[slots].float()[:, 0]  # one KV head (MLA): stored fp8 values, exact in float32
        v = v_all[slots].float()[:, 0, :Dv]
        q = batch.q[b]
        qpe = _fp8(q[:, dm:], fp8) if round_rope else q[:, dm:].float()
        s = (_fp8(q[:, :dm], fp8) @ k[:, :dm].T + qpe @ k[:, dm:].T) * (batch.sm_scale * batch.k_scale)
        per = math.ceil(math.ceil(n / SPLITS) / TILE) * TILE
        parts = [_split(s[:, i:i + per], v[i:i + per], fp8) for i in range(0, n, per)]
        lses = torch.stack([lse for _, lse in parts])  # stage 2: merge on the LSEs
        w = torch.softmax(lses, 0)
        out[b] = sum(wi[:, None] * o for wi, (o, _) in zip(w, parts)) * batch.v_scale
    batch.out.copy_(out.to(batch.out.dtype))


class RopeAtQ:
    """sglang's rounding of q: the no-rope dims to fp8, the rope dims at q's precision."""
    name = "toy_fp8_mla_rope_at_q"
    caps = CAPS
    round_rope = False

    def plan(self, batch):
        return lambda: decode(batch, self.round_rope)


class AllDims(RopeAtQ):
    """Every dim of q rounded to fp8: the form of the tier's torch computation."""
    name = "toy_fp8_mla_all_dims"
    round_rope = True


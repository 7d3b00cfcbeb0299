"""torch.nn.attention.flex_attention as a decode kernel under test (`torch_flex`): the
FlexAttention path a torch user writes for decode, compiled with torch.compile on a GPU (the
flex-decoding Triton kernel), eager on the CPU.

Translation from the suite's DecodeBatch (docs/kernel-contract.md):
  - the paged cache is read through a per-request token table built on the device from
    kv_indptr / kv_indices ([B, max_len] slot ids): K / V are gathered into [B, Hkv, max_len,
    D], positions past a request's length zeroed (never a poisoned slot: flex masks scores,
    not values, and 0 x NaN = NaN), fp8 upcast and scaled (fp8 math "dequant-kv").
  - a block mask over (request, key position): key p of request b is visible when
    p < L_b and p >= L_b - window ("counts-current"); create_block_mask skips the key blocks a
    request does not reach. q is [B, Hq, 1, D]; GQA through enable_gqa.
  - soft-cap: score_mod cap * tanh(score / cap) (flex's score is already scaled).
  - sinks: from flex's natural-log LSE: lse' = logaddexp(lse, sink), out' = out * exp(lse - lse'),
    the sink entering the denominator only.
  - empty requests: every key masked; flex writes 0 and an LSE of -inf.
  - head dims past 256 (MLA 576/512, 288/256): kernel_options BLOCK_N 32 (16 when more than 16
    query heads share a KV head), one stage, 4 warps (FlexKernelOptions). flex rounds the QK head
    dim up to a power of two (1024 for 576), and on an H200 (torch 2.11, 2026-12-01) none of
    Inductor's default configs for the template fit: "No valid triton configs ... Required:
    425984 Hardware limit: 232448" (bytes of shared memory). BLOCK_M is left to flex: its
    decoding template puts the query heads sharing a KV head on BLOCK_M rows and sets BLOCK_M to
    max(16, next power of two of that group) (torch/_inductor/kernel/flex/flex_decoding.py); a
    smaller BLOCK_M does not compile ("CompilationError", seen on the H200 for groups 32 and 128
    when this adapter forced 16).
Not graph-safe: the block mask and the token table are built at plan time from the lengths.
"""
from __future__ import annotations

import torch

from decode_conformance.kernel_api import Capabilities, ShapeRule


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    return flex_attention, create_block_mask


_COMPILED = {}
WIDE_HEAD_DIM = 256  # above this, the default configs exceed sm_90's 227 KiB of shared memory
WIDE_KERNEL_OPTIONS = {"BLOCK_N": 32, "num_stages": 1, "num_warps": 4}
WIDE_GROUP = 16  # more query heads per KV head than this: flex's BLOCK_M grows, so BLOCK_N halves


# Past head dim 512 flex pads QK to 1024 and holds BLOCK_M = next_pow2(group) query rows of it in
# shared memory: group 128 needs 294912 B against sm_90's 232448 ("No valid triton configs ...
# Required: 294912", H200, torch 2.11, 2026-12-01, h128g128 d576 with BLOCK_N 16, one stage: that
# is 2 B x (128 + 16) x 1024); group 64 by the same count needs 2 x (64 + 16) x 1024 = 163840 B.
WIDE_GROUP_RULE = ShapeRule("group", max=64, when=ShapeRule("head_dim", min=513),
                            why="flex's decode template keeps next_pow2(group) x 1024 query rows in shared memory: "
                                "group 128 at head dim 576 needs 294912 B of sm_90's 232448 (torch 2.11)")


def kernel_options(head_dim: int, group: int = 1):
    """flex_attention's kernel_options for this head dim and GQA group (None: Inductor's defaults)."""
    if head_dim <= WIDE_HEAD_DIM:
        return None
    options = dict(WIDE_KERNEL_OPTIONS)
    if group > WIDE_GROUP:
        options["BLOCK_N"] = 16
    return options


def _compiled(device_type: str):
    """flex_attention compiled once per device type (uncompiled it runs a reference math path)."""
    flex, _ = _flex()
    if device_type != "cuda":
        return flex
    if "cuda" not in _COMPILED:
        _COMPILED["cuda"] = torch.compile(flex, dynamic=False)
    return _COMPILED["cuda"]


class TorchFlexKernel:
    name = "torch_flex"
    caps = Capabilities(deterministic=True, window_convention="counts-current", softcap=True, sinks=True, lse=True, mla=True,
                        cuda_graph_safe=False, shape_rules=(WIDE_GROUP_RULE,))

    def __init__(self):
        self.library_version = torch.__version__

    def plan(self, batch):
        _, create_block_mask = _flex()
        dev, B = batch.device, batch.batch_size
        L = max(1, batch.max_seq_len)
        lens = batch.seq_lens.to(torch.int64)
        pos = torch.arange(L, device=dev)
        valid = pos[None, :] < lens[:, None]  # [B, L]
        n_idx = batch.kv_indices.numel()
        flat = (batch.kv_indptr[:-1, None].to(torch.int64) + pos[None, :]).clamp(max=max(0, n_idx - 1))
        slots = torch.where(valid, batch.kv_indices[flat].to(torch.int64) if n_idx else torch.zeros_like(flat),
                            torch.zeros_like(flat))
        window = batch.window
        lo = lens - window if window is not None else torch.zeros_like(lens)

        def visible(b, h, q_idx, kv_idx):
            return (kv_idx < lens[b]) & (kv_idx >= lo[b])

        block_mask = create_block_mask(visible, B, None, 1, L, device=dev)
        cap = float(batch.softcap or 0.0)
        score_mod = (lambda s, b, h, q_idx, kv_idx: cap * torch.tanh(s / cap)) if cap else None
        flex = _compiled(dev.type if isinstance(dev, torch.device) else torch.device(dev).type)
        dt = batch.q.dtype
        k_slots, v_slots = batch.k_slots(), batch.v_slots()
        keep = valid[:, :, None, None]
        options = kernel_options(batch.head_dim, batch.num_q_heads // batch.num_kv_heads)

        def gathered(pool, scale):
            x = pool[slots].to(dt) * scale  # [B, L, Hkv, D]
            return torch.where(keep, x, torch.zeros((), dtype=dt, device=dev)).transpose(1, 2)

        def launch():
            k, v = gathered(k_slots, batch.k_scale), gathered(v_slots, batch.v_scale)
            out, lse = flex(batch.q[:, :, None, :], k, v, score_mod=score_mod, block_mask=block_mask,
                            scale=batch.sm_scale, enable_gqa=batch.num_q_heads != batch.num_kv_heads,
                            return_lse=True, kernel_options=options)
            out, lse = out[:, :, 0].float(), lse[:, :, 0].float()
            if batch.sinks is not None:
                with_sink = torch.logaddexp(lse, batch.sinks.float()[None, :])
                out = out * torch.exp(lse - with_sink).nan_to_num(0.0)[..., None]
                lse = with_sink
            batch.out.copy_(out.to(batch.out.dtype))
            batch.lse.copy_(lse)
        return launch

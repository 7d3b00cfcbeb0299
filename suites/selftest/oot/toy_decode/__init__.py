"""A decode kernel from "another team": pure torch, written only against decode-conformance's
public contract (decode_conformance.Capabilities and the DecodeBatch fields), packaged on its
own. The suite's self-tests use it as a correct kernel that is not ours (and wrap it with
planted bugs the checks were not built around: suites/selftest/planted.py).

Every step runs on the device from the page table and the device-side lengths, on shapes
fixed at plan time, so one CUDA graph serves every length up to the planned capacity.
Math in float32 on the dequantized cache.
"""
from __future__ import annotations

import torch

from decode_conformance import Capabilities

def decode(batch, *, compute=torch.float32, out=None, lse=None, drop_last=False, bug=None):
    """Writes batch.out / batch.lse (or `out` / `lse`), computing in `compute`. drop_last: a
    planted off-by-one, the last key of every request is never read. bug: a planted mistake in
    how the kernel reads its inputs, right on packed inputs (the `_ReadsInputsWrong` classes)."""
    q, bt, v_cache = batch.q, batch.block_table, batch.v_cache
    B, Hq, Dk = q.shape
    Hkv, Dv, P = batch.num_kv_heads, batch.v_head_dim, batch.page_size
    if bug == "q_packed":  # rows of q assumed Hq x Dk apart
        q = torch.as_strided(q, q.shape, (Hq * Dk, Dk, 1))
    elif bug == "table_rows_from_lengths":  # a row of the page table assumed cdiv(max len, P) wide
        width = max(1, -(-max(batch.seq_lens_host, default=0) // P))
        bt = torch.as_strided(bt, (B, width), (width, 1))
    elif bug == "v_with_k_strides":  # V addressed with K's strides
        v_cache = torch.as_strided(v_cache, v_cache.shape, batch.k_cache.stride())
    bt = bt.long()
    G = Hq // Hkv
    n = bt.shape[1] * P
    k = batch.k_cache[bt].reshape(B, n, Hkv, Dk)
    v = v_cache[bt].reshape(B, n, Hkv, Dv)
    if bug in ("flat_head_tiles", "kv_heads_interleaved"):  # each query head reads the KV head given it
        kv_of = torch.tensor(flat_tile_kv_heads(Hq, G) if bug == "flat_head_tiles"
                             else [h % Hkv for h in range(Hq)], device=q.device)
        k, v, Hkv, G = k[:, :, kv_of], v[:, :, kv_of], Hq, 1
    pos = torch.arange(n, device=q.device)[None, :]
    length = batch.seq_lens.long()[:, None]
    start = (length - batch.window).clamp_min(0) if batch.window is not None else torch.zeros_like(length)
    valid = (pos >= start) & (pos < length - int(drop_last))  # [B, n]
    kf = torch.where(valid[..., None, None], k.to(compute), 0.0) * batch.k_scale
    vf = torch.where(valid[..., None, None], v.to(compute), 0.0) * batch.v_scale
    s = torch.einsum("bhgd,bnhd->bhgn", q.to(compute).view(B, Hkv, G, Dk), kf) * batch.sm_scale
    if batch.softcap:
        s = batch.softcap * torch.tanh(s / batch.softcap)
    s = torch.where(valid[:, None, None, :], s, float("-inf"))
    m = s.amax(-1, keepdim=True)
    if batch.sinks is not None and bug != "sink_without_max":  # that bug: the keys' max alone
        m = torch.maximum(m, batch.sinks.to(compute).view(1, Hkv, G, 1))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    z = p.sum(-1, keepdim=True)
    if batch.sinks is not None:
        z = z + torch.exp(batch.sinks.to(compute).view(1, Hkv, G, 1) - m)
    o = torch.einsum("bhgn,bnhd->bhgd", p, vf) / z.clamp_min(1e-30)
    o = torch.where(z > 0, o, 0.0).reshape(B, Hq, Dv)
    out = batch.out if out is None else out
    out.copy_(o.to(out.dtype))
    lse_val = torch.where(z > 0, m + torch.log(z), float("-inf")).reshape(B, Hq)
    (batch.lse if lse is None else lse).copy_(lse_val)


CAPS = Capabilities(window_convention="counts-current", cuda_graph_safe=True, deterministic=True,
                    batch_invariant=False)


class ToyDecode:
    """The correct kernel."""
    name = "toy_decode"
    caps = CAPS

    def plan(self, batch):
        return lambda: decode(batch)


class ScalesQInPlace:
    """Scales q by sm_scale in place, then applies sm_scale again: wrong, and the reference
    would agree with it if it were computed from the inputs after the launch."""
    name = "toy_inplace_q"
    caps = CAPS

    def plan(self, batch):
        def launch():
            batch.q.mul_(batch.sm_scale)
            decode(batch)
        return launch


class ZeroesItsInputs:
    """Zeroes q and the caches and writes zeros: 'correct' for the zeroed inputs."""
    name = "toy_zeroes_inputs"
    caps = CAPS

    def plan(self, batch):
        def launch():
            batch.q.zero_()
            batch.k_cache.zero_()
            batch.v_cache.zero_()
            decode(batch)
        return launch



def shape_scale(batch) -> float:
    """The softmax scale a model config implies from the shapes alone: 1/sqrt(head dim), or
    for an MLA cache DeepSeek's pre-absorption dim (128 nope + 64 rope; 2 x rope + rope)."""
    import math
    if batch.v_from_k:
        rope = batch.head_dim - batch.v_head_dim
        return 1.0 / math.sqrt((128 if rope == 64 else 2 * rope) + rope)
    return 1.0 / math.sqrt(batch.head_dim)


class IgnoresCallerScale:
    """Planted for the fuzz demo (docs/fuzz.md): re-derives the softmax scale from the shapes
    instead of taking batch.sm_scale. Right whenever the caller's scale is the shapes' default
    - every parity case - and wrong for Gemma-2 27B (1/sqrt(144) at head dim 128), Granite's
    attention multiplier or a YaRN-scaled MLA. Keeps its LSE."""
    name = "toy_ignores_caller_scale"
    caps = CAPS

    def plan(self, batch):
        import dataclasses
        own = dataclasses.replace(batch, sm_scale=shape_scale(batch))  # same tensors, its own scale
        return lambda: decode(own)


class DropsLastKey:
    """An off-by-one: the last (current) key of every request is never read."""
    name = "toy_drops_last_key"
    caps = CAPS

    def plan(self, batch):
        return lambda: decode(batch, drop_last=True)


class _ReadsInputsWrong:
    caps = CAPS
    bug = None

    def plan(self, batch):
        return lambda: decode(batch, bug=self.bug)


class AssumesPackedQ(_ReadsInputsWrong):
    """q's rows taken as Hq x Dk apart: right for a packed q, NaN from a fused qkv row's K part
    (sglang #7462, vllm-xpu-kernels #318)."""
    name = "toy_assumes_packed_q"
    bug = "q_packed"


class TableRowsFromLengths(_ReadsInputsWrong):
    """A page-table row taken as cdiv(longest request, page size) entries: right for a table
    sized to the batch, another request's pages from a capacity-wide one (vLLM's)."""
    name = "toy_table_rows_from_lengths"
    bug = "table_rows_from_lengths"


class VWithKStrides(_ReadsInputsWrong):
    """V addressed with K's strides (vllm-xpu-kernels #449): right while both share a layout."""
    name = "toy_v_with_k_strides"
    bug = "v_with_k_strides"


HEAD_TILE = 16


def flat_tile_kv_heads(num_q_heads: int, group: int) -> list[int]:
    """The KV head each query head reads when heads are cut into tiles of HEAD_TILE counted
    from head 0 and tile t reads KV head t // cdiv(group, HEAD_TILE). A tile stays inside one
    group while group <= HEAD_TILE (a tile is then the group) or group is a multiple of it."""
    per_tile = min(group, HEAD_TILE)
    tiles_per_group = -(-group // HEAD_TILE)
    return [(h // per_tile) // tiles_per_group for h in range(num_q_heads)]


class FlatHeadTiles(_ReadsInputsWrong):
    """Query heads tiled 16 at a time from head 0, each tile reading one KV head
    (flat_tile_kv_heads): right for groups up to 16 and multiples of 16; for any other group
    over 16 a tile straddles two groups and its last heads read the previous KV head. sglang
    0.5.23's grouped Triton decode maps heads this way (docs/conformance-matrix.md, triage)."""
    name = "toy_flat_head_tiles"
    bug = "flat_head_tiles"


class InterleavedKvHeads(_ReadsInputsWrong):
    """Query head h reads KV head h % Hkv instead of h // group: the query heads taken as
    [group, Hkv] where they are [Hkv, group] (a `repeat` where `repeat_interleave` belongs).
    Right for MHA and MQA only."""
    name = "toy_kv_heads_interleaved"
    bug = "kv_heads_interleaved"


class SinkWithoutMax(_ReadsInputsWrong):
    """The sink's exp taken against the keys' max alone (sgl-kernel-xpu #235): exp(sink - max)
    overflows once the sink is more than ~88 above every score."""
    name = "toy_sink_without_max"
    bug = "sink_without_max"

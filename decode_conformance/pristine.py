"""The inputs of a launch are read-only: snapshot them before, compare after.

A kernel that scales q in place and then applies sm_scale again, or that zeroes its inputs
and writes zeros, would be judged against a reference computed from what it left behind.
The runner computes the reference before the launch (so the yardstick is pristine) and
uses this module to fail any kernel that wrote to an input: q, the caches (including their
poisoned slots), kv_indptr / kv_indices, block_table, seq_lens and sinks must be bitwise
unchanged.

Small tensors are kept as exact copies, so the failure names the first changed index and
both values. Pools larger than COPY_LIMIT_BYTES (multi-GB caches of the 32-bit-offset
cases) are digested in blocks of DIGEST_BLOCK_BYTES instead: the failure names the first
block that changed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

COPY_LIMIT_BYTES = 256 << 20
DIGEST_BLOCK_BYTES = 256 << 10


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements in logical order, as bytes (no copy when it is contiguous; a
    strided view - MLA's V inside K, one half of a combined K/V page - is gathered, so only
    its own elements are compared and a change is named in its own indices)."""
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    return t.contiguous().reshape(-1).view(torch.uint8)


def _block_digest(u8: torch.Tensor) -> torch.Tensor:
    """One int64 per DIGEST_BLOCK_BYTES block: the wrapping sum of its 8-byte words. Any write
    that changes a block's contents changes its sum except by exact cancellation (two words
    swapped inside one block, say); one pass at memory speed, no copy of the pool."""
    n = u8.numel()
    words_per_block = DIGEST_BLOCK_BYTES // 8
    whole = n // 8 * 8
    try:
        words = u8[:whole].view(torch.int64)
    except RuntimeError:  # a span not aligned to 8 bytes: copy it once (never the case for our pools)
        words = u8[:whole].clone().view(torch.int64)
    full = words.numel() // words_per_block
    sums = [words[:full * words_per_block].view(full, words_per_block).sum(1)]
    rest = words[full * words_per_block:]
    if rest.numel() or whole < n:
        sums.append((rest.sum() + u8[whole:].to(torch.int64).sum() * 7).reshape(1))
    return torch.cat(sums)


@dataclass
class _Kept:
    name: str
    copy: Optional[torch.Tensor] = None  # exact bytes
    digest: Optional[torch.Tensor] = None  # per-block digest


class InputGuard:
    """Snapshot of a batch's inputs; `changes(batch)` lists what a launch wrote."""

    def __init__(self, inputs: dict[str, Optional[torch.Tensor]], copy_limit: int = COPY_LIMIT_BYTES):
        self.kept: list[_Kept] = []
        self.tensors = {}
        for name, t in inputs.items():
            if t is None:
                continue
            self.tensors[name] = t
            u8 = _bytes_view(t)
            if u8.numel() <= copy_limit:
                self.kept.append(_Kept(name, copy=u8.clone()))
            else:
                self.kept.append(_Kept(name, digest=_block_digest(u8)))

    def changes(self, inputs: dict[str, Optional[torch.Tensor]]) -> list[str]:
        out = []
        for kept in self.kept:
            t = inputs.get(kept.name)
            if t is None or t is not self.tensors[kept.name]:
                out.append(f"{kept.name}: the kernel replaced the input tensor (batch.{kept.name} was reassigned)")
                continue
            u8 = _bytes_view(t)
            if kept.copy is not None:
                diff = (u8 != kept.copy).nonzero()
                if diff.numel():
                    out.append(f"{kept.name}: {_describe_first(t, int(diff[0]), kept.copy)}")
            else:
                now = _block_digest(u8)
                bad = (now != kept.digest).nonzero()
                if bad.numel():
                    blk = int(bad[0])
                    first = blk * DIGEST_BLOCK_BYTES // t.element_size()
                    out.append(f"{kept.name}: bytes changed in the block of elements starting at flat index {first} "
                               f"({DIGEST_BLOCK_BYTES >> 10} KiB blocks digested, {int(bad.numel())} changed)")
        return out


def _describe_first(t: torch.Tensor, byte_index: int, before_u8: torch.Tensor) -> str:
    """'first changed element [i, j, ...]: was X, now Y' for a byte offset into t's elements."""
    size = t.element_size()
    elem = byte_index // size
    idx, rest = [], elem
    for dim in reversed(t.shape):
        idx.append(rest % dim)
        rest //= dim
    was = before_u8[elem * size:(elem + 1) * size].view(t.dtype)
    now = t[tuple(reversed(idx))].reshape(1)
    return (f"first changed element {list(reversed(idx))} (of {list(t.shape)}): was {_fmt(was)}, now {_fmt(now)}; "
            "the kernel wrote to an input (inputs are read-only)")


def _fmt(x: torch.Tensor) -> str:
    v = x.reshape(-1)[0]
    if v.dtype.is_floating_point and v.element_size() == 1:
        v = v.float()
    return f"{v.item():.6g}" if v.dtype.is_floating_point else str(int(v.item()))

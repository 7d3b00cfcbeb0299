"""What a kernel under test receives: the tensors and host-side metadata of one decode step.

This is what a serving engine has at the call site - device tensors, lengths on the host,
the batch size, the longest request, scales, an optional split-count hint - and nothing of
the suite's own bookkeeping (no case id, seed or data kind): a kernel that passes here was
given no more than it will get in production.

The suite owns every buffer here (design principle 1): `out` and `lse` arrive filled with
NaN, and kernels ask `workspace` for their scratch instead of allocating it, so a value a
kernel forgets to write - or a stale partial it merges - is a NaN in the result. The inputs
are read-only: the suite checks after every launch that none of them changed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


class Workspace:
    """Suite-owned scratch. Float buffers are NaN-filled; integer buffers take the fill the
    kernel documents (a lock or counter start value), which must be given explicitly."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.buffers: dict[str, torch.Tensor] = {}

    def alloc(self, name: str, shape, dtype: torch.dtype, fill=None) -> torch.Tensor:
        if name in self.buffers:
            raise ValueError(f"workspace buffer {name!r}: allocated twice in one plan")
        if fill is None:
            if not dtype.is_floating_point:
                raise ValueError(f"workspace buffer {name!r}: integer dtype {dtype} needs an explicit fill")
            fill = float("nan")
        t = torch.full(tuple(shape), fill, dtype=dtype, device=self.device)
        self.buffers[name] = t
        return t

    def repoison(self) -> None:
        """Refill every float buffer with NaN (between CUDA-graph replays)."""
        for t in self.buffers.values():
            if t.dtype.is_floating_point:
                t.fill_(float("nan"))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers.values())


# The input tensors of a batch, in the order the pristine-input check reports them.
INPUT_TENSORS = ("q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "block_table", "seq_lens", "sinks")


@dataclass
class DecodeBatch:
    """One decode step: a query per request against a paged KV cache.

    Cache views (both describe the same slots):
      - CSR, sglang style: kv_indptr [B+1] int32 prefix sums of seq_lens; kv_indices the flat
        slot id (page * page_size + offset) of every key in token order.
      - page table, vLLM/FlashAttention style: block_table [B, max_pages] int32 page ids
        (unused entries point at the null page 0) and seq_lens [B] int32.
    k_cache [pages, page_size, Hkv, Dk]; v_cache [pages, page_size, Hkv, Dv] (for MLA, a
    strided view of k_cache's first Dv columns). Page 0 is the null page. For fp8 caches the
    true key is k_cache * k_scale and the true value v_cache * v_scale.

    Host-side metadata: `seq_lens_host` (the lengths, as the scheduler knows them), `window`
    (visible keys in the kernel's declared convention, None = no window), `num_splits` (a
    split count to use when the kernel declares `Capabilities.num_splits`, else a hint it may
    ignore), `softcap` (0.0 = off).
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    sinks: Optional[torch.Tensor]
    out: torch.Tensor
    lse: torch.Tensor
    workspace: Workspace
    seq_lens_host: tuple[int, ...]
    page_size: int
    sm_scale: float
    k_scale: float = 1.0
    v_scale: float = 1.0
    softcap: float = 0.0
    window: Optional[int] = None
    num_splits: Optional[int] = None
    # The one channel back from the kernel: a short note on what it chose (a dispatcher's path,
    # a split count), shown on the case's report row. Nothing reads it to judge.
    kernel_note: str = ""

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def batch_size(self) -> int:
        return self.q.shape[0]

    @property
    def num_q_heads(self) -> int:
        return self.q.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k_cache.shape[-2]

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    @property
    def v_head_dim(self) -> int:
        return self.v_cache.shape[-1]

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host) if self.seq_lens_host else 0

    @property
    def v_from_k(self) -> bool:
        """MLA: V is the first v_head_dim columns of K (one latent KV head)."""
        return self.v_head_dim < self.head_dim and self.v_cache.data_ptr() == self.k_cache.data_ptr()

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.k_cache.dtype

    def k_slots(self) -> torch.Tensor:
        """k_cache as [slots, Hkv, Dk] (slot = page * page_size + offset)."""
        return self.k_cache.flatten(0, 1)

    def v_slots(self) -> torch.Tensor:
        return self.v_cache.flatten(0, 1)

    def inputs(self) -> dict[str, Optional[torch.Tensor]]:
        return {name: getattr(self, name) for name in INPUT_TENSORS}

    def repoison_outputs(self) -> None:
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))
        self.workspace.repoison()

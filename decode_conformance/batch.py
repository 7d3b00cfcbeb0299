"""What a kernel under test receives: tensors and metadata views of one Case.

The suite owns every buffer here (design principle 1): `out` and `lse` arrive filled with
NaN, and kernels ask `workspace` for their scratch instead of allocating it, so a value a
kernel forgets to write - or a stale partial it merges - is a NaN in the result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .cases import Case


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


@dataclass
class DecodeBatch:
    """One decode step: a query per request against a paged KV cache.

    Cache views (both describe the same slots):
      - CSR, sglang style: kv_indptr [B+1] int32 prefix sums of seq_lens; kv_indices the flat
        slot id (page * page_size + offset) of every key in token order.
      - page table, vLLM/FlashAttention style: block_table [B, max_pages] int32 page ids
        (unused entries point at the null page 0) and seq_lens [B] int32.
    k_cache [pages, page_size, Hkv, Dk]; v_cache [pages, page_size, Hkv, Dv] (for MLA, a
    strided view of k_cache's first Dv columns). Page 0 is the null page. For fp8, the true
    key is k_cache * k_scale and the true value v_cache * v_scale.
    """

    case: Case
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
    seed: int
    window: Optional[int] = None  # in the kernel's declared convention; set by the harness
    extras: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def page_size(self) -> int:
        return self.case.page_size

    @property
    def sm_scale(self) -> float:
        return self.case.sm_scale

    @property
    def k_scale(self) -> float:
        return self.case.scales[0]

    @property
    def v_scale(self) -> float:
        return self.case.scales[1]

    @property
    def softcap(self) -> float:
        """0.0 means off, the convention of sglang's logit_cap."""
        return float(self.case.softcap or 0.0)

    def k_slots(self) -> torch.Tensor:
        """k_cache as [slots, Hkv, Dk] (slot = page * page_size + offset)."""
        return self.k_cache.flatten(0, 1)

    def v_slots(self) -> torch.Tensor:
        return self.v_cache.flatten(0, 1)

    def repoison_outputs(self) -> None:
        self.out.fill_(float("nan"))
        self.lse.fill_(float("nan"))
        self.workspace.repoison()

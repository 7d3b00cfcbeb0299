"""The suite-facing side both split-K kernels (fixed_split, adaptive_split) share: what they
declare (SPLIT_K_CAPS) and how a plan turns a DecodeBatch into a launch (`plan_launch`:
scratch from the batch's workspace, sinks as fp32, the batch's tensors and scalars). What
differs between them - the split count and the arguments it brings - is passed in.

Host-side Python only; the launchers it calls are the kernels' own.
"""
from __future__ import annotations

from typing import Callable

import torch

from decode_conformance.kernel_api import Capabilities

SPLIT_K_CAPS = Capabilities(
    kv_dtypes=frozenset({"bf16", "fp16", "e4m3", "e5m2"}),
    layouts=frozenset({"contig", "paged"}),
    page_sizes=None,
    window_convention="counts-current",
    mla=True, softcap=True, sinks=True, lse=True,
    num_splits=True, cuda_graph_safe=True, deterministic=True,
)


def plan_launch(batch, scratch_name: str, shapes, launcher: Callable, **kernel_args) -> Callable[[], None]:
    """A launch of `launcher` on `batch`: partials and their LSEs of `shapes` (partials shape,
    partial-lse shape) taken from the batch's workspace as `<scratch_name>.partials` /
    `.partial_lse` (NaN-poisoned by the suite, so a read of an unwritten split shows), and
    `kernel_args` (the kernel's split count and its own options) passed through."""
    p_shape, l_shape = shapes
    partials = batch.workspace.alloc(f"{scratch_name}.partials", p_shape, torch.float32)
    partial_lse = batch.workspace.alloc(f"{scratch_name}.partial_lse", l_shape, torch.float32)
    sinks = batch.sinks.to(device=batch.device, dtype=torch.float32).contiguous() if batch.sinks is not None else None
    kw = dict(sm_scale=batch.sm_scale, lse=batch.lse, k_scale=batch.k_scale, v_scale=batch.v_scale,
              softcap=batch.softcap, sinks=sinks, window=batch.window,
              partials=partials, partial_lse=partial_lse, **kernel_args)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices, batch.out)

    def launch():
        launcher(*args, **kw)

    return launch

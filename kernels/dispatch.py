"""Decode-attention dispatcher: the Lean persistent kernel where its gate says it wins,
adaptive split-K everywhere else (after the forward_decode resolution of sglang PR #33576).

Order of the decision (`choose_path`), first match wins:
1. A feature Lean does not implement (soft-cap, attention sinks, a forced split count)
   -> split-K, whatever the override: never a wrong result.
2. Kill switch DECODE_CONFORMANCE_DISABLE_LEAN=1 -> split-K (also over enable_lean=True).
3. Explicit enable_lean=True / False.
4. enable_lean=None during CUDA-graph capture -> `lean_gate.capture_policy` (batch, head
   tiles, MLA; the lengths are not known yet).
5. enable_lean=None on an fp8 cache -> split-K (the gate is calibrated on 16-bit caches, and
   split-K's fp8 path has no counterpart in Lean; `choose_path`).
6. enable_lean=None in eager mode -> `lean_gate.eager_gate` with the real lengths (their host
   sum and maximum; None -> split-K, and no host sync is ever made to find them).
Thresholds come from the GPU class's row of fixtures/gates/lean_calibration.toml; classes
without one (and the CPU interpreter) never enable Lean on their own.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, Optional

import torch

from decode_conformance.cases import visible_keys_of
from decode_conformance.kernel_api import Capabilities

from . import kv_layout, lean_gate

DISABLE_ENV = "DECODE_CONFORMANCE_DISABLE_LEAN"
LEAN, SPLIT = "lean", "split"

__all__ = ["choose_path", "lean_disabled", "gpu_class_of", "decode", "DispatchKernel", "DISABLE_ENV"]


def lean_disabled(env: Optional[Mapping[str, str]] = None) -> bool:
    env = os.environ if env is None else env
    return env.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def lean_unsupported(softcap: float = 0.0, sinks: bool = False, num_splits: Optional[int] = None) -> list[str]:
    """Features of the call that the Lean kernel does not implement."""
    why = []
    if softcap and softcap > 0:
        why.append("soft-cap")
    if sinks:
        why.append("attention sinks")
    if num_splits is not None:
        why.append("a forced split count")
    return why


def choose_path(*, batch: int, num_q_heads: int, kv_group: int, seq_lens_sum: Optional[int] = None,
                max_len: Optional[int] = None, is_mla: bool = False, enable_lean: Optional[bool] = None, softcap: float = 0.0,
                sinks: bool = False, num_splits: Optional[int] = None, capturing: bool = False,
                gpu_class: Optional[str] = lean_gate.DEFAULT_CLASS, table=None,
                env: Optional[Mapping[str, str]] = None, kv_fp8: bool = False) -> str:
    """"lean" or "split". Pure in its arguments (env=None reads os.environ)."""
    if lean_unsupported(softcap, sinks, num_splits):
        return SPLIT
    if lean_disabled(env):
        return SPLIT
    if enable_lean is not None:
        return LEAN if enable_lean else SPLIT
    if kv_fp8:
        # The gate's thresholds come from 16-bit sweeps, and split-K's fp8 path (fp16 dots, V
        # read as byte pairs) has no counterpart in Lean: on an H200 (s18-3,
        # docs/gpu-runs/2026-12-03-h200-s18/) Lean ran e4m3 32/8/128 ragged batches of 8, 16
        # and 32 in 203.1 / 449.3 / 683.5 us against split-K's 130.8 / 290.6 / 452.4.
        return SPLIT
    if capturing:
        ok = lean_gate.capture_policy(batch, num_q_heads, kv_group, is_mla, gpu_class, table)
    else:
        ok = lean_gate.eager_gate(batch, seq_lens_sum, num_q_heads, kv_group, is_mla, gpu_class, table,
                                  max_len=max_len)
    return LEAN if ok else SPLIT


def gpu_class_of(device) -> str:
    """Calibration class of `device` (decode_conformance.hardware names); "default" if unknown."""
    device = torch.device(device)
    try:
        from decode_conformance import hardware
    except ImportError:
        return lean_gate.DEFAULT_CLASS
    if device.type != "cuda":
        return getattr(hardware, "CPU_CLASS", lean_gate.DEFAULT_CLASS)
    try:
        return hardware.detect_class(device.index if device.index is not None else torch.cuda.current_device())
    except Exception:
        return lean_gate.DEFAULT_CLASS


def _capturing(device) -> bool:
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def _gate_lengths(lengths, window: Optional[int]) -> dict:
    """The eager gate's length arguments (sum and longest of the visible lengths), or unknown."""
    if lengths is None:
        return dict(seq_lens_sum=None, max_len=None)
    vis = kv_layout.visible_lengths(lengths, window)
    return dict(seq_lens_sum=sum(vis), max_len=max(vis, default=0))


def decode(q, k_cache, v_cache, kv_indptr, kv_indices, out, *, sm_scale: float, lse=None,
           k_scale: float = 1.0, v_scale: float = 1.0, softcap: float = 0.0, sinks=None,
           window: Optional[int] = None, seq_lens=None, enable_lean: Optional[bool] = None,
           gpu_class: Optional[str] = None, table=None) -> str:
    """Decode attention through the chosen kernel; returns the path taken ("lean"/"split").

    Tensors as `lean.lean_decode` / `adaptive_split.decode_attention_adaptive`; window =
    visible keys counting the current one. seq_lens: host-side lengths (a list or a CPU
    tensor) for the eager gate; when omitted they are read from kv_indptr only if it is
    already on the CPU (never a device sync), otherwise the gate sees "unknown" (split-K).
    Scratch comes from torch here; use the kernels' plan functions to own it.
    """
    B, Hq = q.shape[0], q.shape[1]
    Hkv = k_cache.shape[-2]
    lengths = None
    if seq_lens is not None:
        lengths = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else list(seq_lens)
    elif kv_indptr.device.type == "cpu":
        lengths = (kv_indptr[1:B + 1] - kv_indptr[:B]).tolist()
    gate_lengths = _gate_lengths(lengths, window)
    capturing = _capturing(q.device)
    path = choose_path(
        batch=B, num_q_heads=Hq, kv_group=Hq // Hkv,
        **gate_lengths,
        is_mla=k_cache.shape[-1] != v_cache.shape[-1], enable_lean=enable_lean, softcap=softcap,
        sinks=sinks is not None, capturing=capturing,
        gpu_class=gpu_class if gpu_class is not None else gpu_class_of(q.device), table=table,
        kv_fp8=k_cache.element_size() == 1)
    if path == LEAN:
        from .lean import lean_decode
        lean_decode(q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, sm_scale=sm_scale, k_scale=k_scale,
                    v_scale=v_scale, window=window)
    else:
        from .adaptive_split import decode_attention_adaptive
        # known lengths bound this eager launch (never a captured one: its graph replays others)
        bound = None if capturing else gate_lengths["max_len"]
        decode_attention_adaptive(q, k_cache, v_cache, kv_indptr, kv_indices, out, sm_scale=sm_scale, lse=lse,
                                  k_scale=k_scale, v_scale=v_scale, softcap=softcap, sinks=sinks, window=window,
                                  max_visible=bound, planned_seq_lens=None if capturing else lengths)
    return path


def _split_kernel():
    from .adaptive_split import AdaptiveSplitKernel
    return AdaptiveSplitKernel()


def _lean_kernel():
    from .lean import LeanKernel
    return LeanKernel()


def _union_caps(a: Capabilities, b: Capabilities) -> Capabilities:
    if a.window_convention != b.window_convention:
        raise ValueError("dispatch: the two kernels declare different window conventions")
    return Capabilities(
        kv_dtypes=a.kv_dtypes | b.kv_dtypes, layouts=a.layouts | b.layouts,
        page_sizes=None if a.page_sizes is None or b.page_sizes is None else a.page_sizes | b.page_sizes,
        head_dims=None if a.head_dims is None or b.head_dims is None else a.head_dims | b.head_dims,
        window_convention=a.window_convention, mla=a.mla or b.mla, softcap=a.softcap or b.softcap,
        sinks=a.sinks or b.sinks, lse=a.lse and b.lse, num_splits=a.num_splits or b.num_splits,
        cuda_graph_safe=a.cuda_graph_safe and b.cuda_graph_safe, deterministic=a.deterministic and b.deterministic,
        devices=a.devices & b.devices,
    )


class DispatchKernel:
    """Suite adapter. The path is chosen at plan time from the batch's host-side lengths (or the
    capture policy when planned inside a capture) and reported in batch.kernel_note ("path=lean" or "path=split").
    Features one kernel lacks go to the other: soft-cap, sinks and forced split counts to
    split-K (so caps are the union)."""

    name = "dispatch"

    def __init__(self, enable_lean: Optional[bool] = None, gpu_class: Optional[str] = None, table=None,
                 split_kernel=None, lean_kernel=None):
        self.enable_lean = enable_lean
        self.gpu_class = gpu_class
        self.table = table
        self.split = split_kernel or _split_kernel()
        self.lean = lean_kernel or _lean_kernel()
        self.caps = _union_caps(self.split.caps, self.lean.caps)

    def path_for(self, batch) -> str:
        visible = visible_keys_of(batch.window, self.caps.window_convention)
        return choose_path(
            batch=batch.batch_size, num_q_heads=batch.num_q_heads, kv_group=batch.group,
            **_gate_lengths(batch.seq_lens_host, visible), is_mla=batch.v_from_k,
            enable_lean=self.enable_lean, softcap=batch.softcap, sinks=batch.sinks is not None,
            num_splits=batch.num_splits, capturing=_capturing(batch.device),
            gpu_class=self.gpu_class if self.gpu_class is not None else gpu_class_of(batch.device),
            table=self.table, kv_fp8=batch.k_cache.element_size() == 1)

    def plan(self, batch) -> Callable[[], None]:
        path = self.path_for(batch)
        batch.kernel_note = f"path={path}"
        return (self.lean if path == LEAN else self.split).plan(batch)

"""vLLM's Triton `unified_attention` (the V1 Triton attention backend) as decode kernels under
test, one per launch path, each forced so both are judged (validated against vllm 0.33.0):

| registry name | path |
|---|---|
| `vllm_unified_2d` | the single-pass 2D kernel: grid (q blocks, KV heads), one program per request and KV head |
| `vllm_unified_3d` | the segmented 3D kernel (grid x 16 softmax segments) and its `reduce_segments` kernel |

vLLM picks between them from `seq_threshold_3D` and the scratch buffers it is given: no
threshold forces 2D; a threshold at the batch size with scratch forces 3D (every decode
request is one q block). The function is imported from `vllm.v1.attention.ops.
triton_unified_attention` (current releases) or `vllm.attention.ops.triton_unified_attention`
(before the ops moved under v1/); arguments are passed by name after reading the installed
signature, and a release without the forced-3D arguments declares the 3D kernel unavailable.

Translation from the suite's DecodeBatch (docs/kernel-contract.md):
  - q [B, Hq, D] is vLLM's [num_tokens, Hq, D] with one token per request: cu_seqlens_q =
    0..B, max_seqlen_q = 1, causal; k / v = the suite's [pages, page_size, Hkv, D] caches
    (vLLM's NHD block layout), block_table / seqused_k = batch.block_table / batch.seq_lens.
  - window: the kernel's mask keeps key p when `query_pos - p < SLIDING_WINDOW` with
    SLIDING_WINDOW = 1 + window_size[0] (triton_attention_helpers.compute_kv_seq_mask), i.e.
    window_size[0] + 1 keys counting the current one: "counts-current", passed as
    (window - 1, 0) the way vLLM maps its sliding_window to FlashAttention's pair.
  - fp8: vLLM's fp8 KV cache with per-tensor scales (kv_quant_mode FP8_PER_TENSOR): the
    kernel loads each K/V tile, multiplies by the scale in fp32 and casts to q's dtype
    (_cast_kv_tile), so fp8 math is "dequant-kv"; q_descale is None (q stays 16-bit).
    k_descale / v_descale are [1] fp32 device tensors, as vLLM's layers hold them.
  - soft-cap: softcap (0 = off); sinks: fp32 [Hq] (USE_SINKS).
  - 3D scratch: softmax_segm_output [B, Hq, 16, next_pow2(Dv)], softmax_segm_max /
    _expsum [B, Hq, 16] fp32 from batch.workspace (NaN-filled).
No LSE is returned (caps.lse False); no MLA (a separate vLLM backend).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, Optional

from decode_conformance.kernel_api import Capabilities

from .library import first_module, library_version

MODULES = ("vllm.v1.attention.ops.triton_unified_attention", "vllm.attention.ops.triton_unified_attention")
FUNCTION = "unified_attention"
NUM_SEGMENTS = 16  # vLLM's NUM_PAR_SOFTMAX_SEGMENTS for the 3D path
FP8_PER_TENSOR = 1  # vllm.v1.kv_cache_interface.KVQuantMode.FP8_PER_TENSOR (an IntEnum)
_REQUIRED = ("q", "k", "v", "out", "cu_seqlens_q", "max_seqlen_q", "seqused_k", "max_seqlen_k",
             "softmax_scale", "causal", "window_size", "block_table", "softcap", "q_descale", "k_descale",
             "v_descale")
_FORCE_3D = ("seq_threshold_3D", "num_par_softmax_segments", "softmax_segm_output", "softmax_segm_max",
             "softmax_segm_expsum")

CAPS = Capabilities(
    deterministic=True,  # no atomics or arrival-order merges on this path: shown by the determinism scenario
    window_convention="counts-current",
    mla=False,
    softcap=True,
    sinks=True,
    lse=False,
    cuda_graph_safe=True,  # lengths and block table are read on the device; the grid depends on B only
    # A forced path gives each request fixed programs (and, in 3D, 16 segments sized from its own
    # length), so its bits do not depend on its batch companions.
    batch_invariant=True,
    devices=frozenset({"cuda", "cpu"}),  # cpu: Triton's interpreter (checked with vllm 0.33.0's file)
)


class VllmUnifiedKernel:
    def __init__(self, fn: Optional[Callable] = None, unavailable: Optional[str] = None, path: str = "2d"):
        if path not in ("2d", "3d"):
            raise ValueError(f"VllmUnifiedKernel path: expected '2d' or '3d', got {path!r}")
        self.name = f"vllm_unified_{path}"
        self.path = path
        self._fn = fn
        self._params: frozenset = frozenset()
        caps = CAPS
        if fn is not None:
            self._params = frozenset(inspect.signature(fn).parameters)
            missing = [p for p in _REQUIRED if p not in self._params]
            if path == "3d":
                missing += [p for p in _FORCE_3D if p not in self._params]
            if missing:
                unavailable = f"vLLM's {FUNCTION} has an unsupported signature (no {', '.join(missing)})"
            if "sinks" not in self._params:
                caps = dataclasses.replace(caps, sinks=False)
        self.caps = caps if unavailable is None else dataclasses.replace(caps, unavailable=unavailable)
        self.library_version = library_version("vllm") if fn is not None else None

    def plan(self, batch):
        import torch
        if self._fn is None or self.caps.unavailable:
            raise RuntimeError(f"{self.name}: {self.caps.unavailable}")
        B, Hq, Dv, dev = batch.batch_size, batch.num_q_heads, batch.v_head_dim, batch.device
        is_fp8 = batch.kv_dtype.itemsize == 1
        # Constants, not scratch: kept out of the workspace (its float buffers are re-poisoned
        # between graph replays).
        k_descale = torch.tensor([batch.k_scale], dtype=torch.float32, device=dev)
        v_descale = torch.tensor([batch.v_scale], dtype=torch.float32, device=dev)
        args = dict(
            q=batch.q, k=batch.k_cache, v=batch.v_cache, out=batch.out,
            cu_seqlens_q=torch.arange(B + 1, dtype=torch.int32, device=dev), max_seqlen_q=1,
            seqused_k=batch.seq_lens, max_seqlen_k=batch.max_seq_len, softmax_scale=batch.sm_scale, causal=True,
            window_size=(-1, -1) if batch.window is None else (int(batch.window) - 1, 0),
            block_table=batch.block_table, softcap=float(batch.softcap or 0.0),
            q_descale=None, k_descale=k_descale, v_descale=v_descale, sinks=batch.sinks,
        )
        if "kv_quant_mode" in self._params:
            args["kv_quant_mode"] = FP8_PER_TENSOR if is_fp8 else 0
        if self.path == "3d":
            ws = batch.workspace
            padded = 1 << max(0, (Dv - 1).bit_length())
            args.update(
                seq_threshold_3D=B, num_par_softmax_segments=NUM_SEGMENTS,
                softmax_segm_output=ws.alloc("vllm_segm_output", (B, Hq, NUM_SEGMENTS, padded), torch.float32),
                softmax_segm_max=ws.alloc("vllm_segm_max", (B, Hq, NUM_SEGMENTS), torch.float32),
                softmax_segm_expsum=ws.alloc("vllm_segm_expsum", (B, Hq, NUM_SEGMENTS), torch.float32),
            )
        elif "seq_threshold_3D" in self._params:
            args["seq_threshold_3D"] = None  # no threshold: the 2D kernel
        args = {k: v for k, v in args.items() if k in self._params}
        fn = self._fn
        return lambda: fn(**args)


def make_kernel(path: str = "2d") -> VllmUnifiedKernel:
    """The registry's factory: imports vLLM's kernel module now, so listing says whether it can run."""
    fn, why = first_module(MODULES, FUNCTION)
    return VllmUnifiedKernel(fn, why, path=path)

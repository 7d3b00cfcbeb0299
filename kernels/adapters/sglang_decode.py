"""sglang's Triton `decode_attention_fwd` as a decode kernel under test.

Opt-in (`--kernel=decode_conformance_kernels.registry:sglang_decode`), not shipped by
default. sglang is imported by the factory, never at module import: where it is not
installed the kernel is still listed and every case skips with
"sglang_decode lacks: sglang is not installed".

The function lives in `sglang.srt.layers.attention.triton_ops.decode_attention` (releases up to
0.5.x's middle) and `sglang.kernels.ops.attention.decode_attention` (0.5.23, the release this
adapter was last validated against); its recent signature is
    decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
                         num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale,
                         logit_cap=0.0, sinks=None, ...)
Arguments are passed by name after reading the installed signature, so an older sglang
without k_scale/v_scale or sinks declares (and is tested for) less rather than failing.

Translation from the suite's DecodeBatch (see docs/kernel-contract.md):
  - q [B, Hq, Lk]; k_buffer / v_buffer = batch.k_slots() / v_slots() ([slots, Hkv, D]; for MLA
    v_buffer is the strided view of K's first Lv columns, as in sglang's has_mla path).
  - kv_indptr / kv_indices are the suite's CSR slot view; kv_indices is copied at launch into
    a fixed int64 buffer, the type sglang's Triton backend allocates it in (triton_backend.py:
    `torch.zeros(..., dtype=torch.int64)`): the kernel computes each slot's offset
    `kv_loc * stride_buf_kbs` in kv_indices' type (decode_attention.py stage 1), so int32 indices
    overflow in pools past 2^31 elements (an illegal memory access). A sliding window is
    applied the way sglang's backend does it: per-request index lists trimmed to the last
    `window` keys (the window counts the current token: "counts-current").
  - num_kv_splits int32 [B] (all = max_kv_splits: every split runs, trailing ones empty for
    short requests), max_kv_splits sizes the grid; Case.num_splits, when set, is honoured.
  - scratch attn_logits fp32 [B, Hq, max_splits, Lv] and attn_lse fp32 [B, Hq, max_splits]
    come NaN-filled from batch.workspace.
  - logit_cap = batch.softcap (0.0 = off); k_scale / v_scale = the case's fp8 scales.
sglang's decode returns no final LSE, so caps.lse is False.

No 0-length rows (ShapeRule min_len >= 1): sglang's engine never hands its Triton decode a
request without keys. A decode request's current token is in the cache before attention runs,
and the CUDA-graph runner pads a batch up to its captured size with
`seq_lens.fill_(seq_len_fill_value)` (python/sglang/srt/model_executor/cuda_graph_runner.py),
where the Triton backend's `get_cuda_graph_seq_len_fill_value()` returns 1
(python/sglang/srt/layers/attention/triton_backend.py; sgl-project/sglang PR #1782, "we can
always use 1", zeroed req_to_token so the padding row reads slot 0). Its stage 2 divides by
the row's exp-sum, which is 0 for an empty row (a NaN, outside the contract it serves).
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, Optional

from decode_conformance.kernel_api import Capabilities, ShapeRule
from decode_conformance.reference import FP8_Q_AND_P

from .library import first_module, library_version

MODULES = ("sglang.srt.layers.attention.triton_ops.decode_attention",
           "sglang.kernels.ops.attention.decode_attention")
FUNCTION = "decode_attention_fwd"
DEFAULT_MAX_KV_SPLITS = 8  # sglang's --triton-attention-num-kv-splits default
_REQUIRED = ("q", "k_buffer", "v_buffer", "o", "kv_indptr", "kv_indices", "attn_logits", "attn_lse",
             "num_kv_splits", "max_kv_splits", "sm_scale")

CAPS = Capabilities(
    deterministic=True,  # no atomics or arrival-order merges on this path: shown by the determinism scenario
    window_convention="counts-current",
    mla=True,
    softcap=True,
    sinks=True,
    lse=False,
    num_splits=True,
    cuda_graph_safe=True,  # launch is two Triton kernels on fixed buffers; metadata is built in plan
    fp8_math=FP8_Q_AND_P,  # its grouped kernel casts q (and P) to the KV dtype for an fp8 x fp8 dot
    devices=frozenset({"cuda", "cpu"}),  # cpu: Triton's interpreter (checked with sglang 0.5.23's file)
    shape_rules=(ShapeRule("min_len", min=1, why="sglang pads CUDA-graph batches with seq_len 1 "
                           "(triton_backend.get_cuda_graph_seq_len_fill_value), never 0"),),
)


class SglangDecodeKernel:
    name = "sglang_decode"

    def __init__(self, fn: Optional[Callable] = None, unavailable: Optional[str] = None,
                 max_kv_splits: int = DEFAULT_MAX_KV_SPLITS):
        self._fn = fn
        self.max_kv_splits = max_kv_splits
        self._params: frozenset = frozenset()
        caps = CAPS
        if fn is not None:
            self._params = frozenset(inspect.signature(fn).parameters)
            missing = [p for p in _REQUIRED if p not in self._params]
            if missing:
                unavailable = f"sglang's {FUNCTION} has an unsupported signature (no {', '.join(missing)})"
            changes = {}
            if not {"k_scale", "v_scale"} <= self._params:
                changes["kv_dtypes"] = frozenset({"bf16", "fp16"})  # no way to pass fp8 scales
            if "sinks" not in self._params:
                changes["sinks"] = False
            caps = dataclasses.replace(caps, **changes)
        self.caps = caps if unavailable is None else dataclasses.replace(caps, unavailable=unavailable)
        self.library_version = library_version("sglang") if fn is not None else None

    def plan(self, batch):
        import torch
        if self._fn is None or self.caps.unavailable:
            raise RuntimeError(f"{self.name}: {self.caps.unavailable}")
        B, Hq, Lv = batch.batch_size, batch.num_q_heads, batch.v_head_dim
        indptr, indices = batch.kv_indptr, batch.kv_indices
        if batch.window is not None:
            lens = batch.seq_lens_host
            starts = batch.kv_indptr.tolist()
            keep = [indices[starts[b] + max(0, L - batch.window): starts[b] + L] for b, L in enumerate(lens)]
            indptr = torch.zeros_like(batch.kv_indptr)
            indptr[1:] = torch.tensor([len(k) for k in keep], dtype=torch.int32, device=batch.device).cumsum(0)
            indices = torch.cat(keep) if keep else indices[:0]
        # Device-to-device at launch (capturable), so a graph replay reads the indices written then.
        src_indices, indices = indices, torch.empty(indices.shape, dtype=torch.int64, device=indices.device)
        splits = batch.num_splits or self.max_kv_splits
        ws = batch.workspace
        args = dict(
            q=batch.q, k_buffer=batch.k_slots(), v_buffer=batch.v_slots(), o=batch.out,
            kv_indptr=indptr, kv_indices=indices,
            attn_logits=ws.alloc("attn_logits", (B, Hq, splits, Lv), torch.float32),
            attn_lse=ws.alloc("attn_lse", (B, Hq, splits), torch.float32),
            num_kv_splits=ws.alloc("num_kv_splits", (B,), torch.int32, fill=splits),
            max_kv_splits=splits, sm_scale=batch.sm_scale,
            k_scale=batch.k_scale, v_scale=batch.v_scale, logit_cap=batch.softcap, sinks=batch.sinks,
            has_mla=batch.v_head_dim != batch.head_dim,  # 0.5.23+: MLA launch geometry (suite: only MLA has Dv < Dk)
        )
        args = {k: v for k, v in args.items() if k in self._params}
        fn = self._fn

        def launch():
            indices.copy_(src_indices)
            fn(**args)
        return launch


def make_kernel(max_kv_splits: int = DEFAULT_MAX_KV_SPLITS) -> SglangDecodeKernel:
    """The registry's factory: imports sglang now, so listing the kernel says whether it can run."""
    fn, why = first_module(MODULES, FUNCTION)
    return SglangDecodeKernel(fn, why, max_kv_splits=max_kv_splits)

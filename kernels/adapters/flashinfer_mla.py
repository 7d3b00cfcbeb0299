"""flashinfer's `BatchMLAPagedAttentionWrapper` (the MLA decode, DeepSeek's 576/512 rope split)
as a decode kernel under test, one kernel per concrete backend: `flashinfer_mla` (fa2) and
`flashinfer_mla_fa3` (the sm_90 one). Validated against flashinfer-python 0.7.2.post1.

Translation from the suite's DecodeBatch (docs/kernel-contract.md):
  - the suite's MLA cache is one latent head: k_cache [pages, P, 1, 576] with V = its first
    512 columns. flashinfer's packed form is kv_cache [pages, P, 576] (ckv 512 + kpe 64), a
    view of k_cache's head 0; the query is packed the same way ([B, H, 576]).
  - metadata: the canonical CSR form, MLAPlanMetadata.csr(qo_indptr = 0..B, kv_indptr over
    pages, kv_indices = block_table rows, kv_len_arr = the lengths), host tensors (plan()
    normalises them to the device). causal=False: one query per request sees all its keys.
  - LSE: planned with lse_mode="basee" (natural log, the contract's base) and run with
    return_lse_base_on_e=True, returned into batch.lse. 0.7.2 checks that the run asks for the
    planned mode ("LSE mode mismatch: planned 'basee', got 'base2'" otherwise, seen on the H200).
  - workspace: 128 MiB float workspace from batch.workspace, zero-filled.
  - the LSE's tier: fa2 sums the softmax denominator from P cast to the query dtype
    (softmax_sum "rounded-p"), fa3 in fp32.
Declared: bf16 / fp16 caches only (fp8 MLA is a different scale contract), no window, no
soft-cap, no sinks, head dim 576 with V 512 only.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from decode_conformance.kernel_api import Capabilities, ShapeRule
from decode_conformance.reference import SUM_ROUNDED_P

from .flashinfer_decode import FLOAT_WORKSPACE_BYTES, LIBRARY, host_page_metadata
from .library import import_library, library_version

BACKENDS = {"flashinfer_mla": "fa2", "flashinfer_mla_fa3": "fa3"}
CKV, KPE = 512, 64

CAPS = Capabilities(
    deterministic=True,  # no atomics or arrival-order merges on this path: shown by the determinism scenario
    kv_dtypes=frozenset({"bf16", "fp16"}),
    layouts=frozenset({"paged"}),
    head_dims=frozenset({CKV + KPE}),  # with the rule below: MLA 576/512 cases only
    shape_rules=(ShapeRule("v_head_dim", allowed=frozenset({CKV}), why="the wrapper's compressed-KV width"),),
    window_convention=None,
    mla=True,
    softcap=False,
    sinks=False,
    lse=True,
    devices=frozenset({"cuda"}),
)
# The fa2 MLA kernel (include/flashinfer/attention/mla.cuh) casts P to the query dtype and sums
# the denominator from the cast values, as fa2's prefill kernel does (flashinfer_decode.py);
# the fa3 one sums in fp32 (its LSE passed the fp32 tier on the H200, run s13-2).
BACKEND_CAPS = {"fa2": dataclasses.replace(CAPS, softmax_sum=SUM_ROUNDED_P), "fa3": CAPS}


class FlashinferMlaKernel:
    def __init__(self, module=None, unavailable: Optional[str] = None, name: str = "flashinfer_mla"):
        self._fi = module
        self.name = name
        self._backend = BACKENDS[name]
        caps = BACKEND_CAPS[self._backend]
        self.caps = caps if unavailable is None else dataclasses.replace(caps, unavailable=unavailable)
        self.library_version = library_version(LIBRARY) if module is not None else None

    def plan(self, batch):
        import torch
        if self._fi is None:
            raise RuntimeError(f"{self.name}: {self.caps.unavailable}")
        P, B = batch.page_size, batch.batch_size
        indptr, _, n_pages = host_page_metadata(batch.seq_lens_host, P)
        bt = batch.block_table.cpu()  # host work at plan time, as a scheduler has its block table
        indices = torch.cat([bt[b, :n] for b, n in enumerate(n_pages)] + [torch.zeros(0, dtype=torch.int32)])
        kv_len = torch.tensor(list(batch.seq_lens_host), dtype=torch.int32)
        qo_indptr = torch.arange(B + 1, dtype=torch.int32)
        workspace = batch.workspace.alloc("flashinfer_float_workspace", (FLOAT_WORKSPACE_BYTES,), torch.uint8,
                                          fill=0)
        wrapper = self._fi.BatchMLAPagedAttentionWrapper(workspace, backend=self._backend)
        meta = self._fi.mla.MLAPlanMetadata.csr(qo_indptr, indptr, indices.to(torch.int32), kv_len)
        wrapper.plan(metadata=meta, num_heads=batch.num_q_heads, head_dim_ckv=CKV, head_dim_kpe=KPE,
                     page_size=P, causal=False, sm_scale=batch.sm_scale, q_data_type=batch.q.dtype,
                     kv_data_type=batch.kv_dtype, query_layout="packed", kv_cache_layout="packed",
                     lse_mode="basee")
        kv = batch.k_cache[:, :, 0, :]  # [pages, P, 576]: ckv then kpe, as flashinfer packs them

        def launch():
            wrapper.run(query=batch.q, kv_cache=kv, out=batch.out, lse=batch.lse, return_lse=True,
                        return_lse_base_on_e=True)  # the planned mode: 0.7.2 refuses a run that differs
        return launch


def make_kernel(name: str = "flashinfer_mla") -> FlashinferMlaKernel:
    module, why = import_library(LIBRARY)
    if module is not None and not hasattr(module, "BatchMLAPagedAttentionWrapper"):
        module, why = None, "flashinfer has no BatchMLAPagedAttentionWrapper (unsupported version)"
    return FlashinferMlaKernel(module, why, name=name)

"""flashinfer's `BatchDecodeWithPagedKVCacheWrapper` as decode kernels under test, one per
path a serving engine picks (validated against flashinfer-python 0.7.2.post1):

| registry name | path |
|---|---|
| `flashinfer_decode` | CUDA-core decode (`use_tensor_cores=False`) |
| `flashinfer_decode_tc` | tensor-core decode: the fa2 prefill kernel over the paged cache (`use_tensor_cores=True`, flashinfer's recommendation for GQA) |
| `flashinfer_decode_tc_graph` | the tensor-core path with `use_cuda_graph=True`: fixed metadata buffers, plan() outside the capture, split-KV off |
| `flashinfer_decode_graph` | listed, never run: every case skips with the reason below |

Opt-in (`--kernel=decode_conformance_kernels.registry:NAME`). flashinfer is imported by the
factory, never at module import: where it is not installed the kernel is still listed and
every case skips with "NAME lacks: flashinfer is not installed".

Translation from the suite's DecodeBatch (docs/kernel-contract.md):
  - cache: the suite's k_cache / v_cache [pages, page_size, Hkv, D] are flashinfer's NHD
    layout as a (K, V) tuple, unchanged; a contiguous layout is page size 1.
  - metadata: kv_indptr over *pages* (prefix sums of ceil(L / P)), kv_indices the page ids
    of each request in order (block_table rows), kv_last_page_len = L - (pages - 1) * P. The
    documented range is 1..P; an empty request has no page, and flashinfer's kernels give a
    request without pages length 0 whatever its last_page_len, so it gets 1.
  - plan() gets indptr and last_page_len as host tensors (built from seq_lens_host): it
    copies both to the host, which for device tensors costs two synchronisations per plan.
    kv_indices is built on the device from block_table (plan() moves it to the device).
  - window: window_left excludes the current token (window_left + 1 keys are visible), so
    the kernels declare "excludes-current" and receive batch.window in that convention.
  - soft-cap: logits_soft_cap (cap * tanh(s / cap) after scaling), None when off.
  - fp8: kv_data_type is the cache dtype; k_scale / v_scale go to run() (flashinfer folds
    k_scale into sm_scale and multiplies the output by v_scale).
  - LSE: flashinfer reports log2-sum-exp2; the contract is natural log, so the launch
    multiplies by ln 2 in place.
  - workspace: the 128 MiB float workspace comes from batch.workspace zero-filled (the
    constructor's documented requirement for its first use).
  - GQA groups: the CUDA-core decode instantiates groups {1, 2, 3, 4, 6, 8, 16} only
    (DISPATCH_GQA_GROUP_SIZE in include/flashinfer/utils.cuh; plan() raises
    "Unsupported group_size" otherwise); the tensor-core path takes any group.
  - the LSE's tier: the tensor-core path sums the softmax denominator from P cast to the
    query dtype (softmax_sum "rounded-p"); the CUDA-core decode sums it in fp32.
  - graph forms: the wrapper is built with fixed indptr / indices / last_page_len buffers
    from the workspace and planned once at the capacity the graph serves, with
    disable_split_kv=True (one CTA per request reads its length from those buffers at
    launch); the launch rebuilds the three buffers on the device from batch.seq_lens and
    batch.block_table before run(), so a replay with other lengths needs no re-plan.
No CUDA-graph form of the CUDA-core decode: its plan() accepts `disable_split_kv` and drops it
(flashinfer/decode.py, `_plan_impl`: only the tensor-core (fa2 prefill) branch passes it to the
module's plan), so that path keeps splitting KV by the planned lengths, and a replay with other
lengths runs on a stale split plan. flashinfer's own graph use re-plans before every replay,
which a graph that serves every length without a host step (docs/kernel-contract.md) cannot
do. Measured on an H200 before this was known (run s13-2): wrong rows, a hung replay and a
batch-dependent result for that form. The registry keeps `flashinfer_decode_graph`, marked
unavailable with that reason, so a run naming it says why it tests nothing.
Not declared: attention sinks (both fa2 paths accept `sinks=` in run() and drop it: only the
trtllm-gen and cuDNN backends, not available on sm_90, pass it to a kernel), MLA (the separate
wrapper in flashinfer_mla.py).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from decode_conformance.cases import INPUT_FORMS
from decode_conformance.kernel_api import Capabilities
from decode_conformance.reference import SUM_ROUNDED_P

from .library import import_library, library_version

LIBRARY = "flashinfer"
FLOAT_WORKSPACE_BYTES = 128 << 20
LN2 = math.log(2.0)
CUDA_CORE_GROUPS = frozenset({1, 2, 3, 4, 6, 8, 16})
NO_CUDA_CORE_GRAPH_FORM = ("no CUDA-graph form of flashinfer's CUDA-core decode: its plan() ignores "
                           "disable_split_kv (flashinfer/decode.py, _plan_impl), so a replay with other lengths "
                           "runs on a split plan fixed to the planned ones; use flashinfer_decode_tc_graph")

CAPS = Capabilities(
    deterministic=True,  # no atomics or arrival-order merges on this path: shown by the determinism scenario
    head_dims=frozenset({64, 128, 256}),
    gqa_groups=CUDA_CORE_GROUPS,
    window_convention="excludes-current",
    # The CUDA-core decode checks that paged_k_cache and paged_v_cache have the same strides and
    # raises otherwise: it addresses V through K's (csrc/batch_decode.cu, "K/V strides differ").
    input_forms=frozenset(INPUT_FORMS) - {"v-head-major"},
    mla=False,
    softcap=True,
    sinks=False,
    lse=True,
    num_splits=False,
    cuda_graph_safe=False,
    devices=frozenset({"cuda"}),
)
# The fa2 prefill kernel casts P to the query dtype and sums the denominator from the cast values
# (include/flashinfer/attention/prefill.cuh, compute_sfm_v: vec_cast, m16k16_rowsum_f16f16f32).
# It builds a module for K and V of independent strides (`paged_kv_stride_independent`).
TC_CAPS = dataclasses.replace(CAPS, gqa_groups=None, input_forms=None, softmax_sum=SUM_ROUNDED_P)


def variant_caps(use_tensor_cores: bool, cuda_graph: bool) -> Capabilities:
    if cuda_graph and not use_tensor_cores:
        return dataclasses.replace(CAPS, unavailable=NO_CUDA_CORE_GRAPH_FORM)
    caps = TC_CAPS if use_tensor_cores else CAPS
    if cuda_graph:
        # Split-KV off: each request is one CTA whose reduction order depends on its own
        # length only, so repeated launches and other batch companions give the same bits.
        caps = dataclasses.replace(caps, cuda_graph_safe=True, batch_invariant=True)
    return caps


def variant_name(use_tensor_cores: bool, cuda_graph: bool) -> str:
    return "flashinfer_decode" + ("_tc" if use_tensor_cores else "") + ("_graph" if cuda_graph else "")


def host_page_metadata(seq_lens_host, page_size: int):
    """(indptr [B+1], last_page_len [B]) int32 host tensors, and the page count per request."""
    import torch
    n_pages = [(L + page_size - 1) // page_size for L in seq_lens_host]
    indptr = torch.zeros(len(n_pages) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(n_pages, dtype=torch.int32).cumsum(0)
    last = torch.tensor([L - (n - 1) * page_size if n else 1 for L, n in zip(seq_lens_host, n_pages)],
                        dtype=torch.int32)
    return indptr, last, n_pages


def device_page_metadata(seq_lens, block_table, page_size: int, indptr_out, indices_out, last_out) -> None:
    """flashinfer's page metadata computed on the device from seq_lens and block_table, into
    fixed buffers, with no host synchronisation (so it can be captured in a CUDA graph).
    indices_out has one slot past B * max_pages that absorbs the unused block-table entries."""
    import torch
    B, M = block_table.shape
    n = (seq_lens + (page_size - 1)) // page_size
    indptr_out[:1].zero_()  # a fill kernel: `indptr_out[0] = 0` copies a host scalar (illegal in a capture)
    torch.cumsum(n, 0, dtype=torch.int32, out=indptr_out[1:])
    last_out.copy_(torch.where(n > 0, seq_lens - (n - 1) * page_size, torch.ones_like(seq_lens)))
    col = torch.arange(M, device=block_table.device, dtype=torch.int32)
    target = torch.where(col[None, :] < n[:, None], indptr_out[:-1, None] + col[None, :],
                         torch.full_like(col, B * M)[None, :])
    indices_out.scatter_(0, target.reshape(-1).long(), block_table.reshape(-1).to(indices_out.dtype))


class FlashinferDecodeKernel:
    def __init__(self, module=None, unavailable: Optional[str] = None, use_tensor_cores: bool = False,
                 cuda_graph: bool = False):
        self._fi = module
        self._use_tensor_cores = use_tensor_cores
        self._cuda_graph = cuda_graph
        self.name = variant_name(use_tensor_cores, cuda_graph)
        caps = variant_caps(use_tensor_cores, cuda_graph)
        if unavailable is not None and not caps.unavailable:  # a form with no run keeps its own reason
            caps = dataclasses.replace(caps, unavailable=unavailable)
        self.caps = caps
        self.library_version = library_version(LIBRARY) if module is not None else None

    def plan(self, batch):
        import torch
        if self._fi is None or self.caps.unavailable:  # the plugin skips every case first; this guards direct use
            raise RuntimeError(f"{self.name}: {self.caps.unavailable}")
        P, B = batch.page_size, batch.batch_size
        ws = batch.workspace
        indptr_h, last_h, n_pages = host_page_metadata(batch.seq_lens_host, P)
        M = batch.block_table.shape[1]
        indptr_d = ws.alloc("flashinfer_kv_indptr", (B + 1,), torch.int32, fill=0)
        indices_d = ws.alloc("flashinfer_kv_indices", (B * M + 1,), torch.int32, fill=0)
        last_d = ws.alloc("flashinfer_kv_last_page_len", (B,), torch.int32, fill=1)
        device_page_metadata(batch.seq_lens, batch.block_table, P, indptr_d, indices_d, last_d)
        workspace = ws.alloc("flashinfer_float_workspace", (FLOAT_WORKSPACE_BYTES,), torch.uint8, fill=0)
        graph = {}
        if self._cuda_graph:
            graph = dict(use_cuda_graph=True, paged_kv_indptr_buffer=indptr_d, paged_kv_indices_buffer=indices_d,
                         paged_kv_last_page_len_buffer=last_d)
        wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                              use_tensor_cores=self._use_tensor_cores, **graph)
        total = int(indptr_h[-1])
        wrapper.plan(indptr_h, indices_d[:total], last_h,
                     batch.num_q_heads, batch.num_kv_heads, batch.head_dim, P,
                     pos_encoding_mode="NONE",
                     window_left=-1 if batch.window is None else int(batch.window),
                     logits_soft_cap=batch.softcap or None,
                     q_data_type=batch.q.dtype, kv_data_type=batch.kv_dtype,
                     sm_scale=batch.sm_scale,
                     **(dict(disable_split_kv=True) if self._cuda_graph else {}))
        is_fp8 = batch.kv_dtype.itemsize == 1
        scales = dict(k_scale=batch.k_scale, v_scale=batch.v_scale) if is_fp8 else {}
        cuda_graph = self._cuda_graph

        def launch():
            if cuda_graph:  # lengths as they are at this launch (a replay writes new ones)
                device_page_metadata(batch.seq_lens, batch.block_table, P, indptr_d, indices_d, last_d)
            wrapper.run(batch.q, (batch.k_cache, batch.v_cache), out=batch.out, lse=batch.lse, return_lse=True,
                        **scales)
            batch.lse.mul_(LN2)  # base 2 -> natural log
        return launch


def make_kernel(use_tensor_cores: bool = False, cuda_graph: bool = False) -> FlashinferDecodeKernel:
    """The registry's factory: imports flashinfer now, so listing the kernel says whether it
    can run."""
    module, why = import_library(LIBRARY)
    if module is not None and not hasattr(module, "BatchDecodeWithPagedKVCacheWrapper"):
        module, why = None, "flashinfer has no BatchDecodeWithPagedKVCacheWrapper (unsupported version)"
    return FlashinferDecodeKernel(module, why, use_tensor_cores=use_tensor_cores, cuda_graph=cuda_graph)

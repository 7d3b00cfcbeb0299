"""flashinfer's `BatchDecodeWithPagedKVCacheWrapper` as a decode kernel under test.

Opt-in (`--kernel=decode_conformance_kernels.registry:flashinfer_decode`), not shipped by
default. flashinfer is imported by the factory, never at module import: where it is not
installed the kernel is still listed and every case skips with
"flashinfer_decode lacks: flashinfer is not installed".

Translation from the suite's DecodeBatch (see docs/kernel-contract.md):
  - cache: the suite's k_cache / v_cache [pages, page_size, Hkv, D] are flashinfer's NHD
    layout as a (K, V) tuple, unchanged; a contiguous layout is page size 1.
  - metadata: kv_indptr over *pages* (prefix sums of ceil(L / P)), kv_indices the page ids
    of each request in order (block_table rows), kv_last_page_len = L - (pages - 1) * P in
    1..P (0 for an empty request, which has no page).
  - window: flashinfer's window_left excludes the current token (window_left + 1 keys are
    visible), so the kernel declares window_convention "excludes-current" and receives
    batch.window in that convention.
  - soft-cap: logits_soft_cap (cap * tanh(s / cap) after scaling), None when off.
  - fp8: kv_data_type is the cache dtype; k_scale / v_scale go to run() (flashinfer folds
    k_scale into sm_scale and multiplies the output by v_scale).
  - LSE: flashinfer reports log2-sum-exp2; the contract is natural log, so the launch
    multiplies by ln 2 in place.
  - workspace: the 128 MB float workspace comes from batch.workspace (filled with 0xFF
    bytes, i.e. NaN for any float scratch flashinfer reads before writing).
Not declared: MLA (a separate flashinfer wrapper), attention sinks (backend-dependent in
flashinfer's decode wrapper), CUDA-graph use (needs the wrapper's use_cuda_graph buffers).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Optional

from decode_conformance.kernel_api import Capabilities

LIBRARY = "flashinfer"
FLOAT_WORKSPACE_BYTES = 128 << 20
LN2 = math.log(2.0)

CAPS = Capabilities(
    head_dims=frozenset({64, 128, 256}),
    window_convention="excludes-current",
    mla=False,
    softcap=True,
    sinks=False,
    lse=True,
    num_splits=False,
    cuda_graph_safe=False,
    devices=frozenset({"cuda"}),
)


def import_library(name: str) -> tuple[Optional[object], Optional[str]]:
    """(module, None), or (None, 'X is not installed') when the package itself is absent. A
    package that is installed but fails to import (a CUDA/ABI mismatch, a missing symbol) is
    not absent: that raises KernelLoadError with the import's traceback, so the run stops with
    a usage error instead of skipping every case green."""
    from decode_conformance.kernel_api import KernelLoadError
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as e:
        top = name.split(".")[0]
        if e.name == top or not _package_present(top):
            return None, f"{top} is not installed"
        if e.name and name.startswith(e.name):  # a submodule this version does not have
            return None, f"{name} does not exist in the installed {top}"
        raise KernelLoadError(f"{name} is installed but failed to import:\n{_traceback(e)}") from e
    except Exception as e:
        raise KernelLoadError(f"{name} is installed but failed to import:\n{_traceback(e)}") from e


def _traceback(e: BaseException) -> str:
    import traceback
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:]).rstrip()


def _package_present(top: str) -> bool:
    import importlib.util
    import sys
    if top in sys.modules and sys.modules[top] is None:  # import blocked: as good as absent
        return False
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return True


class FlashinferDecodeKernel:
    name = "flashinfer_decode"

    def __init__(self, module=None, unavailable: Optional[str] = None, use_tensor_cores: bool = False):
        self._fi = module
        self._use_tensor_cores = use_tensor_cores
        self.caps = CAPS if unavailable is None else dataclasses.replace(CAPS, unavailable=unavailable)

    def plan(self, batch):
        import torch
        if self._fi is None:  # the plugin skips every case first; this guards direct use
            raise RuntimeError(f"{self.name}: {self.caps.unavailable}")
        P = batch.page_size
        lens = list(batch.seq_lens_host)
        n_pages = [(L + P - 1) // P for L in lens]
        indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
        indptr[1:] = torch.tensor(n_pages, dtype=torch.int32).cumsum(0)
        bt = batch.block_table.cpu()
        indices = torch.cat([bt[b, :n] for b, n in enumerate(n_pages)] or [torch.zeros(0, dtype=torch.int32)])
        last = torch.tensor([L - (n - 1) * P if n else 0 for L, n in zip(lens, n_pages)], dtype=torch.int32)
        dev = batch.device
        workspace = batch.workspace.alloc("flashinfer_float_workspace", (FLOAT_WORKSPACE_BYTES,), torch.uint8,
                                          fill=0xFF)
        wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                              use_tensor_cores=self._use_tensor_cores)
        wrapper.plan(indptr.to(dev), indices.to(dtype=torch.int32, device=dev), last.to(dev),
                     batch.num_q_heads, batch.num_kv_heads, batch.head_dim, P,
                     pos_encoding_mode="NONE",
                     window_left=-1 if batch.window is None else int(batch.window),
                     logits_soft_cap=batch.softcap or None,
                     q_data_type=batch.q.dtype, kv_data_type=batch.kv_dtype,
                     sm_scale=batch.sm_scale)
        is_fp8 = batch.kv_dtype.itemsize == 1
        scales = dict(k_scale=batch.k_scale, v_scale=batch.v_scale) if is_fp8 else {}

        def launch():
            wrapper.run(batch.q, (batch.k_cache, batch.v_cache), out=batch.out, lse=batch.lse, return_lse=True,
                        **scales)
            batch.lse.mul_(LN2)  # base 2 -> natural log
        return launch


def make_kernel(use_tensor_cores: bool = False) -> FlashinferDecodeKernel:
    """The registry's factory: imports flashinfer now, so listing the kernel says whether it
    can run."""
    module, why = import_library(LIBRARY)
    if module is not None and not hasattr(module, "BatchDecodeWithPagedKVCacheWrapper"):
        module, why = None, "flashinfer has no BatchDecodeWithPagedKVCacheWrapper (unsupported version)"
    return FlashinferDecodeKernel(module, why, use_tensor_cores=use_tensor_cores)

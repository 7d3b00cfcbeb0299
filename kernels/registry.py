"""The kernels this project ships, by the names `--kernel` and reports use.

Each attribute is a zero-argument factory, so listing kernels imports no Triton code.
"""


def fixed_split():
    from .fixed_split import FixedSplitKernel
    return FixedSplitKernel()


def adaptive_split():
    from .adaptive_split import AdaptiveSplitKernel
    return AdaptiveSplitKernel()


def adaptive_split_graph():
    """adaptive_split launched as under CUDA-graph capture: no lengths known to the plan (opt-in)."""
    from .adaptive_split import AdaptiveSplitKernel
    return AdaptiveSplitKernel(sized_for_lengths=False)


def adaptive_split_fp8mma():
    from .adaptive_split import AdaptiveSplitFp8MmaKernel
    return AdaptiveSplitFp8MmaKernel()


def lean():
    from .lean import LeanKernel
    return LeanKernel()


def dispatch():
    from .dispatch import DispatchKernel
    return DispatchKernel()


def torch_gather():
    from .torch_gather import TorchGatherKernel
    return TorchGatherKernel()


def torch_sdpa():
    from .adapters.torch_sdpa import TorchSdpaKernel
    return TorchSdpaKernel()


# External libraries: opt-in through --kernel (not registered as entry points). Where the library
# is not installed the kernel still loads, and every case skips saying so.

def flashinfer_decode():
    from .adapters.flashinfer_decode import make_kernel
    return make_kernel()


def sglang_decode():
    from .adapters.sglang_decode import make_kernel
    return make_kernel()


def flashinfer_decode_tc():
    from .adapters.flashinfer_decode import make_kernel
    return make_kernel(use_tensor_cores=True)


def flashinfer_decode_graph():
    from .adapters.flashinfer_decode import make_kernel
    return make_kernel(cuda_graph=True)


def flashinfer_decode_tc_graph():
    from .adapters.flashinfer_decode import make_kernel
    return make_kernel(use_tensor_cores=True, cuda_graph=True)


def flashinfer_mla():
    from .adapters.flashinfer_mla import make_kernel
    return make_kernel("flashinfer_mla")


def flashinfer_mla_fa3():
    from .adapters.flashinfer_mla import make_kernel
    return make_kernel("flashinfer_mla_fa3")


def vllm_unified_2d():
    from .adapters.vllm_unified import make_kernel
    return make_kernel("2d")


def vllm_unified_3d():
    from .adapters.vllm_unified import make_kernel
    return make_kernel("3d")


def torch_flex():
    from .adapters.torch_flex import TorchFlexKernel
    return TorchFlexKernel()


# Every opt-in adapter of an external library, by registry name (`--list-kernels` lists them,
# saying whether the library is present; the conformance matrix has a row for each).
ADAPTERS = ("torch_sdpa", "torch_flex", "flashinfer_decode", "flashinfer_decode_tc", "flashinfer_decode_graph",
            "flashinfer_decode_tc_graph", "flashinfer_mla", "flashinfer_mla_fa3", "vllm_unified_2d",
            "vllm_unified_3d", "sglang_decode")

"""The kernels this project ships, by the names `--kernel` and reports use.

Each attribute is a zero-argument factory, so listing kernels imports no Triton code.
"""


def fixed_split():
    from .fixed_split import FixedSplitKernel
    return FixedSplitKernel()


def adaptive_split():
    from .adaptive_split import AdaptiveSplitKernel
    return AdaptiveSplitKernel()


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

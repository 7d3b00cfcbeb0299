"""Kernels that misbehave on purpose, for testing the harness (pure torch, CPU or GPU).

Each one fails in a way a real kernel can: raising, replacing the output buffer with one of
the wrong shape / dtype / device, writing NaN, leaving the output unwritten, hanging,
killing its process (abort, segfault, a hard exit standing in for a CUDA error that
corrupts the context), or reporting a CUDA error that poisons every later launch in the
same process. `canary` is a correct kernel that fails only in such a poisoned process.

Specs: `suites.selftest.faulty_kernels:<attribute>`, e.g. `--kernel=suites.selftest.faulty_kernels:hang`.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import time

import torch

from decode_conformance.kernel_api import Capabilities

MARKER_DIR_ENV = "DC_FAULTY_MARKER_DIR"  # MarkerKernel writes <dir>/<name> when planned
CUDA_ERROR_TEXT = "CUDA error: an illegal memory access was encountered"

# Process-wide stand-in for a poisoned CUDA context: set by `cuda_error`, read by `canary`.
_CONTEXT_POISONED = False


def _correct(batch) -> None:
    from decode_conformance_kernels.torch_gather import torch_gather_decode
    torch_gather_decode(batch)


class FaultyKernel:
    caps = Capabilities(window_convention="counts-current")

    def __init__(self, name: str, launch):
        self.name = name
        self._launch = launch

    def plan(self, batch):
        return lambda: self._launch(batch)

    def __repr__(self):
        return f"FaultyKernel({self.name})"


def _raise(batch):
    raise RuntimeError("faulty kernel: deliberate failure inside launch")


def _wrong_shape(batch):
    B, H, D = batch.out.shape
    batch.out = torch.zeros((B, H, D + 1), dtype=batch.out.dtype, device=batch.out.device)


def _wrong_dtype(batch):
    own = batch.out
    _correct(batch)  # right numbers, but handed back in float32 instead of the q dtype
    batch.out = own.float()


def _wrong_device(batch):
    batch.out = torch.empty(batch.out.shape, dtype=batch.out.dtype, device="meta")


def _nan(batch):
    _correct(batch)
    batch.out[0, 0, 0] = float("nan")


def _unwritten(batch):
    return None  # out and lse keep the suite's NaN fill


def _hang(batch):
    while True:
        time.sleep(0.05)


def _abort(batch):
    os.abort()


def _segfault(batch):
    ctypes.string_at(0)  # read address 0: SIGSEGV


def _exit_in_launch(batch):
    # On a GPU, an illegal access can take the process down or leave its CUDA context
    # unusable; on CPU the closest stand-in is the process vanishing mid-launch.
    os._exit(1)


def _cuda_error(batch):
    global _CONTEXT_POISONED
    _CONTEXT_POISONED = True
    raise RuntimeError(CUDA_ERROR_TEXT)


def _canary(batch):
    if _CONTEXT_POISONED:
        raise RuntimeError(f"{CUDA_ERROR_TEXT} (context poisoned by an earlier launch in this process)")
    _correct(batch)


class MarkerKernel(FaultyKernel):
    """Records every plan() in $DC_FAULTY_MARKER_DIR/<name> (one case id a line), then
    raises on launch: proves whether the harness ever handed it a case (quarantine must not)."""

    def __init__(self, name: str):
        super().__init__(name, self._raise_launched)

    def plan(self, batch):
        d = os.environ.get(MARKER_DIR_ENV)
        if d:
            with open(pathlib.Path(d) / self.name, "a") as f:
                f.write(f"{list(batch.seq_lens_host)}\n")
        return super().plan(batch)

    def _raise_launched(self, batch):
        raise RuntimeError(f"{self.name} was launched")


raises = FaultyKernel("faulty_raises", _raise)
wrong_shape = FaultyKernel("faulty_wrong_shape", _wrong_shape)
wrong_dtype = FaultyKernel("faulty_wrong_dtype", _wrong_dtype)
wrong_device = FaultyKernel("faulty_wrong_device", _wrong_device)
nan = FaultyKernel("faulty_nan", _nan)
unwritten = FaultyKernel("faulty_unwritten", _unwritten)
hang = FaultyKernel("faulty_hang", _hang)
abort = FaultyKernel("faulty_abort", _abort)
segfault = FaultyKernel("faulty_segfault", _segfault)
exit_in_launch = FaultyKernel("faulty_exit", _exit_in_launch)
cuda_error = FaultyKernel("faulty_cuda_error", _cuda_error)
canary = FaultyKernel("faulty_canary", _canary)
marker_a = MarkerKernel("marker_a")
marker_b = MarkerKernel("marker_b")


class _Fp8MmaKernel:
    """Correct output, but declares fp8 matrix instructions: for GPU-class deselection tests."""
    name = "fp8_mma"

    def __init__(self):
        from decode_conformance.kernel_api import Capabilities
        from decode_conformance.reference import FP8_Q_AND_P
        self.caps = Capabilities(window_convention="counts-current", fp8_math=FP8_Q_AND_P)

    def plan(self, batch):
        return lambda: _correct(batch)


fp8_mma = _Fp8MmaKernel()


class _CudaOnly(FaultyKernel):
    """Correct, but declares it runs on CUDA only: on a CPU runner every case skips."""
    caps = Capabilities(window_convention="counts-current", devices=frozenset({"cuda"}))


cuda_only = _CudaOnly("faulty_cuda_only", _correct)


class _DeclaredInvariant(FaultyKernel):
    """torch_gather, declaring batch invariance (it is: one request at a time)."""
    caps = Capabilities(window_convention="counts-current", batch_invariant=True)


class _BatchDependent(FaultyKernel):
    """Correct to the last bit but one: the output moves by an ulp with the batch size, as a
    kernel whose split count follows the batch does - and it claims batch invariance."""
    caps = Capabilities(window_convention="counts-current", batch_invariant=True)


def _ulp_per_request(batch):
    _correct(batch)
    if batch.batch_size > 1:
        batch.out.copy_(torch.nextafter(batch.out, torch.full_like(batch.out, float("inf"))))


invariant = _DeclaredInvariant("faulty_invariant", _correct)
batch_dependent = _BatchDependent("faulty_batch_dependent", _ulp_per_request)


class _Relaunch(FaultyKernel):
    """Correct on the first launch of each plan; on the second launch of the same plan (what a
    CUDA-graph replay or a relaunch does) it runs `on_relaunch` instead. Declares graph safety
    and determinism so every scenario that relaunches or re-plans applies to it."""
    caps = Capabilities(window_convention="counts-current", cuda_graph_safe=True, deterministic=True)

    def plan(self, batch):
        launches = []

        def launch():
            launches.append(1)
            (self._launch if len(launches) > 1 else _correct)(batch)
        return launch


# Out-of-tree kernels that die on a relaunch of one plan: the process aborts / the launch hangs
# (on a GPU the replay of a captured graph is such a relaunch; on a CPU the second eager launch).
abort_on_relaunch = _Relaunch("faulty_abort_on_relaunch", _abort)
hang_on_relaunch = _Relaunch("faulty_hang_on_relaunch", _hang)


class _EveryScenario(FaultyKernel):
    """Declares every property a scenario checks, so each one runs it."""
    caps = Capabilities(window_convention="counts-current", cuda_graph_safe=True, deterministic=True,
                        batch_invariant=True)


def _writes_q(batch):
    _correct(batch)  # the right output, from the pristine q; then q is scaled in place
    batch.q.mul_(1.0 + 2 ** -7)


def _replaces_out(batch):
    batch.out = torch.empty_like(batch.out)  # same shape and dtype: only the buffer's identity differs
    _correct(batch)


# Contract violations every scenario must name as such (not as a mismatch they cause later).
writes_q = _EveryScenario("faulty_writes_q", _writes_q)
replaces_out = _EveryScenario("faulty_replaces_out", _replaces_out)


def _ulp_up(batch):
    _correct(batch)
    batch.out.copy_(torch.nextafter(batch.out, torch.full_like(batch.out, float("inf"))))


class _DriftsOnRelaunch(_Relaunch):
    """An ulp off on a plan's second launch (state a plan keeps between launches), claiming
    graph safety only: the same-plan-twice check applies, determinism does not."""
    caps = Capabilities(window_convention="counts-current", cuda_graph_safe=True)


class _DriftsOnReplan(FaultyKernel):
    """An ulp off on every plan after this object's first (an atomic-order or split choice that
    changes run to run), claiming determinism only."""
    caps = Capabilities(window_convention="counts-current", deterministic=True)

    def plan(self, batch):
        self.plans = getattr(self, "plans", 0) + 1
        return lambda: (_ulp_up if self.plans > 1 else _correct)(batch)


drifts_on_relaunch = _DriftsOnRelaunch("faulty_drifts_on_relaunch", _ulp_up)
drifts_on_replan = _DriftsOnReplan("faulty_drifts_on_replan", _correct)


def _lse_off(batch):
    """The output right, the LSE a twentieth of a nat high: what a split-merge that rescales
    the output but not the LSE it hands back gives. Only the LSE check can see it."""
    _correct(batch)
    batch.lse.add_(0.05)


lse_off = FaultyKernel("faulty_lse_off", _lse_off)

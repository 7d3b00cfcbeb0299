"""What a device string means to the suite, in one place: its case profile, the device type
capabilities are declared for, and the process set-up a CPU run needs.

A CPU run executes Triton kernels through Triton's interpreter on interpreter-sized cases
(the "interpreter" profile); any other device runs them natively on full-sized cases ("gpu").
"""
from __future__ import annotations

import os

PROFILES = ("interpreter", "gpu")

# Triton's source-line records in each binary serve profilers and debuggers, not a correctness
# run: without them a cold main job compiled 4 % faster (39.4 s against 41.2 s, one H100,
# docs/gpu-runs/2026-12-06-h100-s39). The variable is part of Triton's cache key, so these
# binaries never stand in for a profiling run's. A user's own value (0 keeps line info) is kept.
LINE_INFO_VAR = "TRITON_DISABLE_LINE_INFO"


def is_cpu(device) -> bool:
    return str(device).split(":", 1)[0] == "cpu"


def profile_of(device) -> str:
    """The case profile a run on `device` uses."""
    return "interpreter" if is_cpu(device) else "gpu"


def device_type(device) -> str:
    """The device type `Capabilities.devices` and `missing_for` speak of: cpu or cuda (ROCm
    builds of torch call their GPUs cuda too)."""
    return "cpu" if is_cpu(device) else "cuda"


def device_type_of_profile(profile: str) -> str:
    return "cpu" if profile == "interpreter" else "cuda"


def use_compile_defaults() -> None:
    """The Triton settings of every process that compiles the suite's kernels for a GPU: the
    isolated worker and the compile-ahead pool. The same settings make the same cache keys, so a
    pool's binaries are the ones the cases look up. Call it before the first compile."""
    os.environ.setdefault(LINE_INFO_VAR, "1")


def use_interpreter() -> None:
    """The cpu-device set-up, shared by the pytest plugin, the isolation worker and the command
    line tools: run Triton kernels through its interpreter, with the bf16 compatibility layer
    installed. Must precede the first `import triton` in the process."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from . import interpreter_compat
    interpreter_compat.install()

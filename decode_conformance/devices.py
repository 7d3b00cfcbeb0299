"""What a device string means to the suite, in one place: its case profile, the device type
capabilities are declared for, and the process set-up a CPU run needs.

A CPU run executes Triton kernels through Triton's interpreter on interpreter-sized cases
(the "interpreter" profile); any other device runs them natively on full-sized cases ("gpu").
"""
from __future__ import annotations

import os

PROFILES = ("interpreter", "gpu")


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


def use_interpreter() -> None:
    """The cpu-device set-up, shared by the pytest plugin, the isolation worker and the command
    line tools: run Triton kernels through its interpreter, with the bf16 compatibility layer
    installed. Must precede the first `import triton` in the process."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from . import interpreter_compat
    interpreter_compat.install()

"""The command a failing perf verdict prints: it re-runs that one (kernel, cell) test with the
options that decided the verdict - the A/B reference, the records' folder, CI mode, the GPU
class and device as given - in the form the run was invoked with (a checkout path, or the
installed module under --pyargs). Only the selected cell is measured then (GuardRun times the
cells its session runs), so the line costs one cell's timing, not the whole table's."""
from __future__ import annotations

import os
import shlex

from ..runner import PYTEST_COMMAND
from .sources import FAKE_ENV

VALUE_OPTIONS = ("--perf-reference", "--perf-baseline-dir", "--gpu-class", "--device")
FLAG_OPTIONS = ("--perf-require-baseline",)


def command(node, kernel_spec: str, state) -> str:
    """`node` is the failing test_perf item; `state` the run's RunState (state.repro_target)."""
    config = node.config
    test = state.repro_target(node, config.invocation_params.dir) + node.name[len(node.originalname):]  # + "[kernel-cell]"
    parts = list(PYTEST_COMMAND) + (["--pyargs"] if state.pyargs else []) + [test, f"--kernel={kernel_spec}"]
    parts += [f"{opt}={config.getoption(opt)}" for opt in VALUE_OPTIONS if config.getoption(opt)]
    parts += [opt for opt in FLAG_OPTIONS if config.getoption(opt)]
    line = " ".join(shlex.quote(p) for p in parts)
    fake = os.environ.get(FAKE_ENV)  # the modelled timing decided the verdict: the line keeps it
    return f"{FAKE_ENV}={shlex.quote(fake)} {line}" if fake else line

"""The command a failing perf verdict prints: it re-runs that one (kernel, cell) test with the
options that decided the verdict - the A/B reference, the records' folder, CI mode, the GPU
class and device as given - in the form the run was invoked with (a checkout path, or the
installed module under --pyargs), with the PYTHONPATH entries its kernels were found on (CI
puts the base commit's copy, `mypkg_base`, there). Only the selected cell is measured then
(GuardRun times the cells its session runs), so the line costs one cell's timing, not the
whole table's."""
from __future__ import annotations

import os
import pathlib
import shlex

from ..runner import PYTEST_COMMAND
from .sources import FAKE_ENV

VALUE_OPTIONS = ("--perf-reference", "--perf-baseline-dir", "--gpu-class", "--device")
FLAG_OPTIONS = ("--perf-require-baseline",)


def path_entries_for(specs) -> list[str]:
    """The PYTHONPATH entries holding the top-level package of a `pkg.module:obj` spec; a
    registered bare name, or a package found elsewhere, needs none."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    need = []
    for spec in specs:
        top = spec.split(":", 1)[0].split(".", 1)[0]
        for e in entries:
            if (pathlib.Path(e) / top).is_dir() or (pathlib.Path(e) / f"{top}.py").is_file():
                if e not in need:
                    need.append(e)
                break
    return need


def command(node, kernel_spec: str, state) -> str:
    """`node` is the failing test_perf item; `state` the run's RunState (state.repro_target)."""
    config = node.config
    test = state.repro_target(node, config.invocation_params.dir) + node.name[len(node.originalname):]  # + "[kernel-cell]"
    parts = list(PYTEST_COMMAND) + (["--pyargs"] if state.pyargs else []) + [test, f"--kernel={kernel_spec}"]
    parts += [f"{opt}={config.getoption(opt)}" for opt in VALUE_OPTIONS if config.getoption(opt)]
    parts += [opt for opt in FLAG_OPTIONS if config.getoption(opt)]
    env = []
    fake = os.environ.get(FAKE_ENV)  # the modelled timing decided the verdict: the line keeps it
    if fake:
        env.append(f"{FAKE_ENV}={shlex.quote(fake)}")
    path = path_entries_for([kernel_spec] + [config.getoption("--perf-reference") or ""])
    if path:
        env.append("PYTHONPATH=" + shlex.quote(os.pathsep.join(path)))
    return " ".join(env + [shlex.quote(p) for p in parts])

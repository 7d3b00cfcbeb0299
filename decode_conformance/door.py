"""The one way a conformance test hands a kernel a case: `run(state, config, kernel, scenario,
case, test)`, for every scenario (scenarios.py) and every source of cases (case sets, fuzz
examples, trace workloads).

It applies the run's policy, the same for all of them: the reproduce line; a slot on a GPU
shared by several workers (device_memory); then either the isolated worker (isolation.py:
--isolation=process, which survives a crash, hang or poisoned context and fails only the
case) or this process under the per-case time limit (inprocess_timeout.py). Inside, the
scenario runs every kernel step under the input guard and output checks (runner.guarded).
"""
from __future__ import annotations

import dataclasses

from .cases import Case
from .device_memory import case_on_shared_gpu
from .runner import CaseResult, repro_command


def isolated_runner(state):
    """This process's isolated worker (its process started by state.build_state, or else on the
    first isolated case)."""
    if state.runner is None:
        from .isolation import IsolatedRunner
        state.runner = IsolatedRunner(state.device, state.case_timeout, preload=tuple(k.spec for k in state.kernels))
    return state.runner


def run(state, config, kp, scenario: str, case: Case, test: str, repro: str = "") -> CaseResult:
    """Scenario `scenario` of kernel `kp` (a state.KernelParam) on `case` under the run's policy.
    `test` names the test in the reproduce line (state.repro_target); `repro` replaces the line
    where a case source has its own (a fuzz example)."""
    repro = repro or repro_command(kp.spec, case, state.case_set, state.device, test=test, pyargs=state.pyargs,
                                  ledgers=state.repro_ledgers, extra_cases=tuple(state.extra_case_paths))
    with case_on_shared_gpu(case, state.device, state.workers_per_device):
        if state.isolation == "process":
            res = isolated_runner(state).run(kp.spec, case, scenario, name=kp.name)
        else:
            from .inprocess_timeout import in_process_timeout
            from .scenarios import run as run_scenario
            with in_process_timeout(config, state.case_timeout, f"{kp.name} on {case.id}"):
                res = run_scenario(scenario, kp.kernel, case, state.device)
    return dataclasses.replace(res, repro=repro)

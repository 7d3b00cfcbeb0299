"""The named checks a kernel goes through, each a function (kernel, case, device) -> CaseResult,
and the fixed cases of those that are not driven by the case set.

    parity            one plan, one launch, the verdict (runner.run_case); cases: the case set,
                      fuzz examples, trace workloads
    graph-replay      a plan captured once at capacity, replayed with other lengths (GPU only)
    determinism       the same inputs planned and launched again give the same bits
    same-plan-twice   one plan launched twice gives the same bits (state left in the workspace)
    batch-invariance  a request's row does not depend on the rest of its batch
    num-splits        the split count the batch asks for is the one used

Every step a scenario takes with the kernel goes through `runner.plan` / `runner.launch` /
`runner.guarded`, the checks parity makes (the kernel's exception with its own traceback,
replaced out/lse buffers, written inputs), and each output it compares is first judged against
the float64 reference. A scenario's fixed case carries the scenario's name as its label, so
its id (`determinism-bf16-paged16-...`) is stable, names the scenario, and is what --case-id
and a ledger entry match. `run(name, kernel, case, device)` is the one entry: the pytest door
(door.py) and the isolation worker call it by name.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .cases import Case
from .devices import device_type, profile_of
from .runner import (CaseBuildError, CaseResult, KernelFault, build_checked, guarded, launch, plan, prepare, run_case,
                     verdict_of, yardstick)


@dataclass(frozen=True)
class Scenario:
    name: str
    check: Callable  # (kernel, case, device) -> list of failure lines, filling the CaseResult it is given
    # Fixed cases per profile; each entry lists alternatives, of which a kernel runs the first it can
    # (an fp8-only kernel gets the e4m3 one). None: the case set's cases.
    cases: Optional[Callable[[str], list[tuple[Case, ...]]]] = None
    needs: str = ""  # a Capabilities flag the kernel must declare for the scenario to apply
    gpu_only: str = ""  # why it cannot run on a CPU, when it cannot

    def fixed_cases(self, profile: str) -> list[tuple[Case, ...]]:
        return self.cases(profile) if self.cases is not None else []

    def skip_reason(self, kernel, case: Case, device) -> str:
        """Why `kernel` does not run this scenario on `case` here ('' when it does). Missing
        capabilities for the case itself are the caller's (Capabilities.missing_for)."""
        if self.gpu_only and device_type(device) == "cpu":
            return self.gpu_only
        if self.needs and not getattr(kernel.caps, self.needs):
            return f"{kernel.name} does not declare {self.needs}"
        for group in self.fixed_cases(profile_of(device)):
            if case in group:
                first = next((c for c in group if not kernel.caps.missing_for(c, device_type(device))), None)
                if first is not None and first != case:
                    return f"{kernel.name} runs {first.id} instead"
        return ""

    def run(self, kernel, case: Case, device) -> CaseResult:
        t0 = time.perf_counter()
        res = CaseResult(kernel=kernel.name, case_id=case.id, status="failed", scenario=self.name)
        try:
            failures = self.check(kernel, case, device, res)
        except CaseBuildError as e:
            res.status, res.message = "error", str(e)
        except KernelFault as e:
            res.message = str(e)
        else:
            if isinstance(failures, CaseResult):  # parity's own result
                res = failures
                res.scenario = self.name
            else:
                res.status = "failed" if failures else "passed"
                res.message = "\n".join(failures) if failures else f"{self.name}: passed"
        res.seconds = time.perf_counter() - t0
        return res


# ---- parity --------------------------------------------------------------------------------------

def _parity(kernel, case, device, res):
    return run_case(kernel, case, device)


# ---- CUDA-graph replay ------------------------------------------------------------------------------

GRAPH_MAX_LEN = 131072
# Lengths replayed on one graph captured at GRAPH_MAX_LEN keys per request, per batch size.
GRAPH_REPLAYS = {
    1: [(1,), (7,), (4097,), (32769,), (GRAPH_MAX_LEN,), (0,)],
    4: [(1, 32769, 7, 4096), (0, 0, 300, 0), (GRAPH_MAX_LEN, 1, 0, 65537), (33, 33, 33, 33)],
    16: [tuple([1, 32769, 0, 4096] * 4), tuple(range(1, 16 * 997, 997))],
}


def _graph_cases(profile: str) -> list[tuple[Case, ...]]:
    return [tuple(Case(kv_dtype=dt, num_q_heads=16, num_kv_heads=2, head_dim=128, seq_lens=(GRAPH_MAX_LEN,) * b,
                       page_size=16, label="graph-replay") for dt in ("bf16", "e4m3"))
            for b in sorted(GRAPH_REPLAYS)]


def graph_replays(kernel, case: Case, device) -> tuple[list[Case], list[str]]:
    """The replays of `case`'s graph that `kernel` declares it takes, and a 'not run' line for
    each it excludes by a shape rule (e.g. min_len: sglang's engine never replays a 0-length
    row, it pads with length 1)."""
    run, not_run = [], []
    for i, lens in enumerate(GRAPH_REPLAYS[case.batch]):
        replay_case = case.replace(seq_lens=lens, seed=100 + i)
        missing = kernel.caps.missing_for(replay_case, device_type(device))
        if missing:
            not_run.append(f"replay {replay_case.id} not run: {', '.join(missing)}")
        else:
            run.append(replay_case)
    return run, not_run


def _graph_replay(kernel, case, device, res):
    from .graphs import bitwise_equal, load_scenario, with_fresh_outputs
    cap = prepare(kernel, case, device)
    fn = plan(kernel, cap, "plan at capacity: ")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    def warm_up():  # JIT compilation outside the capture
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)

    guarded(cap, warm_up, "warm-up launch: ")
    graph = torch.cuda.CUDAGraph()

    def capture():
        with torch.cuda.graph(graph):
            fn()

    guarded(cap, capture, "capture: ")
    failures = []
    replays, not_run = graph_replays(kernel, case, device)
    for replay_case in replays:
        view = load_scenario(cap, replay_case, seed=replay_case.seed)
        ref, tier = yardstick(kernel, replay_case, view)
        cap.repoison_outputs()
        guarded(view, graph.replay, f"replay {replay_case.id}: ")
        v = verdict_of(kernel, replay_case, view, ref, tier)
        replayed = with_fresh_outputs(view)
        replayed.out.copy_(view.out)
        replayed.lse.copy_(view.lse)
        cap.repoison_outputs()
        launch(view, fn, f"eager launch {replay_case.id}: ")  # the same plan, on the same buffers
        differs = bitwise_equal(view, replayed, lse=kernel.caps.lse)
        if not v.passed or differs:
            failures.append(f"replay {replay_case.id}: {v.summary()}" + (f"; graph vs eager: {differs}" if differs else ""))
    res.kernel_note = "; ".join(filter(None, [cap.kernel_note] + not_run))
    return failures + (not_run if failures else [])


# ---- determinism --------------------------------------------------------------------------------------

def _determinism_cases(profile: str, label: str) -> list[Case]:
    if profile == "interpreter":
        return [Case("bf16", 4, 1, 64, (300, 0, 77, 1000), page_size=16, seed=5, label=label),
                Case("e4m3", 8, 1, 576, (129, 700), v_head_dim=512, mla=True, page_size=1, seed=6, label=label)]
    return [Case("bf16", 32, 8, 128, (131072, 1, 4097, 0, 65537, 300), page_size=16, seed=5, label=label),
            Case("e4m3", 128, 1, 576, (32769, 7, 16384, 1), v_head_dim=512, mla=True, page_size=64, seed=6,
                 label=label)]


def repeats(device) -> int:
    """20 on a GPU, where races can show; 3 under the interpreter, which runs programs one after
    another (so only plan-to-plan state can differ there)."""
    return 3 if device_type(device) == "cpu" else 20


def _first_judged(kernel, case, device, res):
    """Plan, launch and judge once; the batch and a copy of its output, or the failure lines."""
    from .graphs import with_fresh_outputs
    batch, ref, tier = build_checked(kernel, case, device, phases=res.phases)
    fn = plan(kernel, batch, "first plan: ")
    launch(batch, fn, "first launch: ")
    res.kernel_note = batch.kernel_note
    v = verdict_of(kernel, case, batch, ref, tier)
    res.verdict = v
    if not v.passed:
        return batch, fn, None, [f"first launch: {v.summary()}"]
    first = with_fresh_outputs(batch)
    first.out.copy_(batch.out)
    first.lse.copy_(batch.lse)
    return batch, fn, first, []


def _determinism(kernel, case, device, res):
    from .graphs import bitwise_equal, with_fresh_outputs
    batch, _, first, failures = _first_judged(kernel, case, device, res)
    if failures:
        return failures
    for i in range(repeats(device) - 1):
        again = with_fresh_outputs(batch)
        launch(again, plan(kernel, again, f"plan {i + 2}: "), f"launch {i + 2}: ")
        what = bitwise_equal(again, first, lse=kernel.caps.lse)
        if what:
            return [f"repeat {i + 2} (a new plan on the same inputs) differs from the first run: {what}; the kernel "
                    "declares deterministic"]
    return []


def _same_plan_twice(kernel, case, device, res):
    from .graphs import bitwise_equal
    batch, fn, first, failures = _first_judged(kernel, case, device, res)
    if failures:
        return failures
    batch.repoison_outputs()
    launch(batch, fn, "second launch of the same plan: ")
    what = bitwise_equal(batch, first, lse=kernel.caps.lse)
    return [f"second launch of one plan differs from the first: {what}; the kernel declares cuda_graph_safe (one "
            "plan, launched again, must give the same bits)"] if what else []


# ---- batch invariance -------------------------------------------------------------------------------

INVARIANCE_LEN = {"interpreter": 300, "gpu": 32769}
INVARIANCE_OTHERS = {"interpreter": (77, 513), "gpu": (4097, 131072)}


def _invariance_cases(profile: str) -> list[tuple[Case, ...]]:
    """The request alone: GQA bf16 and fp8 MLA (interpreter-sized head counts on a CPU)."""
    n = INVARIANCE_LEN[profile]
    return [(Case("bf16", 8, 2, 64, (n,), page_size=16, seed=21, label="batch-invariance"),),
            (Case("e4m3", 8, 1, 576, (n,), v_head_dim=512, mla=True, page_size=64, seed=22,
                  label="batch-invariance"),)]


def arrangements(n: int, a: int, b: int) -> dict[str, tuple[tuple[int, ...], int]]:
    """name -> (lengths, index of the request)."""
    return {"first": ((n, a, b), 0), "last": ((a, b, n), 2), "between-padding": ((0, n, 0), 1)}


def _batch_invariance(kernel, case, device, res):
    from .factories import transplant
    from .graphs import bitwise_equal
    alone = prepare(kernel, case, device)
    launch(alone, plan(kernel, alone, "alone: "), "alone: ")
    failures, not_run = [], []
    n = case.seq_lens[0]
    for name, (lens, idx) in arrangements(n, *INVARIANCE_OTHERS[profile_of(device)]).items():
        mixed = case.replace(seq_lens=lens, seed=case.seed + 1)
        missing = kernel.caps.missing_for(mixed, device_type(device))
        if missing:  # a declared shape rule (e.g. min_len: the kernel's engine never batches 0-length rows)
            not_run.append(f"{name} not run: {', '.join(missing)}")
            continue
        batch = prepare(kernel, mixed, device)
        transplant(alone, 0, batch, idx)
        ref, tier = yardstick(kernel, mixed, batch)
        launch(batch, plan(kernel, batch, f"{name}: "), f"{name}: ")
        v = verdict_of(kernel, mixed, batch, ref, tier)
        if not v.passed:
            failures.append(f"the batch {mixed.id} with the request placed {name} (row {idx}), judged whole - "
                            f"its worst row may be another request's: {v.summary()}")
        elif kernel.caps.batch_invariant:
            differs = bitwise_equal(batch, alone, lse=kernel.caps.lse, rows=(idx, 0))
            if differs:
                failures.append(f"the request placed {name} in the batch {mixed.id} (its row {idx}): not bitwise "
                                f"the same as alone ({differs}); the kernel declares batch_invariant")
    res.kernel_note = "; ".join(filter(None, [alone.kernel_note] + not_run))
    return failures + (not_run if failures else [])


# ---- forced split counts ----------------------------------------------------------------------------

SPLITS_LONG = {"interpreter": 1000, "gpu": 65537}


def _splits_cases(profile: str) -> list[tuple[Case, ...]]:
    return [(Case("bf16", 8, 2, 64, (SPLITS_LONG[profile],), page_size=16, seed=11, label="num-splits"),)]


def _num_splits(kernel, case, device, res):
    outs = {}
    for splits in (1, 4):
        r = run_case(kernel, case.replace(num_splits=splits), device, keep_output=True)
        if not r.ok:
            return [f"num_splits={splits}: {r.message}"]
        outs[splits] = r.output
    if outs[1].equal(outs[4]):
        return [f"num_splits=1 and num_splits=4 gave bitwise-identical outputs on a {case.seq_lens[0]}-key request: "
                "the kernel ignores batch.num_splits"]
    return []


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("parity", _parity),
    Scenario("graph-replay", _graph_replay, _graph_cases, needs="cuda_graph_safe", gpu_only="CUDA graphs need a GPU"),
    Scenario("determinism", _determinism, lambda p: [(c,) for c in _determinism_cases(p, "determinism")],
             needs="deterministic"),
    Scenario("same-plan-twice", _same_plan_twice, lambda p: [tuple(_determinism_cases(p, "same-plan-twice"))],
             needs="cuda_graph_safe"),
    Scenario("batch-invariance", _batch_invariance, _invariance_cases),
    Scenario("num-splits", _num_splits, _splits_cases, needs="num_splits"),
)}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"no scenario {name!r}; expected one of {sorted(SCENARIOS)}") from None


def why_not_run(name: str, kernel, case: Case, device) -> str:
    """Why `kernel` does not run `case` in scenario `name` here ('' when it does): the scenario's
    own reason, else every capability the case needs that the kernel lacks. The one answer the
    tests' skips (state.case_marks) and a single case run outside pytest (inspect) both give."""
    why = get(name).skip_reason(kernel, case, device)
    if why:
        return why
    missing = kernel.caps.missing_for(case, device_type(device))
    return f"{kernel.name} lacks: {', '.join(missing)}" if missing else ""


def run(name: str, kernel, case: Case, device) -> CaseResult:
    """The scenario `name` on `kernel` and `case`, in this process."""
    return get(name).run(kernel, case, device)


def fixed_cases(profile: str) -> dict[str, list[Case]]:
    """Every scenario's fixed cases (alternatives flattened), by scenario name."""
    return {n: [c for group in s.fixed_cases(profile) for c in group] for n, s in SCENARIOS.items() if s.cases}


def case_by_id(case_id: str, profile: str) -> Optional[tuple[str, Case]]:
    for name, cases in fixed_cases(profile).items():
        for c in cases:
            if c.id == case_id:
                return name, c
    return None

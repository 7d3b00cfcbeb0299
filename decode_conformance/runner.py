"""Run one kernel on one case and judge it:
build -> reference and tier budget (pristine inputs) -> snapshot -> plan -> launch
-> inputs unchanged? -> verdict.

Everything a kernel can do wrong becomes a failed CaseResult with a message, never an
exception that takes other results down: raising, returning a non-callable from plan,
replacing or reshaping `out`, writing NaN, leaving elements unwritten, writing to its inputs.
"""
from __future__ import annotations

import shlex
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional

import torch

from .batch import DecodeBatch
from .cases import Case
from .factories import build
from .kernel_api import DecodeKernel
from .diagnose import kv_head_misreads
from .metrics import THRESHOLDS, Thresholds, Verdict, judge
from .pristine import InputGuard
from .reference import Reference, TierResult, reference, tier_attention


@dataclass
class CaseResult:
    kernel: str
    case_id: str
    status: str  # passed | failed | error | skipped | xfailed | xpassed | quarantined
    verdict: Optional[Verdict] = None
    message: str = ""
    repro: str = ""
    seconds: float = 0.0
    scenario: str = "parity"
    phases: dict = field(default_factory=dict)  # seconds per step: build, reference, launch, judge
    kernel_note: str = ""  # what the kernel said it chose (DecodeBatch.kernel_note), shown in the report
    worker_log: list = field(default_factory=list)  # the isolation worker's last lines on a crash or hang
    output: Optional[torch.Tensor] = field(default=None, repr=False)  # only when asked for (keep_output)

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "case": self.case_id, "scenario": self.scenario, "status": self.status,
                "message": self.message, "repro": self.repro, "seconds": round(self.seconds, 4),
                "phases": self.phases, "kernel_note": self.kernel_note,
                "verdict": self.verdict.to_dict() if self.verdict else None}


class KernelFault(Exception):
    """What the kernel did wrong in one step (raised, returned no launch, replaced a buffer,
    wrote an input): the case fails with this message."""


class CaseBuildError(Exception):
    """Building a case's tensors or its yardstick failed: the suite's problem, reported per case."""


# How every reproduce line starts. `-p decode_conformance.plugin`: pasted into a shell whose Python
# lacks this package, the line fails naming it ("Error importing plugin "decode_conformance.plugin":
# No module named 'decode_conformance'") instead of with "unrecognized arguments: --kernel=...";
# where the package is installed that is its entry point's own name, so pytest loads it once.
PYTEST_COMMAND = ("python", "-m", "pytest", "-p", "decode_conformance.plugin")


def repro_command(kernel_spec: str, case: Case, case_set: str, device: str, test: str,
                  pyargs: bool = False, ledgers: tuple = (), extra_cases: tuple = ()) -> str:
    """The one-line command that re-runs exactly this case, in the form the run was invoked with:
    `test` names the test function (state.repro_target, _paths.suite_test) as a checkout path
    (`suites/parity/test_parity.py::test_parity`) or, with `pyargs`, as the installed module
    (`decode_conformance.suites.parity.test_parity::test_parity`).
    `python -m pytest`, not `pytest`: it puts the current folder on sys.path (an adopter's
    uninstalled kernel package imports) and runs in the environment whose `python` is first on
    PATH rather than whichever `pytest` script is. `ledgers`: the adopter's ledgers the run read
    (state.RunState.repro_ledgers), as given (relative to where the line is pasted); `extra_cases`:
    the adopter's case files the run read, which a case of theirs needs to be found again."""
    parts = list(PYTEST_COMMAND) + (["--pyargs"] if pyargs else []) + [test, f"--kernel={kernel_spec}",
                                                                      f"--case-set={case_set}", f"--case-id={case.id}"]
    if device != "cpu":
        parts.append(f"--device={device}")
    parts += [f"--ledger={p}" for p in ledgers]
    parts += [f"--extra-cases={p}" for p in extra_cases]
    return " ".join(shlex.quote(p) for p in parts)


def prepare(kernel: DecodeKernel, case: Case, device, seed: Optional[int] = None) -> DecodeBatch:
    """The kernel's view of `case`: tensors, with the window in the kernel's declared convention."""
    batch = build(case, device, seed)
    conv = kernel.caps.window_convention
    batch.window = case.window_in(conv) if (case.window is not None and conv) else None
    return batch


def yardstick(kernel: DecodeKernel, case: Case, batch: DecodeBatch) -> tuple[Reference, TierResult]:
    """The float64 reference and the kernel tier's torch computation, from pristine inputs."""
    return reference(case, batch), tier_attention(case, batch, kernel.caps.fp8_math, kernel.caps.softmax_sum)


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


def _check_outputs(batch: DecodeBatch, out_ref: torch.Tensor, lse_ref: torch.Tensor) -> str:
    if batch.out is not out_ref or batch.lse is not lse_ref:
        what = [f"batch.{name} with {_describe(got)} (suite buffer: {_describe(own)})"
                for name, got, own in (("out", batch.out, out_ref), ("lse", batch.lse, lse_ref)) if got is not own]
        return ("kernel replaced " + " and ".join(what) +
                " instead of writing into the suite-owned buffers")
    return ""


def kernel_traceback(e: BaseException, limit_to_kernel: bool = True) -> str:
    """The exception with its traceback, trimmed to the frames below the suite's own (the
    kernel's code and what it called)."""
    frames = traceback.extract_tb(e.__traceback__)
    if limit_to_kernel:
        own = __file__.rsplit("/", 1)[0]
        while frames and frames[0].filename.startswith(own):
            frames = traceback.StackSummary.from_list(list(frames)[1:])
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(e), e)
    return "".join(lines).rstrip()


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def guarded(batch: DecodeBatch, step, what: str = ""):
    """Run one kernel step (a plan, a launch, a graph replay) under the contract's checks: an
    exception, a replaced out/lse buffer or a changed input raises KernelFault naming it (`what`
    says which step, for scenarios of several). Returns the step's return value."""
    guard = InputGuard(batch.inputs())
    out_buf, lse_buf = batch.out, batch.lse
    _sync(batch.device)
    try:
        value = step()
        _sync(batch.device)
    except Exception as e:
        raise KernelFault(f"{what}kernel raised: {type(e).__name__}: {e}\n  kernel traceback (suite frames "
                          "trimmed):\n" + kernel_traceback(e)) from None
    problem = _check_outputs(batch, out_buf, lse_buf)
    written = guard.changes(batch.inputs())
    if written:
        problem = (problem + "; " if problem else "") + "kernel wrote to its inputs: " + "; ".join(written)
    if problem:
        raise KernelFault(what + problem)
    return value


def plan(kernel: DecodeKernel, batch: DecodeBatch, what: str = ""):
    """kernel.plan(batch) under the contract's checks; the launch it returned."""
    launch = guarded(batch, lambda: kernel.plan(batch), what)
    if not callable(launch):
        raise KernelFault(f"{what}plan() returned {type(launch).__name__}, not a callable: plan(batch) must return "
                          "a zero-argument function that launches the kernel")
    return launch


def launch(batch: DecodeBatch, fn, what: str = "") -> None:
    """One launch of a planned kernel under the contract's checks."""
    guarded(batch, fn, what)


def build_checked(kernel: DecodeKernel, case: Case, device, seed: Optional[int] = None,
                  phases: Optional[dict] = None) -> tuple[DecodeBatch, Reference, TierResult]:
    """The kernel's batch and its yardstick; CaseBuildError when the suite cannot build them."""
    t0 = time.perf_counter()
    try:
        batch = prepare(kernel, case, device, seed)
        t = time.perf_counter()
        ref, tier = yardstick(kernel, case, batch)
    except Exception as e:
        raise CaseBuildError(f"building the case failed: {type(e).__name__}: {e}") from None
    if phases is not None:
        phases["build"] = round(t - t0, 4)
        phases["reference"] = round(time.perf_counter() - t, 4)
    return batch, ref, tier


def verdict_of(kernel: DecodeKernel, case: Case, batch: DecodeBatch, ref: Reference, tier: TierResult,
               thresholds: Optional[Thresholds] = None) -> Verdict:
    """The judge on the batch's current output (the LSE only where the kernel returns one); a
    failure whose rows match another KV head's attention says so (diagnose.py)."""
    verdict = judge(case, batch.out, batch.lse if kernel.caps.lse else None, ref.out, ref.lse, ref.visible,
                    tier.outs, tier.lses, batch.sinks, thresholds, lse_slack=tier.lse_slack)
    if verdict.rows_over:
        note = kv_head_misreads(case, batch, batch.out, ref, tier, (thresholds or THRESHOLDS).budget_ratio)
        if note:
            verdict.failures.append(note)
    return verdict


def run_case(kernel: DecodeKernel, case: Case, device="cpu", seed: Optional[int] = None,
             thresholds: Optional[Thresholds] = None, repro: str = "", keep_output: bool = False) -> CaseResult:
    """The parity check: one plan, one launch, the verdict."""
    t0 = time.perf_counter()
    res = CaseResult(kernel=kernel.name, case_id=case.id, status="failed", repro=repro)
    try:
        batch, ref, tier = build_checked(kernel, case, device, seed, res.phases)
    except CaseBuildError as e:
        res.status, res.message = "error", str(e)
        return res
    res = run_prepared(kernel, case, batch, ref, tier, thresholds=thresholds, keep_output=keep_output, result=res)
    res.seconds = time.perf_counter() - t0
    return res


def run_prepared(kernel: DecodeKernel, case: Case, batch: DecodeBatch, ref: Reference, tier: TierResult,
                 thresholds: Optional[Thresholds] = None, keep_output: bool = False,
                 result: Optional[CaseResult] = None) -> CaseResult:
    """The launch and the verdict on a batch whose yardstick is already computed (from its
    inputs, before any kernel touched them)."""
    t0 = time.perf_counter()
    res = result or CaseResult(kernel=kernel.name, case_id=case.id, status="failed")
    res.status = "failed"
    try:
        launch(batch, plan(kernel, batch))
    except KernelFault as e:
        res.message = str(e)
        return res
    finally:
        res.kernel_note = batch.kernel_note
    t = time.perf_counter()
    res.phases["launch"] = round(t - t0, 4)
    verdict = verdict_of(kernel, case, batch, ref, tier, thresholds)
    res.phases["judge"] = round(time.perf_counter() - t, 4)
    if keep_output:
        res.output = batch.out.detach().cpu().clone()
    res.verdict = verdict
    res.status = "passed" if verdict.passed else "failed"
    res.message = verdict.summary()
    return res


def failure_text(res: CaseResult, case: Case) -> str:
    lines = [f"[{res.kernel}] {res.case_id}: {res.message}"]
    if case.note:
        lines.append(f"  why this case exists: {case.note}")
    lines.append(f"  seed={case.seed}")
    if res.repro:
        lines.append(f"  reproduce: {res.repro}")
    if res.worker_log:  # set by the isolation worker on a crash or hang
        lines.append("  isolation worker output (last lines):")
        lines += [f"    {ln}" for ln in res.worker_log]
    return "\n".join(lines)

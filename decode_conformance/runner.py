"""Run one kernel on one case and judge it: build -> plan -> launch -> reference -> verdict.

Everything a kernel can do wrong becomes a failed CaseResult with a message, never an
exception that takes other results down: raising, replacing or reshaping `out`, writing
NaN, leaving elements unwritten.
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
from .metrics import Thresholds, Verdict, judge
from .reference import Reference, low_precision_attention, reference


@dataclass
class CaseResult:
    kernel: str
    case_id: str
    status: str  # passed | failed | error | skipped | xfailed | xpassed | quarantined
    verdict: Optional[Verdict] = None
    message: str = ""
    repro: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "case": self.case_id, "status": self.status, "message": self.message,
                "repro": self.repro, "seconds": round(self.seconds, 4),
                "verdict": self.verdict.to_dict() if self.verdict else None}


def repro_command(kernel_spec: str, case: Case, case_set: str, device: str, suite: str = "suites/parity") -> str:
    parts = ["pytest", suite, f"--kernel={kernel_spec}", f"--case-set={case_set}", f"--case-id={case.id}"]
    if device != "cpu":
        parts.append(f"--device={device}")
    return " ".join(shlex.quote(p) for p in parts)


def prepare(kernel: DecodeKernel, case: Case, device, seed: Optional[int] = None) -> DecodeBatch:
    batch = build(case, device, seed)
    conv = kernel.caps.window_convention
    batch.window = case.window_in(conv) if (case.window is not None and conv) else None
    return batch


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


def _check_outputs(kernel: DecodeKernel, batch: DecodeBatch, out_ref: torch.Tensor, lse_ref: torch.Tensor) -> str:
    if batch.out is not out_ref or batch.lse is not lse_ref:
        what = [f"batch.{name} with {_describe(got)} (suite buffer: {_describe(own)})"
                for name, got, own in (("out", batch.out, out_ref), ("lse", batch.lse, lse_ref)) if got is not own]
        return ("kernel replaced " + " and ".join(what) +
                " instead of writing into the suite-owned buffers")
    return ""


def run_case(kernel: DecodeKernel, case: Case, device="cpu", seed: Optional[int] = None,
             thresholds: Optional[Thresholds] = None, ref: Optional[Reference] = None,
             repro: str = "") -> CaseResult:
    t0 = time.perf_counter()
    res = CaseResult(kernel=kernel.name, case_id=case.id, status="failed", repro=repro)
    try:
        batch = prepare(kernel, case, device, seed)
    except Exception as e:  # a factory bug is the suite's, but report it per case
        res.status, res.message = "error", f"building the case failed: {type(e).__name__}: {e}"
        return res
    out_buf, lse_buf = batch.out, batch.lse
    try:
        launch = kernel.plan(batch)
        launch()
        if batch.device.type == "cuda":
            torch.cuda.synchronize(batch.device)
    except Exception as e:
        tb = traceback.format_exception_only(type(e), e)[-1].strip()
        res.message = f"kernel raised: {tb}"
        res.seconds = time.perf_counter() - t0
        return res
    problem = _check_outputs(kernel, batch, out_buf, lse_buf)
    if problem:
        res.message = problem
        res.seconds = time.perf_counter() - t0
        return res
    ref = ref if ref is not None else reference(batch)
    budget = low_precision_attention(batch)
    verdict = judge(case, batch.out, batch.lse if kernel.caps.lse else None, ref.out, ref.lse, ref.visible,
                    budget, thresholds)
    res.verdict = verdict
    res.status = "passed" if verdict.passed else "failed"
    res.message = verdict.summary()
    res.seconds = time.perf_counter() - t0
    return res


def failure_text(res: CaseResult, case: Case) -> str:
    lines = [f"[{res.kernel}] {res.case_id}: {res.message}"]
    if case.note:
        lines.append(f"  why this case exists: {case.note}")
    lines.append(f"  seed={case.seed}")
    if res.repro:
        lines.append(f"  reproduce: {res.repro}")
    log = res.extra.get("worker_log")
    if log:  # set by the isolation worker on a crash or hang
        lines.append("  isolation worker output (last lines):")
        lines += [f"    {ln}" for ln in log]
    return "\n".join(lines)

"""Closeness measures, the per-dtype threshold table, and the verdict on one kernel output.

A case passes only when every check holds (design principle 4):
  finite      no NaN/Inf anywhere; rows with no visible key are exactly zero
  cosine      global cosine similarity against the float64 reference
  row         per-(request, head) max error <= atol + rtol * max|ref row|, so one broken
              row cannot hide behind a good global cosine (flashinfer #3864)
  budget      max error <= ratio x the error of plain torch in the case dtype (+ one
              output ulp), i.e. the kernel is as accurate as the dtype allows
  lse         natural-log LSE within atol + rtol*|lse| where the kernel returns it
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from .cases import Case


@dataclass(frozen=True)
class Thresholds:
    cosine_min: float
    row_atol: float
    row_rtol: float
    budget_ratio: float
    lse_atol: float
    lse_rtol: float


# One table. fp8 is judged against the dequantized cache, so its numbers measure kernel
# error and sit near bf16's; anchors: flashinfer bf16 1e-2, vLLM bf16 1.5e-2/1e-2,
# FlashAttention 2x (3x with a KV cache) its low-precision reference, sglang cos > 0.999.
THRESHOLDS: dict[str, Thresholds] = {
    "bf16": Thresholds(cosine_min=0.9995, row_atol=1e-2, row_rtol=2e-2, budget_ratio=3.0, lse_atol=2e-3, lse_rtol=1e-5),
    "fp16": Thresholds(cosine_min=0.99995, row_atol=2e-3, row_rtol=4e-3, budget_ratio=3.0, lse_atol=2e-3, lse_rtol=1e-5),
    "e4m3": Thresholds(cosine_min=0.9995, row_atol=1e-2, row_rtol=2e-2, budget_ratio=3.0, lse_atol=2e-3, lse_rtol=1e-5),
    "e5m2": Thresholds(cosine_min=0.9995, row_atol=1e-2, row_rtol=2e-2, budget_ratio=3.0, lse_atol=2e-3, lse_rtol=1e-5),
}


@dataclass
class Verdict:
    passed: bool
    failures: list[str] = field(default_factory=list)
    cosine: float = float("nan")
    worst_row_err: float = float("nan")
    worst_row: Optional[tuple[int, int]] = None
    budget_ratio: float = float("nan")
    lse_err: float = float("nan")
    nonfinite: int = 0

    def summary(self) -> str:
        head = "PASS" if self.passed else "FAIL: " + "; ".join(self.failures)
        return (f"{head} | cosine={self.cosine:.6f} worst_row_err={self.worst_row_err:.3g} at {self.worst_row} "
                f"budget_ratio={self.budget_ratio:.3g} lse_err={self.lse_err:.3g} nonfinite={self.nonfinite}")

    def to_dict(self) -> dict:
        return {
            "passed": self.passed, "failures": list(self.failures), "cosine": _num(self.cosine),
            "worst_row_err": _num(self.worst_row_err), "worst_row": self.worst_row,
            "budget_ratio": _num(self.budget_ratio), "lse_err": _num(self.lse_err), "nonfinite": self.nonfinite,
        }


def _num(x: float):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    na, nb = a.norm(), b.norm()
    if float(na) == 0.0 and float(nb) == 0.0:
        return 1.0
    if float(na) == 0.0 or float(nb) == 0.0:
        return 0.0
    return float((a @ b) / (na * nb))


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _ulp(dtype: torch.dtype, magnitude: float) -> float:
    """Spacing of `dtype` at `magnitude` (the output rounding floor)."""
    eps = torch.finfo(dtype).eps
    return eps * max(magnitude, torch.finfo(dtype).tiny)


def judge(case: Case, out: torch.Tensor, lse: Optional[torch.Tensor], ref_out: torch.Tensor,
          ref_lse: torch.Tensor, visible: torch.Tensor, budget_out: Optional[torch.Tensor],
          thresholds: Optional[Thresholds] = None) -> Verdict:
    th = thresholds or THRESHOLDS[case.kv_dtype]
    v = Verdict(passed=True)
    o = out.detach().double().cpu()
    r = ref_out.detach().double().cpu()
    vis = visible.cpu() > 0

    finite = torch.isfinite(o)
    v.nonfinite = int((~finite).sum())
    if v.nonfinite:
        v.failures.append(f"{v.nonfinite} non-finite output elements")
    empty_rows = ~vis
    if bool(empty_rows.any()):
        bad = o[empty_rows]
        if not bool((bad == 0).all()):
            v.failures.append("rows with no visible key must be exactly zero (CUDA-graph padding rows)")

    o_safe = torch.where(finite, o, torch.zeros_like(o))
    rows_o, rows_r = o_safe[vis], r[vis]
    if rows_r.numel():
        v.cosine = cosine(rows_o, rows_r)
        if not v.nonfinite and v.cosine < th.cosine_min:
            v.failures.append(f"cosine {v.cosine:.6f} < {th.cosine_min}")
        err = (o_safe - r).abs()
        err[~finite] = float("inf")
        row_err = err.amax(-1)  # [B, Hq]
        row_ref = r.abs().amax(-1)
        row_tol = th.row_atol + th.row_rtol * row_ref
        excess = torch.where(vis[:, None], row_err / row_tol, torch.zeros_like(row_err))
        b, h = divmod(int(excess.argmax()), excess.shape[1])
        v.worst_row, v.worst_row_err = (b, h), float(row_err[b, h])
        if float(excess[b, h]) > 1.0:
            n_bad = int((excess > 1.0).sum())
            v.failures.append(f"{n_bad} (request, head) rows over tolerance; worst (b={b}, h={h}) "
                              f"err {v.worst_row_err:.3g} > {float(row_tol[b, h]):.3g}")
        if budget_out is not None:
            max_err = float(err[vis].max())
            ref_err = float((budget_out.detach().double().cpu() - r)[vis].abs().max())
            floor = _ulp(case.q_dtype, float(r[vis].abs().max()))
            v.budget_ratio = max_err / max(ref_err, floor)
            if max_err > th.budget_ratio * ref_err + floor:
                v.failures.append(f"max error {max_err:.3g} > {th.budget_ratio:g} x torch-{_short(case.q_dtype)} error "
                                  f"{ref_err:.3g} (+{floor:.2g})")
    if lse is not None:
        lz = lse.detach().double().cpu()
        rl = ref_lse.detach().double().cpu()
        lz_v, rl_v = lz[vis], rl[vis]
        if lz_v.numel():
            if not bool(torch.isfinite(lz_v).all()):
                v.failures.append("non-finite LSE on a row with visible keys")
                v.lse_err = float("inf")
            else:
                e = (lz_v - rl_v).abs()
                v.lse_err = float(e.max())
                tol = th.lse_atol + th.lse_rtol * rl_v.abs()
                if bool((e > tol).any()):
                    v.failures.append(f"LSE error {v.lse_err:.3g} over tolerance (natural log expected)")
    v.passed = not v.failures
    return v

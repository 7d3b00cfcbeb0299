"""The verdict on one kernel output: every (request, head) row judged against its own budget.

A case passes only when every check holds (design principle 4):
  finite      no NaN/Inf anywhere in the output
  empty rows  rows with no visible key are exact zeros, and their LSE is -inf (or the sink)
  rows        each row's error is within a budget derived from that row (below)
  lse         natural-log LSE within a budget of its own per row (below), where the kernel returns it

The row budget. For row (b, h) with float64 reference r, the kernel's output o and the
output t of the same attention computed by torch the way the kernel's declared precision
tier computes it (`reference.tier_attention`: the query dtype, or fp8 q and P), both

    ||o - r||_2   <= R * ||t - r||_2   + 0.5 * ||ulp(r)||_2 + sqrt(n) * eps32 * ||r||_2
    max|o - r|    <= R * max|t - r|    + ulp(max|r|)

(where the tier's rounding can legitimately land on several grids - P quantized against a
tile's running max - t ranges over several realizations and the largest error counts)

must hold, n being the row's visible keys. So a kernel is as accurate as its declared
arithmetic allows on *that* row, whatever the other rows look like: an error confined to
the long requests of a mixed batch, or to one head (flashinfer #3864), fails its own rows.
Where the tier's own error is near zero (a 1-key row returns a stored value) the floor is
the row's own rounding: half an ulp of each element in the output dtype (what a correctly
rounded result may be off by), one ulp for the largest, plus fp32 accumulation over n keys.
R = 3: FlashAttention holds its kernels to 2x (3x on KV-cache paths) the error of a
reordered low-precision reference; a kernel computing in fp32 and rounding once lands
well under 1x on the rows measured here.

The LSE budget. A natural-log LSE feeds every split merge and cascade that consumes it as a
weight exp(lse_a - lse_b): an LSE off by d scales that weight by e^d, so +1e-3 is a 0.1 %
error in every merge. Per row, with l the float64 reference LSE and lt the tier's own
(`reference.tier_attention`: fp32 scores, exponentials, sum and log on the query-dtype
inputs, or with q in fp8 for FP8_Q_AND_P), a kernel's LSE must satisfy

    |lse - l|  <=  R * |lt - l|  +  2 ulp32(|l|)  +  g(n) u  +  S

The first term is what the declared arithmetic costs on that row (the same R as the output).
The rest is a first-order bound of fp32 rounding, for the rows where that cost happens to be
near zero, derived from the operations, never measured (u = eps32 / 2):
  2 ulp32(|l|)  up to four roundings of an |l|-sized value, half an ulp each: the score times
                log2 e (exp2-based kernels), m + log2 Z, the product with ln 2, the store;
  g(n) u        Z = sum of n positive terms: a relative error e in Z is an absolute e in ln Z.
                Tiled kernels sum in blocks (tl.sum over a tile, tiles and splits in order),
                bounded by (b + n/b) u for blocks of b >= 16 (Higham, Accuracy and Stability
                of Numerical Algorithms, 2nd ed., 4.2), plus an ulp for each exponential and
                one for the log: g(n) = 16 + ceil(n / 16) + 2;
  S             the scores' own rounding (reference.score_rounding_bound): d lse / d s_p = P_p,
                and each fp32 score of Dk exact products is bounded the same blockwise way.
So a 300-key bf16 row of head dim 64 allows a few 1e-6 plus its own fp32 error, 128k keys
~5e-4. The constant 2e-3 this replaces was hundreds of times the floor of a short row, and
let an LSE off by +1e-3 (a 0.1 % weight error) pass every case.

The global cosine is reported as a summary, never a gate: short rows dominate it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from .cases import Case

BUDGET_RATIO = 3.0
EPS32 = torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class Thresholds:
    budget_ratio: float = BUDGET_RATIO  # R above, for the output and the LSE


THRESHOLDS = Thresholds()


@dataclass
class Verdict:
    passed: bool
    failures: list[str] = field(default_factory=list)
    cosine: float = float("nan")  # summary only
    worst_row: Optional[tuple[int, int]] = None
    worst_row_ratio: float = float("nan")  # the worst row's error over its budget (> 1 fails)
    worst_row_err: float = float("nan")  # its L2 error
    rows_over: int = 0
    lse_err: float = float("nan")
    lse_ratio: float = float("nan")  # the worst row's LSE error over its budget (> 1 fails): lse_err's scale
    nonfinite: int = 0

    def summary(self) -> str:
        head = "PASS" if self.passed else "FAIL: " + "; ".join(self.failures)
        return (f"{head} | worst row {self.worst_row} at {_times(self.worst_row_ratio)}x its budget "
                f"(L2 err {self.worst_row_err:.3g}), cosine={self.cosine:.6f} lse_err={self.lse_err:.3g}"
                + (f" ({_times(self.lse_ratio)}x its budget)" if math.isfinite(self.lse_ratio) else "")
                + f" nonfinite_out={self.nonfinite}")  # output elements; a non-finite LSE is said above

    def to_dict(self) -> dict:
        return {
            "passed": self.passed, "failures": list(self.failures), "cosine": _num(self.cosine),
            "worst_row": list(self.worst_row) if self.worst_row else None,
            "worst_row_ratio": _num(self.worst_row_ratio), "worst_row_err": _num(self.worst_row_err),
            "rows_over": self.rows_over, "lse_err": _num(self.lse_err), "lse_ratio": _num(self.lse_ratio),
            "nonfinite": self.nonfinite,
        }


def _num(x: float):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _times(ratio: float) -> str:
    """A ratio to a budget, with the digits that keep one over the budget from reading as 1x."""
    text = f"{ratio:.3g}"
    return f"{ratio:.6g}" if ratio > 1.0 and float(text) <= 1.0 else text


def _keys(visible: int, length: int) -> str:
    """A row's keys as the kernel had to read them: a window shows fewer than the request holds."""
    return f"{length} keys" if visible == length else f"{visible} visible of {length} keys"


def _requests(rows: torch.Tensor, shown: int = 8) -> str:
    """The indices of a [B] mask's true rows, the first `shown` of them."""
    idx = rows.nonzero().flatten().tolist()
    return ", ".join(map(str, idx[:shown])) + (f" (+{len(idx) - shown} more)" if len(idx) > shown else "")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    na, nb = a.norm(), b.norm()
    if float(na) == 0.0 and float(nb) == 0.0:
        return 1.0
    if float(na) == 0.0 or float(nb) == 0.0:
        return 0.0
    return float((a @ b) / (na * nb))


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Elementwise spacing of `dtype` at |x| (float64): 2^(floor(log2|x|) - mantissa bits),
    never below the dtype's smallest subnormal step."""
    fi = torch.finfo(dtype)
    mant = round(-math.log2(fi.eps))
    ax = x.abs().clamp_min(fi.tiny)
    return torch.exp2(torch.floor(torch.log2(ax)) - mant).clamp_min(fi.tiny * fi.eps)


@dataclass
class RowBudget:
    """Per-row allowances [B, Hq] (float64, on the device of the reference)."""
    l2: torch.Tensor
    max: torch.Tensor


def row_budget(ref_out: torch.Tensor, tier_out, visible: torch.Tensor, out_dtype: torch.dtype,
               ratio: float = BUDGET_RATIO) -> RowBudget:
    """tier_out: the tier's torch output, or a sequence of equally valid realizations of it
    (reference.TierResult.outs): each row is allowed R x the largest of their errors."""
    r = ref_out.double()
    outs = tier_out if isinstance(tier_out, (tuple, list)) else (tier_out,)
    errs = [(t.to(r.device).double() - r).abs() for t in outs]
    t_l2 = torch.stack([e.norm(dim=-1) for e in errs]).amax(0)
    t_max = torch.stack([e.amax(-1) for e in errs]).amax(0)
    u = ulp(r, out_dtype)
    n = visible.to(r.device, torch.float64)[:, None]
    l2 = ratio * t_l2 + 0.5 * u.norm(dim=-1) + n.sqrt() * EPS32 * r.norm(dim=-1)
    mx = ratio * t_max + ulp(r.abs().amax(-1), out_dtype)
    return RowBudget(l2=l2, max=mx)


def blocked_sum_terms(n):
    """(b + n/b) at b = 16: the blocked-summation error bound of n terms, in units of u."""
    return 16 + torch.ceil(n / 16) if isinstance(n, torch.Tensor) else 16 + -(-n // 16)


def lse_budget(ref_lse: torch.Tensor, tier_lse, visible: torch.Tensor,
               ratio: float = BUDGET_RATIO, slack: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[B, Hq] float64 allowance on |lse - ref_lse| (the LSE budget above). tier_lse: the tier's
    LSE, or a sequence of equally valid realizations of it (reference.TierResult.lses): each row
    is allowed R x the largest of their errors. slack: the score rounding bound
    (reference.TierResult.lse_slack). tier_lse None or empty (a hand-built TierResult) leaves
    the floor alone."""
    r = ref_lse.double()
    finite = torch.isfinite(r)
    mag = torch.where(finite, r.abs(), torch.zeros_like(r))
    n = visible.to(r.device, torch.float64)[:, None].expand_as(r)
    floor = 2.0 * ulp(mag, torch.float32) + (blocked_sum_terms(n) + 2.0) * (EPS32 / 2)
    if slack is not None:
        floor = floor + slack.to(r.device).double()
    lses = tier_lse if isinstance(tier_lse, (tuple, list)) else (() if tier_lse is None else (tier_lse,))
    if not lses:
        return floor
    own = torch.zeros_like(r)
    for t in lses:
        t = t.to(r.device).double()
        own = torch.maximum(own, torch.where(finite & torch.isfinite(t), (t - r).abs(), torch.zeros_like(r)))
    return ratio * own + floor


def row_excess(out: torch.Tensor, ref_out: torch.Tensor, budget: RowBudget) -> tuple[torch.Tensor, torch.Tensor]:
    """(error over budget per row, L2 error per row); non-finite outputs count as infinite."""
    o, r = out.double(), ref_out.double()
    err = (o - r).abs()
    err = torch.where(torch.isfinite(o), err, torch.full_like(err, float("inf")))
    l2 = err.norm(dim=-1)
    excess = torch.maximum(l2 / budget.l2.clamp_min(1e-300), err.amax(-1) / budget.max.clamp_min(1e-300))
    return excess, l2


def judge(case: Case, out: torch.Tensor, lse: Optional[torch.Tensor], ref_out: torch.Tensor, ref_lse: torch.Tensor,
          visible: torch.Tensor, tier_out, tier_lse=None,
          sinks: Optional[torch.Tensor] = None, thresholds: Optional[Thresholds] = None,
          lse_slack: Optional[torch.Tensor] = None) -> Verdict:
    """Everything stays on the tensors' device; only scalars reach the host."""
    th = thresholds or THRESHOLDS
    v = Verdict(passed=True)
    dev = ref_out.device
    o = out.detach().to(dev)
    vis = visible.to(dev) > 0  # [B]
    finite = torch.isfinite(o)
    v.nonfinite = int((~finite).sum())
    if v.nonfinite:
        v.failures.append(f"{v.nonfinite} non-finite output elements")
    empty = ~vis
    if bool(empty.any()):
        nonzero = (o != 0).flatten(1).any(-1) & empty
        if bool(nonzero.any()):
            v.failures.append("rows with no visible key must be exactly zero (CUDA-graph padding rows); got "
                              f"{int((o[empty] != 0).sum())} non-zero elements, in request(s) {_requests(nonzero)}")
    if bool(vis.any()):
        v.cosine = cosine(torch.where(finite, o.double(), 0.0)[vis], ref_out[vis])
        budget = row_budget(ref_out, tier_out, visible, case.q_dtype, th.budget_ratio)
        unusable = vis[:, None] & ~(torch.isfinite(budget.l2) & torch.isfinite(budget.max))
        if bool(unusable.any()):
            # NaN > 1 is False: such a row would pass whatever the kernel wrote. Not the kernel's
            # fault, so not a FAIL either: an error that stops this case.
            b, h = divmod(int(unusable.flatten().nonzero()[0]), unusable.shape[1])
            raise ValueError(f"{case.id}: the error budget of {int(unusable.sum())} (request, head) rows is not finite "
                             f"(first: b={b}, h={h}), so they cannot be judged: the tier's torch realization "
                             "overflowed. A decode-conformance bug, not the kernel's; please report it with this case id")
        excess, l2 = row_excess(o, ref_out, budget)
        excess = torch.where(vis[:, None], excess, torch.zeros_like(excess))
        flat = int(excess.argmax())
        b, h = divmod(flat, excess.shape[1])
        v.worst_row, v.worst_row_ratio, v.worst_row_err = (b, h), float(excess[b, h]), float(l2[b, h])
        v.rows_over = int((excess > 1.0).sum())
        if v.rows_over:
            v.failures.append(
                f"{v.rows_over} of {int(vis.sum()) * excess.shape[1]} (request, head) rows over their error budget; "
                f"worst (b={b}, h={h}, {_keys(int(visible[b]), case.seq_lens[b])}): L2 error {v.worst_row_err:.3g} "
                f"is {_times(v.worst_row_ratio)}x its budget ({th.budget_ratio:g}x the torch error of that row + its ulp floor)")
    if lse is not None:
        _judge_lse(case, v, lse.detach().to(dev), ref_lse, visible.to(dev), vis, tier_lse, lse_slack, sinks, th)
    v.passed = not v.failures
    return v


def _judge_lse(case, v: Verdict, lse, ref_lse, visible, vis, tier_lse, slack, sinks, th: Thresholds) -> None:
    lz, rl = lse.double(), ref_lse.double()
    allow = lse_budget(rl, tier_lse, visible, th.budget_ratio, slack)
    if bool(vis.any()):
        lz_v, rl_v = lz[vis], rl[vis]
        if not bool(torch.isfinite(lz_v).all()):
            v.failures.append("non-finite LSE on a row with visible keys")
            v.lse_err = float("inf")
        else:
            e = (lz_v - rl_v).abs()
            v.lse_err = float(e.max())
            ratio = e / allow[vis].clamp_min(1e-300)
            v.lse_ratio = float(ratio.max())
            over = ratio > 1.0
            if bool(over.any()):
                worst = int(ratio.argmax())
                rows = vis.nonzero().flatten()
                b = int(rows[worst // lz.shape[1]])
                h = worst % lz.shape[1]
                v.failures.append(
                    f"{int(over.sum())} of {int(vis.sum()) * lz.shape[1]} rows' LSE over budget; worst (b={b}, h={h}): "
                    f"off by {float(e.flatten()[worst]):.3g} (natural log), {_times(float(ratio.flatten()[worst]))}x its "
                    f"budget {float(allow[vis].flatten()[worst]):.3g} ({th.budget_ratio:g}x the tier's own LSE error "
                    "of that row + its fp32 rounding floor)")
    empty = ~vis
    if bool(empty.any()):
        if sinks is None:
            wrong = ~torch.isneginf(lz)
            want = "-inf"
        else:
            expect = sinks.to(lz.device).double()[None, :].expand_as(lz)
            wrong = ~((lz - expect).abs() <= allow)
            want = "the sink's logit"
        wrong_rows = wrong.any(-1) & empty
        if bool(wrong_rows.any()):
            first = int(wrong_rows.nonzero()[0])
            v.failures.append(f"LSE of rows with no visible key must be {want}; request(s) {_requests(wrong_rows)} "
                              f"are not (b={first}: {lz[first][:4].tolist()}{' ...' if lz.shape[1] > 4 else ''})")

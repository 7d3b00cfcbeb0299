"""What a failed verdict's rows match, where that names the bug.

A kernel that maps query heads to KV heads wrongly computes correct attention over the wrong
keys and values: its rows miss the reference by far, yet each one matches the reference of
another KV head to within its own budget. sglang 0.5.23's grouped decode does this at a group of
29 (docs/conformance-matrix.md, triage): its 16-head tiles straddle two groups. Saying so in the
failure turns "84 of 232 heads over budget" into "heads 29-31 read KV head 0, not 1".

Runs only on a verdict with rows over budget and a case with more than one KV head; costs one
reference pass per KV head, on the failure path alone. It reads the inputs after the launch: a
kernel that wrote them has already failed for that (runner.guarded), before any verdict.
"""
from __future__ import annotations

from typing import Optional

import torch

from .batch import DecodeBatch
from .cases import Case
from .metrics import BUDGET_RATIO, row_budget, row_excess
from .reference import Reference, TierResult, reference

LISTED_PAIRS = 4  # (head range, KV head read) groups named in the message; the rest are counted


class _OneKvHead:
    """`batch` seen through one KV head: every query head attends with KV head `j`."""

    def __init__(self, batch: DecodeBatch, j: int):
        self._batch, self._j = batch, j
        self.q, self.sinks, self.device = batch.q, batch.sinks, batch.device
        self.kv_indptr, self.kv_indices = batch.kv_indptr, batch.kv_indices

    def k_slots(self) -> torch.Tensor:
        return self._batch.k_slots()[:, self._j:self._j + 1]

    def v_slots(self) -> torch.Tensor:
        return self._batch.v_slots()[:, self._j:self._j + 1]


def _ranges(heads: list[int]) -> str:
    out, start = [], heads[0]
    for prev, h in zip(heads, heads[1:] + [None]):
        if h != prev + 1:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = h
    return ", ".join(out)


def kv_head_misreads(case: Case, batch: DecodeBatch, out: torch.Tensor, ref: Reference,
                     tier: TierResult, ratio: float = BUDGET_RATIO) -> Optional[str]:
    """A sentence naming the query heads whose rows over budget are, within that budget, attention
    over another KV head; None when no such row (or one KV head only)."""
    if case.num_kv_heads < 2:
        return None
    o = out.detach().to(ref.out.device)
    budget = row_budget(ref.out, tier.outs, ref.visible, case.q_dtype, ratio)
    excess, _ = row_excess(o, ref.out, budget)
    over = (excess > 1.0) & (ref.visible > 0)[:, None]
    if not bool(over.any()):
        return None
    try:
        one_head = case.replace(num_kv_heads=1)
    except ValueError:  # a case whose other fields need its KV heads: no diagnosis, the failure stands
        return None
    read = torch.full_like(excess, -1, dtype=torch.long)  # the KV head a row matches; -1: none
    for j in range(case.num_kv_heads):
        alt, _ = row_excess(o, reference(one_head, _OneKvHead(batch, j)).out, budget)
        read = torch.where(over & (read < 0) & (alt <= 1.0), torch.full_like(read, j), read)
    own = torch.arange(case.num_q_heads, device=read.device) // case.group
    misread = over & (read >= 0) & (read != own[None, :])
    if not bool(misread.any()):
        return None
    pairs: dict[tuple[int, int], set[int]] = {}
    for b, h in misread.nonzero().tolist():
        pairs.setdefault((int(own[h]), int(read[b, h])), set()).add(h)
    named = [f"heads {_ranges(sorted(hs))} (KV head {mine}) read KV head {theirs}"
             for (mine, theirs), hs in sorted(pairs.items(), key=lambda p: min(p[1]))[:LISTED_PAIRS]]
    more = f"; {len(pairs) - LISTED_PAIRS} more such groups" if len(pairs) > LISTED_PAIRS else ""
    return (f"{int(misread.sum())} of the {int(over.sum())} rows over budget match another KV head's attention "
            f"within their budget - a query-head to KV-head mapping error: {'; '.join(named)}{more}")

"""Candidate chunk rules, as kernels: timed beside the shipped rule in one process, no tree carried.

    python benchmarks/peer_table.py --out DIR --kernel adaptive_split \
        --kernel benchmarks.rule_candidates:pps4_budget66 --kernel benchmarks.rule_candidates:pps4_budget82

Each candidate is `adaptive_split` with another `chunk_budget` (the chunk budget and the occupancy
count the device's per-request cap is computed from); the kernels and their launches are the shipped
ones. Nothing here is shipped: a candidate that wins is moved into `kernels/split_rule.py`.

The candidates, from the chunks sweep of docs/gpu-runs/2026-12-04-h200-s27: at 32/8/128,
batch 8-32, the fastest 64-key count was at every cell the occupancy count for 4 stage-1 programs per
SM with no wave-fill raise (8, 4, 2 and 2 chunks against the rule's 10, 5, 10 and 5), 0.1-8.4 %
faster. Interleaved with the shipped rule in one process (s27-3), the first candidate below ran
b1-32k 2.7 % faster and b4-ragged 1.5 % slower: its long request's share of a budget of 66 chunks
(4 per SM) is 43 chunks, against 54 of 82. The candidates, for the 16-bit 4-warp class only (head dims
up to 128, 2-byte caches, not MLA; the 8-warp and fp8 rows keep their measured raise):
  - pps4_budget66: occupancy and budget both for 4 programs per SM;
  - pps4_budget82: occupancy for 4, the budget (a ragged request's share) for the rule's 5;
  - pps4_budget66_shipped_below2: pps4_budget66 where 4 per SM give 2 chunks or more, the shipped
    counts from batch 40 on.
The first two keep the rule's raise of a count of 1, at 4 per SM: at 32/8/128 batch 48 that is 4 chunks
where the shipped rule keeps 1, and session 27's sweep timed 4 there 8-15 % slower
(docs/gpu-runs/2026-12-05-h200-s30: why no candidate is shipped yet; sweep batch 36-60 before one is).
"""
from __future__ import annotations

from decode_conformance_kernels import split_rule, triton_common as tc
from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel

CANDIDATE_PROGRAMS_PER_SM = 4


def occupancy_without_raise(batch: int, kv_head_tiles: int, num_sms: int, max_splits: int, programs_per_sm: int,
                            below_two_programs_per_sm: int | None = None) -> int:
    """floor(slots / (batch x tiles)) in [1, max_splits], kept as it is from 2 up. Below 2: with
    `below_two_programs_per_sm`, the same count at that many programs per SM; else the rule's own
    count (`split_rule.occupancy_splits`: a count of 1 raised to 3 or 4 only from a wave under
    WAVE_FILL)."""
    floor_count = max(1, min(max_splits, programs_per_sm * num_sms // (batch * kv_head_tiles)))
    if floor_count >= 2:
        return floor_count
    if below_two_programs_per_sm and below_two_programs_per_sm != programs_per_sm:
        return occupancy_without_raise(batch, kv_head_tiles, num_sms, max_splits, below_two_programs_per_sm)
    return split_rule.occupancy_splits(batch, kv_head_tiles, num_sms, max_splits, programs_per_sm)


def in_candidate_class(batch) -> bool:
    """The launch-config row the candidates are for: 4-warp programs on a 16-bit cache."""
    return (not batch.v_from_k and batch.head_dim <= split_rule.WIDE_HEAD_DIM
            and batch.k_cache.element_size() == 2)


class FourPerSmRule(AdaptiveSplitKernel):
    """adaptive_split with the occupancy count for CANDIDATE_PROGRAMS_PER_SM programs per SM, not
    raised from 2 or more (a count of 1 keeps the rule's treatment, `occupancy_without_raise`), and a
    budget sized for `budget_programs_per_sm` (4 or the rule's 5), in the candidate class; the
    shipped rule elsewhere, and wherever the batch or the adapter fixes or caps the budget."""

    def __init__(self, budget_programs_per_sm: int, below_two_programs_per_sm: int | None = None, **kw):
        super().__init__(**kw)
        self.budget_programs_per_sm = budget_programs_per_sm
        self.below_two_programs_per_sm = below_two_programs_per_sm
        self.name = (f"adaptive_pps{CANDIDATE_PROGRAMS_PER_SM}_budget{budget_programs_per_sm}"
                     + (f"_below2pps{below_two_programs_per_sm}" if below_two_programs_per_sm else ""))

    def chunk_budget(self, batch) -> tuple[int, int]:
        if self.chunks or batch.num_splits or self.max_splits or not in_candidate_class(batch):
            return super().chunk_budget(batch)
        tiles = tc.head_tiling(batch.num_q_heads, batch.num_kv_heads)["kv_head_tiles"]
        sms = self.num_sms if self.num_sms is not None else split_rule.num_sms(batch.device)
        budget = split_rule.grid_splits(batch.batch_size, tiles, sms, split_rule.MAX_SPLITS, self.budget_programs_per_sm)
        occupancy = occupancy_without_raise(batch.batch_size, tiles, sms, split_rule.MAX_SPLITS,
                                            CANDIDATE_PROGRAMS_PER_SM, self.below_two_programs_per_sm)
        return budget, min(occupancy, budget)


def pps4_budget66():
    """Occupancy and budget for 4 programs per SM (66 chunks at 32/8/128 on 132 SMs)."""
    return FourPerSmRule(budget_programs_per_sm=4)


def pps4_budget82():
    """Occupancy for 4 programs per SM, the budget for the rule's 5 (82 chunks at 32/8/128)."""
    return FourPerSmRule(budget_programs_per_sm=split_rule.PROGRAMS_PER_SM)


def pps4_budget66_shipped_below2():
    """pps4_budget66 where 4 programs per SM give 2 chunks or more (batch 33 or less at 32/8/128 on
    132 SMs); below that the count for the shipped 5 per SM, not raised from 2 (batch 34-41: 2, where
    the shipped rule raises 34 to 7 chunks), and the shipped rule's own count where that is 1 (batch 42
    on: 48 and 64 keep 1, 52 takes 3, 56 takes 4), so the batches s27's sweep timed at 48 and 64 keep
    the shipped counts."""
    return FourPerSmRule(budget_programs_per_sm=4, below_two_programs_per_sm=split_rule.PROGRAMS_PER_SM)

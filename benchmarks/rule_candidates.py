"""Candidate chunk rules, as kernels: timed beside the shipped rule in one process, no tree carried.

    python benchmarks/peer_table.py --out DIR --kernel dispatch --kernel adaptive_split \
        --kernel benchmarks.rule_candidates:previous_rule --kernel benchmarks.rule_candidates:resident_budget \
        --kernel benchmarks.rule_candidates:aimed_budget

Each candidate is `adaptive_split` with another `chunk_budget` (the chunk budget and the occupancy
count the device's per-request cap is computed from) or other launch options; the kernels are the
shipped ones. Nothing here is shipped: a candidate that wins is moved into `kernels/split_rule.py`.

  - previous_rule: the rule shipped before the 16-bit 4-warp row aimed at 4 programs per SM
    (`split_rule.SPLIT_PROGRAMS_PER_SM`): counts for the 5 programs an SM holds, raised to fill
    waves, a budget of 82 chunks at 32/8/128, and stage 2 at every count (no stage-1 merge). The
    A/B baseline of that change, run on the same machine in the same rounds.
  - resident_budget: the shipped counts and merge, with the budget (a ragged request's share) for
    the 5 programs an SM holds in every batch: at b4-ragged-32x8x128 the 128k request takes 54 chunks,
    not 43. On session 30's H200 this form ran b4-ragged 1.4 % faster than the budget of 66, and a
    batch of one (82 chunks, not 66) 2-4 % slower (docs/gpu-runs/2026-12-05-h200-s30, s30-2). The
    shipped rule takes it only for ragged batches (`split_rule.share_budget`).
  - aimed_budget: the shipped counts and merge with the budget for 4 programs per SM in every batch
    (66 at 32/8/128), as shipped from session 31 to `split_rule.share_budget`: the A/B baseline of
    that change (they differ only where a planned batch is ragged).
Both change only the 16-bit 4-warp row (head dims up to 128, 2-byte caches, not MLA); elsewhere,
and wherever the batch or the adapter fixes or caps the budget, they are the shipped kernel.
"""
from __future__ import annotations

from decode_conformance_kernels import split_rule, triton_common as tc
from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel, plan_splits


def in_row(batch) -> bool:
    """The launch-config row the candidates are for: 4-warp programs on a 16-bit cache."""
    return split_rule.split_programs_per_sm(batch.head_dim, batch.v_from_k, batch.k_cache.element_size()) is not None


class RowRule(AdaptiveSplitKernel):
    """adaptive_split whose chunk budget, in the 16-bit 4-warp row, is sized for the programs an SM
    holds (82 at 32/8/128), and whose occupancy count aims at `aim_programs_per_sm` (None: counts for
    what an SM holds, raised to fill waves); `stage1_merge` False launches stage 2 at every count."""

    def __init__(self, name: str, aim_programs_per_sm: int | None, stage1_merge: bool = True, **kw):
        super().__init__(**kw)
        self.name = name
        self.aim_programs_per_sm = aim_programs_per_sm
        self.stage1_merge = stage1_merge

    def chunk_budget(self, batch) -> tuple[int, int]:
        if self.chunks or batch.num_splits or self.max_splits or not in_row(batch):
            return super().chunk_budget(batch)
        tiles = tc.head_tiling(batch.num_q_heads, batch.num_kv_heads)["kv_head_tiles"]
        sms = self.num_sms if self.num_sms is not None else split_rule.num_sms(batch.device)
        held, cap = split_rule.PROGRAMS_PER_SM, split_rule.MAX_SPLITS
        budget = split_rule.grid_splits(batch.batch_size, tiles, sms, cap, held)
        occupancy = split_rule.occupancy_splits(batch.batch_size, tiles, sms, cap, held, self.aim_programs_per_sm)
        return budget, min(occupancy, budget)

    def launch_options(self, batch) -> dict:
        return super().launch_options(batch) if self.stage1_merge else {}


def previous_rule():
    """Counts and budget for the 5 programs an SM holds, raised to fill waves; no stage-1 merge."""
    return RowRule("adaptive_previous_rule", None, stage1_merge=False)


def resident_budget():
    """The shipped counts (aimed at 4 per SM) and merge, the budget for the 5 an SM holds (82 at 32/8/128)."""
    return RowRule("adaptive_resident_budget", split_rule.SPLIT_PROGRAMS_PER_SM)


class AimedBudget(AdaptiveSplitKernel):
    """adaptive_split planned without its lengths' share budget: the budget for the programs the
    counts aim at, whatever the batch (a plan of a graph captured without lengths has it too)."""

    name = "adaptive_aimed_budget"

    def chunk_budget(self, batch) -> tuple[int, int]:
        if self.chunks:
            return super().chunk_budget(batch)
        return plan_splits(batch.batch_size, batch.num_q_heads, batch.num_kv_heads, device=batch.device,
                           num_sms=self.num_sms, max_splits=batch.num_splits or self.max_splits,
                           mla=batch.v_from_k, head_dim=batch.head_dim,
                           kv_bytes=batch.k_cache.element_size(), fp8_mma=self.fp8_mma)


def aimed_budget():
    """The budget for 4 programs per SM in every batch (66 at 32/8/128), ragged or not."""
    return AimedBudget()

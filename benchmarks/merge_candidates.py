"""Candidate merges, as kernels: stage 1 merges its own partials, no stage 2. Timed beside the
shipped two-stage launch in one process, no tree carried:

    python benchmarks/peer_table.py --out DIR --kernel adaptive_split \
        --kernel benchmarks.merge_candidates:merge_in_stage1_upto8 \
        --kernel benchmarks.merge_candidates:merge_in_stage1_upto24 \
        --kernel benchmarks.merge_candidates:pps4_budget66_merge_in_stage1_upto24

Why: Nsight Compute on the H200 (docs/gpu-runs/2026-12-04-h200-s24, s24-6) had our stage 1
streaming as fast as flashinfer's tensor-core decode at the split-K cells that miss (within -1.0 to
+0.3 % of its duration, the same DRAM share); the distance is the merge, 6.7-7.4 us of stage 2
against flashinfer's 4.4-5.0. Here the last program of a request's head tile to finish merges
that tile's partials (a ticket on a per-tile counter, the protocol Lean's combine already runs on
the H200), so the merges of other tiles overlap the stream and only the last one is on the
critical path, with no second kernel to wait for.

What it may cost: the last merge is one program's loads of n partials, `stage1_merge_splits` of
them per round of loads (4 at 32/8/128, 1 at 16/2/256); stage 2 spreads a request over many
programs and merges up to 128 partials in one round. So the candidates merge in stage 1 only
where stage 1 has at most 8 programs per request (two rounds at 32/8/128: b32-8k's 5 chunks;
16/2/256 b32-8k's 4) or 24 (five or six rounds: b4-32k and b4-128k's 20 chunks too), and keep
stage 2 elsewhere (a batch of one at 32k or 128k takes 82 chunks at 32/8/128: 21 rounds on one
SM). `merge_in_stage1_always` merges at every count; it is the one to run the parity set with.
The chunk counts per cell on 132 SMs: `adaptive_split.plan_splits` and `split_rule.most_chunks`.

Registers (sm_90 compiles on a CPU through ci/compile_check.py's launch recording; the triton 3.6
build reproduces the H200's recorded counts): every merging 32/8/128 stage-1 variant keeps the
shipped variant's count on triton 3.6.0 and 3.9.0 (bf16 96 / 94, e4m3 168 / 160), so the A/B runs
at the same programs per SM; the 16/2/256 rows too on 3.6 (128). On 3.9 the e5m2 16/2/256 row
takes 136 against 128 (1 program per SM instead of 2; fp16 there is 160 against 154, already 1).

Nothing here is shipped: the launch option is `decode_attention_adaptive(merge_counters=...)`,
off unless given; a candidate that wins makes it the plan's default where it won.
"""
from __future__ import annotations

from typing import Optional

import torch

from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel, merge_counter_shape

from benchmarks.rule_candidates import FourPerSmRule


class MergeInStage1(AdaptiveSplitKernel):
    """adaptive_split whose plans pass merge counters (zeroed scratch of the batch's workspace,
    which every launch leaves zero): stage 1 merges, where a tile's heads fit its merge load and,
    with `up_to`, where stage 1 has at most that many programs per request."""

    def __init__(self, up_to: Optional[int] = None, **kw):
        super().__init__(**kw)
        self.up_to = up_to
        self.name = f"{self.name}_merge_in_stage1" + (f"_upto{up_to}" if up_to else "")

    def launch_options(self, batch) -> dict:
        shape = merge_counter_shape(batch.batch_size, batch.num_q_heads, batch.num_kv_heads)
        counters = batch.workspace.alloc("adaptive_split.merge_counters", shape, torch.int32, fill=0)
        return dict(merge_counters=counters, merge_in_stage1_up_to=self.up_to)


class FourPerSmMergeInStage1(MergeInStage1, FourPerSmRule):
    """A pps4 rule (benchmarks/rule_candidates.py: the budget for `budget_programs_per_sm`) with
    stage 1's merge."""

    def __init__(self, up_to: Optional[int] = None, budget_programs_per_sm: int = 4,
                 below_two_programs_per_sm: Optional[int] = None, **kw):
        FourPerSmRule.__init__(self, budget_programs_per_sm=budget_programs_per_sm,
                               below_two_programs_per_sm=below_two_programs_per_sm, **kw)
        self.up_to = up_to
        self.name = f"{self.name}_merge_in_stage1" + (f"_upto{up_to}" if up_to else "")


def merge_in_stage1_always():
    """Stage 1 merges wherever a tile's heads fit its merge load, at any chunk count: the
    candidate the parity set runs on a GPU, so every chunk count it meets merges under real
    concurrency (and CUDA-graph replays)."""
    return MergeInStage1()


def merge_in_stage1_upto8():
    """Stage 1 merges where it has at most 8 programs per request."""
    return MergeInStage1(up_to=8)


def merge_in_stage1_upto24():
    """Stage 1 merges where it has at most 24 programs per request."""
    return MergeInStage1(up_to=24)


def pps4_budget66_merge_in_stage1_upto24():
    """pps4_budget66's counts (2 chunks at b32-8k, 16 at b4-32k), stage 1 merging up to 24."""
    return FourPerSmMergeInStage1(up_to=24)


def pps4_budget66_merge_in_stage1_upto8():
    """pps4_budget66's counts, stage 1 merging up to 8 (two rounds at 32/8/128: b4-32k's 16
    chunks keep stage 2; session 30's A/B had 24 cost b4-32k 2 %)."""
    return FourPerSmMergeInStage1(up_to=8)


def pps4_budget82_merge_in_stage1_upto8():
    """pps4_budget82's counts (occupancy for 4 programs per SM, a ragged request's share of the
    rule's 82-chunk budget: b4-ragged as shipped), stage 1 merging up to 8."""
    return FourPerSmMergeInStage1(up_to=8, budget_programs_per_sm=5)


def pps4_budget66_shipped_below2_merge_in_stage1_upto8():
    """rule_candidates.pps4_budget66_shipped_below2's counts (4 per SM where that gives 2 chunks or
    more, the 5-per-SM counts below it), stage 1 merging up to 8."""
    from decode_conformance_kernels import split_rule
    return FourPerSmMergeInStage1(up_to=8, below_two_programs_per_sm=split_rule.PROGRAMS_PER_SM)

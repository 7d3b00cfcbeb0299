"""Candidate merges, as kernels: stage 1 merges its own partials, no stage 2. Timed beside the
shipped launch in one process, no tree carried:

    python benchmarks/peer_table.py --out DIR --kernel adaptive_split \
        --kernel benchmarks.merge_candidates:merge_in_stage1_upto24

Why stage 1 merges at all: Nsight Compute on the H200 (docs/gpu-runs/2026-12-04-h200-s24, s24-6) had
our stage 1 streaming as fast as flashinfer's tensor-core decode at the split-K cells that missed
(within -1.0 to +0.3 % of its duration, the same DRAM share); the distance was the merge, 6.7-7.4 us
of stage 2 against flashinfer's 4.4-5.0. The last program of a request's head tile to finish merges
that tile's partials (a ticket on a per-tile counter, the protocol Lean's combine runs), so the
merges of other tiles overlap the stream and only the last one is on the critical path, with no
second kernel to wait for. The shipped plans merge so in the 16-bit 4-warp row up to
`adaptive_split.STAGE1_MERGE_UP_TO` programs per request (timed in session 30); these candidates
move that bound.

What it may cost: the last merge is one program's loads of n partials, `stage1_merge_splits` of
them per round of loads (4 at 32/8/128, 1 at 16/2/256); stage 2 spreads a request over many
programs and merges up to 128 partials in one round. `merge_in_stage1_upto24` merges b4-32k's
and b4-128k's 16 chunks too (four rounds; session 30 timed it 2 % slower at b4-32k);
`merge_in_stage1_always` merges at every count, in every row whose tile fits one merge load: the
one to run the parity set with, so every chunk count merges under real concurrency (and CUDA-graph
replays).

Registers (sm_90 compiles on a CPU through ci/compile_check.py's launch recording; the triton 3.6
build reproduces the H200's recorded counts): every merging 32/8/128 stage-1 variant keeps the
two-stage variant's count on triton 3.6.0 and 3.9.0 (bf16 96 / 94, e4m3 168 / 160), so the A/B runs
at the same programs per SM; the 16/2/256 rows too on 3.6 (128). On 3.9 the e5m2 16/2/256 row
takes 136 against 128 (1 program per SM instead of 2; fp16 there is 160 against 154, already 1).
"""
from __future__ import annotations

from typing import Optional

from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel


class MergeInStage1(AdaptiveSplitKernel):
    """adaptive_split whose plans pass merge counters (zeroed scratch of the batch's workspace,
    which every launch leaves zero) in every row: stage 1 merges where a tile's heads fit its merge
    load and, with `up_to`, where stage 1 has at most that many programs per request."""

    def __init__(self, up_to: Optional[int] = None, **kw):
        super().__init__(**kw)
        self.up_to = up_to
        self.name = f"{self.name}_merge_in_stage1" + (f"_upto{up_to}" if up_to else "")

    def launch_options(self, batch) -> dict:
        return self.merge_options(batch, self.up_to)


def merge_in_stage1_always():
    """Stage 1 merges wherever a tile's heads fit its merge load, at any chunk count, in every row."""
    return MergeInStage1()


def merge_in_stage1_upto24():
    """Stage 1 merges where it has at most 24 programs per request, in every row."""
    return MergeInStage1(up_to=24)

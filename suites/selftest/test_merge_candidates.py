"""benchmarks/merge_candidates.py: each candidate is `adaptive_split` whose plans pass merge counters
from the batch's workspace, so stage 1 merges and stage 2 is not launched (the launch option itself
is gated in suites/gates/test_adaptive_launch.py). Here: the candidates run through the suite's own
runner (NaN-poisoned scratch, the float64 reference), launch no stage 2 where they claim to, leave
their counters at 0 and keep distinct names for the peer table's rows. Runs under Triton's CPU
interpreter when there is no GPU."""
import pytest

torch = pytest.importorskip("torch")

from decode_conformance.runner import build_checked, run_prepared  # noqa: E402
from suites.selftest.test_chunk_sweep import CASE, SMALL_GPU, _small_gpu, _sweep  # noqa: E402,F401 (the 4-SM fixture)


def _candidates():
    _, device = _sweep()  # the interpreter set up before the kernels import (as the sweep's own tests)
    from benchmarks import merge_candidates
    from decode_conformance_kernels import adaptive_split
    return merge_candidates, adaptive_split, device


def _run(kernel, adaptive_split, device):
    """(result, stage-2 launches, the counters after the launch) of `kernel` on CASE: 4 requests
    of 640 keys, 2 chunks each on the 4-SM fixture (`test_chunk_sweep`)."""
    launches = []
    stage2 = adaptive_split._adaptive_stage2

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return stage2[grid]

    batch, ref, tier = build_checked(kernel, CASE, device)
    adaptive_split._adaptive_stage2 = Counting()
    try:
        res = run_prepared(kernel, CASE, batch, ref, tier)
    finally:
        adaptive_split._adaptive_stage2 = stage2
    counters = batch.workspace.buffers.get("adaptive_split.merge_counters")
    return res, launches, None if counters is None else counters.tolist()


@pytest.mark.parametrize("factory", ["merge_in_stage1_always", "merge_in_stage1_upto24"])
def test_candidate_merges_in_stage1_and_passes_the_judge(factory):
    mc, adaptive_split, device = _candidates()
    kernel = getattr(mc, factory)()
    kernel.num_sms = SMALL_GPU
    res, launches, counters = _run(kernel, adaptive_split, device)
    assert res.status == "passed", res.message
    assert launches == [], f"{kernel.name} launched stage 2"
    assert counters == [[0, 0]] * 4, f"{kernel.name} left its counters at {counters}"


def test_the_shipped_plan_merges_in_stage1_in_its_row():
    """The shipped plan on CASE (bf16, head dim 64: the 16-bit 4-warp row; 2 chunks per request, at
    most STAGE1_MERGE_UP_TO): stage 1 merges, no stage-2 launch, its counters left at 0."""
    _, adaptive_split, device = _candidates()
    res, launches, counters = _run(adaptive_split.AdaptiveSplitKernel(num_sms=SMALL_GPU), adaptive_split, device)
    assert res.status == "passed", res.message
    assert launches == [] and counters == [[0, 0]] * 4, (launches, counters)


def test_the_previous_rule_launches_stage2():
    """The control: the same runner and case, the rule before the merge (rule_candidates.previous_rule),
    one stage-2 launch, no counters."""
    _, adaptive_split, device = _candidates()
    from benchmarks.rule_candidates import previous_rule
    kernel = previous_rule()
    kernel.num_sms = SMALL_GPU
    res, launches, counters = _run(kernel, adaptive_split, device)
    assert res.status == "passed", res.message
    assert len(launches) == 1 and counters is None


def test_up_to_keeps_stage2_above_its_count():
    """`up_to` below the plan's 2 chunks per request: stage 2 merges, the counters untouched."""
    mc, adaptive_split, device = _candidates()
    res, launches, counters = _run(mc.MergeInStage1(up_to=1, num_sms=SMALL_GPU), adaptive_split, device)
    assert res.status == "passed", res.message
    assert len(launches) == 1 and counters == [[0, 0]] * 4


def test_candidate_names_are_distinct():
    mc, _, _ = _candidates()
    names = [f().name for f in (mc.merge_in_stage1_always, mc.merge_in_stage1_upto24)]
    assert names == ["adaptive_split_merge_in_stage1", "adaptive_split_merge_in_stage1_upto24"]

"""benchmarks/rule_candidates.py: the candidate rules plan the counts the chunks sweep found fastest,
only in the class they are for, and the kernel runs them (counted from what the device wrote) with
outputs the judge passes. Runs under Triton's CPU interpreter when there is no GPU."""
import types

import pytest

torch = pytest.importorskip("torch")

from suites.selftest.test_chunk_sweep import SMALL_GPU, _launch_and_count, _small_gpu, _sweep  # noqa: E402,F401 (the 4-SM fixture)

H200_SMS = 132


def _batch(b, hq=32, hkv=8, d=128, kv_bytes=2, mla=False):
    """What chunk_budget reads of a batch."""
    return types.SimpleNamespace(batch_size=b, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, v_from_k=mla,
                                 num_splits=None, device="cpu",
                                 k_cache=types.SimpleNamespace(element_size=lambda: kv_bytes))


def _candidates():
    sweep, _ = _sweep()  # the interpreter set up before the kernels import (as the sweep's own tests)
    from benchmarks import rule_candidates
    return rule_candidates


# The s27 chunks sweep's fastest 64-key counts at 32/8/128 (docs/gpu-runs/2026-12-04-h200-s27):
# batch 8: 8, 16: 4, 24: 2, 32: 2 - the occupancy count for 4 programs per SM without a raise. The
# shipped rule's there: 10, 5, 10, 5 (raised to fill waves). Batch 40: one chunk's 320 programs fill
# 61 % of a 528-slot wave, so both raise it (the candidate to 3: 960 of 1056 slots).
@pytest.mark.parametrize("b, occupancy, rule_occupancy", [(8, 8, 10), (16, 4, 5), (24, 2, 10), (32, 2, 5), (4, 16, 20),
                                                          (40, 3, 2), (64, 1, 1)])
def test_candidates_plan_the_sweeps_fastest_counts_at_32x8x128(b, occupancy, rule_occupancy):
    rc = _candidates()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    for make, budget in ((rc.pps4_budget66, 66), (rc.pps4_budget82, 82)):
        candidate = make()
        candidate.num_sms = H200_SMS
        assert candidate.chunk_budget(_batch(b)) == (budget, occupancy), candidate.name
    assert AdaptiveSplitKernel(num_sms=H200_SMS).chunk_budget(_batch(b)) == (82, rule_occupancy)


# pps4_budget66_shipped_below2: the 4-per-SM count where it is 2 or more (batch <= 33), the 5-per-SM count
# without a raise from 2 (batch 34-41; the shipped rule raises 34 to 7), the shipped rule's where that is 1
# (s27's sweep: at batch 48 the shipped 1 chunk beat 4 by 8-15 %, which the other candidates plan).
@pytest.mark.parametrize("b, occupancy", [(4, 16), (8, 8), (16, 4), (24, 2), (32, 2), (33, 2), (34, 2), (40, 2),
                                          (48, 1), (52, 3), (56, 4), (64, 1)])
def test_shipped_below2_candidate_counts_at_32x8x128(b, occupancy):
    rc = _candidates()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    candidate = rc.pps4_budget66_shipped_below2()
    candidate.num_sms = H200_SMS
    assert candidate.chunk_budget(_batch(b)) == (66, occupancy)
    shipped = AdaptiveSplitKernel(num_sms=H200_SMS).chunk_budget(_batch(b))[1]
    assert (shipped == occupancy) == (b >= 40), (b, shipped)  # the shipped counts from batch 40 on
    assert candidate.name == "adaptive_pps4_budget4_below2pps5" != rc.pps4_budget66().name


@pytest.mark.parametrize("batch", [_batch(32, 16, 2, 256), _batch(32, kv_bytes=1), _batch(8, 128, 1, 576, mla=True),
                                   _batch(8, mla=True)],
                         ids=["8-warp-16x2x256", "fp8-32x8x128", "mla", "v-from-k-d128"])
def test_candidates_keep_the_shipped_rule_outside_their_class(batch):
    rc = _candidates()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    rule = AdaptiveSplitKernel(num_sms=H200_SMS).chunk_budget(batch)
    assert rc.FourPerSmRule(4, num_sms=H200_SMS).chunk_budget(batch) == rule


@pytest.mark.parametrize("option", [dict(chunks=3), dict(max_splits=7), "batch.num_splits"])
def test_candidates_keep_a_fixed_or_capped_budget(option):
    rc = _candidates()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    batch = _batch(32)
    kw = {"num_sms": H200_SMS}
    if option == "batch.num_splits":
        batch.num_splits = 7
    else:
        kw.update(option)
    assert rc.FourPerSmRule(4, **kw).chunk_budget(batch) == AdaptiveSplitKernel(**kw).chunk_budget(batch)


def test_candidate_runs_its_counts_and_passes_the_judge():
    """On a 4-SM machine (CASE: 4 requests x 2 KV-head tiles, 640 keys each): the rule raises its
    occupancy count 2 (16 of 20 slots) to 5 chunks; the candidate keeps 2 (16 of 16 slots)."""
    rc = _candidates()
    _, device = _sweep()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    res, counts = _launch_and_count(AdaptiveSplitKernel(num_sms=SMALL_GPU), device)
    assert res.status == "passed" and counts == [5], (res.message, counts)
    candidate = rc.pps4_budget66()
    candidate.num_sms = SMALL_GPU
    res, counts = _launch_and_count(candidate, device)
    assert res.status == "passed", res.message
    assert counts == [2], f"the candidate planned 2 chunks per request; the device ran {counts}"

"""benchmarks/rule_candidates.py: each candidate plans the counts it claims, only in the row it is
for, and the kernel runs them (counted from what the device wrote) with outputs the judge passes.
The expected counts are worked from the arithmetic in the comments, not read from the rule. Runs
under Triton's CPU interpreter when there is no GPU."""
import types

import pytest

torch = pytest.importorskip("torch")

from suites.selftest.test_chunk_sweep import SMALL_GPU, _launch_and_count, _small_gpu, _sweep  # noqa: E402,F401 (the 4-SM fixture)

H200_SMS = 132


def _batch(b, hq=32, hkv=8, d=128, kv_bytes=2, mla=False, lens=None):
    """What chunk_budget reads of a batch (equal 32k requests unless `lens`)."""
    return types.SimpleNamespace(batch_size=b, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, v_from_k=mla,
                                 num_splits=None, device="cpu", seq_lens_host=lens or [32768] * b, window=None,
                                 k_cache=types.SimpleNamespace(element_size=lambda: kv_bytes))


def _candidates():
    sweep, _ = _sweep()  # the interpreter set up before the kernels import (as the sweep's own tests)
    from benchmarks import rule_candidates
    return rule_candidates


# 32/8/128 (8 KV-head tiles) on 132 SMs: (batch, previous_rule's occupancy, resident_budget's). The previous
# rule: floor(660 / (batch x 8)) raised to the first count up to 4x it that fills >= 90 % of its 660-slot
# waves (batch 8: 10, 640 of 660; 16: 5; 24: 3 fills 87 %, 10 fills 1920 / 1980; 32: 2 fills 78 %, 5 fills
# 1280 / 1320; 4: 20; 40: 2, 640 / 660; 48 and 64: one chunk, no 3 or 4 fills 90 %). resident_budget:
# the shipped row's counts, floor(528 / (batch x 8)) from 2 up (16, 8, 4, 2, 2), else floor(660 / ...)
# (40: 2), else one chunk's treatment (48 and 64: 1). Budgets: 660 // 8 = 82 for both.
@pytest.mark.parametrize("b, previous, resident", [(4, 20, 16), (8, 10, 8), (16, 5, 4), (24, 10, 2), (32, 5, 2),
                                                   (40, 2, 2), (48, 1, 1), (64, 1, 1)])
def test_candidates_plan_their_counts_at_32x8x128(b, previous, resident):
    rc = _candidates()
    for make, occupancy in ((rc.previous_rule, previous), (rc.resident_budget, resident)):
        candidate = make()
        candidate.num_sms = H200_SMS
        assert candidate.chunk_budget(_batch(b)) == (82, occupancy), candidate.name
    previous = rc.previous_rule()
    previous.num_sms = H200_SMS
    assert previous.chunk_budget(_batch(1)) == (82, 82)  # a batch of one: the whole budget


@pytest.mark.parametrize("batch", [_batch(32, 16, 2, 256), _batch(32, kv_bytes=1), _batch(8, 128, 1, 576, mla=True),
                                   _batch(8, mla=True)],
                         ids=["8-warp-16x2x256", "fp8-32x8x128", "mla", "v-from-k-d128"])
def test_candidates_keep_the_shipped_rule_outside_their_row(batch):
    rc = _candidates()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    rule = AdaptiveSplitKernel(num_sms=H200_SMS).chunk_budget(batch)
    for make in (rc.previous_rule, rc.resident_budget):
        candidate = make()
        candidate.num_sms = H200_SMS
        assert candidate.chunk_budget(batch) == rule, candidate.name


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
    want = AdaptiveSplitKernel(**kw).chunk_budget(batch)
    assert rc.RowRule("x", None, **kw).chunk_budget(batch) == want


def test_candidates_run_their_counts_and_pass_the_judge():
    """On a 4-SM machine (CASE: 4 requests x 2 KV-head tiles, 640 keys each, head dim 64: the 16-bit
    4-warp row): the previous rule raises its occupancy count 2 (16 of 20 slots) to 5 chunks; the
    shipped rule keeps floor(16 / 8) = 2."""
    rc = _candidates()
    _, device = _sweep()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    for kernel, want in ((rc.previous_rule(), [5]), (AdaptiveSplitKernel(), [2])):
        kernel.num_sms = SMALL_GPU
        res, counts = _launch_and_count(kernel, device)
        assert res.status == "passed", (kernel.name, res.message)
        assert counts == want, f"{kernel.name} planned {want} chunks per request; the device ran {counts}"


def test_candidate_names_are_distinct():
    rc = _candidates()
    assert [rc.previous_rule().name, rc.resident_budget().name, rc.aimed_budget().name] == [
        "adaptive_previous_rule", "adaptive_resident_budget", "adaptive_aimed_budget"]


# b4-ragged-32x8x128 on 132 SMs: the shipped plan shares 82 (floor(66 x 131072 / 197639) = 43 > the
# occupancy count 16); aimed_budget keeps 66; equal requests and a batch of one plan alike (66).
@pytest.mark.parametrize("lens,shipped", [([131072, 1024, 65536, 7], (82, 16)), ([32768] * 4, (66, 16)),
                                          ([131072], (66, 66))])
def test_aimed_budget_is_the_shipped_plan_without_the_share_budget(lens, shipped):
    rc = _candidates()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    batch = _batch(len(lens), lens=lens)
    assert AdaptiveSplitKernel(num_sms=H200_SMS).chunk_budget(batch) == shipped
    aimed = rc.aimed_budget()
    aimed.num_sms = H200_SMS
    assert aimed.chunk_budget(batch) == (66, shipped[1])

"""benchmarks/sweep.py's chunks sweep labels every variant with the chunk counts it launches, from
the host mirror of the rule (`planned_chunks`). A label is only worth its row if the kernel ran
that many chunks: here each launch's count is read back from what the device wrote (a request
of n >= 2 chunks fills n partial LSEs of the NaN-poisoned scratch; one chunk writes none) and
its output is judged against the float64 reference. Runs under Triton's CPU interpreter when
there is no GPU.

The trap the sweep exists to avoid: `AdaptiveSplitKernel(max_splits=c)` caps the chunk budget,
not the count, so a row labelled c can have run fewer (s24-7's "3 chunks" at 32/8/128 b32-8k
ran 2; docs/gpu-runs/2026-12-04-h200-s24).
"""
import importlib
import os

import pytest

torch = pytest.importorskip("torch")

from decode_conformance.cases import Case  # noqa: E402
from decode_conformance.runner import build_checked, run_prepared  # noqa: E402

# 4 requests x 2 KV-head tiles = 8 stage-1 programs per chunk; 640 keys take up to 5 chunks of 128
CASE = Case(kv_dtype="bf16", num_q_heads=4, num_kv_heads=2, head_dim=64, seq_lens=(640, 640, 640, 640),
            page_size=16, seed=11)
SHAPE = (CASE.num_q_heads, CASE.num_kv_heads, CASE.head_dim)
# 4 SMs: 16 programs aimed at (the 16-bit 4-warp row: 4 per SM), 20 held. The rule runs
# floor(16 / 8) = 2 chunks here; a budget capped at 3 runs 2 as well (3 chunks would take 24
# programs), so a capped budget launches 2 chunks where a sweep's label would say 3. The SM count of
# every launch on the CPU (the environment variable), so a forced count that fell back on the rule
# would show there.
SMALL_GPU = 4


@pytest.fixture(autouse=True)
def _small_gpu(monkeypatch):
    from decode_conformance_kernels import split_rule
    monkeypatch.setenv(split_rule.NUM_SMS_ENV, str(SMALL_GPU))


def _sweep():
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        pytest.importorskip("triton")
        from triton.runtime.interpreter import InterpretedFunction
        from decode_conformance_kernels import adaptive_split
        if not isinstance(adaptive_split._adaptive_stage1, InterpretedFunction):
            pytest.skip("no GPU and the kernels were imported without Triton's interpreter")
    return importlib.import_module("benchmarks.sweep"), ("cuda" if torch.cuda.is_available() else "cpu")


def _launch_and_count(kernel, device):
    """Run `kernel` on CASE through the suite's runner; (result, the chunk counts the device
    used per request)."""
    batch, ref, tier = build_checked(kernel, CASE, device)
    res = run_prepared(kernel, CASE, batch, ref, tier)
    lse = next(t for name, t in batch.workspace.buffers.items() if name.endswith(".partial_lse"))
    written = torch.isfinite(lse).sum(dim=-1)  # [B, Hq]
    return res, sorted({max(1, int(n)) for n in written.flatten().tolist()})


@pytest.mark.parametrize("chunks", [1, 2, 3, 5])
def test_forced_count_is_what_the_device_runs(chunks):
    sweep, device = _sweep()
    res, counts = _launch_and_count(sweep.ForcedChunks(chunks), device)
    assert res.ok, res.message
    assert counts == [chunks]
    assert sweep.planned_chunks(SHAPE, list(CASE.seq_lens), chunks=chunks, num_sms=SMALL_GPU,
                                block_n=64)["counts"] == counts


def test_rule_label_is_what_the_device_runs():
    sweep, device = _sweep()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    res, counts = _launch_and_count(AdaptiveSplitKernel(num_sms=SMALL_GPU), device)
    assert res.ok, res.message
    assert sweep.planned_chunks(SHAPE, list(CASE.seq_lens), num_sms=SMALL_GPU, block_n=64)["counts"] == counts


def test_a_capped_budget_is_not_a_chunk_count():
    """The planted mislabel: a budget capped at 3 runs 2 chunks here, so a sweep that forced
    counts that way would have labelled a 2-chunk launch "3"."""
    sweep, device = _sweep()
    from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel
    res, counts = _launch_and_count(AdaptiveSplitKernel(num_sms=SMALL_GPU, max_splits=3), device)
    assert res.ok, res.message
    assert counts == [2]


def test_only_resumes_a_cut_sweep_at_the_cells_named():
    """`--only`: a call that resumes a sweep cut by its deadline times the named cells and no
    others; a filter that matches nothing stops the run, instead of a green sweep of no cells."""
    sweep = importlib.import_module("benchmarks.sweep")
    picked = sweep.chunk_cells(only=["16/2/256:48", "32/8/128:64"])
    assert picked and {(s, b) for s, b, _ in picked} == {((16, 2, 256), 48), ((32, 8, 128), 64)}
    assert [c for c in sweep.chunk_cells() if c in picked] == picked  # the sweep's own order
    assert {s for s, _, _ in sweep.chunk_cells(only=["16/2/256"])} == {(16, 2, 256)}
    for bad in ("16/2/255", "16/2", "x:8"):
        with pytest.raises(SystemExit, match="--only"):
            sweep.chunk_cells(only=[bad])
    # a batch between the listed ones is swept where it is named, and only there
    assert 40 not in sweep.CHUNK_BATCHES
    assert {(s, b) for s, b, _ in sweep.chunk_cells(only=["32/8/128:40"])} == {((32, 8, 128), 40)}
    assert not any(b == 40 for _, b, _ in sweep.chunk_cells(only=["32/8/128"]))


def test_label_says_where_stage1_merges():
    """The rule's 2 chunks on CASE (bf16, head dim 64: the 16-bit 4-warp row) merge in stage 1, so the
    label says no stage 2 runs (test_merge_candidates counts the launches); a 16/2/256 launch (8-warp
    row) of 2 chunks keeps stage 2."""
    sweep = importlib.import_module("benchmarks.sweep")
    plan = sweep.planned_chunks(SHAPE, list(CASE.seq_lens), num_sms=SMALL_GPU, block_n=64)
    assert plan["counts"] == [2] and plan["merge_in_stage1"] and not plan["stage2"], plan
    assert "s1-merge" in sweep._plan_label(plan)
    wide = sweep.planned_chunks((16, 2, 256), [640] * 4, chunks=2, num_sms=SMALL_GPU)
    assert wide["stage2"] and not wide["merge_in_stage1"], wide

"""Gate: the adaptive split-K kernel's launch shapes (kernels/adaptive_split.py) give the same
answer - stage-2 column slices, the grid and partials sized from a bound on the lengths, stage 2
left out when no request can take two chunks - and the bound is a promise a kernel must not
break silently. Each launch is judged against the float64 reference with the suite's own
judge (the expected values come from decode_conformance.reference, never from the kernel).
Runs under Triton's CPU interpreter when there is no GPU.
"""
import importlib
import os

import pytest

torch = pytest.importorskip("torch")

from decode_conformance.cases import Case  # noqa: E402
from decode_conformance.metrics import judge  # noqa: E402
from decode_conformance.runner import prepare, yardstick  # noqa: E402

# Requests of 0, 1, 200 (one chunk: finished in stage 1) and 1500 keys (11 chunks of >= 128):
# both paths in one batch, with sinks and the LSE.
MIXED = Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(0, 1, 200, 1500),
             page_size=16, sinks=True, seed=5)
_MOD = None  # test_a_request_past_the_axis_is_caught: the module its planted helper calls into
_MERGE = None  # test_a_merge_of_the_first_round_only_is_caught: the helper its plant calls
SHORT = MIXED.replace(seq_lens=(0, 1, 200, 255), seed=6)  # none takes two chunks (< 2 x 128 keys)


def _adaptive():
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from decode_conformance_kernels import adaptive_split
    if not on_gpu:
        from triton.runtime.interpreter import InterpretedFunction
        if not isinstance(adaptive_split._adaptive_stage1, InterpretedFunction):
            if os.environ.get("TRITON_INTERPRET", "").strip().lower() not in ("1", "true", "on", "yes"):
                pytest.skip("no GPU and TRITON_INTERPRET is off: the kernel cannot run")
            importlib.reload(adaptive_split.tc)
            adaptive_split = importlib.reload(adaptive_split)
    return adaptive_split, ("cuda" if on_gpu else "cpu")


def _run(case, drop_stage2=False, **kw):
    """Launch decode_attention_adaptive directly with `kw`; returns (verdict, stage-2 launches).
    drop_stage2: a planted bug, stage 2 recorded but never launched."""
    mod, device = _adaptive()
    kernel = mod.AdaptiveSplitKernel()
    batch = prepare(kernel, case, device)
    ref, tier = yardstick(kernel, case, batch)
    launches = []
    stage2 = mod._adaptive_stage2

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return (lambda *a, **k: None) if drop_stage2 else stage2[grid]

    mod._adaptive_stage2 = Counting()
    try:
        sinks = batch.sinks.to(device=device, dtype=torch.float32) if batch.sinks is not None else None
        mod.decode_attention_adaptive(batch.q, batch.k_cache, batch.v_cache, batch.kv_indptr, batch.kv_indices,
                                      batch.out, sm_scale=batch.sm_scale, lse=batch.lse, sinks=sinks, **kw)
    finally:
        mod._adaptive_stage2 = stage2
    if device == "cuda":
        torch.cuda.synchronize()
    v = judge(case, batch.out, batch.lse, ref.out, ref.lse, ref.visible, tier.outs, tier.lses, batch.sinks,
              lse_slack=tier.lse_slack)
    return v, launches


@pytest.mark.parametrize("slices", [1, 2, 4])
def test_stage2_slices_give_the_same_answer(slices):
    v, launches = _run(MIXED, stage2_slices=slices)
    assert v.passed, v.summary()
    assert [g[2] for g in launches] == [slices]


def test_bounded_grid_and_partials():
    """A bound (the longest request) shortens the chunk axis and the partials to its chunk count."""
    v, launches = _run(MIXED, max_visible=1500)
    assert v.passed, v.summary()
    assert len(launches) == 1


def test_no_stage2_when_no_request_takes_two_chunks():
    v, launches = _run(SHORT, max_visible=255)
    assert v.passed, v.summary()
    assert launches == [], "stage 2 launched for a batch that every request finishes in stage 1"
    v, launches = _run(SHORT)  # no bound: stage 2 is launched and leaves one-chunk rows alone
    assert v.passed, v.summary()
    assert len(launches) == 1


def test_a_broken_bound_is_caught():
    """The planted bug the previous test guards against: stage 2 left out while a request needs
    it. Its row is never merged, and the judge fails it."""
    v, launches = _run(MIXED, drop_stage2=True, max_visible=1500)
    assert len(launches) == 1
    assert not v.passed


def test_a_request_past_the_bound_is_still_computed():
    """A bound below the 1500-key request: the chunk axis has one program per request and head
    tile, so that request is finished in one chunk by stage 1 (slower, still right)."""
    v, launches = _run(MIXED, max_visible=255)
    assert launches == []
    assert v.passed, v.summary()


# One request of 9000 keys under a budget of 128: 70 chunks, more than one 64-partial round.
LONG = MIXED.replace(seq_lens=(9000,), sinks=False, seed=7)


@pytest.mark.parametrize("slices", [1, 2])
def test_more_than_64_partials_merge_in_one_round(slices):
    """Stage 2 merges up to 128 partials per load round (triton_common.STAGE2_MAX_TILE) when a
    column slice is narrow enough (64 or 32 columns here): 70 partials in one round."""
    mod, _ = _adaptive()
    assert mod.tc.split_tile(70, 64 // slices) == 128
    v, launches = _run(LONG, splits=128, occupancy=128, stage2_slices=slices)
    assert v.passed, v.summary()
    assert [g[2] for g in launches] == [slices]


def test_a_chunk_axis_sized_for_short_requests_still_serves_long_ones():
    """Sized for short requests (one chunk each: one program per request and head tile, and no
    stage 2), then launched on MIXED: the 1500-key request is cut into as many chunks as the
    axis has programs (one: finished in stage 1), not the 11 its length allows."""
    mod, _ = _adaptive()
    assert mod.split_rule.most_chunks([100] * 4, 400, 82, 1, 128, 64) == 1
    v, launches = _run(MIXED, max_visible=1500, planned_seq_lens=(100, 100, 100, 100))
    assert v.passed, v.summary()
    assert launches == []


def test_a_request_past_the_axis_is_caught(monkeypatch):
    """The planted bug the previous test guards against: the cap not held to the chunk axis, so
    the 1500-key request counts 11 chunks of which only the first is launched; the judge fails
    it. Planted through the interpreter's late binding of the kernel's helper (CPU only)."""
    mod, device = _adaptive()
    if device != "cpu":
        pytest.skip("planted through the CPU interpreter")
    import triton

    global _MOD  # the interpreter resolves a helper's names in its module's globals
    _MOD = mod

    @triton.jit
    def cap_ignoring_the_axis(length, total, grid, occupancy, ceiling):
        share = (length.to(_MOD.tl.int64) * grid) // _MOD.tl.maximum(total, 1).to(_MOD.tl.int64)
        return _MOD.tl.minimum(_MOD.tl.maximum(share, occupancy), grid).to(_MOD.tl.int32)

    monkeypatch.setattr(mod, "axis_cap_device", cap_ignoring_the_axis)
    v, _ = _run(MIXED, max_visible=1500, planned_seq_lens=(100, 100, 100, 100))
    assert not v.passed


def test_planned_lengths_must_match_the_batch():
    with pytest.raises(ValueError, match="planned_seq_lens: expected 4 lengths"):
        _run(MIXED, planned_seq_lens=(100, 100))



# Stage 1's own merge (merge_counters): the last of a request's programs to finish a head tile
# merges that tile's partials, and stage 2 is not launched. MIXED's 1500-key request takes 11
# chunks; a tile's 4 query heads x 64 columns merge 8 partials per round of loads: two rounds,
# the second one masked.
def _counters(case, fill=0):
    mod, device = _adaptive()
    shape = mod.merge_counter_shape(len(case.seq_lens), case.num_q_heads, case.num_kv_heads)
    return torch.full(shape, fill, dtype=torch.int32, device=device)


def test_stage1_merge_replaces_stage2():
    mod, _ = _adaptive()
    assert mod.stage1_merge_splits(4, 64) == 8
    counters = _counters(MIXED)
    v, launches = _run(MIXED, merge_counters=counters)
    assert v.passed, v.summary()
    assert launches == [], "stage 2 launched although stage 1 merged"
    assert counters.tolist() == [[0, 0]] * 4, "the counters were not left at 0 for the next launch"


def test_stage1_merge_up_to_keeps_stage2_above_it():
    """merge_in_stage1_up_to below the 16 programs of the axis (splits=16): stage 2 merges, as
    without counters; at 16 stage 1 does."""
    for up_to, stage2 in ((8, 1), (16, 0)):
        counters = _counters(MIXED)
        v, launches = _run(MIXED, splits=16, occupancy=16, merge_counters=counters, merge_in_stage1_up_to=up_to)
        assert v.passed, v.summary()
        assert len(launches) == stage2, up_to


def test_a_counter_left_set_is_caught():
    """The planted bug the counters' reset guards against: a launch after one that left its
    counters at 11 (no reset). No program draws the last ticket, nothing merges the 1500-key
    request, its rows stay unwritten (NaN-poisoned) and the judge fails them."""
    v, launches = _run(MIXED, merge_counters=_counters(MIXED, fill=11))
    assert launches == []
    assert not v.passed


def test_a_merge_of_the_first_round_only_is_caught(monkeypatch):
    """Planted: the merge stops after its first round of loads (8 of the 11 partials), as a loop
    bound of one round would. Planted through the interpreter's late binding of the kernel's
    helper (CPU only)."""
    mod, device = _adaptive()
    if device != "cpu":
        pytest.skip("planted through the CPU interpreter")
    import triton
    global _MOD, _MERGE
    _MOD, _MERGE = mod, mod.tc.merge_tile_partials

    @triton.jit
    def first_round_only(b, head0, count, Part, stride_pb, stride_ph, stride_ps, PartLse, stride_lb, stride_lh,
                         heads_per_tile, DV: mod.tl.constexpr, HEADS: mod.tl.constexpr, SPLITS: mod.tl.constexpr,
                         BLOCK_DV: mod.tl.constexpr):
        return _MERGE(b, head0, _MOD.tl.minimum(count, SPLITS), Part, stride_pb, stride_ph, stride_ps, PartLse,
                      stride_lb, stride_lh, heads_per_tile, DV, HEADS, SPLITS, BLOCK_DV)

    monkeypatch.setattr(mod.tc, "merge_tile_partials", first_round_only)
    v, _ = _run(MIXED, merge_counters=_counters(MIXED))
    assert not v.passed


def test_merge_counters_are_checked():
    with pytest.raises(ValueError, match=r"merge_counters: expected a contiguous int32 tensor of shape \(4, 2\)"):
        _run(MIXED, merge_counters=_counters(MIXED).to(torch.int64))
    with pytest.raises(ValueError, match=r"merge_counters: expected .* shape \(4, 2\).* got torch.int32 \(2, 4\)"):
        _run(MIXED, merge_counters=_counters(MIXED).reshape(2, 4))


def test_tiles_too_wide_for_stage1s_merge_keep_stage2():
    """A tile's query heads x columns over STAGE1_MERGE_ELEMS (32 heads x 128 here; MLA's 16 x 512)
    keep stage 2; 32 heads x 64 columns fit, one partial per round (11 rounds)."""
    mod, _ = _adaptive()
    shapes = ((4, 128), (8, 256), (16, 512), (32, 128), (32, 64))  # (heads of a tile, columns)
    assert [mod.stage1_merge_splits(*t) for t in shapes] == [4, 1, 0, 0, 1]
    for head_dim, stage2 in ((128, 1), (64, 0)):
        wide = MIXED.replace(num_q_heads=32, num_kv_heads=1, head_dim=head_dim, v_head_dim=head_dim, seed=9)
        v, launches = _run(wide, merge_counters=_counters(wide))
        assert v.passed, v.summary()
        assert len(launches) == stage2, head_dim


def test_stage1_merges_from_two_programs_up_to_the_plans_count():
    """The decision the kernel launches by and the chunks sweep labels with: a launch with counters
    merges in stage 1 from 2 programs per request up to `up_to` (None: any), where the tile fits a
    load (4 heads x 128: 2048 // 512 = 4 partials a load); otherwise 0 and stage 2 runs."""
    mod, _ = _adaptive()
    assert [mod.stage1_merge_plan(p, 8, 4, 128) for p in (0, 1, 2, 8, 9, 64)] == [0, 0, 4, 4, 0, 0]
    assert [mod.stage1_merge_plan(p, None, 4, 128) for p in (1, 2, 64)] == [0, 4, 4]
    assert mod.stage1_merge_plan(2, 8, 16, 512) == 0  # MLA's 16 heads x 512 columns: stage 2

# A windowed batch: both requests see 300 keys, one of them out of 2000 (the vllm47188 shape).
WINDOWED = Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=4, head_dim=64, seq_lens=(2000, 700), window=300,
                page_size=16, seed=8)


def _planned_axis(sized_for_lengths):
    """(verdict, stage-1 chunk axis) of AdaptiveSplitKernel(sized_for_lengths=...) on WINDOWED."""
    mod, device = _adaptive()
    kernel = mod.AdaptiveSplitKernel(sized_for_lengths=sized_for_lengths)
    batch = prepare(kernel, WINDOWED, device)
    ref, tier = yardstick(kernel, WINDOWED, batch)
    grids, stage1 = [], mod._adaptive_stage1

    class Recording:
        def __getitem__(self, grid):
            grids.append(grid)
            return stage1[grid]

    mod._adaptive_stage1 = Recording()
    try:
        kernel.plan(batch)()
    finally:
        mod._adaptive_stage1 = stage1
    if device == "cuda":
        torch.cuda.synchronize()
    v = judge(WINDOWED, batch.out, batch.lse, ref.out, ref.lse, ref.visible, tier.outs, tier.lses, batch.sinks,
              lse_slack=tier.lse_slack)
    return v, kernel, [g[2] for g in grids]


def test_the_graph_configuration_launches_the_budget():
    """adaptive_split_graph (registry; what dispatch launches under CUDA-graph capture) plans
    for no lengths: its chunk axis is the whole budget, where the default stops at the longest
    visible request's count. Both are right. The mutant that measures a stage-2 count from the
    full length (fixtures/mutants.toml, adaptive_stage2_ignores_window) is killed only on the
    former: on the latter the axis bounds both stages' counts alike."""
    mod, _ = _adaptive()
    v_sized, sized, sized_axis = _planned_axis(True)
    v_graph, graph, graph_axis = _planned_axis(False)
    assert v_sized.passed, v_sized.summary()
    assert v_graph.passed, v_graph.summary()
    assert (sized.name, graph.name) == ("adaptive_split", "adaptive_split_graph")
    budget, _ = mod.plan_splits(2, 8, 4, device=_adaptive()[1], head_dim=64, kv_bytes=2)
    assert graph_axis == [budget]
    assert sized_axis[0] < budget, (sized_axis, budget)

"""The input distributions that stress the running max and the accumulator: each draws what
it says (cases.DATA_KINDS), a correct kernel that is not ours passes it, and the bug class it
exists for fails it while the same recipe under structured data passes.

The planted kernels are the out-of-tree tiled toy (suites/selftest/oot/toy_decode/tiled.py):
split-K online softmax in torch, with one numerics bug each."""
from __future__ import annotations

import pytest
import torch

from decode_conformance import case_sets as cs
from decode_conformance import factories
from decode_conformance.cases import DATA_KINDS, KEYS_MATTER, Case
from decode_conformance.runner import run_case

from suites.selftest import planted  # noqa: F401  (puts the out-of-tree package on sys.path)
import toy_decode  # noqa: E402
from toy_decode import tiled  # noqa: E402

EXP_LIMIT_F32 = 88.72  # ln(float32 max): exp overflows above it
FP16_MAX = torch.finfo(torch.float16).max


def _recipe(data: str, kv_dtype: str = "bf16", head_dim: str = "d64", lengths: str = "all-long") -> Case:
    case = cs.realize(dict(kv_dtype=kv_dtype, layout="paged16", heads="g2", head_dim=head_dim, window="none",
                           window_start="-", window_keys="-", softcap="off", sinks="off", lengths=lengths,
                           data=data, inputs="packed", scale="head-dim"), "interpreter")
    assert case is not None, data
    return case


def _scores(case: Case, batch, b: int) -> torch.Tensor:
    """float64 raw scores [Hq, n] of request b."""
    lo, hi = int(batch.kv_indptr[b]), int(batch.kv_indptr[b + 1])
    k = batch.k_slots()[batch.kv_indices[lo:hi].long()].double() * case.scales[0]
    q = batch.q[b].double().view(case.num_kv_heads, case.group, -1)
    return (torch.einsum("hgd,nhd->hgn", q, k) * case.sm_scale).reshape(case.num_q_heads, -1)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16", "e4m3", "e5m2"])
@pytest.mark.parametrize("head_dim", ["d64", "mla576"])
def test_late_spike_jumps_30_nats_late_on_every_other_row(kv_dtype, head_dim):
    case = _recipe("late-spike", kv_dtype, head_dim, lengths="long-short")
    batch = factories.build(case)
    positions = factories.spike_positions(case)
    spiked_rows = plain_rows = 0
    for b, L in enumerate(case.seq_lens):
        s = _scores(case, batch, b)
        spike = torch.zeros(L, dtype=torch.bool)
        spike[positions[b]] = True
        assert min(positions[b]) >= 3 * L // 4, "spikes must come late, after most tiles"
        if spike.all():
            continue
        margin = s[:, spike].amin(-1) - s[:, ~spike].amax(-1)
        for h in range(case.num_q_heads):
            if (b + h) % 2 == 0:
                spiked_rows += 1
                assert margin[h] > 30, (b, h, float(margin[h]))
                # equal spike scores: the budget of a spiked row stays a structured row's
                assert float(s[h, spike].max() - s[h, spike].min()) == 0.0
            else:
                plain_rows += 1
                assert float(s[h].max() - s[h].min()) < 20, "unspiked rows keep structured scores"
    assert spiked_rows and plain_rows


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16", "e4m3", "e5m2"])
def test_large_scores_pass_the_float32_exp_limit_and_stay_finite(kv_dtype):
    from decode_conformance.reference import reference
    case = _recipe("large-scores", kv_dtype, lengths="long-short")
    batch = factories.build(case)
    s = torch.cat([_scores(case, batch, b) for b in range(case.batch)], dim=-1)
    assert float(s.min()) > EXP_LIMIT_F32  # every raw exp(s) overflows float32
    assert float(s.max() - s.min()) < 20  # after the max is subtracted, structured scores
    assert torch.isfinite(reference(case, batch).out).all()


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp16", "e4m3", "e5m2"])
@pytest.mark.parametrize("head_dim", ["d64", "mla576"])
def test_large_v_fills_the_storage_type(kv_dtype, head_dim):
    case = _recipe("large-v", kv_dtype, head_dim, lengths="long-short")
    batch = factories.build(case)
    v = batch.v_slots()[batch.kv_indices.long()].float()
    assert float(v.abs().max()) == pytest.approx(factories.LARGE_V_STORED[kv_dtype], rel=0.07)
    assert torch.isfinite(v).all() and float(v.abs().max()) <= torch.finfo(case.cache_dtype).max
    assert float(v.abs().max()) * case.scales[1] <= FP16_MAX  # the output itself fits an fp16 row


def test_long_requests_keep_a_kind_where_every_key_matters():
    for profile in cs.PROFILES:
        for c in cs.build_set("parity", profile):
            if not c.label and cs.classify(c, profile).get("lengths") != "zero-one":
                assert c.data in KEYS_MATTER, c.id


def _drawn_as_randn(kind: str) -> bool:
    """Whether factories.build draws `kind` exactly as it draws randn: a kind listed in
    cases.DATA_KINDS that factories does not know falls through to N(0, 1) data."""
    base = _recipe("randn", lengths="zero-one").replace(softcap=30.0)  # huge-scores needs a cap
    ours, plain = factories.build(base.replace(data=kind)), factories.build(base)
    bits = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731  (bitwise: the caches' poison is NaN)
    return all(torch.equal(bits(getattr(ours, n)), bits(getattr(plain, n))) for n in ("q", "k_cache", "v_cache"))


@pytest.mark.parametrize("kind", sorted(set(DATA_KINDS) - {"randn"}))
def test_every_kind_draws_its_own_data(kind):
    assert not _drawn_as_randn(kind), (
        f"data kind {kind!r} (cases.DATA_KINDS) is drawn as randn: factories._values has no branch for it")


def test_a_kind_factories_does_not_know_is_caught(monkeypatch):
    monkeypatch.setitem(DATA_KINDS, "planted-unknown-kind", "listed, never drawn")
    assert _drawn_as_randn("planted-unknown-kind")


# ---- each kind earns its place: a correct foreign kernel passes, its bug class fails -----------
# (kind, the planted kernel it exists for, recipe values beyond the kind)
EARNERS = [
    ("large-scores", tiled.NoMaxSubtract, dict(lengths="long-short")),
    ("late-spike", tiled.FirstTileMax, dict(lengths="all-long")),
    ("large-v", tiled.Fp16TileSum, dict(lengths="all-long")),
]


@pytest.mark.parametrize("kind,bug,extra", EARNERS, ids=[k for k, _, _ in EARNERS])
def test_kind_kills_its_bug_and_structured_does_not(kind, bug, extra):
    case = _recipe(kind, **extra)
    twin = cs.realize(dict(cs.classify(case, "interpreter"), data="structured"), "interpreter")
    for good in (tiled.TiledDecode(), toy_decode.ToyDecode()):
        for c in (case, twin):
            res = run_case(good, c, "cpu")
            assert res.ok, f"{good.name} on {c.id}: {res.message}"
    res = run_case(bug(), case, "cpu")
    assert not res.ok, f"{bug.name} passed {case.id}"
    assert "nonfinite" in res.message or "budget" in res.message, res.message
    res = run_case(bug(), twin, "cpu")
    assert res.ok, f"{bug.name} failed the structured twin {twin.id}: {res.message}"

"""The float64 reference against independent computations (torch SDPA, hand-written
formulas) - the suite's ground truth must itself be checked."""
import math

import pytest
import torch
import torch.nn.functional as F

from decode_conformance.cases import Case
from decode_conformance.factories import build
from decode_conformance.reference import DEQUANT_KV, FP8_Q_AND_P, reference, saturating_cast, tier_attention


def _gather(b, r):
    sl = b.kv_indices[b.kv_indptr[r]:b.kv_indptr[r + 1]].long()
    k = b.k_slots()[sl].double() * b.k_scale
    v = b.v_slots()[sl].double() * b.v_scale
    return k, v


def _case(**kw):
    base = dict(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(33, 1, 90), page_size=16)
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize("kw", [dict(), dict(kv_dtype="e4m3"), dict(kv_dtype="fp16", layout="contig", page_size=1),
                                dict(mla=True, num_q_heads=16, num_kv_heads=1, head_dim=576, v_head_dim=512)])
def test_matches_sdpa(kw):
    c = _case(**kw)
    b = build(c)
    ref = reference(c, b)
    for r in range(c.batch):
        k, v = _gather(b, r)
        o = F.scaled_dot_product_attention(b.q[r].double()[:, None], k.transpose(0, 1), v.transpose(0, 1),
                                           scale=c.sm_scale, enable_gqa=True)[:, 0]
        torch.testing.assert_close(ref.out[r], o, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("conv, visible", [("counts-current", 7), ("excludes-current", 8)])
def test_window_sinks_softcap_by_hand(conv, visible):
    c = _case(window=7, window_convention=conv, sinks=True, softcap=2.0)
    b = build(c)
    ref = reference(c, b)
    G = c.group
    for r, L in enumerate(c.seq_lens):
        k, v = _gather(b, r)
        k, v = k[max(0, L - visible):], v[max(0, L - visible):]
        for h in range(c.num_q_heads):
            s = (k[:, h // G] @ b.q[r, h].double()) * c.sm_scale
            s = 2.0 * torch.tanh(s / 2.0)
            sink = b.sinks[h].double()
            z = torch.exp(s).sum() + torch.exp(sink)
            o = (torch.exp(s)[:, None] * v[:, h // G]).sum(0) / z
            torch.testing.assert_close(ref.out[r, h], o, rtol=1e-10, atol=1e-12)
            assert math.isclose(float(ref.lse[r, h]), float(torch.log(z)), rel_tol=1e-12)
    assert ref.visible.tolist() == [min(n, visible) for n in c.seq_lens]



def test_empty_rows_are_zero_and_low_scores_give_the_mean():
    c = _case(seq_lens=(0, 50), data="low-scores")
    b = build(c)
    ref = reference(c, b)
    assert (ref.out[0] == 0).all() and torch.isinf(ref.lse[0]).all()
    k, v = _gather(b, 1)
    mean = v.mean(0)  # [Hkv, Dv]
    torch.testing.assert_close(ref.out[1], mean.repeat_interleave(c.group, 0), rtol=1e-12, atol=1e-12)
    assert float(ref.lse[1].max()) < -4e5  # the scores really are near -5e5


def test_saturating_cast_saturates():
    x = torch.tensor([1000.0, -1000.0, 1.0, 1e6, float("nan")])
    got = saturating_cast(x, torch.float8_e4m3fn).float()
    assert got[:3].tolist() == [448.0, -448.0, 1.0] and torch.isnan(got[4])
    assert saturating_cast(x, torch.float8_e5m2).float()[3].item() == 57344.0


def test_fp8_q_and_p_tier_quantizes_q_and_p():
    """The tier's torch computation by hand: q saturated to e4m3, P = exp(s - max) to e4m3,
    the denominator from the unquantized P."""
    c = _case(kv_dtype="e4m3", seq_lens=(40,))
    b = build(c)
    t = tier_attention(c, b, FP8_Q_AND_P)
    k, v = _gather(b, 0)
    G = c.group
    for h in range(c.num_q_heads):
        q8 = saturating_cast(b.q[0, h], torch.float8_e4m3fn).double()
        s = (k[:, h // G] @ q8) * c.sm_scale
        p = torch.exp(s - s.max())
        p8 = p.float().to(torch.float8_e4m3fn).double()
        o = (p8[:, None] * v[:, h // G]).sum(0) / p.sum()
        torch.testing.assert_close(t.out[0, h].double(), o, rtol=1e-2, atol=1e-2)
        assert math.isclose(float(t.lse[0, h]), float(torch.logsumexp(s, 0)), rel_tol=1e-9)
    dq = tier_attention(c, b, DEQUANT_KV)
    assert not torch.equal(dq.out, t.out), "the tiers must compute differently"

"""The float64 reference against independent computations (torch SDPA, hand-written
formulas) - the suite's ground truth must itself be checked."""
import math

import pytest
import torch
import torch.nn.functional as F

from decode_conformance.cases import Case
from decode_conformance.factories import build
from decode_conformance.reference import reference


def _gather(b, r):
    c = b.case
    sl = b.kv_indices[b.kv_indptr[r]:b.kv_indptr[r + 1]].long()
    k = b.k_slots()[sl].double() * c.scales[0]
    v = b.v_slots()[sl].double() * c.scales[1]
    return k, v


def _case(**kw):
    base = dict(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(33, 1, 90), page_size=16)
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize("kw", [dict(), dict(kv_dtype="e4m3"), dict(kv_dtype="fp16", layout="contig", page_size=1),
                                dict(mla=True, num_q_heads=16, num_kv_heads=1, head_dim=576, v_head_dim=512)])
def test_matches_sdpa(kw):
    b = build(_case(**kw))
    ref = reference(b)
    for r in range(b.case.batch):
        k, v = _gather(b, r)
        o = F.scaled_dot_product_attention(b.q[r].double()[:, None], k.transpose(0, 1), v.transpose(0, 1),
                                           scale=b.case.sm_scale, enable_gqa=True)[:, 0]
        torch.testing.assert_close(ref.out[r], o, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("conv, visible", [("counts-current", 7), ("excludes-current", 8)])
def test_window_sinks_softcap_by_hand(conv, visible):
    c = _case(window=7, window_convention=conv, sinks=True, softcap=2.0)
    b = build(c)
    ref = reference(b)
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
    ref = reference(b)
    assert (ref.out[0] == 0).all() and torch.isinf(ref.lse[0]).all()
    k, v = _gather(b, 1)
    mean = v.mean(0)  # [Hkv, Dv]
    torch.testing.assert_close(ref.out[1], mean.repeat_interleave(c.group, 0), rtol=1e-12, atol=1e-12)
    assert float(ref.lse[1].max()) < -4e5  # the scores really are near -5e5

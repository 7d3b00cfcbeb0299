"""Factories: deterministic, both metadata views agree, and everything a request does not
own is poisoned with NaN."""
import math

import pytest
import torch

from decode_conformance.cases import Case
from decode_conformance.factories import build


def _case(**kw):
    base = dict(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(17, 0, 40, 1), page_size=16)
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize("kw", [dict(), dict(layout="contig", page_size=1), dict(page_size=1),
                                dict(kv_dtype="e4m3", page_size=64), dict(combined_kv=True, page_size=4),
                                dict(mla=True, num_q_heads=16, num_kv_heads=1, head_dim=576, v_head_dim=512),
                                dict(inputs="q-strided"), dict(inputs="table-wide"), dict(inputs="v-head-major")])
def test_views_agree_and_unowned_slots_are_nan(kw):
    c = _case(**kw)
    b = build(c)
    P = c.page_size
    assert b.kv_indptr.tolist() == [0] + list(torch.tensor(c.seq_lens).cumsum(0).tolist())
    owned = set()
    for r, n in enumerate(c.seq_lens):
        slots = b.kv_indices[b.kv_indptr[r]:b.kv_indptr[r + 1]].tolist()
        pages = b.block_table[r, :math.ceil(n / P)].tolist()
        expect = [pages[i // P] * P + i % P for i in range(n)]
        assert slots == expect, "CSR slots and page table disagree"
        assert (b.block_table[r, math.ceil(n / P):] == 0).all(), "unused block-table entries must be the null page"
        owned.update(slots)
    assert 0 not in owned, "slot 0 belongs to the null page"
    k = b.k_slots().float()
    mask = torch.zeros(k.shape[0], dtype=torch.bool)
    mask[list(owned)] = True
    if not c.is_fp8:  # fp8 NaN bytes: checked through the raw bytes below
        assert torch.isnan(k[~mask]).all(), "every slot no request owns must be NaN"
        assert not torch.isnan(k[mask]).any()
    else:
        raw = b.k_slots().view(torch.uint8)
        assert (raw[~mask] & 0x7F == 0x7F).all(), "fp8 e4m3 NaN byte expected in unowned slots"
    assert torch.isnan(b.out).all() and torch.isnan(b.lse).all(), "outputs arrive poisoned"


def test_pages_are_shuffled_and_not_consecutive():
    b = build(_case(seq_lens=(200,), page_size=16))
    pages = b.block_table[0, :13].tolist()
    assert pages != sorted(pages)
    assert any(abs(x - y) != 1 for x, y in zip(pages, pages[1:]))


def test_same_seed_same_tensors_other_seed_differs():
    c = _case(seed=11)
    a, b, d = build(c), build(c), build(c, seed=12)
    assert torch.equal(a.q, b.q) and torch.equal(a.kv_indices, b.kv_indices)
    assert torch.equal(a.k_cache.nan_to_num(7.0), b.k_cache.nan_to_num(7.0))
    assert not torch.equal(a.q, d.q)


def test_mla_v_is_a_view_of_k():
    b = build(_case(mla=True, num_q_heads=16, num_kv_heads=1, head_dim=576, v_head_dim=512))
    assert b.v_cache.data_ptr() == b.k_cache.data_ptr() and b.v_cache.shape[-1] == 512
    assert not b.v_cache.is_contiguous()


def test_fp8_scales_are_unequal_and_not_one():
    b = build(_case(kv_dtype="e5m2"))
    assert b.k_scale != b.v_scale and 1.0 not in (b.k_scale, b.v_scale)


def test_big_pool_places_pages_past_2_31_bytes():
    c = _case(kv_dtype="e4m3", num_kv_heads=1, num_q_heads=4, seq_lens=(20,), min_pool_bytes=2**31 + 2**20)
    b = build(c)
    elem_offset = int(b.kv_indices.min()) * b.k_slots().stride(0)
    assert elem_offset >= 2**31, "the overflow case must put used keys past int32 element offsets"


def test_each_input_form_changes_its_one_tensor_and_keeps_the_values():
    packed = build(_case())
    q_strided, wide, v_major = (build(_case(inputs=f)) for f in ("q-strided", "table-wide", "v-head-major"))
    # q: a view into a fused qkv row whose K and V parts are NaN; the same values
    B, Hq, Dk = packed.q.shape
    assert q_strided.q.stride() == ((Hq + 2 * 2) * Dk, Dk, 1) and not q_strided.q.is_contiguous()
    row = torch.as_strided(q_strided.q, (B, (Hq + 4) * Dk), (q_strided.q.stride(0), 1))
    assert torch.isnan(row[:, Hq * Dk:]).all() and torch.equal(q_strided.q, packed.q)
    # block table: 2 x max_pages + 3 columns, the extra ones the null page; the same pages
    pages = packed.block_table.shape[1]
    assert wide.block_table.shape == (B, 2 * pages + 3) and (wide.block_table[:, pages:] == 0).all()
    assert torch.equal(wide.block_table[:, :pages], packed.block_table)
    # V: head-major storage behind the usual view, K untouched; the same values in every slot
    assert v_major.v_cache.shape == packed.v_cache.shape and v_major.v_cache.stride() != v_major.k_cache.stride()
    assert v_major.v_cache.permute(0, 2, 1, 3).is_contiguous()
    assert torch.equal(v_major.v_slots().nan_to_num(7.0), packed.v_slots().nan_to_num(7.0))
    assert v_major.k_cache.stride() == packed.k_cache.stride()

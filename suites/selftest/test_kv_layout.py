"""kernels/kv_layout.py: the head tiling, cache addressing and window encoding that the split-K
and Lean kernels share (one module, one encoding of "no window")."""
from __future__ import annotations

import pytest
import torch

from decode_conformance_kernels import kv_layout, lean
from decode_conformance_kernels import triton_common as tc


def test_no_window_is_one_int32_value():
    assert kv_layout.visible_arg(None) == kv_layout.NO_WINDOW == 2**31 - 1
    assert kv_layout.visible_arg(4096) == 4096
    with pytest.raises(ValueError, match="window"):
        kv_layout.visible_arg(0)


@pytest.mark.parametrize("hq, hkv, cap, hpt, tiles", [
    (32, 8, 64, 4, 1), (128, 1, 64, 64, 2), (128, 1, 16, 16, 8), (24, 1, 16, 12, 2), (7, 1, 16, 7, 1),
    (5, 1, 4, 1, 5), (56, 8, 16, 7, 1),
])
def test_head_tiles_are_equal_and_never_straddle_kv_heads(hq, hkv, cap, hpt, tiles):
    t = kv_layout.head_tiling(hq, hkv, cap)
    assert (t["heads_per_tile"], t["tiles_per_kv"]) == (hpt, tiles)
    assert t["heads_per_tile"] * t["tiles_per_kv"] == hq // hkv  # no partial tile, no head lost
    assert t["BLOCK_H"] >= max(16, hpt)


def test_bad_head_counts_name_the_field():
    with pytest.raises(ValueError, match="num_kv_heads"):
        kv_layout.head_tiling(6, 4, 16)


def test_addressing_flattens_evenly_spaced_pages_only():
    pool = torch.zeros(10, 16, 2, 8)
    assert kv_layout.cache_addressing(pool) == (1, 16, 0, 8, 1)  # slot s at s * 16
    kv = torch.zeros(10, 2, 16, 2, 8)  # K and V pages interleaved: page stride 2 x 16 slots
    assert kv_layout.cache_addressing(kv[:, 0]) == (16, 512, 16, 8, 1)


def test_a_head_major_v_beside_an_evenly_spaced_k_is_addressed_by_its_pages():
    k = torch.zeros(10, 16, 2, 8)  # evenly spaced slots: alone it would be slot-addressed
    v = torch.zeros(10, 2, 16, 8).permute(0, 2, 1, 3)  # stored head-major, viewed [pages, P, Hkv, D]
    assert kv_layout.pair_addressing(k, v) == (16, (256, 16, 8, 1), (256, 8, 128, 1))
    assert kv_layout.pair_addressing(k, k) == (1, (16, 0, 8, 1), (16, 0, 8, 1))
    with pytest.raises(ValueError, match=r"share a page size: got pages of \(10, 16\) and \(10, 8\)"):
        kv_layout.pair_addressing(k, torch.zeros(10, 2, 8, 8).permute(0, 2, 1, 3))


def test_both_kernel_families_use_the_shared_module(monkeypatch):
    assert tc.visible_arg is kv_layout.visible_arg and tc.cache_addressing is kv_layout.cache_addressing
    assert tc.head_tiling(128, 1) == kv_layout.head_tiling(128, 1, tc.MAX_HEADS_PER_TILE)
    assert lean.head_tile_shape(128, 1) == (128, 16, 8)
    seen = []
    real_visible, real_addr = kv_layout.visible_arg, kv_layout.cache_addressing
    monkeypatch.setattr(kv_layout, "visible_arg", lambda w: seen.append(("window", w)) or real_visible(w))
    monkeypatch.setattr(kv_layout, "cache_addressing", lambda c: seen.append(("cache", c.dim())) or real_addr(c))
    B, Hq, Hkv, D = 1, 4, 1, 64
    q = torch.zeros(B, Hq, D, dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, Hkv, D, dtype=torch.bfloat16)
    lean.plan_lean(q, cache, cache, torch.tensor([0, 5], dtype=torch.int32), torch.arange(5, dtype=torch.int32),
                   torch.zeros(B, Hq, D, dtype=torch.bfloat16), torch.zeros(B, Hq), sm_scale=0.125, window=None)
    assert ("window", None) in seen and ("cache", 4) in seen

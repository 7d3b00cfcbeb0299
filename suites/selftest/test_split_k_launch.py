"""The split-K kernels' launch configuration (kernels/triton_common.py `gpu_config`), and which int
arguments the shipped kernels (Lean's too) leave unspecialized: the choices the H200
measurements in the comments there stand behind (docs/gpu-runs/2026-12-02-h200-s16/,
2026-12-03-h200-s17/)."""
from __future__ import annotations

import pytest

from decode_conformance_kernels import adaptive_split, fixed_split, lean
from decode_conformance_kernels import triton_common as tc

H200_SMEM = 232448  # bytes of shared memory a program may use on sm_90
SM120_SMEM = 101376


def test_fp8_small_class_takes_its_own_first_row():
    bf16 = tc.gpu_config(128, 128, False, H200_SMEM)
    fp8 = tc.gpu_config(128, 128, False, H200_SMEM, kv_bytes=1)
    assert (bf16["block_n"], bf16["num_stages"]) == (64, 3)
    assert fp8 == dict(block_n=128, num_warps=4, num_stages=3)  # 3 x 128 x 256 x 1 byte + 16 KiB = 112 KiB


def test_fp8_falls_back_by_bytes():
    # 112 KiB > 99 KiB for the first two rows (128 x 3 and 64 x 6 stages): the third, 64 keys x 4
    assert tc.gpu_config(128, 128, False, SM120_SMEM, kv_bytes=1) == dict(block_n=64, num_warps=4, num_stages=4)


def test_fp8_keeps_the_16_bit_rows_where_not_measured_faster():
    for dk, dv, share in ((256, 256, False), (576, 512, True)):
        assert tc.gpu_config(dk, dv, share, H200_SMEM, kv_bytes=1) == tc.gpu_config(dk, dv, share, H200_SMEM)


def test_hip_keeps_its_pipeliner_depth_for_fp8():
    assert tc.gpu_config(128, 128, False, H200_SMEM, is_hip=True, kv_bytes=1)["num_stages"] == tc.HIP_MAX_STAGES


def test_mla_576_takes_64_keys_in_two_stages():
    assert tc.gpu_config(576, 512, True, H200_SMEM) == dict(block_n=64, num_warps=8, num_stages=2)


def test_kv_bytes_is_checked():
    with pytest.raises(ValueError, match="kv_bytes"):
        tc.gpu_config(128, 128, False, H200_SMEM, kv_bytes=4)


# Unspecialized on the H200 at the same speed: the per-launch scalars and runtime flags (s16)
# and the LSE strides (s20: 412 -> 303 variants in a cold main job, every peer-table cell
# within 0.8 %, the same registers; stage 2's chunk axis too). The head tiling, unspecialized too, made 1 x 128k 27 %
# slower (s16-3), and the page size and K/V strides 10-69 % (close 8): they stay specialized.
# Since session 40 stage 1's group and heads per tile are unspecialized, their multiple-of-16
# class passed as constexpr hints instead (GQA PTX unchanged, the MLA cell -2.4 % on an H100;
# without the hints +37 %: docs/gpu-runs/2026-12-06-h100-s40/); tiles_per_kv stays.
# Written out here, not read from tc.LSE_STRIDES: the test names what it expects.
LSE_STRIDES = ("stride_lb", "stride_lh", "stride_lseb", "stride_lseh")  # partial and final LSE
UNSPECIALIZED = {
    "_adaptive_stage1": {"has_sinks", "store_lse", "pdl_early", "visible", "grid", "occupancy", "B", "ceiling",
                         *LSE_STRIDES, "group", "heads_per_tile"},
    "_adaptive_stage2": {"has_sinks", "store_lse", "visible", "grid", "occupancy", "B", "ceiling",
                         *LSE_STRIDES},
    "_fixed_stage1": {"visible", "num_splits", "stride_lb", "stride_lh", "group", "heads_per_tile"},
    "_fixed_stage2": {"has_sinks", "store_lse", "visible", "num_splits", *LSE_STRIDES},
    # Lean reads its head counts once per segment, outside the key loop; TILES_PER_KV stays.
    "lean_decode_kernel": {"B", "window", "NUM_KV_HEADS", "GROUP", "HPT", "stride_lb"},
}
MODULES = {"_adaptive": adaptive_split, "_fixed": fixed_split, "lean": lean}


@pytest.mark.parametrize("name", sorted(UNSPECIALIZED))
def test_only_per_launch_scalars_are_unspecialized(name):
    module = next(m for prefix, m in MODULES.items() if name.startswith(prefix))
    kernel = getattr(module, name)
    listed = getattr(kernel, "do_not_specialize", None)
    if listed is None:  # the CPU interpreter's wrapper keeps the decorator's arguments in kwargs
        listed = kernel.kwargs.get("do_not_specialize", [])
    assert set(listed) == UNSPECIALIZED[name]


# (group, heads per tile) -> (GROUP_DIV16, TILE_DIV16): the hint is claimed only for a multiple
# of 16, never for a group or tile merely large (24, 40) or a multiple of 8 (8).
HINTS = [((1, 1), (False, False)), ((8, 8), (False, False)), ((16, 16), (True, True)),
         ((24, 24), (False, False)), ((80, 40), (True, False)), ((128, 64), (True, True))]


@pytest.mark.parametrize("tiling,expected", HINTS, ids=[f"g{g}-t{t}" for (g, t), _ in HINTS])
def test_head_hints_claim_only_multiples_of_16(tiling, expected):
    group, heads_per_tile = tiling
    hints = tc.head_hints(dict(group=group, heads_per_tile=heads_per_tile))
    assert (hints["GROUP_DIV16"], hints["TILE_DIV16"]) == expected

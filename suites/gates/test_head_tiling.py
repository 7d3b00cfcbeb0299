"""The Lean gate's head tiles against the split-K kernels' head tiling. The gate counts query-head
parallelism in 16-head tiles (the unit its calibration thresholds are expressed in); the kernels
tile up to 64 heads of a group. The two must agree wherever the calibration was measured
(groups of 16 or fewer) and their difference above is a known, named one - not drift."""
import pytest

from decode_conformance_kernels import lean_gate, triton_common

# (Hq, Hkv): GQA groups 1-16 of common models and tensor-parallel shards, and the shapes of the
# sm_90 calibration sweep (32/8, 28/4).
SMALL_GROUPS = [(32, 32), (32, 8), (28, 4), (32, 4), (64, 8), (48, 6), (16, 8), (24, 8), (48, 16), (16, 1),
                (8, 8), (128, 8)]
# (Hq, Hkv, gate tiles, kernel tiles): groups over 16, where the kernel packs more heads a tile.
LARGE_GROUPS = [(32, 1, 2, 1), (128, 1, 8, 2), (64, 2, 4, 2), (96, 4, 6, 4)]


@pytest.mark.parametrize("hq, hkv", SMALL_GROUPS)
def test_gate_counts_the_kernels_tiles_for_groups_up_to_16(hq, hkv):
    kernel = triton_common.head_tiling(hq, hkv)["kv_head_tiles"]
    assert lean_gate.head_tiles(hq, hq // hkv) == kernel, (
        f"{hq}/{hkv}: gate {lean_gate.head_tiles(hq, hq // hkv)} head tiles, split-K kernel {kernel}")


@pytest.mark.parametrize("hq, hkv, gate, kernel", LARGE_GROUPS)
def test_gate_counts_16_head_tiles_where_the_kernel_packs_more(hq, hkv, gate, kernel):
    assert lean_gate.head_tiles(hq, hq // hkv) == gate
    assert triton_common.head_tiling(hq, hkv)["kv_head_tiles"] == kernel

"""Launch constants of the shipped Triton kernels that host code outside them needs: the case
generator (decode_conformance.case_sets) places split edges on the fixed-split kernel's split
rule and Lean's key tiles. Plain Python, no torch and no Triton: case_sets imports it before
the plugin switches Triton's interpreter on, which importing a kernel module would defeat.
The kernels import their constants from here, so the generator reads the values they launch
with, not a copy.
"""
from __future__ import annotations

# Fixed split-K: sglang's decode rule, split lengths rounded up to multiples of 32 keys, 8 splits.
FIXED_DEFAULT_SPLITS = 8
FIXED_SPLIT_ALIGN = 32

# Lean: key tile in the interpreter (it costs ~3 ms per program x key block, so small) and the
# most query heads per tile by default (tl.dot needs M >= 16; a tile never straddles KV heads).
LEAN_CPU_BLOCK_N = 64
LEAN_BLOCK_H = 16

# NVIDIA launch configurations, in order of preference: (BLOCK_N, num_warps, num_stages, programs
# per SM, most query heads per tile, shared memory a bf16 cache takes on sm_90). The first whose
# shared memory fits the device's per-program limit is used. Why these (H200, triton 3.6,
# docs/gpu-runs/2026-12-01-h200/probe6 and probe7): compiled for sm_90, num_stages 2-4 keep one
# K and one V buffer and wait for every copy at the top of each key step (the slot-id load that
# feeds the K/V addresses takes a pipeline stage), so a step's loads never overlap its math;
# 5-6 stages give two buffers and a real prefetch. That is worth having where one program per
# SM is all the shared memory allows:
# - Dk <= 128: 128 keys, 4 warps, 2 stages, 2 per SM stays: double-buffered configs were within
#   2 % on the ragged batches (32/8/128 b16-32, 28/4/128) and slower at batch 1 (1 x 1k 18.1 /
#   24.2 us against 15.8).
# - Dk <= 256: 64 keys, 8 warps, 6 stages, 1 per SM: 16/2/256 1 x 128k 106.8 us (2 stages: 167.6),
#   1 x 32k 58.4 (97.3), 4 x 32k 92.7 (123.2), 32 x 4k 89.4 (115.5), b16 ragged 16k 120.1 (157.9).
# - MLA (V inside K, 512 + 64): 64 keys, 8 warps, 5 stages, 1 per SM, 32 heads per tile (each
#   tile reads the latent cache once: 4 reads for 128 heads instead of 8): 8 x 16k 300.9 us (was
#   373.3), 8 x 64k 1073 (1370), b32 ragged 853 (987), b16 ragged r=0.1 313 (323), 1 x 16k 89.1
#   (90.0); 32 x 4k 294.6 (277.4) the one cell it lost. 64 heads per tile spill (Lean's combine
#   holds three [rows, Dv] fp32 tiles): 368+ bytes per thread at 8 or 16 warps.
LEAN_GPU_CONFIGS = {
    "small": ((128, 4, 2, 2, 16, 74240),),
    "medium": ((64, 8, 6, 1, 16, 141824), (64, 4, 2, 2, 16, 75776)),
    "mla": ((64, 8, 5, 1, 32, 189440), (64, 4, 2, 2, 16, 94208)),
    "large": ((64, 4, 2, 2, 16, 0),),  # Dk > 256 with its own V: sglang's Lean tile, not re-measured
}


def config_class(block_d1: int, mla: bool) -> str:
    """The LEAN_GPU_CONFIGS row of a key width (the padded first part of K) and attention kind."""
    if mla and block_d1 <= 512:
        return "mla"
    return "small" if block_d1 <= 128 else "medium" if block_d1 <= 256 else "large"

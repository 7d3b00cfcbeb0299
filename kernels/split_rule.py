"""The adaptive split-K chunk rule (pure python: no torch/triton import at module level).

The split-K rule: chunks sized by length and SM count, after FlashML PR #729 ("perf(kernel):
split triton decode attention by context length and sm count", a sglang-style two-stage
decode): a request's keys are cut into chunks that run in parallel; the chunk
count is the smaller of
  - a length-based count: chunks of at least MIN_CHUNK keys, and
  - an occupancy count: about `programs_per_sm` programs per SM over batch x KV-head tiles,
    capped at the split cap (both from `launch_shape`), raised to fill whole waves when one
    wave would be left part empty (`occupancy_splits`); in the 16-bit 4-warp row, the count
    for one program per SM fewer than it holds, not raised (`split_programs_per_sm`);
and every chunk is a whole number of key blocks. The PR's worked example: on a 132-SM H100,
Qwen3.6's full-attention shape 16/2/256 (2 KV-head tiles) at batch 1, a 32k request takes
64 chunks of 512 keys (occupancy 2*132 // 2 = 132, capped at 64; 32768 // 128 = 256 by length).
The constants below are the H200's (`launch_shape`): the same shape takes 128 chunks of 256.

Ragged batches: the occupancy count gives every request of a batch the same cap, so in a
batch of 16 requests from 1.6k to 65k keys the longest ones got 4 chunks and finished last
(an H200 run measured 647 us against 452 us with length-proportional chunks, fixed 8 splits
546 us). So a request's cap is the larger of the batch's occupancy count and its *share* of
the whole chunk budget: floor(budget x its visible length / the batch's total length), the
budget being the occupancy count of a batch of one (`grid_splits`). Uniform batches keep the
occupancy count; a long request next to short ones gets the chunks the short ones leave.
The share rounds down: rounded up, a uniform batch of B got ceil(budget / B) chunks each,
more programs than the occupancy count places - at 32/8/128 4 x 128k on an H200 (budget 66,
occupancy 16) 17 chunks, 544 programs for 528 slots, a second wave: 698 us against 513.

In the 16-bit 4-warp row the counts aim at one program per SM fewer than an SM holds
(`split_programs_per_sm`), and so does the budget (66 at 32/8/128 on 132 SMs, not 82): right for
a batch of one and for equal requests, whose counts fill the aimed-at slots. A ragged batch whose
longest request is sized by its share, not by the occupancy count, leaves that fifth slot to the
requests that finish early; there the shares come from the budget for what an SM holds
(`share_budget`). The host decides from the planned lengths; the device formulas are unchanged
(the budget is an argument), so a graph replayed with other lengths stays right.

Under CUDA graphs the grid is fixed at capture, so the host sizes its split axis with
`grid_splits` (the whole budget: the most chunks any request can take, whatever the
lengths), and each program recomputes its request's cap and count from the current lengths
on the device (the batch's total length is kv_indptr[B]) with the same formulas
(`adaptive_split.request_cap_device` / `chunk_count_device` mirror `request_cap` /
`chunk_count_for_cap`).

Chunk boundaries: the request's B = ceil(L / block) key blocks are dealt out as evenly as
possible, chunk i taking blocks [i*B // n, (i+1)*B // n). Every chunk is a whole number of
blocks (the last one clipped at L), lengths differ by at most one block, and no chunk below
the count is empty. (A uniform length ceil(L/n) rounded up to the block would leave trailing
chunks empty and make the count of non-empty chunks fall as L grows: 64 chunks at 32768 keys,
61 at 32769.)
"""
from __future__ import annotations

import os

# FlashML PR #729 says "about 2 programs per SM, at most 64 splits" (its RTX follow-up found 32 enough
# on consumer cards). On an H200 (docs/gpu-runs/2026-12-01-h200/) the best count is the number
# of stage-1 programs an SM holds at once, so a uniform batch runs in one full wave:
# - 4-warp programs (head dims up to 128): 96 registers x 128 threads and 39 KB of shared
#   memory, 5 per SM; 5 per SM ran 32/8/128 16 x 64k in 981 us (4: 1043-1051, 6: 1259),
#   4 x 128k 501 (4: 537-600), 32 x 16k 545 (4: 548-618), 1 x 128k 143 (4: 140-158);
# - 8-warp programs (head dims above 128, `triton_common.GPU_CONFIGS`): 128 registers x 256
#   threads, 2 per SM; 4 per SM was 4-6 % slower at 16/2/256 4 x 32k, 32 x 4k, 16 x 4k, 32 x 1k;
# - MLA (128 query heads on one latent head): 1 per SM. A partial costs Hq x Dv x 8 bytes
#   (fp32 written and read back): 512 KiB for 128 x 512, 3.6 x the K bytes of a 128-key chunk,
#   so fewer chunks win: batch 8 x 4k 79 us with 1 per SM, 92 us with 2 (fixed 8 splits 78).
# The split cap: 128 for GQA/MHA (16/2/256 at 1 x 128k: 85 us with 128 chunks, 101 with 64),
# 64 for MLA (1 x 16k: 65 us with 128, 51 with 64).
# - fp8 caches, 4-warp programs: the fp16-dot path (`triton_common.attend_range`) compiles to 168
#   registers, 3 per SM (docs/gpu-runs/2026-12-03-h200-s20/); a grid sized for 3 ran e4m3
#   32/8/128 5-14 % faster than one sized for 5 at 6 of 7 cells (s20-2/pps.md), the 7th (32 x 8k)
#   being the one-chunk case below. Not the fp8-MMA tier (fp8 x fp8 dots, `fp8_mma`): sized for 3,
#   its b4-32k ran 147.1 us against 136.3 for 5 (s22-1, the perf guard).
PROGRAMS_PER_SM = 5
# The chunk counts of that 4-warp 16-bit row aim at 4 programs per SM, one fewer than an SM holds: on
# the kernels of 2026-12-04 (stage 2 sized for the planned counts), the chunks sweep found the floor
# count for 4 per SM, not raised, the fastest 64-key count at every 32/8/128 cell of batch 8 to 32
# (8, 4, 2, 2 chunks against 10, 5, 10, 5: 0.1-8.4 % faster; docs/gpu-runs/2026-12-04-h200-s27),
# and A/B in one process a batch of one (82 -> 66 chunks) ran 1.0-2.7 % faster, batch 4 1.8-2.0 %.
# Where 4 per SM give one chunk and 5 give two or more (32/8/128 batch 34-41) the count for 5, not
# raised; one chunk keeps its treatment (`occupancy_splits`: batch 48 and 64 stay at 1, which the
# sweep timed 8-15 % faster than the 4 chunks a raise at 4 per SM plans). The cost: a ragged batch's
# long requests share a budget of 66 chunks, not 82 (b4-ragged 1.5-1.9 % slower in that A/B).
# Not the 8-warp, fp8 and MLA rows: their counts (and the raise) are the measured ones below.
SPLIT_PROGRAMS_PER_SM = 4
FP8_PROGRAMS_PER_SM = 3
WIDE_PROGRAMS_PER_SM = 2
WIDE_HEAD_DIM = 128  # head dims above this launch 8-warp programs
MLA_PROGRAMS_PER_SM = 1
MAX_SPLITS = 128
MLA_MAX_SPLITS = 64
# Whole waves: the occupancy count floor(slots / (batch x tiles)) fills one wave of stage-1
# programs, but only in part when a chunk's programs are a large share of it: 32/8/128 at
# batch 32 is 256 programs per chunk, so 2 chunks use 512 of an H200's 660 slots (78 %). Then
# the count is the smallest one, up to 4x the occupancy count, that fills >= WAVE_FILL of the
# slots of its waves: 5 chunks, 1280 of 2 x 660 (97 %). H200, one batch per cell, 32/8/128
# (docs/gpu-runs/2026-12-01-h200/probe4): 32 x 16k 522 us with 5 chunks, 561 with 2, 545 with 4
# (78 % again), 667 with 3 (58 %); 32 x 64k 1982 vs 2171; counts whose fill is >= 97 % already
# (batch 8 and 16, every 16/2/256 batch) gained nothing from more chunks. A count of 1 stays 1:
# one chunk is the direct path with no stage 2 (128 x 1k: 143 us against 168 for 8 splits).
# 0.9 from the same cells: time tracked the fill - at 32 x 16k counts filling 93-97 % ran
# 522-531 us, 89 % 542, 78 % 545-561, 58 % 667 - and >= 90 % kept the counts within 2 % of the best.
WAVE_FILL = 0.9
# Smallest chunk the length-based count makes (keys). Any value <= 512 reproduces the PR's
# example; the PR also reports 1k contexts within 1.5% of the fixed 8-split kernel, whose
# splits there are 128 keys. 128 it is: on an H200 (16/2/256, 1 x 1k) 128-key chunks ran in
# 15 us against 20 us with 256-key chunks.
MIN_CHUNK = 128
# Chunk granularity: the kernel's key block (sglang rounds splits to 32 keys).
KEY_BLOCK = 32
# SM count assumed where torch reports no GPU (CPU interpreter runs): an H100/H200's 132, so a
# CPU run takes the same chunk counts a GPU run would. Override with this environment variable.
DEFAULT_NUM_SMS = 132
NUM_SMS_ENV = "DECODE_CONFORMANCE_NUM_SMS"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_sms(device=None, default: int | None = None) -> int:
    """Streaming multiprocessors of `device` (CUs on ROCm: torch reports them as
    multi_processor_count). On a CPU device, or without a GPU: $DECODE_CONFORMANCE_NUM_SMS,
    else `default`, else DEFAULT_NUM_SMS."""
    env = os.environ.get(NUM_SMS_ENV, "").strip()
    fallback = int(env) if env else (DEFAULT_NUM_SMS if default is None else int(default))
    try:
        import torch
    except ImportError:
        return fallback
    if device is None:
        if not torch.cuda.is_available():
            return fallback
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        return fallback
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def launch_shape(head_dim: int, mla: bool, kv_bytes: int = 2, fp8_mma: bool = False) -> tuple[int, int]:
    """(programs per SM, split cap) for a head dim (of K), attention kind, cache element size
    (1: fp8) and dot form: an fp8 cache read into fp16 dots (fp8_mma False) holds more registers
    per 4-warp program than one whose dots stay fp8 (the fp8-MMA tier)."""
    if mla:
        return MLA_PROGRAMS_PER_SM, MLA_MAX_SPLITS
    if head_dim > WIDE_HEAD_DIM:
        return WIDE_PROGRAMS_PER_SM, MAX_SPLITS
    return (FP8_PROGRAMS_PER_SM if kv_bytes == 1 and not fp8_mma else PROGRAMS_PER_SM), MAX_SPLITS


def split_programs_per_sm(head_dim: int, mla: bool, kv_bytes: int = 2) -> int | None:
    """Programs per SM the chunk counts aim at where that is fewer than `launch_shape`'s (the
    4-warp row on a 16-bit cache: SPLIT_PROGRAMS_PER_SM); None elsewhere (the counts aim at
    what an SM holds)."""
    if mla or head_dim > WIDE_HEAD_DIM or kv_bytes != 2:
        return None
    return SPLIT_PROGRAMS_PER_SM


# What one SM holds, for `resident_programs`: NVIDIA's per-SM limits of compute capability 9.0
# (CUDA C++ Programming Guide, the technical specifications per compute capability: 64 K
# registers, 228 KB of shared memory with 1 KB reserved per block, 2048 threads, 32 blocks) and
# the occupancy calculator's register allocation, per warp in units of 256 registers.
SM90_LIMITS = dict(registers=65536, shared_bytes=233472, shared_reserved=1024, threads=2048, programs=32)
REGISTER_UNIT = 256
WARP_SIZE = 32


def resident_programs(registers: int, num_warps: int, shared_bytes: int, *, limits: dict = SM90_LIMITS) -> int:
    """How many programs of a compiled kernel (registers per thread, warps, shared memory bytes)
    one SM holds at once: the least of what its registers, shared memory, threads and block
    slots allow. The rule's programs per SM (`launch_shape`) are only true while this is at
    least as large; suites/selftest/test_stage1_occupancy.py checks it on a GPU."""
    if registers < 1 or num_warps < 1 or shared_bytes < 0:
        raise ValueError(f"resident_programs: registers={registers}, num_warps={num_warps}, "
                         f"shared_bytes={shared_bytes}: expected registers >= 1, num_warps >= 1, shared_bytes >= 0")
    per_warp = -(-registers * WARP_SIZE // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = (limits["registers"] // per_warp) // num_warps
    by_shared = limits["shared_bytes"] // (shared_bytes + limits["shared_reserved"])
    by_threads = limits["threads"] // (num_warps * WARP_SIZE)
    return min(by_registers, by_shared, by_threads, limits["programs"])


def wave_fill(programs: int, slots: int) -> float:
    """The fraction of the program slots used over the waves `programs` equal programs take
    (`slots` = programs per SM x SMs)."""
    return programs / (_cdiv(programs, slots) * slots)


def occupancy_splits(batch: int, kv_head_tiles: int, num_sms: int, max_splits: int = MAX_SPLITS,
                     programs_per_sm: int = PROGRAMS_PER_SM, split_programs_per_sm: int | None = None) -> int:
    """Chunks per request for a batch of equal requests, in [1, max_splits]: the count that puts
    about `programs_per_sm` stage-1 programs on every SM (floor(slots / (batch x tiles))), or,
    when that count (>= 2) leaves more than a tenth of its wave empty, the smallest count up to
    4x it whose waves are >= WAVE_FILL full (else the fullest of them). A count of 1 whose
    programs fit one wave is raised only to a count of 3 or 4 that fills >= WAVE_FILL.
    With `split_programs_per_sm` (fewer than `programs_per_sm`: `split_programs_per_sm()`'s row),
    the floor count for that many programs per SM where it is 2 or more, else the floor count
    for `programs_per_sm` where that is 2 or more, neither raised; a count of 1 as above."""
    if batch < 1 or kv_head_tiles < 1 or num_sms < 1 or max_splits < 1:
        raise ValueError(f"occupancy_splits: batch={batch}, kv_head_tiles={kv_head_tiles}, "
                         f"num_sms={num_sms}, max_splits={max_splits} must all be >= 1")
    slots, per_chunk = programs_per_sm * num_sms, batch * kv_head_tiles
    floor_count = max(1, min(max_splits, slots // per_chunk))
    if split_programs_per_sm is not None:
        aimed = max(1, min(max_splits, split_programs_per_sm * num_sms // per_chunk))
        if aimed >= 2 or floor_count >= 2:
            return aimed if aimed >= 2 else floor_count
    if floor_count < 2:
        # One chunk is the direct path (no stage 2, no partials), kept when its programs already
        # take a wave or more, or no few chunks fill one: e4m3 32/8/128 at 32 x 8k, 256 programs
        # on 396 slots (65 %), takes 3 chunks (768 of 792).
        if per_chunk >= slots or wave_fill(per_chunk, slots) >= WAVE_FILL:
            return floor_count
        # Only when one chunk leaves more than a tenth of its wave empty: H200, s21, raised from one
        # wave 91-97 % full it ran slower (bf16 32/8/128 80 x 2k +4.8 % to 2 chunks, +6.9 % to 3;
        # 16/2/256 120 x 8k +2.3 %, +3.5 %), from 63-73 % faster (52 x 4k -8.3 %, 56 x 8k -3.5 %,
        # MLA 48 x 4k -7.8 %). (From under 90 %, 2 chunks never reach 90 %: the search starts at 3.)
        counts = range(3, min(max_splits, 4) + 1)
        return next((c for c in counts if wave_fill(per_chunk * c, slots) >= WAVE_FILL), 1)
    counts = range(floor_count, min(max_splits, 4 * floor_count) + 1)
    fill = {c: wave_fill(per_chunk * c, slots) for c in counts}
    full = [c for c in counts if fill[c] >= WAVE_FILL]
    return full[0] if full else max(counts, key=lambda c: (fill[c], -c))


def grid_splits(batch: int, kv_head_tiles: int, num_sms: int, max_splits: int = MAX_SPLITS,
                programs_per_sm: int = PROGRAMS_PER_SM, split_programs_per_sm: int | None = None) -> int:
    """The most chunks any request can take: the chunk budget of the whole grid (a batch of
    one's occupancy count), the stage-1 grid's split axis (fixed at CUDA-graph capture,
    whatever the lengths). `batch` is validated but does not change it."""
    if batch < 1:
        raise ValueError(f"grid_splits: batch={batch} must be >= 1")
    return occupancy_splits(1, kv_head_tiles, num_sms, max_splits, programs_per_sm, split_programs_per_sm)


def share_budget(visible_lengths, total: int, budget: int, occupancy: int, resident_budget: int) -> int:
    """The chunk budget a planned batch's shares are computed from: `resident_budget` (the budget
    for the programs an SM holds) when some request's share of `budget` exceeds the occupancy
    count, so that shares, not the occupancy count, size the batch's longest request; else
    `budget`. A batch of one (share = budget = its occupancy count) and a batch of equal
    requests (share floor(budget / B), which the occupancy count is at least) keep `budget`.
    Why: at 32/8/128 b4-ragged ([131072, 1024, 65536, 7]; budget 66, occupancy 16) the 128k
    request's share is 43 chunks; from 82 it is 54, which ran 1.4 % faster on an H200 (s30-2) and
    2.4 % on an H100 (s33-1), while a budget of 82 for every batch cost a batch of one 2-4 % and
    b4-32k 1.4 % (docs/gpu-runs/2026-12-05-h200-s30, 2026-12-05-h100-s33). This rule against the
    budget of 66 in one process on an H100 (s34-2): b4-ragged -1.9 %, b16-ragged -1.2 %, the other
    14 cells of the peer table planned alike (docs/gpu-runs/2026-12-05-h100-s34)."""
    if total > 0 and any(budget * v // total > occupancy for v in visible_lengths):
        return max(budget, resident_budget)
    return budget


def request_cap(length: int, total: int, grid: int, occupancy: int) -> int:
    """The most chunks a request of `length` visible keys may take in a batch whose lengths
    sum to `total`: min(grid, max(occupancy, floor(grid x length / total)))."""
    share = grid * length // total if total > 0 else 0
    return min(grid, max(occupancy, share))


def chunk_count_for_cap(length: int, cap: int, min_chunk: int = MIN_CHUNK, block: int = KEY_BLOCK) -> int:
    """Chunks of a request of `length` keys when at most `cap` are allowed (the device formula:
    `cap` is the grid's split axis). 0 for an empty request."""
    if length <= 0:
        return 0
    by_length = max(1, length // min_chunk)
    return min(by_length, cap, _cdiv(length, block))


def most_chunks(visible_lengths, total: int, grid: int, occupancy: int, min_chunk: int = MIN_CHUNK,
                block: int = KEY_BLOCK) -> int:
    """The largest chunk count in a batch of these visible lengths whose cache lengths sum to
    `total` (what the device computes per request), at least 1."""
    return max([1] + [chunk_count_for_cap(v, request_cap(v, total, grid, occupancy), min_chunk, block)
                      for v in visible_lengths])


def chunk_count(length: int, batch: int, kv_head_tiles: int, num_sms: int, max_splits: int = MAX_SPLITS,
                min_chunk: int = MIN_CHUNK, block: int = KEY_BLOCK, total: int | None = None,
                programs_per_sm: int = PROGRAMS_PER_SM, split_programs_per_sm: int | None = None) -> int:
    """The chunks a request of `length` visible keys takes at this batch / head tiling / SM
    count, in a batch whose lengths sum to `total` (default: a uniform batch, batch x length)."""
    return chunk_count_for_cap(length, _cap(length, batch, kv_head_tiles, num_sms, max_splits, total,
                                            programs_per_sm, split_programs_per_sm), min_chunk, block)


def _cap(length, batch, tiles, sms, max_splits, total, pps=PROGRAMS_PER_SM, split_pps=None) -> int:
    grid = grid_splits(batch, tiles, sms, max_splits, pps, split_pps)
    occ = occupancy_splits(batch, tiles, sms, max_splits, pps, split_pps)
    return request_cap(length, batch * length if total is None else total, grid, occ)


def chunk_bounds(i: int, n: int, length: int, block: int = KEY_BLOCK) -> tuple[int, int]:
    """[start, end) of chunk i of n over `length` keys (blocks dealt out evenly)."""
    nblocks = _cdiv(length, block)
    return min(length, (i * nblocks // n) * block), min(length, ((i + 1) * nblocks // n) * block)


def chunk_ranges_for_cap(length: int, cap: int, min_chunk: int = MIN_CHUNK,
                         block: int = KEY_BLOCK) -> list[tuple[int, int]]:
    n = chunk_count_for_cap(length, cap, min_chunk, block)
    return [chunk_bounds(i, n, length, block) for i in range(n)]


def chunk_ranges(length: int, batch: int = 1, kv_head_tiles: int = 1, num_sms: int = DEFAULT_NUM_SMS,
                 max_splits: int = MAX_SPLITS, min_chunk: int = MIN_CHUNK,
                 block: int = KEY_BLOCK, total: int | None = None,
                 programs_per_sm: int = PROGRAMS_PER_SM,
                 split_programs_per_sm: int | None = None) -> list[tuple[int, int]]:
    """The [start, end) key ranges of a request's chunks, in order; [] for an empty request."""
    return chunk_ranges_for_cap(length, _cap(length, batch, kv_head_tiles, num_sms, max_splits, total,
                                             programs_per_sm, split_programs_per_sm), min_chunk, block)


def chunk_length(length: int, n: int, block: int = KEY_BLOCK) -> int:
    """The longest chunk when `length` keys are cut into n chunks (a multiple of `block`)."""
    if n <= 0:
        return 0
    return _cdiv(_cdiv(length, block), n) * block

"""Gate: the adaptive split-K chunk rule (kernels/split_rule.py).

Pure-python checks need neither a GPU nor Triton: a table of worked cases (FlashML PR #729's
own example among them) and properties over a seeded random grid of (length, batch, KV-head
tiles, SMs, cap, block, minimum chunk). The last test runs the kernel's @triton.jit mirror of
the rule (under Triton's CPU interpreter when there is no GPU) and requires it to agree
exactly with the pure function: the host sizes the grid and the device picks the chunks, so
the two formulas must never drift.
"""
import importlib
import os
import random

import pytest

from decode_conformance_kernels import split_rule as sr

# ----------------------------------------------------------------------------------------
# worked cases
# ----------------------------------------------------------------------------------------
# (why, length, batch, kv_head_tiles, num_sms, max_splits, expected count, expected longest chunk),
# worked at 4 programs per SM (the arithmetic of the rule; the shipped counts per program size
# are `launch_shape`'s, tested below)
TABLE_PPS = 4
TABLE = [
    # FlashML PR #729: H100 (132 SMs), Qwen3.6 full attention 16/2/256 (2 KV-head tiles), batch 1 x 32k:
    # occupancy 4*132 // 2 = 264 (the PR's 2/SM: 132) -> capped at 64; by length 32768 // 128 = 256
    # -> 64 chunks of 512.
    ("seed: 132 SMs, 1 x 32k, 16/2/256", 32768, 1, 2, 132, 64, 64, 512),
    ("seed shape at 128k: still the 64 cap", 131072, 1, 2, 132, 64, 64, 2048),
    ("batch 4 x 32k on 16/2/256: 528 // 8 = 66 -> the 64 cap", 32768, 4, 2, 132, 64, 64, 512),
    ("32/8/128 (8 tiles) at 1 x 128k: 528 // 8 = 66 -> 64", 131072, 1, 8, 132, 64, 64, 2048),
    ("batch 32 x 8k on 32/8/128: 528 // 256 = 2 chunks", 8192, 32, 8, 132, 64, 2, 4096),
    ("1k request: chunks of >= 128 keys -> 8, like the fixed 8-split kernel", 1024, 1, 2, 132, 64, 8, 128),
    ("just under one minimum chunk -> 1", 127, 1, 2, 132, 64, 1, 128),
    ("two minimum chunks", 256, 1, 2, 132, 64, 2, 128),
    ("two and a half minimum chunks -> 2 (chunks of >= 128)", 320, 1, 2, 132, 64, 2, 160),
    ("one key", 1, 1, 2, 132, 64, 1, 32),
    ("empty request (CUDA-graph padding row): no work", 0, 1, 2, 132, 64, 0, 0),
    ("RTX 4060 laptop (24 SMs), 16/2/256, 1 x 32k: 96 // 2 = 48", 32768, 1, 2, 24, 64, 48, 704),
    ("a forced cap of 8", 32768, 1, 2, 132, 8, 8, 4096),
    ("a cap of 1: no split", 32768, 1, 2, 132, 1, 1, 32768),
]


@pytest.mark.parametrize("why,length,batch,tiles,sms,cap,count,longest", TABLE, ids=[t[0] for t in TABLE])
def test_table(why, length, batch, tiles, sms, cap, count, longest):
    n = sr.chunk_count(length, batch, tiles, sms, max_splits=cap, programs_per_sm=TABLE_PPS)
    assert n == count, why
    ranges = sr.chunk_ranges(length, batch, tiles, sms, max_splits=cap, programs_per_sm=TABLE_PPS)
    assert len(ranges) == count
    assert sr.chunk_length(length, n) == longest
    if ranges:
        assert max(e - s for s, e in ranges) <= longest


def test_upstream_example_is_uniform():
    """With FlashML PR #729's constants (2 programs per SM, at most 64 splits) the rule reproduces its
    worked example; with the H200's (8-warp programs at 2 per SM, at most 128) the same shape
    takes 128 chunks of 256."""
    ranges = sr.chunk_ranges(32768, batch=1, kv_head_tiles=2, num_sms=132, max_splits=64)
    assert ranges == [(512 * i, 512 * (i + 1)) for i in range(64)]
    assert sr.grid_splits(1, 2, 132, max_splits=64, programs_per_sm=2) == 64
    pps, cap = sr.launch_shape(256, mla=False)
    assert sr.grid_splits(1, 2, 132, cap, pps) == 128
    assert sr.chunk_count(32768, 1, 2, 132, cap, programs_per_sm=pps) == 128


def test_launch_shape():
    assert sr.launch_shape(128, mla=False) == (5, 128)  # 4-warp programs: 5 fit an H200 SM
    assert sr.launch_shape(128, mla=False, kv_bytes=1) == (3, 128)  # fp8: 168 registers, 3 fit
    assert sr.launch_shape(128, mla=False, kv_bytes=1, fp8_mma=True) == (5, 128)  # fp8 x fp8 dots
    assert sr.launch_shape(128, mla=False, fp8_mma=True) == (5, 128)  # a 16-bit cache: no fp8 dots
    assert sr.launch_shape(256, mla=False, kv_bytes=1) == (2, 128)  # fp8 wide heads: the 16-bit row's config
    assert sr.launch_shape(576, mla=True, kv_bytes=1) == (1, 64)
    assert sr.launch_shape(256, mla=False) == (2, 128)  # 8-warp programs: the same warps per SM
    assert sr.launch_shape(576, mla=True) == (1, 64)  # MLA: fewer, larger partials


# A ragged batch of 16 (32/8/128, 8 tiles, 132 SMs): 1.6k-65k keys, 421k in all.
RAGGED16 = (1600, 65536, 4096, 32768, 2048, 48000, 8192, 16384, 24576, 1700, 40000, 60000, 12000, 30000, 57000, 28144)


def test_ragged_batch_gives_long_requests_their_share():
    """The occupancy count alone gives every request 660 // (16 x 8) = 5 chunks (5 programs per
    SM), so the 65k request runs 13k keys per program while the 1.6k one is done; its share of
    the chunk budget (660 // 8 = 82) is floor(82 x 65536 / 432044) = 12."""
    total = sum(RAGGED16)
    counts = [sr.chunk_count(n, 16, 8, 132, total=total) for n in RAGGED16]
    assert counts[RAGGED16.index(65536)] == 12 and counts[RAGGED16.index(1600)] == 5
    assert sorted(counts) == [c for _, c in sorted(zip(RAGGED16, counts))], "longer never gets fewer chunks"
    longest_chunk = max(sr.chunk_length(n, c) for n, c in zip(RAGGED16, counts))
    assert longest_chunk <= 8192, longest_chunk  # vs 13120 with the occupancy count alone
    # programs: about PROGRAMS_PER_SM per SM (the budget plus one rounding per request, and the floor)
    assert sum(counts) * 8 <= 2 * sr.PROGRAMS_PER_SM * 132


def test_request_cap():
    assert sr.request_cap(65536, 431000, 64, 4) == 9  # floor(64 x 65536 / 431000)
    assert sr.request_cap(1600, 431000, 64, 4) == 4  # the occupancy count is the floor
    assert sr.request_cap(131072, 131072, 64, 64) == 64  # alone: the whole budget
    assert sr.request_cap(0, 0, 64, 4) == 4  # an all-empty batch (padding rows): no division by 0


def test_uniform_batch_keeps_the_occupancy_count():
    """A share rounded up gave a uniform batch of 4 at 32/8/128 (then 4 programs per SM, a budget
    of 66) ceil(66 / 4) = 17 chunks: 544 programs for the 528 the occupancy count places, a
    second wave on an H200. Rounded down, every uniform batch keeps the occupancy count, and
    its programs fill their waves at least as well as the one-wave count does."""
    slots = sr.PROGRAMS_PER_SM * 132
    for batch in range(1, 65):
        for tiles in (1, 2, 4, 8, 16):
            occ = sr.occupancy_splits(batch, tiles, 132)
            n = sr.chunk_count(131072, batch, tiles, 132)
            assert n == occ, (batch, tiles)
            one_wave = max(1, min(sr.MAX_SPLITS, slots // (batch * tiles)))
            assert n >= one_wave, (batch, tiles)
            assert sr.wave_fill(batch * tiles * n, slots) >= min(sr.WAVE_FILL, sr.wave_fill(batch * tiles * one_wave,
                                                                                          slots)), (batch, tiles)


# (batch, KV-head tiles, programs per SM, split cap, chunks): H200 shapes, 132 SMs. The
# arithmetic: slots = programs per SM x 132; the one-wave count is floor(slots / (batch x tiles)).
WAVES = [
    # 32/8/128 batch 32: 256 programs per chunk; 2 chunks fill 512 / 660 (78 %), 3: 768 / 1320,
    # 4: 1024 / 1320, 5: 1280 / 1320 (97 %)
    (32, 8, 5, 128, 5),
    (16, 8, 5, 128, 5),  # 640 / 660 already: unchanged
    (8, 8, 5, 128, 10),  # 640 / 660
    # batch 24: 3 chunks 576 / 660 (87 %); 4-9 at most 87 %; 10: 1920 / 1980 (97 %)
    (24, 8, 5, 128, 10),
    (64, 8, 5, 128, 1),  # one chunk (512 / 660) stays one: 2-4 chunks fill no better (78 %)
    (128, 8, 5, 128, 1),  # one chunk already takes two waves: the direct path
    # one chunk in part of one wave, raised to the first count up to 4 that fills >= 90 %:
    (32, 8, 3, 128, 3),  # e4m3 32 x 8k: 256 of 396 slots (65 %); 2: 512 / 792; 3: 768 / 792 (97 %)
    (56, 8, 5, 128, 4),  # 448 / 660 (68 %); 2 and 3 the same; 4: 1792 / 1980 (90.5 %)
    (48, 8, 5, 128, 1),  # 384 / 660; 3 chunks fill 87 %, none of 2-4 reaches 90 %: one stays
    (32, 2, 2, 128, 4),  # 16/2/256: 256 / 264
    (8, 8, 1, 64, 2),  # MLA, 1 per SM: 128 / 132
    (4, 8, 5, 3, 3),  # the split cap bounds the search: 3 chunks (96 / 660)
]


@pytest.mark.parametrize("batch,tiles,pps,cap,count", WAVES)
def test_occupancy_fills_whole_waves(batch, tiles, pps, cap, count):
    assert sr.occupancy_splits(batch, tiles, 132, cap, pps) == count


# The 16-bit 4-warp row (32/8/128: 8 KV-head tiles, 132 SMs), as `adaptive_split.plan_splits` plans it:
# (batch, occupancy count). The arithmetic: 4 x 132 = 528 aimed slots, 5 x 132 = 660 held.
#   batch 1-33: floor(528 / (batch x 8)), not raised: 66 (the budget), 16, 8, 4, 2, 2 (the counts the
#     s27 chunks sweep found fastest at batch 8-32: 8, 4, 2, 2);
#   batch 34-41: 528 // (batch x 8) = 1, 660 // (batch x 8) = 2: 2, not raised (raised, 34 took 7);
#   batch 42 on: one chunk at 5 per SM, raised only to 3 or 4 that fill >= 90 % of 660-slot waves:
#     48: 384 programs, 3 chunks fill 87 %: 1; 52: 3 (1248 / 1320); 56: 4 (1792 / 1980); 64: 1.
ROW_32x8x128 = [(1, 66), (4, 16), (8, 8), (16, 4), (24, 2), (32, 2), (33, 2), (34, 2), (40, 2), (41, 2), (42, 1),
                (48, 1), (52, 3), (56, 4), (64, 1), (80, 1)]


@pytest.mark.parametrize("batch,occupancy", ROW_32x8x128)
def test_the_16bit_4warp_row_aims_at_4_programs_per_sm(batch, occupancy):
    from decode_conformance_kernels.adaptive_split import plan_splits
    assert plan_splits(batch, 32, 8, num_sms=132, head_dim=128, kv_bytes=2) == (66, occupancy)
    assert sr.split_programs_per_sm(128, mla=False, kv_bytes=2) == sr.SPLIT_PROGRAMS_PER_SM == 4


# A ragged batch's shares (`share_budget`), 32/8/128 on 132 SMs: budget 528 // 8 = 66 aimed, 660 // 8 = 82 held.
#   b4-ragged [131072, 1024, 65536, 7], total 197639, occupancy 16: the 128k request's share of 66 is
#     floor(66 x 131072 / 197639) = 43 > 16, so the shares come from 82 (its share then 54);
#   b4 of 32k, equal: floor(66 / 4) = 16, not above the occupancy count 16: 66;
#   b4 [32768 x 3, 30000]: the longest's share floor(66 x 32768 / 128304) = 16: 66;
#   b4 [40000, 30000 x 3]: floor(66 x 40000 / 130000) = 20 > 16: 82;
#   a batch of one: its share is the budget, 66, which is also its occupancy count: 66;
#   b16 [65536, 1024 x 15] with a 4096-key window: visible [4096, 1024 x 15], total 80896:
#     floor(66 x 4096 / 80896) = 3, not above the occupancy count 4 (the cache's 65536 would be 53): 66.
SHARES_32x8x128 = [
    ([131072, 1024, 65536, 7], None, 82),
    ([32768] * 4, None, 66),
    ([32768] * 3 + [30000], None, 66),
    ([40000] + [30000] * 3, None, 82),
    ([131072], None, 66),
    ([65536] + [1024] * 15, 4096, 66),
    ([65536] + [1024] * 15, None, 82),
]


@pytest.mark.parametrize("lens,window,budget", SHARES_32x8x128)
def test_a_ragged_batch_shares_the_budget_for_what_an_sm_holds(lens, window, budget):
    from decode_conformance_kernels.adaptive_split import plan_splits
    occupancy = dict(ROW_32x8x128)[len(lens)]
    assert plan_splits(len(lens), 32, 8, num_sms=132, head_dim=128, kv_bytes=2, planned_seq_lens=lens,
                       window=window) == (budget, occupancy)
    # without planned lengths (a graph captured without them) the aimed-at budget
    assert plan_splits(len(lens), 32, 8, num_sms=132, head_dim=128, kv_bytes=2) == (66, occupancy)


def test_the_ragged_long_request_takes_its_share_of_82():
    """What the device then computes for b4-ragged: 54 chunks for 128k (floor(82 x 131072 / 197639)),
    27 for 64k, 8 for 1k (its length count 1024 // 128, under the occupancy cap 16), 1 for 7 keys."""
    lens = [131072, 1024, 65536, 7]
    caps = [sr.request_cap(v, sum(lens), 82, 16) for v in lens]
    assert [sr.chunk_count_for_cap(v, c, sr.MIN_CHUNK, 64) for v, c in zip(lens, caps)] == [54, 8, 27, 1]


def test_share_budget_leaves_other_rows_and_caps_alone():
    """Outside the 16-bit 4-warp row the budget already is what an SM holds; a cap (max_splits) bounds both."""
    from decode_conformance_kernels.adaptive_split import plan_splits
    lens = [131072, 1024, 65536, 7]
    assert plan_splits(4, 16, 2, num_sms=132, head_dim=256, planned_seq_lens=lens) == plan_splits(
        4, 16, 2, num_sms=132, head_dim=256)
    assert plan_splits(4, 32, 8, num_sms=132, head_dim=128, kv_bytes=1, planned_seq_lens=lens) == plan_splits(
        4, 32, 8, num_sms=132, head_dim=128, kv_bytes=1)
    # a cap of 40: the aimed-at budget 40, occupancy 16, share floor(40 x 131072 / 197639) = 26 > 16; held 40
    assert plan_splits(4, 32, 8, num_sms=132, head_dim=128, max_splits=40, planned_seq_lens=lens) == (40, 16)
    assert sr.share_budget([10, 10], 0, 66, 16, 82) == 66  # an empty batch: no share


# The other rows keep the counts for what an SM holds, raised to fill waves (their measured rule).
@pytest.mark.parametrize("hq,hkv,d,mla,kv_bytes,fp8_mma", [(16, 2, 256, False, 2, False), (32, 8, 128, False, 1, False),
                                                         (32, 8, 128, False, 1, True), (128, 1, 576, True, 2, False),
                                                         (16, 2, 256, False, 1, False)],
                         ids=["8-warp", "fp8", "fp8-mma", "mla", "fp8-8-warp"])
def test_other_rows_keep_the_raised_counts(hq, hkv, d, mla, kv_bytes, fp8_mma):
    from decode_conformance_kernels import triton_common as tc
    from decode_conformance_kernels.adaptive_split import plan_splits
    assert sr.split_programs_per_sm(d, mla, kv_bytes) is None
    tiles = tc.head_tiling(hq, hkv)["kv_head_tiles"]
    pps, cap = sr.launch_shape(d, mla, kv_bytes, fp8_mma)
    for batch in (1, 4, 8, 24, 32, 48, 64):
        want = (sr.grid_splits(batch, tiles, 132, cap, pps), sr.occupancy_splits(batch, tiles, 132, cap, pps))
        assert plan_splits(batch, hq, hkv, num_sms=132, head_dim=d, mla=mla, kv_bytes=kv_bytes,
                           fp8_mma=fp8_mma) == want, batch


def test_a_cap_bounds_the_aimed_count():
    """max_splits caps the 4-per-SM count as it caps the others: 528 // 8 = 66 -> 7; at batch 34 the
    5-per-SM fallback's 2 under a cap of 1 -> 1."""
    assert sr.occupancy_splits(1, 8, 132, 7, 5, 4) == sr.grid_splits(1, 8, 132, 7, 5, 4) == 7
    assert sr.occupancy_splits(34, 8, 132, 1, 5, 4) == 1


def test_constants_are_the_h200s():
    # H200-measured (FlashML PR #729: 2 per SM, 64 splits); test_upstream_example_is_uniform shows
    # the PR's constants still give its worked example
    assert (sr.PROGRAMS_PER_SM, sr.FP8_PROGRAMS_PER_SM, sr.WIDE_PROGRAMS_PER_SM, sr.MLA_PROGRAMS_PER_SM) == (5, 3, 2, 1)
    assert (sr.MAX_SPLITS, sr.MLA_MAX_SPLITS) == (128, 64)
    assert sr.KEY_BLOCK == 32
    assert 0 < sr.MIN_CHUNK <= 512 and sr.MIN_CHUNK % sr.KEY_BLOCK == 0


def test_num_sms_on_cpu(monkeypatch):
    monkeypatch.delenv(sr.NUM_SMS_ENV, raising=False)
    assert sr.num_sms("cpu") == sr.DEFAULT_NUM_SMS
    assert sr.num_sms("cpu", default=24) == 24
    monkeypatch.setenv(sr.NUM_SMS_ENV, "80")
    assert sr.num_sms("cpu") == 80


def test_bad_arguments():
    with pytest.raises(ValueError):
        sr.grid_splits(0, 2, 132)
    with pytest.raises(ValueError):
        sr.grid_splits(1, 2, 132, max_splits=0)


# ----------------------------------------------------------------------------------------
# properties over a seeded random grid
# ----------------------------------------------------------------------------------------
SMS = (24, 80, 108, 128, 132, 170, 188, 304)
CAPS = (1, 2, 8, 32, 64, 128)
BLOCKS = (16, 32, 64, 128)
MIN_CHUNKS = (32, 64, 256, 512)


def _random_length(rng):
    kind = rng.random()
    if kind < 0.1:
        return rng.choice((0, 1, 2, 31, 32, 33))
    if kind < 0.5:
        return rng.randint(0, 4096)
    if kind < 0.9:
        return rng.randint(4096, 300_000)
    return rng.randint(300_000, 4_000_000)


def _grid(n=2000, seed=20261130, split=None):
    rng = random.Random(seed)
    for _ in range(n):
        yield dict(length=_random_length(rng), batch=rng.choice((1, 2, 3, 4, 8, 16, 32, 64, 256)),
                   tiles=rng.choice((1, 2, 4, 8, 16, 32, 64)), sms=rng.choice(SMS), cap=rng.choice(CAPS),
                   block=rng.choice(BLOCKS), min_chunk=rng.choice(MIN_CHUNKS), split=split)


def _count(p, length=None):
    return sr.chunk_count(p["length"] if length is None else length, p["batch"], p["tiles"], p["sms"],
                          max_splits=p["cap"], min_chunk=p["min_chunk"], block=p["block"],
                          split_programs_per_sm=p["split"])


# every property holds for the counts aimed at what an SM holds and for the 16-bit 4-warp row's
ROWS = pytest.mark.parametrize("split", [None, sr.SPLIT_PROGRAMS_PER_SM], ids=["held", "aimed"])


@ROWS
def test_count_bounds(split):
    for p in _grid(split=split):
        n = _count(p)
        grid = sr.grid_splits(p["batch"], p["tiles"], p["sms"], max_splits=p["cap"], split_programs_per_sm=split)
        assert 1 <= grid <= p["cap"], p
        # a uniform batch: at most 4 waves of PROGRAMS_PER_SM programs per SM (the wave-filling count
        # stops at 4x the one-wave count), or one chunk per request
        assert p["batch"] * p["tiles"] * n <= max(4 * sr.PROGRAMS_PER_SM * p["sms"], p["batch"] * p["tiles"]), p
        if p["length"] == 0:
            assert n == 0, p
        else:
            assert 1 <= n <= grid, p
            # more than one chunk only when each averages at least the minimum chunk
            assert n == 1 or p["length"] >= n * p["min_chunk"], p


@ROWS
def test_count_non_decreasing_in_length(split):
    for p in _grid(600, seed=7, split=split):
        L = p["length"]
        for step in (1, 2, p["block"] - 1, p["block"], p["block"] + 1, p["min_chunk"], 1000, 37_000):
            assert _count(p, L) <= _count(p, L + step), (p, step)
    # and densely over a whole range for a few settings, around every block and chunk boundary
    for batch, tiles, sms, cap, block, mc in ((1, 2, 132, 64, 32, 256), (1, 1, 24, 64, 64, 64),
                                              (3, 5, 108, 128, 16, 32), (1, 2, 132, 64, 128, 512)):
        prev = 0
        for L in range(0, 40_000):
            n = sr.chunk_count(L, batch, tiles, sms, max_splits=cap, min_chunk=mc, block=block,
                               split_programs_per_sm=split)
            assert n >= prev, (L, batch, tiles, sms, cap, block, mc)
            prev = n


@ROWS
def test_ranges_partition_the_request(split):
    for p in _grid(split=split):
        L, block = p["length"], p["block"]
        ranges = sr.chunk_ranges(L, p["batch"], p["tiles"], p["sms"], max_splits=p["cap"],
                                 min_chunk=p["min_chunk"], block=block, split_programs_per_sm=split)
        n = _count(p)
        assert len(ranges) == n, p
        if L == 0:
            assert ranges == []
            continue
        assert ranges[0][0] == 0 and ranges[-1][1] == L, p
        longest = sr.chunk_length(L, n, block)
        for i, (s, e) in enumerate(ranges):
            assert s < e, (p, i)  # no empty chunk below the count
            assert s % block == 0, (p, i)  # chunks start on key-block boundaries
            assert e - s <= longest, (p, i)
            if i + 1 < n:
                assert ranges[i + 1][0] == e, (p, i)  # contiguous: every key exactly once
                assert (e - s) % block == 0, (p, i)
        lens = [e - s for s, e in ranges[:-1]]
        if lens:
            assert max(lens) - min(lens) <= block, p  # balanced to one block


# ----------------------------------------------------------------------------------------
# host formula == device formula
# ----------------------------------------------------------------------------------------
def _interpreted(fn) -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(fn, InterpretedFunction)


def test_device_mirror_agrees_with_host():
    torch = pytest.importorskip("torch")
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    from decode_conformance_kernels import adaptive_split
    if not on_gpu and not _interpreted(adaptive_split.chunk_count_device):
        if os.environ.get("TRITON_INTERPRET", "").strip().lower() not in ("1", "true", "on", "yes"):
            pytest.skip("no GPU and TRITON_INTERPRET is off: the device formula cannot run")
        adaptive_split = importlib.reload(adaptive_split)  # imported before the interpreter was switched on
    device = "cuda" if on_gpu else "cpu"

    rng = random.Random(11)
    lengths = list(range(0, 200)) + [255, 256, 257, 511, 512, 513, 32767, 32768, 32769, 131071, 131072]
    lengths += [rng.randint(0, 300_000) for _ in range(150)]
    lengths += [2**31 - 1 - 128, 2**31 - 1 - 129, 2**30 + 12345]  # int64 products in the chunk bounds
    for block, min_chunk in ((32, 256), (64, 64), (16, 512)):
        caps = [rng.choice((1, 2, 3, 7, 8, 33, 64, 100, 128)) for _ in lengths]
        counts, starts, ends = adaptive_split.device_split_table(
            torch.tensor(lengths, dtype=torch.int32, device=device), torch.tensor(caps, dtype=torch.int32),
            min_chunk=min_chunk, block=block)
        counts, starts, ends = counts.cpu().tolist(), starts.cpu().tolist(), ends.cpu().tolist()
        for L, cap, n, s_row, e_row in zip(lengths, caps, counts, starts, ends):
            want = sr.chunk_ranges_for_cap(L, cap, min_chunk=min_chunk, block=block)
            assert n == len(want) == sr.chunk_count_for_cap(L, cap, min_chunk, block), (L, cap, block, min_chunk)
            assert list(zip(s_row[:n], e_row[:n])) == want, (L, cap, block, min_chunk)
            assert all(x == -1 for x in s_row[n:]), (L, cap)  # nothing written past the count
    totals = [max(L, rng.randint(0, 2**31 - 1)) for L in lengths]
    for grid, occ in ((64, 4), (64, 64), (1, 1), (7, 2), (128, 1)):
        caps = adaptive_split.device_request_caps(torch.tensor(lengths, dtype=torch.int32, device=device),
                                                  torch.tensor(totals, dtype=torch.int32), grid, occ).cpu().tolist()
        assert caps == [sr.request_cap(L, t, grid, occ) for L, t in zip(lengths, totals)], (grid, occ)


# Register counts as the H200 compiled them (cuobjdump, docs/gpu-runs/2026-12-03-h200-s19/s19-3
# and -s20/s20-1/regs.md); the resident counts follow from the sm_90 limits by hand:
# 96 x 32 = 3072 registers a warp, 21 warps, 5 programs of 4 warps (39 KB shared: 5 as well);
# 106 -> 3584 a warp, 18 warps, 4 (what s19-3 saw); 168 -> 5376, 12 warps, 3; 8-warp 127 -> 4096,
# 16 warps, 2; MLA 255 -> 8192, 8 warps, 1 (and its 216 KB of shared memory alone allow 1).
@pytest.mark.parametrize("registers, warps, shared, expected", [
    (96, 4, 39168, 5), (106, 4, 39168, 4), (168, 4, 41472, 3), (127, 8, 76032, 2), (255, 8, 221184, 1),
    (32, 4, 100 * 1024, 2),  # shared memory binds: 233472 // (102400 + 1024)
    (16, 1, 0, 32),  # block slots bind
])
def test_resident_programs(registers, warps, shared, expected):
    assert sr.resident_programs(registers, warps, shared) == expected


def test_resident_programs_rejects_nonsense():
    with pytest.raises(ValueError, match="num_warps=0"):
        sr.resident_programs(96, 0, 0)


def test_adapters_size_an_fp8_grid_by_its_dot_form(monkeypatch):
    """Both split-K adapters plan an e4m3 32/8/128 batch at the programs per SM of their dot form:
    fp16 dots 3, the fp8-MMA tier 5 (sized for 3, its b4-32k ran 8 % slower on an H200, s22-1).
    Through Case -> prepare -> plan on the CPU with 132 SMs."""
    from decode_conformance.cases import Case
    from decode_conformance.runner import prepare
    from decode_conformance_kernels import adaptive_split
    case = Case(kv_dtype="e4m3", num_q_heads=32, num_kv_heads=8, head_dim=128, seq_lens=(4096,) * 4,
                layout="paged", page_size=16, seed=1)
    seen = {}
    real = adaptive_split.plan_splits

    def spy(*args, **kw):
        seen[kw.get("fp8_mma", False)] = got = real(*args, **kw)
        return got
    monkeypatch.setattr(adaptive_split, "plan_splits", spy)
    for kernel in (adaptive_split.AdaptiveSplitKernel(num_sms=132), adaptive_split.AdaptiveSplitFp8MmaKernel(num_sms=132)):
        kernel.plan(prepare(kernel, case, "cpu"))
    # (budget, occupancy): a batch of one's floor(pps x 132 / 8 tiles), and 4 x 8 = 32 programs a chunk
    assert seen == {False: (3 * 132 // 8, 3 * 132 // 32), True: (5 * 132 // 8, 5 * 132 // 32)}

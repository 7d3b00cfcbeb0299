"""Layout facts both Triton decode kernels (split-K and Lean) launch with, in one place so the
two cannot drift apart: which query heads share a program (head tiling), how a slot id becomes
an address in the cache (cache addressing), and how "no window" is passed (one encoding).

Plain Python on shapes and strides: no Triton, no device work.
"""
from __future__ import annotations

INT32_MAX = 2**31 - 1
# The window argument is the number of visible keys counting the current one, and every kernel
# takes min(length, window): "no window" is the largest int32, never 0 or a flag.
NO_WINDOW = INT32_MAX
MIN_DOT = 16  # tl.dot needs every dimension >= 16


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def visible_arg(window) -> int:
    """The window argument of a launch: keys visible to the query (the current token counted);
    NO_WINDOW when there is none."""
    if window is None:
        return NO_WINDOW
    if int(window) < 1:
        raise ValueError(f"window: expected None or >= 1 visible keys, got {window}")
    return int(window)


def visible_lengths(lengths, window) -> list[int]:
    """Keys each request's query sees (host lengths; window counts the current token, None = all)."""
    return [min(int(n), window) if window else int(n) for n in lengths]


def head_tiling(num_q_heads: int, num_kv_heads: int, max_heads_per_tile: int) -> dict:
    """GQA head tiling: each program handles `heads_per_tile` query heads of one KV head (so one
    K/V load serves all of them), padded to BLOCK_H >= 16 rows for tl.dot. A group larger than
    `max_heads_per_tile` is cut into equal tiles: the largest divisor of the group that fits, so
    no tile straddles two KV heads and none is partial."""
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if max_heads_per_tile < 1:
        raise ValueError(f"max_heads_per_tile: expected >= 1, got {max_heads_per_tile}")
    group = num_q_heads // num_kv_heads
    hpt = max(d for d in range(1, min(group, max_heads_per_tile) + 1) if group % d == 0)
    tiles_per_kv = group // hpt
    return dict(group=group, heads_per_tile=hpt, tiles_per_kv=tiles_per_kv,
                kv_head_tiles=num_kv_heads * tiles_per_kv, BLOCK_H=max(MIN_DOT, next_pow2(hpt)))


def cache_addressing(cache) -> tuple[int, int, int, int, int]:
    """(page_size, stride_page, stride_token, stride_head, stride_d) of a cache given as
    [pages, page_size, Hkv, D] or [slots, Hkv, D]; slot s sits at
    (s // page_size) * stride_page + (s % page_size) * stride_token. When pages are evenly
    spaced, slots are addressed directly (page_size 1, which Triton specialises away)."""
    if cache.dim() == 3:
        return 1, cache.stride(0), 0, cache.stride(1), cache.stride(2)
    if cache.dim() != 4:
        raise ValueError(f"KV cache: expected [pages, page_size, Hkv, D] or [slots, Hkv, D], got {tuple(cache.shape)}")
    P = cache.shape[1]
    if P == 1:  # a slot is a page
        return 1, cache.stride(0), 0, cache.stride(2), cache.stride(3)
    if cache.stride(0) == P * cache.stride(1):  # evenly spaced slots
        return 1, cache.stride(1), 0, cache.stride(2), cache.stride(3)
    return P, cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3)


def pair_addressing(k_cache, v_cache) -> tuple[int, tuple, tuple]:
    """(page_size, K strides, V strides), strides as (page, token, head, d): K and V addressed by
    one page size, or ValueError. When only one of them has evenly spaced slots (V stored
    head-major behind its view, K not), both are addressed by their pages."""
    kpage, *k_strides = cache_addressing(k_cache)
    vpage, *v_strides = cache_addressing(v_cache)
    if kpage == vpage:
        return kpage, tuple(k_strides), tuple(v_strides)
    if k_cache.dim() == 4 and v_cache.dim() == 4 and k_cache.shape[1] == v_cache.shape[1]:
        return k_cache.shape[1], tuple(k_cache.stride()), tuple(v_cache.stride())
    raise ValueError(f"k_cache and v_cache must share a page size: got pages of {tuple(k_cache.shape[:2])} "
                     f"and {tuple(v_cache.shape[:2])}")

"""GPU kernel time for the perf suite: CUDA-graph replay with the L2 flushed before each
replay, device events around the replay alone, median over repeats.

Why graphs: decode kernels run in microseconds, where host launch overhead (tens of us for
a two-launch Triton kernel) would be most of a do_bench number. Why the flush: a decode
step reads its KV cache once; a warm 60 MB L2 would make short contexts look free.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

L2_FLUSH_BYTES = 256 * 2**20  # larger than any current L2 (H200: 60 MB; MI300X: 256 MB infinity cache)


def _flush_buffer(device) -> torch.Tensor:
    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)


def capture(fn: Callable[[], None], device, warmup: int = 2) -> torch.cuda.CUDAGraph:
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    torch.cuda.synchronize(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize(device)
    return g


def replay_times_us(graph: torch.cuda.CUDAGraph, device, reps: int = 50, flush: bool = True) -> list[float]:
    buf = _flush_buffer(device) if flush else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    graph.replay()
    for i in range(reps):
        if buf is not None:
            buf.zero_()
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def graph_median_us(fn: Callable[[], None], device="cuda", reps: int = 50, flush: bool = True) -> float:
    g = capture(fn, device)
    return statistics.median(replay_times_us(g, device, reps, flush))


def copy_bandwidth_tbs(device="cuda", nbytes: int = 4 * 2**30, reps: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second, in TB/s: the ceiling."""
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize(device)
        times.append(s.elapsed_time(e) * 1e-3)
    return nbytes / statistics.median(times) / 1e12


def kv_floor_us(batch: int, ctx: int, kv_heads: int, head_dim: int, elem_bytes: int, tbs: float,
                v_head_dim: int | None = None) -> float:
    """Time to read K and V once at `tbs` TB/s (MLA: pass v_head_dim=0, V lives inside K)."""
    v = head_dim if v_head_dim is None else v_head_dim
    return batch * ctx * kv_heads * (head_dim + v) * elem_bytes / (tbs * 1e12) * 1e6

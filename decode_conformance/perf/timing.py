"""GPU kernel time for the perf guard and the sweeps: device events around the timed work
alone, the L2 flushed before each sample, CUDA-graph replay where the kernel allows it.

Why graphs: decode kernels run in microseconds, where host launch overhead (tens of us for
a two-launch Triton kernel) would be most of a do_bench number. Why the flush: a decode
step reads its KV cache once; a warm 60 MB L2 would make short contexts look free.

How one sample is taken (`event_times_us`): flush, record a start event on the stream,
enqueue the work (a graph replay, or an eager launch), record an end event - with no host
synchronization anywhere in between; the host waits once after the last sample. The
elapsed time of the two events is therefore the device time of the work alone: the flush
(tens of microseconds of device time) keeps the GPU busy while the host enqueues the
replay, so host launch latency is not in the sample.

Two flushes: "zero" (`buf.zero_()` of 256 MB, what triton.testing.do_bench does) leaves the
L2 full of *dirty* lines, which the timed kernel then writes back to memory as it evicts
them - up to the L2 size of extra DRAM writes inside the sample. "read" (a read-only kernel
over the same 256 MB) leaves the L2 full of clean lines of an unrelated buffer: the timed
kernel starts cold and pays for its own traffic only. The perf guard uses "read"
(decode_conformance/perf/sources.py), and so do the benchmarks (`BENCH_FLUSH`; their `--flush`
picks "zero" to compare with the records taken with it, docs/gpu-runs/2026-12-01-h200's close
1-13 and probe 1-8: on an H200 it added 5-10 us to a 30-150 us cell).
"""
from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, Optional

import torch

L2_FLUSH_BYTES = 256 * 2**20  # larger than any current L2 (H200: 60 MB; MI300X: 256 MB infinity cache)
FLUSH_MODES = ("zero", "read")

try:  # the read-only bandwidth kernel; Triton is a dependency, but keep timing importable without it
    import triton
    import triton.language as tl

    @triton.jit
    def _read_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        """Each program sums a grid-strided share of x (int32 words) into out[pid]: every
        byte is loaded once, nothing but one word per program is written."""
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(pid * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))
except ImportError:  # pragma: no cover - triton is a declared dependency
    triton = None
    _read_sum_kernel = None

READ_BLOCK = 4096  # int32 words per program and iteration (16 KiB): 4 x 16-byte loads per thread at 8 warps


class ReadKernel:
    """A read-only kernel: `read(t, nbytes)` loads the first `nbytes` of tensor `t` once and
    writes one int32 per program. Used as the bandwidth roofline, as the L2 flush, and by
    benchmarks/perf_power.py to plant extra reads. Safe to capture in a CUDA graph after
    one eager call (Triton compiles on the first call)."""

    def __init__(self, device, programs_per_sm: int = 8):
        self.device = torch.device(device)
        props = torch.cuda.get_device_properties(self.device)
        self.programs = max(1, props.multi_processor_count * programs_per_sm)
        self.partials = torch.zeros(self.programs, dtype=torch.int32, device=self.device)

    def read(self, t: torch.Tensor, nbytes: Optional[int] = None) -> None:
        if _read_sum_kernel is None:  # pragma: no cover
            raise RuntimeError("the read-only bandwidth kernel needs triton")
        flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)
        words = flat.view(torch.uint8)[: (flat.numel() * flat.element_size()) // 4 * 4].view(torch.int32)
        n = words.numel() if nbytes is None else min(words.numel(), max(0, int(nbytes)) // 4)
        grid = (min(self.programs, max(1, -(-n // READ_BLOCK))),)
        _read_sum_kernel[grid](words, self.partials, n, BLOCK=READ_BLOCK, num_warps=8)


class L2Flush:
    """Callable that evicts the L2 before a sample: mode "zero" (memset of 256 MB) or
    "read" (read-only kernel over 256 MB; leaves clean lines)."""

    def __init__(self, device, mode: str = "zero", nbytes: int = L2_FLUSH_BYTES):
        if mode not in FLUSH_MODES:
            raise ValueError(f"L2Flush mode: expected one of {FLUSH_MODES}, got {mode!r}")
        self.mode = mode
        self.buf = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
        self.reader = ReadKernel(device) if mode == "read" else None
        self()  # compile / warm up now, not inside the first sample

    def __call__(self) -> None:
        if self.reader is not None:
            self.reader.read(self.buf)
        else:
            self.buf.zero_()


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


def event_times_us(fn: Callable[[], None], device, reps: int, flush: Optional[Callable[[], None]] = None) -> list[float]:
    """Device time of `fn` (a graph replay or an eager launch), once per repeat, in us: the
    flush, then events recorded on the current stream around `fn` alone. The host does not
    wait between repeats; it synchronizes once at the end."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    gc_was_on = gc.isenabled()
    gc.disable()  # a collection between the start event and the launch would put host time in the sample
    try:
        with torch.cuda.device(device):
            for i in range(reps):
                if flush is not None:
                    flush()
                starts[i].record()
                fn()
                ends[i].record()
    finally:
        if gc_was_on:
            gc.enable()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


# A GPU left idle while the host prepares the next batch runs its first replays slower: on an
# H200 the first of four medians taken on one batch was 10-14 % above the other three, for
# whichever kernel came first, and a second batch prepared meanwhile was not slower
# (docs/gpu-runs/2026-12-01-h200/probe5) - the GPU's state, not the memory. So samples start
# after this much wall time of untimed, flushed replays.
WARMUP_S = 0.2


def warm_up(fn: Callable[[], None], device, flush: Optional[Callable[[], None]] = None,
            seconds: float = WARMUP_S, max_calls: int = 5000) -> int:
    """Run `fn` (flushed) untimed for `seconds` of wall time; returns the calls made."""
    t0, n = time.perf_counter(), 0
    while n < max_calls:
        for _ in range(10):
            if flush is not None:
                flush()
            fn()
        n += 10
        torch.cuda.synchronize(device)
        if time.perf_counter() - t0 >= seconds:
            break
    return n


# The flush the benchmarks' replay timing uses unless told otherwise (`set_bench_flush`).
BENCH_FLUSH = "read"


def set_bench_flush(mode: str) -> None:
    """The L2 flush of `replay_times_us` / `graph_median_us` for this process (a benchmark's
    --flush option)."""
    global BENCH_FLUSH
    if mode not in FLUSH_MODES:
        raise ValueError(f"flush mode: expected one of {FLUSH_MODES}, got {mode!r}")
    BENCH_FLUSH = mode


_FLUSHES: dict = {}


def _bench_flush(device, mode: str) -> L2Flush:
    """One L2Flush per (device, mode) for the process: a sweep times hundreds of replay
    series, and each would otherwise allocate and warm its own 256 MB buffer."""
    key = (str(torch.device(device)), mode)
    if key not in _FLUSHES:
        _FLUSHES[key] = L2Flush(device, mode)
    return _FLUSHES[key]


def replay_times_us(graph: torch.cuda.CUDAGraph, device, reps: int = 50, flush: bool = True,
                    flush_mode: Optional[str] = None) -> list[float]:
    """Replay times of a captured graph, L2 flushed before each (`flush_mode`, default
    BENCH_FLUSH), after `warm_up`."""
    fl = _bench_flush(device, flush_mode or BENCH_FLUSH) if flush else None
    warm_up(graph.replay, device, fl)
    return event_times_us(graph.replay, device, reps, fl)


def graph_median_us(fn: Callable[[], None], device="cuda", reps: int = 50, flush: bool = True,
                    flush_mode: Optional[str] = None) -> float:
    g = capture(fn, device)
    return statistics.median(replay_times_us(g, device, reps, flush, flush_mode))


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


def read_bandwidth_tbs(device="cuda", nbytes: int = 2 * 2**30, reps: int = 10) -> float:
    """Read-only bandwidth in TB/s (bytes loaded per second by `ReadKernel` over a buffer far
    larger than the L2): the roofline of a decode kernel, which reads its KV cache and
    writes almost nothing. A copy's figure (`copy_bandwidth_tbs`) is lower on HBM GPUs:
    mixing reads and writes costs bus turnarounds."""
    buf = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
    reader = ReadKernel(device)
    reader.read(buf)
    times = event_times_us(lambda: reader.read(buf), device, reps)
    return nbytes / (statistics.median(times) * 1e-6) / 1e12


def torch_sum_bandwidth_tbs(device="cuda", nbytes: int = 2 * 2**30, reps: int = 10) -> float:
    """Read bandwidth of torch's own reduction (`torch.sum` of a large int32 tensor): a
    second read-only figure, to cross-check `read_bandwidth_tbs`."""
    buf = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
    out = torch.empty((), dtype=torch.int64, device=device)
    torch.sum(buf, dim=0, out=out)
    times = event_times_us(lambda: torch.sum(buf, dim=0, out=out), device, reps)
    return nbytes / (statistics.median(times) * 1e-6) / 1e12


def kv_floor_us(batch: int, ctx: int, kv_heads: int, head_dim: int, elem_bytes: int, tbs: float,
                v_head_dim: int | None = None) -> float:
    """Time to read K and V once at `tbs` TB/s (MLA: pass v_head_dim=0, V lives inside K)."""
    v = head_dim if v_head_dim is None else v_head_dim
    return batch * ctx * kv_heads * (head_dim + v) * elem_bytes / (tbs * 1e12) * 1e6

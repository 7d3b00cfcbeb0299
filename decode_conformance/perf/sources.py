"""Timing sources. A source opens a session for one kernel on the perf cells; a session gives
device-time samples (us) per cell. `GpuTiming` times the real kernel (graph replay where the
kernel declares `cuda_graph_safe`, else eager launches; events around the work alone, the L2
flushed by a read-only kernel before each sample: perf/timing.py). `FakeTiming` draws samples
from a model, for the CPU self-tests (env DECODE_CONFORMANCE_PERF_FAKE names its arguments).

`open(kernel, cells, role, inputs_of=None)`: role "test" is the kernel under test,
"reference" the second kernel of an A/B run; a planted slowdown (perf_power.py's `wrap`,
FakeTiming's `slowdown`) applies to the kernel under test only. `inputs_of` (an open session)
makes the new session read that session's input tensors (q, the caches, the metadata), with
its own out / lse / workspace: an A/B pair then differs by its kernels only, not by where its
inputs happened to be allocated."""
from __future__ import annotations

import json
import math
import os
import random
import statistics
from typing import Optional, Protocol

from .cells import PerfCell, skip_reason

FAKE_ENV = "DECODE_CONFORMANCE_PERF_FAKE"


class Session(Protocol):
    cells: dict            # name -> PerfCell, the cells this kernel runs here
    skipped: dict          # name -> reason (capability)
    errors: dict           # name -> error text (prepare / plan / capture raised)
    timing: dict           # name -> "graph" | "eager" | "fake"

    def sample(self, name: str, n: int) -> list[float]: ...
    def check(self, name: str) -> str: ...
    def crosscheck(self, name: str) -> Optional[dict]: ...
    def close(self) -> None: ...


class TimingSource(Protocol):
    def device_info(self) -> dict: ...
    def open(self, kernel, cells: list[PerfCell], role: str = "test", inputs_of=None) -> Session: ...


def _same_inputs(batch, device):
    """A batch reading `batch`'s input tensors, with fresh suite-owned outputs and workspace."""
    import dataclasses
    import torch
    from ..batch import Workspace
    return dataclasses.replace(batch, out=torch.full_like(batch.out, float("nan")),
                               lse=torch.full_like(batch.lse, float("nan")), workspace=Workspace(device),
                               kernel_note="")


class GpuSession:
    def __init__(self, kernel, cells: list[PerfCell], device, flush, wrap=None, gpu_class: Optional[str] = None,
                 inputs_of: Optional["GpuSession"] = None):
        import torch
        from ..runner import kernel_traceback, prepare
        from . import timing
        self.device, self.flush = device, flush
        self.window_convention = kernel.caps.window_convention  # how its batches give the window
        self.cells, self.skipped, self.errors, self.timing = {}, {}, {}, {}
        self._items = {}
        for cell in cells:
            why = skip_reason(kernel, cell.case, gpu_class)
            if why:
                self.skipped[cell.name] = why
                continue
            try:
                shared = inputs_of._items.get(cell.name) if inputs_of is not None else None
                if shared is not None and inputs_of.window_convention == kernel.caps.window_convention:
                    batch = _same_inputs(shared[0], device)
                else:  # the other kernel has no batch here, or reads the window in another convention
                    batch = prepare(kernel, cell.case, device)
                launch = kernel.plan(batch)
                if wrap is not None:
                    launch = wrap(kernel, cell, launch)
                if kernel.caps.cuda_graph_safe:
                    graph = timing.capture(launch, device)
                    fn = graph.replay
                    fn()
                    self.timing[cell.name] = "graph"
                else:
                    graph = None
                    launch()
                    fn = launch
                    self.timing[cell.name] = "eager"
                torch.cuda.synchronize(device)
            except Exception as e:  # noqa: BLE001 - a kernel's failure is this cell's result
                self.errors[cell.name] = f"{type(e).__name__} preparing {cell.name}: {kernel_traceback(e)}"
                continue
            self._items[cell.name] = (batch, launch, fn, graph)
            self.cells[cell.name] = cell

    def replay_fn(self, name: str):
        """What one sample of `name` times (the graph replay or the eager launch)."""
        return self._items[name][2]

    def sample(self, name: str, n: int) -> list[float]:
        from . import timing
        return timing.event_times_us(self._items[name][2], self.device, n, self.flush)

    def check(self, name: str) -> str:
        import torch
        batch = self._items[name][0]
        if not bool(torch.isfinite(batch.out).all()):
            return "timed output has NaN/Inf: a fast wrong kernel is not a result"
        return ""

    def crosscheck(self, name: str) -> Optional[dict]:
        """Our replay timing against triton.testing.do_bench_cudagraph (graph-safe kernels:
        back-to-back calls in one graph, no flush - compared with our replay timing without
        the flush) or triton.testing.do_bench (eager kernels, which flush themselves)."""
        import triton.testing as tt
        from . import timing
        _, launch, fn, graph = self._items[name]
        flushed = statistics.median(timing.event_times_us(fn, self.device, 30, self.flush))
        if graph is not None:
            ref = tt.do_bench_cudagraph(launch, rep=20, return_mode="median") * 1e3
            ours = statistics.median(timing.event_times_us(fn, self.device, 50, None))
            method = "do_bench_cudagraph (no flush) vs our replay without flush"
        else:
            ref = tt.do_bench(launch, return_mode="median") * 1e3
            ours = flushed
            method = "do_bench (zero flush) vs our eager timing (read flush)"
        return {"method": method, "reference_us": ref, "ours_us": ours, "ours_flushed_us": flushed,
                "agreement": ours / ref - 1 if ref > 0 else None}

    def close(self) -> None:
        import torch
        self._items.clear()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()


def torch_device_index(device) -> int:
    import torch
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


class GpuTiming:
    """The real timing source. `wrap(kernel, cell, launch) -> launch` plants extra work inside
    the captured launch of the kernel under test (benchmarks/perf_power.py); `flush` and `info`
    let several sources share one flush buffer and one bandwidth measurement."""

    def __init__(self, device="cuda", flush_mode: str = "read", wrap=None, flush=None, info: Optional[dict] = None):
        import torch
        from . import timing
        from .. import hardware
        self.device = device
        if torch.device(device).index is not None:  # Triton launches and events go to the current device
            torch.cuda.set_device(torch.device(device))
        self.flush = flush if flush is not None else timing.L2Flush(device, flush_mode)
        self.wrap = wrap
        self._info = info
        self.gpu_class = hardware.detect_class(torch_device_index(device))

    def device_info(self) -> dict:
        if self._info is None:
            import subprocess
            import torch
            import triton
            from . import timing
            props = torch.cuda.get_device_properties(self.device)
            try:
                driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20).stdout.split("\n")[0].strip()
            except (OSError, subprocess.SubprocessError):
                driver = None
            self._info = {"gpu_name": torch.cuda.get_device_name(self.device), "sms": props.multi_processor_count,
                          "gpu_uuid": str(getattr(props, "uuid", "")) or None, "gpu_class": self.gpu_class,
                          "read_tbs": timing.read_bandwidth_tbs(self.device),
                          "copy_tbs": timing.copy_bandwidth_tbs(self.device, nbytes=2 * 2**30),
                          "torch": torch.__version__, "triton": triton.__version__,
                          "cuda": torch.version.cuda or torch.version.hip, "driver": driver or None}
            torch.cuda.empty_cache()
        return self._info

    def open(self, kernel, cells: list[PerfCell], role: str = "test", inputs_of=None) -> GpuSession:
        return GpuSession(kernel, cells, self.device, self.flush, self.wrap if role == "test" else None,
                          self.gpu_class, inputs_of=inputs_of)


class FakeSession:
    def __init__(self, src: "FakeTiming", kernel, cells: list[PerfCell], index: int, role: str):
        self.src = src
        self.rng = random.Random(f"{src.seed}/{kernel.name}/{role}/{index}")
        self.cells, self.skipped, self.errors, self.timing = {}, {}, {}, {}
        self.shift = {}
        self.slowdown = src.slowdown if role == "test" else src.reference_slowdown
        for cell in cells:
            why = skip_reason(kernel, cell.case, src.gpu_class)
            if why:
                self.skipped[cell.name] = why
                continue
            self.cells[cell.name] = cell
            self.timing[cell.name] = "eager" if src.eager else "fake"
            self.shift[cell.name] = math.exp(self.rng.gauss(0.0, src.pick(src.session_jitter, cell)))

    def sample(self, name: str, n: int) -> list[float]:
        cell = self.cells[name]
        t = self.src.base(cell) * (1 + self.src.pick(self.slowdown, cell)) * self.shift[name]
        noise = self.src.pick(self.src.noise, cell)
        p, mean = self.src.pick(self.src.host_delay_p, cell), self.src.pick(self.src.host_delay, cell)
        out = []
        for _ in range(n):
            x = t * math.exp(self.rng.gauss(0.0, noise))
            if p > 0 and self.rng.random() < p:
                x += self.rng.expovariate(1.0 / (mean * t))
            out.append(x)
        return out

    def check(self, name: str) -> str:
        return ""

    def crosscheck(self, name: str) -> Optional[dict]:
        return None

    def close(self) -> None:
        pass


class FakeTiming:
    """Samples from a model: base time per cell (`base_us`, else 4 us + bytes at 80 % of
    `read_tbs`) times `machine` (another GPU of the model: 1.03 = 3 % slower), a planted
    `slowdown` of the kernel under test and `reference_slowdown` of an A/B reference
    (fractions), per-sample `noise` and per-session `session_jitter` (log-normal sigmas). Each
    of slowdown / noise / session_jitter is a number or {cell name: number, "*": default}.
    `eager` marks the cells as eagerly timed; `host_delay_p` / `host_delay` add to a sample,
    with that probability, an exponential delay of that mean (a fraction of the cell's time):
    a loaded host. Sessions are independent and reproducible from `seed`."""

    def __init__(self, base_us=None, slowdown=0.0, noise=0.01, session_jitter=0.002, seed=0,
                 gpu_name="fake GPU", read_tbs=4.0, copy_tbs=3.6, gpu_class=None, eager=False,
                 host_delay_p=0.0, host_delay=0.0, gpu_uuid="fake-gpu-0", machine=1.0, reference_slowdown=0.0):
        self.base_us = dict(base_us or {})
        self.slowdown, self.noise, self.session_jitter = slowdown, noise, session_jitter
        self.reference_slowdown, self.machine = reference_slowdown, float(machine)
        self.eager, self.host_delay_p, self.host_delay = eager, host_delay_p, host_delay
        self.seed, self.gpu_name, self.read_tbs, self.copy_tbs = seed, gpu_name, read_tbs, copy_tbs
        self.gpu_class, self.gpu_uuid = gpu_class, gpu_uuid
        self._opened = 0

    @staticmethod
    def pick(value, cell: PerfCell) -> float:
        if isinstance(value, dict):
            return float(value.get(cell.name, value.get("*", 0.0)))
        return float(value)

    def base(self, cell: PerfCell) -> float:
        if cell.name in self.base_us:
            return float(self.base_us[cell.name]) * self.machine
        return (4.0 + cell.bytes_moved / (0.8 * self.read_tbs * 1e6)) * self.machine

    def device_info(self) -> dict:
        return {"gpu_name": self.gpu_name, "sms": 0, "read_tbs": self.read_tbs, "copy_tbs": self.copy_tbs,
                "gpu_uuid": self.gpu_uuid, "gpu_class": self.gpu_class, "torch": "fake", "triton": "fake",
                "cuda": None, "driver": None}

    def open(self, kernel, cells: list[PerfCell], role: str = "test", inputs_of=None) -> FakeSession:
        self._opened += 1
        return FakeSession(self, kernel, cells, self._opened, role)


def timing_from_env() -> Optional[FakeTiming]:
    """The fake timing source named by $DECODE_CONFORMANCE_PERF_FAKE (JSON kwargs), or None."""
    raw = os.environ.get(FAKE_ENV)
    if not raw:
        return None
    try:
        return FakeTiming(**json.loads(raw))
    except (ValueError, TypeError) as e:
        raise ValueError(f"${FAKE_ENV}: expected JSON keyword arguments of FakeTiming, got {raw!r}: {e}") from None

"""The perf-regression guard: per kernel and perf cell, device time against a stored baseline of
the same GPU model, with a per-cell threshold derived from measured noise.

Used by `suites/perf` (pytest, one GuardRun per session) and `benchmarks/perf_power.py` (the
false-alarm / planted-slowdown experiment), through the same functions, so what the power
experiment measures is what CI runs. docs/perf-guard.md is the user-facing description.

Timing source
    A `TimingSource` opens a `Session` for a kernel on the perf cells; the session gives
    samples (device time in us) per cell. `GpuTiming` prepares each cell's inputs
    (`runner.prepare`), plans the launch, captures it in a CUDA graph when the kernel
    declares `cuda_graph_safe` (else launches eagerly), and times each sample with events
    recorded on the stream around the replay alone, no host synchronization in between, the
    L2 flushed before by a read-only kernel over 256 MB (decode_conformance/timing.py).
    `FakeTiming` draws samples from a model (CPU self-tests; env DECODE_CONFORMANCE_PERF_FAKE).

One guard measurement of one kernel (a *session*, `measure_session`)
    fresh inputs and graphs for every cell the kernel can run; a pilot of 3 samples per cell
    (warm-up; sets the block size n_c = clamp(2000 us / t_c, 5, 40)); then R = 10 rounds, each
    visiting every cell once (order rotated each round: interleaved, so a slow phase of the
    GPU is spread over all cells instead of landing on one) and taking a block of n_c samples.
      m_{c,r}  = median of block r of cell c (graph replay); for eagerly launched kernels the
                 10th percentile of the block instead: the host launches every sample, and a
                 host delay (another process, a page fault, the Python loop of a pure-torch
                 kernel waiting for a core) only ever adds time, so the low quantile follows
                 the kernel while up to ~90 % of a block's samples are delayed, and a slowdown of
                 the kernel's own work moves it as it moves every sample
      x_c      = median_r m_{c,r}                       (the cell's statistic)
      s_c      = 1.4826 * MAD_r(m_{c,r}) / x_c          (relative spread of one block median)
      se_c     = 1.2533 * s_c / sqrt(R)                 (standard error of x_c; 1.2533 = sqrt(pi/2))

Recording a baseline (`record_kernel`, `pytest suites/perf --perf-record`)
    K = 10 independent sessions (each with fresh inputs and graphs). Per cell:
      x_B      = median_k x_{c,k}
      sigma    = max( sd_k(ln x_{c,k}),  median_k se_{c,k},  0.2 %,  0.05 us / x_B )
    sigma is the spread of ONE session's statistic around the truth, measured (session to
    session, which includes fresh allocations, graph captures and GPU state over the
    recording) and floored (timer resolution, a cell that happened to repeat exactly).
    se_B = median_k se_{c,k} is the within-session noise at recording time.

Comparing (`compare_cell`): one session now, x with standard error se
      d        = ln(x / x_B)
      sigma_d  = sqrt( sigma^2 * (1 + pi / (2K))  +  max(0, se^2 - se_B^2) )
                 (one session's spread, plus the error of the baseline's median of K, plus
                  whatever this run's own noise exceeds the recording's: a disturbed run widens
                  its own threshold instead of raising a false alarm)
      T        = max(1.5 %, z * sigma_d),  z = 3.0
      verdict  = slower (FAIL) if d > T;  faster (reported) if d < -T;  else pass
      catches  = exp(T + 1.645 * sigma_d) - 1   (the smallest slowdown this cell catches
                                                  with >= 95 % probability)
    False alarms: with sigma estimated from K = 10 sessions, d / sigma_d is about Student-t
    with 9 degrees of freedom, P(t_9 > 3.0) = 0.75 % per cell comparison (0.13 % if sigma were
    exact); the 1.5 % floor keeps small unmodelled shifts between processes out. A 5 %
    slowdown is caught (>= 95 %) on every cell where catches <= 5 %, i.e. where
    T + 1.645 sigma_d <= ln 1.05: sigma_d <= 1.05 % when T = 3 sigma_d. Cells shorter than
    20 us are reported with their `catches` figure; so is any longer cell whose noise
    does not allow 5 % (the record and the terminal table say so).

Baselines (`baseline_path`): <dir>/<gpu_class>/<kernel>.json, JSON (FORMAT, version 1):
    gpu_class, kernel, kernel_spec, method (the timing method id: a baseline taken another
    way is refused), recorded {date, gpu_name, gpu_uuid, sms, torch, triton, cuda, python, command},
    bandwidth {read_tbs, copy_tbs}, settings {sessions, rounds, z, min_threshold}, and per
    cell: case id, context, median_us, sessions_us, noise_rel (sigma), within_se_rel (se_B),
    iqr_rel, threshold, catches, bytes, tbs, roofline_pct, crosscheck. Independent of the
    Python version and the machine name; tied to the GPU model (a baseline recorded on an
    H200 is refused on an H100, both class sm_90). Validated on load; errors name the file.
    Compared on another GPU of the model (another UUID, or a read bandwidth more than 1 %
    off the recorded one), the run says so in a note (`other_machine`): machines differ by
    more than one machine's noise.

Roofline: bytes moved per cell = K and V read once (MLA: K only, V is its first columns)
    + q read + out and LSE written; achieved TB/s = bytes / x; roofline_pct = TB/s over the
    read bandwidth of a read-only kernel measured in the same run (timing.read_bandwidth_tbs).
"""
from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import platform
import random
import statistics
import tomllib
from dataclasses import dataclass, field
from typing import Optional, Protocol

from .cases import Case

FORMAT = "decode-conformance-perf-baseline"
FORMAT_VERSION = 1
METHOD = "device-events-around-replay/read-flush-256MiB/median-of-block-stats(median|eager:q10)/v2"
EAGER_BLOCK_QUANTILE = 0.1  # the block statistic of eagerly timed cells (module docstring)

ROUNDS = 10
BLOCK_US = 2000.0
MIN_BLOCK, MAX_BLOCK = 5, 40
PILOT = 3
RECORD_SESSIONS = 10
Z = 3.0
MIN_THRESHOLD = 0.015
DETECT_Z = 1.645
NOISE_FLOOR_REL = 0.002
NOISE_FLOOR_US = 0.05
MEDIAN_EFF = math.sqrt(math.pi / 2)  # se of a median / se of a mean, normal data
MAD_TO_SD = 1.4826
SHORT_CELL_US = 20.0
TARGET_SLOWDOWN = 0.05

CELLS_FILE = "perf_cells.toml"
FAKE_ENV = "DECODE_CONFORMANCE_PERF_FAKE"  # JSON kwargs of FakeTiming: the perf suite then times nothing real
SHARDS_TABLE = ("ci", "shards.toml")


class BaselineError(Exception):
    """A baseline file that cannot be used (corrupt, foreign, another GPU or method)."""


# ---- perf cells ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PerfCell:
    name: str
    case: Case

    @property
    def context(self) -> int:
        return self.case.total_keys

    @property
    def shape(self) -> str:
        c = self.case
        return f"{c.num_q_heads}x{c.num_kv_heads}x{c.head_dim}" + (f"/{c.v_head_dim} mla" if c.mla else "")

    @property
    def bytes_moved(self) -> int:
        return bytes_moved(self.case)


def bytes_moved(case: Case) -> int:
    """Compulsory traffic of one decode step: K and V read once (MLA: K only), q read, out and
    LSE written. Page-table / index reads (4 bytes per key or page) are left out."""
    import torch
    kv_elem = torch.empty((), dtype=case.cache_dtype).element_size()
    q_elem = torch.empty((), dtype=case.q_dtype).element_size()
    kv = case.total_keys * case.num_kv_heads * (case.head_dim + (0 if case.mla else case.v_head_dim)) * kv_elem
    q = case.batch * case.num_q_heads * case.head_dim * q_elem
    out = case.batch * case.num_q_heads * case.v_head_dim * q_elem + case.batch * case.num_q_heads * 4
    return kv + q + out


_CELL_KEYS = {"name", "shape", "lens", "v_head_dim", "mla", "kv_dtype", "page_size", "seed"}


def load_cells(path=None) -> list[PerfCell]:
    """The perf cells (fixtures/perf_cells.toml); errors name the file and the cell."""
    if path is None:
        from .resources import data_path
        path = data_path(CELLS_FILE)
    path = pathlib.Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None
    cells, seen = [], set()
    for i, row in enumerate(data.get("cell", [])):
        where = f"{path}: cell {i + 1} ({row.get('name', '?')})"
        extra = set(row) - _CELL_KEYS
        if extra:
            raise ValueError(f"{where}: unknown fields {sorted(extra)}; expected {sorted(_CELL_KEYS)}")
        if not isinstance(row.get("name"), str) or row["name"] in seen:
            raise ValueError(f"{where}: needs a unique string 'name'")
        seen.add(row["name"])
        try:
            hq, hkv, d = row["shape"]
            case = Case(kv_dtype=row.get("kv_dtype", "bf16"), num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                        seq_lens=tuple(row["lens"]), v_head_dim=row.get("v_head_dim"), mla=row.get("mla", False),
                        layout="paged", page_size=row.get("page_size", 16), seed=row.get("seed", 1))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        cells.append(PerfCell(row["name"], case))
    if not cells:
        raise ValueError(f"{path}: no [[cell]] tables")
    return cells


# ---- statistics ---------------------------------------------------------------------------

@dataclass
class CellStats:
    """One session's measurement of one cell."""
    median_us: float
    se_rel: float
    spread_rel: float
    iqr_rel: float
    samples: int
    rounds: int
    blocks_us: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"median_us": self.median_us, "se_rel": self.se_rel, "spread_rel": self.spread_rel,
                "iqr_rel": self.iqr_rel, "samples": self.samples, "rounds": self.rounds}


def _mad(xs) -> float:
    m = statistics.median(xs)
    return statistics.median([abs(x - m) for x in xs])


def _iqr(xs) -> float:
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


def block_quantile(xs: list[float], q: float) -> float:
    """The q-quantile of one block (linear interpolation between order statistics)."""
    ys = sorted(xs)
    pos = q * (len(ys) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def cell_stats(blocks: list[list[float]], quantile: Optional[float] = None) -> CellStats:
    """Statistics of one session's blocks; each block reduced by its median, or by `quantile`
    (eager timing, see the module docstring)."""
    meds = [statistics.median(b) if quantile is None else block_quantile(b, quantile) for b in blocks]
    x = statistics.median(meds)
    spread = MAD_TO_SD * _mad(meds) / x if x > 0 else 0.0
    allx = [v for b in blocks for v in b]
    return CellStats(median_us=x, se_rel=MEDIAN_EFF * spread / math.sqrt(len(meds)), spread_rel=spread,
                     iqr_rel=_iqr(allx) / x if x > 0 else 0.0, samples=len(allx), rounds=len(meds), blocks_us=meds)


def block_size(pilot_us: float, block_us: float = BLOCK_US) -> int:
    return int(min(MAX_BLOCK, max(MIN_BLOCK, math.ceil(block_us / max(pilot_us, 1e-3)))))


def measure_session(session: "Session", rounds: int = ROUNDS, block_us: float = BLOCK_US) -> dict[str, CellStats]:
    """One guard measurement of every runnable cell of an open session: pilot, then `rounds`
    interleaved rounds of one block per cell (order rotated each round)."""
    names = list(session.cells)
    sizes: dict[str, int] = {}
    for n in list(names):
        try:
            sizes[n] = block_size(statistics.median(session.sample(n, PILOT)), block_us)
        except Exception as e:  # noqa: BLE001 - a kernel that fails while timed fails its cell
            session.errors[n] = f"{type(e).__name__} while timing {n}: {e}"
            names.remove(n)
    blocks: dict[str, list] = {n: [] for n in names}
    for r in range(rounds):
        live = [n for n in names if n not in session.errors]
        if not live:
            break
        k = r % len(live)
        for n in live[k:] + live[:k]:
            try:
                blocks[n].append(session.sample(n, sizes[n]))
            except Exception as e:  # noqa: BLE001
                session.errors[n] = f"{type(e).__name__} while timing {n}: {e}"
    return {n: cell_stats(blocks[n], EAGER_BLOCK_QUANTILE if session.timing.get(n) == "eager" else None)
            for n in names if n not in session.errors and blocks[n]}


def record_noise(sessions_us: list[float], within_se: list[float]) -> tuple[float, float, float]:
    """(x_B, sigma, se_B) of a cell from K sessions (module docstring)."""
    x_b = statistics.median(sessions_us)
    logs = [math.log(v) for v in sessions_us]
    between = statistics.stdev(logs) if len(logs) >= 2 else 0.0
    se_b = statistics.median(within_se) if within_se else 0.0
    sigma = max(between, se_b, NOISE_FLOOR_REL, NOISE_FLOOR_US / x_b)
    return x_b, sigma, se_b


def sigma_d(sigma: float, sessions: int, se_now: float, se_b: float) -> float:
    return math.sqrt(sigma ** 2 * (1 + math.pi / (2 * max(1, sessions))) + max(0.0, se_now ** 2 - se_b ** 2))


def threshold_for(sd: float, z: float = Z, floor: float = MIN_THRESHOLD) -> float:
    return max(floor, z * sd)


def catches(threshold: float, sd: float) -> float:
    """Smallest slowdown (fraction) caught with >= 95 % probability."""
    return math.exp(threshold + DETECT_Z * sd) - 1


# ---- timing sources -------------------------------------------------------------------------

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
    def open(self, kernel, cells: list[PerfCell]) -> Session: ...


def skip_reason(kernel, case: Case, gpu_class: Optional[str]) -> str:
    """Why `kernel` does not run `case` on this class ('' when it does): its capabilities, or
    fp8 MMAs on a class without fp8 tensor cores (as the plugin decides for parity)."""
    missing = kernel.caps.missing_for(case, "cuda")
    if missing:
        return f"{kernel.name} lacks: {', '.join(missing)}"
    if gpu_class and case.is_fp8 and getattr(kernel.caps, "fp8_mma", False):
        from . import hardware
        cls = hardware.known_classes().get(gpu_class)
        if cls is not None and cls.vendor != "cpu" and not cls.fp8_tensor_cores:
            return f"{kernel.name} runs fp8 MMAs; class {gpu_class} has no fp8 tensor cores"
    return ""


class GpuSession:
    def __init__(self, kernel, cells: list[PerfCell], device, flush, wrap=None, gpu_class: Optional[str] = None):
        import torch
        from .runner import kernel_traceback, prepare
        from . import timing
        self.device, self.flush = device, flush
        self.cells, self.skipped, self.errors, self.timing = {}, {}, {}, {}
        self._items = {}
        for cell in cells:
            why = skip_reason(kernel, cell.case, gpu_class)
            if why:
                self.skipped[cell.name] = why
                continue
            try:
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
    """The real timing source (see module docstring). `wrap(kernel, cell, launch) -> launch`
    lets benchmarks/perf_power.py plant extra work inside the captured launch; `flush` and
    `info` let several sources share one flush buffer and one bandwidth measurement."""

    def __init__(self, device="cuda", flush_mode: str = "read", wrap=None, flush=None, info: Optional[dict] = None):
        import torch
        from . import timing
        self.device = device
        if torch.device(device).index is not None:  # Triton launches and events go to the current device
            torch.cuda.set_device(torch.device(device))
        self.flush = flush if flush is not None else timing.L2Flush(device, flush_mode)
        self.wrap = wrap
        self._info = info
        from . import hardware
        self.gpu_class = hardware.detect_class(torch_device_index(device))

    def device_info(self) -> dict:
        if self._info is None:
            import torch
            import triton
            from . import timing
            props = torch.cuda.get_device_properties(self.device)
            self._info = {"gpu_name": torch.cuda.get_device_name(self.device), "sms": props.multi_processor_count,
                          "gpu_uuid": str(getattr(props, "uuid", "")) or None,
                          "read_tbs": timing.read_bandwidth_tbs(self.device),
                          "copy_tbs": timing.copy_bandwidth_tbs(self.device, nbytes=2 * 2**30),
                          "torch": torch.__version__, "triton": triton.__version__,
                          "cuda": torch.version.cuda or torch.version.hip}
            torch.cuda.empty_cache()
        return self._info

    def open(self, kernel, cells: list[PerfCell]) -> GpuSession:
        return GpuSession(kernel, cells, self.device, self.flush, self.wrap, self.gpu_class)


class FakeSession:
    def __init__(self, src: "FakeTiming", kernel, cells: list[PerfCell], index: int):
        self.src = src
        self.rng = random.Random(f"{src.seed}/{kernel.name}/{index}")
        self.cells, self.skipped, self.errors, self.timing = {}, {}, {}, {}
        self.shift = {}
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
        t = self.src.base(cell) * (1 + self.src.pick(self.src.slowdown, cell)) * self.shift[name]
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
    """Samples from a model, for CPU self-tests: base time per cell (`base_us`, else
    4 us + bytes at 80 % of `read_tbs`), a planted `slowdown` (fraction), per-sample `noise`
    and per-session `session_jitter` (log-normal sigmas). Each of slowdown / noise /
    session_jitter is a number or {cell name: number}. `eager` marks the cells as eagerly
    timed, and `host_delay_p` / `host_delay` add to each sample, with that probability, an
    exponential delay of that mean (a fraction of the cell's time): a loaded host. Sessions
    are independent and reproducible from `seed`."""

    def __init__(self, base_us=None, slowdown=0.0, noise=0.01, session_jitter=0.002, seed=0,
                 gpu_name="fake GPU", read_tbs=4.0, copy_tbs=3.6, gpu_class=None, eager=False,
                 host_delay_p=0.0, host_delay=0.0, gpu_uuid="fake-gpu-0"):
        self.base_us = dict(base_us or {})
        self.slowdown, self.noise, self.session_jitter = slowdown, noise, session_jitter
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
            return float(self.base_us[cell.name])
        return 4.0 + cell.bytes_moved / (0.8 * self.read_tbs * 1e6)

    def device_info(self) -> dict:
        return {"gpu_name": self.gpu_name, "sms": 0, "read_tbs": self.read_tbs, "copy_tbs": self.copy_tbs,
                "gpu_uuid": self.gpu_uuid, "torch": "fake", "triton": "fake", "cuda": None}

    def open(self, kernel, cells: list[PerfCell]) -> FakeSession:
        self._opened += 1
        return FakeSession(self, kernel, cells, self._opened)


def timing_from_env() -> Optional[FakeTiming]:
    """The fake timing source named by $DECODE_CONFORMANCE_PERF_FAKE (JSON kwargs), or None."""
    raw = os.environ.get(FAKE_ENV)
    if not raw:
        return None
    try:
        kw = json.loads(raw)
        return FakeTiming(**kw)
    except (ValueError, TypeError) as e:
        raise ValueError(f"${FAKE_ENV}: expected JSON keyword arguments of FakeTiming, got {raw!r}: {e}") from None


# ---- baselines ------------------------------------------------------------------------------

def default_baseline_dir() -> pathlib.Path:
    from .resources import data_path
    return data_path("baselines")


def baseline_path(root, gpu_class: str, kernel: str) -> pathlib.Path:
    return pathlib.Path(root) / gpu_class / f"{kernel}.json"


_CELL_NUMBERS = ("median_us", "noise_rel", "within_se_rel", "threshold", "bytes")


def validate_baseline(doc, path, gpu_class: str, kernel: str) -> dict:
    """The document if it is a usable baseline for (gpu_class, kernel); else BaselineError
    naming the file and what is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        hint = " (a pytest-benchmark file? the guard no longer uses them)" if isinstance(doc, dict) and (
            "benchmarks" in doc or "machine_info" in doc) else ""
        raise BaselineError(f"perf baseline {path}: foreign file, not a {FORMAT!r} document{hint}; delete it "
                            "and record a baseline with --perf-record")
    if doc.get("version") != FORMAT_VERSION:
        raise BaselineError(f"perf baseline {path}: format version {doc.get('version')!r}, this guard reads "
                            f"version {FORMAT_VERSION}; record it again with --perf-record")
    if doc.get("gpu_class") != gpu_class or doc.get("kernel") != kernel:
        raise BaselineError(f"perf baseline {path}: foreign file: it records kernel {doc.get('kernel')!r} on GPU "
                            f"class {doc.get('gpu_class')!r}, but sits where {gpu_class}/{kernel} belongs")
    if doc.get("method") != METHOD:
        raise BaselineError(f"perf baseline {path}: timed with method {doc.get('method')!r}; this guard times with "
                            f"{METHOD!r}, so the numbers do not compare: record it again with --perf-record")
    rec, settings, cells = doc.get("recorded"), doc.get("settings"), doc.get("cells")
    if not isinstance(rec, dict) or not isinstance(rec.get("gpu_name"), str):
        raise BaselineError(f"perf baseline {path}: corrupt: 'recorded.gpu_name' missing")
    if not isinstance(settings, dict) or not isinstance(settings.get("sessions"), int) or settings["sessions"] < 1:
        raise BaselineError(f"perf baseline {path}: corrupt: 'settings.sessions' must be a positive int")
    if not isinstance(cells, dict) or not cells:
        raise BaselineError(f"perf baseline {path}: corrupt: 'cells' must be a non-empty table")
    for name, c in cells.items():
        if not isinstance(c, dict):
            raise BaselineError(f"perf baseline {path}: corrupt: cell {name!r} is not a table")
        for key in _CELL_NUMBERS:
            v = c.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0 or (
                    key == "median_us" and v <= 0):
                raise BaselineError(f"perf baseline {path}: corrupt: cell {name!r} field {key!r} = {v!r}")
        if not isinstance(c.get("case"), str):
            raise BaselineError(f"perf baseline {path}: corrupt: cell {name!r} has no 'case' id")
    return doc


def load_baseline(path, gpu_class: str, kernel: str) -> Optional[dict]:
    """The validated baseline, None when the file does not exist, BaselineError otherwise."""
    path = pathlib.Path(path)
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BaselineError(f"perf baseline {path}: corrupt: not readable JSON ({e})") from None
    return validate_baseline(doc, path, gpu_class, kernel)


def write_baseline(path, doc: dict) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def has_perf_job(gpu_class: str, table="checkout") -> Optional[bool]:
    """Whether CI runs the perf suite for `gpu_class`, from the shard table (ci/shards.toml
    of this checkout, or `table`): the class's own row, else [class.default]. None when there
    is no shard table (an installed package: --perf-require-baseline then applies to whatever
    class the job runs on)."""
    if table == "checkout":
        from ._paths import checkout_root
        root = checkout_root()
        table = pathlib.Path(root).joinpath(*SHARDS_TABLE) if root is not None else None
    if table is None or not pathlib.Path(table).exists():
        return None
    data = tomllib.loads(pathlib.Path(table).read_text())
    perf = {n for n, s in data.get("shard", {}).items() if str(s.get("suite", "")).rstrip("/").endswith("perf")}
    classes = data.get("class", {})
    row = classes.get(gpu_class, classes.get("default", {}))
    return any(n in perf for names in row.values() for n in names)


def baseline_required(require_flag: bool, perf_job: Optional[bool]) -> bool:
    """--perf-require-baseline makes a missing baseline fail only where CI has a perf job."""
    return bool(require_flag) and perf_job is not False


# ---- record and compare -------------------------------------------------------------------------

def cell_numbers(cell: PerfCell, us: float, read_tbs: float) -> dict:
    b = cell.bytes_moved
    tbs = b / (us * 1e-6) / 1e12 if us > 0 else 0.0
    return {"bytes": b, "tbs": tbs, "roofline_pct": 100 * tbs / read_tbs if read_tbs else None}


def record_kernel(timing: TimingSource, kernel, cells: list[PerfCell], *, gpu_class: str, kernel_spec: str,
                  sessions: int = RECORD_SESSIONS, rounds: int = ROUNDS, command: str = "",
                  crosscheck: bool = True) -> tuple[Optional[dict], dict, dict, dict]:
    """K sessions -> (baseline document or None when no cell ran, skipped {cell: reason},
    errors {cell: text}, per-session stats [{cell: CellStats}]) . The cross-check against
    triton.testing runs once, in the first session."""
    info = timing.device_info()
    per_session, skipped, errors, xcheck, kinds = [], {}, {}, {}, {}
    for k in range(sessions):
        s = timing.open(kernel, cells)
        try:
            skipped.update(s.skipped)
            errors.update(s.errors)
            kinds.update(s.timing)
            stats = measure_session(s, rounds)
            for name in list(stats):
                problem = s.check(name)
                if problem:
                    errors[name] = problem
            if k == 0 and crosscheck:
                for name in stats:
                    try:
                        xcheck[name] = s.crosscheck(name)
                    except Exception as e:  # noqa: BLE001 - the cross-check is informative only
                        xcheck[name] = {"error": f"{type(e).__name__}: {e}"}
            per_session.append(stats)
        finally:
            s.close()
        if k == 0 and not per_session[0]:
            break  # nothing runs (every cell skipped or failed): no use repeating
    by_name = {c.name: c for c in cells}
    doc_cells = {}
    for name in by_name:
        xs = [st[name] for st in per_session if name in st]
        if name in errors or not xs:
            continue
        cell = by_name[name]
        x_b, sigma, se_b = record_noise([x.median_us for x in xs], [x.se_rel for x in xs])
        sd = sigma_d(sigma, len(xs), se_b, se_b)
        thr = threshold_for(sd)  # log units; stored as a fraction below
        doc_cells[name] = {
            "case": cell.case.id, "shape": cell.shape, "batch": cell.case.batch, "context": cell.context,
            "max_len": cell.case.max_len, "timing": kinds.get(name, "?"),
            "median_us": x_b, "sessions_us": [x.median_us for x in xs], "noise_rel": sigma,
            "within_se_rel": se_b, "iqr_rel": statistics.median([x.iqr_rel for x in xs]),
            "samples_per_session": xs[0].samples, "threshold": math.exp(thr) - 1, "catches": catches(thr, sd),
            **cell_numbers(cell, x_b, info["read_tbs"]), "crosscheck": xcheck.get(name)}
    if not doc_cells:
        return None, skipped, errors, per_session
    doc = {"format": FORMAT, "version": FORMAT_VERSION, "gpu_class": gpu_class, "kernel": kernel.name,
           "kernel_spec": kernel_spec, "method": METHOD,
           "recorded": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        "gpu_name": info["gpu_name"], "gpu_uuid": info.get("gpu_uuid"), "sms": info.get("sms"),
                        "torch": info.get("torch"),
                        "triton": info.get("triton"), "cuda": info.get("cuda"),
                        "python": platform.python_version(), "command": command},
           "bandwidth": {"read_tbs": info["read_tbs"], "copy_tbs": info["copy_tbs"]},
           "settings": {"sessions": sessions, "rounds": rounds, "block_us": BLOCK_US, "z": Z,
                        "min_threshold": MIN_THRESHOLD},
           "cells": doc_cells}
    return doc, skipped, errors, per_session


@dataclass
class Verdict:
    """One (kernel, cell) result of a guard run."""
    kernel: str
    cell: str
    status: str  # pass | slower | faster | recorded | no-baseline | error | skipped
    fail: bool = False
    message: str = ""
    now_us: Optional[float] = None
    base_us: Optional[float] = None
    change: Optional[float] = None
    threshold: Optional[float] = None  # fraction: 0.015 = 1.5 %
    catches: Optional[float] = None
    bytes: Optional[int] = None
    tbs: Optional[float] = None
    roofline_pct: Optional[float] = None
    timing: str = ""
    context: Optional[int] = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @property
    def short(self) -> bool:
        t = self.base_us or self.now_us
        return t is not None and t < SHORT_CELL_US


def _numbers_text(v: Verdict) -> str:
    if v.bytes is None or v.tbs is None:
        return ""
    roof = f", {v.roofline_pct:.0f} % of read roofline" if v.roofline_pct is not None else ""
    return f"{v.bytes / 1e6:.1f} MB moved, {v.tbs:.2f} TB/s{roof}"


# Two lent H200s (one model, one driver, one software stack) ran the same kernels 2-3 % apart on
# bandwidth-bound cells and 3-5 % apart on a 15 us cell, and their read-only bandwidths measured
# 4.43 and 4.62 TB/s; repeated on one machine the measurement moved <= 0.3 %
# (docs/gpu-runs/2026-12-01-h200/probe10, close15). A reading more than this far from the
# baseline's, or another GPU's UUID, means another machine: thresholds derived from one
# machine's noise do not cover the difference between two.
MACHINE_READ_TOLERANCE = 0.01


def other_machine(base: dict, info: dict) -> Optional[str]:
    """A note when `base` was recorded on another GPU than the one `info` describes (its UUID,
    where both have one, or its read-only bandwidth off by more than MACHINE_READ_TOLERANCE);
    None when it looks like the same one."""
    rec, bw = base.get("recorded", {}), base.get("bandwidth", {})
    then, now = rec.get("gpu_uuid"), info.get("gpu_uuid")
    read_then, read_now = bw.get("read_tbs"), info.get("read_tbs")
    drift = read_now / read_then - 1 if read_then and read_now else 0.0
    why = []
    if then and now and then != now:
        why.append(f"recorded on GPU {then}, this is {now}")
    if abs(drift) > MACHINE_READ_TOLERANCE:
        why.append(f"this GPU reads at {read_now:.2f} TB/s, the baseline's at {read_then:.2f} ({drift:+.1%})")
    if not why:
        return None
    return ("machine: the baselines come from another machine (" + "; ".join(why) + "). GPUs of one model differ "
            "by a few percent (2-5 % measured between two H200s), more than thresholds derived from one machine's "
            "noise: a slower or faster cell may be the machine. Record the baselines on the machine that compares "
            "(docs/perf-guard.md, 'One model, several machines').")


def compare_cell(kernel: str, cell: PerfCell, base: dict, sessions: int, now: CellStats, read_tbs: float,
                 timing_kind: str = "") -> Verdict:
    """Verdict of one session's measurement against a baseline cell (module docstring)."""
    x_b = float(base["median_us"])
    d = math.log(now.median_us / x_b)
    sd = sigma_d(float(base["noise_rel"]), sessions, now.se_rel, float(base["within_se_rel"]))
    thr = threshold_for(sd)
    catch = catches(thr, sd)
    change = math.exp(d) - 1
    v = Verdict(kernel=kernel, cell=cell.name, status="pass", now_us=now.median_us, base_us=x_b, change=change,
                threshold=math.exp(thr) - 1, catches=catch, timing=timing_kind, context=cell.context,
                **cell_numbers(cell, now.median_us, read_tbs))
    head = (f"{kernel} {cell.name}: {now.median_us:.2f} us vs baseline {x_b:.2f} us ({change:+.1%}; "
            f"threshold {math.exp(thr) - 1:.1%} from measured noise {sd:.2%}; catches >= {catch:.1%})")
    if d > thr:
        v.status, v.fail = "slower", True
        v.message = f"SLOWER: {head}; {_numbers_text(v)}"
    elif d < -thr:
        v.status = "faster"
        v.message = (f"faster: {head}; {_numbers_text(v)} - re-record the baseline to lock the speed-up in")
    else:
        v.message = f"{head}; {_numbers_text(v)}"
    if v.short or catch > TARGET_SLOWDOWN:
        v.message += (f" [{'short cell (< 20 us)' if v.short else 'noisy cell'}: the smallest slowdown it "
                      f"catches is {catch:.1%}]")
    return v


def record_command(*, pyargs: bool, spec: str, baseline_dir, gpu_class_option: Optional[str] = None) -> str:
    suite = "--pyargs decode_conformance.suites.perf" if pyargs else "suites/perf"
    cmd = f"pytest {suite} --kernel={spec} --perf-record --perf-baseline-dir={baseline_dir}"
    if gpu_class_option:
        cmd += f" --gpu-class={gpu_class_option}"
    return cmd


class GuardRun:
    """The guard of one pytest session: measures each kernel once (all its cells, one
    session; K sessions when recording), caches the verdicts per (kernel, cell)."""

    def __init__(self, *, timing: Optional[TimingSource], gpu_class: str, baseline_dir, record: bool,
                 require: bool, pyargs: bool, gpu_class_option: Optional[str] = None, cells=None,
                 perf_job="checkout", selected: Optional[dict] = None):
        self.timing = timing
        self.gpu_class = gpu_class
        self.default_dir = not baseline_dir
        self.baseline_dir = pathlib.Path(baseline_dir) if baseline_dir else default_baseline_dir()
        self.record, self.require, self.pyargs = record, require, pyargs
        self.gpu_class_option = gpu_class_option
        self.cells = cells if cells is not None else load_cells()
        self.perf_job = has_perf_job(gpu_class) if perf_job == "checkout" else perf_job
        self.selected = selected  # {kernel name: cell names} the run compares (None: all); recording takes all
        self.outcomes: dict[str, dict[str, Verdict]] = {}
        self.notes: list[str] = []

    @property
    def required(self) -> bool:
        return baseline_required(self.require, self.perf_job)

    def outcome(self, kp) -> dict[str, Verdict]:
        if kp.name not in self.outcomes:
            try:
                self.outcomes[kp.name] = self._run(kp)
            except BaselineError as e:
                self.outcomes[kp.name] = {c.name: Verdict(kp.name, c.name, "error", True, str(e)) for c in self.cells}
            except Exception as e:  # noqa: BLE001 - reported per cell, the session goes on
                from .runner import kernel_traceback
                text = f"perf guard failed for {kp.name}: {type(e).__name__}: {kernel_traceback(e, False)}"
                self.outcomes[kp.name] = {c.name: Verdict(kp.name, c.name, "error", True, text) for c in self.cells}
        return self.outcomes[kp.name]

    def verdict(self, kp, cell_name: str) -> Verdict:
        v = self.outcome(kp).get(cell_name)
        if v is None:  # selected after the kernel was measured (should not happen under pytest)
            return Verdict(kp.name, cell_name, "error", True, f"{kp.name} {cell_name}: not measured in this run")
        return v

    def _path(self, kp) -> pathlib.Path:
        return baseline_path(self.baseline_dir, self.gpu_class, kp.name)

    def _cmd(self, kp) -> str:
        return record_command(pyargs=self.pyargs, spec=kp.spec, baseline_dir=self.baseline_dir,
                              gpu_class_option=self.gpu_class_option) + "  (on a GPU of this model, without -n)"

    def _run(self, kp) -> dict[str, Verdict]:
        kernel, path = kp.kernel, self._path(kp)
        out: dict[str, Verdict] = {}
        if self.record:
            from ._paths import checkout_root
            if self.default_dir and checkout_root() is None:
                raise BaselineError(f"--perf-record without --perf-baseline-dir would write {path} inside the installed "
                                    "package; pass --perf-baseline-dir=<a folder of your repository>")
            doc, skipped, errors, _ = record_kernel(self.timing, kernel, self.cells, gpu_class=self.gpu_class,
                                                    kernel_spec=kp.spec,
                                                    command=self._cmd(kp).split("  (")[0])
            if doc is not None:
                write_baseline(path, doc)
                self.notes.append(f"recorded {path}")
            read = self.timing.device_info()["read_tbs"]
            for c in self.cells:
                if c.name in skipped:
                    out[c.name] = Verdict(kp.name, c.name, "skipped", False, skipped[c.name])
                elif c.name in errors or doc is None or c.name not in doc["cells"]:
                    out[c.name] = Verdict(kp.name, c.name, "error", True,
                                          errors.get(c.name, f"{kp.name} {c.name}: nothing measured, nothing recorded"))
                else:
                    bc = doc["cells"][c.name]
                    v = Verdict(kp.name, c.name, "recorded", now_us=bc["median_us"], base_us=bc["median_us"],
                                threshold=bc["threshold"], catches=bc["catches"], timing=bc["timing"],
                                context=c.context, **cell_numbers(c, bc["median_us"], read))
                    v.message = (f"recorded {kp.name} {c.name}: {bc['median_us']:.2f} us over {len(bc['sessions_us'])} "
                                 f"sessions, noise {bc['noise_rel']:.2%}, threshold {bc['threshold']:.1%}, "
                                 f"catches >= {bc['catches']:.1%}; {_numbers_text(v)} -> {path}")
                    out[c.name] = v
            return out
        base = load_baseline(path, self.gpu_class, kp.name)  # BaselineError: handled below
        info = self.timing.device_info()
        if base is not None and base["recorded"]["gpu_name"] != info["gpu_name"]:
            raise BaselineError(f"perf baseline {path}: foreign file: recorded on {base['recorded']['gpu_name']!r}, "
                                f"this GPU is {info['gpu_name']!r} (same class {self.gpu_class}, another model); "
                                f"record one for this GPU with: {self._cmd(kp)}")
        other = other_machine(base, info) if base is not None else None
        if other and other not in self.notes:
            self.notes.append(other)
        cells = [c for c in self.cells if self.selected is None or c.name in self.selected.get(kp.name, ())]
        s = self.timing.open(kernel, cells)
        try:
            stats = measure_session(s)
            problems = {n: s.check(n) for n in stats}
            skipped, errors, kinds = dict(s.skipped), dict(s.errors), dict(s.timing)
        finally:
            s.close()
        sessions = int(base["settings"]["sessions"]) if base else 0  # per cell: len(sessions_us) below
        missing_msg = (f"no baseline for {self.gpu_class}/{kp.name} ({path}); record one with: {self._cmd(kp)}")
        if base is None and self.require and not self.required:
            missing_msg += (f" [class {self.gpu_class} has no perf job in ci/shards.toml, so "
                            "--perf-require-baseline does not apply]")
        for c in cells:
            if c.name in skipped:
                out[c.name] = Verdict(kp.name, c.name, "skipped", False, skipped[c.name])
                continue
            if c.name in errors or problems.get(c.name):
                out[c.name] = Verdict(kp.name, c.name, "error", True, errors.get(c.name) or problems[c.name])
                continue
            now = stats[c.name]
            bc = (base or {}).get("cells", {}).get(c.name)
            if bc is not None and bc["case"] != c.case.id:
                bc, why = None, (f"cell {c.name} was recorded as case {bc['case']} and is now {c.case.id}; "
                                 f"record it again with: {self._cmd(kp)}")
            elif bc is None:
                why = (missing_msg if base is None else
                       f"no baseline for cell {c.name} in {path}; record one with: {self._cmd(kp)}")
            if bc is None:
                v = Verdict(kp.name, c.name, "no-baseline", self.required, why, now_us=now.median_us,
                            timing=kinds.get(c.name, ""), context=c.context,
                            **cell_numbers(c, now.median_us, info["read_tbs"]))
                v.message = f"{why} | measured {now.median_us:.2f} us; {_numbers_text(v)}"
                out[c.name] = v
                continue
            k = len(bc.get("sessions_us") or []) or sessions
            v = compare_cell(kp.name, c, bc, k, now, info["read_tbs"], kinds.get(c.name, ""))
            if other and v.status in ("slower", "faster"):
                v.message += " [the baseline is from another machine: see the note below]"
            out[c.name] = v
        return out

    # ---- the terminal table -------------------------------------------------------------------
    def rows(self) -> list[Verdict]:
        return [v for k in self.outcomes.values() for v in k.values()]

    def table(self) -> list[str]:
        rows = [v for v in self.rows() if v.status != "skipped"]
        if not rows:
            return []
        info = self.timing.device_info() if self.timing is not None else {}
        lines = [f"perf guard ({'record' if self.record else 'compare'}): {info.get('gpu_name', '?')}, class "
                 f"{self.gpu_class}, read roofline {info.get('read_tbs', 0):.2f} TB/s, copy {info.get('copy_tbs', 0):.2f} "
                 f"TB/s; baselines {self.baseline_dir}"]
        hdr = (f"{'kernel':21s} {'cell':22s} {'status':11s} {'now us':>9s} {'base us':>9s} {'change':>7s} "
               f"{'thresh':>6s} {'catches':>7s} {'MB':>7s} {'TB/s':>5s} {'roof%':>5s}")
        lines += [hdr, "-" * len(hdr)]

        def f(x, fmt):
            width = int("".join(ch for ch in fmt.split(".")[0] if ch.isdigit()) or 0)
            return format(x, fmt) if x is not None else "-".rjust(width)
        for v in rows:
            thr = v.threshold
            lines.append(f"{v.kernel:21s} {v.cell:22s} {v.status:11s} {f(v.now_us, '9.2f')} {f(v.base_us, '9.2f')} "
                         f"{f(v.change, '+7.1%')} {f(thr, '6.1%')} {f(v.catches, '7.1%')} "
                         f"{f(v.bytes / 1e6 if v.bytes else None, '7.1f')} {f(v.tbs, '5.2f')} "
                         f"{f(v.roofline_pct, '5.0f')}")
        for v in rows:
            if v.status in ("slower", "faster", "error", "no-baseline"):
                lines.append(f"  {v.status}: {v.message.splitlines()[0][:400]}")
        lines += [f"  {n}" for n in self.notes]
        return lines

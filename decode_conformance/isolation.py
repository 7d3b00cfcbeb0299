"""Crash and hang isolation (design principle 7: a crash is a result, not the end of the run).

`IsolatedRunner` keeps one persistent worker process (multiprocessing, spawn context) that
runs any named scenario (scenarios.py) on a case: the parent sends (kernel spec, scenario name,
Case.to_dict()) and receives a CaseResult. When a case

  - gives no result within the per-case timeout, the worker is killed and restarted and the
    case fails with "hung: no result within N s (kernel killed, worker restarted)";
  - kills the worker (segfault, abort, os._exit, the OOM killer), the case fails with
    "crashed: worker exited with signal SIGSEGV" (or "... with code N") and a fresh worker
    takes the next case;
  - returns a result whose message shows a device error (illegal memory access, "CUDA
    error", "HIP error", ...), the result stands but the worker is restarted anyway: such
    errors poison the CUDA context of the process, so every later case in it would fail too.

Only the case that misbehaved fails; every other result of the run is kept.

The worker is set up like the pytest process: a checkout that is not pip-installed aliased
to the installed package names (`_paths.alias_checkout`), and on device cpu TRITON_INTERPRET=1
with the bf16 interpreter layer (`devices.use_interpreter`). It imports each kernel by its spec, so a
kernel under isolation must be importable by spec (`pkg.module:obj`), not only an object.

The worker's stdout/stderr go to a log file; faulthandler writes the Python stack there on a
fatal signal, and on a hang the parent asks for the stack (SIGUSR1) before killing, so the
failure names the frame that crashed or hung.
"""
from __future__ import annotations

import atexit
import faulthandler
import multiprocessing
import os
import pathlib
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import time
import weakref
from typing import Optional

# Messages that mean the device context of the process is gone: later CUDA/HIP calls in the
# same process fail with the same error, so the worker must be replaced.
CONTEXT_POISON = re.compile(
    r"illegal memory access|illegal instruction|misaligned address|unspecified launch failure|"
    r"device-side assert|CUDA error|HIP error|hipError|cudaError|CUDA_ERROR|"
    r"an illegal|launch timed out|uncorrectable ECC",
    re.IGNORECASE)

STARTUP_TIMEOUT_S = 300.0  # importing torch (+ a CUDA context) must finish within this
_POLL_SLICE_S = 0.5
_STACK_DUMP_WAIT_S = 0.5
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_LIBRARY_PREFIXES = tuple(sorted({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
_LIVE: "weakref.WeakSet[IsolatedRunner]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # a hung worker must not keep the interpreter from exiting
    for r in list(_LIVE):
        r.close()


def poisons_context(message: str) -> bool:
    return bool(message) and CONTEXT_POISON.search(message) is not None


def describe_exit(exitcode: Optional[int]) -> str:
    if exitcode is None:
        return "worker stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return f"worker exited with signal {name}"
    return f"worker exited with code {exitcode}"


def _format_seconds(s: float) -> str:
    return f"{s:g}"


# ---- the worker ------------------------------------------------------------------------

def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# Triton's source-line records in each binary serve profilers and debuggers, not a correctness
# run: without them a cold main job compiled 4 % faster (39.4 s against 41.2 s, one H100,
# docs/gpu-runs/2026-12-06-h100-s39). The variable is part of Triton's cache key, so these
# binaries never stand in for a profiling run's. A user's own value (0 keeps line info) is kept.
LINE_INFO_VAR = "TRITON_DISABLE_LINE_INFO"


def use_compile_defaults() -> None:
    """The Triton settings of every process that compiles the suite's kernels for a GPU: this
    module's worker and the compile-ahead pool. The same settings make the same cache keys, so a
    pool's binaries are the ones the cases look up. Call it before the first compile."""
    os.environ.setdefault(LINE_INFO_VAR, "1")


def _worker_main(conn, device: str, root: str, log_path: str, preload: tuple = ()) -> None:
    """Entry point of the worker process (spawned; must stay importable at module level).
    `preload`: kernel specs to import once the device is up, while the parent still collects
    (a spec that fails to load is reported by the case that uses it, as without preloading)."""
    if device != "cpu":
        use_compile_defaults()
    _redirect_output(log_path)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    from ._paths import alias_checkout
    alias_checkout(pathlib.Path(root) if root else None)
    if device == "cpu":
        from .devices import use_interpreter
        use_interpreter()
    from .cases import Case
    from .device_memory import trim
    from .kernel_api import KernelLoadError, load_kernel
    from .runner import CaseResult
    from .scenarios import run

    if device != "cpu":  # the device context now, before any case is waiting for it
        import torch
        torch.empty(0, device=device)
    conn.send(("ready", os.getpid()))
    kernels: dict = {}
    for spec in preload:
        try:
            kernels[spec] = load_kernel(spec)
        except KernelLoadError:
            pass
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        spec, name, scenario, case_dict = msg
        case = Case.from_dict(case_dict)
        try:
            if spec not in kernels:
                kernels[spec] = load_kernel(spec)
            res = run(scenario, kernels[spec], case, device)
            if device != "cpu":
                trim(device)  # the parent's slot for a heavy case ends when this returns
        except KernelLoadError as e:
            res = CaseResult(kernel=name, case_id=case.id, status="error", scenario=scenario,
                             message=f"isolation worker: {e}")
        except Exception as e:  # scenarios turn kernel errors into results; this is the suite's
            res = CaseResult(kernel=name, case_id=case.id, status="error", scenario=scenario,
                             message=f"isolation worker: {type(e).__name__}: {e}")
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.send(("result", res))
        except Exception as e:  # an unpicklable verdict: keep the essentials
            res.verdict, res.output = None, None
            res.message += f" (result sent without its verdict: {type(e).__name__}: {e})"
            conn.send(("result", res))


# ---- the parent side -------------------------------------------------------------------

class IsolatedRunner:
    """Runs cases in a worker process that is replaced when it hangs, dies or is poisoned.

    One per pytest process (each xdist worker has its own, pinned to its GPU through the
    inherited *_VISIBLE_DEVICES).
    """

    def __init__(self, device: str, case_timeout: Optional[float], root: Optional[str] = None,
                 startup_timeout: float = STARTUP_TIMEOUT_S, preload: tuple = ()):
        from ._paths import checkout_root
        self.device = device
        self.preload = tuple(preload)  # kernel specs each worker imports before its first case
        self.case_timeout = case_timeout if case_timeout and case_timeout > 0 else None
        root = root or checkout_root()
        self.root = str(root) if root else ""
        self.startup_timeout = startup_timeout
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
        self._conn = None
        self._ready = False
        self._log_dir = tempfile.mkdtemp(prefix="decode-conformance-worker-")
        self._log_path = ""
        self.starts = 0  # how many workers were started (tests and the report read it)
        self.restarts = []  # why each replacement happened
        _LIVE.add(self)

    # -- worker lifecycle --
    def _start(self) -> None:
        self.starts += 1
        self._log_path = os.path.join(self._log_dir, f"worker-{self.starts}.log")
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, name=f"decode-conformance-worker-{self.starts}",
                                 args=(child_conn, self.device, self.root, self._log_path, self.preload), daemon=False)
        proc.start()
        child_conn.close()  # so the worker's death reads as EOF here
        self._proc, self._conn, self._ready = proc, parent_conn, False

    def start(self) -> None:
        """Start the worker process now if none is running (it is otherwise started by the
        first case)."""
        if self._proc is None:
            self._start()

    def _wait_ready(self) -> Optional[str]:
        """None when the worker is up, else why it is not."""
        if self._proc is None:
            self._start()
        if self._ready:
            return None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._conn.poll(_POLL_SLICE_S):
                try:
                    kind, _ = self._conn.recv()
                except (EOFError, OSError):
                    break
                if kind == "ready":
                    self._ready = True
                    return None
            elif not self._proc.is_alive():
                break
        why = ("did not start within " + _format_seconds(self.startup_timeout) + " s"
               if self._proc.is_alive() else describe_exit(self._reap()))
        tail = self.log_tail()
        self._kill()
        return f"isolation worker failed to start: {why}" + (f"; output: {tail[-1]}" if tail else "")

    def _reap(self, wait: float = 5.0) -> Optional[int]:
        self._proc.join(wait)
        return self._proc.exitcode

    def _kill(self) -> None:
        if self._proc is None:
            return
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(10)
        try:
            self._conn.close()
        except OSError:
            pass
        self._proc, self._conn, self._ready = None, None, False

    def _replace(self, why: str) -> None:
        """Kill the current worker and start the next one now, so it warms up while the
        parent records the result."""
        self.restarts.append(why)
        self._kill()
        self._start()

    def _dump_stacks(self) -> None:
        if self._proc is not None and self._proc.is_alive() and hasattr(signal, "SIGUSR1"):
            try:
                os.kill(self._proc.pid, signal.SIGUSR1)
            except OSError:
                return
            time.sleep(_STACK_DUMP_WAIT_S)

    def log_tail(self, n: int = 40) -> list[str]:
        try:
            lines = pathlib.Path(self._log_path).read_text(errors="replace").splitlines()
        except OSError:
            return []
        return lines[-n:]

    def _where(self, lines: list[str]) -> str:
        """Where the worker was, from the last faulthandler dump in its output ('File "...",
        line N in f', most recent call first): the innermost frame and, when that is inside
        Python or an installed package, the innermost frame of the kernel's own code."""
        starts = [i for i, ln in enumerate(lines) if "most recent call first" in ln]
        frames = []
        for ln in lines[starts[-1] + 1:] if starts else []:
            m = _FRAME.match(ln.strip())
            if not m:
                if frames:
                    break
                continue
            frames.append((m.group("path"), m.group("line"), m.group("func")))
        if not frames:
            return ""

        def fmt(f):
            path, line, func = f
            for base in ((self.root,) if self.root else ()) + _LIBRARY_PREFIXES:
                try:
                    path = str(pathlib.Path(path).resolve().relative_to(pathlib.Path(base).resolve()))
                    break
                except ValueError:
                    continue
            return f"{func} ({path}:{line})"

        text = fmt(frames[0])
        own = next((f for f in frames if not f[0].startswith(_LIBRARY_PREFIXES)), None)
        if own is not None and own is not frames[0]:
            text += f" <- {fmt(own)}"
        return text

    # -- running cases --
    def run(self, spec: str, case, scenario: str = "parity", name: str = ""):
        """The scenario `scenario` of the kernel `spec` (called `name`) on `case`, in the worker."""
        from .runner import CaseResult
        name = name or spec.rsplit(":", 1)[-1]
        res = CaseResult(kernel=name, case_id=case.id, status="error", scenario=scenario)
        problem = self._wait_ready()  # a replacement worker may still be importing torch
        if problem:
            res.message = problem
            return res
        t0 = time.perf_counter()
        log_mark = len(self.log_tail(10**9))
        try:
            self._conn.send((spec, name, scenario, case.to_dict()))
        except (OSError, ValueError) as e:
            why = describe_exit(self._reap(1.0))
            self._replace(why)
            res.status, res.message = "failed", f"crashed: {why} (before the case started: {e})"
            return res

        deadline = None if self.case_timeout is None else time.monotonic() + self.case_timeout
        while True:
            left = _POLL_SLICE_S if deadline is None else min(_POLL_SLICE_S, deadline - time.monotonic())
            if left <= 0:
                return self._hung(res, t0, log_mark)
            if self._conn.poll(left):
                try:
                    kind, payload = self._conn.recv()
                except (EOFError, OSError):
                    return self._crashed(res, t0, log_mark)
                if kind != "result":
                    continue
                out = payload
                if poisons_context(out.message):
                    self._replace(f"device error in {case.id}")
                    out.message += " (device context poisoned: worker restarted)"
                return out
            if not self._proc.is_alive():
                return self._crashed(res, t0, log_mark)

    def _new_output(self, log_mark: int) -> list[str]:
        return self.log_tail(10**9)[log_mark:]

    def _hung(self, res, t0, log_mark):
        self._dump_stacks()
        lines = self._new_output(log_mark)
        frame = self._where(lines)
        self._replace(f"hang in {res.case_id}")
        res.status = "failed"
        res.message = (f"hung: no result within {_format_seconds(self.case_timeout)} s "
                       f"(kernel killed, worker restarted)" + (f"; stack: {frame}" if frame else ""))
        res.worker_log = lines[-40:]
        res.seconds = time.perf_counter() - t0
        return res

    def _crashed(self, res, t0, log_mark):
        why = describe_exit(self._reap())
        lines = self._new_output(log_mark)
        frame = self._where(lines)
        self._replace(f"{why} in {res.case_id}")
        res.status = "failed"
        res.message = f"crashed: {why}" + (f"; stack: {frame}" if frame else "") + " (worker restarted)"
        res.worker_log = lines[-40:]
        res.seconds = time.perf_counter() - t0
        return res

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
            self._proc.join(5)
        self._kill()
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

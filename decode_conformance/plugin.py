"""The pytest plugin: options, the kernel x case parametrization, skips and ledger marks,
GPU pinning under xdist, and the conformance report.

Loaded by the repository's root conftest.py (`pytest_plugins`), so `pytest suites/...` in a
checkout picks it up with or without `pip install`.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional

import pytest

from . import hardware

OPT_GROUP = "decode-conformance"
ISOLATION_MODES = ("none", "process")
DEFAULT_CASE_TIMEOUT = {"gpu": 600.0, "cpu": 900.0}


def pytest_addoption(parser):
    g = parser.getgroup(OPT_GROUP, "decode-attention conformance")
    g.addoption("--kernel", action="append", default=[], metavar="PKG.MODULE:OBJ",
                help="kernel under test (repeatable); default: $DECODE_CONFORMANCE_KERNELS, else every shipped kernel")
    g.addoption("--list-kernels", action="store_true", help="print the kernels and their capabilities, then exit")
    g.addoption("--case-set", default=os.environ.get("DECODE_CONFORMANCE_CASE_SET", "parity"),
                help="named case set: smoke, parity (default), full")
    g.addoption("--case-id", action="append", default=[], help="run only this exact case id (repeatable)")
    g.addoption("--device", default=None, help="cuda, cuda:N or cpu; default: cuda when a GPU is visible")
    g.addoption("--gpu-class", default=None, help="override the detected GPU class (e.g. sm_90, gfx942, cpu)")
    g.addoption("--ledger", action="append", default=[],
                help="known-failure ledger TOML (repeatable); default: $DECODE_CONFORMANCE_LEDGER, "
                     "else fixtures/known_failures.toml")
    g.addoption("--conformance-report", default=None, metavar="PATH",
                help="write PATH.json and PATH.md (kernel x case matrix with reproduce lines)")
    g.addoption("--isolation", choices=ISOLATION_MODES, default=None,
                help="process: run cases in a worker process that is killed and restarted when a kernel "
                     "hangs, crashes or poisons the CUDA context, failing only its own cases; none: run "
                     "in the pytest process. Default: process on a GPU, none on cpu")
    g.addoption("--case-timeout", type=float, default=None, metavar="SECONDS",
                help=f"per-case time limit (0 = none; default {DEFAULT_CASE_TIMEOUT['gpu']:g} on a GPU, "
                     f"{DEFAULT_CASE_TIMEOUT['cpu']:g} on cpu). Under --isolation=process a case past it fails "
                     "and the run goes on; under --isolation=none a hung case ends the whole run "
                     "(tracebacks dumped), since a kernel cannot be stopped inside the process")


@dataclass
class Session:
    device: str
    gpu_class: str
    profile: str
    case_set: str
    kernels: list  # [(spec, kernel or None, error or None)]
    ledger: object
    results: list
    isolation: str = "none"
    case_timeout: Optional[float] = None  # seconds; None = no limit
    runner: object = None  # isolation.IsolatedRunner, started on the first isolated case


def _session(config) -> Session:
    return config._dc_session


def _choose_device(opt: Optional[str]) -> str:
    if opt:
        return opt
    return "cuda" if hardware.has_gpu() else "cpu"


def resolve_isolation(device: str, isolation: Optional[str], timeout: Optional[float]) -> tuple[str, Optional[float]]:
    """(--isolation, --case-timeout) after defaults: process isolation and 600 s on a GPU,
    none and 900 s on cpu (where kernels are plain Python under the interpreter and a
    worker process would only cost time). A timeout of 0 means none (returned as None)."""
    kind = "cpu" if device == "cpu" else "gpu"
    isolation = isolation or ("none" if kind == "cpu" else "process")
    if isolation not in ISOLATION_MODES:
        raise pytest.UsageError(f"--isolation: expected one of {ISOLATION_MODES}, got {isolation!r}")
    timeout = DEFAULT_CASE_TIMEOUT[kind] if timeout is None else float(timeout)
    if timeout < 0:
        raise pytest.UsageError(f"--case-timeout: expected seconds >= 0 (0 = none), got {timeout:g}")
    return isolation, (timeout or None)


def pytest_configure(config):
    for line in (
        "decode_case: a decode-conformance kernel x case test",
        "gpu_only: needs a real GPU",
        "min_gpu_memory(gb): needs at least this much device memory",
        "fp8_tensor_cores: the kernel runs fp8 matrix instructions on this case",
    ):
        config.addinivalue_line("markers", line)
    device = _choose_device(config.getoption("--device"))
    if device == "cpu":
        # Must precede the first `import triton` anywhere in the process; the isolation
        # worker runs the same function.
        from .isolation import use_interpreter
        use_interpreter()
    elif os.environ.get("TRITON_INTERPRET") == "1":
        raise pytest.UsageError("TRITON_INTERPRET=1 is set but --device is a GPU: unset it or pass --device=cpu")
    gpu_class = config.getoption("--gpu-class") or (hardware.CPU_CLASS if device == "cpu" else hardware.detect_class())
    from .kernel_api import KernelLoadError, kernel_specs, load_kernel
    from .ledger import Ledger, default_ledger_paths
    kernels = []
    for spec in kernel_specs(config.getoption("--kernel")):
        try:
            kernels.append((spec, load_kernel(spec), None))
        except KernelLoadError as e:
            kernels.append((spec, None, str(e)))
    ledger = Ledger.load(config.getoption("--ledger") or default_ledger_paths(config.rootpath))
    isolation, timeout = resolve_isolation(device, config.getoption("--isolation"), config.getoption("--case-timeout"))
    config._dc_session = Session(device=device, gpu_class=gpu_class,
                                 profile="interpreter" if device == "cpu" else "gpu",
                                 case_set=config.getoption("--case-set"), kernels=kernels,
                                 ledger=ledger, results=[], isolation=isolation,
                                 case_timeout=timeout)


def pytest_unconfigure(config):
    s = getattr(config, "_dc_session", None)
    if s is not None and s.runner is not None:
        s.runner.close()
        s.runner = None


def pytest_cmdline_main(config):
    if config.getoption("--list-kernels"):
        config._do_configure()
        s = _session(config)
        for spec, k, err in s.kernels:
            if k is None:
                print(f"{spec}\n    NOT LOADED: {err}")
            else:
                print(f"{k.name:16s} {spec}\n    {k.caps.describe()}")
        config._ensure_unconfigure()
        return 0
    return None


def pytest_report_header(config):
    s = getattr(config, "_dc_session", None)
    if s is None:
        return None
    names = ", ".join(k.name if k else f"{spec} (not loaded)" for spec, k, _ in s.kernels)
    timeout = f"{s.case_timeout:g}s" if s.case_timeout else "none"
    return [f"decode-conformance: device={s.device} gpu_class={s.gpu_class} case_set={s.case_set} "
            f"profile={s.profile} TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')} "
            f"isolation={s.isolation} case_timeout={timeout}",
            f"kernels: {names}"]


# ---- parametrization -----------------------------------------------------------------

@dataclass(frozen=True)
class KernelParam:
    spec: str
    kernel: object
    error: Optional[str]

    @property
    def name(self) -> str:
        return self.kernel.name if self.kernel is not None else self.spec.rsplit(":", 1)[-1]


def _case_marks(s: Session, kp: KernelParam, case) -> list:
    from .memory import case_bytes
    marks = [pytest.mark.decode_case]
    if kp.kernel is None:
        return marks
    device_type = "cpu" if s.device == "cpu" else "cuda"
    missing = kp.kernel.caps.missing_for(case, device_type)
    if missing:
        marks.append(pytest.mark.skip(reason=f"{kp.name} lacks: {', '.join(missing)}"))
        return marks
    cls = hardware.known_classes().get(s.gpu_class)
    need_gb = case_bytes(case) / 2**30
    marks.append(pytest.mark.min_gpu_memory(round(need_gb, 2)))
    if cls is not None and cls.memory_gb and need_gb > 0.8 * cls.memory_gb:
        marks.append(pytest.mark.skip(reason=f"needs {need_gb:.1f} GB; class {s.gpu_class} has {cls.memory_gb:g} GB"))
        return marks
    if case.is_fp8 and kp.kernel.caps.fp8_tensor_cores:
        marks.append(pytest.mark.fp8_tensor_cores)
        if cls is not None and cls.vendor != "cpu" and not cls.fp8_tensor_cores:
            marks.append(pytest.mark.skip(reason=f"{kp.name} runs fp8 MMAs; class {s.gpu_class} has no fp8 "
                                                 "tensor cores"))
            return marks
    entry = s.ledger.match(kp.name, case.id, s.gpu_class)
    if entry is not None:
        marks.append(entry.mark())
    return marks


def pytest_generate_tests(metafunc):
    if not {"dc_kernel", "dc_case"} <= set(metafunc.fixturenames):
        return
    s = _session(metafunc.config)
    from .case_sets import build_set
    cases = build_set(s.case_set, s.profile)
    wanted = metafunc.config.getoption("--case-id")
    if wanted:
        known = {c.id for c in cases}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise pytest.UsageError(f"--case-id: not in case set {s.case_set!r} ({s.profile}): {unknown}")
        cases = [c for c in cases if c.id in set(wanted)]
    params = []
    for spec, kernel, err in s.kernels:
        kp = KernelParam(spec, kernel, err)
        for case in cases:
            params.append(pytest.param(kp, case, id=f"{kp.name}|{case.id}", marks=_case_marks(s, kp, case)))
    metafunc.parametrize(("dc_kernel", "dc_case"), params)


# ---- fixtures ------------------------------------------------------------------------

@pytest.fixture(scope="session")
def dc_session(request) -> Session:
    return _session(request.config)


@pytest.fixture
def dc_run(request, dc_session):
    """Run a kernel on a case, record the result for the report, return the CaseResult."""
    from .runner import CaseResult, failure_text, repro_command, run_case

    def run(kp: KernelParam, case, **kw):
        repro = repro_command(kp.spec, case, dc_session.case_set, dc_session.device,
                              suite=str(request.node.path.parent.relative_to(request.config.rootpath)))
        if kp.kernel is None:
            res = CaseResult(kernel=kp.name, case_id=case.id, status="error", message=kp.error, repro=repro)
        elif dc_session.isolation == "process":
            if dc_session.runner is None:
                from .isolation import IsolatedRunner
                dc_session.runner = IsolatedRunner(dc_session.device, dc_session.case_timeout,
                                                   root=str(request.config.rootpath))
            res = dc_session.runner.run(kp.spec, case, repro=repro, **kw)
            res.kernel = kp.name  # the worker names it by the loaded kernel too; keep the parent's
        else:
            with _in_process_timeout(request.config, dc_session.case_timeout, f"{kp.name} on {case.id}"):
                res = run_case(kp.kernel, case, dc_session.device, repro=repro, **kw)
        res.extra["text"] = failure_text(res, case)
        request.node.user_properties.append(("dc_result", json.dumps(res.to_dict())))
        return res

    return run


@contextlib.contextmanager
def _in_process_timeout(config, seconds: Optional[float], what: str = ""):
    """--isolation=none: a kernel cannot be stopped inside the process, so past the limit the
    run ends: a note says why, then faulthandler dumps every thread's stack and exits (like
    pytest-timeout's thread method; faulthandler's watchdog is a C thread, so it fires even
    when the kernel holds the GIL). Left alone when pytest's own faulthandler_timeout is set
    (one faulthandler timer per process)."""
    try:
        own = float(config.getini("faulthandler_timeout") or 0)
    except (ValueError, KeyError):
        own = 0.0
    if not seconds or own > 0:
        yield
        return
    out = None
    try:  # pytest's faulthandler plugin keeps a dup of the real stderr (capture replaces fd 2)
        from _pytest.faulthandler import fault_handler_stderr_fd_key
        out = config.stash.get(fault_handler_stderr_fd_key, None)
    except ImportError:
        pass
    fd = out if out is not None else sys.__stderr__.fileno()

    def note():
        msg = (f"\ndecode-conformance: {what} gave no result within --case-timeout={seconds:g} s under "
               f"--isolation=none; ending the run (use --isolation=process to fail only this case)\n")
        try:
            os.write(fd, msg.encode())
        except OSError:
            pass

    import threading
    timer = threading.Timer(seconds, note)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(seconds + 0.5, exit=True, file=fd)
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()


# ---- report --------------------------------------------------------------------------

def _split_nodeid(nodeid: str) -> tuple[str, str]:
    inside = nodeid.split("[", 1)[1][:-1] if "[" in nodeid else nodeid
    kernel, _, case = inside.partition("|")
    return kernel, case


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """Runs on the controller under xdist too, so results are gathered in one place."""
    s = _REPORTING.get("session")
    if s is None or "|" not in report.nodeid:
        return
    test = report.nodeid.split("[", 1)[0]  # which test function produced the row
    if report.when == "call":
        for key, val in report.user_properties:
            if key == "dc_result":
                d = json.loads(val)
                d["test"] = test
                if hasattr(report, "wasxfail"):
                    d["status"] = "xfailed" if report.skipped else "xpassed"
                elif report.failed and str(report.longrepr).startswith("[XPASS(strict)]"):
                    # A strict xfail that passed: pytest fails the test without `wasxfail`.
                    d["status"] = "xpassed"
                    d["message"] = (f"passed but the ledger expects a failure ({report.longrepr}); "
                                    f"remove or narrow the ledger entry | {d.get('message', '')}")
                s.results.append(d)
    elif report.when == "setup" and report.skipped:
        kernel, case = _split_nodeid(report.nodeid)
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.replace("Skipped: ", "")
        s.results.append({"kernel": kernel, "case": case, "verdict": None, "repro": "", "seconds": 0,
                          "status": "quarantined" if reason.startswith("quarantined") else "skipped",
                          "message": reason, "test": test})


_REPORTING: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    _REPORTING["session"] = getattr(session.config, "_dc_session", None)


def _unused_ledger_entries(s: Session):
    from .case_sets import build_set
    names = [k.name for _, k, _ in s.kernels if k is not None]
    ids = [c.id for c in build_set(s.case_set, s.profile)]
    return s.ledger.unused(((k, c) for k in names for c in ids), s.gpu_class)


def pytest_sessionfinish(session, exitstatus):
    cfg = session.config
    s = getattr(cfg, "_dc_session", None)
    if s is None or hasattr(cfg, "workerinput"):
        return
    path = cfg.getoption("--conformance-report")
    if path:
        from .report import write_report
        write_report(path, s.results, meta={"device": s.device, "gpu_class": s.gpu_class, "case_set": s.case_set})


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    s = getattr(config, "_dc_session", None)
    if s is None or not s.ledger.entries:
        return
    for entry in _unused_ledger_entries(s):
        terminalreporter.write_line(f"ledger warning: entry matches no case in this run: {entry.describe()}",
                                    yellow=True)

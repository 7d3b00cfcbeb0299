"""The pytest plugin (registered through the `pytest11` entry point): thin hooks over one
RunState per pytest process (state.py).

Loading it costs nothing: the hooks below do their work only in a conformance run - one
whose command line names a conformance suite or option (`state.conformance_requested`) -
so an adopter's unrelated tests see no environment change, no Triton patching and no
kernel imports. In a conformance run the state is built in `pytest_configure`, where every
configuration mistake is a usage error, once, before any case runs.
"""
from __future__ import annotations

import json
import os

import pytest

STATE = pytest.StashKey["object"]()
REPORT = pytest.StashKey["object"]()
_WORKER_FLAG = "decode_conformance"


def pytest_addoption(parser):
    g = parser.getgroup("decode-conformance", "decode-attention conformance")
    g.addoption("--kernel", action="append", default=[], metavar="PKG.MODULE:OBJ",
                help="kernel under test (repeatable): an instance, a class or a zero-argument factory; "
                     "default: $DECODE_CONFORMANCE_KERNELS, else the shipped kernels")
    g.addoption("--list-kernels", action="store_true", help="print the kernels and their capabilities, then exit")
    g.addoption("--case-set", default=None,
                help="named case set: smoke, parity (default; $DECODE_CONFORMANCE_CASE_SET), full, fuzz (hypothesis: "
                     "suites/parity/test_fuzz.py), or trace:PATH (a FlashInfer-Trace workload JSONL)")
    g.addoption("--case-id", action="append", default=[], help="run only this exact case id (repeatable)")
    g.addoption("--extra-cases", action="append", default=[], metavar="PATH",
                help="your own cases, run beside the case set: a JSON Lines file, one case per line as a fuzz find "
                     "prints it (repeatable; default: $DECODE_CONFORMANCE_EXTRA_CASES, paths separated by "
                     f"'{os.pathsep}')")
    g.addoption("--device", default=None, help="cuda, cuda:N or cpu; default: cuda when a GPU is visible")
    g.addoption("--gpu-class", default=None, help="override the detected GPU class (e.g. sm_90, gfx942, cpu)")
    g.addoption("--ledger", action="append", default=[],
                help="known-failure ledger TOML (repeatable); default: $DECODE_CONFORMANCE_LEDGER, "
                     "else the shipped kernels' ledger")
    g.addoption("--conformance-report", default=None, metavar="PATH",
                help="write PATH.json and PATH.md: failures first with reproduce lines, versions, every suite")
    g.addoption("--require-cases", action="store_true",
                help="fail the run when every parity case of a kernel was skipped (CI: a green run that "
                     "tested nothing is a failure)")
    g.addoption("--isolation", choices=("none", "process"), default=None,
                help="process: run cases in a worker process that is killed and restarted when a kernel "
                     "hangs, crashes or poisons the CUDA context, failing only its own cases; none: run "
                     "in the pytest process. Default: process on a GPU, none on cpu")
    g.addoption("--case-timeout", type=float, default=None, metavar="SECONDS",
                help="per-case time limit (0 = none; default 600 on a GPU, 900 on cpu). Under "
                     "--isolation=process a case past it fails and the run goes on; under --isolation=none "
                     "a hung case ends the whole run (tracebacks dumped)")
    g.addoption("--compile-ahead", default=None, metavar="off|auto|MANIFEST",
                help="compile the run's Triton variants in the background on the host's idle cores (compile_ahead.py): "
                     "off (default: measured no faster, docs/compile-ahead.md); auto: the shipped manifest of this "
                     "GPU class and Triton version when the run is the one it was recorded from (the shipped kernels "
                     "on the whole parity set); or a manifest's path")
    from . import fuzz_options, perf_options
    perf_options.add_options(g)
    fuzz_options.add_options(g)


def state_of(config, activate: bool = False, runs_cases: bool = True):
    """The run state, or None outside a conformance run (built on demand when `activate`;
    `runs_cases`: state.build_state's)."""
    s = config.stash.get(STATE, None)
    if s is None and activate:
        from .state import build_state
        s = config.stash[STATE] = build_state(config, runs_cases=runs_cases)
    return s


# ---- xdist (optional hooks: harmless with -p no:xdist or without xdist) --------------------

# tryfirst: xdist's own implementation (the CPU count) answers first otherwise whenever this
# plugin was registered before xdist (entry points load in distribution order).
@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    from . import xdist_pinning
    return xdist_pinning.auto_num_workers(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    from . import xdist_pinning
    xdist_pinning.setup_nodes(config, specs)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    s = state_of(node.config)
    if s is not None:
        node.workerinput[_WORKER_FLAG] = True
        if not node.config.getoption("--device"):
            from .state import WORKER_DEVICE_KEY
            node.workerinput[WORKER_DEVICE_KEY] = s.device


# ---- configuration ---------------------------------------------------------------------------

def _dist_mode(config) -> str:
    """xdist's --dist mode, set from -n before pytest_configure: 'no' without xdist or workers."""
    return getattr(config.option, "dist", "no") or "no"


def _quiet_benchmark_under_xdist(config) -> None:
    """Under xdist pytest-benchmark disables itself (timing on shared workers is not timing), and
    some releases say so once per worker process in every parity run (seen: seven times in one H200
    log). The perf suite never runs under xdist (it skips, saying why), so turning it off up front
    changes nothing but the noise. Runs before pytest-benchmark's own configure (trylast there);
    --benchmark-enable still wins."""
    import os
    under_xdist = _dist_mode(config) != "no" or bool(os.environ.get("PYTEST_XDIST_WORKER"))
    if under_xdist and hasattr(config.option, "benchmark_disable"):
        config.option.benchmark_disable = True


def pytest_configure(config):
    for line in (
        "decode_case: a decode-conformance kernel x case test",
        "dc_scenario(name): the scenario (decode_conformance/scenarios.py) a conformance test runs",
        "gpu_only: needs a real GPU",
        "min_gpu_memory(gb): needs at least this much device memory",
        "fp8_tensor_cores: the kernel runs fp8 matrix instructions on this case",
    ):
        config.addinivalue_line("markers", line)
    _quiet_benchmark_under_xdist(config)
    from . import perf_options
    perf_options.check(config, _dist_mode(config))
    from .state import conformance_requested
    if config.getoption("--list-kernels"):
        return
    worker = getattr(config, "workerinput", None)
    if (worker is not None and worker.get(_WORKER_FLAG)) or (worker is None and conformance_requested(config)):
        runs_cases = worker is not None or _dist_mode(config) == "no"
        s = state_of(config, activate=True, runs_cases=runs_cases and not config.option.collectonly)
        if worker is None and not config.option.collectonly:
            _start_compile_ahead(config, s)


_COMPILE_AHEAD = pytest.StashKey[dict]()


def _start_compile_ahead(config, s) -> None:
    """The pool of compile_ahead.py, started before any worker, at the lowest CPU priority; no
    case waits for it (compile_ahead_run.py says why)."""
    from . import compile_ahead, compile_ahead_run
    try:
        manifest, why = compile_ahead_run.plan(config, s)
    except compile_ahead.ManifestError as e:  # a bad or misfitting manifest named on the command line
        raise pytest.UsageError(str(e)) from e
    info = {"why": why}
    if manifest is not None:
        import tempfile
        # kept after the run: the terminal summary names the pool's log in it
        folder = tempfile.mkdtemp(prefix="decode-conformance-compile-ahead-")
        summary = os.path.join(folder, "summary.json")
        info.update(summary=summary, log=os.path.join(folder, "pool.log"),
                    proc=compile_ahead_run.start(manifest, summary, log_path=os.path.join(folder, "pool.log")))
    config.stash[_COMPILE_AHEAD] = info


def pytest_unconfigure(config):
    proc = config.stash.get(_COMPILE_AHEAD, {}).get("proc")
    if proc is not None:
        from .compile_ahead_run import stop
        stop(proc)  # a run that ended first: its cases compiled the rest themselves
    s = state_of(config)
    if s is not None and s.runner is not None:
        s.runner.close()
        s.runner = None


def pytest_cmdline_main(config):
    if config.getoption("--list-kernels"):
        from .state import list_kernels
        return list_kernels(config)
    return None


def pytest_report_header(config):
    s = state_of(config)
    if s is None:
        return None
    timeout = f"{s.case_timeout:g}s" if s.case_timeout else "none"
    return [f"decode-conformance: device={s.device} gpu_class={s.gpu_class} case_set={s.case_set} "
            f"profile={s.profile} TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')} "
            f"isolation={s.isolation} case_timeout={timeout}",
            "kernels: " + ", ".join(f"{k.name} ({k.spec})" for k in s.kernels)] + (
        [f"compile ahead: {config.stash[_COMPILE_AHEAD]['why']}"] if _COMPILE_AHEAD in config.stash else [])


# ---- parametrization ---------------------------------------------------------------------

def scenario_of(node) -> str:
    """The scenario a conformance test runs: its `dc_scenario` mark, else parity."""
    mark = node.get_closest_marker("dc_scenario")
    return mark.args[0] if mark is not None else "parity"


def pytest_generate_tests(metafunc):
    names = set(metafunc.fixturenames)
    if "dc_kernel" not in names:
        return
    s = state_of(metafunc.config, activate=True)
    if "dc_case" in names:
        scenario = scenario_of(metafunc.definition)
        cases = s.cases if scenario == "parity" else s.scenario_cases(scenario)
        params = [pytest.param(kp, case, id=f"{kp.name}|{case.id}", marks=s.case_marks(kp, case, scenario))
                  for kp in s.kernels for case in cases]
        metafunc.parametrize(("dc_kernel", "dc_case"), params)
    else:
        metafunc.parametrize("dc_kernel", [pytest.param(kp, id=kp.name) for kp in s.kernels])


# ---- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def dc_state(request):
    """The run state (device, GPU class, kernels, case set, ...)."""
    return state_of(request.config, activate=True)


@pytest.fixture
def dc_device(dc_state) -> str:
    return dc_state.device


_RESULT = pytest.StashKey[dict]()


@pytest.fixture
def dc_run(request, dc_state):
    """Run the test's scenario (its `dc_scenario` mark, else parity) of a kernel on a case through
    the door (door.py: reproduce line, GPU slot, isolation or time limit), record the result for
    the test's report row, return the CaseResult. `record=False` for cases that are not the
    test's own row (fuzz examples); `repro` replaces the reproduce line."""
    from . import door
    target = dc_state.repro_target(request.node, request.config.invocation_params.dir)

    def run(kp, case, scenario=None, record=True, repro=""):
        res = door.run(dc_state, request.config, kp, scenario or scenario_of(request.node), case, target, repro)
        if record:
            request.node.stash[_RESULT] = res.to_dict()
        return res

    return run


# ---- report rows: from the items' parameters, gathered on the controller -------------------

RESULT_FIELDS = ("message", "repro", "seconds", "verdict", "phases", "kernel_note")  # of CaseResult.to_dict()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The test's one report row, built where it ran (an xdist worker) and carried to the
    controller in the report's user properties."""
    report = yield
    callspec = getattr(item, "callspec", None)
    from .state import KernelParam
    kp = callspec.params.get("dc_kernel") if callspec is not None else None
    if not isinstance(kp, KernelParam) or state_of(item.config) is None:  # an empty parameter set: NOTSET
        return report
    case = callspec.params.get("dc_case")
    row = {"test": f"{item.path.stem}::{item.originalname}", "kernel": kp.name, "spec": kp.spec,
           "case": getattr(case, "id", ""), "scenario": scenario_of(item) if case is not None else "", "param": item.name[len(item.originalname):]}
    result = item.stash.get(_RESULT, None)
    if result is None and "dc_result" in dict(item.user_properties):  # a suite recording its own verdict (perf)
        result = json.loads(dict(item.user_properties)["dc_result"])
    if result is not None and call.when == "call":
        row.update({k: result[k] for k in RESULT_FIELDS if k in result})
    from .report import strict_xpass_entry
    if call.when == "call" and strict_xpass_entry(report) is not None:
        # pytest says only the entry's reason: say what to do, and how to see the pass again
        report.longrepr = (f"{report.longrepr}\n  it passed where a ledger entry expects a failure: remove or "
                           f"narrow that entry" + (f"\n  reproduce: {row['repro']}" if row.get("repro") else ""))
    report.user_properties = [p for p in report.user_properties if p[0] != "dc_result"]
    report.user_properties.append(("dc_row", json.dumps(row)))
    return report


def pytest_runtest_logreport(report):
    """Runs on the controller under xdist too, so rows are gathered in one place."""
    config = _CONTROLLER.get("config")
    if config is None or state_of(config) is None:
        return
    props = dict(report.user_properties)
    if "dc_row" not in props:
        return
    from .report import row_from_report
    row = row_from_report(report, json.loads(props["dc_row"]))
    if row is not None:
        config.stash.setdefault(REPORT, []).append(row)
        partial = _partial(config)
        if partial is not None:
            partial.row(report.nodeid, row)


def pytest_runtest_logstart(nodeid, location):
    """On the controller: the partial report names each test as it starts (what a killed run
    was stuck on)."""
    config = _CONTROLLER.get("config")
    partial = _partial(config) if config is not None and state_of(config) is not None else None
    if partial is not None:
        partial.started(nodeid)


def _partial(config):
    path = config.getoption("--conformance-report", None)
    if not path or hasattr(config, "workerinput"):
        return None
    if _PARTIAL not in config.stash:
        from .report import PartialReport
        config.stash[_PARTIAL] = PartialReport(path)
    return config.stash[_PARTIAL]


_CONTROLLER: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    _CONTROLLER["config"] = session.config


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    s = state_of(config)
    if s is not None:
        _skip_idle_hypothesis_summary(config)
    if s is None or hasattr(config, "workerinput"):
        return
    rows = config.stash.get(REPORT, [])
    from .report import kernels_without_cases
    empty = kernels_without_cases(rows, [k.name for k in s.kernels]) if rows or s.kernels else []
    config.stash[_EMPTY] = empty
    if empty and s.require_cases and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    config.stash[_LEDGER_WARNINGS] = _ledger_warnings(s)
    config.stash[_LEDGER_NOT_CHECKED] = _ledger_not_checked(s)
    path = config.getoption("--conformance-report")
    if path:
        from .report import write_report
        config.stash[_WRITTEN] = write_report(path, rows, s, empty, config.stash[_LEDGER_WARNINGS])
        if _PARTIAL in config.stash:
            config.stash[_PARTIAL].finish()


def _skip_idle_hypothesis_summary(config) -> None:
    """Unregister hypothesis's pytest plugin before its terminal summary where that summary has
    nothing to say. The summary imports the whole hypothesis package (for its observability
    module) whether or not the run used hypothesis (1.0-1.4 s a process on a 2-core CPU), paid under xdist by every
    worker after its last test and then by the controller, all inside the run's time. It reports
    only hypothesis's statistics and failing examples (carried on test reports) and the files its
    observability wrote (only in a process that imported hypothesis), so with hypothesis never
    imported here and no report carrying its keys there is nothing to lose. Nothing else of that
    plugin runs after this point."""
    import sys
    if "hypothesis" in sys.modules:
        return
    pm = config.pluginmanager
    plugin = pm.get_plugin("hypothesispytest")
    keys = tuple(getattr(plugin, name, None) for name in ("STATS_KEY", "FAILING_EXAMPLES_KEY"))
    reporter = pm.get_plugin("terminalreporter")
    if plugin is None or None in keys or reporter is None:
        return  # another release of the plugin, or no summary to skip: leave it as it is
    for reports in reporter.stats.values():
        for report in reports:
            if any(key in getattr(report, "__dict__", {}) for key in keys):
                return
    pm.unregister(plugin)


def _ledger_warnings(s) -> list[str]:
    """The ledger entries about this run's kernels and GPU class that match no case the suite
    ships (a stale or mistyped entry), said on the terminal and in the report a CI job keeps.
    Checked against every shipped case of both profiles and every scenario's, not just this run's
    set: one ledger serves an adopter's smoke and full runs, on CPUs and GPUs alike."""
    if not s.ledger.entries:
        return []
    from .case_sets import build_set
    from .devices import PROFILES
    from .scenarios import fixed_cases
    ids = {c.id for c in s.set_cases}  # a trace's workloads, your own cases
    for profile in PROFILES:
        ids |= {c.id for c in build_set("full", profile)}
        ids |= {c.id for cs in fixed_cases(profile).values() for c in cs}
    pairs = [(k.name, c) for k in s.kernels for c in ids]
    return [f"entry matches no case the suite ships: {entry.describe()}"
            for entry in s.ledger.unused(pairs, s.gpu_class)]


def _ledger_not_checked(s) -> str:
    """One line for the entries of the adopter's ledger about kernels this run does not test:
    not a warning (one ledger serves every kernel's job), but where a renamed kernel shows."""
    if not s.ledger_named:
        return ""  # the shipped ledger names this package's kernels
    import difflib
    tested = [k.name for k in s.kernels]
    other = s.ledger.elsewhere(tested)
    if not other:
        return ""

    def named(entry) -> str:
        near = difflib.get_close_matches(entry.kernel, tested, n=1, cutoff=0.75)
        return f"{entry.kernel!r} ({entry.source}" + (f"; did you mean {near[0]!r}?)" if near else ")")
    return (f"ledger: {len(other)} entr{'y' if len(other) == 1 else 'ies'} about kernels this run does not test, "
            f"not checked: " + "; ".join(map(named, other)))


_PARTIAL = pytest.StashKey[object]()
_EMPTY = pytest.StashKey[list]()
_WRITTEN = pytest.StashKey[tuple]()
_LEDGER_WARNINGS = pytest.StashKey[list]()
_LEDGER_NOT_CHECKED = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    s = state_of(config)
    if s is None or hasattr(config, "workerinput"):
        return
    tr = terminalreporter
    from .report import parity_coverage
    for line in filter(None, (parity_coverage(config.stash.get(REPORT, []), k.name) for k in s.kernels)):
        tr.write_line(f"decode-conformance coverage: {line}")
    for name in config.stash.get(_EMPTY, []):
        tr.write_line(f"decode-conformance: EVERY parity case of kernel {name!r} was skipped - nothing was "
                      f"tested{'' if s.require_cases else ' (pass --require-cases to fail the run for it)'}",
                      red=True, bold=True)
    ahead = config.stash.get(_COMPILE_AHEAD, {})
    if "summary" in ahead:
        from . import compile_ahead, compile_ahead_run
        summary = compile_ahead_run.read_summary(ahead["summary"])
        line = (compile_ahead.summary_line(summary) if summary
                else "compile ahead: the pool had not finished when the cases had (their own compiles did the rest)")
        tr.write_line(f"decode-conformance {line} (log: {ahead['log']})",
                      yellow=bool(summary is None or "error" in summary or summary["failed"]))
    written = config.stash.get(_WRITTEN, None)
    if written:
        tr.write_line(f"decode-conformance report: {written[0]} and {written[1]}")
    for warning in config.stash.get(_LEDGER_WARNINGS, []):
        tr.write_line(f"ledger warning: {warning}", yellow=True)
    if config.stash.get(_LEDGER_NOT_CHECKED, ""):
        tr.write_line(config.stash[_LEDGER_NOT_CHECKED])


def conformance_failure(result, case) -> None:
    """Fail a test with the verdict, why the case exists and the reproduce line - and none of
    pytest's assertion rewriting noise."""
    from .runner import failure_text
    pytest.fail(failure_text(result, case), pytrace=False)


"""The perf guard's session parts: one GuardRun per pytest session (the
`perf_run` fixture), the GPU in pytest-benchmark's machine_info, and the table and report at
the end of the run. Loaded for `pytest suites/perf` and `pytest --pyargs
decode_conformance.suites.perf` alike; the options are registered by the plugin
(decode_conformance/perf_options.py), which also checks their combinations."""
import pytest

from decode_conformance.perf import report, sources, store
from decode_conformance.perf.guard import GuardRun

_RUN = pytest.StashKey[object]()
_TIMING = pytest.StashKey[object]()


def _timing(config):
    """The session's timing source (None on a machine without a GPU), made once: the fixture
    and pytest-benchmark's machine_info hook (called before any test) share it."""
    if _TIMING not in config.stash:
        from decode_conformance import hardware
        timing = sources.timing_from_env()  # the CPU self-tests' fake timing source
        device = config.getoption("--device") or ("cuda" if hardware.has_gpu() else "cpu")
        if timing is None and device != "cpu":
            timing = sources.GpuTiming(device)
        config.stash[_TIMING] = timing
    return config.stash[_TIMING]


@pytest.fixture(scope="session")
def perf_run(request, dc_state):
    config = request.config
    run = config.stash.get(_RUN, None)
    if run is None:
        timing = _timing(config)
        selected = {}  # compare only the cells whose tests this session runs (-k, node ids)
        for item in request.session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if "dc_kernel" in params and "cell" in params and item.originalname == "test_perf":
                selected.setdefault(params["dc_kernel"].name, set()).add(params["cell"])
        run = GuardRun(timing=timing, gpu_class=dc_state.gpu_class, selected=selected,
                       baseline_dir=config.getoption("--perf-baseline-dir"),
                       record=bool(config.getoption("--perf-record")),
                       require=bool(config.getoption("--perf-require-baseline")),
                       pyargs=dc_state.pyargs, gpu_class_option=config.getoption("--gpu-class"),
                       reference=dc_state.perf_reference)
        config.stash[_RUN] = run
    if run.timing is None:
        why = "the perf guard needs a GPU: under Triton's interpreter it would time Python, not the kernel"
        if run.require:
            pytest.exit(f"--perf-require-baseline (the CI mode) on a machine without a GPU: {why}; run the perf job "
                        "on a GPU runner", returncode=pytest.ExitCode.USAGE_ERROR)
        pytest.skip(why)
    return run


def pytest_benchmark_update_machine_info(config, machine_info):
    timing = _timing(config)
    if timing is not None:
        machine_info["gpu"] = store.machine_gpu(timing.device_info())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    run = config.stash.get(_RUN, None)
    if run is None or run.timing is None or hasattr(config, "workerinput"):
        return
    lines = report.table(run)
    if lines:
        terminalreporter.section("perf guard")
        bad = any(r.fail for r in run.rows())
        for i, line in enumerate(lines):
            terminalreporter.write_line(line, red=bad and i == 0, bold=i == 0)
    folder = config.getoption("--perf-report")
    if folder:
        for p in report.write(run, folder):
            terminalreporter.write_line(f"perf report: {p}")

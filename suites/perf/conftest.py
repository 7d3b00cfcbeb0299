"""The perf guard's session parts: one GuardRun per pytest session (the `perf_run` fixture),
and the per-cell table printed at the end of the run. Loaded for `pytest suites/perf` and
`pytest --pyargs decode_conformance.suites.perf` alike; the options are registered by the
plugin (decode_conformance/perf_options.py)."""
import pytest

from decode_conformance import perf_guard

_RUN = pytest.StashKey[object]()


@pytest.fixture(scope="session")
def perf_run(request, dc_state):
    config = request.config
    run = config.stash.get(_RUN, None)
    if run is None:
        timing = perf_guard.timing_from_env()  # the CPU self-tests' fake timing source
        if timing is None and dc_state.device != "cpu":
            timing = perf_guard.GpuTiming(dc_state.device)
        selected = {}  # compare only the cells whose tests this session runs (-k, node ids)
        for item in request.session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if "dc_kernel" in params and "cell" in params and item.originalname == "test_perf":
                selected.setdefault(params["dc_kernel"].name, set()).add(params["cell"])
        run = perf_guard.GuardRun(timing=timing, gpu_class=dc_state.gpu_class, selected=selected,
                                  baseline_dir=config.getoption("--perf-baseline-dir"),
                                  record=bool(config.getoption("--perf-record")),
                                  require=bool(config.getoption("--perf-require-baseline")),
                                  pyargs=dc_state.pyargs, gpu_class_option=config.getoption("--gpu-class"))
        config.stash[_RUN] = run
    if run.timing is None:
        pytest.skip("the perf guard needs a GPU: under Triton's interpreter it would time Python, not the kernel")
    return run


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    run = config.stash.get(_RUN, None)
    if run is None or hasattr(config, "workerinput"):
        return
    lines = run.table()
    if not lines:
        return
    terminalreporter.section("perf guard")
    bad = any(v.fail for v in run.rows())
    for i, line in enumerate(lines):
        terminalreporter.write_line(line, red=bad and i == 0, bold=i == 0)

"""The pytest side of benchmarks/compile_log.py: each pytest process's phases and tests, written to
the process's log (`compile_log.install` opened it; sitecustomize names this module in
PYTEST_PLUGINS, which xdist workers inherit). A module of its own so that the processes that are
not pytest's (the suite's isolated kernel processes, execnet's start of each worker) never import
pytest for the logger."""
from __future__ import annotations

import time

import pytest

from benchmarks import compile_log


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    compile_log.phase("configure")
    _time_state_build()


def _time_state_build() -> None:
    """Spans of the suite's start-up work in this process (decode_conformance.state.build_state and
    the parts of it that wait on the GPU, the kernels or a child process)."""
    try:
        from decode_conformance import hardware, isolation, state
    except Exception:
        return
    compile_log.timed(state, "build_state", "build_state")
    compile_log.timed(state, "_load_kernels", "load kernels")
    compile_log.timed(state, "_device_memory", "device memory read")
    compile_log.timed(hardware, "detect_class", "GPU class")
    compile_log.timed(isolation.IsolatedRunner, "start", "isolated worker start")


def pytest_sessionstart(session):
    compile_log.phase("sessionstart")
    if not hasattr(session.config, "workerinput"):  # the run's start: where pytest's clock starts
        compile_log.write(kind="session", kernel="", t0=time.time(), seconds=0.0)


def pytest_collection_finish(session):
    compile_log.phase("collected")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    compile_log.phase("sessionfinish")
    try:
        return (yield)
    finally:  # the outermost wrapper: after the terminal summary and, in the controller, the workers' end
        compile_log.phase("finished")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    compile_log.phase("unconfigured")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0 = time.time()
    try:
        return (yield)
    finally:
        compile_log.write(kind="test", kernel=item.nodeid, t0=t0, seconds=time.time() - t0)

"""Command-line options of the perf guard (suites/perf), registered by the plugin, and the
check of their combinations. What they do: docs/perf-guard.md."""
from __future__ import annotations


def add_options(group) -> None:
    group.addoption("--perf-baseline-dir", default=None, metavar="DIR",
                    help="perf guard: folder of records, <DIR>/<gpu_class>/<kernel>.json in pytest-benchmark's JSON "
                         "format (default: the shipped kernels' records in decode_conformance.fixtures/baselines; "
                         "adopters pass their own)")
    group.addoption("--perf-record", action="store_true",
                    help="perf guard: record this GPU's records for the kernels under test (10 sessions per kernel) "
                         "into --perf-baseline-dir instead of comparing")
    group.addoption("--perf-require-baseline", action="store_true",
                    help="perf guard (CI): a missing record fails instead of being reported, and a machine without a "
                         "GPU stops the run instead of skipping")
    group.addoption("--perf-reference", default=None, metavar="SPEC",
                    help="perf guard A/B: time this second kernel (pkg.mod:obj or a registered name; in CI the kernel "
                         "at the base commit, installed under another import name) interleaved with each kernel under "
                         "test, and judge the ratio")
    group.addoption("--perf-report", default=None, metavar="DIR",
                    help="perf guard: write perf.md (per kernel: record / now / ratio / threshold / verdict) and "
                         "perf.json into DIR (benchmarks/plot_perf.py plots perf.json)")


def check(config, dist_mode: str) -> None:
    """Option combinations that cannot mean anything: one usage error naming both. Called by the
    plugin's pytest_configure, so it holds for `pytest suites/perf` and `--pyargs` alike (a
    conftest's pytest_configure runs at collection under --pyargs, where pytest prints a usage
    error as a traceback). `dist_mode`: xdist's --dist ('no' without workers)."""
    import pytest
    record, require = config.getoption("--perf-record"), config.getoption("--perf-require-baseline")
    ref = config.getoption("--perf-reference")
    modes = [f"--perf-{m}" for m, on in (("record", record), ("require-baseline", require), ("reference", ref)) if on]
    if modes and dist_mode != "no" and getattr(config, "workerinput", None) is None:
        # the perf tests skip on xdist workers (they would share the GPU while timing): a CI run
        # of the guard under -n would pass having timed nothing
        raise pytest.UsageError(f"{modes[0]} under xdist (-n / --dist={dist_mode}): the perf guard never times on xdist "
                                "workers, which would share the GPU, so every perf cell would skip and the run pass "
                                "having timed nothing; run the perf suite without -n (or with -n 0)")
    if record and require:
        raise pytest.UsageError("--perf-record and --perf-require-baseline together: --perf-record writes the records "
                                "that --perf-require-baseline demands; run one, then the other")
    if record and ref:
        raise pytest.UsageError(f"--perf-record and --perf-reference={ref} together: a record is one kernel's absolute "
                                "times; --perf-reference runs an A/B comparison: pick one")

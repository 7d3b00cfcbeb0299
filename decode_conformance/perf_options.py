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


def check(config) -> None:
    """Option combinations that cannot mean anything: one usage error naming both."""
    import pytest
    record, require = config.getoption("--perf-record"), config.getoption("--perf-require-baseline")
    ref = config.getoption("--perf-reference")
    if record and require:
        raise pytest.UsageError("--perf-record and --perf-require-baseline together: --perf-record writes the records "
                                "that --perf-require-baseline demands; run one, then the other")
    if record and ref:
        raise pytest.UsageError(f"--perf-record and --perf-reference={ref} together: a record is one kernel's absolute "
                                "times; --perf-reference runs an A/B comparison: pick one")

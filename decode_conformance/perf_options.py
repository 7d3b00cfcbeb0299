"""Command-line options of the perf guard (suites/perf), registered by the plugin.
What they do: decode_conformance/perf_guard.py and docs/perf-guard.md."""
from __future__ import annotations


def add_options(group) -> None:
    group.addoption("--perf-baseline-dir", default=None, metavar="DIR",
                    help="perf guard: folder of baselines, <DIR>/<gpu_class>/<kernel>.json (default: the shipped "
                         "kernels' baselines in decode_conformance.fixtures/baselines; adopters pass their own)")
    group.addoption("--perf-record", action="store_true",
                    help="perf guard: record this GPU class's baselines for the kernels under test (10 sessions "
                         "per kernel) into --perf-baseline-dir instead of comparing")
    group.addoption("--perf-require-baseline", action="store_true",
                    help="perf guard (CI): a missing baseline for this GPU class and kernel fails instead of being "
                         "reported (only for classes with a perf job in ci/shards.toml, where there is one)")

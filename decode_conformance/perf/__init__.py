"""The perf guard: device time of each kernel on a few fixed perf cells, judged against a
reference kernel timed beside it (A/B) or against a stored record, with thresholds derived
from measured noise. docs/perf-guard.md is the long form; each module holds one concept:

    cells    the perf cells (fixtures/perf_cells.toml), bytes moved, roofline numbers
    stats    block statistics, sessions, record noise, thresholds, A/B ratios
    timing   device-time primitives: events, graph capture, L2 flush, bandwidth kernels
    sources  timing sources: the GPU one and the fake one of the CPU self-tests
    store    records in pytest-benchmark's JSON format: write, load, validate
    bench    the bridge into pytest-benchmark's `benchmark` fixture (device-time clock, extra_info)
    guard    one pytest session's guard: measure, record, compare, A/B
    report   the terminal table and the markdown report
    reproduce  the command a failing verdict prints, re-running its one (kernel, cell) test
"""

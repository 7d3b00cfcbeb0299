"""The bridge into pytest-benchmark: its `benchmark` fixture times each perf cell on a clock
that reads device time. The guard measures the cell first (interleaved with the other cells,
or with the reference kernel), then `feed` hands the measured statistics to
`benchmark.pedantic` as its rounds: each round calls `DeviceClock.tick`, which advances the
clock by the next device-time value, so pytest-benchmark's stats (median, IQR, ...) are those
of device time, never host time around a synchronising launch. What pytest-benchmark cannot
express - the per-cell threshold from measured noise, the A/B ratio, the GPU identity - rides
in extra_info and in the guard's own verdict."""
from __future__ import annotations


class DeviceClock:
    """A pytest-benchmark timer (`@pytest.mark.benchmark(timer=CLOCK)`): calling it reads the
    clock; `tick()` advances it by the next queued device-time value (us)."""
    __name__ = "DeviceClock"

    def __init__(self):
        self.now = 0.0
        self.queue: list[float] = []

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += self.queue.pop(0) * 1e-6

    def __repr__(self) -> str:
        return "decode_conformance.perf.bench:DeviceClock"


CLOCK = DeviceClock()


def feed(benchmark, values_us: list[float], extra_info: dict, group: str) -> None:
    """Record `values_us` (device time, us) as the rounds of `benchmark`, with `extra_info`."""
    benchmark.group = group
    benchmark.extra_info.update(extra_info)
    CLOCK.now, CLOCK.queue = 0.0, list(values_us)
    benchmark.pedantic(CLOCK.tick, rounds=len(values_us), iterations=1, warmup_rounds=0)
    CLOCK.queue = []

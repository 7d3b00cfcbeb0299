"""The guard's statistics: how one session measures a cell, how a record summarises K sessions,
the per-cell threshold derived from that noise, and the ratio statistic of an A/B session.
The arithmetic, with its reasons and worked numbers, is docs/perf-guard.md."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Optional

# Eager cells' block statistic: host delays only ever add time to a sample, so a low quantile
# follows the kernel while most of a block is delayed (docs/perf-guard.md, "What is timed").
EAGER_BLOCK_QUANTILE = 0.1
ROUNDS = 10
BLOCK_US = 2000.0
MIN_BLOCK, MAX_BLOCK = 5, 40
PILOT = 3
RECORD_SESSIONS = 10
Z = 3.0
MIN_THRESHOLD = 0.015
DETECT_Z = 1.645
NOISE_FLOOR_REL = 0.002
NOISE_FLOOR_US = 0.05
MEDIAN_EFF = math.sqrt(math.pi / 2)  # se of a median / se of a mean, normal data
MAD_TO_SD = 1.4826
SHORT_CELL_US = 20.0
TARGET_SLOWDOWN = 0.05


@dataclass
class CellStats:
    """One session's measurement of one cell: x (median_us), its relative standard error,
    the block statistics it came from."""
    median_us: float
    se_rel: float
    spread_rel: float
    iqr_rel: float
    samples: int
    rounds: int
    blocks_us: list = field(default_factory=list)


@dataclass
class PairStats:
    """One A/B session's measurement of one cell: both kernels' statistics and the ratio's,
    d = median over rounds of ln(m_A / m_B), with its relative standard error."""
    a: CellStats
    b: CellStats
    d: float
    se: float
    log_ratios: list = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return math.exp(self.d)


def _mad(xs) -> float:
    m = statistics.median(xs)
    return statistics.median([abs(x - m) for x in xs])


def iqr(xs) -> float:
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


def block_quantile(xs: list[float], q: float) -> float:
    """The q-quantile of one block (linear interpolation between order statistics)."""
    ys = sorted(xs)
    pos = q * (len(ys) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def block_stat(block: list[float], eager: bool) -> float:
    q = EAGER_BLOCK_QUANTILE if eager else None
    return statistics.median(block) if q is None else block_quantile(block, q)


def robust_se(values: list[float]) -> tuple[float, float]:
    """(spread, standard error of the median) of `values` (already relative: logs or x / x_c):
    1.4826 MAD, times sqrt(pi / 2) / sqrt(n)."""
    spread = MAD_TO_SD * _mad(values)
    return spread, MEDIAN_EFF * spread / math.sqrt(len(values))


def cell_stats(meds: list[float], samples: list[float]) -> CellStats:
    x = statistics.median(meds)
    spread, se = robust_se([m / x for m in meds]) if x > 0 else (0.0, 0.0)
    return CellStats(median_us=x, se_rel=se, spread_rel=spread, iqr_rel=iqr(samples) / x if x > 0 else 0.0,
                     samples=len(samples), rounds=len(meds), blocks_us=meds)


def block_size(pilot_us: float, block_us: float = BLOCK_US) -> int:
    return int(min(MAX_BLOCK, max(MIN_BLOCK, math.ceil(block_us / max(pilot_us, 1e-3)))))


def _pilot(session, names: list[str], block_us: float) -> dict[str, int]:
    sizes = {}
    for n in names:
        try:
            sizes[n] = block_size(statistics.median(session.sample(n, PILOT)), block_us)
        except Exception as e:  # noqa: BLE001 - a kernel that fails while timed fails its cell
            session.errors[n] = f"{type(e).__name__} while timing {n}: {e}"
    return sizes


def _take(session, name: str, n: int, into: dict) -> None:
    try:
        block = session.sample(name, n)
    except Exception as e:  # noqa: BLE001
        session.errors[name] = f"{type(e).__name__} while timing {name}: {e}"
        return
    meds, allx = into.setdefault(name, ([], []))
    meds.append(block_stat(block, session.timing.get(name) == "eager"))
    allx.extend(block)


def measure_session(session, rounds: int = ROUNDS, block_us: float = BLOCK_US) -> dict[str, CellStats]:
    """One guard measurement of every runnable cell of an open session: a pilot (warm-up, block
    size), then `rounds` interleaved rounds of one block per cell, the order rotated per round
    so a slow phase of the GPU lands on every cell instead of one."""
    sizes = _pilot(session, list(session.cells), block_us)
    names = [n for n in session.cells if n in sizes]
    blocks: dict = {}
    for r in range(rounds):
        live = [n for n in names if n not in session.errors]
        if not live:
            break
        k = r % len(live)
        for n in live[k:] + live[:k]:
            _take(session, n, sizes[n], blocks)
    return {n: cell_stats(*blocks[n]) for n in names if n not in session.errors and n in blocks}


def measure_pair(sa, sb, rounds: int = ROUNDS, block_us: float = BLOCK_US) -> dict[str, PairStats]:
    """One A/B measurement: the kernel under test (`sa`) and the reference (`sb`) on the same
    cells, in one process on one GPU. Each round visits every cell (rotated order) and takes one
    block of each kernel back to back, A first in even rounds and B first in odd ones, so a
    drift within a round does not favour either; the cell's ratio statistic is the median of
    the per-round log ratios of the two block statistics."""
    common = [n for n in sa.cells if n in sb.cells]
    sizes_a, sizes_b = _pilot(sa, common, block_us), _pilot(sb, common, block_us)
    names = [n for n in common if n in sizes_a and n in sizes_b]
    size = {n: max(sizes_a[n], sizes_b[n]) for n in names}
    ba: dict = {}
    bb: dict = {}
    for r in range(rounds):
        live = [n for n in names if n not in sa.errors and n not in sb.errors]
        if not live:
            break
        k = r % len(live)
        for n in live[k:] + live[:k]:
            order = ((sa, ba), (sb, bb)) if r % 2 == 0 else ((sb, bb), (sa, ba))
            for s, into in order:
                _take(s, n, size[n], into)
    out = {}
    for n in names:
        if n in sa.errors or n in sb.errors or n not in ba or n not in bb:
            continue
        rounds_done = min(len(ba[n][0]), len(bb[n][0]))
        logs = [math.log(x / y) for x, y in zip(ba[n][0][:rounds_done], bb[n][0][:rounds_done])]
        _, se = robust_se(logs)
        out[n] = PairStats(a=cell_stats(*ba[n]), b=cell_stats(*bb[n]), d=statistics.median(logs), se=se,
                           log_ratios=logs)
    return out


def record_noise(sessions_us: list[float], within_se: list[float]) -> tuple[float, float, float]:
    """(x_B, sigma, se_B) of a cell from K sessions: the median, the spread of one session's
    statistic (measured session to session, floored), the within-session noise."""
    x_b = statistics.median(sessions_us)
    logs = [math.log(v) for v in sessions_us]
    between = statistics.stdev(logs) if len(logs) >= 2 else 0.0
    se_b = statistics.median(within_se) if within_se else 0.0
    sigma = max(between, se_b, NOISE_FLOOR_REL, NOISE_FLOOR_US / x_b)
    return x_b, sigma, se_b


def sigma_d(sigma: float, sessions: int, se_now: float, se_b: float) -> float:
    """Spread of ln(x / x_B): one session's, the error of a median of K, and this run's noise
    beyond the recording's."""
    return math.sqrt(sigma ** 2 * (1 + math.pi / (2 * max(1, sessions))) + max(0.0, se_now ** 2 - se_b ** 2))


def sigma_ab(se_now: float, sigma_rec: Optional[float], se_rec: Optional[float]) -> float:
    """Spread of an A/B session's d when A and B are the same kernel. Each kernel's statistic
    carries one session's spread sigma (measured by the record of this class and kernel), so
    their log ratio carries sqrt(2) sigma; this run's round-to-round noise beyond the
    recording's (2 se_B^2 for a ratio) widens it. Without a record, this run's own se."""
    if sigma_rec is None:
        return se_now
    return math.sqrt(2 * sigma_rec ** 2 + max(0.0, se_now ** 2 - 2 * (se_rec or 0.0) ** 2))


def threshold_for(sd: float, z: float = Z, floor: float = MIN_THRESHOLD) -> float:
    return max(floor, z * sd)


def catches(threshold: float, sd: float) -> float:
    """Smallest slowdown (fraction) caught with >= 95 % probability."""
    return math.exp(threshold + DETECT_Z * sd) - 1

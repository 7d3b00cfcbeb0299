"""The guard of one pytest session (`GuardRun`): each kernel under test is measured once, all
its cells interleaved - recorded over K sessions (`--perf-record`), compared with its record
of this GPU class, or timed beside a reference kernel (`--perf-reference`, A/B) - and each
cell gets a `CellResult`: its verdict, the numbers a person reads, the device-time values the
`benchmark` fixture records and the extra_info it carries."""
from __future__ import annotations

import datetime
import math
import pathlib
import platform
import shlex
import statistics
from dataclasses import dataclass, field
from typing import Optional

from .._paths import SUITES_PACKAGE, checkout_root, suite_test
from ..runner import PYTEST_COMMAND
from . import machines, stats, store
from .cells import PerfCell, cell_numbers, load_cells

# A/B: the gate. compare: the gate on the record's own GPU, with the machine spread added on
# another GPU of the class. record: no verdict.
MODES = ("record", "compare", "ab")


@dataclass
class CellResult:
    """One (kernel, cell) outcome of a guard run."""
    kernel: str
    cell: str
    status: str  # pass | slower | faster | moved | recorded | no-baseline | error | skipped
    fail: bool = False
    message: str = ""
    now_us: Optional[float] = None
    base_us: Optional[float] = None
    change: Optional[float] = None       # now / baseline - 1
    ref_us: Optional[float] = None       # A/B: the reference kernel's statistic
    ratio: Optional[float] = None        # A/B: now / reference, the gated number
    threshold: Optional[float] = None    # fraction: 0.015 = 1.5 %
    catches: Optional[float] = None
    bytes: Optional[int] = None
    tbs: Optional[float] = None
    roofline_pct: Optional[float] = None
    timing: str = ""
    context: Optional[int] = None
    values_us: list = field(default_factory=list)   # what the benchmark fixture records
    extra: dict = field(default_factory=dict)       # its extra_info

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("values_us", "extra")}

    @property
    def short(self) -> bool:
        t = self.base_us or self.now_us
        return t is not None and t < stats.SHORT_CELL_US


def numbers_text(r: CellResult) -> str:
    if r.bytes is None or r.tbs is None:
        return ""
    roof = f", {r.roofline_pct:.0f} % of read roofline" if r.roofline_pct is not None else ""
    return f"{r.bytes / 1e6:.1f} MB moved, {r.tbs:.2f} TB/s{roof}"


def record_command(*, pyargs: bool, spec: str, baseline_dir, gpu_class_option: Optional[str] = None) -> str:
    """The command that records `spec`'s baselines into `baseline_dir`, to paste where the run
    was started. `baseline_dir` None: the run read the installed package's records, where
    --perf-record refuses to write; the line names `perf-baselines`, a folder of the adopter's
    repository (docs/perf-guard.md), which later runs then pass as --perf-baseline-dir."""
    test, installed = suite_test("perf/test_perf.py::test_perf")
    target = ["--pyargs", f"{SUITES_PACKAGE}.perf"] if pyargs or installed else [test.partition("::")[0]]
    if baseline_dir is None:
        baseline_dir = "perf-baselines"
    else:
        here, d = pathlib.Path.cwd().resolve(), pathlib.Path(baseline_dir).resolve()
        baseline_dir = d.relative_to(here) if d.is_relative_to(here) else d
    parts = list(PYTEST_COMMAND) + target + [f"--kernel={spec}", "--perf-record", f"--perf-baseline-dir={baseline_dir}"]
    if gpu_class_option:
        parts.append(f"--gpu-class={gpu_class_option}")
    return " ".join(shlex.quote(p) for p in parts)


def _extra(mode: str, kernel_name: str, spec: str, gpu_class: str, cell: PerfCell, info: dict, timing_kind: str,
           us: float) -> dict:
    """extra_info of one cell: the guard's identity fields, the GPU, the roofline numbers."""
    return {**store.gpu_fields(info), "perf_guard": store.RECORD_VERSION, "mode": mode, "method": store.METHOD,
            "kernel": kernel_name, "kernel_spec": spec, "gpu_class": gpu_class, "cell": cell.name,
            "case": cell.case.id, "shape": cell.shape, "batch": cell.case.batch, "context": cell.context,
            "timing": timing_kind, **cell_numbers(cell, us, info.get("read_tbs"))}


def measure_record(timing, kernel, cells: list[PerfCell], *, sessions: int = stats.RECORD_SESSIONS,
                   rounds: int = stats.ROUNDS, crosscheck: bool = True):
    """K sessions -> (per-session stats [{cell: CellStats}], skipped, errors, timing kinds,
    cross-checks). The cross-check against triton.testing runs once, in the first session."""
    per_session, skipped, errors, xcheck, kinds = [], {}, {}, {}, {}
    for k in range(sessions):
        s = timing.open(kernel, cells)
        try:
            skipped.update(s.skipped)
            errors.update(s.errors)
            kinds.update(s.timing)
            st = stats.measure_session(s, rounds)
            for name in list(st):
                problem = s.check(name)
                if problem:
                    errors[name] = problem
            if k == 0 and crosscheck:
                for name in st:
                    try:
                        xcheck[name] = s.crosscheck(name)
                    except Exception as e:  # noqa: BLE001 - the cross-check is informative only
                        xcheck[name] = {"error": f"{type(e).__name__}: {e}"}
            per_session.append(st)
        finally:
            s.close()
        if k == 0 and not per_session[0]:
            break  # nothing runs (every cell skipped or failed): no use repeating
    return per_session, skipped, errors, kinds, xcheck


def record_cells(kp_name: str, spec: str, gpu_class: str, cells: list[PerfCell], info: dict, per_session, errors,
                 kinds, xcheck, command: str) -> dict[str, CellResult]:
    """The recorded cells: pytest-benchmark rounds = the K session statistics, extra_info =
    the noise the thresholds derive from."""
    out = {}
    for cell in cells:
        xs = [st[cell.name] for st in per_session if cell.name in st]
        if cell.name in errors or not xs:
            continue
        sessions_us = [x.median_us for x in xs]
        x_b, sigma, se_b = stats.record_noise(sessions_us, [x.se_rel for x in xs])
        sd = stats.sigma_d(sigma, len(xs), se_b, se_b)
        thr = stats.threshold_for(sd)
        extra = _extra("record", kp_name, spec, gpu_class, cell, info, kinds.get(cell.name, "?"), x_b)
        extra.update(sessions=len(xs), rounds=xs[0].rounds, noise_rel=sigma, within_se_rel=se_b,
                     iqr_rel=statistics.median([x.iqr_rel for x in xs]), samples_per_session=xs[0].samples,
                     threshold=math.exp(thr) - 1, catches=stats.catches(thr, sd), crosscheck=xcheck.get(cell.name),
                     z=stats.Z, min_threshold=stats.MIN_THRESHOLD, block_us=stats.BLOCK_US,
                     recorded={"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               "python": platform.python_version(), "command": command})
        r = CellResult(kp_name, cell.name, "recorded", now_us=x_b, base_us=x_b, threshold=extra["threshold"],
                       catches=extra["catches"], timing=extra["timing"], context=cell.context,
                       values_us=sessions_us, extra=extra,
                       **{k: extra[k] for k in ("bytes", "tbs", "roofline_pct")})
        r.message = (f"recorded {kp_name} {cell.name}: {x_b:.2f} us over {len(xs)} sessions, noise {sigma:.2%}, "
                     f"threshold {extra['threshold']:.1%}, catches >= {extra['catches']:.1%}; {numbers_text(r)}")
        out[cell.name] = r
    return out


def compare_cell(kp_name: str, cell: PerfCell, base: dict, now: stats.CellStats, info: dict, timing_kind: str,
                 other: Optional[str], spread: Optional[dict]) -> CellResult:
    """One session's measurement against a record cell. On the record's GPU: slower (FAIL) when
    ln(x / x_B) > T, T = max(1.5 %, 3 sigma_d). On another GPU of the class: the measured
    machine spread s is added, a move within T + ln(1 + s) is 'moved' (reported), and an
    eagerly timed cell never fails; where the class has no measured spread, no move fails
    there (how far two machines of the class lie apart is not known, so the record is a
    trend: the docs' "One model, several machines")."""
    x_b = float(base["median_us"])
    d = math.log(now.median_us / x_b)
    sd = stats.sigma_d(float(base["noise_rel"]), int(base.get("sessions") or 1), now.se_rel,
                       float(base["within_se_rel"]))
    thr = stats.threshold_for(sd)
    room = math.log1p(spread["spread"]) if other and spread else 0.0
    catch = stats.catches(thr + room, sd)
    change = math.exp(d) - 1
    r = CellResult(kp_name, cell.name, "pass", now_us=now.median_us, base_us=x_b, change=change,
                   threshold=math.exp(thr + room) - 1, catches=catch, timing=timing_kind, context=cell.context,
                   values_us=list(now.blocks_us), **cell_numbers(cell, now.median_us, info.get("read_tbs")))
    head = (f"{kp_name} {cell.name}: {now.median_us:.2f} us vs record {x_b:.2f} us ({change:+.1%}; threshold "
            f"{math.exp(thr) - 1:.1%} from measured noise {sd:.2%}"
            + (f" + machine spread {spread['spread']:.1%}" if room else "") + f"; catches >= {catch:.1%})")
    eager_elsewhere = bool(other) and timing_kind == "eager"
    spread_unknown = bool(other) and not spread
    if abs(d) > thr and (abs(d) <= thr + room or eager_elsewhere or spread_unknown):
        r.status = "moved"
        why = ("an eagerly timed cell carries the host's time and does not gate across machines" if eager_elsewhere
               else "no machine-to-machine spread is measured for this class, so the record is a trend here"
               if spread_unknown else "within the measured machine-to-machine spread")
        r.message = f"moved: {head}; {numbers_text(r)} - the record is from another machine ({other}): {why}"
    elif d > thr + room:
        r.status, r.fail = "slower", True
        r.message = f"SLOWER: {head}; {numbers_text(r)}"
    elif d < -(thr + room):
        r.status = "faster"
        r.message = f"faster: {head}; {numbers_text(r)} - record it again to lock the speed-up in"
    else:
        r.message = f"{head}; {numbers_text(r)}"
    if other and r.status in ("slower", "faster"):
        r.message += f" [the record is from another machine: {other}]"
    if r.short or catch > stats.TARGET_SLOWDOWN:
        r.message += (f" [{'short cell (< 20 us)' if r.short else 'noisy cell'}: the smallest slowdown it "
                      f"catches is {catch:.1%}]")
    return r


def ab_cell(kp_name: str, ref_name: str, cell: PerfCell, pair: stats.PairStats, base: Optional[dict], info: dict,
            timing_kind: str) -> CellResult:
    """One A/B measurement: slower (FAIL) when d = median ln(m_A / m_B) > T, T = max(1.5 %,
    3 sigma_AB), sigma_AB from the record's session spread (stats.sigma_ab); faster reported."""
    sigma_rec = float(base["noise_rel"]) if base else None
    se_rec = float(base["within_se_rel"]) if base else None
    sd = stats.sigma_ab(pair.se, sigma_rec, se_rec)
    thr = stats.threshold_for(sd)
    catch = stats.catches(thr, sd)
    now = pair.a.median_us
    r = CellResult(kp_name, cell.name, "pass", now_us=now, ref_us=pair.b.median_us, ratio=pair.ratio,
                   threshold=math.exp(thr) - 1, catches=catch, timing=timing_kind, context=cell.context,
                   values_us=list(pair.a.blocks_us), **cell_numbers(cell, now, info.get("read_tbs")))
    if base:
        r.base_us = float(base["median_us"])
        r.change = now / r.base_us - 1
    src = ("the record's session spread" if base else "this run's round-to-round spread (no record of this class "
                                                     "and kernel: the session spread is not known)")
    head = (f"{kp_name} {cell.name}: {now:.2f} us vs reference {ref_name} {pair.b.median_us:.2f} us, ratio "
            f"{pair.ratio:.4f} ({pair.ratio - 1:+.1%}; threshold {math.exp(thr) - 1:.1%} from {src}, sigma {sd:.2%}; "
            f"catches >= {catch:.1%})")
    trend = f"; record {r.base_us:.2f} us ({r.change:+.1%}, trend only)" if base else ""
    if pair.d > thr:
        r.status, r.fail = "slower", True
        r.message = f"SLOWER: {head}; {numbers_text(r)}{trend}"
    elif pair.d < -thr:
        r.status = "faster"
        r.message = f"faster: {head}; {numbers_text(r)}{trend}"
    else:
        r.message = f"{head}; {numbers_text(r)}{trend}"
    if r.short or catch > stats.TARGET_SLOWDOWN:
        r.message += (f" [{'short cell (< 20 us)' if r.short else 'noisy cell'}: the smallest slowdown it "
                      f"catches is {catch:.1%}]")
    return r


class GuardRun:
    """The guard of one pytest session: measures each kernel once and keeps its results per
    (kernel, cell). `reference`: the KernelParam of an A/B run's second kernel."""

    def __init__(self, *, timing, gpu_class: str, baseline_dir, record: bool, require: bool, pyargs: bool,
                 gpu_class_option: Optional[str] = None, cells=None, selected: Optional[dict] = None,
                 reference=None, spread: Optional[dict] = "table", share_inputs: bool = True):
        self.timing = timing
        # A/B: the reference reads the inputs of the kernel under test (sources.open's inputs_of);
        # False gives each its own, allocated elsewhere (perf_power.py --separate-inputs measures it).
        self.share_inputs = share_inputs
        self.gpu_class = gpu_class
        self.default_dir = not baseline_dir
        self.baseline_dir = pathlib.Path(baseline_dir) if baseline_dir else store.default_dir()
        self.record, self.require, self.pyargs = record, require, pyargs
        self.gpu_class_option = gpu_class_option
        self.cells = cells if cells is not None else load_cells()
        self.selected = selected  # {kernel name: cell names} this run compares (None: all); recording takes all
        self.reference = reference
        self.spread = machines.load_spread(gpu_class) if spread == "table" else spread
        self.outcomes: dict[str, dict[str, CellResult]] = {}
        self.notes: list[str] = []

    @property
    def mode(self) -> str:
        return "record" if self.record else "ab" if self.reference is not None else "compare"

    def outcome(self, kp) -> dict[str, CellResult]:
        if kp.name not in self.outcomes:
            try:
                self.outcomes[kp.name] = self._run(kp)
            except store.BaselineError as e:
                self.outcomes[kp.name] = {c.name: CellResult(kp.name, c.name, "error", True, str(e)) for c in self.cells}
            except Exception as e:  # noqa: BLE001 - reported per cell, the session goes on
                from ..runner import kernel_traceback
                text = f"perf guard failed for {kp.name}: {type(e).__name__}: {kernel_traceback(e, False)}"
                self.outcomes[kp.name] = {c.name: CellResult(kp.name, c.name, "error", True, text) for c in self.cells}
        return self.outcomes[kp.name]

    def result(self, kp, cell_name: str) -> CellResult:
        r = self.outcome(kp).get(cell_name)
        if r is None:
            return CellResult(kp.name, cell_name, "error", True, f"{kp.name} {cell_name}: not measured in this run")
        return r

    def _path(self, kp, info) -> pathlib.Path:
        return store.record_path(self.baseline_dir, self.gpu_class, kp.name, info["gpu_name"])

    def _installed_records(self) -> bool:
        return bool(self.default_dir and checkout_root() is None)

    def _cmd(self, kp) -> str:
        return record_command(pyargs=self.pyargs, spec=kp.spec, gpu_class_option=self.gpu_class_option,
                              baseline_dir=None if self._installed_records() else self.baseline_dir)

    def _record_with(self, kp, what: str = "one") -> str:
        """'record one with: <command>'; where this run read the installed records, the command
        writes a folder of the adopter's repository, which this run would not read again."""
        where = (" into perf-baselines (runs then read it with --perf-baseline-dir=perf-baselines)"
                 if self._installed_records() else "")
        return f"record {what}{where} with: {self._cmd(kp)}"

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _run(self, kp) -> dict[str, CellResult]:
        info = self.timing.device_info()
        if self.record:
            return self._record(kp, info)
        path = self._path(kp, info)
        try:
            base = store.load(path, self.gpu_class, kp.name)  # BaselineError: an error on every cell
            if base:
                model = next(iter(base.values()))["gpu_name"]
                if model != info["gpu_name"]:
                    raise store.BaselineError(
                        f"perf record {path}: foreign file: recorded on {model!r}, this GPU is {info['gpu_name']!r} "
                        f"(same class {self.gpu_class}, another model); {self._record_with(kp, 'one for this GPU')}")
        except store.BaselineError as e:
            if self.reference is None:
                raise
            # A/B gates on the ratio alone; the record is a trend beside it, so an unusable one
            # (another GPU model of the class, a damaged file) is reported and left out.
            self._note(f"record left out of the A/B run: {e}")
            base = False  # left out (said above), as against None: there is none
        cells = [c for c in self.cells if self.selected is None or c.name in self.selected.get(kp.name, ())]
        if self.reference is not None:
            return self._ab(kp, cells, base, info)
        s = self.timing.open(kp.kernel, cells)
        try:
            measured = stats.measure_session(s)
            problems = {n: s.check(n) for n in measured}
            skipped, errors, kinds = dict(s.skipped), dict(s.errors), dict(s.timing)
        finally:
            s.close()
        out = {}
        for c in cells:
            if c.name in skipped:
                out[c.name] = CellResult(kp.name, c.name, "skipped", False, skipped[c.name])
                continue
            if c.name in errors or problems.get(c.name):
                out[c.name] = CellResult(kp.name, c.name, "error", True, errors.get(c.name) or problems[c.name])
                continue
            now, kind = measured[c.name], kinds.get(c.name, "")
            bc = (base or {}).get(c.name)
            why = ""
            if bc is not None and bc["case"] != c.case.id:
                bc, why = None, (f"cell {c.name} was recorded as case {bc['case']} and is now {c.case.id}; "
                                 f"{self._record_with(kp, 'it again')}")
            elif bc is None:
                why = (f"no record for {self.gpu_class}/{kp.name} on {info['gpu_name']!r} ({path}); "
                       f"{self._record_with(kp)}"
                       if base is None else f"no record of cell {c.name} in {path}; {self._record_with(kp)}")
            if bc is None:
                r = CellResult(kp.name, c.name, "no-baseline", self.require, why, now_us=now.median_us, timing=kind,
                               context=c.context, values_us=list(now.blocks_us),
                               **cell_numbers(c, now.median_us, info.get("read_tbs")))
                r.message = f"{why} | measured {now.median_us:.2f} us; {numbers_text(r)}"
            else:
                other = machines.other_machine(bc, info)
                if other:
                    self._note(f"machine: the records come from another machine ({other}); "
                               + (f"moves within the measured machine-to-machine spread of {self.gpu_class} ("
                                  f"{self.spread['spread']:.1%}, {self.spread['source'].split(':')[0]}) are reported, "
                                  "not failed; eagerly timed cells do not gate"
                                  if self.spread else
                                  f"no machine-to-machine spread is measured for {self.gpu_class} "
                                  "(fixtures/perf_machine_spread.toml), so no move fails here: the records are a trend "
                                  "on this machine and a gate on the one that recorded them")
                               + ". For a gate that holds on any runner: --perf-reference (docs/perf-guard.md)")
                r = compare_cell(kp.name, c, bc, now, info, kind, other, self.spread)
            r.extra = _extra("compare", kp.name, kp.spec, self.gpu_class, c, info, kind, now.median_us)
            r.extra.update(sessions=1, rounds=now.rounds, se_rel=now.se_rel, status=r.status,
                           baseline_us=r.base_us, change=r.change, threshold=r.threshold)
            out[c.name] = r
        return out

    def _ab(self, kp, cells, base, info) -> dict[str, CellResult]:
        ref = self.reference
        sa = self.timing.open(kp.kernel, cells, role="test")
        try:
            sb = self.timing.open(ref.kernel, cells, role="reference", inputs_of=sa if self.share_inputs else None)
            try:
                pairs = stats.measure_pair(sa, sb)
                problems = {n: sa.check(n) or sb.check(n) for n in pairs}
                skipped = {**{n: f"reference {ref.name}: {w}" for n, w in sb.skipped.items()}, **sa.skipped}
                errors = {**{n: f"reference {ref.name}: {e}" for n, e in sb.errors.items()}, **sa.errors}
                kinds = dict(sa.timing)
            finally:
                sb.close()
        finally:
            sa.close()
        if not base:
            what = (f"the record of {self.gpu_class}/{kp.name} left out" if base is False else
                    f"no record of {self.gpu_class}/{kp.name} on {info['gpu_name']!r} in {self.baseline_dir}")
            self._note(f"A/B: {what}: thresholds come from this run's round-to-round spread only (the "
                       "session-to-session spread a record measures is not known)"
                       + ("" if base is False else f"; {self._record_with(kp)}"))
        out = {}
        for c in cells:
            if c.name in skipped:
                out[c.name] = CellResult(kp.name, c.name, "skipped", False, skipped[c.name])
            elif c.name in errors or problems.get(c.name) or c.name not in pairs:
                out[c.name] = CellResult(kp.name, c.name, "error", True,
                                         errors.get(c.name) or problems.get(c.name) or f"{c.name}: not measured")
            else:
                bc = (base or {}).get(c.name)
                if bc is not None and bc["case"] != c.case.id:
                    bc = None
                p = pairs[c.name]
                r = ab_cell(kp.name, ref.name, c, p, bc, info, kinds.get(c.name, ""))
                r.extra = _extra("ab", kp.name, kp.spec, self.gpu_class, c, info, r.timing, r.now_us)
                r.extra.update(sessions=1, rounds=p.a.rounds, reference=ref.spec, reference_us=p.b.median_us,
                               ratio=p.ratio, ratio_se_rel=p.se, status=r.status, threshold=r.threshold,
                               baseline_us=r.base_us, change=r.change)
                out[c.name] = r
        return out

    def _record(self, kp, info) -> dict[str, CellResult]:
        path = self._path(kp, info)
        if self._installed_records():
            raise store.BaselineError(f"--perf-record without --perf-baseline-dir would write {path} inside the "
                                      "installed package; pass --perf-baseline-dir=<a folder of your repository>")
        per_session, skipped, errors, kinds, xcheck = measure_record(self.timing, kp.kernel, self.cells)
        rec = record_cells(kp.name, kp.spec, self.gpu_class, self.cells, info, per_session, errors, kinds, xcheck,
                           self._cmd(kp))
        if rec:
            entries = [store.benchmark_entry(kp.name, n, r.values_us, r.extra, "session") for n, r in rec.items()]
            store.write(path, store.document(entries, info))
            self._note(f"recorded {path}")
            for r in rec.values():
                r.message += f" -> {path}"
        out = {}
        for c in self.cells:
            if c.name in skipped:
                out[c.name] = CellResult(kp.name, c.name, "skipped", False, skipped[c.name])
            elif c.name in rec:
                out[c.name] = rec[c.name]
            else:
                out[c.name] = CellResult(kp.name, c.name, "error", True,
                                         errors.get(c.name, f"{kp.name} {c.name}: nothing measured, nothing recorded"))
        return out

    def rows(self) -> list[CellResult]:
        return [r for k in self.outcomes.values() for r in k.values()]

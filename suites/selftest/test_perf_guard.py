"""The perf guard's logic on CPU, with the fake timing source (decode_conformance.perf.sources.
FakeTiming), in-process: the threshold arithmetic, interleaving, unchanged timings pass, a
planted 5 % slowdown fails where the cell's noise allows it, a speed-up is reported, a record
from another machine of the class widens thresholds by the measured machine spread (and eager
cells do not gate there), A/B: A/A passes and a planted ratio fails, and a missing, corrupt or
foreign record is reported or is an error naming the file."""
from __future__ import annotations

import json
import math
import statistics

import pytest

from decode_conformance.perf import guard, machines, sources, stats, store
from decode_conformance.perf.cells import load_cells
from decode_conformance.state import KernelParam
from suites.selftest._subpytest import GOOD

SPEC = GOOD  # torch_gather: runs every perf cell; the fake timing source never launches it
SHORT = "b1-4k-32x8x128"
Fake = sources.FakeTiming


@pytest.fixture(scope="module")
def kp():
    from decode_conformance.kernel_api import load_kernel
    return KernelParam(SPEC, load_kernel(SPEC))


@pytest.fixture(scope="module")
def cells():
    return load_cells()


def _run(tmp_path, timing, cells, *, record=False, require=False, gpu_class="sm_90", reference=None,
         spread="table"):
    return guard.GuardRun(timing=timing, gpu_class=gpu_class, baseline_dir=tmp_path, record=record, require=require,
                          pyargs=False, cells=cells, reference=reference, spread=spread)


def _record(tmp_path, kp, cells, **fake):
    out = _run(tmp_path, Fake(seed=1000, **fake), cells, record=True).outcome(kp)
    assert all(r.status == "recorded" for r in out.values()), [r.message for r in out.values()]
    return store.record_path(tmp_path, "sm_90", kp.name)


# ---- the statistics ------------------------------------------------------------------------

def test_threshold_arithmetic():
    # 10 sessions, log spread 0.5 %, within-session se 0.2 %: sigma = 0.5 %
    xs = [100 * math.exp(0.005 * z) for z in (-1.5, -1, -0.5, -0.2, 0, 0, 0.2, 0.5, 1, 1.5)]
    x_b, sigma, se_b = stats.record_noise(xs, [0.002] * 10)
    assert x_b == pytest.approx(100)
    assert sigma == pytest.approx(statistics.stdev([math.log(x) for x in xs]))
    sd = stats.sigma_d(sigma, 10, se_b, se_b)
    assert sd == pytest.approx(sigma * math.sqrt(1 + math.pi / 20))
    assert stats.threshold_for(sd) == pytest.approx(max(0.015, 3 * sd))
    # a noisier run widens its own threshold by the excess of its within-session noise
    assert stats.sigma_d(sigma, 10, 0.01, se_b) == pytest.approx(math.sqrt(sd ** 2 + 0.01 ** 2 - se_b ** 2))
    # floors: an exactly repeating cell still has 0.2 % noise; a 10 us cell at least 0.05 us
    assert stats.record_noise([100.0] * 10, [0.0] * 10)[1] == pytest.approx(0.002)
    assert stats.record_noise([10.0] * 10, [0.0] * 10)[1] == pytest.approx(0.005)
    assert stats.catches(0.03, 0.01) == pytest.approx(math.exp(0.03 + 1.645 * 0.01) - 1)


def test_ab_sigma_arithmetic():
    # a ratio of two sessions carries sqrt(2) x one session's spread; extra round noise adds
    assert stats.sigma_ab(0.001, 0.004, 0.002) == pytest.approx(math.sqrt(2) * 0.004)
    assert stats.sigma_ab(0.01, 0.004, 0.002) == pytest.approx(math.sqrt(2 * 0.004 ** 2 + 0.01 ** 2 - 2 * 0.002 ** 2))
    assert stats.sigma_ab(0.003, None, None) == 0.003


def test_session_interleaves_rounds(kp, cells):
    class Log(Fake):
        def open(self, kernel, cells, role="test"):
            s = super().open(kernel, cells, role)
            calls, orig = [], s.sample
            s.calls = calls

            def sample(name, n):
                calls.append((name, n))
                return orig(name, n)
            s.sample = sample
            return s
    s = Log(seed=1).open(kp.kernel, cells)
    st = stats.measure_session(s, rounds=4)
    timed = s.calls[len(cells):]  # after the pilot
    assert [c for c, _ in timed[:len(cells)]] != [c for c, _ in timed[len(cells):2 * len(cells)]], "order rotates"
    assert all(st[c.name].rounds == 4 for c in cells)
    sizes = dict(timed)
    assert sizes[SHORT] > sizes["b32-8k-32x8x128"], "short cells get larger blocks"


def test_pair_alternates_which_kernel_goes_first(kp, cells):
    order = []

    class Log(Fake):
        def open(self, kernel, cells, role="test"):
            s = super().open(kernel, cells, role)
            orig = s.sample

            def sample(name, n):
                order.append((role, name))
                return orig(name, n)
            s.sample = sample
            return s
    src = Log(seed=1)
    pairs = stats.measure_pair(src.open(kp.kernel, cells[:1]), src.open(kp.kernel, cells[:1], "reference"), rounds=4)
    timed = order[2:]  # after the two pilots
    assert [r for r, _ in timed] == ["test", "reference", "reference", "test"] * 2
    assert len(pairs[cells[0].name].log_ratios) == 4


def test_bytes_moved(cells):
    c = {x.name: x for x in cells}
    b = c["b1-128k-32x8x128"]
    assert b.bytes_moved == 131072 * 8 * 256 * 2 + 32 * 128 * 2 + 32 * 128 * 2 + 32 * 4
    mla = c["b8-32k-mla"]  # V is the first 512 columns of K: read once
    assert mla.bytes_moved == 8 * 32768 * 576 * 2 + 8 * 128 * 576 * 2 + 8 * 128 * 512 * 2 + 8 * 128 * 4


def test_cells_file_errors_name_the_file(tmp_path):
    p = tmp_path / "cells.toml"
    p.write_text('[[cell]]\nname = "x"\nshape = [32, 8, 128]\nlens = [1]\ncolour = "red"\n')
    with pytest.raises(ValueError, match=str(p)):
        load_cells(p)


def test_block_quantile():
    assert stats.block_quantile([5, 1, 3, 2, 4], 0.0) == 1 and stats.block_quantile([5, 1, 3, 2, 4], 1.0) == 5
    assert stats.block_quantile([1, 2, 3, 4, 5], 0.2) == pytest.approx(1.8)
    assert stats.block_quantile([1, 2, 3, 4, 5], 0.5) == statistics.median([1, 2, 3, 4, 5])


# ---- compare against a record ----------------------------------------------------------------

def test_unchanged_timings_pass(tmp_path, kp, cells):
    _record(tmp_path, kp, cells)
    results = [r for seed in range(20) for r in _run(tmp_path, Fake(seed=seed), cells).outcome(kp).values()]
    assert len(results) == 20 * len(cells)
    alarms = [r.message for r in results if r.fail]
    assert len(alarms) <= 0.01 * len(results), alarms
    assert all(r.status in ("pass", "faster") for r in results)


def test_planted_slowdown_fails_where_noise_allows(tmp_path, kp, cells):
    jitter = {SHORT: 0.03, "*": 0.003}  # the short cell: 3 % session-to-session noise
    _record(tmp_path, kp, cells, session_jitter=jitter)
    for seed in range(5):
        out = _run(tmp_path, Fake(seed=seed, slowdown=0.05, session_jitter=jitter), cells).outcome(kp)
        for name, r in out.items():
            if name == SHORT:
                assert r.catches > 0.05, "a noisy short cell cannot promise 5 %"
                assert f"the smallest slowdown it catches is {r.catches:.1%}" in r.message
            else:
                assert r.base_us >= 20 and r.catches <= 0.05
                assert r.status == "slower" and r.fail, r.message
                assert r.message.startswith("SLOWER") and "MB moved" in r.message and "TB/s" in r.message


# An eagerly launched kernel on a loaded host: every host delay adds time to a sample, never
# removes it. Recorded quiet (10 % of samples delayed), compared loaded (half of them delayed
# by 30 % of the cell's time on average).
QUIET = dict(eager=True, host_delay_p=0.10, host_delay=0.3)
LOADED = dict(eager=True, host_delay_p=0.5, host_delay=0.3)


def test_eager_cells_do_not_cry_wolf_on_a_loaded_host(tmp_path, kp, cells):
    _record(tmp_path, kp, cells, **QUIET)
    results = [r for seed in range(10) for r in _run(tmp_path, Fake(seed=seed, **LOADED), cells).outcome(kp).values()]
    assert sum(r.fail for r in results) <= 0.01 * len(results), [r.message for r in results if r.fail]


def test_eager_cells_with_the_median_statistic_would_cry_wolf(tmp_path, kp, cells, monkeypatch):
    # the same experiment with the graph statistic on eager cells: the check above can fail
    # (measured with this model: 12 of 70 comparisons fail with the median, 0 with the 10th percentile)
    monkeypatch.setattr(stats, "EAGER_BLOCK_QUANTILE", None)
    _record(tmp_path, kp, cells, **QUIET)
    results = [r for seed in range(10) for r in _run(tmp_path, Fake(seed=seed, **LOADED), cells).outcome(kp).values()]
    assert sum(r.fail for r in results) >= 5


def test_eager_cells_still_catch_a_slowdown_on_a_loaded_host(tmp_path, kp, cells):
    _record(tmp_path, kp, cells, **QUIET)
    for seed in range(3):
        out = _run(tmp_path, Fake(seed=seed, slowdown=0.05, **LOADED), cells).outcome(kp)
        long_cells = [r for r in out.values() if r.catches <= 0.05]
        assert long_cells and all(r.status == "slower" for r in long_cells), [r.message for r in long_cells]


def test_speedup_is_reported_not_failed(tmp_path, kp, cells):
    _record(tmp_path, kp, cells)
    for r in _run(tmp_path, Fake(seed=5, slowdown=-0.10), cells).outcome(kp).values():
        assert r.status == "faster" and not r.fail
        assert "record it again" in r.message and r.change == pytest.approx(-0.10, abs=0.01)


# ---- another machine of the class ------------------------------------------------------------

SPREAD = {"spread": 0.054, "source": "test"}


def test_a_move_within_the_machine_spread_is_reported_not_failed(tmp_path, kp, cells):
    """The issue's case: a GPU reading at 4.61 TB/s against a record taken at 4.52, the kernel
    unchanged, cells 2.5 % slower or 4.5 % faster: moved, not failed."""
    base = {c.name: 25.0 * (i + 1) for i, c in enumerate(cells)}  # the same kernel time on both machines
    _record(tmp_path, kp, cells, read_tbs=4.52, gpu_uuid="GPU-a", base_us=base)
    for machine in (1.025, 0.955):
        run = _run(tmp_path, Fake(seed=5, machine=machine, read_tbs=4.61, gpu_uuid="GPU-b", base_us=base), cells,
                   spread=SPREAD)
        out = run.outcome(kp)
        assert not any(r.fail for r in out.values()), [r.message for r in out.values() if r.fail]
        moved = [r for r in out.values() if r.status == "moved"]
        assert len(moved) >= len(cells) - 1 and all(r.status in ("moved", "pass") for r in out.values()), \
            [r.message for r in out.values()]
        assert all("within the measured machine-to-machine spread" in r.message for r in moved)
        assert any(n.startswith("machine:") and "GPU-b" in n and "4.61 TB/s" in n for n in run.notes), run.notes
    # beyond the spread it is still a regression
    out = _run(tmp_path, Fake(seed=5, slowdown=0.10, read_tbs=4.61, gpu_uuid="GPU-b", base_us=base), cells,
               spread=SPREAD).outcome(kp)
    assert all(r.status == "slower" and "another machine" in r.message for r in out.values())


def test_a_class_without_a_measured_spread_does_not_gate_on_another_machine(tmp_path, kp, cells):
    """How far two machines of a class lie apart is known only where it was measured; without a
    row (gfx942 today) a record from another machine is a trend there, even a 10 % move, and
    the note says what gates instead. On the recording machine it still gates."""
    _record(tmp_path, kp, cells, gpu_uuid="GPU-a")
    run = _run(tmp_path, Fake(seed=5, slowdown=0.10, gpu_uuid="GPU-b"), cells, spread=None)
    out = run.outcome(kp)
    assert all(r.status == "moved" and not r.fail for r in out.values()), [r.message for r in out.values()]
    assert all("no machine-to-machine spread is measured for this class" in r.message for r in out.values())
    assert any(n.startswith("machine:") and "so no move fails here" in n and "--perf-reference" in n
               for n in run.notes), run.notes
    out = _run(tmp_path, Fake(seed=5, slowdown=0.10, gpu_uuid="GPU-a"), cells, spread=None).outcome(kp)
    assert all(r.status == "slower" and r.fail for r in out.values()), [r.message for r in out.values()]


def test_same_machine_keeps_its_own_thresholds(tmp_path, kp, cells):
    _record(tmp_path, kp, cells, read_tbs=4.43, gpu_uuid="GPU-a")
    run = _run(tmp_path, Fake(seed=5, slowdown=0.025, read_tbs=4.45, gpu_uuid="GPU-a"), cells, spread=SPREAD)
    out = run.outcome(kp)
    assert not any(n.startswith("machine:") for n in run.notes)
    long_cells = [r for r in out.values() if r.catches <= 0.025]
    assert long_cells and all(r.status == "slower" for r in long_cells)


def test_eager_cells_never_gate_across_machines(tmp_path, kp, cells):
    _record(tmp_path, kp, cells, gpu_uuid="GPU-a", **QUIET)
    out = _run(tmp_path, Fake(seed=5, slowdown=0.30, gpu_uuid="GPU-b", **QUIET), cells, spread=SPREAD).outcome(kp)
    assert all(r.status == "moved" and not r.fail for r in out.values()), [r.message for r in out.values()]
    assert all("does not gate across machines" in r.message for r in out.values())


def test_machine_spread_table():
    row = machines.load_spread("sm_90")
    assert 0 < row["spread"] < 0.1 and "probe10" in row["source"]
    assert machines.load_spread("gfx942") is None


def test_machine_spread_table_errors_name_the_file(tmp_path):
    p = tmp_path / "spread.toml"
    p.write_text('[sm_90]\nspread = 5\nsource = "x"\n')
    with pytest.raises(ValueError, match=f"{p}.*spread"):
        machines.load_spread("sm_90", p)


# ---- A/B ---------------------------------------------------------------------------------------

def test_ab_same_kernel_passes(tmp_path, kp, cells):
    _record(tmp_path, kp, cells)
    results = [r for seed in range(20) for r in _run(tmp_path, Fake(seed=seed), cells, reference=kp)
               .outcome(kp).values()]
    assert len(results) == 20 * len(cells)
    assert sum(r.fail for r in results) <= 0.01 * len(results), [r.message for r in results if r.fail]
    assert all(r.ratio is not None and r.ref_us and "vs reference" in r.message for r in results)


def test_ab_planted_slowdown_fails_on_another_machine_too(tmp_path, kp, cells):
    """The ratio holds on any runner: a record from another, 3 % slower machine does not
    matter, a 5 % slowdown of the kernel under test fails every cell that can catch it."""
    _record(tmp_path, kp, cells, gpu_uuid="GPU-a")
    for seed in range(5):
        out = _run(tmp_path, Fake(seed=seed, slowdown=0.05, machine=1.03, gpu_uuid="GPU-b"), cells,
                   reference=kp).outcome(kp)
        caught = [r for r in out.values() if r.catches <= 0.05]
        assert len(caught) >= len(cells) - 1, [r.message for r in out.values()]
        assert all(r.status == "slower" and r.fail and r.ratio > 1.03 for r in caught), [r.message for r in caught]
        assert all("trend only" in r.message for r in out.values())


def test_ab_planted_slowdown_of_the_reference_is_a_speedup(tmp_path, kp, cells):
    out = _run(tmp_path, Fake(seed=1, reference_slowdown=0.10), cells, reference=kp).outcome(kp)
    assert all(r.status == "faster" and not r.fail for r in out.values()), [r.message for r in out.values()]


def test_ab_without_a_record_uses_the_run_spread(tmp_path, kp, cells):
    run = _run(tmp_path, Fake(seed=1, slowdown=0.05, session_jitter=0.0), cells, reference=kp)
    out = run.outcome(kp)
    assert any("thresholds come from this run's round-to-round spread" in n for n in run.notes)
    assert all(r.status == "slower" for r in out.values() if r.catches <= 0.05)


# ---- records -----------------------------------------------------------------------------------

def test_missing_record_is_reported_with_the_record_command(tmp_path, kp, cells):
    for r in _run(tmp_path, Fake(seed=1), cells).outcome(kp).values():
        assert r.status == "no-baseline" and not r.fail
        assert f"no record for sm_90/{kp.name}" in r.message
        assert (f"record one with: python -m pytest -p decode_conformance.plugin suites/perf/test_perf.py "
                f"--kernel={SPEC} --perf-record --perf-baseline-dir={tmp_path}") in r.message, r.message
        assert r.now_us and r.tbs and "MB moved" in r.message  # measured anyway


def test_missing_record_fails_in_ci_mode(tmp_path, kp, cells):
    out = _run(tmp_path, Fake(seed=1), cells, require=True).outcome(kp)
    assert all(r.fail and "record one with" in r.message for r in out.values())


def test_record_is_a_pytest_benchmark_document(tmp_path, kp, cells):
    doc = json.loads(_record(tmp_path, kp, cells).read_text())
    assert set(doc) == {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert doc["machine_info"]["gpu"]["gpu_name"] == "fake GPU" and "node" not in doc["machine_info"]
    assert len(doc["benchmarks"]) == len(cells)
    for b in doc["benchmarks"]:
        x, s = b["extra_info"], b["stats"]
        assert x["method"] == store.METHOD and x["kernel_spec"] == SPEC and x["mode"] == "record"
        assert x["sessions"] == stats.RECORD_SESSIONS == s["rounds"] == len(s["data"])
        assert s["median"] == pytest.approx(statistics.median(s["data"]))  # pytest-benchmark's own median
        assert x["bytes"] > 0 and x["tbs"] > 0 and 0 < x["roofline_pct"] < 100
        assert 0.015 <= x["threshold"] < 0.2 and x["catches"] > x["threshold"]
        assert {"gpu_uuid", "gpu_class", "torch", "triton", "driver", "timing"} <= set(x)
        assert "--perf-record" in x["recorded"]["command"]


@pytest.mark.parametrize("content,words", [
    ("{not json", ["corrupt", "not readable JSON"]),
    (json.dumps({"format": store.OLD_FORMAT, "version": 1, "cells": {}}), ["foreign", "record it again"]),
    (json.dumps({"machine_info": {}, "benchmarks": []}), ["foreign", "no benchmark of kernel"]),
    ("[1, 2]", ["foreign", "not a pytest-benchmark document"]),
])
def test_corrupt_or_foreign_record_is_an_error_naming_the_file(tmp_path, kp, cells, content, words):
    p = store.record_path(tmp_path, "sm_90", kp.name)
    p.parent.mkdir(parents=True)
    p.write_text(content)
    for r in _run(tmp_path, Fake(seed=1), cells).outcome(kp).values():
        assert r.status == "error" and r.fail and str(p) in r.message, r.message
        assert all(w in r.message for w in words), r.message


def _edit_all(key, value):
    def edit(doc):
        for b in doc["benchmarks"]:
            b["extra_info"][key] = value
    return edit


def _edit_short(fn):
    def edit(doc):
        fn(next(b for b in doc["benchmarks"] if b["extra_info"]["cell"] == SHORT))
    return edit


@pytest.mark.parametrize("edit,words", [
    (_edit_all("kernel", "lean"), ["foreign", "records kernel 'lean'"]),
    (_edit_all("gpu_class", "sm_80"), ["foreign", "class 'sm_80'"]),
    (_edit_all("method", "host-wall-time"), ["timed with method 'host-wall-time'"]),
    (_edit_all("perf_guard", 99), ["record version 99"]),
    (_edit_short(lambda b: b["stats"].update(median=-1)), ["corrupt", SHORT, "stats.median"]),
    (_edit_short(lambda b: b["extra_info"].pop("sessions")), ["corrupt", "extra_info.sessions"]),
])
def test_unusable_record_is_an_error_naming_the_file(tmp_path, kp, cells, edit, words):
    p = _record(tmp_path, kp, cells)
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc))
    for r in _run(tmp_path, Fake(seed=1), cells).outcome(kp).values():
        assert r.status == "error" and r.fail and str(p) in r.message, r.message
        assert all(w in r.message for w in words), r.message


H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def test_each_gpu_model_of_a_class_keeps_its_own_record(tmp_path, kp, cells):
    """A pool of one class may hold two models (sm_90: H100 and H200, 40 % apart in bandwidth):
    the first model recorded takes <kernel>.json, the other <kernel>@<model>.json beside it;
    each run reads its own model's, so a slowdown on the H100 is judged against the H100's."""
    h200 = _record(tmp_path, kp, cells, gpu_name=H200)
    before = h200.read_bytes()
    out = _run(tmp_path, Fake(seed=1000, gpu_name=H100), cells, record=True).outcome(kp)
    h100 = tmp_path / "sm_90" / f"{kp.name}@nvidia-h100-80gb-hbm3.json"
    assert h200.name == f"{kp.name}.json" and h200.read_bytes() == before, "the H200's record was overwritten"
    assert all(r.status == "recorded" and str(h100) in r.message for r in out.values()), [r.message for r in out.values()]
    for name in (H200, H100):
        out = _run(tmp_path, Fake(seed=5, gpu_name=name), cells).outcome(kp)
        assert all(r.status == "pass" for r in out.values()), [r.message for r in out.values()]
    out = _run(tmp_path, Fake(seed=5, slowdown=0.10, gpu_name=H100), cells).outcome(kp)
    assert all(r.status == "slower" for r in out.values()), [r.message for r in out.values()]
    # a third model finds no record of its own: reported, naming its file and the command
    out = _run(tmp_path, Fake(seed=5, gpu_name="NVIDIA H20"), cells).outcome(kp)
    assert all(r.status == "no-baseline" and f"no record for sm_90/{kp.name} on 'NVIDIA H20'" in r.message
               and f"{kp.name}@nvidia-h20.json" in r.message for r in out.values()), [r.message for r in out.values()]


def test_a_model_file_holding_another_model_is_an_error_naming_it(tmp_path, kp, cells):
    _record(tmp_path, kp, cells, gpu_name=H200)
    own = store.record_path(tmp_path, "sm_90", kp.name, H100)
    doc = json.loads(store.record_path(tmp_path, "sm_90", kp.name).read_text())
    own.write_text(json.dumps(doc))  # copied by hand: the H200's numbers under the H100's name
    for r in _run(tmp_path, Fake(seed=1, gpu_name=H100), cells).outcome(kp).values():
        assert r.status == "error" and r.fail and str(own) in r.message and "recorded on 'NVIDIA H200'" in r.message, \
            r.message


def test_changed_cell_asks_for_a_new_recording(tmp_path, kp, cells):
    p = _record(tmp_path, kp, cells)
    doc = json.loads(p.read_text())
    for b in doc["benchmarks"]:
        if b["extra_info"]["cell"] == SHORT:
            b["extra_info"]["case"] = "bf16-old-case"
    doc["benchmarks"] = [b for b in doc["benchmarks"] if b["extra_info"]["cell"] != "b8-32k-mla"]
    p.write_text(json.dumps(doc))
    out = _run(tmp_path, Fake(seed=1), cells, require=True).outcome(kp)
    assert out[SHORT].status == "no-baseline" and out[SHORT].fail and "record it again" in out[SHORT].message
    assert out["b8-32k-mla"].status == "no-baseline" and "no record of cell b8-32k-mla" in out["b8-32k-mla"].message
    assert out["b1-128k-32x8x128"].status == "pass"


def test_shipped_records_load():
    from decode_conformance.perf.store import default_dir
    files = sorted(default_dir().glob("*/*.json"))
    assert files
    for f in files:
        cells = store.load(f, f.parent.name, f.stem)
        assert cells and all(c["gpu_name"] and c["sessions"] >= 1 and c["median_us"] > 0 for c in cells.values())


def _unrecorded(root, cells) -> list[str]:
    """'<class>/<kernel>: <cell>' for every perf cell a shipped kernel runs that the records of a
    GPU class under `root` lack (a whole missing file lists each of its cells)."""
    from decode_conformance.discovery import shipped_specs
    from decode_conformance.kernel_api import load_kernel
    from decode_conformance.perf.cells import skip_reason
    gaps = []
    for cls in sorted(p.name for p in root.iterdir() if p.is_dir()):
        for spec in shipped_specs():
            kernel = load_kernel(spec)
            have = store.load(store.record_path(root, cls, kernel.name), cls, kernel.name) or {}
            gaps += [f"{cls}/{kernel.name}: {c.name}" for c in cells
                     if not skip_reason(kernel, c.case, cls) and c.name not in have]
    return gaps


def test_every_shipped_kernel_has_a_record_of_every_cell_it_runs(tmp_path, cells):
    """A kernel added to the entry points, or a cell added to perf_cells.toml, without a GPU
    recording would make the guard say 'no record' (and fail under --perf-require-baseline) on
    the first GPU run; here it shows on CPU. The other side: a copy of the records missing one
    cell and one kernel's file names both."""
    import shutil
    from decode_conformance.perf.store import default_dir
    gaps = _unrecorded(default_dir(), cells)
    assert not gaps, (f"shipped kernels without a record of a perf cell they run: {gaps}; record them on a GPU of "
                      "the class: `pytest suites/perf --perf-record`")
    copy = tmp_path / "baselines"
    shutil.copytree(default_dir(), copy, ignore=shutil.ignore_patterns("*.md"))
    (copy / "sm_90" / "lean.json").unlink()
    dispatch = copy / "sm_90" / "dispatch.json"
    doc = json.loads(dispatch.read_text())
    dropped = doc["benchmarks"].pop()
    dispatch.write_text(json.dumps(doc))
    gaps = _unrecorded(copy, cells)
    assert any(g.startswith("sm_90/dispatch: ") and g.endswith(dropped["extra_info"]["cell"]) for g in gaps), gaps
    assert [g for g in gaps if g.startswith("sm_90/lean: ")], gaps


def test_ab_reference_reads_the_tested_kernels_inputs(cells):
    """The A/B reference's batch shares the tested kernel's input tensors (two instances of one
    kernel then differ by nothing but the kernel: s13-2 measured Lean's two instances, each with
    inputs of its own, 0.5-0.7 % apart), and owns fresh NaN outputs and workspace."""
    import torch
    from decode_conformance.factories import build
    a = build(cells[0].case, "cpu")
    a.out.zero_()
    a.workspace.alloc("scratch", (4,), torch.float32)
    b = sources._same_inputs(a, "cpu")
    assert all(getattr(b, n) is getattr(a, n) for n in ("q", "k_cache", "v_cache", "kv_indices", "block_table"))
    assert b.out is not a.out and bool(b.out.isnan().all()) and b.lse is not a.lse
    assert b.workspace is not a.workspace and not b.workspace.buffers


def test_terminal_table_keeps_its_columns_for_a_long_kernel_name():
    """An adopter's kernel name longer than ours (seen: my_decode_drops_last_key) must not push
    the numbers out from under their headings."""
    from types import SimpleNamespace

    from decode_conformance.perf import report
    rows = [guard.CellResult("my_decode_drops_last_key", "b1-128k-32x8x128", "slower", True, "SLOWER: ...", now_us=180.12,
                             ref_us=171.99, ratio=1.0473),
            guard.CellResult("k", "b1-4k-32x8x128-with-a-long-cell-name", "pass", now_us=16.2, ref_us=16.3, ratio=0.9939)]
    run = SimpleNamespace(rows=lambda: rows, timing=None, reference=None, mode="ab", gpu_class="sm_90",
                          baseline_dir="perf-baselines", notes=[])
    lines = report.table(run)
    hdr, body = lines[1], lines[3:5]
    # text columns start under their heading; numbers end under theirs (right-aligned)
    columns = (("cell", lambda r: r.cell, "left"), ("status", lambda r: r.status, "left"),
               ("now us", lambda r: f"{r.now_us:.2f}", "right"), ("ratio", lambda r: f"{r.ratio:.4f}", "right"))
    for heading, value_of, align in columns:
        edge = hdr.index(heading) + (len(heading) if align == "right" else 0)
        for line, r in zip(body, rows):
            start = line.index(value_of(r), len(r.kernel))
            assert (start + len(value_of(r)) if align == "right" else start) == edge, (heading, hdr, line)

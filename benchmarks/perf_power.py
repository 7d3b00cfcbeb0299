"""The perf guard's power on a real GPU: false-alarm rate of the unchanged kernels against their
own fresh baseline, and the catch rate of a planted 5 % slowdown (the guard's targets: <= 1 %
false alarms, every cell of 20 us or more caught; docs/perf-guard.md).

    python benchmarks/perf_power.py --out $OUT [--kernel pkg.mod:obj ...] [--reps 20]
                                    [--planted-reps 5] [--max-seconds 285]

Every guard measurement here is the pytest guard's own code path (`perf_guard.GuardRun` on a
`GpuTiming` source: fresh inputs and CUDA graphs, pilot, 10 interleaved rounds, comparison
with the per-cell threshold), run in-process to save the interpreter and compiler start-up:

 1. bandwidth: read-only Triton kernel (the roofline; 3 repeats), torch.sum, device copy;
 2. L2 flush check: one kernel's cells timed with the zero flush and the read flush;
 3. record: a fresh baseline per kernel (10 sessions, as `pytest suites/perf --perf-record`),
    into $OUT/baselines/<class>/<kernel>.json, with the once-per-cell cross-check of the replay
    timing against triton.testing.do_bench_cudagraph (do_bench for eager kernels);
 4. null runs: `--reps` full guard runs of every kernel against its baseline; every slowdown
    verdict is a false alarm (target: <= 1 % of cell comparisons);
 5. planted: each launch also reads extra bytes with a read-only kernel inside the same graph,
    sized so the extra device time is `--slowdown` (5 %) of the cell's time:
        bytes = (0.05 * t_cell - overhead_cell) * read bandwidth
    where overhead_cell is the measured cost of the extra launch reading nothing. The achieved
    slowdown (planted median / null median - 1) is reported next to the catch count; cells of
    >= 20 us must fail every planted run, shorter ones report the slowdown they can catch;
 6. cross-process: while time remains, whole `pytest suites/perf --perf-require-baseline`
    runs in fresh processes against the same baselines (false alarms across processes).

`--host-load N` keeps N busy-looping processes on the host from the end of step 3 to the end
of step 5: baselines recorded on a quiet host, then compared under load (on an H200,
docs/gpu-runs/2026-11-30-h200-x2/run6, eager-timed cells moved 5-20 % while correctness suites
shared the host).

Writes $OUT/power.json, $OUT/power.md and the baselines (at most 8 files with the shipped
5 kernels); prints the summary table last. A kernel that fails is recorded and skipped; the
run stops starting new work at --max-seconds.
"""
from __future__ import annotations

import argparse
import atexit
import datetime
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--out", default=os.environ.get("OUT", "results"), help="output folder (default: $OUT)")
    ap.add_argument("--kernel", action="append", default=[], metavar="PKG.MOD:OBJ",
                    help="kernel(s) to measure (repeatable; default: the suite's default kernels)")
    ap.add_argument("--reps", type=int, default=20, help="null guard runs per kernel (>= 20 for the record)")
    ap.add_argument("--planted-reps", type=int, default=5, help="planted-slowdown guard runs per kernel")
    ap.add_argument("--slowdown", type=float, default=0.05, help="planted slowdown (fraction of the cell's time)")
    ap.add_argument("--sessions", type=int, default=None, help="sessions per recorded baseline (default: the guard's)")
    ap.add_argument("--subprocess-runs", type=int, default=3,
                    help="whole pytest guard runs in fresh processes, if time remains (0: none)")
    ap.add_argument("--max-seconds", type=float, default=285.0, help="stop starting new work after this long")
    ap.add_argument("--host-load", type=int, default=0, metavar="N",
                    help="N busy-looping host processes during the null and planted runs (not the recording)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--fake", action="store_true",
                    help="CPU dry run of the bookkeeping with perf_guard.FakeTiming (no GPU; numbers are synthetic)")
    return ap.parse_args(argv)


# ---- helpers -----------------------------------------------------------------------------------

SHORT_CELL_US = 20.0  # = decode_conformance.perf_guard.SHORT_CELL_US (not imported before torch)


class _Skip(Exception):
    pass


class _FakePlanter:
    nbytes: dict = {}

    def ensure(self, nbytes):
        pass

def _smi() -> str:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,temperature.gpu,clocks.sm,clocks.mem,"
                            "power.draw,power.limit", "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=20)
        return p.stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"nvidia-smi unavailable: {e}"


class Clock:
    def __init__(self, seconds: float):
        self.t0 = time.time()
        self.deadline = self.t0 + seconds

    @property
    def left(self) -> float:
        return self.deadline - time.time()

    @property
    def used(self) -> float:
        return time.time() - self.t0


def _pct(x, digits=1):
    return "-" if x is None else f"{100 * x:.{digits}f}%"


class Planter:
    """wrap(kernel, cell, launch): the launch, then a read-only kernel over `nbytes[(kernel,
    cell)]` bytes of a buffer the timed kernel never touches (cold after the L2 flush)."""

    def __init__(self, torch, timing, device):
        self.torch, self.timing, self.device = torch, timing, device
        self.reader = timing.ReadKernel(device)
        self.buf = torch.ones(1024, dtype=torch.int32, device=device)
        self.nbytes: dict = {}

    def ensure(self, nbytes: int) -> None:
        if self.buf.numel() * 4 < nbytes:
            self.buf = None
            self.torch.cuda.empty_cache()
            self.buf = self.torch.ones(nbytes // 4 + 1024, dtype=self.torch.int32, device=self.device)

    def __call__(self, kernel, cell, launch):
        n = int(self.nbytes.get((kernel.name, cell.name), 0))
        reader, buf = self.reader, self.buf

        def planted():
            launch()
            reader.read(buf, n)
        return planted


# ---- the experiment ------------------------------------------------------------------------------

def main(argv=None) -> int:
    args = parse_args(argv)
    clock = Clock(args.max_seconds)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    if not torch.cuda.is_available() and not args.fake:
        print("perf_power: no GPU visible to torch; nothing to measure (--fake: a CPU dry run)", file=sys.stderr)
        return 2
    from decode_conformance import _paths
    _paths.alias_checkout(ROOT)
    import triton
    from decode_conformance import hardware, perf_guard as pg, timing
    from decode_conformance.kernel_api import kernel_specs, load_kernel
    from decode_conformance.state import KernelParam

    dev = args.device
    fake_kw = {"gpu_class": "sm_90", "noise": 0.01, "session_jitter": 0.003}
    gpu_class = "sm_90" if args.fake else hardware.detect_class(pg.torch_device_index(dev))
    cells = pg.load_cells()
    base_dir = out / "baselines"
    log: list[str] = []

    def say(msg: str) -> None:
        line = f"[{clock.used:6.1f}s] {msg}"
        log.append(line)
        print(line, flush=True)

    res = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "gpu": "fake GPU (--fake: synthetic numbers)" if args.fake else torch.cuda.get_device_name(dev),
                    "gpu_class": gpu_class,
                    "sms": 0 if args.fake else torch.cuda.get_device_properties(dev).multi_processor_count,
                    "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                    "python": sys.version.split()[0], "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
                    "args": vars(args), "nvidia_smi_start": _smi(), "method": pg.METHOD,
                    "settings": {"rounds": pg.ROUNDS, "sessions": args.sessions or pg.RECORD_SESSIONS, "z": pg.Z,
                                 "min_threshold": pg.MIN_THRESHOLD, "block_us": pg.BLOCK_US}},
           "kernels": {}, "log": log}
    say(f"{res['meta']['gpu']} ({gpu_class}), torch {torch.__version__}, triton {triton.__version__}")

    kps = []
    for spec in kernel_specs(args.kernel):
        try:
            kps.append(KernelParam(spec, load_kernel(spec)))
        except Exception as e:  # noqa: BLE001
            res["kernels"][spec] = {"spec": spec, "error": f"load: {e}"}
            say(f"kernel {spec}: does not load: {e}")

    # 1. bandwidth ------------------------------------------------------------------------------
    bw = {}
    try:
        if args.fake:
            raise _Skip()
        bw["read_tbs_repeats"] = [timing.read_bandwidth_tbs(dev) for _ in range(3)]
        bw["read_tbs"] = statistics.median(bw["read_tbs_repeats"])
        bw["torch_sum_tbs"] = timing.torch_sum_bandwidth_tbs(dev)
        bw["copy_tbs"] = timing.copy_bandwidth_tbs(dev, nbytes=2 * 2**30)
        torch.cuda.empty_cache()
    except _Skip:
        f = pg.FakeTiming(**fake_kw).device_info()
        bw = {"read_tbs_repeats": [f["read_tbs"]], "read_tbs": f["read_tbs"], "torch_sum_tbs": f["read_tbs"],
              "copy_tbs": f["copy_tbs"]}
    except Exception as e:  # noqa: BLE001
        bw["error"] = traceback.format_exc(limit=3)
        say(f"bandwidth: {e}")
    res["bandwidth"] = bw
    say(f"bandwidth: read {bw.get('read_tbs', 0):.3f} TB/s (Triton read-only kernel; repeats "
        f"{[round(x, 3) for x in bw.get('read_tbs_repeats', [])]}), torch.sum {bw.get('torch_sum_tbs', 0):.3f}, "
        f"copy {bw.get('copy_tbs', 0):.3f} TB/s (read+written)")

    if args.fake:
        flush, src = None, pg.FakeTiming(seed="null", **fake_kw)
    else:
        flush = timing.L2Flush(dev, "read")
        src = pg.GpuTiming(dev, flush=flush)
    info = src.device_info()
    info["read_tbs"] = bw.get("read_tbs", info["read_tbs"])

    # 2. flush check ------------------------------------------------------------------------------
    res["flush_check"] = []
    try:
        kp0 = None if args.fake else next((k for k in kps if k.kernel.caps.cuda_graph_safe), None)
        if kp0 is not None:
            zero = timing.L2Flush(dev, "zero")
            s = src.open(kp0.kernel, cells)
            try:
                for name in s.cells:
                    fn = s._items[name][2]
                    row = {"kernel": kp0.name, "cell": name}
                    for mode, fl in (("zero", zero), ("read", flush)):
                        xs = timing.event_times_us(fn, dev, 60, fl)
                        row[mode] = {"median_us": statistics.median(xs),
                                     "iqr_rel": pg._iqr(xs) / statistics.median(xs)}
                    res["flush_check"].append(row)
            finally:
                s.close()
                del zero
            say("flush check: " + "; ".join(f"{r['cell']} zero {r['zero']['median_us']:.1f} us (IQR "
                                            f"{_pct(r['zero']['iqr_rel'])}) read {r['read']['median_us']:.1f} us "
                                            f"(IQR {_pct(r['read']['iqr_rel'])})" for r in res["flush_check"]))
    except Exception as e:  # noqa: BLE001
        res["flush_check_error"] = traceback.format_exc(limit=4)
        say(f"flush check failed: {e}")

    # 3. record -------------------------------------------------------------------------------------
    live = []
    for kp in kps:
        k = res["kernels"][kp.name] = {"spec": kp.spec, "cells": {}}
        if clock.left < 30:
            k["error"] = "not recorded: out of time"
            continue
        t0 = time.time()
        try:
            doc, skipped, errors, _ = pg.record_kernel(
                src, kp.kernel, cells, gpu_class=gpu_class, kernel_spec=kp.spec,
                sessions=args.sessions or pg.RECORD_SESSIONS,
                command=f"benchmarks/perf_power.py (same code path as pytest suites/perf --kernel={kp.spec} --perf-record)")
        except Exception as e:  # noqa: BLE001
            k["error"] = f"record: {traceback.format_exc(limit=6)}"
            say(f"{kp.name}: record failed: {e}")
            continue
        k["record_seconds"] = time.time() - t0
        k["skipped"], k["errors"] = skipped, errors
        if doc is None:
            k["error"] = "record: no cell measured"
            say(f"{kp.name}: nothing recorded ({errors or skipped})")
            continue
        path = pg.write_baseline(pg.baseline_path(base_dir, gpu_class, kp.name), doc)
        k["baseline"] = str(path.relative_to(out))
        for name, c in doc["cells"].items():
            k["cells"][name] = {key: c[key] for key in ("median_us", "noise_rel", "within_se_rel", "iqr_rel", "threshold",
                                                      "catches", "bytes", "tbs", "roofline_pct", "timing", "context",
                                                      "crosscheck", "samples_per_session")}
            k["cells"][name].update(null=[], null_fail=0, planted=[], planted_fail=0)
        live.append(kp)
        say(f"{kp.name}: recorded {len(doc['cells'])} cells in {k['record_seconds']:.1f} s"
            + (f"; errors {sorted(errors)}" if errors else "") + (f"; skipped {sorted(skipped)}" if skipped else ""))

    def guard(kp, timing_src):
        run = pg.GuardRun(timing=timing_src, gpu_class=gpu_class, baseline_dir=base_dir, record=False, require=True,
                          pyargs=False, cells=cells, perf_job=True)
        return run.outcome(kp)

    # 4. null runs ------------------------------------------------------------------------------------
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, args.host_load))]
    atexit.register(lambda: [b.kill() for b in burners])
    if burners:
        say(f"host load: {len(burners)} busy processes from here to the end of the planted runs")
    planted_reserve = lambda per_rep: (args.planted_reps + 1) * per_rep + 15  # noqa: E731
    per_rep = None
    n_done = 0
    for rep in range(args.reps):
        if per_rep is not None and clock.left < planted_reserve(per_rep) + per_rep:
            say(f"null runs: stopping after {n_done} of {args.reps} (time)")
            break
        t0 = time.time()
        for kp in live:
            k = res["kernels"][kp.name]
            try:
                for name, v in guard(kp, src).items():
                    if name not in k["cells"] or v.now_us is None:
                        if v.fail:
                            k.setdefault("null_errors", []).append(v.message[:500])
                        continue
                    c = k["cells"][name]
                    c["null"].append(v.now_us)
                    c["null_fail"] += int(v.status == "slower")
                    c.setdefault("null_faster", 0)
                    c["null_faster"] += int(v.status == "faster")
            except Exception as e:  # noqa: BLE001
                k.setdefault("null_errors", []).append(f"rep {rep}: {e}")
        n_done += 1
        per_rep = time.time() - t0 if per_rep is None else 0.5 * per_rep + 0.5 * (time.time() - t0)
        if rep == 0 or (rep + 1) % 5 == 0:
            fa = sum(c["null_fail"] for kp in live for c in res["kernels"][kp.name]["cells"].values())
            say(f"null run {rep + 1}/{args.reps}: {per_rep:.1f} s per run of all kernels; false alarms so far {fa}")
    res["null_runs"] = n_done

    # 5. planted slowdown ---------------------------------------------------------------------------
    if args.fake:
        planter = _FakePlanter()
        plant_src = pg.FakeTiming(seed="planted", slowdown=args.slowdown, **fake_kw)
    else:
        planter = Planter(torch, timing, dev)
        plant_src = pg.GpuTiming(dev, flush=flush, wrap=planter, info=info)
    read_bpus = info["read_tbs"] * 1e6  # bytes per microsecond
    for kp in live:
        k = res["kernels"][kp.name]
        if clock.left < 20:
            k["planted_error"] = "out of time"
            continue
        try:
            for name in k["cells"]:
                planter.nbytes[(kp.name, name)] = 0
            s = plant_src.open(kp.kernel, cells)  # the extra launch reading nothing: its overhead
            try:
                empty = pg.measure_session(s)
            finally:
                s.close()
            need = 0
            for name, c in k["cells"].items():
                t_null = statistics.median(c["null"]) if c["null"] else c["median_us"]
                c["null_median_us"] = t_null
                c["plant_overhead_us"] = empty[name].median_us - t_null if name in empty else None
                nb = max(0.0, args.slowdown * t_null - max(0.0, c["plant_overhead_us"] or 0.0)) * read_bpus
                c["plant_bytes"] = int(nb)
                planter.nbytes[(kp.name, name)] = int(nb)
                need = max(need, int(nb))
            planter.ensure(need)
            for rep in range(args.planted_reps):
                if clock.left < 10:
                    break
                for name, v in guard(kp, plant_src).items():
                    if name in k["cells"] and v.now_us is not None:
                        k["cells"][name]["planted"].append(v.now_us)
                        k["cells"][name]["planted_fail"] += int(v.status == "slower")
            say(f"{kp.name}: planted {args.slowdown:.0%} slowdown, {len(next(iter(k['cells'].values()))['planted'])} runs")
        except Exception as e:  # noqa: BLE001
            k["planted_error"] = traceback.format_exc(limit=6)
            say(f"{kp.name}: planted runs failed: {e}")
    del planter, plant_src
    if not args.fake:
        torch.cuda.empty_cache()

    for b in burners:
        b.kill()
        b.wait()

    # 6. whole pytest runs in fresh processes --------------------------------------------------------
    res["subprocess_runs"] = []
    if live:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.subprocess_runs):
                if clock.left < 45:
                    break
                cmd = [sys.executable, "-m", "pytest", "suites/perf", "-q", "-p", "no:cacheprovider",
                       f"--perf-baseline-dir={base_dir.resolve()}", "--perf-require-baseline",
                       f"--conformance-report={tmp}/run{i}"] + [f"--kernel={kp.spec}" for kp in live]
                env = dict(os.environ)
                if args.fake:
                    cmd += ["--device=cpu", f"--gpu-class={gpu_class}"]
                    env[pg.FAKE_ENV] = json.dumps({"seed": f"proc{i}", **fake_kw})
                t0 = time.time()
                p = None
                try:
                    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                                       timeout=max(10, clock.left - 5))
                    rep = json.loads(pathlib.Path(f"{tmp}/run{i}.json").read_text())
                    rows = [r for r in rep["results"] if r["test"].endswith("test_perf")]
                    run = {"rc": p.returncode, "seconds": time.time() - t0,
                           "compared": sum(r["status"] in ("passed", "failed") for r in rows),
                           "slower": [f"{r['kernel']} {r['param']}: {r.get('message', '')[:300]}" for r in rows
                                      if r["status"] == "failed" and "SLOWER" in (r.get("message") or "")],
                           "other_failures": [f"{r['kernel']} {r['param']}: {(r.get('message') or '')[:300]}"
                                              for r in rows if r["status"] in ("failed", "error")
                                              and "SLOWER" not in (r.get("message") or "")]}
                except Exception as e:  # noqa: BLE001
                    run = {"error": f"{type(e).__name__}: {e}", "seconds": time.time() - t0,
                           "tail": ((p.stdout + p.stderr)[-2000:] if p is not None else "")}
                res["subprocess_runs"].append(run)
                say(f"pytest run {i + 1} in a fresh process: " + (
                    f"rc {run['rc']}, {run['compared']} cells compared, {len(run['slower'])} slower, "
                    f"{run['seconds']:.0f} s" if "error" not in run else run["error"]))

    # summary ---------------------------------------------------------------------------------------
    res["meta"]["nvidia_smi_end"] = _smi()
    res["meta"]["seconds"] = clock.used
    summ = summarize(res, args)
    res["summary"] = summ
    (out / "power.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res, args)
    (out / "power.md").write_text(md)
    print()
    print(short_table(res, args))
    return 0


def summarize(res: dict, args) -> dict:
    n_cmp = n_fa = 0
    long_total = long_caught_all = 0
    planted_cmp = planted_fail = 0
    short = []
    for kname, k in res["kernels"].items():
        for name, c in k.get("cells", {}).items():
            n_cmp += len(c["null"])
            n_fa += c["null_fail"]
            if c["null"]:
                med = statistics.median(c["null"])
                c["null_spread_rel"] = statistics.stdev([math.log(x) for x in c["null"]]) if len(c["null"]) > 1 else None
                c["null_max_change"] = max(abs(x / c["median_us"] - 1) for x in c["null"])
                c["null_median_change"] = med / c["median_us"] - 1
            if c["planted"]:
                base = c.get("null_median_us") or c["median_us"]
                c["planted_achieved"] = statistics.median(c["planted"]) / base - 1
                planted_cmp += len(c["planted"])
                planted_fail += c["planted_fail"]
                if c["median_us"] >= SHORT_CELL_US:
                    long_total += 1
                    long_caught_all += int(c["planted_fail"] == len(c["planted"]))
            if c["median_us"] < SHORT_CELL_US:
                short.append({"kernel": kname, "cell": name, "median_us": c["median_us"], "catches": c["catches"],
                              "planted_achieved": c.get("planted_achieved"),
                              "planted_caught": f"{c['planted_fail']}/{len(c['planted'])}"})
    sub_cmp = sum(r.get("compared", 0) for r in res.get("subprocess_runs", []))
    sub_fa = sum(len(r.get("slower", [])) for r in res.get("subprocess_runs", []))
    return {"null_runs": res.get("null_runs", 0), "null_comparisons": n_cmp, "false_alarms": n_fa,
            "false_alarm_rate": n_fa / n_cmp if n_cmp else None,
            "planted_comparisons": planted_cmp, "planted_failures": planted_fail,
            "cells_ge_20us": long_total, "cells_ge_20us_failing_every_planted_run": long_caught_all,
            "short_cells": short, "subprocess_comparisons": sub_cmp, "subprocess_false_alarms": sub_fa}


def _rows(res):
    for kname, k in res["kernels"].items():
        for name, c in k.get("cells", {}).items():
            yield kname, name, c


def markdown(res: dict, args) -> str:
    m, s, bw = res["meta"], res["summary"], res.get("bandwidth", {})
    fa_rate = s["false_alarm_rate"]
    lines = [f"# Perf guard power, {m['gpu']} ({m['gpu_class']}), {m['date']}", "",
             f"torch {m['torch']}, triton {m['triton']}, CUDA {m['cuda']}, Python {m['python']}; `{m['command']}`; "
             f"{m['seconds']:.0f} s.", f"nvidia-smi start: `{m['nvidia_smi_start']}`; end: `{m.get('nvidia_smi_end')}`", "",
             f"Method: `{m['method']}`; {m['settings']}.", "",
             "## Result", "",
             f"- null runs: {s['null_runs']} full guard runs per kernel against a fresh baseline: **{s['false_alarms']} "
             f"false alarms in {s['null_comparisons']} cell comparisons ({_pct(fa_rate, 2)})** (target <= 1 %)",
             f"- planted {args.slowdown:.0%} slowdown: **{s['cells_ge_20us_failing_every_planted_run']} of "
             f"{s['cells_ge_20us']} cells of >= 20 us failed every planted run**; {s['planted_failures']} of "
             f"{s['planted_comparisons']} planted comparisons failed overall",
             f"- fresh-process pytest runs: {len(res.get('subprocess_runs', []))} runs, {s['subprocess_false_alarms']} "
             f"slower verdicts in {s['subprocess_comparisons']} cell comparisons",
             f"- bandwidth: read-only kernel {bw.get('read_tbs', 0):.3f} TB/s (repeats "
             f"{[round(x, 3) for x in bw.get('read_tbs_repeats', [])]}), torch.sum {bw.get('torch_sum_tbs', 0):.3f} TB/s, "
             f"copy {bw.get('copy_tbs', 0):.3f} TB/s (read + written)", ""]
    if s["short_cells"]:
        lines += ["Short cells (< 20 us): the smallest slowdown each catches with >= 95 % probability:", ""]
        for r in s["short_cells"]:
            lines.append(f"- {r['kernel']} {r['cell']}: {r['median_us']:.1f} us, catches >= {_pct(r['catches'])}; "
                         f"planted achieved {_pct(r['planted_achieved'])}, failed {r['planted_caught']}")
        lines.append("")
    lines += ["## Per cell", "",
              "| kernel | cell | timing | base us | noise | threshold | catches | null FA | null max abs change | "
              "null spread | planted achieved | planted failed | MB | TB/s | % read roofline | cross-check |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kname, name, c in _rows(res):
        xc = c.get("crosscheck") or {}
        agree = (f"{_pct(xc.get('agreement'))} vs {xc.get('reference_us', 0):.1f} us" if xc.get("agreement") is not None
                 else xc.get("error", "-"))
        lines.append(f"| {kname} | {name} | {c['timing']} | {c['median_us']:.2f} | {_pct(c['noise_rel'], 2)} | "
                     f"{_pct(c['threshold'])} | {_pct(c['catches'])} | {c['null_fail']}/{len(c['null'])} | "
                     f"{_pct(c.get('null_max_change'))} | {_pct(c.get('null_spread_rel'), 2)} | "
                     f"{_pct(c.get('planted_achieved'))} | {c['planted_fail']}/{len(c['planted'])} | "
                     f"{c['bytes'] / 1e6:.1f} | {c['tbs']:.2f} | {c['roofline_pct']:.0f} | {agree} |")
    lines += ["", "Cross-check: graph-safe kernels compare our replay timing *without* the flush against "
              "triton.testing.do_bench_cudagraph (which unrolls back-to-back calls in one graph and does not flush); "
              "cells whose KV fits in the L2 differ by design. Eager kernels: do_bench (zero flush) vs our eager "
              "timing (read flush).", ""]
    if res.get("flush_check"):
        lines += ["## L2 flush: zero (dirty lines) vs read (clean lines), 60 samples each", "",
                  "| kernel | cell | zero: median us | zero: IQR | read: median us | read: IQR |", "|---|---|---|---|---|---|"]
        for r in res["flush_check"]:
            lines.append(f"| {r['kernel']} | {r['cell']} | {r['zero']['median_us']:.2f} | {_pct(r['zero']['iqr_rel'])} | "
                         f"{r['read']['median_us']:.2f} | {_pct(r['read']['iqr_rel'])} |")
        lines.append("")
    errs = [(n, k) for n, k in res["kernels"].items() if k.get("error") or k.get("planted_error") or k.get("null_errors")
            or k.get("errors")]
    if errs:
        lines += ["## Errors", ""]
        for n, k in errs:
            for key in ("error", "planted_error", "errors", "null_errors"):
                if k.get(key):
                    lines.append(f"- {n} {key}: `{str(k[key])[:800]}`")
        lines.append("")
    for i, r in enumerate(res.get("subprocess_runs", [])):
        if r.get("slower") or r.get("other_failures") or r.get("error"):
            lines.append(f"- fresh-process run {i + 1}: {json.dumps(r)[:1500]}")
    return "\n".join(lines) + "\n"


def short_table(res: dict, args) -> str:
    s = res["summary"]
    lines = [f"{'kernel':21s} {'cell':20s} {'base us':>8s} {'thresh':>6s} {'catches':>7s} {'null FA':>7s} "
             f"{'planted':>7s} {'caught':>6s} {'roof%':>5s} {'xcheck':>7s}"]
    for kname, name, c in _rows(res):
        xc = (c.get("crosscheck") or {}).get("agreement")
        lines.append(f"{kname:21s} {name:20s} {c['median_us']:8.2f} {_pct(c['threshold']):>6s} {_pct(c['catches']):>7s} "
                     f"{c['null_fail']:>3d}/{len(c['null']):<3d} {_pct(c.get('planted_achieved')):>7s} "
                     f"{c['planted_fail']:>2d}/{len(c['planted']):<3d} {c['roofline_pct']:5.0f} {_pct(xc):>7s}")
    bw = res.get("bandwidth", {})
    lines += ["",
              f"false alarms: {s['false_alarms']}/{s['null_comparisons']} cell comparisons "
              f"({_pct(s['false_alarm_rate'], 2)}) in {s['null_runs']} null runs; fresh processes: "
              f"{s['subprocess_false_alarms']}/{s['subprocess_comparisons']}",
              f"planted {args.slowdown:.0%}: {s['cells_ge_20us_failing_every_planted_run']}/{s['cells_ge_20us']} cells "
              f">= 20 us failed every planted run; short cells: " + (", ".join(
                  f"{r['kernel']}/{r['cell']} catches >= {_pct(r['catches'])}" for r in s["short_cells"]) or "none"),
              f"bandwidth: read {bw.get('read_tbs', 0):.3f} TB/s, torch.sum {bw.get('torch_sum_tbs', 0):.3f}, "
              f"copy {bw.get('copy_tbs', 0):.3f}; {res['meta']['seconds']:.0f} s; files in {args.out}"]
    errs = [n for n, k in res["kernels"].items() if k.get("error") or k.get("planted_error")]
    if errs:
        lines.append(f"errors (see power.md): {errs}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

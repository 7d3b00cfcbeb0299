"""The A/B perf guard's power on a real GPU, in one command: false alarms of A/A runs (the
kernel under test and its reference are the same kernel, two instances), and which planted
slowdowns each cell catches.

    python benchmarks/perf_power.py --out $OUT [--kernel pkg.mod:obj ...] [--reps 20]
                                    [--slowdowns 0.05,0.03,0.02,0.01] [--planted-reps 3] [--max-seconds 240]

Every measurement is the pytest guard's own code path (`perf.guard.GuardRun` with a reference
on a `GpuTiming` source: fresh inputs and CUDA graphs for both kernels, pilot, 10 interleaved
rounds of one block of each, the verdict on the ratio), in-process:

 1. bandwidth: read-only Triton kernel (the roofline; 3 repeats), device copy;
 2. A/A: `--reps` guard runs per kernel with itself as the reference; every "slower" is a false
    alarm (target: none in >= 20 runs). The spread of the A/A ratios per cell is reported next
    to the sigma the guard derived (stats.sigma_ab), so the derivation can be checked;
 3. planted: the kernel under test's launch also reads extra bytes with a read-only kernel
    inside the same graph (the reference does not), sized so the extra device time is s of the
    cell's time: bytes = (s * t_cell - overhead) * read bandwidth, overhead = the measured cost
    of the extra launch reading nothing. 5 % first (cells >= 20 us must fail every run), then
    the smaller `--slowdowns` while time remains; per cell, the smallest slowdown that failed
    every planted run is reported.

Records used for the thresholds: --perf-baseline-dir (default: the shipped ones). Writes
$OUT/power.json and $OUT/power.md, prints the summary table last; stops starting new work at
--max-seconds. `--fake`: a CPU dry run of the bookkeeping (synthetic numbers).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import statistics
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHORT_CELL_US = 20.0  # = decode_conformance.perf.stats.SHORT_CELL_US (not imported before torch)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--out", default=os.environ.get("OUT", "results"), help="output folder (default: $OUT)")
    ap.add_argument("--kernel", action="append", default=[], metavar="PKG.MOD:OBJ",
                    help="kernel(s) to measure (repeatable; default: the suite's default kernels)")
    ap.add_argument("--reps", type=int, default=20, help="A/A guard runs per kernel (>= 20 for the record)")
    ap.add_argument("--slowdowns", default="0.05,0.03,0.02,0.01",
                    help="planted slowdowns (fractions of the cell's time), the first is the target")
    ap.add_argument("--planted-reps", type=int, default=3, help="guard runs per kernel and planted slowdown")
    ap.add_argument("--perf-baseline-dir", default=None, help="records for the thresholds (default: the shipped)")
    ap.add_argument("--max-seconds", type=float, default=240.0, help="stop starting new work after this long")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--separate-inputs", action="store_true",
                    help="give the reference instance inputs of its own (the guard shares the tested kernel's)")
    ap.add_argument("--fake", action="store_true", help="CPU dry run with perf.sources.FakeTiming (synthetic numbers)")
    return ap.parse_args(argv)


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
    """wrap(kernel, cell, launch) for the kernel under test: the launch, then a read-only kernel
    over `nbytes[(kernel, cell)]` bytes of a buffer the timed kernel never touches (cold after
    the L2 flush). A (kernel, cell) without an entry is left unwrapped: the A/A runs time the
    kernel under test exactly as its reference (an H200 run with an empty extra launch there
    read +1.5 us on every test launch: 20 of 20 "false alarms" on the 16 us cells)."""

    def __init__(self, torch, timing, device):
        self.torch, self.device = torch, device
        self.reader = timing.ReadKernel(device)
        self.buf = torch.ones(1024, dtype=torch.int32, device=device)
        self.nbytes: dict = {}

    def ensure(self, nbytes: int) -> None:
        if self.buf.numel() * 4 < nbytes:
            self.buf = None
            self.torch.cuda.empty_cache()
            self.buf = self.torch.ones(nbytes // 4 + 1024, dtype=self.torch.int32, device=self.device)

    def __call__(self, kernel, cell, launch):
        key = (kernel.name, cell.name)
        if key not in self.nbytes:  # A/A: the launch as it is (an empty extra launch costs ~1.5 us)
            return launch
        n = int(self.nbytes[key])
        reader, buf = self.reader, self.buf

        def planted():
            launch()
            reader.read(buf, n)
        return planted


def main(argv=None) -> int:
    args = parse_args(argv)
    clock = Clock(args.max_seconds)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slowdowns = [float(s) for s in args.slowdowns.split(",") if s.strip()]

    import torch
    if not torch.cuda.is_available() and not args.fake:
        print("perf_power: no GPU visible to torch; nothing to measure (--fake: a CPU dry run)", file=sys.stderr)
        return 2
    from decode_conformance import _paths
    _paths.alias_checkout(ROOT)
    import triton
    from decode_conformance import hardware
    from decode_conformance.kernel_api import kernel_specs, load_kernel
    from decode_conformance.perf import guard, sources, stats, store, timing
    from decode_conformance.perf.cells import load_cells
    from decode_conformance.state import KernelParam

    dev = args.device
    fake_kw = {"gpu_class": "sm_90", "noise": 0.01, "session_jitter": 0.003}
    gpu_class = "sm_90" if args.fake else hardware.detect_class(sources.torch_device_index(dev))
    cells = load_cells()
    log: list[str] = []

    def say(msg: str) -> None:
        line = f"[{clock.used:6.1f}s] {msg}"
        log.append(line)
        print(line, flush=True)

    res = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "gpu": "fake GPU (--fake)" if args.fake else torch.cuda.get_device_name(dev),
                    "gpu_class": gpu_class, "torch": torch.__version__, "triton": triton.__version__,
                    "cuda": torch.version.cuda, "python": sys.version.split()[0],
                    "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]), "args": vars(args),
                    "method": store.METHOD, "settings": {"rounds": stats.ROUNDS, "z": stats.Z,
                                                         "min_threshold": stats.MIN_THRESHOLD}},
           "kernels": {}, "log": log}
    say(f"{res['meta']['gpu']} ({gpu_class}), torch {torch.__version__}, triton {triton.__version__}")

    pairs = []
    for spec in kernel_specs(args.kernel):
        try:  # two instances: the A/A reference must not share state with the kernel under test
            pairs.append((KernelParam(spec, load_kernel(spec)), KernelParam(spec, load_kernel(spec))))
        except Exception as e:  # noqa: BLE001
            res["kernels"][spec] = {"spec": spec, "error": f"load: {e}"}
            say(f"kernel {spec}: does not load: {e}")

    if args.fake:
        src = sources.FakeTiming(seed="aa", **fake_kw)
        planter, info = None, src.device_info()
    else:
        info = {"read_tbs_repeats": [timing.read_bandwidth_tbs(dev) for _ in range(3)]}
        flush = timing.L2Flush(dev, "read")
        planter = Planter(torch, timing, dev)
        src = sources.GpuTiming(dev, flush=flush, wrap=planter)
        info = {**src.device_info(), **info}
        info["read_tbs"] = statistics.median(info["read_tbs_repeats"])
        src._info = info
    res["device"] = info
    say(f"read {info['read_tbs']:.3f} TB/s, copy {info['copy_tbs']:.3f} TB/s")

    # the shipped records are an H200's: the fake GPU is another model, so it reads none
    base_dir = args.perf_baseline_dir or (str(out / "no-records") if args.fake else None)

    def run(kp, ref, source):
        return guard.GuardRun(timing=source, gpu_class=gpu_class, baseline_dir=base_dir, record=False,
                              require=False, pyargs=False, cells=cells, reference=ref,
                              share_inputs=not args.separate_inputs).outcome(kp)

    # A/A ---------------------------------------------------------------------------------------
    for kp, ref in pairs:
        k = res["kernels"][kp.name] = {"spec": kp.spec, "cells": {}, "aa_runs": 0}
        for rep in range(args.reps):
            if clock.left < 20:
                k["aa_stopped"] = f"out of time after {rep} runs"
                break
            try:
                for name, r in run(kp, ref, src).items():
                    if r.ratio is None:
                        if r.fail:
                            k.setdefault("errors", []).append(r.message[:500])
                        continue
                    c = k["cells"].setdefault(name, {"aa": [], "aa_thresholds": [], "aa_fail": 0,
                                                     "threshold": r.threshold, "catches": r.catches,
                                                     "now_us": r.now_us, "timing": r.timing, "planted": {}})
                    c["aa"].append(r.ratio)
                    c["aa_thresholds"].append(r.threshold)  # per run: a noisy run widens its own
                    c["aa_fail"] += int(r.status == "slower")
            except Exception as e:  # noqa: BLE001
                k.setdefault("errors", []).append(f"A/A run {rep}: {traceback.format_exc(limit=4)}")
                say(f"{kp.name}: A/A run failed: {e}")
                break
            k["aa_runs"] = rep + 1
        fa = sum(c["aa_fail"] for c in k["cells"].values())
        say(f"{kp.name}: {k['aa_runs']} A/A runs, {fa} false alarms in {sum(len(c['aa']) for c in k['cells'].values())}")

    # planted -----------------------------------------------------------------------------------
    for s in slowdowns:
        for kp, ref in pairs:
            k = res["kernels"].get(kp.name, {})
            if not k.get("cells") or clock.left < 20:
                continue
            try:
                if args.fake:
                    psrc = sources.FakeTiming(seed=f"planted{s}", slowdown=s, **fake_kw)
                else:
                    for name in k["cells"]:
                        planter.nbytes[(kp.name, name)] = 0
                    empty = run(kp, ref, src)  # the extra launch reading nothing: its cost
                    need = 0
                    for name, c in k["cells"].items():
                        t = c["now_us"]
                        over = max(0.0, (empty[name].ratio - 1) * t) if empty[name].ratio else 0.0
                        nb = int(max(0.0, s * t - over) * info["read_tbs"] * 1e6)
                        planter.nbytes[(kp.name, name)] = nb
                        c.setdefault("plant_overhead_us", over)
                        need = max(need, nb)
                    planter.ensure(need)
                    psrc = src
                for rep in range(args.planted_reps):
                    if clock.left < 10:
                        break
                    for name, r in run(kp, ref, psrc).items():
                        if name in k["cells"] and r.ratio is not None:
                            p = k["cells"][name]["planted"].setdefault(str(s), {"ratios": [], "fail": 0,
                                                                                 "thresholds": []})
                            p["ratios"].append(r.ratio)
                            p["thresholds"].append(r.threshold)  # why a run above the A/A threshold can pass
                            p["fail"] += int(r.status == "slower")
            except Exception as e:  # noqa: BLE001
                k.setdefault("errors", []).append(f"planted {s}: {traceback.format_exc(limit=4)}")
                say(f"{kp.name}: planted {s:.0%} failed: {e}")
            if planter is not None:
                planter.nbytes.clear()
        say(f"planted {s:.0%}: done")

    res["meta"]["seconds"] = clock.used
    res["summary"] = summarize(res, slowdowns)
    (out / "power.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "power.md").write_text(markdown(res, slowdowns))
    print()
    print(short_table(res, slowdowns))
    return 0


def summarize(res: dict, slowdowns: list[float]) -> dict:
    target = f"{slowdowns[0]}" if slowdowns else None
    n_aa = fa = long_total = long_caught = 0
    for k in res["kernels"].values():
        for c in k.get("cells", {}).values():
            n_aa += len(c["aa"])
            fa += c["aa_fail"]
            logs = [math.log(x) for x in c["aa"]]
            c["aa_spread"] = statistics.stdev(logs) if len(logs) > 1 else None
            c["aa_median_ratio"] = statistics.median(c["aa"]) if c["aa"] else None
            caught = [float(s) for s, p in c["planted"].items() if p["ratios"] and p["fail"] == len(p["ratios"])]
            c["smallest_caught"] = min(caught) if caught else None
            for p in c["planted"].values():
                p["achieved"] = statistics.median(p["ratios"]) / (c["aa_median_ratio"] or 1) - 1 if p["ratios"] else None
            if target and c["now_us"] >= SHORT_CELL_US and target in c["planted"]:
                long_total += 1
                p = c["planted"][target]
                long_caught += int(bool(p["ratios"]) and p["fail"] == len(p["ratios"]))
    return {"aa_comparisons": n_aa, "aa_false_alarms": fa, "target": target, "cells_ge_20us": long_total,
            "cells_ge_20us_caught_every_run": long_caught}


def _rows(res):
    for kname, k in res["kernels"].items():
        for name, c in k.get("cells", {}).items():
            yield kname, name, c


def markdown(res: dict, slowdowns: list[float]) -> str:
    m, s, d = res["meta"], res["summary"], res.get("device", {})
    lines = [f"# A/B perf guard power, {m['gpu']} ({m['gpu_class']}), {m['date']}", "",
             f"torch {m['torch']}, triton {m['triton']}, CUDA {m['cuda']}; `{m['command']}`; {m['seconds']:.0f} s; "
             f"read {d.get('read_tbs', 0):.3f} TB/s, copy {d.get('copy_tbs', 0):.3f} TB/s.", "",
             f"- A/A: **{s['aa_false_alarms']} false alarms in {s['aa_comparisons']} cell comparisons** (target: none)",
             f"- planted {_pct(float(s['target'])) if s['target'] else '-'}: **{s['cells_ge_20us_caught_every_run']} of "
             f"{s['cells_ge_20us']} cells of >= 20 us failed every run**", "",
             "| kernel | cell | timing | us | A/A runs | A/A false alarms | A/A spread (measured) | threshold | "
             "catches (derived) | " + " | ".join(f"planted {_pct(x, 0)}: failed, achieved" for x in slowdowns)
             + " | smallest caught |", "|" + "---|" * (10 + len(slowdowns))]
    for kname, name, c in _rows(res):
        planted = []
        for x in slowdowns:
            p = c["planted"].get(str(x))
            planted.append(f"{p['fail']}/{len(p['ratios'])}, {_pct(p['achieved'])}" if p else "-")
        lines.append(f"| {kname} | {name} | {c['timing']} | {c['now_us']:.2f} | {len(c['aa'])} | {c['aa_fail']} | "
                     f"{_pct(c['aa_spread'], 2)} | {_pct(c['threshold'])} | {_pct(c['catches'])} | "
                     + " | ".join(planted) + f" | {_pct(c['smallest_caught'], 0)} |")
    errs = [(n, k) for n, k in res["kernels"].items() if k.get("errors") or k.get("error")]
    if errs:
        lines += ["", "## Errors", ""] + [f"- {n}: `{str(k.get('errors') or k.get('error'))[:800]}`" for n, k in errs]
    return "\n".join(lines) + "\n"


def short_table(res: dict, slowdowns: list[float]) -> str:
    s = res["summary"]
    lines = [f"{'kernel':21s} {'cell':22s} {'us':>8s} {'A/A FA':>7s} {'A/A sd':>7s} {'thresh':>6s} {'smallest':>8s}"]
    for kname, name, c in _rows(res):
        lines.append(f"{kname:21s} {name:22s} {c['now_us']:8.2f} {c['aa_fail']:>3d}/{len(c['aa']):<3d} "
                     f"{_pct(c['aa_spread'], 2):>7s} {_pct(c['threshold']):>6s} {_pct(c['smallest_caught'], 0):>8s}")
    lines += ["", f"A/A false alarms: {s['aa_false_alarms']}/{s['aa_comparisons']}; planted {s['target']}: "
              f"{s['cells_ge_20us_caught_every_run']}/{s['cells_ge_20us']} cells >= 20 us failed every run; "
              f"{res['meta']['seconds']:.0f} s"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

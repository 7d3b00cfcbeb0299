"""Every adapter beside our shipped kernels at the perf-guard cells (fixtures/perf_cells.toml)
and the speed targets' other cells (benchmarks/target_cells.toml; `--guard-cells-only`: the
first file alone), in one process, interleaved (round-robin over the kernels, several rounds, so clock and
thermal drift hit every kernel alike): median time, the ratio to `--baseline` (default
`dispatch`, our default kernel) and the share of the read roofline (the cell's compulsory
bytes at the measured read bandwidth).

    python benchmarks/peer_table.py --out DIR [--kernel NAME|SPEC ...] [--baseline NAME|SPEC] [--guard-cells-only]
                                    [--rounds 5] [--reps 20]

Every kernel is timed as a CUDA-graph replay of its planned launch where that launch can be
captured (a cell has fixed lengths, so a graph of one plan is what a serving engine replays
for it, whether or not the kernel declares `cuda_graph_safe`, which promises more: one graph
for every length), else as eager launches (mode `e`, with why), the L2 flushed before every
launch (decode_conformance's timer). Each kernel's output is first compared with
torch_gather's (our float32 torch implementation) on the same inputs: a kernel that is wrong
on the cell is reported, not timed. A kernel that does not declare the cell's shape, or whose
library is absent, gets the skip reason. Writes DIR/peer_table.json and DIR/peer_table.md.

A kernel is a registry name or an import spec (`pkg.mod:obj`, as pytest's `--kernel`): a
candidate tree's kernels, importable under another name, run interleaved with main's in the same
rounds (benchmarks/README.md: an A/B of two trees), each row labelled as given; `--baseline`
names the row the verdict and the ratios are computed for (default `dispatch`).

The last row, `sdpa_dense`, is not a peer: torch SDPA on dense copies of the keys made before
timing (`SdpaDense`), the floor without paging cost, on the 16-bit cells without MLA.
Before the timing process launches anything, each kernel meets every cell once in a process of
its own (`--preflight NAME`, a few at a time): a launch that kills its CUDA context (an
illegal address) would otherwise take the whole table down with it. The child writes one
JSON line per cell as it goes, so a crash names the cell it died on; that kernel is then
reported as "crashed" on that cell and left out of the timing there.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()

SHIPPED = ("dispatch", "adaptive_split", "lean", "fixed_split")
ADAPTERS = ("flashinfer_decode", "flashinfer_decode_tc", "flashinfer_decode_tc_graph",
            "flashinfer_mla", "flashinfer_mla_fa3", "vllm_unified_2d", "vllm_unified_3d", "sglang_decode",
            "torch_flex", "torch_sdpa")
DENSE_FLOOR = "sdpa_dense"  # not a paged peer: the floor row (SdpaDense)
BASELINE = "dispatch"
MIN_COSINE = 0.999  # far below any correct bf16 kernel (~0.99999), far above a wrong one
ANY_CELL = "*"  # a pre-flight that died outside a cell's launch: the kernel is left out of every cell


def perf_api(guard_only: bool = False):
    """The suite's timer, the table's cells (a zero-argument loader) and the bytes a cell moves."""
    from decode_conformance.perf import timing
    from decode_conformance.perf.cells import bytes_moved
    from benchmarks.sweep import target_cells
    return timing, lambda: target_cells(guard_only), bytes_moved


def _load(label):
    """A registry name, `sdpa_dense`, or an import spec `pkg.mod:obj`."""
    if label == DENSE_FLOOR:
        return SdpaDense()
    from decode_conformance.kernel_api import load_kernel
    return load_kernel(label if ":" in label else f"decode_conformance_kernels.registry:{label}")


class SdpaDense:
    """torch SDPA on a dense, contiguous copy of each request's keys, copied at plan time (not
    timed): attention without the cost of paging, the floor the speed issue compares with at
    >= 8k keys. One batched call when the requests are equally long, else one per request. Not
    a paged kernel (the registry's `torch_sdpa` gathers inside its launch): a reference row.
    16-bit caches only (an fp8 cache copied to 16 bits would read twice its bytes), no MLA."""

    name = DENSE_FLOOR
    library_version = None

    def __init__(self):
        from decode_conformance.kernel_api import Capabilities
        self.caps = Capabilities(kv_dtypes=frozenset({"bf16", "fp16"}), window_convention=None, mla=False,
                                 softcap=False, sinks=False, lse=False)

    def plan(self, batch):
        from benchmarks.sweep import dense_sdpa
        return dense_sdpa(batch, batch.out)[0]


def _cosine(a, b) -> float:
    import torch
    a, b = a.double().flatten(), b.double().flatten()
    if not bool(torch.isfinite(a).all()):
        return float("nan")
    return float(torch.dot(a, b) / (a.norm() * b.norm()).clamp_min(1e-300))


class TimedRunner:
    """One kernel's samples on one cell: `runner()` returns `reps` device times in us.

    It holds the batch AND the planned launch: a graph replays raw addresses of the tensors it
    was captured on, and those include what plan() allocated that only the launch closure owns
    (a library wrapper's own workspace and index buffers). Freed when the caller moves on to
    the next kernel, a replay reads freed memory: an illegal address (the s14 crashes: the
    first dropped the batch, the second the launch)."""

    def __init__(self, launch, batch, timing, reps: int, eager: bool):
        self.launch, self.batch, self.timing, self.reps = launch, batch, timing, reps
        self.mode = "eager" if eager else "graph"
        self.graph = None if eager else timing.capture(launch, "cuda")

    def __call__(self) -> list:
        t = self.timing
        if self.graph is None:
            return t.event_times_us(self.launch, "cuda", self.reps, t._bench_flush("cuda", t.BENCH_FLUSH))
        return t.replay_times_us(self.graph, "cuda", self.reps)


def measure_cell(cell, kernels: dict, reference, timing, rounds: int, reps: int, no_graph: dict) -> dict:
    """kernels: {label: kernel}; no_graph: {label: why} for the kernels whose launch did not
    capture on this cell (the pre-flight's finding); they are timed eagerly."""
    from decode_conformance.runner import prepare
    import torch
    ref_batch = prepare(reference, cell.case, "cuda")
    reference.plan(ref_batch)()
    torch.cuda.synchronize()
    entries, runners = {}, {}
    for label, k in kernels.items():
        miss = k.caps.missing_for(cell.case, "cuda")
        if miss:
            entries[label] = {"status": "skip", "reason": "; ".join(miss)}
            continue
        try:
            batch = prepare(k, cell.case, "cuda")
            launch = k.plan(batch)
            launch()
            torch.cuda.synchronize()
        except Exception as e:  # a library error on this cell is a result, not the end of the table
            entries[label] = {"status": "error", "reason": f"{type(e).__name__}: {e}"[:300]}
            continue
        cos = _cosine(batch.out, ref_batch.out)
        if not cos >= MIN_COSINE:
            entries[label] = {"status": "wrong", "reason": f"cosine {cos:.6f} against torch_gather"}
            continue
        runners[label] = TimedRunner(launch, batch, timing, reps, eager=label in no_graph)
        entries[label] = {"status": "timed", "times_us": [], "mode": runners[label].mode}
        if label in no_graph:
            entries[label]["eager_because"] = no_graph[label]
    for _ in range(rounds):  # interleaved
        for name, run in runners.items():
            entries[name]["times_us"] += run()
    for e in entries.values():
        if e["status"] == "timed":
            e["median_us"] = statistics.median(e["times_us"])
            del e["times_us"]
    return entries


def preflight(name: str, guard_only: bool = False, only=None) -> int:
    """Child process: plan, launch and synchronise `name` once on every cell it declares, then try
    to capture the launch in a CUDA graph and replay it; one JSON line per cell on stdout, flushed
    before the next launch ("graph": "ok" or why not)."""
    import torch
    from decode_conformance.runner import prepare
    timing, load_cells, _ = perf_api(guard_only)
    k = _load(name)
    for cell in load_cells():
        if k.caps.missing_for(cell.case, "cuda") or (only and cell.name not in only):
            continue
        print(json.dumps({"cell": cell.name, "status": "started"}), flush=True)
        graph = "not tried"
        try:
            batch = prepare(k, cell.case, "cuda")
            launch = k.plan(batch)
            launch()
            torch.cuda.synchronize()
            status = "ok"
        except Exception as e:  # reported by measure_cell in the timing process, with the same message
            status = f"error: {type(e).__name__}"
        if status == "ok":
            try:
                timing.capture(launch, "cuda").replay()
                torch.cuda.synchronize()
                graph = "ok"
            except Exception as e:
                graph = f"{type(e).__name__}: {e}"[:160]
        print(json.dumps({"cell": cell.name, "status": status, "graph": graph}), flush=True)
    return 0


def crashed_cells(names, jobs: int, guard_only: bool = False, only=None) -> tuple[dict, dict]:
    """({kernel: {cell: why}} for the cells whose pre-flight process died (signal, CUDA abort),
    {kernel: {cell: why}} for the cells whose launch did not capture in a CUDA graph)."""
    import concurrent.futures as cf
    import subprocess

    def one(name):
        p = subprocess.run([sys.executable, __file__, "--preflight", name] + ["--guard-cells-only"] * guard_only
                           + [arg for c in only or () for arg in ("--cell", c)],
                           capture_output=True, text=True)
        lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        no_graph = {x["cell"]: x["graph"] for x in lines if x.get("graph") not in (None, "ok")}
        if p.returncode == 0:
            return name, {}, no_graph
        tail = " ".join(p.stderr.strip().splitlines()[-2:])[-200:]
        why = f"pre-flight process died (exit {p.returncode}): {tail}"
        if lines and lines[-1]["status"] == "started":
            return name, {lines[-1]["cell"]: why}, no_graph
        return name, {ANY_CELL: why}, no_graph  # before or between cells: trust none of them in this process

    with cf.ThreadPoolExecutor(max(1, jobs)) as pool:
        found = list(pool.map(one, names))
    return {n: c for n, c, _ in found}, {n: g for n, _, g in found}


DENSE_TARGET_KEYS = 8192  # the floor target applies to cells whose longest request has this many keys
DENSE_TARGET = 1.03  # within 3 % of dense SDPA


def verdict_lines(rows: dict, baseline: str = BASELINE) -> list:
    """Per cell, the speed issue's two targets: `baseline` (default dispatch) against the fastest
    paged peer (every adapter in ADAPTERS that timed the cell) and against the dense floor
    (cells whose longest request has >= DENSE_TARGET_KEYS keys). A ratio > 1 is a miss; a cell
    with no number for the baseline, or no peer that timed it, says so rather than passing."""
    out = [f"| cell | {baseline} us | fastest paged peer | {baseline} / peer | sdpa_dense us | {baseline} / dense |",
           "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ks = r["kernels"]
        ours = ks.get(baseline, {}).get("median_us")
        peers = {n: e["median_us"] for n, e in ks.items() if n in ADAPTERS and "median_us" in e}
        best = min(peers, key=peers.get) if peers else None
        dense = ks.get(DENSE_FLOOR, {}).get("median_us")

        def ratio(theirs, limit):
            if ours is None or theirs is None:
                return "-"
            x = ours / theirs
            return f"{x:.3f}" + (" **miss**" if x > limit else "")
        peer = f"`{best}` {peers[best]:.1f}" if best else "none timed"
        floor = ratio(dense, DENSE_TARGET) if r.get("max_len", 0) >= DENSE_TARGET_KEYS else "(< 8k keys)"
        out.append(f"| {name} | {f'{ours:.1f}' if ours else ks.get(baseline, {}).get('status', '-')} | {peer} | "
                   f"{ratio(peers.get(best), 1.0)} | {f'{dense:.1f}' if dense else '-'} | {floor} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for peer_table.json / .md")
    ap.add_argument("--kernel", action="append",
                    help="a registry name or an import spec pkg.mod:obj, repeatable (default: shipped + every adapter)")
    ap.add_argument("--baseline", default=BASELINE,
                    help="the --kernel the verdict and the ratios are for (default: %(default)s)")
    ap.add_argument("--guard-cells-only", action="store_true",
                    help="the perf guard's cells alone, not benchmarks/target_cells.toml's as well")
    ap.add_argument("--cell", action="append", metavar="NAME",
                    help="time these cells only, repeatable (default: every cell)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--preflight-jobs", type=int, default=4, help="pre-flight processes at a time")
    ap.add_argument("--preflight", metavar="NAME", help=argparse.SUPPRESS)  # the child's entry
    a = ap.parse_args(argv)
    if a.preflight:
        return preflight(a.preflight, a.guard_cells_only, a.cell)
    if not a.out:
        ap.error("--out is required")
    labels = a.kernel or list(SHIPPED + ADAPTERS + (DENSE_FLOOR,))
    if len(set(labels)) != len(labels):
        ap.error(f"--kernel: {sorted({x for x in labels if labels.count(x) > 1})} given twice")
    if a.baseline not in labels:
        ap.error(f"--baseline {a.baseline}: not one of the kernels timed ({', '.join(labels)})")
    timing, load_cells, bytes_moved = perf_api(a.guard_cells_only)
    timed_cells = [c for c in load_cells() if not a.cell or c.name in a.cell]
    unknown = sorted(set(a.cell or ()) - {c.name for c in timed_cells})
    if unknown:
        ap.error(f"--cell {', '.join(unknown)}: expected one of {', '.join(c.name for c in load_cells())}")
    import torch
    if not torch.cuda.is_available():
        ap.error("--out: the peer table times kernels on a GPU; none is visible here")
    kernels = {label: _load(label) for label in labels}
    crashed, no_graph = crashed_cells([lb for lb, k in kernels.items() if not k.caps.unavailable], a.preflight_jobs,
                                      a.guard_cells_only, a.cell)
    for name, cells in crashed.items():
        for cell, why in cells.items():
            print(f"{name} on {cell}: {why}", flush=True)
    reference = _load("torch_gather")
    tbs = timing.read_bandwidth_tbs()
    rows = {}
    for cell in timed_cells:
        dead = {lb: crashed.get(lb, {}).get(cell.name) or crashed.get(lb, {}).get(ANY_CELL) for lb in kernels}
        eager = {n: cells[cell.name] for n, cells in no_graph.items() if cell.name in cells}
        entries = measure_cell(cell, {lb: k for lb, k in kernels.items() if not dead[lb]}, reference, timing,
                               a.rounds, a.reps, eager)
        entries.update({n: {"status": "crashed", "reason": why} for n, why in dead.items() if why})
        floor_us = bytes_moved(cell.case) / (tbs * 1e12) * 1e6
        base = entries.get(a.baseline, {}).get("median_us")
        for e in entries.values():
            if "median_us" in e:
                e["roofline_pct"] = 100 * floor_us / e["median_us"]
                if base:
                    e["vs_baseline"] = e["median_us"] / base
        rows[cell.name] = {"shape": cell.shape, "floor_us": floor_us, "max_len": max(cell.case.seq_lens),
                           "kernels": entries}
        print(cell.name, {k: round(v.get("median_us", 0), 1) or v["status"] for k, v in entries.items()}, flush=True)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    libs = {lb: getattr(k, "library_version", None) for lb, k in kernels.items()}
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "read_tbs": tbs, "libraries": libs,
            "rounds": a.rounds, "reps": a.reps, "baseline": a.baseline}
    (out / "peer_table.json").write_text(json.dumps({"meta": meta, "cells": rows}, indent=1))
    lines = [f"{meta['gpu']}, torch {meta['torch']}, read bandwidth {tbs:.2f} TB/s; median us "
             f"(x {a.baseline}, % of the read roofline); g = CUDA-graph replay, e = eager launch (its launch did "
             "not capture: peer_table.json says why)", ""] + verdict_lines(rows, a.baseline) + [
             "", "| kernel | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    for label in kernels:
        cells = []
        for r in rows.values():
            e = r["kernels"][label]
            if "median_us" in e:
                ratio = f"x{e['vs_baseline']:.2f}, " if "vs_baseline" in e else ""
                cells.append(f"{e['median_us']:.1f} {e['mode'][0]} ({ratio}{e['roofline_pct']:.0f} %)")
            else:
                cells.append(f"{e['status']}: {e['reason'][:50]}")
        lib = f" {libs[label]}" if libs[label] else ""
        lines.append(f"| `{label}`{lib} | " + " | ".join(cells) + " |")
    (out / "peer_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Latency vs context per kernel, with the read roofline, from stored perf-guard results (runs
anywhere: it reads JSON, no GPU).

    python benchmarks/plot_perf.py                           # the shipped records
    python benchmarks/plot_perf.py fixtures/baselines/sm_90 --out /tmp/sm_90.png
    python benchmarks/plot_perf.py reports/perf/perf.json    # what a guard run measured (--perf-report)
    python benchmarks/plot_perf.py my-records/sm_90/my_kernel.json

Inputs: records (<dir>/<gpu_class>/<kernel>.json, pytest-benchmark documents written by the
guard, decode_conformance/perf/store.py), `perf.json` of a guard run's --perf-report, or
folders holding them. One panel per (GPU class, kernel): x = keys in the cell (its context,
summed over the batch), y = the cell's median device time; one colour per shape and KV dtype
(labelled with the cell and its % of the roofline; the roofline: bytes moved / measured read
bandwidth, dashed). Needs matplotlib (`pip install matplotlib`).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _panels(doc: dict) -> list[dict]:
    """[{gpu_class, kernel, gpu_name, date, triton, read_tbs, cells: {name: {context, median_us, bytes,
    roofline_pct, shape, case}}}] of a record or a report; [] for anything else."""
    if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list):
        panels: dict = {}
        for b in doc["benchmarks"]:
            x = b.get("extra_info") or {}
            if "perf_guard" not in x:
                continue
            p = panels.setdefault((x["gpu_class"], x["kernel"]), {
                "gpu_class": x["gpu_class"], "kernel": x["kernel"], "gpu_name": x.get("gpu_name"),
                "date": str(doc.get("datetime", ""))[:10], "triton": x.get("triton"), "read_tbs": x.get("read_tbs"),
                "cells": {}})
            p["cells"][x["cell"]] = {"context": x["context"], "median_us": b["stats"]["median"] * 1e6,
                                     "bytes": x["bytes"], "roofline_pct": x.get("roofline_pct") or 0,
                                     "shape": x.get("shape"), "case": x.get("case")}
        return list(panels.values())
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list) and "mode" in doc:
        dev = doc.get("device") or {}
        panels = {}
        for r in doc["rows"]:
            if r.get("now_us") is None or r.get("context") is None:
                continue
            p = panels.setdefault(r["kernel"], {"gpu_class": doc["gpu_class"], "kernel": r["kernel"],
                                                "gpu_name": dev.get("gpu_name"), "date": "", "triton": dev.get("triton"),
                                                "read_tbs": dev.get("read_tbs"), "cells": {}})
            p["cells"][r["cell"]] = {"context": r["context"], "median_us": r["now_us"], "bytes": r["bytes"],
                                     "roofline_pct": r.get("roofline_pct") or 0, "shape": r["cell"].split("-")[-1],
                                     "case": ""}
        return list(panels.values())
    return []


def find_baselines(paths: list[str]) -> list[tuple[pathlib.Path, dict]]:
    files: list[pathlib.Path] = []
    for p in map(pathlib.Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.json"))
        elif p.exists():
            files.append(p)
        else:
            raise SystemExit(f"plot_perf: {p} does not exist")
    docs = []
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except ValueError as e:
            print(f"plot_perf: skipping {f}: not JSON ({e})", file=sys.stderr)
            continue
        panels = _panels(doc)
        if not panels:
            print(f"plot_perf: skipping {f}: not a perf-guard record or report", file=sys.stderr)
        docs += [(f, p) for p in panels]
    return docs


def family(cell: dict) -> str:
    dtype = str(cell.get("case", "?")).split("-", 1)[0]
    return f"{cell.get('shape', '?')} {dtype}"


def plot(docs: list[tuple[pathlib.Path, dict]], out: pathlib.Path) -> pathlib.Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = sorted(docs, key=lambda fd: (fd[1]["gpu_class"], fd[1]["kernel"]))
    n = len(docs)
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols, 4.4 * rows), squeeze=False)
    fams = sorted({family(c) for _, d in docs for c in d["cells"].values()})
    colors = {f: plt.cm.tab10(i % 10) for i, f in enumerate(fams)}
    for i, (path, d) in enumerate(docs):
        ax = axes[i // cols][i % cols]
        read = d["read_tbs"] or 1.0
        for fam in fams:
            cells = sorted(((name, c) for name, c in d["cells"].items() if family(c) == fam),
                           key=lambda nc: nc[1]["context"])
            if not cells:
                continue
            x = [c["context"] for _, c in cells]
            ax.plot(x, [c["median_us"] for _, c in cells], marker="o", ls="-", color=colors[fam], label=fam)
            ax.plot(x, [c["bytes"] / (read * 1e6) for _, c in cells], marker="_", ms=12, ls="--", color=colors[fam],
                    alpha=0.7)
            for name, c in cells:
                ax.annotate(f"{name}\n{c['median_us']:.0f} us, {c['roofline_pct']:.0f} %", (c["context"], c["median_us"]),
                            textcoords="offset points", xytext=(4, 4), fontsize=6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("keys in the cell (context x batch)")
        ax.set_ylabel("median device time, us")
        ax.set_title(f"{d['kernel']} - {d['gpu_class']} {d['gpu_name']}\n"
                     f"{d['date']}, triton {d['triton']}; dashed: roofline "
                     f"at {read:.2f} TB/s read", fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, loc="upper left")
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle("Perf guard: latency vs context per kernel (CUDA-graph replay, L2 flushed; dashed = bytes moved / "
                 "measured read bandwidth)", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="baseline files or folders (default: the shipped fixtures/baselines)")
    ap.add_argument("--out", default="perf-latency.png", help="PNG to write (default: ./perf-latency.png)")
    a = ap.parse_args(argv)
    paths = a.paths or [str(ROOT / "fixtures" / "baselines")]
    docs = find_baselines(paths)
    if not docs:
        print(f"plot_perf: no perf-guard records or reports under {paths}; record some with "
              "`pytest suites/perf --perf-record` on a GPU", file=sys.stderr)
        return 1
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        print("plot_perf: needs matplotlib (pip install matplotlib, or the project's [plot] extra)", file=sys.stderr)
        return 2
    print(plot(docs, pathlib.Path(a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

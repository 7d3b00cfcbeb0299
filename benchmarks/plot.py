"""Plots of a recorded sweep (runs anywhere: reads the JSON that benchmarks/sweep.py wrote).

    python benchmarks/plot.py results/                                 # what sweep.py wrote there
    # the recorded final sweeps (kept in git history, not in the tree):
    mkdir -p /tmp/close15 && for f in split lean; do
      git show e757cfd:docs/gpu-runs/2026-12-01-h200/close15/$f.json > /tmp/close15/$f.json; done
    python benchmarks/plot.py /tmp/close15

Writes split.png / lean.png next to the JSON it reads.
"""
from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_split(d: pathlib.Path) -> pathlib.Path:
    data = json.loads((d / "split.json").read_text())
    rows = [r for r in data["rows"] if "error" not in r]
    shapes = sorted({r["shape"] for r in rows}, key=lambda s: [int(x) for x in s.split("/")])
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(len(shapes), len(batches), figsize=(4 * len(batches), 3.3 * len(shapes)), squeeze=False)
    for i, shape in enumerate(shapes):
        for j, b in enumerate(batches):
            ax = axes[i][j]
            cells = sorted((r for r in rows if r["shape"] == shape and r["batch"] == b), key=lambda r: r["ctx"])
            if not cells:
                ax.axis("off")
                continue
            x = [r["ctx"] for r in cells]
            for key, label in (("adaptive_us", "adaptive split-K"), ("fixed_us", "fixed 8 splits"),
                               ("sdpa_us", "torch SDPA (contig)")):
                if "128/1/576" in shape and key == "sdpa_us":
                    continue  # SDPA's math fallback for Dk != Dv is 100-300x off the chart
                ax.plot(x, [r[key] for r in cells], marker="o", label=label)
            ax.plot(x, [r["floor_us"] for r in cells], "k--", label="bandwidth floor")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{shape}, batch {b}", fontsize=9)
            ax.set_xlabel("context")
            ax.set_ylabel("us")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    m = data["meta"]
    fig.suptitle(f"{m['gpu']} {m['date']}: torch {m['torch']}, triton {m['triton']}; CUDA-graph replay, L2 flushed",
                 fontsize=10)
    fig.tight_layout()
    out = d / "split.png"
    fig.savefig(out, dpi=80)
    return out


def plot_lean(d: pathlib.Path) -> pathlib.Path:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from decode_conformance import _paths
    _paths.alias_checkout()
    from decode_conformance_kernels import lean_gate
    data = json.loads((d / "lean.json").read_text())
    rows = [r for r in data["rows"] if "error" not in r]
    shapes = sorted({r["shape"] for r in rows}, key=lambda s: [int(x) for x in s.split("/")])
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        cells = sorted((r for r in rows if r["shape"] == shape), key=lambda r: (r["batch"], r["ctx"], -r["ratio"]))
        parts = [int(x) for x in shape.split("/")]
        labels, vals, colors = [], [], []
        for r in cells:
            on = lean_gate.eager_gate(r["batch"], round(r["mean_len"] * r["batch"]), parts[0], parts[0] // parts[1],
                                      is_mla=len(parts) == 4, gpu_class="sm_90", max_len=r.get("max_len"))
            labels.append(f"b{r['batch']} {r['ctx'] // 1024}k r{r['ratio']}")
            vals.append(r["speedup"])
            colors.append("tab:green" if on else "tab:gray")
        ax.barh(range(len(vals)), vals, color=colors)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(range(len(vals)))
        ax.set_yticklabels(labels, fontsize=6)
        ax.set_xlabel("split-K time / Lean time (>1: Lean faster)")
        ax.set_title(f"{shape} (green: sm_90 eager gate on)", fontsize=9)
    m = data["meta"]
    fig.suptitle(f"Lean vs adaptive split-K, {m['gpu']} {m['date']}, triton {m['triton']}", fontsize=10)
    fig.tight_layout()
    out = d / "lean.png"
    fig.savefig(out, dpi=80)
    return out


if __name__ == "__main__":
    d = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    for f in (plot_split, plot_lean):
        if (d / f"{f.__name__.split('_')[1]}.json").exists():
            print(f(d))

"""What a person reads after a guard run: the terminal table, and per kernel a markdown table
of its cells (record / now / ratio / threshold / verdict) with the run's notes, written next to
a JSON of the same rows; benchmarks/plot_perf.py draws the latency-vs-context plot from it."""
from __future__ import annotations

import json
import pathlib

from .guard import CellResult


def _f(x, fmt: str) -> str:
    width = int("".join(ch for ch in fmt.split(".")[0] if ch.isdigit()) or 0)
    return format(x, fmt) if x is not None else "-".rjust(width)


def header(run) -> str:
    info = run.timing.device_info() if run.timing is not None else {}
    ref = f", reference {run.reference.spec}" if run.reference is not None else ""
    return (f"perf guard ({run.mode}{ref}): {info.get('gpu_name', '?')}, class {run.gpu_class}, read roofline "
            f"{info.get('read_tbs') or 0:.2f} TB/s, copy {info.get('copy_tbs') or 0:.2f} TB/s; records {run.baseline_dir}")


def table(run) -> list[str]:
    rows = [r for r in run.rows() if r.status != "skipped"]
    if not rows:
        return []
    kw = max([21] + [len(r.kernel) for r in rows])  # an adopter's kernel name may be longer than ours
    cw = max([22] + [len(r.cell) for r in rows])
    hdr = (f"{'kernel':{kw}s} {'cell':{cw}s} {'status':11s} {'now us':>9s} {'record':>9s} {'change':>7s} {'ref us':>9s} "
           f"{'ratio':>7s} {'thresh':>6s} {'catches':>7s} {'MB':>7s} {'TB/s':>5s} {'roof%':>5s}")
    lines = [header(run), hdr, "-" * len(hdr)]
    for r in rows:
        lines.append(f"{r.kernel:{kw}s} {r.cell:{cw}s} {r.status:11s} {_f(r.now_us, '9.2f')} {_f(r.base_us, '9.2f')} "
                     f"{_f(r.change, '+7.1%')} {_f(r.ref_us, '9.2f')} {_f(r.ratio, '7.4f')} {_f(r.threshold, '6.1%')} "
                     f"{_f(r.catches, '7.1%')} {_f(r.bytes / 1e6 if r.bytes else None, '7.1f')} {_f(r.tbs, '5.2f')} "
                     f"{_f(r.roofline_pct, '5.0f')}")
    for r in rows:
        if r.status in ("slower", "faster", "moved", "error", "no-baseline"):
            lines.append(f"  {r.status}: {r.message.splitlines()[0][:400]}")
    lines += [f"  {n}" for n in run.notes]
    return lines


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def markdown(run) -> str:
    by_kernel: dict[str, list[CellResult]] = {}
    for r in run.rows():
        by_kernel.setdefault(r.kernel, []).append(r)
    lines = [f"## {header(run)}", ""]
    for kernel, rows in by_kernel.items():
        bad = sum(r.fail for r in rows)
        lines += [f"### {kernel}: {'**' + str(bad) + ' failing**' if bad else 'no failure'}", "",
                  "| cell | context | record us | now us | change | reference us | ratio | threshold | verdict | "
                  "TB/s | % roofline |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r.cell} | {r.context or '-'} | {_f(r.base_us, '.2f')} | {_f(r.now_us, '.2f')} | "
                         f"{_pct(r.change)} | {_f(r.ref_us, '.2f')} | {_f(r.ratio, '.4f')} | "
                         f"{'-' if r.threshold is None else f'{r.threshold:.1%}'} | "
                         f"{'**' + r.status + '**' if r.fail else r.status} | {_f(r.tbs, '.2f')} | "
                         f"{_f(r.roofline_pct, '.0f')} |")
        msgs = [r for r in rows if r.status in ("slower", "faster", "moved", "error", "no-baseline")]
        lines += [""] + [f"- {r.message.splitlines()[0][:600]}" for r in msgs] + ([""] if msgs else [])
    lines += [f"- {n}" for n in run.notes]
    return "\n".join(lines) + "\n"


def write(run, folder) -> list[pathlib.Path]:
    """perf.md and perf.json (the rows, with the device and the roofline) into `folder`."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    info = run.timing.device_info() if run.timing is not None else {}
    doc = {"mode": run.mode, "gpu_class": run.gpu_class, "device": info, "notes": run.notes,
           "reference": run.reference.spec if run.reference is not None else None,
           "rows": [r.to_dict() for r in run.rows()]}
    md, js = folder / "perf.md", folder / "perf.json"
    md.write_text(markdown(run))
    js.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return [md, js]

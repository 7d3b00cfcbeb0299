"""The conformance report: JSON for machines, Markdown for a CI job summary.

Rows come from every conformance test of the run (parity, CUDA-graph replay, determinism,
batch invariance, perf, ...), one per (test, kernel, case). The Markdown puts failures first,
each with its reproduce line, then a per-kernel summary and the environment (versions, GPU
class, kernel specs, ledgers); the full matrix follows in a collapsed section.

While the run goes, PATH.partial.jsonl gets one line per test as it starts ({"started":
nodeid}) and one per finished row, flushed as written: a run that is killed (a CI limit, a
hung kernel under --isolation=none) still leaves its results, and the tests that started but
never finished name what it was stuck on. A run that ends writes PATH.json / PATH.md and
removes the partial file.
"""
from __future__ import annotations

import json
import pathlib
import platform
import re
from collections import Counter
from typing import Optional, Sequence

BAD = ("failed", "error", "xpassed")
_ICON = {"passed": "pass", "failed": "**FAIL**", "error": "**ERROR**", "skipped": "skip",
         "xfailed": "xfail", "xpassed": "**XPASS**", "quarantined": "quarantine"}


def _reason(report) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple):
        return str(lr[2]).replace("Skipped: ", "")
    text = getattr(report, "longreprtext", "") or str(lr or "")
    return text.strip()


def _clip(text: str, head: int = 1500, tail: int = 2500) -> str:
    """A failure's text for a row: whole up to head + tail characters, else both ends - the
    head holds the verdict (a fuzz find's 'shrunk to ...'), the tail a traceback's error."""
    return text if len(text) <= head + tail else f"{text[:head]}\n...\n{text[-tail:]}"


XPASS_STRICT = "[XPASS(strict)]"  # how pytest words a strict xfail that passed: a failed call report


def strict_xpass_entry(report) -> Optional[str]:
    """The ledger entry's text (the xfail reason) of a test that passed where a strict xfail
    expected a failure; None for any other report."""
    text = str(report.longrepr) if report.failed else ""
    return text.splitlines()[0][len(XPASS_STRICT):].strip() if text.startswith(XPASS_STRICT) else None


def row_from_report(report, row: dict) -> Optional[dict]:
    """One report row from a test report and the row its item carried (parameters, and the
    result fields where the test ran a case through the door)."""
    if report.when == "setup" and report.skipped:
        reason = _reason(report)
        row.update(status="quarantined" if reason.startswith("quarantined") else "skipped", message=reason)
        return row
    if report.when == "setup" and report.failed:
        row.update(status="error", message=_clip(_reason(report)))
        return row
    if report.when != "call":
        return None
    entry = strict_xpass_entry(report)
    if hasattr(report, "wasxfail"):
        row["status"] = "xfailed" if report.skipped else "xpassed"
        row["ledger_entry"] = report.wasxfail  # the accepting entry's reason, issue, file and line
    elif entry is not None:
        row.update(status="xpassed", ledger_entry=entry)
        row["message"] = (f"passed but the ledger expects a failure ({entry}); remove or narrow the "
                          f"ledger entry | {row.get('message', '')}")
    elif report.skipped:
        row.update(status="skipped", message=_reason(report))
    else:
        row["status"] = "passed" if report.passed else "failed"
        if report.failed and "message" not in row:
            row["message"] = _clip(_reason(report))
    return row


def kernels_without_cases(rows: list[dict], kernels: list[str]) -> list[str]:
    """Kernels whose every parity row was skipped: a run that tested nothing for them."""
    out = []
    for k in kernels:
        parity = _parity_rows(rows, k)
        if parity and all(r["status"] in ("skipped", "quarantined") for r in parity):
            out.append(k)
    return out


def _parity_rows(rows: list[dict], kernel: str) -> list[dict]:
    return [r for r in rows if r["kernel"] == kernel and r["test"].endswith("test_parity")]


def parity_coverage(rows: list[dict], kernel: str) -> Optional[str]:
    """How much of the case set `kernel`'s parity test ran, and the capabilities the rest needed
    (the Capabilities fields its skip reasons name, most cases first): a green run that skipped
    most of the set says so. None where the run had no parity rows for it."""
    parity = _parity_rows(rows, kernel)
    if not parity:
        return None
    skipped = [r for r in parity if r["status"] in ("skipped", "quarantined")]
    line = f"{kernel}: ran {len(parity) - len(skipped)} of {len(parity)} parity cases"
    if not skipped:
        return line
    fields = Counter(f for r in skipped for f in set(re.findall(r"\[([a-z_]+)\](?:,|$)", r.get("message", ""))))
    quarantined = sum(r["status"] == "quarantined" for r in skipped)
    why = [f"{n} need{'s' if n == 1 else ''} {f}" for f, n in fields.most_common()]
    if quarantined:
        why.append(f"{quarantined} quarantined")
    return f"{line}; {len(skipped)} skipped" + (f" ({', '.join(why)})" if why else "")


def environment(state) -> dict:
    env = {"python": platform.python_version(), "platform": platform.platform(terse=True),
           "device": state.device, "gpu_class": state.gpu_class, "case_set": state.case_set,
           "profile": state.profile, "ledgers": list(state.ledger_paths),
           "kernels": {k.name: {"spec": k.spec, "caps": k.kernel.caps.describe(),
                                "library": getattr(k.kernel, "library_version", None)} for k in state.kernels}}
    try:
        from importlib.metadata import version
        env["decode_conformance"] = version("decode-conformance")
    except Exception:
        env["decode_conformance"] = "not installed (checkout)"
    try:
        import torch
        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        env["hip"] = getattr(torch.version, "hip", None)
        if state.device != "cpu" and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = props.name
            env["driver"] = _driver_version()
    except Exception as e:  # the report must still be written
        env["torch"] = f"unavailable: {e}"
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception as e:
        env["triton"] = f"unavailable: {e}"
    return env


def _driver_version() -> Optional[str]:
    try:
        import subprocess
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except Exception:
        return None


def _fmt(x, spec=".4g"):
    return "" if x is None else format(x, spec)


def markdown(rows: list[dict], env: dict, empty: list[str], ledger_warnings: Sequence[str] = ()) -> str:
    counts = Counter(r["status"] for r in rows)
    bad = [r for r in rows if r["status"] in BAD]
    lines = [f"# Decode conformance: {env.get('gpu_class', '?')} ({env.get('device', '?')}), "
             f"case set `{env.get('case_set', '?')}`", "",
             " | ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no conformance tests ran", ""]
    for k in empty:
        lines.append(f"> **Every parity case of `{k}` was skipped: nothing was tested.**")
    for w in ledger_warnings:
        lines.append(f"> ledger warning: {w}")
    if bad:
        split = ", ".join(f"{v} {k}" for k, v in sorted(Counter(r["status"] for r in bad).items()))
        lines += ["", f"## Failures ({len(bad)}: {split})", ""]
        for r in bad:
            what = f"`{r['case']}`" if r.get("case") else f"`{r['test']}{r.get('param', '')}`"
            msg = (r.get("message") or "").strip().replace("\n", "\n  ")
            lines.append(f"- **{r['kernel']}** {what} ({r['test']}): {_ICON.get(r['status'], r['status'])}")
            lines.append(f"  {msg}")
            if r.get("repro"):
                lines.append(f"  - reproduce: `{r['repro']}`")
    lines += ["", "## Per kernel and test", "", "| kernel | test | passed | failed | error | skipped | xfail | xpass |",
              "|---|---|---|---|---|---|---|---|"]
    for (k, t) in sorted({(r["kernel"], r["test"]) for r in rows}):
        c = Counter(r["status"] for r in rows if r["kernel"] == k and r["test"] == t)
        lines.append(f"| {k} | {t} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped'] + c['quarantined']} "
                     f"| {c['xfailed']} | {c['xpassed']} |")
    lines += ["", "## Environment", ""]
    for key in ("decode_conformance", "torch", "triton", "cuda", "hip", "driver", "gpu", "python", "platform",
                "profile", "ledgers"):
        if env.get(key) not in (None, "", []):
            lines.append(f"- {key}: {env[key]}")
    for name, k in env.get("kernels", {}).items():
        lines.append(f"- kernel `{name}`: `{k['spec']}` ({k['caps']})")
    lines += ["", "<details><summary>All rows</summary>", "",
              "| kernel | test | case | status | worst row / budget | LSE / budget | cosine | seconds | note |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["kernel"], r["test"], r.get("case", ""))):
        v = r.get("verdict") or {}
        lines.append(f"| {r['kernel']} | {r['test']} | `{r.get('case') or r.get('param', '')}` | "
                     f"{_ICON.get(r['status'], r['status'])} | {_fmt(v.get('worst_row_ratio'))} | "
                     f"{_fmt(v.get('lse_ratio'))} | {_fmt(v.get('cosine'), '.6f')} | "
                     f"{_fmt(r.get('seconds'), '.3g')} | {_cell(_note(r))} |")
    lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def _note(row: dict) -> str:
    """What a reader of one row needs beside its numbers: why it was skipped, which ledger entry
    accepted it, or the kernel's own note."""
    if row["status"] in ("skipped", "quarantined"):
        return row.get("message", "")
    if row.get("ledger_entry"):
        return f"ledger: {row['ledger_entry']}"
    return row.get("kernel_note", "")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def report_base(path: str) -> pathlib.Path:
    base = pathlib.Path(path)
    return base.with_suffix("") if base.suffix in (".json", ".md") else base


class PartialReport:
    """PATH.partial.jsonl, appended line by line on the controller while the run goes."""

    def __init__(self, path: str):
        self.path = report_base(path).with_suffix(".partial.jsonl")
        self._f = None

    def _write(self, obj: dict) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w", buffering=1)
        self._f.write(json.dumps(obj) + "\n")
        self._f.flush()

    def started(self, nodeid: str) -> None:
        self._write({"started": nodeid})

    def row(self, nodeid: str, row: dict) -> None:
        self._write({"row": row, "nodeid": nodeid})

    def finish(self) -> None:
        """The full report is written: the partial one is no longer needed."""
        if self._f is not None:
            self._f.close()
            self._f = None
        self.path.unlink(missing_ok=True)


def read_partial(path) -> tuple[list[dict], list[str]]:
    """(rows, node ids started but with no row yet) from a partial report."""
    rows, started = [], {}
    for line in pathlib.Path(path).read_text().splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:  # the last line of a killed run may be cut
            continue
        if "started" in obj:
            started[obj["started"]] = True
        elif "row" in obj:
            rows.append(obj["row"])
            started.pop(obj.get("nodeid", ""), None)
    return rows, list(started)


def write_report(path: str, rows: list[dict], state, empty: list[str],
                 ledger_warnings: Sequence[str] = ()) -> tuple[pathlib.Path, pathlib.Path]:
    base = report_base(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    jp, mp = base.with_suffix(".json"), base.with_suffix(".md")
    env = environment(state)
    rows = sorted(rows, key=lambda r: (r["status"] not in BAD, r["kernel"], r["test"], r.get("case", "")))
    jp.write_text(json.dumps({"meta": env, "kernels_without_cases": empty, "ledger_warnings": list(ledger_warnings),
                              "results": rows}, indent=1))
    mp.write_text(markdown(rows, env, empty, ledger_warnings))
    return jp.resolve(), mp.resolve()

"""The conformance report: JSON for machines, a Markdown matrix for a CI job summary."""
from __future__ import annotations

import json
import pathlib
from collections import Counter

_ICON = {"passed": "pass", "failed": "**FAIL**", "error": "**ERROR**", "skipped": "skip",
         "xfailed": "xfail", "xpassed": "**XPASS**", "quarantined": "quarantine"}


def _fmt(x, spec=".4g"):
    return "" if x is None else format(x, spec)


def markdown(results: list[dict], meta: dict) -> str:
    counts = Counter(r["status"] for r in results)
    kernels = sorted({r["kernel"] for r in results})
    lines = [f"# Decode conformance: {meta.get('gpu_class', '?')} ({meta.get('device', '?')}), "
             f"case set `{meta.get('case_set', '?')}`", "",
             " | ".join(f"{k}: {v}" for k, v in sorted(counts.items())), "",
             "| kernel | passed | failed | error | skipped | xfail | xpass | quarantined |",
             "|---|---|---|---|---|---|---|---|"]
    for k in kernels:
        c = Counter(r["status"] for r in results if r["kernel"] == k)
        lines.append(f"| {k} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} | {c['xfailed']} | "
                     f"{c['xpassed']} | {c['quarantined']} |")
    lines += ["", "| kernel | case | status | cosine | worst row err | budget ratio | lse err |",
              "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["kernel"], r["case"])):
        v = r.get("verdict") or {}
        lines.append(f"| {r['kernel']} | `{r['case']}` | {_ICON.get(r['status'], r['status'])} | "
                     f"{_fmt(v.get('cosine'), '.6f')} | {_fmt(v.get('worst_row_err'))} | "
                     f"{_fmt(v.get('budget_ratio'))} | {_fmt(v.get('lse_err'))} |")
    bad = [r for r in results if r["status"] in ("failed", "error", "xpassed")]
    if bad:
        lines += ["", "## Failures", ""]
        for r in bad:
            lines.append(f"- **{r['kernel']}** `{r['case']}`: {r.get('message', '')}")
            if r.get("repro"):
                lines.append(f"  - reproduce: `{r['repro']}`")
    return "\n".join(lines) + "\n"


def write_report(path: str, results: list[dict], meta: dict) -> tuple[pathlib.Path, pathlib.Path]:
    base = pathlib.Path(path)
    if base.suffix in (".json", ".md"):
        base = base.with_suffix("")
    base.parent.mkdir(parents=True, exist_ok=True)
    jp, mp = base.with_suffix(".json"), base.with_suffix(".md")
    jp.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    mp.write_text(markdown(results, meta))
    return jp, mp

"""The conformance matrix: conformance-report JSON files (`--conformance-report=...`) in, a
Markdown table out - one row per kernel and its library version, one column per case family,
each cell pass / FAIL / skip with the reason.

    python benchmarks/conformance_matrix.py OUT/matrix/*.json -o docs/conformance-matrix.md
    python benchmarks/conformance_matrix.py OUT/a.json OUT/b.partial.jsonl --library flashinfer=0.7.2.post1 -o ...

A case's families come from its id, which names its axes (docs/cases.md: dtype, layout,
`win`, `softcap`, `sinks`, `mla`, `B<n>[lengths]`, `pool<N>M`); graph replay, determinism and
batch invariance are the rows of their own tests. The part of an existing output file below
the GENERATED_END marker (the triage) is kept.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from collections import Counter, defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GENERATED_END = "<!-- end of generated matrix: triage below is kept by benchmarks/conformance_matrix.py -->"
PARITY_TESTS = ("test_parity",)
TEST_FAMILIES = {"test_cuda_graph": "graph replay", "test_determinism": "determinism",
                 "test_batch_invariance": "batch invariance"}
COLUMNS = ("bf16", "fp16", "e4m3", "e5m2", "contig", "paged", "kv2", "window", "soft-cap", "sinks", "MLA",
           "0-length rows", "2^31 pools", "graph replay", "determinism", "batch invariance")
_LENS = re.compile(r"^B\d+\[(.*)\]$")


def case_families(case_id: str) -> list[str]:
    """The matrix columns a parity case belongs to, from the axes its id names."""
    tokens = case_id.split("-")
    fam = [t for t in tokens if t in ("bf16", "fp16", "e4m3", "e5m2", "contig", "kv2")]
    if any(t.startswith("paged") for t in tokens):
        fam.append("paged")
    for t in tokens:
        if re.fullmatch(r"win\d+x?", t):
            fam.append("window")
        elif t.startswith("softcap"):
            fam.append("soft-cap")
        elif t == "sinks":
            fam.append("sinks")
        elif t == "mla":
            fam.append("MLA")
        elif re.fullmatch(r"pool\d+M", t):
            fam.append("2^31 pools")
        elif _LENS.match(t) and "0" in _LENS.match(t).group(1).split(","):
            fam.append("0-length rows")
    return fam


def families(row: dict) -> list[str]:
    test_file = row["test"].split("::")[0]  # report rows name tests "<file stem>::<function>"
    if test_file in TEST_FAMILIES:
        return [TEST_FAMILIES[test_file]]
    if test_file in PARITY_TESTS and row.get("case"):
        return case_families(row["case"])
    return []


def _short(reason: str) -> str:
    reason = reason.split(" lacks: ", 1)[-1]
    return reason if len(reason) <= 60 else reason[:57] + "..."


def cell(rows: list[dict]) -> str:
    if not rows:
        return "-"
    st = Counter(r["status"] for r in rows)
    bad = st["failed"] + st["error"] + st["xpassed"]
    ran = st["passed"] + bad + st["xfailed"]
    if bad:
        return f"**FAIL** {bad}/{ran}"
    if ran:
        text = f"pass {st['passed']}" + (f" (xfail {st['xfailed']})" if st["xfailed"] else "")
        return text + (f", skip {st['skipped']}" if st["skipped"] else "")
    reasons = Counter(_short(r.get("message", "")) for r in rows)
    return "skip: " + reasons.most_common(1)[0][0]


def load(paths) -> tuple[list[dict], dict]:
    rows, kernels = [], {}
    for p in paths:
        if str(p).endswith(".partial.jsonl"):  # a run that was stopped: its rows so far, and what was in flight
            from decode_conformance.report import read_partial
            got, in_flight = read_partial(p)
            rows += got
            for nodeid in in_flight:
                print(f"{p}: started, no result (the run was stopped here): {nodeid}", file=sys.stderr)
            continue
        data = json.loads(pathlib.Path(p).read_text())
        rows += data.get("results", [])
        kernels.update(data.get("meta", {}).get("kernels", {}))
        kernels.setdefault("_meta", data.get("meta", {}))
    return rows, kernels


def render(rows: list[dict], kernels: dict) -> str:
    meta = kernels.pop("_meta", {})
    by = defaultdict(list)
    for r in rows:
        for f in families(r):
            by[(r["kernel"], f)].append(r)
    names = sorted({r["kernel"] for r in rows})
    lines = [f"Generated from one run: {meta.get('gpu', meta.get('device', '?'))}, torch {meta.get('torch', '?')}, "
             f"CUDA {meta.get('cuda', '?')}, triton {meta.get('triton', '?')}, case set {meta.get('case_set', '?')}.",
             "", "| kernel | library | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for k in names:
        lib = (kernels.get(k) or {}).get("library") or "-"
        lines.append(f"| `{k}` | {lib} | " + " | ".join(cell(by[(k, c)]) for c in COLUMNS) + " |")
    failures = [r for r in rows if r["status"] in ("failed", "error", "xpassed")]
    lines += ["", f"{len(failures)} failing rows; each is triaged below (kernel defect with its smallest case "
                  "and upstream report, or our mistake, fixed)."]
    for r in failures:
        lines.append(f"- `{r['kernel']}` {r['test']} `{r.get('case') or r.get('param', '')}`: "
                     f"{(r.get('message') or '').splitlines()[0][:200] if r.get('message') else ''}"
                     + (f"  \n  reproduce: `{r['repro']}`" if r.get("repro") else ""))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="conformance report JSON files (or a stopped run's PATH.partial.jsonl)")
    ap.add_argument("--library", action="append", default=[], metavar="PREFIX=VERSION",
                    help="the library version of kernels whose name starts with PREFIX, where the reports do "
                         "not name one (a .partial.jsonl has no metadata): e.g. flashinfer=0.7.2.post1")
    ap.add_argument("-o", "--output", help="Markdown file to write (default: stdout); the part below the "
                                           "GENERATED_END marker of an existing file is kept")
    a = ap.parse_args(argv)
    rows, kernels = load(a.reports)
    for item in a.library:
        prefix, eq, ver = item.partition("=")
        if not eq or not prefix or not ver:
            ap.error(f"--library: expected PREFIX=VERSION, got {item!r}")
        for name in {r["kernel"] for r in rows if r["kernel"].startswith(prefix)}:
            if not (kernels.get(name) or {}).get("library"):
                kernels.setdefault(name, {})["library"] = f"{ver} (given)"
    table = render(rows, kernels)
    if not a.output:
        print(table)
        return 0
    out = pathlib.Path(a.output)
    old = out.read_text() if out.exists() else ""
    head, mark, tail = old.partition("<!-- matrix -->")
    if not mark:
        head, tail = "# Conformance matrix\n\n", ""
    kept = tail.split(GENERATED_END, 1)[1] if GENERATED_END in tail else "\n"
    out.write_text(head + "<!-- matrix -->\n" + table + GENERATED_END + kept)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

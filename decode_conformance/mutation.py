"""Mutation testing of the suite itself: plant a realistic bug in a copy of a shipped kernel
and check that the parity cases catch it.

A mutant is data (fixtures/mutants.toml): the kernel module, an exact source snippet that
must occur exactly once, and its replacement. Loading one copies `kernels/` to a temporary
package with that single edit (Triton's JIT reads kernel source from files, so the copy is
real files) and builds the kernel from the copy's registry.

    python -m decode_conformance.mutation            # rebuild kill_map.json/.md + smoke_set.txt
    python -m decode_conformance.mutation --jobs 2   # ... two mutants at a time
    python -m decode_conformance.mutation --only NAME [NAME ...]   # rebuild these rows only
    python -m decode_conformance.mutation --report   # print the stored map (and rewrite kill_map.md)
    python -m decode_conformance.mutation --report --explain --jobs 2   # ... with first-killer messages

Each mutant runs in its own subprocess (`--worker`), so a mutant that kills the interpreter
(a segfault on a wild address) or hangs only ends that subprocess: the case it was running
counts as a kill ("crashed" / "hung") and a fresh subprocess goes on with the next case.
"""
from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import re
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS_DIR = ROOT / "kernels"
MUTANTS_FILE = ROOT / "fixtures" / "mutants.toml"
KILL_MAP_FILE = ROOT / "fixtures" / "kill_map.json"
SMOKE_FILE = ROOT / "fixtures" / "smoke_set.txt"
KILL_REPORT_FILE = ROOT / "fixtures" / "kill_map.md"
REGENERATE = "python -m decode_conformance.mutation --jobs 2"
# A case that gives no progress for this long counts as a kill ("hung"), its worker replaced.
CASE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Mutant:
    name: str
    kernel: str  # registry factory name of the kernel that carries the bug
    module: str  # file in kernels/ (without .py)
    find: str
    replace: str
    description: str

    def source(self) -> str:
        return (KERNELS_DIR / f"{self.module}.py").read_text()

    def occurrences(self) -> int:
        return self.source().count(self.find)


def load_mutants(path: pathlib.Path = MUTANTS_FILE) -> list[Mutant]:
    data = tomllib.loads(path.read_text())
    out = []
    for i, row in enumerate(data.get("mutant", [])):
        missing = {"name", "kernel", "module", "find", "replace", "description"} - set(row)
        if missing:
            raise ValueError(f"{path}: mutant {i}: missing fields {sorted(missing)}")
        out.append(Mutant(**{k: row[k] for k in ("name", "kernel", "module", "find", "replace", "description")}))
    names = [m.name for m in out]
    if len(names) != len(set(names)):
        raise ValueError(f"{path}: duplicate mutant names")
    return out


_LOADED: dict[str, object] = {}
_TMP_ENV = "DECODE_CONFORMANCE_MUTANT_TMP"
_TMP = None


def mutant_kernel(m: Mutant):
    """The kernel object built from a copy of kernels/ with the mutant's edit applied."""
    global _TMP
    if m.name in _LOADED:
        return _LOADED[m.name]
    n = m.occurrences()
    if n != 1:
        raise ValueError(f"mutant {m.name}: snippet occurs {n} times in kernels/{m.module}.py (expected exactly 1); "
                         "update fixtures/mutants.toml")
    if _TMP is None:
        # Under run_isolated: inside the parent's scratch folder, removed even if this worker crashes.
        _TMP = tempfile.mkdtemp(prefix="dc_mutants_", dir=os.environ.get(_TMP_ENV) or None)
        sys.path.insert(0, _TMP)
        atexit.register(shutil.rmtree, _TMP, True)
    pkg = "dc_mutant_" + "".join(ch if ch.isalnum() else "_" for ch in m.name)
    dest = pathlib.Path(_TMP) / pkg
    shutil.copytree(KERNELS_DIR, dest, ignore=shutil.ignore_patterns("__pycache__"))
    target = dest / f"{m.module}.py"
    target.write_text(m.source().replace(m.find, m.replace))
    importlib.invalidate_caches()
    registry = importlib.import_module(f"{pkg}.registry")
    kernel = getattr(registry, m.kernel)()
    kernel.name = f"mutant-{m.name}"
    _LOADED[m.name] = kernel
    return kernel


def killers(m: Mutant, cases: Iterable, device: str = "cpu", stop_at_first: bool = False) -> list[str]:
    """Ids of the cases on which the mutant fails (or raises)."""
    from .runner import run_case
    kernel = mutant_kernel(m)
    out = []
    for case in cases:
        if kernel.caps.missing_for(case, "cpu" if device == "cpu" else "cuda"):
            continue
        if not run_case(kernel, case, device).ok:
            out.append(case.id)
            if stop_at_first:
                break
    return out


def greedy_cover(kill_map: dict[str, list[str]], order: list[str]) -> list[str]:
    """A small set of case ids that kills every mutant (greedy set cover; ties broken by
    the parity set's order, so the result is deterministic)."""
    rank = {cid: i for i, cid in enumerate(order)}
    alive = {m for m, ks in kill_map.items() if ks}
    chosen = []
    while alive:
        best = max(order, key=lambda c: (sum(1 for m in alive if c in kill_map[m]), -rank[c]))
        gain = {m for m in alive if best in kill_map[m]}
        if not gain:
            break
        chosen.append(best)
        alive -= gain
    return chosen


def minimum_cover_size(kill_map: dict[str, list[str]]) -> int:
    """The exact size of the smallest case set killing every killed mutant (branch and bound
    on the mutant with the fewest killers): tells whether the greedy smoke set is optimal."""
    sets = {m: frozenset(ks) for m, ks in kill_map.items() if ks}
    best = [len(greedy_cover(kill_map, sorted({k for ks in sets.values() for k in ks})))]

    def rec(alive: frozenset, depth: int) -> None:
        if not alive:
            best[0] = min(best[0], depth)
            return
        if depth + 1 >= best[0]:
            return
        m = min(alive, key=lambda x: len(sets[x]))
        for c in sorted(sets[m]):
            rec(frozenset(x for x in alive if c not in sets[x]), depth + 1)

    rec(frozenset(sets), 0)
    return best[0]


def _prepare_interpreter():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from . import _paths, interpreter_compat
    _paths.alias_kernels()
    interpreter_compat.install()


def parity_cases() -> list:
    from .case_sets import build_set
    return build_set("parity", "interpreter")


# ---- one mutant in a subprocess -------------------------------------------------------
def _worker(name: str, cases_file: str, progress: str, stop_at_first: bool) -> int:
    """Run the parity cases listed in `cases_file` (ids, in that order) against one mutant,
    appending one line per event to `progress`: `start i`, `pass i`, `skip i`,
    `fail i <message>`, and `done` at the end."""
    _prepare_interpreter()
    import torch
    torch.set_num_threads(1)
    from .runner import run_case
    m = {x.name: x for x in load_mutants()}[name]
    kernel = mutant_kernel(m)
    by_id = {c.id: c for c in parity_cases()}
    ids = pathlib.Path(cases_file).read_text().split()
    with open(progress, "a", buffering=1) as f:
        for i, cid in enumerate(ids):
            case = by_id[cid]
            if kernel.caps.missing_for(case, "cpu"):
                f.write(f"skip {i}\n")
                continue
            f.write(f"start {i}\n")
            f.flush()
            res = run_case(kernel, case, "cpu")
            if res.ok:
                f.write(f"pass {i}\n")
            else:
                f.write(f"fail {i} {' '.join(res.message.split())[:300]}\n")
                if stop_at_first:
                    break
        f.write("done\n")
    return 0


def _describe_exit(code: Optional[int]) -> str:
    if code is not None and code < 0:
        import signal
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def run_isolated(m: Mutant, case_ids: list[str], stop_at_first: bool = False,
                 case_timeout: float = CASE_TIMEOUT_S) -> dict[str, str]:
    """{case id: failure message} for the cases of `case_ids` (parity ids) that kill the
    mutant, run in a subprocess. A case that crashes the subprocess (a segfault on a wild
    address) or gives no progress for `case_timeout` s kills the mutant, and a fresh
    subprocess goes on with the next case. stop_at_first: stop at the first kill."""
    kills: dict[str, str] = {}
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    remaining = list(case_ids)
    with tempfile.TemporaryDirectory(prefix="dc_mutant_run_") as tmp:
        env[_TMP_ENV] = tmp
        attempt = 0
        while remaining:
            attempt += 1
            ids_file = pathlib.Path(tmp) / f"cases{attempt}.txt"
            ids_file.write_text("\n".join(remaining) + "\n")
            progress = pathlib.Path(tmp) / f"progress{attempt}.txt"
            progress.touch()
            log = pathlib.Path(tmp) / f"log{attempt}.txt"
            cmd = [sys.executable, "-m", "decode_conformance.mutation", "--worker", m.name,
                   "--cases", str(ids_file), "--progress", str(progress)]
            if stop_at_first:
                cmd.append("--stop-at-first")
            hung = False
            with open(log, "wb") as logf:
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT)
                size, last = 0, time.monotonic()
                while proc.poll() is None:
                    time.sleep(0.1)
                    now = progress.stat().st_size
                    if now != size:
                        size, last = now, time.monotonic()
                    elif time.monotonic() - last > case_timeout:
                        proc.kill()
                        proc.wait()
                        hung = True
            running, done = None, False
            for ln in progress.read_text().splitlines():
                word, _, rest = ln.partition(" ")
                if word == "done":
                    done = True
                    continue
                idx, _, msg = rest.partition(" ")
                i = int(idx)
                if word == "start":
                    running = i
                    continue
                running = None
                if word == "fail":
                    kills[remaining[i]] = msg
            if done:
                break
            if running is None:  # died outside a case: a broken mutant or worker, not a kill
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"mutant {m.name}: worker exited with {proc.returncode} outside a case:\n{tail}")
            kills[remaining[running]] = (f"hung: no result within {case_timeout:.0f} s" if hung else
                                         f"crashed: worker exited with {_describe_exit(proc.returncode)}")
            if stop_at_first:
                break
            remaining = remaining[running + 1:]
    return {cid: kills[cid] for cid in case_ids if cid in kills}


def build_kill_map(names: Optional[list[str]] = None, jobs: int = 1) -> tuple[dict, dict]:
    """({mutant: [killer ids in parity order]}, {mutant: {killer id: message}})."""
    case_ids = [c.id for c in parity_cases()]
    todo = [m for m in load_mutants() if not names or m.name in names]
    if names:
        unknown = set(names) - {m.name for m in todo}
        if unknown:
            raise SystemExit(f"--only: no such mutants {sorted(unknown)}")

    def one(m):
        t0 = time.monotonic()
        kills = run_isolated(m, case_ids)
        print(f"{m.name}: killed by {len(kills)} cases ({time.monotonic() - t0:.0f} s)", flush=True)
        return m.name, kills

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = dict(pool.map(one, todo))
    return ({n: list(k) for n, k in results.items()}, results)


# ---- report ---------------------------------------------------------------------------
def report_table(kill_map: dict, mutants: Optional[list[Mutant]] = None, smoke: Optional[list[str]] = None) -> str:
    """Markdown: mutant -> kernel / module -> number of killing cases -> first 3 killers
    (those in the smoke set in bold)."""
    mutants = mutants if mutants is not None else load_mutants()
    smoke_set = set(smoke or [])
    rows = ["| mutant | kernel / module | kills | first killers (smoke cases in bold) | smoke case that kills it |",
            "|---|---|---:|---|---|"]
    for m in mutants:
        ks = kill_map.get(m.name)
        if ks is None:
            rows.append(f"| {m.name} | {m.kernel} / {m.module} | - | not in the kill map | |")
            continue
        cells = [f"**`{k}`**" if k in smoke_set else f"`{k}`" for k in ks[:3]]
        if len(ks) > 3:
            cells[-1] += f" (+{len(ks) - 3} more)"
        in_smoke = [k for k in (smoke or []) if k in ks]
        rows.append(f"| {m.name} | {m.kernel} / {m.module} | {len(ks)} | {'<br>'.join(cells) or 'SURVIVES'} | "
                    f"{f'`{in_smoke[0]}`' if in_smoke else '-'} |")
    return "\n".join(rows) + "\n"


_MSG_LINE = re.compile(r"^- \*\*(?P<name>[^*]+)\*\* on `(?P<case>[^`]+)`: (?P<msg>.*)$")


def _stored_messages() -> dict[str, dict[str, str]]:
    """First-killer messages of the current kill_map.md, so `--report` keeps them."""
    out: dict[str, dict[str, str]] = {}
    if KILL_REPORT_FILE.exists():
        for ln in KILL_REPORT_FILE.read_text().splitlines():
            mt = _MSG_LINE.match(ln)
            if mt:
                out.setdefault(mt["name"], {})[mt["case"]] = mt["msg"]
    return out


def first_killer_messages(kill_map: dict, jobs: int = 1) -> dict[str, dict[str, str]]:
    """Re-run each mutant on its first killer only (in a subprocess) for the failure message."""
    todo = [m for m in load_mutants() if kill_map.get(m.name)]

    def one(m):
        return m.name, run_isolated(m, kill_map[m.name][:1])

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(one, todo))


def write_report(kill_map: dict, smoke: list[str], messages: Optional[dict] = None) -> str:
    """Write fixtures/kill_map.md. Without `messages`, the first-killer messages already in
    the file are kept where the first killer is unchanged."""
    mutants = load_mutants()
    if messages is None:
        messages = _stored_messages()
    by_case: dict[str, int] = {}
    for ks in kill_map.values():
        for k in ks:
            by_case[k] = by_case.get(k, 0) + 1
    order = [c.id for c in parity_cases()]
    dead = [c for c in order if c not in by_case]
    text = ["# Mutation kill map", "",
            f"Generated by `{REGENERATE}` from fixtures/mutants.toml: each mutant is a copy of a",
            "shipped kernel with one planted bug, run against the interpreter parity set. A case",
            "kills a mutant when it fails on it (wrong result, NaN, exception, crash or hang).",
            "", f"{len(mutants)} mutants, {sum(1 for m in mutants if kill_map.get(m.name))} killed; "
            f"{len(order)} parity cases, {len(order) - len(dead)} kill at least one mutant; "
            f"smoke set: {len(smoke)} cases (fixtures/smoke_set.txt; greedy cover, the exact minimum "
            f"is {minimum_cover_size(kill_map)}).", "",
            report_table(kill_map, mutants, smoke)]
    if messages:
        text += ["## How the first killer fails each mutant", ""]
        for m in mutants:
            ks = kill_map.get(m.name) or []
            if ks and m.name in messages and ks[0] in messages[m.name]:
                text.append(f"- **{m.name}** on `{ks[0]}`: {messages[m.name][ks[0]][:200]}")
        text.append("")
    text += ["## Cases that kill no mutant", "",
             "See fixtures/dead_weight.md for why each is kept.", ""]
    text += [f"- `{c}`" for c in dead] or ["(none)"]
    out = "\n".join(text) + "\n"
    KILL_REPORT_FILE.write_text(out)
    return out


def print_table(kill_map: dict, smoke: list[str]) -> None:
    mutants = load_mutants()
    w = max(len(m.name) for m in mutants)
    print(f"{'mutant':<{w}}  kills  first killers")
    for m in mutants:
        ks = kill_map.get(m.name)
        n = "-" if ks is None else str(len(ks))
        print(f"{m.name:<{w}}  {n:>5}  {', '.join((ks or [])[:3])}")


def write_smoke(kill_map: dict) -> list[str]:
    order = [c.id for c in parity_cases()]
    smoke = greedy_cover(kill_map, order)
    SMOKE_FILE.write_text("# The smoke set: the smallest greedy set of parity cases that kills every mutant.\n"
                          f"# Generated by `{REGENERATE}`; checked by suites/selftest/test_mutants.py.\n"
                          + "".join(f"{c}\n" for c in smoke))
    return smoke


def read_smoke() -> list[str]:
    if not SMOKE_FILE.exists():
        return []
    return [ln.strip() for ln in SMOKE_FILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="rebuild these mutants' rows only")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at a time (one subprocess each)")
    ap.add_argument("--report", action="store_true",
                    help="print the stored kill map as a table and rewrite fixtures/kill_map.md; runs nothing")
    ap.add_argument("--explain", action="store_true",
                    help="with --report: re-run each mutant on its first killer for the failure message")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    ap.add_argument("--progress", help=argparse.SUPPRESS)
    ap.add_argument("--stop-at-first", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args.worker, args.cases, args.progress, args.stop_at_first)
    old = json.loads(KILL_MAP_FILE.read_text()) if KILL_MAP_FILE.exists() else {}
    if args.report:
        if not old:
            raise SystemExit(f"{KILL_MAP_FILE} is missing; build it with `{REGENERATE}`")
        smoke = read_smoke()
        write_report(old, smoke, first_killer_messages(old, args.jobs) if args.explain else None)
        print_table(old, smoke)
        return 0
    new, messages = build_kill_map(args.only, args.jobs)
    kill_map = {**old, **new} if args.only else new
    current = {m.name for m in load_mutants()}
    kill_map = {k: v for k, v in sorted(kill_map.items()) if k in current}
    KILL_MAP_FILE.write_text(json.dumps(kill_map, indent=1) + "\n")
    smoke = write_smoke(kill_map)
    write_report(kill_map, smoke, {**_stored_messages(), **messages} if args.only else messages)
    print_table(kill_map, smoke)
    survivors = [k for k, v in kill_map.items() if not v]
    print(f"{len(kill_map)} mutants, {len(survivors)} survivors {survivors}; smoke set {len(smoke)} cases")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())

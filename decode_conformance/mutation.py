"""Mutation testing of the suite itself: plant a realistic bug in a copy of a shipped kernel
and check that the parity cases catch it.

A mutant is data (fixtures/mutants.toml): the kernel module, an exact source snippet that
must occur exactly once, and its replacement. Loading one copies `kernels/` to a temporary
package with that single edit (Triton's JIT reads kernel source from files, so the copy is
real files) and builds the kernel from the copy's registry.

    python -m decode_conformance.mutation            # rebuild fixtures/kill_map.json + smoke_set.txt
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from typing import Iterable, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS_DIR = ROOT / "kernels"
MUTANTS_FILE = ROOT / "fixtures" / "mutants.toml"
KILL_MAP_FILE = ROOT / "fixtures" / "kill_map.json"
SMOKE_FILE = ROOT / "fixtures" / "smoke_set.txt"


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
        _TMP = tempfile.mkdtemp(prefix="dc_mutants_")
        sys.path.insert(0, _TMP)
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


def _prepare_interpreter():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from . import _paths, interpreter_compat
    _paths.alias_kernels()
    interpreter_compat.install()


def build_kill_map(names: Optional[list[str]] = None) -> dict:
    _prepare_interpreter()
    from .case_sets import build_set
    cases = build_set("parity", "interpreter")
    kill_map = {}
    for m in load_mutants():
        if names and m.name not in names:
            continue
        kill_map[m.name] = killers(m, cases)
        print(f"{m.name}: killed by {len(kill_map[m.name])} cases", flush=True)
    return kill_map


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", nargs="*", help="rebuild these mutants' rows only")
    args = ap.parse_args(argv)
    old = json.loads(KILL_MAP_FILE.read_text()) if KILL_MAP_FILE.exists() else {}
    new = build_kill_map(args.only)
    kill_map = {**old, **new} if args.only else new
    current = {m.name for m in load_mutants()}
    kill_map = {k: v for k, v in sorted(kill_map.items()) if k in current}
    KILL_MAP_FILE.write_text(json.dumps(kill_map, indent=1) + "\n")
    from .case_sets import build_set
    order = [c.id for c in build_set("parity", "interpreter")]
    smoke = greedy_cover(kill_map, order)
    SMOKE_FILE.write_text("# The smoke set: the smallest greedy set of parity cases that kills every mutant.\n"
                          "# Generated by `python -m decode_conformance.mutation`; checked by suites/selftest.\n"
                          + "".join(f"{c}\n" for c in smoke))
    survivors = [k for k, v in kill_map.items() if not v]
    print(f"{len(kill_map)} mutants, {len(survivors)} survivors {survivors}; smoke set {len(smoke)} cases")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Mutation testing of the suite itself: plant a realistic bug in a copy of a shipped kernel
and record what catches it - parity cases and named kernel-level tests.

A mutant is data (fixtures/mutants.toml): the kernel module, an exact source snippet that
must occur exactly once, and its replacement. Loading one copies `kernels/` to a temporary
package with that single edit (Triton's JIT reads kernel source from files, so the copy is
real files) and builds the kernel from the copy's registry.

    python ci/mutation.py --jobs 2             # regenerate everything: kill map (cases + tests),
                                               #   smoke set, kill_map.md, dead-weight table
    python ci/mutation.py --only NAME [NAME]   # rebuild these mutants' rows (same inputs otherwise)
    python ci/mutation.py --check              # is the map fresh? (inputs hashed vs the map's record)
    python ci/mutation.py --report [--explain]  # print the stored map, rewrite kill_map.md
    python ci/mutation.py --profile gpu --device cuda   # the GPU profile's rows (on a GPU machine)

What decides a kill - the kernels, mutants.toml, the case sets, the factories, the judge, the
kernel-level tests and this tool - is hashed into the map (`fingerprint`); `--check` and
suites/selftest/test_mutants.py fail when any of it changed since the map was generated, naming
the files. A mutant's own entry is hashed per row, so `--only NAME` refreshes an added or
edited mutant without a full run.

Each mutant's cases run in the suite's isolated worker (decode_conformance/isolation.py, the one
pytest uses under --isolation=process), so a mutant that kills the interpreter (a segfault on a
wild address) or hangs only ends that worker: the case it was running counts as a kill
("crashed" / "hung") and a fresh worker goes on with the next case.
Kernel-level tests (KERNEL_TESTS) run once per mutant in a pytest subprocess with
`--kernel=<the mutant's copy>`; a test that fails there, and passes on the shipped kernel,
kills it (e.g. the Lean counter that is not reset fails
test_determinism::test_same_plan_launched_twice).
"""
from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import importlib
import json
import os
import pathlib
import re
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KERNELS_DIR = ROOT / "kernels"
MUTANTS_FILE = ROOT / "fixtures" / "mutants.toml"
KILL_MAP_FILE = ROOT / "fixtures" / "kill_map.json"
SMOKE_FILE = ROOT / "fixtures" / "smoke_set.txt"
KILL_REPORT_FILE = ROOT / "fixtures" / "kill_map.md"
DEAD_WEIGHT_FILE = ROOT / "fixtures" / "dead_weight.md"
REGENERATE = "python ci/mutation.py --jobs 2"
FORMAT = 2
# A case that gives no progress for this long counts as a kill ("hung"), its worker replaced.
CASE_TIMEOUT_S = 600.0
TESTS_TIMEOUT_S = 1200.0
# Kernel-level tests that may kill a mutant (run with --kernel=<mutant>); CUDA-graph replay
# needs a GPU and runs only in the gpu profile.
KERNEL_TESTS = {
    "interpreter": ("suites/parity/test_determinism.py", "suites/parity/test_batch_invariance.py",
                    "suites/parity/test_num_splits.py"),
    "gpu": ("suites/parity/test_determinism.py", "suites/parity/test_batch_invariance.py",
            "suites/parity/test_num_splits.py", "suites/parity/test_cuda_graph.py"),
}
# Everything that decides a kill, hashed into the map (paths relative to ROOT; folders: *.py).
FINGERPRINT_INPUTS = (
    "kernels",
    "decode_conformance/cases.py", "decode_conformance/case_sets.py", "decode_conformance/pairwise.py",
    "decode_conformance/regressions.py", "decode_conformance/factories.py", "decode_conformance/batch.py",
    "decode_conformance/reference.py", "decode_conformance/metrics.py", "decode_conformance/runner.py",
    "decode_conformance/pristine.py", "decode_conformance/graphs.py", "decode_conformance/interpreter_compat.py",
    "suites/parity/test_determinism.py", "suites/parity/test_batch_invariance.py", "suites/parity/test_num_splits.py",
    "suites/parity/test_cuda_graph.py", "decode_conformance/scenarios.py", "decode_conformance/devices.py",
    "ci/mutation.py",
)
MUTANT_FIELDS = ("name", "kernel", "module", "find", "replace", "description")


@dataclass(frozen=True)
class Mutant:
    name: str
    kernel: str  # registry factory name of the kernel that carries the bug
    module: str  # file in kernels/ (without .py)
    find: str
    replace: str
    description: str
    gpu_killers: tuple = ()  # case-id patterns that must kill it in the gpu profile (GPU-only pools)

    def source(self) -> str:
        return (KERNELS_DIR / f"{self.module}.py").read_text()

    def occurrences(self) -> int:
        return self.source().count(self.find)

    def digest(self) -> str:
        body = json.dumps({f: getattr(self, f) for f in MUTANT_FIELDS} | {"gpu_killers": list(self.gpu_killers)},
                          sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def load_mutants(path: pathlib.Path = MUTANTS_FILE) -> list[Mutant]:
    data = tomllib.loads(path.read_text())
    out = []
    for i, row in enumerate(data.get("mutant", [])):
        missing = set(MUTANT_FIELDS) - set(row)
        if missing:
            raise ValueError(f"{path}: mutant {i}: missing fields {sorted(missing)}")
        unknown = set(row) - set(MUTANT_FIELDS) - {"gpu_killers"}
        if unknown:
            raise ValueError(f"{path}: mutant {row['name']}: unknown fields {sorted(unknown)}")
        out.append(Mutant(**{k: row[k] for k in MUTANT_FIELDS}, gpu_killers=tuple(row.get("gpu_killers", ()))))
    names = [m.name for m in out]
    if len(names) != len(set(names)):
        raise ValueError(f"{path}: duplicate mutant names")
    return out


# ---- freshness ----------------------------------------------------------------------------
# Under kernels/: not the external-library adapters (no mutant is measured on them).
FINGERPRINT_SKIP = ("kernels/adapters",)


def _input_files() -> list[pathlib.Path]:
    files = []
    for rel in FINGERPRINT_INPUTS:
        p = ROOT / rel
        if p.is_dir():
            files += sorted(q for q in p.rglob("*.py") if "__pycache__" not in q.parts
                            and not any(str(q.relative_to(ROOT)).startswith(s) for s in FINGERPRINT_SKIP))
        elif p.exists():
            files.append(p)
    return files


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _content_sha(path: pathlib.Path) -> str:
    """A Python file hashes by its syntax tree without docstrings (comments, docstrings and
    layout decide no kill, and rewording one must not cost a 25-minute regeneration)."""
    text = path.read_bytes().replace(b"\r\n", b"\n")
    if path.suffix != ".py":
        return _sha(text)
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return _sha(ast.dump(tree).encode())


def fingerprint(parity_ids: Optional[list[str]] = None) -> dict:
    """Hashes of every input that decides a kill (mutants.toml is hashed per mutant row), and
    of the interpreter parity set's case ids."""
    files = {str(p.relative_to(ROOT)): _content_sha(p) for p in _input_files()}
    if parity_ids is None:
        parity_ids = [c.id for c in parity_cases("interpreter")]
    ids = _sha("\n".join(parity_ids).encode())
    total = _sha(json.dumps({"files": files, "parity_ids": ids}, sort_keys=True).encode())
    return {"sha256": total, "files": files, "parity_ids": ids}


def stale_inputs(kill_map: dict, mutants: Optional[list[Mutant]] = None) -> list[str]:
    """What changed since the map was generated: input files, the parity ids, mutant rows
    (added, removed or edited). Empty when the map is fresh."""
    rec = kill_map.get("fingerprint") or {}
    now = fingerprint()
    out = []
    if rec.get("sha256") != now["sha256"]:
        old_files = rec.get("files", {})
        for f in sorted(set(old_files) | set(now["files"])):
            if old_files.get(f) != now["files"].get(f):
                what = "added" if f not in old_files else "removed" if f not in now["files"] else "changed"
                out.append(f"{f} ({what})")
        if rec.get("parity_ids") != now["parity_ids"]:
            out.append("the interpreter parity set's case ids")
        if not out:
            out.append("the fingerprint record")
    rows = kill_map.get("profiles", {}).get("interpreter", {}).get("mutants", {})
    for m in (mutants if mutants is not None else load_mutants()):
        if m.name not in rows:
            out.append(f"mutant {m.name} (not in the map: `python ci/mutation.py --only {m.name}`)")
        elif rows[m.name].get("mutant_sha") != m.digest():
            out.append(f"mutant {m.name} (its entry in mutants.toml changed: `python ci/mutation.py --only {m.name}`)")
    names = {m.name for m in (mutants if mutants is not None else load_mutants())}
    out += [f"mutant {n} (in the map, no longer in mutants.toml)" for n in sorted(set(rows) - names)]
    return out


# ---- kill map file ----------------------------------------------------------------------------
def read_map() -> dict:
    if not KILL_MAP_FILE.exists():
        return {}
    data = json.loads(KILL_MAP_FILE.read_text())
    if data.get("format") != FORMAT:
        return {}
    return data


def rows_of(kill_map: dict, profile: str = "interpreter") -> dict:
    return (kill_map.get("profiles", {}).get(profile) or {}).get("mutants", {})


def case_kills(kill_map: dict, profile: str = "interpreter") -> dict[str, list[str]]:
    """{mutant: [killer case ids]} (parity order)."""
    return {n: list(r.get("cases", [])) for n, r in rows_of(kill_map, profile).items()}


def killer_tests(kill_map: dict, profile: str = "interpreter") -> dict[str, list[str]]:
    """{mutant: [killer test ids, e.g. test_determinism::test_same_plan_launched_twice]}."""
    return {n: list(r.get("tests", [])) for n, r in rows_of(kill_map, profile).items()}


def write_map(kill_map: dict) -> None:
    KILL_MAP_FILE.write_text(json.dumps(kill_map, indent=1, sort_keys=False) + "\n")


# ---- mutant kernels ---------------------------------------------------------------------------
def package_name(m: Mutant) -> str:
    return "dc_mutant_" + "".join(ch if ch.isalnum() else "_" for ch in m.name)


def materialize(m: Mutant, dest: pathlib.Path) -> str:
    """Write the mutant's copy of kernels/ under `dest`; returns its package name."""
    n = m.occurrences()
    if n != 1:
        raise ValueError(f"mutant {m.name}: snippet occurs {n} times in kernels/{m.module}.py (expected exactly 1); "
                         "update fixtures/mutants.toml")
    pkg = package_name(m)
    target_dir = pathlib.Path(dest) / pkg
    if not target_dir.exists():
        shutil.copytree(KERNELS_DIR, target_dir, ignore=shutil.ignore_patterns("__pycache__"))
        (target_dir / f"{m.module}.py").write_text(m.source().replace(m.find, m.replace))
    return pkg


# ---- covers -------------------------------------------------------------------------------------
def greedy_cover(kill_map: dict[str, list[str]], order: list[str],
                 extra: Optional[dict[str, set]] = None) -> list[str]:
    """A small set of case ids that kills every mutant of `kill_map` ({mutant: killer ids})
    and, with `extra` ({case id: other items, e.g. axis values}), covers every item some case
    has. Greedy set cover; ties broken by `order` (deterministic)."""
    extra = extra or {}
    rank = {cid: i for i, cid in enumerate(order)}
    items_of = {c: {("mutant", m) for m, ks in kill_map.items() if c in ks} | {("item", x) for x in extra.get(c, ())}
                for c in order}
    alive = set().union(*items_of.values()) if items_of else set()
    chosen = []
    while alive:
        best = max(order, key=lambda c: (len(items_of[c] & alive), -rank[c]))
        gain = items_of[best] & alive
        if not gain:
            break
        chosen.append(best)
        alive -= gain
    return chosen


def minimum_cover_size(kill_map: dict[str, list[str]], extra: Optional[dict[str, set]] = None,
                       node_limit: int = 200000) -> tuple[int, bool]:
    """(size of the smallest case set covering what `greedy_cover` covers, exact?) by branch and
    bound on the item with the fewest holders; gives up after `node_limit` nodes."""
    extra = extra or {}
    holders: dict = {}
    for m, ks in kill_map.items():
        if ks:
            holders[("mutant", m)] = frozenset(ks)
    for c, xs in extra.items():
        for x in xs:
            holders.setdefault(("item", x), set()).add(c)
    holders = {k: frozenset(v) for k, v in holders.items()}
    order = sorted({c for v in holders.values() for c in v})
    best = [len(greedy_cover(kill_map, order, extra))]
    nodes = [0]

    def rec(alive: frozenset, depth: int) -> None:
        nodes[0] += 1
        if nodes[0] > node_limit:
            return
        if not alive:
            best[0] = min(best[0], depth)
            return
        if depth + 1 >= best[0]:
            return
        it = min(alive, key=lambda x: len(holders[x]))
        for c in sorted(holders[it]):
            rec(frozenset(x for x in alive if c not in holders[x]), depth + 1)

    rec(frozenset(holders), 0)
    return best[0], nodes[0] <= node_limit


def axis_items(case, profile: str) -> set:
    from decode_conformance.case_sets import classify
    return {f"{a}={v}" for a, v in classify(case, profile).items()}


def narrow_kernel():
    """The Capabilities of a kernel with none of the optional features: bf16 paged caches, no
    MLA, no window, soft-cap or sinks, packed inputs only. Where a case set (the smoke set)
    must serve narrow kernels too, each axis value is carried by a case asking such a kernel
    for as few features as the parity set allows (`needs`)."""
    from decode_conformance.kernel_api import Capabilities
    return Capabilities(kv_dtypes=frozenset({"bf16"}), layouts=frozenset({"paged"}), mla=False, softcap=False,
                        sinks=False, window_convention=None, input_forms=frozenset({"packed"}))


def needs(case, narrow=None) -> int:
    """How many features `case` needs that `narrow_kernel()` lacks."""
    return len((narrow or narrow_kernel()).missing_for(case, "cpu"))


def smoke_from_map(kill_map: dict) -> tuple[list[str], list[str]]:
    """(interpreter smoke ids, GPU-only smoke ids). Interpreter: greedy cover of every mutant a
    parity case kills and every axis value of the table, each value in one of the parity cases
    with it that `needs` the fewest optional features (so a kernel without MLA, fp8 or soft-cap
    still meets sinks in the smoke set, where one case combining them all would skip for it).
    GPU-only: for each mutant with gpu_killers patterns, the first GPU parity case matching one
    (its 2^31-element pools do not exist on the CPU)."""
    from decode_conformance.case_sets import AXES
    cases = parity_cases("interpreter")
    order = [c.id for c in cases]
    table = {f"{a}={v}" for a, vs in AXES.items() for v in vs}
    extra = {c.id: axis_items(c, "interpreter") & table for c in cases}
    narrow = narrow_kernel()
    need = {c.id: needs(c, narrow) for c in cases}
    fewest: dict[str, int] = {}
    for cid, items in extra.items():
        for it in items:
            fewest[it] = min(fewest.get(it, need[cid]), need[cid])
    extra = {cid: items | {f"narrow:{it}" for it in items if need[cid] == fewest[it]} for cid, items in extra.items()}
    smoke = greedy_cover(case_kills(kill_map), order, extra)
    gpu_ids = [c.id for c in parity_cases("gpu")]
    interp = set(order)
    gpu_only = []
    for m in load_mutants():
        if not m.gpu_killers or any(fnmatch.fnmatchcase(c, p) for c in gpu_only for p in m.gpu_killers):
            continue
        hit = next((cid for pat in m.gpu_killers for cid in gpu_ids
                    if fnmatch.fnmatchcase(cid, pat) and cid not in interp), None)
        if hit:
            gpu_only.append(hit)
    return smoke, gpu_only


def parity_cases(profile: str = "interpreter") -> list:
    from decode_conformance.case_sets import build_set
    return build_set("parity", profile)


# ---- one mutant through the suite's isolated runner --------------------------------------
def _prepare(device: str):
    from decode_conformance import _paths
    _paths.alias_checkout(ROOT)
    if device == "cpu":
        from decode_conformance.devices import use_interpreter
        use_interpreter()


def _env(tmp: str, device: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([tmp, str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


def run_isolated(m: Mutant, case_ids: list[str], stop_at_first: bool = False,
                 case_timeout: float = CASE_TIMEOUT_S, device: str = "cpu", profile: str = "interpreter"
                 ) -> dict[str, str]:
    """{case id: failure message} for the cases of `case_ids` (parity ids) that kill the
    mutant, run by the isolated worker pytest uses under --isolation=process: a case that
    crashes it (a segfault on a wild address), gives no result within `case_timeout` s or
    poisons its CUDA context kills the mutant, and a fresh worker goes on with the next case.
    stop_at_first: stop at the first kill."""
    from decode_conformance.devices import device_type
    from decode_conformance.isolation import IsolatedRunner
    from decode_conformance.kernel_api import load_kernel
    by_id = {c.id: c for c in parity_cases(profile)}
    kills: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="dc_mutant_run_") as tmp:
        spec = f"{materialize(m, pathlib.Path(tmp))}.registry:{m.kernel}"
        sys.path.insert(0, tmp)  # the spawned worker starts with this sys.path
        try:
            importlib.invalidate_caches()
            caps = load_kernel(spec).caps
            with IsolatedRunner(device, case_timeout, root=str(ROOT)) as runner:
                for cid in case_ids:
                    if caps.missing_for(by_id[cid], device_type(device)):
                        continue
                    res = runner.run(spec, by_id[cid], name=f"mutant-{m.name}")
                    if res.status == "error":  # the mutant or the worker is broken: not a kill
                        raise RuntimeError(f"mutant {m.name} on {cid}: {res.message}")
                    if not res.ok:
                        kills[cid] = " ".join(res.message.split())[:300]
                        if stop_at_first:
                            break
        finally:
            sys.path.remove(tmp)
    return kills


# ---- kernel-level tests -------------------------------------------------------------------------
def _test_path(test_id: str, profile: str) -> str:
    stem = test_id.split("::")[0]
    for p in KERNEL_TESTS[profile]:
        if pathlib.Path(p).stem == stem:
            return p + "::" + test_id.split("::", 1)[1]
    raise ValueError(f"test {test_id!r} is not one of the kernel-level tests {KERNEL_TESTS[profile]}")


def run_tests(spec: str, tests: Iterable[str], tmp: str, device: str = "cpu", timeout: float = TESTS_TIMEOUT_S
              ) -> dict[str, str]:
    """{test id: status} of the kernel-level tests run with --kernel=spec (a pytest subprocess;
    PYTHONPATH holds `tmp`). Status 'failed' / 'error' kill; a run past `timeout` marks the
    tests without a result 'hung', a run that died without its report 'crashed'."""
    report = pathlib.Path(tmp) / f"report_{abs(hash((spec, tuple(tests)))) & 0xFFFFFF}"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *tests, f"--kernel={spec}",
           f"--device={'cpu' if device == 'cpu' else device}", f"--conformance-report={report}",
           "--isolation=none", "-o", "addopts="]
    log = pathlib.Path(tmp) / "tests.log"
    hung = False
    with open(log, "ab") as logf:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp, device), stdout=logf, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            hung = True
    status: dict[str, str] = {}
    rp = report.with_suffix(".json")
    if rp.exists():
        for row in json.loads(rp.read_text())["results"]:
            prev = status.get(row["test"])
            if prev in ("failed", "error"):
                continue
            status[row["test"]] = row["status"] if row["status"] in ("failed", "error") else (
                prev if prev == "passed" else row["status"])
    # A run that hung, or died before writing its report (a mutant that makes the interpreter
    # segfault on a wild address), kills with every test that has no result of its own.
    lost = "hung" if hung else (None if rp.exists() else "crashed")
    if lost:
        for t in tests:
            stem = pathlib.Path(t.split("::")[0]).stem
            if not any(k.startswith(stem + "::") for k in status):
                status[f"{stem}::*"] = lost
    return status


_BASELINE: dict = {}


def baseline_tests(kernel: str, device: str, profile: str, tests: Optional[Iterable[str]] = None) -> dict[str, str]:
    """The kernel-level tests' statuses on the shipped kernel (a failure there is no kill)."""
    paths = tuple(tests) if tests is not None else tuple(KERNEL_TESTS[profile])
    key = (kernel, device, profile, paths)
    if key not in _BASELINE:
        with tempfile.TemporaryDirectory(prefix="dc_mutant_base_") as tmp:
            _BASELINE[key] = run_tests(f"decode_conformance_kernels.registry:{kernel}", paths, tmp, device)
    return _BASELINE[key]


def killing_tests(m: Mutant, device: str = "cpu", profile: str = "interpreter",
                 tests: Optional[Iterable[str]] = None) -> dict[str, str]:
    """{test id: status} of the kernel-level tests (files or node ids; default KERNEL_TESTS)
    that fail on the mutant and pass on the shipped kernel."""
    paths = tuple(tests) if tests is not None else tuple(KERNEL_TESTS[profile])
    base = baseline_tests(m.kernel, device, profile, paths)
    with tempfile.TemporaryDirectory(prefix="dc_mutant_tests_") as tmp:
        pkg = materialize(m, pathlib.Path(tmp))
        got = run_tests(f"{pkg}.registry:{m.kernel}", paths, tmp, device)
    return {t: s for t, s in got.items()
            if s in ("failed", "error", "hung", "crashed") and base.get(t, "passed") != "failed"}


def node_id(test_id: str, profile: str = "interpreter") -> str:
    """The pytest node id of a recorded killer test (`test_determinism::test_same_plan_launched_twice`)."""
    return _test_path(test_id, profile)


# ---- the map ---------------------------------------------------------------------------------------
def build_rows(names: Optional[list[str]] = None, jobs: int = 1, device: str = "cpu", profile: str = "interpreter",
               with_tests: bool = True) -> tuple[dict, dict]:
    """({mutant: row}, {mutant: {killer id: message}})."""
    case_ids = [c.id for c in parity_cases(profile)]
    todo = [m for m in load_mutants() if not names or m.name in names]
    if names:
        unknown = set(names) - {m.name for m in todo}
        if unknown:
            raise SystemExit(f"--only: no such mutants {sorted(unknown)}")
    if with_tests:  # baselines first, once per kernel (not raced by the pool)
        for k in sorted({m.kernel for m in todo}):
            baseline_tests(k, device, profile)

    def one(m):
        t0 = time.monotonic()
        kills = run_isolated(m, case_ids, device=device, profile=profile)
        tests = killing_tests(m, device, profile) if with_tests else {}
        print(f"{m.name}: killed by {len(kills)} cases, {len(tests)} tests ({time.monotonic() - t0:.0f} s)",
              flush=True)
        row = {"mutant_sha": m.digest(), "cases": list(kills), "tests": sorted(tests)}
        return m.name, row, {**kills, **{t: f"test {s}" for t, s in tests.items()}}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, todo))
    return {n: r for n, r, _ in results}, {n: msg for n, _, msg in results}


def assemble(old: dict, rows: dict, profile: str, full: bool) -> dict:
    """The new map: `rows` replace the profile's rows; a full run records the fingerprint."""
    current = {m.name for m in load_mutants()}
    profiles = dict(old.get("profiles", {}))
    prev = {} if full else dict(rows_of(old, profile))
    merged = {k: v for k, v in sorted({**prev, **rows}.items()) if k in current}
    profiles[profile] = {"mutants": merged}
    fp = fingerprint() if (full or not old.get("fingerprint")) else old["fingerprint"]
    return {"format": FORMAT, "regenerate": REGENERATE, "fingerprint": fp, "profiles": profiles}


# ---- report -----------------------------------------------------------------------------------------
def report_table(kill_map: dict, mutants: Optional[list[Mutant]] = None, smoke: Optional[list[str]] = None) -> str:
    """Markdown: mutant -> kernel / module -> killing cases -> first 3 killers (those in the
    smoke set in bold) -> killing kernel-level tests."""
    mutants = mutants if mutants is not None else load_mutants()
    smoke_set = set(smoke or [])
    rows = ["| mutant | kernel / module | cases | first killers (smoke cases in bold) | tests that kill it | "
            "smoke case that kills it |",
            "|---|---|---:|---|---|---|"]
    cases, tests = case_kills(kill_map), killer_tests(kill_map)
    for m in mutants:
        ks = cases.get(m.name)
        if ks is None:
            rows.append(f"| {m.name} | {m.kernel} / {m.module} | - | not in the kill map | | |")
            continue
        cells = [f"**`{k}`**" if k in smoke_set else f"`{k}`" for k in ks[:3]]
        if len(ks) > 3:
            cells[-1] += f" (+{len(ks) - 3} more)"
        in_smoke = [k for k in (smoke or []) if k in ks]
        ts = "<br>".join(f"`{t}`" for t in tests.get(m.name, [])) or "-"
        killed = cells or (["(tests only)"] if tests.get(m.name) else ["SURVIVES"])
        rows.append(f"| {m.name} | {m.kernel} / {m.module} | {len(ks)} | {'<br>'.join(killed)} | {ts} | "
                    f"{f'`{in_smoke[0]}`' if in_smoke else '-'} |")
    return "\n".join(rows) + "\n"


_MSG_LINE = re.compile(r"^- \*\*(?P<name>[^*]+)\*\* on `(?P<case>[^`]+)`: (?P<msg>.*)$")


def _stored_messages() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    if KILL_REPORT_FILE.exists():
        for ln in KILL_REPORT_FILE.read_text().splitlines():
            mt = _MSG_LINE.match(ln)
            if mt:
                out.setdefault(mt["name"], {})[mt["case"]] = mt["msg"]
    return out


def first_killer_messages(kill_map: dict, jobs: int = 1) -> dict[str, dict[str, str]]:
    """Re-run each mutant on its first killer case only (in an isolated worker) for the failure message."""
    cases = case_kills(kill_map)
    todo = [m for m in load_mutants() if cases.get(m.name)]

    def one(m):
        return m.name, run_isolated(m, cases[m.name][:1])

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(one, todo))


def write_report(kill_map: dict, smoke: list[str], gpu_smoke: list[str], messages: Optional[dict] = None) -> str:
    """Write fixtures/kill_map.md. Without `messages`, the first-killer messages already in
    the file are kept where the first killer is unchanged."""
    mutants = load_mutants()
    if messages is None:
        messages = _stored_messages()
    cases, tests = case_kills(kill_map), killer_tests(kill_map)
    by_case: dict[str, int] = {}
    for ks in cases.values():
        for k in ks:
            by_case[k] = by_case.get(k, 0) + 1
    order = [c.id for c in parity_cases()]
    dead = [c for c in order if c not in by_case]
    killed = [m for m in mutants if cases.get(m.name) or tests.get(m.name)]
    tests_only = [m.name for m in mutants if not cases.get(m.name) and tests.get(m.name)]
    from decode_conformance.case_sets import AXES
    extra = {c.id: axis_items(c, "interpreter") & {f"{a}={v}" for a, vs in AXES.items() for v in vs}
             for c in parity_cases()}
    minimum, exact = minimum_cover_size(cases, extra)
    gpu_rows = rows_of(kill_map, "gpu")
    text = ["# Mutation kill map", "",
            f"Generated by `{REGENERATE}` from fixtures/mutants.toml: each mutant is a copy of a",
            "shipped kernel with one planted bug, run against the interpreter parity set and the",
            "kernel-level tests (" + ", ".join(f"`{pathlib.Path(p).name}`" for p in KERNEL_TESTS["interpreter"]) + ").",
            "A case or test kills a mutant when it fails on it (wrong result, NaN, exception, crash",
            "or hang) and passes on the shipped kernel. `python ci/mutation.py --check` says whether",
            "the map is still fresh (kill_map.json records a hash of everything that decides a kill).",
            "", f"{len(mutants)} mutants, {len(killed)} killed ({len(tests_only)} only by kernel-level tests: "
            f"{', '.join(tests_only) or 'none'}); {len(order)} interpreter parity cases, {len(order) - len(dead)} kill "
            f"at least one mutant; smoke set: {len(smoke)} cases (fixtures/smoke_set.txt: greedy cover of every "
            f"mutant a case kills and every axis value; the {'exact' if exact else 'best found'} minimum is "
            f"{minimum}), plus {len(gpu_smoke)} GPU-only case(s) for the gpu profile.", "",
            f"GPU profile rows: {'present' if gpu_rows else 'not generated yet (`python ci/mutation.py --profile gpu --device cuda` on a GPU)'}.",
            "", report_table(kill_map, mutants, smoke)]
    if messages:
        text += ["## How the first killer fails each mutant", ""]
        for m in mutants:
            ks = cases.get(m.name) or []
            if ks and m.name in messages and ks[0] in messages[m.name]:
                text.append(f"- **{m.name}** on `{ks[0]}`: {messages[m.name][ks[0]][:200]}")
        text.append("")
    text += ["## Cases that kill no mutant", "",
             "Each is justified in fixtures/dead_weight.md (generated with this file).", ""]
    text += [f"- `{c}`" for c in dead] or ["(none)"]
    out = "\n".join(text) + "\n"
    KILL_REPORT_FILE.write_text(out)
    return out


def print_table(kill_map: dict) -> None:
    mutants = load_mutants()
    cases, tests = case_kills(kill_map), killer_tests(kill_map)
    w = max(len(m.name) for m in mutants)
    print(f"{'mutant':<{w}}  cases  tests  first killers")
    for m in mutants:
        ks = cases.get(m.name)
        n = "-" if ks is None else str(len(ks))
        first = (ks or [])[:2] + tests.get(m.name, [])[:1]
        print(f"{m.name:<{w}}  {n:>5}  {len(tests.get(m.name, [])):>5}  {', '.join(first)}")


def write_smoke(smoke: list[str], gpu_only: list[str]) -> None:
    SMOKE_FILE.write_text(
        "# The smoke set: parity cases (interpreter ids) that together kill every mutant a parity case kills\n"
        "# and cover every value of the axis table (a greedy cover). The gpu profile runs the same recipes;\n"
        "# lines starting with `gpu ` are gpu-profile cases with no interpreter twin (2^31-element pools).\n"
        f"# Generated by `{REGENERATE}`; checked by suites/selftest/test_mutants.py.\n"
        + "".join(f"{c}\n" for c in smoke) + "".join(f"gpu {c}\n" for c in gpu_only))


def read_smoke() -> list[str]:
    if not SMOKE_FILE.exists():
        return []
    return [ln.strip() for ln in SMOKE_FILE.read_text().splitlines()
            if ln.strip() and not ln.startswith("#") and not ln.startswith("gpu ")]


def read_gpu_smoke() -> list[str]:
    if not SMOKE_FILE.exists():
        return []
    return [ln[4:].strip() for ln in SMOKE_FILE.read_text().splitlines() if ln.startswith("gpu ")]


# ---- dead weight -----------------------------------------------------------------------------------
DEAD_BEGIN = "<!-- generated by ci/mutation.py: begin -->"
DEAD_END = "<!-- generated by ci/mutation.py: end -->"


def dead_weight_rows(kill_map: dict) -> list[tuple[str, str, str]]:
    """(case id, why it stays, decision) for every interpreter parity case that kills no
    mutant: a pairwise case names the pairs only it covers for some kernel; a regression case
    names the property its record checks."""
    from decode_conformance import case_sets as cs
    from decode_conformance.coverage import format_pair
    from decode_conformance.pairwise import CoveringProblem
    cases = parity_cases()
    killers = {k for ks in case_kills(kill_map).values() for k in ks}
    dead = [c for c in cases if c.id not in killers]
    if not dead:
        return []
    problem = CoveringProblem(cs.AXES, cs.constraints(),
                              {g: cs.value_domains(caps) for g, caps in cs.CAPABILITY_GROUPS.items()})
    targets = problem.targets()
    holds = {c.id: {g: set(problem.row_pairs(cs.classify(c, "interpreter"), problem.order))
                    if not caps.missing_for(c, "cpu") else set() for g, caps in cs.CAPABILITY_GROUPS.items()}
             for c in cases}
    out = []
    for c in dead:
        if c.label:
            out.append((c.id, f"regression `{c.label}`: {c.note.split(': ', 1)[-1]}", "keep (regression record)"))
            continue
        only = []
        for g in cs.CAPABILITY_GROUPS:
            others = set().union(*(holds[o.id][g] for o in cases if o.id != c.id))
            only += [(g, p) for p in sorted(holds[c.id][g] & set(targets[g]) - others)]
        if only:
            shown = "; ".join(f"{format_pair(p)} ({g})" for g, p in only[:3])
            more = f" (+{len(only) - 3} more)" if len(only) > 3 else ""
            out.append((c.id, f"pairwise: the only case covering {shown}{more}", "keep (coverage)"))
        else:
            out.append((c.id, "pairwise: every pair it holds is covered elsewhere too (regression cases included)",
                        "keep (generated recipe; drop by excluding it in case_sets if it costs)"))
    return out


def write_dead_weight(kill_map: dict) -> None:
    rows = dead_weight_rows(kill_map)
    table = ["| case | distinct axis / reason | decision |", "|---|---|---|"]
    table += [f"| `{cid}` | {why} | {dec} |" for cid, why, dec in rows]
    if not rows:
        table.append("")
        table.append("None: every interpreter parity case kills at least one mutant.")
    block = "\n".join([DEAD_BEGIN, *table, DEAD_END])
    text = DEAD_WEIGHT_FILE.read_text() if DEAD_WEIGHT_FILE.exists() else ""
    if DEAD_BEGIN in text and DEAD_END in text:
        text = text[:text.index(DEAD_BEGIN)] + block + text[text.index(DEAD_END) + len(DEAD_END):]
    else:
        text = "# Dead weight in the parity set\n\n## Cases that kill no mutant\n\n" + block + "\n" + text
    DEAD_WEIGHT_FILE.write_text(text)


# ---- main ----------------------------------------------------------------------------------------
def check(kill_map: dict) -> list[str]:
    """Problems that make the stored artefacts unusable (stale inputs, out-of-sync files)."""
    if not kill_map:
        return [f"{KILL_MAP_FILE} is missing or in an old format; {REGENERATE}"]
    problems = [f"changed since the kill map was generated: {s}" for s in stale_inputs(kill_map)]
    smoke, gpu_only = smoke_from_map(kill_map)
    if read_smoke() != smoke or read_gpu_smoke() != gpu_only:
        problems.append(f"{SMOKE_FILE.name} is not the cover of the map")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="rebuild these mutants' rows only")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at a time (one subprocess each)")
    ap.add_argument("--no-tests", action="store_true", help="skip the kernel-level tests (cases only)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the map is stale or out of sync; runs nothing")
    ap.add_argument("--report", action="store_true",
                    help="print the stored kill map as a table and rewrite fixtures/kill_map.md; runs nothing")
    ap.add_argument("--explain", action="store_true",
                    help="with --report: re-run each mutant on its first killer for the failure message")
    ap.add_argument("--device", default="cpu", help="cpu (Triton's interpreter, default) or cuda[:N]")
    ap.add_argument("--profile", choices=("interpreter", "gpu"), default=None,
                    help="case profile (default: interpreter on cpu, gpu otherwise)")
    args = ap.parse_args(argv)
    from decode_conformance.devices import profile_of
    profile = args.profile or profile_of(args.device)
    _prepare(args.device)
    old = read_map()
    if args.check:
        problems = check(old)
        for p in problems:
            print(p)
        if not problems:
            print(f"kill map fresh: fingerprint {old['fingerprint']['sha256']}")
        return 1 if problems else 0
    if args.report:
        if not old:
            raise SystemExit(f"{KILL_MAP_FILE} is missing or in an old format; build it with `{REGENERATE}`")
        write_report(old, read_smoke(), read_gpu_smoke(), first_killer_messages(old, args.jobs) if args.explain else None)
        print_table(old)
        return 0
    full = not args.only
    if not full and old.get("fingerprint") and old["fingerprint"].get("sha256") != fingerprint()["sha256"]:
        print("warning: inputs other than these mutants changed since the map was generated; only a full run "
              f"(`{REGENERATE}`) makes it fresh again", file=sys.stderr)
    rows, messages = build_rows(args.only, args.jobs, args.device, profile, with_tests=not args.no_tests)
    kill_map = assemble(old, rows, profile, full)
    write_map(kill_map)
    smoke, gpu_only = smoke_from_map(kill_map)
    write_smoke(smoke, gpu_only)
    write_report(kill_map, smoke, gpu_only, {**_stored_messages(), **messages} if args.only else messages)
    write_dead_weight(kill_map)
    print_table(kill_map)
    cases, tests = case_kills(kill_map, profile), killer_tests(kill_map, profile)
    survivors = [k for k in cases if not cases[k] and not tests.get(k)]
    print(f"{len(cases)} mutants, {len(survivors)} survivors {survivors}; smoke set {len(smoke)} cases "
          f"(+{len(gpu_only)} gpu-only)")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())

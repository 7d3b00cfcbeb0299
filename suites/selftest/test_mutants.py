"""Mutation self-test: the suite must catch realistic bugs planted in our own kernels.

fixtures/mutants.toml lists the mutants (one exact-snippet edit each, in a copy of kernels/);
`python ci/mutation.py --jobs 2` runs the interpreter parity set and the kernel-level tests
against each and stores what kills which mutant (fixtures/kill_map.json, .md), the smoke set
(fixtures/smoke_set.txt: every mutant a case kills, every axis value) and the dead-weight table.

Here, on CPU and in a few minutes:
- every mutant still applies (its snippet occurs exactly once, so a kernel refactor cannot
  silently turn a mutant into the unmutated kernel);
- the map is fresh: nothing that decides a kill (kernels, mutants.toml, case sets, factories,
  judge, kernel-level tests, the tool) changed since it was generated - the map records a hash;
- the stored map, the smoke set and the dead-weight table agree with each other and with the
  current parity set and mutant list;
- the smoke set really kills every mutant a case kills now, and each mutant only a
  kernel-level test kills still fails that test (subprocesses, stopping at the first kill: a
  mutant that segfaults the interpreter on a wrapped 32-bit address counts as killed);
- the shipped, unmutated kernels pass the smoke set, so a kill is the mutation's doing.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys

import pytest

from decode_conformance.case_sets import AXES, build_set
from suites.selftest._subpytest import ROOT


def _load_tool():
    name = "decode_conformance_ci_mutation"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "ci" / "mutation.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


mu = _load_tool()
MUTANTS = mu.load_mutants()
REGEN = f"regenerate with `{mu.REGENERATE}`"


def _kill_map() -> dict:
    m = mu.read_map()
    if not m:
        pytest.fail(f"{mu.KILL_MAP_FILE} is missing or in an old format; {REGEN}")
    return m


def _parity_ids() -> list[str]:
    return [c.id for c in build_set("parity", "interpreter")]


# ---- the mutants themselves ----------------------------------------------------------------
def test_mutant_list_is_broad():
    assert len(MUTANTS) >= 15
    assert {m.kernel for m in MUTANTS} >= {"fixed_split", "adaptive_split", "lean"}
    assert {m.module for m in MUTANTS} >= {"triton_common", "fixed_split", "adaptive_split", "lean"}


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_mutant_snippet_occurs_exactly_once(m):
    from decode_conformance_kernels import registry
    assert callable(getattr(registry, m.kernel, None)), f"{m.name}: no kernel factory {m.kernel!r} in registry"
    n = m.occurrences()
    assert n == 1, (f"mutant {m.name}: its `find` snippet occurs {n} times in kernels/{m.module}.py (expected "
                    f"exactly 1). The kernel changed: update the snippet in fixtures/mutants.toml so the mutant "
                    f"still plants its bug, then `python ci/mutation.py --only {m.name}`")
    assert m.find != m.replace


# ---- freshness and stored artefacts in sync ---------------------------------------------------
def test_kill_map_is_fresh():
    """Anything that decides a kill changed since the map was generated: the kills on record
    (and the smoke set built from them) may no longer hold."""
    stale = mu.stale_inputs(_kill_map(), MUTANTS)
    assert not stale, ("the mutation kill map is stale; changed since it was generated:\n  " + "\n  ".join(stale)
                       + f"\n{REGEN} (25-60 minutes on 2 cores) or, for mutant rows only, "
                         "`python ci/mutation.py --only NAME`")


def test_kill_map_covers_exactly_the_mutants():
    rows = mu.rows_of(_kill_map())
    names = {m.name for m in MUTANTS}
    assert set(rows) == names, (f"kill map out of date: missing {sorted(names - set(rows))}, "
                                f"stale {sorted(set(rows) - names)}; {REGEN}")


def test_every_mutant_is_killed_in_the_map():
    km = _kill_map()
    cases, tests = mu.case_kills(km), mu.killer_tests(km)
    survivors = [n for n in cases if not cases[n] and not tests.get(n)]
    assert not survivors, f"mutants no parity case or kernel-level test kills: {survivors}; add a case or test"


def test_every_killer_is_current():
    km = _kill_map()
    parity = set(_parity_ids())
    stale = sorted({k for ks in mu.case_kills(km).values() for k in ks} - parity)
    assert not stale, f"{len(stale)} killer ids are not in the parity set (e.g. {stale[0]}); {REGEN}"
    for ts in mu.killer_tests(km).values():
        for t in ts:
            mu.node_id(t)  # raises for a test that is no longer one of the kernel-level tests


def test_smoke_set_is_the_cover_of_the_map():
    smoke, gpu_only = mu.smoke_from_map(_kill_map())
    assert mu.read_smoke() == smoke and mu.read_gpu_smoke() == gpu_only, \
        f"{mu.SMOKE_FILE} is out of sync with the kill map; {REGEN}"
    order = _parity_ids()
    assert [c.id for c in build_set("smoke", "interpreter")] == [c for c in order if c in set(smoke)]


def test_smoke_set_covers_every_axis_value():
    from decode_conformance.case_sets import classify
    seen = {(a, v) for c in build_set("smoke", "interpreter") for a, v in classify(c, "interpreter").items()}
    missing = [f"{a}={v}" for a, vs in AXES.items() for v in vs if (a, v) not in seen]
    assert not missing, f"axis values no smoke case has: {missing}; {REGEN}"


def test_smoke_set_serves_narrow_kernels():
    """Each axis value sits in a smoke case needing as few optional features (MLA, fp8, a window,
    soft-cap, sinks, contiguous caches, input forms) as any parity case with it: an adopter's
    kernel without MLA or fp8 found sinks, soft-cap and huge-scores in the smoke set only inside
    one MLA fp8 case, skipped for it, and the smoke set passed its sink bug."""
    from decode_conformance.case_sets import classify
    narrow = mu.narrow_kernel()

    def fewest(cases):
        out = {}
        for c in cases:
            n = mu.needs(c, narrow)
            for a, v in classify(c, "interpreter").items():
                out[(a, v)] = min(out.get((a, v), n), n)
        return out
    parity, smoke = fewest(build_set("parity", "interpreter")), fewest(build_set("smoke", "interpreter"))
    worse = [f"{a}={v} (smoke needs {smoke.get((a, v))}, parity {n})" for (a, v), n in parity.items()
             if a in AXES and v in AXES[a] and smoke.get((a, v), 99) > n]
    assert not worse, f"axis values the smoke set carries only in cases a narrow kernel skips: {worse}; {REGEN}"


def test_smoke_set_carries_over_to_the_gpu_profile():
    gpu = build_set("smoke", "gpu")
    assert len(gpu) == len(mu.read_smoke()) + len(mu.read_gpu_smoke())


@pytest.mark.parametrize("m", [m for m in MUTANTS if m.gpu_killers], ids=lambda m: m.name)
def test_gpu_only_killers(m):
    """Mutants whose bf16/fp16 kill needs a 2^31-element pool: the gpu profile has such a
    case and its smoke set runs one; the gpu rows of the map (made on a GPU) must show it."""
    import fnmatch
    gpu_ids = [c.id for c in build_set("parity", "gpu")]
    matching = [c for c in gpu_ids if any(fnmatch.fnmatchcase(c, p) for p in m.gpu_killers)]
    assert matching, f"{m.name}: no gpu-profile parity case matches {m.gpu_killers}"
    assert set(mu.read_gpu_smoke()) & set(matching), f"{m.name}: the gpu smoke set has none of {matching[:2]}"
    gpu_rows = mu.rows_of(_kill_map(), "gpu")
    if not gpu_rows:
        pytest.skip("gpu rows of the kill map not generated yet: `python ci/mutation.py --profile gpu --device cuda` "
                    "on a GPU")
    assert set(gpu_rows.get(m.name, {}).get("cases", [])) & set(matching), \
        f"{m.name} is not killed by any of {matching} on the GPU"


def test_kill_report_lists_every_mutant():
    assert mu.KILL_REPORT_FILE.exists(), f"{mu.KILL_REPORT_FILE} is missing; {REGEN}"
    text = mu.KILL_REPORT_FILE.read_text()
    assert mu.report_table(_kill_map(), MUTANTS, mu.read_smoke()) in text, \
        f"{mu.KILL_REPORT_FILE} does not match kill_map.json; `python ci/mutation.py --report`"


def test_dead_weight_is_justified():
    """Every parity case that kills no mutant is listed, with a reason, in fixtures/dead_weight.md."""
    killers = {k for ks in mu.case_kills(_kill_map()).values() for k in ks}
    dead = {c for c in _parity_ids() if c not in killers}
    text = mu.DEAD_WEIGHT_FILE.read_text()
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]*) \|", text, flags=re.M)
    listed = {cid for cid, _ in rows}
    assert dead <= listed, f"cases that kill no mutant and are not justified in {mu.DEAD_WEIGHT_FILE.name}: " \
                           f"{sorted(dead - listed)}; {REGEN}"
    assert not listed - dead, f"{mu.DEAD_WEIGHT_FILE.name} lists cases that are not dead weight: {sorted(listed - dead)}"
    assert all(why.strip() for _, why in rows), "a dead-weight row without a reason"


# ---- the kills are real now --------------------------------------------------------------------
@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_smoke_set_kills_mutant(m):
    km = _kill_map()
    known = set(mu.case_kills(km).get(m.name, ()))
    tests = mu.killer_tests(km).get(m.name, [])
    if not known:
        if not tests:
            pytest.fail(f"mutant {m.name} has no killer in the map; {REGEN}")
        # Killed only by a kernel-level test: that test must still fail on it.
        got = mu.killing_tests(m, tests=[mu.node_id(tests[0])])
        assert got, (f"mutant {m.name} ({m.description}) now passes {tests[0]}, its only recorded killer; the "
                     "suite no longer catches it")
        return
    smoke = mu.read_smoke()
    assert smoke, f"{mu.SMOKE_FILE} is empty or missing; {REGEN}"
    order = [c for c in smoke if c in known] + [c for c in smoke if c not in known]
    kills = mu.run_isolated(m, order, stop_at_first=True, case_timeout=300)
    assert kills, (f"mutant {m.name} ({m.description}) now passes every smoke case; the suite no longer "
                   f"catches it. Known killers in the map: {sorted(known)[:3]}")


def _interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


@pytest.mark.parametrize("kernel_name", sorted({m.kernel for m in MUTANTS}))
def test_shipped_kernel_passes_smoke_set(kernel_name):
    if not _interpreter_active():
        pytest.skip("runs the kernels under Triton's interpreter: --device=cpu")
    from decode_conformance.runner import run_case
    from decode_conformance_kernels import registry
    from decode_conformance.ledger import Ledger, default_ledger_paths
    kernel = getattr(registry, kernel_name)()
    known = Ledger.load(list(default_ledger_paths()))  # the shipped kernels' known failures
    failures = []
    for case in build_set("smoke", "interpreter"):
        if kernel.caps.missing_for(case, "cpu") or known.match(kernel.name, case.id, "cpu"):
            continue
        res = run_case(kernel, case, "cpu")
        if not res.ok:
            failures.append(f"{case.id}: {res.message}")
    assert not failures, f"the unmutated {kernel_name} fails smoke cases:\n" + "\n".join(failures)


def test_fingerprint_ignores_docstrings_and_comments_not_code(tmp_path):
    src = 'def f(x):\n    """Scale x."""\n    return x * 2  # doubled\n'
    base = tmp_path / "a.py"
    base.write_text(src)
    reworded = tmp_path / "b.py"
    reworded.write_text(src.replace("Scale x.", "Double x (see docs/).").replace("# doubled", "# twice"))
    changed = tmp_path / "c.py"
    changed.write_text(src.replace("x * 2", "x * 3"))
    assert mu._content_sha(reworded) == mu._content_sha(base)
    assert mu._content_sha(changed) != mu._content_sha(base)

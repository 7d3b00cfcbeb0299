"""Mutation self-test: the parity suite must catch realistic bugs planted in our own kernels.

fixtures/mutants.toml lists the mutants (one exact-snippet edit each, in a copy of kernels/);
`python -m decode_conformance.mutation --jobs 2` runs the whole interpreter parity set against
each and stores which cases kill which mutant (fixtures/kill_map.json, .md) and the smallest
greedy set of cases that kills them all (fixtures/smoke_set.txt, the `smoke` case set).

Here, on CPU and in a few minutes:
- every mutant still applies (its snippet occurs exactly once, so a kernel refactor cannot
  silently turn a mutant into the unmutated kernel);
- the stored map, the smoke set and the dead-weight list agree with each other and with the
  current parity set and mutant list;
- the smoke set really kills every mutant now (each mutant runs in a subprocess, its known
  killers first, stopping at the first kill: a mutant that segfaults the interpreter on a
  wrapped 32-bit address counts as killed, as it does in the map);
- the shipped, unmutated kernels pass the smoke set, so a kill is the mutation's doing.
"""
from __future__ import annotations

import json
import os
import re

import pytest

from decode_conformance import mutation as mu
from decode_conformance.case_sets import build_set

MUTANTS = mu.load_mutants()
REGEN = f"regenerate with `{mu.REGENERATE}`"
DEAD_WEIGHT_FILE = mu.ROOT / "fixtures" / "dead_weight.md"


def _kill_map() -> dict[str, list[str]]:
    if not mu.KILL_MAP_FILE.exists():
        pytest.fail(f"{mu.KILL_MAP_FILE} is missing; {REGEN}")
    return json.loads(mu.KILL_MAP_FILE.read_text())


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
                    f"still plants its bug, then {REGEN} --only {m.name}")
    assert m.find != m.replace


# ---- stored artefacts in sync ---------------------------------------------------------------
def test_kill_map_covers_exactly_the_mutants():
    kill_map = _kill_map()
    names = {m.name for m in MUTANTS}
    assert set(kill_map) == names, (f"kill map out of date: missing {sorted(names - set(kill_map))}, "
                                    f"stale {sorted(set(kill_map) - names)}; {REGEN}")


def test_every_mutant_is_killed_in_the_map():
    survivors = [n for n, ks in _kill_map().items() if not ks]
    assert not survivors, f"mutants no parity case kills: {survivors}; add a case that catches each"


def test_every_killer_is_a_current_parity_case():
    parity = set(_parity_ids())
    stale = sorted({k for ks in _kill_map().values() for k in ks} - parity)
    assert not stale, f"{len(stale)} killer ids are not in the parity set (e.g. {stale[0]}); {REGEN}"


def test_smoke_set_is_the_greedy_cover_of_the_map():
    order = _parity_ids()
    expected = mu.greedy_cover(_kill_map(), order)
    stored = mu.read_smoke()
    assert stored == expected, f"{mu.SMOKE_FILE} is out of sync with the kill map; {REGEN}"
    assert [c.id for c in build_set("smoke", "interpreter")] == [c for c in order if c in set(stored)]


def test_smoke_set_carries_over_to_the_gpu_profile():
    assert len(build_set("smoke", "gpu")) == len(mu.read_smoke())


def test_kill_report_lists_every_mutant():
    assert mu.KILL_REPORT_FILE.exists(), f"{mu.KILL_REPORT_FILE} is missing; {REGEN}"
    text = mu.KILL_REPORT_FILE.read_text()
    assert mu.report_table(_kill_map(), MUTANTS, mu.read_smoke()) in text, \
        f"{mu.KILL_REPORT_FILE} does not match kill_map.json; `python -m decode_conformance.mutation --report`"


def test_dead_weight_is_justified():
    """Every parity case that kills no mutant is listed, with a reason, in fixtures/dead_weight.md."""
    killers = {k for ks in _kill_map().values() for k in ks}
    dead = {c for c in _parity_ids() if c not in killers}
    text = DEAD_WEIGHT_FILE.read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))
    assert dead <= listed, f"cases that kill no mutant and are not justified in {DEAD_WEIGHT_FILE.name}: " \
                           f"{sorted(dead - listed)}"
    assert not listed - dead, f"{DEAD_WEIGHT_FILE.name} lists cases that are not dead weight: {sorted(listed - dead)}"


# ---- the kills are real now --------------------------------------------------------------------
@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_smoke_set_kills_mutant(m):
    kill_map = _kill_map()
    smoke = mu.read_smoke()
    assert smoke, f"{mu.SMOKE_FILE} is empty or missing; {REGEN}"
    known = set(kill_map.get(m.name, ()))
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
    kernel = getattr(registry, kernel_name)()
    failures = []
    for case in build_set("smoke", "interpreter"):
        if kernel.caps.missing_for(case, "cpu"):
            continue
        res = run_case(kernel, case, "cpu")
        if not res.ok:
            failures.append(f"{case.id}: {res.message}")
    assert not failures, f"the unmutated {kernel_name} fails smoke cases:\n" + "\n".join(failures)

"""Pairwise coverage: the generator, the axis table's round trip, and 100 % of the valid pairs
covered for every registered kernel on both profiles (what `python -m
decode_conformance.coverage --check` reports)."""
from __future__ import annotations

import itertools

import pytest

from decode_conformance import case_sets as cs
from decode_conformance.kernel_api import Capabilities
from decode_conformance.pairwise import Constraint, CoveringProblem


# ---- the generator on a small problem ----------------------------------------------------
AX = {"a": ("0", "1", "2"), "b": ("x", "y"), "c": ("p", "q", "r"), "d": ("on", "off")}


def _problem(groups=None):
    cons = [Constraint.from_predicate(AX, ("a", "b"), lambda a, b: not (a == "2" and b == "y"), "no 2 with y")]
    return CoveringProblem(AX, cons, groups)


def test_generator_covers_every_valid_pair_and_respects_constraints():
    p = _problem()
    rows = p.generate()
    assert all(p.valid(r) for r in rows)
    covered, targets = p.coverage(rows)["all"]
    assert covered == targets
    assert (("a", "2"), ("b", "y")) not in targets  # impossible pair: not counted
    assert len(rows) < len(list(itertools.product(*AX.values())))
    assert rows == _problem().generate(), "not deterministic"


def test_fingerprint_follows_what_generate_reads():
    base = _problem().fingerprint()
    assert _problem().fingerprint() == base  # the same problem, built again
    reordered = CoveringProblem(dict(reversed(list(AX.items()))), _problem().constraints)
    looser = CoveringProblem(AX, [Constraint.from_predicate(AX, ("a", "b"), lambda a, b: True)])
    grouped = _problem({"g": {"a": ("0", "1")}})
    assert len({base, reordered.fingerprint(), looser.fingerprint(), grouped.fingerprint()}) == 4


def test_rows_are_read_only_from_the_same_problem(tmp_path):
    """covering_rows reads a rows file whose fingerprint is the problem's (planted rows are used
    as given) and generates otherwise (the planted rows are not)."""
    import json
    p = _problem()
    planted = [dict(r, d="off") for r in p.generate()][:2]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"fingerprint": p.fingerprint(), "rows": planted}))
    assert cs.covering_rows(p, path) == planted
    path.write_text(json.dumps({"fingerprint": "0" * 16, "rows": planted}))
    assert cs.covering_rows(p, path) == p.generate()
    path.write_text("not json")
    assert cs.covering_rows(p, path) == p.generate()


def test_shipped_pairwise_rows_are_fresh():
    """The shipped rows (fixtures/pairwise_rows.json) are what the generator gives for today's
    axis table, constraints and capability groups; the parity set reads them instead of
    generating in every process."""
    import json
    from decode_conformance.resources import data_path
    problem = cs.covering_problem()
    shipped = json.loads(data_path(cs.PAIRWISE_FILE).read_text())
    assert shipped["fingerprint"] == problem.fingerprint(), (
        f"{cs.PAIRWISE_FILE} was generated from another axis table, constraint set or generator; "
        f"regenerate it: {cs.PAIRWISE_REGENERATE}")
    assert [dict(r) for r in shipped["rows"]] == problem.generate()


def test_generator_covers_each_group_within_its_values():
    p = _problem({"all": {}, "no-on": {"d": ("off",)}, "only-2": {"a": ("2",)}})
    rows = p.generate()
    cov = p.coverage(rows)
    for g, (covered, targets) in cov.items():
        assert covered == targets, g
    # a row counts for a group only when every value of it is the group's
    on_rows = [r for r in rows if r["d"] == "on"]
    assert on_rows and not any(p.allowed("no-on", r) for r in on_rows)
    assert (("a", "2"), ("d", "on")) not in set(p.targets()["no-on"])


# ---- the axis table --------------------------------------------------------------------------
@pytest.mark.parametrize("profile", cs.PROFILES)
def test_every_recipe_realizes_and_reads_back(profile):
    for r in cs.pairwise_recipes():
        recipe = dict(r)
        case = cs.realize(recipe, profile)
        assert case is not None, recipe
        assert cs.classify(case, profile) == recipe, case.id


@pytest.mark.parametrize("profile", cs.PROFILES)
def test_every_axis_value_is_in_the_parity_set(profile):
    seen = {(a, v) for c in cs.build_set("parity", profile) for a, v in cs.classify(c, profile).items()}
    assert {(a, v) for a, vs in cs.AXES.items() for v in vs} <= seen


def test_table_has_the_issue_values():
    assert {"g1", "g3", "g5", "g6", "g7", "mqa"} <= set(cs.AXES["heads"])
    assert {"d64", "d80", "d96", "d128", "d256", "mla576", "mla288"} <= set(cs.AXES["head_dim"])
    assert {"zero-one", "long-short", "all-long", "split-edge"} <= set(cs.AXES["lengths"])
    assert set(cs.AXES["window"]) == {"none", "counts-current", "excludes-current"}
    from decode_conformance.cases import DATA_KINDS
    assert set(cs.AXES["data"]) == set(DATA_KINDS) and cs.AXES["data"][0] == "structured"


def test_interpreter_sizes_stay_small():
    """CPU time: few requests, short lengths, two KV heads (mqa: one) on the interpreter profile;
    query heads at most g29's 58."""
    for c in cs.build_set("parity", "interpreter"):
        if c.label:
            continue
        assert c.batch <= 3 and c.max_len <= 520 and c.num_kv_heads <= 2 and c.num_q_heads <= 58, c.id


def test_gpu_profile_reaches_long_contexts():
    cases = [c for c in cs.build_set("parity", "gpu") if not c.label]
    assert max(c.max_len for c in cases) >= 131072
    assert any(c.num_kv_heads == 8 for c in cases)


def test_value_domains_follow_capabilities():
    lean_like = cs.value_domains(Capabilities(softcap=False, sinks=False))
    assert lean_like["softcap"] == ("off",) and lean_like["sinks"] == ("off",)
    assert lean_like["kv_dtype"] == cs.AXES["kv_dtype"]
    fp8 = cs.value_domains(Capabilities(kv_dtypes=frozenset({"e4m3", "e5m2"})))
    assert fp8["kv_dtype"] == ("e4m3", "e5m2") and fp8["layout"] == cs.AXES["layout"]
    no_window = cs.value_domains(Capabilities(window_convention=None, mla=False))
    assert no_window["window"] == ("none",)
    assert not set(no_window["head_dim"]) & set(cs.MLA_SHAPES)


# ---- the split rules behind window_keys and split-edge ------------------------------------------
def test_split_constants_are_the_kernels():
    from decode_conformance_kernels import lean, triton_common
    assert cs.lean_block_n("interpreter") == lean.launch_defaults("cpu", 64)["block_n"]
    assert cs.lean_block_n("gpu") == lean.launch_defaults("cuda", 64)["block_n"]
    assert cs.split_unit("interpreter") % triton_common.kernel_config("cpu", 64, 64, False)["block_n"] == 0


@pytest.mark.parametrize("profile", cs.PROFILES)
def test_split_edge_is_a_boundary_of_every_rule(profile):
    from decode_conformance_kernels import split_rule
    b = cs.split_edge(profile)
    from decode_conformance_kernels.fixed_split import DEFAULT_SPLITS as S, SPLIT_ALIGN as A

    def fixed_splits(n):  # fixed_split._fixed_split_len: (length of a split, splits holding keys)
        per = -(-(-(-n // S)) // A) * A
        return per, -(-n // per)

    per, count = fixed_splits(b)
    assert per * count == b and count == S  # all 8 splits full
    per1, count1 = fixed_splits(b + 1)
    assert (b + 1) - per1 * (count1 - 1) < per1  # b + 1: a partial last split
    assert b % cs.lean_block_n(profile) == 0  # Lean: whole key tiles at b, a 1-key tile at b + 1
    for cap in (1, 8, 64):
        ends = [e for _, e in split_rule.chunk_ranges_for_cap(b, cap)]
        assert all(e % split_rule.KEY_BLOCK == 0 for e in ends)
        last = split_rule.chunk_ranges_for_cap(b + 1, cap)[-1]
        assert (last[1] - last[0]) % split_rule.KEY_BLOCK == 1


# ---- coverage, per registered kernel ------------------------------------------------------------
@pytest.mark.parametrize("profile", cs.PROFILES)
def test_pairwise_coverage_is_complete_for_every_kernel(profile):
    from decode_conformance.coverage import compute, default_specs, report
    results = compute(default_specs(), [profile])
    assert {r.kernel for r in results} >= {"fixed_split", "adaptive_split", "lean", "dispatch", "torch_gather",
                                           "torch_sdpa"}
    short = [r for r in results if not r.complete]
    assert not short, "pairwise coverage below 100 %:\n" + report(short, missing=10)


def test_coverage_names_what_is_missing():
    from decode_conformance.coverage import kernel_coverage, report
    from decode_conformance_kernels import registry
    cases = cs.build_set("parity", "interpreter")[:10]
    r = kernel_coverage(registry.torch_gather(), cases, "interpreter")
    assert not r.complete and r.covered < r.valid and r.missing
    assert "not covered:" in report([r])


def test_coverage_command_exit_code(capsys):
    from decode_conformance.coverage import main
    assert main(["--profile", "interpreter", "--kernel", "torch_gather", "--check"]) == 0
    assert "100.00%" in capsys.readouterr().out


def test_coverage_check_fails_on_stale_shipped_rows(tmp_path, monkeypatch, capsys):
    import json
    from decode_conformance import coverage
    from decode_conformance.resources import data_path
    assert coverage.stale_rows() == ""  # the shipped rows are fresh (test_shipped_pairwise_rows_are_fresh)
    shipped = json.loads(data_path(cs.PAIRWISE_FILE).read_text())
    stale = tmp_path / cs.PAIRWISE_FILE
    stale.write_text(json.dumps(dict(shipped, fingerprint="from-another-axis-table")))
    assert cs.PAIRWISE_REGENERATE in coverage.stale_rows(stale)
    check = coverage.stale_rows
    monkeypatch.setattr(coverage, "stale_rows", lambda path=None: check(stale))
    assert coverage.main(["--profile", "interpreter", "--kernel", "torch_gather", "--check"]) == 1
    assert "100.00%" in (said := capsys.readouterr()).out and cs.PAIRWISE_REGENERATE in said.err


def test_write_pairwise_writes_the_checkout_it_runs_from(tmp_path):
    """`python -m decode_conformance.case_sets --write-pairwise` run in a second copy of the
    project wrote the rows of the copy that was pip-installed (editable) instead: the command
    did not alias its own checkout's data folder, as every other command does."""
    import os
    import shutil
    import subprocess
    import sys

    from suites.selftest._subpytest import ROOT, child_env
    copy = tmp_path / "second-checkout"
    copy.mkdir()
    for name in ("decode_conformance", "fixtures", "kernels"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    (copy / "fixtures" / cs.PAIRWISE_FILE).unlink()
    ours = ROOT / "fixtures" / cs.PAIRWISE_FILE
    before = ours.stat().st_mtime_ns
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-m", "decode_conformance.case_sets", "--write-pairwise"], cwd=copy,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == f"wrote {copy / 'fixtures' / cs.PAIRWISE_FILE}", run.stdout
    assert (copy / "fixtures" / cs.PAIRWISE_FILE).read_text() == ours.read_text()  # the same rows, regenerated
    assert ours.stat().st_mtime_ns == before and os.path.exists(ours)

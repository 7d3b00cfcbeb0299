"""The NVIDIA adopter template's jobs, run: their shell steps executed as a runner would
(workflow_steps.py) in an adopter's repository made here - README's kernel module in a
package of its own, a base commit and a head commit, an `origin` to fetch from - with the
suite installed from its wheel, on CPU.

- conformance: install, then parity on the smoke set (workflow_dispatch's case_set input),
  green for README's correct kernel and red, with reproduce lines in the step summary, for its
  planted bug;
- perf on a pull request: the base commit's package copied in as `mypkg_base` (imports
  rewritten) and the A/B guard run against it - A/A passes, a planted slowdown fails - then
  recording baselines and the nightly comparison with them.

On this CPU the step that checks the runner's GPU against its label is left out (it needs
CUDA), and the perf guard reads the fake timing source of the perf self-tests
($DECODE_CONFORMANCE_PERF_FAKE): the template's plumbing is what runs here, not a GPU timing.
The AMD template is not run: its install step is apt-get and a ROCm torch.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import sysconfig
from typing import Optional

import pytest

from decode_conformance.perf import sources
from suites.selftest._subpytest import ROOT
from suites.selftest.test_installed import CLEAN_ENV, _building_in, _readme_adopter_module
from suites.selftest.workflow_steps import Workflow

TEMPLATE = Workflow(ROOT / "ci" / "templates" / "decode-conformance-nvidia.yml")
NO_GPU = {"The runner's GPU is its label's class": "it needs a CUDA GPU; this self-test runs on CPU"}
KERNEL = "mypkg.conformance:MyDecode"


def _git(*args, cwd) -> str:
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                       env={**CLEAN_ENV, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.strip()


@pytest.fixture(scope="module")
def runner_env(tmp_path_factory):
    """(the runner's environment, the suite's wheel, a folder for adopter repositories)."""
    tmp = tmp_path_factory.mktemp("template")
    with _building_in(ROOT):
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(tmp / "dist"), str(ROOT)], cwd=tmp, env=CLEAN_ENV, capture_output=True, text=True,
                           timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = (tmp / "dist").glob("*.whl")
    # The runner's Python has torch (a CUDA runner keeps its own; the template's venv uses
    # --system-site-packages): here a user site whose .pth borrows this environment's packages.
    userbase = tmp / "userbase"
    user_site = userbase / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # No network: the kernel package installs with --no-build-isolation, by this environment's
    # setuptools (the venv's own, from ensurepip, predates building an editable install alone).
    build = tmp / "build-tools"
    build.mkdir()
    purelib = pathlib.Path(sysconfig.get_paths()["purelib"])
    for src in [purelib / n for n in ("setuptools", "pkg_resources", "_distutils_hack")] + \
            list(purelib.glob("setuptools-*.dist-info")):
        (build / src.name).symlink_to(src)
    env = {**CLEAN_ENV, "PYTHONUSERBASE": str(userbase), "PYTHONPATH": str(build), "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return env, wheel, tmp


def _adopter_repo(where: pathlib.Path, extra: str = "", files: Optional[dict] = None):
    """An adopter's repository: package `mypkg` holding README's kernel module (+ `extra`, and
    `files`), a base commit and a head commit (the module's TREE says which), pushed to an
    `origin`. Returns (workspace, base sha, head sha)."""
    origin, work = where / "origin.git", where / "work"
    _git("init", "-q", "--bare", str(origin), cwd=where)
    _git("clone", "-q", str(origin), str(work), cwd=where)
    (work / "mypkg").mkdir()
    (work / "mypkg" / "__init__.py").write_text("")
    for name, text in (files or {}).items():
        (work / "mypkg" / name).write_text(text)
    (work / "pyproject.toml").write_text('[project]\nname = "mypkg"\nversion = "0"\n'
                                         '[tool.setuptools]\npackages = ["mypkg"]\n')
    module = _readme_adopter_module() + extra
    (work / "mypkg" / "conformance.py").write_text(module + '\nTREE = "base"\n')
    _git("add", "-A", cwd=work)
    _git("commit", "-qm", "base", cwd=work)
    base = _git("rev-parse", "HEAD", cwd=work)
    (work / "mypkg" / "conformance.py").write_text(module + '\nTREE = "head"\n')
    _git("commit", "-qam", "head", cwd=work)
    head = _git("rev-parse", "HEAD", cwd=work)
    _git("push", "-q", "origin", "HEAD:main", cwd=work)
    return work, base, head


@pytest.fixture(scope="module")
def adopter(runner_env):
    """(the runner's environment, the workspace, base sha, head sha, the suite's wheel)."""
    env, wheel, tmp = runner_env
    (tmp / "repo").mkdir()
    work, base, head = _adopter_repo(tmp / "repo")
    return env, work, base, head, wheel


def _vars(wheel, **more) -> dict:
    return {"DECODE_CONFORMANCE_SOURCE": str(wheel), "DECODE_CONFORMANCE_KERNELS": KERNEL,
            "DECODE_CONFORMANCE_KERNEL_INSTALL": "--no-build-isolation -e .", "DECODE_CONFORMANCE_PYTHON": sys.executable,
            **more}


def _run(adopter, tmp_path, job, github, vars, inputs=None, env=None, shell=None):
    base_env, work, *_ = adopter
    return TEMPLATE.run_job(job, workspace=work, runner_temp=tmp_path / "runner", github=github, vars=vars,
                            inputs=inputs, matrix={"gpu_class": "sm_90"}, base_env={**base_env, **(env or {})},
                            skip=NO_GPU, default_shell=shell)


@pytest.mark.parametrize("kernel,green", [(KERNEL, True), ("mypkg.conformance:MyDecodeDropsLastKey", False)])
def test_conformance_job(adopter, tmp_path, kernel, green):
    _, work, _, head, wheel = adopter
    job = _run(adopter, tmp_path, "conformance", {"event_name": "workflow_dispatch", "sha": head},
               _vars(wheel, DECODE_CONFORMANCE_KERNELS=kernel), inputs={"case_set": "smoke"})
    parity = job.step("Parity")
    assert job.step("Install").outcome == "success", job.text()
    assert parity.outcome == ("success" if green else "failure"), job.text()
    assert job.env["CASE_SET"] == "smoke"  # the workflow_dispatch input
    assert job.summary.startswith("# Decode conformance: cpu (cpu), case set `smoke`"), job.summary[:2000]
    assert (work / "reports" / "sm_90.md").exists() and (work / "reports" / "sm_90-parity.xml").exists()
    if not green:
        assert "reproduce: `python -m pytest -p decode_conformance.plugin --pyargs" in job.summary, job.summary[:3000]
    assert job.step("Fuzz mode (").outcome == "skipped", "fuzz runs nightly, or by hand with fuzz_examples"


@pytest.mark.parametrize("kernel,green", [(KERNEL, True), ("mypkg.conformance:MyDecodeDropsLastKey", False)])
def test_nightly_fuzz_step_shows_a_find_as_the_line_to_pin(adopter, tmp_path, kernel, green):
    """Fuzz mode after the parity run, a seed per run (the run id): a find's case reaches the step
    summary as the JSON line to append to the adopter's cases file, which then rebuilds it."""
    from decode_conformance.cases import Case
    _, work, _, head, wheel = adopter
    job = _run(adopter, tmp_path, "conformance", {"event_name": "workflow_dispatch", "sha": head, "run_id": "4711"},
               _vars(wheel, DECODE_CONFORMANCE_KERNELS=kernel), inputs={"case_set": "smoke", "fuzz_examples": "5"})
    fuzz = job.step("Fuzz mode (")
    assert fuzz.outcome == ("success" if green else "failure"), job.text()
    assert (work / "reports" / "sm_90-fuzz.xml").exists(), job.text()
    if green:
        assert "Fuzz mode found" not in job.summary, job.summary[-2000:]
        return
    assert "--fuzz-seed=4711" in (work / "reports" / "sm_90-fuzz.log").read_text(), "the reproduce line's seed"
    block = job.summary.split("## Fuzz mode found a failing case (seed 4711, 5 examples)", 1)[1]
    lines = block.split("```")[1].strip().splitlines()
    assert lines, job.summary[-2000:]
    for line in lines:
        case = Case.from_dict(json.loads(line))
        assert case.batch >= 1, line


def test_conformance_job_runs_the_adopters_own_cases(adopter, tmp_path):
    """DECODE_CONFORMANCE_EXTRA_CASES names a cases file of the adopter's repository (a path in
    it, as the ledger's); its cases join the set the job runs from its empty folder."""
    import json

    from decode_conformance.cases import Case
    _, work, _, head, wheel = adopter
    pinned = Case("bf16", 2, 1, 64, (37, 5), seed=4242)
    (work / "conformance").mkdir(exist_ok=True)
    (work / "conformance" / "cases.jsonl").write_text("# a find of ours\n" + json.dumps(pinned.to_dict()) + "\n")
    job = _run(adopter, tmp_path, "conformance", {"event_name": "workflow_dispatch", "sha": head},
               _vars(wheel, DECODE_CONFORMANCE_EXTRA_CASES="conformance/cases.jsonl"), inputs={"case_set": "smoke"})
    assert job.step("Parity").outcome == "success", job.text()
    assert pinned.id in (work / "reports" / "sm_90-parity.xml").read_text(), job.text()


@pytest.mark.parametrize("job_name, next_step", [("conformance", "Parity"), ("perf", "Perf guard")])
def test_each_job_refuses_the_unpinned_placeholder(adopter, tmp_path, job_name, next_step):
    _, _, _, head, wheel = adopter
    vars = _vars(wheel, DECODE_CONFORMANCE_PERF_CLASSES='["sm_90"]')
    del vars["DECODE_CONFORMANCE_SOURCE"]  # the template's own default: YOUR-ORG@FULL-COMMIT-HASH
    job = _run(adopter, tmp_path, job_name, {"event_name": "push", "sha": head}, vars)
    assert job.step("Install").outcome == "failure" and "pinned to a full commit hash" in job.step("Install").output
    assert job.step(next_step).outcome == "skipped", job.text()


def _pull_request(base: str, head: str) -> dict:
    return {"event_name": "pull_request", "sha": head, "repository": "org/kernels",
            "event": {"pull_request": {"base": {"sha": base}, "head": {"repo": {"full_name": "org/kernels"}}}}}


@pytest.mark.parametrize("shell", [None, "bash"], ids=["default-shell", "shell-bash-pipefail"])
def test_perf_job_ab_against_the_base_commit(adopter, tmp_path, shell):
    """A/A passes and a planted slowdown fails, with GitHub's default shell and under the
    `defaults: run: shell: bash` (pipefail) many repositories set: README's kernel package has
    no absolute self-import to rewrite, and that must not fail the step."""
    env, work, base, head, wheel = adopter
    vars = _vars(wheel, DECODE_CONFORMANCE_PERF_CLASSES='["sm_90"]', DECODE_CONFORMANCE_PACKAGE="mypkg")
    assert TEMPLATE.job_condition("perf", github=_pull_request(base, head), vars=vars)
    assert not TEMPLATE.job_condition("perf", github=_pull_request(base, head), vars=_vars(wheel)), \
        "no perf classes: no perf job"
    same = _run(adopter, tmp_path / "aa", "perf", _pull_request(base, head), vars,
                env={sources.FAKE_ENV: json.dumps({"seed": 1})}, shell=shell)
    ab = same.step("The base commit's kernel")
    assert ab.outcome == "success" and f"A/B against {base}" in ab.output, same.text()
    assert same.step("Perf guard").outcome == "success", same.text()
    assert "mypkg_base.conformance:MyDecode" in same.summary and "**slower**" not in same.summary, same.summary[:3000]
    # the reference is the base commit's code, imported under its own name beside the head's
    probe = subprocess.run([str(tmp_path / "aa" / "runner" / "dc-venv" / "bin" / "python"), "-c",
                            "import mypkg.conformance as h, mypkg_base.conformance as b; print(h.TREE, b.TREE)"],
                           cwd=tmp_path, env={**env, "PYTHONPATH": same.env["PYTHONPATH"]}, capture_output=True,
                           text=True, timeout=120)
    assert probe.stdout.split() == ["head", "base"], probe.stdout + probe.stderr
    slow = _run(adopter, tmp_path / "slow", "perf", _pull_request(base, head), vars,
                env={sources.FAKE_ENV: json.dumps({"seed": 2, "slowdown": 0.05})}, shell=shell)
    guard = slow.step("Perf guard")
    assert guard.outcome == "failure" and "SLOWER: my_decode" in guard.output, slow.text()
    # the modelled timing decided the verdict, so the line pasted re-runs with it
    assert "**slower**" in slow.summary and f"reproduce: {sources.FAKE_ENV}=" in guard.output
    assert " python -m pytest -p decode_conformance.plugin " in guard.output.split("reproduce: ", 1)[1]


def test_perf_job_records_then_compares_nightly(adopter, tmp_path):
    """Recording (workflow_dispatch, record_baselines) writes the baselines folder the upload
    step keeps; committed, the nightly run (no base: no A/B) compares with them in CI mode."""
    _, work, base, head, wheel = adopter
    vars = _vars(wheel, DECODE_CONFORMANCE_PERF_CLASSES='["sm_90"]', DECODE_CONFORMANCE_PACKAGE="mypkg",
                 DECODE_CONFORMANCE_BASELINES="conformance/baselines")
    fake = {sources.FAKE_ENV: json.dumps({"seed": 3})}
    rec = _run(adopter, tmp_path / "rec", "perf", {"event_name": "workflow_dispatch", "sha": head}, vars,
               inputs={"record_baselines": True}, env=fake)
    assert rec.step("The base commit's kernel").outcome == "skipped", rec.text()
    assert rec.step("Perf guard").outcome == "success", rec.text()
    recorded = sorted(p.relative_to(work).as_posix() for p in (work / "conformance" / "baselines").rglob("*.json"))
    # the class the suite detects: `cpu` here; on a runner, its GPU's (the left-out step holds
    # that to the runner's label)
    assert recorded == ["conformance/baselines/cpu/my_decode.json"], recorded
    nightly = _run(adopter, tmp_path / "nightly", "perf", {"event_name": "schedule", "sha": head}, vars,
                   env={sources.FAKE_ENV: json.dumps({"seed": 4})})
    guard = nightly.step("Perf guard")
    assert guard.outcome == "success", nightly.text()
    assert "## perf guard (compare): fake GPU, class cpu" in nightly.summary, nightly.summary[:2000]
    assert f"records {work / 'conformance' / 'baselines'}" in nightly.summary, nightly.summary[:2000]
    slow = _run(adopter, tmp_path / "slow", "perf", {"event_name": "schedule", "sha": head}, vars,
                env={sources.FAKE_ENV: json.dumps({"seed": 5, "gpu_class": "sm_90", "slowdown": 0.05})})
    assert slow.step("Perf guard").outcome == "failure" and "SLOWER" in slow.step("Perf guard").output, slow.text()


def test_perf_job_refuses_a_base_copy_that_imports_the_head_package(runner_env, tmp_path):
    """A self-import the rewrite cannot see (`import os, mypkg.timing`) would load the head's
    code into the reference - an A/B of the head against itself, green whatever changed. The
    A/B step stops instead, naming the module and the way out."""
    env, wheel, _ = runner_env
    (tmp_path / "repo").mkdir()
    work, base, head = _adopter_repo(tmp_path / "repo", extra="\nimport os, mypkg.timing  # noqa\n",
                                     files={"timing.py": "WARMUP = 3\n"})
    vars = _vars(wheel, DECODE_CONFORMANCE_PERF_CLASSES='["sm_90"]', DECODE_CONFORMANCE_PACKAGE="mypkg")
    job = TEMPLATE.run_job("perf", workspace=work, runner_temp=tmp_path / "runner", github=_pull_request(base, head),
                           vars=vars, matrix={"gpu_class": "sm_90"},
                           base_env={**env, sources.FAKE_ENV: json.dumps({"seed": 1})}, skip=NO_GPU)
    ab = job.step("The base commit's kernel")
    assert ab.outcome == "failure", job.text()
    assert "mypkg_base imported the head package (mypkg, mypkg.timing)" in ab.output, ab.output
    assert "DECODE_CONFORMANCE_REFERENCE_INSTALL" in ab.output and job.step("Perf guard").outcome == "skipped"

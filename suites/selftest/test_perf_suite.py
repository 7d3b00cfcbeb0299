"""The perf suite as a whole pytest run, on CPU with the fake timing source
($DECODE_CONFORMANCE_PERF_FAKE): pytest-benchmark's files are written and read back (the
guard reads a `--benchmark-json` file as a record; `pytest-benchmark list / compare` read the
guard's records), `--benchmark-compare-fail` works on these runs, an A/B run (A/A passes, a
planted slowdown fails), the CI perf shard of ci/shards.toml, and the usage errors."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from decode_conformance.perf import sources, store
from suites.selftest._subpytest import GOOD, ROOT, child_env, paste, run_pytest

SPEC = GOOD
KERNEL = "torch_gather"
BASE = ("suites/perf", "-p", "no:xdist", "--gpu-class=sm_90", f"--kernel={SPEC}")


def _fake(**kw) -> dict:
    return {sources.FAKE_ENV: json.dumps(kw)}


def _pb(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_benchmark", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_pytest_benchmark_files_are_written_and_read_back(tmp_path):
    recs, storage = tmp_path / "records", tmp_path / "storage"
    rec = run_pytest(*BASE, f"--perf-baseline-dir={recs}", "--perf-record", f"--benchmark-json={tmp_path}/rec.json",
                     f"--benchmark-storage=file://{storage}", "--benchmark-save=rec", env=_fake(seed=1))
    assert rec.rc == 0, rec.out[-3000:]
    ours = store.load(store.record_path(recs, "sm_90", KERNEL), "sm_90", KERNEL)
    theirs = store.load(tmp_path / "rec.json", "sm_90", KERNEL)  # what pytest-benchmark wrote
    assert ours and set(ours) == set(theirs)
    for cell, c in ours.items():
        # the same values, through pytest-benchmark's clock (a subtraction of two clock readings)
        assert theirs[cell]["median_us"] == pytest.approx(c["median_us"], rel=1e-9)
        assert theirs[cell]["noise_rel"] == c["noise_rel"]
        assert theirs[cell]["gpu_name"] == "fake GPU" and theirs[cell]["tbs"] > 0
    saved = sorted(storage.glob("*/0001_rec.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["machine_info"]["gpu"]["gpu_name"] == "fake GPU"
    # pytest-benchmark's own file is a record the guard compares with: one store
    (tmp_path / "pb" / "sm_90").mkdir(parents=True)
    shutil.copy(tmp_path / "rec.json", tmp_path / "pb" / "sm_90" / f"{KERNEL}.json")
    same = run_pytest(*BASE, f"--perf-baseline-dir={tmp_path / 'pb'}", "--perf-require-baseline", env=_fake(seed=2))
    assert same.rc == 0 and "7 passed" in same.out, same.out[-3000:]
    # pytest-benchmark's command line lists and compares the guard's records and its saved run
    listed = _pb("--storage", f"file://{recs}", "list", cwd=tmp_path)
    assert listed.returncode == 0 and f"sm_90/{KERNEL}.json" in listed.stdout, listed.stdout + listed.stderr
    cmp = _pb("compare", f"records/sm_90/{KERNEL}.json", str(saved[0].relative_to(tmp_path)), "--group-by=param:cell",
              cwd=tmp_path)  # relative paths: pytest-benchmark 5 cannot mix them with absolute ones
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    assert "benchmark 'cell=b1-128k-32x8x128': 2 tests" in cmp.stdout and "Median" in cmp.stdout, cmp.stdout


def test_benchmark_compare_fail_works_on_device_time(tmp_path):
    storage = f"--benchmark-storage=file://{tmp_path}/storage"
    first = run_pytest(*BASE, f"--perf-baseline-dir={tmp_path}", storage, "--benchmark-autosave", "-k", "b1-128k",
                       env=_fake(seed=1))
    assert first.rc == 0, first.out[-3000:]
    slow = run_pytest(*BASE, f"--perf-baseline-dir={tmp_path}", storage, "--benchmark-compare",
                      "--benchmark-compare-fail=median:3%", "-k", "b1-128k", env=_fake(seed=2, slowdown=0.05))
    assert slow.rc == 1 and "Performance has regressed" in slow.out, slow.out[-3000:]


def test_ab_run_passes_a_a_and_fails_a_planted_slowdown(tmp_path):
    args = (*BASE, f"--perf-baseline-dir={tmp_path}", f"--perf-reference={SPEC}", f"--perf-report={tmp_path}/rep")
    same = run_pytest(*args, env=_fake(seed=1))
    assert same.rc == 0 and "perf guard (ab, reference" in same.out, same.out[-3000:]
    slow = run_pytest(*args, env=_fake(seed=2, slowdown=0.05))
    assert slow.rc == 1 and f"SLOWER: {KERNEL} b1-128k-32x8x128" in slow.out and "vs reference" in slow.out, \
        slow.out[-3000:]
    md = (tmp_path / "rep" / "perf.md").read_text()
    assert f"### {KERNEL}: **" in md and "| ratio |" in md and "**slower**" in md
    rows = json.loads((tmp_path / "rep" / "perf.json").read_text())["rows"]
    assert rows and all(r["ratio"] for r in rows if r["status"] != "skipped")


def test_a_slower_cell_prints_a_line_that_re_runs_its_one_verdict(tmp_path):
    """Each failing perf test prints a reproduce line (also in the report's row) carrying what
    decided its verdict - the A/B reference, the records' folder and, on a CPU, the modelled
    timing - that, pasted, re-runs that one (kernel, cell) test: failing with that slowdown,
    passing with the same line's timing model without it."""
    import shlex
    args = (*BASE, "-k", "b1-128k or b4-ragged", f"--perf-baseline-dir={tmp_path}", f"--perf-reference={SPEC}")
    fake = _fake(seed=2, slowdown=0.05)
    slow = run_pytest(*args, report=tmp_path / "r", env=fake)
    assert slow.rc == 1, slow.out[-3000:]
    rows = {r["param"]: r["repro"] for r in slow.report["results"] if r["test"].endswith("test_perf")}
    assert set(rows) == {f"[{KERNEL}-b1-128k-32x8x128]", f"[{KERNEL}-b4-ragged-32x8x128]"}, rows
    for param, line in rows.items():
        assert f"reproduce: {line}" in slow.out
        env_part, *argv = shlex.split(line)
        assert env_part == f"{sources.FAKE_ENV}={fake[sources.FAKE_ENV]}", line
        assert argv[:5] == ["python", "-m", "pytest", "-p", "decode_conformance.plugin"], line
        assert f"suites/perf/test_perf.py::test_perf{param}" in argv and f"--kernel={SPEC}" in argv, line
        assert {f"--perf-reference={SPEC}", f"--perf-baseline-dir={tmp_path}", "--gpu-class=sm_90"} <= set(argv), line
    line = rows[f"[{KERNEL}-b1-128k-32x8x128]"]
    unslowed = line.replace(shlex.quote(fake[sources.FAKE_ENV]), shlex.quote(_fake(seed=2)[sources.FAKE_ENV]), 1)
    assert unslowed != line
    for pasted, rc, last in ((line, 1, " 1 failed"), (unslowed, 0, " 1 passed")):
        again = paste(pasted, ROOT, child_env())
        assert again.returncode == rc and again.stdout.splitlines()[-1].split(" in ")[0].endswith(last), \
            pasted + "\n" + again.stdout[-2000:] + again.stderr[-2000:]


def test_ab_run_takes_a_candidate_tree_under_another_import_name(tmp_path):
    """benchmarks/README.md's A/B of two trees: the candidate's kernels/ copied as
    decode_conformance_kernels_cand, its kernel of the same name timed against main's. A/A
    passes; the planted slowdown of the candidate fails naming it."""
    cand = tmp_path / "tree" / "decode_conformance_kernels_cand"
    shutil.copytree(ROOT / "kernels", cand, ignore=shutil.ignore_patterns("__pycache__"))
    args = ("suites/perf", "-p", "no:xdist", "--gpu-class=sm_90", "-k", "b1-128k", f"--perf-baseline-dir={tmp_path}",
            f"--kernel={cand.name}.registry:{KERNEL}", f"--perf-reference=decode_conformance_kernels.registry:{KERNEL}")
    path = {"PYTHONPATH": os.pathsep.join(filter(None, [str(cand.parent), os.environ.get("PYTHONPATH")]))}
    same = run_pytest(*args, env={**_fake(seed=1), **path})
    assert same.rc == 0 and f"perf guard (ab, reference decode_conformance_kernels.registry:{KERNEL}" in same.out, \
        same.out[-3000:]
    slow = run_pytest(*args, env={**_fake(seed=2, slowdown=0.05), **path})
    assert slow.rc == 1 and f"SLOWER: {KERNEL} b1-128k-32x8x128" in slow.out, slow.out[-3000:]
    # its reproduce line names the folder the candidate was imported from, so it re-runs when
    # pasted where PYTHONPATH is not set (a CI log's line, on a developer's machine)
    line = next(ln.split("reproduce: ", 1)[1] for ln in slow.out.splitlines() if "reproduce: " in ln)
    assert f"PYTHONPATH={cand.parent} " in line, line
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    again = paste(line, ROOT, env)
    assert again.returncode == 1 and again.stdout.splitlines()[-1].split(" in ")[0].endswith(" 1 failed"), \
        line + "\n" + again.stdout[-2000:] + again.stderr[-2000:]


def test_ab_run_holds_beside_a_record_of_another_gpu_model(tmp_path):
    """A/B gates on the ratio: the shipped records are an H200's, and a pool runner of another
    model (the fake GPU) reads none of them - its model has no record there - yet gets its A/B
    verdict on the run's own spread. A damaged record of its own model is left out, said so."""
    args = ("suites/perf", "-p", "no:xdist", "--gpu-class=sm_90", f"--kernel={SPEC}", f"--perf-reference={SPEC}")
    same = run_pytest(*args, env=_fake(seed=1))
    assert same.rc == 0 and f"A/B: no record of sm_90/{KERNEL} on 'fake GPU' in " in same.out, same.out[-3000:]
    slow = run_pytest(*args, env=_fake(seed=2, slowdown=0.05))
    assert slow.rc == 1 and f"SLOWER: {KERNEL} b1-128k-32x8x128" in slow.out, slow.out[-3000:]
    # without a reference: no record of this model, reported with the file it would be
    plain = run_pytest("suites/perf", "-p", "no:xdist", "--gpu-class=sm_90", f"--kernel={SPEC}", env=_fake(seed=1))
    assert plain.rc == 0 and f"no record for sm_90/{KERNEL} on 'fake GPU'" in plain.out \
        and f"{KERNEL}@fake-gpu.json" in plain.out, plain.out[-3000:]
    (tmp_path / "sm_90").mkdir()
    (tmp_path / "sm_90" / f"{KERNEL}.json").write_text("{not json")
    damaged = run_pytest(*args, f"--perf-baseline-dir={tmp_path}", env=_fake(seed=1))
    assert damaged.rc == 0 and "record left out of the A/B run" in damaged.out and "corrupt" in damaged.out, \
        damaged.out[-3000:]
    # the note on thresholds says the record was left out, not that there is none
    assert f"A/B: the record of sm_90/{KERNEL} left out: thresholds come from" in damaged.out, damaged.out[-3000:]


@pytest.mark.parametrize("target", [("suites/perf",), ("--pyargs", "decode_conformance.suites.perf")],
                         ids=["path", "pyargs"])
@pytest.mark.parametrize("options, said", [
    (("--perf-record", "--perf-require-baseline"), "--perf-record and --perf-require-baseline together"),
    (("--perf-record", f"--perf-reference={SPEC}"), f"--perf-record and --perf-reference={SPEC} together"),
    (("--perf-require-baseline", "-n", "2"), "--perf-require-baseline under xdist (-n / --dist=load)"),
    ((f"--perf-reference={SPEC}", "-n", "2"), "--perf-reference under xdist (-n / --dist=load)"),
], ids=["record+require", "record+reference", "require under -n", "reference under -n"])
def test_option_clashes_are_one_usage_error_in_both_forms(target, options, said):
    """In the checkout's form and the installed one (--pyargs, the adopters' and the templates'):
    pytest's usage error, once, before collection, exit 4 - not a traceback, and never a green
    run under -n whose every cell skipped (the guard does not time on xdist workers)."""
    r = run_pytest(*target, "--gpu-class=sm_90", f"--kernel={SPEC}", *options, env=_fake(seed=1))
    errors = [ln for ln in r.out.splitlines() if ln.startswith("ERROR: ")]
    assert r.rc == 4 and len(errors) == 1 and said in errors[0], r.out[-3000:]
    assert "Traceback" not in r.out and "collected" not in r.out, r.out[-3000:]


@pytest.mark.parametrize("spec, said", [
    ("mypkg_base.conformance:MyDecode", "cannot import mypkg_base.conformance: no module named 'mypkg_base'"),
    ("decode_conformance_kernels:nothing", "kernel spec 'decode_conformance_kernels:nothing'"),
])
def test_a_reference_that_does_not_load_is_one_usage_error_before_collection(tmp_path, spec, said):
    """As a --kernel that does not load: pytest's usage error, once, before any test is collected,
    naming the option and what the reference is in CI (the base commit's copy)."""
    r = run_pytest(*BASE, f"--perf-baseline-dir={tmp_path}", f"--perf-reference={spec}", env=_fake(seed=1))
    lines = [ln for ln in r.out.splitlines() if ln.startswith("ERROR: --perf-reference (the A/B reference: in CI, "
                                                              "the base commit's copy")]
    assert r.rc == 4 and len(lines) == 1 and r.out.count(said) == 1, r.out[-3000:]
    assert "collected" not in r.out and "Exit" not in r.out, r.out[-3000:]


def test_require_baseline_without_a_gpu_stops_the_run():
    r = run_pytest(*BASE, "--perf-require-baseline", "-k", "b1-4k", env={sources.FAKE_ENV: ""})
    assert r.rc == 4 and "machine without a GPU" in r.out, r.out[-3000:]


def test_perf_suite_skips_on_cpu_and_under_xdist():
    r = run_pytest("suites/perf", "-rs", "-k", "b1-4k", env={sources.FAKE_ENV: ""})
    assert r.rc == 0 and "the perf guard needs a GPU" in r.out, r.out[-3000:]
    r = run_pytest("suites/perf", "-rs", "-k", "b1-4k", env={**_fake(seed=1), "PYTEST_XDIST_WORKER": "gw0"})
    assert r.rc == 0 and "does not time under xdist" in r.out, r.out[-3000:]


# ---- CI ----------------------------------------------------------------------------------------

def _perf_shard_commands():
    """[(class, trigger, argv)] of every shard of ci/shards.toml that runs suites/perf."""
    spec = importlib.util.spec_from_file_location("ci_shards", ROOT / "ci" / "shards.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ci_shards", mod)  # dataclasses in the module look themselves up there
    spec.loader.exec_module(mod)
    data = mod.load()
    out = []
    for cls in data["class"]:
        for trig in mod.TRIGGERS:
            for c in mod.commands(cls, trig, runner="perf", data=data):
                if c.suite.rstrip("/").endswith("perf"):
                    out.append((cls, trig, list(c.argv)))
    return out


def test_ci_perf_shard_requires_a_record():
    cmds = _perf_shard_commands()
    assert cmds, "ci/shards.toml runs the perf suite nowhere"
    for cls, trig, argv in cmds:
        assert "--perf-require-baseline" in argv, (
            f"{cls} {trig}: the CI perf shard must pass --perf-require-baseline (a missing record must fail); "
            f"ci/shards.toml [shard.perf] needs it in args. Command now: {' '.join(argv)}")
        assert "-n" not in argv, "perf must not run under xdist"


def test_ci_perf_shard_fails_on_a_planted_regression(tmp_path):
    _, _, argv = _perf_shard_commands()[0]
    assert argv[:3] == ["python", "-m", "pytest"]
    drop = ("--conformance-report", "--junitxml", "--perf-baseline-dir", "--perf-require-baseline")
    args = [a for a in argv[3:] if not a.startswith(drop)] + ["--gpu-class=sm_90", f"--kernel={SPEC}",
                                                             f"--perf-baseline-dir={tmp_path}"]
    rec = run_pytest(*args, "--perf-record", env=_fake(seed=1))
    assert rec.rc == 0 and (tmp_path / "sm_90" / f"{KERNEL}.json").exists(), rec.out[-3000:]
    slow = run_pytest(*args, "--perf-require-baseline", report=tmp_path / "report", env=_fake(seed=3, slowdown=0.05))
    assert slow.rc == 1 and f"SLOWER: {KERNEL} b1-128k-32x8x128" in slow.out, slow.out[-3000:]
    rows = [r for r in slow.report["results"] if r["test"].endswith("test_perf")]
    assert rows and all(r["status"] == "failed" and "SLOWER" in r["message"] for r in rows)
    assert all(f"test_perf.py::test_perf{r['param']}" in r["repro"] and "--perf-require-baseline" in r["repro"]
               for r in rows), rows


def test_missing_record_fails_the_ci_mode_run_and_names_a_command_that_records_it(tmp_path):
    import re
    import shlex
    r = run_pytest(*BASE, f"--perf-baseline-dir={tmp_path}", "--perf-require-baseline", "-k", "b1-128k",
                   env=_fake(seed=1))
    said = re.search(r"record one with: (python -m pytest [^\n]+?)(?: \| |\n)", r.out)
    assert r.rc == 1 and f"no record for sm_90/{KERNEL}" in r.out and said, r.out[-3000:]
    rec = run_pytest(*shlex.split(said[1])[3:], env=_fake(seed=1))  # pasted where the run was started
    assert rec.rc == 0 and (tmp_path / "sm_90" / f"{KERNEL}.json").exists(), said[1] + "\n" + rec.out[-3000:]
    again = run_pytest(*BASE, f"--perf-baseline-dir={tmp_path}", "--perf-require-baseline", "-k", "b1-128k",
                       env=_fake(seed=1))
    assert again.rc == 0, again.out[-3000:]

"""Crash and hang isolation, end to end: one `pytest suites/parity` run (in a child process)
with a good kernel, every fault-injecting kernel of faulty_kernels.py and a canary, under
--isolation=process. Each faulty kernel must fail only its own cases, with a message saying
what it did; every other result must be kept; the run must finish and write a report with a
one-line reproduce command for every failure.

Order of kernels matters: the canary runs right after `cuda_error`, so it passes only if the
worker was replaced after the device error (it fails in a process where cuda_error ran);
torch_gather runs first and `canary` last, so results before and after the crashes are kept.
"""
from __future__ import annotations

import re
import shlex

import pytest

from decode_conformance.state import DEFAULT_CASE_TIMEOUT, resolve_isolation
from suites.selftest._subpytest import GOOD, PARITY, ROOT, faulty, run_pytest, small_case_ids

TIMEOUT_S = 5  # per case; a good case here takes < 0.5 s, even on a busy 2-core machine
_REPLACED = r"kernel replaced batch\.out with \((?P<got>[\d, ]+)\) (?P<got_dtype>\w+) on (?P<got_dev>\w+) " \
            r"\(suite buffer: \((?P<own>[\d, ]+)\) (?P<own_dtype>\w+) on (?P<own_dev>\w+)\)"

# kernel attribute -> (kernel name, message pattern, extra check on the regex match or None)
EXPECTED = {
    # The kernel's own traceback, trimmed to its frames (none of the suite's runner).
    "raises": ("faulty_raises", r"(?s)^kernel raised: RuntimeError: faulty kernel: deliberate failure.*"
                                r'faulty_kernels\.py", line \d+, in _raise', lambda m: "runner.py" not in m.string),
    "wrong_shape": ("faulty_wrong_shape", "^" + _REPLACED,
                    lambda m: m["got"] != m["own"] and m["got_dtype"] == m["own_dtype"]),
    "wrong_dtype": ("faulty_wrong_dtype", "^" + _REPLACED,
                    lambda m: m["got"] == m["own"] and (m["got_dtype"], m["own_dtype"]) == ("float32", "bfloat16")),
    "wrong_device": ("faulty_wrong_device", "^" + _REPLACED,
                     lambda m: (m["got_dev"], m["own_dev"]) == ("meta", "cpu")),
    "nan": ("faulty_nan", r"^FAIL: 1 non-finite output elements", None),
    "unwritten": ("faulty_unwritten", r"^FAIL: \d+ non-finite output elements.*non-finite LSE", None),
    "hang": ("faulty_hang", rf"^hung: no result within {TIMEOUT_S} s \(kernel killed, worker restarted\); "
                            r"stack: _hang \(suites/selftest/faulty_kernels\.py:\d+\)", None),
    "abort": ("faulty_abort", r"^crashed: worker exited with signal SIGABRT; stack: .*_abort", None),
    "segfault": ("faulty_segfault", r"^crashed: worker exited with signal SIGSEGV; stack: .*_segfault", None),
    "exit_in_launch": ("faulty_exit", r"^crashed: worker exited with code 1\b", None),
    "cuda_error": ("faulty_cuda_error", r"(?s)^kernel raised: RuntimeError: CUDA error: an illegal memory access.*"
                                        r"\(device context poisoned: worker restarted\)$", None),
}
GOOD_NAMES = ("torch_gather", "faulty_canary")


def test_faulty_kernels_fail_only_their_own_cases(tmp_path):
    cases = small_case_ids(2)
    specs = [GOOD] + [faulty(a) for a in EXPECTED] + [faulty("canary")]
    run = run_pytest(PARITY, "-q", "-rN", *[f"--kernel={s}" for s in specs], *[f"--case-id={c}" for c in cases],
                     "--isolation=process", f"--case-timeout={TIMEOUT_S}", report=tmp_path / "report", timeout=240)
    tail = run.out[-3000:]
    n_bad, n_good = len(EXPECTED) * len(cases), len(GOOD_NAMES) * len(cases)

    # The run finished on its own: failures (rc 1), not an interrupt or internal error.
    assert run.rc == 1, f"exit code {run.rc}\n{tail}"
    assert "INTERNALERROR" not in run.out, tail
    assert re.search(rf"\b{n_bad} failed, {n_good} passed\b", run.out), tail
    assert run.report is not None, f"no report written\n{tail}"

    rows = run.rows()
    by_key = {}
    for r in rows:
        assert (r["kernel"], r["case"]) not in by_key, f"two report rows for {r['kernel']} {r['case']}"
        by_key[(r["kernel"], r["case"])] = r
    problems = []
    for name in GOOD_NAMES:  # every other result is kept, before and after the crashes
        for c in cases:
            r = by_key.get((name, c))
            if r is None or r["status"] != "passed":
                problems.append(f"{name} {c}: expected passed, got {r and (r['status'], r['message'])}")
    for attr, (name, pattern, check) in EXPECTED.items():
        for c in cases:
            r = by_key.get((name, c))
            if r is None:
                problems.append(f"{name} {c}: no report row")
                continue
            m = re.search(pattern, r["message"])
            if r["status"] != "failed" or m is None or (check is not None and not check(m)):
                problems.append(f"{name} {c}: status {r['status']!r}, message {r['message']!r} "
                                f"does not match {pattern!r}")
    assert len(rows) == n_bad + n_good, f"{len(rows)} report rows, expected {n_bad + n_good}"
    assert not problems, "\n".join(problems)

    # One line to reproduce every failure, in the JSON and in the Markdown, naming the
    # kernel spec and the case id (principle 6).
    failures = [r for r in rows if r["status"] in ("failed", "error", "xpassed")]
    assert len(failures) == n_bad
    spec_of = {EXPECTED[a][0]: faulty(a) for a in EXPECTED}
    for r in failures:
        repro = r["repro"]
        assert repro and "\n" not in repro, f"{r['kernel']} {r['case']}: repro {repro!r}"
        argv = shlex.split(repro)
        assert argv[:6] == ["python", "-m", "pytest", "-p", "decode_conformance.plugin",
                            "suites/parity/test_parity.py::test_parity"], repro
        assert f"--kernel={spec_of[r['kernel']]}" in argv and f"--case-id={r['case']}" in argv, repro
        assert f"reproduce: `{repro}`" in run.md, f"{r['kernel']} {r['case']}: repro missing from the Markdown"

    # A crash shows the worker's last output (faulthandler's stack) in the failure text.
    assert "isolation worker output (last lines):" in run.out and "Fatal Python error" in run.out, tail


@pytest.mark.parametrize("device,iso,timeout,expected", [
    ("cpu", None, None, ("none", DEFAULT_CASE_TIMEOUT["cpu"])),
    ("cuda", None, None, ("process", DEFAULT_CASE_TIMEOUT["gpu"])),
    ("cuda:1", None, None, ("process", DEFAULT_CASE_TIMEOUT["gpu"])),
    ("cpu", "process", 0.0, ("process", None)),
    ("cuda", "none", 30.0, ("none", 30.0)),
])
def test_isolation_defaults(device, iso, timeout, expected):
    assert resolve_isolation(device, iso, timeout) == expected


def test_negative_case_timeout_is_refused():
    with pytest.raises(pytest.UsageError, match="--case-timeout"):
        resolve_isolation("cpu", None, -1.0)


def test_timeout_without_isolation_ends_the_run_and_says_why():
    """--isolation=none cannot stop a kernel inside the process: past --case-timeout the run
    ends (instead of hanging CI forever), naming the case and pointing at --isolation=process."""
    case = small_case_ids(1)[0]
    run = run_pytest(PARITY, "-q", f"--kernel={faulty('hang')}", f"--case-id={case}", "--isolation=none",
                     "--case-timeout=1", timeout=120)
    assert run.rc not in (0, 5), run.out[-2000:]
    assert f"faulty_hang on {case} gave no result within --case-timeout=1 s under --isolation=none" in run.out
    assert re.search(r"Timeout \(0:00:01\.5", run.out) and "_hang" in run.out, run.out[-2000:]


def test_a_run_that_ends_early_leaves_its_partial_report(tmp_path):
    """A run that never reaches its end (here: a hang under --isolation=none; on CI: a job limit)
    still leaves PATH.partial.jsonl with the rows it finished and the test it was stuck on; a
    run that ends removes it (the full report replaces it)."""
    from decode_conformance.report import read_partial
    case = small_case_ids(1)[0]
    report = tmp_path / "rep"
    run = run_pytest(PARITY, "-q", f"--kernel={GOOD}", f"--kernel={faulty('hang')}",
                     f"--case-id={case}", "--isolation=none", "--case-timeout=1", f"--conformance-report={report}",
                     timeout=120)
    assert run.rc not in (0, 5), run.out[-2000:]
    partial = tmp_path / "rep.partial.jsonl"
    assert partial.exists() and not (tmp_path / "rep.json").exists(), run.out[-2000:]
    rows, in_flight = read_partial(partial)
    assert [(r["kernel"], r["status"]) for r in rows if r["case"] == case] == [("torch_gather", "passed")], rows
    assert len(in_flight) == 1 and "faulty_hang" in in_flight[0] and case in in_flight[0], in_flight
    ok = run_pytest(PARITY, "-q", f"--kernel={GOOD}", f"--case-id={case}", f"--conformance-report={report}",
                    timeout=120)
    assert ok.rc == 0 and (tmp_path / "rep.json").exists() and not partial.exists(), ok.out[-2000:]


def test_a_relaunch_that_kills_or_hangs_fails_only_its_own_scenario_case(tmp_path):
    """Out-of-tree kernels correct on every first launch of a plan that abort the process /
    hang on the second launch of one plan (a graph replay on a GPU): in the whole parity suite
    under --isolation=process only their same-plan-twice case fails (crashed / hung), and every
    other scenario's result before and after it is kept. --case-id picks scenario cases by id."""
    from decode_conformance.scenarios import fixed_cases
    fixed = fixed_cases("interpreter")
    ids = small_case_ids(1) + [c.id for name in ("determinism", "same-plan-twice") for c in fixed[name]]
    ids.append(fixed["batch-invariance"][0].id)
    bad = {"faulty_abort_on_relaunch": r"^crashed: worker exited with signal SIGABRT; stack: .*_abort",
           "faulty_hang_on_relaunch": rf"^hung: no result within {TIMEOUT_S} s \(kernel killed, worker restarted\)"}
    specs = [faulty("abort_on_relaunch"), GOOD, faulty("hang_on_relaunch")]
    run = run_pytest("suites/parity", "-q", "-rN", *[f"--kernel={s}" for s in specs], *[f"--case-id={c}" for c in ids],
                     "--isolation=process", f"--case-timeout={TIMEOUT_S}", report=tmp_path / "report", timeout=400)
    tail = run.out[-3000:]
    assert run.rc == 1 and "INTERNALERROR" not in run.out, f"exit code {run.rc}\n{tail}"
    rows = run.report["results"]
    failed = sorted((r["kernel"], r["scenario"]) for r in rows if r["status"] in ("failed", "error", "xpassed"))
    assert failed == sorted((k, "same-plan-twice") for k in bad), tail
    for r in rows:
        if r["status"] == "failed":
            assert re.search(bad[r["kernel"]], r["message"]), r["message"]
            assert f"--case-id={r['case']}" in shlex.split(r["repro"]), r["repro"]
    kept = {(r["kernel"], r["scenario"]) for r in rows if r["status"] == "passed"}
    for k in list(bad) + ["torch_gather"]:
        for scenario in ("parity", "batch-invariance") + (("determinism",) if k in bad else ()):
            assert (k, scenario) in kept, f"{k} {scenario}: no passed row\n{tail}"
    assert all(r["case"] in ids for r in rows if r["case"]), "a case outside --case-id ran"


def test_every_scenario_names_a_contract_violation_and_how_to_reproduce_it():
    """A kernel that writes q, and one that hands back a new out tensor, fail determinism,
    the relaunch of one plan and batch invariance with what they did (as parity says it), and
    each failure prints the command that re-runs exactly that scenario case."""
    from decode_conformance.scenarios import fixed_cases
    fixed = fixed_cases("interpreter")
    test_of = {"determinism": "suites/parity/test_determinism.py::test_bitwise_repeatable",
               "same-plan-twice": "suites/parity/test_determinism.py::test_same_plan_launched_twice",
               "batch-invariance": "suites/parity/test_batch_invariance.py::test_request_is_independent_of_its_batch"}
    ids = {fixed[name][0].id: test for name, test in test_of.items()}
    said = {"faulty_writes_q": "kernel wrote to its inputs: q", "faulty_replaces_out": "kernel replaced batch.out with"}
    run = run_pytest("suites/parity/test_determinism.py", "suites/parity/test_batch_invariance.py", "-q",
                     *[f"--kernel={faulty(a)}" for a in ("writes_q", "replaces_out")],
                     *[f"--case-id={c}" for c in ids], timeout=300)
    assert run.rc == 1 and re.search(r"\b6 failed\b", run.out), run.out[-3000:]
    for name, text in said.items():
        for cid in ids:
            block = re.search(rf"\[{name}\] {re.escape(cid)}: (?P<msg>.*?)\n  seed=.*?\n  reproduce: (?P<repro>[^\n]+)",
                              run.out, re.S)
            assert block and text in block["msg"], f"{name} {cid}\n{run.out[-3000:]}"
            argv = shlex.split(block["repro"])
            assert argv[:6] == ["python", "-m", "pytest", "-p", "decode_conformance.plugin", ids[cid]], block["repro"]
            assert f"--case-id={cid}" in argv, block["repro"]
    # The line runs that one test on that one case and nothing else: no other test of the file
    # (or folder) turns up as a skip for the case it filtered out.
    again = run_pytest(*shlex.split(block["repro"])[3:], "-q", timeout=300)
    assert again.rc == 1 and re.search(r"^=* ?1 failed in [\d.]+s", again.out.splitlines()[-1]), again.out[-3000:]


def test_a_bitwise_check_says_which_declaration_it_holds_the_kernel_to():
    """A kernel whose result moves by an ulp on a new plan fails determinism, and one whose plan
    moves by an ulp when launched again fails the same-plan relaunch; each message names the
    capability the kernel declared, which is why the check ran."""
    from decode_conformance.scenarios import fixed_cases
    fixed = fixed_cases("interpreter")
    ids = [fixed[name][0].id for name in ("determinism", "same-plan-twice")]
    run = run_pytest("suites/parity/test_determinism.py", "-q", "-p", "no:xdist",
                     f"--kernel={faulty('drifts_on_replan')}", f"--kernel={faulty('drifts_on_relaunch')}",
                     *[f"--case-id={c}" for c in ids], timeout=300)
    assert run.rc == 1 and re.search(r"\b2 failed\b", run.out), run.out[-3000:]
    assert re.search(r"\[faulty_drifts_on_replan\] .*differs from the first run: .*; the kernel declares "
                     r"deterministic", run.out), run.out[-3000:]
    assert re.search(r"\[faulty_drifts_on_relaunch\] .*second launch of one plan differs from the first: .*; "
                     r"the kernel declares cuda_graph_safe", run.out), run.out[-3000:]


@pytest.mark.parametrize("where", ["suites", "elsewhere"])
def test_a_reproduce_line_runs_in_the_folder_the_run_was_started_from(where, tmp_path):
    """The line names the test relative to the folder pytest was started in (where it is
    pasted), not to the rootdir: `pytest parity` from suites/, and a checkout's suite given by
    its absolute path from another folder, each print a line that re-runs the one failure
    there. Under -n 2: each worker builds the line."""
    folder = ROOT / "suites" if where == "suites" else tmp_path
    target = "parity/test_parity.py" if where == "suites" else str(ROOT / PARITY)
    env = {"PYTHONPATH": str(ROOT)}
    case = small_case_ids(1)[0]
    run = run_pytest(target, "-q", "-n", "2", f"--kernel={faulty('nan')}", f"--case-id={case}",
                     env=env, cwd=folder, timeout=300)
    lines = sorted({ln.split("reproduce: ", 1)[1] for ln in run.out.splitlines()
                    if ln.strip().startswith("reproduce: ")})
    assert run.rc == 1 and len(lines) == 1, run.out[-3000:]
    assert shlex.split(lines[0])[5] == f"{target}::test_parity", lines[0]
    again = run_pytest(*shlex.split(lines[0])[3:], "-q", env=env, cwd=folder, timeout=300)
    assert again.rc == 1 and re.search(r"^=* ?1 failed in [\d.]+s", again.out.splitlines()[-1]), again.out[-3000:]


def _poll(path, seconds: float) -> bool:
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return True
        time.sleep(0.05)
    return False


def test_the_isolated_worker_imports_its_kernels_before_the_first_case(tmp_path, monkeypatch):
    # A run's kernels are imported while its pytest process still collects, not by the first
    # case that needs them; a spec that cannot load does not stop the rest.
    from decode_conformance.case_sets import build_set
    from decode_conformance.isolation import IsolatedRunner
    marker = tmp_path / "imported-by"
    monkeypatch.setenv("DC_PRELOAD_MARKER", str(marker))
    spec = "suites.selftest.preload_marker:kernel"
    with IsolatedRunner("cpu", 60, preload=("no_such_package.kernels:nothing", spec)) as runner:
        runner.start()
        assert runner._wait_ready() is None
        assert _poll(marker, 60), "the worker did not import the preloaded kernel before any case"
        assert int(marker.read_text()) == runner._proc.pid
        res = runner.run(spec, build_set("smoke", "interpreter")[0], name="torch_gather")
    assert res.status == "passed", res.message

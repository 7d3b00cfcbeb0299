"""Fuzz mode: the strategy draws valid cases across the axes, a correct kernel passes, and
the planted bug of docs/fuzz.md - a kernel that re-derives the softmax scale from the shapes
instead of taking the caller's - passes the whole parity set yet is found within the
documented budget (seed 0, 200 examples) and shrunk to a one-key case printed as a
paste-ready regression record."""
from __future__ import annotations

import math
import os
import sys
import types

import pytest

from decode_conformance import fuzz as fz
from decode_conformance.case_sets import build_set
from decode_conformance.cases import INPUT_FORMS, Case
from suites.selftest._subpytest import OOT, ROOT, run_pytest

if str(OOT) not in sys.path:
    sys.path.insert(0, str(OOT))
import toy_decode  # noqa: E402

DEMO_SEED, DEMO_EXAMPLES = 0, 200  # docs/fuzz.md
PLANTED = "toy_decode:IgnoresCallerScale"


def _sample(caps, n=150, seed=3):
    """n cases the strategy draws for `caps` (nothing is run)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    seen = []

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @hseed(seed)
    @given(fz.case_strategy(caps, "interpreter", "cpu"))
    def collect(case):
        seen.append(case)

    collect()
    return seen


def test_strategy_draws_valid_cases_across_the_axes():
    from decode_conformance.kernel_api import Capabilities
    cases = _sample(Capabilities(num_splits=True), n=400)
    assert len(cases) >= 300 and all(isinstance(c, Case) for c in cases)
    groups = {c.group for c in cases if not c.mla}
    assert {1, 3, 5, 6, 7} & groups and any(g % 2 for g in groups if g > 1)
    assert any(c.mla for c in cases) and any(c.num_kv_heads == 1 and not c.mla for c in cases)
    assert len({c.page_size for c in cases if c.layout == "paged"}) >= 5
    assert any(c.layout == "contig" for c in cases) and any(c.combined_kv for c in cases)
    assert any(n % 2 for c in cases for n in c.seq_lens) and any(0 in c.seq_lens for c in cases)
    wins = [c for c in cases if c.window is not None]
    assert {c.window_convention for c in wins} == {"counts-current", "excludes-current"}
    assert any(c.visible_keys > c.max_len for c in wins) and any(c.visible_keys < c.max_len for c in wins)
    assert any(c.scale is not None for c in cases) and any(c.kv_scales is not None for c in cases)
    assert any(c.softcap for c in cases) and any(c.sinks for c in cases) and any(c.num_splits for c in cases)
    assert {c.data for c in cases} >= {"structured", "randn"}
    assert {c.inputs for c in cases} >= set(INPUT_FORMS) - {"v-head-major"}
    # head-major V needs a V of its own, pages of several slots and several KV heads: drawn
    # where the kernel's capabilities leave only such cases
    paged = _sample(Capabilities(mla=False, layouts=frozenset({"paged"}), page_sizes=frozenset({16})), n=100)
    assert any(c.inputs == "v-head-major" for c in paged)
    assert all(not c.mla and not c.combined_kv and c.num_kv_heads > 1 for c in cases + paged
               if c.inputs == "v-head-major")


def test_strategy_stays_within_capabilities():
    caps = toy_decode.CAPS.__class__(kv_dtypes=frozenset({"e4m3"}), softcap=False, sinks=False, mla=False,
                                     window_convention=None, layouts=frozenset({"paged"}),
                                     page_sizes=frozenset({16, 64}))
    for c in _sample(caps, n=60):
        assert not caps.missing_for(c, "cpu"), c.id
        assert c.kv_dtype == "e4m3" and c.page_size in (16, 64) and c.window is None and not c.mla


def test_correct_kernel_passes():
    out = fz.fuzz(toy_decode.ToyDecode(), "cpu", examples=25, seed=DEMO_SEED)
    assert not out.failed, out.text()
    assert out.examples_run >= 25


def test_parity_catches_the_planted_bug_since_the_scale_axis():
    """The demo's planted kernel re-derives the softmax scale from the shapes. Until the parity
    set had a scale axis (2026-12-05) every parity case used the shapes' default scale and the
    planted kernel passed them all; fuzz mode was what found it. Now each profile's parity set
    has cases at another scale, and the planted kernel fails them."""
    from decode_conformance.runner import run_case
    for profile in ("interpreter", "gpu"):
        other = [c for c in build_set("parity", profile) if c.scale is not None]
        assert len(other) >= 8, profile
        for c in other:
            fake = types.SimpleNamespace(v_from_k=c.mla, head_dim=c.head_dim, v_head_dim=c.v_head_dim)
            assert not math.isclose(toy_decode.shape_scale(fake), c.sm_scale, rel_tol=1e-3), c.id
    planted = toy_decode.IgnoresCallerScale()
    first = next(c for c in build_set("parity", "interpreter") if c.scale is not None and c.data != "zero-q")
    assert not run_case(planted, first, "cpu").ok, first.id


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The documented demo search, with an example database."""
    db = str(tmp_path_factory.mktemp("fuzzdb") / "hyp")
    return db, fz.fuzz(toy_decode.IgnoresCallerScale(), "cpu", examples=DEMO_EXAMPLES, seed=DEMO_SEED,
                       kernel_spec=PLANTED, database=db)


def test_fuzz_finds_and_shrinks_the_planted_bug(demo):
    _, out = demo
    assert out.failed, "the planted bug was not found within the documented budget"
    c = out.case
    assert c.scale is not None and c.batch == 1 and c.seq_lens == (1,), c.id
    # a bug of the scale alone shrinks to the plain shape, not to MLA (whose branch drew fewer
    # choices, so hypothesis's shortest sequence was an MLA case until 2026-12-07)
    assert not c.mla and c.head_dim == fz.HEAD_DIMS[0] and c.num_q_heads == 1, c.id
    assert "LSE" in out.message
    assert out.reproduce[0].startswith("python -m decode_conformance.fuzz --kernel toy_decode:IgnoresCallerScale")
    assert "--case-set=fuzz --fuzz-seed=0 --fuzz-examples=200 --fuzz-database=" in out.reproduce[1]
    # the record pastes into regressions.py as is and rebuilds the same case
    from decode_conformance import regressions
    ns = dict(vars(regressions))
    reg = eval(out.record.strip().rstrip(","), ns)
    (again,) = reg.cases("interpreter")
    assert again.replace(label="", note="") == c.replace(label="", note="")
    assert again.id.startswith(reg.label + "-")


def test_one_case_reproduces_from_its_json(capsys):
    c = Case("bf16", 2, 1, 64, (5,), scale=1 / 12, seed=4)
    import json
    rc = fz.main(["--kernel", PLANTED, "--case", json.dumps(c.to_dict())])
    assert rc == 1 and "LSE error" in capsys.readouterr().out


def test_fuzz_test_skips_outside_fuzz_mode():
    run = run_pytest("suites/parity/test_fuzz.py", "-q", "-rs", f"--kernel={PLANTED}",
                     env={"PYTHONPATH": os.pathsep.join([str(OOT), str(ROOT)])}, timeout=300)
    assert run.rc == 0 and "fuzz mode only" in run.out, run.out[-2000:]


def test_fuzz_mode_under_pytest_prints_the_record_once():
    # -rN: the short summary would repeat the message where CI is set in the environment
    run = run_pytest("suites/parity/test_fuzz.py", "-q", "-rN", f"--kernel={PLANTED}", "--case-set=fuzz",
                     env={"PYTHONPATH": os.pathsep.join([str(OOT), str(ROOT)]),
                          "DECODE_CONFORMANCE_FUZZ_EXAMPLES": str(DEMO_EXAMPLES),
                          "DECODE_CONFORMANCE_FUZZ_SEED": str(DEMO_SEED)}, timeout=600)
    assert run.rc == 1, run.out[-3000:]
    assert "as a regression record" in run.out and "Regression(" in run.out and "scale=" in run.out
    assert "reproduce the search:  python -m pytest -p decode_conformance.plugin suites/parity/test_fuzz.py" in run.out
    assert run.out.count("reproduce the search:") == 1, run.out[-3000:]


def test_a_record_summary_ends_at_a_clause():
    message = ("FAIL: 12 of 96 rows over budget; worst row (request 0, head 3) error 0.31 = 9.7x its budget "
               "(3x the tier's own error of that row + its fp32 ulp); cosine 0.998; 2 non-finite LSE rows")
    summary = fz._clipped(message, 160)
    assert len(summary) <= 160 and summary.endswith(" ...") and message.startswith(summary[:-4]), summary
    assert message[len(summary) - 4:].startswith(("; ", ", ", " (")), summary  # the next clause left out
    assert fz._clipped("short", 160) == "short"


def test_fuzz_command_lines_run_from_another_folder(tmp_path):
    """`python -m decode_conformance.fuzz` run outside the checkout prints two lines that each
    work from there: the case (a module command) and the search, whose test is named by a path
    that exists from that folder. (The installed form's `--pyargs` line: test_installed.py.)"""
    import shlex
    import subprocess
    from suites.selftest._subpytest import child_env
    env = child_env(PYTHONPATH=str(OOT))
    r = subprocess.run([sys.executable, "-m", "decode_conformance.fuzz", "--kernel", PLANTED, "--examples",
                        str(DEMO_EXAMPLES), "--seed", str(DEMO_SEED)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    lines = dict(ln.strip().split(":", 1) for ln in r.stdout.splitlines() if ln.strip().startswith("reproduce "))
    assert r.returncode == 1 and set(lines) == {"reproduce this case", "reproduce the search"}, r.stdout + r.stderr
    assert f" {ROOT}/suites/parity/test_fuzz.py::test_fuzz " in lines["reproduce the search"], lines
    for name, expect in (("reproduce this case", "LSE error"), ("reproduce the search", " 1 failed in ")):
        again = subprocess.run([sys.executable] + shlex.split(lines[name])[1:], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 1 and expect in again.stdout, (name, again.stdout[-2000:] + again.stderr[-2000:])


@pytest.mark.parametrize("mode", [("-p", "no:xdist"), ("-n", "2", "--isolation=process")], ids=["no-xdist", "xdist"])
def test_fuzz_mode_runs_the_whole_suite(tmp_path, mode):
    """`pytest suites/parity --case-set=fuzz` as README documents it, with and without xdist
    (and each drawn example through the isolated worker): the run ends in its verdict - exit
    code 1 for the kernel whose fuzz found a failure, the other kernel's pass kept - never an
    internal error, and the fuzz verdicts are the report's rows."""
    from suites.selftest._subpytest import GOOD, faulty
    run = run_pytest("suites/parity", "-q", *mode, f"--kernel={faulty('nan')}", f"--kernel={GOOD}",
                     "--case-set=fuzz", "--fuzz-examples=3", "--fuzz-shrink-seconds=5", report=tmp_path / "r",
                     timeout=600)
    assert run.rc == 1 and "INTERNALERROR" not in run.out, run.out[-3000:]
    status = {r["kernel"]: r["status"] for r in run.rows("test_fuzz")}
    assert status == {"faulty_nan": "failed", "torch_gather": "passed"}, run.out[-3000:]
    assert "shrunk to" in next(r["message"] for r in run.rows("test_fuzz") if r["status"] == "failed")


def test_case_id_in_fuzz_mode_is_a_usage_error():
    run = run_pytest("suites/parity", "-q", "--case-set=fuzz", "--case-id=bf16-contig-h8g4-d64-B1[1]-s1")
    assert run.rc == 4 and "--case-id with --case-set=fuzz" in run.out, run.out[-2000:]


def test_options_register_in_a_group():
    from decode_conformance import fuzz_options
    names = []

    class Group:
        def addoption(self, name, **kw):
            names.append(name)

    fuzz_options.add_options(Group())
    assert names == ["--fuzz-examples", "--fuzz-seed", "--fuzz-database", "--fuzz-shrink-seconds"]


def test_database_replays_the_failure_first(demo):
    db, first = demo
    assert first.failed and os.listdir(db)
    again = fz.fuzz(toy_decode.IgnoresCallerScale(), "cpu", examples=DEMO_EXAMPLES, seed=12345, database=db)
    assert again.failed and again.case == first.case and again.examples_run <= first.examples_run

"""One case outside pytest (decode_conformance.inspect): the same verdict as the parity test of
that case, red for a planted bug and green for a correct kernel that is not ours, the tensors
saved, and an unknown id a usage error with the nearest ids."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from decode_conformance import inspect as dci
from suites.selftest import planted  # noqa: F401  (puts the out-of-tree toy kernel on sys.path)
from suites.selftest._subpytest import OOT, ROOT, small_case_ids

CASE = small_case_ids(1)[0]


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DECODE_CONFORMANCE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(OOT)])
    return subprocess.run([sys.executable, "-m", "decode_conformance.inspect", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_open_case_builds_inputs_and_reference():
    opened = dci.open_case(CASE, device="cpu")
    assert opened.case.id == CASE
    assert opened.reference.out.dtype == torch.float64 and opened.reference.out.shape == opened.batch.out.shape
    assert torch.isnan(opened.batch.out).all(), "outputs arrive poisoned, as in a run"


def test_run_one_red_for_a_planted_bug_green_for_a_correct_kernel(tmp_path):
    bad = dci.run_one("toy_decode:DropsLastKey", CASE, device="cpu", save=str(tmp_path / "c.pt"))
    good = dci.run_one("toy_decode:ToyDecode", CASE, device="cpu")
    assert not bad.ok and "over their error budget" in bad.message, bad.message
    assert good.ok, good.message
    saved = torch.load(tmp_path / "c.pt")
    assert saved["case_id"] == CASE and saved["kernel"]["status"] == "failed"
    torch.testing.assert_close(saved["kernel"]["out"], bad.output)
    assert set(saved["inputs"]) >= {"q", "k_cache", "v_cache", "kv_indptr", "kv_indices"}


def test_cli_exit_codes():
    r = _cli(CASE, "--kernel=toy_decode:DropsLastKey", "--device=cpu")
    assert r.returncode == 1 and "FAIL" in r.stdout and "why this case exists" in r.stdout, r.stdout + r.stderr
    r = _cli(CASE, "--kernel=toy_decode:ToyDecode", "--device=cpu")
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    r = _cli(CASE + "x", "--kernel=toy_decode:ToyDecode", "--device=cpu")
    assert r.returncode == dci.USAGE_ERROR and f"nearest: {CASE}" in r.stderr, r.stdout + r.stderr


def test_a_drawn_case_opens_from_its_json(tmp_path):
    """A fuzz find has no id to look up: its JSON (the fuzz output's --case argument) opens it,
    red for a planted bug with its tensors saved, green for a correct kernel; a fuzz-set id
    says so."""
    import json
    from decode_conformance.cases import Case
    drawn = json.dumps(Case("bf16", 2, 1, 64, (5, 0), scale=1 / 12, seed=4).to_dict())
    r = _cli(drawn, "--kernel=toy_decode:DropsLastKey", "--device=cpu", f"--save={tmp_path / 'f.pt'}")
    assert r.returncode == 1 and "FAIL" in r.stdout and (tmp_path / "f.pt").exists(), r.stdout + r.stderr
    r = _cli(drawn, "--kernel=toy_decode:ToyDecode", "--device=cpu")
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    r = _cli('{"kv_dtype": "bf16", "heads": 2}', "--kernel=toy_decode:ToyDecode", "--device=cpu")
    assert r.returncode == dci.USAGE_ERROR and "case JSON: Case fields: unknown ['heads']" in r.stderr, r.stderr
    r = _cli("bf16-paged16-h1g1-d64-B1[2]-s1", "--case-set=fuzz", "--kernel=toy_decode:ToyDecode", "--device=cpu")
    assert r.returncode == dci.USAGE_ERROR and "a fuzz find has no fixed id: pass its JSON" in r.stderr, r.stderr
    # the id the fuzz output prints ("shrunk to ...") looks like any other: without --case-set
    r = _cli("bf16-paged16-h1g1-d64-B1[1]-s1", "--kernel=toy_decode:ToyDecode", "--device=cpu")
    assert r.returncode == dci.USAGE_ERROR and "for a fuzz find, pass its JSON" in r.stderr, r.stderr


def test_a_scenario_case_id_runs_its_scenario():
    """The ids a determinism / batch-invariance failure prints open too, running that scenario:
    red for a kernel whose output depends on the rest of the batch, green for a correct one."""
    from decode_conformance.scenarios import fixed_cases
    inv = fixed_cases("interpreter")["batch-invariance"][0].id
    assert dci.find_scenario_case(inv, device="cpu")[0] == "batch-invariance"
    good = dci.run_one("toy_decode:ToyDecode", inv, device="cpu")
    assert good.ok and good.scenario == "batch-invariance", good.message
    det = fixed_cases("interpreter")["determinism"][0].id
    bad = dci.run_one("toy_decode:DropsLastKey", det, device="cpu")
    assert not bad.ok and bad.scenario == "determinism" and "over their error budget" in bad.message, bad.message


def test_save_refuses_gigabytes_unless_asked(tmp_path):
    """A 2^31-element pool case would write ~4 GiB: refused, saying the size and the option."""
    from decode_conformance.case_sets import build_set
    pool = next(c.id for c in build_set("parity", "interpreter") if "pool" in c.id)
    r = _cli(pool, "--device=cpu", f"--save={tmp_path / 'p.pt'}")
    assert r.returncode == dci.USAGE_ERROR and "--save would write" in r.stderr and "--max-save-gib=" in r.stderr, \
        r.stdout + r.stderr
    assert not (tmp_path / "p.pt").exists()


def test_a_case_the_tests_skip_is_not_run_unless_forced():
    """A case needing what the kernel does not declare (Lean: no soft-cap) is one the parity test
    skips; inspect judged it anyway and said FAIL, against a contract the kernel never claimed.
    Now it is not run: the tests' reason, exit NOT_RUN; --force runs it."""
    from decode_conformance.case_sets import build_set
    capped = min((c for c in build_set("parity", "interpreter") if c.softcap is not None),
                 key=lambda c: sum(c.seq_lens) * c.num_q_heads).id
    res = dci.run_one("lean", capped, device="cpu")
    assert res.status == "skipped" and not res.ok and "lean lacks: soft-cap" in res.message, res.message
    r = _cli(capped, "--kernel=lean", "--device=cpu")
    assert r.returncode == dci.NOT_RUN and "not run: lean lacks: soft-cap" in r.stdout \
        and "--force" in r.stdout and "FAIL" not in r.stdout, r.stdout + r.stderr
    r = _cli(capped, "--kernel=lean", "--device=cpu", "--force")
    # launched: Lean's plan refuses a soft-cap, which is why it does not declare one
    assert r.returncode == 1 and "not run" not in r.stdout and "kernel raised: NotImplementedError" in r.stdout, \
        r.stdout + r.stderr

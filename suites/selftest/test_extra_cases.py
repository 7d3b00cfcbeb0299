"""An adopter's own cases (--extra-cases, decode_conformance/extra_cases.py): a fuzz find pinned
by the line the fuzz output prints fails the planted bug on every run and passes a correct
kernel that is not ours (the out-of-tree toy), joins whichever case set runs, is found again by
its reproduce line and by inspect, and a bad file is one usage error naming file and line. The
example database is shown to be no pin: passing runs delete a find's entries."""
from __future__ import annotations

import json
import os
import sys

import pytest

from decode_conformance import extra_cases
from decode_conformance import fuzz as fz
from suites.selftest._subpytest import OOT, ROOT, child_env, paste, run_pytest

if str(OOT) not in sys.path:
    sys.path.insert(0, str(OOT))
import toy_decode  # noqa: E402

PLANTED, CORRECT = "toy_decode:IgnoresCallerScale", "toy_decode:ToyDecode"
ENV = {"PYTHONPATH": os.pathsep.join([str(OOT), str(ROOT)])}


@pytest.fixture(scope="module")
def find():
    """The fuzz demo's find (docs/fuzz.md: seed 0) and the line its output says to pin."""
    out = fz.fuzz(toy_decode.IgnoresCallerScale(), "cpu", examples=200, seed=0, kernel_spec=PLANTED)
    assert out.failed, out.text()
    lines = out.text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("pin it in your repository"))
    return out.case, lines[at + 1].strip()


def _pinned(tmp_path, line: str):
    f = tmp_path / "regressions.jsonl"
    f.write_text(f"# found by fuzz seed 0: the caller's scale ignored\n\n{line}\n")
    return f


def test_a_pinned_find_fails_the_bug_every_run_and_passes_a_correct_kernel(tmp_path, find):
    case, line = find
    f = _pinned(tmp_path, line)
    args = ("suites/parity/test_parity.py", "-p", "no:xdist", "-q", f"--extra-cases={f}", f"--case-id={case.id}")
    for _ in range(2):  # the database erodes (below); the file does not
        red = run_pytest(*args, f"--kernel={PLANTED}", env=ENV)
        assert red.rc == 1 and red.out.splitlines()[-1].startswith("1 failed"), red.out[-3000:]
    green = run_pytest(*args, f"--kernel={CORRECT}", env=ENV)
    assert green.rc == 0 and green.out.splitlines()[-1].startswith("1 passed"), green.out[-3000:]
    # the failure's reproduce line names the file, so it finds the case when pasted
    repro = next(ln.split("reproduce: ", 1)[1] for ln in red.out.splitlines() if "reproduce: " in ln)
    assert f"--extra-cases={f}" in repro, repro
    again = paste(repro, ROOT, child_env(**ENV))
    assert again.returncode == 1 and again.stdout.splitlines()[-1].split(" in ")[0].endswith(" 1 failed"), \
        repro + "\n" + again.stdout[-2000:] + again.stderr[-2000:]


def test_pinned_cases_join_the_set_that_runs(tmp_path, find):
    case, line = find
    f = _pinned(tmp_path, line)
    base = ("suites/parity/test_parity.py", "-p", "no:xdist", "--collect-only", "-q", "--case-set=smoke",
            f"--kernel={CORRECT}")
    without = run_pytest(*base, env=ENV)
    with_file = run_pytest(*base, f"--extra-cases={f}", env=ENV)
    by_env = run_pytest(*base, env={**ENV, extra_cases.ENV_VAR: str(f)})
    count = [r.out.count("::test_parity[") for r in (without, with_file, by_env)]
    assert count[1] == count[2] == count[0] + 1 and case.id not in without.out, count
    assert case.id in with_file.out and case.id in by_env.out, with_file.out[-2000:]


def test_inspect_opens_a_pinned_case_by_its_id(tmp_path, find, capsys):
    from decode_conformance import inspect
    case, line = find
    f = _pinned(tmp_path, line)
    assert inspect.main([case.id, f"--kernel={PLANTED}", "--device=cpu", f"--extra-cases={f}"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert inspect.main([case.id, "--device=cpu"]) == inspect.USAGE_ERROR
    assert "--extra-cases=PATH" in capsys.readouterr().err


@pytest.mark.parametrize("content, said", [
    ('{"kv_dtype": "bf16"}\n', "regressions.jsonl:1: expected one case as a JSON object"),
    ('# note\n[1, 2]\n', "regressions.jsonl:2: expected one case as a JSON object"),
    ('{"kv_dtype": "bf17", "num_q_heads": 1, "num_kv_heads": 1, "head_dim": 64, "seq_lens": [5]}\n',
     "regressions.jsonl:1:"),
    (None, "regressions.jsonl: cannot read it"),
])
def test_a_bad_cases_file_is_one_usage_error_naming_file_and_line(tmp_path, content, said):
    f = tmp_path / "regressions.jsonl"
    if content is not None:
        f.write_text(content)
    r = run_pytest("suites/parity/test_parity.py", "-p", "no:xdist", "-q", f"--kernel={CORRECT}",
                   f"--extra-cases={f}", env=ENV)
    errors = [ln for ln in r.out.splitlines() if ln.startswith("ERROR: ")]
    assert r.rc == 4 and len(errors) == 1 and "--extra-cases: " in errors[0] and said in errors[0], r.out[-3000:]


def test_the_example_database_is_no_pin(tmp_path):
    """What the fuzz output and docs/fuzz.md say of --fuzz-database: a correct kernel under the
    same name replays the find and passes, and each such run deletes entries, until a returning
    bug would replay nothing."""
    db = str(tmp_path / "hyp")
    bad = toy_decode.IgnoresCallerScale()
    assert fz.fuzz(bad, "cpu", examples=200, seed=0, database=db).failed

    def entries():
        return sum(len(files) for _, _, files in os.walk(db))

    fixed = toy_decode.ToyDecode()
    fixed.name = bad.name
    counts = [entries()]
    for _ in range(3):
        assert not fz.fuzz(fixed, "cpu", examples=3, seed=1, database=db).failed
        counts.append(entries())
    assert counts == sorted(counts, reverse=True) and counts[-1] < counts[0], counts


def test_load_keeps_order_and_each_id_once(tmp_path, find):
    case, line = find
    f = tmp_path / "a.jsonl"
    other = json.dumps({**json.loads(line), "seed": 9})
    f.write_text("\n".join([line, other, line]) + "\n")
    got = extra_cases.load([str(f)])
    assert [c.seed for c in got] == [case.seed, 9]


def test_a_ledger_entry_about_a_pinned_case_applies_and_is_not_stale(tmp_path, find):
    """The adopter's ledger may accept a failure of their own case (a known bug, with its issue):
    the entry marks it xfail and is not warned about as matching no shipped case."""
    case, line = find
    f = _pinned(tmp_path, line)
    ledger = tmp_path / "known.toml"
    ledger.write_text(f'[[entry]]\nkernel = "toy_ignores_caller_scale"\ncase = "{case.id}"\nkind = "xfail"\n'
                      'reason = "the caller\'s scale ignored"\nissue = "https://example.com/issues/1"\n')
    r = run_pytest("suites/parity/test_parity.py", "-p", "no:xdist", "-q", f"--kernel={PLANTED}",
                   f"--extra-cases={f}", f"--case-id={case.id}", f"--ledger={ledger}", env=ENV)
    assert r.rc == 0 and r.out.splitlines()[-1].startswith("1 xfailed"), r.out[-3000:]
    assert "matches no case" not in r.out, r.out[-3000:]

"""The conformance report's table of every row (decode_conformance/report.py), read as a CI job
keeps it: a failure of the LSE alone reads as a failure, beside a correct kernel that is not
ours (the out-of-tree toy) whose row reads as a pass."""
from __future__ import annotations

import os

from suites.selftest._subpytest import OOT, PARITY, ROOT, faulty, run_pytest, small_case_ids



def _table_row(md: str, kernel: str, case: str) -> str:
    return next(ln for ln in md.splitlines() if ln.startswith(f"| {kernel} | test_parity::test_parity | `{case}` |"))


def test_an_lse_only_failure_reads_as_one_in_the_report(tmp_path):
    case = small_case_ids(1)[0]
    run = run_pytest(PARITY, f"--kernel={faulty('lse_off')}", "--kernel=toy_decode:ToyDecode", f"--case-id={case}",
                     report=tmp_path / "report", env={"PYTHONPATH": os.pathsep.join([str(OOT), str(ROOT)])},
                     timeout=180)
    rows = {r["kernel"]: r for r in run.rows()}
    bad, good = rows["faulty_lse_off"], rows["toy_decode"]
    # the output is right, so its ratio alone would read as a pass: the LSE column says otherwise
    assert bad["status"] == "failed" and bad["verdict"]["worst_row_ratio"] < 1 < bad["verdict"]["lse_ratio"], bad
    assert good["status"] == "passed" and good["verdict"]["lse_ratio"] < 1, good
    for row in (bad, good):
        v = row["verdict"]
        line = _table_row(run.md, row["kernel"], case)
        assert f"| {format(v['worst_row_ratio'], '.4g')} | {format(v['lse_ratio'], '.4g')} |" in line, line
    assert "| LSE / budget |" in run.md and run.rc == 1, run.out[-2000:]


def test_a_kernel_that_skips_most_of_the_set_says_how_much_it_ran(tmp_path):
    """A green run of a narrow kernel used to read like a full one ('4 passed, 22 skipped', two of
    them parity cases): each kernel gets a line of how many parity cases it ran and which
    Capabilities fields the others needed, counted here from the cases themselves."""
    from decode_conformance.case_sets import build_set
    (tmp_path / "narrow_decode.py").write_text(
        "import dataclasses\n"
        "import toy_decode\n"
        "class Narrow(toy_decode.ToyDecode):\n"
        "    name = 'toy_narrow'\n"
        "    caps = dataclasses.replace(toy_decode.CAPS, kv_dtypes=frozenset({'bf16'}), window_convention=None)\n")
    run = run_pytest(PARITY, "--kernel=narrow_decode:Narrow", "--case-set=smoke", "-k", "test_parity",
                     env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(OOT), str(ROOT)])}, timeout=300)
    cases = build_set("smoke", "interpreter")
    dtype = sum(c.kv_dtype != "bf16" for c in cases)
    window = sum(c.window is not None for c in cases)
    skipped = sum(c.kv_dtype != "bf16" or c.window is not None for c in cases)
    assert run.rc == 0 and 0 < skipped < len(cases), run.out[-2000:]
    line = next(ln for ln in run.out.splitlines() if ln.startswith("decode-conformance coverage: toy_narrow"))
    assert line.startswith(f"decode-conformance coverage: toy_narrow: ran {len(cases) - skipped} of {len(cases)} "
                           f"parity cases; {skipped} skipped ("), line
    assert f"{dtype} need{'s' if dtype == 1 else ''} kv_dtypes" in line, line
    assert f"{window} need{'s' if window == 1 else ''} window_convention" in line, line

"""The known-failure ledger (decode_conformance/ledger.py): parsing, and what each kind of
entry does to a real run (child pytest processes on one cheap case).

One ledger file drives two runs, on the cpu class and with --gpu-class=sm_90:
  entry 0  xfail      faulty_nan   (fails)            -> xfailed; the run does not fail for it
  entry 1  xfail      torch_gather (passes)           -> strict XPASS: the run fails
  entry 2  quarantine marker_a                        -> never planned nor launched
  entry 3  quarantine marker_b, gpu_classes=[sm_90]   -> cpu: runs (and fails); sm_90: never planned
  entry 4  xfail      faulty_raises, gpu_classes=[cpu]-> cpu: xfailed; sm_90: plain failure
  entry 5  xfail      no_such_kernel                  -> about no kernel of the run: one 'not checked' line
  entry 6  xfail      faulty_nan, a case no set has   -> a 'ledger warning' line (a mistyped pattern)
"""
from __future__ import annotations

import itertools
import re

import pytest

from decode_conformance.ledger import Entry, Ledger, default_ledger_paths
from suites.selftest._subpytest import GOOD, PARITY, ROOT, child_env, faulty, paste, run_pytest, small_case_ids
from suites.selftest.faulty_kernels import MARKER_DIR_ENV

ISSUE = "https://github.com/example/kernels/issues/1"
VALID = dict(kernel="k", case="c-*", kind="xfail", reason="why", issue=ISSUE)


def _toml_value(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(v).lower() if isinstance(v, bool) else str(v)


def _write_ledger(path, entries: list[dict]):
    text = "".join("[[entry]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in e.items()) + "\n"
                   for e in entries)
    path.write_text(text)
    return path


# ---- parsing ---------------------------------------------------------------------------

@pytest.mark.parametrize("field,value,expected", [
    ("kernel", None, "field 'kernel' must be a non-empty string"),
    ("case", "", "field 'case' must be a non-empty string"),
    ("kind", None, "field 'kind' must be a non-empty string"),
    ("kind", "skip", "field 'kind' must be one of"),
    ("reason", "  ", "field 'reason' must be a non-empty string"),
    ("issue", None, "field 'issue' must be a non-empty string"),
    ("issue", "see slack", "field 'issue' must be an issue URL"),
    ("gpu_classes", "sm_90", "field 'gpu_classes' must be a list"),
    ("gpu_clases", ["sm_90"], "unknown fields ['gpu_clases']"),
])
def test_parse_error_names_the_field(tmp_path, field, value, expected):
    row = dict(VALID)
    if value is None:
        row.pop(field)
    else:
        row[field] = value
    p = _write_ledger(tmp_path / "ledger.toml", [dict(VALID), row])
    with pytest.raises(ValueError) as e:
        Ledger.load([p])
    assert expected in str(e.value)
    assert f"{p}: entry 1" in str(e.value)  # file and entry index: the adopter can find the row


def test_unknown_top_level_key(tmp_path):
    p = tmp_path / "ledger.toml"
    p.write_text('[[entries]]\nkernel = "k"\n')
    with pytest.raises(ValueError, match=r"unknown top-level keys \['entries'\]"):
        Ledger.load([p])


def test_repository_ledger_parses():
    Ledger.load(default_ledger_paths())


def test_gpu_class_filter_and_patterns():
    e = Entry(kernel="fixed_*", case="fi4267-*", kind="xfail", reason="r", issue=ISSUE, gpu_classes=("sm_90",))
    assert e.matches("fixed_split", "fi4267-bf16-x", "sm_90")
    assert not e.matches("fixed_split", "fi4267-bf16-x", "sm_80")  # other class
    assert not e.matches("lean", "fi4267-bf16-x", "sm_90")  # other kernel
    assert not e.matches("fixed_split", "bf16-fi4267", "sm_90")  # pattern is anchored
    everywhere = Entry(kernel="*", case="*", kind="quarantine", reason="r", issue=ISSUE)
    assert everywhere.matches("any", "case", "gfx942")
    ledger = Ledger([e, everywhere])
    assert ledger.match("fixed_split", "fi4267-a", "sm_90") is e  # first match wins
    assert ledger.match("fixed_split", "fi4267-a", "sm_80") is everywhere


def test_a_case_id_pasted_from_a_failure_matches_itself():
    """Patterns were fnmatch's, whose `[...]` is a character class: every case id holds one
    (`B2[257,17]`), so an id copied from a failure into `case` matched no case, not even itself.
    `*` and `?` are the only wildcards now."""
    cid = "bf16-contig-h4g2-d80-B2[257,17]-win64-large-scores-scale0.105409-q-strided-s812695649"
    def entry(case):
        return Entry(kernel="k", case=case, kind="xfail", reason="r", issue=ISSUE)
    assert entry(cid).matches("k", cid, "cpu")
    assert not entry(cid).matches("k", cid.replace("[257,17]", "2"), "cpu")  # "B2" then one of 2,5,7,1
    assert entry("*-B2[257,*]-*").matches("k", cid, "cpu")
    assert entry("?f16-*").matches("k", cid, "cpu") and not entry("?f16-*").matches("k", "e4m3-" + cid, "cpu")
    assert not entry("bf16-contig").matches("k", cid, "cpu")  # the whole id, not a prefix


# ---- what entries do to a run ----------------------------------------------------------

ENTRIES = [
    dict(kernel="faulty_nan", case="*", kind="xfail", reason="writes NaN", issue=ISSUE),
    dict(kernel="torch_gather", case="*", kind="xfail", reason="stale entry", issue=ISSUE),
    dict(kernel="marker_a", case="*", kind="quarantine", reason="crashes the device", issue=ISSUE),
    dict(kernel="marker_b", case="*", kind="quarantine", reason="crashes on sm_90", issue=ISSUE,
         gpu_classes=["sm_90"]),
    dict(kernel="faulty_raises", case="*", kind="xfail", reason="raises on cpu", issue=ISSUE, gpu_classes=["cpu"]),
    dict(kernel="no_such_kernel", case="*", kind="xfail", reason="renamed kernel", issue=ISSUE),
    dict(kernel="faulty_nan", case="bf16-paged17-*", kind="xfail", reason="mistyped pattern", issue=ISSUE),
]
# The line of each entry's [[entry]] header as _write_ledger lays them out (header, a line per
# field, a blank line).
ENTRY_LINES = list(itertools.accumulate([1] + [len(e) + 2 for e in ENTRIES[:-1]]))
KERNELS = [GOOD, faulty("nan"), faulty("raises"), faulty("marker_a"), faulty("marker_b")]


@pytest.fixture(scope="module")
def ledger_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ledger")
    ledger = _write_ledger(tmp / "known_failures.toml", ENTRIES)
    case = small_case_ids(1)[0]
    runs = {}
    for gpu_class in ("cpu", "sm_90"):
        markers = tmp / f"markers-{gpu_class}"
        markers.mkdir()
        run = run_pytest(PARITY, "-rA", *[f"--kernel={k}" for k in KERNELS], f"--case-id={case}",
                         f"--ledger={ledger}", f"--gpu-class={gpu_class}", report=tmp / f"report-{gpu_class}",
                         env={MARKER_DIR_ENV: str(markers)}, timeout=180)
        assert run.report is not None, run.out[-3000:]
        runs[gpu_class] = (run, {r["kernel"]: r for r in run.rows()}, markers)
    return runs


def _ledger_file(run) -> str:
    return run.report["meta"]["ledgers"][0]


def _warned(out: str) -> list[str]:
    return re.findall(r"ledger warning: entry matches no case the suite ships: .*?\((.*?:\d+)\)", out)


def test_xfail_entry_turns_a_failure_into_xfail(ledger_runs):
    run, rows, _ = ledger_runs["cpu"]
    assert rows["faulty_nan"]["status"] == "xfailed", rows["faulty_nan"]
    assert "XFAIL" in run.out and "known failure: writes NaN" in run.out
    # which entry accepted it: its issue, file and line, on the terminal and in the report's row
    accepted = f"known failure: writes NaN ({ISSUE}; {_ledger_file(run)}:{ENTRY_LINES[0]})"
    assert accepted in run.out and rows["faulty_nan"]["ledger_entry"] == accepted, rows["faulty_nan"]
    assert f"| ledger: {accepted} |" in run.md, run.md[-3000:]


def test_unexpected_pass_fails_the_run(ledger_runs):
    run, rows, _ = ledger_runs["cpu"]
    assert run.rc == 1, run.out[-2000:]
    assert "[XPASS(strict)]" in run.out
    assert re.search(r"FAILED \S+test_parity\[torch_gather\|", run.out)
    assert rows["torch_gather"]["status"] == "xpassed"  # and the report says so, with a repro line
    assert rows["torch_gather"]["repro"] and "reproduce: `" + rows["torch_gather"]["repro"] + "`" in run.md
    # the terminal says which entry, what to do and how to see the pass again (pytest alone gives
    # only the entry's reason)
    assert f"stale entry ({ISSUE}; {_ledger_file(run)}:{ENTRY_LINES[1]})" in run.out, run.out[-3000:]
    assert "it passed where a ledger entry expects a failure: remove or narrow that entry" in run.out
    assert "reproduce: " + rows["torch_gather"]["repro"] in run.out


def test_an_unexpected_pass_reproduces_when_pasted(ledger_runs):
    """The strict XPASS's reproduce line names the ledger: pasted where no variable is set (a CI
    log read elsewhere), it fails again; without the ledger the case simply passed, exit 0."""
    run, rows, _ = ledger_runs["cpu"]
    line = rows["torch_gather"]["repro"]
    assert line.endswith(f"--ledger={_ledger_file(run)}"), line
    pasted = paste(line, ROOT, child_env())
    assert pasted.returncode == 1 and "XPASS(strict)" in pasted.stdout, pasted.stdout[-2000:] + pasted.stderr
    assert "1 failed" in pasted.stdout, pasted.stdout[-500:]


def test_quarantine_never_plans_or_launches(ledger_runs):
    for gpu_class in ("cpu", "sm_90"):
        run, rows, markers = ledger_runs[gpu_class]
        assert rows["marker_a"]["status"] == "quarantined", rows["marker_a"]
        assert rows["marker_a"]["message"].startswith("quarantined, never launched: crashes the device")
        assert not (markers / "marker_a").exists(), "a quarantined kernel was planned"


def test_gpu_classes_filter(ledger_runs):
    run_cpu, rows_cpu, markers_cpu = ledger_runs["cpu"]
    run_90, rows_90, markers_90 = ledger_runs["sm_90"]
    # marker_b is quarantined on sm_90 only: on cpu it runs (the marker proves the harness
    # would have launched it), on sm_90 it never does.
    assert (markers_cpu / "marker_b").exists() and rows_cpu["marker_b"]["status"] == "failed"
    assert not (markers_90 / "marker_b").exists() and rows_90["marker_b"]["status"] == "quarantined"
    # faulty_raises is an expected failure on cpu only.
    assert rows_cpu["faulty_raises"]["status"] == "xfailed"
    assert rows_90["faulty_raises"]["status"] == "failed"


def test_entry_matching_nothing_prints_a_warning(ledger_runs):
    """Warned: an entry about a kernel of the run, on its GPU class, whose pattern matches no case
    the suite ships (entry 6). Not warned: entries for another class (3 on cpu, 4 on sm_90: one
    ledger serves every runner of a sharded CI). An entry about a kernel the run does not test
    (5) is one plain 'not checked' line, where a renamed kernel shows."""
    for gpu_class in ("cpu", "sm_90"):
        run, _, _ = ledger_runs[gpu_class]
        got = [int(w.rsplit(":", 1)[1]) for w in _warned(run.out)]
        assert got == [ENTRY_LINES[6]], run.out[-2000:]
        said = re.findall(r"ledger warning: (.*)", run.out)
        assert run.report["ledger_warnings"] == said and len(said) == 1, run.report["ledger_warnings"]
        assert all(f"> ledger warning: {w}" in run.md for w in said), run.md[:2000]
        not_checked = [ln for ln in run.out.splitlines() if ln.startswith("ledger: ")]
        assert not_checked == [f"ledger: 1 entry about kernels this run does not test, not checked: "
                               f"'no_such_kernel' ({_ledger_file(run)}:{ENTRY_LINES[5]})"], run.out[-2000:]


def test_a_smoke_run_does_not_warn_about_entries_for_the_full_set(tmp_path):
    """One ledger serves an adopter's smoke and full runs: an entry naming a case of the full set
    only is not stale in a smoke run."""
    from decode_conformance.case_sets import build_set
    smoke = {c.id for c in build_set("smoke", "interpreter")}
    full_only = next(c.id for c in build_set("full", "interpreter") if c.id not in smoke)
    ledger = _write_ledger(tmp_path / "l.toml", [dict(kernel="torch_gather", case=full_only, kind="xfail",
                                                      reason="r", issue=ISSUE)])
    run = run_pytest(PARITY, f"--kernel={GOOD}", "--case-set=smoke", f"--case-id={sorted(smoke)[0]}",
                     f"--ledger={ledger}", timeout=120)
    assert run.rc == 0 and "ledger warning" not in run.out and "ledger: " not in run.out, run.out[-2000:]


def test_a_gpu_class_that_does_not_exist_is_a_usage_error(tmp_path):
    """"sm90" for "sm_90" would leave the entry unused on every runner, silently."""
    ledger = _write_ledger(tmp_path / "l.toml", [dict(VALID), dict(VALID, gpu_classes=["sm90"])])
    run = run_pytest(PARITY, f"--kernel={GOOD}", f"--case-id={small_case_ids(1)[0]}", f"--ledger={ledger}",
                     timeout=120)
    assert run.rc == 4 and f"{ledger}:8: field 'gpu_classes': unknown class 'sm90'; expected names from cpu, " in run.out, run.out[-2000:]


def test_every_scenario_honours_the_ledger(tmp_path):
    """A scenario's case is named by its id like a parity case: an entry naming the scenario
    (`batch-invariance-*`) and one written for parity ids with a leading wildcard (`*-bf16-*`)
    both turn the batch-invariance failures into xfails; without the ledger they fail."""
    from decode_conformance.scenarios import fixed_cases
    gqa = fixed_cases("interpreter")["batch-invariance"][0].id
    args = ("suites/parity/test_batch_invariance.py", "-q", f"--kernel={faulty('batch_dependent')}",
            f"--kernel={faulty('nan')}", f"--case-id={gqa}")
    entries = [dict(kernel="faulty_batch_dependent", case="batch-invariance-*", kind="xfail", reason="ulp moves",
                    issue=ISSUE),
               dict(kernel="faulty_nan", case="*-bf16-*", kind="xfail", reason="NaN in row 0", issue=ISSUE)]
    ledger = _write_ledger(tmp_path / "ledger.toml", entries)
    runs = {"none": run_pytest(*args, report=tmp_path / "bare"),  # the shipped ledger: empty
            "ledger": run_pytest(*args, f"--ledger={ledger}", report=tmp_path / "marked")}
    for name, expected, rc in (("none", "failed", 1), ("ledger", "xfailed", 0)):
        run = runs[name]
        status = {r["kernel"]: r["status"] for r in run.report["results"] if r["case"] == gqa}
        assert status == {"faulty_batch_dependent": expected, "faulty_nan": expected}, run.out[-2000:]
        assert run.rc == rc, run.out[-2000:]


def test_the_shipped_ledger_is_quiet_for_a_kernel_it_does_not_name(tmp_path):
    """An adopter testing only their kernel, with no --ledger, must not hear about the shipped
    ledger's entries for this package's kernels (seen: a fixed_split entry warned in every run).
    The shipped ledger has no entries since 2026-12-05, so the rule is held on a ledger of the
    same shape: an entry for one of our kernels, on the CPU."""
    run = run_pytest(PARITY, f"--kernel={GOOD}", f"--case-id={small_case_ids(1)[0]}", timeout=120)
    assert run.rc == 0 and "ledger warning" not in run.out and "ledger: " not in run.out, run.out[-2000:]
    shipped = Ledger.load(default_ledger_paths())
    assert all(e.kernel != "torch_gather" for e in shipped.entries)
    ours = tmp_path / "ours.toml"
    ours.write_text('[[entry]]\nkernel = "fixed_split"\ncase = "e5m2-*"\ngpu_classes = ["cpu"]\nkind = "xfail"\n'
                    'reason = "a known failure of ours"\nissue = "https://example.org/1"\n')
    like_shipped = Ledger.load([str(ours)])
    assert like_shipped.entries
    assert like_shipped.unused([("torch_gather", "x")], "cpu") == []
    assert like_shipped.unused([("fixed_split", "e5m2-x")], "sm_90") == []  # another class
    assert like_shipped.unused([("fixed_split", "bf16-x")], "cpu") == like_shipped.entries
    assert like_shipped.elsewhere(["torch_gather"]) == like_shipped.entries


def test_an_entry_for_a_near_miss_kernel_name_asks_did_you_mean():
    """A misspelled kernel name in the adopter's ledger leaves every failure of the real kernel
    reported as new; the 'not checked' line names the kernel it was probably meant for."""
    import types

    from decode_conformance.ledger import Entry, Ledger
    from decode_conformance.plugin import _ledger_not_checked
    entries = [Entry("pagedatn", "*-win*", "xfail", "windows not implemented", "https://x/1", source="l.toml:1"),
               Entry("flashinfer_decode", "*", "xfail", "another job's kernel", "https://x/2", source="l.toml:6")]
    state = types.SimpleNamespace(ledger_named=True, ledger=Ledger(entries),
                                  kernels=[types.SimpleNamespace(name="pagedattn")])
    assert _ledger_not_checked(state) == (
        "ledger: 2 entries about kernels this run does not test, not checked: 'pagedatn' (l.toml:1; did you mean "
        "'pagedattn'?); 'flashinfer_decode' (l.toml:6)")

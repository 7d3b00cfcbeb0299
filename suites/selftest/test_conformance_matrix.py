"""benchmarks/conformance_matrix.py: case families read from case ids, cells from row
statuses, and a rewrite of the document that keeps its triage."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from decode_conformance._paths import checkout_root

ROOT = checkout_root()
pytestmark = pytest.mark.skipif(ROOT is None or not (ROOT / "benchmarks").is_dir(),
                                reason="benchmarks/ is in the checkout only")


def _module():
    spec = importlib.util.spec_from_file_location("conformance_matrix", ROOT / "benchmarks" / "conformance_matrix.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


@pytest.mark.parametrize("case_id,families", [
    ("e4m3-contig-h2g1-d128-B3[0,45,1]-win51x-s662681708", {"e4m3", "contig", "window", "0-length rows"}),
    ("bf16-paged16-kv2-h14g7-d256-B2[303,300]-win62x-s853967298", {"bf16", "paged", "kv2", "window"}),
    ("e5m2-paged1-h2g1-d80-B2[477,300]-win484-softcap30-sinks-s2076247910",
     {"e5m2", "paged", "window", "soft-cap", "sinks"}),
    ("fi3864-bf16-paged16-h6g6-d576v512-mla-B2[300,10]-pool2048M-s1", {"bf16", "paged", "MLA", "2^31 pools"}),
    ("fp16-paged16-h8g4-d64-B2[10,0]-s1", {"fp16", "paged", "0-length rows"}),
    ("fp16-paged16-h8g4-d64-B2[10,100]-s1", {"fp16", "paged"}),
])
def test_case_families_from_ids(case_id, families):
    assert set(_module().case_families(case_id)) == families


def test_cells_and_rewrite_keep_the_triage(tmp_path):
    m = _module()
    assert m.cell([]) == "-"
    assert m.cell([{"status": "passed"}, {"status": "failed"}, {"status": "skipped"}]) == "**FAIL** 1/2"
    assert m.cell([{"status": "skipped", "message": "k lacks: GQA group 5 (supported: 1, 2)"}]) == \
        "skip: GQA group 5 (supported: 1, 2)"
    rows = [{"test": "test_parity::test_parity", "kernel": "k", "case": "bf16-paged16-h8g4-d64-B2[10,0]-s1",
             "status": "failed", "message": "FAIL: x", "repro": "pytest ..."},
            {"test": "test_cuda_graph::test_one_graph_serves_every_length", "kernel": "k", "case": "",
             "status": "passed"}]
    rep = tmp_path / "r.json"
    rep.write_text(json.dumps({"meta": {"kernels": {"k": {"library": "lib 1.0"}}}, "results": rows}))
    doc = tmp_path / "m.md"
    doc.write_text("# title\n<!-- matrix -->\nold\n" + m.GENERATED_END + "\n## Triage\nkept\n")
    assert m.main([str(rep), "-o", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and text.endswith("## Triage\nkept\n") and text.startswith("# title\n")
    line = next(x for x in text.splitlines() if x.startswith("| `k`"))
    cols = ["kernel", "library", *m.COLUMNS]
    cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
    assert cells["library"] == "lib 1.0" and cells["0-length rows"] == "**FAIL** 1/1"
    assert cells["graph replay"] == "pass 1" and cells["sinks"] == "-"
    assert "reproduce: `pytest ...`" in text


def test_a_partial_report_makes_a_matrix(tmp_path, capsys):
    """A run that was stopped leaves PATH.partial.jsonl; the matrix reads its rows and names the
    tests that started without a result."""
    m = _module()
    row = {"test": "test_parity::test_parity", "kernel": "k", "case": "fp16-paged16-h8g4-d64-B2[10,0]-s1",
           "status": "passed", "message": "PASS"}
    p = tmp_path / "rep.partial.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in (
        {"started": "suites/parity/test_parity.py::test_parity[k|a]"}, {"row": row, "nodeid": "suites/parity/test_parity.py::test_parity[k|a]"},
        {"started": "suites/parity/test_parity.py::test_parity[k|b]"})) + "\n{\"row\": {\"cut")
    rows, _ = m.load([p])
    assert rows == [row]
    assert "started, no result (the run was stopped here): suites/parity/test_parity.py::test_parity[k|b]" in \
        capsys.readouterr().err


def test_library_versions_given_for_a_partial_report(tmp_path, capsys):
    """A .partial.jsonl carries no metadata: --library PREFIX=VERSION names the version of the
    kernels it matches (marked as given), never over one a report recorded; a malformed value
    is a usage error."""
    m = _module()
    row = {"test": "test_parity::test_parity", "kernel": "fi_x", "case": "fp16-paged16-h8g4-d64-B2[10,0]-s1",
           "status": "passed", "message": "PASS"}
    p = tmp_path / "rep.partial.jsonl"
    p.write_text(json.dumps({"row": row, "nodeid": "n"}) + "\n")
    out = tmp_path / "m.md"
    assert m.main([str(p), "--library", "fi=1.2.3", "--library", "other=9", "-o", str(out)]) == 0
    assert "| `fi_x` | 1.2.3 (given) |" in out.read_text()
    with pytest.raises(SystemExit):
        m.main([str(p), "--library", "fi", "-o", str(out)])
    assert "expected PREFIX=VERSION" in capsys.readouterr().err


def _peer_module():
    spec = importlib.util.spec_from_file_location("peer_table", ROOT / "benchmarks" / "peer_table.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_peer_table_leaves_out_the_cell_a_preflight_died_on(monkeypatch):
    """A launch that kills its process (an illegal address) must not take the peer table down:
    the pre-flight child's last 'started' line names the cell; a death outside a launch leaves
    the kernel out of every cell."""
    import subprocess
    m = _peer_module()
    outs = {"dies_in_cell": (-6, ['{"cell": "c1", "status": "started"}',
                                  '{"cell": "c1", "status": "ok", "graph": "ok"}',
                                  '{"cell": "c2", "status": "started"}']),
            "dies_before": (1, []),
            "fine": (0, ['{"cell": "c1", "status": "started"}',
                         '{"cell": "c1", "status": "ok", "graph": "RuntimeError: operation not permitted when '
                         'stream is capturing"}'])}

    def fake_run(cmd, capture_output, text):
        rc, lines = outs[cmd[-1]]
        return subprocess.CompletedProcess(cmd, rc, "\n".join(lines) + "\n", "CUDA error: an illegal memory access\n")
    monkeypatch.setattr(subprocess, "run", fake_run)
    got, no_graph = m.crashed_cells(list(outs), jobs=2)
    assert set(got["dies_in_cell"]) == {"c2"} and "exit -6" in got["dies_in_cell"]["c2"]
    assert "illegal memory access" in got["dies_in_cell"]["c2"]
    assert set(got["dies_before"]) == {m.ANY_CELL} and got["fine"] == {}
    # a launch that did not capture is timed eagerly, saying why; one that did is replayed
    assert no_graph == {"dies_in_cell": {}, "dies_before": {}, "fine": {"c1": "RuntimeError: operation not "
                                                                          "permitted when stream is capturing"}}


def test_peer_table_runner_keeps_what_its_graph_replays_alive():
    """A captured graph replays raw addresses: what plan() allocated and only the launch closure
    owns (a library wrapper's workspace) must live as long as the runner, or the replay reads
    freed memory (the s14-2 illegal address). Planted: a runner that keeps only the graph."""
    import gc
    import types
    import weakref
    m = _peer_module()

    class Owned:  # stands for a wrapper's workspace buffer allocated in plan()
        pass

    def planned():
        owned = Owned()
        return (lambda: owned), weakref.ref(owned)

    def replay(graph, device, reps):
        return [1.0] * reps if graph.owner() is not None else pytest.fail("graph replayed on freed memory")

    timing = types.SimpleNamespace(capture=lambda fn, device: types.SimpleNamespace(owner=weakref.ref(fn())),
                                   replay_times_us=replay)
    launch, alive = planned()
    runner = m.TimedRunner(launch, batch=object(), timing=timing, reps=3, eager=False)
    del launch
    gc.collect()
    assert alive() is not None and runner() == [1.0] * 3 and runner.mode == "graph"

    class GraphOnly(m.TimedRunner):  # the planted fault: drops the launch once captured
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.launch = None
    launch, alive = planned()
    bad = GraphOnly(launch, batch=object(), timing=timing, reps=3, eager=False)
    del launch
    gc.collect()
    assert alive() is None
    with pytest.raises(pytest.fail.Exception, match="freed memory"):
        bad()


@pytest.mark.parametrize("lens", [(300, 300), (300, 0, 129)], ids=["uniform", "ragged-with-empty"])
def test_peer_table_dense_sdpa_floor_matches_the_reference(lens):
    """The floor row (SDPA on dense copies made at plan time) computes attention: against our
    float32 torch kernel on the same batch, uniform (one batched call) and ragged (per request,
    an empty request zeroed). Planted: the dense copy taken in page order, not token order."""
    from decode_conformance.cases import Case
    from decode_conformance.runner import prepare
    from decode_conformance_kernels import registry
    m = _peer_module()
    case = Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=lens, layout="paged",
                page_size=16, seed=3)
    ref = prepare(registry.torch_gather(), case, "cpu")
    registry.torch_gather().plan(ref)()
    floor = m.SdpaDense()
    assert not floor.caps.missing_for(case, "cpu")
    batch = prepare(floor, case, "cpu")
    floor.plan(batch)()
    assert m._cosine(batch.out, ref.out) > 0.9999
    if lens[1] == 0:
        assert bool((batch.out[1] == 0).all())

    class PageOrder(m.SdpaDense):  # planted: keys in slot order instead of the request's token order
        def plan(self, b):
            b.kv_indices.copy_(b.kv_indices.sort().values)
            return super().plan(b)
    bad = prepare(PageOrder(), case, "cpu")
    PageOrder().plan(bad)()
    assert m._cosine(bad.out, ref.out) < 0.9999


def test_peer_table_dense_floor_declines_fp8_and_mla():
    from decode_conformance.cases import Case
    m = _peer_module()
    fp8 = Case(kv_dtype="e4m3", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(64,), layout="paged",
               page_size=16, seed=1)
    mla = Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=1, head_dim=576, v_head_dim=512, mla=True,
               seq_lens=(64,), layout="paged", page_size=16, seed=1)
    assert m.SdpaDense().caps.missing_for(fp8, "cuda") and m.SdpaDense().caps.missing_for(mla, "cuda")


def test_dense_sdpa_per_request_and_batched_agree_and_batched_needs_one_length():
    """benchmarks/sweep.py dense_sdpa, the floor every benchmark times: its two forms compute the
    same attention; asking for one batched call over unequal requests is refused by name."""
    import importlib
    sys.path.insert(0, str(ROOT))
    from decode_conformance.cases import Case
    from decode_conformance.runner import prepare
    from decode_conformance_kernels import registry
    sweep = importlib.import_module("benchmarks.sweep")
    m = _peer_module()
    case = Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(200, 200), layout="paged",
                page_size=16, seed=5)
    batch = prepare(registry.torch_gather(), case, "cpu")
    one, out_one = sweep.dense_sdpa(batch, batched=True)
    each, out_each = sweep.dense_sdpa(batch, batched=False)
    one()
    each()
    assert m._cosine(out_one, out_each) > 0.99999
    ragged = prepare(registry.torch_gather(), Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64,
                                                   seq_lens=(200, 17), layout="paged", page_size=16, seed=5), "cpu")
    with pytest.raises(ValueError, match="batched needs requests of one length"):
        sweep.dense_sdpa(ragged, batched=True)


def test_peer_table_verdict_names_every_miss_and_never_passes_an_untimed_cell():
    """The verdict lines the speed issue is judged on: dispatch against the fastest paged peer,
    and against the dense floor only where the longest request has >= 8k keys. Planted: a peer
    0.5 % faster than dispatch, a floor 5 % faster, a cell dispatch did not time."""
    m = _peer_module()
    timed = lambda us: {"status": "timed", "median_us": us}  # noqa: E731
    rows = {
        "ahead": {"max_len": 131072, "kernels": {"dispatch": timed(100.0), "flashinfer_decode_tc": timed(101.0),
                                                 "sglang_decode": timed(300.0), "sdpa_dense": timed(99.0)}},
        "behind": {"max_len": 8192, "kernels": {"dispatch": timed(100.5), "flashinfer_decode_tc": timed(100.0),
                                                "lean": timed(50.0), "sdpa_dense": timed(95.0)}},
        "short": {"max_len": 4096, "kernels": {"dispatch": timed(10.0), "vllm_unified_3d": timed(20.0),
                                               "sdpa_dense": timed(5.0)}},
        "untimed": {"max_len": 65536, "kernels": {"dispatch": {"status": "wrong", "reason": "cosine 0.2"},
                                                  "flashinfer_decode": timed(50.0)}},
    }
    lines = {line.split(" | ")[0].lstrip("| "): line for line in m.verdict_lines(rows)[2:]}
    assert "`flashinfer_decode_tc` 101.0 | 0.990 | 99.0 | 1.010 |" in lines["ahead"] and "miss" not in lines["ahead"]
    # lean is ours, not a peer: the fastest peer is flashinfer at 100.0
    assert "`flashinfer_decode_tc` 100.0 | 1.005 **miss** | 95.0 | 1.058 **miss** |" in lines["behind"]
    assert "(< 8k keys)" in lines["short"] and "miss" not in lines["short"]
    assert "| wrong |" in lines["untimed"] and lines["untimed"].count(" - ") >= 2


def test_peer_table_times_a_candidate_tree_beside_main(tmp_path, monkeypatch, capsys):
    """An A/B of two trees in one process (benchmarks/README.md): the candidate's kernels/ copied
    under another import name load as modules of their own beside main's, so a change in the
    copy (planted: MIN_CHUNK 64) is the candidate's alone - its launch cuts the 300-key request
    into 4 chunks where main's cuts 2, read back from the partial LSEs the device wrote - and
    both compute right (judged against the float64 reference, under the interpreter without a
    GPU). The table refuses a kernel given twice, a --baseline it would not time and a --cell it does
    not have (naming the ones it has)."""
    import shutil
    cand = tmp_path / "decode_conformance_kernels_cand"
    shutil.copytree(ROOT / "kernels", cand, ignore=shutil.ignore_patterns("__pycache__"))
    rule = cand / "split_rule.py"
    rule.write_text(rule.read_text().replace("\nMIN_CHUNK = 128\n", "\nMIN_CHUNK = 64\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        _judge_both_trees(cand.name, capsys, tmp_path)
    finally:
        for name in [n for n in sys.modules if n.startswith(cand.name)]:
            del sys.modules[name]


def _judge_both_trees(cand, capsys, tmp_path):
    torch = pytest.importorskip("torch")
    from decode_conformance.cases import Case
    from decode_conformance.runner import build_checked, run_prepared
    m = _peer_module()
    spec = f"{cand}.registry:adaptive_split"
    kernels = {"adaptive_split": m._load("adaptive_split"), spec: m._load(spec)}
    assert type(kernels[spec]).__module__ == f"{cand}.adaptive_split"
    from decode_conformance_kernels import split_rule
    assert (split_rule.MIN_CHUNK, sys.modules[f"{cand}.split_rule"].MIN_CHUNK) == (128, 64)
    case = Case(kv_dtype="bf16", num_q_heads=4, num_kv_heads=2, head_dim=64, seq_lens=(300, 17), page_size=16,
                seed=3)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    chunks = {}
    for label, k in kernels.items():
        batch, ref, tier = build_checked(k, case, device)
        res = run_prepared(k, case, batch, ref, tier)
        assert res.ok, (label, res.message)
        partial_lse = batch.workspace.buffers["adaptive_split.partial_lse"]
        chunks[label] = int(torch.isfinite(partial_lse[0, 0]).sum())  # the 300-key request, head 0
    assert chunks == {"adaptive_split": 2, spec: 4}
    for argv, says in ((["--kernel", "dispatch", "--kernel", "dispatch"], "given twice"),
                       (["--kernel", spec], "--baseline dispatch: not one of the kernels timed"),
                       (["--cell", "b8-32k-mla", "--cell", "b9-nope"], "--cell b9-nope: expected one of b1-4k")):
        with pytest.raises(SystemExit):
            m.main(["--out", str(tmp_path / "out")] + argv)
        assert says in capsys.readouterr().err


def test_target_cells_refuse_a_name_the_guard_already_has(tmp_path, monkeypatch):
    import importlib
    sys.path.insert(0, str(ROOT))
    sweep = importlib.import_module("benchmarks.sweep")
    names = [c.name for c in sweep.target_cells()]
    assert len(names) == len(set(names)) and "b64-2k-32x8x128" in names and "b8-32k-mla" in names
    guard = [c.name for c in sweep.target_cells(guard_only=True)]
    assert names[:len(guard)] == guard and len(names) > len(guard)
    dup = tmp_path / "cells.toml"
    dup.write_text('[[cell]]\nname = "b1-4k-32x8x128"\nshape = [32, 8, 128]\nlens = [4096]\n')
    monkeypatch.setattr(sweep, "TARGET_CELLS", dup)
    with pytest.raises(ValueError, match="b1-4k-32x8x128.*already a perf-guard cell"):
        sweep.target_cells()

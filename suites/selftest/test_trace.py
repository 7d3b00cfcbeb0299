"""FlashInfer-Trace: the synthetic workload files in fixtures/traces/ (definitions, JSONL
workloads, safetensors blobs, one workload with no blob) read as cases, run through the
judge, and written back as schema-valid Trace records - on CPU."""
from __future__ import annotations

import json
import math

import pytest
import torch

from decode_conformance import trace
from decode_conformance.case_sets import build_set

GQA = "workloads/gqa_paged_decode_h4_kv2_d64_ps16.jsonl"
MLA = "workloads/mla_paged_decode_h2_ckv512_kpe64_ps1.jsonl"


def test_safetensors_round_trip(tmp_path):
    t = {"kv_indptr": torch.tensor([0, 3, 3], dtype=torch.int32), "x": torch.arange(6, dtype=torch.int64).view(2, 3),
         "e": torch.empty(0, dtype=torch.int32), "h": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}
    trace.write_safetensors(tmp_path / "a.safetensors", t)
    raw = (tmp_path / "a.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert json.loads(raw[8:8 + n])["x"] == {"dtype": "I64", "shape": [2, 3], "data_offsets": [12, 60]}
    back = trace.read_safetensors(tmp_path / "a.safetensors")
    for k, v in t.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)


def test_workloads_map_to_cases():
    by_label = {c.label: c for c in build_set(f"trace:{GQA}", "interpreter") + build_set(f"trace:{MLA}", "gpu")}
    empty_row = by_label["fit5f0c2a1e"]  # 3 pages (last holds 5), an empty request, one 1-key page
    assert (empty_row.kv_dtype, empty_row.num_q_heads, empty_row.num_kv_heads, empty_row.head_dim,
            empty_row.page_size, empty_row.seq_lens) == ("bf16", 4, 2, 64, 16, (37, 0, 1))
    assert empty_row.scale is None  # the workload's 0.125 is the default 1/sqrt(64)
    shared = by_label["fita3d9e4b2"]
    assert shared.seq_lens == (40, 33) and "2 page(s) shared" in shared.note
    custom = by_label["fitc81f0d57"]  # no blob: lengths from the axes; Gemma-2 27B-style scale
    assert custom.seq_lens == (48,) and "approximate" in custom.note
    assert math.isclose(custom.sm_scale, 1 / 12)
    mla = by_label["fit0e4b7c29"]
    assert (mla.mla, mla.head_dim, mla.v_head_dim, mla.num_q_heads, mla.num_kv_heads, mla.page_size,
            mla.seq_lens) == (True, 576, 512, 2, 1, 1, (20, 7))
    assert mla.scale is None  # 1/sqrt(192): the MLA default


def test_unmapped_definitions_are_refused(tmp_path):
    d = json.loads(trace.find_definition("gqa_paged_decode_h4_kv2_d64_ps16",
                                         trace.resolve(GQA)).read_text())
    d["inputs"]["q"]["dtype"] = "float32"
    with pytest.raises(trace.TraceError, match="dtypes"):
        trace.shape_of(d)
    d2 = dict(d, name="gqa_paged_prefill_causal_h4", tags=[])
    with pytest.raises(trace.TraceError, match="not a decode definition"):
        trace.shape_of(d2)
    (tmp_path / "w.jsonl").write_text('{"definition": "nowhere", "workload": {"uuid": "u", "axes": {}, "inputs": {}}}\n')
    with pytest.raises(ValueError, match="definition 'nowhere'"):
        build_set(f"trace:{tmp_path / 'w.jsonl'}", "interpreter")


@pytest.mark.parametrize("kernel", ["torch_gather", "lean"])
def test_round_trip_writes_schema_valid_records(tmp_path, kernel):
    from decode_conformance_kernels import registry
    recs = trace.run(GQA, getattr(registry, kernel)(), "cpu")
    assert [r["evaluation"]["status"] for r in recs] == ["PASSED"] * 3
    out = trace.write_records(tmp_path / "v.jsonl", recs)
    back = [json.loads(line) for line in out.read_text().splitlines()]
    src = [json.loads(line) for line in trace.resolve(GQA).read_text().splitlines()]
    for rec, wl in zip(back, src):
        assert trace.validate_record(rec) == []
        assert rec["definition"] == wl["definition"] and rec["workload"] == wl["workload"]
        assert rec["solution"] == kernel
        c = rec["evaluation"]["correctness"]
        assert 0 <= c["max_absolute_error"] < 0.1 and c["extra"]["case_id"].startswith("fit")
        assert c["extra"]["lse_max_abs_error_base2"] == pytest.approx(c["extra"]["lse_max_abs_error_natural"] / math.log(2))
        assert rec["evaluation"]["performance"]["latency_ms"] >= 0


def test_a_wrong_kernel_gets_incorrect_numerical(tmp_path):
    """The workload with a non-default softmax scale catches a kernel that ignores the caller's."""
    import sys
    from suites.selftest._subpytest import ROOT
    sys.path.insert(0, str(ROOT / "suites" / "selftest" / "oot"))
    import toy_decode
    recs = trace.run(GQA, toy_decode.IgnoresCallerScale(), "cpu")
    status = {r["workload"]["uuid"][:8]: r["evaluation"]["status"] for r in recs}
    assert status == {"5f0c2a1e": "PASSED", "a3d9e4b2": "PASSED", "c81f0d57": "INCORRECT_NUMERICAL"}
    bad = next(r for r in recs if r["evaluation"]["status"] != "PASSED")
    assert trace.validate_record(bad) == [] and "performance" not in bad["evaluation"]
    assert "reproduce: python -m pytest" in bad["evaluation"]["log"]


def test_trace_command_prints_reproduce_lines_that_run_from_where_it_ran(tmp_path):
    """`python -m decode_conformance.trace run` outside the checkout: each not-PASSED record's
    reproduce line is printed, names test_parity by a path that exists from there, and re-runs
    exactly its one case. (The installed form's `--pyargs` line: test_installed.py.)"""
    import shlex
    import subprocess
    import sys
    from suites.selftest._subpytest import ROOT, child_env
    env = child_env(PYTHONPATH=str(ROOT / "suites" / "selftest" / "oot"))
    r = subprocess.run([sys.executable, "-m", "decode_conformance.trace", "run", GQA, "--kernel",
                        "toy_decode:IgnoresCallerScale", "--out", "v.jsonl"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stdout.splitlines()[-1].endswith("(1 not PASSED)"), r.stdout + r.stderr
    lines = [ln.split("reproduce: ", 1)[1] for ln in r.stdout.splitlines() if "reproduce: " in ln]
    assert len(lines) == 1 and f" {ROOT}/suites/parity/test_parity.py::test_parity " in lines[0], r.stdout
    again = subprocess.run([sys.executable] + shlex.split(lines[0])[1:] + ["-p", "no:cacheprovider"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and " 1 failed in " in again.stdout.splitlines()[-1], again.stdout[-2000:]


def test_validate_record_catches_schema_breaks():
    rec = {"definition": "d", "workload": {"uuid": "u", "axes": {}, "inputs": {}}, "solution": "k",
           "evaluation": {"status": "PASSED", "environment": {"hardware": "cpu"}, "timestamp": "t", "log": "",
                          "correctness": {"max_relative_error": 0.0, "max_absolute_error": 0.0}}}
    assert trace.validate_record(rec) == ["performance missing for status PASSED"]
    rec["evaluation"]["status"] = "RUNTIME_ERROR"
    assert "correctness present for status RUNTIME_ERROR" in trace.validate_record(rec)

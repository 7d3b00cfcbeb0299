"""Adapters for external libraries (kernels/adapters/flashinfer_decode.py, sglang_decode.py).

Without the library: the kernel still loads, says why it cannot run, and every case skips
with "<kernel> lacks: <library> is not installed" - neither failed nor passed.

With a stand-in library (suites/selftest/fake_libraries.py: pure-torch fakes of flashinfer's
paged decode wrapper and sglang's decode_attention_fwd with their documented signatures,
conventions and preconditions, recording every call): the adapters' translation on CPU -
metadata, window convention, soft-cap, fp8 scales, LSE base, scratch from the workspace, and
the arguments each library receives. They do not check the libraries themselves; that needs
a GPU and the real packages.
"""
from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from decode_conformance.case_sets import build_set
from decode_conformance.kernel_api import Capabilities, load_kernel
from decode_conformance.runner import run_case
from decode_conformance_kernels.adapters.flashinfer_decode import CAPS as FI_CAPS
from suites.selftest._subpytest import PARITY, run_pytest, small_case_ids
from suites.selftest.fake_libraries import (CaptureViolation, FakeCapture, fake_decode_attention_fwd, fake_flashinfer,
                                            fake_sglang)

FI_SPEC = "decode_conformance_kernels.registry:flashinfer_decode"
SG_SPEC = "decode_conformance_kernels.registry:sglang_decode"
SG_MODULE = "sglang.srt.layers.attention.triton_ops.decode_attention"
SG_MODULE_NEW = "sglang.kernels.ops.attention.decode_attention"


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ---- library absent --------------------------------------------------------------------

def test_unavailable_capability_is_the_only_reason():
    caps = Capabilities(unavailable="flashinfer is not installed")
    case = build_set("parity", "interpreter")[0]
    assert caps.missing_for(case, "cuda") == ["flashinfer is not installed"]
    assert caps.describe().startswith("UNAVAILABLE (flashinfer is not installed)")
    assert Capabilities().missing_for(case, "cuda") == []


@pytest.mark.parametrize("spec,blocked,reason", [
    (FI_SPEC, ["flashinfer"], "flashinfer is not installed"),
    (SG_SPEC, ["sglang"], "sglang is not installed"),
])
def test_factory_without_library(monkeypatch, spec, blocked, reason):
    for name in blocked:  # None in sys.modules: `import name` fails as if not installed
        monkeypatch.setitem(sys.modules, name, None)
    k = load_kernel(spec)
    assert k.caps.unavailable == reason
    case = build_set("parity", "interpreter")[0]
    assert k.caps.missing_for(case, "cuda") == [reason]
    with pytest.raises(RuntimeError, match=reason):
        k.plan(None)


def test_every_case_skips_without_the_library(tmp_path):
    if _installed("flashinfer") or _installed("sglang"):
        pytest.skip("flashinfer or sglang is installed here; the fake-library tests cover the adapters")
    run = run_pytest(PARITY, "-q", "-rs", f"--kernel={FI_SPEC}", f"--kernel={SG_SPEC}",
                     *[f"--case-id={c}" for c in small_case_ids(2)], report=tmp_path / "r", timeout=120)
    assert run.rc == 5 or run.rc == 0, run.out[-2000:]  # 5: nothing ran (all skipped)
    rows = run.rows()
    assert len(rows) == 4, rows
    for r in rows:
        lib = r["kernel"].split("_")[0]
        assert r["status"] == "skipped", r
        assert r["message"] == f"{r['kernel']} lacks: {lib} is not installed", r
    assert "passed" not in run.out.splitlines()[-1] and "failed" not in run.out.splitlines()[-1]


# ---- adapters against the fakes --------------------------------------------------------

def _cases(pred, n=None, caps=None):
    cs = [c for c in build_set("parity", "interpreter") if pred(c) and not (caps and caps.missing_for(c, "cuda"))]
    return cs[:n] if n else cs


def _unique(cases):
    return list({c.id: c for c in cases}.values())


FI_CASES = _unique([  # paged and contiguous, fp8, GQA, windows in both conventions, soft-cap, empty rows
    *_cases(lambda c: not c.mla and c.head_dim == 64 and c.window is None and not c.sinks and c.softcap is None
            and c.data == "structured" and c.num_splits is None and c.label == "", 12, FI_CAPS),
    *_cases(lambda c: c.window is not None and not c.mla and not c.sinks, caps=FI_CAPS),
    *_cases(lambda c: c.softcap is not None and not c.sinks, caps=FI_CAPS),
])


@pytest.fixture
def fake_fi(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer())
    return load_kernel(FI_SPEC)


@pytest.fixture
def fake_sg(monkeypatch):
    monkeypatch.setitem(sys.modules, SG_MODULE, fake_sglang(SG_MODULE))
    return load_kernel(SG_SPEC)


def test_flashinfer_declares_its_conventions(fake_fi):
    assert fake_fi.caps.unavailable is None
    assert fake_fi.caps.window_convention == "excludes-current"
    assert fake_fi.caps.lse and not fake_fi.caps.mla
    assert fake_fi.caps.devices == frozenset({"cuda"})


@pytest.mark.parametrize("name,softmax_sum", [
    ("flashinfer_decode", "fp32"), ("flashinfer_decode_tc", "rounded-p"), ("flashinfer_decode_tc_graph", "rounded-p"),
    ("flashinfer_mla", "rounded-p"), ("flashinfer_mla_fa3", "fp32")])
def test_flashinfer_declares_how_each_path_sums_the_softmax(monkeypatch, name, softmax_sum):
    """The fa2 kernel (the tensor-core decode's, the fa2 MLA's) sums the denominator from P cast
    to the query dtype (prefill.cuh compute_sfm_v, mla.cuh): its LSE is judged on that tier
    (suites/selftest/test_foreign_arithmetic.py shows the tier on the arithmetic). The
    CUDA-core decode and fa3 sum in fp32."""
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer())
    assert load_kernel(f"decode_conformance_kernels.registry:{name}").caps.softmax_sum == softmax_sum


@pytest.mark.parametrize("case", FI_CASES, ids=lambda c: c.id)
def test_flashinfer_adapter_against_fake(fake_fi, case):
    assert not fake_fi.caps.missing_for(case, "cuda")
    res = run_case(fake_fi, case, "cpu")
    assert res.ok, res.message


def test_flashinfer_lse_is_converted_to_natural_log(fake_fi, monkeypatch):
    """Planted: skip the base-2 -> natural conversion; the LSE check must catch it."""
    import decode_conformance_kernels.adapters.flashinfer_decode as fi
    monkeypatch.setattr(fi, "LN2", 1.0)
    res = run_case(fake_fi, FI_CASES[0], "cpu")
    assert not res.ok and "LSE error" in res.message, res.message


def test_flashinfer_window_convention_matters(fake_fi):
    """Planted: declare the other convention; window cases must fail."""
    import dataclasses
    case = next(c for c in FI_CASES if c.window is not None and c.max_len > c.visible_keys)
    fake_fi.caps = dataclasses.replace(fake_fi.caps, window_convention="counts-current")
    res = run_case(fake_fi, case, "cpu")
    assert not res.ok, res.message


def _calls(module, fn):
    return [c["args"] for c in module.calls if c["fn"] == fn]


def test_flashinfer_plan_gets_what_its_documentation_asks(fake_fi):
    """Host indptr / last_page_len (no device-to-host copy in plan), last_page_len in 1..P for
    every request (empty ones included), int32 metadata, a zeroed workspace (the fake asserts it
    in its constructor), fp8 scales and the LSE request at run()."""
    fi = sys.modules["flashinfer"]
    case = next(c for c in FI_CASES if 0 in c.seq_lens and c.kv_dtype == "e4m3")
    assert run_case(fake_fi, case, "cpu").ok
    (plan,) = _calls(fi, "BatchDecodeWithPagedKVCacheWrapper.plan")
    assert plan["indptr"]["device"] == plan["last_page_len"]["device"] == "cpu"
    P = case.page_size if case.layout == "paged" else 1
    assert plan["page_size"] == P and all(1 <= x <= P for x in plan["last_page_len"]["values"])
    assert plan["num_qo_heads"] == case.num_q_heads and plan["num_kv_heads"] == case.num_kv_heads
    assert plan["kv_data_type"] == torch.float8_e4m3fn and plan["pos_encoding_mode"] == "NONE"
    assert not plan["disable_split_kv"]
    (run,) = _calls(fi, "BatchDecodeWithPagedKVCacheWrapper.run")
    assert run["return_lse"] and run["sinks"] is None
    from decode_conformance.factories import build
    built = build(case, "cpu")
    assert (run["k_scale"], run["v_scale"]) == pytest.approx((built.k_scale, built.v_scale))


def test_flashinfer_cuda_core_declares_its_group_sizes(fake_fi):
    """A group the CUDA-core decode does not instantiate is skipped, naming the group; the
    tensor-core form runs it. Planted: without the declaration plan() raises, as on the H200."""
    import dataclasses
    case = next(c for c in build_set("parity", "interpreter")
                if c.group not in FI_CAPS.gqa_groups and not dataclasses.replace(FI_CAPS, gqa_groups=None)
                .missing_for(c, "cuda"))
    assert fake_fi.caps.missing_for(case, "cuda") == [
        f"GQA group {case.group} (supported: 1, 2, 3, 4, 6, 8, 16) [gqa_groups]"]
    tc = load_kernel(FI_SPEC + "_tc")
    assert tc.caps.missing_for(case, "cuda") == [] and tc.name == "flashinfer_decode_tc"
    res = run_case(tc, case, "cpu")
    assert res.ok, res.message
    fake_fi.caps = dataclasses.replace(fake_fi.caps, gqa_groups=None)
    res = run_case(fake_fi, case, "cpu")
    assert not res.ok and f"Unsupported group_size: {case.group}" in res.message, res.message


def test_flashinfer_cuda_core_declares_k_and_v_share_strides(fake_fi):
    """V with strides of its own (the v-head-major form) is skipped by the CUDA-core decode,
    naming the form; the tensor-core form runs it. Planted: without the declaration run()
    raises flashinfer's stride check, as on the H100 (session 41)."""
    import dataclasses
    case = next(c for c in build_set("parity", "interpreter")
                if c.inputs == "v-head-major" and not dataclasses.replace(FI_CAPS, input_forms=None)
                .missing_for(c, "cuda"))
    assert fake_fi.caps.missing_for(case, "cuda") == [
        "input form v-head-major (supported: packed, q-strided, table-wide) [input_forms]"]
    tc = load_kernel(FI_SPEC + "_tc")
    assert tc.caps.missing_for(case, "cuda") == []
    res = run_case(tc, case, "cpu")
    assert res.ok, res.message
    fake_fi.caps = dataclasses.replace(fake_fi.caps, input_forms=None)
    res = run_case(fake_fi, case, "cpu")
    assert not res.ok and "K/V strides differ" in res.message, res.message


def test_flashinfer_cuda_core_path_has_no_graph_form(fake_fi):
    """flashinfer 0.7.2's CUDA-core plan() drops disable_split_kv (decode.py, _plan_impl), so
    a graph form of it would replay a split plan fixed to the planned lengths: with flashinfer
    installed the registry's flashinfer_decode_graph is still unavailable, naming the reason,
    and a direct plan() refuses."""
    k = load_kernel(FI_SPEC + "_graph")
    assert k.caps.unavailable and "ignores disable_split_kv" in k.caps.unavailable
    assert not load_kernel(FI_SPEC + "_tc_graph").caps.unavailable
    with pytest.raises(RuntimeError, match="ignores disable_split_kv"):
        k.plan(None)


@pytest.mark.parametrize("variant", ["_tc_graph"])
def test_flashinfer_graph_form_reads_lengths_at_launch(fake_fi, variant):
    """Planned once at capacity with fixed buffers, then relaunched on other lengths written
    into the same tensors (what a CUDA-graph replay does), each launch under the capture rules
    (FakeCapture: no host tensors, no host reads of device values): each must match the
    reference. Planted: a launch that keeps the plan's metadata fails."""
    from decode_conformance.graphs import capacity_case, load_scenario
    from decode_conformance.metrics import judge
    from decode_conformance.runner import prepare, yardstick
    import decode_conformance_kernels.adapters.flashinfer_decode as fi_mod
    fi = sys.modules["flashinfer"]
    k = load_kernel(FI_SPEC + variant)
    assert k.caps.cuda_graph_safe and k.caps.batch_invariant
    from decode_conformance.cases import Case
    template = Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(1,), page_size=16)
    cap = prepare(k, capacity_case(template, 3, 160), "cpu")
    launch = k.plan(cap)
    (ctor,) = _calls(fi, "BatchDecodeWithPagedKVCacheWrapper")
    assert ctor["use_cuda_graph"] and ctor["paged_kv_indptr_buffer"]["shape"] == (4,)
    assert _calls(fi, "BatchDecodeWithPagedKVCacheWrapper.plan")[0]["disable_split_kv"]

    def replays(run):
        bad = []
        for i, lens in enumerate([(1, 160, 0), (33, 0, 17), (0, 0, 0)]):
            scenario = template.replace(seq_lens=lens, seed=100 + i)
            view = load_scenario(cap, scenario, seed=scenario.seed)
            ref, tier = yardstick(k, scenario, view)
            cap.repoison_outputs()
            with FakeCapture():
                run()
            v = judge(scenario, view.out, view.lse, ref.out, ref.lse, ref.visible, tier.outs, tier.lses, view.sinks, lse_slack=tier.lse_slack)
            if not v.passed:
                bad.append(f"{lens}: {v.summary()}")
        return bad

    assert replays(launch) == []
    stale = fi_mod.device_page_metadata
    try:
        fi_mod.device_page_metadata = lambda *a, **kw: None  # planted: metadata left as planned
        assert replays(launch), "a launch on the plan's stale lengths must fail"
    finally:
        fi_mod.device_page_metadata = stale


def test_capture_rules_catch_host_copies_and_syncs():
    """The capture rules on the class of bug a real capture raised on: a host scalar written into
    a device buffer (`t[0] = 0`), and a host read of a device value. Their capturable
    equivalents pass."""
    t = torch.zeros(4, dtype=torch.int32)
    for planted in (lambda: t.__setitem__(0, 0), lambda: int(t[1]), lambda: bool(t.any()),
                    lambda: t.add_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))):
        with pytest.raises(CaptureViolation), FakeCapture():
            planted()
    with FakeCapture():
        t[:1].zero_()
        torch.cumsum(t, 0, dtype=torch.int32, out=t)
        t.add_(1)
    assert t.tolist() == [1, 1, 1, 1]


MLA_CASES = [c for c in build_set("parity", "interpreter") if c.mla and c.head_dim == 576]


@pytest.mark.parametrize("name", ["flashinfer_mla", "flashinfer_mla_fa3"])
def test_flashinfer_mla_against_fake(monkeypatch, name):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer())
    fi = sys.modules["flashinfer"]
    k = load_kernel(f"decode_conformance_kernels.registry:{name}")
    runnable = [c for c in MLA_CASES if not k.caps.missing_for(c, "cuda")]
    assert runnable, [k.caps.missing_for(c, "cuda") for c in MLA_CASES]
    for case in runnable:
        res = run_case(k, case, "cpu")
        assert res.ok, f"{case.id}: {res.message}"
    assert {c["backend"] for c in _calls(fi, "BatchMLAPagedAttentionWrapper")} == {name == "flashinfer_mla"
                                                                                  and "fa2" or "fa3"}
    plan = _calls(fi, "BatchMLAPagedAttentionWrapper.plan")[0]
    assert (plan["head_dim_ckv"], plan["head_dim_kpe"], plan["lse_mode"], plan["causal"]) == (512, 64, "basee",
                                                                                              False)
    assert plan["kv_indptr"]["device"] == "cpu"
    non_mla = next(c for c in FI_CASES if not c.mla)
    assert k.caps.missing_for(non_mla, "cuda")


SG_CASES = _unique([
    *_cases(lambda c: c.window is None and not c.sinks and c.softcap is None and c.data == "structured"
            and c.num_splits is None and c.label == "" and not c.mla, 10),
    *_cases(lambda c: c.mla, 3),
    *_cases(lambda c: c.window is not None, 4),
    *_cases(lambda c: c.softcap is not None or c.sinks),
    *_cases(lambda c: c.num_splits is not None, 3),
])


def test_sglang_declares_its_conventions(fake_sg):
    assert fake_sg.caps.unavailable is None
    assert fake_sg.caps.window_convention == "counts-current"
    assert not fake_sg.caps.lse and fake_sg.caps.mla and fake_sg.caps.num_splits and fake_sg.caps.sinks


def test_sglang_launch_obeys_the_capture_rules(fake_sg):
    """Declared cuda_graph_safe: the launch issues no host->device copy and reads no device
    value on the host (FakeCapture, the rules a CUDA-graph capture enforces)."""
    from decode_conformance.runner import prepare
    assert fake_sg.caps.cuda_graph_safe
    case = next(c for c in SG_CASES if c.window is not None and not fake_sg.caps.missing_for(c, "cuda"))
    launch = fake_sg.plan(prepare(fake_sg, case, "cpu"))
    with FakeCapture():
        launch()


@pytest.mark.parametrize("case", SG_CASES, ids=lambda c: c.id)
def test_sglang_adapter_against_fake(fake_sg, case):
    if fake_sg.caps.missing_for(case, "cuda"):
        pytest.skip(f"not declared: {fake_sg.caps.missing_for(case, 'cuda')}")
    res = run_case(fake_sg, case, "cpu")
    if all(L > 0 for L in case.seq_lens) or case.sinks:
        assert res.ok, res.message
    else:
        # The fake follows sglang's stage-2 arithmetic, acc / e_sum with e_sum = 0 for an
        # empty request (a NaN row); the suite must report that as a failure.
        assert not res.ok and "non-finite" in res.message, res.message


def test_sglang_newer_module_path(monkeypatch):
    monkeypatch.setitem(sys.modules, SG_MODULE, None)
    monkeypatch.setitem(sys.modules, SG_MODULE_NEW, fake_sglang(SG_MODULE_NEW))
    k = load_kernel(SG_SPEC)
    assert k.caps.unavailable is None
    case = next(c for c in SG_CASES if all(n > 0 for n in c.seq_lens))
    assert run_case(k, case, "cpu").ok


def test_sglang_old_signature_declares_less(monkeypatch):
    """An sglang without k_scale/v_scale and sinks: fp8 and sink cases become skips."""
    def old(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
            max_kv_splits, sm_scale, logit_cap=0.0):
        fake_decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
                                  num_kv_splits, max_kv_splits, sm_scale, 1.0, 1.0, logit_cap)
    m = types.ModuleType(SG_MODULE)
    m.decode_attention_fwd = old
    monkeypatch.setitem(sys.modules, SG_MODULE, m)
    k = load_kernel(SG_SPEC)
    assert k.caps.kv_dtypes == frozenset({"bf16", "fp16"}) and not k.caps.sinks
    case = next(c for c in SG_CASES if not k.caps.missing_for(c, "cuda") and all(n > 0 for n in c.seq_lens))
    assert run_case(k, case, "cpu").ok


def test_sglang_declares_no_zero_length_rows(fake_sg):
    """sglang's engine pads CUDA-graph batches with seq_len 1, never 0: a case with a 0-length
    row is skipped naming the rule; one without runs."""
    empty = next(c for c in SG_CASES if 0 in c.seq_lens)
    reasons = fake_sg.caps.missing_for(empty, "cuda")
    assert any("min_len 0" in r and "seq_len 1" in r for r in reasons), reasons
    full = next(c for c in SG_CASES if min(c.seq_lens) > 0)
    assert not fake_sg.caps.missing_for(full, "cuda")


def test_graph_replay_takes_only_the_lengths_a_kernel_declares(fake_sg):
    """The graph-replay scenario applies the kernel's shape rules to each replay, as batch
    invariance does: sglang (min_len >= 1) is not replayed with a 0-length row, and each
    replay left out is named; a kernel without the rule takes every replay."""
    from decode_conformance import scenarios
    from decode_conformance_kernels.registry import adaptive_split
    cap = scenarios.SCENARIOS["graph-replay"].fixed_cases("gpu")[1][0]  # batch 4, at capacity
    run, not_run = scenarios.graph_replays(fake_sg, cap, "cuda")
    assert [c.seq_lens for c in run] == [(1, 32769, 7, 4096), (33, 33, 33, 33)]
    assert len(not_run) == 2 and all("not run: min_len 0" in line for line in not_run), not_run
    run, not_run = scenarios.graph_replays(adaptive_split(), cap, "cuda")
    assert len(run) == len(scenarios.GRAPH_REPLAYS[4]) and not not_run

"""vLLM's unified_attention adapters (kernels/adapters/vllm_unified.py) against the recording
stand-in of suites/selftest/fake_libraries.py: both module paths, both forced launch paths,
the window pair, fp8 descale tensors, sinks, the 3D scratch from the workspace, and an older
signature. The real kernel files run under Triton's interpreter in test_real_triton_adapters.py,
where they are importable (never in CI)."""
from __future__ import annotations

import dataclasses
import sys

import pytest

from decode_conformance.case_sets import build_set
from decode_conformance.kernel_api import load_kernel
from decode_conformance.runner import run_case
from suites.selftest.fake_libraries import fake_vllm

NEW = "vllm.v1.attention.ops.triton_unified_attention"
OLD = "vllm.attention.ops.triton_unified_attention"
SPEC = "decode_conformance_kernels.registry:vllm_unified_"

CASES = build_set("parity", "interpreter")


def _pick(kernel, pred, n):
    return [c for c in CASES if pred(c) and not kernel.caps.missing_for(c, "cuda")][:n]


@pytest.fixture
def fake(monkeypatch):
    m = fake_vllm(NEW)
    monkeypatch.setitem(sys.modules, NEW, m)
    return m


def _cases_for(kernel):
    return [*_pick(kernel, lambda c: c.window is None and c.softcap is None and not c.sinks, 4),
            *_pick(kernel, lambda c: c.window is not None, 3),
            *_pick(kernel, lambda c: c.softcap is not None, 2),
            *_pick(kernel, lambda c: c.sinks, 2),
            *_pick(kernel, lambda c: c.kv_dtype in ("e4m3", "e5m2"), 2),
            *_pick(kernel, lambda c: 0 in c.seq_lens, 2)]


@pytest.mark.parametrize("path", ["2d", "3d"])
def test_vllm_adapter_against_fake(fake, path):
    k = load_kernel(SPEC + path)
    assert k.caps.unavailable is None and k.name == f"vllm_unified_{path}"
    assert k.caps.window_convention == "counts-current" and not k.caps.lse and not k.caps.mla
    bad = []
    for case in _cases_for(k):
        res = run_case(k, case, "cpu")
        if not res.ok:
            bad.append(f"{case.id}: {res.message}")
    assert not bad, "\n".join(bad)
    calls = [c["args"] for c in fake.calls]
    assert {c["use_3d"] for c in calls} == {path == "3d"}, "the forced path must be the one launched"
    assert all(c["max_seqlen_q"] == 1 and c["causal"] for c in calls)
    fp8 = [c for c in calls if c["kv_quant_mode"] == 1]
    assert fp8 and all(c["k_descale"]["dtype"].is_floating_point and c["q_descale"] is None for c in fp8)
    if path == "3d":
        assert all(c["softmax_segm_output"]["shape"][2] == 16 for c in calls)


def test_vllm_window_pair(fake):
    """The window reaches the kernel as (window - 1, 0): counts-current. Planted: declaring
    the other convention must fail a window case that cuts the context."""
    k = load_kernel(SPEC + "2d")
    case = min((c for c in CASES if c.window is not None and c.max_len > c.visible_keys
                and not k.caps.missing_for(c, "cuda")), key=lambda c: c.visible_keys)  # one key of few
    assert run_case(k, case, "cpu").ok
    (call,) = [c["args"] for c in fake.calls]
    assert call["window_size"] == (case.window_in("counts-current") - 1, 0)
    k.caps = dataclasses.replace(k.caps, window_convention="excludes-current")
    assert not run_case(k, case, "cpu").ok


def test_vllm_older_module_path_and_signature(monkeypatch):
    """Before the ops moved under v1/, and without the forced-3D arguments: 2D runs, 3D says why not."""
    monkeypatch.setitem(sys.modules, NEW, None)
    monkeypatch.setitem(sys.modules, OLD, fake_vllm(OLD, with_3d=False))
    k2, k3 = load_kernel(SPEC + "2d"), load_kernel(SPEC + "3d")
    assert k2.caps.unavailable is None
    assert k3.caps.unavailable and "seq_threshold_3D" in k3.caps.unavailable
    case = _pick(k2, lambda c: c.window is None, 1)[0]
    assert run_case(k2, case, "cpu").ok


def test_vllm_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    k = load_kernel(SPEC + "3d")
    assert k.caps.unavailable == "vllm is not installed"


@pytest.mark.parametrize("path", ["2d", "3d"])
def test_vllm_launch_obeys_the_capture_rules(fake, path):
    """Declared cuda_graph_safe: the launch issues no host->device copy and reads no device
    value on the host (FakeCapture, the rules a CUDA-graph capture enforces)."""
    from decode_conformance.runner import prepare
    from suites.selftest.fake_libraries import FakeCapture
    k = load_kernel(SPEC + path)
    assert k.caps.cuda_graph_safe
    case = _pick(k, lambda c: 0 in c.seq_lens, 1)[0]
    launch = k.plan(prepare(k, case, "cpu"))
    with FakeCapture():
        launch()

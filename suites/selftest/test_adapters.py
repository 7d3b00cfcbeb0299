"""Adapters for external libraries (kernels/adapters/flashinfer_decode.py, sglang_decode.py).

Without the library: the kernel still loads, says why it cannot run, and every case skips
with "<kernel> lacks: <library> is not installed" - neither failed nor passed.

With a stand-in library: small pure-torch fakes of flashinfer's paged decode wrapper and
sglang's decode_attention_fwd, written from their documented interfaces (page-level indptr
with last_page_len, window_left excluding the current token, base-2 LSE; CSR slot indices,
split-KV scratch, logit_cap). They check the adapters' translation on CPU: metadata, window
convention, soft-cap, fp8 scales, LSE base, scratch from the workspace. They do not check
the libraries themselves; that needs a GPU and the real packages.
"""
from __future__ import annotations

import importlib.util
import math
import sys
import types

import pytest
import torch

from decode_conformance.case_sets import build_set
from decode_conformance.kernel_api import Capabilities, load_kernel
from decode_conformance.runner import run_case
from decode_conformance_kernels.adapters.flashinfer_decode import CAPS as FI_CAPS
from suites.selftest._subpytest import PARITY, run_pytest, small_case_ids

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


# ---- fake flashinfer -------------------------------------------------------------------

def _fake_attention(q, k, v, sm_scale, cap, sinks=None):
    """q [H, D], k [n, H, D], v [n, H, Dv] (heads already expanded): (out [H, Dv], lse [H])."""
    s = torch.einsum("hd,nhd->hn", q.double(), k.double()) * sm_scale
    if cap:
        s = cap * torch.tanh(s / cap)
    if sinks is not None:
        s = torch.cat([s, sinks.double()[:, None]], dim=1)
    lse = torch.logsumexp(s, dim=1)
    p = torch.exp(s - lse[:, None])
    if sinks is not None:
        p = p[:, :-1]
    return torch.einsum("hn,nhd->hd", p, v.double()), lse


class FakeFlashinferWrapper:
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper, NHD, the documented plan/run subset."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_tensor_cores=False):
        assert kv_layout == "NHD"
        assert float_workspace_buffer.dtype == torch.uint8
        self.workspace = float_workspace_buffer

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=torch.float16,
             kv_data_type=None, sm_scale=None):
        assert pos_encoding_mode == "NONE"
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        last = last_page_len.cpu()
        n_pages = indptr.cpu().diff()
        assert bool(torch.where(n_pages > 0, (last >= 1) & (last <= page_size), last == 0).all()), \
            "kv_last_page_len must be in 1..page_size for a request with pages"
        self.p = dict(indptr=indptr.cpu().tolist(), indices=indices.cpu().tolist(), last=last.tolist(),
                      hq=num_qo_heads, hkv=num_kv_heads, d=head_dim, P=page_size, window_left=window_left,
                      cap=logits_soft_cap or 0.0, kv_dtype=kv_data_type,
                      sm_scale=sm_scale if sm_scale is not None else 1 / math.sqrt(head_dim))

    def run(self, q, paged_kv_cache, *, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False):
        p = self.p
        k_cache, v_cache = paged_kv_cache
        assert k_cache.dtype == p["kv_dtype"] and k_cache.shape[1] == p["P"]
        sm_scale = p["sm_scale"] * (k_scale if k_scale is not None else 1.0)
        B = q.shape[0]
        out = torch.empty(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype) if out is None else out
        lse = torch.empty(q.shape[:2], dtype=torch.float32) if lse is None else lse
        group = p["hq"] // p["hkv"]
        for b in range(B):
            pages = p["indices"][p["indptr"][b]:p["indptr"][b + 1]]
            n = (len(pages) - 1) * p["P"] + p["last"][b] if pages else 0
            k = k_cache[pages].flatten(0, 1)[:n]
            v = v_cache[pages].flatten(0, 1)[:n]
            if p["window_left"] >= 0:  # window_left keys before the current one, plus it
                k, v = k[-(p["window_left"] + 1):], v[-(p["window_left"] + 1):]
            if k.shape[0] == 0:
                out[b] = 0
                lse[b] = float("-inf")
                continue
            k = k.double().repeat_interleave(group, dim=1)
            v = v.double().repeat_interleave(group, dim=1) * (v_scale if v_scale is not None else 1.0)
            o, l_nat = _fake_attention(q[b], k, v, sm_scale, p["cap"])
            out[b] = o.to(out.dtype)
            lse[b] = (l_nat / math.log(2.0)).float()  # flashinfer reports base 2
        return (out, lse) if return_lse else out


def _fake_flashinfer():
    m = types.ModuleType("flashinfer")
    m.BatchDecodeWithPagedKVCacheWrapper = FakeFlashinferWrapper
    return m


# ---- fake sglang -----------------------------------------------------------------------

MIN_BLOCK_KV = 32


def fake_decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
                              num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=0.0,
                              sinks=None, xai_temperature_len=-1):
    """sglang's two-stage split-KV decode: stage 1 writes per-split partials into the
    caller's scratch, stage 2 merges the non-empty splits (and adds sinks)."""
    assert max_kv_splits == attn_logits.shape[2] and attn_logits.shape[-1] == v_buffer.shape[-1]
    B, H = q.shape[:2]
    group = H // k_buffer.shape[1]
    indptr, splits = kv_indptr.tolist(), num_kv_splits.tolist()
    scale = sm_scale * k_scale
    for b in range(B):
        L = indptr[b + 1] - indptr[b]
        slots = kv_indices[indptr[b]:indptr[b + 1]].long()
        per = math.ceil(math.ceil(L / splits[b]) / MIN_BLOCK_KV) * MIN_BLOCK_KV if L else 0
        k_all = k_buffer[slots].double().repeat_interleave(group, dim=1)
        v_all = v_buffer[slots].double().repeat_interleave(group, dim=1)
        for i in range(splits[b]):  # stage 1
            lo, hi = i * per, min((i + 1) * per, L)
            if hi > lo:
                o_i, l_i = _fake_attention(q[b], k_all[lo:hi], v_all[lo:hi], scale, logit_cap)
                attn_logits[b, :, i] = o_i.float()
                attn_lse[b, :, i] = l_i.float()
        e_max = torch.full((H,), float("-inf"), dtype=torch.float64)
        e_sum = torch.zeros(H, dtype=torch.float64)
        acc = torch.zeros(H, v_buffer.shape[-1], dtype=torch.float64)
        for i in range(max_kv_splits):  # stage 2 reads only the non-empty splits
            lo, hi = i * per, min((i + 1) * per, L)
            if i < splits[b] and hi > lo:
                tl, tv = attn_lse[b, :, i].double(), attn_logits[b, :, i].double()
                n_max = torch.maximum(tl, e_max)
                old = torch.exp(e_max - n_max)
                w = torch.exp(tl - n_max)
                acc = acc * old[:, None] + w[:, None] * tv
                e_sum = e_sum * old + w
                e_max = n_max
        if sinks is not None:
            e_sum = e_sum + torch.exp(sinks.double() - e_max)
        o[b] = (acc / e_sum[:, None] * v_scale).to(o.dtype)


def _fake_sglang(module_name):
    m = types.ModuleType(module_name)
    m.decode_attention_fwd = fake_decode_attention_fwd
    return m


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
    monkeypatch.setitem(sys.modules, "flashinfer", _fake_flashinfer())
    return load_kernel(FI_SPEC)


@pytest.fixture
def fake_sg(monkeypatch):
    monkeypatch.setitem(sys.modules, SG_MODULE, _fake_sglang(SG_MODULE))
    return load_kernel(SG_SPEC)


def test_flashinfer_declares_its_conventions(fake_fi):
    assert fake_fi.caps.unavailable is None
    assert fake_fi.caps.window_convention == "excludes-current"
    assert fake_fi.caps.lse and not fake_fi.caps.mla
    assert fake_fi.caps.devices == frozenset({"cuda"})


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
    monkeypatch.setitem(sys.modules, SG_MODULE_NEW, _fake_sglang(SG_MODULE_NEW))
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

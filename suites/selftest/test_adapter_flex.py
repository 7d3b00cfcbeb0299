"""torch FlexAttention adapter (kernels/adapters/torch_flex.py) on the CPU: torch is always
installed, so the real flex_attention runs (eager here, ~1 s a case; compiled on a GPU) on one
case per feature it declares - paged and contiguous caches, fp8, a window, soft-cap with
sinks, MLA, empty requests."""
from __future__ import annotations

import warnings

import pytest

from decode_conformance.case_sets import build_set
from decode_conformance.kernel_api import load_kernel
from decode_conformance.runner import run_case

SPEC = "decode_conformance_kernels.registry:torch_flex"
FEATURES = {
    "paged-window": lambda c: c.layout == "paged" and c.window is not None and c.page_size > 1,
    "contig-fp8": lambda c: c.layout == "contig" and c.kv_dtype in ("e4m3", "e5m2") and c.window is None,
    "softcap-sinks": lambda c: c.softcap is not None and c.sinks,
    "mla": lambda c: c.mla and c.head_dim == 576,
    "empty-rows": lambda c: 0 in c.seq_lens and not c.sinks,
}


def _case(pred):
    return next(c for c in build_set("parity", "interpreter") if pred(c))


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_flex_adapter_on_cpu(feature):
    k = load_kernel(SPEC)
    case = _case(FEATURES[feature])
    assert not k.caps.missing_for(case, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention warns that it is not compiled
        res = run_case(k, case, "cpu")
    assert res.ok, f"{case.id}: {res.message}"


@pytest.mark.parametrize("feature, wide", [("mla", True), ("paged-window", False)])
def test_flex_gets_small_tiles_for_wide_heads(monkeypatch, feature, wide):
    """Head dims past 256 (MLA 576) get kernel_options that fit sm_90's shared memory (the
    defaults asked 425984 B of 232448 B on an H200); others keep Inductor's defaults. The
    options reach flex_attention, which takes them (eager here: the tile sizes themselves are
    checked only when compiled on the GPU)."""
    import decode_conformance_kernels.adapters.torch_flex as flex_mod
    seen = []
    real = flex_mod._compiled

    def recording(device_type):
        fn = real(device_type)

        def call(*args, **kwargs):
            seen.append(kwargs.get("kernel_options"))
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(flex_mod, "_compiled", recording)
    k = load_kernel(SPEC)
    case = _case(FEATURES[feature])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_case(k, case, "cpu")
    assert res.ok, f"{case.id}: {res.message}"
    assert seen and all(o == (flex_mod.WIDE_KERNEL_OPTIONS if wide else None) for o in seen), seen


@pytest.mark.parametrize("group, block_n", [(1, 32), (16, 32), (32, 16), (128, 16)])
def test_flex_wide_heads_leave_block_m_to_flex(group, block_n):
    """flex's decoding template holds a KV head's query group on BLOCK_M rows and sizes BLOCK_M
    from the group itself; forcing 16 failed to compile on an H200 for groups 32 and 128. Wider
    groups take a narrower K/V step instead, to stay inside the shared memory."""
    import decode_conformance_kernels.adapters.torch_flex as flex_mod
    opts = flex_mod.kernel_options(576, group)
    assert "BLOCK_M" not in opts and opts["BLOCK_N"] == block_n and opts["num_stages"] == 1, opts
    assert flex_mod.kernel_options(128, group) is None


def test_flex_declares_the_group_its_template_cannot_hold_at_576():
    """H200, torch 2.11: group 128 at head dim 576 asks 294912 B of shared memory (232448 B
    there); the adapter declares it instead of failing, and keeps every group at head dim 128."""
    from decode_conformance.cases import Case
    k = load_kernel(SPEC)
    wide = Case(kv_dtype="e4m3", num_q_heads=128, num_kv_heads=1, head_dim=576, seq_lens=(7,), v_head_dim=512,
                mla=True, page_size=64)
    assert any(r.startswith("group 128 (supported: <= 64 when head_dim>=513") for r in k.caps.missing_for(wide, "cuda"))
    assert not k.caps.missing_for(wide.replace(num_q_heads=8), "cuda")
    assert not k.caps.missing_for(Case(kv_dtype="bf16", num_q_heads=128, num_kv_heads=1, head_dim=128, seq_lens=(7,)),
                                  "cuda")

"""vLLM's and sglang's real Triton kernels through their adapters, on the CPU under Triton's
interpreter, where the library (or just its kernel files, e.g. extracted from the released
wheel with stand-ins for the few vllm.* / sglang.* modules they import) is importable. CI has
neither, so these skip there; the fake-library tests check the translation in CI."""
from __future__ import annotations

import pytest

from decode_conformance.case_sets import build_set
from decode_conformance.kernel_api import load_kernel
from decode_conformance.runner import run_case

FEATURES = {
    "paged-window": lambda c: c.layout == "paged" and c.window is not None and c.kv_dtype == "bf16",
    "fp8": lambda c: c.kv_dtype == "e4m3" and c.layout == "paged" and c.window is None,
    "softcap-sinks": lambda c: c.softcap is not None and c.sinks,
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("name", ["vllm_unified_2d", "vllm_unified_3d", "sglang_decode"])
def test_real_kernel_in_the_interpreter(name, feature):
    k = load_kernel(f"decode_conformance_kernels.registry:{name}")
    if k.caps.unavailable:
        pytest.skip(k.caps.unavailable)
    case = next((c for c in build_set("parity", "interpreter") if FEATURES[feature](c)
                 and not k.caps.missing_for(c, "cpu") and all(n > 0 for n in c.seq_lens)), None)
    assert case is not None, f"no {feature} case {name} declares"
    res = run_case(k, case, "cpu")
    assert res.ok, f"{case.id}: {res.message}"

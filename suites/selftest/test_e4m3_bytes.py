"""GPUs below sm_89 have no e4m3 type in Triton, so every shipped kernel takes an e4m3 cache as
uint8 bytes there and rebuilds the values exactly (triton_common.kv_operand / upcast_kv). The
byte path runs here by forcing it on the interpreter: it must pass and equal the typed path
bit for bit (the compile check builds it for sm_80)."""
import pytest
import torch

from decode_conformance.case_sets import build_set
from decode_conformance.runner import run_case

CASE = next(c for c in build_set("parity", "interpreter") if c.kv_dtype == "e4m3" and not c.mla and not c.sinks
            and c.softcap is None and c.max_len > 256)


@pytest.mark.parametrize("name", ["fixed_split", "adaptive_split", "lean"])
def test_byte_path_equals_typed_path(name, monkeypatch):
    import os
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("forces the byte path under the interpreter (a GPU below sm_89 takes it by itself)")
    from decode_conformance_kernels import registry, triton_common as tc
    kernel = getattr(registry, name)()
    typed = run_case(kernel, CASE, "cpu", keep_output=True)
    monkeypatch.setattr(tc, "FORCE_E4M3_BITS", True)
    assert tc.kv_operand(torch.zeros(2, dtype=torch.float8_e4m3fn))[1], "the byte path is not taken"
    as_bytes = run_case(kernel, CASE, "cpu", keep_output=True)
    assert typed.ok and as_bytes.ok, (typed.message, as_bytes.message)
    assert torch.equal(typed.output.view(torch.int16), as_bytes.output.view(torch.int16))

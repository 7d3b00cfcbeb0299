"""The MLA probe kernels (benchmarks/mla_probe.py) compute attention right, so what the peer table
times of them is the MLA loop and not a broken one: each probe form, judged by the suite's own
runner against the float64 reference on a small MLA case under the interpreter."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from decode_conformance.cases import Case  # noqa: E402
from decode_conformance.runner import build_checked, run_prepared  # noqa: E402

# 64 query heads (one probe head tile) on the 576 / 512 latent head, two requests of 256 keys; on
# a GPU of 4 SMs each request takes 2 chunks of 2 or more key steps, so the loop's rescale and the
# merge of partials both run
CASE = Case(kv_dtype="bf16", num_q_heads=64, num_kv_heads=1, head_dim=576, v_head_dim=512, mla=True,
            seq_lens=(256, 256), page_size=16, seed=11, data="randn")


@pytest.fixture(autouse=True)
def _four_sms(monkeypatch):
    monkeypatch.setenv("DECODE_CONFORMANCE_NUM_SMS", "4")


@pytest.mark.parametrize("factory", ["gather_64", "gather_64_masked_exp", "gather_32_dv2_w4", "tma_64",
                                     "tma_32_dv2"])
def test_probe_is_right_on_an_mla_case(factory):
    from benchmarks import mla_probe  # imported in the test: the interpreter is set up by then, as for the kernels
    kernel = getattr(mla_probe, factory)()
    assert not kernel.caps.missing_for(CASE, "cpu"), kernel.caps.missing_for(CASE, "cpu")
    batch, ref, tier = build_checked(kernel, CASE, "cpu")
    res = run_prepared(kernel, CASE, batch, ref, tier)
    assert res.ok, res.message


def test_probe_refuses_what_it_does_not_cover():
    """A ragged batch has no equal chunks to split: the plan says so instead of timing a wrong launch."""
    case = Case(kv_dtype="bf16", num_q_heads=64, num_kv_heads=1, head_dim=576, v_head_dim=512, mla=True,
                seq_lens=(256, 64), page_size=16, seed=11)
    from benchmarks import mla_probe
    kernel = mla_probe.gather_64()
    batch, _, _ = build_checked(kernel, case, "cpu")
    with pytest.raises(ValueError, match="equal lengths"):
        kernel.plan(batch)

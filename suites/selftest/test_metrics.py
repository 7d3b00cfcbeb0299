"""The judge: each planted defect in an otherwise exact output must fail its named check,
and an output at the dtype's rounding floor must pass."""
import math

import torch

from decode_conformance.cases import Case
from decode_conformance.factories import build
from decode_conformance.metrics import judge
from decode_conformance.reference import low_precision_attention, reference

CASE = Case(kv_dtype="bf16", num_q_heads=32, num_kv_heads=8, head_dim=64, seq_lens=(300, 0, 129, 77), page_size=16)


def _setup():
    b = build(CASE)
    ref = reference(b)
    return b, ref, low_precision_attention(b)


def _judge(out, lse, ref, budget):
    return judge(CASE, out, lse, ref.out, ref.lse, ref.visible, budget)


def test_rounded_reference_passes():
    b, ref, budget = _setup()
    v = _judge(ref.out.to(torch.bfloat16), ref.lse.float(), ref, budget)
    assert v.passed, v.summary()


def test_one_bad_row_fails_although_global_cosine_passes():
    b, ref, budget = _setup()
    out = ref.out.clone()
    out[2, 5, 3] += 0.1  # one element of one (request, head) row of 128 is wrong
    v = _judge(out.to(torch.bfloat16), ref.lse.float(), ref, budget)
    assert v.cosine > 0.9995, "the planted error should hide from the global cosine"
    assert not v.passed and v.worst_row == (2, 5)
    assert any("rows over tolerance" in f for f in v.failures)


def test_nan_fails():
    b, ref, budget = _setup()
    out = ref.out.to(torch.bfloat16)
    out[3, 0, 7] = float("nan")
    v = _judge(out, ref.lse.float(), ref, budget)
    assert not v.passed and v.nonfinite == 1


def test_padding_row_must_be_zero():
    b, ref, budget = _setup()
    out = ref.out.to(torch.bfloat16)
    out[1] = 1e-3  # request 1 has length 0
    v = _judge(out, ref.lse.float(), ref, budget)
    assert not v.passed and any("exactly zero" in f for f in v.failures)


def test_lse_in_base_two_fails():
    b, ref, budget = _setup()
    v = _judge(ref.out.to(torch.bfloat16), (ref.lse / math.log(2)).float(), ref, budget)
    assert not v.passed and any("LSE" in f for f in v.failures)


def test_error_budget_catches_a_uniformly_sloppy_kernel():
    # 2 % noise everywhere: inside a loose per-row tolerance, but far above torch's own bf16 error
    b, ref, budget = _setup()
    g = torch.Generator().manual_seed(0)
    noisy = ref.out * (1 + 0.02 * torch.randn(ref.out.shape, generator=g, dtype=torch.float64))
    v = _judge(noisy.to(torch.bfloat16), ref.lse.float(), ref, budget)
    assert not v.passed and any("x torch-bfloat16 error" in f for f in v.failures), v.summary()

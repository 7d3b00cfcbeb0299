"""The judge: each planted defect in an otherwise exact output must fail its named check, an
output at the dtype's rounding floor must pass, and the row budget scales with each row."""
import math

import torch

from decode_conformance.cases import Case
from decode_conformance.factories import build
from decode_conformance.metrics import judge, row_budget, ulp
from decode_conformance.reference import reference, tier_attention

CASE = Case(kv_dtype="bf16", num_q_heads=32, num_kv_heads=8, head_dim=64, seq_lens=(300, 0, 129, 77), page_size=16)


def _setup(case=CASE):
    b = build(case)
    return b, reference(case, b), tier_attention(case, b)


def _judge(out, lse, ref, tier, case=CASE, sinks=None):
    return judge(case, out, lse, ref.out, ref.lse, ref.visible, tier.outs, tier.lses, sinks, lse_slack=tier.lse_slack)


def test_rounded_reference_passes():
    b, ref, tier = _setup()
    v = _judge(ref.out.to(torch.bfloat16), ref.lse.float(), ref, tier)
    assert v.passed, v.summary()
    assert v.worst_row_ratio < 0.5, "a correctly rounded output sits well inside every row's budget"


def test_torch_in_the_case_dtype_passes():
    b, ref, tier = _setup()
    assert _judge(tier.out, ref.lse.float(), ref, tier).passed


def test_one_bad_row_fails_although_global_cosine_passes():
    b, ref, tier = _setup()
    out = ref.out.clone()
    out[2, 5, 3] += 0.1  # one element of one (request, head) row of 128 is wrong
    v = _judge(out.to(torch.bfloat16), ref.lse.float(), ref, tier)
    assert v.cosine > 0.9995, "the planted error should hide from the global cosine"
    assert not v.passed and v.worst_row == (2, 5) and v.rows_over == 1
    assert any("rows over their error budget" in f for f in v.failures)


def test_a_two_percent_error_on_one_long_row_fails_its_row():
    """The short rows dominate any global number; the long row is judged on its own."""
    b, ref, tier = _setup()
    out = ref.out.clone()
    out[0] *= 0.98  # request 0 (300 keys) only
    v = _judge(out.to(torch.bfloat16), ref.lse.float(), ref, tier)
    assert not v.passed and v.worst_row[0] == 0 and v.rows_over == CASE.num_q_heads, v.summary()


def test_budget_is_the_rows_own():
    """A row's floor follows its own magnitude (its ulp), not the largest value of the output."""
    b, ref, tier = _setup()
    big = ref.out.clone()
    big[3] *= 1000.0  # one request with huge outputs must not loosen the others' budgets
    small = row_budget(ref.out, tier.out, ref.visible, torch.bfloat16)
    mixed = row_budget(big, tier.out * torch.tensor([1, 1, 1, 1000.0], dtype=torch.float64)[:, None, None]
                       .to(tier.out.dtype), ref.visible, torch.bfloat16)
    torch.testing.assert_close(mixed.l2[:3], small.l2[:3])
    assert ulp(torch.tensor([1.0, 3.0, 1e-3], dtype=torch.float64), torch.bfloat16).tolist() == \
        [2 ** -7, 2 ** -6, 2 ** -17]


def test_nan_fails():
    b, ref, tier = _setup()
    out = ref.out.to(torch.bfloat16)
    out[3, 0, 7] = float("nan")
    v = _judge(out, ref.lse.float(), ref, tier)
    assert not v.passed and v.nonfinite == 1


def test_padding_row_must_be_zero():
    b, ref, tier = _setup()
    out = ref.out.to(torch.bfloat16)
    out[1] = 1e-3  # request 1 has length 0
    v = _judge(out, ref.lse.float(), ref, tier)
    assert not v.passed and any("exactly zero" in f and "in request(s) 1" in f for f in v.failures), v.failures


def test_padding_row_lse_must_be_minus_inf_or_the_sink():
    b, ref, tier = _setup()
    lse = ref.lse.float().clone()
    lse[1] = 0.0  # a kernel that leaves 0 instead of -inf on an empty row
    v = _judge(ref.out.to(torch.bfloat16), lse, ref, tier)
    assert not v.passed and any("no visible key must be -inf; request(s) 1 are not" in f for f in v.failures), \
        v.failures
    case = CASE.replace(sinks=True)
    b, ref, tier = _setup(case)
    good = _judge(ref.out.to(torch.bfloat16), ref.lse.float(), ref, tier, case, b.sinks)
    assert good.passed, good.summary()
    lse = ref.lse.float().clone()
    lse[1] = float("-inf")  # with sinks the empty row's LSE is the sink's logit
    v = _judge(ref.out.to(torch.bfloat16), lse, ref, tier, case, b.sinks)
    assert not v.passed and any("the sink's logit" in f for f in v.failures)


def test_lse_in_base_two_fails():
    b, ref, tier = _setup()
    v = _judge(ref.out.to(torch.bfloat16), (ref.lse / math.log(2)).float(), ref, tier)
    assert not v.passed and any("LSE" in f for f in v.failures)


def test_uniformly_sloppy_kernel_fails():
    # 2 % noise everywhere: far above torch's own bf16 error on every row
    b, ref, tier = _setup()
    g = torch.Generator().manual_seed(0)
    noisy = ref.out * (1 + 0.02 * torch.randn(ref.out.shape, generator=g, dtype=torch.float64))
    v = _judge(noisy.to(torch.bfloat16), ref.lse.float(), ref, tier)
    assert not v.passed and v.rows_over > 50, v.summary()


def test_lse_rounded_to_fp32_passes_and_one_row_off_by_1e3_fails_its_row():
    """The LSE budget: an fp32-rounded float64 LSE sits inside every row's budget; +1e-3 on one
    (request, head) row - a 0.1 % weight in every merge using it - fails, naming that row."""
    b, ref, tier = _setup()
    out = ref.out.to(torch.bfloat16)
    good = _judge(out, ref.lse.float(), ref, tier)
    assert good.passed, good.summary()
    lse = ref.lse.float().clone()
    lse[2, 7] += 1e-3
    v = _judge(out, lse, ref, tier)
    assert not v.passed and any("1 of 96 rows' LSE over budget; worst (b=2, h=7)" in f for f in v.failures), v.failures
    # the summary's lse_err stands beside its budget: the same number reads differently at |lse| 1e5
    assert 1.0 < v.lse_ratio and f"lse_err={v.lse_err:.3g} ({v.lse_ratio:.3g}x its budget)" in v.summary(), v.summary()
    assert 0.0 <= good.lse_ratio <= 1.0 and "x its budget) nonfinite_out=0" in good.summary(), good.summary()


def test_lse_budget_follows_the_row():
    """Longer rows and larger scores get more (fp32 sums of more terms), and none of this
    case's rows allows 1e-4 (the constant it replaces allowed 2e-3 everywhere)."""
    from decode_conformance.metrics import lse_budget
    b, ref, tier = _setup()
    allow = lse_budget(ref.lse, tier.lses, ref.visible, slack=tier.lse_slack)
    vis = ref.visible > 0
    assert bool((allow[vis] < 1e-4).all()), allow[vis].max()
    floor = lse_budget(ref.lse, None, ref.visible)
    assert float(floor[0].min()) > float(floor[3].max()), "300 keys allow more than 77"


def test_a_windowed_rows_message_counts_the_keys_it_sees():
    """A window bug's worst row is read with the keys the kernel had to read, not the request's."""
    case = CASE.replace(window=63)
    b, ref, tier = _setup(case)
    out = ref.out.clone()
    out[0] *= 0.9
    v = _judge(out.to(torch.bfloat16), ref.lse.float(), ref, tier, case)
    assert not v.passed and v.worst_row[0] == 0
    assert any("63 visible of 300 keys" in f for f in v.failures), v.failures
    unwindowed = _judge(out.to(torch.bfloat16), ref.lse.float(), *_setup()[1:])
    assert any("(b=0, h=" in f and ", 300 keys)" in f for f in unwindowed.failures), unwindowed.failures


def test_a_row_just_over_its_budget_never_reads_as_1x():
    b, ref, tier = _setup()
    budget = row_budget(ref.out, tier.outs, ref.visible, torch.bfloat16)
    out = ref.out.double().clone()
    d = out.shape[-1]
    per_element = 1.0004 / max(math.sqrt(d) / float(budget.l2[2, 5]), 1.0 / float(budget.max[2, 5]))
    out[2, 5] += per_element  # the row's error 1.0004x its budget
    v = _judge(out, ref.lse.float(), ref, tier)
    assert not v.passed and v.rows_over == 1 and 1.0 < v.worst_row_ratio < 1.001, v.summary()
    assert any(" is 1.0004x its budget" in f for f in v.failures), v.failures

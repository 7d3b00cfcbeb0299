"""Self-test of decode_conformance.interpreter_compat (bf16 under TRITON_INTERPRET=1).

Each check is run with the layer on and, where it matters, off: the "off" runs show that
stock Triton's interpreter gets bf16 wrong (triton-lang/triton #11584), so these tests
would fail without the layer.
"""
import os

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("interpreter_compat only patches Triton's CPU interpreter; a GPU is present, so kernels "
                "compile for it and the layer is not used", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from decode_conformance import interpreter_compat as compat  # noqa: E402

if not compat._interpreter_active():
    pytest.skip("TRITON_INTERPRET is set to off; the layer only applies under the interpreter",
                allow_module_level=True)

M, K, N = 16, 64, 32


@triton.jit
def _dot_kernel(q_ptr, k_ptr, c_ptr, out_ptr, out32_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
                USE_ACC: tl.constexpr):
    m = tl.arange(0, M)
    d = tl.arange(0, K)
    n = tl.arange(0, N)
    q = tl.load(q_ptr + m[:, None] * K + d[None, :])
    k = tl.load(k_ptr + d[:, None] * N + n[None, :])
    if USE_ACC:
        acc = tl.load(c_ptr + m[:, None] * N + n[None, :])
    else:
        acc = tl.zeros([M, N], dtype=tl.float32)
    acc = tl.dot(q, k, acc)
    tl.store(out32_ptr + m[:, None] * N + n[None, :], acc)
    tl.store(out_ptr + m[:, None] * N + n[None, :], acc.to(out_ptr.dtype.element_ty))


@triton.jit
def _cast_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr, RTZ: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    if RTZ:
        y = x.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtz")
    else:
        y = x.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs, y)


@pytest.fixture(autouse=True)
def _restore_layer_state():
    """Leave the builder as this module found it, whatever a test switched."""
    was = compat.is_installed()
    yield
    if was:
        compat.install()
    else:
        compat.uninstall()


def _run_dot(q, k, c=None, out_dtype=torch.bfloat16):
    out = torch.empty(M, N, dtype=out_dtype)
    out32 = torch.empty(M, N, dtype=torch.float32)
    acc = c if c is not None else torch.zeros(M, N, dtype=torch.float32)
    _dot_kernel[(1, )](q, k, acc, out, out32, M, K, N, c is not None)
    return out, out32


def _cast(x, dtype, rtz=False):
    out = torch.empty(x.numel(), dtype=dtype)
    _cast_kernel[(1, )](x, out, x.numel(), rtz)
    return out


def _bf16_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(M, K, generator=g).to(torch.bfloat16)
    k = torch.randn(K, N, generator=g).to(torch.bfloat16)
    c = torch.randn(M, N, generator=g)
    return q, k, c


def _cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _bf16_ulp(x):
    mag = x.double().abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


def _bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("use_acc", [False, True], ids=["zero_acc", "given_acc"])
def test_bf16_dot_matches_torch_with_layer(use_acc):
    assert compat.install() is True
    q, k, c = _bf16_inputs()
    c = c if use_acc else None
    out, out32 = _run_dot(q, k, c)
    ref32 = q.float() @ k.float() + (c if use_acc else 0)
    ref = ref32.to(torch.bfloat16)
    # fp32 result: same products, only the summation order may differ.
    torch.testing.assert_close(out32, ref32, rtol=1e-5, atol=1e-5)
    # bf16 result: within one bf16 ulp of the value (a summation-order difference can tip a rounding).
    err = (out.double() - ref.double()).abs()
    assert bool((err <= _bf16_ulp(ref)).all()), f"max err {err.max().item()}"
    assert _cosine(out, ref) > 0.9999


def test_without_layer_bf16_dot_is_garbage():
    """Proof the layer matters: stock interpreter multiplies the uint16 bit patterns."""
    compat.uninstall()
    assert not compat.is_installed()
    q, k, c = _bf16_inputs()
    out, out32 = _run_dot(q, k, c)
    ref32 = q.float() @ k.float() + c
    max_err = (out32 - ref32).abs().max().item()
    assert _cosine(out32, ref32) < 0.9 or max_err > 1e3, (
        "bf16 tl.dot is correct without the compat layer: triton-lang/triton #11584 may be fixed upstream; "
        "re-check whether decode_conformance.interpreter_compat is still needed")


def _rne_probe_f32():
    """fp32 values where truncation and round-to-nearest-even give different bf16 results, plus edges."""
    patterns = [
        0x3F808000,  # 1 + 2^-8: exact tie, kept lsb even -> stays 0x3F80
        0x3F818000,  # tie with odd kept lsb -> rounds up to 0x3F82
        0x3F80FFFF,  # just under the next bf16 -> rounds up
        0x3F808001,  # just over a tie -> rounds up
        0x3F807FFF,  # just under a tie -> rounds down
        0xBF818000,  # negative tie, odd -> away from zero in magnitude
        0x7F7FFFFF,  # fp32 max -> rounds to +inf
        0x7F7F8000,  # tie at the top, odd lsb -> +inf
        0x7F7F7FFF,  # largest value that stays finite
        0x7F800000, 0xFF800000,  # +-inf stay inf
        0x7FC00000, 0xFFC00001,  # quiet NaNs
        0x7F800001,  # NaN with payload only in the low bits: truncation would give +inf
        0x00000000, 0x80000000,  # +-0
        0x00008000, 0x00018000, 0x0000FFFF, 0x007FFFFF,  # subnormals: ties and round-ups
        0x00800000,  # smallest normal
    ]
    rng = np.random.default_rng(1)
    rand = rng.integers(0, 2**32, size=256 - len(patterns), dtype=np.uint64).astype(np.uint32)
    rand = rand[(rand & 0x7F800000) != 0x7F800000]  # random part: finite only
    bits = np.concatenate([np.array(patterns, dtype=np.uint32), rand])
    bits = np.concatenate([bits, np.full(256 - bits.size, 0x3F818000, dtype=np.uint32)])
    return torch.from_numpy(bits.view(np.float32).copy())


def _assert_same_bf16(got, want):
    got_nan, want_nan = torch.isnan(got), torch.isnan(want)
    assert torch.equal(got_nan, want_nan), "NaN positions differ"
    keep = ~want_nan
    gb, wb = _bits(got[keep]), _bits(want[keep])
    bad = np.flatnonzero(gb != wb)
    assert bad.size == 0, f"{bad.size} mismatches, first: got {gb[bad[:4]]} want {wb[bad[:4]]}"


def test_fp32_to_bf16_store_rounds_to_nearest_even():
    assert compat.install() is True
    x = _rne_probe_f32()
    want = x.to(torch.bfloat16)
    truncated = (x.view(torch.int32).numpy().view(np.uint32) >> 16).astype(np.uint16)
    differs = (truncated != _bits(want)) & ~torch.isnan(x).numpy()
    assert differs.sum() >= 20, "probe has too few values where truncation and RNE disagree"
    _assert_same_bf16(_cast(x, torch.bfloat16), want)


def test_without_layer_fp32_to_bf16_truncates():
    compat.uninstall()
    x = _rne_probe_f32()
    got = _cast(x, torch.bfloat16)
    finite = torch.isfinite(x)
    assert not torch.equal(_bits_t(got[finite]), _bits_t(x[finite].to(torch.bfloat16))), (
        "fp32->bf16 already rounds to nearest even without the compat layer (upstream fix?)")


def _bits_t(t):
    return torch.from_numpy(_bits(t).astype(np.int32))


def test_fp32_to_bf16_rtz_truncates_and_keeps_nan():
    assert compat.install() is True
    x = _rne_probe_f32()
    got = _cast(x, torch.bfloat16, rtz=True)
    nan = torch.isnan(x)
    assert torch.equal(torch.isnan(got), nan)
    want = (x.view(torch.int32).numpy().view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(_bits(got)[~nan.numpy()], want[~nan.numpy()])


def test_fp16_and_fp64_to_bf16_round_to_nearest_even():
    assert compat.install() is True
    rng = np.random.default_rng(2)
    h = rng.integers(0, 2**16, size=4096, dtype=np.uint32).astype(np.uint16).view(np.float16)
    x16 = torch.from_numpy(h.copy())  # every kind of fp16, NaN/inf/subnormal included
    _assert_same_bf16(_cast(x16, torch.bfloat16), x16.to(torch.bfloat16))

    x64 = torch.from_numpy(rng.standard_normal(1024) * np.exp2(rng.integers(-140, 120, 1024)))
    x64[:4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e300], dtype=torch.float64)
    _assert_same_bf16(_cast(x64, torch.bfloat16), x64.to(torch.bfloat16))

    # One correctly rounded step (LLVM fptrunc), not two: 1 + 2^-8 + 2^-40 is above the bf16 tie,
    # so it rounds up; rounding to fp32 first would land on the tie and round down to 1.0.
    x = torch.full((16, ), 1 + 2.0**-8 + 2.0**-40, dtype=torch.float64)
    assert (_bits(_cast(x, torch.bfloat16)) == 0x3F81).all()


# bf16 -> fp64 goes bf16 -> fp32 (patched) -> fp64 (numpy astype, untouched), which warns on NaN.
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_bf16_widening_decodes_every_pattern():
    assert compat.install() is True
    allbits = torch.from_numpy(np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.int16).copy())
    x = allbits.view(torch.bfloat16)
    for dtype in (torch.float32, torch.float64):
        got, want = _cast(x, dtype), x.to(dtype)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan], want[~nan])


def test_other_dtypes_unchanged_by_install():
    g = torch.Generator().manual_seed(3)
    q16 = torch.randn(M, K, generator=g).half()
    k16 = torch.randn(K, N, generator=g).half()
    fp8_bytes = torch.arange(256, dtype=torch.int32).to(torch.uint8)

    def run_all():
        res = {"fp16_dot": _run_dot(q16, k16, out_dtype=torch.float16)}
        for name, f8 in (("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
            x8 = fp8_bytes.view(f8)
            res[f"{name}_to_f32"] = _cast(x8, torch.float32)
            res[f"{name}_to_bf16"] = _cast(x8, torch.bfloat16)
            a8 = (torch.randn(M, K, generator=torch.Generator().manual_seed(4)) * 4).to(f8)
            b8 = (torch.randn(K, N, generator=torch.Generator().manual_seed(5)) * 4).to(f8)
            res[f"{name}_dot"] = _run_dot(a8, b8, out_dtype=torch.float32)
        return res

    def flat(res):
        return {k: (v if isinstance(v, tuple) else (v, )) for k, v in res.items()}

    compat.uninstall()
    before = flat(run_all())
    assert compat.install() is True
    after = flat(run_all())
    for key in before:
        for b, a in zip(before[key], after[key]):
            same = torch.equal(_bits_any(b), _bits_any(a))
            assert same, f"{key} changed when the compat layer was installed"

    # And the untouched paths are right to begin with (what the design notes measured).
    out16, _ = after["fp16_dot"]
    torch.testing.assert_close(out16.float(), (q16.float() @ k16.float()).half().float(), rtol=2e-3, atol=2e-3)
    x8 = fp8_bytes.view(torch.float8_e4m3fn)
    (got,) = after["e4m3fn_to_f32"]
    finite = torch.isfinite(x8.float())
    assert torch.equal(got[finite], x8.float()[finite])


def _bits_any(t):
    return t.contiguous().view(torch.uint8)


def test_install_twice_is_harmless():
    assert compat.install() is True
    first = {n: getattr(_builder_cls(), n) for n in compat._PATCHED}
    assert compat.install() is True
    assert compat.is_installed()
    for name, fn in first.items():
        now = getattr(_builder_cls(), name)
        assert now is fn, f"{name} was re-wrapped"
        assert not getattr(now.__wrapped__, compat._MARK, False), f"{name} wraps a wrapper"
    q, k, c = _bf16_inputs(seed=7)
    _, out32 = _run_dot(q, k, c)
    torch.testing.assert_close(out32, q.float() @ k.float() + c, rtol=1e-5, atol=1e-5)

    compat.uninstall()
    compat.uninstall()
    assert not compat.is_installed()
    assert all(not getattr(getattr(_builder_cls(), n), compat._MARK, False) for n in compat._PATCHED)


def _builder_cls():
    import triton.runtime.interpreter as interp
    return interp.InterpreterBuilder


def test_install_refuses_unknown_internals(monkeypatch):
    compat.uninstall()
    monkeypatch.delattr(_builder_cls(), "create_dot")
    with pytest.raises(RuntimeError, match="InterpreterBuilder.create_dot"):
        compat.install()


def test_install_is_a_no_op_off_the_interpreter(monkeypatch):
    compat.uninstall()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert compat.install() is False
    assert not compat.is_installed()


def test_fp8_downcast_rounds_to_nearest_even_and_saturates():
    """bf16/fp32 -> fp8 under the interpreter: without the layer, mantissas are truncated and
    e4m3 clips at 256 (measured: dozens of 1024 values off); with it, every value equals
    torch's round-to-nearest-even saturated to the largest finite value (what the GPU's
    cvt.rn.satfinite gives), so a kernel that quantizes q and P to fp8 is judged on its own
    rounding."""
    g = torch.Generator().manual_seed(9)
    for src in (torch.float32, torch.bfloat16):
        x = (torch.randn(1024, generator=g) * 3).to(src)
        x[:2] = torch.tensor([1000.0, -1000.0]).to(src)
        for f8 in (torch.float8_e4m3fn, torch.float8_e5m2):
            want = x.float().clamp(-torch.finfo(f8).max, torch.finfo(f8).max).to(f8)
            compat.uninstall()
            before = _cast(x, f8)
            assert not torch.equal(before.view(torch.uint8), want.view(torch.uint8)), (src, f8)
            assert compat.install() is True
            after = _cast(x, f8)
            assert torch.equal(after.view(torch.uint8), want.view(torch.uint8)), (src, f8)


@triton.jit
def _scale_helper(x, s):
    return x * s


@triton.jit
def _helper_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr, REPEAT: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(REPEAT):
        x = _scale_helper(x, 0.5)
        x = x - tl.max(x, 0) + tl.max(x, 0)  # tl.max: a Triton helper that sees tl.core, not tl
    tl.store(out_ptr + offs, x)


def _count_lang_patches(monkeypatch):
    import triton.runtime.interpreter as interp
    calls = []
    original = interp._patch_lang

    def counting(fn):
        calls.append(fn.__name__)
        return original(fn)

    monkeypatch.setattr(interp, "_patch_lang", counting)
    return calls


def test_helpers_inside_a_launch_are_not_repatched_and_compute_the_same(monkeypatch):
    x = torch.randn(64, dtype=torch.float32, generator=torch.Generator().manual_seed(3))
    calls = _count_lang_patches(monkeypatch)

    compat.uninstall()
    stock = torch.empty_like(x)
    _helper_kernel[(1, )](x, stock, 64, 4)
    stock_patches = list(calls)

    calls.clear()
    compat.install()
    layered = torch.empty_like(x)
    _helper_kernel[(1, )](x, layered, 64, 4)

    # Stock interpreter: one patch for the launch and one per helper call; ours: the launch, and
    # tl.max once (its module, tl.core, is not one the launch patched).
    assert stock_patches.count("_scale_helper") == 4 and stock_patches.count("max") == 8
    assert calls == ["_helper_kernel", "max"]
    assert torch.equal(layered, stock)
    torch.testing.assert_close(layered, x / 16, rtol=0, atol=1e-6)


@triton.jit
def _bad_shape_helper(x):
    return x + tl.arange(0, 32)  # x has 64 elements: shapes do not broadcast


@triton.jit
def _bad_helper_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, _bad_shape_helper(tl.load(x_ptr + offs)))


def test_helper_errors_still_surface_as_interpreter_errors():
    import triton.runtime.interpreter as interp
    compat.install()
    x = torch.randn(64)
    with pytest.raises(interp.InterpreterError):
        _bad_helper_kernel[(1, )](x, torch.empty(64), 64)


def test_uninstall_restores_the_interpreters_launch_calls():
    import triton.runtime.interpreter as interp
    compat.install()
    compat.uninstall()
    for cls_name, meth in compat._CALLS:
        assert not getattr(getattr(getattr(interp, cls_name), meth), compat._MARK, False), f"{cls_name}.{meth}"


@triton.jit
def _int_overflow_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 65536)  # int32 product past 2^31 for x >= 32768


def _overflowing_ints():
    return torch.tensor([1, -3, 32768, 100000] * 4, dtype=torch.int32)


def test_int_overflow_check_skipped_only_while_its_assert_is_off(monkeypatch):
    import dataclasses

    import triton.runtime.interpreter as interp
    x = _overflowing_ints()
    wrapped = (x.to(torch.int64) * 65536).to(torch.int32)  # two's-complement wrap, as on a GPU
    compat.uninstall()
    stock = torch.empty_like(x)
    _int_overflow_kernel[(1, )](x, stock, 16)
    compat.install()
    layered = torch.empty_like(x)
    _int_overflow_kernel[(1, )](x, layered, 16)
    assert torch.equal(stock, wrapped) and torch.equal(layered, wrapped)

    # With debug on the interpreter does evaluate its overflow assert, and the layer steps aside.
    builder = interp.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))
    with pytest.raises(interp.InterpreterError, match="overflow detected"):
        _int_overflow_kernel[(1, )](x, torch.empty_like(x), 16)

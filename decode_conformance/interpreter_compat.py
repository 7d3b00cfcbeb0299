"""bf16 and fp8 compatibility layer for Triton's CPU interpreter (TRITON_INTERPRET=1).

Why this exists: the interpreter keeps bfloat16 values as raw numpy uint16 bit
patterns, and two of its builder paths forget that:

* ``tl.dot`` on bf16 operands multiplies the uint16 *integers*, so a bf16
  attention score is garbage (cosine about -0.2 against the true product);
* fp32 -> bf16 casts drop the low 16 bits (truncation), where every GPU
  rounds to nearest even, so results sit up to one bf16 ulp off, always
  towards zero.

And its generic float downcast is wrong for fp8 targets (measured with triton
3.9.0: 22-58 of 1024 random values differ): it truncates the mantissa instead of
rounding to nearest even, and clips e4m3 at 256 where GPUs saturate at 448 (the
NVIDIA backend converts with ``cvt.rn.satfinite``). A kernel that quantizes q or
P to fp8 for fp8 x fp8 MMAs would be judged on the interpreter's rounding, not
its own. fp32/fp16/bf16 -> fp8 casts therefore round to nearest even and
saturate to the largest finite value.

This was reported upstream as triton-lang/triton #11584 and the maintainers
declined to fix it ("we just don't support it yet"); it is present in triton
3.6.0 (the GPU machine) and 3.9.0 (CI).  The conformance suite compares bf16
kernels against references at the bf16 rounding floor, so without this layer
every bf16 case would fail on CPU for reasons that have nothing to do with the
kernel under test.

The layer wraps a handful of ``InterpreterBuilder`` methods.  A wrapper only
acts when a bf16 operand is involved and is stored as uint16 bits; everything
else (fp16, fp32, fp64, fp8, integers) goes to the original method untouched,
so the interpreter's behaviour for those dtypes is bit-for-bit what it was.

Speed, not correctness: the interpreter re-runs its language patch (an
``inspect.getmembers`` scan of ``triton.language``) on every call of a
``@triton.jit`` helper, although the launch already patched the same modules
and the patch is idempotent.  Decode kernels call helpers per tile, so this was
about 30% of interpreter time.  The layer skips the re-patch when the helper
sees no language module the running launch did not patch; anything else goes
through the interpreter's own path.  Likewise the interpreter re-computes every
integer add, sub and mul in int64 to feed an overflow assert that it never
evaluates (its options leave ``debug`` off); the layer skips that work while
``debug`` is off and leaves it alone when someone turns ``debug`` on.

Public API: ``install()``, ``is_installed()``, ``uninstall()``.
"""

from __future__ import annotations

import inspect
import os
import sys

import numpy as np

__all__ = ["install", "is_installed", "uninstall"]

# Marker set on every wrapper, so the state is read from the builder class
# itself: a reloaded copy of this module still recognises (and never re-wraps)
# a wrapper installed by an earlier copy.
_MARK = "_decode_conformance_bf16_compat"

# Casts that may see a bf16 on one side.  create_fp_to_fp carries a rounding
# mode and is handled apart.  The int casts are included because the
# interpreter's generic ``astype`` turns bf16 bits into integers the same
# wrong way (bits read as a number).
_PLAIN_CASTS = (
    "create_fp_trunc",
    "create_fp_ext",
    "create_si_to_fp",
    "create_ui_to_fp",
    "create_fp_to_si",
    "create_fp_to_ui",
)
_PATCHED = ("create_dot", "create_fp_to_fp") + _PLAIN_CASTS
# (class in triton.runtime.interpreter, method): the launch-scoped language patch (speed only)
_CALLS = (("GridExecutor", "__call__"), ("InterpretedFunction", "__call__"))
# TritonSemantic method whose int64 re-computation only feeds a device_assert (speed only)
_OVERFLOW_CHECK = "binary_op_sanitize_overflow_impl"
# Triton fp8 type name -> torch dtype name (the interpreter stores fp8 as uint8 bytes).
_FP8 = {"fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2", "fp8e4b8": "float8_e4m3fnuz",
        "fp8e5b16": "float8_e5m2fnuz"}


# --------------------------------------------------------------------------
# bit-level conversions (numpy only)
# --------------------------------------------------------------------------

def _bf16_bits_to_f32(bits):
    # bf16 is exactly the top half of an fp32, so widening is a shift; this is
    # exact for every pattern, NaN payloads and subnormals included.
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _quiet_nan_bits(bits32):
    # Keep sign and top payload bits, force the quiet bit: a NaN whose payload
    # lived only in the low 16 bits must not come out as an infinity.
    return ((bits32 >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)


def _f32_to_bf16_bits(x, round_to_zero=False):
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if round_to_zero:
        kept = bits >> np.uint32(16)
    else:
        # Round half to even: add 0x7FFF plus the lowest kept bit.  A carry out
        # of the mantissa bumps the exponent, which is also how the largest
        # finite values round up to infinity.  Cannot overflow uint32 for a
        # non-NaN input, and infinities stay infinities.
        lsb = (bits >> np.uint32(16)) & np.uint32(1)
        kept = (bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)
    return np.where(is_nan, _quiet_nan_bits(bits), kept.astype(np.uint16)).astype(np.uint16)


def _f64_to_f32_toward_zero(x):
    with np.errstate(over="ignore", invalid="ignore"):
        r = x.astype(np.float32)
        # astype rounds to nearest; step back towards zero wherever that went
        # outwards (also turns an overflow to inf back into the largest finite).
        outward = np.abs(r.astype(np.float64)) > np.abs(x)
        r = np.where(outward, np.nextafter(r, np.float32(0)), r).astype(np.float32)
    return r


def _f64_to_bf16_bits(x, round_to_zero=False):
    # A GPU's fptrunc double->bfloat16 is one correctly rounded step.  Going
    # through fp32 with round-to-nearest would round twice and can land on the
    # wrong side of a bf16 tie; rounding the fp32 intermediate to *odd* (sticky
    # low bit) keeps enough information for the second rounding to be exact.
    x = np.asarray(x, dtype=np.float64)
    r = _f64_to_f32_toward_zero(x)
    if round_to_zero:
        return _f32_to_bf16_bits(r, round_to_zero=True)
    bits = r.view(np.uint32)
    with np.errstate(invalid="ignore"):
        inexact = (r.astype(np.float64) != x) & ~np.isnan(x)
    bits = bits | inexact.astype(np.uint32)
    return _f32_to_bf16_bits(bits.view(np.float32))


def _to_bf16_bits(data, round_to_zero=False):
    data = np.asarray(data)
    if data.dtype == np.float32:
        return _f32_to_bf16_bits(data, round_to_zero)
    if data.dtype == np.float16:
        # fp16 -> fp32 is exact, so one rounding happens here.
        return _f32_to_bf16_bits(data.astype(np.float32), round_to_zero)
    # fp64 and integers: integers up to 2**53 are exact in fp64.
    return _f64_to_bf16_bits(data.astype(np.float64), round_to_zero)


# --------------------------------------------------------------------------
# patching
# --------------------------------------------------------------------------

_state = {}  # filled by _load(): interpreter module pieces


def _interpreter_active():
    try:
        from triton import knobs  # triton >= 3.4 reads TRITON_INTERPRET here
        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _load():
    """Find the interpreter internals this layer depends on, or say what is missing.

    Checked on every install, not cached: the point is to fail loudly the
    first time a Triton upgrade moves something.
    """
    import triton.language as tl
    try:
        import triton.runtime.interpreter as interp
    except ImportError as exc:  # pragma: no cover - depends on triton build
        raise RuntimeError(f"interpreter_compat: cannot import triton.runtime.interpreter ({exc})") from exc

    missing = []
    builder_cls = getattr(interp, "InterpreterBuilder", None)
    handle_cls = getattr(interp, "TensorHandle", None)
    if builder_cls is None:
        missing.append("triton.runtime.interpreter.InterpreterBuilder")
    if handle_cls is None:
        missing.append("triton.runtime.interpreter.TensorHandle")
    if builder_cls is not None:
        missing += [f"InterpreterBuilder.{n}" for n in _PATCHED if not callable(getattr(builder_cls, n, None))]
    np_dtype_of = getattr(interp, "_get_np_dtype", None)
    if np_dtype_of is None:
        missing.append("triton.runtime.interpreter._get_np_dtype")
    for cls_name, meth in _CALLS:
        if not callable(getattr(getattr(interp, cls_name, None), meth, None)):
            missing.append(f"triton.runtime.interpreter.{cls_name}.{meth}")
    for name in ("_patch_lang", "InterpreterError", "interpreter_builder", "interpreter_semantic"):
        if getattr(interp, name, None) is None:
            missing.append(f"triton.runtime.interpreter.{name}")
    semantic_cls = type(getattr(interp, "interpreter_semantic", None))
    if not callable(getattr(semantic_cls, _OVERFLOW_CHECK, None)):
        missing.append(f"{semantic_cls.__name__}.{_OVERFLOW_CHECK}")
    if not hasattr(getattr(getattr(interp, "interpreter_builder", None), "options", None), "debug"):
        missing.append("triton.runtime.interpreter.interpreter_builder.options.debug")
    ir = getattr(interp, "_ir", None)
    rounding = getattr(ir, "ROUNDING_MODE", None)
    if rounding is None or not hasattr(rounding, "RTNE") or not hasattr(rounding, "RTZ"):
        missing.append("triton.runtime.interpreter._ir.ROUNDING_MODE.{RTNE,RTZ}")
    if missing:
        raise RuntimeError(
            "interpreter_compat: the Triton interpreter's internals are not the expected shape, "
            "so the bf16 fix (triton-lang/triton #11584) cannot be applied; not found: " + ", ".join(missing))

    # The whole fix assumes bf16 lives in the interpreter as raw uint16 bits.
    # If upstream ever changes that (e.g. to a real bf16 numpy type, likely
    # together with a fix), the wrappers would be wrong: stop and say so.
    storage = np.dtype(np_dtype_of(tl.bfloat16))
    if storage != np.dtype(np.uint16):
        raise RuntimeError(
            "interpreter_compat: Triton's interpreter no longer stores bfloat16 as uint16 bits "
            f"(it uses {storage}); re-check whether triton-lang/triton #11584 is fixed and this layer is still needed")

    _state.update(tl=tl, builder_cls=builder_cls, Handle=handle_cls, np_dtype_of=np_dtype_of,
                  RTNE=rounding.RTNE, RTZ=rounding.RTZ, interp=interp)
    return _state


def _scalar(ty):
    return getattr(ty, "scalar", ty)


def _make_wrappers(st, originals):
    tl, Handle, np_dtype_of = st["tl"], st["Handle"], st["np_dtype_of"]
    bf16 = tl.bfloat16
    wider = (tl.float16, tl.float32, tl.float64)

    def is_bf16_bits(h):
        return _scalar(h.dtype) == bf16 and h.data.dtype == np.uint16

    def convert(src, dst_type, round_to_zero):
        """bf16 on one side of src -> dst; returns None when not ours to handle."""
        dst = _scalar(dst_type)
        if is_bf16_bits(src) and (dst in wider or dst.is_int()):
            wide = _bf16_bits_to_f32(src.data)
            with np.errstate(invalid="ignore", over="ignore"):
                out = wide.astype(np_dtype_of(dst))  # fp32 -> fp16 rounds to nearest in numpy
            return Handle(out, dst)
        if dst == bf16 and _scalar(src.dtype) != bf16 and (
                _scalar(src.dtype) in wider or _scalar(src.dtype).is_int()):
            return Handle(_to_bf16_bits(src.data, round_to_zero).reshape(np.shape(src.data)), dst)
        return None

    def plain_cast(name):
        original = originals[name]

        def wrapper(self, src, dst_type, *args, **kwargs):
            out = convert(src, dst_type, round_to_zero=False)
            return out if out is not None else original(self, src, dst_type, *args, **kwargs)

        return wrapper

    fp_to_fp_orig = originals["create_fp_to_fp"]

    def to_fp8(src, d_ty, rounding_mode):
        """Wider float -> fp8, rounded to nearest even and saturated (cvt.rn.satfinite)."""
        if str(d_ty) not in _FP8 or rounding_mode not in (None, st["RTNE"]):
            return None
        s_ty = _scalar(src.dtype)
        if is_bf16_bits(src):
            wide = _bf16_bits_to_f32(src.data)
        elif s_ty in wider:
            wide = np.asarray(src.data).astype(np.float32)
        else:
            return None
        import torch
        fp8 = getattr(torch, _FP8[str(d_ty)])
        big = torch.finfo(fp8).max
        t = torch.from_numpy(np.ascontiguousarray(wide, dtype=np.float32))
        nan = torch.isnan(t)
        out = t.clamp(-big, big).to(fp8)
        out = torch.where(nan, torch.full_like(t, float("nan")).to(fp8), out)
        return Handle(out.view(torch.uint8).numpy().reshape(np.shape(src.data)), d_ty)

    def create_fp_to_fp(self, src, dst_type, rounding_mode, *args, **kwargs):
        # fp8 -> wider, and every pair without bf16 or an fp8 target, stay on the original path.
        s_ty, d_ty = _scalar(src.dtype), _scalar(dst_type)
        fp8 = to_fp8(src, d_ty, rounding_mode)
        if fp8 is not None:
            return fp8
        bf16_and_wider = (s_ty == bf16 and d_ty in wider) or (d_ty == bf16 and s_ty in wider)
        if bf16_and_wider and rounding_mode in (None, st["RTNE"], st["RTZ"]):
            out = convert(src, dst_type, round_to_zero=rounding_mode == st["RTZ"])
            if out is not None:
                return out
        return fp_to_fp_orig(self, src, dst_type, rounding_mode, *args, **kwargs)

    dot_orig = originals["create_dot"]

    def as_f32_operand(h):
        if is_bf16_bits(h):
            return _bf16_bits_to_f32(h.data)
        if h.data.dtype.kind == "f":
            return h.data.astype(np.float32)
        return None  # fp8/int: not a combination tl.dot allows with bf16

    def create_dot(self, a, b, d, *args, **kwargs):
        if not (is_bf16_bits(a) or is_bf16_bits(b)):
            return dot_orig(self, a, b, d, *args, **kwargs)
        a32, b32 = as_f32_operand(a), as_f32_operand(b)
        if a32 is None or b32 is None:
            return dot_orig(self, a, b, d, *args, **kwargs)
        # bf16 x bf16 products are exact in fp32 and tensor cores accumulate in
        # fp32, so an fp32 matmul is what the GPU computes (up to summation
        # order).  Then add the caller's accumulator in its own dtype.
        acc_bf16 = is_bf16_bits(d)
        acc = _bf16_bits_to_f32(d.data) if acc_bf16 else d.data
        prod = np.matmul(a32, b32, dtype=np.result_type(np.float32, acc.dtype))
        out = prod.astype(acc.dtype) + acc
        if acc_bf16:
            out = _f32_to_bf16_bits(out.astype(np.float32))
        return Handle(out, _scalar(d.dtype))

    wrappers = {name: plain_cast(name) for name in _PLAIN_CASTS}
    wrappers["create_fp_to_fp"] = create_fp_to_fp
    wrappers["create_dot"] = create_dot
    for name, fn in wrappers.items():
        fn.__name__ = name
        fn.__qualname__ = f"InterpreterBuilder.{name}"
        fn.__wrapped__ = originals[name]
        setattr(fn, _MARK, True)
    return wrappers


def _lang_modules(fn, tl) -> frozenset:
    """ids of the language modules `_patch_lang` would patch for fn (tl and/or tl.core)."""
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def _make_call_wrappers(st, originals):
    """Launch-scoped language patching: the launch patches, helpers inside it do not again."""
    tl, interp = st["tl"], st["interp"]
    active: list = []  # per running launch: the language modules its patch covers
    cache: dict = {}

    def langs_of(fn):
        key = id(fn)
        if key not in cache:
            cache[key] = (fn, _lang_modules(fn, tl))  # keep fn alive: ids must not be reused
        return cache[key][1]

    grid_orig = originals[("GridExecutor", "__call__")]
    device_orig = originals[("InterpretedFunction", "__call__")]

    def grid_call(self, *args, **kwargs):
        active.append(set(langs_of(self.fn)))
        try:
            return grid_orig(self, *args, **kwargs)
        finally:
            active.pop()

    def device_call(self, *args, **kwargs):
        langs = langs_of(self.fn)
        if active and langs <= active[-1]:
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # as the original: errors surface as InterpreterError
                raise interp.InterpreterError(repr(e)) from e
        if active:
            # The original patches this helper's modules first thing and never undoes it (its scope
            # is dropped), so for the rest of this launch they count as patched. Triton's own
            # helpers (tl.sum, tl.max...) see tl.core where kernels see tl: without this, every
            # call of them would re-patch.
            active[-1].update(langs)
        return device_orig(self, *args, **kwargs)

    wrappers = {("GridExecutor", "__call__"): grid_call, ("InterpretedFunction", "__call__"): device_call}
    for key, fn in wrappers.items():
        fn.__wrapped__ = originals[key]
        setattr(fn, _MARK, True)
    return wrappers


def _make_overflow_wrapper(st, original):
    """Skip the interpreter's int overflow re-computation when its assert cannot fire."""
    builder = st["interp"].interpreter_builder

    def overflow_check(self, lhs, rhs, binary_op):
        # The interpreter always sets sanitize_overflow but leaves debug off, and device_assert
        # returns at once without debug: each integer add, sub and mul was re-done in int64 and
        # compared to the bounds (a third of interpreter time) for an assert never evaluated.
        if self.builder is builder and not builder.options.debug:
            return None
        return original(self, lhs, rhs, binary_op)

    overflow_check.__wrapped__ = original
    setattr(overflow_check, _MARK, True)
    return overflow_check


def _speed_targets(st) -> list:
    """(owner, attribute) of every speed-only wrapper."""
    interp = st["interp"]
    return [(getattr(interp, c), m) for c, m in _CALLS] + [(type(interp.interpreter_semantic), _OVERFLOW_CHECK)]


def install() -> bool:
    """Patch the interpreter's builder for bf16.  Idempotent.

    Returns False when Triton is not running under the interpreter (a real GPU
    compiles kernels and never touches this code), True once patched.  Raises
    RuntimeError if the interpreter is active but its internals are not the
    shape this layer knows, rather than leaving bf16 silently wrong.
    """
    if not _interpreter_active():
        return False
    st = _load()
    cls = st["builder_cls"]
    if is_installed():
        return True
    uninstall()  # drop any partial earlier install so nothing gets wrapped twice
    originals = {name: getattr(cls, name) for name in _PATCHED}
    for name, fn in _make_wrappers(st, originals).items():
        setattr(cls, name, fn)
    interp = st["interp"]
    call_originals = {(c, m): getattr(getattr(interp, c), m) for c, m in _CALLS}
    for (c, m), fn in _make_call_wrappers(st, call_originals).items():
        setattr(getattr(interp, c), m, fn)
    semantic_cls = type(interp.interpreter_semantic)
    setattr(semantic_cls, _OVERFLOW_CHECK, _make_overflow_wrapper(st, getattr(semantic_cls, _OVERFLOW_CHECK)))
    return True


def is_installed() -> bool:
    """True when the builder currently carries this layer's wrappers."""
    if not _state:
        if "triton.runtime.interpreter" not in sys.modules:
            return False
        try:
            _load()
        except RuntimeError:
            return False
    cls = _state["builder_cls"]
    return (all(getattr(getattr(cls, name, None), _MARK, False) for name in _PATCHED)
            and all(getattr(getattr(owner, name, None), _MARK, False) for owner, name in _speed_targets(_state)))


def uninstall() -> None:
    """Put the interpreter's own methods back (used to prove the layer matters)."""
    if not _state:
        return
    cls = _state["builder_cls"]
    targets = [(cls, name) for name in _PATCHED] + _speed_targets(_state)
    for owner, name in targets:
        current = getattr(owner, name, None)
        # Unwind any stack of our wrappers, but never past a foreign one.
        while current is not None and getattr(current, _MARK, False):
            current = current.__wrapped__
            setattr(owner, name, current)

"""The adapter protocol between the suite and a kernel under test, and kernel discovery.

How to add a kernel: write an object (or a class, or a zero-argument factory) with `name`,
`caps` (a Capabilities) and `plan(batch) -> launch`. `plan` receives a DecodeBatch (the
tensors and host-side metadata a serving engine has at the call: docs/kernel-contract.md),
does host-side work (workspace from `batch.workspace`, grid sizes) and returns a
zero-argument callable that launches the kernel and writes `batch.out` (and `batch.lse`
when `caps.lse`). Parity calls `plan(batch)()`; CUDA-graph replay captures `launch`; the
perf guard times it. Point the suite at it with `--kernel=pkg.module:obj`,
`DECODE_CONFORMANCE_KERNELS=pkg.module:obj`, or an entry point in the
`decode_conformance.kernels` group (the shipped kernels are registered that way too).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import os
import traceback
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, runtime_checkable

from .batch import DecodeBatch
from .cases import DTYPES, FP8_TOKENS, INPUT_FORMS, LAYOUTS, WINDOW_CONVENTIONS, Case
from .reference import DEQUANT_KV, FP8_MATH, FP8_Q_AND_P, SOFTMAX_SUMS, SUM_FP32

# Where kernel specs come from lives in a module without torch (the first usage checks of a run
# happen before torch is imported); its names stay importable from here.
from .discovery import (ENTRY_POINT_GROUP, ENV_VAR, SHIPPED_PACKAGE, entry_point_specs,  # noqa: E402,F401
                        kernel_specs, missing_module, shipped_specs)


DEVICES = ("cpu", "cuda")  # cpu: Triton's interpreter or plain torch; cuda: NVIDIA and ROCm GPUs


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


# The case fields a ShapeRule may constrain (all ints on every case).
SHAPE_FIELDS = ("group", "num_q_heads", "num_kv_heads", "head_dim", "v_head_dim", "page_size", "batch_size",
                "max_len", "min_len")


@dataclass(frozen=True)
class ShapeRule:
    """A declared limit on the case's shape, kept as data so the skip reason can name it:
    `field` (one of SHAPE_FIELDS) must be in `allowed` and/or within [min, max]. `why` says
    where the limit comes from (shown in the skip reason). `when` (another ShapeRule, its own
    `why` unused) limits the rule to the cases that satisfy it: ShapeRule("group", max=64,
    when=ShapeRule("head_dim", min=257)) admits any group up to head dim 256."""

    field: str
    allowed: Optional[frozenset] = None
    min: Optional[int] = None
    max: Optional[int] = None
    why: str = ""
    when: Optional["ShapeRule"] = None

    def __post_init__(self):
        if self.field not in SHAPE_FIELDS:
            raise ValueError(f"ShapeRule.field: expected one of {SHAPE_FIELDS}, got {self.field!r}")
        if self.allowed is None and self.min is None and self.max is None:
            raise ValueError(f"ShapeRule({self.field!r}): expected allowed, min or max; got none")
        if self.when is not None and not isinstance(self.when, ShapeRule):
            raise ValueError(f"ShapeRule({self.field!r}).when: expected a ShapeRule, got {self.when!r}")

    def value(self, case: Case) -> int:
        if self.field == "batch_size":
            return len(case.seq_lens)
        if self.field == "min_len":  # e.g. a library whose contract has no 0-length rows
            return min(case.seq_lens)
        return int(getattr(case, self.field))

    def violation(self, case: Case) -> Optional[str]:
        """None when the case satisfies the rule, else the reason (field, value, what is supported)."""
        if self.when is not None and self.when.violation(case) is not None:
            return None  # the rule does not apply to this case
        v = self.value(case)
        bad = ((self.allowed is not None and v not in self.allowed) or (self.min is not None and v < self.min)
               or (self.max is not None and v > self.max))
        if not bad:
            return None
        want = []
        if self.allowed is not None:
            want.append("{" + ", ".join(str(a) for a in sorted(self.allowed)) + "}")
        if self.min is not None:
            want.append(f">= {self.min}")
        if self.max is not None:
            want.append(f"<= {self.max}")
        where = f" when {self.when.bounds()}" if self.when is not None else ""
        return f"{self.field} {v} (supported: {' and '.join(want)}{where}{'; ' + self.why if self.why else ''})"

    def bounds(self) -> str:
        """'field{a,b}>=min<=max', as --list-kernels prints a rule."""
        text = self.field + ("{" + ",".join(str(a) for a in sorted(self.allowed)) + "}" if self.allowed is not None
                             else "") + (f">={self.min}" if self.min is not None else "") + (
            f"<={self.max}" if self.max is not None else "")
        return text + (f" when {self.when.bounds()}" if self.when is not None else "")


@dataclass(frozen=True)
class Capabilities:
    """What a kernel supports. Each flag says which test consumes it; a case or test that
    needs what a kernel lacks is skipped with a reason naming the flag (`missing_for`).
    Reference, with accepted values and defaults: docs/kernel-contract.md, "Capabilities"
    (installed: `python -m decode_conformance.guide kernel-contract`).

    The case axes default to everything: a case a kernel cannot run then fails, loudly,
    instead of being skipped unseen. The claims a kernel makes about itself (num_splits,
    cuda_graph_safe, deterministic, batch_invariant) default to off: each turns on a test
    that the kernel must then pass."""

    # Case axes (parity, batch invariance, fuzz: every case-driven test, via missing_for):
    kv_dtypes: frozenset = frozenset(DTYPES)
    layouts: frozenset = frozenset({"contig", "paged"})
    page_sizes: Optional[frozenset] = None  # None: any page size
    head_dims: Optional[frozenset] = None  # None: any
    # Query heads per KV head (MQA: group = num_q_heads); None: any group.
    gqa_groups: Optional[frozenset] = None
    # Further declared limits on the case's shape (ShapeRule): every rule must hold.
    shape_rules: tuple = ()
    window_convention: Optional[str] = "counts-current"  # None: no sliding window
    # How the tensors may be handed over (cases.INPUT_FORMS: a strided q, a capacity-wide page
    # table, V with strides of its own); None: every form.
    input_forms: Optional[frozenset] = None
    mla: bool = True
    softcap: bool = True
    sinks: bool = True
    devices: frozenset = frozenset(DEVICES)
    max_pool_bytes: Optional[int] = None
    # metrics.judge: the LSE is checked only where the kernel returns it.
    lse: bool = True
    # reference.tier_attention (the error budget of fp8 cases): DEQUANT_KV or FP8_Q_AND_P. The
    # latter also deselects fp8 cases on GPU classes without fp8 tensor cores (plugin).
    fp8_math: str = DEQUANT_KV
    # reference.tier_attention (the LSE budget, where `lse`): how the softmax denominator is
    # summed, SUM_FP32 (the unrounded P) or SUM_ROUNDED_P (P as rounded for P @ V).
    softmax_sum: str = SUM_FP32
    # suites/parity/test_num_splits.py: the kernel uses batch.num_splits when it is set.
    num_splits: bool = False
    # suites/parity/test_cuda_graph.py and test_determinism.py::test_same_plan_launched_twice.
    cuda_graph_safe: bool = False
    # suites/parity/test_determinism.py::test_bitwise_repeatable.
    deterministic: bool = False
    # suites/parity/test_batch_invariance.py: a request's output and LSE are bitwise the same
    # whatever else is in its batch (False: within the row budget instead).
    batch_invariant: bool = False
    # Set when the kernel cannot run here at all (its library is not installed): the kernel
    # is still listed, and every case skips with this reason.
    unavailable: Optional[str] = None

    def __post_init__(self):
        for name in ("kv_dtypes", "layouts", "devices", "page_sizes", "head_dims", "input_forms"):
            value = getattr(self, name)
            if value is None and name in ("page_sizes", "head_dims", "input_forms"):
                continue
            if isinstance(value, (str, bytes)) or not isinstance(value, (set, frozenset, list, tuple)):
                raise ValueError(f"Capabilities.{name}: expected a set, e.g. frozenset({{...}}), got "
                                 f"{type(value).__name__} {value!r}")
            object.__setattr__(self, name, frozenset(value))
        for name, allowed in (("kv_dtypes", DTYPES), ("layouts", LAYOUTS), ("devices", DEVICES),
                              ("input_forms", INPUT_FORMS)):
            if getattr(self, name) is None:
                continue
            unknown = set(getattr(self, name)) - set(allowed)
            if unknown or not getattr(self, name):
                raise ValueError(f"Capabilities.{name}: expected a non-empty subset of {sorted(allowed)}, got "
                                 f"{sorted(map(str, getattr(self, name)))}")
        for name in ("page_sizes", "head_dims"):
            value = getattr(self, name)
            if value is not None and (not value or not all(_positive_int(v) for v in value)):
                raise ValueError(f"Capabilities.{name}: expected None (any) or a non-empty set of positive ints, "
                                 f"got {sorted(value, key=str)}")
        if self.max_pool_bytes is not None and not _positive_int(self.max_pool_bytes):
            raise ValueError(f"Capabilities.max_pool_bytes: expected None (no limit) or a positive int, "
                             f"got {self.max_pool_bytes!r}")
        for name in ("mla", "softcap", "sinks", "lse", "num_splits", "cuda_graph_safe", "deterministic",
                     "batch_invariant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Capabilities.{name}: expected True or False, got {getattr(self, name)!r}")
        if self.window_convention is not None and self.window_convention not in WINDOW_CONVENTIONS:
            raise ValueError(f"Capabilities.window_convention: expected None or one of {WINDOW_CONVENTIONS}, "
                             f"got {self.window_convention!r}")
        if self.gqa_groups is not None and not (isinstance(self.gqa_groups, frozenset) and self.gqa_groups and all(
                isinstance(g, int) and g >= 1 for g in self.gqa_groups)):
            raise ValueError(f"Capabilities.gqa_groups: expected None or a non-empty frozenset of ints >= 1 (query "
                             f"heads per KV head), got {self.gqa_groups!r}")
        bad_rules = [r for r in self.shape_rules if not isinstance(r, ShapeRule)]
        if not isinstance(self.shape_rules, tuple) or bad_rules:
            raise ValueError(f"Capabilities.shape_rules: expected a tuple of ShapeRule, got {self.shape_rules!r}")
        if self.fp8_math not in FP8_MATH:
            raise ValueError(f"Capabilities.fp8_math: expected one of {FP8_MATH}, got {self.fp8_math!r}")
        if self.softmax_sum not in SOFTMAX_SUMS:
            raise ValueError(f"Capabilities.softmax_sum: expected one of {SOFTMAX_SUMS}, got {self.softmax_sum!r}")
        if self.unavailable is not None and not isinstance(self.unavailable, str):
            raise ValueError(f"Capabilities.unavailable: expected None or a reason (str), got {self.unavailable!r}")

    @property
    def fp8_mma(self) -> bool:
        """fp8 cases run fp8 x fp8 matrix instructions: needs an sm_89+ / CDNA3+ GPU class."""
        return self.fp8_math == FP8_Q_AND_P

    def missing_for(self, case: Case, device_type: str) -> list[str]:
        """Every capability `case` needs that this kernel lacks, as readable reasons, each ending
        in the field that would declare it: "kv dtype e4m3 [kv_dtypes]"."""
        if self.unavailable:  # nothing else matters (and one reason groups the skips in -rs)
            return [self.unavailable]
        miss = []
        if case.kv_dtype not in self.kv_dtypes:
            miss.append(f"kv dtype {case.kv_dtype} [kv_dtypes]")
        if case.layout not in self.layouts:
            miss.append(f"layout {case.layout} [layouts]")
        if case.layout == "paged" and self.page_sizes is not None and case.page_size not in self.page_sizes:
            miss.append(f"page size {case.page_size} [page_sizes]")
        if self.head_dims is not None and case.head_dim not in self.head_dims:
            miss.append(f"head dim {case.head_dim} [head_dims]")
        if self.gqa_groups is not None and case.group not in self.gqa_groups:
            miss.append(f"GQA group {case.group} (supported: {', '.join(str(g) for g in sorted(self.gqa_groups))}) "
                        "[gqa_groups]")
        miss += [f"{why} [shape_rules]" for why in (r.violation(case) for r in self.shape_rules) if why]
        if self.input_forms is not None and case.inputs not in self.input_forms:
            miss.append(f"input form {case.inputs} (supported: {', '.join(sorted(self.input_forms))}) [input_forms]")
        if case.window is not None and self.window_convention is None:
            miss.append("sliding window [window_convention]")
        if case.mla and not self.mla:
            miss.append("MLA rope split [mla]")
        if case.softcap is not None and not self.softcap:
            miss.append("soft-cap [softcap]")
        if case.sinks and not self.sinks:
            miss.append("attention sinks [sinks]")
        if device_type not in self.devices:
            miss.append(f"device {device_type} [devices]")
        if case.min_pool_bytes and self.max_pool_bytes is not None and case.min_pool_bytes > self.max_pool_bytes:
            miss.append(f"KV pools past {self.max_pool_bytes} bytes [max_pool_bytes]")
        return miss

    def describe(self) -> str:
        parts = [f"UNAVAILABLE ({self.unavailable})"] if self.unavailable else []
        parts += [",".join(sorted(self.kv_dtypes)), "/".join(sorted(self.layouts))]
        if self.page_sizes is not None:
            parts.append("pages " + ",".join(str(p) for p in sorted(self.page_sizes)))
        if self.head_dims is not None:
            parts.append("head dims " + ",".join(str(d) for d in sorted(self.head_dims)))
        if self.gqa_groups is not None:
            parts.append("groups " + ",".join(str(g) for g in sorted(self.gqa_groups)))
        for r in self.shape_rules:
            parts.append("rule " + r.bounds())
        if self.input_forms is not None:
            parts.append("inputs " + ",".join(sorted(self.input_forms)))
        parts.append(f"window {self.window_convention}" if self.window_convention else "no window")
        if self.kv_dtypes & FP8_TOKENS:  # the fp8 tier means nothing to a kernel without fp8 caches
            parts.append(f"fp8 {self.fp8_math}")
        if self.softmax_sum != SUM_FP32:
            parts.append(f"softmax sum {self.softmax_sum}")
        for flag in ("mla", "softcap", "sinks", "lse", "num_splits", "cuda_graph_safe", "deterministic",
                     "batch_invariant"):
            parts.append(("+" if getattr(self, flag) else "-") + flag)
        return " ".join(parts)


def _named_fields_only(init):
    """Capabilities' generated __init__, with an unknown keyword named beside the fields there are
    (Python's own TypeError names only the keyword)."""
    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        unknown = [k for k in kwargs if k not in Capabilities.__dataclass_fields__]
        if unknown:
            known = [f.name for f in dataclasses.fields(Capabilities)]
            hints = [f"{k!r} (did you mean {near[0]!r}?)" if (near := difflib.get_close_matches(k, known, n=1))
                     else repr(k) for k in unknown]
            raise TypeError(f"Capabilities: no field {', '.join(hints)}; its fields: {', '.join(known)} "
                            "(help(decode_conformance.Capabilities) says what each means)")
        init(self, *args, **kwargs)
    return checked


Capabilities.__init__ = _named_fields_only(Capabilities.__init__)


@runtime_checkable
class DecodeKernel(Protocol):
    name: str
    caps: Capabilities

    def plan(self, batch: DecodeBatch) -> Callable[[], None]: ...


class KernelLoadError(RuntimeError):
    pass


def resolve_kernel(obj, spec: str) -> DecodeKernel:
    """A kernel from what a spec names: an instance, a class (instantiated with no arguments)
    or a zero-argument factory."""
    if isinstance(obj, type) or not isinstance(obj, DecodeKernel):
        if not callable(obj):
            raise KernelLoadError(f"kernel spec {spec!r}: names a {type(obj).__name__}, not a kernel, a kernel class "
                                  "or a zero-argument factory (expected an object with name, caps, plan(batch))")
        needed = _required_parameters(obj)
        if needed:
            raise KernelLoadError(f"kernel spec {spec!r}: names a {'class' if isinstance(obj, type) else 'callable'} "
                                  f"that needs arguments ({', '.join(needed)}): not a kernel, a kernel class or a "
                                  "zero-argument factory (expected an object with name, caps, plan(batch); the "
                                  "kernel function itself belongs inside plan's launch)")
        what = "instantiating the class" if isinstance(obj, type) else "calling the factory"
        try:
            obj = obj()
        except KernelLoadError:
            raise
        except Exception as e:
            raise KernelLoadError(f"kernel spec {spec!r}: {what} failed:\n{_trimmed(e)}") from e
    check_kernel(obj, spec)
    return obj


def _required_parameters(obj) -> list[str]:
    """The parameters a call with no arguments would miss ([] where the signature is unknown)."""
    import inspect
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values() if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _trimmed(e: BaseException, user_frames_only: bool = False) -> str:
    tb = traceback.extract_tb(e.__traceback__)[1:]  # drop this module's own frame
    if user_frames_only:  # the kernel module's lines, not importlib's or Capabilities' checks
        own = os.path.dirname(os.path.abspath(__file__))
        tb = [f for f in tb if not f.filename.startswith((own, "<frozen", "<string>"))] or tb
        return "".join(traceback.format_list(tb)).rstrip()
    return "".join(traceback.format_list(tb) + traceback.format_exception_only(type(e), e)).rstrip()


def load_kernel(spec: str) -> DecodeKernel:
    """Import `pkg.module:attr` and resolve it (`resolve_kernel`)."""
    if ":" not in spec:
        raise KernelLoadError(missing_module(spec))
    mod_name, attr = spec.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
            raise KernelLoadError(_no_such_module(spec, mod_name, e.name)) from None
        raise KernelLoadError(_import_failed(spec, mod_name, e)) from e
    except Exception as e:
        raise KernelLoadError(_import_failed(spec, mod_name, e)) from e
    obj, path = mod, mod_name
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            near = difflib.get_close_matches(part, names, n=3, cutoff=0.6)
            raise KernelLoadError(f"kernel spec {spec!r}: {path} has no attribute {part!r}"
                                  + (f"; did you mean {', '.join(map(repr, near))}?" if near else ""))
        obj, path = getattr(obj, part), f"{path}.{part}"
    return resolve_kernel(obj, spec)


def _import_failed(spec: str, mod_name: str, e: BaseException) -> str:
    return (f"kernel spec {spec!r}: cannot import {mod_name}: {type(e).__name__}: {e}\n"
            f"  where (import machinery and this package's frames left out):\n{_trimmed(e, user_frames_only=True)}")


def _no_such_module(spec: str, mod_name: str, missing: str) -> str:
    """The spec's own module (or a package above it) does not exist: name it, and the modules
    its parent package does have that come close."""
    import importlib.util
    import pkgutil
    parent, _, leaf = missing.rpartition(".")
    where = ""
    if parent:
        found = importlib.util.find_spec(parent)
        if found is not None and found.submodule_search_locations:
            names = [m.name for m in pkgutil.iter_modules(found.submodule_search_locations)]
            near = difflib.get_close_matches(leaf, names, n=3, cutoff=0.6)
            where = (f"; {parent} ({list(found.submodule_search_locations)[0]}) has "
                     + (f"{', '.join(map(repr, near))} - did you mean {parent}.{near[0]}?" if near
                        else f"modules {', '.join(sorted(names)) or '(none)'}"))
    return (f"kernel spec {spec!r}: cannot import {mod_name}: no module named {missing!r}"
            + (where or " (expected an installed package, or its folder on PYTHONPATH)"))


def check_kernel(obj, origin: str = "") -> None:
    where = f" ({origin})" if origin else ""
    for attr in ("name", "caps", "plan"):
        if not hasattr(obj, attr):
            raise KernelLoadError(f"kernel{where}: missing attribute {attr!r}; expected name, caps, plan(batch)")
    if not isinstance(obj.caps, Capabilities):
        raise KernelLoadError(f"kernel{where}: caps must be decode_conformance.Capabilities, got {type(obj.caps).__name__}")
    if not isinstance(obj.name, str) or not obj.name or any(c in obj.name for c in " []/|"):
        raise KernelLoadError(f"kernel{where}: name must be a non-empty string without spaces, '[', ']', '/' or '|'; "
                              f"got {obj.name!r}")
    if not callable(getattr(obj, "plan")):
        raise KernelLoadError(f"kernel{where}: plan must be a method plan(batch) -> launch")

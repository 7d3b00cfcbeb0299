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

import importlib
import os
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Protocol, runtime_checkable

from .batch import DecodeBatch
from .cases import DTYPES, WINDOW_CONVENTIONS, Case
from .reference import DEQUANT_KV, FP8_MATH, FP8_Q_AND_P

ENV_VAR = "DECODE_CONFORMANCE_KERNELS"
ENTRY_POINT_GROUP = "decode_conformance.kernels"
# Ours among the registered kernels: pyproject.toml registers the shipped kernels in
# ENTRY_POINT_GROUP, the group an adopter's package registers its kernels in. That table is
# the one list of shipped kernels.
SHIPPED_PACKAGE = "decode_conformance_kernels"


# The case fields a ShapeRule may constrain (all ints on every case).
SHAPE_FIELDS = ("group", "num_q_heads", "num_kv_heads", "head_dim", "v_head_dim", "page_size", "batch_size",
                "max_len", "min_len")


@dataclass(frozen=True)
class ShapeRule:
    """A declared limit on the case's shape, kept as data so the skip reason can name it:
    `field` (one of SHAPE_FIELDS) must be in `allowed` and/or within [min, max]. `why` says
    where the limit comes from (shown in the skip reason)."""

    field: str
    allowed: Optional[frozenset] = None
    min: Optional[int] = None
    max: Optional[int] = None
    why: str = ""

    def __post_init__(self):
        if self.field not in SHAPE_FIELDS:
            raise ValueError(f"ShapeRule.field: expected one of {SHAPE_FIELDS}, got {self.field!r}")
        if self.allowed is None and self.min is None and self.max is None:
            raise ValueError(f"ShapeRule({self.field!r}): expected allowed, min or max; got none")

    def value(self, case: Case) -> int:
        if self.field == "batch_size":
            return len(case.seq_lens)
        if self.field == "min_len":  # e.g. a library whose contract has no 0-length rows
            return min(case.seq_lens)
        return int(getattr(case, self.field))

    def violation(self, case: Case) -> Optional[str]:
        """None when the case satisfies the rule, else the reason (field, value, what is supported)."""
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
        return f"{self.field} {v} (supported: {' and '.join(want)}{'; ' + self.why if self.why else ''})"


@dataclass(frozen=True)
class Capabilities:
    """What a kernel supports. Each flag says which test consumes it; a case or test that
    needs what a kernel lacks is skipped with a reason naming the flag (`missing_for`)."""

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
    mla: bool = True
    softcap: bool = True
    sinks: bool = True
    devices: frozenset = frozenset({"cuda", "cpu"})  # cpu = Triton interpreter or torch
    max_pool_bytes: Optional[int] = None
    # metrics.judge: the LSE is checked only where the kernel returns it.
    lse: bool = True
    # reference.tier_attention (the error budget of fp8 cases): DEQUANT_KV or FP8_Q_AND_P. The
    # latter also deselects fp8 cases on GPU classes without fp8 tensor cores (plugin).
    fp8_math: str = DEQUANT_KV
    # suites/parity/test_num_splits.py: the kernel uses batch.num_splits when it is set.
    num_splits: bool = False
    # suites/parity/test_cuda_graph.py and test_determinism.py::test_same_plan_launched_twice.
    cuda_graph_safe: bool = False
    # suites/parity/test_determinism.py::test_bitwise_repeatable.
    deterministic: bool = True
    # suites/parity/test_batch_invariance.py: a request's output and LSE are bitwise the same
    # whatever else is in its batch (False: within the row budget instead).
    batch_invariant: bool = False
    # Set when the kernel cannot run here at all (its library is not installed): the kernel
    # is still listed, and every case skips with this reason.
    unavailable: Optional[str] = None

    def __post_init__(self):
        if self.window_convention is not None and self.window_convention not in WINDOW_CONVENTIONS:
            raise ValueError(f"Capabilities.window_convention: expected None or one of {WINDOW_CONVENTIONS}, "
                             f"got {self.window_convention!r}")
        unknown = set(self.kv_dtypes) - set(DTYPES)
        if unknown:
            raise ValueError(f"Capabilities.kv_dtypes: unknown {sorted(unknown)}; expected a subset of {sorted(DTYPES)}")
        if self.gqa_groups is not None and not (isinstance(self.gqa_groups, frozenset) and self.gqa_groups and all(
                isinstance(g, int) and g >= 1 for g in self.gqa_groups)):
            raise ValueError(f"Capabilities.gqa_groups: expected None or a non-empty frozenset of ints >= 1 (query "
                             f"heads per KV head), got {self.gqa_groups!r}")
        bad_rules = [r for r in self.shape_rules if not isinstance(r, ShapeRule)]
        if not isinstance(self.shape_rules, tuple) or bad_rules:
            raise ValueError(f"Capabilities.shape_rules: expected a tuple of ShapeRule, got {self.shape_rules!r}")
        if self.fp8_math not in FP8_MATH:
            raise ValueError(f"Capabilities.fp8_math: expected one of {FP8_MATH}, got {self.fp8_math!r}")

    @property
    def fp8_mma(self) -> bool:
        """fp8 cases run fp8 x fp8 matrix instructions: needs an sm_89+ / CDNA3+ GPU class."""
        return self.fp8_math == FP8_Q_AND_P

    def missing_for(self, case: Case, device_type: str) -> list[str]:
        """Every capability `case` needs that this kernel lacks, as readable reasons."""
        if self.unavailable:  # nothing else matters (and one reason groups the skips in -rs)
            return [self.unavailable]
        miss = []
        if case.kv_dtype not in self.kv_dtypes:
            miss.append(f"kv dtype {case.kv_dtype}")
        if case.layout not in self.layouts:
            miss.append(f"layout {case.layout}")
        if case.layout == "paged" and self.page_sizes is not None and case.page_size not in self.page_sizes:
            miss.append(f"page size {case.page_size}")
        if self.head_dims is not None and case.head_dim not in self.head_dims:
            miss.append(f"head dim {case.head_dim}")
        if self.gqa_groups is not None and case.group not in self.gqa_groups:
            miss.append(f"GQA group {case.group} (supported: {', '.join(str(g) for g in sorted(self.gqa_groups))})")
        miss += [why for why in (r.violation(case) for r in self.shape_rules) if why]
        if case.window is not None and self.window_convention is None:
            miss.append("sliding window")
        if case.mla and not self.mla:
            miss.append("MLA rope split")
        if case.softcap is not None and not self.softcap:
            miss.append("soft-cap")
        if case.sinks and not self.sinks:
            miss.append("attention sinks")
        if device_type not in self.devices:
            miss.append(f"device {device_type}")
        if case.min_pool_bytes and self.max_pool_bytes is not None and case.min_pool_bytes > self.max_pool_bytes:
            miss.append(f"KV pools past {self.max_pool_bytes} bytes")
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
            parts.append("rule " + r.field + ("{" + ",".join(str(a) for a in sorted(r.allowed)) + "}" if r.allowed
                                              is not None else "") + (f">={r.min}" if r.min is not None else "")
                         + (f"<={r.max}" if r.max is not None else ""))
        parts.append(f"window {self.window_convention}" if self.window_convention else "no window")
        parts.append(f"fp8 {self.fp8_math}")
        for flag in ("mla", "softcap", "sinks", "lse", "num_splits", "cuda_graph_safe", "deterministic",
                     "batch_invariant"):
            parts.append(("+" if getattr(self, flag) else "-") + flag)
        return " ".join(parts)


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
        what = "instantiating the class" if isinstance(obj, type) else "calling the factory"
        try:
            obj = obj()
        except KernelLoadError:
            raise
        except Exception as e:
            raise KernelLoadError(f"kernel spec {spec!r}: {what} failed:\n{_trimmed(e)}") from e
    check_kernel(obj, spec)
    return obj


def _trimmed(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)[1:]  # drop this module's own frame
    return "".join(traceback.format_list(tb) + traceback.format_exception_only(type(e), e)).rstrip()


def load_kernel(spec: str) -> DecodeKernel:
    """Import `pkg.module:attr` and resolve it (`resolve_kernel`)."""
    if ":" not in spec:
        raise KernelLoadError(f"kernel spec {spec!r}: expected 'package.module:object'")
    mod_name, attr = spec.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:
        raise KernelLoadError(f"kernel spec {spec!r}: cannot import {mod_name}:\n{_trimmed(e)}") from e
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise KernelLoadError(f"kernel spec {spec!r}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return resolve_kernel(obj, spec)


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


def entry_point_specs() -> dict[str, str]:
    """{name: 'module:attr'} of every kernel registered in the `decode_conformance.kernels` group:
    the installed distributions' entry points (ours and any adopter package's). A checkout that
    is not pip-installed has no metadata: there the table comes from its pyproject.toml."""
    from importlib.metadata import entry_points
    eps = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if not any(v.startswith(SHIPPED_PACKAGE + ".") for v in eps.values()):
        eps = {**_checkout_entry_points(), **eps}
    return eps


def _checkout_entry_points() -> dict[str, str]:
    import tomllib
    from ._paths import checkout_root
    root = checkout_root()
    if root is None:
        return {}
    data = tomllib.loads((root / "pyproject.toml").read_text())
    return dict(data.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))


def shipped_specs() -> list[str]:
    """The kernels this package ships (registered by its own pyproject.toml)."""
    return [v for v in entry_point_specs().values() if v.startswith(SHIPPED_PACKAGE + ".")]


def kernel_specs(cli: Iterable[str] = (), env: Optional[str] = None) -> list[str]:
    """Which kernels to test: command line, then environment variable, then every registered
    kernel (entry points). A registered name (e.g. `lean`) is accepted wherever a spec is."""
    specs = [s for s in cli if s]
    if not specs:
        env = os.environ.get(ENV_VAR, "") if env is None else env
        specs = [s.strip() for s in env.replace(";", ",").split(",") if s.strip()]
    eps = entry_point_specs()
    if not specs:
        specs = list(eps.values())
    out = []
    for s in specs:
        s = eps.get(s, s) if ":" not in s else s
        if s not in out:
            out.append(s)
    return out

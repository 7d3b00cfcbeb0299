"""The adapter protocol between the suite and a kernel under test, and kernel discovery.

How to add a kernel: write an object with `name`, `caps` (a Capabilities) and
`plan(batch) -> launch`. `plan` does host-side work (workspace from `batch.workspace`,
grid sizes) and returns a no-argument callable that launches the kernel and writes
`batch.out` (and `batch.lse` when `caps.lse`). Parity calls `plan(batch)()`; the perf suite
times `launch`; the CUDA-graph tests capture it. Then point the suite at it:
`--kernel=pkg.module:obj`, `DECODE_CONFORMANCE_KERNELS=pkg.module:obj`, or an entry point in
the `decode_conformance.kernels` group.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Protocol, runtime_checkable

from .batch import DecodeBatch
from .cases import DTYPES, WINDOW_CONVENTIONS, Case

ENV_VAR = "DECODE_CONFORMANCE_KERNELS"
ENTRY_POINT_GROUP = "decode_conformance.kernels"
SHIPPED = (
    "decode_conformance_kernels.registry:fixed_split",
    "decode_conformance_kernels.registry:adaptive_split",
    "decode_conformance_kernels.registry:lean",
    "decode_conformance_kernels.registry:dispatch",
    "decode_conformance_kernels.registry:torch_gather",
)


@dataclass(frozen=True)
class Capabilities:
    kv_dtypes: frozenset = frozenset(DTYPES)
    layouts: frozenset = frozenset({"contig", "paged"})
    page_sizes: Optional[frozenset] = None  # None: any page size
    head_dims: Optional[frozenset] = None  # None: any
    window_convention: Optional[str] = "counts-current"  # None: no sliding window
    mla: bool = True
    softcap: bool = True
    sinks: bool = True
    lse: bool = True
    num_splits: bool = False  # honours Case.num_splits (others run those cases with their own choice)
    cuda_graph_safe: bool = False
    deterministic: bool = True
    devices: frozenset = frozenset({"cuda", "cpu"})  # cpu = Triton interpreter or torch
    max_pool_bytes: Optional[int] = None
    fp8_tensor_cores: bool = False  # fp8 cases run fp8 MMAs (q cast to fp8): needs an sm_89+/CDNA3+ class
    # Set when the kernel cannot run here at all (its library is not installed, say): the
    # kernel is still listed, and every case skips with this reason.
    unavailable: Optional[str] = None

    def __post_init__(self):
        if self.window_convention is not None and self.window_convention not in WINDOW_CONVENTIONS:
            raise ValueError(f"Capabilities.window_convention: expected None or one of {WINDOW_CONVENTIONS}, "
                             f"got {self.window_convention!r}")
        unknown = set(self.kv_dtypes) - set(DTYPES)
        if unknown:
            raise ValueError(f"Capabilities.kv_dtypes: unknown {sorted(unknown)}; expected a subset of {sorted(DTYPES)}")

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
        parts.append(f"window {self.window_convention}" if self.window_convention else "no window")
        for flag in ("mla", "softcap", "sinks", "lse", "cuda_graph_safe", "deterministic"):
            parts.append(("+" if getattr(self, flag) else "-") + flag)
        return " ".join(parts)


@runtime_checkable
class DecodeKernel(Protocol):
    name: str
    caps: Capabilities

    def plan(self, batch: DecodeBatch) -> Callable[[], None]: ...


class KernelLoadError(RuntimeError):
    pass


def load_kernel(spec: str) -> DecodeKernel:
    """Import `pkg.module:attr`; the attribute may be a kernel or a zero-argument factory."""
    if ":" not in spec:
        raise KernelLoadError(f"kernel spec {spec!r}: expected 'package.module:object'")
    mod_name, attr = spec.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # report the import error for this kernel, keep the others
        raise KernelLoadError(f"kernel spec {spec!r}: cannot import {mod_name}: {type(e).__name__}: {e}") from e
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise KernelLoadError(f"kernel spec {spec!r}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, DecodeKernel) and callable(obj):
        try:
            obj = obj()
        except Exception as e:
            raise KernelLoadError(f"kernel spec {spec!r}: constructing it failed: {type(e).__name__}: {e}") from e
    check_kernel(obj, spec)
    return obj


def check_kernel(obj, origin: str = "") -> None:
    where = f" ({origin})" if origin else ""
    for attr in ("name", "caps", "plan"):
        if not hasattr(obj, attr):
            raise KernelLoadError(f"kernel{where}: missing attribute {attr!r}; expected name, caps, plan(batch)")
    if not isinstance(obj.caps, Capabilities):
        raise KernelLoadError(f"kernel{where}: caps must be decode_conformance.Capabilities, got {type(obj.caps).__name__}")
    if not isinstance(obj.name, str) or not obj.name or any(c in obj.name for c in " []/"):
        raise KernelLoadError(f"kernel{where}: name must be a non-empty string without spaces, '[', ']' or '/'; "
                              f"got {obj.name!r}")


def entry_point_specs() -> list[str]:
    from importlib.metadata import entry_points
    return [f"{ep.value}" for ep in entry_points(group=ENTRY_POINT_GROUP)]


def kernel_specs(cli: Iterable[str] = (), env: Optional[str] = None, include_entry_points: bool = True) -> list[str]:
    """Which kernels to test, in priority order: command line, then environment variable,
    then (when neither names one) every shipped kernel plus installed entry points."""
    specs = [s for s in cli if s]
    if not specs:
        env = os.environ.get(ENV_VAR, "") if env is None else env
        specs = [s.strip() for s in env.replace(";", ",").split(",") if s.strip()]
    if not specs:
        specs = list(SHIPPED)
        if include_entry_points:
            specs += [s for s in entry_point_specs() if s not in specs]
    seen, out = set(), []
    for s in specs:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out

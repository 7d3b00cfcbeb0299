"""Compile every shipped Triton kernel variant for every GPU target, on a CPU-only machine.

Triton's interpreter accepts code the GPU compilers reject (`return` inside a loop, a type a
target lacks, inline PTX on AMD, shared memory over the limit), so a CPU-green CI can still
ship a kernel that does not build on some GPU. This check runs the shipped host code with
every launch recorded instead of run (kernel, arguments, constexprs), then runs
`triton.compile` on each distinct launch for every target below. Nothing here runs a kernel.

    python ci/compile_check.py                        # every variant, every target (CI)
    python ci/compile_check.py --targets sm_100 --kernels lean --jobs 2
    python ci/compile_check.py --report reports/compile-check   # + .md table and .json

Variants. A variant is one kernel compiled with one set of the compile-time choices its host
code makes: kv dtype, head geometry (launch-config row, head tiling, MLA split), soft-cap and
sinks, LSE or not, page layout. GRID lists the rows every kernel in `kernel_entries` compiles
(less what its capabilities exclude); they are chosen so that every switch meets every other
switch, every geometry and both element widths (see GRID). Launch configurations come from
the kernels' own rules for the target (its shared memory, AMD or not), so each target
compiles what a GPU of that class would run. Identical compiles are done once.

Per target, derived rather than listed: a kernel whose Capabilities say it runs fp8 x fp8
MMAs is excluded on a class without fp8 tensor cores (fixtures/gpu_classes.toml,
`fp8_tensor_cores`). The host code's own device-dependent choices (e4m3 caches passed as
bytes below sm_89, the FNUZ fp8 MMA form on gfx942) are made by the host code itself, with
torch's device queries answering as a GPU of the target would (`on_target`). A variant
that fails for a known reason is in KNOWN_FAILURES and must keep failing.

Reported per compiled variant: shared memory (against the target's limit: over it fails),
registers and spills (NVIDIA: cuobjdump's REG and STACK; AMD: the code object's VGPR/SGPR
and spill counts) and the matrix instructions used. Compiles run in `--jobs` processes.

Uses Triton internals that move between releases (checked on 3.9: the launch binder, the
compiled kernel's asm and metadata); the check says so and exits 2 when the binder is missing
rather than passing silently.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import multiprocessing
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import types
from typing import Callable, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

CLASSES_FILE = ROOT / "fixtures" / "gpu_classes.toml"


def _compile_env() -> None:
    """Set before any kernel module is imported for compiling (not at import: the self-tests
    import this module for its pure parts inside an interpreter-mode pytest process)."""
    os.environ.pop("TRITON_INTERPRET", None)  # with it, triton.jit builds uncompilable interpreter functions
    # Triton 3.9 warns once per process that this default changes in 3.10; pin today's
    # default so the compiled code is what a GPU run gets now, and the log stays readable.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def _import_kernels():
    """The shipped kernels, from an install or, in a bare checkout, through the checkout alias."""
    try:
        import decode_conformance_kernels  # noqa: F401
    except ImportError:
        from decode_conformance import _paths
        alias = getattr(_paths, "alias_checkout", None) or getattr(_paths, "alias_kernels")
        alias(ROOT)
    from decode_conformance_kernels import adaptive_split, fixed_split, lean, triton_common
    return adaptive_split, fixed_split, lean, triton_common


# ----------------------------------------------------------------------------------------
# targets
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Target:
    gpu: GPUTarget
    smem: int  # bytes of shared memory (LDS) one program may use: the CUDA opt-in maximum per block

    @property
    def is_hip(self) -> bool:
        return self.gpu.backend == "hip"


BACKENDS = {"nvidia": "cuda", "amd": "hip"}


def _targets() -> dict:
    """The classes of fixtures/gpu_classes.toml that name a compile_arch, in the table's order:
    one table of GPU classes for detection, sharding and compiling."""
    from decode_conformance import hardware
    return {c.name: Target(GPUTarget(BACKENDS[c.vendor], c.compile_arch, c.warp_size), c.shared_memory_bytes)
            for c in hardware.known_classes(str(CLASSES_FILE)).values() if c.compile_arch is not None}


TARGETS = _targets()


def gpu_classes() -> dict:
    with open(CLASSES_FILE, "rb") as f:
        return tomllib.load(f)


@contextlib.contextmanager
def emulated_device(target_name: str):
    """torch's device queries (ROCm or not, compute capability, device properties) answer as
    a GPU of `target_name` would, for host code that branches on them."""
    t = TARGETS[target_name]
    if t.is_hip:
        hip, cap, arch = "emulated", (9, 4), f"{t.gpu.arch}:sramecc+:xnack-"
    else:
        hip, cap, arch = None, divmod(int(t.gpu.arch), 10), ""
    props = types.SimpleNamespace(major=cap[0], minor=cap[1], gcnArchName=arch, name=f"{target_name} (emulated)",
                                  multi_processor_count=132, total_memory=80 * 2**30)
    saved = torch.version.hip, torch.cuda.get_device_capability, torch.cuda.get_device_properties
    torch.version.hip = hip
    torch.cuda.get_device_capability = lambda *a, **k: cap
    torch.cuda.get_device_properties = lambda *a, **k: props
    try:
        yield
    finally:
        torch.version.hip, torch.cuda.get_device_capability, torch.cuda.get_device_properties = saved


class _OnDevice:
    """A CPU tensor that says it lives on the GPU (its `.device`); everything else is the tensor's."""

    def __init__(self, tensor):
        self._tensor = tensor

    device = torch.device("cuda", 0)

    def __getattr__(self, name):
        return getattr(self._tensor, name)


def on_target(fn, target_name: str):
    """`fn` (a host helper taking tensors) run as on a GPU of `target_name`."""
    def call(*args, **kwargs):
        args = [_OnDevice(a) if isinstance(a, torch.Tensor) else a for a in args]
        with emulated_device(target_name):
            out = fn(*args, **kwargs)
        unwrap = lambda x: x._tensor if isinstance(x, _OnDevice) else x  # noqa: E731
        return tuple(map(unwrap, out)) if isinstance(out, tuple) else unwrap(out)
    return call


# Host helpers of the split-K kernels whose result depends on the GPU (triton_common): run as
# on the target while launches are recorded.
DEVICE_DEPENDENT = ("kv_operand", "fp8_mma_code", "dependent_launch")


# ----------------------------------------------------------------------------------------
# the variant grid
# ----------------------------------------------------------------------------------------
DTYPES = {  # kv dtype -> (q / out dtype, cache dtype as the suite's cases use it)
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp16": (torch.float16, torch.float16),
    "e4m3": (torch.bfloat16, torch.float8_e4m3fn),
    "e5m2": (torch.bfloat16, torch.float8_e5m2),
}


@dataclasses.dataclass(frozen=True)
class Geometry:
    hq: int
    hkv: int
    dk: int
    dv: int
    mla: bool = False  # V is a view of K's first dv columns


# Each geometry lands on a different launch-config row or head tiling of the kernels.
GEOMETRIES = {
    "gqa-d128": Geometry(32, 8, 128, 128),  # the "small" config row; 4 heads per KV head
    "g128-d96": Geometry(128, 1, 96, 96),  # group of 128 cut into 64-row head tiles; D not a power of 2
    "gqa-d256": Geometry(16, 2, 256, 256),  # the "medium" row
    "mla-576": Geometry(16, 1, 576, 512, mla=True),  # DeepSeek MLA: the "large" row, K split 512 + 64
}
# Even pages are folded by the host to one slot per page (page size specialised to 1); a pool
# whose pages are not evenly spaced (here a gap after each page) keeps the runtime page size.
LAYOUTS = ("pages", "gapped-pages")
PAGE_SIZE = 16


@dataclasses.dataclass(frozen=True)
class Row:
    dtype: str
    geometry: str
    softcap_sinks: bool  # soft-cap 30 and per-head sinks (the stage-1 and stage-2 switches)
    lse: bool  # the LSE is returned (False: the launcher gets lse=None)
    layout: str

    @property
    def label(self) -> str:
        feats = ("softcap+sinks " if self.softcap_sinks else "") + ("lse" if self.lse else "no-lse")
        return f"{self.dtype} {self.geometry} {feats} {self.layout}"


# Every geometry with a 16-bit and an fp8 cache, every dtype twice, and each switch (soft-cap
# + sinks, LSE, page layout) on and off with every geometry, every element width and every
# other switch (suites/selftest/test_compile_targets.py checks these properties). The full
# dtype x geometry product compiles twice as much for the same switches.
GRID = (
    Row("bf16", "gqa-d128", False, True, "pages"),
    Row("e4m3", "gqa-d128", True, False, "gapped-pages"),
    Row("fp16", "g128-d96", True, True, "gapped-pages"),
    Row("e5m2", "g128-d96", False, False, "pages"),
    Row("fp16", "gqa-d256", False, False, "gapped-pages"),
    Row("e5m2", "gqa-d256", True, True, "pages"),
    Row("bf16", "mla-576", True, False, "pages"),
    Row("e4m3", "mla-576", False, True, "gapped-pages"),
)


def grid_gaps(rows=GRID) -> list[str]:
    """What `rows` fails to cover of GRID's promise (empty: nothing)."""
    gaps = []
    width = {d: "fp8" if DTYPES[d][1].itemsize == 1 else "16-bit" for d in DTYPES}
    switches = {"softcap+sinks": lambda r: r.softcap_sinks, "lse": lambda r: r.lse, "layout": lambda r: r.layout}
    values = {"softcap+sinks": {True, False}, "lse": {True, False}, "layout": set(LAYOUTS)}
    for d in DTYPES:
        if sum(r.dtype == d for r in rows) < 2:
            gaps.append(f"dtype {d} in fewer than 2 rows")
    for g in GEOMETRIES:
        got = {width[r.dtype] for r in rows if r.geometry == g}
        if got != {"16-bit", "fp8"}:
            gaps.append(f"geometry {g} lacks a {'/'.join({'16-bit', 'fp8'} - got)} row")
    for name, f in switches.items():
        for axis, key in (("geometry", lambda r: r.geometry), ("width", lambda r: width[r.dtype])):
            for a in sorted({key(r) for r in rows}):
                got = {f(r) for r in rows if key(r) == a}
                if got != values[name]:
                    gaps.append(f"{name} takes only {sorted(got, key=str)} with {axis} {a}")
        for other, f2 in switches.items():
            if other <= name:
                continue
            got = {(f(r), f2(r)) for r in rows}
            want = {(a, b) for a in values[name] for b in values[other]}
            for a, b in sorted(want - got, key=str):
                gaps.append(f"no row with {name}={a} and {other}={b}")
    return gaps


# ----------------------------------------------------------------------------------------
# the kernels
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """One shipped kernel (or kernel flag) to compile. `launch(inputs, target)` runs its host
    code once; `caps` is the Capabilities the kernel declares to the suite."""
    name: str
    caps: object
    launch: Callable
    fp8_mma: Optional[bool] = None  # fp8 x fp8 MMAs; None: as the Capabilities say (`fp8_mma`)
    omits_lse: bool = True  # the launcher accepts lse=None (the no-lse feature)
    available: Optional[str] = None  # why this entry cannot be built in this checkout, if so


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    out: torch.Tensor
    lse: Optional[torch.Tensor]
    sinks: Optional[torch.Tensor]
    softcap: float
    geometry: Geometry


def _inputs(row: Row, entry: KernelEntry) -> Inputs:
    g = GEOMETRIES[row.geometry]
    qdt, kvdt = DTYPES[row.dtype]
    softcap, sinks, lse = effective_features(row, entry)
    B, pages = 2, 8
    slots = PAGE_SIZE + (1 if row.layout == "gapped-pages" else 0)
    k = torch.zeros(pages, slots, g.hkv, g.dk, dtype=kvdt)[:, :PAGE_SIZE]
    v = k[..., :g.dv] if g.mla else torch.zeros(pages, slots, g.hkv, g.dv, dtype=kvdt)[:, :PAGE_SIZE]
    return Inputs(
        q=torch.zeros(B, g.hq, g.dk, dtype=qdt), k=k, v=v,
        indptr=torch.zeros(B + 1, dtype=torch.int32), indices=torch.zeros(4, dtype=torch.int32),
        out=torch.zeros(B, g.hq, g.dv, dtype=qdt), lse=torch.zeros(B, g.hq) if lse else None,
        sinks=torch.zeros(g.hq) if sinks else None, softcap=softcap, geometry=g)


def effective_features(row: Row, entry: KernelEntry) -> tuple[float, bool, bool]:
    """(softcap, sinks, lse) of the row less what the kernel does not have (soft-cap, sinks:
    its Capabilities; omitting the LSE: its launcher), so that the row still compiles the
    kernel's dtype x geometry pair."""
    softcap = 30.0 if row.softcap_sinks and entry.caps.softcap else 0.0
    return softcap, row.softcap_sinks and entry.caps.sinks, row.lse or not entry.omits_lse


def effective_label(row: Row, entry: KernelEntry) -> str:
    """The row as this kernel compiles it (features it lacks dropped)."""
    softcap, sinks, lse = effective_features(row, entry)
    feats = ("softcap " if softcap else "") + ("sinks " if sinks else "") + ("lse" if lse else "no-lse")
    return f"{row.dtype} {row.geometry} {feats} {row.layout}"


def _split_k_launcher(fn, **extra):
    def launch(x: Inputs, target: Target):
        tc = _import_kernels()[3]
        g = x.geometry
        cfg = tc.gpu_config(g.dk, g.dv, g.mla, target.smem, is_hip=target.is_hip, kv_bytes=x.k.element_size())
        fn(x.q, x.k, x.v, x.indptr, x.indices, x.out, sm_scale=0.1, lse=x.lse, softcap=x.softcap, sinks=x.sinks,
           window=64, **cfg, **extra)
    return launch


def _merge_in_stage1_launch(x: Inputs, target: Target):
    """adaptive_split with merge counters: stage 1 merges its partials where a tile fits its merge."""
    adaptive_split = _import_kernels()[0]
    shape = adaptive_split.merge_counter_shape(x.q.shape[0], x.q.shape[1], x.k.shape[-2])
    _split_k_launcher(adaptive_split.decode_attention_adaptive, splits=64,
                      merge_counters=torch.zeros(shape, dtype=torch.int32))(x, target)


def _lean_launch(x: Inputs, target: Target):
    lean = _import_kernels()[2]
    d1 = min(x.geometry.dk, x.geometry.dv)
    saved = lean._is_hip
    lean._is_hip = lambda: target.is_hip  # its launch defaults differ on ROCm
    try:
        # the target's shared memory picks the configuration, as the device's would on a GPU
        cfg = lean.launch_defaults("cuda", lean._pow2(d1), mla=x.geometry.mla, max_smem=target.smem)
    finally:
        lean._is_hip = saved
    cfg.pop("programs_per_sm")  # the grid's size changes no compile
    lse = x.lse if x.lse is not None else torch.zeros(x.out.shape[:2])
    lean.plan_lean(x.q, x.k, x.v, x.indptr, x.indices, x.out, lse, sm_scale=0.1, window=64, programs=132,
                   **cfg)()


def kernel_entries() -> list[KernelEntry]:
    """The shipped kernels. To add one (or a flag of one): an entry with its launcher and the
    Capabilities the kernel declares; exclusions follow from those and the GPU class table."""
    import inspect
    adaptive_split, fixed_split, lean, _ = _import_kernels()
    adaptive = adaptive_split.decode_attention_adaptive
    fp8_kernel = getattr(adaptive_split, "AdaptiveSplitFp8MmaKernel", None)
    has_fp8_mma = "fp8_mma" in inspect.signature(adaptive).parameters and fp8_kernel is not None
    return [
        KernelEntry("fixed_split", fixed_split.CAPS, _split_k_launcher(fixed_split.decode_attention_fixed, num_splits=8)),
        KernelEntry("adaptive_split", adaptive_split.CAPS, _split_k_launcher(adaptive, splits=64)),
        KernelEntry("adaptive_split_fp8mma", fp8_kernel.caps if has_fp8_mma else adaptive_split.CAPS,
                    _split_k_launcher(adaptive, splits=64, fp8_mma=True) if has_fp8_mma else None,
                    available=None if has_fp8_mma else "decode_attention_adaptive has no fp8_mma flag yet"),
        KernelEntry("adaptive_split_merge_in_stage1", adaptive_split.CAPS, _merge_in_stage1_launch),
        KernelEntry("lean", lean.LeanKernel.caps, _lean_launch, omits_lse=False),
    ]


# A variant that fails to build for a reason recorded here is reported as a known failure and
# does not fail the check; if it starts compiling, the check fails until the entry is removed.
# (kernel entry, @triton.jit function, kv dtype, target) -> (text the error contains, why)
KNOWN_FAILURES: dict = {
    # (kernel, jit function, kv dtype, target): (text the error must contain, why). Empty: the
    # lean e4m3-on-sm_80 failure this check found is fixed (lean takes the bytes path too).
}


def fp8_mma(entry: KernelEntry) -> bool:
    return entry.fp8_mma if entry.fp8_mma is not None else bool(getattr(entry.caps, "fp8_mma", False))


def exclusion(entry: KernelEntry, row: Row, target_name: str, classes: Optional[dict] = None) -> Optional[str]:
    """Why `entry` has no variant for `row` on `target_name` (None: it has one)."""
    if entry.available:
        return entry.available
    if row.dtype not in entry.caps.kv_dtypes:
        return f"kv dtype {row.dtype} not in {entry.name}'s dtypes"
    if GEOMETRIES[row.geometry].mla and not entry.caps.mla:
        return f"{entry.name} lacks mla"
    if fp8_mma(entry) and DTYPES[row.dtype][1].itemsize == 1:
        cls = (classes or gpu_classes()).get(target_name)
        if cls is None:
            return f"{target_name} is not a row of {CLASSES_FILE.name}"
        if not cls.get("fp8_tensor_cores", False):
            return f"class {target_name} has no fp8 tensor cores ({CLASSES_FILE.name}: fp8_tensor_cores = false)"
    return None


# ----------------------------------------------------------------------------------------
# recording launches
# ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Unit:
    """One distinct compile: a kernel function with one signature, constexprs and options."""
    target: str
    fn: str  # the @triton.jit function
    kernel: str  # the kernel_entries() entry that launched it first
    variants: list  # every "kernel row" label that produced this exact compile
    jit: object = None
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    known: Optional[tuple] = None  # (expected error text, why) from KNOWN_FAILURES
    error: Optional[str] = None  # the host code raised instead of launching
    fp8_mma: bool = False  # launched by a kernel that declares fp8 x fp8 MMAs


_RECORDED: list = []


def _recording_getitem(self, grid):
    def record(*args, **kwargs):
        _RECORDED.append((self, args, kwargs))
    return record


def _binder(jf, backend):
    try:
        from triton.runtime.jit import create_function_from_signature
    except ImportError as e:  # depends on the Triton release
        print(f"compile check: this Triton ({triton.__version__}) lacks "
              f"triton.runtime.jit.create_function_from_signature: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    return create_function_from_signature(jf.signature, jf.params, backend)


def _pack(jf, backend, args, kwargs):
    bound, spec, options = _binder(jf, backend)(*args, **kwargs)
    return jf._pack_args(backend, kwargs, bound, spec, options)  # (options, signature, constexprs, attrs)


def plan(target_name: str, entries: Optional[list] = None, kernels: Optional[list] = None) -> tuple[list, list]:
    """(units, excluded) for one target: the distinct compiles the grid produces, and the
    (kernel, row, reason) triples that have no variant here."""
    tc = _import_kernels()[3]
    target = TARGETS[target_name]
    backend = make_backend(target.gpu)
    classes = gpu_classes()
    units: dict = {}
    excluded = []
    saved_getitem = JITFunction.__getitem__
    saved_helpers = {name: getattr(tc, name) for name in DEVICE_DEPENDENT if hasattr(tc, name)}
    JITFunction.__getitem__ = _recording_getitem
    for name, fn in saved_helpers.items():
        setattr(tc, name, on_target(fn, target_name))
    try:
        for entry in entries if entries is not None else kernel_entries():
            if kernels and entry.name not in kernels:
                continue
            for row in GRID:
                why = exclusion(entry, row, target_name, classes)
                if why:
                    excluded.append((entry.name, row.label, why))
                    continue
                _RECORDED.clear()
                label = f"{entry.name} {effective_label(row, entry)}"
                try:
                    entry.launch(_inputs(row, entry), target)
                except Exception as e:  # the host code refused what the class table allows
                    units[("host", entry.name, row.label)] = Unit(
                        target_name, "(host code)", entry.name, [label],
                        error=f"host code raised {type(e).__name__}: {_first_lines(str(e))}")
                    continue
                if not _RECORDED:  # e.g. kernels imported in interpreter mode run instead of recording
                    raise RuntimeError(f"compile check: {entry.name} ({row.label}) launched no recordable "
                                       "kernel; were its modules imported with TRITON_INTERPRET=1?")
                for jf, args, kwargs in _RECORDED:
                    known = KNOWN_FAILURES.get((entry.name, jf.fn.__name__, row.dtype, target_name))
                    options, signature, constexprs, _ = _pack(jf, backend, args, kwargs)
                    key = (jf.fn.__name__, str(sorted(signature.items())),
                           str(sorted(constexprs.items(), key=str)), str(options))
                    if key not in units:
                        units[key] = Unit(target_name, jf.fn.__name__, entry.name, [], jf, args, kwargs, known,
                                          fp8_mma=fp8_mma(entry))
                    units[key].variants.append(label)
                    units[key].known = units[key].known or known  # one compile, one verdict
    finally:
        JITFunction.__getitem__ = saved_getitem
        for name, fn in saved_helpers.items():
            setattr(tc, name, fn)
    return list(units.values()), excluded


# ----------------------------------------------------------------------------------------
# compiling and reading resource use
# ----------------------------------------------------------------------------------------
def _cuobjdump() -> Optional[str]:
    exe = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(exe) if exe.exists() else None


def resources(compiled, target: Target) -> dict:
    """Registers, spills, matrix instructions and grid-dependency instructions (programmatic
    dependent launch, NVIDIA sm_90+) of a compiled kernel, where readable."""
    out = {"regs": None, "spill": None, "mma": "", "griddep": ""}
    if target.is_hip:
        asm = compiled.asm.get("amdgcn", "")
        m = {k: int(v) for k, v in re.findall(r"\.(vgpr_count|sgpr_count|agpr_count|vgpr_spill_count|sgpr_spill_count):\s*(\d+)", asm)}
        if m:  # SGPR spills land in VGPR lanes; VGPR spills go to scratch memory, the costly kind
            sgpr_spill = m.get("sgpr_spill_count", 0)
            out["regs"] = f"{m.get('vgpr_count', 0)}v/{m.get('sgpr_count', 0)}s" + (
                f" ({sgpr_spill}s spilled)" if sgpr_spill else "")
            out["spill"] = m.get("vgpr_spill_count", 0)
        # v_mfma_f32_32x32x16_bf16 -> bf16; ..._fp8_fp8 / ..._bf8_bf8 / ..._f8f6f4 (gfx950): fp8
        mma = sorted(set(re.findall(r"\bv_mfma_(?:scale_)?f32_\d+x\d+x\d+_?([a-z0-9]+(?:_[a-z0-9]+)?)\b", asm)))
        out["mma"] = " ".join(f"mfma:{t.removesuffix('_1k')}" for t in mma)
        return out
    ptx = compiled.asm.get("ptx", "")
    kinds = set(f"mma:{t}" for t in re.findall(r"\bmma\.sync\.aligned\.m\d+n\d+k\d+\.row\.col\.f32\.(\w+)\.", ptx))
    kinds |= set(f"wgmma:{t}" for t in re.findall(r"\bwgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+\.f32\.(\w+)\.", ptx))
    kinds |= set(f"tcgen05:{t}" for t in re.findall(r"\btcgen05\.mma\S*?\.kind::(\w+)", ptx))
    out["mma"] = " ".join(sorted(kinds))
    out["griddep"] = " ".join(sorted(set(re.findall(r"\bgriddepcontrol\.(\w+)", ptx))))
    exe = _cuobjdump()
    if exe and "cubin" in compiled.asm:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            p = subprocess.run([exe, "-res-usage", f.name], capture_output=True, text=True)
        m = re.search(r"REG:(\d+) STACK:(\d+)", p.stdout)
        if m:  # STACK: bytes of per-thread stack; ptxas puts spilled registers there
            out["regs"], out["spill"] = int(m.group(1)), int(m.group(2))
    return out


FP8_MMA_OPERANDS = ("e4m3", "e5m2", "f8f6f4", "fp8", "bf8")


def fp8_note(row: dict, entry_is_fp8_mma: bool) -> str:
    """A stage with dots of an fp8-MMA kernel that the compiler lowered to 16-bit matrix
    instructions (the fp8 operands upcast: correct, but not the fp8 speed the kernel is for)."""
    if not entry_is_fp8_mma or not row["mma"] or row["status"] != "ok":
        return ""
    if any(op in row["mma"] for op in FP8_MMA_OPERANDS):
        return ""
    return f"fp8 MMA requested, compiled to {row['mma']}"


def compile_unit(unit: Unit) -> dict:
    target = TARGETS[unit.target]
    backend = make_backend(target.gpu)
    row = {"target": unit.target, "fn": unit.fn, "kernel": unit.kernel, "variants": unit.variants,
           "num_warps": None, "num_stages": None, "shared": None, "smem_limit": target.smem,
           "regs": None, "spill": None, "mma": "", "griddep": "", "status": "ok", "error": "", "note": "", "seconds": 0.0}
    t0 = time.time()
    if unit.error:
        row["status"], row["error"] = "fail", unit.error
        return row
    try:
        options, signature, constexprs, attrs = _pack(unit.jit, backend, unit.args, unit.kwargs)
        row["num_warps"], row["num_stages"] = options.num_warps, options.num_stages
        # Triton prints a whole failing PTX file to stdout before raising: keep it out of the log.
        with contextlib.redirect_stdout(None):
            compiled = triton.compile(ASTSource(unit.jit, signature, constexprs, attrs), target=target.gpu,
                                      options=options.__dict__)
    except Exception as e:  # every variant is reported, not just the first
        row["status"], row["error"] = "fail", f"{type(e).__name__}: {_first_lines(str(e))}"
    else:
        row["shared"] = compiled.metadata.shared
        row.update(resources(compiled, target))
        if compiled.metadata.shared > target.smem:
            row["status"], row["error"] = "fail", f"shared memory {compiled.metadata.shared} > {target.smem} bytes"
    row["seconds"] = round(time.time() - t0, 2)
    row["note"] = fp8_note(row, unit.fp8_mma)
    if unit.known:
        expected, why = unit.known
        if row["status"] == "fail" and expected in row["error"]:
            row["status"], row["error"] = "known", f"known failure: {why}"
        else:
            row["status"] = "fail"
            row["error"] = (f"listed in KNOWN_FAILURES ({expected!r}) but " +
                            ("compiled: remove the entry" if not row["error"] else f"failed differently: {row['error']}"))
    return row


def _first_lines(text: str, limit: int = 600) -> str:
    text = " | ".join(ln.strip() for ln in text.strip().splitlines() if ln.strip())
    return text if len(text) <= limit else text[:limit] + " ..."


# Processes for --jobs > 1 plan their targets themselves: launches hold JIT functions and
# tensors, cheaper to record again (about a second per target) than to send.
_WORKER_PLANS: dict = {}


def _worker_compile(target_name: str, index: int, kernels: Optional[list]) -> dict:
    if target_name not in _WORKER_PLANS:
        _WORKER_PLANS[target_name] = plan(target_name, kernels=kernels)[0]
    return compile_unit(_WORKER_PLANS[target_name][index])


def _cost(unit: Unit) -> float:
    """Rough compile time, to start the long compiles first when spread over processes."""
    base = {"lean_decode_kernel": 3.0}.get(unit.fn, 1.5 if "stage1" in unit.fn else 0.5)
    return base * (2.0 if "mla-576" in unit.variants[0] else 1.0)


def compile_all(target_names, jobs: int = 1, kernels: Optional[list] = None, entries: Optional[list] = None,
                log=print) -> tuple[list, list]:
    """Compile every unit of every target: (rows, excluded). `entries` replaces kernel_entries()
    (self-tests plant kernels this way; it needs jobs=1)."""
    _compile_env()
    plans = {t: plan(t, entries=entries, kernels=kernels) for t in target_names}
    excluded = [(t, *x) for t, (_, exc) in plans.items() for x in exc]
    work = sorted(((t, i, u) for t, (units, _) in plans.items() for i, u in enumerate(units)),
                  key=lambda w: -_cost(w[2]))
    log(f"{len(work)} distinct compiles over {len(target_names)} targets "
        f"({', '.join(f'{t}: {len(u)}' for t, (u, _) in plans.items())}), {jobs} process(es)")
    rows = []
    if jobs <= 1 or entries is not None:
        rows = [compile_unit(u) for _, _, u in work]
    else:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that has run LLVM
        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = [pool.submit(_worker_compile, t, i, kernels) for t, i, _ in work]
            for n, fut in enumerate(cf.as_completed(futures), 1):
                rows.append(fut.result())
                if n % 50 == 0:
                    log(f"  {n}/{len(work)} compiled")
    order = {t: i for i, t in enumerate(TARGETS)}
    rows.sort(key=lambda r: (order.get(r["target"], 99), r["kernel"], r["fn"], r["variants"][0]))
    return rows, excluded


# ----------------------------------------------------------------------------------------
# reporting
# ----------------------------------------------------------------------------------------
def summary_lines(rows: list, excluded: list) -> list[str]:
    lines = []
    for t in dict.fromkeys(r["target"] for r in rows):
        rs = [r for r in rows if r["target"] == t]
        ok = [r for r in rs if r["status"] == "ok"]
        shared = max((r["shared"] or 0 for r in ok), default=0)
        spilling = [r for r in ok if r["spill"]]
        notes = [r for r in ok if r["note"]]
        lines.append(f"{t}: {len(ok)} compiled, {sum(r['status'] == 'fail' for r in rs)} failed, "
                     f"{sum(r['status'] == 'known' for r in rs)} known failures, "
                     f"{sum(1 for x in excluded if x[0] == t)} variants excluded; max shared {shared} of "
                     f"{TARGETS[t].smem} B; {len(spilling)} spill"
                     + (f"; {len(notes)} fp8-MMA variants without fp8 matrix instructions" if notes else ""))
    return lines


def markdown(rows: list, excluded: list, seconds: float) -> str:
    fails = [r for r in rows if r["status"] == "fail"]
    out = [f"## Compile check: {sum(r['status'] == 'ok' for r in rows)} compiled, {len(fails)} failed "
           f"(triton {triton.__version__}, {seconds:.0f} s)", ""]
    if fails:
        out += ["### Failures", ""] + [f"- **{r['target']} {r['fn']}** ({r['variants'][0]}): {r['error']}"
                                        for r in fails] + [""]
    out += [f"- {ln}" for ln in summary_lines(rows, excluded)] + [""]
    notes = [r for r in rows if r["note"]]
    if notes:
        out += ["### Notes", ""] + [f"- {r['target']} {r['fn']} ({r['variants'][0]}): {r['note']}" for r in notes] + [""]
    out += ["spill: NVIDIA, bytes of stack per thread (ptxas spills there); AMD, VGPRs spilled to scratch.", "",
            "| target | kernel | function | first variant (of n) | warps | stages | shared B | regs | spill | mma | griddep | status |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['error'][:160]}"
        status += f" ({r['note']})" if r["note"] else ""
        out.append(f"| {r['target']} | {r['kernel']} | {r['fn']} | {r['variants'][0]} ({len(r['variants'])}) | "
                   f"{r['num_warps']} | {r['num_stages']} | {r['shared']} | {r['regs']} | {r['spill']} | "
                   f"{r['mma']} | {r['griddep']} | {status} |")
    if excluded:
        reasons: dict = {}
        for t, k, _, why in excluded:
            reasons.setdefault((t, k, why), 0)
            reasons[(t, k, why)] += 1
        out += ["", "### Excluded (derived per target)", ""]
        out += [f"- {t} {k}: {n} rows: {why}" for (t, k, why), n in sorted(reasons.items())]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--kernels", nargs="*", default=None, help="only these kernel_entries() names (default: all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes (default: CPU count)")
    ap.add_argument("--report", default=None, metavar="PATH", help="write PATH.md (table) and PATH.json")
    args = ap.parse_args(argv)
    if args.kernels:
        _compile_env()
        names = [e.name for e in kernel_entries()]
        unknown = sorted(set(args.kernels) - set(names))
        if unknown:
            ap.error(f"--kernels: no entry named {', '.join(unknown)}; entries: {', '.join(names)}")
    t0 = time.time()
    rows, excluded = compile_all(args.targets, jobs=args.jobs, kernels=args.kernels)
    seconds = time.time() - t0
    for r in rows:
        if r["status"] == "fail":
            print(f"FAIL {r['target']} {r['fn']} ({r['variants'][0]}): {r['error']}")
    for ln in summary_lines(rows, excluded):
        print(ln)
    if args.report:
        base = pathlib.Path(args.report)
        base.parent.mkdir(parents=True, exist_ok=True)
        base.with_suffix(".md").write_text(markdown(rows, excluded, seconds))
        base.with_suffix(".json").write_text(json.dumps({"triton": triton.__version__, "seconds": round(seconds, 1),
                                                         "rows": rows, "excluded": excluded}, indent=1))
        print(f"report: {base.with_suffix('.md')}, {base.with_suffix('.json')}")
    n_ok = sum(r["status"] == "ok" for r in rows)
    n_fail = sum(r["status"] == "fail" for r in rows)
    print(f"{n_ok} kernel variants compiled, {n_fail} failed, {sum(r['status'] == 'known' for r in rows)} known "
          f"failures, {len(args.targets)} targets, triton {triton.__version__}, {seconds:.0f} s")
    if not rows:
        print("compile check: nothing was compiled (every variant excluded?)")
        return 1
    return 1 if n_fail else 0


if __name__ == "__main__":
    raise SystemExit(main())

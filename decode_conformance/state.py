"""The state of one conformance run, built once per pytest process from its options.

`plugin.py` is thin hooks over this object. Building it is where every configuration
mistake becomes a usage error - before any case runs, once, naming what was wrong and what
was expected: a kernel spec that does not import or is not a kernel, a ledger that does not
parse, an unknown case set or case id, a CUDA device on a machine without one, a kernel
module imported before the interpreter could be switched on.

Nothing here runs at import or at plugin load: `conformance_requested` decides from the
command line whether this pytest run is a conformance run at all, so an adopter's unrelated
tests pay nothing (no environment change, no Triton patching, no kernel imports).
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import pathlib
import sys
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

import pytest

from . import devices, hardware
from ._paths import SUITES_PACKAGE

ISOLATION_MODES = ("none", "process")
DEFAULT_CASE_TIMEOUT = {"gpu": 600.0, "cpu": 900.0}
# Options whose presence on the command line makes a run a conformance run by itself.
CONFORMANCE_OPTIONS = ("--kernel", "--case-set", "--case-id", "--list-kernels", "--conformance-report",
                       "--require-cases", "--ledger", "--gpu-class", "--isolation", "--case-timeout",
                       "--perf-baseline-dir", "--perf-record", "--perf-require-baseline",
                       "--fuzz-examples", "--fuzz-seed", "--fuzz-database", "--fuzz-shrink-seconds")


@dataclass(frozen=True)
class KernelParam:
    """One kernel under test as a test parameter (its report row reads these fields)."""
    spec: str
    kernel: object

    @property
    def name(self) -> str:
        return self.kernel.name

    def __repr__(self) -> str:  # shows in pytest's output for the parameter
        return self.name


@dataclass
class RunState:
    device: str
    gpu_class: str
    case_set: str
    kernels: list[KernelParam]
    ledger: object
    ledger_paths: list[str]
    isolation: str
    case_timeout: Optional[float]
    pyargs: bool
    require_cases: bool
    case_ids: list[str] = field(default_factory=list)
    runner: object = None  # isolation.IsolatedRunner: started by build_state, or by door.py on the first isolated case
    workers_per_device: int = 1
    device_memory: Optional[tuple[int, int]] = None  # (free, total) bytes of the device at start; None on the CPU
    perf_reference: Optional[KernelParam] = None  # --perf-reference, the perf guard's A/B reference
    ledger_named: bool = False  # by --ledger or $DECODE_CONFORMANCE_LEDGER: the adopter's, not the shipped one
    extra_case_paths: list[str] = field(default_factory=list)  # --extra-cases (extra_cases.py)

    @property
    def repro_ledgers(self) -> tuple[str, ...]:
        """The ledgers a reproduce line names: an xfail, a strict XPASS or a quarantine re-runs as
        such only under the same ledger, and a CI log's line is pasted where no variable is set."""
        return tuple(self.ledger_paths) if self.ledger_named else ()

    @property
    def profile(self) -> str:
        return devices.profile_of(self.device)

    @property
    def device_type(self) -> str:
        return devices.device_type(self.device)

    @cached_property
    def set_cases(self) -> list:
        """The case set with the adopter's --extra-cases, validated when the state was built."""
        from .extra_cases import cases_of
        return cases_of(self.case_set, self.profile, self.extra_case_paths)

    @cached_property
    def cases(self) -> list:
        """The cases this run runs: the set after the --case-id filter."""
        cases = self.set_cases
        if self.case_ids:
            wanted = set(self.case_ids)
            cases = [c for c in cases if c.id in wanted]
        return cases

    def scenario_cases(self, scenario: str) -> list:
        """The fixed cases of a scenario (scenarios.py) for this profile, after --case-id."""
        from .scenarios import get
        cases = [c for group in get(scenario).fixed_cases(self.profile) for c in group]
        if self.case_ids:
            wanted = set(self.case_ids)
            cases = [c for c in cases if c.id in wanted]
        return cases

    def repro_target(self, node, here: pathlib.Path) -> str:
        """How a reproduce line names the test function `node` runs: `module::function` under
        --pyargs, else `path::function` relative to `here`, the folder pytest was invoked from
        (config.invocation_params.dir), where the line is pasted - not the rootdir, which a run
        of `pytest parity` from suites/ or of a checkout's suite from another folder leaves
        elsewhere; absolute when the file is outside `here`. The function, not its folder or
        file: each other test there would report the filtered-out case as a skip ("got empty
        parameter set")."""
        path = node.path
        if self.pyargs:
            parts = path.with_suffix("").parts
            i = max(i for i, p in enumerate(parts) if p == "suites")
            where = ".".join((SUITES_PACKAGE,) + parts[i + 1:])
        else:
            here, path = pathlib.Path(here).resolve(), path.resolve()
            where = str(path.relative_to(here) if path.is_relative_to(here) else path)
        return f"{where}::{node.originalname}"

    def case_marks(self, kp: KernelParam, case, scenario: str = "parity") -> list:
        """Skips (the scenario does not apply, missing capability, memory, fp8 MMA on a class
        without it) and ledger marks."""
        from .memory import case_bytes
        from .scenarios import why_not_run
        marks = [pytest.mark.decode_case]
        why = why_not_run(scenario, kp.kernel, case, self.device)
        if why:
            return marks + [pytest.mark.skip(reason=why)]
        need = case_bytes(case)
        marks.append(pytest.mark.min_gpu_memory(round(need / 2**30, 2)))
        if self.device_memory is not None:
            from .device_memory import case_budget, runs_in_slot
            budget = case_budget(need, *self.device_memory, self.workers_per_device)
            if need > budget:
                where = ("for a heavy case's slot" if runs_in_slot(need, self.workers_per_device) else
                         "free for this worker" + (f" (one of {self.workers_per_device} workers on it)"
                                                   if self.workers_per_device > 1 else ""))
                return marks + [pytest.mark.skip(reason=f"needs {need / 2**30:.1f} GB of device memory; "
                                                        f"{budget / 2**30:.1f} GB {where}")]
        cls = hardware.known_classes().get(self.gpu_class)
        if case.is_fp8 and kp.kernel.caps.fp8_mma:
            marks.append(pytest.mark.fp8_tensor_cores)
            if cls is not None and cls.vendor != "cpu" and not cls.fp8_tensor_cores:
                return marks + [pytest.mark.skip(reason=f"{kp.name} runs fp8 MMAs; class {self.gpu_class} has no fp8 "
                                                        "tensor cores")]
        entry = self.ledger.match(kp.name, case.id, self.gpu_class)
        if entry is not None:
            marks.append(entry.mark())
        return marks


# ---- is this a conformance run? ----------------------------------------------------------

def _suites_dirs() -> list[pathlib.Path]:
    try:
        spec = importlib.util.find_spec(SUITES_PACKAGE)
    except (ModuleNotFoundError, ValueError):
        spec = None
    dirs = [pathlib.Path(p).resolve() for p in (spec.submodule_search_locations or [])] if spec else []
    from ._paths import checkout_root
    root = checkout_root()
    if root is not None and (root / "suites").is_dir():
        dirs.append((root / "suites").resolve())
    return dirs


def conformance_requested(config) -> bool:
    """True when the command line names a conformance suite (a path inside it, or a module
    under `decode_conformance.suites` with --pyargs) or one of the conformance options."""
    argv = list(config.invocation_params.args)
    if any(a == opt or a.startswith(opt + "=") for a in argv for opt in CONFORMANCE_OPTIONS):
        return True
    args = list(config.args)
    if config.getoption("pyargs", False) and any(a.split("::")[0].startswith(SUITES_PACKAGE) for a in args):
        return True
    dirs = _suites_dirs()
    for a in args:
        p = pathlib.Path(config.invocation_params.dir, a.split("::")[0]).resolve()
        for d in dirs:
            if p == d or d in p.parents or p in d.parents:
                return True
    return False


# ---- building the state --------------------------------------------------------------------

# The device the xdist controller detected, handed to each worker (plugin.pytest_configure_node):
# a worker then starts its isolated worker before importing torch itself.
WORKER_DEVICE_KEY = "decode_conformance_device"


def _device(config) -> str:
    opt = config.getoption("--device")
    if not opt:
        told = (getattr(config, "workerinput", None) or {}).get(WORKER_DEVICE_KEY)
        return told or ("cuda" if hardware.has_gpu() else "cpu")
    if opt != "cpu" and not opt.startswith("cuda"):
        raise pytest.UsageError(f"--device: expected cpu, cuda or cuda:N, got {opt!r}")
    if opt.startswith("cuda") and not hardware.has_gpu():
        raise pytest.UsageError(f"--device={opt}: this machine has no CUDA/ROCm GPU visible to torch "
                                "(use --device=cpu, or leave --device out to choose automatically)")
    if opt.startswith("cuda:"):
        idx = opt.split(":", 1)[1]
        if not idx.isdigit() or int(idx) >= hardware.gpu_count():
            raise pytest.UsageError(f"--device={opt}: expected cuda:N with N < {hardware.gpu_count()} "
                                    "(the GPUs visible to this process)")
    return opt


def resolve_isolation(device: str, isolation: Optional[str], timeout: Optional[float]) -> tuple[str, Optional[float]]:
    """(--isolation, --case-timeout) after defaults: process isolation and 600 s on a GPU,
    none and 900 s on cpu (where kernels are plain Python under the interpreter and a
    worker process would only cost time). A timeout of 0 means none (returned as None)."""
    kind = "cpu" if devices.is_cpu(device) else "gpu"
    isolation = isolation or ("none" if kind == "cpu" else "process")
    if isolation not in ISOLATION_MODES:
        raise pytest.UsageError(f"--isolation: expected one of {ISOLATION_MODES}, got {isolation!r}")
    timeout = DEFAULT_CASE_TIMEOUT[kind] if timeout is None else float(timeout)
    if timeout < 0:
        raise pytest.UsageError(f"--case-timeout: expected seconds >= 0 (0 = none), got {timeout:g}")
    return isolation, (timeout or None)


def _jit_functions_not_interpreted(module_names: list[str]) -> list[str]:
    """Triton kernels defined before TRITON_INTERPRET=1 took effect (compiled-mode JITFunctions
    in modules of the given packages)."""
    try:
        from triton.runtime.jit import JITFunction
    except Exception:
        return []
    found = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not any(name == m or name.startswith(m + ".") for m in module_names):
            continue
        for attr, val in list(vars(mod).items()):
            if type(val) is JITFunction:
                found.append(f"{name}.{attr}")
    return found


def kernel_source(config) -> str:
    """Where the kernel specs of this run come from, as a usage error should name it."""
    from .discovery import ENV_VAR
    if any(config.getoption("--kernel") or ()):
        return "--kernel"
    if os.environ.get(ENV_VAR, "").strip():
        return ENV_VAR
    return "the decode_conformance.kernels entry points"


def _load_kernels(specs: list[str], device: str, source: str = "--kernel") -> list[KernelParam]:
    from .kernel_api import KernelLoadError, load_kernel
    preloaded = {s.split(":", 1)[0] for s in specs if s.split(":", 1)[0] in sys.modules}
    out, errors = [], []
    for spec in specs:
        try:
            out.append(KernelParam(spec, load_kernel(spec)))
        except KernelLoadError as e:
            errors.append(str(e))
    if errors:
        raise pytest.UsageError(f"{source}: " + "\n\n".join(errors))
    names = [k.name for k in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise pytest.UsageError(f"{source}: two kernels are named {dup}; names key results and ledgers, "
                                "so each kernel under test needs its own")
    if device == "cpu":
        packages = sorted({s.split(":", 1)[0].split(".")[0] for s in specs})
        stale = _jit_functions_not_interpreted(packages)
        if stale:
            early = sorted(preloaded) or packages
            raise pytest.UsageError(
                f"kernel module(s) {early} defined Triton kernels before decode-conformance could switch on "
                f"Triton's interpreter (TRITON_INTERPRET=1) for this CPU run, so they would run compiled, not "
                f"interpreted: {stale[:3]}. Set TRITON_INTERPRET=1 in the environment before pytest starts, or "
                "keep conftest.py files and earlier plugins from importing the kernel module.")
    return out


def _validate_case_selection(case_set: str, case_ids: list[str], profile: str, extra_paths: list[str]) -> None:
    from .case_sets import TRACE_PREFIX, set_names
    from .extra_cases import ExtraCasesError, cases_of
    try:
        cases = cases_of(case_set, profile, extra_paths)
    except ExtraCasesError as e:
        raise pytest.UsageError(f"--extra-cases: {e}") from None
    except ValueError as e:
        raise pytest.UsageError(f"--case-set={case_set}: {e}") from None
    if not case_ids:
        return
    if case_set == "fuzz":
        raise pytest.UsageError("--case-id with --case-set=fuzz: fuzz mode draws its cases; re-run one drawn case "
                                "with the 'reproduce this case' line it printed (python -m decode_conformance.fuzz "
                                "--case ...)")
    from .scenarios import fixed_cases

    def ids(prof: str, listed: list) -> set:
        return {c.id for c in listed} | {c.id for cs in fixed_cases(prof).values() for c in cs}

    known = ids(profile, cases)
    unknown = [w for w in case_ids if w not in known]
    if not unknown:
        return
    other = "gpu" if profile == "interpreter" else "interpreter"
    try:
        other_ids = ids(other, cases_of(case_set, other, extra_paths))
    except ValueError:
        other_ids = ids(other, [])
    lines = []
    for w in unknown:
        if w in other_ids:
            lines.append(f"  {w}: a {other}-profile case (this run uses the {profile} profile: "
                         f"{'run it on a GPU' if other == 'gpu' else 'run it with --device=cpu'})")
            continue
        near = difflib.get_close_matches(w, sorted(known), n=3, cutoff=0.6)
        lines.append(f"  {w}: not in case set {case_set!r} ({profile})" +
                     (f"; nearest: {', '.join(near)}" if near else ""))
    raise pytest.UsageError("--case-id: unknown case id(s)\n" + "\n".join(lines) +
                            f"\n(case sets: {', '.join(set_names())}, {TRACE_PREFIX}PATH; your own cases: "
                            "--extra-cases=PATH)")


def _device_memory(device: str) -> Optional[tuple[int, int]]:
    """(free, total) bytes of the run's device, read once at the start."""
    if device == "cpu":
        return None
    from .device_memory import free_and_total
    return free_and_total(device)


def workers_sharing_device() -> int:
    """xdist workers pinned to the same GPU as this one (1 outside xdist), as the pinning hook
    told this worker. Not the user's DECODE_CONFORMANCE_WORKERS_PER_GPU: that is a request to the
    controller, and a run without xdist while it is exported is still alone on its GPU."""
    from .xdist_pinning import SHARING_ENV
    try:
        return max(1, int(os.environ.get(SHARING_ENV, "1")))
    except ValueError:
        return 1


def check_report_path(path: Optional[str]) -> None:
    """--conformance-report is written after the last case: a path that cannot be written is a
    usage error now, not a traceback after the whole run."""
    if not path:
        return
    from .report import report_base
    base = report_base(path)
    for target in (base.with_suffix(".json"), base.with_suffix(".md")):
        if target.is_dir():
            raise pytest.UsageError(f"--conformance-report={path}: {target} is a directory; expected PATH such "
                                    "that PATH.json and PATH.md can be written (e.g. reports/conformance)")
    parent = base.parent.absolute()
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir():
        raise pytest.UsageError(f"--conformance-report={path}: {existing} is a file, not a directory, so "
                                f"{base.with_suffix('.json')} cannot be written; expected PATH in a directory "
                                "that exists or can be created")
    # Try it: permission bits say nothing for root, and some places (/proc, a read-only mount)
    # refuse whatever they say. The folders are made now (the report would make them anyway).
    import tempfile
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=base.parent, prefix=".dc-report-probe-"):
            pass
    except OSError as e:
        raise pytest.UsageError(f"--conformance-report={path}: cannot write in {base.parent} "
                                f"({e.strerror or e}); expected PATH in a directory this user can create and "
                                "write") from None


def _check_spec_syntax(specs: list[str], source: str) -> None:
    """The mistakes visible without importing anything (torch takes seconds to import): a
    spec without ':' or naming a top-level package that does not exist."""
    from .discovery import missing_module
    bad = [problem for problem in map(missing_module, specs) if problem]
    if bad:
        raise pytest.UsageError(f"{source}: " + "\n\n".join(bad))


def preflight(config) -> None:
    """The checks that need neither torch nor Triton, made before either is imported."""
    if not hasattr(config, "workerinput"):  # the controller writes the report; workers need not try
        check_report_path(config.getoption("--conformance-report"))
    if config.getoption("--isolation") not in (None, *ISOLATION_MODES):
        raise pytest.UsageError(f"--isolation: expected one of {ISOLATION_MODES}, got {config.getoption('--isolation')!r}")
    timeout = config.getoption("--case-timeout")
    if timeout is not None and float(timeout) < 0:
        raise pytest.UsageError(f"--case-timeout: expected seconds >= 0 (0 = none), got {float(timeout):g}")
    from .discovery import kernel_specs
    _check_spec_syntax(kernel_specs(config.getoption("--kernel")), kernel_source(config))
    reference = _perf_reference_spec(config)
    if reference:
        _check_spec_syntax([reference], PERF_REFERENCE_SOURCE)


# An A/B run's reference is most often the base commit's copy of the package under test,
# installed under another import name: a usage error about it says so.
PERF_REFERENCE_SOURCE = ("--perf-reference (the A/B reference: in CI, the base commit's copy of your package "
                         "installed under another import name, docs/perf-guard.md)")


def _perf_reference_spec(config) -> Optional[str]:
    from .discovery import kernel_specs
    spec = config.getoption("--perf-reference", None)
    return kernel_specs([spec])[0] if spec else None


def build_state(config, runs_cases: bool = True) -> RunState:
    """Everything the run needs, validated. Raises pytest.UsageError naming the mistake.

    `runs_cases`: this process runs cases (not the controller of xdist workers). It then reads
    the device's memory (the cases' budgets) and, under --isolation=process, starts its isolated
    worker as soon as the device is known: that process's start-up (torch, Triton, the CUDA
    context, the run's kernels) then overlaps the rest of this one's (the kernels, the memory
    read, collection). On a 12-worker GPU run each worker took 4.4-5.3 s from its start to its
    isolated worker's, and that one 4.4-4.8 s more to its first launch, while every worker's
    first test waited for the slowest worker's collection (docs/gpu-runs/2026-12-06-h100-s39)."""
    preflight(config)
    from .ledger import ENV_VAR as LEDGER_ENV_VAR, Ledger, LedgerError, default_ledger_paths
    ledger_paths = list(config.getoption("--ledger") or default_ledger_paths())
    ledger_named = bool(config.getoption("--ledger") or os.environ.get(LEDGER_ENV_VAR, "").strip())
    try:
        ledger = Ledger.load(ledger_paths)
        ledger.check_classes(hardware.known_classes())
    except LedgerError as e:
        raise pytest.UsageError(f"--ledger: {e}") from None
    device = _device(config)
    if device == "cpu":
        # Must precede the definition of any kernel's Triton functions in this process; the
        # isolation worker runs the same function.
        from .devices import use_interpreter
        use_interpreter()
    elif os.environ.get("TRITON_INTERPRET") == "1":
        raise pytest.UsageError("TRITON_INTERPRET=1 is set but --device is a GPU: unset it or pass --device=cpu")
    isolation, timeout = resolve_isolation(device, config.getoption("--isolation"), config.getoption("--case-timeout"))
    from .kernel_api import kernel_specs
    specs = kernel_specs(config.getoption("--kernel"))
    runner = None
    if runs_cases and isolation == "process":
        from .isolation import IsolatedRunner
        runner = IsolatedRunner(device, timeout, preload=tuple(specs))
        runner.start()
    try:
        gpu_class = config.getoption("--gpu-class") or (hardware.CPU_CLASS if device == "cpu" else hardware.detect_class())
        if gpu_class not in hardware.known_classes():
            raise pytest.UsageError(f"--gpu-class={gpu_class}: not a row of the GPU class table; expected one of "
                                    f"{sorted(hardware.known_classes())}")
        profile = devices.profile_of(device)
        case_set = config.getoption("--case-set") or os.environ.get("DECODE_CONFORMANCE_CASE_SET") or "parity"
        case_ids = list(config.getoption("--case-id") or [])
        from .extra_cases import paths_from
        extra_case_paths = paths_from(config.getoption("--extra-cases"))
        _validate_case_selection(case_set, case_ids, profile, extra_case_paths)
        kernels = _load_kernels(specs, device, kernel_source(config))
        # loaded here, not by the perf suite's session fixture: a reference that does not load is
        # then one usage error before collection, as a --kernel is
        reference = _perf_reference_spec(config)
        perf_reference = _load_kernels([reference], device, PERF_REFERENCE_SOURCE)[0] if reference else None
        # the cases' memory skips: wherever cases are collected (not xdist's controller)
        memory = _device_memory(device) if runs_cases or config.option.collectonly else None
    except BaseException:
        if runner is not None:
            runner.close()
        raise
    return RunState(device=device, gpu_class=gpu_class, case_set=case_set, kernels=kernels, ledger=ledger,
                    ledger_paths=ledger_paths, ledger_named=ledger_named, isolation=isolation, case_timeout=timeout,
                    pyargs=bool(config.getoption("pyargs", False)),
                    require_cases=bool(config.getoption("--require-cases")), case_ids=case_ids, runner=runner,
                    workers_per_device=workers_sharing_device(), device_memory=memory, perf_reference=perf_reference,
                    extra_case_paths=extra_case_paths)


def list_kernels(config) -> int:
    """--list-kernels: every kernel spec with its capabilities, or why it does not load. Exit
    code 0 when all load, pytest's usage-error code otherwise."""
    if _device(config) == "cpu":
        from .devices import use_interpreter
        use_interpreter()
    from .kernel_api import KernelLoadError, kernel_specs, load_kernel
    bad = 0
    specs = kernel_specs(config.getoption("--kernel"))
    if not config.getoption("--kernel"):  # the opt-in kernels and adapters too: whether each library is present
        from .discovery import listed_opt_in_specs
        specs += [s for s in listed_opt_in_specs() if s not in specs]
    for spec in specs:
        try:
            k = load_kernel(spec)
        except KernelLoadError as e:
            bad += 1
            print(f"{spec}\n    NOT LOADED: " + str(e).replace("\n", "\n    "))
            continue
        lib = f" [{k.library_version}]" if getattr(k, "library_version", None) else ""
        print(f"{k.name:16s} {spec}{lib}\n    {k.caps.describe()}")
    return int(pytest.ExitCode.USAGE_ERROR) if bad else 0

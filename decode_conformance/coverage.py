"""Pairwise coverage of a case set, per kernel and profile.

    python -m decode_conformance.coverage                    # parity set, both profiles, every kernel
    python -m decode_conformance.coverage --check            # ... exit 1 below 100 %, or on stale rows
    python -m decode_conformance.coverage --profile gpu --kernel mypkg.mod:MyDecode --missing 20

A pair is two values of two axes of the axis table (case_sets.AXES). It is *valid* for a
kernel when some case that can exist (case_sets.constraints) holds both values and every
value of it is one the kernel can run (its Capabilities, `case_sets.value_domains`). It is
*covered* when a case of the set holds it and the kernel runs that case - the case is not
skipped for a missing capability, nor (GPU profile) for fp8 MMAs on a class without fp8
tensor cores. Cases are read back into axis values with `case_sets.classify`, so regression
and trace cases count too. The kernels: the shipped ones (kernel_api.shipped_specs(): an
entry point added there is picked up) and the opt-in torch_sdpa, or those given.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Optional

OPT_IN = ("decode_conformance_kernels.registry:torch_sdpa",)
DEFAULT_CLASS = {"interpreter": "cpu", "gpu": "sm_90"}


@dataclass
class KernelCoverage:
    kernel: str
    profile: str
    covered: int = 0
    valid: int = 0
    cases_run: int = 0
    missing: list = field(default_factory=list)  # uncovered valid pairs
    unavailable: Optional[str] = None

    @property
    def percent(self) -> float:
        return 100.0 * self.covered / self.valid if self.valid else 100.0

    @property
    def complete(self) -> bool:
        return self.unavailable is not None or self.covered == self.valid


def default_specs() -> list[str]:
    from .kernel_api import shipped_specs
    out = list(shipped_specs())
    return out + [s for s in OPT_IN if s not in out]


def _runs(kernel, case, device_type: str, gpu_class: str) -> bool:
    caps = kernel.caps
    if caps.missing_for(case, device_type):
        return False
    if case.is_fp8 and caps.fp8_mma:
        from . import hardware
        cls = hardware.known_classes().get(gpu_class)
        if cls is not None and cls.vendor != "cpu" and not cls.fp8_tensor_cores:
            return False
    return True


def kernel_coverage(kernel, cases, profile: str, gpu_class: Optional[str] = None) -> KernelCoverage:
    from . import case_sets as cs
    from .pairwise import CoveringProblem
    res = KernelCoverage(kernel.name, profile)
    if kernel.caps.unavailable:
        res.unavailable = kernel.caps.unavailable
        return res
    from .devices import device_type_of_profile
    device_type = device_type_of_profile(profile)
    gpu_class = gpu_class or DEFAULT_CLASS[profile]
    problem = CoveringProblem(cs.AXES, cs.constraints(), {"k": cs.value_domains(kernel.caps, device_type)})
    targets = set(problem.targets()["k"])
    covered = set()
    for c in cases:
        if _runs(kernel, c, device_type, gpu_class):
            res.cases_run += 1
            covered.update(problem.row_pairs(cs.classify(c, profile), problem.order))
    res.valid = len(targets)
    res.covered = len(targets & covered)
    res.missing = sorted(targets - covered)
    return res


def compute(specs: list[str], profiles: list[str], case_set: str = "parity",
            gpu_class: Optional[str] = None) -> list[KernelCoverage]:
    from .case_sets import build_set
    from .kernel_api import load_kernel
    kernels = [load_kernel(s) for s in specs]
    out = []
    for profile in profiles:
        cases = build_set(case_set, profile)
        for k in kernels:
            out.append(kernel_coverage(k, cases, profile, gpu_class))
    return out


def format_pair(p) -> str:
    (a, va), (b, vb) = p
    return f"{a}={va} x {b}={vb}"


def report(results: list[KernelCoverage], missing: int = 5) -> str:
    lines = [f"{'profile':<12} {'kernel':<24} {'pairs covered / valid':>22} {'':>8}  cases run"]
    for r in results:
        if r.unavailable:
            lines.append(f"{r.profile:<12} {r.kernel:<24} {'unavailable':>22} {'':>8}  ({r.unavailable})")
            continue
        lines.append(f"{r.profile:<12} {r.kernel:<24} {f'{r.covered} / {r.valid}':>22} {r.percent:7.2f}%  {r.cases_run}")
        for p in r.missing[:missing]:
            lines.append(f"{'':<12}   not covered: {format_pair(p)}")
        if len(r.missing) > missing:
            lines.append(f"{'':<12}   ... and {len(r.missing) - missing} more (--missing N)")
    return "\n".join(lines)


def stale_rows(path=None) -> str:
    """Why the shipped covering rows (case_sets.PAIRWISE_FILE, or `path`) would not be read, ''
    when they would. Coverage is computed from the axis table either way (stale rows are
    generated again in every process), so only this says that they need writing."""
    from . import case_sets as cs
    return cs.shipped_rows(cs.covering_problem(), path)[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decode_conformance.coverage", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=("interpreter", "gpu", "both"), default="both")
    ap.add_argument("--kernel", action="append", default=[], metavar="PKG.MODULE:OBJ",
                    help="kernel spec or entry-point name (repeatable); default: the shipped kernels and torch_sdpa")
    ap.add_argument("--case-set", default="parity", help="case set to measure (default parity)")
    ap.add_argument("--gpu-class", default=None,
                    help="GPU class whose fp8-MMA skips apply (default: cpu for the interpreter profile, sm_90 for gpu)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a kernel covers less than 100 %% of its pairs, "
                         "or the shipped covering rows are stale")
    ap.add_argument("--missing", type=int, default=5, help="uncovered pairs to list per kernel (default 5)")
    args = ap.parse_args(argv)
    from . import _paths
    _paths.alias_checkout()
    from .devices import use_interpreter
    use_interpreter()  # kernel modules are imported for their capabilities; nothing is launched
    from .kernel_api import kernel_specs
    specs = kernel_specs(args.kernel, env="") if args.kernel else default_specs()
    profiles = ["interpreter", "gpu"] if args.profile == "both" else [args.profile]
    results = compute(specs, profiles, args.case_set, args.gpu_class)
    print(f"pairwise coverage of case set {args.case_set!r} (axes: decode_conformance/case_sets.py AXES)")
    print(report(results, args.missing))
    short = [r for r in results if not r.complete]
    if short:
        print(f"\n{len(short)} kernel/profile row(s) below 100 %", file=sys.stderr)
    stale = stale_rows() if args.check else ""
    if stale:
        print(f"\n{stale}", file=sys.stderr)
    return 1 if (args.check and (short or stale)) else 0


if __name__ == "__main__":
    raise SystemExit(main())

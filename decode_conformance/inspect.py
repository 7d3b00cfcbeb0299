"""One case outside pytest: its inputs from its id, a kernel run on them, the verdict, the tensors.

    python -m decode_conformance.inspect CASE_ID --kernel=mypkg.conformance:MyDecode --save case.pt

does what the parity test of that case does (the same factories, reference, budget and
judge: runner.run_case) and prints the verdict with the worst row, its budget and why the
case exists. A scenario's case id (`determinism-...`, `batch-invariance-...`, as their
failures print them) runs that scenario instead. `--save` writes every tensor (inputs as the kernel saw them, the float64
reference, the tier's torch result, the kernel's output and LSE) to one `torch.load`-able
file. Without --kernel it builds the inputs and the reference only.

From Python:

    from decode_conformance import inspect as dci
    opened = dci.open_case("fi3864-bf16-...")           # case, batch, reference, tier
    result = dci.run_one("mypkg.conformance:MyDecode", "fi3864-bf16-...")
    print(result.message); result.output       # the kernel's output tensor

Exit status of the command: 0 the case passed (or no kernel was given), 1 it failed, 4 a usage
error (an unknown case id: the nearest are suggested; a kernel spec that does not load), 5 the
kernel does not run this case: the tests skip it for the reason printed (a capability it does
not declare, a scenario that does not apply); `--force` runs it anyway.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from dataclasses import dataclass
from typing import Optional

USAGE_ERROR = 4
NOT_RUN = 5  # as pytest's "no tests ran": the case is one the tests skip for this kernel
DEFAULT_MAX_SAVE_GIB = 1.0  # --save: the 2^31-element pool cases are ~4 GiB


class UsageError(ValueError):
    pass


def _device(device: Optional[str]) -> str:
    from ._paths import alias_checkout
    alias_checkout()  # a checkout that is not pip-installed imports like the installed package
    if device:
        return device
    from .hardware import has_gpu
    return "cuda" if has_gpu() else "cpu"


def find_scenario_case(case_id: str, case_set: str = "parity", device: Optional[str] = None,
                       extra_cases: Optional[list] = None):
    """(scenario name, Case) for this id: a case of `case_set` or of the adopter's `extra_cases`
    files (default: $DECODE_CONFORMANCE_EXTRA_CASES; scenario "parity"), or a fixed case of another
    scenario (`determinism-...`, `batch-invariance-...`: their ids name them), built for the
    device's profile (interpreter on cpu)."""
    from . import extra_cases as extra
    from .devices import profile_of
    from .scenarios import case_by_id, fixed_cases
    dev = _device(device)
    profile = profile_of(dev)
    if case_id.lstrip().startswith("{"):  # a drawn case has no fixed id: the fuzz output's --case JSON
        return "parity", _case_from_json(case_id)
    found = case_by_id(case_id, profile)
    if found is not None:
        return found
    try:
        cases = extra.cases_of(case_set, profile, extra.paths_from(extra_cases or []))
    except extra.ExtraCasesError as e:
        raise UsageError(f"--extra-cases: {e}") from None
    except ValueError as e:
        raise UsageError(f"case set {case_set!r}: {e}") from None
    for c in cases:
        if c.id == case_id:
            return "parity", c
    known = [c.id for c in cases] + [c.id for cs in fixed_cases(profile).values() for c in cs]
    near = difflib.get_close_matches(case_id, known, n=3, cutoff=0.6)
    # a fuzz find prints an id like any other ("shrunk to ..."), but no set holds it
    json_form = "its JSON, the --case argument of the fuzz output's 'reproduce this case' line"
    drawn = (f"; a fuzz find has no fixed id: pass {json_form}" if case_set == "fuzz"
             else f"; for a fuzz find, pass {json_form}; for a trace's case, --case-set=trace:PATH; for one of "
                  "your own, --extra-cases=PATH")
    raise UsageError(f"case id {case_id!r}: not in case set {case_set!r} nor a scenario's case ({profile} profile)"
                     + (f"; nearest: {', '.join(near)}" if near and case_set != "fuzz" else "") + drawn)


def _case_from_json(text: str):
    import json

    from .cases import Case
    try:
        return Case.from_dict(json.loads(text))
    except (ValueError, TypeError) as e:
        raise UsageError(f"case JSON: {e}") from None


def find_case(case_id: str, case_set: str = "parity", device: Optional[str] = None,
              extra_cases: Optional[list] = None):
    """The Case with this id (see find_scenario_case)."""
    return find_scenario_case(case_id, case_set, device, extra_cases)[1]


def load(kernel, device: Optional[str] = None):
    """A kernel from a spec ('pkg.module:obj' or a registered name such as 'lean') or an object;
    on cpu Triton's interpreter is switched on first, as the plugin does."""
    if _device(device) == "cpu":
        from .devices import use_interpreter
        use_interpreter()
    from .kernel_api import KernelLoadError, kernel_specs, load_kernel, resolve_kernel
    try:
        if isinstance(kernel, str):
            return load_kernel(kernel_specs([kernel])[0])
        return resolve_kernel(kernel, repr(kernel))
    except KernelLoadError as e:
        raise UsageError(str(e)) from None


@dataclass
class OpenedCase:
    case: object  # cases.Case
    batch: object  # batch.DecodeBatch: what the kernel receives
    reference: object  # reference.Reference: float64 out / lse, visible keys per request
    tier: object  # reference.TierResult: the same attention by torch at the kernel's precision tier


def open_case(case_id: str, kernel=None, device: Optional[str] = None, case_set: str = "parity",
              extra_cases: Optional[list] = None) -> OpenedCase:
    """A case's inputs (in `kernel`'s window convention; counts-current without one) and its
    yardstick, computed from the pristine inputs as a run does."""
    from .runner import prepare, yardstick
    dev = _device(device)
    k = load(kernel, dev) if kernel is not None else _NoKernel()
    case = find_case(case_id, case_set, dev, extra_cases)
    batch = prepare(k, case, dev)
    ref, tier = yardstick(k, case, batch)
    return OpenedCase(case, batch, ref, tier)


class _NoKernel:
    name = "none"

    @property
    def caps(self):
        from .kernel_api import Capabilities
        return Capabilities()


def run_one(kernel, case_id: str, device: Optional[str] = None, case_set: str = "parity",
            save: Optional[str] = None, max_save_gib: float = DEFAULT_MAX_SAVE_GIB, force: bool = False):
    """runner.CaseResult of `kernel` on the case (the kernel's output in result.output). A
    scenario's case (`determinism-...`) runs that scenario, as its test does; `save` then writes
    the tensors of one plain launch of it (what the scenario's first launch sees). A case the
    tests skip for this kernel (a capability it does not declare) is not launched: status
    "skipped", the reason in result.message; `force` launches it anyway."""
    dev = _device(device)
    return _run(load(kernel, dev), *find_scenario_case(case_id, case_set, dev), dev, save, max_save_gib, force)


def _run(k, scenario: str, case, dev: str, save: Optional[str], max_save_gib: float, force: bool = False):
    from .runner import CaseResult, run_case
    from .scenarios import why_not_run
    why = "" if force else why_not_run(scenario, k, case, dev)
    if why:  # judged against a contract the kernel never claimed, it would read as a failure
        return CaseResult(kernel=k.name, case_id=case.id, status="skipped", scenario=scenario,
                          message=f"not run: {why} (the tests skip this case for this kernel; --force runs it)")
    if save is None:
        if scenario != "parity":
            from .scenarios import run
            return run(scenario, k, case, dev)
        return run_case(k, case, dev, keep_output=True)
    from .runner import prepare, run_prepared, yardstick
    batch = prepare(k, case, dev)
    check_save_size(batch, max_save_gib)  # before the float64 reference of a multi-GiB pool
    ref, tier = yardstick(k, case, batch)
    inputs = _host_copies(batch.inputs())
    res = run_prepared(k, case, batch, ref, tier, keep_output=True)
    save_tensors(save, OpenedCase(case, batch, ref, tier), inputs, res)
    return res


def check_save_size(batch, max_gib: float = DEFAULT_MAX_SAVE_GIB) -> None:
    """--save writes the whole KV pools: a 2^31-element pool case (`pool2049M`) is GiBs. Refuse
    past `max_gib`, saying how much and how to allow it."""
    size = sum(t.numel() * t.element_size() for t in batch.inputs().values() if t is not None)
    if size > max_gib * 2 ** 30:
        raise UsageError(f"--save would write {size / 2 ** 30:.1f} GiB (this case's KV pools; --max-save-gib is "
                         f"{max_gib:g}); pass --max-save-gib={size / 2 ** 30 + 0.5:.0f} to write it anyway")


def _host_copies(tensors: dict) -> dict:
    return {name: (t.detach().cpu().clone() if t is not None else None) for name, t in tensors.items()}


def save_tensors(path: str, opened: OpenedCase, inputs: Optional[dict] = None, result=None) -> None:
    """One torch.save file: the case id and fields, the inputs, the reference, the tier's result,
    and the kernel's output / LSE / verdict when a result is given."""
    import dataclasses

    import torch
    b = opened.batch
    data = {
        "case_id": opened.case.id,
        "case": {f.name: getattr(opened.case, f.name) for f in dataclasses.fields(opened.case)},
        "inputs": inputs if inputs is not None else _host_copies(b.inputs()),
        "scalars": {"sm_scale": b.sm_scale, "k_scale": b.k_scale, "v_scale": b.v_scale, "softcap": b.softcap,
                    "window": b.window, "page_size": b.page_size, "seq_lens_host": list(b.seq_lens_host)},
        "reference": {"out": opened.reference.out.cpu(), "lse": opened.reference.lse.cpu(),
                      "visible": opened.reference.visible.cpu()},
        "tier": {"out": opened.tier.out.cpu(),
                 "lse": opened.tier.lse.cpu() if opened.tier.lse is not None else None},
    }
    if result is not None:
        data["kernel"] = {"name": result.kernel, "status": result.status, "message": result.message,
                          "out": result.output,
                          "lse": b.lse.detach().cpu().clone(),
                          "verdict": result.verdict.to_dict() if result.verdict else None}
    torch.save(data, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decode_conformance.inspect",
                                 description="build one conformance case from its id, run a kernel on it, "
                                             "print the verdict, save the tensors")
    ap.add_argument("case_id", help="a case id, as a failure's reproduce line prints it, or a case's JSON (a fuzz "
                                    "find: the --case argument of the fuzz output's 'reproduce this case' line)")
    ap.add_argument("--kernel", default=None,
                    help="pkg.module:obj or a registered name (e.g. lean); without it only the inputs and the "
                         "reference are built")
    ap.add_argument("--case-set", default="parity", help="the set the id comes from (default: parity; a trace's "
                                                          "case: trace:PATH)")
    ap.add_argument("--extra-cases", action="append", default=[], metavar="PATH",
                    help="your own cases files, searched after the set (repeatable; default: "
                         "$DECODE_CONFORMANCE_EXTRA_CASES)")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N; default: cuda when a GPU is visible")
    ap.add_argument("--save", default=None, metavar="FILE.pt", help="write every tensor to FILE.pt (torch.save)")
    ap.add_argument("--force", action="store_true",
                    help="run the kernel even on a case the tests skip for it (a capability it does not declare)")
    ap.add_argument("--max-save-gib", type=float, default=DEFAULT_MAX_SAVE_GIB, metavar="N",
                    help=f"refuse a --save larger than N GiB (default {DEFAULT_MAX_SAVE_GIB:g}; the 2^31-element pool "
                         "cases are ~4 GiB)")
    a = ap.parse_args(argv)
    try:
        if a.kernel is None:
            opened = open_case(a.case_id, None, a.device, a.case_set, a.extra_cases)
            r = opened.reference
            print(f"{opened.case.id}: {opened.case.batch} requests, visible keys {r.visible.tolist()}, "
                  f"out {tuple(r.out.shape)}, device {opened.batch.device}")
            if opened.case.note:
                print(f"  why this case exists: {opened.case.note}")
            if a.save:
                check_save_size(opened.batch, a.max_save_gib)
                save_tensors(a.save, opened)
                print(f"  tensors: {a.save}")
            return 0
        dev = _device(a.device)
        kernel = load(a.kernel, dev)
        scenario, case = find_scenario_case(a.case_id, a.case_set, dev, a.extra_cases)
        res = _run(kernel, scenario, case, dev, a.save, a.max_save_gib, a.force)
    except UsageError as e:
        print(f"usage error: {e}", file=sys.stderr)
        return USAGE_ERROR
    if res.status == "skipped":
        print(f"[{res.kernel}] {res.case_id}: {res.message}")
        return NOT_RUN
    from .runner import failure_text
    print(failure_text(res, case))
    if a.save:
        print(f"  tensors: {a.save}")
    return 0 if res.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

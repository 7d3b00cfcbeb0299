"""Planted bugs the judge was not built around, wrapped around any kernel, and the study that
shows each one fails every case it affects.

A planted kernel runs a correct kernel on a slightly wrong problem (a batch transform) or
spoils its output afterwards, and declares no LSE, so only the output checks can catch it:

  out_2pct_long     output x 0.98 on the long requests only
  drop_tail_long    the long requests lose the last 1/16 of their visible keys
  sm_scale_1pct     sm_scale x 1.01
  v_2pct            V x 1.02 (v_scale x 1.02)
  out_1pct          output x 1.01 everywhere (the precision-tier test)

Two more plant an LSE error, on a correct output, so only the LSE check can catch them:

  lse_plus_1e-3     LSE + 1e-3 (natural log): a 0.1 % weight error in every merge using it
  lse_plus_3e-3     LSE + 3e-3

"Long": more than 8192 visible keys on a GPU, more than 256 on the CPU (the profiles' long
contexts). A row is *affected* when the bug moves its float64 output by more than twice the
row's error budget (metrics.row_budget: R x the tier's torch error + the row's ulp floor):
the planted kernel carries its own rounding error, up to one budget, on top of the bug. The
float64 output of the buggy problem comes from the out-of-tree toy kernel computing in
float64 on the transformed batch (checked against the reference in the self-test).

    python -m suites.selftest.planted --profile gpu --out DIR   # the H200 study, per bug x case
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
from typing import Callable, Optional

import torch

OOT = pathlib.Path(__file__).resolve().parent / "oot"
if str(OOT) not in sys.path:
    sys.path.insert(0, str(OOT))

import toy_decode  # noqa: E402

LONG_KEYS = {"cuda": 8192, "cpu": 256}
AFFECTED_FACTOR = 2.0
BUGS = ("out_2pct_long", "drop_tail_long", "sm_scale_1pct", "v_2pct")


def _visible(batch) -> list[int]:
    w = batch.window
    return [min(n, w) if w is not None else n for n in batch.seq_lens_host]


def _long_rows(batch) -> torch.Tensor:
    limit = LONG_KEYS[batch.device.type]
    return torch.tensor([v > limit for v in _visible(batch)], device=batch.device)


def _shorten_long(batch):
    """The long requests shortened by 1/16 of their visible keys (the kernel 'loses' their tail)."""
    limit = LONG_KEYS[batch.device.type]
    lens = [n - v // 16 if v > limit else n for n, v in zip(batch.seq_lens_host, _visible(batch))]
    starts = batch.kv_indptr.tolist()
    keep = [batch.kv_indices[starts[b]:starts[b] + n] for b, n in enumerate(lens)]
    indptr = torch.zeros_like(batch.kv_indptr)
    indptr[1:] = torch.tensor(lens, dtype=indptr.dtype, device=indptr.device).cumsum(0)
    return dataclasses.replace(batch, kv_indptr=indptr, kv_indices=torch.cat(keep) if keep else batch.kv_indices,
                               seq_lens=torch.tensor(lens, dtype=batch.seq_lens.dtype, device=batch.device),
                               seq_lens_host=tuple(lens))


# bug -> (batch transform, output transform applied in place)
TRANSFORMS: dict[str, tuple[Callable, Optional[Callable]]] = {
    "out_2pct_long": (lambda b: b, lambda b, out: out.mul_(torch.where(_long_rows(b), 0.98, 1.0)[:, None, None]
                                                          .to(out.dtype))),
    "drop_tail_long": (_shorten_long, None),
    "sm_scale_1pct": (lambda b: dataclasses.replace(b, sm_scale=b.sm_scale * 1.01), None),
    "v_2pct": (lambda b: dataclasses.replace(b, v_scale=b.v_scale * 1.02), None),
    "out_1pct": (lambda b: b, lambda b, out: out.mul_(1.01)),
}


class Planted:
    """`inner` with one planted bug; declares no LSE."""

    def __init__(self, inner, bug: str, name: Optional[str] = None):
        self.inner, self.bug = inner, bug
        self.name = name or f"{inner.name}+{bug}"
        self.caps = dataclasses.replace(inner.caps, lse=False)

    def plan(self, batch):
        to_batch, to_out = TRANSFORMS[self.bug]
        wrong = to_batch(batch)
        launch = self.inner.plan(wrong)

        def run():
            launch()
            if to_out is not None:
                to_out(wrong, batch.out)
        return run


LSE_BUGS = {"lse_plus_1e-3": 1e-3, "lse_plus_3e-3": 3e-3}


class LseOffset:
    """`inner` with its LSE moved by a constant (LSE_BUGS[bug], or `offset`); the output is left as
    it computed it."""

    def __init__(self, inner, bug: str, offset: Optional[float] = None):
        self.inner, self.bug, self.offset = inner, bug, LSE_BUGS[bug] if offset is None else offset
        self.name = f"{inner.name}+{bug}"
        self.caps = inner.caps

    def plan(self, batch):
        launch = self.inner.plan(batch)

        def run():
            launch()
            batch.lse.add_(self.offset)
        return run


def lse_study(inner_factory: Callable, bug: str, cases, device: str) -> Tally:
    """Run `inner + LSE offset` on every case it can run. A case is affected when the offset
    exceeds AFFECTED_FACTOR x the LSE budget of one of its rows (the kernel's own LSE error
    may take up one budget); an fp32 LSE near -5e5 cannot even carry +1e-3 (its ulp is 0.03).
    `caught` counts affected cases failing on the LSE check."""
    from decode_conformance.metrics import lse_budget
    from decode_conformance.runner import prepare, run_prepared, yardstick
    kernel = LseOffset(inner_factory(), bug)
    t = Tally(kernel=kernel.inner.name, bug=bug)
    dev_type = "cpu" if device == "cpu" else "cuda"
    for case in cases:
        if kernel.caps.missing_for(case, dev_type):
            continue
        t.cases += 1
        batch = prepare(kernel, case, device)
        ref, tier = yardstick(kernel, case, batch)
        allow = lse_budget(ref.lse, tier.lses, ref.visible, slack=tier.lse_slack)
        vis = ref.visible.to(allow.device) > 0
        hit = bool((kernel.offset > AFFECTED_FACTOR * allow)[vis].any())
        res = run_prepared(kernel, case, batch, ref, tier)
        failed = not res.ok and "LSE over budget" in res.message
        if hit:
            t.affected += 1
            if failed:
                t.caught += 1
            else:
                t.missed.append(f"{case.id}: {res.message}")
        elif failed:
            t.caught_unaffected += 1
    return t


def oracle(batch, bug: str) -> torch.Tensor:
    """The float64 output of the buggy problem (the toy kernel in float64, then the output bug)."""
    to_batch, to_out = TRANSFORMS[bug]
    wrong = to_batch(batch)
    out = torch.empty(batch.out.shape, dtype=torch.float64, device=batch.device)
    lse = torch.empty(batch.lse.shape, dtype=torch.float64, device=batch.device)
    toy_decode.decode(wrong, compute=torch.float64, out=out, lse=lse)
    if to_out is not None:
        to_out(wrong, out)
    return out


def affected_rows(case, batch, kernel, bug: str, yard=None) -> torch.Tensor:
    """[B, Hq] bool: rows the bug moves by more than AFFECTED_FACTOR x their budget."""
    from decode_conformance.metrics import row_budget, row_excess
    from decode_conformance.runner import yardstick
    ref, tier = yard or yardstick(kernel, case, batch)
    budget = row_budget(ref.out, tier.outs, ref.visible, case.q_dtype)
    excess, _ = row_excess(oracle(batch, bug), ref.out, budget)
    vis = ref.visible.to(excess.device) > 0
    return (excess > AFFECTED_FACTOR) & vis[:, None]


@dataclasses.dataclass
class Tally:
    kernel: str
    bug: str
    cases: int = 0
    affected: int = 0
    caught: int = 0  # affected cases that failed
    caught_unaffected: int = 0  # failed although no row moved by 2x its budget
    missed: list = dataclasses.field(default_factory=list)  # affected cases that passed

    def row(self) -> dict:
        return dataclasses.asdict(self)


def study(inner_factory: Callable, bug: str, cases, device: str) -> Tally:
    """Run `inner + bug` on every case it can run; count affected / caught."""
    from decode_conformance.devices import device_type
    from decode_conformance.runner import prepare, run_prepared, yardstick
    kernel = Planted(inner_factory(), bug)
    t = Tally(kernel=kernel.inner.name, bug=bug)
    dev_type = device_type(device)
    for case in cases:
        if kernel.caps.missing_for(case, dev_type):
            continue
        t.cases += 1
        batch = prepare(kernel, case, device)
        yard = yardstick(kernel, case, batch)
        hit = bool(affected_rows(case, batch, kernel, bug, yard).any())
        res = run_prepared(kernel, case, batch, *yard)
        if hit:
            t.affected += 1
            if res.ok:
                t.missed.append(f"{case.id}: {res.message}")
            else:
                t.caught += 1
        elif not res.ok:
            t.caught_unaffected += 1
    return t


def _job(args):
    spec, bug, profile, device = args
    from decode_conformance import _paths
    _paths.alias_checkout()
    if device == "cpu":
        from decode_conformance.devices import use_interpreter
        use_interpreter()
    from decode_conformance.case_sets import build_set
    from decode_conformance.kernel_api import load_kernel
    t0 = time.time()
    run = lse_study if bug in LSE_BUGS else study
    t = run(lambda: load_kernel(spec), bug, build_set("parity", profile), device)
    return dict(t.row(), spec=spec, seconds=round(time.time() - t0, 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="planted bug x parity case study: affected cases must all fail")
    ap.add_argument("--profile", choices=("interpreter", "gpu"), default="gpu")
    ap.add_argument("--kernels", nargs="*", default=["toy_decode:ToyDecode",
                                                     "decode_conformance_kernels.registry:adaptive_split_fp8mma"])
    ap.add_argument("--bugs", nargs="*", default=list(BUGS) + list(LSE_BUGS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--jobs", type=int, default=1, help="(kernel, bug) pairs studied in parallel processes")
    a = ap.parse_args(argv)
    device = "cpu" if a.profile == "interpreter" else "cuda"
    work = [(spec, bug, a.profile, device) for spec in a.kernels for bug in a.bugs]
    if a.jobs > 1:
        import multiprocessing
        with multiprocessing.get_context("spawn").Pool(a.jobs) as pool:
            rows = pool.map(_job, work)
    else:
        rows = [_job(w) for w in work]
    for t in rows:
        print(f"{t['kernel']:24s} {t['bug']:15s} cases {t['cases']:3d} affected {t['affected']:3d} caught "
              f"{t['caught']:3d} missed {len(t['missed'])} caught-unaffected {t['caught_unaffected']} "
              f"({t['seconds']} s)", flush=True)
        for m in t["missed"][:3]:
            print("    MISSED", m[:200])
    if a.out:
        pathlib.Path(a.out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(a.out) / f"planted-{a.profile}.json").write_text(json.dumps(rows, indent=1))
    return 1 if any(r["missed"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

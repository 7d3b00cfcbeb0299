"""What a cold run would compile with fewer specializations: read from a compile-ahead manifest,
no GPU and no compile.

    python benchmarks/variant_census.py fixtures/compile_ahead/sm_90/triton-3.6.0.json
    python benchmarks/variant_census.py MANIFEST --unspecialize D_MAIN,DV,D1 --unspecialize group,tiles_per_kv

Each manifest entry is one variant: a kernel, its arguments' specialization (constexpr values,
ints equal to 1, 16-byte divisibility), its launch options, and the seconds its compile took on
the recording host. For every argument whose specialization differs between a kernel's variants
the census prints how many variants and compile seconds would remain if that argument were a
runtime int Triton does not specialize (`do_not_specialize`: no constant, no `== 1`, no
divisibility). Variants that then share a key would be one compile; its seconds are taken as
the slowest of them. `--unspecialize A,B` adds one row for that set of arguments together.

This is arithmetic on the list, not a measurement of a run: an argument that sets a block shape
cannot become a runtime int, and one that can may change the code of every variant it folds into
(masks no longer folded at compile time); what a change costs on the GPU is the peer table's.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from typing import Iterable

from decode_conformance.compile_ahead import load_manifest


def _specialization(data: dict) -> dict[str, object]:
    names = list(data["signature"])
    spec: dict[str, object] = {n: ("type", t) for n, t in data["signature"].items()}
    for k, v in zip(data["constant_keys"], data["constant_vals"]):
        spec[names[k[0]]] = ("constant", v)
    for k, v in zip(data["attrs_keys"], data["attrs_vals"]):
        n = names[k[0]]
        spec[n] = (spec[n], json.dumps(v))
    return spec


def census(manifest: dict, unspecialized: Iterable[str] = ()) -> tuple[int, float]:
    """(variants, compile seconds) if the named arguments were runtime ints Triton does not
    specialize (`do_not_specialize`)."""
    drop = set(unspecialized)
    groups: dict[tuple, float] = {}
    for e in manifest["entries"]:
        data = json.loads(e["data"])
        spec = _specialization(data)
        for n in drop & spec.keys():
            spec[n] = "runtime"
        key = (e["fn"], json.dumps(sorted(spec.items(), key=lambda kv: kv[0]), default=str),
               json.dumps(data.get("options"), sort_keys=True, default=str))
        groups[key] = max(groups.get(key, 0.0), float(e.get("seconds") or 0.0))
    return len(groups), sum(groups.values())


def varying_arguments(manifest: dict) -> dict[str, set[str]]:
    """Per kernel, the arguments whose specialization differs between its variants."""
    seen: dict[str, dict[str, set]] = collections.defaultdict(lambda: collections.defaultdict(set))
    for e in manifest["entries"]:
        for n, s in _specialization(json.loads(e["data"])).items():
            seen[e["fn"]][n].add(json.dumps(s, default=str))
    return {fn: {n for n, vals in args.items() if len(vals) > 1} for fn, args in seen.items()}


def report(manifest: dict, extra_sets: list[list[str]]) -> str:
    n0, s0 = census(manifest)
    lines = [f"{n0} variants, {s0:.1f} s of compile on the recording host", "",
             "| not specialized | kernels where it varies | variants | compile s | saved s |", "|---|---|---|---|---|"]
    by_arg = collections.defaultdict(list)
    for fn, args in varying_arguments(manifest).items():
        for a in args:
            by_arg[a].append(fn.rsplit(":", 1)[-1])
    rows = []
    for a, fns in by_arg.items():
        n, s = census(manifest, [a])
        rows.append((s0 - s, a, fns, n, s))
    for args in extra_sets:
        n, s = census(manifest, args)
        rows.append((s0 - s, "+".join(args), ["(together)"], n, s))
    alone = []
    for saved, a, fns, n, s in sorted(rows, key=lambda r: (-r[0], r[1])):
        if n == n0:  # it varies only together with another argument: nothing folds by it alone
            alone.append(a)
            continue
        lines.append(f"| {a} | {', '.join(sorted(fns))} | {n} | {s:.1f} | {saved:.1f} |")
    if alone:
        lines += ["", "No variant folds when only one of these is not specialized: " + ", ".join(alone)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest")
    ap.add_argument("--unspecialize", action="append", default=[], metavar="A,B",
                    help="a set of arguments made runtime ints together (repeatable)")
    args = ap.parse_args(argv)
    print(report(load_manifest(args.manifest), [s.split(",") for s in args.unspecialize]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

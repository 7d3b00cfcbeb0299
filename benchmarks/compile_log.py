"""Where a cold run spends its Triton compile time: a logger for every Python process of a run,
and its summary.

    DC_COMPILE_LOG=/tmp/clog PYTHONPATH=benchmarks/compile_log_site:. pytest suites/parity -n auto
    python benchmarks/compile_log.py /tmp/clog          # the summary

`benchmarks/compile_log_site/sitecustomize.py` calls `install()` at the start of every Python
process that has DC_COMPILE_LOG set: the pytest workers and any kernel process the suite's
crash isolation spawns. It hangs on Triton's JIT hooks
(`triton.knobs.runtime.jit_cache_hook` before a compile, `jit_post_compile_hook` after) and on
the C builds of Triton's host-side modules (`compile_module_from_src`: the driver utilities and
one launcher per distinct kernel signature, built with the host C compiler), and writes one
JSON line per event: process, kind, kernel, its specialization by argument and the seconds it
took. A compile that found its binary in Triton's on-disk cache still passes the hooks, only
quickly; the summary counts as real compiles those over `--real` seconds.

The summary answers what a cold run's time is made of: per kernel, the distinct variants
(specialization keys), how often a variant was compiled in more than one process, the seconds,
and for each kernel the arguments whose specialization differs between its variants (the
arguments to look at for fewer variants).
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import pathlib
import time


def install(out_dir: str) -> None:
    """Log this process's Triton compiles and host-module builds under out_dir (one file per process).
    The kernel lines are decode_conformance.compile_ahead's records (which a compile-ahead manifest
    is built from), with this summary's fields added."""
    from decode_conformance import compile_ahead
    proc = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
    born = time.time()

    def fields(kw, t0) -> dict:
        jit = getattr(kw["fn"], "jit_function", None)
        return dict(proc=proc, born=born, kind="kernel", kernel=kw["fn"].name, t0=t0,
                    variant=variant(getattr(jit, "arg_names", []), kw["compile"]))

    sink = compile_ahead.install_recorder(out_dir, extra=fields)

    def write(**rec):
        sink(json.dumps({"proc": proc, "born": born, **rec}))

    # The host-side C modules (driver utilities, launchers): triton 3.6's driver calls the builder
    # by the name it imported; later versions build elsewhere, and are then not timed.
    try:
        from triton.backends.nvidia import driver as nv_driver
    except Exception:
        return
    build = getattr(nv_driver, "compile_module_from_src", None)
    if build is None:
        return

    def timed_build(*args, **kwargs):
        t0 = time.time()
        try:
            return build(*args, **kwargs)
        finally:
            write(kind="host-module", kernel=kwargs.get("name", args[1] if len(args) > 1 else "?"), t0=t0,
                  seconds=time.time() - t0, variant={"src": hashlib.sha1(str(kwargs.get("src", args[0] if args else "")).encode()).hexdigest()[:12]})

    nv_driver.compile_module_from_src = timed_build


def variant(arg_names, compile) -> dict:
    """One compiled variant, by argument: its type, the value it was compiled for (a constexpr,
    or an int specialized to 1), its divisibility-by-16 attribute; and the launch options."""
    out = {}
    constants = {k[0] if isinstance(k, tuple) else k: v for k, v in compile.get("constants", {}).items()}
    attrs = {}
    for cfg in compile.get("configs") or []:
        for k, v in (cfg or {}).items():
            attrs[k[0] if isinstance(k, tuple) else k] = v
    for i, name in enumerate(arg_names):
        ty = compile.get("signature", {}).get(name, "?")
        desc = str(ty)
        if i in constants or name in constants:
            desc += f"={constants.get(i, constants.get(name))}"
        if attrs.get(i):
            desc += " " + ",".join(f"{a[0].split('.')[-1]}{a[1]}" for a in attrs[i])
        out[name] = desc
    out["launch"] = f"warps={compile.get('num_warps')} stages={compile.get('num_stages')}"
    return out


def _vkey(r) -> str:
    return json.dumps(r["variant"], sort_keys=True)


def summarize(log_dir: pathlib.Path, real: float) -> str:
    def is_real(r) -> bool:  # slower than a disk-cache hit
        return (r["seconds"] or 0) > real

    rows = [json.loads(line) for f in sorted(log_dir.glob("*.jsonl")) for line in f.read_text().splitlines() if line]
    if not rows:
        return f"no compile records under {log_dir}"
    by_kernel = collections.defaultdict(list)
    for r in rows:
        by_kernel[r["kernel"]].append(r)
    kinds = collections.Counter(r.get("kind", "kernel") for r in rows)
    lines = [f"{len(rows)} compile events ({dict(kinds)}) in {len({r['proc'] for r in rows})} processes; "
             f"{sum(map(is_real, rows))} over {real} s (real compiles), "
             f"{sum(r['seconds'] or 0 for r in rows):.1f} s in all", "",
             "| kernel | events | variants | real compiles | variants compiled in >1 process | seconds |",
             "|---|---|---|---|---|---|"]
    for name, rs in sorted(by_kernel.items(), key=lambda kv: -sum(r["seconds"] or 0 for r in kv[1])):
        variants = collections.defaultdict(set)
        for r in filter(is_real, rs):
            variants[_vkey(r)].add(r["proc"])
        lines.append(f"| {name} | {len(rs)} | {len({_vkey(r) for r in rs})} | {sum(map(is_real, rs))} | "
                     f"{sum(1 for w in variants.values() if len(w) > 1)} | {sum(r['seconds'] or 0 for r in rs):.1f} |")
    lines += ["", "Arguments whose specialization differs between a kernel's variants (value: variants):"]
    for name, rs in sorted(by_kernel.items()):
        uniq = {_vkey(r): r["variant"] for r in rs}
        per_arg = collections.defaultdict(collections.Counter)
        for v in uniq.values():
            for k, desc in v.items():
                per_arg[k][desc] += 1
        varying = {k: dict(c) for k, c in per_arg.items() if len(c) > 1}
        if varying:
            lines.append(f"- {name} ({len(uniq)} variants): " + "; ".join(f"{k} {v}" for k, v in varying.items()))
    t_first = min(r["born"] for r in rows)
    lines += ["", "| process | started at s | first compile at s | last compile ends at s | kernel compile s | "
              "host-module build s |", "|---|---|---|---|---|---|"]
    procs = collections.defaultdict(list)
    for r in rows:
        procs[r["proc"]].append(r)
    for proc, rs in sorted(procs.items(), key=lambda kv: kv[1][0]["born"]):
        t0s = [r["t0"] for r in rs if r["t0"] is not None]
        ends = [r["t0"] + (r["seconds"] or 0) for r in rs if r["t0"] is not None]
        sec = lambda kind: sum(r["seconds"] or 0 for r in rs if r.get("kind", "kernel") == kind)  # noqa: E731
        lines.append(f"| {proc} | {rs[0]['born'] - t_first:.1f} | {min(t0s) - t_first:.1f} | {max(ends) - t_first:.1f} | "
                     f"{sec('kernel'):.1f} | {sec('host-module'):.1f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log_dir", type=pathlib.Path)
    p.add_argument("--real", type=float, default=0.25, help="seconds above which a compile was not a disk-cache hit")
    a = p.parse_args(argv)
    print(summarize(a.log_dir, a.real))


if __name__ == "__main__":
    main()

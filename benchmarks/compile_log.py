"""Where a cold run spends its time: a logger for every Python process of a run (Triton compiles,
the tests of each pytest worker, the waits for a heavy-case slot), and its summary.

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

In the pytest processes `compile_log_plugin.py` (sitecustomize names it in PYTEST_PLUGINS) adds
one line per test (its worker, start and seconds) and one per phase of the process (configured,
collected, session finished, exited), and this module one per wait for a heavy case's GPU slot
(decode_conformance/device_memory.py), so the summary can split each worker's time line and show
each process's start-up and end. Triton's hooks go in when a process first imports triton, not at
its start, so a logged process starts as fast as an unlogged one.

The summary answers what a cold run's time is made of: per kernel, the distinct variants
(specialization keys), how often a variant was compiled in more than one process, the seconds,
and for each kernel the arguments whose specialization differs between its variants (the
arguments to look at for fewer variants); per pytest worker, when its first test started and
its last ended, and how its tests' time splits into compiling (in it or its isolated kernel
process), waiting for a slot, and the rest (host work and the GPU); and the slowest tests, each
with the compile seconds inside it.
"""
from __future__ import annotations

import argparse
import atexit
import collections
import hashlib
import importlib.abc
import importlib.util
import json
import os
import pathlib
import sys
import time

_SINK = None  # this process's line writer, once install() ran


def _proc() -> str:
    # read at each line: xdist names its worker (PYTEST_XDIST_WORKER) after the process started
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"


def install(out_dir: str, born: float | None = None) -> None:
    """Log this process under out_dir: its own lines (tests, phases, slot waits, host-module builds)
    from now, its Triton compiles from the moment triton is first imported (`_AfterImport`). The
    kernel lines are decode_conformance.compile_ahead's records (which a compile-ahead manifest is
    built from), with this summary's fields added. `born`: the process's start (sitecustomize's
    clock), now if not given. Importing triton here instead would cost every process of the run
    0.3-0.4 s at start-up (a 2-core CPU), and xdist starts its workers one after another: 12 workers began 3.7 s
    apart in a logged run (docs/gpu-runs/2026-12-06-h100-s42) where an unlogged one starts them
    together."""
    global _SINK
    born = time.time() if born is None else born
    path = pathlib.Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    own = open(path / f"events-{os.getpid()}.jsonl", "a", buffering=1)

    def write(**rec):
        own.write(json.dumps({"proc": _proc(), "born": born, **rec}) + "\n")

    _SINK = write
    atexit.register(phase, "exit")
    if "triton" in sys.modules:
        _hook_triton(out_dir, born)
    else:
        sys.meta_path.insert(0, _AfterImport("triton", lambda: _hook_triton(out_dir, born)))
    if "torch" not in sys.modules:  # how long its import took here (a span line)
        sys.meta_path.insert(0, _AfterImport("torch"))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then` once, right after the module `name` is first imported (never failing that
    import). It stays on the meta path until the module is loaded: a bare
    `importlib.util.find_spec(name)` (torch asks so whether triton is installed) loads nothing."""

    def __init__(self, name: str, then=None):
        self.name, self.then, self.busy = name, then, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.busy:
            return None
        t0 = time.time()
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)  # the finders after this one (it answers None now)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then(module):
            exec_module(module)
            if self not in sys.meta_path:
                return
            sys.meta_path.remove(self)
            write(kind="span", kernel=f"import {self.name}", t0=t0, seconds=time.time() - t0)
            try:
                if self.then is not None:
                    self.then()
            except Exception as e:  # a logger must not break the run it logs
                write(kind="phase", kernel=f"log hooks failed: {type(e).__name__}: {e}", t0=time.time(), seconds=0.0)

        spec.loader.exec_module = exec_then
        return spec


def _hook_triton(out_dir: str, born: float) -> None:
    from decode_conformance import compile_ahead

    def fields(kw, t0) -> dict:
        jit = getattr(kw["fn"], "jit_function", None)
        return dict(proc=_proc(), born=born, kind="kernel", kernel=kw["fn"].name, t0=t0,
                    variant=variant(getattr(jit, "arg_names", []), kw["compile"]))

    compile_ahead.install_recorder(out_dir, extra=fields)
    _time_slot_waits()

    # The host-side C modules (driver utilities, launchers): triton 3.6's driver calls the builder
    # by the name it imported; later versions build elsewhere, and are then not timed.
    try:
        from triton.backends.nvidia import driver as nv_driver
    except Exception:
        return

    def host_module(args, kwargs) -> dict:
        src = str(kwargs.get("src", args[0] if args else ""))
        return dict(kind="host-module", kernel=kwargs.get("name", args[1] if len(args) > 1 else "?"),
                    variant={"src": hashlib.sha1(src.encode()).hexdigest()[:12]})

    timed(nv_driver, "compile_module_from_src", host_module)


def write(**rec) -> None:
    """A line of this process's own (no-op before install)."""
    if _SINK is not None:
        _SINK(**rec)


def timed(owner, attr: str, record) -> None:
    """Wrap owner.attr so that each call writes a line (its start and seconds): `record` is the
    span's name, or a function of the call's (args, kwargs) giving the line's other fields."""
    fn = getattr(owner, attr, None)
    if fn is None or getattr(fn, "_compile_log_timed", False):
        return
    fields = record if callable(record) else (lambda args, kwargs: dict(kind="span", kernel=record))

    def wrapper(*args, **kwargs):
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            write(**fields(args, kwargs), t0=t0, seconds=time.time() - t0)

    wrapper._compile_log_timed = True
    setattr(owner, attr, wrapper)


def phase(name: str) -> None:
    """When this process reached `name` (configure, collected, sessionfinish, ... exit)."""
    write(kind="phase", kernel=name, t0=time.time(), seconds=0.0)


def _time_slot_waits() -> None:
    """A line per wait for a heavy case's slot (device_memory.SlotLock): how long the worker
    stood still because other workers held every slot."""
    try:
        from decode_conformance import device_memory
    except Exception:
        return
    timed(device_memory.SlotLock, "__enter__", lambda args, kwargs: dict(kind="slot-wait", kernel=""))


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


COMPILE_KINDS = ("kernel", "host-module")


def _worker(proc: str) -> str:
    """A pytest worker's name for its own process and its isolated kernel process (both carry
    PYTEST_XDIST_WORKER)."""
    return proc.rsplit("-", 1)[0]


def _by_worker(rows) -> collections.defaultdict:
    out = collections.defaultdict(list)
    for r in rows:
        out[_worker(r["proc"])].append(r)
    return out


def _within(rows, t0: float, t1: float) -> float:
    """Seconds of `rows` (events with t0, seconds) that fall inside [t0, t1]."""
    return sum(max(0.0, min(t1, r["t0"] + (r["seconds"] or 0)) - max(t0, r["t0"])) for r in rows if r["t0"] is not None)


def summarize(log_dir: pathlib.Path, real: float, slowest: int = 15) -> str:
    def is_real(r) -> bool:  # slower than a disk-cache hit
        return (r["seconds"] or 0) > real

    everything = [json.loads(line) for f in sorted(log_dir.glob("*.jsonl")) for line in f.read_text().splitlines() if line]
    rows = [r for r in everything if r.get("kind", "kernel") in COMPILE_KINDS and "kernel" in r]
    t_first = min((r["born"] for r in everything), default=0.0)  # the first process's start: the time lines' zero
    if not rows:
        return "\n".join([f"no compile records under {log_dir}"] + _timeline(everything, rows, t_first, slowest)
                         + _phases(everything, t_first) + _spans(everything))
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
    lines += _timeline(everything, rows, t_first, slowest) + _phases(everything, t_first) + _spans(everything)
    return "\n".join(lines)


def _timeline(everything, compiles, t_first: float, slowest: int) -> list[str]:
    """Per pytest worker: its time line split into compiling, waiting for a slot and the rest;
    then the slowest tests. Empty when the run logged no tests (no plugin)."""
    tests = [r for r in everything if r.get("kind") == "test"]
    if not tests:
        return []
    w_tests, w_waits = _by_worker(tests), _by_worker(r for r in everything if r.get("kind") == "slot-wait")
    w_compiles = _by_worker(r for r in compiles if r["t0"] is not None)
    born = {w: min(r["born"] for r in rs) for w, rs in _by_worker(everything).items()}
    end = max(r["t0"] + r["seconds"] for r in tests)
    session = [r["t0"] for r in everything if r.get("kind") == "session"]
    lines = ["", "Pytest workers (seconds from the first process's start; "
                 + (f"pytest's session starts at {min(session) - t_first:.1f} s, " if session else "")
                 + f"the last test ends at {end - t_first:.1f} s). Compile: in the worker or its isolated kernel process, during its "
                 f"tests; rest: its tests' other time (host work, the GPU, waiting on it):", "",
             "| worker | started at | first test at | last test ends at | tests | in tests s | compile s | "
             "slot wait s | rest s |", "|---|---|---|---|---|---|---|---|---|"]
    for w in sorted(w_tests, key=lambda w: (len(w), w)):
        ts = w_tests[w]
        busy = sum(r["seconds"] for r in ts)
        comp = sum(_within(w_compiles[w], r["t0"], r["t0"] + r["seconds"]) for r in ts)
        wait = sum(r["seconds"] for r in w_waits[w])
        lines.append(f"| {w} | {born[w] - t_first:.1f} | {min(r['t0'] for r in ts) - t_first:.1f} | "
                     f"{max(r['t0'] + r['seconds'] for r in ts) - t_first:.1f} | {len(ts)} | {busy:.1f} | {comp:.1f} | "
                     f"{wait:.1f} | {busy - comp - wait:.1f} |")
    def rows_of(title, chosen):
        out = ["", title, "", "| test | worker | starts at | seconds | compile s | slot wait s |", "|---|---|---|---|---|---|"]
        for r in chosen:
            w, t1 = _worker(r["proc"]), r["t0"] + r["seconds"]
            out.append(f"| `{r['kernel'].split('::')[-1]}` | {w} | {r['t0'] - t_first:.1f} | {r['seconds']:.2f} | "
                       f"{_within(w_compiles[w], r['t0'], t1):.2f} | {_within(w_waits[w], r['t0'], t1):.2f} |")
        return out

    lines += rows_of(f"The {slowest} slowest tests:", sorted(tests, key=lambda r: -r["seconds"])[:slowest])
    # the run's end: which tests kept workers busy after the others had run out of tests
    last = sorted(tests, key=lambda r: -(r["t0"] + r["seconds"]))[:10]
    return lines + rows_of("The 10 tests that ended last (the run's tail):", last)


PHASES = ("configure", "sessionstart", "collected", "sessionfinish", "finished", "unconfigured", "exit")


def _phases(everything, t_first: float) -> list[str]:
    """Each pytest process's start-up and end (compile_log_plugin's phase lines): when it began,
    configured (the suite's state built), collected, ran its first and last test, began and ended
    its session's finish (the controller's end includes waiting for its workers' processes to
    end), unconfigured and exited. Empty for a log without phases."""
    by_proc = collections.defaultdict(dict)
    for r in everything:
        if r.get("kind") == "phase" and r["kernel"] in PHASES:
            by_proc[r["proc"]].setdefault(r["kernel"], r["t0"])
            by_proc[r["proc"]].setdefault("born", r["born"])
    pytest_procs = {p: ph for p, ph in by_proc.items() if "configure" in ph}
    if not pytest_procs:
        return []
    tests_of = collections.defaultdict(list)
    for r in (r for r in everything if r.get("kind") == "test"):
        tests_of[r["proc"]].append(r)
    at = lambda t: "" if t is None else f"{t - t_first:.1f}"  # noqa: E731
    lines = ["", "Each pytest process's phases (seconds from the first process's start; `finished`: its session's "
                 "end, after the terminal summary and, in the controller, after its workers' processes ended):", "",
             "| process | started | configure | sessionstart | collected | first test | last test ends | "
             "sessionfinish | finished | unconfigured | exit |", "|" + "---|" * 11]
    for proc, ph in sorted(pytest_procs.items(), key=lambda kv: (_worker(kv[0]) != "main", kv[1]["born"])):
        ts = tests_of.get(proc, [])
        first = min((r["t0"] for r in ts), default=None)
        last = max((r["t0"] + r["seconds"] for r in ts), default=None)
        cells = [at(ph["born"]), at(ph.get("configure")), at(ph.get("sessionstart")), at(ph.get("collected")),
                 at(first), at(last)] + [at(ph.get(k)) for k in PHASES[3:]]
        lines.append(f"| {proc} | " + " | ".join(cells) + " |")
    return lines


def _spans(everything) -> list[str]:
    """The timed start-up work (imports, the suite's state build and its parts), per kind of
    process: count, median and longest seconds. Empty for a log without spans."""
    pytest_procs = {r["proc"] for r in everything if r.get("kind") == "phase" and r["kernel"] == "configure"}
    groups = collections.defaultdict(list)
    for r in everything:
        if r.get("kind") == "span":
            where = "pytest process" if r["proc"] in pytest_procs else "kernel process"
            groups[(r["kernel"], where)].append(r["seconds"])
    if not groups:
        return []
    lines = ["", "Start-up work, timed where it ran (s):", "", "| what | where | times | median | longest |",
             "|---|---|---|---|---|"]
    for (name, where), secs in sorted(groups.items(), key=lambda kv: (kv[0][1], -max(kv[1]))):
        secs = sorted(secs)
        lines.append(f"| {name} | {where} | {len(secs)} | {secs[len(secs) // 2]:.2f} | {secs[-1]:.2f} |")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log_dir", type=pathlib.Path)
    p.add_argument("--real", type=float, default=0.25, help="seconds above which a compile was not a disk-cache hit")
    a = p.parse_args(argv)
    print(summarize(a.log_dir, a.real))


if __name__ == "__main__":
    main()

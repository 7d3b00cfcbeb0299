"""Compile ahead: a run's Triton variants, compiled once each, in parallel, from a recorded list.

A cold main job is mostly Triton compiling (docs/gpu-runs/2026-12-02-h200-s16: 563 compiles,
418 s over 12 workers, out of a 61 s run). Each worker compiles the variants its own cases
need, one after another, and several workers compile the same one. Given the list of variants
a run needs, the cores the workers leave idle can compile each of them once, ahead of the cases
that will ask for them; those cases then find their binary in Triton's on-disk cache. Measured
on lent 16-core GPU hosts, that made a run no faster, so a run has no pool unless asked
(compile_ahead_run.py). Filling a cache on a machine without a GPU, ahead of a batch of runs,
is the other use (`precompile`).

The list is a *manifest*, recorded from a run on the GPU class it is for:
  - `install_recorder(DIR)` hangs on Triton's JIT hooks in a process and writes one JSON line
    per compile: the JIT function (`module:qualname`), its source hash, the seconds, the target
    and Triton's own serialized specialization (the arguments `JITFunction.preload` takes);
  - `build_manifest(DIR)` merges the lines of every process of that run, one entry per variant.
Compiling ahead (`precompile`) preloads each entry in a pool of processes whose Triton driver
is a stand-in reporting the manifest's target (compile_ahead_run checks it is the GPU's): nothing touches the GPU, so the pool costs no
device memory and no CUDA context. A variant compiled by the pool is the one a case would have
compiled (the same source, specialization, options, target and Triton settings make the same cache key).

When a pytest run uses a manifest, and why no case waits for the pool: compile_ahead_run.py.

    python -m decode_conformance.compile_ahead manifest LOG_DIR --gpu-class sm_90 -o OUT.json
    python -m decode_conformance.compile_ahead precompile OUT.json [--jobs N] [--nice N]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import time
from typing import Optional

FORMAT = 1
MANIFEST_DIR = "compile_ahead"  # under the shipped fixtures: <gpu class>/triton-<version>.json


def manifest_name(gpu_class: str, triton_version: str) -> tuple[str, str, str]:
    return (MANIFEST_DIR, gpu_class, f"triton-{triton_version}.json")


# ---- recording -------------------------------------------------------------------------------

def install_recorder(out_dir, extra=None):
    """Write a JSON line per Triton compile of this process under out_dir (one file per process);
    `extra(hook_kwargs, start_time)` adds fields to each line. Chains onto hooks already installed
    (their return value is kept). Returns a function that writes a line of the caller's own to the
    same file (lines without "data" are not compile records)."""
    from triton import knobs
    from triton.runtime import driver

    path = pathlib.Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    sink = open(path / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.jsonl", "a", buffering=1)
    started: dict = {}
    prev_before, prev_after = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook

    def before(**kw):
        started[str(kw["key"])] = time.time()
        return prev_before(**kw) if prev_before else False

    def after(**kw):
        t0 = started.pop(str(kw["key"]), None)
        jit = kw["fn"].jit_function
        target = driver.active.get_current_target()
        rec = {"fn": f"{jit.fn.__module__}:{jit.fn.__qualname__}", "hash": jit.cache_key,
               "seconds": None if t0 is None else round(time.time() - t0, 4),
               "target": {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size},
               "data": kw["compile"]["specialization_data"]}
        if extra is not None:
            rec.update(extra(kw, t0))
        sink.write(json.dumps(rec) + "\n")
        return prev_after(**kw) if prev_after else None

    knobs.runtime.jit_cache_hook = before
    knobs.runtime.jit_post_compile_hook = after
    return lambda line: sink.write(line + "\n")


class ManifestError(ValueError):
    pass


def build_manifest(log_dir, gpu_class: str, recorded: Optional[dict] = None) -> dict:
    """One entry per variant (JIT function and Triton's specialization key) of every process's
    records under log_dir; its seconds are the longest any process took (a disk-cache hit is
    fast; the compile is what the pool will pay)."""
    import triton
    entries: dict = {}
    targets = set()
    for f in sorted(pathlib.Path(log_dir).glob("*.jsonl")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if not line.strip():
                continue
            r = json.loads(line)
            if "data" not in r:  # another logger's line (benchmarks/compile_log's host-module builds)
                continue
            targets.add(json.dumps(r["target"], sort_keys=True))
            ident = (r["fn"], json.dumps(json.loads(r["data"])["key"]))
            old = entries.get(ident)
            secs = r.get("seconds") or 0.0
            if old is None or secs > old["seconds"]:
                entries[ident] = {"fn": r["fn"], "hash": r["hash"], "seconds": secs, "data": r["data"]}
    if not entries:
        raise ManifestError(f"{log_dir}: no compile records (was the recorder installed in the processes that compiled?)")
    if len(targets) != 1:
        raise ManifestError(f"{log_dir}: records of {len(targets)} targets ({sorted(targets)}); expected one")
    return {"format": FORMAT, "triton": triton.__version__, "gpu_class": gpu_class,
            "target": json.loads(targets.pop()), "recorded": recorded or {},
            "entries": sorted(entries.values(), key=lambda e: (e["fn"], e["data"]))}


def load_manifest(path) -> dict:
    """The manifest at `path`, checked: every error names the field and what was expected."""
    path = pathlib.Path(path)
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ManifestError(f"compile-ahead manifest {path}: cannot read it as JSON ({e})") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ManifestError(f"compile-ahead manifest {path}: format: expected {FORMAT}, "
                            f"got {m.get('format') if isinstance(m, dict) else type(m).__name__!r}")
    for field, kind in (("triton", str), ("gpu_class", str), ("target", dict), ("entries", list)):
        if not isinstance(m.get(field), kind):
            raise ManifestError(f"compile-ahead manifest {path}: {field}: expected a {kind.__name__}, "
                                f"got {type(m.get(field)).__name__}")
    bad = [k for k, kind in (("backend", str), ("arch", (int, str)), ("warp_size", int))
           if not isinstance(m["target"].get(k), kind)]
    if bad:
        raise ManifestError(f"compile-ahead manifest {path}: target: expected backend (str), arch and warp_size "
                            f"(int), got {m['target']!r}")
    for i, e in enumerate(m["entries"]):
        missing = [k for k in ("fn", "data") if not isinstance(e, dict) or not isinstance(e.get(k), str)]
        if missing:
            raise ManifestError(f"compile-ahead manifest {path}: entries[{i}]: expected strings fn and data, "
                                f"missing {missing}")
        if not isinstance(e.get("seconds", 0.0), (int, float)):
            raise ManifestError(f"compile-ahead manifest {path}: entries[{i}].seconds: expected a number, "
                                f"got {e['seconds']!r}")
    return m


# ---- compiling without a GPU -------------------------------------------------------------------

class TargetDriver:
    """A Triton driver stand-in that reports `target` and nothing else: enough for
    `JITFunction.preload` / `warmup` to compile and cache a variant; launching is not possible."""

    def __init__(self, backend: str, arch, warp_size: int):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget(backend, arch, warp_size)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch
        return torch.device("cpu")


@contextlib.contextmanager
def offline_target(target: dict):
    """Triton compiles for `target` ({backend, arch, warp_size}) in this block, whatever GPU the
    host has or lacks. JIT functions defined under TRITON_INTERPRET=1 are interpreted and
    compile nothing: use this in a process without it."""
    from triton.runtime import driver
    before = getattr(driver, "_active", None)  # None: not chosen yet (reset_active would build one: no GPU, an error)
    driver.set_active(TargetDriver(**target))
    try:
        yield
    finally:
        driver.set_active(before)


def resolve_function(spec: str):
    """The object `module:qualname` names (a manifest entry's JIT function)."""
    import pkgutil
    return pkgutil.resolve_name(spec)


def _pool_init(target: dict, root: str) -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    from ._paths import alias_checkout
    alias_checkout(pathlib.Path(root) if root else None)
    from .isolation import use_compile_defaults
    use_compile_defaults()  # the isolated workers' settings: the same cache keys
    from triton.runtime import driver
    driver.set_active(TargetDriver(**target))


def portable(data: str) -> str:
    """A variant's specialization data without the recording host's paths. Triton's options name
    the math libraries by file path (`extern_libs`: libdevice under the recording machine's Triton
    install), a path another host's install does not have. A library missing here is left out and
    the backend fills in its own; the cache key hashes the file's content, not its path, so the
    key is still the one a case on this host makes."""
    d = json.loads(data)
    opts = d.get("options") or {}
    libs = opts.get("extern_libs")
    if libs:
        opts["extern_libs"] = [[name, path] for name, path in libs if os.path.exists(path)]
    return json.dumps(d)


def _compile_one(entry: dict) -> dict:
    t0 = time.time()
    try:
        jit = resolve_function(entry["fn"])
        stale = jit.cache_key != entry.get("hash")  # no hash recorded: not known to be current
        jit.preload(portable(entry["data"]))
    except Exception as e:  # reported per entry; the rest still compile
        return {"fn": entry["fn"], "error": f"{type(e).__name__}: {e}", "seconds": time.time() - t0}
    return {"fn": entry["fn"], "stale": stale, "seconds": time.time() - t0}


def precompile(manifest: dict, jobs: Optional[int] = None, nice: int = 0, progress=None) -> dict:
    """Compile every entry once, longest first, in `jobs` processes (default: the host's cores),
    `nice` added to their CPU niceness (a pool beside a run: compile_ahead_run.POOL_NICE);
    `progress(done, total, result, elapsed_s)` after each entry.
    Returns {compiled, failed: [(fn, error)], stale, seconds, jobs}: stale entries were recorded
    from another version of their kernel's source (compiled anyway; re-record the manifest)."""
    import concurrent.futures
    import multiprocessing
    from ._paths import checkout_root
    jobs = max(1, jobs or os.cpu_count() or 1)
    if nice:
        os.nice(nice)  # before the pool's processes start: they inherit it
    entries = sorted(manifest["entries"], key=lambda e: -(e.get("seconds") or 0.0))
    t0 = time.time()
    root = checkout_root()
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, max(1, len(entries))),
                                                mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_pool_init,
                                                initargs=(manifest["target"], str(root) if root else "")) as pool:
        results = []
        for future in concurrent.futures.as_completed([pool.submit(_compile_one, e) for e in entries]):
            results.append(future.result())
            if progress is not None:
                progress(len(results), len(entries), results[-1], time.time() - t0)
    failed = [(r["fn"], r["error"]) for r in results if "error" in r]
    return {"compiled": len(results) - len(failed), "failed": failed, "stale": sum(bool(r.get("stale")) for r in results),
            "seconds": round(time.time() - t0, 2), "jobs": jobs, "entries": len(entries)}


def _log_progress(done: int, total: int, result: dict, elapsed: float) -> None:
    """One line an entry in the pool's log: how far a pool stopped by its run's end had got (an
    entry a case had compiled first is a cache hit here, a fraction of a second)."""
    what = f"error {result['error']}" if "error" in result else f"{result['seconds']:.2f} s"
    print(f"{elapsed:7.1f} s  {done}/{total}  {result['fn']}  {what}", flush=True)


def summary_line(s: Optional[dict]) -> str:
    if s is None:
        return "compile ahead: no pool ran"
    if "error" in s:
        return f"compile ahead: {s['error']}"
    line = f"compile ahead: {s['compiled']} of {s['entries']} variants in {s['seconds']:.1f} s on {s['jobs']} processes"
    if s["stale"]:
        line += f"; {s['stale']} recorded from other kernel source (re-record the manifest)"
    if s["failed"]:
        line += f"; {len(s['failed'])} failed, first: {s['failed'][0][0]}: {s['failed'][0][1]}"
    return line


# ---- command line ------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decode_conformance.compile_ahead", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest", help="merge a recorded run's compile records into a manifest")
    m.add_argument("log_dir")
    m.add_argument("--gpu-class", required=True)
    m.add_argument("-o", "--out", required=True)
    m.add_argument("--note", default="", help="what was recorded: command, commit, date, GPU")
    p = sub.add_parser("precompile", help="compile a manifest's variants into Triton's cache")
    p.add_argument("manifest")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--done", default=None, help="write the summary JSON here when finished")
    p.add_argument("--nice", type=int, default=0, help="run the pool this much nicer (a run's pool: 19)")
    a = ap.parse_args(argv)
    from ._paths import alias_checkout
    alias_checkout()
    if a.cmd == "manifest":
        man = build_manifest(a.log_dir, a.gpu_class, {"note": a.note} if a.note else None)
        pathlib.Path(a.out).write_text(json.dumps(man, indent=1) + "\n")
        print(f"{len(man['entries'])} variants -> {a.out}")
        return 0
    try:
        summary = precompile(load_manifest(a.manifest), a.jobs, a.nice, progress=_log_progress)
    except Exception as e:  # the run's summary line says why, not a bare exit code
        summary = {"error": f"the compile-ahead pool failed: {type(e).__name__}: {e}"}
    if a.done:
        tmp = pathlib.Path(a.done + ".tmp")
        tmp.write_text(json.dumps(summary))
        tmp.replace(a.done)
    print(summary_line(summary))
    return 0 if "error" not in summary and not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Compile ahead: a cold run's Triton variants compiled first, in parallel, on every host core.

A cold main job is mostly Triton compiling (docs/gpu-runs/2026-12-02-h200-s16: 563 compiles,
418 s over 12 workers, out of a 61 s run). Each worker compiles the variants its own cases
need, one after another, and several workers compile the same one. Given the list of variants
a run needs, the host's cores can compile each of them once, side by side, before the cases
ask for them; every case then finds its binary in Triton's on-disk cache.

The list is a *manifest*, recorded from a run on the GPU class it is for:
  - `install_recorder(DIR)` hangs on Triton's JIT hooks in a process and writes one JSON line
    per compile: the JIT function (`module:qualname`), its source hash, the seconds, the target
    and Triton's own serialized specialization (the arguments `JITFunction.preload` takes);
  - `build_manifest(DIR)` merges the lines of every process of that run, one entry per variant.
Compiling ahead (`precompile`) preloads each entry in a pool of processes whose Triton driver
is a stand-in reporting the manifest's target: nothing touches the GPU, so the pool costs no
device memory and no CUDA context. A variant compiled by the pool is the one a case would have
compiled (the same source, specialization, options and target make the same cache key).

The pytest plugin starts the pool (`start`) at configure time in the run that matches a shipped
manifest (`plan`: GPU class and Triton version, shipped kernels, the whole parity set) and each
process waits for it (`wait`) before its first case. `--compile-ahead=off` turns it off.

    python -m decode_conformance.compile_ahead manifest LOG_DIR --gpu-class sm_90 -o OUT.json
    python -m decode_conformance.compile_ahead precompile OUT.json [--jobs N]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Optional

FORMAT = 1
MANIFEST_DIR = "compile_ahead"  # under the shipped fixtures: <gpu class>/triton-<version>.json
DONE_ENV = "DECODE_CONFORMANCE_COMPILE_AHEAD_DONE"  # the pool's summary file, for the processes that wait
# How long a process waits for the pool before compiling for itself: a pool on 16 cores took
# (estimate) 15-20 s for the ~300 variants of the H200's main job; far past that, something is wrong.
WAIT_LIMIT_S = 300.0


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
    for i, e in enumerate(m["entries"]):
        missing = [k for k in ("fn", "data") if not isinstance(e, dict) or not isinstance(e.get(k), str)]
        if missing:
            raise ManifestError(f"compile-ahead manifest {path}: entries[{i}]: expected strings fn and data, "
                                f"missing {missing}")
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
    driver.set_active(TargetDriver(target["backend"], target["arch"], target["warp_size"]))
    try:
        yield
    finally:
        driver.set_active(before)


def _resolve(spec: str):
    import importlib
    mod, _, qual = spec.partition(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _pool_init(target: dict, root: str) -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    from ._paths import alias_checkout
    alias_checkout(pathlib.Path(root) if root else None)
    from triton.runtime import driver
    driver.set_active(TargetDriver(target["backend"], target["arch"], target["warp_size"]))


def _compile_one(entry: dict) -> dict:
    t0 = time.time()
    try:
        jit = _resolve(entry["fn"])
        stale = bool(entry.get("hash")) and jit.cache_key != entry["hash"]
        jit.preload(entry["data"])
    except Exception as e:  # reported per entry; the rest still compile
        return {"fn": entry["fn"], "error": f"{type(e).__name__}: {e}", "seconds": time.time() - t0}
    return {"fn": entry["fn"], "stale": stale, "seconds": time.time() - t0}


def precompile(manifest: dict, jobs: Optional[int] = None) -> dict:
    """Compile every entry once, longest first, in `jobs` processes (default: the host's cores).
    Returns {compiled, failed: [(fn, error)], stale, seconds, jobs}: stale entries were recorded
    from another version of their kernel's source (compiled anyway; re-record the manifest)."""
    import concurrent.futures
    import multiprocessing
    from ._paths import checkout_root
    jobs = max(1, jobs or os.cpu_count() or 1)
    entries = sorted(manifest["entries"], key=lambda e: -(e.get("seconds") or 0.0))
    t0 = time.time()
    root = checkout_root()
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, max(1, len(entries))),
                                                mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_pool_init,
                                                initargs=(manifest["target"], str(root) if root else "")) as pool:
        results = list(pool.map(_compile_one, entries))
    failed = [(r["fn"], r["error"]) for r in results if "error" in r]
    return {"compiled": len(results) - len(failed), "failed": failed, "stale": sum(bool(r.get("stale")) for r in results),
            "seconds": round(time.time() - t0, 2), "jobs": jobs, "entries": len(entries)}


# ---- the pytest run: when, start, wait ----------------------------------------------------------

def shipped_manifest(gpu_class: str) -> Optional[pathlib.Path]:
    """The shipped manifest for this GPU class and the installed Triton, if there is one."""
    import triton
    from .resources import data_path
    try:
        p = data_path(*manifest_name(gpu_class, triton.__version__))
    except Exception:
        return None
    return p if p.is_file() else None


def plan(config, state) -> tuple[Optional[pathlib.Path], str]:
    """(manifest to compile ahead from, or None; why). `--compile-ahead`: off, auto (default: the
    shipped manifest, on a GPU, for the run it was recorded from - the shipped kernels on the whole
    parity set) or a manifest's path (any run)."""
    choice = config.getoption("--compile-ahead") or "auto"
    if choice == "off":
        return None, "off (--compile-ahead=off)"
    if choice != "auto":  # asked for by name: also on the CPU, where nothing uses it but the wiring is tested
        return pathlib.Path(choice), f"--compile-ahead={choice}"
    if state.device == "cpu":
        return None, "off (the CPU interpreter compiles nothing)"
    reasons = []
    if config.getoption("--kernel") or os.environ.get("DECODE_CONFORMANCE_KERNELS"):
        reasons.append("kernels other than the shipped ones")
    if state.case_set != "parity" or state.case_ids:
        reasons.append(f"case set {state.case_set}{' filtered by --case-id' if state.case_ids else ''}")
    if config.getoption("keyword") or config.getoption("markexpr") or getattr(config.option, "lf", False) \
            or any("::" in a for a in config.args):
        reasons.append("a selection of the tests")
    if (getattr(config.option, "splits", None) or 1) > 1:  # pytest-split: one group of the set (ci/shards.py)
        reasons.append("one group of a split run (--splits)")
    path = shipped_manifest(state.gpu_class)
    if path is None:
        import triton
        reasons.append(f"no shipped manifest for {state.gpu_class} and triton {triton.__version__}")
    else:
        stale = stale_functions(load_manifest(path))
        if stale:  # the cases would compile other variants than the pool: all cost, no gain
            reasons.append(f"the shipped manifest {path.parent.name}/{path.name} was recorded from other source of "
                           f"{', '.join(stale)}: re-record it (docs/compile-ahead.md)")
    if reasons:
        return None, "off (" + "; ".join(reasons) + ")"
    return path, f"the shipped manifest {path.parent.name}/{path.name}"


def source_hash(spec: str) -> Optional[str]:
    """The Triton source hash of the JIT function `module:qualname` in this process (None when it
    does not import, or is not a compiled JIT function: under TRITON_INTERPRET=1)."""
    try:
        return getattr(_resolve(spec), "cache_key", None)
    except Exception:
        return None


def stale_functions(manifest: dict) -> list[str]:
    """The manifest's JIT functions whose source here differs from the one recorded (or is gone)."""
    recorded = {e["fn"]: e.get("hash") for e in manifest["entries"]}
    return sorted(fn for fn, h in recorded.items() if source_hash(fn) != h)


def start(manifest_path, done_path, jobs: Optional[int] = None, log_path=None) -> subprocess.Popen:
    """Start the pool in a process of its own (it writes its summary to done_path when it ends)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "decode_conformance.compile_ahead", "precompile", str(manifest_path),
           "--done", str(done_path)] + (["--jobs", str(jobs)] if jobs else [])
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    from ._paths import checkout_root
    root = checkout_root()
    if root:  # a checkout that is not installed: the pool imports the package from it
        env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    (pathlib.Path(done_path).parent / "pool.pid").write_text(str(proc.pid))  # so a waiter sees a pool that died
    return proc


_WAITED: dict = {}


def wait(limit_s: float = WAIT_LIMIT_S) -> Optional[dict]:
    """Block, once per process, until the pool named by $DECODE_CONFORMANCE_COMPILE_AHEAD_DONE has
    written its summary (None when there is no pool; {"error": ...} past `limit_s`)."""
    done = os.environ.get(DONE_ENV)
    if not done:
        return None
    if done in _WAITED:
        return _WAITED[done]
    deadline = time.monotonic() + limit_s
    path = pathlib.Path(done)
    pid = _pool_pid(path)
    while not path.exists() and time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    try:
        _WAITED[done] = json.loads(path.read_text())
    except (OSError, ValueError):
        why = (f"the pool (pid {pid}) ended without a summary" if not _alive(pid)
               else f"no summary from the compile-ahead pool after {limit_s:.0f} s")
        _WAITED[done] = {"error": f"{why}; cases compile their own"}
    return _WAITED[done]


def _pool_pid(done: pathlib.Path) -> Optional[int]:
    try:
        return int((done.parent / "pool.pid").read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: Optional[int]) -> bool:
    """Unknown counts as alive (the wait is then bounded by its limit alone)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


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
    a = ap.parse_args(argv)
    from ._paths import alias_checkout
    alias_checkout()
    if a.cmd == "manifest":
        man = build_manifest(a.log_dir, a.gpu_class, {"note": a.note} if a.note else None)
        pathlib.Path(a.out).write_text(json.dumps(man, indent=1) + "\n")
        print(f"{len(man['entries'])} variants -> {a.out}")
        return 0
    try:
        summary = precompile(load_manifest(a.manifest), a.jobs)
    except Exception as e:  # the waiting processes must hear of it, not time out
        summary = {"error": f"the compile-ahead pool failed: {type(e).__name__}: {e}"}
    if a.done:
        tmp = pathlib.Path(a.done + ".tmp")
        tmp.write_text(json.dumps(summary))
        tmp.replace(a.done)
    print(summary_line(summary))
    return 0 if "error" not in summary and not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())

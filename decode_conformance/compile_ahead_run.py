"""When a pytest run compiles ahead (compile_ahead.py), and why no case waits for it.

The plugin asks `plan` at configure time (the controller): `--compile-ahead=off` (the default), a
manifest's path, or auto - the shipped manifest of the GPU class and the installed Triton, for the
run it was recorded from only (the shipped kernels on the whole parity suite, their source
unchanged). `start` launches the pool in a process group of its own at the lowest CPU priority,
and `stop` ends the group when the run ends.

The cases do not wait for the pool. They compile what they need when they need it, as without a
pool; the pool, at nice 19, takes only the cores they leave idle and fills Triton's cache ahead of
them. A variant already cached (a case compiled it first, or a warm cache) costs it a file read.

Why off by default (docs/compile-ahead.md has the runs): on a lent H100 a pool every case waited
for made the cold main job slower (56.6 s against 49.8 s without one), and a warm run waited for a
pool with nothing to compile; on another, this background pool was worth -1.3 s cold and +1.5 s
warm. Each worker's first cases need their variants at once, so the critical path is the workers'
own first compiles either way.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from typing import Optional

from .compile_ahead import ManifestError, load_manifest, manifest_name, resolve_function

POOL_NICE = 19  # the lowest priority: the pool runs on what the cases leave idle
PARITY_SUITE = ("suites", "parity")
PARITY_MODULE = "decode_conformance.suites.parity"


def shipped_manifest(gpu_class: str) -> Optional[pathlib.Path]:
    """The shipped manifest for this GPU class and the installed Triton, if there is one."""
    import triton
    from .resources import data_path
    try:
        p = data_path(*manifest_name(gpu_class, triton.__version__))
    except Exception:
        return None
    return p if p.is_file() else None


def whole_parity_suite(config) -> bool:
    """The run's arguments name the parity suite and nothing narrower: its folder (or, with
    --pyargs, its package), no file or test id, no -k / -m / --lf / --deselect / --ignore /
    --stepwise, no pytest-split group (ci/shards.py)."""
    args = list(config.args)
    if not args:
        return False
    for a in args:
        if getattr(config.option, "pyargs", False) and a.rstrip(".") == PARITY_MODULE:
            continue
        if "::" in a or pathlib.Path(a).resolve().parts[-2:] != PARITY_SUITE:
            return False
    opt = config.option
    narrowed = (config.getoption("keyword") or config.getoption("markexpr") or getattr(opt, "lf", False)
                or getattr(opt, "deselect", None) or getattr(opt, "ignore", None) or getattr(opt, "ignore_glob", None)
                or getattr(opt, "stepwise", False))
    return not narrowed and (getattr(opt, "splits", None) or 1) <= 1


def live_target() -> Optional[dict]:
    """This process's Triton target ({backend, arch, warp_size}), or None where there is none."""
    try:
        from triton.runtime import driver
        t = driver.active.get_current_target()
    except Exception:
        return None
    return {"backend": t.backend, "arch": t.arch, "warp_size": t.warp_size}


def misfit(manifest: dict, gpu_class: str, target: Optional[dict]) -> Optional[str]:
    """Why `manifest` cannot serve this run (None: it can): another Triton, GPU class or target."""
    import triton
    if manifest["triton"] != triton.__version__:
        return f"it was written by triton {manifest['triton']}; this is triton {triton.__version__}"
    if manifest["gpu_class"] != gpu_class:
        return f"it is for {manifest['gpu_class']}; this run's GPU class is {gpu_class}"
    if target is not None and manifest["target"] != target:
        return f"its target is {manifest['target']}; this GPU's is {target}"
    return None


def plan(config, state, target: Optional[dict] = None) -> tuple[Optional[pathlib.Path], str]:
    """(manifest to compile ahead from, or None; why). `--compile-ahead`: off (default); a manifest's
    path (any run; on a GPU it must fit it, else a usage error); auto: the shipped manifest,
    on a GPU, for the run it was recorded from - the shipped kernels on the whole parity suite,
    their source as recorded. `target`: the GPU's (default: Triton's active driver's)."""
    choice = config.getoption("--compile-ahead") or "off"
    on_gpu = state.device != "cpu"
    if choice == "off":
        return None, ("off (--compile-ahead=auto or a manifest's path turns it on)" if on_gpu
                      else "off (the CPU interpreter compiles nothing)")
    if on_gpu and target is None:
        target = live_target()
    if choice != "auto":  # asked for by name: also on the CPU, where nothing uses it but the wiring is tested
        path = pathlib.Path(choice)
        manifest = load_manifest(path)  # a bad one is a usage error here, before any process starts
        why = misfit(manifest, state.gpu_class, target) if on_gpu else None
        if why:
            raise ManifestError(f"--compile-ahead={choice}: {why}")
        return path, f"--compile-ahead={choice}"
    if not on_gpu:
        return None, "off (the CPU interpreter compiles nothing)"
    reasons = []
    if config.getoption("--kernel") or os.environ.get("DECODE_CONFORMANCE_KERNELS"):
        reasons.append("a --kernel selection (the manifest holds the shipped kernels' variants)")
    if state.case_set != "parity" or state.case_ids:
        reasons.append(f"case set {state.case_set}{' filtered by --case-id' if state.case_ids else ''}")
    if not whole_parity_suite(config):
        reasons.append("not the whole parity suite (other paths, a file, a test id, -k/-m/--lf/--deselect/--ignore, "
                       "or one group of --splits)")
    path = shipped_manifest(state.gpu_class)
    if path is None:
        import triton
        reasons.append(f"no shipped manifest for {state.gpu_class} and triton {triton.__version__}")
    else:
        name = f"the shipped manifest {path.parent.name}/{path.name}"
        try:
            manifest = load_manifest(path)
        except ManifestError as e:
            reasons.append(f"{name} is unreadable: {e}")
        else:
            why = misfit(manifest, state.gpu_class, target)
            stale = [] if why else stale_functions(manifest)
            if why:
                reasons.append(f"{name} does not fit: {why}")
            elif stale:  # the cases would compile other variants than the pool: all cost, no gain
                reasons.append(f"{name} was recorded from other source of {', '.join(stale)}: re-record it "
                               f"(docs/compile-ahead.md)")
    if reasons:
        return None, "off (" + "; ".join(reasons) + ")"
    return path, name


def source_hash(spec: str) -> Optional[str]:
    """The Triton source hash of the JIT function `module:qualname` in this process (None when it
    does not import, or is not a compiled JIT function: under TRITON_INTERPRET=1)."""
    try:
        return getattr(resolve_function(spec), "cache_key", None)
    except Exception:
        return None


def stale_functions(manifest: dict) -> list[str]:
    """The manifest's JIT functions whose source here differs from the one recorded (or is gone)."""
    recorded = {e["fn"]: e.get("hash") for e in manifest["entries"]}
    return sorted(fn for fn, h in recorded.items() if source_hash(fn) != h)


def start(manifest_path, summary_path, jobs: Optional[int] = None, log_path=None) -> subprocess.Popen:
    """Start the pool in a process group of its own at nice POOL_NICE (it writes its summary to
    summary_path when it ends). A thread of this process reaps it, so a pool that dies does not
    linger as a zombie."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "decode_conformance.compile_ahead", "precompile", str(manifest_path),
           "--done", str(summary_path), "--nice", str(POOL_NICE)] + (["--jobs", str(jobs)] if jobs else [])
    from ._paths import checkout_root
    root = checkout_root()
    if root:  # a checkout that is not installed: the pool imports the package from it
        env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log_path:
            out.close()  # the pool has its own copy
    threading.Thread(target=proc.wait, name="compile-ahead-reaper", daemon=True).start()
    return proc


def stop(proc: subprocess.Popen) -> None:
    """End the pool and the compile processes it started (a run that ended before it did)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def read_summary(summary_path) -> Optional[dict]:
    """The pool's summary, if it has written one (None: it had not finished)."""
    try:
        return json.loads(pathlib.Path(summary_path).read_text())
    except (OSError, ValueError):
        return None

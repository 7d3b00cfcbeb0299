"""When a pytest run compiles ahead (compile_ahead.py), and how its processes wait for the pool.

The plugin asks `plan` at configure time (the controller): `--compile-ahead=off`, a manifest's path,
or auto - the shipped manifest of the GPU class and the installed Triton, for the run it was
recorded from only (the shipped kernels on the whole parity set, their source unchanged). `start`
launches the pool in a process of its own; every process that runs cases inherits
$DECODE_CONFORMANCE_COMPILE_AHEAD_DONE and `wait`s for the pool's summary before its first case
(door.py), for at most WAIT_LIMIT_S or until the pool's process is gone.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Optional

from .compile_ahead import load_manifest, manifest_name, resolve_function

DONE_ENV = "DECODE_CONFORMANCE_COMPILE_AHEAD_DONE"  # the pool's summary file, for the processes that wait
# How long a process waits for the pool before compiling for itself: a pool on 16 cores took
# (estimate) 15-20 s for the ~300 variants of the H200's main job; far past that, something is wrong.
WAIT_LIMIT_S = 300.0


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
        return getattr(resolve_function(spec), "cache_key", None)
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

"""Fill flashinfer's JIT cache before a parity run, so pytest's workers find every module built.

flashinfer compiles one module per configuration (path, q / KV dtypes, head dims, window,
soft-cap) on first use, ~11 s each; 16 xdist workers meeting the same cold modules compile
them concurrently and a parity run of the six flashinfer adapters overruns a 10-minute GPU
command. This plans and launches one representative parity case per distinct configuration,
in a pool of processes, with the same FLASHINFER_WORKSPACE_BASE the parity run uses; the
graph forms share their eager form's modules, so they are warmed through it.

    python benchmarks/flashinfer_warm.py --jobs 4 [--kernel flashinfer_decode ...]

Prints one line per configuration (seconds, ok / the error) and the total; exits 0 whatever
the cases' verdicts (judging is the parity run's job), 1 when a launch raised.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()  # the kernels package, as pytest's conftest aliases it (also in spawned workers)

KERNELS = ("flashinfer_decode", "flashinfer_decode_tc", "flashinfer_mla", "flashinfer_mla_fa3")
REGISTRY = "decode_conformance_kernels.registry:"


def module_key(name: str, case) -> tuple:
    """What flashinfer's JIT module for this case depends on (a superset is harmless)."""
    return (name, case.kv_dtype, case.head_dim, case.v_head_dim, case.window is not None,
            case.softcap is not None)


def plan_configs(names, profile: str = "gpu"):
    from decode_conformance.case_sets import build_set
    from decode_conformance.kernel_api import load_kernel
    cases = build_set("parity", profile)
    todo = {}
    for name in names:
        k = load_kernel(REGISTRY + name)
        if k.caps.unavailable:
            print(f"{name}: {k.caps.unavailable}", flush=True)
            continue
        for c in cases:
            if not k.caps.missing_for(c, "cuda"):
                key = module_key(name, c)
                if key not in todo or sum(c.seq_lens) < sum(todo[key].seq_lens):
                    todo[key] = c  # the cheapest case of the configuration
    return todo


def warm(name: str, case_id: str) -> tuple[float, str]:
    from decode_conformance.case_sets import build_set
    from decode_conformance.kernel_api import load_kernel
    from decode_conformance.runner import prepare
    case = next(c for c in build_set("parity", "gpu") if c.id == case_id)
    k = load_kernel(REGISTRY + name)
    t0 = time.perf_counter()
    try:
        k.plan(prepare(k, case, "cuda"))()
        import torch
        torch.cuda.synchronize()
        return time.perf_counter() - t0, "ok"
    except Exception as e:  # reported, not judged: the parity run gives the verdict
        return time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:200]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4, help="processes compiling at once (each runs MAX_JOBS ninja jobs)")
    ap.add_argument("--kernel", action="append", choices=KERNELS, help="default: all four eager forms")
    a = ap.parse_args(argv)
    todo = plan_configs(a.kernel or KERNELS)
    print(f"{len(todo)} flashinfer module configurations", flush=True)
    t0, raised = time.perf_counter(), 0
    ctx = multiprocessing.get_context("spawn")  # CUDA in each worker
    with cf.ProcessPoolExecutor(a.jobs, mp_context=ctx) as pool:
        futs = {pool.submit(warm, key[0], c.id): (key, c.id) for key, c in todo.items()}
        for f in cf.as_completed(futs):
            key, cid = futs[f]
            secs, what = f.result()
            raised += what != "ok"
            print(f"{secs:6.1f}s {key[0]} {cid}: {what}", flush=True)
    print(f"warmed in {time.perf_counter() - t0:.0f}s, {raised} raised", flush=True)
    return 1 if raised else 0


if __name__ == "__main__":
    raise SystemExit(main())

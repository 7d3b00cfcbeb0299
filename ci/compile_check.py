"""Compile the shipped Triton kernels for GPU targets on a CPU-only machine.

Triton's interpreter accepts code the GPU compiler rejects (`break` or `return` inside a loop,
types a target lacks, shared memory over the limit), so a CPU-green CI can still ship a kernel
that does not build on any GPU. This check records the launches our host code makes (the
kernel, its arguments and constexprs) without running them, then runs `triton.compile` for each
target: NVIDIA sm_80/sm_90/sm_120 and AMD gfx942/gfx950 (compile only: nothing here runs them).

    python ci/compile_check.py                 # every variant, every target (minutes)
    python ci/compile_check.py --quick         # a representative subset (CI)

Uses Triton internals that moved between releases (checked on 3.6 and 3.9); the check says so
and exits 2 when they are missing rather than passing silently.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from decode_conformance import _paths  # noqa: E402

_paths.alias_kernels()

TARGETS = {
    "sm_80": (GPUTarget("cuda", 80, 32), 166912),
    "sm_90": (GPUTarget("cuda", 90, 32), 232448),
    "sm_120": (GPUTarget("cuda", 120, 32), 101376),
    "gfx942": (GPUTarget("hip", "gfx942", 64), 65536),
    "gfx950": (GPUTarget("hip", "gfx950", 64), 163840),
}

_RECORDED: list = []


def _recording_getitem(self, grid):
    def record(*args, **kwargs):
        _RECORDED.append((self, args, kwargs))
    return record


def _binder(jf, backend):
    try:
        from triton.runtime.jit import create_function_from_signature
    except ImportError as e:  # pragma: no cover - depends on the Triton release
        raise SystemExit(f"compile check: this Triton ({triton.__version__}) lacks "
                         f"triton.runtime.jit.create_function_from_signature: {e}") from e
    return create_function_from_signature(jf.signature, jf.params, backend)


def variants(quick: bool):
    shapes = [(32, 8, 128, 128, False), (16, 2, 256, 256, False), (16, 1, 576, 512, True)]
    if not quick:
        shapes += [(4, 4, 64, 64, False), (8, 1, 80, 80, False), (128, 1, 96, 96, False), (16, 1, 288, 256, True)]
    dtypes = [torch.bfloat16, torch.float8_e4m3fn] if quick else \
        [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
    for kvdt in dtypes:
        qdt = torch.float16 if kvdt == torch.float16 else torch.bfloat16
        for hq, hkv, dk, dv, mla in shapes:
            for page in ((16,) if quick else (1, 16)):
                for softcap, sinks in ((0.0, False), (30.0, True)):
                    yield dict(qdt=qdt, kvdt=kvdt, hq=hq, hkv=hkv, dk=dk, dv=dv, mla=mla, page=page,
                               softcap=softcap, sinks=sinks)


def _tensors(v):
    B = 2
    q = torch.zeros(B, v["hq"], v["dk"], dtype=v["qdt"])
    k = torch.zeros(8, v["page"], v["hkv"], v["dk"], dtype=v["kvdt"])
    vc = k[..., :v["dv"]] if v["mla"] else torch.zeros(8, v["page"], v["hkv"], v["dv"], dtype=v["kvdt"])
    indptr = torch.zeros(B + 1, dtype=torch.int32)
    idx = torch.zeros(4, dtype=torch.int32)
    out = torch.zeros(B, v["hq"], v["dv"], dtype=v["qdt"])
    lse = torch.zeros(B, v["hq"])
    sinks = torch.zeros(v["hq"]) if v["sinks"] else None
    return q, k, vc, indptr, idx, out, lse, sinks


def record_launches(target_name: str, quick: bool) -> list:
    from decode_conformance_kernels import lean, triton_common as tc
    from decode_conformance_kernels.adaptive_split import decode_attention_adaptive
    from decode_conformance_kernels.fixed_split import decode_attention_fixed
    target, smem = TARGETS[target_name]
    is_hip = target.backend == "hip"
    saved = JITFunction.__getitem__
    JITFunction.__getitem__ = _recording_getitem
    _RECORDED.clear()
    try:
        for v in variants(quick):
            q, k, vc, indptr, idx, out, lse, sinks = _tensors(v)
            # Triton has no e4m3 type below sm_89: the split-K kernels pass its bytes as uint8.
            tc.FORCE_E4M3_BITS = target_name == "sm_80"
            cfg = tc.gpu_config(v["dk"], v["dv"], v["mla"], smem, is_hip=is_hip)
            common = dict(sm_scale=0.1, lse=lse, softcap=v["softcap"], sinks=sinks, window=64, **cfg)
            decode_attention_fixed(q, k, vc, indptr, idx, out, num_splits=8, **common)
            decode_attention_adaptive(q, k, vc, indptr, idx, out, splits=64, **common)
            if not v["sinks"] and not (target_name == "sm_80" and v["kvdt"] == torch.float8_e4m3fn):
                d1 = min(v["dk"], v["dv"])
                block_n = (64 if d1 <= 128 else 32) if is_hip else (128 if d1 <= 128 else 64)
                lean.plan_lean(q, k, vc, indptr, idx, out, lse, sm_scale=0.1, window=64, programs=132,
                               block_n=block_n, num_warps=4 if (not is_hip or d1 <= 128) else 8, num_stages=2)()
    finally:
        JITFunction.__getitem__ = saved
        tc.FORCE_E4M3_BITS = False
    return list(_RECORDED)


def compile_all(target_names, quick: bool, log=print) -> tuple[int, list[str]]:
    ok, failures, seen = 0, [], set()
    for name in target_names:
        target, smem = TARGETS[name]
        backend = make_backend(target)
        for jf, args, kwargs in record_launches(name, quick):
            bound, spec, options = _binder(jf, backend)(*args, **kwargs)
            options, signature, constexprs, attrs = jf._pack_args(backend, kwargs, bound, spec, options)
            key = (name, jf.fn.__name__, str(sorted(signature.items())), str(sorted(constexprs.items(), key=str)),
                   str(options))
            if key in seen:
                continue
            seen.add(key)
            try:
                compiled = triton.compile(ASTSource(jf, signature, constexprs, attrs), target=target,
                                          options=options.__dict__)
            except Exception as e:  # report every variant, not just the first
                failures.append(f"{name} {jf.fn.__name__}: {type(e).__name__}: {str(e)[:500]}")
                continue
            if compiled.metadata.shared > smem:
                failures.append(f"{name} {jf.fn.__name__}: shared memory {compiled.metadata.shared} > {smem}")
            else:
                ok += 1
        log(f"{name}: {ok} compiled so far, {len(failures)} failures")
    return ok, failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    args = ap.parse_args(argv)
    t0 = time.time()
    ok, failures = compile_all(args.targets, args.quick)
    for f in failures:
        print("FAIL", f)
    print(f"{ok} kernel variants compiled, {len(failures)} failed, triton {triton.__version__}, "
          f"{time.time() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

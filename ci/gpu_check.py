#!/usr/bin/env python3
"""First step of every GPU job: the runner's GPU is the class its label names and torch is
the matching build, so results and baselines are never filed under the wrong class.

    python ci/gpu_check.py --vendor nvidia --gpu-class sm_90

Prints torch, driver/runtime version, GPU count and the pinning variable; exits 1 with the
reason when the torch build, the GPU or the class does not match.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent


def verdict(vendor: str, want: str, *, is_rocm: bool, has_gpu: bool, detected: Optional[str],
            known: dict) -> Optional[str]:
    """Why this runner must not run class `want` of `vendor` (None: it may)."""
    if want not in known:
        return f"class {want!r} is not a row of fixtures/gpu_classes.toml"
    if known[want]["vendor"] != vendor:
        return f"class {want} is a {known[want]['vendor']} class, this is the {vendor} job"
    if vendor == "amd" and not is_rocm:
        return "torch is not a ROCm build (torch.version.hip is None): install it from the ROCm wheel index"
    if vendor == "nvidia" and is_rocm:
        return "torch is a ROCm build on an NVIDIA job: use a CUDA build of torch"
    if not has_gpu:
        hint = "HIP_VISIBLE_DEVICES, /dev/kfd and /dev/dri access" if is_rocm else "CUDA_VISIBLE_DEVICES, the driver"
        return f"torch sees no GPU (a CPU-only torch build? {hint})"
    if detected != want:
        return f"runner labelled {want} but its GPU is class {detected}: fix the runner's labels"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vendor", choices=("nvidia", "amd"), required=True)
    ap.add_argument("--gpu-class", required=True)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import tomllib

    import torch
    from decode_conformance import hardware
    with open(ROOT / "fixtures" / "gpu_classes.toml", "rb") as f:
        known = tomllib.load(f)
    rocm, gpu = hardware.is_rocm(), hardware.has_gpu()
    detected = hardware.detect_class() if gpu else None
    var = hardware.visible_devices_var(rocm)
    print(f"torch {torch.__version__}, {'HIP ' + str(torch.version.hip) if rocm else 'CUDA ' + str(torch.version.cuda)}, "
          f"{hardware.gpu_count()} GPU(s), class {detected}, {var}={os.environ.get(var, '<unset: all>')}")
    for i in range(hardware.gpu_count()):
        print(f"  {i}: {torch.cuda.get_device_name(i)}")
    why = verdict(a.vendor, a.gpu_class, is_rocm=rocm, has_gpu=gpu, detected=detected, known=known)
    if why:
        print(f"::error::{why}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

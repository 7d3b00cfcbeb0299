"""GPUs for pytest-xdist workers: how many workers `-n auto` starts, and which GPU each gets.

Correctness suites are bound by host work (building cases, the float64 reference, Triton
launches), so `-n auto` on a GPU machine starts WORKERS_PER_GPU workers per visible GPU (at
most the CPU count, and no more than leave each light case its memory budget:
device_memory.workers_fitting), pinned round robin: each worker's CUDA_VISIBLE_DEVICES
(HIP_VISIBLE_DEVICES on ROCm) names one GPU, so it sees exactly one device as cuda:0 and a
crash or illegal access stays there. A run of the perf suite alone gets one worker per GPU
(and the perf suite refuses to time under xdist anyway: its GPU must be its own).
"""
from __future__ import annotations

import os
import pathlib

import pytest

from . import hardware

# Cold, the main job is Triton compiling ~330 kernel variants, each worker those its cases need. On
# one 16-core H200, 16 workers were 3 s faster than 12 but left too little device memory per
# worker for the 8 GB overflow cases (docs/gpu-runs/2026-11-30-h200-cold/, 2026-12-01-h200/);
# since such cases take a slot (device_memory), on one fresh H100 16 workers ran 42.6 and 43.9 s
# against 12's 50.1 and 47.7, skipping the same 134 cases (docs/gpu-runs/2026-12-06-h100-s43).
WORKERS_PER_GPU = 16
WORKERS_PER_GPU_ENV = "DECODE_CONFORMANCE_WORKERS_PER_GPU"  # the user's request, read here only
SHARING_ENV = "DECODE_CONFORMANCE_WORKERS_SHARING_GPU"  # what each worker is told, state.workers_sharing_device


def _on_gpu(config) -> bool:
    return hardware.gpu_count() > 0 and (config.getoption("--device") or "cuda") != "cpu"


def _perf_only(config) -> bool:
    args = [a.split("::")[0] for a in config.args]
    return bool(args) and all(pathlib.PurePath(a.replace(".", "/")).name == "perf" or "/perf" in a.replace(".", "/")
                              for a in args)


def workers_per_gpu(config) -> int:
    if _perf_only(config):
        return 1
    gpus = len(hardware.parent_visible_ids())
    by_cpus = (os.cpu_count() or 1) // max(1, gpus)
    raw = os.environ.get(WORKERS_PER_GPU_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise pytest.UsageError(f"{WORKERS_PER_GPU_ENV}={raw!r}: expected a whole number of xdist workers per "
                                    "GPU, at least 1 (unset: as many as the CPUs and the GPU's memory allow)")
        return max(1, min(int(raw), by_cpus))
    from .device_memory import workers_fitting
    by_memory = min((workers_fitting(t) for t in hardware.gpu_memory_totals()), default=WORKERS_PER_GPU)
    return max(1, min(WORKERS_PER_GPU, by_cpus, by_memory))


def auto_num_workers(config):
    if not _on_gpu(config):
        return None  # xdist's default: the CPU count
    return len(hardware.parent_visible_ids()) * workers_per_gpu(config)


def assign(specs, ids: list[str], var: str, per_gpu: int = 1) -> None:
    for i, spec in enumerate(specs):
        gpu = hardware.pin_for_worker(i, ids)
        if gpu is not None:
            spec.env[var] = gpu
            spec.env[SHARING_ENV] = str(-(-len(specs) // len(ids)))


def setup_nodes(config, specs) -> None:
    if not _on_gpu(config):
        return
    assign(specs, hardware.parent_visible_ids(), hardware.visible_devices_var())

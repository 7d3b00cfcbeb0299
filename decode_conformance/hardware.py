"""GPU class, device count and memory of the machine under test.

How to add a GPU class: add a row to `fixtures/gpu_classes.toml`, named as `classify()` names
the device (memory, whether it has fp8 tensor cores; to compile for it in ci/compile_check.py,
its compile_arch, warp size and shared-memory limit) and, if the detection rule is new, one
line in `classify()`. Everything class-specific (baselines, ledgers, gate calibration) is keyed
by the class name. The SM count is not a row's: kernels read it from the device at run time
(`kernels/split_rule.num_sms`). The files outside this package a new class touches (runner
labels, CI class lists, the Lean gate table): README.md, "Where things are".
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Union

CLASSES_FILE = "gpu_classes.toml"  # in the shipped data (decode_conformance.fixtures)
CPU_CLASS = "cpu"


@dataclass(frozen=True)
class GpuClass:
    name: str
    vendor: str  # nvidia | amd | cpu
    memory_gb: float
    fp8_tensor_cores: bool
    description: str
    # Compile-target facts (ci/compile_check.py): None on classes that are not compiled for.
    compile_arch: Optional[Union[int, str]] = None  # CUDA compute capability as 90, or the gfx name
    warp_size: Optional[int] = None
    shared_memory_bytes: Optional[int] = None  # one program's shared memory (LDS) limit


@lru_cache(maxsize=None)
def known_classes(path: Optional[str] = None) -> dict[str, GpuClass]:
    if path is None:
        from .resources import data_path
        path = str(data_path(CLASSES_FILE))
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = {}
    for name, row in data.items():
        for key in ("vendor", "memory_gb", "fp8_tensor_cores", "description"):
            if key not in row:
                raise ValueError(f"{path}: class {name!r} lacks field {key!r}")
        if "compile_arch" in row:
            for key in ("warp_size", "shared_memory_bytes"):
                if not isinstance(row.get(key), int) or row[key] < 1:
                    raise ValueError(f"{path}: class {name!r} has a compile_arch, so field {key!r} must be a "
                                     f"positive int, got {row.get(key)!r}")
        out[name] = GpuClass(name=name, vendor=row["vendor"], memory_gb=float(row["memory_gb"]),
                             fp8_tensor_cores=bool(row["fp8_tensor_cores"]), description=row["description"],
                             compile_arch=row.get("compile_arch"), warp_size=row.get("warp_size"),
                             shared_memory_bytes=row.get("shared_memory_bytes"))
    return out


def classify(*, is_hip: bool, capability: Optional[tuple[int, int]] = None, arch_name: Optional[str] = None) -> str:
    """Class name from what the driver reports: NVIDIA compute capability -> sm_XY;
    ROCm gcnArchName ('gfx942:sramecc+:xnack-') -> gfx942."""
    if is_hip:
        if not arch_name:
            raise ValueError("classify: a ROCm device needs arch_name (torch's gcnArchName)")
        return arch_name.split(":", 1)[0].strip()
    if capability is None:
        raise ValueError("classify: an NVIDIA device needs capability (major, minor)")
    major, minor = capability
    return f"sm_{major}{minor}"


def is_rocm() -> bool:
    import torch
    return getattr(torch.version, "hip", None) is not None


def has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def detect_class(device_index: int = 0) -> str:
    if not has_gpu():
        return CPU_CLASS
    import torch
    props = torch.cuda.get_device_properties(device_index)
    if is_rocm():
        return classify(is_hip=True, arch_name=getattr(props, "gcnArchName", ""))
    return classify(is_hip=False, capability=(props.major, props.minor))


def visible_devices_var(rocm: Optional[bool] = None) -> str:
    """The variable that pins a process to GPUs: HIP_VISIBLE_DEVICES on ROCm."""
    if rocm is None:
        rocm = is_rocm()
    return "HIP_VISIBLE_DEVICES" if rocm else "CUDA_VISIBLE_DEVICES"


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if has_gpu() else 0


def gpu_memory_totals() -> list[int]:
    """Total memory in bytes of each GPU this process sees. Reading a device's properties opens
    no CUDA context (checked on an H100, docs/gpu-runs/2026-12-06-h100-s43)."""
    import torch
    return [int(torch.cuda.get_device_properties(i).total_memory) for i in range(gpu_count())]


def parent_visible_ids(env: Optional[dict] = None, count: Optional[int] = None, rocm: Optional[bool] = None) -> list[str]:
    """GPU ids the parent process may hand out, honouring an existing *_VISIBLE_DEVICES."""
    env = os.environ if env is None else env
    var = visible_devices_var(rocm)
    if env.get(var, "").strip():
        return [x.strip() for x in env[var].split(",") if x.strip()]
    n = gpu_count() if count is None else count
    return [str(i) for i in range(n)]


def pin_for_worker(worker_index: int, ids: list[str]) -> Optional[str]:
    """The single GPU id worker `worker_index` gets (round robin), or None with no GPU."""
    if not ids:
        return None
    return ids[worker_index % len(ids)]

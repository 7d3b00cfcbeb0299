"""One GPU per pytest-xdist worker, pinned before the worker process starts.

`-n auto` means one worker per visible GPU on a GPU machine (the CPU count otherwise).
Each worker's spec gets CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on ROCm) set to one id,
so the worker sees exactly one device as cuda:0 and a crash or illegal access stays there.
"""
from __future__ import annotations

import pytest

from . import hardware


def pytest_xdist_auto_num_workers(config):
    n = hardware.gpu_count()
    if n and (config.getoption("--device") or "cuda") != "cpu":
        return len(hardware.parent_visible_ids(count=n))
    return None  # xdist's default: the CPU count


def assign(specs, ids: list[str], var: str) -> None:
    for i, spec in enumerate(specs):
        gpu = hardware.pin_for_worker(i, ids)
        if gpu is not None:
            spec.env[var] = gpu


@pytest.hookimpl
def pytest_xdist_setupnodes(config, specs):
    if (config.getoption("--device") or "") == "cpu" or not hardware.has_gpu():
        return
    assign(specs, hardware.parent_visible_ids(), hardware.visible_devices_var())

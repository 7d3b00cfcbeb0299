"""A pytest plugin for test_hardware: in xdist workers, writes a line to $DC_GPU_PROBE_LOG each
time the suite asks whether there is a GPU (`hardware.has_gpu`, which imports torch)."""
from __future__ import annotations

import os

import pytest


@pytest.hookimpl(tryfirst=True)  # before the suite's plugin builds its state
def pytest_configure(config):
    if getattr(config, "workerinput", None) is None:
        return
    from decode_conformance import hardware
    real = hardware.has_gpu

    def counted() -> bool:
        with open(os.environ["DC_GPU_PROBE_LOG"], "a") as f:
            f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '?')}\n")
        return real()

    hardware.has_gpu = counted

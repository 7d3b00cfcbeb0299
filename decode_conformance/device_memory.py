"""Sharing one GPU between several xdist workers (see `xdist_pinning`): keep the memory each
worker leaves reserved between cases small, and bound how many memory-heavy cases hold the GPU
at once.

Why: PyTorch's caching allocator keeps the blocks of every case a process has run, so after a
few large cases each worker holds gigabytes it no longer uses. Measured on one H200 with 16 and
12 workers (docs/gpu-runs/2026-11-30-h200-cold/, run 1): single processes held 8-15 GB, and the
4-8 GB pools of the int32-overflow regression cases (fa2709) then failed to allocate (9 and 1
out-of-memory failures). A case's own need is `memory.case_bytes`; what a kernel adds on top
(scratch, gathers) is unknown to us, so a heavy case takes one of a few slots sized with room
to spare rather than a byte budget.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import re
import tempfile
import time

IDLE_RESERVE_BYTES = 1 << 30  # reserved-but-free memory a process may keep between cases
HEAVY_CASE_BYTES = 2 << 30  # a case estimated at or above this runs in a slot
SLOT_BYTES = 16 << 30  # what one slot stands for: the largest GPU-profile case (8.6 GB est.) x ~2
SLOT_SHARE = 0.5  # of the GPU's memory, the rest for the workers' contexts and light cases
FREE_SHARE = 0.9  # of a worker's share of the free memory, what a light case may count on
POLL_S = 0.02
CONTEXT_BYTES = 512 << 20  # a CUDA context, each worker's isolated process holds one: 518 MiB on an H100


def workers_fitting(total_bytes: int) -> int:
    """Workers that may share a GPU of `total_bytes` while each light case (below
    HEAVY_CASE_BYTES) keeps its budget, `case_budget`'s share of the free memory: free / workers
    x FREE_SHARE >= HEAVY_CASE_BYTES, the free memory being the total less each worker's context.
    An 80 GB card fits 29, a 24 GB card 8."""
    return max(1, int(total_bytes // (HEAVY_CASE_BYTES / FREE_SHARE + CONTEXT_BYTES)))


def slot_count(total_bytes: int) -> int:
    """Heavy cases that may run at once on a GPU of `total_bytes` (at least one)."""
    return max(1, int(total_bytes * SLOT_SHARE) // SLOT_BYTES)


def runs_in_slot(need_bytes: int, workers: int) -> bool:
    """A case of `need_bytes` (memory.case_bytes) takes a slot: it is heavy and the GPU is shared
    (slots are POSIX file locks)."""
    return workers > 1 and need_bytes >= HEAVY_CASE_BYTES and hasattr(os, "getuid")


def case_budget(need_bytes: int, free_bytes: int, total_bytes: int, workers: int) -> float:
    """The device memory a case of `need_bytes` may count on when `workers` processes share a GPU
    with `free_bytes` free of `total_bytes`: a light case, its worker's share of the free memory.
    A heavy case runs in a slot, and at most `slot_count` of them at once, so it may count on a
    slot's memory (SLOT_BYTES, or less where the free memory no longer covers the slots) however
    many workers share the GPU. Before slots counted here, an 80 GB card with 12 workers skipped
    the 8 GB overflow cases (5.5 GB "free for this worker") that its two slots had room for."""
    share = free_bytes / max(1, workers) * FREE_SHARE
    if not runs_in_slot(need_bytes, workers):
        return share
    return max(share, min(SLOT_BYTES, free_bytes * SLOT_SHARE / slot_count(total_bytes)))


def free_and_total(device: str) -> tuple[int, int]:
    """(free, total) bytes of `device` now, for the cases' budgets. NVIDIA's management library
    (NVML) answers without a CUDA context; torch's `mem_get_info` opens one in the asking
    process, and a pytest worker that runs its cases in an isolated process (isolation.py)
    otherwise never would: on a 12-worker H100 run the read took 0.87 s of each worker's start-up
    while twenty-four processes imported torch, and each context held device memory for the whole
    run (docs/gpu-runs/2026-12-06-h100-s42; without it, s43: the first test 1.5-1.9 s sooner).
    NVML's total is 0.5 GB above CUDA's, which leaves `slot_count` the same on an H100 and an
    H200. torch answers where NVML cannot: ROCm, a MIG instance, no library."""
    import torch
    props = torch.cuda.get_device_properties(torch.device(device))
    read = None if getattr(torch.version, "hip", None) else nvml_free_and_total(f"GPU-{props.uuid}")
    if read is not None:
        return read
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return int(free), int(total)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_free_and_total(uuid: str, library: str = "libnvidia-ml.so.1"):
    """(free, total) bytes of the GPU whose NVML UUID is `uuid` ("GPU-..."), or None where the
    library is missing or any call fails (its return codes are nonzero on error)."""
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        memory = _NvmlMemory()
        if (nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != 0
                or nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0):
            return None
        return int(memory.free), int(memory.total)
    finally:
        nvml.nvmlShutdown()


def trim(device=None, limit: int = IDLE_RESERVE_BYTES) -> bool:
    """Return cached, unused device memory to the driver when more than `limit` bytes of it
    sit in this process's allocator for `device`. True when it did."""
    import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    if torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) <= limit:
        return False
    torch.cuda.empty_cache()
    return True


class SlotLock:
    """One of `slots` advisory file locks in `directory`: a counting semaphore between
    processes that needs no server and is released by the OS when its holder dies."""

    def __init__(self, directory: pathlib.Path, slots: int):
        self.directory = pathlib.Path(directory)
        self.slots = max(1, slots)
        self._fh = None

    def __enter__(self):
        import fcntl
        self.directory.mkdir(parents=True, exist_ok=True)
        start = os.getpid() % self.slots
        while True:
            for k in range(self.slots):
                fh = open(self.directory / f"slot-{(start + k) % self.slots}.lock", "a+")
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    fh.close()
                    continue
                self._fh = fh
                return self
            time.sleep(POLL_S)

    def __exit__(self, *exc):
        import fcntl
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None
        return False


def _lock_dir() -> pathlib.Path:
    """One directory per physical GPU: workers pinned to it share its slots."""
    from . import hardware
    gpu = os.environ.get(hardware.visible_devices_var(), "") or "all"
    return (pathlib.Path(tempfile.gettempdir()) / f"decode-conformance-{os.getuid()}"
            / f"gpu-{re.sub(r'[^0-9A-Za-z_-]', '_', gpu)}")


@contextlib.contextmanager
def case_on_shared_gpu(case, device: str, workers: int):
    """Around one case on `device`: a slot when the case is heavy and other workers share the
    GPU; afterwards this process's idle reserve trimmed."""
    if not str(device).startswith("cuda"):
        yield
        return
    from .memory import case_bytes
    slot = contextlib.nullcontext()
    if runs_in_slot(case_bytes(case), workers):
        import torch
        slot = SlotLock(_lock_dir(), slot_count(torch.cuda.get_device_properties(torch.device(device)).total_memory))
    with slot:
        try:
            yield
        finally:
            trim(device)

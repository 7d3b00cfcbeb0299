"""GPU sharing between xdist workers (decode_conformance.device_memory), on the CPU: the slot
arithmetic, the cross-process slot lock, and when the allocator's idle reserve is returned."""
from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from decode_conformance import device_memory
from decode_conformance.cases import Case

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="file locks need a POSIX system")
GiB = 1 << 30


@pytest.mark.parametrize("total_gib,slots", [(139.8, 4), (80, 2), (40, 1), (24, 1), (0, 1)])
def test_slot_count_from_total_memory(total_gib, slots):
    # half the memory in 16 GiB slots, never none
    assert device_memory.slot_count(int(total_gib * GiB)) == slots


@pytest.mark.parametrize("total_bytes,workers", [
    (85_017_493_504, 29),  # an H100 80GB's total as CUDA reports it (79.2 GiB)
    (24 << 30, 8), (16 << 30, 5), (1 << 30, 1),
])
def test_workers_fitting_keeps_a_light_case_within_its_share(total_bytes, workers):
    assert device_memory.workers_fitting(total_bytes) == workers
    light = device_memory.HEAVY_CASE_BYTES - 1

    def budget(w):  # what case_budget gives the largest light case with w workers' contexts open
        free = total_bytes - w * device_memory.CONTEXT_BYTES
        return device_memory.case_budget(light, free, total_bytes, w)
    assert workers == 1 or budget(workers) >= light
    assert budget(workers + 1) < light


@pytest.mark.parametrize("need_gib,free_gib,total_gib,workers,budget_gib", [
    # an 80 GB card, 12 workers: a light case gets its worker's share, 78 / 12 x 0.9
    (1.0, 78, 80, 12, 78 / 12 * 0.9),
    # the 8 GB overflow case is heavy: one of the card's two slots, 16 GiB (78 x 0.5 / 2 = 19.5 covers it)
    (8.0, 78, 80, 12, 16),
    # a heavy case larger than a slot still does not fit
    (20.0, 78, 80, 12, 16),
    # an H200 and 16 workers: the share (7.6) would skip it; one of 4 slots does not
    (8.0, 135, 139.8, 16, 16),
    # free memory that no longer covers the slots (another tenant): the slots' part of it
    (8.0, 40, 80, 12, 40 * 0.5 / 2),
    # one worker: no slots, the whole free memory (x 0.9)
    (8.0, 78, 80, 1, 78 * 0.9),
])
def test_case_budget(need_gib, free_gib, total_gib, workers, budget_gib):
    got = device_memory.case_budget(int(need_gib * GiB), int(free_gib * GiB), int(total_gib * GiB), workers)
    assert got / GiB == pytest.approx(budget_gib, rel=1e-6)


def _hold(lock_factory, log, hold_s, barrier):
    barrier.wait(60)  # every holder contends at once, however long its process took to start
    with lock_factory():
        t0 = time.time()
        time.sleep(hold_s)
        t1 = time.time()
    with open(log, "a") as f:
        f.write(json.dumps([t0, t1]) + "\n")


class _Slots:  # picklable factory for the spawned holders
    def __init__(self, directory, slots):
        self.directory, self.slots = directory, slots

    def __call__(self):
        return device_memory.SlotLock(self.directory, self.slots)


class _NoLock:
    def __call__(self):
        import contextlib
        return contextlib.nullcontext()


def _max_overlap(log) -> int:
    spans = [json.loads(line) for line in open(log)]
    events = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def _run_holders(factory, log, n=4, hold_s=1.0):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_hold, args=(factory, str(log), hold_s, barrier)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        assert p.exitcode == 0
    return _max_overlap(log)


def test_slot_lock_bounds_concurrent_holders(tmp_path):
    assert _run_holders(_Slots(tmp_path / "gpu-0", 2), tmp_path / "slots.log") == 2
    # the same measurement without the lock sees all four at once: the check can fail
    assert _run_holders(_NoLock(), tmp_path / "none.log") == 4


def _die_holding(directory):
    lock = device_memory.SlotLock(directory, 1)
    lock.__enter__()
    os._exit(0)  # no release: the OS drops the lock with the process


def test_slot_of_a_dead_holder_is_free(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_die_holding, args=(tmp_path / "gpu-0",))
    p.start()
    p.join(30)
    t0 = time.time()
    with device_memory.SlotLock(tmp_path / "gpu-0", 1):
        pass
    assert time.time() - t0 < 1.0


class _FakeCuda:
    def __init__(self, reserved, allocated):
        self.reserved, self.allocated, self.emptied = reserved, allocated, 0

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def memory_reserved(self, device=None):
        return self.reserved

    def memory_allocated(self, device=None):
        return self.allocated

    def empty_cache(self):
        self.emptied += 1


@pytest.mark.parametrize("reserved,allocated,emptied", [(3 * GiB, 1 * GiB, 1), (GiB + GiB // 2, GiB, 0)])
def test_trim_returns_only_a_large_idle_reserve(monkeypatch, reserved, allocated, emptied):
    import torch
    fake = _FakeCuda(reserved, allocated)
    monkeypatch.setattr(torch, "cuda", fake)
    assert device_memory.trim("cuda") is bool(emptied)
    assert fake.emptied == emptied


def test_cpu_cases_touch_no_gpu_state(monkeypatch, tmp_path):
    import torch
    fake = _FakeCuda(10 * GiB, 0)
    monkeypatch.setattr(torch, "cuda", fake)
    monkeypatch.setattr(device_memory.tempfile, "gettempdir", lambda: str(tmp_path))
    with device_memory.case_on_shared_gpu(HEAVY, "cpu", workers=12):
        pass
    assert fake.emptied == 0 and not any(tmp_path.iterdir())


HEAVY = Case(num_q_heads=4, num_kv_heads=4, head_dim=64, seq_lens=(70, 33), kv_dtype="bf16", min_pool_bytes=2**32)
LIGHT = Case(num_q_heads=4, num_kv_heads=4, head_dim=64, seq_lens=(70, 33), kv_dtype="bf16")


@pytest.mark.parametrize("case,workers,slotted", [(HEAVY, 12, True), (LIGHT, 12, False), (HEAVY, 1, False)])
def test_heavy_cases_take_a_slot_when_the_gpu_is_shared(monkeypatch, tmp_path, case, workers, slotted):
    import types
    import torch
    fake = _FakeCuda(3 * GiB, 0)
    fake.get_device_properties = lambda device: types.SimpleNamespace(total_memory=int(139.8 * GiB))
    monkeypatch.setattr(torch, "cuda", fake)
    taken = []

    class Recording(device_memory.SlotLock):
        def __enter__(self):
            taken.append(self.slots)
            return super().__enter__()

    monkeypatch.setattr(device_memory, "SlotLock", Recording)
    monkeypatch.setattr(device_memory.tempfile, "gettempdir", lambda: str(tmp_path))
    with device_memory.case_on_shared_gpu(case, "cuda", workers=workers):
        pass
    assert taken == ([4] if slotted else [])
    assert fake.emptied == 1  # the 3 GiB idle reserve is returned after every GPU case


class _StandInNvml:
    """What `nvml_free_and_total` calls of NVIDIA's library, for one GPU of `uuid`."""

    def __init__(self, uuid: str, free: int, total: int, init_rc: int = 0):
        self.uuid, self.free, self.total, self.init_rc = uuid, free, total, init_rc
        self.open = 0

    def nvmlInit_v2(self):
        self.open += self.init_rc == 0
        return self.init_rc

    def nvmlShutdown(self):
        self.open -= 1
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes, handle):
        return 0 if uuid.decode() == self.uuid else 13  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetMemoryInfo(self, handle, memory):
        memory._obj.free, memory._obj.total = self.free, self.total
        return 0


@pytest.mark.parametrize("asked,expected", [("GPU-1234", (70 * GiB, 80 * GiB)), ("MIG-77", None)])
def test_nvml_reads_the_named_gpu_and_closes_the_library(monkeypatch, asked, expected):
    lib = _StandInNvml("GPU-1234", 70 * GiB, 80 * GiB)
    monkeypatch.setattr(device_memory.ctypes, "CDLL", lambda name: lib)
    assert device_memory.nvml_free_and_total(asked) == expected
    assert lib.open == 0


def test_nvml_absent_or_failing_is_no_answer(monkeypatch):
    assert device_memory.nvml_free_and_total("GPU-1", library="libdoes-not-exist.so.0") is None
    lib = _StandInNvml("GPU-1", GiB, GiB, init_rc=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    monkeypatch.setattr(device_memory.ctypes, "CDLL", lambda name: lib)
    assert device_memory.nvml_free_and_total("GPU-1") is None


@pytest.mark.parametrize("nvml_answer,hip,expected", [
    ((70 * GiB, 80 * GiB), None, (70 * GiB, 80 * GiB)),  # NVML: no CUDA context
    (None, None, (5 * GiB, 8 * GiB)),                    # MIG, no library: torch's read
    ((70 * GiB, 80 * GiB), "6.2", (5 * GiB, 8 * GiB)),   # ROCm: never NVML
])
def test_free_and_total_asks_torch_only_where_nvml_cannot_answer(monkeypatch, nvml_answer, hip, expected):
    import types
    import torch
    asked = []
    monkeypatch.setattr(device_memory, "nvml_free_and_total", lambda uuid: asked.append(uuid) or nvml_answer)
    fake = types.SimpleNamespace(get_device_properties=lambda device: types.SimpleNamespace(uuid="abcd"),
                                 mem_get_info=lambda device: (5 * GiB, 8 * GiB))
    monkeypatch.setattr(torch, "cuda", fake)
    monkeypatch.setattr(torch.version, "hip", hip)
    assert device_memory.free_and_total("cuda:0") == expected
    assert asked == ([] if hip else ["GPU-abcd"])

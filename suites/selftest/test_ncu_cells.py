"""benchmarks/ncu_cells.py names each profiled launch with an NVTX range "CELL KERNEL": ncu prints
its report after the program's own output, so without the range a reader maps kernels to launches
by counting (session 33's record was read that way). The range must close even when the launch
fails, and a torch without NVTX must still profile, unnamed."""
import importlib

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def ncu_cells():
    return importlib.import_module("benchmarks.ncu_cells")


def test_the_launch_runs_inside_a_range_named_for_it(ncu_cells, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda label: calls.append(("push", label)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    with ncu_cells.nvtx_range("b4-ragged-32x8x128 dispatch"):
        calls.append(("launch",))
    assert calls == [("push", "b4-ragged-32x8x128 dispatch"), ("launch",), ("pop",)]


def test_a_failing_launch_still_closes_its_range(ncu_cells, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda label: calls.append("push"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    with pytest.raises(ZeroDivisionError):
        with ncu_cells.nvtx_range("cell kernel"):
            1 / 0
    assert calls == ["push", "pop"]


def test_without_nvtx_the_launch_runs_unnamed(ncu_cells, monkeypatch):
    def no_nvtx(label):
        raise RuntimeError("NVTX functions not installed. Are you sure you have a CUDA build?")
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", no_nvtx)
    popped = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: popped.append(1))
    ran = []
    with ncu_cells.nvtx_range("cell kernel"):
        ran.append(1)
    assert ran == [1] and popped == []

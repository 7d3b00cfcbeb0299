"""Perf-regression guard on pytest-benchmark: GPU time of one CUDA-graph replay after an
L2 flush, per kernel and cell, compared against the stored baseline of this GPU class.

    pytest suites/perf --benchmark-storage=file://fixtures/baselines/sm_90 \
        --benchmark-compare --benchmark-compare-fail=median:10%

Run without -n (pytest-benchmark disables itself under xdist). Baselines are stored per
GPU class explicitly, because pytest-benchmark's machine id ignores the GPU.
"""
import pathlib
import tomllib

import pytest

from decode_conformance import hardware
from decode_conformance.cases import Case

CELLS = tomllib.loads((pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "perf_cells.toml").read_text())["cell"]
KERNELS = ("fixed_split", "adaptive_split", "lean", "dispatch")

pytestmark = pytest.mark.skipif(not hardware.has_gpu(),
                                reason="perf needs a GPU: under Triton's interpreter it would time Python, not the kernel")


def _case(cell) -> Case:
    hq, hkv, d = cell["shape"]
    return Case(kv_dtype="bf16", num_q_heads=hq, num_kv_heads=hkv, head_dim=d, seq_lens=tuple(cell["lens"]),
                v_head_dim=cell.get("v_head_dim"), mla=cell.get("mla", False), layout="paged", page_size=16, seed=1)


class GpuEventClock:
    """A pytest-benchmark timer that reads GPU time: each call records an event on the
    stream and waits for it, so the difference of two calls is the device time of the work
    enqueued between them (the queue is empty at the first call)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.origin = torch.cuda.Event(enable_timing=True)
        self.origin.record()
        torch.cuda.synchronize(device)

    def __call__(self) -> float:
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        e.synchronize()
        return self.origin.elapsed_time(e) * 1e-3


@pytest.mark.parametrize("cell", CELLS, ids=[c["name"] for c in CELLS])
@pytest.mark.parametrize("kernel_name", KERNELS)
def test_kernel_time(benchmark, kernel_name, cell):
    import torch
    from decode_conformance.factories import build
    from decode_conformance.runner import prepare
    from decode_conformance import timing
    from decode_conformance_kernels import registry

    kernel = getattr(registry, kernel_name)()
    case = _case(cell)
    missing = kernel.caps.missing_for(case, "cuda")
    if missing:
        pytest.skip(f"{kernel_name} lacks: {', '.join(missing)}")
    batch = prepare(kernel, case, "cuda")
    graph = timing.capture(kernel.plan(batch), "cuda")
    flush = torch.empty(timing.L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    benchmark._timer = GpuEventClock(torch, "cuda")
    benchmark.extra_info.update(gpu_class=hardware.detect_class(), case=case.id)
    def flush_l2():  # returns None: pytest-benchmark would take a returned value as call args
        flush.zero_()

    benchmark.pedantic(graph.replay, setup=flush_l2, rounds=30, warmup_rounds=3, iterations=1)
    assert bool(torch.isfinite(batch.out).all()), "timed output has NaN/Inf"

"""Kernels that declare `deterministic` must give bitwise-identical output and LSE when the
same inputs are run again (atomic arrival order, split scheduling and the like must not move
a bit). 20 repeats on a GPU, where races can show; 3 under the interpreter, which runs
programs one after another (so only plan-to-plan state can differ there)."""
import pytest
import torch

from decode_conformance import hardware
from decode_conformance.cases import Case
from decode_conformance.graphs import with_fresh_outputs
from decode_conformance.runner import prepare

REPEATS = 20 if hardware.has_gpu() else 3
CASES = {
    "interpreter": [Case("bf16", 8, 2, 64, (300, 0, 77, 1000), page_size=16, seed=5),
                    Case("e4m3", 16, 1, 576, (129, 700), v_head_dim=512, mla=True, page_size=1, seed=6)],
    "gpu": [Case("bf16", 32, 8, 128, (131072, 1, 4097, 0, 65537, 300), page_size=16, seed=5),
            Case("e4m3", 128, 1, 576, (32769, 7, 16384, 1), v_head_dim=512, mla=True, page_size=64, seed=6)],
}
KERNELS = ("fixed_split", "adaptive_split", "lean", "dispatch")


@pytest.mark.parametrize("case_index", [0, 1])
@pytest.mark.parametrize("kernel_name", KERNELS)
def test_bitwise_repeatable(kernel_name, case_index):
    from decode_conformance_kernels import registry
    kernel = getattr(registry, kernel_name)()
    if not kernel.caps.deterministic:
        pytest.skip(f"{kernel_name} does not declare deterministic")
    device = "cuda" if hardware.has_gpu() else "cpu"
    case = CASES["gpu" if device == "cuda" else "interpreter"][case_index]
    batch = prepare(kernel, case, device)
    kernel.plan(batch)()
    first_out, first_lse = batch.out.clone(), batch.lse.clone()
    assert torch.isfinite(first_out).all()
    for i in range(REPEATS - 1):
        again = with_fresh_outputs(batch)
        kernel.plan(again)()
        assert torch.equal(again.out.view(torch.int16), first_out.view(torch.int16)), f"output moved on repeat {i + 2}"
        assert torch.equal(again.lse.nan_to_num(0.5), first_lse.nan_to_num(0.5)), f"LSE moved on repeat {i + 2}"


@pytest.mark.parametrize("kernel_name", KERNELS)
def test_same_plan_launched_twice(kernel_name):
    """A graph-safe kernel's launch is replayed on one plan: whatever state it keeps in the
    suite's workspace (Lean's arrival counters) must be back to its start after a launch.
    Runs on CPU too, where the CUDA-graph tests cannot."""
    from decode_conformance_kernels import registry
    kernel = getattr(registry, kernel_name)()
    if not kernel.caps.cuda_graph_safe:
        pytest.skip(f"{kernel_name} does not declare cuda_graph_safe")
    device = "cuda" if hardware.has_gpu() else "cpu"
    case = CASES["gpu" if device == "cuda" else "interpreter"][0]
    batch = prepare(kernel, case, device)
    launch = kernel.plan(batch)
    launch()
    first = batch.out.clone()
    batch.repoison_outputs()
    launch()
    assert torch.equal(batch.out.view(torch.int16), first.view(torch.int16)), "second launch of one plan differs"

"""Kernels that declare `deterministic` must give bitwise-identical output and LSE when the
same inputs are run again (atomic arrival order, split scheduling and the like must not move
a bit). 20 repeats on a GPU, where races can show; 3 under the interpreter, which runs
programs one after another (so only plan-to-plan state can differ there)."""
import pytest
import torch

from decode_conformance.cases import Case
from decode_conformance.graphs import bitwise_equal, with_fresh_outputs
from decode_conformance.runner import prepare
from .scenarios import fail_unless, profile_of, require

CASES = {
    "interpreter": [Case("bf16", 4, 1, 64, (300, 0, 77, 1000), page_size=16, seed=5),
                    Case("e4m3", 8, 1, 576, (129, 700), v_head_dim=512, mla=True, page_size=1, seed=6)],
    "gpu": [Case("bf16", 32, 8, 128, (131072, 1, 4097, 0, 65537, 300), page_size=16, seed=5),
            Case("e4m3", 128, 1, 576, (32769, 7, 16384, 1), v_head_dim=512, mla=True, page_size=64, seed=6)],
}


def _repeats(device: str) -> int:
    return 3 if device == "cpu" else 20


@pytest.mark.parametrize("case_index", [0, 1])
def test_bitwise_repeatable(dc_kernel, dc_device, case_index):
    kernel = dc_kernel.kernel
    if not kernel.caps.deterministic:
        pytest.skip(f"{kernel.name} does not declare deterministic")
    case = CASES[profile_of(dc_device)][case_index]
    require(kernel, case, dc_device)
    batch = prepare(kernel, case, dc_device)
    kernel.plan(batch)()
    first = with_fresh_outputs(batch)
    first.out.copy_(batch.out)
    first.lse.copy_(batch.lse)
    fail_unless(bool(torch.isfinite(first.out).all()), kernel, f"{case.id}: non-finite output")
    for i in range(_repeats(dc_device) - 1):
        again = with_fresh_outputs(batch)
        kernel.plan(again)()
        what = bitwise_equal(again, first, lse=kernel.caps.lse)
        fail_unless(not what, kernel, f"{case.id}: repeat {i + 2} differs from the first run: {what}")


def test_same_plan_launched_twice(dc_kernel, dc_device):
    """A graph-safe kernel's launch is replayed on one plan: whatever state it keeps in the
    suite's workspace (Lean's arrival counters) must be back to its start after a launch.
    Runs on CPU too, where the CUDA-graph tests cannot."""
    kernel = dc_kernel.kernel
    if not kernel.caps.cuda_graph_safe:
        pytest.skip(f"{kernel.name} does not declare cuda_graph_safe")
    cases = CASES[profile_of(dc_device)]
    case = next((c for c in cases if not kernel.caps.missing_for(c, "cpu" if dc_device == "cpu" else "cuda")),
                cases[0])
    require(kernel, case, dc_device)
    batch = prepare(kernel, case, dc_device)
    launch = kernel.plan(batch)
    launch()
    first = with_fresh_outputs(batch)
    first.out.copy_(batch.out)
    first.lse.copy_(batch.lse)
    batch.repoison_outputs()
    launch()
    what = bitwise_equal(batch, first, lse=kernel.caps.lse)
    fail_unless(not what, kernel, f"{case.id}: second launch of one plan differs from the first: {what}")

"""CUDA-graph replay (GPU only), for kernels that declare `cuda_graph_safe`: captured once per
batch size on buffers sized for 128k keys, then replayed with lengths from 1 to 128k, ragged
batches and 0-length padding rows. Before every replay the outputs and float scratch are NaN
again; every replay must match the float64 reference (output and LSE) and equal an eager
launch of the same plan on the same buffers bit for bit."""
import pytest
import torch

from decode_conformance.cases import Case
from decode_conformance.graphs import bitwise_equal, capacity_case, load_scenario, with_fresh_outputs
from decode_conformance.metrics import judge
from decode_conformance.runner import prepare, yardstick
from .scenarios import fail_unless, require

MAX_LEN = 131072
# The first one a kernel can run (an fp8-only kernel gets the e4m3 one).
TEMPLATES = [Case(kv_dtype=dt, num_q_heads=16, num_kv_heads=2, head_dim=128, seq_lens=(1,), page_size=16)
             for dt in ("bf16", "e4m3")]
SCENARIOS = {
    1: [(1,), (7,), (4097,), (32769,), (MAX_LEN,), (0,)],
    4: [(1, 32769, 7, 4096), (0, 0, 300, 0), (MAX_LEN, 1, 0, 65537), (33, 33, 33, 33)],
    16: [tuple([1, 32769, 0, 4096] * 4), tuple(range(1, 16 * 997, 997))],
}


@pytest.mark.parametrize("batch_size", sorted(SCENARIOS))
def test_one_graph_serves_every_length(dc_kernel, dc_device, batch_size):
    kernel = dc_kernel.kernel
    if dc_device == "cpu":
        pytest.skip("CUDA graphs need a GPU")
    if not kernel.caps.cuda_graph_safe:
        pytest.skip(f"{kernel.name} does not declare cuda_graph_safe")
    template = next((t for t in TEMPLATES if not kernel.caps.missing_for(t, "cuda")), TEMPLATES[0])
    require(kernel, template, dc_device)
    cap = prepare(kernel, capacity_case(template, batch_size, MAX_LEN), dc_device)
    launch = kernel.plan(cap)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch()  # warm-up: JIT compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    failures = []
    for i, lens in enumerate(SCENARIOS[batch_size]):
        scenario = template.replace(seq_lens=lens, seed=100 + i)
        view = load_scenario(cap, scenario, seed=scenario.seed)
        ref, tier = yardstick(kernel, scenario, view)
        cap.repoison_outputs()
        graph.replay()
        torch.cuda.synchronize()
        v = judge(scenario, view.out, view.lse if kernel.caps.lse else None, ref.out, ref.lse, ref.visible,
                  tier.outs, tier.lse, view.sinks, lse_slack=tier.lse_slack)
        replayed = with_fresh_outputs(view)
        replayed.out.copy_(view.out)
        replayed.lse.copy_(view.lse)
        cap.repoison_outputs()
        launch()  # the same plan, eagerly, on the same buffers
        torch.cuda.synchronize()
        differs = bitwise_equal(view, replayed, lse=kernel.caps.lse)
        if not v.passed or differs:
            failures.append(f"{scenario.id}: {v.summary()}" + (f"; graph vs eager: {differs}" if differs else ""))
    fail_unless(not failures, kernel, "one captured graph, replayed:\n" + "\n".join(failures))

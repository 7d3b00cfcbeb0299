"""CUDA-graph replay (GPU only): each graph-safe kernel is captured once per batch size on
buffers sized for 128k keys, then replayed with lengths from 1 to 128k, ragged batches and
0-length padding rows. Before every replay the outputs and float scratch are NaN again;
every replay must match the float64 reference and equal an eager call bit for bit."""
import pytest
import torch

from decode_conformance import hardware
from decode_conformance.cases import Case
from decode_conformance.graphs import capacity_case, load_scenario, with_fresh_outputs
from decode_conformance.metrics import judge
from decode_conformance.reference import low_precision_attention, reference
from decode_conformance.runner import prepare

pytestmark = pytest.mark.skipif(not hardware.has_gpu(), reason="CUDA graphs need a GPU")

MAX_LEN = 131072
TEMPLATE = Case(kv_dtype="bf16", num_q_heads=16, num_kv_heads=2, head_dim=128, seq_lens=(1,), page_size=16)
SCENARIOS = {
    1: [(1,), (7,), (4097,), (32769,), (MAX_LEN,), (0,)],
    4: [(1, 32769, 7, 4096), (0, 0, 300, 0), (MAX_LEN, 1, 0, 65537), (33, 33, 33, 33)],
    16: [tuple([1, 32769, 0, 4096] * 4), tuple(range(1, 16 * 997, 997))],
}
GRAPH_KERNELS = ("fixed_split", "adaptive_split", "lean", "dispatch")


@pytest.mark.parametrize("batch_size", sorted(SCENARIOS))
@pytest.mark.parametrize("kernel_name", GRAPH_KERNELS)
def test_one_graph_serves_every_length(kernel_name, batch_size):
    from decode_conformance_kernels import registry
    kernel = getattr(registry, kernel_name)()
    if not kernel.caps.cuda_graph_safe:
        pytest.skip(f"{kernel_name} does not declare cuda_graph_safe")
    cap = prepare(kernel, capacity_case(TEMPLATE, batch_size, MAX_LEN), "cuda")
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
        scenario = TEMPLATE.replace(seq_lens=lens, seed=100 + i)
        view = load_scenario(cap, scenario, seed=scenario.seed)
        cap.repoison_outputs()
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(view)
        v = judge(scenario, view.out, view.lse, ref.out, ref.lse, ref.visible, low_precision_attention(view))
        eager = with_fresh_outputs(view)
        twin = kernel
        if "dispatch_path" in cap.extras:  # a dispatcher fixed its path at capture: compare that path
            twin = kernel.lean if cap.extras["dispatch_path"] == "lean" else kernel.split
        twin.plan(eager)()
        torch.cuda.synchronize()
        same = torch.equal(eager.out.nan_to_num(1e9), view.out.nan_to_num(1e9))
        if not v.passed or not same:
            failures.append(f"{scenario.id}: {v.summary()} eager_equal={same}")
    assert not failures, "\n".join(failures)

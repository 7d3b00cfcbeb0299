"""CUDA-graph replay (GPU only), for kernels that declare `cuda_graph_safe`: captured once per
batch size on buffers sized for 128k keys, then replayed with lengths from 1 to 128k, ragged
batches and 0-length padding rows; every replay judged against the float64 reference and
compared bit for bit with an eager launch of the same plan (decode_conformance/scenarios.py,
"graph-replay")."""
import pytest

from decode_conformance.plugin import conformance_failure


@pytest.mark.dc_scenario("graph-replay")
def test_one_graph_serves_every_length(dc_kernel, dc_case, dc_run):
    result = dc_run(dc_kernel, dc_case)
    if not result.ok:
        conformance_failure(result, dc_case)

"""Batch invariance: a request's output and LSE do not depend on the other requests in its
batch or on its position. The same request alone, first, last, and between two 0-length
rows must give bitwise-identical rows for kernels that declare `batch_invariant`, and rows
within the per-row error budget for the others (whose split counts may follow the batch)."""
import pytest
import torch

from decode_conformance.cases import Case
from decode_conformance.factories import transplant
from decode_conformance.graphs import bitwise_equal
from decode_conformance.metrics import judge
from decode_conformance.runner import prepare, yardstick
from .scenarios import fail_unless, profile_of, require

LEN = {"interpreter": 300, "gpu": 32769}
OTHERS = {"interpreter": (77, 513), "gpu": (4097, 131072)}
REQUESTS = {  # the request's shape: GQA bf16, and fp8 MLA (interpreter-sized head counts on a CPU)
    "gqa": Case("bf16", 8, 2, 64, (1,), page_size=16, seed=21),
    "mla-e4m3": Case("e4m3", 8, 1, 576, (1,), v_head_dim=512, mla=True, page_size=64, seed=22),
}


def _arrangements(n: int, a: int, b: int) -> dict[str, tuple[tuple[int, ...], int]]:
    """name -> (lengths, index of the request)."""
    return {"first": ((n, a, b), 0), "last": ((a, b, n), 2), "between-padding": ((0, n, 0), 1)}


@pytest.mark.parametrize("request_kind", sorted(REQUESTS))
def test_request_is_independent_of_its_batch(dc_kernel, dc_device, request_kind):
    kernel = dc_kernel.kernel
    profile = profile_of(dc_device)
    n = LEN[profile]
    alone_case = REQUESTS[request_kind].replace(seq_lens=(n,))
    require(kernel, alone_case, dc_device)
    alone = prepare(kernel, alone_case, dc_device)
    kernel.plan(alone)()
    failures, skipped = [], []
    for name, (lens, idx) in _arrangements(n, *OTHERS[profile]).items():
        case = alone_case.replace(seq_lens=lens, seed=alone_case.seed + 1)
        missing = kernel.caps.missing_for(case, "cpu" if dc_device == "cpu" else "cuda")
        if missing:  # e.g. a declared min_len: the kernel's engine never batches 0-length rows with it
            skipped.append(f"{name}: {', '.join(missing)}")
            continue
        batch = prepare(kernel, case, dc_device)
        transplant(alone, 0, batch, idx)
        ref, tier = yardstick(kernel, case, batch)
        kernel.plan(batch)()
        v = judge(case, batch.out, batch.lse if kernel.caps.lse else None, ref.out, ref.lse, ref.visible,
                  tier.outs, tier.lse, batch.sinks)
        if not v.passed:
            failures.append(f"{name} {case.id}: {v.summary()}")
        if kernel.caps.batch_invariant:
            differs = bitwise_equal(batch, alone, lse=kernel.caps.lse, rows=(idx, 0))
            if differs:
                failures.append(f"{name}: the request's row is not bitwise the same as alone ({differs}); the kernel "
                                "declares batch_invariant")
        elif not torch.isfinite(batch.out[idx]).all():
            failures.append(f"{name}: non-finite output for the request")
    fail_unless(not failures, kernel, "\n".join(failures + [f"not run: {s}" for s in skipped]))

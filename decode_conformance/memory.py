"""Rough device-memory need of a case, for deselecting what a GPU class cannot hold."""
from __future__ import annotations

import math

from .cases import Case

# Pool overhead from factories: spare pages and holes (a draw over twice the pages needed).
_POOL_FACTOR = 2.2


def case_bytes(case: Case) -> int:
    elem = 1 if case.is_fp8 else 2
    width = case.head_dim + (0 if case.mla else case.v_head_dim)
    tokens = sum(math.ceil(n / case.page_size) * case.page_size for n in case.seq_lens)
    pool = int(tokens * _POOL_FACTOR) * case.num_kv_heads * width * elem + case.min_pool_bytes * (1 if case.mla else 2)
    # float64 reference works on one request at a time, in chunks
    ref = 8 * case.num_kv_heads * width * min(case.max_len, 16384) * 3
    return pool + ref

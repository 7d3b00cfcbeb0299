"""A kernel that declares `num_splits` uses the split count the batch asks for: the same
request at 1 and at several splits must both be right, and must not be the same bits (a
kernel that ignored the request would run one configuration twice)."""
import pytest

from decode_conformance.cases import Case
from decode_conformance.runner import run_case
from .scenarios import fail_unless, profile_of, require

LONG = {"interpreter": 1000, "gpu": 65537}


def test_forced_split_count_is_honoured(dc_kernel, dc_device):
    kernel = dc_kernel.kernel
    if not kernel.caps.num_splits:
        pytest.skip(f"{kernel.name} does not declare num_splits")
    base = Case("bf16", 8, 2, 64, (LONG[profile_of(dc_device)],), page_size=16, seed=11)
    require(kernel, base, dc_device)
    outs = {}
    for splits in (1, 4):
        case = base.replace(num_splits=splits)
        res = run_case(kernel, case, dc_device, keep_output=True)
        fail_unless(res.ok, kernel, f"num_splits={splits}: {res.message}")
        outs[splits] = res.extra["output"]
    fail_unless(not outs[1].equal(outs[4]), kernel, f"num_splits=1 and num_splits=4 gave bitwise-identical outputs on a "
                f"{base.seq_lens[0]}-key request: the kernel ignores batch.num_splits")

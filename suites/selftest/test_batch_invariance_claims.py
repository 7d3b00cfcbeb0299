"""The batch-invariance check holds a kernel to what it declares: bitwise identity for
`batch_invariant` kernels (an ulp that moves with the batch fails), the row budget otherwise
(the same kernel, not claiming it, passes)."""
import re

from decode_conformance.scenarios import fixed_cases
from suites.selftest._subpytest import GOOD, faulty, run_pytest

TEST = "suites/parity/test_batch_invariance.py"


def test_bitwise_claim_is_checked(tmp_path):
    run = run_pytest(TEST, "-q", f"--kernel={faulty('invariant')}", f"--kernel={faulty('batch_dependent')}",
                     f"--kernel={GOOD}", report=tmp_path / "r")
    gqa = fixed_cases("interpreter")["batch-invariance"][0].id  # the bf16 GQA request
    status = {(r["kernel"], r["case"]): r["status"] for r in run.report["results"]}
    assert status[("faulty_invariant", gqa)] == "passed", run.out[-2000:]
    assert status[("faulty_batch_dependent", gqa)] == "failed", run.out[-2000:]
    # each failing arrangement says where the request sat, in which batch, at which row
    assert re.search(r"the request placed (first|last) in the batch batch-invariance-\S+-B3\[[\d,]+\]-s22 "
                     r"\(its row [02]\): not bitwise the same as alone \(.*\); the kernel declares batch_invariant",
                     run.out), run.out[-2000:]
    assert status[("torch_gather", gqa)] == "passed"  # not claimed: the row budget holds

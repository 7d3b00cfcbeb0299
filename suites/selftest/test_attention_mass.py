"""benchmarks/attention_mass.py reads a kernel's softmax weights back through indicator V:
exact for a correct kernel that is not ours (the toy), and showing where a planted bug's
weight went: the dropped tail's block gets none, the rest of the row shares it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from decode_conformance.case_sets import build_set

from suites.selftest import planted
from toy_decode import tiled  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import attention_mass  # noqa: E402

CASE = max((c for c in build_set("parity", "interpreter") if c.data == "low-scores" and not c.mla
            and c.kv_dtype == "bf16" and not c.sinks), key=lambda c: c.max_len)  # a sink takes weight
LONGEST = max(range(CASE.batch), key=lambda b: CASE.seq_lens[b])
BF16_ULP_AT_1 = 2.0 ** -8  # the output is read back in the query dtype


# K and V in one allocation (v_cache strided): indicators must land where the kernel reads them
COMBINED = max((c for c in build_set("parity", "interpreter") if c.combined_kv and c.window and not c.mla
                and c.kv_dtype == "bf16"), key=lambda c: c.max_len)


@pytest.mark.parametrize("case", [CASE, COMBINED], ids=lambda c: c.id)
def test_a_correct_kernel_gives_the_exact_weights(case):
    longest = max(range(case.batch), key=lambda b: case.seq_lens[b])
    m = attention_mass.measure(tiled.TiledDecode(), case, "cpu", longest, 0)
    assert abs(m.total - 1.0) <= BF16_ULP_AT_1
    assert m.blocks and all(abs(k - r) <= BF16_ULP_AT_1 * r for _, _, k, r in m.blocks), m.blocks


def test_a_dropped_tail_shows_as_a_block_with_no_weight():
    case = max((c for c in build_set("parity", "interpreter") if c.data == "structured" and not c.mla
                and c.kv_dtype == "bf16" and c.max_len > planted.LONG_KEYS["cpu"]), key=lambda c: c.max_len)
    b = max(range(case.batch), key=lambda i: case.seq_lens[i])
    kernel = planted.Planted(tiled.TiledDecode(), "drop_tail_long")
    m = attention_mass.measure(kernel, case, "cpu", b, 0)
    lo, hi, k, r = m.blocks[-1]
    assert r > 0 and k == 0.0, m.blocks[-1]
    assert abs(m.total - 1.0) <= BF16_ULP_AT_1  # the rest renormalized: the total alone cannot tell


def test_mla_cases_are_refused():
    case = next(c for c in build_set("parity", "interpreter") if c.mla)
    with pytest.raises(SystemExit, match="MLA cases are refused"):
        attention_mass.measure(tiled.TiledDecode(), case, "cpu", 0, 0)


def test_a_case_the_kernel_does_not_declare_is_refused_by_name():
    import dataclasses
    kernel = tiled.TiledDecode()
    kernel.caps = dataclasses.replace(kernel.caps, kv_dtypes=("fp16",))
    with pytest.raises(SystemExit, match="does not declare .*kv dtype bf16"):
        attention_mass.measure(kernel, CASE, "cpu", LONGEST, 0)

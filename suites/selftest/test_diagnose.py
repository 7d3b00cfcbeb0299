"""A failure whose rows match another KV head's attention names the heads and the KV head they
read (decode_conformance/diagnose.py), and no other failure does.

Shown on two head-mapping bugs of the out-of-tree toy (suites/selftest/oot/toy_decode/): the
tiling sglang 0.5.23's grouped decode uses (FlatHeadTiles, the bug the check was written after;
asserted in test_head_tiles.py, on the cases that expose it) and one it was not written around
(InterleavedKvHeads: head h reads KV head h % Hkv); and on bugs of another kind on the same cases
(a lost last key, V off by 2 %), which must fail without it.
"""
from __future__ import annotations

import pytest

from decode_conformance import case_sets as cs
from decode_conformance.runner import run_case

from suites.selftest import planted  # noqa: F401  (puts the out-of-tree package on sys.path)
import toy_decode  # noqa: E402

MAPPING_ERROR = "a query-head to KV-head mapping error"


def _parity(pred, n=None):
    found = [c for c in cs.build_set("parity", "interpreter") if pred(c)]
    return found[:n] if n else found


@pytest.mark.parametrize("case", _parity(lambda c: c.num_kv_heads == 2 and c.group == 4 and not c.mla, 3),
                         ids=lambda c: c.id)
def test_a_mapping_bug_the_check_was_not_written_for_is_named_too(case):
    res = run_case(toy_decode.InterleavedKvHeads(), case, "cpu")
    assert not res.ok, res.message
    assert "heads 1, 3 (KV head 0) read KV head 1; heads 4, 6 (KV head 1) read KV head 0" in res.message, res.message


@pytest.mark.parametrize("bug", [toy_decode.DropsLastKey, lambda: planted.Planted(toy_decode.ToyDecode(), "v_2pct")],
                         ids=["drops_last_key", "v_2pct"])
def test_other_failures_name_no_kv_head(bug):
    cases = _parity(lambda c: c.num_kv_heads > 1 and not c.mla and c.window is None, 6)
    failed = 0
    for case in cases:
        assert run_case(toy_decode.ToyDecode(), case, "cpu").ok, case.id
        res = run_case(bug(), case, "cpu")
        failed += not res.ok
        assert MAPPING_ERROR not in res.message, (case.id, res.message)
    assert failed, "the planted bug failed none of the cases: nothing was shown"

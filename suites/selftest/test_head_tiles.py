"""The heads axis's g29 (Falcon-180B's group of 29 query heads per KV head) against the bug it
found on a real kernel: query heads cut into tiles of 16 counted from head 0, each tile reading
one KV head (sglang 0.5.23's grouped Triton decode; docs/conformance-matrix.md, triage). For a
group over 16 that is not a multiple of 16 a tile straddles two groups, and its last heads read
the previous group's KV head. Every other group in the parity set hides it: up to 16 a tile is
the group, and 32, 64 or 128 are whole tiles.

The planted kernel is the out-of-tree toy's (suites/selftest/oot/toy_decode/__init__.py,
FlatHeadTiles), right at every other group. Which heads go wrong follows from the tiling
alone (flat_tile_kv_heads against head // group), and the judge must fail exactly those rows.
"""
from __future__ import annotations

from decode_conformance import case_sets as cs
from decode_conformance.runner import run_case

from suites.selftest import planted  # noqa: F401  (puts the out-of-tree package on sys.path)
import toy_decode  # noqa: E402

PROFILE = "interpreter"


def _misread_heads(num_q_heads: int, group: int) -> list[int]:
    kv_of = toy_decode.flat_tile_kv_heads(num_q_heads, group)
    return [h for h, kv in enumerate(kv_of) if kv != h // group]


def _visible_requests(case) -> int:
    return sum(1 for n in case.seq_lens if min(n, case.window or n) > 0)


def test_flat_head_tiles_misread_only_groups_over_16_off_the_tile():
    # The tiling's arithmetic on its own: which (query heads, group) shapes it gets wrong.
    assert _misread_heads(58, 29) == [29, 30, 31]
    assert len(_misread_heads(232, 29)) == 84
    for heads, group in ((64, 8), (128, 32), (32, 16), (128, 128), (56, 7), (29, 29)):
        assert _misread_heads(heads, group) == [], (heads, group)


def test_g29_catches_flat_head_tiles_on_exactly_the_misread_rows_and_its_g8_twin_does_not():
    # Only the g29 GQA cases expose it: without them the whole parity set passes this bug.
    exposed = [c for c in cs.build_set("parity", PROFILE) if _misread_heads(c.num_q_heads, c.group)]
    assert len(exposed) >= 4 and all(c.num_q_heads == 58 and c.group == 29 for c in exposed), [c.id for c in exposed]
    good, bad = toy_decode.ToyDecode(), toy_decode.FlatHeadTiles()
    for case in exposed:
        assert run_case(good, case, "cpu").ok, f"toy_decode failed {case.id}"
        res = run_case(bad, case, "cpu")
        assert not res.ok, f"{bad.name} passed {case.id}"
        # the failure names the heads and the KV head they read (decode_conformance/diagnose.py)
        assert "heads 29-31 (KV head 1) read KV head 0" in res.message, (case.id, res.message)
        want = len(_misread_heads(case.num_q_heads, case.group)) * _visible_requests(case)
        assert res.verdict.rows_over == want, f"{case.id}: {res.verdict.rows_over} rows over, expected {want}"
        twin = cs.realize(dict(cs.classify(case, PROFILE), heads="g8"), PROFILE)
        assert twin is not None and not _misread_heads(twin.num_q_heads, twin.group), case.id
        assert run_case(bad, twin, "cpu").ok, f"{bad.name} failed the g8 twin {twin.id}"


"""The input-forms and scale axes, and the sinkmax regression: each catches the bug it exists
for in a kernel that is not ours, and a correct kernel that is not ours passes it.

Found by writing a decode kernel from the contract alone, outside this repository, with one
planted bug per variant: these five passed every parity case before (docs/cases.md, "Input
forms and the scale"). The planted kernels are the out-of-tree toy's
(suites/selftest/oot/toy_decode/__init__.py), each right on packed inputs at the shapes' scale.
"""
from __future__ import annotations

import pytest

from decode_conformance import case_sets as cs
from decode_conformance.runner import run_case

from suites.selftest import planted  # noqa: F401  (puts the out-of-tree package on sys.path)
import toy_decode  # noqa: E402

PROFILE = "interpreter"


def _parity(pred) -> list:
    return [c for c in cs.build_set("parity", PROFILE) if pred(c)]


def _twin(case, **values):
    """The same pairwise recipe with other axis values (only pairwise cases carry these values)."""
    twin = cs.realize(dict(cs.classify(case, PROFILE), **values), PROFILE)
    assert twin is not None, (case.id, values)
    return twin


# (axis value, the planted kernel it exists for, the parity cases that carry the value, the twin's values)
EARNERS = [
    ("q-strided", toy_decode.AssumesPackedQ, lambda c: c.inputs == "q-strided", dict(inputs="packed")),
    ("table-wide", toy_decode.TableRowsFromLengths, lambda c: c.inputs == "table-wide", dict(inputs="packed")),
    ("v-head-major", toy_decode.VWithKStrides, lambda c: c.inputs == "v-head-major", dict(inputs="packed")),
    # q = 0: every score is 0 whatever the scale
    ("query-scalar", toy_decode.IgnoresCallerScale, lambda c: c.scale is not None and c.data != "zero-q",
     dict(scale="head-dim")),
]


@pytest.mark.parametrize("value,bug,carries,twin_values", EARNERS, ids=[e[0] for e in EARNERS])
def test_axis_value_catches_its_bug_and_the_packed_twin_does_not(value, bug, carries, twin_values):
    cases = _parity(carries)
    assert len(cases) >= 8, f"{value}: only {len(cases)} parity cases"
    good = toy_decode.ToyDecode()
    caught = 0
    for case in cases:
        assert run_case(good, case, "cpu").ok, f"toy_decode failed {case.id}"
        res = run_case(bug(), case, "cpu")
        if res.ok:
            continue
        caught += 1
        twin = _twin(case, **twin_values)
        assert run_case(good, twin, "cpu").ok, twin.id
        res = run_case(bug(), twin, "cpu")
        assert res.ok, f"{bug.name} failed the twin {twin.id} too: {res.message}"
    assert caught == len(cases), f"{bug.name}: caught on {caught} of {len(cases)} {value} cases"


def test_sinkmax_cases_catch_a_sink_taken_against_the_keys_max_alone():
    cases = [c for c in cs.build_set("parity", PROFILE) if c.label == "sinkmax"]
    assert len(cases) == 3
    for case in cases:
        assert run_case(toy_decode.ToyDecode(), case, "cpu").ok, case.id
        res = run_case(toy_decode.SinkWithoutMax(), case, "cpu")
        assert not res.ok and "LSE" in res.message, (case.id, res.message)
        twin = case.replace(data="structured")  # sink - max a few nats: the bug cannot show
        assert run_case(toy_decode.SinkWithoutMax(), twin, "cpu").ok, twin.id

"""run_order.py: each compiled variant's first test ahead of the tests that reuse it, nothing
dropped or repeated, the same order every time (xdist needs every worker to collect it)."""
from __future__ import annotations

import dataclasses
import types

import pytest

from decode_conformance import plugin
from decode_conformance.cases import Case
from decode_conformance.run_order import compile_key, variants_first
from decode_conformance.state import KernelParam

BASE = Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(300, 17), seed=1)


def test_only_what_a_kernel_compiles_for_changes_the_key():
    same = [dataclasses.replace(BASE, seq_lens=(5000,), seed=9), dataclasses.replace(BASE, window=64),
            dataclasses.replace(BASE, data="randn"), dataclasses.replace(BASE, num_splits=8)]
    assert {compile_key("k", c) for c in same} == {compile_key("k", BASE)}
    other = [dataclasses.replace(BASE, kv_dtype="e4m3"), dataclasses.replace(BASE, num_q_heads=16),
             dataclasses.replace(BASE, head_dim=128), dataclasses.replace(BASE, page_size=1),
             dataclasses.replace(BASE, softcap=30.0), dataclasses.replace(BASE, sinks=True),
             dataclasses.replace(BASE, inputs="v-head-major")]
    keys = [compile_key("k", c) for c in other] + [compile_key("k2", BASE), compile_key("k", BASE)]
    assert len(set(keys)) == len(keys)


def test_first_of_each_key_then_the_rest_in_their_order():
    items = ["a1", "b1", "a2", "x", "c1", "b2", "a3"]
    out = variants_first(items, lambda s: None if s == "x" else s[0])
    assert out == ["a1", "b1", "c1", "a2", "x", "b2", "a3"]
    assert sorted(out) == sorted(items)


def _item(kernel: str, case: Case):
    kp = KernelParam(spec=f"pkg:{kernel}", kernel=types.SimpleNamespace(name=kernel))
    return types.SimpleNamespace(callspec=types.SimpleNamespace(params={"dc_kernel": kp, "dc_case": case}),
                                 label=f"{kernel}|{case.id}")


def test_the_hook_reorders_a_conformance_run_only():
    e4m3 = dataclasses.replace(BASE, kv_dtype="e4m3")
    items = [_item("lean", BASE), _item("lean", dataclasses.replace(BASE, seed=2)), _item("lean", e4m3),
             types.SimpleNamespace(label="not a conformance test")]
    config = types.SimpleNamespace(stash={plugin.STATE: object()})
    plugin.pytest_collection_modifyitems(None, config, items)
    assert [i.label for i in items][:2] == [f"lean|{BASE.id}", f"lean|{e4m3.id}"]
    unrelated, reversed_items = types.SimpleNamespace(stash={}), items[::-1]
    plugin.pytest_collection_modifyitems(None, unrelated, reversed_items)
    assert reversed_items == items[::-1]  # outside a conformance run: untouched


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])

"""Declared shape and input-form support (Capabilities.gqa_groups, .shape_rules, .input_forms): a
case outside it is skipped with a reason naming the field, its value and what is supported; a
kernel that declares nothing supports every shape and form; a malformed declaration is one clear
error."""
from __future__ import annotations

import pytest

from decode_conformance.cases import Case
from decode_conformance.kernel_api import Capabilities, ShapeRule

GQA5 = Case(kv_dtype="bf16", num_q_heads=10, num_kv_heads=2, head_dim=64, seq_lens=(7, 0))
MQA = Case(kv_dtype="bf16", num_q_heads=32, num_kv_heads=1, head_dim=64, seq_lens=(7,))
GQA4 = Case(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(7,))


def test_undeclared_means_every_group():
    for case in (GQA5, MQA, GQA4):
        assert Capabilities().missing_for(case, "cuda") == []


def test_gqa_groups_name_the_group_in_the_skip_reason():
    caps = Capabilities(gqa_groups=frozenset({1, 2, 3, 4, 6, 8, 16}))
    assert caps.missing_for(GQA4, "cuda") == []
    assert caps.missing_for(GQA5, "cuda") == ["GQA group 5 (supported: 1, 2, 3, 4, 6, 8, 16) [gqa_groups]"]
    assert caps.missing_for(MQA, "cuda") == ["GQA group 32 (supported: 1, 2, 3, 4, 6, 8, 16) [gqa_groups]"]
    assert "groups 1,2,3,4,6,8,16" in caps.describe()


def test_shape_rules_are_data_and_named():
    rule = ShapeRule("num_q_heads", max=16, why="one CTA holds at most 16 query heads")
    caps = Capabilities(shape_rules=(rule, ShapeRule("batch_size", allowed=frozenset({1, 2}))))
    assert caps.missing_for(GQA4, "cuda") == []  # 8 heads, batch of 1
    assert caps.missing_for(GQA4.replace(seq_lens=(1, 2, 3)), "cuda") == ["batch_size 3 (supported: {1, 2}) [shape_rules]"]
    assert caps.missing_for(MQA, "cuda") == [
        "num_q_heads 32 (supported: <= 16; one CTA holds at most 16 query heads) [shape_rules]"]
    assert caps.missing_for(GQA5, "cuda") == []  # 10 heads, batch of 2
    assert "rule num_q_heads<=16" in caps.describe()


def test_a_rule_can_hold_only_when_another_does():
    """`when`: a limit that applies to part of the shape space only (torch_flex: group <= 64
    past head dim 512, any group below)."""
    rule = ShapeRule("group", max=64, when=ShapeRule("head_dim", min=513), why="shared memory")
    caps = Capabilities(shape_rules=(rule,))
    wide_mqa = Case(kv_dtype="bf16", num_q_heads=128, num_kv_heads=1, head_dim=576, seq_lens=(7,), v_head_dim=512,
                    mla=True)
    assert caps.missing_for(wide_mqa, "cuda") == ["group 128 (supported: <= 64 when head_dim>=513; shared memory) [shape_rules]"]
    assert caps.missing_for(wide_mqa.replace(num_q_heads=64), "cuda") == []
    assert caps.missing_for(MQA.replace(num_q_heads=128), "cuda") == []  # head dim 64: the rule does not apply
    assert "rule group<=64 when head_dim>=513" in caps.describe()
    with pytest.raises(ValueError, match=r"when: expected a ShapeRule"):
        ShapeRule("group", max=64, when=("head_dim", 513))


def test_input_forms_name_the_form_in_the_skip_reason():
    v_own_strides = GQA4.replace(inputs="v-head-major")
    assert Capabilities().missing_for(v_own_strides, "cuda") == []
    caps = Capabilities(input_forms=frozenset({"packed", "q-strided", "table-wide"}))
    assert caps.missing_for(GQA4, "cuda") == []
    assert caps.missing_for(v_own_strides, "cuda") == [
        "input form v-head-major (supported: packed, q-strided, table-wide) [input_forms]"]
    assert "inputs packed,q-strided,table-wide" in caps.describe()


@pytest.mark.parametrize("make,field", [
    (lambda: ShapeRule("heads", max=4), "ShapeRule.field"),
    (lambda: ShapeRule("group"), "ShapeRule('group')"),
    (lambda: Capabilities(shape_rules=[ShapeRule("group", max=4)]), "Capabilities.shape_rules"),
    (lambda: Capabilities(shape_rules=("group<=4",)), "Capabilities.shape_rules"),
    (lambda: Capabilities(gqa_groups={1, 2}), "Capabilities.gqa_groups"),
    (lambda: Capabilities(gqa_groups=frozenset({0, 2})), "Capabilities.gqa_groups"),
    (lambda: Capabilities(input_forms="packed"), "Capabilities.input_forms"),
    (lambda: Capabilities(input_forms=frozenset({"packed", "k-head-major"})), "Capabilities.input_forms"),
    (lambda: Capabilities(input_forms=frozenset()), "Capabilities.input_forms"),
])
def test_malformed_declaration_is_one_clear_error(make, field):
    with pytest.raises(ValueError, match=rf"^{field.replace('(', '[(]').replace(')', '[)]')}: expected"):
        make()

"""The Case record: impossible cases are refused naming the field; ids are stable and
carry the tokens people select with -k; case sets are deterministic."""
import pytest

from decode_conformance.case_sets import build_set
from decode_conformance.cases import Case

GOOD = dict(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, seq_lens=(5, 9))


@pytest.mark.parametrize("change, field", [
    (dict(window=0), "window"),
    (dict(window=-3), "window"),
    (dict(num_q_heads=6, num_kv_heads=4), "num_q_heads"),
    (dict(mla=True, num_q_heads=16, num_kv_heads=1, head_dim=512, v_head_dim=576), "v_head_dim"),
    (dict(mla=True, num_kv_heads=2, head_dim=576, v_head_dim=512), "num_kv_heads"),
    (dict(page_size=0), "page_size"),
    (dict(layout="contig", page_size=16), "page_size"),
    (dict(layout="ragged"), "layout"),
    (dict(kv_dtype="fp4"), "kv_dtype"),
    (dict(seq_lens=(3, -1)), "seq_lens"),
    (dict(seq_lens=()), "seq_lens"),
    (dict(softcap=0.0), "softcap"),
    (dict(softcap=float("inf")), "softcap"),
    (dict(data="huge-scores"), "softcap"),
    (dict(window=4, window_convention="left"), "window_convention"),
    (dict(num_splits=0), "num_splits"),
    (dict(scale=0.0), "scale"),
    (dict(scale=float("nan")), "scale"),
    (dict(kv_scales=(1.0,)), "kv_scales"),
    (dict(kv_scales=(1.0, -2.0)), "kv_scales"),
    (dict(inputs="strided"), "inputs"),
    (dict(inputs="v-head-major", mla=True, num_q_heads=16, num_kv_heads=1, head_dim=576, v_head_dim=512), "inputs"),
    (dict(inputs="v-head-major", combined_kv=True), "inputs"),
])
def test_impossible_case_names_the_field(change, field):
    with pytest.raises(ValueError, match=rf"Case\.{field}: expected"):
        Case(**{**GOOD, **change})


def test_id_tokens():
    c = Case(kv_dtype="e4m3", num_q_heads=16, num_kv_heads=1, head_dim=576, v_head_dim=512, mla=True,
             seq_lens=(1, 4097, 300, 0), page_size=16, window=128, sinks=True, softcap=30.0, seed=3)
    assert c.id == "e4m3-paged16-h16g16-d576v512-mla-B4[1,4097,300,0]-win128-softcap30-sinks-s3"
    assert Case(**GOOD, layout="contig", page_size=1, window=7, window_convention="excludes-current").id == \
        "bf16-contig-h8g4-d64-B2[5,9]-win7x-s0"


def test_window_conventions_convert_through_visible_keys():
    inc = Case(**GOOD, window=10)
    exc = Case(**GOOD, window=10, window_convention="excludes-current")
    assert (inc.visible_keys, exc.visible_keys) == (10, 11)
    assert inc.window_in("excludes-current") == 9 and exc.window_in("counts-current") == 11
    assert Case(**GOOD).window_in("counts-current") is None


def test_scale_fields_override_the_defaults_and_name_themselves():
    c = Case(**GOOD)
    assert c.sm_scale == 1 / 8 and c.scales == (1.0, 1.0)
    g = Case(**GOOD, scale=1 / 12, kv_scales=(0.5, 2.0))
    assert g.sm_scale == 1 / 12 and g.scales == (0.5, 2.0)
    assert g.id == "bf16-paged16-h8g4-d64-B2[5,9]-scale0.0833333-kvs0.5,2-s0"
    assert Case.from_dict(g.to_dict()) == g
    assert c.id == "bf16-paged16-h8g4-d64-B2[5,9]-s0"  # ids of cases without them unchanged


def test_round_trip_dict():
    c = Case(**GOOD, window=3, sinks=True, label="x")
    assert Case.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown"):
        Case.from_dict({**c.to_dict(), "bogus": 1})


@pytest.mark.parametrize("profile", ["interpreter", "gpu"])
def test_case_sets_are_deterministic_and_unique(profile):
    a = [c.id for c in build_set("parity", profile)]
    b = [c.id for c in build_set("parity", profile)]
    assert a == b
    assert len(a) == len(set(a))


def test_every_split_count_sees_lengths_that_fill_all_its_splits():
    # sglang's old test ran length 10 with 4 splits: only one split ever ran. With a 32-key
    # minimum chunk, all S splits run only when the visible length exceeds 32 * (S - 1).
    cases = build_set("parity", "interpreter")
    for s in sorted({c.num_splits for c in cases if c.num_splits}):
        assert any(c.num_splits == s and any(n > 32 * (s - 1) for n in c.seq_lens) for c in cases), s


def test_parity_covers_every_axis_value():
    from decode_conformance import case_sets as cs
    cases = build_set("parity", "interpreter")
    seen = {(a, v) for c in cases for a, v in cs.classify(c, "interpreter").items()}
    assert {(a, v) for a, vs in cs.AXES.items() for v in vs} <= seen
    assert {c.window_convention for c in cases if c.window} == {"counts-current", "excludes-current"}
    assert any(0 in c.seq_lens for c in cases) and any(1 in c.seq_lens for c in cases)
    assert any(c.softcap for c in cases) and any(c.sinks for c in cases)


def test_set_names_and_unknown_set():
    from decode_conformance.case_sets import set_names
    assert set(set_names()) >= {"smoke", "parity", "full", "fuzz"}
    with pytest.raises(ValueError, match=r"unknown case set 'nope'; expected one of smoke, parity, full, fuzz"):
        build_set("nope", "interpreter")
    with pytest.raises(ValueError, match="no such file"):
        build_set("trace:/no/such/workloads.jsonl", "interpreter")
    assert build_set("fuzz", "interpreter") == []


@pytest.mark.parametrize("profile", ["interpreter", "gpu"])
def test_every_named_set_builds(profile):
    """`--case-set full` once stopped the run with an internal error: its product grid named no
    input distribution after `data` became an axis. Every set of both profiles builds, the
    product grid adds cases to the parity set, and each of its cases classifies back."""
    from decode_conformance import case_sets as cs
    parity = {c.id for c in build_set("parity", "interpreter" if profile == "interpreter" else "gpu")}
    full = build_set("full", profile)
    grid = cs.product_grid(profile)
    assert grid and {c.id for c in full} == parity | {c.id for c in grid}
    assert len(parity | {c.id for c in grid}) > len(parity)
    assert all(cs.classify(c, profile)["data"] == "structured" for c in grid)
    assert build_set("smoke", profile)


@pytest.mark.parametrize("profile", ["interpreter", "gpu"])
def test_gpu_profile_adds_only_its_own_cases(profile):
    """The recipes are shared: the GPU profile has the interpreter's recipes plus the GPU-only
    2^31-element pools of fa2709."""
    from decode_conformance.case_sets import parity_keys
    interp, other = set(parity_keys("interpreter").values()), set(parity_keys(profile).values())
    assert interp <= other
    assert all(k.startswith("fa2709#") for k in other - interp)

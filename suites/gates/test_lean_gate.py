"""The Lean auto-gate (kernels/lean_gate.py) and the dispatcher's path choice: pure host
logic, no GPU and no Triton.

The gfx950 row must reproduce sglang PR #33576's gate (lean_decode_seqlen_gate and
lean_capture_policy, calibrated on MI355X); the properties hold for every row of the
calibration table over a seeded random grid of inputs.
"""
import random
import subprocess
import sys

import pytest

from decode_conformance_kernels import dispatch, lean_gate
from decode_conformance_kernels.lean_gate import capture_policy, eager_gate, eager_threshold, head_tiles

UPSTREAM_CLASSES = ("gfx950", "gfx942")
ALL_CLASSES = tuple(lean_gate.load_table())
K = 1024

# (name, num_q_heads, kv_group): shapes sglang PR #33576 names.
QWEN_7B = (28, 7)  # tiles 4
LLAMA_8B = (32, 4)  # tiles 8
LLAMA_70B_TP8 = (8, 8)  # tiles 1 (heavy TP shard)
MHA_32 = (32, 1)  # tiles 32
R1_TP4 = (32, 32)  # MLA, 32 heads per GPU: tiles 2


def _grid(n=3000, seed=20260830):
    rng = random.Random(seed)
    heads = [1, 2, 4, 8, 12, 16, 28, 32, 40, 48, 64, 96, 128]
    for _ in range(n):
        hq = rng.choice(heads)
        group = rng.choice([g for g in (1, 2, 4, 6, 7, 8, 16, 32, 64, 128) if hq % g == 0])
        yield dict(batch=rng.choice([1, 2, 3, 4, 7, 8, 12, 16, 31, 32, 64, 256]),
                   avg=rng.choice([1, 512, 4095, 4096, 8192, 18750, 32768, 65535, 65536, 131072, 262144]),
                   hq=hq, group=group, mla=rng.random() < 0.2)


# ----- the table --------------------------------------------------------------------------
def test_calibration_file_rows():
    rows = lean_gate.load_table()
    assert {"default", "gfx950", "gfx942", "sm_90"} <= set(rows)
    assert rows["default"].enabled is False
    assert rows["sm_90"].provisional is False and "H200 re-sweep" in rows["sm_90"].note
    assert rows["gfx950"].provisional is False
    # sglang PR #33576: "The MI355X auto-gate thresholds transfer unchanged" to MI300X.
    a, b = rows["gfx950"], rows["gfx942"]
    assert (a.tiers, a.len_floor, a.mla_min_batch, a.mla_len_floor, a.capture_min_batch, a.capture_min_tiles,
            a.capture_mla_min_batch) == (b.tiers, b.len_floor, b.mla_min_batch, b.mla_len_floor,
                                         b.capture_min_batch, b.capture_min_tiles, b.capture_mla_min_batch)


def _row_dict(**over):
    d = dict(enabled=True, len_floor=4096, tiers=[{"min_tiles": 4, "base_len": 65536, "batch_div": 2},
                                                  {"min_tiles": 0, "base_len": 131072, "batch_div": 4}],
             mla_min_batch=8, mla_len_floor=4096, capture_min_batch=16, capture_min_tiles=4, capture_mla_min_batch=8)
    d.update(over)
    return d


@pytest.mark.parametrize("bad, match", [
    ({"default": _row_dict()}, "enabled = false"),
    ({"x": _row_dict()}, "default"),
    ({"default": _row_dict(enabled=False, tiers=[{"min_tiles": 0, "base_len": 1, "batch_div": 1},
                                                 {"min_tiles": 4, "base_len": 1, "batch_div": 1}])}, "decreasing"),
    ({"default": _row_dict(enabled=False, tiers=[{"min_tiles": 4, "base_len": 1, "batch_div": 1}])}, "ending at 0"),
    ({"default": _row_dict(enabled=False, len_floor=-1)}, "len_floor"),
    ({"default": _row_dict(enabled=False, surprise=1)}, "unknown keys"),
    ({"default": _row_dict(enabled=False, ragged_ratio=0.5)}, "ragged_ratio"),
    ({"default": _row_dict(enabled=False, ragged_ratio=True)}, "ragged_ratio"),
    ({"default": _row_dict(enabled=False, ragged_min_batch=-1)}, "ragged_min_batch"),
    ({"default": _row_dict(enabled=False, mla_ragged_ratio=0.9)}, "mla_ragged_ratio"),
])
def test_table_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        lean_gate.load_table(bad)


# ----- the ragged rule (sm_90 row: batch >= 8; GQA with >= 4 head tiles and longest >= 1.2 x
# average; MLA off since split-K's MLA launch change) ------------------------------------------
@pytest.mark.parametrize("batch, hq, group, avg, longest, on", [
    (16, 32, 4, 10000, 13000, True),  # 1.3x ragged, 8 tiles
    (16, 32, 4, 10000, 11000, False),  # 1.1x: uniform enough, split-K
    (16, 32, 4, 10000, None, False),  # longest unknown: the rule is not applied
    (4, 32, 4, 10000, 13000, False),  # batch below 8
    (8, 28, 7, 10000, 12000, True),  # 4 tiles, exactly 1.2x
    (16, 8, 4, 10000, 13000, False),  # 2 tiles: not measured, never on
    (16, 32, 4, 4000, 8000, False),  # average under the 4096 floor
    (16, 128, 128, 10000, 13000, False),  # MLA (group 128) at 1.3x: off on sm_90 (its ratio 0)
    (32, 128, 128, 10000, 30000, False),  # MLA at 3x: off
])
def test_sm90_ragged_rule(batch, hq, group, avg, longest, on):
    mla = group == 128
    assert lean_gate.eager_gate(batch, batch * avg, hq, group, mla, "sm_90", max_len=longest) is on


# The MLA ragged rule itself, on a table that turns it on (mla_ragged_ratio 1.2)
@pytest.mark.parametrize("batch, avg, longest, on", [
    (16, 10000, 11000, False),  # 1.1x is under the ratio
    (16, 10000, 13000, True),  # 1.3x
    (4, 10000, 16000, False),  # batch under ragged_min_batch (8)
    (16, 4000, 8000, False),  # average under the 4096 floor
])
def test_mla_ragged_rule(batch, avg, longest, on):
    table = {"default": _row_dict(enabled=False),
             "x": _row_dict(ragged_min_batch=8, ragged_ratio=1.2, mla_ragged_ratio=1.2,
                            mla_min_batch=2147483647)}
    assert lean_gate.eager_gate(batch, batch * avg, 128, 128, True, "x", table, max_len=longest) is on


@pytest.mark.parametrize("cls", UPSTREAM_CLASSES)
def test_rows_without_the_ragged_rule_ignore_the_longest_length(cls):
    for p in _grid(300, seed=7):
        total = p["batch"] * p["avg"]
        plain = eager_gate(p["batch"], total, p["hq"], p["group"], p["mla"], cls)
        assert eager_gate(p["batch"], total, p["hq"], p["group"], p["mla"], cls, max_len=50 * p["avg"]) == plain


def test_dispatch_passes_the_longest_visible_length():
    shape = dict(batch=16, num_q_heads=32, kv_group=4, gpu_class="sm_90", env=NO_ENV)
    lens = [16000] * 8 + [4000] * 8  # average 10000, longest 16000
    assert dispatch.choose_path(seq_lens_sum=sum(lens), max_len=max(lens), **shape) == "lean"
    assert dispatch.choose_path(seq_lens_sum=sum(lens), **shape) == "split"
    # a 4096-key window caps every request: uniform then, split-K
    vis = [min(n, 4096) for n in lens]
    assert dispatch._gate_lengths(lens, 4096) == dict(seq_lens_sum=sum(vis), max_len=4096)


def test_unknown_class_uses_default_row():
    for cls in ("sm_75", "cpu", None, "gfx1100", ""):
        assert lean_gate.row_for(cls).name == "default"


# ----- head tiles -------------------------------------------------------------------------
@pytest.mark.parametrize("hq, group, tiles", [
    (28, 7, 4), (32, 4, 8), (8, 8, 1), (32, 1, 32), (128, 128, 8), (16, 16, 1), (32, 32, 2), (64, 8, 8), (48, 6, 8),
])
def test_head_tiles(hq, group, tiles):
    assert head_tiles(hq, group) == tiles


# ----- sglang PR #33576's rules on the gfx950 row (and gfx942, a copy) ----------------------
@pytest.mark.parametrize("cls", UPSTREAM_CLASSES)
def test_upstream_eager_thresholds(cls):
    row = lean_gate.row_for(cls)
    # Bases: MHA (tiles >= 16) 16K, GQA (tiles >= 4) 64K, heavy TP shard 128K; at batch 1.
    assert eager_threshold(1, *MHA_32, row) == 16 * K
    assert eager_threshold(1, *QWEN_7B, row) == 64 * K
    assert eager_threshold(1, *LLAMA_8B, row) == 64 * K
    assert eager_threshold(1, *LLAMA_70B_TP8, row) == 128 * K
    # Qwen2.5-7B (tiles 4) relaxes as batch // 2: b4 32K (off at 18.75K, "neutral -> keep
    # off"), b8 from ~18K (16K), b16 from ~8K (8K); floor 4K.
    assert eager_threshold(4, *QWEN_7B, row) == 32 * K
    assert not eager_gate(4, 4 * 18750, *QWEN_7B, False, cls)
    assert eager_threshold(8, *QWEN_7B, row) == 16 * K
    assert eager_gate(8, 8 * 18750, *QWEN_7B, False, cls)
    assert eager_threshold(16, *QWEN_7B, row) == 8 * K
    assert eager_gate(16, 16 * 8192, *QWEN_7B, False, cls)
    assert not eager_gate(16, 16 * 7500, *QWEN_7B, False, cls)
    assert eager_threshold(4096, *QWEN_7B, row) == 4096
    # Heavy TP shard (tiles < 4) relaxes slowly (batch // 4).
    assert eager_threshold(4, *LLAMA_70B_TP8, row) == 128 * K
    assert eager_threshold(8, *LLAMA_70B_TP8, row) == 64 * K
    assert not eager_gate(1, 32 * K, *LLAMA_70B_TP8, False, cls)  # "4x SLOWER at 32K"
    # Single long request, GQA: on from 64K.
    assert eager_gate(1, 64 * K, *LLAMA_8B, False, cls) and not eager_gate(1, 64 * K - 1, *LLAMA_8B, False, cls)


@pytest.mark.parametrize("cls", UPSTREAM_CLASSES)
def test_upstream_mla_needs_batch_8(cls):
    for batch in range(1, 8):
        assert not eager_gate(batch, batch * 1_000_000, *R1_TP4, True, cls), batch
        assert not capture_policy(batch, *R1_TP4, True, cls), batch
    for batch in (8, 9, 16, 32, 256):
        assert eager_gate(batch, batch * 4096, *R1_TP4, True, cls)
        assert not eager_gate(batch, batch * 4096 - 1, *R1_TP4, True, cls)  # 4K length floor
        assert capture_policy(batch, *R1_TP4, True, cls)
        assert capture_policy(batch, 128, 128, True, cls)


@pytest.mark.parametrize("cls", UPSTREAM_CLASSES)
def test_upstream_capture_policy(cls):
    for batch in range(1, 300):
        # Heavy TP shards (tiles < 4) are never baked, at any batch.
        for hq, g in (LLAMA_70B_TP8, (16, 8), (24, 8), (48, 16)):
            assert head_tiles(hq, g) < 4
            assert not capture_policy(batch, hq, g, False, cls)
        for shape in (QWEN_7B, LLAMA_8B, MHA_32):
            assert capture_policy(batch, *shape, False, cls) == (batch >= 16)


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_unknown_lengths_are_off(cls):
    for p in _grid(500):
        assert eager_gate(p["batch"], None, p["hq"], p["group"], p["mla"], cls) is False


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_no_batch_is_off(cls):
    assert not eager_gate(0, 10**9, 32, 4, False, cls)
    assert not capture_policy(0, 32, 4, False, cls)


# ----- properties over a seeded random grid --------------------------------------------------
@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_threshold_relaxes_never_tightens_with_batch(cls):
    row = lean_gate.row_for(cls)
    for hq, g in ((8, 8), (28, 7), (32, 4), (32, 1), (64, 1), (128, 16), (12, 12)):
        prev = None
        for batch in range(1, 1025):
            t = eager_threshold(batch, hq, g, row)
            assert t >= row.len_floor
            assert prev is None or t <= prev, (hq, g, batch, t, prev)
            prev = t


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_monotone_in_length_and_batch(cls):
    for p in _grid():
        b, avg, hq, g, mla = p["batch"], p["avg"], p["hq"], p["group"], p["mla"]
        on = eager_gate(b, b * avg, hq, g, mla, cls)
        if on:  # longer requests or more of them never turn it off
            assert eager_gate(b, b * avg * 2, hq, g, mla, cls)
            assert eager_gate(b, b * avg + 1, hq, g, mla, cls)
            assert eager_gate(b * 2, b * 2 * avg, hq, g, mla, cls)
            assert eager_gate(b + 1, (b + 1) * avg, hq, g, mla, cls)
        cap = capture_policy(b, hq, g, mla, cls)
        if cap:
            assert capture_policy(b + 1, hq, g, mla, cls) and capture_policy(2 * b, hq, g, mla, cls)


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_pure(cls):
    grid = list(_grid(800, seed=7))
    first = [(eager_gate(p["batch"], p["batch"] * p["avg"], p["hq"], p["group"], p["mla"], cls),
              capture_policy(p["batch"], p["hq"], p["group"], p["mla"], cls)) for p in grid]
    order = list(range(len(grid)))
    random.Random(3).shuffle(order)
    for i in order:
        p = grid[i]
        assert first[i] == (eager_gate(p["batch"], p["batch"] * p["avg"], p["hq"], p["group"], p["mla"], cls),
                            capture_policy(p["batch"], p["hq"], p["group"], p["mla"], cls))


@pytest.mark.parametrize("cls", ("default", "cpu", "sm_75", None))
def test_default_row_never_enables(cls):
    for p in _grid():
        assert not eager_gate(p["batch"], p["batch"] * p["avg"], p["hq"], p["group"], p["mla"], cls)
        assert not capture_policy(p["batch"], p["hq"], p["group"], p["mla"], cls)


def test_gate_module_imports_no_torch_or_triton():
    code = ("import sys, importlib.util as u; "
            f"s = u.spec_from_file_location('lg', {lean_gate.__file__!r}); m = u.module_from_spec(s); "
            f"sys.modules['lg'] = m; s.loader.exec_module(m); m.eager_gate(8, 8 * 70000, 32, 4, False, 'gfx950', "
            f"{str(lean_gate._shipped_table())!r}); "
            "bad = [n for n in ('torch', 'triton', 'numpy') if n in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- dispatcher path choice ---------------------------------------------------------------
GQA_LONG = dict(batch=1, num_q_heads=32, kv_group=4, seq_lens_sum=128 * K, is_mla=False)  # gate on (gfx950)
GQA_SHORT = dict(batch=1, num_q_heads=32, kv_group=4, seq_lens_sum=1 * K, is_mla=False)  # gate off
NO_ENV = {}


def test_choose_path_auto_follows_gates():
    assert dispatch.choose_path(**GQA_LONG, gpu_class="gfx950", env=NO_ENV) == "lean"
    assert dispatch.choose_path(**GQA_SHORT, gpu_class="gfx950", env=NO_ENV) == "split"
    assert dispatch.choose_path(**GQA_LONG, gpu_class="default", env=NO_ENV) == "split"
    assert dispatch.choose_path(**{**GQA_LONG, "seq_lens_sum": None}, gpu_class="gfx950", env=NO_ENV) == "split"
    # Under capture the lengths do not matter: batch, head tiles and MLA do.
    cap = dict(num_q_heads=32, kv_group=4, seq_lens_sum=None, gpu_class="gfx950", env=NO_ENV, capturing=True)
    assert dispatch.choose_path(batch=16, **cap) == "lean"
    assert dispatch.choose_path(batch=15, **cap) == "split"
    assert dispatch.choose_path(batch=64, num_q_heads=8, kv_group=8, capturing=True, gpu_class="gfx950",
                                env=NO_ENV) == "split"


def test_choose_path_fp8_cache_stays_on_split_k():
    # where the gate would pick Lean, eagerly and under capture, an fp8 cache is kept on split-K;
    # an explicit enable_lean still wins
    cap = dict(num_q_heads=32, kv_group=4, seq_lens_sum=None, gpu_class="gfx950", env=NO_ENV, capturing=True)
    assert dispatch.choose_path(**GQA_LONG, gpu_class="gfx950", env=NO_ENV, kv_fp8=True) == "split"
    assert dispatch.choose_path(batch=16, **cap, kv_fp8=True) == "split"
    assert dispatch.choose_path(**GQA_LONG, gpu_class="gfx950", env=NO_ENV, kv_fp8=True, enable_lean=True) == "lean"


def test_choose_path_override():
    assert dispatch.choose_path(**GQA_SHORT, enable_lean=True, gpu_class="default", env=NO_ENV) == "lean"
    assert dispatch.choose_path(**GQA_LONG, enable_lean=False, gpu_class="gfx950", env=NO_ENV) == "split"
    assert dispatch.choose_path(**GQA_SHORT, enable_lean=True, capturing=True, env=NO_ENV) == "lean"


@pytest.mark.parametrize("value, disabled", [("1", True), ("true", True), ("0", False), ("", False)])
def test_choose_path_kill_switch(monkeypatch, value, disabled):
    monkeypatch.setenv(dispatch.DISABLE_ENV, value)
    want = "split" if disabled else "lean"
    assert dispatch.choose_path(**GQA_LONG, gpu_class="gfx950") == want
    assert dispatch.choose_path(**GQA_SHORT, enable_lean=True) == want  # wins over an explicit True
    assert dispatch.choose_path(batch=16, num_q_heads=32, kv_group=4, capturing=True, gpu_class="gfx950") == want


def test_choose_path_kill_switch_unset(monkeypatch):
    monkeypatch.delenv(dispatch.DISABLE_ENV, raising=False)
    assert dispatch.choose_path(**GQA_LONG, gpu_class="gfx950") == "lean"


@pytest.mark.parametrize("feature", [dict(softcap=30.0), dict(sinks=True), dict(num_splits=4),
                                     dict(softcap=50.0, sinks=True)])
@pytest.mark.parametrize("enable_lean", [True, None, False])
@pytest.mark.parametrize("capturing", [False, True])
def test_unsupported_features_always_split(feature, enable_lean, capturing):
    for shape in (GQA_LONG, dict(batch=32, num_q_heads=16, kv_group=16, seq_lens_sum=32 * 64 * K, is_mla=True)):
        assert dispatch.choose_path(**shape, **feature, enable_lean=enable_lean, capturing=capturing,
                                    gpu_class="gfx950", env=NO_ENV) == "split"


def test_choose_path_softcap_zero_is_off():
    assert dispatch.choose_path(**GQA_SHORT, softcap=0.0, enable_lean=True, env=NO_ENV) == "lean"

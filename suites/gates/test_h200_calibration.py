"""The sm_90 gate row against the H200 re-sweep it was calibrated from: on every measured cell
the eager gate and the capture policy must agree with what was measured (Lean faster ->
on), except the cells listed here, which the average-length gate cannot separate."""
import json

import pytest

from decode_conformance.resources import data_path
from decode_conformance_kernels import lean_gate

# A copy of the re-sweep's lean.json (docs/gpu-runs/2026-11-30-h200-cold/), with each row's
# max_len, shipped with the gate table.
SWEEP = data_path("gates", "sm_90_lean_sweep.json")

# (shape, batch, ctx, r). Ragged cells where Lean measured 0.98-0.99x: the ragged rule cannot
# tell them from the ragged cells of the same batch size and raggedness where it won.
RAGGED_LOSSES = {("28/4/128", 16, 65536, 0.5), ("28/4/128", 32, 16384, 0.5), ("128/1/576/512", 16, 65536, 0.1)}
# Uniform cells where Lean measured 1.001-1.015x (ties within replay noise): left off.
UNIFORM_TIES = {("32/8/128", 8, 16384, 1.0), ("32/8/128", 32, 16384, 1.0), ("28/4/128", 16, 16384, 1.0),
                ("28/4/128", 32, 16384, 1.0), ("28/4/128", 32, 131072, 1.0)}
EAGER_MISSES = RAGGED_LOSSES | UNIFORM_TIES
# Capture time knows no lengths: GQA at batch >= 8 bakes Lean, so the uniform cells there that
# Lean lost (0.975-0.998x) are misses, and MLA is never baked, so its ragged wins are.
CAPTURE_MISSES = {("28/4/128", 16, 65536, 0.5), ("28/4/128", 32, 16384, 0.5)} | {
    ("32/8/128", 8, 65536, 1.0), ("32/8/128", 8, 131072, 1.0), ("32/8/128", 16, 16384, 1.0),
    ("32/8/128", 16, 65536, 1.0), ("32/8/128", 16, 131072, 1.0), ("32/8/128", 32, 65536, 1.0),
    ("28/4/128", 8, 16384, 1.0), ("28/4/128", 8, 65536, 1.0), ("28/4/128", 8, 131072, 1.0),
    ("28/4/128", 16, 65536, 1.0), ("28/4/128", 16, 131072, 1.0), ("28/4/128", 32, 65536, 1.0),
} | {("128/1/576/512", b, c, 0.1) for b, c in ((8, 65536), (8, 131072), (16, 16384), (16, 131072), (32, 16384),
                                             (32, 65536), (32, 131072))}


def _rows():
    return [r for r in json.loads(SWEEP.read_text())["rows"] if "error" not in r]


def _decision(r, capture: bool) -> bool:
    parts = [int(x) for x in r["shape"].split("/")]
    hq, hkv = parts[0], parts[1]
    mla = len(parts) == 4
    if capture:
        return lean_gate.capture_policy(r["batch"], hq, hq // hkv, is_mla=mla, gpu_class="sm_90")
    total = round(r["mean_len"] * r["batch"])
    return lean_gate.eager_gate(r["batch"], total, hq, hq // hkv, is_mla=mla, gpu_class="sm_90", max_len=r["max_len"])


@pytest.mark.parametrize("capture, expected", [(False, EAGER_MISSES), (True, CAPTURE_MISSES)],
                         ids=["eager", "capture"])
def test_gate_matches_measurement(capture, expected):
    rows = _rows()
    assert len(rows) >= 100, "the sweep file should hold the measured cells"
    misses = {(r["shape"], r["batch"], r["ctx"], r["ratio"]) for r in rows
              if _decision(r, capture) != (r["speedup"] > 1.0)}
    assert misses == expected
    if not capture:  # the bar: the eager decision picks the faster kernel on >= 90 % of cells
        assert 1 - len(misses) / len(rows) >= 0.90

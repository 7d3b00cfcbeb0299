"""The sm_90 gate row against the H200 sweep it is checked on: on every measured GQA cell the
eager gate and the capture policy must agree with what was measured (Lean faster -> on), except
the cells listed here, and no MLA cell may turn Lean on (split-K's MLA launch beats Lean on 34 of
the sweep's 36 MLA cells)."""
import json

import pytest

from decode_conformance.resources import data_path
from decode_conformance_kernels import lean_gate

# The s17-1 sweep's JSON (2026-12-03, table: docs/gpu-runs/2026-12-03-h200-s17/s17-1/lean.md): today's Lean
# against today's split-K, both kernels on one prepared batch after the timing warm-up, each row
# with its max_len.
SWEEP = data_path("gates", "sm_90_lean_sweep.json")

MLA = "128/1/576/512"
# (shape, batch, ctx, r). Ragged cells where the ragged rule picks Lean and Lean measured
# 0.993-0.997x: ties within replay noise, which the longest/average ratio cannot separate.
RAGGED_TIES = {("32/8/128", 32, 131072, 0.5), ("28/4/128", 8, 16384, 0.1), ("28/4/128", 8, 131072, 0.5)}
EAGER_MISSES = RAGGED_TIES
# Capture time knows no lengths: GQA with >= 4 head tiles at batch >= 8 bakes Lean, so every
# uniform cell there (Lean 0.944-0.993x) is a miss as well.
CAPTURE_MISSES = {(s, b, c, 1.0) for s in ("32/8/128", "28/4/128") for b in (8, 16, 32)
                  for c in (16384, 65536, 131072)} | RAGGED_TIES


def _rows(mla: bool = False):
    return [r for r in json.loads(SWEEP.read_text())["rows"] if "error" not in r and (r["shape"] == MLA) == mla]


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
    assert len(rows) >= 70, "the sweep file should hold the measured GQA cells"
    misses = {(r["shape"], r["batch"], r["ctx"], r["ratio"]) for r in rows
              if _decision(r, capture) != (r["speedup"] > 1.0)}
    assert misses == expected
    if not capture:  # the gate's target: the eager decision picks the faster kernel on >= 90 % of cells
        assert 1 - len(misses) / len(rows) >= 0.90


@pytest.mark.parametrize("capture", [False, True], ids=["eager", "capture"])
def test_mla_stays_on_split_k(capture):
    rows = _rows(mla=True)
    assert len(rows) >= 36, "the sweep file should hold the MLA cells"
    assert not any(_decision(r, capture) for r in rows)

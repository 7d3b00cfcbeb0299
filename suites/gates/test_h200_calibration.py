"""The sm_90 gate row against the H200 re-sweep it was calibrated from: on every measured GQA
cell the eager gate and the capture policy must agree with what was measured (Lean faster ->
on), except the cells listed here, which the average-length gate cannot separate. The sweep's
MLA cells predate split-K's MLA launch change (64 keys x 2 stages, 1.13-1.36x faster, s16), so
they say nothing about Lean against today's split-K: the gate must leave MLA on split-K."""
import json

import pytest

from decode_conformance.resources import data_path
from decode_conformance_kernels import lean_gate

# A copy of the Dec 1 re-sweep's lean.json after Lean's launch change
# (docs/gpu-runs/2026-12-01-h200/close10/: both kernels on one prepared batch, after the timing
# warm-up), each row with its max_len, shipped with the gate table.
SWEEP = data_path("gates", "sm_90_lean_sweep.json")

MLA = "128/1/576/512"
# (shape, batch, ctx, r). Uniform cells where Lean measured 1.001-1.011x (ties within replay
# noise): left off.
UNIFORM_TIES = {("28/4/128", 8, 16384, 1.0), ("28/4/128", 16, 16384, 1.0), ("28/4/128", 32, 16384, 1.0)}
EAGER_MISSES = UNIFORM_TIES
# Capture time knows no lengths: GQA with >= 4 head tiles at batch >= 8 bakes Lean, so the
# uniform cells there that Lean lost (0.965-0.994x) are misses.
CAPTURE_MISSES = {(s, b, c, 1.0) for s in ("32/8/128", "28/4/128") for b in (8, 16, 32)
                  for c in (16384, 65536, 131072)} - UNIFORM_TIES


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
    assert len(rows) >= 30, "the sweep file should hold the MLA cells"
    assert not any(_decision(r, capture) for r in rows)

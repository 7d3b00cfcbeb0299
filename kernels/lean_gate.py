"""When to run the Lean decode kernel: the auto-gate of the persistent Lean kernel, as pure
functions over a calibration table (no torch, no Triton: importable and testable anywhere).

Two decisions, after sglang PR #33576 ("[AMD] Add Work-Centric (Lean) Attention"):
- `eager_gate`: eager decode, where the real lengths are known on the host. A length
  threshold keyed on query-head parallelism, `head_tiles` (``ceil(Hq / min(16, group))``),
  relaxed (never tightened) as the batch grows; MLA is gated on batch. Unknown lengths
  (``seq_lens_sum is None``: a speculative draft step without a CPU length mirror) -> off.
- `capture_policy`: CUDA-graph capture, where lengths are still the capture fill value;
  decides from batch, head tiles and MLA only (Lean's persistent grid then adapts to the
  real lengths at replay).

Thresholds live in ``fixtures/gates/lean_calibration.toml``, one table per GPU class
(``decode_conformance.hardware`` class names); a class without a table uses ``default``,
which never enables Lean. Every function returns the same answer for the same arguments.
"""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Optional, Union

CALIBRATION_FILE = ("gates", "lean_calibration.toml")  # in the shipped data (decode_conformance.fixtures)
CALIBRATION_ENV = "DECODE_CONFORMANCE_LEAN_CALIBRATION"  # path override: a serving stack's own table
DEFAULT_CLASS = "default"
# The gate measures query-head parallelism in tiles of at most 16 heads: the unit sglang's gate
# and its standard decode kernel count in, and the one every threshold in the calibration table
# is expressed in. Our split-K kernels tile up to 64 heads of a group (triton_common
# MAX_HEADS_PER_TILE), so for groups over 16 they launch fewer head tiles than the gate counts;
# for groups of 16 or fewer (every shape the table was measured on) the two counts are equal.
# suites/gates/test_lean_gate.py pins both facts.
GATE_HEADS_PER_TILE = 16

__all__ = [
    "Tier", "GateRow", "head_tiles", "load_table", "row_for", "eager_threshold", "eager_gate", "capture_policy",
    "CALIBRATION_FILE", "DEFAULT_CLASS",
]


@dataclass(frozen=True)
class Tier:
    min_tiles: int
    base_len: int
    batch_div: int


@dataclass(frozen=True)
class GateRow:
    name: str
    enabled: bool
    provisional: bool
    note: str
    len_floor: int
    tiers: tuple[Tier, ...]  # decreasing min_tiles, the last one 0
    mla_min_batch: int
    mla_len_floor: int
    capture_min_batch: int
    capture_min_tiles: int
    capture_mla_min_batch: int
    # Ragged rule (eager, non-MLA, optional): on at batch >= ragged_min_batch with at least
    # capture_min_tiles head tiles when the longest request is >= ragged_ratio x the average
    # (Lean balances unequal requests; split-K's per-request chunks leave SMs idle). 0 = off.
    ragged_min_batch: int = 0
    ragged_ratio: float = 0.0
    mla_ragged_ratio: float = 0.0  # the same rule for MLA (no head-tile floor), its own ratio; 0 = off


_INT_FIELDS = ("len_floor", "mla_min_batch", "mla_len_floor", "capture_min_batch", "capture_min_tiles",
               "capture_mla_min_batch")


def _row(name: str, d: Mapping, where: str) -> GateRow:
    def need(key):
        if key not in d:
            raise ValueError(f"{where}: class {name!r} lacks {key!r}")
        return d[key]

    unknown = set(d) - set(_INT_FIELDS) - {"enabled", "provisional", "note", "tiers", "ragged_min_batch",
                                           "ragged_ratio", "mla_ragged_ratio"}
    if unknown:
        raise ValueError(f"{where}: class {name!r} has unknown keys {sorted(unknown)}")
    ints = {}
    for key in _INT_FIELDS:
        v = need(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{where}: {name}.{key} must be an int >= 0, got {v!r}")
        ints[key] = v
    tiers = []
    for t in need("tiers"):
        try:
            tier = Tier(int(t["min_tiles"]), int(t["base_len"]), int(t["batch_div"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: {name}.tiers entries need min_tiles, base_len, batch_div: {t!r}") from e
        if tier.min_tiles < 0 or tier.base_len < 1 or tier.batch_div < 1:
            raise ValueError(f"{where}: {name}.tiers entry out of range: {t!r}")
        tiers.append(tier)
    if not tiers or tiers[-1].min_tiles != 0 or any(a.min_tiles <= b.min_tiles for a, b in zip(tiers, tiers[1:])):
        raise ValueError(f"{where}: {name}.tiers must be in strictly decreasing min_tiles ending at 0")
    ragged_min_batch = d.get("ragged_min_batch", 0)
    if not isinstance(ragged_min_batch, int) or isinstance(ragged_min_batch, bool) or ragged_min_batch < 0:
        raise ValueError(f"{where}: {name}.ragged_min_batch must be an int >= 0, got {ragged_min_batch!r}")
    ratios = {}
    for key in ("ragged_ratio", "mla_ragged_ratio"):
        v = d.get(key, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v == 0 or v >= 1):
            raise ValueError(f"{where}: {name}.{key} must be 0 (off) or a number >= 1, got {v!r}")
        ratios[key] = float(v)
    enabled, provisional = need("enabled"), d.get("provisional", False)
    if not isinstance(enabled, bool) or not isinstance(provisional, bool):
        raise ValueError(f"{where}: {name}.enabled / provisional must be booleans")
    return GateRow(name=name, enabled=enabled, provisional=provisional, note=str(d.get("note", "")),
                   tiers=tuple(tiers), ragged_min_batch=ragged_min_batch, **ratios, **ints)


def _parse(data: Mapping, where: str) -> dict[str, GateRow]:
    rows = {name: _row(name, d, where) for name, d in data.items()}
    if DEFAULT_CLASS not in rows:
        raise ValueError(f"{where}: a [{DEFAULT_CLASS}] table is required")
    if rows[DEFAULT_CLASS].enabled:
        raise ValueError(f"{where}: [{DEFAULT_CLASS}] must have enabled = false (never auto-enable on unknown GPUs)")
    return rows


@lru_cache(maxsize=None)
def _load_path(path: str) -> dict[str, GateRow]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as f:
        return _parse(tomllib.load(f), path)


TableLike = Union[None, str, os.PathLike, Mapping]


def _shipped_table() -> str:
    from decode_conformance.resources import data_path
    return str(data_path(*CALIBRATION_FILE))


def load_table(table: TableLike = None) -> dict[str, GateRow]:
    """The calibration table: None -> the fixture file (or $DECODE_CONFORMANCE_LEAN_CALIBRATION);
    a path -> that TOML file; a mapping of class -> row dict (or GateRow) -> used as given."""
    if table is None:
        table = os.environ.get(CALIBRATION_ENV) or _shipped_table()
    if isinstance(table, (str, os.PathLike)):
        return dict(_load_path(str(pathlib.Path(table).resolve())))
    if all(isinstance(v, GateRow) for v in table.values()):
        return dict(table)
    return _parse(table, "<table>")


def row_for(gpu_class: Optional[str], table: TableLike = None) -> GateRow:
    rows = load_table(table)
    return rows.get(gpu_class or DEFAULT_CLASS, rows[DEFAULT_CLASS])


def head_tiles(num_q_heads: int, kv_group: int) -> int:
    """The gate's query-head parallelism: ceil(Hq / min(16, group)) head tiles per (request,
    split). Equal to the split-K kernels' head tiles when group <= 16, larger above (see
    GATE_HEADS_PER_TILE)."""
    if num_q_heads < 1:
        raise ValueError(f"num_q_heads must be >= 1, got {num_q_heads}")
    block_h = min(GATE_HEADS_PER_TILE, max(1, int(kv_group)))
    return -(-int(num_q_heads) // block_h)


def eager_threshold(batch: int, num_q_heads: int, kv_group: int, row: GateRow) -> int:
    """Average visible length at which the eager gate turns Lean on (non-MLA)."""
    tiles = head_tiles(num_q_heads, kv_group)
    tier = next(t for t in row.tiers if tiles >= t.min_tiles)
    return max(row.len_floor, tier.base_len // max(1, batch // tier.batch_div))


def eager_gate(batch: int, seq_lens_sum: Optional[int], num_q_heads: int, kv_group: int, is_mla: bool = False,
               gpu_class: Optional[str] = DEFAULT_CLASS, table: TableLike = None, *,
               max_len: Optional[int] = None) -> bool:
    """Eager decode: run Lean for these real lengths? seq_lens_sum = sum of the requests'
    (visible) lengths; None (lengths unknown) -> False. max_len = the longest request's
    (visible) length, for the row's ragged rule; None -> that rule is not applied."""
    if batch <= 0 or seq_lens_sum is None:
        return False
    row = row_for(gpu_class, table)
    if not row.enabled:
        return False
    avg_len = seq_lens_sum / batch
    if is_mla:
        if batch >= row.mla_min_batch and avg_len >= row.mla_len_floor:
            return True
        return _ragged(row, row.mla_ragged_ratio, batch, avg_len, max_len, row.mla_len_floor)
    if avg_len >= eager_threshold(batch, num_q_heads, kv_group, row):
        return True
    return (head_tiles(num_q_heads, kv_group) >= row.capture_min_tiles
            and _ragged(row, row.ragged_ratio, batch, avg_len, max_len, row.len_floor))


def _ragged(row: GateRow, ratio: float, batch: int, avg_len: float, max_len: Optional[int], floor: int) -> bool:
    """The ragged rule: a batch of at least ragged_min_batch whose longest request is at least
    `ratio` x the average (0 = rule off; max_len None = unknown, off)."""
    return (ratio > 0 and row.ragged_min_batch > 0 and max_len is not None and batch >= row.ragged_min_batch
            and avg_len >= floor and max_len >= ratio * avg_len)


def capture_policy(batch: int, num_q_heads: int, kv_group: int, is_mla: bool = False,
                   gpu_class: Optional[str] = DEFAULT_CLASS, table: TableLike = None) -> bool:
    """CUDA-graph capture: bake Lean into the graph for this batch size? (lengths unknown)."""
    if batch <= 0:
        return False
    row = row_for(gpu_class, table)
    if not row.enabled:
        return False
    if is_mla:
        return batch >= row.capture_mla_min_batch
    if head_tiles(num_q_heads, kv_group) < row.capture_min_tiles:
        return False
    return batch >= row.capture_min_batch

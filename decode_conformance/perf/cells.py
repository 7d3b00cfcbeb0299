"""Perf cells: the fixed cases the guard times (fixtures/perf_cells.toml), the bytes one decode
step of a cell moves, and which kernels run which cell."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..cases import Case

CELLS_FILE = "perf_cells.toml"
_CELL_KEYS = {"name", "shape", "lens", "v_head_dim", "mla", "kv_dtype", "page_size", "seed"}


@dataclass(frozen=True)
class PerfCell:
    name: str
    case: Case

    @property
    def context(self) -> int:
        return self.case.total_keys

    @property
    def shape(self) -> str:
        c = self.case
        return f"{c.num_q_heads}x{c.num_kv_heads}x{c.head_dim}" + (f"/{c.v_head_dim} mla" if c.mla else "")

    @property
    def bytes_moved(self) -> int:
        return bytes_moved(self.case)


def bytes_moved(case: Case) -> int:
    """Compulsory traffic of one decode step: K and V read once (MLA: K only, V is its first
    columns), q read, out and LSE written. Page-table reads (4 bytes per key or page) are
    left out."""
    import torch
    kv_elem = torch.empty((), dtype=case.cache_dtype).element_size()
    q_elem = torch.empty((), dtype=case.q_dtype).element_size()
    kv = case.total_keys * case.num_kv_heads * (case.head_dim + (0 if case.mla else case.v_head_dim)) * kv_elem
    q = case.batch * case.num_q_heads * case.head_dim * q_elem
    out = case.batch * case.num_q_heads * case.v_head_dim * q_elem + case.batch * case.num_q_heads * 4
    return kv + q + out


def cell_numbers(cell: PerfCell, us: float, read_tbs: Optional[float]) -> dict:
    """bytes, achieved TB/s and % of the measured read roofline of `cell` at `us`."""
    b = cell.bytes_moved
    tbs = b / (us * 1e-6) / 1e12 if us > 0 else 0.0
    return {"bytes": b, "tbs": tbs, "roofline_pct": 100 * tbs / read_tbs if read_tbs else None}


def load_cells(path=None) -> list[PerfCell]:
    """The perf cells; errors name the file and the cell."""
    from ..resources import read_toml
    path, data = read_toml(path, CELLS_FILE)
    cells, seen = [], set()
    for i, row in enumerate(data.get("cell", [])):
        where = f"{path}: cell {i + 1} ({row.get('name', '?')})"
        extra = set(row) - _CELL_KEYS
        if extra:
            raise ValueError(f"{where}: unknown fields {sorted(extra)}; expected {sorted(_CELL_KEYS)}")
        if not isinstance(row.get("name"), str) or row["name"] in seen:
            raise ValueError(f"{where}: needs a unique string 'name'")
        seen.add(row["name"])
        try:
            hq, hkv, d = row["shape"]
            case = Case(kv_dtype=row.get("kv_dtype", "bf16"), num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                        seq_lens=tuple(row["lens"]), v_head_dim=row.get("v_head_dim"), mla=row.get("mla", False),
                        layout="paged", page_size=row.get("page_size", 16), seed=row.get("seed", 1))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        cells.append(PerfCell(row["name"], case))
    if not cells:
        raise ValueError(f"{path}: no [[cell]] tables")
    return cells


def skip_reason(kernel, case: Case, gpu_class: Optional[str]) -> str:
    """Why `kernel` does not run `case` on this class ('' when it does): its capabilities, or
    fp8 MMAs on a class without fp8 tensor cores (as the plugin decides for parity)."""
    missing = kernel.caps.missing_for(case, "cuda")
    if missing:
        return f"{kernel.name} lacks: {', '.join(missing)}"
    if gpu_class and case.is_fp8 and getattr(kernel.caps, "fp8_mma", False):
        from .. import hardware
        cls = hardware.known_classes().get(gpu_class)
        if cls is not None and cls.vendor != "cpu" and not cls.fp8_tensor_cores:
            return f"{kernel.name} runs fp8 MMAs; class {gpu_class} has no fp8 tensor cores"
    return ""

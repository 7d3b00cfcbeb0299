"""Perf records in pytest-benchmark's JSON format. A record of one (GPU class, kernel) is the
document `pytest --benchmark-json` writes: machine_info (+ the GPU), commit_info, and one
benchmark per cell whose stats are pytest-benchmark's own (seconds; its rounds are the
recording's K session statistics) and whose extra_info carries what the guard needs (method,
noise, case id, bytes, TB/s, roofline, GPU name / UUID / class, versions). The folder
`<dir>/<gpu_class>/<kernel>.json` (another GPU model of the class: `<kernel>@<model>.json`
beside it, `record_path`) is laid out as a pytest-benchmark storage whose machine
folders are GPU classes: `pytest-benchmark --storage file://<dir> list | compare 'sm_90/*'`.
The guard reads any document of this shape, also one pytest-benchmark saved itself
(`--benchmark-save` / `--benchmark-json` of a `--perf-record` run)."""
from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import platform
import re
from typing import Optional

RECORD_VERSION = 2
METHOD = "device-events-around-replay/read-flush-256MiB/median-of-block-stats(median|eager:q10)/v2"
OLD_FORMAT = "decode-conformance-perf-baseline"
_CELL_NUMBERS = ("median_us", "noise_rel", "within_se_rel", "threshold", "bytes")


class BaselineError(Exception):
    """A record file that cannot be used (corrupt, foreign, another GPU model or method)."""


def default_dir() -> pathlib.Path:
    from ..resources import data_path
    return data_path("baselines")


def model_slug(gpu_name: str) -> str:
    """A GPU model's name as a file name part: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"


def _recorded_model(path: pathlib.Path) -> Optional[str]:
    """The GPU model a record file names, None where there is no readable one (a damaged file
    is reported when loaded, not here)."""
    try:
        return json.loads(path.read_text())["benchmarks"][0]["extra_info"]["gpu_name"]
    except (OSError, ValueError, LookupError, TypeError):
        return None


def record_path(root, gpu_class: str, kernel: str, gpu_name: Optional[str] = None) -> pathlib.Path:
    """Where the record of `kernel` on `gpu_class` is read and written on a GPU named `gpu_name`.

    A record holds one GPU model (a class may hold several: sm_90 has the H100 and the H200,
    40 % apart in bandwidth), and one pool may run both. The class's file `<kernel>.json` is
    the first model recorded; another model's record sits beside it as
    `<kernel>@<model>.json`. Both stay one folder deep, as pytest-benchmark's storage
    ('<machine>/<file>') expects. Without `gpu_name`: the class's file."""
    folder = pathlib.Path(root) / gpu_class
    plain = folder / f"{kernel}.json"
    if gpu_name is None:
        return plain
    own = folder / f"{kernel}@{model_slug(gpu_name)}.json"
    if own.exists() or _recorded_model(plain) not in (None, gpu_name):
        return own
    return plain


def pb_stats(values_us: list[float]) -> dict:
    """pytest-benchmark's statistics of `values_us` (computed by its Stats, in seconds)."""
    from pytest_benchmark.stats import Stats
    s = Stats()
    for v in values_us:
        s.update(v * 1e-6)
    out = s.as_dict()
    out["data"] = list(s.data)
    out["iterations"] = 1
    return out


def machine_info(info: dict) -> dict:
    """pytest-benchmark's machine_info fields without the host name, plus the GPU."""
    return {"machine": platform.machine(), "python_implementation": platform.python_implementation(),
            "python_version": platform.python_version(), "system": platform.system(), "release": platform.release(),
            "gpu": machine_gpu(info)}


def machine_gpu(info: dict) -> dict:
    """The GPU's identity for machine_info: what does not change from run to run on one machine
    (pytest-benchmark warns when a compared run's machine_info differs); the bandwidths, which
    do, are in each benchmark's extra_info."""
    return {k: v for k, v in gpu_fields(info).items() if k not in ("read_tbs", "copy_tbs")}


def gpu_fields(info: dict) -> dict:
    return {k: info.get(k) for k in ("gpu_name", "gpu_uuid", "gpu_class", "sms", "read_tbs", "copy_tbs", "torch",
                                      "triton", "cuda", "driver")}


def commit_info() -> dict:
    from pytest_benchmark.utils import get_commit_info
    try:
        return get_commit_info()
    except Exception as e:  # noqa: BLE001 - not a git checkout: the record says so
        return {"error": f"{type(e).__name__}: {e}"}


def benchmark_entry(kernel: str, cell: str, values_us: list[float], extra: dict, rounds_are: str) -> dict:
    """One cell as pytest-benchmark writes a benchmark; `rounds_are` says what each round is
    ("session": a record's K session statistics; "block": one session's block statistics)."""
    name = f"test_perf[{kernel}-{cell}]"
    return {"group": kernel, "name": name, "fullname": f"suites/perf/test_perf.py::{name}",
            "params": {"cell": cell}, "param": f"{kernel}-{cell}",
            "extra_info": {**extra, "rounds_are": rounds_are},
            "options": {"timer": "decode_conformance.perf.bench:DeviceClock", "disable_gc": True,
                        "min_rounds": len(values_us), "warmup": False},
            "stats": pb_stats(values_us)}


def document(entries: list[dict], info: dict) -> dict:
    import pytest_benchmark
    return {"machine_info": machine_info(info), "commit_info": commit_info(), "benchmarks": entries,
            "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "version": pytest_benchmark.__version__}


def write(path, doc: dict) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def _bad(path, what: str) -> BaselineError:
    return BaselineError(f"perf record {path}: {what}")


def cells_of(doc, path, gpu_class: str, kernel: str) -> dict[str, dict]:
    """{cell: the guard's fields} of (gpu_class, kernel) in a pytest-benchmark document, each
    with median_us from pytest-benchmark's stats.median; BaselineError naming the file and the
    field when the document cannot be used."""
    if isinstance(doc, dict) and doc.get("format") == OLD_FORMAT:
        raise _bad(path, f"foreign file: a {OLD_FORMAT!r} document (the guard's own format before it recorded "
                         "through pytest-benchmark); record it again with --perf-record")
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise _bad(path, "foreign file, not a pytest-benchmark document (no 'benchmarks' list); delete it and "
                         "record one with --perf-record")
    out = {}
    for i, b in enumerate(doc["benchmarks"]):
        x = b.get("extra_info") if isinstance(b, dict) else None
        if not isinstance(x, dict) or "perf_guard" not in x:
            continue  # another benchmark in the same file (an adopter's own)
        if x.get("mode") != "record":
            continue  # a compare or A/B measurement: one session, no noise record
        where = f"benchmark {i + 1} ({b.get('name', '?')})"
        if x.get("perf_guard") != RECORD_VERSION:
            raise _bad(path, f"{where}: record version {x.get('perf_guard')!r}, this guard reads version "
                             f"{RECORD_VERSION}; record it again with --perf-record")
        if x.get("kernel") != kernel or x.get("gpu_class") != gpu_class:
            if x.get("kernel") == kernel or x.get("gpu_class") == gpu_class:
                raise _bad(path, f"foreign file: it records kernel {x.get('kernel')!r} on GPU class "
                                 f"{x.get('gpu_class')!r}, but sits where {gpu_class}/{kernel} belongs")
            continue
        if x.get("method") != METHOD:
            raise _bad(path, f"{where}: timed with method {x.get('method')!r}; this guard times with {METHOD!r}, so "
                             "the numbers do not compare: record it again with --perf-record")
        if not isinstance(x.get("gpu_name"), str):
            raise _bad(path, f"corrupt: {where}: extra_info.gpu_name missing")
        if not isinstance(x.get("sessions"), int) or x["sessions"] < 1:
            raise _bad(path, f"corrupt: {where}: extra_info.sessions must be a positive int")
        stats = b.get("stats") if isinstance(b.get("stats"), dict) else {}
        med = stats.get("median")
        cell = dict(x, median_us=med * 1e6 if isinstance(med, (int, float)) and not isinstance(med, bool) else med)
        for key in _CELL_NUMBERS:
            v = cell.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0 or (
                    key == "median_us" and v <= 0):
                field = "stats.median" if key == "median_us" else f"extra_info.{key}"
                raise _bad(path, f"corrupt: cell {x.get('cell')!r} field {field} = {v!r}")
        if not isinstance(x.get("case"), str) or not isinstance(x.get("cell"), str):
            raise _bad(path, f"corrupt: {where}: extra_info needs 'cell' and 'case'")
        cell["sessions_us"] = [v * 1e6 for v in stats.get("data") or []]
        out[x["cell"]] = cell
    if not out:
        raise _bad(path, f"foreign file: no benchmark of kernel {kernel!r} on GPU class {gpu_class!r} recorded by "
                         "the perf guard (extra_info.perf_guard); record one with --perf-record")
    return out


def load(path, gpu_class: str, kernel: str) -> Optional[dict[str, dict]]:
    """The validated cells of a record file, None when it does not exist."""
    path = pathlib.Path(path)
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise _bad(path, f"corrupt: not readable JSON ({e})") from None
    return cells_of(doc, path, gpu_class, kernel)

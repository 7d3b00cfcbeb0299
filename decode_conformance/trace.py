"""FlashInfer-Trace workloads as a case set, and our verdicts as FlashInfer-Trace records.

FlashInfer-Bench's FlashInfer-Trace schema is how kernel teams record decode shapes from
real serving: a *definition* per op (`gqa_paged_decode_h32_kv8_d128_ps1.json`: constant
axes such as heads, head dim, page size; the inputs with their dtypes) and *workloads* as
JSONL, one `{"definition", "workload": {"uuid", "axes", "inputs"}, ...}` per line, whose
`kv_indptr` / `kv_indices` (/ `kv_last_page_len`) come from safetensors blobs captured in
serving and whose `sm_scale` is a scalar. The JSON is read directly (the flashinfer-bench
package pulls in flashinfer itself), safetensors with a 40-line reader below.

    pytest suites/parity --case-set=trace:PATH/workloads/gqa_paged_decode_h32_kv8_d128_ps1.jsonl
    python -m decode_conformance.trace show PATH.jsonl            # the cases a workload file maps to
    python -m decode_conformance.trace run PATH.jsonl --kernel SPEC --out verdicts.jsonl
    python -m decode_conformance.trace export --report reports/r.json --workloads PATH.jsonl --out verdicts.jsonl

Mapping (definition + workload -> Case):
  gqa_paged decode   num_qo_heads, num_kv_heads, head_dim, page_size; KV dtype from k_cache
                     (bfloat16 / float16; float8_e4m3fn / float8_e5m2 with bf16 q)
  mla_paged decode   num_qo_heads, head_dim_ckv (= V) + head_dim_kpe (rope) -> MLA, one latent head
  lengths            from the blob: request b holds kv_indptr[b+1] - kv_indptr[b] pages, all full
                     but the last, which holds kv_last_page_len[b] keys (page size 1: one key each).
                     Without blobs: batch_size and num_kv_indices, pages spread evenly (noted as
                     approximate in the case's note).
  sm_scale           the workload's scalar; our case carries it when it differs from the default
  page lists         the case keeps lengths and page size: our factory lays out fresh shuffled,
                     NaN-poisoned pages (production lists can share prefix pages across requests;
                     the note counts shared pages). q/K/V are our structured data (the workloads'
                     q/K/V are `random`).
  id                 `fit<first 8 hex of the uuid>-...`; the note names the definition and uuid.
Verdicts are written as Trace records: status PASSED / INCORRECT_NUMERICAL / INCORRECT_SHAPE /
RUNTIME_ERROR / TIMEOUT, correctness (max absolute / relative error of the output against our
float64 reference; our per-row verdict in `correctness.extra`), performance (the harness's
single-call wall times, not a benchmark), environment, timestamp, log (our verdict text and the
reproduce line). FlashInfer-Trace LSEs are base 2; ours are natural log: `extra.lse_max_abs_error_base2`
converts.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import struct
import zlib
from dataclasses import dataclass
from typing import Iterable, Optional

from .cases import Case

LN2 = math.log(2.0)
KV_DTYPES = {  # (q dtype, cache dtype) -> our kv_dtype token
    ("bfloat16", "bfloat16"): "bf16",
    ("float16", "float16"): "fp16",
    ("bfloat16", "float8_e4m3fn"): "e4m3",
    ("bfloat16", "float8_e5m2"): "e5m2",
}


class TraceError(ValueError):
    pass


# ---- safetensors (no dependency) --------------------------------------------------------------
_ST_DTYPES = {"I32": "int32", "I64": "int64", "I16": "int16", "I8": "int8", "U8": "uint8", "F32": "float32",
              "F16": "float16", "BF16": "bfloat16", "F64": "float64", "BOOL": "bool"}


def read_safetensors(path) -> dict:
    """{name: torch tensor} of a .safetensors file (an 8-byte little-endian header length, a
    JSON header with dtype, shape and data_offsets per tensor, then the raw bytes)."""
    import torch
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dt = getattr(torch, _ST_DTYPES[spec["dtype"]])
        lo, hi = spec["data_offsets"]
        t = torch.frombuffer(bytearray(body[lo:hi]), dtype=dt) if hi > lo else torch.empty(0, dtype=dt)
        out[name] = t.reshape(spec["shape"])
    return out


def write_safetensors(path, tensors: dict) -> None:
    import torch
    names = {v: k for k, v in _ST_DTYPES.items()}
    header, chunks, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[str(t.dtype).replace("torch.", "")], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(chunks))


# ---- reading -----------------------------------------------------------------------------------
@dataclass
class TraceWorkload:
    definition: dict
    record: dict  # the JSONL line (definition name, workload, ...)
    case: Case
    path: pathlib.Path  # the workload file

    @property
    def uuid(self) -> str:
        return self.record["workload"]["uuid"]


def resolve(spec: str) -> pathlib.Path:
    """A workload file: the path as given, else under the shipped data (fixtures/traces/)."""
    p = pathlib.Path(spec).expanduser()
    if p.exists():
        return p.resolve()
    from .resources import data_path
    q = data_path("traces", spec)
    if q.exists():
        return q
    raise TraceError(f"FlashInfer-Trace workloads {spec!r}: no such file (nor under the shipped fixtures/traces/)")


def read_jsonl(path: pathlib.Path) -> list[dict]:
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{i}: not JSON ({e})") from None
        if "workload" not in rec and "uuid" in rec:
            rec = {"definition": None, "workload": rec}
        if not isinstance(rec.get("workload"), dict) or "uuid" not in rec["workload"]:
            raise TraceError(f"{path}:{i}: expected a FlashInfer-Trace workload line "
                             '({"definition": NAME, "workload": {"uuid", "axes", "inputs"}})')
        out.append(rec)
    return out


def find_definition(name: str, near: pathlib.Path) -> pathlib.Path:
    """`<name>.json` next to the workload file, or under a `definitions/` folder of it or of
    one of its parents (the FlashInfer-Trace dataset layout)."""
    for d in [near.parent, *near.parents]:
        cand = d / f"{name}.json"
        if cand.exists():
            return cand
        defs = d / "definitions"
        if defs.is_dir():
            hits = sorted(defs.rglob(f"{name}.json"))
            if hits:
                return hits[0]
    raise TraceError(f"definition {name!r} of {near}: no {name}.json beside it or under a definitions/ folder above")


def _blob(inputs: dict, key: str, near: pathlib.Path, cache: dict):
    spec = inputs.get(key)
    if not spec or spec.get("type") != "safetensors":
        return None
    rel = pathlib.Path(spec["path"])
    cands = [rel] if rel.is_absolute() else [d / rel for d in [near.parent, *near.parents]]
    for c in cands:
        if c.exists():
            if c not in cache:
                cache[c] = read_safetensors(c)
            t = cache[c].get(spec.get("tensor_key", key))
            if t is None:
                raise TraceError(f"{c}: no tensor {spec.get('tensor_key', key)!r}")
            return t
    return None


def _const(defn: dict, axis: str) -> int:
    a = defn.get("axes", {}).get(axis)
    if not a or a.get("type") != "const":
        raise TraceError(f"definition {defn.get('name')}: axis {axis!r} is not a constant")
    return int(a["value"])


def _kv_dtype(defn: dict, q_name: str, cache_name: str) -> str:
    ins = defn.get("inputs", {})
    key = (ins.get(q_name, {}).get("dtype"), ins.get(cache_name, {}).get("dtype"))
    if key not in KV_DTYPES:
        raise TraceError(f"definition {defn.get('name')}: q/cache dtypes {key} have no case dtype; "
                         f"supported: {sorted(KV_DTYPES)}")
    return KV_DTYPES[key]


def _is_decode(defn: dict) -> bool:
    return "decode" in defn.get("name", "") or "stage:decode" in defn.get("tags", [])


def shape_of(defn: dict) -> dict:
    """Case fields a definition fixes."""
    op = defn.get("op_type")
    if not _is_decode(defn):
        raise TraceError(f"definition {defn.get('name')}: not a decode definition (only decode ops map to cases)")
    if op == "gqa_paged":
        hq, hkv, d = _const(defn, "num_qo_heads"), _const(defn, "num_kv_heads"), _const(defn, "head_dim")
        return dict(kv_dtype=_kv_dtype(defn, "q", "k_cache"), num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                    layout="paged", page_size=_const(defn, "page_size"))
    if op == "mla_paged":
        ckv, kpe = _const(defn, "head_dim_ckv"), _const(defn, "head_dim_kpe")
        return dict(kv_dtype=_kv_dtype(defn, "q_nope", "ckv_cache"), num_q_heads=_const(defn, "num_qo_heads"),
                    num_kv_heads=1, head_dim=ckv + kpe, v_head_dim=ckv, mla=True, layout="paged",
                    page_size=_const(defn, "page_size"))
    raise TraceError(f"definition {defn.get('name')}: op_type {op!r} is not mapped (gqa_paged, mla_paged decode)")


def lengths_of(defn: dict, wl: dict, page: int, near: pathlib.Path, cache: dict) -> tuple[tuple[int, ...], str]:
    """(request lengths, note) of a workload."""
    inputs = wl.get("inputs", {})
    indptr = _blob(inputs, "kv_indptr", near, cache)
    if indptr is not None:
        indptr = [int(x) for x in indptr.tolist()]
        pages = [indptr[b + 1] - indptr[b] for b in range(len(indptr) - 1)]
        last = _blob(inputs, "kv_last_page_len", near, cache)
        last = [int(x) for x in last.tolist()] if last is not None else [page] * len(pages)
        if len(last) != len(pages):
            raise TraceError(f"workload {wl['uuid']}: kv_last_page_len has {len(last)} entries, batch {len(pages)}")
        lens = tuple(0 if n == 0 else (n - 1) * page + max(0, min(page, lp)) for n, lp in zip(pages, last))
        note = ""
        idx = _blob(inputs, "kv_indices", near, cache)
        if idx is not None:
            ids = [int(x) for x in idx.tolist()]
            owners: dict[int, set] = {}
            for b in range(len(pages)):
                for pg in ids[indptr[b]:indptr[b + 1]]:
                    owners.setdefault(pg, set()).add(b)
            shared = sum(1 for o in owners.values() if len(o) > 1)
            if shared:
                note = f"; {shared} page(s) shared across requests in the trace (here each request owns its pages)"
        return lens, note
    axes = wl.get("axes", {})
    if "batch_size" not in axes or "num_kv_indices" not in axes:
        raise TraceError(f"workload {wl['uuid']}: no kv_indptr blob and no batch_size / num_kv_indices axes")
    b, total = int(axes["batch_size"]), int(axes["num_kv_indices"])
    pages = [total // b + (1 if i < total % b else 0) for i in range(b)]
    return tuple(n * page for n in pages), "; lengths approximate (no kv_indptr blob: pages spread evenly, full)"


def workload_case(defn: dict, rec: dict, near: pathlib.Path, cache: Optional[dict] = None) -> Case:
    cache = {} if cache is None else cache
    wl = rec["workload"]
    fields = shape_of(defn)
    lens, note = lengths_of(defn, wl, fields["page_size"], near, cache)
    fields["seq_lens"] = lens
    uid = str(wl["uuid"])
    label = "fit" + uid.replace("-", "")[:8]
    case = Case(**fields, label=label, seed=zlib.crc32(uid.encode()) & 0x7FFFFFFF)
    sm = wl.get("inputs", {}).get("sm_scale", {})
    if sm.get("type") == "scalar":
        v = float(sm["value"])
        if abs(v - case.sm_scale) > 1e-6 * case.sm_scale:  # float32 round-off of the default is the default
            case = case.replace(scale=v)
    return case.replace(note=f"FlashInfer-Trace {defn['name']} workload {uid}{note}")


def load(spec: str) -> list[TraceWorkload]:
    path = resolve(spec)
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    out, defs, cache = [], {}, {}
    for f in files:
        for rec in read_jsonl(f):
            name = rec.get("definition")
            if not name:
                raise TraceError(f"{f}: a workload line names no definition")
            if name not in defs:
                defs[name] = json.loads(find_definition(name, f).read_text())
            if not _is_decode(defs[name]):
                continue
            out.append(TraceWorkload(defs[name], rec, workload_case(defs[name], rec, f, cache), f))
    if not out:
        raise TraceError(f"{spec}: no decode workloads")
    return out


def load_cases(spec: str) -> list[Case]:
    """The case set `trace:PATH` (case_sets.build_set). Raises ValueError, naming the problem."""
    seen, out = set(), []
    for w in load(spec):
        if w.case.id not in seen:
            seen.add(w.case.id)
            out.append(w.case)
    return out


# ---- verdicts as trace records ---------------------------------------------------------------------
def environment(device: str) -> dict:
    import torch
    libs = {"torch": torch.__version__}
    try:
        import triton
        libs["triton"] = triton.__version__
    except Exception:
        pass
    try:
        from importlib.metadata import version
        libs["decode_conformance"] = version("decode-conformance")
    except Exception:
        libs["decode_conformance"] = "checkout"
    hw = "CPU (Triton interpreter)" if device == "cpu" else torch.cuda.get_device_name(torch.device(device)).replace(" ", "_")
    return {"hardware": hw, "libs": libs}


def _status(result_status: str, message: str, verdict: Optional[dict]) -> str:
    if result_status == "passed":
        return "PASSED"
    if "hung" in message or "timed out" in message or "time limit" in message:
        return "TIMEOUT"
    if message.startswith("kernel replaced"):
        return "INCORRECT_SHAPE"
    if verdict is not None:
        return "INCORRECT_NUMERICAL"
    return "RUNTIME_ERROR"


def record(w: TraceWorkload, kernel_name: str, status: str, env: dict, log: str,
           correctness: Optional[dict] = None, performance: Optional[dict] = None) -> dict:
    ev = {"status": status, "environment": env,
          "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "log": log}
    if status in ("PASSED", "INCORRECT_NUMERICAL"):
        ev["correctness"] = correctness or {"max_relative_error": float("nan"), "max_absolute_error": float("nan")}
    if status == "PASSED":
        ev["performance"] = performance or {"latency_ms": 0.0, "reference_latency_ms": 0.0, "speedup_factor": 0.0}
    return {"definition": w.definition["name"], "workload": w.record["workload"], "solution": kernel_name,
            "evaluation": ev}


def _performance(phases: dict) -> dict:
    lat, ref = 1e3 * phases.get("launch", 0.0), 1e3 * phases.get("reference", 0.0)
    return {"latency_ms": lat, "reference_latency_ms": ref, "speedup_factor": (ref / lat) if lat > 0 else 0.0}


def _errors(case: Case, kernel, out, device) -> dict:
    """Max absolute / relative output error against the float64 reference, rebuilt from the
    case's seed (the same tensors the kernel saw)."""
    import torch
    from .reference import reference
    from .runner import prepare
    batch = prepare(kernel, case, device)
    ref = reference(case, batch)
    r = ref.out.double().cpu()
    o = out.double().cpu()
    diff = (o - r).abs()
    finite = torch.isfinite(diff)
    abs_err = float(diff[finite].max()) if finite.any() else float("nan")
    if not finite.all():
        abs_err = float("inf")
    rel = diff / (r.abs() + 1e-8)
    return {"max_absolute_error": abs_err, "max_relative_error": float(rel.max()) if rel.numel() else 0.0}


def run(spec: str, kernel, device: str = "cpu", kernel_spec: Optional[str] = None) -> list[dict]:
    """Every workload of `spec` through runner.run_case (judge, poisoning, input checks), as
    trace records."""
    from ._paths import suite_test
    from .devices import device_type
    from .runner import failure_text, repro_command, run_case
    env = environment(device)
    target, pyargs = suite_test("parity/test_parity.py::test_parity")
    out = []
    for w in load(spec):
        case = w.case
        if kernel.caps.missing_for(case, device_type(device)):
            continue
        repro = repro_command(kernel_spec or kernel.name, case, f"trace:{spec}", device, test=target, pyargs=pyargs)
        res = run_case(kernel, case, device, repro=repro, keep_output=True)
        status = _status(res.status, res.message, res.verdict.to_dict() if res.verdict else None)
        corr = perf = None
        if status in ("PASSED", "INCORRECT_NUMERICAL"):
            corr = _errors(case, kernel, res.output, device)
            corr["extra"] = _extra(case, res.verdict.to_dict() if res.verdict else None)
        if status == "PASSED":
            perf = _performance(res.phases)
        out.append(record(w, kernel.name, status, env, failure_text(res, case), corr, perf))
    return out


def _extra(case: Case, verdict: Optional[dict]) -> dict:
    x = {"judge": "decode-conformance per-(request, head) row budget (decode_conformance/metrics.py)",
         "case_id": case.id, "performance_note": "single-call wall time of the harness, not a benchmark"}
    if verdict:
        x.update({k: verdict.get(k) for k in ("passed", "failures", "worst_row", "worst_row_ratio", "worst_row_err",
                                              "rows_over", "cosine", "nonfinite")})
        lse = verdict.get("lse_err")
        x["lse_max_abs_error_natural"] = lse
        x["lse_max_abs_error_base2"] = None if lse is None else lse / LN2
    return x


def export(report_path, spec: str) -> list[dict]:
    """Trace records from a conformance report (`pytest ... --case-set=trace:PATH
    --conformance-report=R`: isolation, ledgers and all) for the workloads of `spec`. Max
    errors are not in the report: NaN there, our verdict in correctness.extra."""
    rep = json.loads(pathlib.Path(report_path).read_text())
    by_id = {w.case.id: w for w in load(spec)}
    device = rep.get("meta", {}).get("device", "cpu")
    env = {"hardware": rep.get("meta", {}).get("gpu_class", device), "libs": {}}
    env["libs"] = {k: str(v) for k, v in rep.get("meta", {}).items() if k in ("torch", "triton", "decode_conformance")}
    out = []
    for row in rep.get("results", []):
        w = by_id.get(row.get("case"))
        if w is None or not row.get("test", "").endswith("test_parity") or row["status"] in ("skipped", "quarantined"):
            continue
        verdict = row.get("verdict")
        st = "passed" if row["status"] in ("passed", "xpassed") else row["status"]
        status = _status(st, row.get("message", ""), verdict)
        corr = {"max_relative_error": float("nan"), "max_absolute_error": float("nan"), "extra": _extra(w.case, verdict)}
        out.append(record(w, row["kernel"], status, env, f"{row.get('message', '')}\nreproduce: {row.get('repro', '')}",
                          corr if status in ("PASSED", "INCORRECT_NUMERICAL") else None,
                          _performance(row.get("phases", {})) if status == "PASSED" else None))
    return out


def write_records(path, records: Iterable[dict]) -> pathlib.Path:
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
    return p


def validate_record(rec: dict) -> list[str]:
    """Problems with a trace record against the FlashInfer-Trace schema (Trace / Evaluation)."""
    errs = []
    for k in ("definition", "workload"):
        if not rec.get(k):
            errs.append(f"missing {k}")
    wl = rec.get("workload") or {}
    for k in ("uuid", "axes", "inputs"):
        if k not in wl:
            errs.append(f"workload.{k} missing")
    ev = rec.get("evaluation")
    if ev is None:
        return errs
    statuses = ("PASSED", "INCORRECT_SHAPE", "INCORRECT_NUMERICAL", "INCORRECT_DTYPE", "RUNTIME_ERROR",
                "COMPILE_ERROR", "TIMEOUT")
    if ev.get("status") not in statuses:
        errs.append(f"evaluation.status {ev.get('status')!r}")
    if not (ev.get("environment") or {}).get("hardware"):
        errs.append("evaluation.environment.hardware missing")
    if not ev.get("timestamp"):
        errs.append("evaluation.timestamp missing")
    has_c, has_p = ev.get("correctness") is not None, ev.get("performance") is not None
    want_c = ev.get("status") in ("PASSED", "INCORRECT_NUMERICAL")
    want_p = ev.get("status") == "PASSED"
    if has_c != want_c:
        errs.append(f"correctness {'missing' if want_c else 'present'} for status {ev.get('status')}")
    if has_p != want_p:
        errs.append(f"performance {'missing' if want_p else 'present'} for status {ev.get('status')}")
    if has_c:
        for k in ("max_relative_error", "max_absolute_error"):
            v = ev["correctness"].get(k)
            if not isinstance(v, (int, float)) or (v < 0 and not math.isnan(v)):
                errs.append(f"correctness.{k} {v!r}")
    if has_p:
        for k in ("latency_ms", "reference_latency_ms", "speedup_factor"):
            v = ev["performance"].get(k)
            if not isinstance(v, (int, float)) or v < 0:
                errs.append(f"performance.{k} {v!r}")
    return errs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decode_conformance.trace", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="list the cases a workload file maps to")
    s.add_argument("workloads")
    r = sub.add_parser("run", help="run every workload on a kernel and write trace records")
    r.add_argument("workloads")
    r.add_argument("--kernel", required=True)
    r.add_argument("--device", default="cpu")
    r.add_argument("--out", required=True)
    e = sub.add_parser("export", help="trace records from a conformance report of --case-set=trace:PATH")
    e.add_argument("--report", required=True)
    e.add_argument("--workloads", required=True)
    e.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from . import _paths
    _paths.alias_checkout()
    if args.cmd == "show":
        for w in load(args.workloads):
            print(f"{w.case.id}\n    {w.case.note}")
        return 0
    if args.cmd == "export":
        recs = export(args.report, args.workloads)
    else:
        if args.device == "cpu":
            from .devices import use_interpreter
            use_interpreter()
        from .kernel_api import kernel_specs, load_kernel
        spec = kernel_specs([args.kernel], env="")[0]
        recs = run(args.workloads, load_kernel(spec), args.device, spec)
    p = write_records(args.out, recs)
    bad = [x for x in recs if x["evaluation"]["status"] != "PASSED"]
    for x in bad:
        print(f"{x['evaluation']['status']}: {x['evaluation']['log']}\n")
    print(f"{len(recs)} trace records -> {p} ({len(bad)} not PASSED)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

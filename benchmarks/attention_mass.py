"""Where a kernel's softmax weight goes on one row of a case: V replaced by indicators.

    python benchmarks/attention_mass.py CASE_ID --kernel=SPEC [--request B] [--head H]
        [--blocks 64] [--q-scale 1.0 0.1 ...] [--show 8] [--device cuda]

A row's output is sum_p w_p V_p with weights w_p = softmax(s)_p. With V_p set to indicator
features (column 0 = 1 for every key, column 1 + j = 1 for the keys of block j), the output
reads the kernel's weights back directly: column 0 is their total (1 for a normalized row),
column 1 + j the mass block j got. The float64 reference gets the same inputs, so each block's
mass is compared with the exact one. That tells a wrong visible set (mass on a block that
should have none, or none where it should be), a lost tile, a renormalization error (total
!= 1) and a skew inside the row apart, where the output error alone cannot.

Only request REQUEST's visible keys get indicators (the other requests keep their V). The
scores are untouched (K and q are the case's), except that --q-scale multiplies q: a sweep
shows at what score magnitude a kernel's weights start to move. MLA cases are refused: V is
part of K there, and indicators would change the scores.
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
from dataclasses import dataclass

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()  # the kernels package importable as decode_conformance_kernels from a checkout


@dataclass
class Mass:
    total: float  # the kernel's weights summed (column 0)
    blocks: list  # [(first key, last key, kernel mass, reference mass)]
    block_keys: int
    lse: float  # the kernel's LSE of the row (nan where it returns none)
    ref_lse: float

    def worst(self) -> float:
        return max((abs(k - r) for _, _, k, r in self.blocks), default=0.0)


def plant_indicators(case, batch, request: int, blocks: int) -> int:
    """Overwrite request `request`'s visible keys' V with indicator features; returns the keys
    per block. The stored value is 1 (exact in every cache type); v_scale is divided out later."""
    from decode_conformance.reference import visible_range
    if case.mla:
        raise SystemExit("attention_mass: MLA cases are refused (V is the first columns of K: indicators would "
                         "change the scores)")
    L = case.seq_lens[request]
    start, end = visible_range(L, case.visible_keys)
    n = end - start
    if n == 0:
        raise SystemExit(f"attention_mass: request {request} has no visible key (lengths {case.seq_lens})")
    Dv = case.v_head_dim
    per = max(1, math.ceil(n / min(blocks, Dv - 1)))
    first = int(batch.kv_indptr[request])
    slots = batch.kv_indices[first + start:first + end].long()
    features = torch.zeros((n, Dv), dtype=torch.float32, device=batch.device)
    features[:, 0] = 1.0
    idx = torch.arange(n, device=batch.device)
    features[idx, 1 + idx // per] = 1.0
    # Written through the page view, not batch.v_slots(): where K and V share one allocation
    # (combined_kv) v_cache is strided and flattening it copies, so the indicators would land
    # in a copy the kernel never reads.
    v, ps = batch.v_cache, batch.page_size
    v[slots // ps, slots % ps] = features[:, None, :].to(v.dtype).expand(n, v.shape[2], Dv)
    return per


def measure(kernel, case, device: str, request: int, head: int, blocks: int = 64, q_scale: float = 1.0) -> Mass:
    from decode_conformance.reference import reference, visible_range
    from decode_conformance.runner import launch, plan, prepare
    missing = kernel.caps.missing_for(case, device)
    if missing:  # a declared skip is not the kernel's answer: say so instead of launching it
        raise SystemExit(f"attention_mass: {kernel.name} does not declare {case.id}: {'; '.join(missing)}")
    batch = prepare(kernel, case, device)
    if q_scale != 1.0:
        batch.q.mul_(q_scale)
    per = plant_indicators(case, batch, request, blocks)
    ref = reference(case, batch)
    run = plan(kernel, batch)
    launch(batch, run)
    v_scale = case.scales[1]
    got = batch.out[request, head].double().cpu() / v_scale
    want = ref.out[request, head].double().cpu() / v_scale
    start, end = visible_range(case.seq_lens[request], case.visible_keys)
    rows = []
    for j in range(math.ceil((end - start) / per)):
        lo, hi = start + j * per, min(end, start + (j + 1) * per) - 1
        rows.append((lo, hi, float(got[1 + j]), float(want[1 + j])))
    lse = float(batch.lse[request, head]) if kernel.caps.lse else float("nan")
    return Mass(total=float(got[0]), blocks=rows, block_keys=per, lse=lse, ref_lse=float(ref.lse[request, head]))


def report(m: Mass, q_scale: float, show: int = 8) -> str:
    lines = [f"q x {q_scale:g}: total weight {m.total:.6g} (exact 1), worst block off by {m.worst():.3g}, "
             f"LSE {m.lse:.8g} (reference {m.ref_lse:.8g}); {len(m.blocks)} blocks of {m.block_keys} keys"]
    ranked = sorted(m.blocks, key=lambda r: -abs(r[2] - r[3]))[:show]
    for lo, hi, k, r in sorted(ranked):
        lines.append(f"  keys {lo:>7}-{hi:<7} kernel {k:.6g}  reference {r:.6g}  ({k - r:+.3g})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case_id")
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--case-set", default="parity")
    ap.add_argument("--request", type=int, default=None, help="default: the longest request")
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--q-scale", type=float, nargs="*", default=[1.0])
    ap.add_argument("--show", type=int, default=8, help="blocks listed per scale, the worst first")
    a = ap.parse_args(argv)
    from decode_conformance import inspect as dci
    dev = dci._device(a.device)
    kernel = dci.load(a.kernel, dev)
    case = dci.find_case(a.case_id, a.case_set, dev)
    request = a.request if a.request is not None else max(range(case.batch), key=lambda b: case.seq_lens[b])
    print(f"{kernel.name} on {case.id}, request {request} ({case.seq_lens[request]} keys), head {a.head}")
    for s in a.q_scale:
        print(report(measure(kernel, case, dev, request, a.head, a.blocks, s), s, a.show))
    return 0


if __name__ == "__main__":
    sys.exit(main())

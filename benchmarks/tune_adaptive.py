"""Occupancy knobs of the adaptive split-K kernel on a GPU: programs per SM (as a multiple of
the SM count given to the rule) and the split cap, on the cells where the seed's defaults
(2 programs per SM, 64 splits) trailed the fixed-split kernel or torch SDPA.

    python benchmarks/tune_adaptive.py --out results/
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from decode_conformance import _paths  # noqa: E402

_paths.alias_checkout()

import torch  # noqa: E402

from decode_conformance.perf import timing  # noqa: E402
from decode_conformance.metrics import cosine  # noqa: E402
from decode_conformance.runner import prepare  # noqa: E402
from decode_conformance_kernels.adaptive_split import AdaptiveSplitKernel  # noqa: E402
from decode_conformance_kernels.fixed_split import FixedSplitKernel  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sweep import _case  # noqa: E402

CELLS = [((32, 8, 128), 1, 131072), ((16, 2, 256), 1, 131072), ((32, 8, 128), 4, 131072),
         ((32, 8, 128), 16, 16384), ((32, 8, 128), 16, 65536), ((32, 8, 128), 32, 16384),
         ((16, 2, 256), 4, 4096), ((32, 8, 128), 1, 1024), ((16, 2, 256), 32, 1024),
         ((128, 1, 576, 512), 8, 4096), ((128, 1, 576, 512), 1, 16384)]
VARIANTS = [(1, 64), (2, 64), (4, 64), (8, 64), (2, 128), (4, 128)]  # (programs-per-SM multiple, split cap)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import triton
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for shape, bsz, ctx in CELLS:
        case = _case(shape, [ctx] * bsz)
        row = {"shape": "/".join(map(str, shape)), "batch": bsz, "ctx": ctx}
        fx = FixedSplitKernel()
        fb = prepare(fx, case, "cuda")
        f_launch = fx.plan(fb)
        row["fixed_us"] = timing.graph_median_us(f_launch, "cuda", reps=args.reps)
        f_launch()
        for mult, cap in VARIANTS:
            k = AdaptiveSplitKernel(num_sms=sms * mult, max_splits=cap)
            b = prepare(k, case, "cuda")
            launch = k.plan(b)
            row[f"x{mult}_cap{cap}_us"] = timing.graph_median_us(launch, "cuda", reps=args.reps)
            launch()
            torch.cuda.synchronize()
            row[f"x{mult}_cap{cap}_cos"] = cosine(b.out, fb.out)
        print(json.dumps(row), flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    meta = {"gpu": torch.cuda.get_device_name(), "sms": sms, "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "variants": VARIANTS}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

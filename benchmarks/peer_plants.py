"""Bugs planted in the peers' real kernels: does the parity suite catch what it was not built around?

Our planted bugs and mutants were designed together with the checks that catch them. These are
one-line changes to vLLM's and sglang's own Triton kernel files (extracted by
`benchmarks/peer_carry.py`). Each models a bug a decode kernel can ship with. For every plant,
this copies the kernel folder, applies the change, runs the parity suite on that adapter, and
counts the failures beyond the unplanted kernel's own, split by the failing cases' input
distribution. The table it prints is docs/cases.md's "Bugs planted in the peers' real kernels".

    python benchmarks/peer_plants.py --site .carry/peers/site [--plant NAME ...] [--out DIR] [-n 2]

On a machine without a GPU the suite runs Triton's interpreter on the interpreter-sized set.
Each run takes 20-40 s on 2 cores. Exit status 1 when a plant's text is missing from its file
(a new release moved the line), or when a plant fails no case.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
REGISTRY = "decode_conformance_kernels.registry:"
VLLM = "vllm/v1/attention/ops/triton_unified_attention.py"
VLLM_HELPERS = "vllm/v1/attention/ops/triton_attention_helpers.py"
SGLANG = "sglang/kernels/ops/attention/decode_attention.py"


@dataclasses.dataclass(frozen=True)
class Plant:
    name: str
    adapter: str
    path: str  # in the kernel folder
    old: str
    new: str
    count: int  # how many times `old` occurs (every occurrence is changed)
    models: str


PLANTS = (
    Plant("scale-1pct", "vllm_unified_2d", VLLM, "    score_scale = scale\n", "    score_scale = scale * 1.01\n", 1,
          "every score scaled 1 % high"),
    Plant("window-plus-one", "vllm_unified_2d", VLLM, "SLIDING_WINDOW=(1 + window_size[0]),",
          "SLIDING_WINDOW=(1 + window_size[0] + (window_size[0] >= 0)),", 1,
          "one key more inside a sliding window"),
    Plant("rescale-exp2", "vllm_unified_2d", VLLM_HELPERS, "    alpha = tl.exp(M - safe_m_j)\n",
          "    alpha = tl.exp2(M - safe_m_j)\n", 1,
          "the running sum's rescale as a power of 2 where the scores are natural logs"),
    Plant("segments-unscaled", "vllm_unified_3d", VLLM, "    segm_output *= segment_scale[:, None]\n",
          "    segm_output *= 1.0\n", 1, "the 3D path's segment outputs merged without their rescale"),
    Plant("split-end-minus-one", "sglang_decode", SGLANG,
          "\n    split_kv_end = tl.minimum(split_kv_start + kv_len_per_split, cur_batch_seq_len)\n",
          "\n    split_kv_end = tl.minimum(split_kv_start + kv_len_per_split - 1, cur_batch_seq_len)\n", 2,
          "each KV split's last key skipped by both stage-1 kernels"),
    Plant("merge-without-max", "sglang_decode", SGLANG, "            n_e_max = tl.maximum(tlogic, e_max)\n",
          "            n_e_max = tl.maximum(tlogic, e_max) * 0.0\n", 1,
          "the stage-2 merge without the running max"),
    Plant("sink-dropped", "sglang_decode", SGLANG, "        e_sum += tl.exp(cur_sink - e_max)\n",
          "        e_sum += 0.0 * tl.exp(cur_sink - e_max)\n", 1, "the sink left out of the denominator"),
    Plant("softcap-before-scale", "sglang_decode", SGLANG,
          "            qk *= sm_scale_withk\n\n            if logit_cap > 0:\n"
          "                qk = logit_cap * tanh(qk / logit_cap)\n",
          "            if logit_cap > 0:\n                qk = logit_cap * tanh(qk / logit_cap)\n"
          "            qk *= sm_scale_withk\n\n", 2, "the soft-cap applied before the scale by both stage-1 kernels"),
)


class PlantError(ValueError):
    pass


def apply(plant: Plant, site: pathlib.Path) -> None:
    """Change `plant.path` under `site` in place. Raises PlantError, naming the plant and the
    file, when the text does not occur exactly `plant.count` times."""
    f = site / plant.path
    if not f.is_file():
        raise PlantError(f"{plant.name}: {plant.path} is not in {site}")
    text = f.read_text()
    found = text.count(plant.old)
    if found != plant.count:
        raise PlantError(f"{plant.name}: expected the planted line {plant.count} time(s) in {plant.path}, "
                         f"found it {found} time(s) (another release?)")
    f.write_text(text.replace(plant.old, plant.new))


def failures(rows: list[dict]) -> set[tuple[str, str]]:
    """(test, case id) of every failed row of a run's conformance report (`--conformance-report`)."""
    return {(r["test"].split("::")[-1], r["case"]) for r in rows if r["status"] == "failed"}


def by_distribution(new: set, data_of: dict) -> collections.Counter:
    """New failures counted by the parity case's input distribution; failures of the other
    scenarios (determinism, batch invariance, ...) under "other scenarios"."""
    counts = collections.Counter()
    for test, case in new:
        counts[data_of.get(case, "?") if test == "test_parity" else "other scenarios"] += 1
    return counts


def run_parity(adapter: str, site: pathlib.Path, workers: str) -> tuple[str, list[dict]]:
    """The parity suite on `adapter` with `site` first on the path: (pytest's output, the rows of
    its conformance report)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    with tempfile.TemporaryDirectory() as tmp:
        report = pathlib.Path(tmp) / "report.json"
        run = subprocess.run([sys.executable, "-m", "pytest", "suites/parity", "-p", "no:cacheprovider", "-q",
                              "-n", workers, f"--kernel={REGISTRY}{adapter}", f"--conformance-report={report}"],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        if not report.exists():
            raise SystemExit(f"the parity run on {adapter} wrote no report (exit {run.returncode}):\n"
                             f"{(run.stdout + run.stderr)[-3000:]}")
        return run.stdout + run.stderr, json.loads(report.read_text())["results"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=pathlib.Path, required=True,
                    help="the kernel folder peer_carry.py builds (its site/)")
    ap.add_argument("--plant", action="append", choices=[p.name for p in PLANTS], help="default: every plant")
    ap.add_argument("--out", type=pathlib.Path, help="folder for plants.json and each run's pytest output")
    ap.add_argument("-n", dest="workers", default="2", help="pytest-xdist workers")
    a = ap.parse_args(argv)
    plants = [p for p in PLANTS if not a.plant or p.name in a.plant]
    sys.path.insert(0, str(ROOT))
    from decode_conformance import _paths
    _paths.alias_checkout()
    from decode_conformance.case_sets import build_set
    from decode_conformance.hardware import has_gpu
    data_of = {c.id: c.data for c in build_set("parity", "gpu" if has_gpu() else "interpreter")}
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    baseline, rows, bad = {}, [], 0
    for plant in plants:
        if plant.adapter not in baseline:
            out, results = run_parity(plant.adapter, a.site, a.workers)
            baseline[plant.adapter] = failures(results)
            if a.out:
                (a.out / f"unplanted-{plant.adapter}.log").write_text(out)
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / "site"
            shutil.copytree(a.site, copy)
            try:
                apply(plant, copy)
            except PlantError as e:
                print(e, file=sys.stderr)
                bad += 1
                continue
            out, results = run_parity(plant.adapter, copy, a.workers)
        if a.out:
            (a.out / f"{plant.name}.log").write_text(out)
        new = failures(results) - baseline[plant.adapter]
        bad += not new
        rows.append({"plant": plant.name, "adapter": plant.adapter, "models": plant.models,
                     "unplanted_failures": len(baseline[plant.adapter]), "new_failures": len(new),
                     "by_distribution": dict(by_distribution(new, data_of).most_common())})
        print(f"{plant.name}: {len(new)} new failures", flush=True)
    print("\n| plant | adapter | new failures | by distribution (parity) |\n|---|---|---|---|")
    for r in rows:
        dist = ", ".join(f"`{k}` {v}" for k, v in r["by_distribution"].items())
        print(f"| {r['models']} | `{r['adapter']}` | {r['new_failures']} | {dist} |")
    if a.out:
        (a.out / "plants.json").write_text(json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

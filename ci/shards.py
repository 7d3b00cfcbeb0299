#!/usr/bin/env python3
"""The GPU CI shard table (ci/shards.toml) as pytest commands and GitHub job matrices, for
.github/workflows/gpu.yml.

    python ci/shards.py list --gpu-class sm_90 --trigger per-commit [--group 1 --splits 2]
        print the pytest commands one runner of the class runs (--runner perf: the perf job's)
    python ci/shards.py run --gpu-class sm_90 --trigger per-commit [...] [--summary FILE]
        run them all (each even when an earlier one failed), append each conformance report
        to FILE ($GITHUB_STEP_SUMMARY) with a table of exit codes and times; exit 1 if any failed
    python ci/shards.py matrix --trigger per-commit
        the job matrices for the runners an organisation attached, read from the repository
        variables DECODE_CONFORMANCE_RUNNERS (JSON object: class -> number of runners, e.g.
        {"sm_90": 2, "gfx942": 1}) and DECODE_CONFORMANCE_PERF_RUNNERS (JSON list of classes
        with a dedicated perf runner), as GitHub output lines nvidia=, amd=, perf=

Every shard writes reports/<class>-<shard>[-g<group>of<splits>] (.json and .md, the conformance
report) and the same name .xml (JUnit). With N runners for a class, shards marked `split` are
cut into N groups balanced on ci/durations/<class>.json (pytest-split; without that file it
splits by test count and says so); the other shards run in group 1 only.
Standard library only: runs before anything is installed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARDS_FILE = ROOT / "ci" / "shards.toml"
CLASSES_FILE = ROOT / "fixtures" / "gpu_classes.toml"
DURATIONS_DIR = ROOT / "ci" / "durations"
TRIGGERS = ("per-commit", "nightly")
RUNNERS = ("gpu", "perf")
SHARD_KEYS = {"suite", "case_set", "xdist", "split", "runner", "args"}
RUNNERS_VAR = "DECODE_CONFORMANCE_RUNNERS"
PERF_RUNNERS_VAR = "DECODE_CONFORMANCE_PERF_RUNNERS"
SUMMARY_LIMIT = 256 * 1024  # per report: GitHub keeps at most 1 MiB of summary per step


def gpu_classes(path: pathlib.Path = CLASSES_FILE) -> dict:
    """GPU rows of the class table (the cpu row has no GPU jobs)."""
    with open(path, "rb") as f:
        return {k: v for k, v in tomllib.load(f).items() if v.get("vendor") != "cpu"}


def load(path: pathlib.Path = SHARDS_FILE) -> dict:
    """Parse and validate the table; errors name the file and the field."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    unknown = set(data) - {"shard", "class"}
    if unknown:
        raise ValueError(f"{path}: unknown top-level tables {sorted(unknown)}; expected [shard.*] and [class.*]")
    shards, classes = data.get("shard", {}), data.get("class", {})
    for name, s in shards.items():
        extra = set(s) - SHARD_KEYS
        if extra:
            raise ValueError(f"{path}: shard {name!r}: unknown fields {sorted(extra)}")
        if not isinstance(s.get("suite"), str):
            raise ValueError(f"{path}: shard {name!r}: field 'suite' must be a path")
        for flag in ("xdist", "split"):
            if not isinstance(s.get(flag), bool):
                raise ValueError(f"{path}: shard {name!r}: field {flag!r} must be true or false")
        if "case_set" in s and s["case_set"] not in ("smoke", "parity", "full"):
            raise ValueError(f"{path}: shard {name!r}: field 'case_set' must be smoke, parity or full")
        if s.get("runner", "gpu") not in RUNNERS:
            raise ValueError(f"{path}: shard {name!r}: field 'runner' must be one of {RUNNERS}")
        if s.get("runner") == "perf" and (s["xdist"] or s["split"]):
            raise ValueError(f"{path}: shard {name!r}: a perf shard times alone: 'xdist' and 'split' must be false")
        if not isinstance(s.get("args", []), list):
            raise ValueError(f"{path}: shard {name!r}: field 'args' must be a list of strings")
    known = gpu_classes()
    if "default" not in classes:
        raise ValueError(f"{path}: missing [class.default]")
    for cls, row in classes.items():
        if cls != "default" and cls not in known:
            raise ValueError(f"{path}: class {cls!r} is not a GPU row of {CLASSES_FILE.name}")
        for trig, names in row.items():
            if trig not in TRIGGERS:
                raise ValueError(f"{path}: class {cls!r}: field {trig!r} must be one of {TRIGGERS}")
            for n in names:
                if n not in shards:
                    raise ValueError(f"{path}: class {cls!r}: field {trig!r}: no shard named {n!r}")
    return data


@dataclasses.dataclass
class Command:
    shard: str
    suite: str
    report: str  # base path: .json/.md conformance report, .xml JUnit
    argv: list


def shard_names(gpu_class: str, trigger: str, runner: str = "gpu", data: dict | None = None) -> list[str]:
    data = data or load()
    row = data["class"].get(gpu_class, data["class"]["default"])
    return [n for n in row.get(trigger, []) if data["shard"][n].get("runner", "gpu") == runner]


def commands(gpu_class: str, trigger: str, runner: str = "gpu", group: int = 1, splits: int = 1,
             data: dict | None = None, python: str = "python",
             durations_dir: pathlib.Path = DURATIONS_DIR) -> list[Command]:
    """The pytest commands of one runner: group `group` of `splits` for class and trigger."""
    if not 1 <= group <= splits:
        raise ValueError(f"group {group} of {splits}: expected 1 <= group <= splits")
    data = data or load()
    out = []
    for name in shard_names(gpu_class, trigger, runner, data):
        s = data["shard"][name]
        cut = s["split"] and splits > 1
        if not cut and group > 1:
            continue  # an unsplit shard runs once, in group 1
        report = f"reports/{gpu_class}-{name}" + (f"-g{group}of{splits}" if cut else "")
        argv = [python, "-m", "pytest", s["suite"]]
        if s["xdist"]:
            argv += ["-n", "auto"]
        if "case_set" in s:
            argv.append(f"--case-set={s['case_set']}")
        argv += list(s.get("args", []))
        if cut:
            argv += [f"--splits={splits}", f"--group={group}", "--splitting-algorithm=least_duration"]
            durations = durations_dir / f"{gpu_class}.json"
            if durations.exists():
                argv.append(f"--durations-path={durations.relative_to(ROOT) if durations.is_relative_to(ROOT) else durations}")
        argv += [f"--conformance-report={report}", f"--junitxml={report}.xml", "-p", "no:cacheprovider"]
        out.append(Command(name, s["suite"], report, argv))
    return out


def _json_var(name: str, default, kind: type):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"repository variable {name}: not JSON ({e}): {raw!r}") from e
    if not isinstance(value, kind):
        raise ValueError(f"repository variable {name}: expected a JSON {kind.__name__}, got {raw!r}")
    return value


def matrix(trigger: str, data: dict | None = None) -> dict:
    """{'nvidia': [...], 'amd': [...], 'perf': [...]}: matrix include lists for the runners
    declared in the repository variables (empty lists when none are)."""
    data = data or load()
    classes = gpu_classes()
    runners = _json_var(RUNNERS_VAR, {}, dict)
    perf = _json_var(PERF_RUNNERS_VAR, [], list)
    out = {"nvidia": [], "amd": [], "perf": []}
    for cls, n in runners.items():
        if cls not in classes:
            raise ValueError(f"repository variable {RUNNERS_VAR}: {cls!r} is not a GPU class "
                             f"(rows of fixtures/{CLASSES_FILE.name}: {sorted(classes)})")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"repository variable {RUNNERS_VAR}: {cls!r}: expected a number of runners >= 1, got {n!r}")
        if not shard_names(cls, trigger, "gpu", data):
            continue
        out[classes[cls]["vendor"]] += [{"gpu_class": cls, "group": g, "splits": n} for g in range(1, n + 1)]
    for cls in perf:
        if cls not in classes:
            raise ValueError(f"repository variable {PERF_RUNNERS_VAR}: {cls!r} is not a GPU class")
        if classes[cls]["vendor"] != "nvidia":
            raise ValueError(f"repository variable {PERF_RUNNERS_VAR}: {cls!r}: the perf job runs on NVIDIA "
                             "runners only (no AMD baseline exists yet)")
        if not any(shard_names(cls, t, "perf", data) for t in TRIGGERS):
            raise ValueError(f"repository variable {PERF_RUNNERS_VAR}: {cls!r} has a perf runner but "
                             f"{SHARDS_FILE.name} gives it no perf shard")
        if shard_names(cls, trigger, "perf", data):
            out["perf"].append({"gpu_class": cls})
    return out


def _append_summary(summary: str, text: str) -> None:
    if len(text) > SUMMARY_LIMIT:
        text = text[:SUMMARY_LIMIT] + "\n\n*(truncated: the whole report is in the job's artifact)*\n"
    with open(summary, "a") as f:
        f.write(text.rstrip("\n") + "\n\n")


def run(cmds: list[Command], summary: str | None) -> int:
    results = []
    for c in cmds:
        if not (ROOT / c.suite).exists():
            results.append((c.shard, "missing", 0.0))
            print(f"shard {c.shard}: {c.suite} does not exist in this checkout", flush=True)
            continue
        print(f"::group::shard {c.shard}: {shlex.join(c.argv)}", flush=True)
        t0 = time.time()
        rc = subprocess.call(c.argv, cwd=ROOT)
        print("::endgroup::", flush=True)
        results.append((c.shard, rc, time.time() - t0))
        md = ROOT / f"{c.report}.md"
        if summary:
            _append_summary(summary, md.read_text() if md.exists() else f"### shard {c.shard}: no report (exit {rc})")
    # 5 = pytest collected nothing: a wrong path or an empty split group, never a pass
    failed = [f"{name} (exit {rc})" for name, rc, _ in results if rc != 0]
    if summary:
        rows = "\n".join(f"| {name} | {rc} | {sec:.0f} |" for name, rc, sec in results)
        _append_summary(summary, f"| shard | exit | seconds |\n|---|---|---|\n{rows}")
    if failed:
        print("failed shards: " + ", ".join(failed))
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("list", "run", "matrix"))
    ap.add_argument("--gpu-class")
    ap.add_argument("--trigger", choices=TRIGGERS, required=True)
    ap.add_argument("--runner", choices=RUNNERS, default="gpu")
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--splits", type=int, default=1)
    ap.add_argument("--summary", default=None, help="append each shard's Markdown report here")
    ap.add_argument("--python", default=sys.executable or "python")
    a = ap.parse_args(argv)
    try:
        if a.action == "matrix":
            for k, v in matrix(a.trigger).items():
                print(f"{k}={json.dumps(v, separators=(',', ':'))}")
            return 0
        if not a.gpu_class:
            ap.error(f"{a.action} needs --gpu-class")
        cmds = commands(a.gpu_class, a.trigger, a.runner, a.group, a.splits,
                        python=a.python if a.action == "run" else "python")
    except ValueError as e:
        print(f"ci/shards.py: {e}", file=sys.stderr)
        return 2
    if a.action == "list":
        for c in cmds:
            print(shlex.join(c.argv))
        return 0
    if not cmds:
        print(f"no shards for {a.gpu_class} / {a.trigger} / {a.runner} runner, group {a.group} of {a.splits}")
        return 1
    return run(cmds, a.summary)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The CI shard table (ci/shards.toml) as pytest commands, for the workflows in ci/github/.

    python ci/shards.py list --gpu-class sm_90 --trigger per-commit
        print one pytest command per shard
    python ci/shards.py run --gpu-class sm_90 --trigger per-commit [--summary FILE]
        run them all (each even when an earlier one failed), append each Markdown report to
        FILE ($GITHUB_STEP_SUMMARY in GitHub Actions), exit 1 if any failed

Reports go to reports/<class> for the first shard (the per-commit parity run:
`pytest suites/parity -n auto --conformance-report=reports/<class>`) and
reports/<class>-<shard> for the others. Standard library only: runs before anything is installed.
"""
from __future__ import annotations

import argparse
import pathlib
import shlex
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARDS_FILE = ROOT / "ci" / "shards.toml"
CLASSES_FILE = ROOT / "fixtures" / "gpu_classes.toml"
TRIGGERS = ("per-commit", "nightly")
SHARD_KEYS = {"suite", "case_set", "xdist", "args"}


def load(path: pathlib.Path = SHARDS_FILE) -> dict:
    """Parse and validate the table; errors name the table and the field."""
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
        if not isinstance(s.get("xdist"), bool):
            raise ValueError(f"{path}: shard {name!r}: field 'xdist' must be true or false")
        if "case_set" in s and s["case_set"] not in ("smoke", "parity", "full"):
            raise ValueError(f"{path}: shard {name!r}: field 'case_set' must be smoke, parity or full")
        if not isinstance(s.get("args", []), list):
            raise ValueError(f"{path}: shard {name!r}: field 'args' must be a list of strings")
    with open(CLASSES_FILE, "rb") as f:
        known = set(tomllib.load(f))
    if "default" not in classes:
        raise ValueError(f"{path}: missing [class.default]")
    for cls, row in classes.items():
        if cls != "default" and cls not in known:
            raise ValueError(f"{path}: class {cls!r} is not a row of {CLASSES_FILE.name}")
        for trig, names in row.items():
            if trig not in TRIGGERS:
                raise ValueError(f"{path}: class {cls!r}: field {trig!r} must be one of {TRIGGERS}")
            for n in names:
                if n not in shards:
                    raise ValueError(f"{path}: class {cls!r}: field {trig!r}: no shard named {n!r}")
    return data


def commands(gpu_class: str, trigger: str, data: dict | None = None, python: str = "python") -> list[tuple]:
    """[(shard name, suite, report base, argv)] for one class and trigger."""
    data = data or load()
    row = data["class"].get(gpu_class, data["class"]["default"])
    out = []
    for i, name in enumerate(row.get(trigger, [])):
        s = data["shard"][name]
        report = f"reports/{gpu_class}" if i == 0 else f"reports/{gpu_class}-{name}"
        argv = [python, "-m", "pytest", s["suite"]]
        if s["xdist"]:
            argv += ["-n", "auto"]
        if "case_set" in s:
            argv.append(f"--case-set={s['case_set']}")
        argv += list(s.get("args", []))
        argv.append(f"--conformance-report={report}")
        out.append((name, s["suite"], report, argv))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("list", "run"))
    ap.add_argument("--gpu-class", required=True)
    ap.add_argument("--trigger", choices=TRIGGERS, required=True)
    ap.add_argument("--summary", default=None, help="append each shard's Markdown report here")
    ap.add_argument("--python", default=sys.executable if sys.executable else "python")
    a = ap.parse_args(argv)
    cmds = commands(a.gpu_class, a.trigger, python=a.python if a.action == "run" else "python")
    if a.action == "list":
        for _, _, _, cmd in cmds:
            print(shlex.join(cmd))
        return 0
    failed = []
    for name, suite, report, cmd in cmds:
        if not (ROOT / suite).exists():
            print(f"shard {name}: {suite} does not exist in this checkout; skipped", flush=True)
            continue
        print(f"::group::shard {name}: {shlex.join(cmd)}", flush=True)
        rc = subprocess.call(cmd, cwd=ROOT)
        print("::endgroup::", flush=True)
        # 0 all passed, 5 nothing collected (a suite with no tests for this class): not failures
        if rc not in (0, 5):
            failed.append(f"{name} (exit {rc})")
        md = ROOT / f"{report}.md"
        if a.summary:
            with open(a.summary, "a") as f:
                f.write(md.read_text() if md.exists() else f"### shard {name}: no report (exit {rc})\n")
                f.write("\n")
    if failed:
        print("failed shards: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

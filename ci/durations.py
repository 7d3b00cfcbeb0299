#!/usr/bin/env python3
"""Recorded test durations for duration-balanced GPU shards, from the JUnit XML every CI job
already uploads.

    python ci/durations.py merge --gpu-class sm_90 artifacts/**/*.xml
        add the test times of those JUnit files to ci/durations/sm_90.json (pytest-split's
        format: pytest node id -> seconds; newer files win, tests not in them are kept)

The GPU jobs read ci/durations/<class>.json when a class has several runners (ci/shards.py).
To refresh it: download a run's artifacts (`gh run download RUN -p 'gpu-sm_90-*' -D art`),
merge, commit. JUnit names a test by dotted module path + class and name; the node id is
rebuilt by finding that module in this checkout.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
DURATIONS_DIR = ROOT / "ci" / "durations"


def node_id(classname: str, name: str, root: pathlib.Path = ROOT) -> str | None:
    """pytest node id of a JUnit testcase: the longest dotted prefix of `classname` that is a
    module file under `root`, then any test classes, then the test name. None if no file matches."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[i:], name])
    return None


def from_junit(paths, root: pathlib.Path = ROOT) -> tuple[dict, list]:
    """({node id: seconds}, [testcases whose module was not found]) over JUnit files; a test in
    several files (a rerun) keeps the last time read."""
    times, unmatched = {}, []
    for p in paths:
        try:
            tree = ET.parse(p)
        except ET.ParseError as e:
            raise ValueError(f"{p}: not JUnit XML ({e})") from e
        for case in tree.iter("testcase"):
            if case.find("skipped") is not None:
                continue  # a skip's time says nothing about a run
            nid = node_id(case.get("classname", ""), case.get("name", ""), root)
            if nid is None:
                unmatched.append(f"{p}: {case.get('classname')}::{case.get('name')}")
                continue
            times[nid] = round(float(case.get("time", 0.0)), 3)
    return times, unmatched


def merge(gpu_class: str, paths, out_dir: pathlib.Path = DURATIONS_DIR, root: pathlib.Path = ROOT) -> pathlib.Path:
    times, unmatched = from_junit(paths, root)
    if not times:
        raise ValueError(f"no timed testcases in {len(list(paths))} file(s)" +
                         (f"; {len(unmatched)} named modules not in this checkout" if unmatched else ""))
    out = out_dir / f"{gpu_class}.json"
    old = json.loads(out.read_text()) if out.exists() else {}
    old.update(times)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
    for u in unmatched[:20]:
        print(f"not in this checkout (skipped): {u}", file=sys.stderr)
    print(f"{out}: {len(times)} tests updated, {len(old)} in all")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    m = sub.add_parser("merge")
    m.add_argument("--gpu-class", required=True)
    m.add_argument("junit", nargs="+")
    a = ap.parse_args(argv)
    try:
        merge(a.gpu_class, a.junit)
    except ValueError as e:
        print(f"ci/durations.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""An adopter's own cases, kept in the adopter's repository and run beside the shipped ones.

`--extra-cases=PATH` (repeatable; `$DECODE_CONFORMANCE_EXTRA_CASES`, paths separated by
`os.pathsep`) names JSON Lines files: one case per line, as a fuzz find prints it (the JSON of
its "reproduce this case" line, `Case.to_dict`); blank lines and lines starting with `#` (a
note on why the case is there) are skipped. Every case joins whichever case set the run uses
(smoke, parity, full or a trace), so each scenario that runs the set runs them.

Why a file and not the fuzz example database: a run that passes a database entry deletes it
(hypothesis: the database is a cache of what to try first, not a pin), and entries are keyed by
the kernel's name, so a fixed bug that comes back, or a renamed kernel, replays nothing. A line
in a file fails on the bug every time, whatever the kernel is called, and shows in review.
"""
from __future__ import annotations

import json
import os
import pathlib

ENV_VAR = "DECODE_CONFORMANCE_EXTRA_CASES"


class ExtraCasesError(ValueError):
    """A cases file that cannot be read, or a line that is not a case: names file:line."""


def paths_from(option: list[str]) -> list[str]:
    """The files named by --extra-cases, else by the environment variable."""
    if option:
        return list(option)
    return [p for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p.strip()]


def cases_of(case_set: str, profile: str, paths: list[str]) -> list:
    """The case set, then the cases of `paths` not already in it (none in fuzz mode, which draws
    its cases). ValueError for an unknown set, ExtraCasesError for a bad file."""
    from .case_sets import build_set
    cases = build_set(case_set, profile)
    if paths and case_set != "fuzz":
        have = {c.id for c in cases}
        cases = cases + [c for c in load(paths) if c.id not in have]
    return cases


def load(paths: list[str]) -> list:
    """The cases of every file, in order, each id once."""
    from .cases import Case
    out, seen = [], set()
    for path in paths:
        p = pathlib.Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ExtraCasesError(f"{path}: cannot read it ({e.strerror or e}); expected a JSON Lines file of cases, "
                                  "one per line as a fuzz find prints it") from None
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise ValueError(f"a JSON {type(d).__name__}")
                case = Case.from_dict(d)
            except (ValueError, TypeError) as e:
                raise ExtraCasesError(f"{path}:{n}: expected one case as a JSON object (the --case JSON of a fuzz "
                                      f"find's 'reproduce this case' line), got {line[:80]!r}: {e}") from None
            if case.id not in seen:
                seen.add(case.id)
                out.append(case)
    return out

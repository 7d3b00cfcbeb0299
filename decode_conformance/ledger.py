"""The known-failure ledger: adopter-owned data saying which (kernel, case) pairs are
expected to fail on which GPU classes, in the spirit of array-api-tests' xfails files. The
format is below; how entries match every scenario's case ids: docs/ledger.md in the project's
repository.

    [[entry]]
    kernel = "my_kernel"            # kernel name, or "*"
    case = "fi4267-*"               # pattern over case ids of every scenario (`*`, `?` the
                                    # only wildcards: `[` is literal, as in `B2[257,17]`); the
                                    # non-parity ones begin with the scenario's name
                                    # ("batch-invariance-*", "determinism-*")
    gpu_classes = ["sm_90"]         # optional; default: every class
    kind = "xfail"                  # xfail: runs and must fail (an unexpected pass fails the run)
                                    # quarantine: never launched (cases that crash the device)
    reason = "merge of empty splits gives NaN"
    issue = "https://github.com/org/repo/issues/123"   # required
"""
from __future__ import annotations

import functools
import os
import pathlib
import re
import tomllib
from dataclasses import dataclass, field
from typing import Iterable, Optional

ENV_VAR = "DECODE_CONFORMANCE_LEDGER"
DEFAULT_FILE = "known_failures.toml"  # in the shipped data (decode_conformance.fixtures): our kernels' ledger
KINDS = ("xfail", "quarantine")


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern:
    # Not fnmatch: its `[...]` is a character class, and every case id holds one literally
    # (`B2[257,17]`), so an id pasted from a failure into `case` would match no case, itself included.
    return re.compile("".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern))


def glob_match(text: str, pattern: str) -> bool:
    """`pattern`, with `*` and `?` its only wildcards, matches the whole of `text`."""
    return _compiled(pattern).fullmatch(text) is not None


class LedgerError(ValueError):
    """A ledger that cannot be read or breaks a rule: names the file, line and field."""


@dataclass
class Entry:
    kernel: str
    case: str
    kind: str
    reason: str
    issue: str
    gpu_classes: Optional[tuple[str, ...]] = None
    source: str = ""
    hits: int = field(default=0, compare=False)

    def matches(self, kernel: str, case_id: str, gpu_class: str) -> bool:
        if self.gpu_classes is not None and gpu_class not in self.gpu_classes:
            return False
        return glob_match(kernel, self.kernel) and glob_match(case_id, self.case)

    def names_any(self, kernels: Iterable[str]) -> bool:
        """Whether the entry's kernel pattern names one of `kernels` (it is about that run)."""
        return any(glob_match(k, self.kernel) for k in kernels)

    def mark(self):
        import pytest
        text = f"{self.reason} ({self.issue}; {self.source})"  # the entry's file and line: which one to edit
        if self.kind == "quarantine":
            return pytest.mark.skip(reason=f"quarantined, never launched: {text}")
        return pytest.mark.xfail(strict=True, reason=f"known failure: {text}")

    def describe(self) -> str:
        where = f" on {','.join(self.gpu_classes)}" if self.gpu_classes else ""
        return f"{self.kind} kernel={self.kernel!r} case={self.case!r}{where} ({self.source})"


def _entry_lines(text: str) -> list[int]:
    """1-based line of each `[[entry]]` header, so an error can point at the row."""
    return [n for n, line in enumerate(text.splitlines(), 1) if line.strip().startswith("[[entry]]")]


def _parse(path: str, data: dict, text: str = "") -> list[Entry]:
    unknown_top = set(data) - {"entry"}
    if unknown_top:
        raise LedgerError(f"{path}: unknown top-level keys {sorted(unknown_top)}; expected [[entry]] tables")
    lines = _entry_lines(text)
    entries = []
    for i, row in enumerate(data.get("entry", [])):
        where = f"{path}: entry {i}" + (f" (line {lines[i]})" if i < len(lines) else "")
        for key in ("kernel", "case", "kind", "reason", "issue"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise LedgerError(f"{where}: field {key!r} must be a non-empty string")
        if row["kind"] not in KINDS:
            raise LedgerError(f"{where}: field 'kind' must be one of {KINDS}, got {row['kind']!r}")
        if not row["issue"].startswith(("http://", "https://")):
            raise LedgerError(f"{where}: field 'issue' must be an issue URL, got {row['issue']!r}")
        extra = set(row) - {"kernel", "case", "kind", "reason", "issue", "gpu_classes"}
        if extra:
            raise LedgerError(f"{where}: unknown fields {sorted(extra)}")
        classes = row.get("gpu_classes")
        if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
            raise LedgerError(f"{where}: field 'gpu_classes' must be a list of class names")
        entries.append(Entry(kernel=row["kernel"], case=row["case"], kind=row["kind"], reason=row["reason"],
                             issue=row["issue"], gpu_classes=tuple(classes) if classes else None,
                             source=f"{path}:{lines[i]}" if i < len(lines) else f"{path}: entry {i}"))
    return entries


@dataclass
class Ledger:
    entries: list[Entry]

    @classmethod
    def load(cls, paths: Iterable[str]) -> "Ledger":
        entries = []
        for p in paths:
            try:
                text = pathlib.Path(p).read_text()
            except OSError as e:
                raise LedgerError(f"{p}: cannot read the ledger: {e.strerror or e}") from None
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise LedgerError(f"{p}: not valid TOML: {e}") from None
            entries += _parse(str(p), data, text)
        return cls(entries)

    def match(self, kernel: str, case_id: str, gpu_class: str) -> Optional[Entry]:
        for e in self.entries:
            if e.matches(kernel, case_id, gpu_class):
                e.hits += 1
                return e
        return None

    def unused(self, pairs: Iterable[tuple[str, str]], gpu_class: str) -> list[Entry]:
        """Entries about this run (their kernel pattern names a kernel of `pairs`, their GPU classes
        include `gpu_class`) that match none of the (kernel, case id) pairs it could collect: a
        stale or mistyped entry. An entry about another kernel or class is not this run's to
        judge: one ledger serves an adopter's every kernel and runner (sharded per kernel and
        per class), and the shipped one names this package's kernels."""
        pairs = list(pairs)
        kernels = {k for k, _ in pairs}
        return [e for e in self.entries
                if e.names_any(kernels)
                and (e.gpu_classes is None or gpu_class in e.gpu_classes)
                and not any(e.matches(k, c, gpu_class) for k, c in pairs)]

    def elsewhere(self, kernels: Iterable[str]) -> list[Entry]:
        """Entries whose kernel pattern names none of `kernels`: not checked by a run of those
        (a renamed kernel's entries are among them)."""
        kernels = list(kernels)
        return [e for e in self.entries if not e.names_any(kernels)]

    def check_classes(self, known: Iterable[str]) -> None:
        """A class no run can have (a typo: "sm90") would leave its entry silently unused."""
        known = sorted(known)
        for e in self.entries:
            bad = [c for c in e.gpu_classes or () if c not in known]
            if bad:
                raise LedgerError(f"{e.source}: field 'gpu_classes': unknown class {', '.join(map(repr, bad))}; "
                                  f"expected names from {', '.join(known)}")


def default_ledger_paths() -> list[str]:
    """$DECODE_CONFORMANCE_LEDGER (os.pathsep-separated), else the shipped kernels' ledger."""
    env = os.environ.get(ENV_VAR, "")
    if env.strip():
        return [p for p in env.split(os.pathsep) if p]
    from .resources import data_path
    p = data_path(DEFAULT_FILE)
    return [str(p)] if p.exists() else []

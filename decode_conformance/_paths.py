"""A checkout that is not pip-installed still imports like an installed package.

The wheel maps three checkout folders onto package names (pyproject.toml,
[tool.setuptools.package-dir]): `kernels/` -> `decode_conformance_kernels`, `fixtures/` ->
`decode_conformance.fixtures` (data, read through importlib.resources) and `suites/` ->
`decode_conformance.suites`. Where the package is not installed (a GPU runner with no
network, say) the repository-root conftest.py and every process the suite starts on its
own (the isolation worker) call `alias_checkout` so the same names resolve to the folders.
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from typing import Optional

KERNELS_PACKAGE = "decode_conformance_kernels"
ALIASES = {KERNELS_PACKAGE: "kernels", "decode_conformance.fixtures": "fixtures",
           "decode_conformance.suites": "suites"}


def checkout_root() -> Optional[pathlib.Path]:
    """The checkout this package was imported from, or None when it is installed elsewhere."""
    here = pathlib.Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() and (here / "kernels").is_dir() else None


def alias_checkout(root: Optional[pathlib.Path] = None) -> None:
    """Make each alias importable from `root` unless it already is. Idempotent."""
    root = pathlib.Path(root).resolve() if root else checkout_root()
    if root is None:
        return
    for name, folder in ALIASES.items():
        init = root / folder / "__init__.py"
        if name in sys.modules or not init.exists():
            continue
        try:
            if importlib.util.find_spec(name) is not None:
                continue
        except ModuleNotFoundError:
            pass
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(root / folder)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)

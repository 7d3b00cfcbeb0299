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
SUITES_PACKAGE = "decode_conformance.suites"
ALIASES = {KERNELS_PACKAGE: "kernels", "decode_conformance.fixtures": "fixtures", SUITES_PACKAGE: "suites"}


def checkout_root() -> Optional[pathlib.Path]:
    """The checkout this package was imported from, or None when it is installed elsewhere."""
    here = pathlib.Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").exists() and (here / "kernels").is_dir() else None


def suite_test(test: str) -> tuple[str, bool]:
    """How a reproduce line printed outside pytest (the trace and fuzz commands) names the suite
    test `test` ("parity/test_fuzz.py::test_fuzz"), and whether the line needs --pyargs: the
    checkout's file when this package runs from a checkout (relative to the current folder when
    inside it), else the installed module - an adopter's folder has no suites/."""
    file, _, function = test.partition("::")
    root = checkout_root()
    if root is None:
        return f"{SUITES_PACKAGE}.{file.removesuffix('.py').replace('/', '.')}::{function}", True
    path = root / "suites" / file
    here = pathlib.Path.cwd().resolve()
    return f"{path.relative_to(here) if path.is_relative_to(here) else path}::{function}", False


def alias_checkout(root: Optional[pathlib.Path] = None) -> None:
    """Make each alias importable from `root`. Idempotent.

    Where `root` is the checkout this package itself was imported from, each alias is the
    checkout's folder even when another copy is importable under the same name (an editable
    install of a second checkout, a stale wheel): otherwise a checkout's library would run
    another checkout's kernels against another checkout's data, and say nothing. Elsewhere an
    importable name is left as it is.
    """
    own = checkout_root()
    root = pathlib.Path(root).resolve() if root else own
    if root is None:
        return
    for name, folder in ALIASES.items():
        init = root / folder / "__init__.py"
        if not init.exists():
            continue
        if name in sys.modules:
            where = getattr(sys.modules[name], "__file__", None)
            if root == own and where and not _inside(pathlib.Path(where), root / folder):
                raise ImportError(f"{name} was imported from {pathlib.Path(where).parent} before this checkout's "
                                  f"{folder}/ ({root / folder}) could stand in for it; import "
                                  f"decode_conformance from {root} first")
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            spec = None
        if spec is not None and (root != own or (spec.origin and _inside(pathlib.Path(spec.origin), root / folder))):
            continue
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(root / folder)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)


def _inside(path: pathlib.Path, folder: pathlib.Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())

"""Importing an external kernel library for an adapter: absent (every case skips, saying so)
versus installed but broken (the run stops with the import's traceback)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from typing import Optional


def import_library(name: str) -> tuple[Optional[object], Optional[str]]:
    """(module, None), or (None, 'X is not installed') when the package itself is absent. A
    package that is installed but fails to import (a CUDA/ABI mismatch, a missing symbol) is
    not absent: that raises KernelLoadError with the import's traceback, so the run stops with
    a usage error instead of skipping every case green."""
    from decode_conformance.kernel_api import KernelLoadError
    try:
        return importlib.import_module(name), None
    except ModuleNotFoundError as e:
        top = name.split(".")[0]
        if e.name == top or not _package_present(top):
            return None, f"{top} is not installed"
        if e.name and name.startswith(e.name):  # a submodule this version does not have
            return None, f"{name} does not exist in the installed {top}"
        raise KernelLoadError(f"{name} is installed but failed to import:\n{_traceback(e)}") from e
    except Exception as e:
        raise KernelLoadError(f"{name} is installed but failed to import:\n{_traceback(e)}") from e


def first_module(names, attr: str) -> tuple[Optional[object], Optional[str]]:
    """(attribute, None) from the first of `names` that imports and has `attr`, else (None, the
    first (canonical) location's problem): libraries move their kernels between releases."""
    why = None
    for name in names:
        module, err = import_library(name)
        if module is not None:
            obj = getattr(module, attr, None)
            if obj is not None:
                return obj, None
            err = f"{name} has no {attr}"
        why = why or err
    return None, why


def library_version(top: str) -> Optional[str]:
    """The installed distribution's version (None when unknown): rows of the conformance matrix
    name it."""
    from importlib.metadata import PackageNotFoundError, version
    for dist in (top, top.replace("_", "-"), f"{top}-python"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    mod = sys.modules.get(top)
    return getattr(mod, "__version__", None) if mod else None


def _traceback(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:]).rstrip()


def _package_present(top: str) -> bool:
    if top in sys.modules and sys.modules[top] is None:  # import blocked: as good as absent
        return False
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return True

"""decode-conformance: a numerical-correctness and regression suite for decode attention.

The public names load on first use (PEP 562), so `import decode_conformance.plugin` - which
pytest does for every run once the package is installed - imports neither torch nor Triton.
"""
from __future__ import annotations

import importlib

_PUBLIC = {
    "Case": "cases",
    "DecodeBatch": "batch",
    "Workspace": "batch",
    "Capabilities": "kernel_api",
    "DecodeKernel": "kernel_api",
    "ShapeRule": "kernel_api",
    "open_case": "inspect",
    "run_one": "inspect",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Where the checkout is, and how its `kernels/` folder imports as `decode_conformance_kernels`.

Called by the repository-root conftest.py and by every process the suite starts on its own
(the isolation worker), so a kernel spec like `decode_conformance_kernels.registry:lean`
imports the same way everywhere, with or without `pip install`.
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNELS_PACKAGE = "decode_conformance_kernels"


def alias_kernels(root: Optional[pathlib.Path] = None) -> None:
    """Put the checkout root on sys.path and, unless an installed package already provides
    it, import `<root>/kernels` under the name `decode_conformance_kernels`. Idempotent."""
    root = pathlib.Path(root or ROOT).resolve()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if KERNELS_PACKAGE in sys.modules:
        return
    init = root / "kernels" / "__init__.py"
    if importlib.util.find_spec(KERNELS_PACKAGE) is not None or not init.exists():
        return
    spec = importlib.util.spec_from_file_location(KERNELS_PACKAGE, init,
                                                  submodule_search_locations=[str(root / "kernels")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[KERNELS_PACKAGE] = mod
    spec.loader.exec_module(mod)

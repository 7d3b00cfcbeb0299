"""Fixed cases of the kernel-level checks (graph replay, determinism, batch invariance, split
counts), per profile: interpreter-sized on the CPU, full-sized on a GPU."""
from __future__ import annotations

import pytest

from decode_conformance.cases import Case


def profile_of(device: str) -> str:
    return "interpreter" if device == "cpu" else "gpu"


def require(kernel, case: Case, device: str) -> None:
    """Skip, naming the capability, when the kernel cannot run `case` here."""
    missing = kernel.caps.missing_for(case, "cpu" if device == "cpu" else "cuda")
    if missing:
        pytest.skip(f"{kernel.name} lacks: {', '.join(missing)}")


def fail_unless(ok: bool, kernel, what: str) -> None:
    """Fail with the kernel's name and what went wrong, without pytest's assertion rewriting
    (the report and the terminal show the verdict, not the test's source)."""
    if not ok:
        pytest.fail(f"[{kernel.name}] {what}", pytrace=False)

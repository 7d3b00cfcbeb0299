"""Which kernels a run tests, from the command line, the environment or entry points, and the
spec mistakes visible without importing anything.

No torch and no Triton here: a run's first usage checks use this module before either is
imported (torch alone takes seconds to import).
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from typing import Iterable, Optional

ENV_VAR = "DECODE_CONFORMANCE_KERNELS"
ENTRY_POINT_GROUP = "decode_conformance.kernels"
# Ours among the registered kernels: pyproject.toml registers the shipped kernels in
# ENTRY_POINT_GROUP, the group an adopter's package registers its kernels in. That table is
# the one list of shipped kernels.
SHIPPED_PACKAGE = "decode_conformance_kernels"


def missing_module(spec: str) -> Optional[str]:
    """Why `spec` cannot name a kernel, when that shows without importing it: no ':' or a
    top-level package that is not installed. None when it may well import."""
    if ":" not in spec:
        # A bare name resolves only where it is known without importing anything: an entry point
        # (ours, an adopter package's) or a shipped adapter. A kernel named by its spec is not.
        import difflib
        near = difflib.get_close_matches(spec, list(bare_names(entry_point_specs())), n=3, cutoff=0.6)
        # Entry points are written at install time: one added to ./pyproject.toml since the last
        # `pip install -e .` is declared there yet unknown to `entry_point_specs`.
        try:
            declared = _declared_in(pathlib.Path("pyproject.toml")).get(spec)
        except (OSError, ValueError):  # no ./pyproject.toml, or not ours to judge
            declared = None
        return (f"kernel spec {spec!r}: expected 'package.module:object', or the bare name of a registered "
                "kernel (--list-kernels without --kernel: ours, the adapters, entry points)"
                + (f"; ./pyproject.toml declares {spec} = {declared!r} in [project.entry-points."
                   f"\"{ENTRY_POINT_GROUP}\"], but the installed package does not register it yet: "
                   "reinstall it (pip install -e .)" if declared else "")
                + (f"; did you mean {', '.join(map(repr, near))}?" if near else ""))
    module = spec.split(":", 1)[0]
    top = module.split(".")[0]
    if not top:
        return f"kernel spec {spec!r}: expected an absolute module name before ':'"
    if top in sys.modules:
        return None
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None  # let the import itself report it
    if found is None:
        return (f"kernel spec {spec!r}: cannot import {module}: no module named {top!r} (expected an installed "
                "package, or its folder on PYTHONPATH)")
    return None


def entry_point_specs() -> dict[str, str]:
    """{name: 'module:attr'} of every kernel registered in the `decode_conformance.kernels` group:
    the installed distributions' entry points (ours and any adopter package's). A checkout that
    is not pip-installed has no metadata: there the table comes from its pyproject.toml."""
    from importlib.metadata import entry_points
    eps = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if not any(v.startswith(SHIPPED_PACKAGE + ".") for v in eps.values()):
        eps = {**_checkout_entry_points(), **eps}
    return eps


def _declared_in(pyproject: pathlib.Path) -> dict[str, str]:
    """The kernels a pyproject.toml declares in ENTRY_POINT_GROUP."""
    import tomllib
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return dict(data.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))


def _checkout_entry_points() -> dict[str, str]:
    from ._paths import checkout_root
    root = checkout_root()
    return {} if root is None else _declared_in(root / "pyproject.toml")


# Opt-in configurations of the shipped kernels: in no default run, listed by --list-kernels.
OPT_IN_SPECS = (f"{SHIPPED_PACKAGE}.registry:adaptive_split_graph",)


def shipped_specs() -> list[str]:
    """The kernels this package ships (registered by its own pyproject.toml)."""
    return [v for v in entry_point_specs().values() if v.startswith(SHIPPED_PACKAGE + ".")]


def listed_opt_in_specs() -> list[str]:
    """The shipped registry's kernels in no default run that --list-kernels lists: the opt-in
    configurations and the adapters of other libraries."""
    try:  # the registry's factories import nothing at module level (no torch, no Triton)
        registry = importlib.import_module(f"{SHIPPED_PACKAGE}.registry")
    except ImportError:
        return list(OPT_IN_SPECS)
    return list(OPT_IN_SPECS) + [f"{SHIPPED_PACKAGE}.registry:{a}" for a in getattr(registry, "ADAPTERS", ())]


def bare_names(registered: dict[str, str]) -> dict[str, str]:
    """{bare name: spec} of every kernel a bare name may stand for: the registered ones (entry
    points, e.g. `lean`) and, where no entry point takes the name, `listed_opt_in_specs`
    (`sglang_decode`)."""
    return {**{s.split(":", 1)[1]: s for s in reversed(listed_opt_in_specs())}, **registered}


def bare_name_spec(name: str, registered: dict[str, str]) -> str:
    """The spec a bare kernel name stands for (`bare_names`); else the name itself, which the spec
    checks then reject."""
    return bare_names(registered).get(name, name)


def kernel_specs(cli: Iterable[str] = (), env: Optional[str] = None) -> list[str]:
    """Which kernels to test: command line, then environment variable, then every registered
    kernel (entry points). A registered kernel's name (e.g. `lean`, `sglang_decode`) is accepted
    wherever a spec is (`bare_name_spec`)."""
    specs = [s for s in cli if s]
    if not specs:
        env = os.environ.get(ENV_VAR, "") if env is None else env
        specs = [s.strip() for s in env.replace(";", ",").split(",") if s.strip()]
    eps = entry_point_specs()
    if not specs:
        specs = list(eps.values())
    out = []
    for s in specs:
        s = bare_name_spec(s, eps) if ":" not in s else s
        if s not in out:
            out.append(s)
    return out

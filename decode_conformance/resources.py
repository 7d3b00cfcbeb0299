"""The data files the suites read (`fixtures/` in a checkout), wherever the package lives.

Installed, they ship inside the package as `decode_conformance.fixtures`; in a checkout that
is not pip-installed (a GPU runner without network), `_paths.alias_checkout` maps the same
module name onto the checkout's `fixtures/` folder. Either way they are found through
importlib.resources, never through a path relative to a source file.
"""
from __future__ import annotations

import pathlib
from importlib import resources

PACKAGE = "decode_conformance.fixtures"


def data_path(*parts: str) -> pathlib.Path:
    """A file or folder of the shipped data, as a real path (the package is a plain folder
    on disk in every install form the suite supports: wheels, editable installs, checkouts)."""
    root = resources.files(PACKAGE)
    node = root.joinpath(*parts) if parts else root
    return pathlib.Path(str(node))


def read_text(*parts: str) -> str:
    return data_path(*parts).read_text()


def read_toml(path, default_name: str) -> tuple[pathlib.Path, dict]:
    """(path, parsed TOML) of `path`, or of the shipped `default_name` when path is None; a file
    that cannot be read or parsed is a ValueError naming it."""
    import tomllib
    path = pathlib.Path(path) if path is not None else data_path(default_name)
    try:
        return path, tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None

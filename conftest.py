"""Repository-root conftest: a checkout runs its suites without `pip install` too (a GPU
runner with no network), by aliasing the checkout's folders to the installed package names.
With the package installed (editable or not) the plugin comes from its pytest11 entry point,
registered under the same name, so listing it here does not load it twice."""
import pathlib
import sys

_ROOT = pathlib.Path(__file__).resolve().parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from decode_conformance._paths import alias_checkout  # noqa: E402

alias_checkout(_ROOT)

pytest_plugins = ["decode_conformance.plugin"]

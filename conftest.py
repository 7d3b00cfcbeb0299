"""Repository-root conftest: a checkout runs its suites without `pip install` too (a GPU
runner with no network), by aliasing the checkout's folders to the installed package names.
With the package installed (editable or not) the plugin comes from its pytest11 entry point,
registered under the same name, so listing it here does not load it twice."""
import pathlib
import sys

_ROOT = pathlib.Path(__file__).resolve().parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import pytest  # noqa: E402

from decode_conformance._paths import alias_checkout, checkout_root  # noqa: E402

alias_checkout(_ROOT)

pytest_plugins = ["decode_conformance.plugin"]


def pytest_configure(config):
    # The `pytest` script loads the plugin of whichever copy is installed before this file runs;
    # going on would test that copy's library and kernels under this checkout's name.
    if checkout_root() != _ROOT:
        import decode_conformance
        raise pytest.UsageError(
            f"this checkout is {_ROOT}, but the decode_conformance this pytest imported is "
            f"{pathlib.Path(decode_conformance.__file__).parent}: its suites would run that copy's "
            f"library and kernels. Run `python -m pytest` here, or `python -m pip install -e .` in this checkout")

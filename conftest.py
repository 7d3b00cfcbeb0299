"""Repository-root conftest: lets a checkout run without `pip install -e .` (the GPU runner
has no network), by aliasing the `kernels/` folder to its import name."""
import importlib.util
import pathlib
import sys

_ROOT = pathlib.Path(__file__).resolve().parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from decode_conformance._paths import alias_kernels  # noqa: E402

alias_kernels(_ROOT)

pytest_plugins = ["decode_conformance.plugin"]


def pytest_addhooks(pluginmanager):
    # xdist's hooks exist only where xdist is installed; register the pinning plugin there.
    if pluginmanager.has_plugin("xdist") or importlib.util.find_spec("xdist") is not None:
        from decode_conformance import xdist_pinning
        pluginmanager.register(xdist_pinning, "decode_conformance_xdist_pinning")

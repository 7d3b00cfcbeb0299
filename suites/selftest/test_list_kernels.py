"""`pytest --list-kernels`: every kernel with its capabilities, including kernels that fail to
import or whose library is missing, then exit 0 without running anything."""
from __future__ import annotations

import re

from decode_conformance.kernel_api import load_kernel
from suites.selftest._subpytest import GOOD, faulty, run_pytest

MISSING_MODULE = "no_such_package.kernels:thing"
MISSING_ATTR = "decode_conformance_kernels.registry:no_such_kernel"
UNAVAILABLE = "decode_conformance_kernels.registry:flashinfer_decode"


def test_list_kernels_prints_every_kernel():
    specs = [GOOD, faulty("nan"), MISSING_MODULE, MISSING_ATTR, UNAVAILABLE]
    run = run_pytest("--list-kernels", *[f"--kernel={s}" for s in specs], timeout=120)
    assert run.rc == 4, run.out[-2000:]  # two specs do not load: a usage error, after listing all
    out = run.out
    for name, spec in (("torch_gather", GOOD), ("faulty_nan", faulty("nan")),
                       ("flashinfer_decode", UNAVAILABLE)):
        k = load_kernel(spec)
        # name, spec, then the capability line
        assert re.search(rf"^{re.escape(name)}\s+{re.escape(spec)}\n\s+{re.escape(k.caps.describe())}$", out, re.M), out
    assert re.search(rf"^{re.escape(MISSING_MODULE)}\n\s+NOT LOADED: .*cannot import no_such_package", out, re.M), out
    assert re.search(rf"^{re.escape(MISSING_ATTR)}\n\s+NOT LOADED: .*no attribute 'no_such_kernel'", out, re.M), out
    assert "test session starts" not in out and "collected" not in out  # nothing ran


def test_list_kernels_default_set():
    """Without --kernel: the shipped kernels, whatever state each is in, and exit 0."""
    from decode_conformance.kernel_api import shipped_specs
    run = run_pytest("--list-kernels", timeout=120)
    assert run.rc == 0, run.out[-2000:]
    for spec in shipped_specs():
        assert spec in run.out, f"{spec} not listed"
    # the opt-in configuration README's table names, and every adapter, each under its spec
    from decode_conformance_kernels.registry import ADAPTERS
    for spec in ["decode_conformance_kernels.registry:adaptive_split_graph"] + [
            f"decode_conformance_kernels.registry:{name}" for name in ADAPTERS]:
        assert spec in run.out, f"{spec} not listed"


def test_the_fp8_tier_is_listed_only_for_a_kernel_with_fp8_caches():
    """A kernel of bf16 / fp16 caches only was listed as `fp8 dequant-kv` (the field's default),
    which reads as a claim of fp8 support."""
    from decode_conformance.kernel_api import Capabilities
    assert " fp8 " not in Capabilities(kv_dtypes={"bf16", "fp16"}).describe()
    assert " fp8 dequant-kv " in Capabilities(kv_dtypes={"bf16", "e4m3"}).describe()
    assert " fp8 fp8-q-and-p " in Capabilities(kv_dtypes={"e4m3"}, fp8_math="fp8-q-and-p").describe()

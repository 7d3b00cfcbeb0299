"""Parity: every kernel under test against the float64 reference on every case of the
chosen set. The kernel x case grid, skips and known failures come from the plugin
(decode_conformance/plugin.py); the check from decode_conformance/scenarios.py ("parity")."""
from decode_conformance.plugin import conformance_failure


def test_parity(dc_kernel, dc_case, dc_run):
    result = dc_run(dc_kernel, dc_case)
    if not result.ok:
        conformance_failure(result, dc_case)

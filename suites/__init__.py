"""The pytest suites. Installed as `decode_conformance.suites` (parity, gates, perf); run them
with `pytest --pyargs decode_conformance.suites.parity` from anywhere, or `pytest suites/parity`
in a checkout. `selftest` (the suite testing itself) stays in the checkout."""

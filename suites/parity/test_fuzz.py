"""Fuzz mode (`--case-set=fuzz`): hypothesis draws valid cases across every axis for each
kernel under test, runs each through the same door as parity (isolation, time limit, input
checks, the judge), and on a failure shrinks to a minimal case, printed as a paste-ready
regression record with its reproduce lines (decode_conformance/fuzz.py). Options:
--fuzz-examples, --fuzz-seed, --fuzz-database, --fuzz-shrink-seconds. Skipped (at no cost) in
any other case set."""
import pytest


def test_fuzz(dc_kernel, dc_state, dc_run, request):
    if dc_state.case_set != "fuzz":
        pytest.skip("fuzz mode only: run with --case-set=fuzz")
    missing = dc_kernel.kernel.caps.unavailable
    if missing:
        pytest.skip(f"{dc_kernel.name} lacks: {missing}")
    from decode_conformance.fuzz import fuzz, options_from_config
    suite = dc_state.repro_target(request.node, request.config.invocation_params.dir)
    outcome = fuzz(dc_kernel.kernel, dc_state.device, dc_state.profile, kernel_spec=dc_kernel.spec, suite=suite,
                   pyargs=dc_state.pyargs, run_one=lambda case, repro: dc_run(dc_kernel, case, "parity", False, repro),
                   **options_from_config(request.config))
    if outcome.failed:  # the text once: as the failure, not also as captured output
        pytest.fail(outcome.text(), pytrace=False)
    print(outcome.text())

"""Kernels that declare `deterministic` give bitwise-identical output and LSE when the same
inputs are planned and launched again; graph-safe kernels give them when one plan is launched
twice (state kept in the workspace, such as arrival counters, is back at its start). Both
on CPU too (decode_conformance/scenarios.py, "determinism" and "same-plan-twice")."""
import pytest

from decode_conformance.plugin import conformance_failure


@pytest.mark.dc_scenario("determinism")
def test_bitwise_repeatable(dc_kernel, dc_case, dc_run):
    result = dc_run(dc_kernel, dc_case)
    if not result.ok:
        conformance_failure(result, dc_case)


@pytest.mark.dc_scenario("same-plan-twice")
def test_same_plan_launched_twice(dc_kernel, dc_case, dc_run):
    result = dc_run(dc_kernel, dc_case)
    if not result.ok:
        conformance_failure(result, dc_case)

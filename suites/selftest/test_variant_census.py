"""benchmarks/variant_census.py: the variants and compile seconds left when arguments are not
specialized, on a manifest written by hand (counts and sums worked out below, not by the tool)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import variant_census  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "fixtures" / "compile_ahead" / "sm_90" / "triton-3.6.0.json"


def _entry(n_value, d_value, stride_divisible, seconds, warps=4):
    """A kernel (P, s, n, D): P a bf16 pointer, s a stride (divisible by 16 or not), n an int
    that Triton made a constant when it was 1, D a constexpr head dim."""
    constant_keys, constant_vals = [[3]], [d_value]
    if n_value == 1:
        constant_keys, constant_vals = [[2], [3]], [1, d_value]
    data = {"signature": {"P": "*bf16", "s": "i32", "n": "i32", "D": "constexpr"},
            "constant_keys": constant_keys, "constant_vals": constant_vals,
            "attrs_keys": [[0], [1]] if stride_divisible else [[0]],
            "attrs_vals": [[["tt.divisibility", 16]]] * (2 if stride_divisible else 1),
            "options": {"num_warps": warps}}
    return {"fn": "m:k", "seconds": seconds, "data": json.dumps(data)}


# A: n=1, D=80; B: n=1, D=128; C: n=5, D=128; E: like C, s not divisible; F: like C at 8 warps
MANIFEST = {"entries": [_entry(1, 80, True, 2.0), _entry(1, 128, True, 3.0), _entry(5, 128, True, 5.0),
                        _entry(5, 128, False, 7.0), _entry(5, 128, True, 11.0, warps=8)]}


def test_census_folds_the_variants_that_differ_only_in_the_unspecialized_arguments():
    assert variant_census.census(MANIFEST) == (5, 28.0)
    # D: A folds into B (max 3.0); 3 + 5 + 7 + 11
    assert variant_census.census(MANIFEST, ["D"]) == (4, 26.0)
    # n: B folds into C (max 5.0); 2 + 5 + 7 + 11
    assert variant_census.census(MANIFEST, ["n"]) == (4, 25.0)
    # D and n: A, B, C are one (5.0); E differs in s, F in its launch options
    assert variant_census.census(MANIFEST, ["D", "n"]) == (3, 23.0)
    # s: C and E fold (7.0); 2 + 3 + 7 + 11
    assert variant_census.census(MANIFEST, ["s"]) == (4, 23.0)


def test_varying_arguments_names_those_whose_specialization_differs():
    assert variant_census.varying_arguments(MANIFEST) == {"m:k": {"D", "n", "s"}}


def test_report_rows_are_savings_and_arguments_that_fold_nothing_alone_are_listed():
    only_with_n = {"entries": [_entry(1, 80, True, 2.0), _entry(5, 128, True, 5.0)]}  # D varies only with n
    text = variant_census.report(only_with_n, [["D", "n"]])
    assert text.splitlines()[0] == "2 variants, 7.0 s of compile on the recording host"
    assert "| D+n | (together) | 1 | 5.0 | 2.0 |" in text
    assert text.splitlines()[-1] == "No variant folds when only one of these is not specialized: D, n"


def test_the_shipped_manifest_reads(capsys):
    assert variant_census.main([str(SHIPPED), "--unspecialize", "D_MAIN,DV,D1"]) == 0
    n = len(json.loads(SHIPPED.read_text())["entries"])
    out = capsys.readouterr().out
    assert out.startswith(f"{n} variants, ")
    assert "| D_MAIN+DV+D1 | (together) |" in out

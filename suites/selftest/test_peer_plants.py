"""benchmarks/peer_plants.py, the bugs planted in the peers' real kernels: a plant changes exactly
the lines it names or says why not; failures are read from the run's conformance report and
counted by the case's distribution. Where the peers' kernel files are importable (PYTHONPATH, as
benchmarks/peer_carry.py builds them), every plant must still find its line in them; CI has
neither, so that one skips there."""
from __future__ import annotations

import importlib.util
import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import peer_plants  # noqa: E402

PLANT = peer_plants.Plant("p", "k", "pkg/mod.py", "x = 1\n", "x = 2\n", 2, "a test plant")


def _site(tmp_path, text):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(text)
    return tmp_path


def test_a_plant_changes_every_occurrence_it_names(tmp_path):
    site = _site(tmp_path, "x = 1\ny = 0\nx = 1\n")
    peer_plants.apply(PLANT, site)
    assert (site / "pkg" / "mod.py").read_text() == "x = 2\ny = 0\nx = 2\n"


@pytest.mark.parametrize("text,found", [("x = 1\n", 1), ("x = 1\nx = 1\nx = 1\n", 3), ("y = 0\n", 0)])
def test_a_plant_that_does_not_match_says_so_and_changes_nothing(tmp_path, text, found):
    site = _site(tmp_path, text)
    with pytest.raises(peer_plants.PlantError, match=rf"^p: expected the planted line 2 time\(s\) in pkg/mod.py, "
                                                      rf"found it {found} time\(s\)"):
        peer_plants.apply(PLANT, site)
    assert (site / "pkg" / "mod.py").read_text() == text


def test_a_plant_without_its_file_names_it(tmp_path):
    with pytest.raises(peer_plants.PlantError, match="^p: pkg/mod.py is not in "):
        peer_plants.apply(PLANT, tmp_path)


ROWS = [  # as the plugin's --conformance-report writes them (decode_conformance/report.py)
    {"test": "test_parity::test_parity", "case": "bf16-paged16-h8g4-d64-B2[300,7]-late-spike-s1", "status": "failed"},
    {"test": "test_parity::test_parity", "case": "e4m3-contig-h4g2-d64-B1[17]-s2", "status": "failed"},
    {"test": "test_determinism::test_bitwise_repeatable",
     "case": "determinism-bf16-paged1-h8g8-d64-B2[129,700]-s6", "status": "failed"},
    {"test": "test_parity::test_parity", "case": "bf16-x-s9", "status": "error"},  # not a failure of the kernel
    {"test": "test_parity::test_parity", "case": "bf16-y-s3", "status": "passed"},
    {"test": "test_parity::test_parity", "case": "bf16-z-s4", "status": "skipped"},
]


def test_failures_are_read_from_the_conformance_report():
    assert peer_plants.failures(ROWS) == {
        ("test_parity", "bf16-paged16-h8g4-d64-B2[300,7]-late-spike-s1"),
        ("test_parity", "e4m3-contig-h4g2-d64-B1[17]-s2"),
        ("test_bitwise_repeatable", "determinism-bf16-paged1-h8g8-d64-B2[129,700]-s6"),
    }


def test_new_failures_are_counted_by_the_cases_distribution():
    new = peer_plants.failures(ROWS)
    data_of = {"bf16-paged16-h8g4-d64-B2[300,7]-late-spike-s1": "late-spike", "e4m3-contig-h4g2-d64-B1[17]-s2": "structured"}
    assert peer_plants.by_distribution(new, data_of) == {"late-spike": 1, "structured": 1, "other scenarios": 1}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(not (_importable("vllm.v1.attention.ops.triton_unified_attention")
                         and _importable("sglang.kernels.ops.attention.decode_attention")),
                    reason="vLLM's and sglang's kernel files are not importable (benchmarks/peer_carry.py builds them)")
def test_every_plant_finds_its_line_in_the_real_kernel_files(tmp_path):
    import vllm
    site = pathlib.Path(vllm.__file__).resolve().parents[1]
    shutil.copytree(site, tmp_path / "site")
    for plant in peer_plants.PLANTS:
        peer_plants.apply(plant, tmp_path / "site")  # raises PlantError naming the plant where not

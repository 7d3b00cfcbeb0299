"""GPU class detection, device pinning under pytest-xdist, and deterministic collection,
with fakes (no GPU needed): decode_conformance/hardware.py and xdist_pinning.py."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest

from decode_conformance import hardware, xdist_pinning
from suites.selftest._subpytest import ROOT, run_pytest

NVIDIA = [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 9), "sm_89"), ((9, 0), "sm_90"), ((10, 0), "sm_100"),
          ((12, 0), "sm_120")]
ROCM = [("gfx942:sramecc+:xnack-", "gfx942"), ("gfx950", "gfx950"), ("gfx950:sramecc+", "gfx950")]


# ---- classes ---------------------------------------------------------------------------

@pytest.mark.parametrize("capability,expected", NVIDIA)
def test_classify_nvidia(capability, expected):
    assert hardware.classify(is_hip=False, capability=capability) == expected
    assert expected in hardware.known_classes(), f"{expected} is not a row of fixtures/gpu_classes.toml"
    assert hardware.known_classes()[expected].vendor == "nvidia"


@pytest.mark.parametrize("arch,expected", ROCM)
def test_classify_rocm(arch, expected):
    assert hardware.classify(is_hip=True, arch_name=arch) == expected
    assert expected in hardware.known_classes(), f"{expected} is not a row of fixtures/gpu_classes.toml"
    assert hardware.known_classes()[expected].vendor == "amd"


def test_classify_needs_what_the_driver_reports():
    with pytest.raises(ValueError, match="arch_name"):
        hardware.classify(is_hip=True)
    with pytest.raises(ValueError, match="capability"):
        hardware.classify(is_hip=False)


def test_every_class_row_is_complete():
    classes = hardware.known_classes()
    assert hardware.CPU_CLASS in classes
    for name, c in classes.items():
        assert c.vendor in ("nvidia", "amd", "cpu"), name
        assert (c.memory_gb > 0) == (c.vendor != "cpu"), name


def test_a_compile_target_row_needs_its_warp_size_and_shared_memory(tmp_path):
    table = tmp_path / "classes.toml"
    table.write_text('[sm_90]\nvendor = "nvidia"\nmemory_gb = 80\nfp8_tensor_cores = true\n'
                     'description = "H100"\ncompile_arch = 90\nshared_memory_bytes = 232448\n')
    with pytest.raises(ValueError, match="class 'sm_90' has a compile_arch, so field 'warp_size' must be"):
        hardware.known_classes(str(table))
    table.write_text(table.read_text() + "warp_size = 32\n")
    assert hardware.known_classes(str(table))["sm_90"].warp_size == 32


def _fake_device(monkeypatch, *, rocm: bool, **props):
    import torch
    monkeypatch.setattr(hardware, "has_gpu", lambda: True)
    monkeypatch.setattr(hardware, "is_rocm", lambda: rocm)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: types.SimpleNamespace(**props))


# Prose that lists the class table for a reader (runner labels to register, compile targets):
# (file, a phrase of the line, which classes it must name).
CLASS_LISTS = [("ci/README.md", "`gpu.yml` `nvidia` (", "nvidia"),
               ("ci/README.md", "gpu, <class>` (class: ", "nvidia"),
               ("ci/templates/decode-conformance-nvidia.yml", "the suite's GPU class table", "nvidia"),
               ("ci/README.md", "`gpu.yml` `amd` (", "amd"),
               ("ci/README.md", "labels `self-hosted, linux, rocm, <class>`", "amd"),
               ("ci/templates/decode-conformance-amd.yml", "rocm, <class>` (", "amd"),
               ("ci/README.md", "Compiles every shipped kernel variant for ", "compiled"),
               ("README.md", "`compile-check` (every shipped kernel variant compiled", "compiled")]


@pytest.mark.parametrize("path,phrase,which", CLASS_LISTS, ids=[f"{p}:{w}" for p, _, w in CLASS_LISTS])
def test_docs_list_every_class_of_the_table(path, phrase, which):
    """A class added to fixtures/gpu_classes.toml must reach the lists a reader acts on (the
    runner labels to register), or a new class's runners are never set up."""
    lines = (ROOT / path).read_text().splitlines()
    at = next((i for i, line in enumerate(lines) if phrase in line), None)
    assert at is not None, f"{path}: no line has {phrase!r} (update CLASS_LISTS)"
    text = " ".join(lines[at:at + 2])  # a list may wrap once
    rows = hardware.known_classes().values()
    if which == "compiled":  # the compile check's targets, either vendor
        want = {c.name for c in rows if c.compile_arch is not None}
    else:
        want = {c.name for c in rows if c.vendor == which}
    form = {"nvidia": r"sm_\d+", "amd": r"gfx\d+"}.get(which, r"sm_\d+|gfx\d+")  # the wrapped line may be the other vendor's
    named = set(re.findall(rf"\b(?:{form})\b", text))
    assert named == want, (f"{path}:{at + 1} names {sorted(named)}; fixtures/gpu_classes.toml's "
                           f"{which} classes are {sorted(want)}")


def test_detect_class_nvidia(monkeypatch):
    _fake_device(monkeypatch, rocm=False, major=9, minor=0, gcnArchName="")
    assert hardware.detect_class() == "sm_90"


def test_detect_class_rocm(monkeypatch):
    # torch on ROCm reports a CUDA-style major/minor too (9.4 on MI300X): the arch name must win.
    _fake_device(monkeypatch, rocm=True, major=9, minor=4, gcnArchName="gfx942:sramecc+:xnack-")
    assert hardware.detect_class() == "gfx942"


def test_detect_class_without_gpu(monkeypatch):
    monkeypatch.setattr(hardware, "has_gpu", lambda: False)
    assert hardware.detect_class() == hardware.CPU_CLASS


# ---- visible devices -------------------------------------------------------------------

def test_visible_devices_var(monkeypatch):
    assert hardware.visible_devices_var(rocm=True) == "HIP_VISIBLE_DEVICES"
    assert hardware.visible_devices_var(rocm=False) == "CUDA_VISIBLE_DEVICES"
    monkeypatch.setattr(hardware, "is_rocm", lambda: True)
    assert hardware.visible_devices_var() == "HIP_VISIBLE_DEVICES"
    monkeypatch.setattr(hardware, "is_rocm", lambda: False)
    assert hardware.visible_devices_var() == "CUDA_VISIBLE_DEVICES"


@pytest.mark.parametrize("env,rocm,count,expected", [
    ({}, False, 4, ["0", "1", "2", "3"]),
    ({}, False, 0, []),
    ({"CUDA_VISIBLE_DEVICES": "2,5"}, False, 8, ["2", "5"]),  # only what the parent was given
    ({"CUDA_VISIBLE_DEVICES": " 3 , 1 "}, False, 8, ["3", "1"]),  # order kept, spaces dropped
    ({"CUDA_VISIBLE_DEVICES": ""}, False, 2, ["0", "1"]),  # empty: not set
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f2a,GPU-77c1"}, False, 2, ["GPU-8f2a", "GPU-77c1"]),  # UUIDs pass through
    ({"HIP_VISIBLE_DEVICES": "6,7"}, True, 8, ["6", "7"]),
    ({"CUDA_VISIBLE_DEVICES": "6,7"}, True, 2, ["0", "1"]),  # ROCm pins with HIP_VISIBLE_DEVICES
    ({"HIP_VISIBLE_DEVICES": "6,7"}, False, 2, ["0", "1"]),  # and NVIDIA ignores HIP's variable
])
def test_parent_visible_ids(env, rocm, count, expected):
    assert hardware.parent_visible_ids(env=env, count=count, rocm=rocm) == expected


def test_parent_visible_ids_reads_the_process_environment(monkeypatch):
    monkeypatch.setattr(hardware, "is_rocm", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert hardware.parent_visible_ids(count=8) == ["4", "6"]


# ---- xdist pinning ---------------------------------------------------------------------

class FakeSpec:
    def __init__(self):
        self.env = {}


def _execnet_specs(n):
    execnet = pytest.importorskip("execnet")
    return [execnet.XSpec("popen") for _ in range(n)]


@pytest.mark.parametrize("make_specs", [lambda n: [FakeSpec() for _ in range(n)], _execnet_specs],
                         ids=["fake", "execnet"])
@pytest.mark.parametrize("ids,n_workers,expected", [
    (["0", "1", "2", "3"], 4, ["0", "1", "2", "3"]),
    (["2", "5"], 5, ["2", "5", "2", "5", "2"]),  # more workers than GPUs: round robin
    (["7"], 3, ["7", "7", "7"]),
    (["0", "1", "2", "3"], 2, ["0", "1"]),
])
def test_assign_one_gpu_per_worker(make_specs, ids, n_workers, expected):
    specs = make_specs(n_workers)
    xdist_pinning.assign(specs, ids, "CUDA_VISIBLE_DEVICES")
    got = [s.env["CUDA_VISIBLE_DEVICES"] for s in specs]
    assert got == expected
    assert all("," not in g for g in got), "a worker must see exactly one device"
    assert {s.env[xdist_pinning.SHARING_ENV] for s in specs} == {str(-(-n_workers // len(ids)))}


def test_a_worker_shares_its_gpu_as_assigned_and_a_run_without_xdist_alone(monkeypatch):
    """The memory budgets divide a GPU's free memory among the workers pinned to it. The user's
    worker request is exported to every process, a run without xdist's too: only the count the
    pinning hook hands a worker may divide it."""
    from decode_conformance import state
    monkeypatch.setenv(xdist_pinning.WORKERS_PER_GPU_ENV, "16")
    monkeypatch.delenv(xdist_pinning.SHARING_ENV, raising=False)
    assert state.workers_sharing_device() == 1
    specs = [FakeSpec() for _ in range(6)]
    xdist_pinning.assign(specs, ["0", "1"], "CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv(xdist_pinning.SHARING_ENV, specs[0].env[xdist_pinning.SHARING_ENV])
    assert state.workers_sharing_device() == 3


def test_assign_without_gpus_leaves_specs_alone():
    specs = [FakeSpec(), FakeSpec()]
    xdist_pinning.assign(specs, [], "CUDA_VISIBLE_DEVICES")
    assert all(s.env == {} for s in specs)


class FakeConfig:
    def __init__(self, device=None, args=("suites",)):
        self._device = device
        self.args = list(args)

    def getoption(self, name):
        assert name == "--device"
        return self._device


def _fake_gpus(monkeypatch, n: int, rocm: bool = False, visible: str = "", cpus: int = 16, gib: float = 80):
    monkeypatch.setattr(hardware, "gpu_count", lambda: n)
    monkeypatch.setattr(hardware, "gpu_memory_totals", lambda: [int(gib * 2**30)] * n)
    monkeypatch.setattr(hardware, "has_gpu", lambda: n > 0)
    monkeypatch.setattr(hardware, "is_rocm", lambda: rocm)
    monkeypatch.setattr(xdist_pinning.os, "cpu_count", lambda: cpus)
    monkeypatch.delenv(xdist_pinning.WORKERS_PER_GPU_ENV, raising=False)
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    if visible:
        monkeypatch.setenv(hardware.visible_devices_var(rocm), visible)


PER_GPU = xdist_pinning.WORKERS_PER_GPU


@pytest.mark.parametrize("n,device,cpus,expected", [
    (1, None, 16, PER_GPU),  # one GPU: several workers, the correctness suites are host-bound
    (1, None, 64, PER_GPU),
    (2, "cuda", 64, 2 * PER_GPU),
    (2, "cuda", 16, 2 * 8),  # bounded by the CPU count: 8 per GPU on 16 cores
    (8, None, 16, 8 * 2),  # 2 per GPU on 16 cores
    (0, None, 16, None),  # no GPU: xdist's own default (CPU count)
    (4, "cpu", 16, None),  # --device=cpu on a GPU machine: the GPUs do not bound the workers
])
def test_auto_num_workers_several_per_gpu(monkeypatch, n, device, cpus, expected):
    _fake_gpus(monkeypatch, n, cpus=cpus)
    assert xdist_pinning.auto_num_workers(FakeConfig(device)) == expected


@pytest.mark.parametrize("gib,cpus,expected", [
    (22.0, 16, 8),    # a 24 GB card: 22 GiB / (2 GiB / 0.9 + 0.5 GiB a context) = 8.1
    (39.4, 16, 14),   # a 40 GB card: 14.5
    (79.2, 16, 16),   # an 80 GB card fits 29; 16 by the constant and the CPUs
    (79.2, 8, 8),
])
def test_auto_num_workers_leave_each_light_case_its_budget(monkeypatch, gib, cpus, expected):
    _fake_gpus(monkeypatch, 1, cpus=cpus, gib=gib)
    assert xdist_pinning.auto_num_workers(FakeConfig()) == expected


def test_auto_num_workers_of_mixed_cards_follow_the_smallest(monkeypatch):
    _fake_gpus(monkeypatch, 2, cpus=64)
    monkeypatch.setattr(hardware, "gpu_memory_totals", lambda: [80 << 30, 22 << 30])
    assert xdist_pinning.auto_num_workers(FakeConfig()) == 2 * 8


@pytest.mark.parametrize("value", ["0", "-2", "twelve", "1.5"])
def test_workers_per_gpu_env_not_a_count_is_a_usage_error(monkeypatch, value):
    _fake_gpus(monkeypatch, 1)
    monkeypatch.setenv(xdist_pinning.WORKERS_PER_GPU_ENV, value)
    with pytest.raises(pytest.UsageError, match=f"{xdist_pinning.WORKERS_PER_GPU_ENV}='{re.escape(value)}': expected"):
        xdist_pinning.auto_num_workers(FakeConfig())


def test_workers_per_gpu_env_overrides_the_memory_bound_not_the_cpus(monkeypatch):
    _fake_gpus(monkeypatch, 1, cpus=16, gib=22.0)
    monkeypatch.setenv(xdist_pinning.WORKERS_PER_GPU_ENV, "12")
    assert xdist_pinning.auto_num_workers(FakeConfig()) == 12
    monkeypatch.setenv(xdist_pinning.WORKERS_PER_GPU_ENV, "40")
    assert xdist_pinning.auto_num_workers(FakeConfig()) == 16


def test_auto_num_workers_perf_alone_is_one_per_gpu(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    assert xdist_pinning.auto_num_workers(FakeConfig(args=["suites/perf"])) == 2
    assert xdist_pinning.auto_num_workers(FakeConfig(args=["decode_conformance.suites.perf"])) == 2


def test_auto_num_workers_honours_visible_devices_and_env(monkeypatch):
    _fake_gpus(monkeypatch, 2, visible="3,5", cpus=64)  # torch counts the 2 the parent may use
    assert xdist_pinning.auto_num_workers(FakeConfig()) == 2 * PER_GPU
    monkeypatch.setenv(xdist_pinning.WORKERS_PER_GPU_ENV, "1")
    assert xdist_pinning.auto_num_workers(FakeConfig()) == 2


@pytest.mark.parametrize("rocm,var", [(False, "CUDA_VISIBLE_DEVICES"), (True, "HIP_VISIBLE_DEVICES")])
def test_setupnodes_pins_each_worker(monkeypatch, rocm, var):
    _fake_gpus(monkeypatch, 2, rocm=rocm, visible="3,5")
    specs = [FakeSpec() for _ in range(4)]
    xdist_pinning.setup_nodes(FakeConfig(), specs)
    assert [s.env[var] for s in specs] == ["3", "5", "3", "5"]
    assert all(s.env[xdist_pinning.SHARING_ENV] == "2" for s in specs)


@pytest.mark.parametrize("n,device", [(0, None), (2, "cpu")])
def test_setupnodes_leaves_cpu_runs_alone(monkeypatch, n, device):
    _fake_gpus(monkeypatch, n)
    specs = [FakeSpec() for _ in range(2)]
    xdist_pinning.setup_nodes(FakeConfig(device), specs)
    assert all(s.env == {} for s in specs)


# ---- determinism across workers --------------------------------------------------------

def _collected_ids(hash_seed: str, *extra: str) -> list[str]:
    run = run_pytest("suites/parity", "--collect-only", "-q", *extra, env={"PYTHONHASHSEED": hash_seed}, timeout=180)
    assert run.rc == 0, run.out[-3000:]
    ids = [ln for ln in run.out.splitlines() if re.match(r"^suites/\S+::", ln)]
    assert ids, run.out[-3000:]
    return ids


def test_collection_is_identical_in_two_processes():
    """xdist requires every worker to collect the same list in the same order; workers are
    separate processes with their own hash seeds, so anything ordered by hash (a set of case
    ids, say) would break it. Two processes with different PYTHONHASHSEED must agree."""
    a = _collected_ids("1")
    b = _collected_ids("2")
    assert len(a) == len(b) and a == b, next(((i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    assert len(set(a)) == len(a), "duplicate test ids"


def test_auto_workers_win_over_xdists_cpu_count(tmp_path):
    """Installed, the plugin may register before xdist; its `-n auto` answer (GPUs x workers per
    GPU) must still be the one used, not xdist's CPU count - and every worker gets one GPU."""
    (tmp_path / "test_pin.py").write_text(
        "import os\n"
        "def test_pinned():\n"
        "    assert os.environ['CUDA_VISIBLE_DEVICES'] in ('0', '1', '2')\n"
        "    assert os.environ['DECODE_CONFORMANCE_WORKERS_SHARING_GPU'] == '1'\n")
    env = {"DECODE_CONFORMANCE_WORKERS_PER_GPU": "1", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "suites.selftest.fake_gpus", "-n", "auto",
                          "-p", "no:cacheprovider", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                         env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, **env})
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-2000:]
    assert re.search(r"\b3 workers\b", out), out[-2000:]  # not os.cpu_count()


def test_workers_take_the_device_the_controller_detected(tmp_path):
    # Under xdist each worker is told the device the controller found, so it can start its
    # isolated worker before importing torch to look for a GPU itself.
    probes = tmp_path / "probes.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
           "PYTHONPATH": str(ROOT), "DC_GPU_PROBE_LOG": str(probes)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "suites.selftest.count_gpu_probes", "-n", "2",
                          "-p", "no:cacheprovider", "-q", "suites/parity/test_parity.py",
                          "--kernel=decode_conformance_kernels.registry:torch_gather", "-k", "winconv"],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and re.search(r"\b8 passed\b", out), out[-2000:]
    assert not probes.exists(), f"workers probed for a GPU themselves: {probes.read_text().split()}"

"""compile_ahead.py: a recorded run's variants, compiled by a pool, are the ones a later run finds.

The end-to-end test compiles for sm_90 on this machine, GPU or not (Triton's NVIDIA backend and
its bundled ptxas; `compile_ahead.offline_target`), in fresh processes without TRITON_INTERPRET:
  1. a run records its compiles (two variants of a small kernel);
  2. the manifest built from the records is compiled by the pool into an empty Triton cache;
  3. a later run on that cache compiles the two variants and a third: only the third is new.
With a manifest that lost an entry (a pool that skips variants), the later run compiles two.
"""
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time
import types

import pytest

from decode_conformance import compile_ahead, compile_ahead_run
from suites.selftest._subpytest import small_case_ids

PROBE = '''
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)
'''

# A case's process: records (install_recorder) when given a folder, then compiles the BLOCK sizes
# given for sm_90.
RUN = '''
import sys, torch
from decode_conformance import compile_ahead, isolation
isolation.use_compile_defaults()  # as the isolated worker that runs a case does
import ca_probe
if sys.argv[1] != "-":
    compile_ahead.install_recorder(sys.argv[1])
with compile_ahead.offline_target({"backend": "cuda", "arch": 90, "warp_size": 32}):
    x = torch.zeros(256)
    for block in map(int, sys.argv[2:]):
        ca_probe.scale.warmup(x, x, 256, BLOCK=block, grid=(1,))
'''

SM90 = {"backend": "cuda", "arch": 90, "warp_size": 32}


def _has_nvidia_backend() -> bool:
    try:
        import triton
        from triton.backends import backends
    except ImportError:
        return False
    ptxas = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return "nvidia" in backends and ptxas.exists()


def _env(tmp_path, cache) -> dict:
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TRITON_CACHE_DIR"] = str(cache)
    return env


def _run(tmp_path, cache, log, *blocks):
    subprocess.run([sys.executable, "-c", RUN, str(log) if log else "-", *map(str, blocks)], env=_env(tmp_path, cache),
                   check=True, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def _variants(cache) -> set:
    """Compiled variants in a Triton cache: one group file (__grp__*.json) per variant."""
    return {p.parent.name for p in pathlib.Path(cache).rglob("__grp__*.json")}


@pytest.mark.skipif(not _has_nvidia_backend(), reason="needs Triton's NVIDIA backend and its ptxas (compiles for sm_90)")
@pytest.mark.parametrize("kept,elsewhere", [(2, False), (1, False), (2, True)],
                         ids=["whole-manifest", "manifest-missing-a-variant", "recorded-on-another-install"])
def test_pool_compiles_what_the_later_run_would(tmp_path, kept, elsewhere):
    (tmp_path / "ca_probe.py").write_text(textwrap.dedent(PROBE))
    _run(tmp_path, tmp_path / "cache-record", tmp_path / "log", 32, 64)
    manifest = compile_ahead.build_manifest(tmp_path / "log", "sm_90")
    assert manifest["target"] == SM90 and len(manifest["entries"]) == 2
    manifest["entries"] = manifest["entries"][:kept]
    if elsewhere:  # a shipped manifest: Triton's options name libdevice under the recording host's install
        for e in manifest["entries"]:
            data = json.loads(e["data"])
            libs = dict(data["options"]["extern_libs"])
            assert "libdevice" in libs, "the recorded options name libdevice by path"
            data["options"]["extern_libs"] = [[k, "/elsewhere/site-packages/triton/backends/nvidia/lib/" + pathlib.Path(v).name]
                                              for k, v in libs.items()]
            e["data"] = json.dumps(data)
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    stale = subprocess.run([sys.executable, "-c", "import json, sys; from decode_conformance import compile_ahead_run; "
                            "print(json.dumps(compile_ahead_run.stale_functions(json.load(open(sys.argv[1])))))",
                            str(tmp_path / "m.json")], env=_env(tmp_path, tmp_path / "cache-x"), capture_output=True,
                           text=True, check=True, cwd=tmp_path)
    assert json.loads(stale.stdout) == [], "a process importing the same source must find the recorded hash"

    cache = tmp_path / "cache"
    pool = subprocess.run([sys.executable, "-m", "decode_conformance.compile_ahead", "precompile", str(tmp_path / "m.json"),
                           "--jobs", "2", "--done", str(tmp_path / "done.json")], env=_env(tmp_path, cache),
                          capture_output=True, text=True, timeout=300)
    assert pool.returncode == 0, pool.stdout + pool.stderr
    summary = json.loads((tmp_path / "done.json").read_text())
    assert (summary["compiled"], summary["failed"], summary["stale"]) == (kept, [], 0)
    before = _variants(cache)
    assert len(before) == kept

    _run(tmp_path, cache, None, 32, 64, 128)
    new = _variants(cache) - before
    assert len(new) == 3 - kept, f"the later run compiled {len(new)} variants; the pool should have left {3 - kept}"


def _write_log(folder, rows):
    folder.mkdir()
    (folder / "w-1.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _row(key, seconds, target=SM90, fn="m:k"):
    return {"fn": fn, "hash": "h", "seconds": seconds, "target": target, "data": json.dumps({"key": key})}


def test_manifest_keeps_one_entry_per_variant_with_its_longest_compile(tmp_path):
    _write_log(tmp_path / "log", [_row("a", 0.8), _row("a", 0.01), _row("b", 0.3), _row("a", 0.2, fn="m:other"),
                                  {"kind": "host-module", "seconds": 1.0}])
    m = compile_ahead.build_manifest(tmp_path / "log", "sm_90")
    assert sorted((e["fn"], json.loads(e["data"])["key"], e["seconds"]) for e in m["entries"]) == [
        ("m:k", "a", 0.8), ("m:k", "b", 0.3), ("m:other", "a", 0.2)]
    assert (m["gpu_class"], m["target"], m["format"]) == ("sm_90", SM90, compile_ahead.FORMAT)


def test_manifest_refuses_records_of_two_targets_and_an_empty_log(tmp_path):
    _write_log(tmp_path / "two", [_row("a", 0.1), _row("b", 0.1, target={**SM90, "arch": 80})])
    with pytest.raises(compile_ahead.ManifestError, match="2 targets"):
        compile_ahead.build_manifest(tmp_path / "two", "sm_90")
    (tmp_path / "empty").mkdir()
    with pytest.raises(compile_ahead.ManifestError, match="no compile records"):
        compile_ahead.build_manifest(tmp_path / "empty", "sm_90")


@pytest.mark.parametrize("change, field", [
    (lambda m: m.update(format=0), "format: expected 1"),
    (lambda m: m.pop("target"), "target: expected a dict"),
    (lambda m: m["entries"].append({"fn": "m:k"}), r"entries\[1\]: expected strings fn and data, missing \['data'\]"),
])
def test_a_bad_manifest_names_the_field(tmp_path, change, field):
    m = {"format": 1, "triton": "3.6.0", "gpu_class": "sm_90", "target": SM90, "entries": [{"fn": "m:k", "data": "{}"}]}
    change(m)
    (tmp_path / "m.json").write_text(json.dumps(m))
    with pytest.raises(compile_ahead.ManifestError, match=field):
        compile_ahead.load_manifest(tmp_path / "m.json")


def _config(args=("suites/parity",), **opts):
    values = {"--compile-ahead": "auto", "--kernel": [], "keyword": "", "markexpr": "", **opts}
    option = types.SimpleNamespace(lf=False, pyargs=values.pop("pyargs", False), splits=values.pop("splits", None),
                                   deselect=values.pop("deselect", None), ignore=None, ignore_glob=None, stepwise=False)
    return types.SimpleNamespace(getoption=values.get, option=option, args=list(args))


def _state(**kw):
    return types.SimpleNamespace(**{"device": "cuda", "case_set": "parity", "case_ids": [], "gpu_class": "sm_90", **kw})


def _manifest(path, **kw):
    import triton
    m = {"format": 1, "triton": triton.__version__, "gpu_class": "sm_90", "target": SM90,
         "entries": [{"fn": "m:k", "hash": "h1", "data": "{}"}], **kw}
    path.write_text(json.dumps(m))
    return path


def test_plan_uses_the_shipped_manifest_only_for_the_run_it_was_recorded_from(tmp_path, monkeypatch):
    shipped = _manifest(tmp_path / "shipped.json")
    monkeypatch.delenv("DECODE_CONFORMANCE_KERNELS", raising=False)
    monkeypatch.setattr(compile_ahead_run, "shipped_manifest", lambda gpu_class: shipped if gpu_class == "sm_90" else None)
    monkeypatch.setattr(compile_ahead_run, "source_hash", lambda fn: "h1")
    plan = compile_ahead_run.plan
    assert plan(_config(), _state(), target=SM90)[0] == shipped
    assert plan(_config(args=["decode_conformance.suites.parity"], pyargs=True), _state(), target=SM90)[0] == shipped
    for config, state, target, why in [
        (_config(), _state(device="cpu"), None, "interpreter"),
        (_config(**{"--compile-ahead": "off"}), _state(), SM90, "off (--compile-ahead=auto"),
        (_config(**{"--compile-ahead": None}), _state(), SM90, "off (--compile-ahead=auto"),  # the default
        (_config(**{"--compile-ahead": None}), _state(device="cpu"), None, "off (the CPU interpreter"),
        (_config(**{"--kernel": ["mine:k"]}), _state(), SM90, "a --kernel selection"),
        (_config(keyword="mla"), _state(), SM90, "not the whole parity suite"),
        (_config(splits=2), _state(), SM90, "not the whole parity suite"),
        (_config(deselect=["x"]), _state(), SM90, "not the whole parity suite"),
        (_config(args=["suites/parity/test_parity.py"]), _state(), SM90, "not the whole parity suite"),
        (_config(args=["suites/perf"]), _state(), SM90, "not the whole parity suite"),
        (_config(args=["suites/parity", "suites/gates"]), _state(), SM90, "not the whole parity suite"),
        (_config(), _state(case_set="smoke"), SM90, "case set smoke"),
        (_config(), _state(case_ids=["x"]), SM90, "filtered by --case-id"),
        (_config(), _state(gpu_class="gfx942"), SM90, "no shipped manifest for gfx942"),
        (_config(), _state(), {**SM90, "arch": 100}, "does not fit: its target is"),
    ]:
        path, reason = plan(config, state, target=target)
        assert path is None and why in reason, (why, reason)
    monkeypatch.setattr(compile_ahead_run, "source_hash", lambda fn: "h2")  # the kernel changed since it was recorded
    path, why = plan(_config(), _state(), target=SM90)
    assert path is None and "was recorded from other source of m:k: re-record it" in why, why
    _manifest(shipped, triton="0.0.1")
    path, why = plan(_config(), _state(), target=SM90)
    assert path is None and "does not fit: it was written by triton 0.0.1" in why, why
    shipped.write_text("{")
    path, why = plan(_config(), _state(), target=SM90)
    assert path is None and "is unreadable" in why, why


def test_a_manifest_named_on_the_command_line_must_fit_the_gpu(tmp_path):
    named = _manifest(tmp_path / "named.json")
    config = _config(**{"--compile-ahead": str(named)})
    assert compile_ahead_run.plan(config, _state(), target=SM90)[0] == named
    assert compile_ahead_run.plan(config, _state(device="cpu"))[0] == named  # the CPU: only the wiring
    with pytest.raises(compile_ahead.ManifestError, match="it is for sm_90; this run's GPU class is gfx942"):
        compile_ahead_run.plan(config, _state(gpu_class="gfx942"), target=SM90)
    with pytest.raises(compile_ahead.ManifestError, match="its target is"):
        compile_ahead_run.plan(config, _state(), target={**SM90, "arch": 80})


SLOW = "import time\ntime.sleep(120)\n"  # a pool whose one variant takes two minutes to import


def _slow_manifest(tmp_path) -> pathlib.Path:
    (tmp_path / "ca_slow.py").write_text(SLOW)
    return _manifest(tmp_path / "slow.json", entries=[{"fn": "ca_slow:k", "hash": "h", "data": "{}"}])


def _stat(pid) -> list:
    """/proc/PID/stat's fields after the command name (state first, then ppid, ...); [] when gone."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in pathlib.Path("/proc").glob("[0-9]*") if _stat(p.name)[1:2] == [str(pid)]]


def _running(pid: int) -> bool:
    return _stat(pid)[:1] not in ([], ["Z"], ["X"])


def _nice(pid: int) -> int:
    return int(_stat(pid)[16])


def _cmdline(path: pathlib.Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:  # the process ended while the folder was listed
        return ""


def test_summary_line_counts_stale_and_failed_entries():
    assert compile_ahead.summary_line({"compiled": 3, "entries": 3, "failed": [], "stale": 1, "seconds": 2.0, "jobs": 2}) == (
        "compile ahead: 3 of 3 variants in 2.0 s on 2 processes; 1 recorded from other kernel source "
        "(re-record the manifest)")
    assert compile_ahead.summary_line({"compiled": 1, "entries": 2, "failed": [("m:k", "E: x")], "stale": 0,
                                       "seconds": 1.0, "jobs": 2}).endswith("; 1 failed, first: m:k: E: x")


@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="reads process priorities from /proc (Linux)")
def test_the_pool_runs_at_the_lowest_priority_and_ends_with_the_run(tmp_path, monkeypatch):
    """The cases do not wait for the pool, so it must not take their cores: it and the processes
    compiling for it run at nice 19, and `stop` ends them all."""
    manifest = _slow_manifest(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = compile_ahead_run.start(manifest, tmp_path / "summary.json", jobs=1)
    try:
        deadline = time.monotonic() + 60
        workers = []
        while not workers and time.monotonic() < deadline:  # started after the pool set its priority
            workers = _children(proc.pid)
            time.sleep(0.1)
        assert workers, "the pool started no compile process"
        want = min(os.nice(0) + compile_ahead_run.POOL_NICE, 19)  # Linux caps niceness at 19
        assert compile_ahead_run.POOL_NICE == 19 and _nice(proc.pid) == want
        assert [_nice(w) for w in workers] == [want] * len(workers)
    finally:
        compile_ahead_run.stop(proc)
    assert proc.poll() is not None
    deadline = time.monotonic() + 10
    while [w for w in workers if _running(w)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [w for w in workers if _running(w)], "a compile process outlived stop()"
    assert compile_ahead_run.read_summary(tmp_path / "summary.json") is None


@pytest.mark.skipif(not _has_nvidia_backend(), reason="needs Triton's NVIDIA backend (the pool's stand-in driver)")
def test_cases_do_not_wait_for_the_pool_and_the_run_reports_it(tmp_path):
    """The plugin's wiring, on the CPU: `--compile-ahead=PATH` starts the pool at configure time;
    the xdist worker runs its case without waiting for it (this pool needs two minutes); the run's
    summary says the pool had not finished, and the pool ends with the run."""
    manifest = _slow_manifest(tmp_path)
    root = pathlib.Path(__file__).resolve().parents[2]
    case = small_case_ids(1)[0]  # a parity case, picked by size (the case tables change)
    env = {**_env(tmp_path, tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", str(root / "suites/parity/test_parity.py"), "-p", "no:cacheprovider",
                          "--case-set", "parity", "--case-id", case, "--kernel", "decode_conformance_kernels.registry:torch_gather",
                          "-n", "1", f"--compile-ahead={manifest}", "--device", "cpu"],
                         env=env, cwd=root, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"compile ahead: --compile-ahead={manifest}" in run.stdout
    assert "1 passed" in run.stdout
    assert took < 100, f"the run took {took:.0f} s: its case waited for the pool"
    assert "compile ahead: the pool had not finished when the cases had" in run.stdout, run.stdout[-2000:]
    left = [p for p in pathlib.Path("/proc").glob("[0-9]*/cmdline") if str(manifest) in _cmdline(p)]
    assert not left, "the pool outlived the run"


def test_every_shipped_manifest_is_what_its_path_names():
    """`--compile-ahead=auto` finds fixtures/compile_ahead/<gpu class>/triton-<version>.json and
    uses it only when its own fields say that class and version: a manifest whose fields
    disagree with its path is never used (session 40's was written with the CPU's Triton
    version in it)."""
    from decode_conformance.resources import data_path
    root = data_path(compile_ahead.MANIFEST_DIR)
    shipped = sorted(root.glob("*/triton-*.json"))
    assert shipped, f"no manifest under {root}"
    for path in shipped:
        m = compile_ahead.load_manifest(path)
        assert path.parts[-3:] == compile_ahead.manifest_name(m["gpu_class"], m["triton"]), (path, m["gpu_class"],
                                                                                              m["triton"])
        assert m["entries"], path

"""benchmarks/compile_log.py: the record of one compile as Triton's JIT hooks hand it over, and the
summary's counts, on records written by hand."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compile_log  # noqa: E402

# What Triton 3.6's JITFunction._call_hook passes as `compile` (keys it fills), for a kernel
# (Q, n, B): Q a bf16 pointer divisible by 16, n an int specialized to 1, B a constexpr.
COMPILE = {"key": "k", "signature": {"Q": "*bf16", "n": "i32", "B": "constexpr"},
           "constants": {(1,): 1, (2,): 64}, "configs": [{(0,): [["tt.divisibility", 16]]}],
           "num_warps": 4, "num_stages": 3, "specialization_data": '{"key": "k"}'}


def test_variant_names_each_argument_by_its_specialization():
    assert compile_log.variant(["Q", "n", "B"], COMPILE) == {
        "Q": "*bf16 divisibility16", "n": "i32=1", "B": "constexpr=64", "launch": "warps=4 stages=3"}


def _rec(proc, kernel, variant, seconds, t0=10.0):
    return {"proc": proc, "born": 0.0, "kind": "kernel", "kernel": kernel, "t0": t0, "seconds": seconds,
            "variant": variant}


def test_summary_counts_variants_real_compiles_and_repeats(tmp_path):
    a = {"n": "i32", "launch": "warps=4 stages=3"}
    b = {"n": "i32=1", "launch": "warps=4 stages=3"}
    rows = [_rec("gw0-1", "stage1", a, 2.0), _rec("gw1-2", "stage1", a, 1.5), _rec("gw1-2", "stage1", b, 0.01)]
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    text = compile_log.summarize(tmp_path, real=0.25)
    # 3 events, 2 variants, 2 real compiles (the 0.01 s one was a disk-cache hit), 1 variant
    # compiled in two processes, 3.51 s
    assert "| stage1 | 3 | 2 | 2 | 1 | 3.5 |" in text
    assert "n {'i32': 1, 'i32=1': 1}" in text
    assert "2 over 0.25 s (real compiles)" in text


def test_install_records_what_the_hooks_receive(tmp_path, monkeypatch):
    from triton import knobs
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    compile_log.install(str(tmp_path))

    def stage1():
        pass

    class Fn:  # triton's JitFunctionInfo: module, name, jit_function
        name = "stage1"
        jit_function = type("J", (), {"arg_names": ["Q", "n", "B"], "fn": stage1, "cache_key": "src-hash"})()

    hook_kwargs = dict(key="k", repr="stage1[...]", fn=Fn(), compile=COMPILE, is_manual_warmup=False,
                       already_compiled=False)
    from decode_conformance.compile_ahead import offline_target
    with offline_target({"backend": "cuda", "arch": 90, "warp_size": 32}):
        assert knobs.runtime.jit_cache_hook(**hook_kwargs) is False  # never skips the compile
        knobs.runtime.jit_post_compile_hook(**hook_kwargs)
    (log,) = [p for p in tmp_path.glob("*.jsonl") if not p.name.startswith("events-")]  # not the process's own lines
    (rec,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert rec["kernel"] == "stage1" and rec["kind"] == "kernel" and rec["seconds"] >= 0
    assert rec["variant"]["n"] == "i32=1"
    # ... and a compile-ahead manifest's fields (decode_conformance.compile_ahead.build_manifest)
    assert (rec["fn"], rec["hash"], rec["data"]) == (f"{__name__}:{stage1.__qualname__}", "src-hash", '{"key": "k"}')
    assert rec["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}


def test_timeline_splits_each_workers_tests_into_compile_slot_wait_and_the_rest(tmp_path):
    # gw0's pytest process (pid 1) ran two tests, 10-14 s and 14-15 s; its isolated kernel
    # process (pid 2) compiled 11-13 s, inside the first; it waited 0.5 s for a slot in the second.
    rows = [{"proc": "main-0", "born": 0.0, "kind": "session", "kernel": "", "t0": 1.0, "seconds": 0.0},
            {"proc": "gw0-1", "born": 2.0, "kind": "test", "kernel": "f.py::t[a]", "t0": 10.0, "seconds": 4.0},
            {"proc": "gw0-1", "born": 2.0, "kind": "test", "kernel": "f.py::t[b]", "t0": 14.0, "seconds": 1.0},
            {"proc": "gw0-1", "born": 2.0, "kind": "slot-wait", "kernel": "", "t0": 14.0, "seconds": 0.5},
            dict(_rec("gw0-2", "stage1", {"n": "i32"}, 2.0, t0=11.0), born=3.0)]
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    text = compile_log.summarize(tmp_path, real=0.25)
    assert "pytest's session starts at 1.0 s, the last test ends at 15.0 s" in text
    # started 2.0, first test 10.0, last ends 15.0, 2 tests, 5.0 s in tests: 2.0 compile, 0.5 wait, 2.5 rest
    assert "| gw0 | 2.0 | 10.0 | 15.0 | 2 | 5.0 | 2.0 | 0.5 | 2.5 |" in text
    assert "| `t[a]` | gw0 | 10.0 | 4.00 | 2.00 | 0.00 |" in text
    assert "| `t[b]` | gw0 | 14.0 | 1.00 | 0.00 | 0.50 |" in text


def test_phases_give_each_pytest_process_its_start_up_and_end(tmp_path):
    # the controller (pid 0) and gw0's pytest process (pid 1) with its phases; gw0's isolated kernel
    # process (pid 2) only exits (no pytest hooks run there): it gets no row
    def ph(proc, born, name, t0):
        return {"proc": proc, "born": born, "kind": "phase", "kernel": name, "t0": t0, "seconds": 0.0}
    rows = [ph("main-0", 0.0, "configure", 0.5), ph("main-0", 0.0, "sessionstart", 3.0),
            ph("main-0", 0.0, "sessionfinish", 20.0), ph("main-0", 0.0, "finished", 22.5),
            ph("main-0", 0.0, "unconfigured", 22.6), ph("main-0", 0.0, "exit", 22.7),
            ph("gw0-1", 3.1, "configure", 3.5), ph("gw0-1", 3.1, "sessionstart", 7.0), ph("gw0-1", 3.1, "collected", 7.4),
            {"proc": "gw0-1", "born": 3.1, "kind": "test", "kernel": "f.py::t[a]", "t0": 8.0, "seconds": 11.5},
            ph("gw0-1", 3.1, "sessionfinish", 19.6), ph("gw0-1", 3.1, "finished", 19.7),
            ph("gw0-1", 3.1, "unconfigured", 21.0), ph("gw0-1", 3.1, "exit", 21.1),
            ph("gw0-2", 7.2, "exit", 21.0)]
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    text = compile_log.summarize(tmp_path, real=0.25)
    assert "| main-0 | 0.0 | 0.5 | 3.0 |  |  |  | 20.0 | 22.5 | 22.6 | 22.7 |" in text
    assert "| gw0-1 | 3.1 | 3.5 | 7.0 | 7.4 | 8.0 | 19.5 | 19.6 | 19.7 | 21.0 | 21.1 |" in text
    assert "gw0-2" not in text


def test_a_logged_process_imports_triton_only_when_it_would_anyway(tmp_path):
    """install() at start-up (sitecustomize) leaves triton unimported, so a logged process starts as
    fast as an unlogged one; the first `import triton` puts the compile hooks in."""
    import subprocess
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import compile_log; "
            f"compile_log.install({str(tmp_path)!r}); "
            "print('before', 'triton' in sys.modules); "
            "import importlib.util; importlib.util.find_spec('triton'); "  # as torch asks whether it is installed
            "from triton import knobs; print('hooked', knobs.runtime.jit_post_compile_hook is not None)")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["before", "False", "hooked", "True"], out.stdout + out.stderr[-2000:]


def test_spans_are_summarized_per_kind_of_process(tmp_path):
    def rec(proc, kind, name, seconds):
        return {"proc": proc, "born": 0.0, "kind": kind, "kernel": name, "t0": 1.0, "seconds": seconds}
    rows = [rec("gw0-1", "phase", "configure", 0.0), rec("gw1-3", "phase", "configure", 0.0),
            rec("gw0-1", "span", "import torch", 2.0), rec("gw1-3", "span", "import torch", 3.0),
            rec("gw0-1", "span", "device memory read", 0.5), rec("gw0-2", "span", "import torch", 4.0)]
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    text = compile_log.summarize(tmp_path, real=0.25)
    assert "| import torch | pytest process | 2 | 3.00 | 3.00 |" in text  # median of two: the upper one
    assert "| device memory read | pytest process | 1 | 0.50 | 0.50 |" in text
    assert "| import torch | kernel process | 1 | 4.00 | 4.00 |" in text  # gw0-2 ran no pytest hooks

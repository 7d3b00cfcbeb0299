"""ci/compile_check.py: the shipped kernels compile for GPU targets from this CPU-only machine,
and the check fails on what a GPU compiler would reject (a construct every backend rejects, one
only AMD rejects, shared memory over a target's limit, fp8 MMAs a class lacks) while its
per-target exclusions follow the kernels' Capabilities and the GPU class table, and the host
code makes its device-dependent choices as on the target GPU.

Compiles run in child processes: under TRITON_INTERPRET=1 (this process) `triton.jit` builds
interpreter functions, not compilable ones. CI runs the full check as its own `.ci/run` stage;
the real-kernel test here compiles two kernels for two targets (cache hits after that stage)."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cc():
    """ci/compile_check.py imported here only for its pure parts (grid, class table reads)."""
    spec = importlib.util.spec_from_file_location("ci_compile_check", ROOT / "ci" / "compile_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ci_compile_check"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cc():
    return _cc()


def _run(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---- the variant grid and the exclusions (pure) --------------------------------------------

def test_grid_meets_its_coverage_promise(cc):
    assert cc.grid_gaps() == []
    assert len({(r.dtype, r.geometry) for r in cc.GRID}) == len(cc.GRID), "duplicate rows compile nothing new"


def test_grid_gaps_names_what_a_thinner_grid_misses(cc):
    without_last = cc.grid_gaps(cc.GRID[:-1])  # drops e4m3 x mla-576
    assert "dtype e4m3 in fewer than 2 rows" in without_last
    assert "geometry mla-576 lacks a fp8 row" in without_last
    same_switches = [r for r in cc.GRID if r.softcap_sinks == r.lse]
    assert any(g.startswith("no row with lse=") for g in cc.grid_gaps(same_switches))


def _fp8_mma_entry(cc, caps_say: bool = True):
    """A kernel entry whose Capabilities (only) say it runs fp8 x fp8 MMAs."""
    caps = type("Caps", (), dict(kv_dtypes=frozenset({"bf16", "e4m3"}), mla=True, softcap=True, sinks=True,
                                 fp8_mma=caps_say))()
    return cc.KernelEntry("planted_fp8_mma", caps, launch=None)


def test_fp8_mma_exclusion_follows_capabilities_and_the_class_table(cc):
    entry = _fp8_mma_entry(cc)
    fp8_row = next(r for r in cc.GRID if r.dtype == "e4m3")
    reasons = {t: cc.exclusion(entry, fp8_row, t) for t in cc.TARGETS}
    assert "fp8_tensor_cores = false" in reasons.pop("sm_80")
    assert reasons == {t: None for t in reasons}, reasons
    # The rule reads the table: a class marked without fp8 tensor cores loses the variant.
    planted = dict(cc.gpu_classes(), sm_90=dict(cc.gpu_classes()["sm_90"], fp8_tensor_cores=False))
    assert "class sm_90 has no fp8 tensor cores" in cc.exclusion(entry, fp8_row, "sm_90", planted)
    # ... and the kernel's Capabilities: the same kernel not declaring fp8 MMAs keeps sm_80.
    assert cc.exclusion(_fp8_mma_entry(cc, caps_say=False), fp8_row, "sm_80") is None
    bf16_row = next(r for r in cc.GRID if r.dtype == "bf16")
    assert cc.exclusion(entry, bf16_row, "sm_80") is None, "16-bit caches run no fp8 MMA: nothing to exclude"


def test_host_code_decides_as_on_the_target(cc):
    import torch
    from decode_conformance_kernels import triton_common as tc
    if not hasattr(tc, "fp8_mma_code"):
        pytest.skip("triton_common.fp8_mma_code does not exist in this checkout")
    cache = torch.zeros(2, 16, 1, 64, dtype=torch.float8_e4m3fn)
    bits = {t: cc.on_target(tc.kv_operand, t)(cache) for t in cc.TARGETS}
    assert [t for t, (_, b) in bits.items() if b] == ["sm_80"], "e4m3 as bytes only where Triton lacks e4m3"
    assert bits["sm_80"][0].dtype == torch.uint8 and bits["sm_90"][0] is cache
    code = {t: cc.on_target(tc.fp8_mma_code, t)(cache, True) for t in cc.TARGETS if t != "sm_80"}
    assert code["gfx942"] != code["gfx950"] == code["sm_90"] != 0, code  # FNUZ form on gfx942 only
    with pytest.raises(ValueError):
        cc.on_target(tc.fp8_mma_code, "sm_80")(cache, True)
    assert torch.version.hip is None and tc.kv_operand(cache)[1] is False, "the emulation must not outlive the call"


def test_every_target_is_a_gpu_class(cc):
    classes = cc.gpu_classes()
    assert set(cc.TARGETS) <= set(classes), f"targets missing from fixtures/gpu_classes.toml: {set(cc.TARGETS) - set(classes)}"
    assert {"sm_80", "sm_90", "sm_100", "sm_120", "gfx942", "gfx950"} <= set(cc.TARGETS)


# ---- planted kernels through the real compiler (one child process) -------------------------

PLANTED = textwrap.dedent('''
    import importlib.util, json, sys, types, torch
    spec = importlib.util.spec_from_file_location("cc", "ci/compile_check.py")
    cc = importlib.util.module_from_spec(spec); sys.modules["cc"] = cc; spec.loader.exec_module(cc)
    import triton, triton.language as tl

    @triton.jit
    def early_exit(x_ptr, n):
        for i in range(n):
            if tl.load(x_ptr + i) > 0:
                return  # the interpreter runs this; every GPU compiler rejects it
            tl.store(x_ptr + i, 1.0)

    @triton.jit
    def ptx_asm(x_ptr):
        r = tl.arange(0, 128)
        y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [tl.load(x_ptr + r)], dtype=tl.int32,
                                      is_pure=True, pack=1)  # PTX: NVIDIA assembles it, AMD cannot
        tl.store(x_ptr + r, y)

    @triton.jit
    def cache_dot(k_ptr, out_ptr):  # an MMA on the cache's own dtype: fp8 x fp8 for fp8 caches
        r = tl.arange(0, 32)
        a = tl.load(k_ptr + r[:, None] * 32 + r[None, :])
        tl.store(out_ptr + r[:, None] * 32 + r[None, :], tl.dot(a, a))

    caps = types.SimpleNamespace(kv_dtypes=frozenset({"e4m3"}), mla=True, softcap=False, sinks=False)
    def entry(name, launch, **kw):
        return cc.KernelEntry(name, caps, launch, **kw)
    def run(entries, targets):
        rows, excluded = cc.compile_all(targets, entries=entries, log=lambda *a: None)
        return dict(rows=[{k: r[k] for k in ("target", "kernel", "status", "error", "shared", "regs", "mma", "note",
                                            "variants")}
                          for r in rows], excluded=excluded)

    x = torch.zeros(128, dtype=torch.int32)
    dot = lambda i, t: cache_dot[(1,)](i.k, torch.zeros(32, 32))
    out = {}
    out["loop_return"] = run([entry("early_exit", lambda i, t: early_exit[(1,)](torch.zeros(8), 8))], ["sm_90"])
    out["ptx"] = run([entry("ptx_asm", lambda i, t: ptx_asm[(1,)](x))], ["sm_90", "gfx942"])
    out["fp8_mma"] = run([entry("fp8_mma", dot, fp8_mma=True)], ["sm_80", "sm_120", "gfx942"])
    out["fp8_mma_unguarded"] = run([entry("fp8_mma_unguarded", dot)], ["sm_80"])
    cc.TARGETS["sm_90"] = cc.Target(cc.TARGETS["sm_90"].gpu, 1024)
    out["smem"] = run([entry("small_smem", dot)], ["sm_90"])
    cc.KNOWN_FAILURES[("known_ok", "cache_dot", "e4m3", "sm_120")] = ("fp8e4nv not supported", "planted")
    cc.KNOWN_FAILURES[("known_bad", "cache_dot", "e4m3", "sm_80")] = ("fp8e4nv not supported", "planted")
    out["known"] = {"rows": run([entry("known_ok", dot)], ["sm_120"])["rows"] + run([entry("known_bad", dot)], ["sm_80"])["rows"]}
    cc.kernel_entries = lambda: [entry("early_exit", lambda i, t: early_exit[(1,)](torch.zeros(8), 8))]
    out["main_rc"] = cc.main(["--targets", "sm_120", "--jobs", "1"])
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    script = tmp_path_factory.mktemp("planted") / "planted.py"
    script.write_text(PLANTED)
    p = _run(str(script), timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _status(result):
    return {r["target"]: r["status"] for r in result["rows"]}


def test_return_inside_a_loop_fails_the_check(planted):
    (row,) = planted["loop_return"]["rows"]
    assert row["status"] == "fail" and "return" in row["error"].lower(), row
    assert planted["main_rc"] == 1, "a failing variant must make the command exit non-zero"


def test_construct_only_amd_rejects_fails_only_there(planted):
    assert _status(planted["ptx"]) == {"sm_90": "ok", "gfx942": "fail"}, planted["ptx"]
    amd = next(r for r in planted["ptx"]["rows"] if r["target"] == "gfx942")
    assert "AMD assembler rejected" in amd["error"], amd["error"]


def test_fp8_mma_is_excluded_below_sm89_and_noted_where_it_is_emulated(planted):
    res = planted["fp8_mma"]
    assert _status(res) == {"sm_120": "ok", "gfx942": "ok"}, res
    assert any(t == "sm_80" and "fp8_tensor_cores = false" in why for t, _, _, why in res["excluded"]), res["excluded"]
    rows = {r["target"]: r for r in res["rows"]}
    assert "mma:e4m3" in rows["sm_120"]["mma"] and rows["sm_120"]["note"] == ""
    # gfx942's matrix cores take FNUZ fp8: an OCP e4m3 dot is lowered to 16-bit MFMAs, and noted.
    assert rows["gfx942"]["note"].startswith("fp8 MMA requested, compiled to mfma:f16"), rows["gfx942"]
    # The exclusion is load-bearing: the same kernel without it does not build on sm_80.
    (row,) = planted["fp8_mma_unguarded"]["rows"]
    assert row["status"] == "fail" and "fp8e4nv not supported" in row["error"], row


def test_shared_memory_over_the_limit_fails(planted):
    (row,) = planted["smem"]["rows"]
    assert row["status"] == "fail" and row["shared"] > 1024 and "> 1024 bytes" in row["error"], row


def test_known_failures_must_keep_failing(planted):
    got = {(r["kernel"], r["target"]): r for r in planted["known"]["rows"]}
    assert got[("known_bad", "sm_80")]["status"] == "known"
    assert got[("known_ok", "sm_120")]["status"] == "fail"
    assert "compiled: remove the entry" in got[("known_ok", "sm_120")]["error"]


# ---- the shipped kernels (good input) ------------------------------------------------------

def test_shipped_fp8_mma_and_lean_kernels_across_targets(tmp_path, cc):
    """sm_80: the fp8-MMA kernel excluded, lean's e4m3 variants built through the byte path; gfx942:
    the fp8-MMA kernel's dots reach the FNUZ fp8 matrix instructions; resources reported."""
    report = tmp_path / "cc"
    p = _run("ci/compile_check.py", "--kernels", "adaptive_split_fp8mma", "lean", "--targets", "sm_80", "gfx942",
             "--report", str(report))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(report.with_suffix(".json").read_text())
    rows = data["rows"]
    fp8 = [r for r in rows if r["kernel"] == "adaptive_split_fp8mma"]
    if not fp8:
        pytest.skip("decode_attention_adaptive has no fp8_mma flag in this checkout")
    assert {r["target"] for r in fp8} == {"gfx942"}
    assert any(t == "sm_80" and k == "adaptive_split_fp8mma" and "fp8_tensor_cores" in why
               for t, k, _, why in data["excluded"])
    stage1 = [r for r in fp8 if r["fn"] == "_adaptive_stage1"]
    assert stage1 and all(r["status"] == "ok" and ("fp8_fp8" in r["mma"] or "bf8_bf8" in r["mma"]) for r in stage1), stage1
    lean = [r for r in rows if r["kernel"] == "lean" and r["fn"] == "lean_decode_kernel"]
    # lean's e4m3 variants on sm_80 (no fp8 hardware) once failed here; lean now loads e4m3 as bytes
    # and widens them in registers, so every lean row must build, sm_80's e4m3 included.
    assert any(r["target"] == "sm_80" and any(v.startswith("lean e4m3") for v in r["variants"]) for r in lean)
    assert all(r["status"] == "ok" and r["regs"] and 0 < r["shared"] <= r["smem_limit"] for r in lean), \
        [r for r in lean if r["status"] != "ok"]
    labels = {v for r in lean if r["target"] == "gfx942" for v in r["variants"]}
    assert len(labels) == len(cc.GRID), f"gfx942: {len(labels)} of {len(cc.GRID)} grid rows compiled for lean"
    assert "| target | kernel | function |" in report.with_suffix(".md").read_text()


def test_stage2_is_a_programmatic_dependent_launch_only_where_the_gpu_has_one(tmp_path):
    """sm_90+: stage 1 lets stage 2 launch early (griddepcontrol.launch_dependents) and every
    stage-2 program waits for stage 1 (griddepcontrol.wait) - a stage 2 without the wait would
    read partials stage 1 has not written. sm_80 and AMD have no such launch: neither is emitted."""
    report = tmp_path / "cc"
    p = _run("ci/compile_check.py", "--kernels", "adaptive_split", "--targets", "sm_90", "sm_80", "gfx942",
             "--report", str(report))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(report.with_suffix(".json").read_text())["rows"]
    got: dict = {}
    for r in rows:
        got.setdefault((r["target"], r["fn"]), set()).add(r["griddep"])
    assert got[("sm_90", "_adaptive_stage1")] == {"launch_dependents"}
    assert got[("sm_90", "_adaptive_stage2")] == {"wait"}
    for target in ("sm_80", "gfx942"):
        assert got[(target, "_adaptive_stage1")] == got[(target, "_adaptive_stage2")] == {""}, target

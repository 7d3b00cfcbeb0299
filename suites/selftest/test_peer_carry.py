"""benchmarks/peer_carry.py, the folder GPU runs carry for the peers: the flashinfer repack on a
wheel built here (which members stay, the RECORD pip reads, an install by pip itself), the
stand-ins for vLLM's and sglang's modules, imported the way their kernel files import them, and
env.sh, sourced with a stand-in CUDA_HOME. The real wheels need a network; the tool's own last
step imports the real kernel files."""
from __future__ import annotations

import base64
import hashlib
import os
import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import peer_carry  # noqa: E402

DIST = "flashinfer_python-0.7.2.post1.dist-info/"
KEPT = {
    DIST + "METADATA", DIST + "WHEEL",
    "flashinfer/__init__.py", "flashinfer/decode.py", "flashinfer/jit/tables.json",
    "flashinfer/data/csrc/batch_decode.cu",  # the CUDA-core decode module
    "flashinfer/data/csrc/batch_mla_sm90_run.cu",  # fa3 MLA
    "flashinfer/data/include/flashinfer/attention/hopper/mainloop.cuh",
    "flashinfer/data/cutlass/include/cute/tensor.hpp",
    "flashinfer/data/cccl/cub/cub/cub.cuh",
    "flashinfer/experimental/__init__.py",
    "flashinfer/experimental/cake_nvfp4_per_token/support.py",  # gemm_base imports it
}
DROPPED = {
    "flashinfer/data/csrc/cutlass_mla.cu",  # a kernel no adapter builds
    "flashinfer/data/cutlass/examples/00_basic_gemm/basic_gemm.cu",
    "flashinfer/data/cutlass/python/CuTeDSL/base.py",
    "flashinfer/data/cccl/cub/test/test_util.h",
    "flashinfer/experimental/b12x/kernels.py",
    "flashinfer/experimental/cake_nvfp4_per_token/cake_backend.py",
    "flashinfer/moe_ep/core/dispatch.py",
    "b12x/__init__.py",  # a top-level shim beside the package
    "build_backend.py",
}


def _wheel(path: pathlib.Path) -> dict[str, bytes]:
    members = {name: f"# {name}\n".encode() for name in sorted(KEPT | DROPPED)}
    members[DIST + "METADATA"] = b"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.7.2.post1\n"
    members[DIST + "WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(DIST + "RECORD", "stale,sha256=x,1\n")
    return members


def test_repack_keeps_what_the_adapters_build_and_records_it(tmp_path):
    members = _wheel(tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl")
    out = peer_carry.repack(tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl", tmp_path / "whl")
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        record = z.read(DIST + "RECORD").decode().splitlines()
    assert names == KEPT | {DIST + "RECORD"}, (sorted(names - KEPT), sorted(KEPT - names))
    expected = []
    for name in sorted(KEPT):
        digest = base64.urlsafe_b64encode(hashlib.sha256(members[name]).digest()).rstrip(b"=").decode()
        expected.append(f"{name},sha256={digest},{len(members[name])}")
    assert sorted(record) == sorted(expected + [DIST + "RECORD,,"])


def test_prebuilt_modules_go_where_flashinfer_loads_them_and_into_the_record(tmp_path):
    """--aot's modules: members under flashinfer/data/aot/<module>/<module>.so (the folder
    flashinfer/jit/env.py looks in before compiling), hashed in RECORD, installed by pip."""
    _wheel(tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl")
    name = "batch_decode_with_kv_cache_test"
    extra = {f"flashinfer/data/aot/{name}/{name}.so": b"\x7fELF not really"}
    out = peer_carry.repack(tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl", tmp_path / "whl",
                            extra=extra)
    with zipfile.ZipFile(out) as z:
        record = z.read(DIST + "RECORD").decode().splitlines()
        assert z.read(f"flashinfer/data/aot/{name}/{name}.so") == b"\x7fELF not really"
    data = b"\x7fELF not really"
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert f"flashinfer/data/aot/{name}/{name}.so,sha256={digest},{len(data)}" in record
    run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--target", str(tmp_path / "site"), str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "flashinfer" / "data" / "aot" / name / f"{name}.so").is_file()


def test_pip_installs_the_repacked_wheel(tmp_path):
    _wheel(tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl")
    out = peer_carry.repack(tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl", tmp_path / "whl")
    run = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--target", str(tmp_path / "site"), str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    installed = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("*") if p.is_file()}
    assert {n for n in KEPT if not n.startswith(DIST)} <= installed
    assert not {n for n in DROPPED} & installed


STAND_IN_CHECK = """
import torch, triton
import vllm.envs, vllm.logger, vllm.platforms, vllm.triton_utils, vllm.v1.kv_cache_interface as kv
import sglang.srt.environ as environ, sglang.srt.utils as utils
from decode_conformance_kernels.adapters import vllm_unified
from decode_conformance_kernels.adapters.library import library_version
assert vllm.envs.VLLM_BATCH_INVARIANT is False
vllm.logger.init_logger("x").debug_once("once")
assert vllm.platforms.current_platform.fp8_dtype() is torch.float8_e4m3fn
assert vllm.platforms.current_platform.is_device_capability_family(100) is False  # no GPU here
assert vllm.triton_utils.triton is triton and vllm.triton_utils.tl is triton.language
assert kv.KVQuantMode.NONE == 0 and kv.KVQuantMode.FP8_PER_TENSOR == vllm_unified.FP8_PER_TENSOR
assert environ.envs.SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS.get() is False
assert environ.envs.SGLANG_MLA_DECODE_TUNE.get() is False
assert environ.envs.SGLANG_FORCE_LEAN_GRID_CU_MULT.get() == 1.0
assert utils.is_hip() is False and utils.get_device_core_count(0) == 0
assert not utils.is_gfx95_supported() and not utils.is_gfx1250_supported()
assert library_version("vllm") == {vllm!r} and library_version("sglang") == {sglang!r}
print("stand-ins ok")
"""


def test_stand_ins_answer_as_the_kernel_files_expect(tmp_path):
    peer_carry.write_stand_ins(tmp_path)
    code = STAND_IN_CHECK.format(vllm=peer_carry.VLLM, sglang=peer_carry.SGLANG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "CUDA_VISIBLE_DEVICES": ""}
    code = "from decode_conformance import _paths; _paths.alias_checkout()\n" + code
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0 and "stand-ins ok" in run.stdout, run.stdout + run.stderr


def test_env_sh_installs_the_wheels_and_sets_what_flashinfer_needs(tmp_path):
    """The script a GPU run sources, run here with its folders moved under tmp_path and a stand-in
    CUDA_HOME: the wheels importable, site/ on the path, flashinfer's link folder and settings."""
    folder = tmp_path / "peers"
    _wheel(tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl")
    peer_carry.repack(tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl", folder / "whl")
    peer_carry.write_stand_ins(folder / "site")
    (folder / "env.sh").write_text(peer_carry.env_sh())
    cuda = tmp_path / "cuda"
    for lib in ("lib64/libcudart.so", "lib64/stubs/libcuda.so"):
        (cuda / lib).parent.mkdir(parents=True, exist_ok=True)
        (cuda / lib).write_text("")
    script = ('source "$1" || exit 9; python3 -c "import flashinfer.decode, vllm.envs, sglang.srt.environ"'
              ' && echo "$FLASHINFER_EXTRA_LDFLAGS|$FLASHINFER_CUDA_ARCH_LIST|$FLASHINFER_WORKSPACE_BASE|$MAX_JOBS"')
    env = {**os.environ, "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "CUDA_HOME": str(cuda), "PEERS_SITE": str(tmp_path / "installed"), "PEERS_LD": str(tmp_path / "ld")}
    env.pop("PYTHONPATH", None)
    run = subprocess.run(["bash", "-c", script, "env.sh", str(folder / "env.sh")], capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    ld, arch, workspace, jobs = run.stdout.strip().splitlines()[-1].split("|")
    assert (ld, arch, workspace) == (f"-L{tmp_path / 'ld'}", "9.0a", "/tmp/fi-ws") and int(jobs) >= 1
    assert (tmp_path / "ld" / "libcudart.so").resolve() == (cuda / "lib64/libcudart.so").resolve()
    assert (tmp_path / "ld" / "libcuda.so").resolve() == (cuda / "lib64/stubs/libcuda.so").resolve()


def test_aot_without_a_cuda_toolkit_says_what_is_missing(tmp_path, monkeypatch):
    """--aot on a machine without nvcc stops before installing anything, naming CUDA_HOME and nvcc."""
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    try:
        peer_carry.build_aot(tmp_path / "flashinfer.whl", tmp_path / "downloads", tmp_path / "work")
    except SystemExit as e:
        message = str(e)
    else:
        raise AssertionError("build_aot ran without nvcc")
    assert f"no nvcc at {tmp_path / 'no-cuda'}/bin/nvcc" in message and "CUDA_HOME" in message
    assert not (tmp_path / "work").exists() and not (tmp_path / "downloads").exists()

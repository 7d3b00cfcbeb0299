"""The peers for a GPU machine without network: build the folder a run carries there.

The peer tables and the adapters' conformance matrices ran flashinfer, vLLM and sglang on lent
GPU machines that reach no package index and take at most 64 MiB of files a call. This builds,
in a git-ignored folder of the checkout (their code is never committed here):

- `whl/`: flashinfer-python's wheel repacked with what `import flashinfer` and the modules our
  adapters build need (the released wheel is 62 MB, most of it CUDA sources of kernels the
  adapters never compile; repacked, about 17 MiB), and apache-tvm-ffi's wheel, the one import
  the GPU image lacked;
- `site/`: vLLM's and sglang's Triton decode kernels, the files unmodified from their released
  wheels, beside stand-ins for the few `vllm.*` / `sglang.*` modules those files import and a
  `dist-info` so the adapters report the version;
- `env.sh`: sourced on the GPU machine (bash), it installs the wheels under
  /tmp/site and exports PYTHONPATH and the settings flashinfer's JIT compiler needs.

    python benchmarks/peer_carry.py .carry/peers [--downloads DIR] [--aot]   # here (network: pip download)
    source .carry/peers/env.sh                                               # there, before the run

`--aot` compiles, here and ahead, the flashinfer modules the peer table's cells use
(`AOT_MODULES`, for sm_90a; it needs nvcc under CUDA_HOME, no GPU) and ships them in the
repacked wheel under flashinfer/data/aot/<module>/<module>.so, which flashinfer loads as it
loads its own prebuilt kernels instead of compiling them (flashinfer/jit/env.py,
`get_aot_artifacts`; a module that fails to load there is compiled as before). That takes the
JIT compilation off the lent machine's clock (about 5 minutes on 2 cores here); any other
module, say the conformance matrix's window and soft-cap variants, still compiles on first use.

The versions are the ones the recorded runs used (docs/gpu-runs/README.md). A newer release may
import more of its library: the last step imports both kernel files under the stand-ins and
names any module or name that is missing.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

FLASHINFER = "0.7.2.post1"
TVM_FFI = "0.1.15.post2"
VLLM = "0.33.0"
SGLANG = "0.5.23"

# The device's interpreter: wheels are fetched for it, not for the machine that builds the folder.
PIP_TARGET = ["--only-binary=:all:", "--no-deps", "--python-version", "3.12", "--implementation", "cp"] + [
    a for tag in ("manylinux_2_17", "manylinux_2_24", "manylinux_2_28", "manylinux_2_31", "manylinux_2_34")
    for a in ("--platform", f"{tag}_x86_64")]  # sglang 0.5.23 is tagged manylinux_2_34 only

# flashinfer's CUDA sources (flashinfer/data/csrc/) that the JIT modules of our adapters compile.
CSRC = {
    # CUDA-core paged decode (BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=False)
    "batch_decode.cu", "batch_decode_jit_binding.cu", "batch_decode_customize_config.jinja",
    "batch_decode_kernel_inst.jinja",
    # the tensor-core decode runs flashinfer's batch prefill module
    "batch_prefill.cu", "batch_prefill_jit_binding.cu", "batch_prefill_customize_config.jinja",
    "batch_prefill_paged_kernel_inst.jinja", "batch_prefill_ragged_kernel_inst.jinja",
    "batch_prefill_paged.cu", "batch_prefill_paged.cuh", "batch_prefill_paged_jit_binding.cu",
    # BatchMLAPagedAttentionWrapper: fa2, and fa3 (sm_90, which also needs cutlass's headers)
    "batch_mla_config.jinja", "batch_mla_plan.cu", "batch_mla_run.cu", "batch_mla_binding.cu",
    "batch_mla_sm90_plan.cu", "batch_mla_sm90_run.cu", "batch_mla_sm90_binding.cu",
    # single decode, page, cascade (merge state) and norm modules, and their shared headers
    "single_decode.cu", "single_decode_jit_binding.cu", "single_decode_customize_config.jinja",
    "single_decode_kernel_inst.jinja", "page.cu", "flashinfer_page_binding.cu", "cascade.cu",
    "flashinfer_cascade_binding.cu", "norm.cu", "flashinfer_norm_binding.cu", "tvm_ffi_utils.h",
    "runtime_utils.h",
}
HEADER_TREES = ("include/", "cccl/libcudacxx/include/", "cccl/cub/cub/", "cccl/thrust/thrust/",
                "cutlass/include/")  # under flashinfer/data/: what the kept sources reach through #include
PYTHON_FILES = (".py", ".pyi", ".json", "py.typed")  # .json: tables some modules read lazily
# Of flashinfer/experimental/ (and moe_ep/, which only experimental code imports), what
# `import flashinfer` reaches at module level: gemm/gemm_base.py imports one support module.
EXPERIMENTAL_IMPORTED = {"flashinfer/experimental/__init__.py",
                         "flashinfer/experimental/cake_nvfp4_per_token/__init__.py",
                         "flashinfer/experimental/cake_nvfp4_per_token/support.py"}

# flashinfer's JIT modules that the peer table's flashinfer rows load on its cells
# (fixtures/perf_cells.toml, benchmarks/target_cells.toml): bf16 queries, bf16 or e4m3 caches, head
# dims 128 and 256 (the CUDA-core decode, and the tensor-core decode, which loads the fa2 batch
# prefill's primary module: K and V of equal strides), and the 576 = 512 + 64 MLA head in both
# backends. As (generator, its arguments): dtypes by torch name, position encoding 0 (none), no
# sliding window, no soft cap, no fp16 QK reduction, no profiler. The prefill generator is
# flashinfer's private one, the one its BatchPrefill path calls for fa2 (flashinfer/prefill.py,
# get_batch_prefill_module, in 0.7.2.post1). Checked in session 45 on a CPU: each adapter's plan()
# on each of those cells loaded its module from the wheel and compiled none.
_MODULES = "flashinfer.jit.attention.modules:"
AOT_MODULES = tuple(
    [(_MODULES + "gen_batch_decode_module", ("bfloat16", kv, "bfloat16", "int32", d, d, 0, False, False))
     for kv, d in (("bfloat16", 128), ("bfloat16", 256), ("float8_e4m3fn", 128))]
    + [(_MODULES + "_gen_batch_prefill_primary_module",
        ("fa2", "bfloat16", kv, "bfloat16", "int32", d, d, 0, False, False, False))
       for kv, d in (("bfloat16", 128), ("bfloat16", 256), ("float8_e4m3fn", 128))]
    + [(_MODULES + "gen_batch_mla_module", (backend, "bfloat16", "bfloat16", "bfloat16", "int32", 512, 64, False))
       for backend in ("fa2", "fa3")])
AOT_ARCH = "9.0a"  # Hopper (H100, H200), the lent machines' class
# flashinfer's own imports beyond torch, for the build here (the GPU image has them)
AOT_HOST_DEPS = ("requests", "tqdm", "nvidia-ml-py")

VLLM_FILES = ("vllm/v1/attention/ops/triton_unified_attention.py",
              "vllm/v1/attention/ops/triton_attention_helpers.py")
SGLANG_FILES = ("sglang/kernels/ops/attention/decode_attention.py",
                "sglang/kernels/ops/attention/score_mod.py")

# What the kernel files import from their libraries, and what a standalone run needs of it:
# vLLM's batch-invariance switch off, its logger, its platform's fp8 type and device family,
# triton as vLLM re-exports it and its KV quantization modes (values as in vllm 0.33.0's
# vllm/v1/kv_cache_interface.py); sglang's three environment settings at their defaults and its
# device queries (a CUDA GPU: not ROCm, none of AMD's gfx targets).
STAND_INS = {
    "vllm/__init__.py": f'__version__ = "{VLLM}"\n',
    "vllm/v1/__init__.py": "", "vllm/v1/attention/__init__.py": "", "vllm/v1/attention/ops/__init__.py": "",
    "vllm/envs.py": "VLLM_BATCH_INVARIANT = False\n",
    "vllm/logger.py": '''import logging


def init_logger(name):
    log = logging.getLogger(name)
    for level in ("debug", "info", "warning"):
        setattr(log, level + "_once", getattr(log, level))
    return log
''',
    "vllm/platforms/__init__.py": '''import torch


class _Platform:
    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def is_device_capability_family(self, family, device_id=0):
        if not torch.cuda.is_available():
            return False
        major, _ = torch.cuda.get_device_capability(device_id)
        return major == family // 10


current_platform = _Platform()
''',
    "vllm/triton_utils/__init__.py": "import triton\nimport triton.language as tl\n",
    "vllm/v1/kv_cache_interface.py": '''from enum import IntEnum


class KVQuantMode(IntEnum):
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5
    TURBOQUANT_K8V4 = 6
''',
    "sglang/__init__.py": f'__version__ = "{SGLANG}"\n',
    "sglang/kernels/__init__.py": "", "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/attention/__init__.py": "", "sglang/srt/__init__.py": "",
    "sglang/srt/environ.py": '''class _Setting:
    def __init__(self, value):
        self._value = value

    def get(self):
        return self._value


class _Envs:
    SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS = _Setting(False)
    SGLANG_MLA_DECODE_TUNE = _Setting(False)
    SGLANG_FORCE_LEAN_GRID_CU_MULT = _Setting(1.0)


envs = _Envs()
''',
    "sglang/srt/utils.py": '''import torch


def is_hip():
    return torch.version.hip is not None


def is_gfx95_supported():
    return False


def is_gfx1250_supported():
    return False


def get_device_core_count(device_id=0):
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return 0
''',
    f"vllm-{VLLM}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM}\n",
    f"sglang-{SGLANG}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: sglang\nVersion: {SGLANG}\n",
}

ENV_SH = '''# source on the GPU machine (bash), before anything imports the peers
_peers=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_site=${PEERS_SITE:-/tmp/site} _ld=${PEERS_LD:-/tmp/fi-ld}   # where the wheels go, and flashinfer's link folder
python3 -m pip install -q --no-index --no-deps --no-compile --target "$_site" "$_peers"/whl/*.whl || return 1
export PYTHONPATH=$_site:$_peers/site${PYTHONPATH:+:$PYTHONPATH}   # the suite's isolated workers inherit it
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-@AOT_ARCH@} MAX_JOBS=${MAX_JOBS:-$(nproc)}
# flashinfer links its modules against libcudart and libcuda; the image has the latter among the stubs only
mkdir -p "$_ld" && ln -sf "$CUDA_HOME"/lib64/libcudart.so "$CUDA_HOME"/lib64/stubs/libcuda.so "$_ld"/ || return 1
export FLASHINFER_EXTRA_LDFLAGS=-L$_ld
'''


def env_sh() -> str:
    """env.sh's text, its default arch the one --aot compiles for: a module built for another arch
    than the JIT's is not loaded from the wheel but compiled on the GPU machine."""
    return ENV_SH.replace("@AOT_ARCH@", AOT_ARCH)


def keep_in_flashinfer(name: str) -> bool:
    """Whether the repacked flashinfer wheel keeps the archive member `name`."""
    if name.endswith("/"):
        return False
    if ".dist-info/" in name:
        return not name.endswith("/RECORD")  # written anew for the kept files
    if not name.startswith("flashinfer/"):
        return False
    if name.startswith("flashinfer/data/"):
        rest = name[len("flashinfer/data/"):]
        if rest.startswith("csrc/"):
            return rest[len("csrc/"):] in CSRC
        return rest.startswith(HEADER_TREES)
    if name.startswith(("flashinfer/experimental/", "flashinfer/moe_ep/")):
        return name in EXPERIMENTAL_IMPORTED
    return name.endswith(PYTHON_FILES)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(wheel: pathlib.Path, out_dir: pathlib.Path, keep=keep_in_flashinfer, extra=None) -> pathlib.Path:
    """A copy of `wheel` in `out_dir` holding the members `keep` accepts and the `extra` ones
    ({member name: bytes}), with a RECORD that lists exactly those (pip reads it to know what it
    installed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / wheel.name
    records, record_name = [], None
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
        for info in src.infolist():
            if info.filename.endswith(".dist-info/RECORD"):
                record_name = info.filename
            if not keep(info.filename):
                continue
            data = src.read(info)
            out.writestr(info, data, zipfile.ZIP_DEFLATED)
            records.append(record_line(info.filename, data))
        for name, data in sorted((extra or {}).items()):
            out.writestr(name, data, zipfile.ZIP_DEFLATED)
            records.append(record_line(name, data))
        if record_name is None:
            raise SystemExit(f"{wheel}: no .dist-info/RECORD; expected a wheel")
        records.append(f"{record_name},,")
        out.writestr(record_name, "\n".join(records) + "\n", zipfile.ZIP_DEFLATED)
    return dst


def extract(wheel: pathlib.Path, members, site: pathlib.Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for m in members:
            if m not in names:
                raise SystemExit(f"{wheel.name}: no {m}; this version keeps its kernel elsewhere")
            (site / m).parent.mkdir(parents=True, exist_ok=True)
            (site / m).write_bytes(z.read(m))


def write_stand_ins(site: pathlib.Path) -> None:
    for rel, text in STAND_INS.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)


def download(spec: str, into: pathlib.Path, for_device: bool = True) -> pathlib.Path:
    """The wheel of `spec` (name==version) in `into`, downloaded once: for the device's
    interpreter, or with for_device=False for this one (keep those in a folder of their own)."""
    name, version = spec.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(into.glob(stem + "*.whl"))
    if not found:
        target = PIP_TARGET if for_device else ["--only-binary=:all:", "--no-deps"]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", *target, "-d", str(into), spec], check=True)
        found = sorted(into.glob(stem + "*.whl"))
    if not found:
        raise SystemExit(f"pip download {spec}: no wheel named {stem}*.whl in {into}")
    return found[0]


AOT_BUILD = """
import json, pkgutil, sys, torch
for gen, args in json.loads(sys.argv[1]):
    args = [getattr(torch, a) if isinstance(a, str) and hasattr(torch, a) else a for a in args]
    spec = pkgutil.resolve_name(gen)(*args)
    spec.build(verbose=False)
    print(json.dumps({"name": spec.name, "so": str(spec.jit_library_path)}), flush=True)
"""


def build_aot(slim: pathlib.Path, downloads: pathlib.Path, work: pathlib.Path) -> dict[str, bytes]:
    """Compile AOT_MODULES with the repacked flashinfer installed for this interpreter (torch
    must be importable here); {wheel member: the module's .so}."""
    cuda = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if not (cuda / "bin" / "nvcc").exists():
        raise SystemExit(f"--aot: no nvcc at {cuda}/bin/nvcc; set CUDA_HOME to a CUDA toolkit (no GPU needed)")
    site = work / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(site)]
    subprocess.run(pip + ["--no-deps", str(slim), str(download(f"apache-tvm-ffi=={TVM_FFI}", downloads / "this-host",
                                                                for_device=False))], check=True)
    subprocess.run(pip + list(AOT_HOST_DEPS), check=True)
    env = {**os.environ, "PYTHONPATH": str(site), "CUDA_HOME": str(cuda), "FLASHINFER_WORKSPACE_BASE": str(work),
           "FLASHINFER_CUDA_ARCH_LIST": AOT_ARCH, "MAX_JOBS": str(os.cpu_count() or 1)}
    # flashinfer links its modules with -L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda.
    # A toolkit without the stubs gets an empty libcuda to link against: the symbols resolve at
    # load time, against the GPU machine's driver.
    if not (cuda / "lib64" / "stubs" / "libcuda.so").exists():
        ld = work / "ld"
        ld.mkdir()
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(ld / "libcuda.so"),
                        "-x", "c", "/dev/null"], check=True)
        env["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{ld}"
    run = subprocess.run([sys.executable, "-c", AOT_BUILD, json.dumps(AOT_MODULES)], env=env, capture_output=True,
                         text=True)
    built = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode or len(built) != len(AOT_MODULES):
        raise SystemExit(f"--aot: built {len(built)} of {len(AOT_MODULES)} modules:\n{run.stderr[-3000:]}")
    return {f"flashinfer/data/aot/{m['name']}/{m['name']}.so": pathlib.Path(m["so"]).read_bytes() for m in built}


def check_imports(site: pathlib.Path) -> int:
    """Import both kernel files under the stand-ins, where torch and triton are installed."""
    code = ("import importlib.util, sys\n"
            "if not (importlib.util.find_spec('torch') and importlib.util.find_spec('triton')):\n"
            "    print('torch or triton missing here: the imports are checked on the GPU machine'); sys.exit(0)\n"
            "import vllm.v1.attention.ops.triton_unified_attention as v\n"
            "import sglang.kernels.ops.attention.decode_attention as s\n"
            "print('imports:', v.unified_attention.__module__, s.decode_attention_fwd.__module__)\n")
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True)
    print((run.stdout + run.stderr).strip()[-2000:])
    return run.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=pathlib.Path, help="where to build it (git-ignored, e.g. .carry/peers)")
    ap.add_argument("--downloads", type=pathlib.Path, default=None,
                    help="where the released wheels are kept (default: FOLDER/../peer-wheels)")
    ap.add_argument("--aot", action="store_true",
                    help="compile the peer table's flashinfer modules here and ship them in the wheel (needs nvcc)")
    a = ap.parse_args(argv)
    downloads = a.downloads or a.folder.parent / "peer-wheels"
    downloads.mkdir(parents=True, exist_ok=True)
    for sub in ("whl", "site"):
        shutil.rmtree(a.folder / sub, ignore_errors=True)
    whl, site = a.folder / "whl", a.folder / "site"
    released = download(f"flashinfer-python=={FLASHINFER}", downloads)
    slim = repack(released, whl)
    if a.aot:
        with tempfile.TemporaryDirectory(prefix="peer-aot-") as work:  # the install, sources and objects: ~190 MiB
            built = build_aot(slim, downloads, pathlib.Path(work))
        slim = repack(released, whl, extra=built)
        print(f"--aot: {len(built)} modules in the wheel, {sum(map(len, built.values())) / 2**20:.1f} MiB")
    shutil.copy2(download(f"apache-tvm-ffi=={TVM_FFI}", downloads), whl)
    extract(download(f"vllm=={VLLM}", downloads), VLLM_FILES, site)
    extract(download(f"sglang=={SGLANG}", downloads), SGLANG_FILES, site)
    write_stand_ins(site)
    (a.folder / "env.sh").write_text(env_sh())
    size = sum(p.stat().st_size for p in a.folder.rglob("*") if p.is_file())
    print(f"{slim.name}: {slim.stat().st_size / 2**20:.1f} MiB; {a.folder}: {size / 2**20:.1f} MiB in all")
    return check_imports(site)


if __name__ == "__main__":
    sys.exit(main())

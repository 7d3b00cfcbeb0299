"""The shipped kernels compile for GPU targets from this CPU-only machine (ci/compile_check.py),
and the check really fails on code only the interpreter accepts. Runs in child processes:
under TRITON_INTERPRET=1 (this process) `triton.jit` builds interpreter functions, not
compilable ones."""
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_shipped_kernels_compile_for_nvidia_and_amd():
    p = _run("ci/compile_check.py", "--quick", "--targets", "sm_90", "gfx942")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    compiled = int(p.stdout.strip().splitlines()[-1].split()[0])
    assert compiled >= 60, f"only {compiled} variants: the launch recorder missed kernels\n{p.stdout[-2000:]}"


PLANTED = textwrap.dedent('''
    import importlib.util, pathlib, sys, torch
    spec = importlib.util.spec_from_file_location("cc", pathlib.Path("ci/compile_check.py"))
    cc = importlib.util.module_from_spec(spec); spec.loader.exec_module(cc)
    import triton, triton.language as tl

    @triton.jit
    def early_exit(x_ptr, n):
        for i in range(n):
            if tl.load(x_ptr + i) > 0:
                return  # the interpreter runs this; the GPU compiler rejects it
            tl.store(x_ptr + i, 1.0)

    cc.record_launches = lambda name, quick: [(early_exit, (torch.zeros(8), 8), {})]
    ok, failures = cc.compile_all(["sm_90"], quick=True, log=lambda *a: None)
    print("RESULT", ok, len(failures), repr(failures[0][:200]) if failures else "")
''')


def test_return_inside_a_loop_fails_the_check(tmp_path):
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    p = _run(str(script), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT"))
    _, ok, n_fail, msg = line.split(" ", 3)
    assert (ok, n_fail) == ("0", "1") and "early_exit" in msg and "return" in msg, p.stdout[-1000:]

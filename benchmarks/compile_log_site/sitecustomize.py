# Put this directory on PYTHONPATH with DC_COMPILE_LOG set: every Python process of the run
# (pytest workers, the suite's isolated kernel processes) logs its Triton compiles there.
import os

if os.environ.get("DC_COMPILE_LOG"):
    from benchmarks import compile_log

    compile_log.install(os.environ["DC_COMPILE_LOG"])

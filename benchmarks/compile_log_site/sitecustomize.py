# Put this directory on PYTHONPATH with DC_COMPILE_LOG set: every Python process of the run
# (pytest workers, the suite's isolated kernel processes) logs its Triton compiles there, and
# the pytest processes their tests (the plugin named in PYTEST_PLUGINS, which xdist workers inherit).
import os
import time

if os.environ.get("DC_COMPILE_LOG"):
    born = time.time()
    from benchmarks import compile_log

    compile_log.install(os.environ["DC_COMPILE_LOG"], born=born)
    plugins = [p for p in os.environ.get("PYTEST_PLUGINS", "").split(",") if p]
    if "benchmarks.compile_log_plugin" not in plugins:
        os.environ["PYTEST_PLUGINS"] = ",".join(plugins + ["benchmarks.compile_log_plugin"])

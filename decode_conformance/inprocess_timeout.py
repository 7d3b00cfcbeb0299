"""--isolation=none: a per-case time limit that ends the run with every thread's stack.

A kernel cannot be stopped inside the pytest process, so past the limit the run ends; under
--isolation=process (isolation.py) only the case fails instead.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
from typing import Optional


@contextlib.contextmanager
def in_process_timeout(config, seconds: Optional[float], what: str = ""):
    """--isolation=none: a kernel cannot be stopped inside the process, so past the limit the
    run ends: a note says why, then faulthandler dumps every thread's stack and exits (like
    pytest-timeout's thread method; faulthandler's watchdog is a C thread, so it fires even
    when the kernel holds the GIL). Left alone when pytest's own faulthandler_timeout is set
    (one faulthandler timer per process)."""
    try:
        own = float(config.getini("faulthandler_timeout") or 0)
    except (ValueError, KeyError):
        own = 0.0
    if not seconds or own > 0:
        yield
        return
    out = None
    try:  # pytest's faulthandler plugin keeps a dup of the real stderr (capture replaces fd 2)
        from _pytest.faulthandler import fault_handler_stderr_fd_key
        out = config.stash.get(fault_handler_stderr_fd_key, None)
    except ImportError:
        pass
    fd = out if out is not None else sys.__stderr__.fileno()

    def note():
        msg = (f"\ndecode-conformance: {what} gave no result within --case-timeout={seconds:g} s under "
               f"--isolation=none; ending the run (use --isolation=process to fail only this case)\n")
        try:
            os.write(fd, msg.encode())
        except OSError:
            pass

    import threading
    timer = threading.Timer(seconds, note)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(seconds + 0.5, exit=True, file=fd)
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()

"""A kernel module that writes, when imported, which process imported it (the file named by
$DC_PRELOAD_MARKER): test_fault_isolation's check that an isolated worker imports its run's
kernels before the first case reaches it. The kernel itself is torch_gather."""
from __future__ import annotations

import os
import pathlib

from decode_conformance_kernels.registry import torch_gather

MARKER_ENV = "DC_PRELOAD_MARKER"

if os.environ.get(MARKER_ENV):
    pathlib.Path(os.environ[MARKER_ENV]).write_text(str(os.getpid()))

kernel = torch_gather()

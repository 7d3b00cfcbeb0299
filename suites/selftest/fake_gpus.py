"""A pytest plugin (`-p suites.selftest.fake_gpus`) that makes decode_conformance.hardware see
three 80 GiB GPUs, for checking worker counts and pinning in a child pytest without a GPU."""
from decode_conformance import hardware

hardware.gpu_count = lambda: 3
hardware.has_gpu = lambda: True
hardware.is_rocm = lambda: False
hardware.gpu_memory_totals = lambda: [80 << 30] * 3

"""Adapters for kernels that live in other libraries (torch SDPA, flashinfer, sglang)."""

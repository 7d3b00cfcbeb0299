"""Parity: kernels against the float64 reference, CUDA-graph replay, determinism, batch invariance."""

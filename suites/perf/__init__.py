"""The perf-regression guard (GPU only, never under xdist)."""

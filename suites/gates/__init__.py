"""Gate logic: dispatch heuristics as pure functions (no GPU)."""

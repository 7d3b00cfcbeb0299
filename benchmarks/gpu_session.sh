#!/usr/bin/env bash
# One device session on a lent GPU: environment, native parity + CUDA-graph replay + gate
# tests, then the split-K and Lean sweeps. Everything lands in $OUT (at most 8 files).
set -u
OUT=${OUT:-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PARITY_S=${PARITY_S:-250}; SPLIT_S=${SPLIT_S:-110}; LEAN_S=${LEAN_S:-110}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "command: timeout $PARITY_S python3 -m pytest suites/parity suites/gates -n 4 -q --conformance-report=\$OUT/parity-h200"
  timeout "$PARITY_S" python3 -m pytest suites/parity suites/gates -n 4 -q -p no:cacheprovider \
      --conformance-report="$OUT/parity-h200" 2>&1 | tail -60
} > "$OUT/parity.log" 2>&1
tail -5 "$OUT/parity.log"
python3 benchmarks/sweep.py split --out "$OUT" --reps 20 --max-seconds "$SPLIT_S" | tail -3
python3 benchmarks/sweep.py lean --out "$OUT" --reps 20 --max-seconds "$LEAN_S" | tail -3

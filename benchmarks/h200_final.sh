#!/usr/bin/env bash
# The final-commit GPU call (one H200, a fresh machine, so the Triton cache starts cold):
# 1. the main job exactly as README gives it, timed cold, with its report;
# 2. the gpu-profile kill-map rows of the two int32-offset mutants (their bf16/fp16 killers are
#    2^31-element pools that exist only on a GPU); the map files come back under $OUT/fixtures.
set -u
OUT=${OUT:-results}; mkdir -p "$OUT/fixtures"; export PYTHONUNBUFFERED=1
LOG="$OUT/session.log"
{ date -u; cat COMMIT 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$LOG"
s=$(date +%s)
timeout 240 python3 -m pytest suites/parity -n auto -p no:cacheprovider -q -rf \
    --conformance-report="$OUT/parity" > "$OUT/parity.log" 2>&1
echo "=== main job (cold cache): rc=$? $(( $(date +%s) - s )) s" >> "$LOG"
tail -3 "$OUT/parity.log" >> "$LOG"
s=$(date +%s)
timeout 300 python3 ci/mutation.py --profile gpu --device cuda --jobs 2 \
    --only tc_int32_slot_offset lean_int32_slot_offset > "$OUT/mutation-gpu.log" 2>&1
echo "=== gpu kill-map rows: rc=$? $(( $(date +%s) - s )) s" >> "$LOG"
tail -12 "$OUT/mutation-gpu.log" >> "$LOG"
cp fixtures/kill_map.json fixtures/kill_map.md fixtures/smoke_set.txt fixtures/dead_weight.md "$OUT/fixtures/"
cat "$LOG"

#!/usr/bin/env bash
# Worker count for the main job on one H200, each run cold (its own empty Triton cache):
# 16 and 12 workers, with per-test durations, the number of compiled kernel variants and the
# GPU memory peak (everything lands in $OUT/results.tgz: the tool returns at most 8 files); then the Lean re-sweep against today's split-K (issue #11.9).
set -u
FINAL=${OUT:-results}; OUT=/tmp/res; mkdir -p "$OUT" "$FINAL"; export PYTHONUNBUFFERED=1
LOG="$OUT/session.log"
{ date -u; cat COMMIT 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; nproc; } > "$LOG"
for w in 16 12; do
  export TRITON_CACHE_DIR=/tmp/triton-cold-$w
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > /tmp/mem-$w.txt &
  smi=$!
  s=$(date +%s)
  DECODE_CONFORMANCE_WORKERS_PER_GPU=$w timeout 200 python3 -m pytest suites/parity -n auto -p no:cacheprovider -q -rf \
      --durations=40 --conformance-report="$OUT/parity-w$w" > "$OUT/parity-w$w.log" 2>&1
  rc=$?
  kill $smi
  echo "=== main job, $w workers, cold: rc=$rc $(( $(date +%s) - s )) s; compiled variants: $(find $TRITON_CACHE_DIR -name '*.cubin' | wc -l); peak MiB: $(sort -n /tmp/mem-$w.txt | tail -1)" >> "$LOG"
  grep -E "passed|failed" "$OUT/parity-w$w.log" | tail -2 >> "$LOG"
done
unset TRITON_CACHE_DIR
s=$(date +%s)
timeout 230 python3 benchmarks/sweep.py lean --out "$OUT" --reps 20 --max-seconds 190 > "$OUT/lean.log" 2>&1
echo "=== lean sweep: rc=$? $(( $(date +%s) - s )) s" >> "$LOG"
cp /tmp/mem-*.txt "$OUT/"
tar czf "$FINAL/results.tgz" -C "$OUT" . ; cp "$LOG" "$FINAL/"
cat "$LOG"

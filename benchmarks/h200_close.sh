#!/usr/bin/env bash
# The closing GPU record of this commit on one H200 (nvidia-h200: 16 CPU cores), in two calls
# that each fit the device tool's 10-minute limit:
#   OUT=$OUT bash benchmarks/h200_close.sh correctness
#     1. the main job, exactly as README gives it, twice, each cold (its own empty Triton cache);
#     2. the kernel table of issue #11 (graph replay, L2 flushed before every replay).
#   OUT=$OUT bash benchmarks/h200_close.sh perf
#     3. the perf guard's power: fresh baselines on a quiet host, then 20 null and 5 planted
#        guard runs with 12 busy processes loading the host (perf_power.py --host-load 12);
#     4. the gpu-profile kill-map rows of the two int32-offset mutants (2^31-element pools);
#   OUT=$OUT bash benchmarks/h200_close.sh sweeps
#     5. the perf guard's power again on a quiet host (the CI perf shard's condition);
#     6. the Lean and split-K sweeps.
#   OUT=$OUT bash benchmarks/h200_close.sh final
#     the main job cold once, the kernel table, both sweeps, and fresh sm_90 baselines of the
#     split-K kernels (after a change to their launch rule).
#   OUT=$OUT bash benchmarks/h200_close.sh lean
#     after a change to Lean alone (split-K kernels as recorded before): the main job cold,
#     sm_90 baselines of lean and dispatch, the kernel table, the Lean sweep, and the guard's
#     power for lean and dispatch on a quiet host.
#   OUT=$OUT bash benchmarks/h200_close.sh stage2
#     after a change to the split-K stage 2 alone: the main job cold, sm_90 baselines of the
#     kernels that run it at batch 1 (adaptive_split, dispatch, adaptive_split_fp8mma), the
#     kernel table and the split sweep.
#   OUT=$OUT bash benchmarks/h200_close.sh last
#     for a short device budget: the main job cold, sm_90 baselines of every shipped kernel, the
#     kernel table, then the split sweep for whatever time is left; each step's output is written
#     straight to $OUT, so a call cut off at its limit still returns the steps it finished.
#   OUT=$OUT bash benchmarks/h200_close.sh pdl
#     stage 2 as a programmatic dependent launch: the main job cold, probe rounds 8 (PDL on / off)
#     and 9 (the cache layout's share), the kernel table with the read flush and again with the
#     zero flush of the earlier records, and the split sweep (read flush).
#   OUT=$OUT bash benchmarks/h200_close.sh guard
#     after a split-K change: sm_90 baselines of the split-K kernels, the guard's power for them
#     on a quiet host, and the Lean sweep (read flush) for the gate's decisions.
#   OUT=$OUT bash benchmarks/h200_close.sh ncu
#     Nsight Compute counters of stage 1 / stage 2 and SDPA's kernels on three cells
#     (benchmarks/ncu_cells.py), probe round 8 with the guard's ragged and b32 cells, and the
#     perf guard three times against the committed sm_90 baselines (recorded on another machine).
#   OUT=$OUT bash benchmarks/h200_close.sh baselines
#     the final commit: the main job cold, sm_90 baselines of every shipped kernel on this one
#     machine (with its GPU UUID), the guard against them (the same machine), and against the
#     files committed before (recorded on other machines: the `machine:` note).
#   OUT=$OUT bash benchmarks/h200_close.sh pdl-final
#     both of the above in one call, probe round 8 on the final trigger rule included;
#     results.tgz is rewritten after every step, so a call cut off returns what it finished.
#   OUT=$OUT bash benchmarks/h200_close.sh empties
#     probe round 10: empty stage-1 programs and stage 2 on batched cells, against fixed-split;
#     then the main job cold (after a change to the split-K grid).
# $OUT gets session.log (each step's command, tail, exit code, seconds) and results.tgz.
set -u
MODE=${1:?usage: h200_close.sh correctness|perf|sweeps|final|lean|stage2|last|pdl|guard|pdl-final|ncu|baselines|empties}
OUT=${OUT:-results}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
RES=/tmp/res; [ "$MODE" = last ] && RES="$OUT"; mkdir -p "$RES"
LOG="$OUT/session.log"
step() {  # step NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*" >> "$LOG"
  local s; s=$(date +%s%N)
  timeout "$limit" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$RES/$name.log" >> "$LOG"
  echo "=== $name: rc=$rc, $(( ($(date +%s%N) - s) / 1000000 )) ms" >> "$LOG"
  case "$MODE" in pdl-final|baselines) tar czf "$OUT/results.tgz" -C "$RES" . ;; esac
  return 0
}
main_job_cold() {  # main_job_cold NAME LIMIT_S REPORT: README's main job, its own empty Triton cache
  export TRITON_CACHE_DIR=/tmp/triton-cold-$MODE-$1  # never one a previous call filled
  step "$1" "$2" python3 -m pytest suites/parity -n auto -p no:cacheprovider -q -rfE \
      --durations=15 --conformance-report="$RES/$3"
  echo "compiled variants: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l)" >> "$LOG"
  unset TRITON_CACHE_DIR
}
record_baselines() {  # record_baselines LIMIT_S KERNEL...: sm_90 baselines under $RES/baselines
  local limit=$1; shift
  step perf-record "$limit" python3 -m pytest suites/perf -p no:cacheprovider -q --perf-record \
      --perf-baseline-dir="$RES/baselines" "${@/#/--kernel=}"
}
{ date -u; cat COMMIT 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  echo "cpus $(nproc)"; } > "$LOG" 2>&1
if [ "$MODE" = correctness ]; then
  for run in 1 2; do
    main_job_cold "main-job-cold-$run" 150 "parity-$run"
  done
  step table 110 python3 benchmarks/kernel_table.py table --out "$RES" --reps 30 --max-seconds 95
elif [ "$MODE" = perf ]; then
  step perf-power 330 python3 benchmarks/perf_power.py --out "$RES/perf" --reps 20 --planted-reps 5 \
      --host-load 12 --max-seconds 300
  step gpu-kill-map-rows 250 python3 ci/mutation.py --profile gpu --device cuda --jobs 2 \
      --only tc_int32_slot_offset lean_int32_slot_offset
  cp fixtures/kill_map.json "$RES/kill_map_gpu.json"
elif [ "$MODE" = final ]; then
  main_job_cold main-job-cold 150 parity
  step table 60 python3 benchmarks/kernel_table.py table --out "$RES" --reps 30 --max-seconds 50
  step split-sweep 80 python3 benchmarks/sweep.py split --out "$RES" --reps 20 --max-seconds 70
  step lean-sweep 60 python3 benchmarks/sweep.py lean --out "$RES" --reps 20 --max-seconds 45
  record_baselines 100 adaptive_split dispatch adaptive_split_fp8mma fixed_split
elif [ "$MODE" = lean ]; then
  main_job_cold main-job-cold 130 parity
  record_baselines 70 lean dispatch
  step table 50 python3 benchmarks/kernel_table.py table --out "$RES" --reps 30 --max-seconds 40
  step lean-sweep 75 python3 benchmarks/sweep.py lean --out "$RES" --reps 20 --max-seconds 60
  step perf-power-quiet 170 python3 benchmarks/perf_power.py --out "$RES/perf-quiet" --kernel lean \
      --kernel dispatch --reps 20 --planted-reps 5 --subprocess-runs 0 --max-seconds 150
elif [ "$MODE" = stage2 ]; then
  main_job_cold main-job-cold 130 parity
  record_baselines 70 adaptive_split dispatch adaptive_split_fp8mma
  step table 50 python3 benchmarks/kernel_table.py table --out "$RES" --reps 30 --max-seconds 40
  step split-sweep 120 python3 benchmarks/sweep.py split --out "$RES" --reps 20 --max-seconds 110
elif [ "$MODE" = pdl ]; then
  main_job_cold main-job-cold 130 parity
  step probe-pdl 150 python3 benchmarks/adaptive_probe.py --variants pdl --out "$RES/pdl" --reps 20 --max-seconds 130
  step probe-layout 110 python3 benchmarks/adaptive_probe.py --variants layout --out "$RES/layout" --reps 20 \
      --max-seconds 95
  step table 50 python3 benchmarks/kernel_table.py table --out "$RES" --reps 30 --max-seconds 40
  step table-zero-flush 50 python3 benchmarks/kernel_table.py table --flush zero --out "$RES/zero" --reps 30 \
      --max-seconds 40
  step split-sweep 100 python3 benchmarks/sweep.py split --out "$RES" --reps 20 --max-seconds 90
elif [ "$MODE" = guard ]; then
  record_baselines 70 adaptive_split dispatch adaptive_split_fp8mma
  step perf-power-quiet 170 python3 benchmarks/perf_power.py --out "$RES/perf-quiet" --kernel adaptive_split \
      --kernel dispatch --kernel adaptive_split_fp8mma --reps 20 --planted-reps 5 --subprocess-runs 0 --max-seconds 150
  step lean-sweep 75 python3 benchmarks/sweep.py lean --out "$RES" --reps 20 --max-seconds 60
elif [ "$MODE" = pdl-final ]; then
  main_job_cold main-job-cold 120 parity
  step probe-pdl 90 python3 benchmarks/adaptive_probe.py --variants pdl --out "$RES/pdl" --reps 20 --max-seconds 75
  record_baselines 45 adaptive_split dispatch adaptive_split_fp8mma
  step perf-power-quiet 100 python3 benchmarks/perf_power.py --out "$RES/perf-quiet" --kernel adaptive_split \
      --kernel dispatch --kernel adaptive_split_fp8mma --reps 20 --planted-reps 5 --subprocess-runs 0 --max-seconds 90
  step table 40 python3 benchmarks/kernel_table.py table --out "$RES" --reps 30 --max-seconds 32
  step split-sweep 90 python3 benchmarks/sweep.py split --out "$RES" --reps 20 --max-seconds 80
  step lean-sweep 75 python3 benchmarks/sweep.py lean --out "$RES" --reps 20 --max-seconds 62
elif [ "$MODE" = ncu ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  step ncu 200 "$NCU" --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
      -k 'regex:adaptive|flash|fmha|attention|sdpa|cudnn' python3 benchmarks/ncu_cells.py
  step probe-pdl 100 python3 benchmarks/adaptive_probe.py --variants pdl --out "$RES/pdl" --reps 20 --max-seconds 85
  for run in 1 2 3; do
    step "perf-compare-$run" 60 python3 -m pytest suites/perf -p no:cacheprovider -q \
        --kernel=adaptive_split --kernel=dispatch --kernel=adaptive_split_fp8mma
  done
elif [ "$MODE" = baselines ]; then
  main_job_cold main-job-cold 120 parity
  step perf-record 150 python3 -m pytest suites/perf -p no:cacheprovider -q --perf-record \
      --perf-baseline-dir="$RES/baselines"
  step perf-compare-same 90 python3 -m pytest suites/perf -p no:cacheprovider -q --perf-baseline-dir="$RES/baselines"
  step perf-compare-committed 90 python3 -m pytest suites/perf -p no:cacheprovider -q
elif [ "$MODE" = empties ]; then
  step probe-empties 250 python3 benchmarks/adaptive_probe.py --variants empties --out "$RES/empties" --reps 20 \
      --max-seconds 230
  main_job_cold main-job-cold 150 parity
elif [ "$MODE" = last ]; then
  main_job_cold main-job-cold 130 parity
  record_baselines 60 adaptive_split dispatch adaptive_split_fp8mma fixed_split lean
  step table 45 python3 benchmarks/kernel_table.py table --out "$RES" --reps 30 --max-seconds 38
  step split-sweep 60 python3 benchmarks/sweep.py split --out "$RES" --reps 20 --max-seconds 50
  cat "$LOG"; exit 0
else
  step perf-power-quiet 250 python3 benchmarks/perf_power.py --out "$RES/perf-quiet" --reps 20 --planted-reps 5 \
      --subprocess-runs 0 --max-seconds 220
  step lean-sweep 60 python3 benchmarks/sweep.py lean --out "$RES" --reps 20 --max-seconds 45
  step split-sweep 200 python3 benchmarks/sweep.py split --out "$RES" --reps 20 --max-seconds 180
fi
tar czf "$OUT/results.tgz" -C "$RES" .
cat "$LOG"

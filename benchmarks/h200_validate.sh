#!/usr/bin/env bash
# One lent-GPU call on a two-GPU machine: the correctness and adoption evidence of issues #9,
# #10 and #12 on GPU 0, and the perf guard's power experiment plus the kernel timings of issue
# #11 on GPU 1 at the same time (timing never shares its GPU). Run from the repository root
# (or a snapshot of it):   OUT=results bash benchmarks/h200_validate.sh
# $OUT gets session.log (each step's command, output tail, exit code and seconds) and
# results.tgz (reports, JSON, baselines). Steps have their own time limits, and the call as a
# whole stays under DEADLINE_S. On a one-GPU machine the GPU-1 part is skipped.
set -u
OUT=${OUT:-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
RES=/tmp/res
mkdir -p "$RES"
LOG="$OUT/session.log"
export CUDA_VISIBLE_DEVICES=0
GPUS=$(nvidia-smi -L | wc -l)
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-560}
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }

step() {  # step NAME LIMIT_S CMD...: run with a time limit (never past the deadline), log it all
  local name=$1 limit=$2; shift 2
  local l; l=$(left); [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -le 5 ]; then echo "=== $name: SKIPPED (no time left)" >> "$LOG"; return; fi
  echo "=== $name (limit ${limit}s): $*" >> "$LOG"
  local s; s=$(date +%s%N)
  timeout "$limit" "$@" > "/tmp/step-$name.log" 2>&1
  local rc=$?
  tail -n 60 "/tmp/step-$name.log" >> "$LOG"
  echo "=== $name: rc=$rc, $(( ($(date +%s%N) - s) / 1000000 )) ms" >> "$LOG"
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'sms', torch.cuda.get_device_properties(0).multi_processor_count)"
  nproc
  git log -1 --format='commit %H %s' 2>/dev/null || cat COMMIT 2>/dev/null
} > "$LOG" 2>&1

# GPU 1, in the background: the perf guard's false-alarm / planted-slowdown experiment (it
# records fresh baselines), then the launch-config sweep and the kernel table.
if [ "$GPUS" -ge 2 ]; then
  (
    export CUDA_VISIBLE_DEVICES=1
    step perf-power 330 python3 benchmarks/perf_power.py --out "$RES/perf" --reps 20 --planted-reps 5 --max-seconds 300
    step tune 150 python3 benchmarks/kernel_table.py tune --out "$RES" --reps 20 --max-seconds 120
    step table 120 python3 benchmarks/kernel_table.py table --out "$RES" --reps 30 --max-seconds 100
  ) &
  PERF_PID=$!
fi

# 1. The main job on one GPU, cold (fresh machine, empty Triton cache), then again warm: every
#    shipped kernel x the GPU parity set, CUDA-graph replay, determinism, batch invariance,
#    split counts.
step main-job-cold 300 python3 -m pytest suites/parity -n auto -p no:cacheprovider -q -rfE \
    --conformance-report="$RES/parity"
step main-job-warm 200 python3 -m pytest suites/parity -n auto -p no:cacheprovider -q -rfE \
    --conformance-report=/tmp/parity-warm

# 2. In parallel (correctness only, no timing): planted bugs vs affected cases at GPU sizes;
#    kernels that write their inputs; the int32-offset mutants on the 2^31-element pools.
PIDS=()
(
  step planted 240 python3 -m suites.selftest.planted --profile gpu --jobs 4 --out "$RES"
) &
PIDS+=($!)
(
  export PYTHONPATH=suites/selftest/oot; step pristine 200 python3 -m pytest suites/parity/test_parity.py -n 2 -q \
      -p no:cacheprovider --kernel=toy_decode:ScalesQInPlace --kernel=toy_decode:ZeroesItsInputs \
      --conformance-report=/tmp/pristine
  python3 - >> "$LOG" 2>&1 <<'EOF'
import json, collections
rows = json.load(open("/tmp/pristine.json"))["results"]
c = collections.Counter((r["kernel"], r["status"], "wrote to its inputs" in r.get("message", "")) for r in rows)
print("pristine:", dict(c))
print("example:", next((r["message"][:300] for r in rows if r["status"] == "failed"), None))
EOF
) &
PIDS+=($!)
wait "${PIDS[@]}"
# The int32-offset mutants on the 2^31-element pools, alone on the GPU (they need 8 GB a case),
# next to a correct kernel in one run (crash isolation keeps every other result).
(
  mkdir -p /tmp/mut
  python3 - > /tmp/mut/specs 2>>"$LOG" <<'EOF'
import sys
sys.path.insert(0, "ci")
import mutation as mu
by = {m.name: m for m in mu.load_mutants()}
for name in ("tc_int32_slot_offset", "lean_int32_slot_offset"):
    m = by[name]
    print(f"{mu.materialize(m, __import__('pathlib').Path('/tmp/mut'))}.registry:{m.kernel}")
EOF
  ids=$(python3 -c "
from decode_conformance import _paths; _paths.alias_checkout()
from decode_conformance.case_sets import build_set
print(' '.join('--case-id=' + c.id for c in build_set('parity', 'gpu') if c.label == 'fa2709'))")
  export PYTHONPATH=/tmp/mut; step int32-mutants 240 python3 -m pytest suites/parity/test_parity.py -n 2 -q -p no:cacheprovider \
      $(sed 's/^/--kernel=/' /tmp/mut/specs) --kernel=decode_conformance_kernels.registry:torch_gather \
      --isolation=process $ids --conformance-report=/tmp/int32
  python3 - >> "$LOG" 2>&1 <<'EOF'
import json
for r in json.load(open("/tmp/int32.json"))["results"]:
    print("int32:", r["kernel"], r["case"], r["status"], r.get("message", "")[:160].replace("\n", " "))
EOF
)

# 3. The adopter's way: our wheel and an out-of-tree kernel package installed into a fresh
#    venv, run from an empty folder: parity + graph replay + determinism + batch invariance,
#    then the perf guard (record a baseline, compare against it).
if ls .whl/*.whl > /dev/null 2>&1; then
  # a fresh venv borrowing the image's torch/triton/pytest (the image's python3 is itself a venv,
  # so --system-site-packages would not see them); our two packages come from the wheels
  python3 -m venv --without-pip /tmp/adopt >> "$LOG" 2>&1
  python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$(/tmp/adopt/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/borrowed.pth"
  python3 -m pip --python /tmp/adopt/bin/python install -q --no-deps --no-index .whl/*.whl >> "$LOG" 2>&1
  /tmp/adopt/bin/python -c "import decode_conformance, toy_decode; print('adopter venv:', decode_conformance.__file__)" >> "$LOG" 2>&1
  mkdir -p /tmp/empty && cd /tmp/empty
  step adopter-parity 200 /tmp/adopt/bin/python -m pytest --pyargs decode_conformance.suites.parity \
      --kernel=toy_decode:ToyDecode -n auto --require-cases -p no:cacheprovider -q -rs \
      --conformance-report="$RES/adopter"
  step adopter-perf-record 120 /tmp/adopt/bin/python -m pytest --pyargs decode_conformance.suites.perf \
      --kernel=toy_decode:ToyDecode --perf-record --perf-baseline-dir=/tmp/empty/baselines -p no:cacheprovider -q
  step adopter-perf-compare 90 /tmp/adopt/bin/python -m pytest --pyargs decode_conformance.suites.perf \
      --kernel=toy_decode:ToyDecode --perf-require-baseline --perf-baseline-dir=/tmp/empty/baselines \
      -p no:cacheprovider -q
  cd - > /dev/null
fi

[ -n "${PERF_PID:-}" ] && wait "$PERF_PID"
# 5. The main job on both GPUs (warm): one pinned group of workers per GPU.
if [ "$GPUS" -ge 2 ]; then
  (export CUDA_VISIBLE_DEVICES=0,1; step main-job-2gpu 150 python3 -m pytest suites/parity -n auto \
      -p no:cacheprovider -q --conformance-report=/tmp/parity-2gpu)
fi
echo "=== total $(( $(date +%s) - T0 )) s" >> "$LOG"
tar -czf "$OUT/results.tgz" -C "$RES" . 2>> "$LOG"
grep -E "^=== |^pristine|^int32|caught|passed|failed" "$LOG" | tail -60

#!/usr/bin/env bash
# A second, short call on the two-GPU machine (same commit as h200_validate.sh): the two steps
# that ran out of GPU memory there because other steps shared GPU 0 - the planted-bug study
# (alone on GPU 0) and the adopter's parity run (alone on GPU 1, two workers: the out-of-tree
# toy kernel gathers whole 128k-key requests into float32, ~10-30 GB a case).
set -u
OUT=${OUT:-results}; mkdir -p "$OUT" /tmp/res; export PYTHONUNBUFFERED=1
LOG="$OUT/session.log"
{ date -u; cat COMMIT 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$LOG"
touch /tmp/planted.log
P1=
(
  export CUDA_VISIBLE_DEVICES=1 DECODE_CONFORMANCE_WORKERS_PER_GPU=2  # the pure-torch toy gathers whole requests: GBs a case
  python3 -m venv --without-pip /tmp/adopt
  python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$(/tmp/adopt/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/borrowed.pth"
  python3 -m pip --python /tmp/adopt/bin/python install -q --no-deps --no-index .whl/*.whl
  mkdir -p /tmp/empty && cd /tmp/empty
  s=$(date +%s)
  timeout 300 /tmp/adopt/bin/python -m pytest --pyargs decode_conformance.suites.parity \
      --kernel=toy_decode:ToyDecode -n auto --require-cases -p no:cacheprovider -q -rs \
      --conformance-report=/tmp/res/adopter > /tmp/adopter.log 2>&1
  echo "=== adopter-parity: rc=$? $(( $(date +%s) - s )) s" >> /tmp/adopter.log
  grep -o "one of [0-9]* workers" /tmp/res/adopter.md | sort | uniq -c >> /tmp/adopter.log
  timeout 120 /tmp/adopt/bin/python -m pytest --pyargs decode_conformance.suites.perf --kernel=toy_decode:ToyDecode \
      --perf-record --perf-baseline-dir=/tmp/empty/baselines -p no:cacheprovider -q >> /tmp/adopter.log 2>&1
  echo "=== adopter-perf-record: rc=$?" >> /tmp/adopter.log
  timeout 90 /tmp/adopt/bin/python -m pytest --pyargs decode_conformance.suites.perf --kernel=toy_decode:ToyDecode \
      --perf-require-baseline --perf-baseline-dir=/tmp/empty/baselines -p no:cacheprovider -q -rA >> /tmp/adopter.log 2>&1
  echo "=== adopter-perf-compare: rc=$?" >> /tmp/adopter.log
) &
P2=$!
wait $P2
cat /tmp/planted.log /tmp/adopter.log | tail -40 >> "$LOG"
rm -rf /tmp/res/perf; tar -czf "$OUT/results.tgz" -C /tmp/res .
tail -40 "$LOG"

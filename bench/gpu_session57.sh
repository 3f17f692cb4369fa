#!/usr/bin/env bash
# Fifty-seventh session: one script for whatever card comes. On an H200 the
# issue's table and B = 1's tier from L = 900 (gpu_session55.sh decbench
# warmup tiers; carry .device/s55); on any card the whole GPU suite over
# every test artifact (carry .device/s56/arts.tar.xz; builds in
# gpu_session56.sh's header), every test's outcome kept even if the call's
# limit cuts the run (pytest -v into $OUT/s57_suite_<file>.txt); `hang`:
# which deal makes fuzz5's static kernel hang (bench/fuzz_hang.py; build:
# python bench/fuzz_hang.py --build .device/s57/hang; carry .device/s57).
# Usage: [SUITE_FILES=...] [SUITE_BUDGET=s] bash bench/gpu_session57.sh [auto|h200|suite|hang]...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
here=$(dirname "$0")
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
for step in ${*:-auto}; do
if [ "$step" = auto ]; then
  case $card in *H200*) step=h200 ;; *) step=suite ;; esac
fi
echo "card: $card; step: $step"
case $step in
h200)  # the issue's card: its table, the cold start, the tier from 900
  OUT="$OUT" bash "$here/gpu_session55.sh" ${H200_STEPS:-decbench warmup tiers}
  ;;
hang)  # each variant in its own process under a timeout, a short watchdog
  timeout ${HANG_BUDGET:-420} python bench/fuzz_hang.py --artifacts .device/s57/hang \
    --out "$OUT/fuzz_hang.json" --budget $(( ${HANG_BUDGET:-420} - 30 )) 2>&1 | tee "$OUT/fuzz_hang.txt"
  ;;
suite)  # quick files first; each file's verbose log survives a cut
  mkdir -p /tmp/s57
  [ -d /tmp/s57/arts ] || python -c \
    "import tarfile; tarfile.open('.device/s56/arts.tar.xz').extractall('/tmp/s57')"
  start=$SECONDS
  for f in ${SUITE_FILES:-gemm schedules runtime moe llama fuzz collective}; do
    left=$(( ${SUITE_BUDGET:-560} - (SECONDS - start) ))
    [ $left -lt 20 ] && { echo "== $f: no time left" | tee -a "$OUT/s57_suite.txt"; continue; }
    echo "== $f (${left} s left)" | tee -a "$OUT/s57_suite.txt"
    ETC_ARTIFACTS=/tmp/s57/arts ETC_FUZZ_ARTIFACTS=/tmp/s57/fuzz timeout $left \
      python -m pytest -v -rfE --durations=5 -p no:cacheprovider "test/gpu/test_${f}_gpu.py" \
      > "$OUT/s57_suite_$f.txt" 2>&1
    echo "rc=$? after $((SECONDS - start)) s" >> "$OUT/s57_suite_$f.txt"
    grep -cE " PASSED" "$OUT/s57_suite_$f.txt" | sed "s/^/passed: /" | tee -a "$OUT/s57_suite.txt"
    grep -E " (FAILED|ERROR)|^(FAILED|ERROR) |rc=|passed|failed" "$OUT/s57_suite_$f.txt" \
      | tail -12 | tee -a "$OUT/s57_suite.txt"
  done
  ;;
esac
done

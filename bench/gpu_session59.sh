#!/usr/bin/env bash
# Fifty-ninth session (no device lent; built here, to run on the next one).
# `triggers`: the run-time checks of a data-dependent trigger's table (a
# table that does not start at 0, decreases or ends past the grid stops the
# launch with TriggerRangeError): the new GPU test over the trigger_table
# artifacts, then every MoE test over the MoE artifacts of today's compiler
# (python test/gpu/make_artifacts.py .device/s59/arts --only
# trigger_table,moe_small; tar cf - -C .device/s59 arts | xz >
# .device/s59/arts.tar.xz; carry .device/s59/arts.tar.xz); a count read
# from a table too low is a WaitCountError in the same test.
# `moebench`: what the checks cost the MoE layer: bench/moe.py over the
# shipped presets (compile_moe, static and dynamic) built by the compiler
# before the checks (.device/s59/moe_before, ea473fa), with the trigger
# checks alone (.device/s59/moe_nocounts: BENCH_MOE_AUTO_OPTIONS=
# '{"check_counts": false}') and with both (.device/s59/moe_after), in
# alternating passes of one call; each built by BENCH_MOE_CONFIGS=auto
# python bench/moe.py --build DIR; carry all three. Predicted: the trigger
# checks static within +-0.5 % (a guarded table is checked once per CTA),
# dynamic +0..+1 % (two loads a popped instance); the count check +0..+1 µs
# a launch (a call and one round trip at the exit).
# Usage: [MOE_PASSES="1"|"2"] bash bench/gpu_session59.sh [triggers|moebench]...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-triggers moebench}; do
case $step in
triggers)
  mkdir -p /tmp/s59 && python -c \
    "import tarfile; tarfile.open('.device/s59/arts.tar.xz').extractall('/tmp/s59')"
  ETC_ARTIFACTS=/tmp/s59/arts timeout 60 python -m pytest -q -rfE -p no:cacheprovider \
    test/gpu/test_schedules_gpu.py -k trigger_tables > "$OUT/s59_triggers.txt" 2>&1
  tail -5 "$OUT/s59_triggers.txt"
  ETC_ARTIFACTS=/tmp/s59/arts timeout ${MOE_TESTS_TIMEOUT:-300} python -m pytest -q -rfE \
    -p no:cacheprovider test/gpu/test_moe_gpu.py > "$OUT/s59_moe_tests.txt" 2>&1
  tail -5 "$OUT/s59_moe_tests.txt"
  ;;
moebench)
  for pass in ${MOE_PASSES:-1 2}; do  # six runs: give each pass its own call if they do not fit
    order="before nocounts after"; [ $pass = 2 ] && order="after nocounts before"
    for build in $order; do
      BENCH_MOE_CONFIGS=auto timeout 140 python bench/moe.py --reps 20 \
        --artifacts .device/s59/moe_$build --out "$OUT/s59_moe_${build}_$pass.json" 2>&1 \
        | tee -a "$OUT/s59_moebench.txt" | grep "ETC fused"
    done
  done
  ;;
esac
done

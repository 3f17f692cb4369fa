#!/usr/bin/env bash
# Fifty-seventh session: one script for whatever card comes. On an H200 the
# issue's table and B = 1's tier from L = 900 (as gpu_session55.sh's decbench
# warmup tiers, over today's compiler: python bench/decode.py --build
# .device/s57/dec; DECODE_SWEEP_VARIANTS=default,b1_tiers900 python
# bench/decode_sweep.py --build .device/s57/tiers; carry both); on any card the whole GPU
# suite over every test artifact (python test/gpu/make_artifacts.py
# .device/s57/arts; python test/gpu/make_fuzz_artifacts.py .device/s57/fuzz
# --count 10; tar cf - -C .device/s57 arts fuzz | xz > .device/s57/arts.tar.xz;
# carry .device/s57/arts.tar.xz), every test's outcome kept even if the call's
# limit cuts the run (pytest -v into $OUT/s57_suite_<file>.txt); `hang`:
# fuzz seeds 5 and 6 with the scheduler's barriers non-aligned (the fix;
# python bench/fuzz_hang.py --build .device/s57/hang_fixed --seeds 5,6), then
# seed 5's variants as they hung, aligned (built before the fix into
# .device/s57/hang_aligned; rebuild: check out 9343971^); carry both.
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
  for part in ${H200_STEPS:-decbench warmup tiers}; do
    case $part in
    decbench) issue_bench .device/s57/dec ;;
    warmup) mkdir -p "$OUT/warmup"
      OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s57/dec ;;
    tiers) SWEEP_TMP=/tmp/s57 sweep_passes s57_tiers default,b1_tiers900 1 768,960,1024,1100 \
      .device/s57/tiers ;;
    esac
  done
  ;;
hang)  # each variant in its own process under a timeout, a short watchdog:
  # first the non-aligned barriers (today's compiler: does the hang end?),
  # then the aligned ones of the hanging build (which deal hangs?)
  for kind in fixed aligned; do
    timeout $(( ${HANG_BUDGET:-200} + 30 )) python bench/fuzz_hang.py \
      --artifacts .device/s57/hang_$kind --out "$OUT/fuzz_hang_$kind.json" \
      --budget ${HANG_BUDGET:-200} 2>&1 | tee "$OUT/fuzz_hang_$kind.txt"
  done
  ;;
suite)  # each file's verbose log survives a cut
  SUITE_FILES=${SUITE_FILES:-gemm schedules runtime moe llama fuzz collective} \
    gpu_suite s57 .device/s57/arts.tar.xz /tmp/s57
  ;;
esac
done

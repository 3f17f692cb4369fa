#!/usr/bin/env bash
# Sixty-second session: B = 1's argmax folded into the LM head of its phased
# kernel (M.SINGLE_SEQUENCE_SHORT's argmax_fused) made the default.
# `tests`: the tiny decoders whose B = 1 bucket is the default's (so they
# fold) against the simulator on the GPU, both schedules (python
# test/gpu/make_artifacts.py .device/s62/arts --only llama_tiny_buckets).
# `fold`: the default against the one before (before62), four passes at B = 1,
# L = 512 and 1024 (DECODE_SWEEP_VARIANTS=before62,default python
# bench/decode_sweep.py --build .device/s62/fold). Predicted: -8..-12 us
# (-1..-1.5 %) at both, from items 272 and 275 on H100s.
# `decbench`, `warmup`: the issue's table and its warm-up over the default
# artifact (python bench/decode.py --build .device/s62/dec).
# Carry .device/s62. Usage: bash bench/gpu_session62.sh [tests] [fold] [warmup] [decbench]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-tests fold warmup}; do
  case $step in
  tests) ETC_ARTIFACTS=.device/s62/arts timeout 200 python -m pytest -q -rfE -p no:cacheprovider \
    test/gpu/test_llama_gpu.py -k "matches_the_simulator and buckets" > "$OUT/s62_tests.txt" 2>&1
    tail -4 "$OUT/s62_tests.txt" ;;
  fold) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s62 sweep_passes s62_fold before62,default 1 \
    512,1024 .device/s62/fold ;;
  warmup) mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s62/dec ;;
  decbench) issue_bench .device/s62/dec ;;
  esac
done
tar czf "$OUT/s62_raw.tgz" -C /tmp/s62 raw 2>/dev/null

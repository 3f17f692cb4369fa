#!/usr/bin/env bash
# Sixty-third session.
# `card`: which GPU came (the issue's table is re-measured only on an H200;
# sessions 60-62 got H100s only).
# `decbench`, `warmup`: the issue's table and its warm-up over the default
# artifact (python bench/decode.py --build .device/s63/dec).
# `qo`: qkv's and o_proj's TMA rings 6 or 7 stages deep in the large kernel
# (tma6_qo, tma7_qo: 6 or 7 of a part's 8 weight k-tiles loaded before the
# waits) against the default, four passes at B = 32, 64 and L = 1024, 4096
# (DECODE_SWEEP_VARIANTS=default,tma6_qo,tma7_qo python bench/decode_sweep.py
# --build .device/s63/qo). Predicted in bench/RESULTS.md (sixty-third session).
# Carry .device/s63. Usage: bash bench/gpu_session63.sh [card] [decbench] [warmup] [qo]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-card}; do
  case $step in
  card) nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$OUT/s63_card.txt" ;;
  decbench) issue_bench .device/s63/dec ;;
  warmup) mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s63/dec ;;
  qo) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s63 sweep_passes s63_qo default,tma6_qo,tma7_qo 32,64 \
    1024,4096 .device/s63/qo; tar czf "$OUT/s63_qo_raw.tgz" -C /tmp/s63 raw ;;
  esac
done

#!/usr/bin/env bash
# Fifty-second session (bench/RESULTS.md items 253-258 ran gpu_session50.sh and
# gpu_session51.sh): B = 1's nine-split tier from L = 900 against the
# fiftieth session's from 576 and the default (DECODE_SWEEP_VARIANTS=
# default,b1_tiers,b1_tiers900 python bench/decode_sweep.py --build .device/s52/sweep).
# The fiftieth session's `stamps` and `trace` run through gpu_session50.sh.
# Usage: bash bench/gpu_session52.sh [tiers] [raw]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s52
for step in ${*:-tiers}; do
  case $step in
  tiers)  # item 257: -1.0 % at L = 1024, +0.3 % at 768 from L = 576; from 900?
    SWEEP_TMP=/tmp/s52 sweep_passes s52_tiers default,b1_tiers,b1_tiers900 1 \
      768,960,1024,1100 .device/s52/sweep
    ;;
  raw)  # every sweep's raw rows
    tar czf "$OUT/raw.tgz" -C /tmp/s52 raw 2>/dev/null || true
    ;;
  esac
done

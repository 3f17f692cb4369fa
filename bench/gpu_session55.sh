#!/usr/bin/env bash
# Fifty-fifth session: the issue's table over today's code (decbench, the
# default artifact: python bench/decode.py --build .device/s55/dec), the cold
# start (warmup), and B = 1's nine-split tier from L = 900 against the default
# (tiers: DECODE_SWEEP_VARIANTS=default,b1_tiers900 python bench/decode_sweep.py
# --build .device/s55/tiers). The cluster meeting runs through gpu_session53.sh.
# Carry .device/s55. Usage: bash bench/gpu_session55.sh [decbench] [warmup] [tiers] [raw]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s55
for step in ${*:-decbench}; do
  case $step in
  decbench)  # the issue's table: ETC static/dynamic against eager, one graph, torch.compile
    issue_bench .device/s55/dec
    ;;
  warmup)  # cold process to the first token over the same artifact
    mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s55/dec
    ;;
  tiers)  # item 257: -1.0 % at L = 1024 from L = 576, +0.3 % at 768; from 900: 1024's gain alone?
    SWEEP_TMP=/tmp/s55 sweep_passes s55_tiers default,b1_tiers900 1 768,960,1024,1100 \
      .device/s55/tiers
    ;;
  raw)  # every sweep's raw rows
    tar czf "$OUT/raw55.tgz" -C /tmp/s55 raw 2>/dev/null || true
    ;;
  esac
done

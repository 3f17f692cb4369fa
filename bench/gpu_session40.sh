#!/usr/bin/env bash
# Fortieth session (bench/RESULTS.md, items 180-): where the tensor-core
# attention's instances spend their time. Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session40.sh [stamps] [sweep] [tests] [decbench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s40
for step in ${*:-stamps}; do
  case $step in
  stamps)  # the B = 2..16 kernel at B = 8, 16 and the large-batch one at 32, 64, each alone,
    # traced with the attention's own clock stamps (DECODE_TRACE_VARIANTS=stamps_mid,stamps_large
    # python bench/decode_trace.py --build .device/s40st)
    for vb in stamps_mid:${MID_BATCHES:-8,16} stamps_large:${LARGE_BATCHES:-32,64}; do
      DECODE_TRACE_VARIANTS=${vb%%:*} DECODE_TRACE_BATCHES=${vb#*:} \
        DECODE_TRACE_CONTEXT=${TRACE_CONTEXTS:-1024,4096} timeout ${TRACE_TIMEOUT:-200} \
        python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s40st} \
        --out /tmp/s40/tr_${vb%%:*} 2>&1 | tee -a "$OUT/trace.txt" \
        | grep -A8 "^== \|attention stamps"
    done
    tar czf "$OUT/traces.tgz" -C /tmp/s40 .
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

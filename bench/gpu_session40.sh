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
        --out /tmp/s40/tr_${vb%%:*} 2>&1 | tee -a "$OUT/trace${TRACE_TAG:-}.txt" \
        | grep "^== \|^attention stamps\|^  [a-z]"
    done
    tar czf "$OUT/traces${TRACE_TAG:-}.tgz" -C /tmp/s40 $(cd /tmp/s40 && ls -d tr_*)
    rm -rf /tmp/s40/tr_*
    ;;
  sweep)  # the tile's setup loads issued together ("loadsfirst", python bench/decode_sweep.py
    # --build after the change, renamed) against "default" (built before it) in .device/s40sw
    SWEEP_TMP=/tmp/s40 sweep_passes s40_loadsfirst ${SWEEP_VARIANTS:-default,loadsfirst} \
      ${SWEEP_BATCHES:-2,8,16,32,64} ${SWEEP_CONTEXTS:-1024,4096} ${SWEEP_DIR:-.device/s40sw}
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

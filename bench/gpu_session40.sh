#!/usr/bin/env bash
# Fortieth session (bench/RESULTS.md, items 180-): where the tensor-core
# attention's instances spend their time. Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session40.sh [stamps] [sweep] [sweep2] [tests] [decbench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s40
for step in ${*:-stamps}; do
  case $step in
  stamps)  # the B = 2..16 kernel at B = 8, 16 and the large-batch one at 32, 64, each alone,
    # traced with the attention's own clock stamps (DECODE_TRACE_VARIANTS=stamps_mid,stamps_large
    # python bench/decode_trace.py --build .device/s40st)
    for vb in ${STAMPS_RUNS:-stamps_mid:8,16 stamps_large:32,64}; do
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
    # --build after the change, renamed), then without the ring start's global proxy fence
    # ("nofence", the same), against "default" (built before them) in .device/s40sw
    SWEEP_TMP=/tmp/s40 sweep_passes s40_loadsfirst ${SWEEP_VARIANTS:-default,loadsfirst,nofence} \
      ${SWEEP_BATCHES:-2,8,16,32,64} ${SWEEP_CONTEXTS:-1024,4096} ${SWEEP_DIR:-.device/s40sw}
    ;;
  sweep2)  # each CTA's next queue entry loaded ahead, satisfied waits skipped, or both
    # (DECODE_SWEEP_VARIANTS=default,lists_ahead,lists_memo,lists_both python
    # bench/decode_sweep.py --build .device/s40sw2)
    SWEEP_TMP=/tmp/s40 sweep_passes s40_lists ${SWEEP_VARIANTS:-default,lists_ahead,lists_memo,lists_both} \
      ${SWEEP_BATCHES:-1,8,32,64} ${SWEEP_CONTEXTS:-1024,4096} .device/s40sw2
    ;;
  sweep3)  # the wait memo in the B = 2..16 kernel alone (DECODE_SWEEP_VARIANTS=default,mid_memo
    # python bench/decode_sweep.py --build .device/s40sw3)
    SWEEP_TMP=/tmp/s40 sweep_passes s40_mid_memo ${SWEEP_VARIANTS:-default,mid_memo} \
      ${SWEEP_BATCHES:-2,4,8,12,16} ${SWEEP_CONTEXTS:-1024,4096} .device/s40sw3
    ;;
  tests)  # the tiny decoders against the simulator (python test/gpu/make_artifacts.py
    # .device/s40art --only llama_tiny_lists, and llama_tiny_mma_tma_capped_lists)
    ETC_ARTIFACTS=${TESTS_ARTS:-.device/s40art} timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "${TESTS_K:-lists}" 2>&1 | tee "$OUT/tests.txt" | tail -8
    ;;
  decbench)  # bench/decode.py over the default artifact (python bench/decode.py --build
    # .device/s40dec): the check against Hugging Face, and the timings with torch.compile
    DECODE_PARTS=${DECODE_PARTS:-check,time} decode_bench .device/s40dec \
      --compile-batches ${COMPILE_BATCHES:-1,8,32,64} --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

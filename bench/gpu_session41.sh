#!/usr/bin/env bash
# Forty-first session (bench/RESULTS.md, items 185-): tensor-core attention
# instances that attend several kv heads on one TMA ring (LlamaConfig.attn_items).
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session41.sh [tests] [sweep] [sweep2] [sweep3] [stamps] [decbench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s41
for step in ${*:-tests sweep}; do
  case $step in
  tests)  # the tiny decoders with attn_items=2 against the simulator, bit-repeatable
    # (python test/gpu/make_artifacts.py .device/s41art --only llama_tiny_mma_tma_items,
    # and llama_tiny_mma_tma_capped_items)
    ETC_ARTIFACTS=${TESTS_ARTS:-.device/s41art} timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "${TESTS_K:-items}" 2>&1 | tee "$OUT/tests.txt" | tail -8
    ;;
  sweep)  # the large-batch kernel alone with 1, 2 or 4 items per attention instance
    # (DECODE_SWEEP_VARIANTS=large,large_items2,large_items4 python bench/decode_sweep.py
    # --build .device/s41sw)
    SWEEP_TMP=/tmp/s41 sweep_passes s41_items ${SWEEP_VARIANTS:-large,large_items2,large_items4} \
      ${SWEEP_BATCHES:-17,32,48,64} ${SWEEP_CONTEXTS:-1024,4096} ${SWEEP_DIR:-.device/s41sw}
    tar czf "$OUT/sweep_raw.tgz" -C /tmp/s41 raw
    ;;
  sweep2)  # the default artifact before ("default") and after ("lfirst") warp 0's state
    # starts from position L (DECODE_SWEEP_VARIANTS=default, then lfirst, python
    # bench/decode_sweep.py --build .device/s41ab, each built with its code)
    SWEEP_TMP=/tmp/s41 sweep_passes s41_lfirst default,lfirst ${SWEEP_BATCHES:-1,8,32,64} \
      ${SWEEP_CONTEXTS:-1024,4096} .device/s41ab
    ;;
  sweep3)  # B = 1 on the tensor-core attention: no B = 1 kernel, or its attention the
    # B = 2..16 kernel's (DECODE_SWEEP_VARIANTS=default,one_mid,one_mma python
    # bench/decode_sweep.py --build .device/s41one)
    SWEEP_TMP=/tmp/s41 sweep_passes s41_one ${SWEEP_VARIANTS:-default,one_mid,one_mma} ${SWEEP_BATCHES:-1} \
      ${SWEEP_CONTEXTS:-1024,4096} .device/s41one
    ;;
  stamps)  # the large kernel with 2 items, its attention stamped (DECODE_TRACE_VARIANTS=
    # stamps_large_items2 python bench/decode_trace.py --build .device/s41st)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-stamps_large_items2} DECODE_TRACE_BATCHES=${TRACE_BATCHES:-64} \
      DECODE_TRACE_CONTEXT=${TRACE_CONTEXTS:-1024,4096} timeout 200 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s41st} --out /tmp/s41/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep "^== \|^attention stamps\|^  [a-z]"
    tar czf "$OUT/traces.tgz" -C /tmp/s41 tr
    ;;
  decbench)  # bench/decode.py over the default artifact (python bench/decode.py --build
    # .device/s41dec): the check against Hugging Face, and the timings with torch.compile
    DECODE_PARTS=${DECODE_PARTS:-check,time} decode_bench .device/s41dec \
      --compile-batches ${COMPILE_BATCHES:-1,8,32,64} --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

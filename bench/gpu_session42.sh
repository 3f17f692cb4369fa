#!/usr/bin/env bash
# Forty-second session (bench/RESULTS.md, items 191-): the B = 1 kernel by
# context, a kernel per range of L inside the B = 1 bucket (nested buckets).
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session42.sh [cross] [tests] [sweep] [trace] [decbench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s42
for step in ${*:-cross}; do
  case $step in
  cross)  # where B = 1's tensor-core attention starts to pay: the phased B = 1 kernel
    # ("default") against the tensor-core one ("one_mma") over contexts
    # (DECODE_SWEEP_VARIANTS=default,one_mma python bench/decode_sweep.py --build .device/s42one)
    SWEEP_TMP=/tmp/s42 sweep_passes s42_cross ${SWEEP_VARIANTS:-default,one_mma} ${SWEEP_BATCHES:-1} \
      ${SWEEP_CONTEXTS:-1024,1536,2048,2560,3072,4096} ${SWEEP_DIR:-.device/s42one}
    tar czf "$OUT/sweep_raw.tgz" -C /tmp/s42 raw
    ;;
  tests)  # the tiny decoders against the simulator, bit-repeatable
    # (python test/gpu/make_artifacts.py .device/s42art --only PREFIX)
    ETC_ARTIFACTS=${TESTS_ARTS:-.device/s42art} timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "${TESTS_K:-buckets}" 2>&1 | tee "$OUT/tests.txt" | tail -8
    ;;
  sweep)  # variants of the default artifact (DECODE_SWEEP_VARIANTS=... python
    # bench/decode_sweep.py --build .device/s42sw)
    SWEEP_TMP=/tmp/s42 sweep_passes s42_sweep ${SWEEP_VARIANTS:-default,lbuckets} \
      ${SWEEP_BATCHES:-1,2} ${SWEEP_CONTEXTS:-1024,4096} ${SWEEP_DIR:-.device/s42sw}
    tar czf "$OUT/sweep_raw.tgz" -C /tmp/s42 raw
    ;;
  trace)  # the default artifact traced at B = 1, L = 1024 and 4096 (its two B = 1
    # kernels; DECODE_TRACE_VARIANTS=default python bench/decode_trace.py --build .device/s42tr)
    DECODE_TRACE_VARIANTS=default DECODE_TRACE_BATCHES=${TRACE_BATCHES:-1} \
      DECODE_TRACE_CONTEXT=${TRACE_CONTEXTS:-1024,4096} timeout 200 \
      python bench/decode_trace.py --artifacts .device/s42tr --out /tmp/s42/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep -A12 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s42 tr
    ;;
  decbench)  # bench/decode.py over the default artifact (python bench/decode.py --build
    # .device/s42dec): the check against Hugging Face, and the timings with torch.compile
    DECODE_PARTS=${DECODE_PARTS:-check,time} decode_bench .device/s42dec \
      --compile-batches ${COMPILE_BATCHES:-1,8,32,64} --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

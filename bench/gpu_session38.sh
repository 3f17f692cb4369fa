#!/usr/bin/env bash
# Thirty-eighth session (bench/RESULTS.md, items 170-): the compiled PyTorch
# step with one cache buffer a layer, and the decoder's timings against it.
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session38.sh [probe] [decbench] [trace] [tests] [sweep] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s38
for step in ${*:-probe}; do
  case $step in
  probe)  # the compiled step's time and kernels at each B, L = 1024 (no CPU-side build)
    PROBE_TIMEOUT=${PROBE_TIMEOUT:-300} compile_probe "1 8 64" 90
    ;;
  decbench)  # bench/decode.py's timings over the default artifact, torch.compile at
    # every B and both contexts (python bench/decode.py --build .device/s38dec)
    DECODE_PARTS=time decode_bench .device/s38dec --compile-batches ${COMPILE_BATCHES:-1,8,32,64} \
      --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  trace)  # the default artifact traced at TRACE_BATCHES, L = 1024
    # (DECODE_TRACE_VARIANTS=default python bench/decode_trace.py --build .device/s38tr)
    DECODE_TRACE_VARIANTS=default DECODE_TRACE_BATCHES=${TRACE_BATCHES:-1,8,32,64} timeout 300 \
      python bench/decode_trace.py --artifacts .device/s38tr --out /tmp/s38/tr 2>&1 \
      | tee "$OUT/trace.txt" | grep -A12 "^== \|layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s38 tr
    ;;
  tests)  # the tiny decoders against the simulator (python test/gpu/make_artifacts.py
    # .device/s38art --only llama_tiny)
    ETC_ARTIFACTS=.device/s38art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "${TESTS_K:-matches_the_simulator}" 2>&1 \
      | tee "$OUT/tests.txt" | tail -8
    ;;
  sweep)  # the split count by batch against spans of 256, B = 2..16
    # (DECODE_SWEEP_VARIANTS=default,spans256 python bench/decode_sweep.py --build .device/s38sw)
    SWEEP_TMP=/tmp/s38 sweep_passes s38_sweep ${SWEEP_VARIANTS:-default,spans256} \
      ${SWEEP_BATCHES:-2,4,8,12,16} 1024,4096 .device/s38sw
    tar czf "$OUT/s38_sweep_raw.tgz" -C /tmp/s38 raw
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

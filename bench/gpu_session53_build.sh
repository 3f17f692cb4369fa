#!/usr/bin/env bash
# The CPU-side builds of bench/gpu_session53.sh: the GPU tests' artifacts of
# the cluster meeting (the tiny decoder and Llama-3.2-1B's large kernel with
# its variants) into .device/s53/tests, and the sweep's default, unshared and
# cluster kernels into .device/s53/sweep (carry .device/s53).
# and the stamped kernels into .device/s53/st.
# Usage: bash bench/gpu_session53_build.sh [tests] [sweep] [stamps]
set -euo pipefail
cd "$(dirname "$0")/.."
for part in ${*:-tests sweep stamps}; do
  case $part in
  tests)
    python test/gpu/make_artifacts.py .device/s53/tests --only 'llama_tiny_tma_cluster,llama_1b_large$,llama_1b_large_share$,llama_1b_large_unshared,llama_1b_large_rows,llama_1b_large_cluster'
    ;;
  sweep)
    DECODE_SWEEP_VARIANTS=default,unshared,cluster DECODE_SWEEP_BATCHES=32,64 \
      python bench/decode_sweep.py --build .device/s53/sweep
    ;;
  stamps)
    DECODE_TRACE_VARIANTS=stamps_large,stamps_cluster python bench/decode_trace.py \
      --build .device/s53/st
    ;;
  esac
done
du -sh .device/s53/* 2>/dev/null

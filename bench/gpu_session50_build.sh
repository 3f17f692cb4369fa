#!/usr/bin/env bash
# The CPU-side builds of bench/gpu_session50.sh (~4 minutes on 2 cores):
# the tiny GPU-test artifacts into .device/s50/art (28 MB) and the rest into
# .device/s50/{sweep,tr,st,dyn,dec} (30 MB); together 58 MB, under the device
# tool's 64 MiB carry (carry .device/s50).
# Usage: bash bench/gpu_session50_build.sh [art] [rest]
set -euo pipefail
cd "$(dirname "$0")/.."
for part in ${*:-art rest}; do
  case $part in
  art)
    for p in llama_tiny_context llama_tiny_tma_gemm_stamps llama_tiny_ragged \
      llama_tiny_online_ragged llama_tiny_mma_tma_ragged llama_tiny_buckets_ragged; do
      python test/gpu/make_artifacts.py .device/s50/art --only $p | tail -1
    done
    ;;
  rest)
    DECODE_SWEEP_VARIANTS=default,b1_tiers,ragged python bench/decode_sweep.py --build .device/s50/sweep
    DECODE_TRACE_VARIANTS=default,b1_one_pass python bench/decode_trace.py --build .device/s50/tr
    DECODE_TRACE_VARIANTS=default,stamps_large python bench/decode_trace.py --build .device/s50/st
    python bench/decode_trace.py --build .device/s50/dyn
    python bench/decode.py --build .device/s50/dec
    ;;
  esac
done
du -sh .device/s50/* 2>/dev/null

#!/usr/bin/env bash
# Fifty-third session (written without a device): the large kernel's split-K
# parts meeting in pairs on thread-block clusters of 2 (`cluster`) against
# the default and the same without down's shared sums (`unshared`). Build:
# DECODE_SWEEP_VARIANTS=default,unshared,cluster DECODE_SWEEP_BATCHES=32,64 \
#   python bench/decode_sweep.py --build .device/s53/sweep
# and the GPU tests' artifacts (bench/gpu_session50_build.sh's way) for
# `tests`, and the stamped kernels for `stamps`. Usage: bash
# bench/gpu_session53.sh [tests] [cluster] [stamps] [raw]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s53
for step in ${*:-cluster}; do
  case $step in
  tests)  # the clustered launch, the tiny decoder's cluster meeting, the 1B kernel's
    ETC_ARTIFACTS=.device/s53/tests timeout 500 python -m pytest -q -x test/gpu/test_llama_gpu.py \
      -k "cluster or shared_split_k" 2>&1 | tail -15 | tee "$OUT/s53_tests.txt"
    ;;
  cluster)  # expected: -5..-8 % at B = 32-64 if item 258's model holds
    SWEEP_TMP=/tmp/s53 sweep_passes s53_cluster default,unshared,cluster 32,64 \
      1024,4096 .device/s53/sweep
    ;;
  stamps)  # if `cluster` does not gain: the stamped parts, pairs against the default
    DECODE_TRACE_VARIANTS=stamps_large,stamps_cluster DECODE_TRACE_BATCHES=32,64 \
      DECODE_TRACE_CONTEXT=1024 timeout 300 \
      python bench/decode_trace.py --artifacts .device/s53/st --out /tmp/s53/st 2>&1 \
      | tail -60 | tee "$OUT/s53_stamps.txt"
    ;;
  raw)  # every sweep's raw rows
    tar czf "$OUT/raw.tgz" -C /tmp/s53 raw 2>/dev/null || true
    ;;
  esac
done

#!/usr/bin/env bash
# Twenty-fifth session (bench/RESULTS.md item 100): chunked expert weights.
# Not run in that session (no GPU was lent); ready for the next one.
# Built with (CPU machine):
#   .device/n25a: BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 \
#       BENCH_MOE_CONFIGS=single,single_ch64,single_ch128,few,few_ch64,dec_pf_gu32,dec_pf_gu32_ch64 \
#       python bench/moe.py --build .device/n25a/moe
#     python test/gpu/make_artifacts.py .device/n25a/arts --only moe_small_chunk (and
#       --only moe_small_ringpf_chunk, --only moe_small_slots_chunk)
# Usage: bash bench/gpu_session25.sh [stream] [tests] [chunk]   (all three: ~6 minutes)
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
A=.device/n25a
mkdir -p /tmp/s25
export AB_TMP=/tmp/s25
ab() { moe_ab "$@"; }
for step in ${*:-stream tests chunk}; do
  case $step in
  stream)  # the three access patterns alone (bench/weight_stream.cu), twice
    nvcc -O3 -arch=sm_90a -o /tmp/s25/ws bench/weight_stream.cu && for pass in 1 2; do
      timeout 60 /tmp/s25/ws; done 2>&1 | tee "$OUT/weight_stream.txt"
    ;;
  tests)  # the chunked tiles (register loop, ring and its fill, slot rings) against the simulator
    ETC_ARTIFACTS=$A/arts timeout 250 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k chunk \
      2>&1 | tail -3 | tee "$OUT/tests_chunk.txt"
    ;;
  chunk)
    ab chunk single,single_ch64,single_ch128,few,few_ch64 1,2,4 $A 1
    ab chunkdec dec_pf_gu32,dec_pf_gu32_ch64 8,16 $A
    ;;
  esac
done

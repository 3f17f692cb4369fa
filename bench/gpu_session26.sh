#!/usr/bin/env bash
# Twenty-sixth session (bench/RESULTS.md, MoE section): gate/up slot tiles
# that also project their own columns down (MoEConfig.fuse_down), A/B
# against the single preset at T = 1, 2, traced; and the stream ceiling
# (bench/stream_ceiling.cu).
# Built with (CPU machine):
#   BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 \
#     BENCH_MOE_CONFIGS=single,single_fd,single_fd_gu24,single_fd_gu16 \
#     python bench/moe.py --build .device/n26a/moe --trace
# Usage: bash bench/gpu_session26.sh [stream] [fused] [tests] [tiles] [tiles2] [norot]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
A=.device/n26a
mkdir -p /tmp/s26
export AB_TMP=/tmp/s26
for step in ${*:-stream fused tests tiles tiles2 norot}; do
  case $step in
  stream)
    nvcc -O3 -arch=sm_90a -o /tmp/s26/sc bench/stream_ceiling.cu && timeout 120 /tmp/s26/sc \
      2>&1 | tee "$OUT/stream_ceiling.txt"
    ;;
  fused)
    moe_ab moe-fd single,single_fd,single_fd_gu24,single_fd_gu16 1,2 $A 1
    ;;
  tests)  # (.device/n26c: python test/gpu/make_artifacts.py .device/n26c/arts --only moe_small_slots_fused)
    ETC_ARTIFACTS=.device/n26c/arts timeout 280 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k slots_fused 2>&1 | tee "$OUT/tests.txt" | tail -15
    ;;
  tiles)  # (.device/n26d: python bench/moe_tile_stream.py --build .device/n26d/tiles)
    timeout 280 python bench/moe_tile_stream.py --artifacts .device/n26d/tiles \
      --out "$OUT/moe_tile_stream.txt"
    ;;
  tiles2)  # (.device/n26e: BENCH_TILE_VARIANTS=s4u2,s4u2_ch32,s4u2_a1,s4u2_a2,s4u2_ch32_a1,s4u2_w124,s4u1_w118
    #  python bench/moe_tile_stream.py --build .device/n26e/tiles)
    BENCH_TILE_VARIANTS=s4u2,s4u2_ch32,s4u2_a1,s4u2_a2,s4u2_ch32_a1,s4u2_w124,s4u1_w118 timeout 280 \
      python bench/moe_tile_stream.py --artifacts .device/n26e/tiles --out "$OUT/moe_tile_stream2.txt"
    ;;
  norot)  # (.device/n26b: BENCH_MOE_CONFIGS=single,single_norot,single_ch32,single_norot_ch32)
    moe_ab moe-norot single,single_norot,single_ch32,single_norot_ch32 1,2 .device/n26b 1
    ;;
  esac
done

#!/usr/bin/env bash
# Twenty-eighth session (bench/RESULTS.md, "GEMM tiles"): split-K parts that
# meet in the dense TMA tile, and 128 x 192 blocks, on the MoE expert shapes.
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session28.sh [tests] [gemm] [moe] [stages] [refill] [final] [launch] [examples] [wide]
set -uo pipefail
mkdir -p /tmp/s28
source "$(dirname "$0")/gpu_common.sh"
# Run 1 of the gemm step (the first meeting: row-major float32 parts, 8-byte
# accesses) used these:
GEMM1_CONFIGS=tma128x128s4,tma128x256s4,tma128x192s4,tma128x192s4k2,tma128x256s4k2,tma128x128s4k2,tma128x256s4k3,moe_gu_128x64s4,moe_gu_128x128s4,moe_dn_128x128s4,moe_dn_128x256s4
GEMM1_SHAPES=1024x1536x2048,4096x1536x2048,8192x1536x2048,1024x2048x768,4096x2048x768,8192x2048x768
# Runs 2 and 3 (the parts in fragment order, 16-byte accesses, the last
# part's own in registers; then the loads double-buffered), with grids of a
# few blocks (M = 256, 512):
GEMM_CONFIGS=tma128x128s4,tma128x256s4,tma128x192s4,tma128x192s4k2,tma128x256s4k2,tma128x128s4k2,tma128x128s4k4,tma128x256s4k3,moe_gu_128x64s4,moe_dn_128x128s4
GEMM_SHAPES=1024x1536x2048,4096x1536x2048,1024x2048x768,4096x2048x768,256x1536x2048,256x2048x768,512x4096x8192
STAGE_CONFIGS=tma128x128s4,tma128x128s5,tma128x128s6,tma128x192s4,tma128x192s5,tma128x256s4,tma128x128s6k2,tma128x192s4k2
STAGE_SHAPES=1024x1536x2048,1024x2048x768,256x1536x2048,4096x1536x2048,8192x8192x8192
# (plain: refill="wait", the default; "...t": refill="test")
REFILL_CONFIGS=tma128x128s4,tma128x128s4t,tma128x192s4,tma128x192s4t,tma128x256s4,tma128x256s4t,tma128x192s4k2,tma128x192s4k2t
REFILL_SHAPES=1024x1536x2048,1024x2048x768,4096x1536x2048,4096x2048x768,8192x8192x8192
# The final run (refill="wait" in both the plain and the "...w" configurations:
# twins that measure the run's noise):
FINAL_CONFIGS=tma128x128s4,tma128x128s4w,tma128x192s4,tma128x192s4w,tma128x256s4,tma128x256s4w,tma128x192s4k2,tma128x256s4k2,tma128x128s4k4,moe_gu_128x64s4,moe_gu_128x128s4,moe_dn_128x128s4,moe_dn_128x256s4
FINAL_SHAPES=1024x1536x2048,4096x1536x2048,8192x1536x2048,1024x2048x768,4096x2048x768,8192x2048x768,256x1536x2048,512x4096x8192
WIDE_CONFIGS=tma128x128s4,tma128x256s4,tma64x256s4,tma64x256s2o2,tma64x192s4,moe_dn_128x128s4
WIDE_SHAPES=1024x1536x2048,1024x2048x768,4096x1536x2048,4096x2048x768
for step in ${*:-tests gemm}; do
  case $step in
  tests)  # (.device/n28: python test/gpu/make_artifacts.py .device/n28/art --only gemm_meet)
    ETC_ARTIFACTS=.device/n28/art timeout 200 python -m pytest -q -rs test/gpu/test_gemm_gpu.py \
      2>&1 | tee "$OUT/tests_gemm.txt" | tail -4
    ;;
  gemm)  # two passes (.device/n28: BENCH_GEMM_CONFIGS=$GEMM_CONFIGS BENCH_GEMM_SHAPES=$GEMM_SHAPES
    #  python bench/gemm_tma.py --build .device/n28/gemm)
    gemm_passes gemm-tma $GEMM_CONFIGS $GEMM_SHAPES .device/n28/gemm
    ;;
  stages)  # deeper rings (.device/n28: BENCH_GEMM_CONFIGS=$STAGE_CONFIGS
    #  BENCH_GEMM_SHAPES=$STAGE_SHAPES python bench/gemm_tma.py --build .device/n28/gemm2)
    gemm_passes gemm-stages $STAGE_CONFIGS $STAGE_SHAPES .device/n28/gemm2
    ;;
  refill)  # stages refilled when free (.device/n28: BENCH_GEMM_CONFIGS=$REFILL_CONFIGS
    #  BENCH_GEMM_SHAPES=$REFILL_SHAPES python bench/gemm_tma.py --build .device/n28/gemm3)
    gemm_passes gemm-refill $REFILL_CONFIGS $REFILL_SHAPES .device/n28/gemm3
    ;;
  final)  # (.device/n28: BENCH_GEMM_CONFIGS=$FINAL_CONFIGS BENCH_GEMM_SHAPES=$FINAL_SHAPES
    #  python bench/gemm_tma.py --build .device/n28/gemm4)
    gemm_passes gemm-final $FINAL_CONFIGS $FINAL_SHAPES .device/n28/gemm4
    ;;
  launch)  # what a launch costs, and a dense GEMM's time traced (.device/n28:
    #  python bench/launch_floor.py --build .device/n28/launch;
    #  python bench/gemm_trace.py --build .device/n28/trace)
    timeout 120 python bench/launch_floor.py --artifacts .device/n28/launch \
      --out "$OUT/launch_floor.txt"
    timeout 200 python bench/gemm_trace.py --artifacts .device/n28/trace --out "$OUT"
    ;;
  examples)  # examples/gemm.py on the GPU (.device/n28: python examples/gemm.py
    #  --save-artifact .device/n28/ex/gemm_k2 -K 2048 --k-splits 2 --block 128x192;
    #  ... ex/gemm -K 2048; ... ex/gemm_dyn -K 2048 --schedule dynamic --k-splits 4)
    ex() { timeout 120 python examples/gemm.py -K 2048 --shapes 1x64,200x300,1024x1536,512x4096,4096x2048 "$@" \
      2>&1 | tee -a "$OUT/examples.txt" | tail -1; }
    ex --artifact .device/n28/ex/gemm_k2 --k-splits 2 --block 128x192
    ex --artifact .device/n28/ex/gemm
    ex --artifact .device/n28/ex/gemm_dyn --schedule dynamic --k-splits 4
    ;;
  wide)  # one 64-row warpgroup per CTA, 256 columns (.device/n28: BENCH_GEMM_CONFIGS=$WIDE_CONFIGS
    #  BENCH_GEMM_SHAPES=$WIDE_SHAPES python bench/gemm_tma.py --build .device/n28/gemm5)
    gemm_passes gemm-wide $WIDE_CONFIGS $WIDE_SHAPES .device/n28/gemm5
    ;;
  moe)  # the prefill preset with 96-column gate/up blocks (.device/n28b:
    #  BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=prefill,pre_gu96
    #  python bench/moe.py --build .device/n28b/moe)
    mkdir -p /tmp/s28; AB_TMP=/tmp/s28 AB_GREP="(prefill|gu96).*GPU" AB_TIMEOUT=300 \
      moe_ab moe-gu96 prefill,pre_gu96 1024,4096 .device/n28b
    ;;
  esac
done

#!/usr/bin/env bash
# Twenty-sixth session (bench/RESULTS.md, MoE section): gate/up slot tiles
# that also project their own columns down (MoEConfig.fuse_down), A/B
# against the single preset at T = 1, 2, traced; and the stream ceiling
# (bench/stream_ceiling.cu).
# Built with (CPU machine):
#   BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 \
#     BENCH_MOE_CONFIGS=single,single_fd,single_fd_gu24,single_fd_gu16 \
#     python bench/moe.py --build .device/n26a/moe --trace
# Usage: bash bench/gpu_session26.sh [stream] [fused] [tests] [tiles] [tiles2] [launch] [gemv] [stages] [final] [narrow] [buckets] [norot]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
A=.device/n26a
mkdir -p /tmp/s26
export AB_TMP=/tmp/s26
for step in ${*:-stream fused tests tiles tiles2 launch gemv stages final narrow buckets norot}; do
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
  launch)  # (.device/n26f: python bench/launch_floor.py --build .device/n26f/launch)
    timeout 120 python bench/launch_floor.py --artifacts .device/n26f/launch \
      --out "$OUT/launch_floor.txt"
    ;;
  gemv)  # (.device/n26g: BENCH_MOE_CONFIGS=single,single_ch32,single_gemv,single_gemv_s8,few,few_gemv
    #  python bench/moe.py --build .device/n26g/moe --trace; BENCH_TILE_VARIANTS=s4u2,s4u2_ch32,gemv_s4,gemv_s8
    #  python bench/moe_tile_stream.py --build .device/n26g/tiles; python test/gpu/make_artifacts.py
    #  .device/n26g/arts --only moe_small_slots_gemv)
    ETC_ARTIFACTS=.device/n26g/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k slots_gemv 2>&1 | tee "$OUT/tests_gemv.txt" | tail -4
    BENCH_TILE_VARIANTS=s4u2,s4u2_ch32,gemv_s4,gemv_s8 timeout 200 python bench/moe_tile_stream.py \
      --artifacts .device/n26g/tiles --out "$OUT/moe_tile_stream3.txt"
    moe_ab moe-gemv single,single_ch32,single_gemv,single_gemv_s8 1,2 .device/n26g 1
    AB_GREP="few.*occ.*GPU" moe_ab moe-gemv-few few,few_gemv 3,4,5 .device/n26g
    ;;
  stages)  # (.device/n26h: BENCH_MOE_CONFIGS=single,single_gemv_s8_8,single_gemv_s10_8,
    #  single_gemv_s12_8,single_gemv_s12_12,few,few_gemv_s8_8,few_gemv_s12_8 python bench/moe.py
    #  --build .device/n26h/moe)
    moe_ab moe-gemv-stages single,single_gemv_s8_8,single_gemv_s10_8,single_gemv_s12_8,single_gemv_s12_12 \
      1,2 .device/n26h
    AB_GREP="few.*occ.*GPU" moe_ab moe-gemv-stages-few few,few_gemv_s8_8,few_gemv_s12_8 3,5 .device/n26h
    ;;
  final)  # (.device/n26i: python test/gpu/make_artifacts.py .device/n26i/arts --only
    #  moe_small_slots_gemv (and moe_small_slots_gemv_chunk, moe_small_family); python
    #  examples/moe.py --preset auto [--topk 1 --routing top1] --save-artifact .device/n26i/ex/auto[_top1];
    #  BENCH_MOE_CONFIGS=auto,single_mma,few_mma python bench/moe.py --build .device/n26i/moe)
    ETC_ARTIFACTS=.device/n26i/arts timeout 240 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k "slots_gemv or one_artifact" 2>&1 | tee "$OUT/tests_final.txt" | tail -3
    run() { timeout 90 python examples/moe.py --preset auto "$@" 2>&1 | tee -a "$OUT/examples.txt"; }
    run --artifact .device/n26i/ex/auto --tokens 1,2,3,4,5,6,8,9,16,128,1024,4096 | tail -14
    run --artifact .device/n26i/ex/auto --routing one-expert --tokens 1,2,5,16,1000 | tail -6
    run --artifact .device/n26i/ex/auto_top1 --topk 1 --routing top1 --tokens 1,2,33 | tail -4
    AB_GREP="(auto|mma).*GPU" moe_ab moe-final auto,single_mma,few_mma 1,2,3,5 .device/n26i
    ;;
  narrow)  # not run in session 26 (its device time was spent): the GEMV slot tiles with
    # narrower blocks, for the next session. (.device/n26j: BENCH_MOE_CONFIGS=single,
    #  single_gemv_gu24,single_gemv_gu16,single_gemv_gu24_dn32 python bench/moe.py --build
    #  .device/n26j/moe --trace)
    moe_ab moe-gemv-narrow single,single_gemv_gu24,single_gemv_gu16,single_gemv_gu24_dn32 1,2 \
      .device/n26j 1
    ;;
  buckets)  # not run in session 26: the GEMV few preset against decode at T = 5-8 (few
    # ends at T = 5 in PRESET_BUCKETS from the mma.sync measurements). (.device/n26k:
    #  BENCH_MOE_CONFIGS=few,dec_pf_gu32 python bench/moe.py --build .device/n26k/moe)
    AB_GREP="(few|dec).*occ.*GPU" moe_ab moe-gemv-buckets few,dec_pf_gu32 5,6,7,8 .device/n26k
    ;;
  norot)  # (.device/n26b: BENCH_MOE_CONFIGS=single,single_norot,single_ch32,single_norot_ch32)
    moe_ab moe-norot single,single_norot,single_ch32,single_norot_ch32 1,2 .device/n26b 1
    ;;
  esac
done

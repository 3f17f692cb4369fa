#!/usr/bin/env bash
# Twenty-fifth session (bench/RESULTS.md item 100): chunked expert weights.
# Ran once at the end of that session (results: bench/RESULTS.md, twenty-fifth session).
# Built with (CPU machine) bash bench/build_session25.sh, which runs:
#   .device/n25a: BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 \
#       BENCH_MOE_CONFIGS=single,single_ch32,single_ch64,single_ch128,single_ch32b,few,few_ch32,few_ch64,few_ch32b,dec_pf_gu32,dec_pf_gu32_ch32,dec_pf_gu32_ch64,dec_pf_gu32_ch32b \
#       python bench/moe.py --build .device/n25a/moe   (and BENCH_MOE_CONFIGS=mid,mid_ch64,prefill,prefill_ch64,auto,auto_ch64)
#     python test/gpu/make_artifacts.py .device/n25a/arts --only moe_small_chunk (and --only
#       moe_small_ringpf_chunk, moe_small_slots_chunk, moe_small_slots_bulk_chunk,
#       moe_small_tma_chunk, moe_small_family, llama_tiny_chunk, llama_tiny_tma_chunk,
#       llama_tiny_bulk_chunk)
#     DECODE_SWEEP_VARIANTS=sync_only,sync_only_ch32,sync_only_ch64,sync_only_ch128,sync_only_ch32b,default,default_ch64 \
#       python bench/decode_sweep.py --build .device/n25a/dec
# Usage: bash bench/gpu_session25.sh [stream] [tests] [chunk] [tma] [auto] [decoder]
# (~15 minutes in all: run it in two or three calls)
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
A=.device/n25a
mkdir -p /tmp/s25
export AB_TMP=/tmp/s25
ab() { moe_ab "$@"; }
for step in ${*:-stream tests chunk tma auto decoder}; do
  case $step in
  stream)  # the three access patterns alone (bench/weight_stream.cu), twice
    nvcc -O3 -arch=sm_90a -o /tmp/s25/ws bench/weight_stream.cu && for pass in 1 2; do
      timeout 60 /tmp/s25/ws; done 2>&1 | tee "$OUT/weight_stream.txt"
    ;;
  tests)  # the chunked tiles (MoE: register loop, ring and its fill, slot rings; the tiny
    # decoder, also under the L2 prefetch) against the simulator
    ETC_ARTIFACTS=$A/arts timeout 280 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      test/gpu/test_llama_gpu.py -k "chunk or one_artifact" 2>&1 | tail -3 | tee "$OUT/tests_chunk.txt"
    ;;
  chunk)  # the GEMV presets, rows against chunks of 32, 64, 128 (and 32 with bulk rings)
    ab chunk single,single_ch32,single_ch64,single_ch128,single_ch32b 1,2 $A 1
    ab chunkfew few,few_ch32,few_ch64,few_ch32b 3,4 $A
    ab chunkdec dec_pf_gu32,dec_pf_gu32_ch32,dec_pf_gu32_ch64,dec_pf_gu32_ch32b 8,16 $A
    ;;
  tma)  # the TMA presets through 2-D and 4-D maps
    AB_GREP="GPU time" ab chunkmid mid,mid_ch64 16,128 $A
    AB_GREP="GPU time" ab chunkpre prefill,prefill_ch64 1024,4096 $A
    ;;
  auto)  # the shipped five-kernel artifact, rows against chunks of 64
    AB_GREP="GPU time" ab chunkauto auto,auto_ch64 1,2,4,8,16,128,1024,4096 $A
    ;;
  decoder)  # two sync-core kernels at B = 1 and 8; the default three kernels at every B
    for pass in 1 2; do
      v=sync_only,sync_only_ch32,sync_only_ch64,sync_only_ch128,sync_only_ch32b
      [ $pass = 2 ] && v=sync_only_ch32b,sync_only_ch128,sync_only_ch64,sync_only_ch32,sync_only
      DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=1,8 timeout 250 python bench/decode_sweep.py \
        --artifacts $A/dec --out "$OUT/dec_$pass.json" 2>&1 | tail -8 | tee -a "$OUT/decoder.txt"
      v=default,default_ch64; [ $pass = 2 ] && v=default_ch64,default
      DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=1,8,32,64 timeout 250 python bench/decode_sweep.py \
        --artifacts $A/dec --out "$OUT/dec_all_$pass.json" 2>&1 | tail -8 | tee -a "$OUT/decoder.txt"
    done
    ;;
  esac
done

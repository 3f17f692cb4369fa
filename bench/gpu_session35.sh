#!/usr/bin/env bash
# Thirty-fifth session (bench/RESULTS.md, items 151-): split-K sums shared by
# each block's last parts to arrive (meet_share), in the decoder's large-batch
# kernel and in the dense GEMM tile. Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session35.sh [tests] [gemm] [sweep] [tests2] [sweep2] [trace] [tests3] [tests4] [ncu] [sweep3] [moe] [moe2] [moebench] [bench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s35/raw
GEMM_TMP=/tmp/s35
SHARE_GEMMS=tma128x192s4k2,tma128x192s4k2sh2,tma128x192s4k2d,tma128x256s4k2,tma128x256s4k2sh2,tma128x128s4k4,tma128x128s4k4sh4
for step in ${*:-sweep}; do
  case $step in
  tests)  # the shared meetings: the dense tile's bits against the plain meeting's, the tiny
    # TMA decoders against the simulator and bit-reproducible, the 1B large kernel's tokens
    # (python test/gpu/make_artifacts.py .device/s35/art --only PREFIX for PREFIX in
    # llama_1b_large llama_tiny_tma_share llama_tiny_tma_buckets_share gemm_meet)
    ETC_ARTIFACTS=.device/s35/art timeout 500 python -m pytest -q -rfs --tb=short \
      test/gpu/test_gemm_gpu.py test/gpu/test_llama_gpu.py \
      -k "gemm or tma_share or tma_buckets_share or shared or 1b_large or ring_layouts" 2>&1 \
      | tee "$OUT/tests.txt" | tail -8
    ;;
  sweep)  # the large kernel with shared meetings against the default, B = 32 and 64
    # (DECODE_SWEEP_VARIANTS=default,share2,share4,share4_down python bench/decode_sweep.py
    # --build .device/s35/sweep)
    SWEEP_TMP=/tmp/s35 sweep_passes s35_sweep default,share2,share4,share4_down \
      32,64 1024,4096 .device/s35/sweep
    ;;
  gemm)  # the dense tile's meeting shared, M = 1024 (python bench/gemm_tma.py --build
    # .device/s35/gemm with BENCH_GEMM_CONFIGS=$SHARE_GEMMS BENCH_GEMM_M=1024)
    gemm_passes s35_gemm $SHARE_GEMMS 1024x1536x2048,1024x2048x768,256x1536x2048 .device/s35/gemm
    ;;
  tests2)  # qkv's and gate/up's sums shared: bit-identical to the plain 1B large kernel
    # (python test/gpu/make_artifacts.py .device/s35/art --only llama_1b_large_share_nosums)
    ETC_ARTIFACTS=.device/s35/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "shared or ring_layouts" 2>&1 | tee "$OUT/tests2.txt" | tail -4
    ;;
  sweep2)  # down's sums shared by 2 or 4, with o_proj's or gate/up's by 2
    # (DECODE_SWEEP_VARIANTS=share2_down,share4_down_o2,share4_down_gu2 python
    # bench/decode_sweep.py --build .device/s35/sweep)
    SWEEP_TMP=/tmp/s35 sweep_passes s35_sweep2 \
      default,share4_down,share2_down,share4_down_o2,share4_down_gu2 32,64 1024,4096 .device/s35/sweep
    ;;
  trace)  # the default and down's sums shared by 4, traced at B = 64, L = 4096
    # (DECODE_TRACE_VARIANTS=default,share4_down python bench/decode_trace.py --build .device/s35/tr)
    DECODE_TRACE_VARIANTS=default,share4_down DECODE_TRACE_BATCHES=64 DECODE_TRACE_CONTEXT=4096 \
      timeout 250 python bench/decode_trace.py --artifacts .device/s35/tr --out /tmp/s35/tr64 2>&1 \
      | tee "$OUT/trace_b64.txt" | grep -A9 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s35 tr64
    ;;
  tests3)  # the adopted default (down's sums shared by 2 in LARGE_BATCH): the tiny decoders
    # whose large bucket takes it against the simulator and bit-reproducible, the 1B large
    # kernel's variants bit-identical, the unshared and all-shared ones close
    # (python test/gpu/make_artifacts.py .device/s35/art2 --only PREFIX for PREFIX in
    # llama_tiny_tma_buckets llama_1b_large llama_tiny_tma_share)
    ETC_ARTIFACTS=.device/s35/art2 timeout 500 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "tma_buckets or tma_share or shared or ring_layouts" 2>&1 \
      | tee "$OUT/tests3.txt" | tail -6
    ;;
  tests4)  # after the review that hoisted the shared meeting's operands: the dense shared tiles
    # against the plain meeting, the tiny shared decoder, the 1B large kernel's groups
    # (python test/gpu/make_artifacts.py .device/s35/art4 --only PREFIX for PREFIX in
    # gemm_meet llama_tiny_tma_share llama_1b_large)
    ETC_ARTIFACTS=.device/s35/art4 timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_gemm_gpu.py test/gpu/test_llama_gpu.py \
      -k "gemm or tma_share or shared or ring_layouts" 2>&1 | tee "$OUT/tests4.txt" | tail -4
    ;;
  sweep3)  # the split projections' later weight boxes asked into L2 before the waits too
    # (DECODE_SWEEP_VARIANTS=default,l2rest_qo,l2rest_qod,l2rest_d python bench/decode_sweep.py
    # --build .device/s35/sweep3)
    SWEEP_TMP=/tmp/s35 sweep_passes s35_sweep3 default,l2rest_qo,l2rest_qod,l2rest_d \
      32,64 1024,4096 .device/s35/sweep3
    ;;
  ncu)  # the large kernel's four projections alone at B = 64 under Nsight Compute: L2 and
    # HBM throughput against their peaks (GEMM_VARIANTS=qkv_tma_frag_s4,o_tma_frag_s4,
    # gu_tma_frag_s2,down_tma_frag_s8_sh2 python bench/decode_gemm.py --build .device/s35/dg)
    for v in qkv_tma_frag_s4 o_tma_frag_s4 gu_tma_frag_s2 down_tma_frag_s8_sh2; do
      echo "== $v" >> "$OUT/ncu.txt"
      GEMM_VARIANTS=$v GEMM_BATCHES=64 timeout 200 ncu --clock-control none -k regex:$v \
        --launch-skip 3 --launch-count 1 --metrics gpu__time_duration.sum,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,\
sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum \
        python bench/decode_gemm.py --artifacts .device/s35/dg --reps 2 2>&1 \
        | grep -E "^\s+(gpu__|dram__|lts__|sm__|l1tex__)|TB/s|==ERR|rror" >> "$OUT/ncu.txt"
    done
    cat "$OUT/ncu.txt"
    ;;
  moe)  # the MoE artifact with a kernel of its own past T = 2048 (prefill_large: top-k
    # blocks of 32, the bulk permute): the family's GPU tests, the real-size examples on both
    # sides of the new bound, and the prefill / prefill_large / auto kernels timed
    # (python test/gpu/make_artifacts.py .device/s35/moeart --only moe_small_family;
    # python examples/moe.py --preset auto --save-artifact .device/s35/moeex/auto;
    # BENCH_MOE_LEAN=1 BENCH_MOE_SCHEDULES=static BENCH_MOE_CONFIGS=prefill,prefill_large,auto
    # BENCH_MOE_SIZES=1024,2048,3072,4096 python bench/moe.py --build .device/s35/moeab/moe)
    moe_checks .device/s35/moeart .device/s35/moeex/auto examples.txt
    AB_TMP=/tmp/s35/ab AB_GREP=GPU moe_ab moe_large prefill,prefill_large,auto 1024,2048,3072,4096 \
      .device/s35/moeab
    ;;
  moe2)  # prefill_large with 64- or 16-token top-k blocks (BENCH_MOE_LEAN=1
    # BENCH_MOE_SCHEDULES=static BENCH_MOE_CONFIGS=prefill_large,pl_tb64,pl_tb16
    # BENCH_MOE_SIZES=3072,4096 python bench/moe.py --build .device/s35/moeab2/moe)
    AB_TMP=/tmp/s35/ab AB_GREP=GPU moe_ab moe_large2 prefill_large,pl_tb64,pl_tb16 3072,4096 \
      .device/s35/moeab2
    ;;
  moebench)  # the MoE issue's benchmark (every baseline, both schedules, the unfused path)
    # over the one artifact (BENCH_MOE_CONFIGS=auto python bench/moe.py --build
    # .device/s35/moefull/moe)
    BENCH_MOE_CONFIGS=auto timeout 520 python bench/moe.py --artifacts .device/s35/moefull/moe \
      --out "$OUT" 2>&1 | tee "$OUT/moe_full.txt" | tail -40
    ;;
  bench)  # the issue's benchmark over the default artifact
    # (python bench/decode.py --build .device/s35/decode)
    decode_bench .device/s35/decode
    ;;
  esac
done
tar czf "$OUT/session35-raw.tgz" -C /tmp/s35 raw 2>/dev/null || true

#!/usr/bin/env bash
# Thirty-seventh session (bench/RESULTS.md, items 165-): the MoE top-k warps
# selecting several tokens at a time, and a model of the decoder's B = 64
# projections with their activation boxes multicast in 2-CTA clusters. Each
# step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session37.sh [tests] [moe] [proto] [checks] [moebench] [sweep] [decbench] [probe] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s37
for step in ${*:-tests}; do
  case $step in
  tests)  # the unrolled top-k layer bit-identical to the plain TMA layer
    # (python test/gpu/make_artifacts.py .device/s37art --only P for P in
    # moe_small_tma_static moe_small_tma_dynamic moe_small_tma_topk)
    ETC_ARTIFACTS=.device/s37art timeout 200 python -m pytest -q -rfs --tb=short \
      test/gpu/test_moe_gpu.py -k "${TESTS_K:-unrolled_topk}" 2>&1 | tee "$OUT/tests.txt" | tail -5
    ;;
  moe)  # the top-k unrolled against the presets, T = 1024 and 4096
    # (BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=<these> python
    # bench/moe.py --build .device/s37moe/moe)
    AB_TMP=/tmp/s37 moe_ab s37_moe \
      ${MOE_CONFIGS:-prefill_large,pl_tku2,pl_tku4,prefill,pre_tb32u4} ${MOE_SIZES:-1024,4096} \
      ${MOE_DIR:-.device/s37moe}
    ;;
  proto)  # bench/multicast_proto.cu (built here: nvcc needs no GPU)
    nvcc -O3 -gencode arch=compute_90a,code=sm_90a bench/multicast_proto.cu -o /tmp/s37/mp \
      && timeout 120 /tmp/s37/mp 2>&1 | tee "$OUT/multicast_proto.txt"
    ;;
  checks)  # prefill_large with its top-k called: the family's GPU tests and the real-size
    # examples (python test/gpu/make_artifacts.py .device/s37b/moeart --only
    # moe_small_family; python examples/moe.py --preset auto --save-artifact
    # .device/s37b/moeex/auto)
    moe_checks .device/s37b/moeart .device/s37b/moeex/auto checks.txt
    ;;
  moebench)  # the MoE issue's benchmark (every baseline, both schedules, the unfused path)
    # over the one artifact (BENCH_MOE_CONFIGS=auto python bench/moe.py --build
    # .device/s37b/moefull/moe)
    BENCH_MOE_CONFIGS=auto timeout 520 python bench/moe.py --artifacts .device/s37b/moefull/moe \
      --out "$OUT" 2>&1 | tee "$OUT/moe_full.txt" | tail -40
    ;;
  sweep)  # the large kernel's projections refilling their rings by test, B = 32 and 64
    # (DECODE_SWEEP_VARIANTS=default,rf_all,rf_gd,rf_qo python bench/decode_sweep.py
    # --build .device/s37sw)
    SWEEP_TMP=/tmp/s37 sweep_passes s37_sweep ${SWEEP_VARIANTS:-default,rf_all,rf_gd,rf_qo} \
      32,64 1024,4096 .device/s37sw
    tar czf "$OUT/s37_sweep_raw.tgz" -C /tmp/s37 raw
    ;;
  decbench)  # bench/decode.py's timings over the default artifact, torch.compile at
    # every B and both contexts (python bench/decode.py --build .device/s37dec)
    DECODE_PARTS=time decode_bench .device/s37dec --compile-batches ${COMPILE_BATCHES:-1,8,32,64} \
      --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  probe)  # why torch.compile's step is slower than eager at B > 1 (no CPU-side build)
    compile_probe "8 64" 60
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

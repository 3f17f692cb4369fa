#!/usr/bin/env bash
# Thirty-sixth session (bench/RESULTS.md, items 158-): the MoE expert GEMMs as the
# layer runs them (grouped, against cuBLAS's batched GEMM), and where the decoder's
# split attention loses. Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session36.sh [grouped] [trace] [tests] [moe] [adopt] [checks] [moebench] [sweep] [regress] [moetrace] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s36
for step in ${*:-grouped}; do
  case $step in
  grouped)  # ETC's MoE tiles over 128 experts against torch.matmul batched and _grouped_mm
    # (BENCH_GROUPED_VARIANTS=$GROUPED_VARIANTS python bench/gemm_grouped.py --build
    # .device/grouped), two passes
    for pass in 1 2; do
      BENCH_GROUPED_VARIANTS=${GROUPED_VARIANTS:-prefill,prefill_large,mid} timeout 250 \
        python bench/gemm_grouped.py --artifacts .device/grouped --out /tmp/s36/g$pass \
        2>&1 | tee -a "$OUT/grouped.txt" | grep -v "^built"
      cp /tmp/s36/g$pass/gemm_grouped.json "$OUT/grouped$pass.json"
    done
    ;;
  trace)  # the default and the attention in spans of 2048 (a combine task), traced at
    # B = 64, L = 4096 (DECODE_TRACE_VARIANTS=default,chunk2048 python bench/decode_trace.py
    # --build .device/s36tr)
    DECODE_TRACE_VARIANTS=default,chunk2048 DECODE_TRACE_BATCHES=64 DECODE_TRACE_CONTEXT=4096 \
      timeout 250 python bench/decode_trace.py --artifacts .device/s36tr --out /tmp/s36/tr64 2>&1 \
      | tee "$OUT/trace_b64.txt" | grep -A12 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s36 tr64
    ;;
  tests)  # the ring passes' MoE layers bit-identical to the plain TMA layer
    # (python test/gpu/make_artifacts.py .device/s36art --only P for P in moe_small_tma_
    # moe_small_tma_ring moe_small_tma_static moe_small_tma_dynamic)
    ETC_ARTIFACTS=.device/s36art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_moe_gpu.py -k "${TESTS_K:-ring_passes or session33 or short_blocks}" 2>&1 \
      | tee "$OUT/tests.txt" | tail -5
    ;;
  moe)  # the layer with the ring passes against prefill_large, T = 1024 and 4096
    # (BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=<these> python
    # bench/moe.py --build .device/s36moe/moe)
    AB_TMP=/tmp/s36 moe_ab s36_moe \
      ${MOE_CONFIGS:-prefill_large,pl_ring,pl_ring_gu,pl_ring_dn} ${MOE_SIZES:-1024,4096} \
      ${MOE_DIR:-.device/s36moe}
    ;;
  adopt)  # the presets with the down ring: the family's GPU tests, the real-size examples,
    # and the prefill kernels against their former (ringless) selves
    # (python test/gpu/make_artifacts.py .device/s36b/moeart --only moe_small_family;
    # python examples/moe.py --preset auto --save-artifact .device/s36b/moeex/auto;
    # BENCH_MOE_LEAN=1 BENCH_MOE_SCHEDULES=static BENCH_MOE_CONFIGS=prefill,pre_noring,
    # prefill_large,pl_noring,auto BENCH_MOE_SIZES=1024,2048,3072,4096 python bench/moe.py
    # --build .device/s36b/moeab/moe)
    moe_checks .device/s36b/moeart .device/s36b/moeex/auto examples.txt
    AB_TMP=/tmp/s36/ab AB_GREP=GPU moe_ab moe_ring prefill,pre_noring,prefill_large,pl_noring,auto \
      1024,2048,3072,4096 .device/s36b/moeab
    ;;
  checks)  # after prefill_large took the down ring (prefill did not): the family's GPU
    # tests and the real-size examples, into one file (builds as in adopt)
    moe_checks .device/s36b/moeart .device/s36b/moeex/auto checks.txt
    ;;
  moebench)  # the MoE issue's benchmark (every baseline, both schedules, the unfused path)
    # over the one artifact (BENCH_MOE_CONFIGS=auto python bench/moe.py --build
    # .device/s36b/moefull/moe)
    BENCH_MOE_CONFIGS=auto timeout 520 python bench/moe.py --artifacts .device/s36b/moefull/moe \
      --out "$OUT" 2>&1 | tee "$OUT/moe_full.txt" | tail -40
    ;;
  sweep)  # the large kernel's argmax in parts, LM head blocks of 256 / 192, B = 32 and 64
    # (DECODE_SWEEP_VARIANTS=default,argparts,lm256,lm192 python bench/decode_sweep.py
    # --build .device/s36sw)
    SWEEP_TMP=/tmp/s36 sweep_passes s36_sweep ${SWEEP_VARIANTS:-default,argparts,lm256,lm192} \
      32,64 1024,4096 .device/s36sw
    ;;
  regress)  # every MoE and GEMM GPU test over this session's tiles (python
    # test/gpu/make_artifacts.py .device/s36all --only moe_small; ... --only gemm)
    ETC_ARTIFACTS=.device/s36all timeout 500 python -m pytest -q -rfs --tb=short \
      test/gpu/test_moe_gpu.py test/gpu/test_gemm_gpu.py 2>&1 | tee "$OUT/regress.txt" | tail -8
    ;;
  moetrace)  # where prefill_large's T = 4096 launch goes now (BENCH_MOE_SCHEDULES=static
    # BENCH_MOE_CONFIGS=prefill_large BENCH_MOE_SIZES=4096 python bench/moe_trace.py --build
    # .device/s36tr2)
    BENCH_MOE_SCHEDULES=static BENCH_MOE_CONFIGS=prefill_large BENCH_MOE_SIZES=4096 \
      BENCH_MOE_CHROME=0 timeout 200 python bench/moe_trace.py --artifacts .device/s36tr2 \
      --out /tmp/s36/mtr 2>&1 | tail -30
    cp /tmp/s36/mtr/moe_trace.txt "$OUT/moe_trace.txt"
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

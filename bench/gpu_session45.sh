#!/usr/bin/env bash
# Forty-fifth session (bench/RESULTS.md, items 210-): the B = 2..16 kernel's
# projections on the gemv core, 8 or 16 rows a tile on mma.sync with the
# weights as the A operand (gemv_layer's rows mode). Each step's CPU-side
# build is in its comment.
# Usage: bash bench/gpu_session45.sh [tests] [mid] [trace] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s45
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoders on the gemv core's rows mode against the simulator, and
    # item 208's called variant again (its hint ignored since), a process per group
    # (python test/gpu/make_artifacts.py .device/s45art --only llama_tiny_gemv)
    for k in "gemv16" "gemv8" "gemv_rows_buckets" "gemv_called"; do
      ETC_ARTIFACTS=${TESTS_ARTS:-.device/s45art} timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests.txt" | tail -4
    done
    ;;
  mid)  # the B = 2..16 kernel on the rows mode (DECODE_SWEEP_VARIANTS=default,mid_gemv16,
    # mid_gemv16_s6,mid_gemv16_gu16,mid_gemv8 python bench/decode_sweep.py --build .device/s45mid)
    SWEEP_TMP=/tmp/s45 sweep_passes s45_mid \
      ${MID_VARIANTS:-default,mid_gemv16,mid_gemv16_s6,mid_gemv16_gu16,mid_gemv8} \
      ${MID_BATCHES:-2,8,16} ${MID_CONTEXTS:-1024} ${MID_DIR:-.device/s45mid}
    ;;
  few)  # the B = 2..8 kernel's down stage: deeper rings, fewer slots before the waits,
    # the deal by SM (DECODE_SWEEP_VARIANTS=default,few_d6p1,few_d8p2,few_spread,few_p2
    # python bench/decode_sweep.py --build .device/s45few)
    SWEEP_TMP=/tmp/s45 sweep_passes s45_few \
      ${FEW_VARIANTS:-default,few_d6p1,few_d8p2,few_spread,few_p2} \
      ${FEW_BATCHES:-4,8} ${FEW_CONTEXTS:-1024} ${FEW_DIR:-.device/s45few}
    ;;
  spread)  # the deal by SM in the B = 2..8 kernel or both B <= 16 ones, both contexts
    # (DECODE_SWEEP_VARIANTS=default,few_spread,mid_spread python bench/decode_sweep.py
    # --build .device/s45sp)
    SWEEP_TMP=/tmp/s45 sweep_passes s45_spread default,few_spread,mid_spread 8,12 1024,4096 \
      .device/s45sp
    ;;
  trace2)  # the default artifact traced at B = 8, L = 1024 and 4096 (DECODE_TRACE_VARIANTS=
    # default DECODE_TRACE_BATCHES=8 python bench/decode_trace.py --build .device/s45tr3)
    for L in 1024 4096; do
      DECODE_TRACE_VARIANTS=default DECODE_TRACE_BATCHES=8 DECODE_TRACE_CONTEXT=$L timeout 200 \
        python bench/decode_trace.py --artifacts .device/s45tr3 --out /tmp/s45/tr$L 2>&1 \
        | tee -a "$OUT/trace2.txt" | grep -A8 "layer"
    done
    tar czf "$OUT/traces2.tgz" -C /tmp/s45 tr1024 tr4096
    ;;
  trace)  # B = 8, L = 1024 traced, the default and the rows mode (DECODE_TRACE_VARIANTS=
    # default,mid_gemv16 DECODE_TRACE_BATCHES=8 python bench/decode_trace.py --build .device/s45tr)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-default,mid_gemv16} DECODE_TRACE_BATCHES=8 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s45tr} --out /tmp/s45/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep -A14 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s45 tr
    ;;
  check8)  # bench/decode.py's check against Hugging Face (B = 2: the B = 2..16 kernel)
    DECODE_PARTS=check decode_bench ${DECBENCH_DIR:-.device/s45dec}
    ;;
  decbench)  # bench/decode.py over the default artifact (python bench/decode.py --build
    # .device/s45dec): the check against Hugging Face, and the timings with torch.compile
    DECODE_PARTS=${DECODE_PARTS:-check,time} decode_bench ${DECBENCH_DIR:-.device/s45dec} \
      --compile-batches ${COMPILE_BATCHES:-1,8,32,64} --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  raw) tar czf "$OUT/sweep_raw.tgz" -C /tmp/s45 raw ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

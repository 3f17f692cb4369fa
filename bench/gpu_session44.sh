#!/usr/bin/env bash
# Forty-fourth session (bench/RESULTS.md, items 207-): the B = 1 kernel's
# projections on CUDA cores (layer_gemm(core="gemv"), one row a tile, whole
# weight lines through a per-thread cp.async ring). Each step's CPU-side
# build is in its comment.
# Usage: bash bench/gpu_session44.sh [tests] [one] [long] [trace] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s44
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoders on the gemv core against the simulator
    # (python test/gpu/make_artifacts.py .device/s44art --only llama_tiny_gemv)
    ETC_ARTIFACTS=${TESTS_ARTS:-.device/s44art} timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "${TESTS_K:-gemv}" 2>&1 | tee "$OUT/tests.txt" | tail -8
    ;;
  one)  # the short B = 1 kernel on the gemv core: inlined, called, deeper rings, evict-first
    # (DECODE_SWEEP_VARIANTS=default,one_gemv,one_gemv_ol,one_gemv_s6,one_gemv_s8,one_gemv_ef,
    # long_gemv python bench/decode_sweep.py --build .device/s44one)
    SWEEP_TMP=/tmp/s44 sweep_passes s44_one \
      ${ONE_VARIANTS:-default,one_gemv,one_gemv_ol,one_gemv_s6,one_gemv_s8,one_gemv_ef} \
      1 ${ONE_CONTEXTS:-1024} ${ONE_DIR:-.device/s44one}
    ;;
  long)  # B = 1's long-context kernel on the gemv core (the same build)
    SWEEP_TMP=/tmp/s44 sweep_passes s44_long ${LONG_VARIANTS:-default,long_gemv} \
      1 ${LONG_CONTEXTS:-2048,4096} ${LONG_DIR:-.device/s44one}
    ;;
  trace)  # B = 1, L = 1024 traced, sync and gemv (DECODE_TRACE_VARIANTS=default,one_gemv_ol
    # DECODE_TRACE_BATCHES=1 python bench/decode_trace.py --build .device/s44tr)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-default,one_gemv_ol} DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s44tr} --out /tmp/s44/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep -A14 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s44 tr
    ;;
  decbench)  # bench/decode.py over the default artifact (python bench/decode.py --build
    # .device/s44dec): the check against Hugging Face, and the timings with torch.compile
    DECODE_PARTS=${DECODE_PARTS:-check,time} decode_bench ${DECBENCH_DIR:-.device/s44dec} \
      --compile-batches ${COMPILE_BATCHES:-1,8,32,64} --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  raw) tar czf "$OUT/sweep_raw.tgz" -C /tmp/s44 raw ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

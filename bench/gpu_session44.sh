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
  tests)  # the tiny decoders on the gemv core against the simulator, a process per
    # variant (a faulting kernel leaves its context unusable for the next)
    # (python test/gpu/make_artifacts.py .device/s44art --only llama_tiny_gemv)
    for k in "gemv and not called and not buckets" "gemv_called" "gemv_buckets"; do
      ETC_ARTIFACTS=${TESTS_ARTS:-.device/s44art} timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests.txt" | tail -4
    done
    ;;
  diag)  # every tensor of a tiny step against the simulator: o_proj and down on the
    # gemv core inlined (before DeviceFunction.called), at LLVM opt levels 0-3
    # (python bench/gemv_diag.py --build .device/s44diag)
    PYTHONPATH=$PWD/python:$PWD timeout 200 python bench/gemv_diag.py --artifacts .device/s44diag \
      2>&1 | grep -v Warn | cut -c1-170 | tee "$OUT/diag.txt" | grep "od_O\|^od "
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
  late)  # what of llama_tiny_gemv_called stops with an illegal instruction under the
    # dynamic schedule without early pushes, a process per variant (ran at d9a13fb:
    # GEMV_DIAG_LATE=1 python bench/gemv_diag.py --build .device/s44late; the gemv
    # tile takes no L2 hint since, and gemv_diag.py no longer has those variants)
    for v in c_full c_no_ef c_no_pf1 c_s4; do
      GEMV_DIAG_LATE=1 GEMV_DIAG_ONLY=$v PYTHONPATH=$PWD/python:$PWD timeout 60 \
        python bench/gemv_diag.py --artifacts .device/s44late 2>&1 | grep -v Warn \
        | grep "c_\|Error" | cut -c1-150 | tee -a "$OUT/late.txt"
    done
    ;;
  check1)  # bench/decode.py's check against Hugging Face at B = 1 (the gemv kernel)
    DECODE_CHECK_BATCH=1 DECODE_PARTS=check decode_bench ${DECBENCH_DIR:-.device/s44dec}
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

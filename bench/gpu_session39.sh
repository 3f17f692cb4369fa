#!/usr/bin/env bash
# Thirty-ninth session (bench/RESULTS.md, items 174-): the B = 2..16 kernel
# on the tensor-core attention. Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session39.sh [sweep] [sweep2] [sweep3] [kvearly] [vstore] [trace] [tests] [decbench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s39
for step in ${*:-sweep}; do
  case $step in
  sweep)  # the small-batch kernel's attention tile and split caps, B = 2..16 (item 174;
    # run when "default" was today's mid_phased: DECODE_SWEEP_VARIANTS=mid_phased,mid_mma,
    # mid_mma_s256,mid_mma_cap1,mid_mma_cap2 python bench/decode_sweep.py --build .device/s39sw)
    SWEEP_TMP=/tmp/s39 sweep_passes s39_sweep \
      ${SWEEP_VARIANTS:-mid_phased,mid_mma,mid_mma_s256,mid_mma_cap1,mid_mma_cap2} \
      ${SWEEP_BATCHES:-2,4,8,12,16} ${SWEEP_CONTEXTS:-1024,4096} .device/s39sw
    tar czf "$OUT/s39_sweep_raw.tgz" -C /tmp/s39 raw
    ;;
  sweep2)  # a third attention ring stage and spans of 512 up to B = 8 in the B = 2..16
    # kernel (DECODE_SWEEP_VARIANTS=default,mid_attn3,mid_b8_512 python bench/decode_sweep.py
    # --build .device/s39sw2)
    SWEEP_TMP=/tmp/s39 sweep_passes s39_sweep2 ${SWEEP_VARIANTS:-default,mid_attn3,mid_b8_512} \
      ${SWEEP_BATCHES:-2,4,8,16} ${SWEEP_CONTEXTS:-1024,4096} .device/s39sw2
    tar czf "$OUT/s39_sweep2_raw.tgz" -C /tmp/s39 raw
    ;;
  trace)  # the default artifact (TRACE_VARIANTS) traced at TRACE_BATCHES, L = 1024
    # (DECODE_TRACE_VARIANTS=default python bench/decode_trace.py --build .device/s39tr;
    # the second call: default,mid_nopf,mid_inline into .device/s39tr2 with TRACE_DIR)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-default} DECODE_TRACE_BATCHES=${TRACE_BATCHES:-8,16} \
      timeout 300 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s39tr} --out /tmp/s39/tr 2>&1 \
      | tee "$OUT/trace.txt" | grep -A12 "^== \|layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s39 tr
    ;;
  sweep3)  # the B = 2..16 kernel's attention without its ring prefetch, and inlined
    # (DECODE_SWEEP_VARIANTS=default,mid_nopf,mid_inline python bench/decode_sweep.py
    # --build .device/s39sw3)
    SWEEP_TMP=/tmp/s39 sweep_passes s39_sweep3 ${SWEEP_VARIANTS:-default,mid_nopf,mid_inline} \
      ${SWEEP_BATCHES:-2,8,16} ${SWEEP_CONTEXTS:-1024,4096} .device/s39sw3
    tar czf "$OUT/s39_sweep3_raw.tgz" -C /tmp/s39 raw
    ;;
  kvearly)  # the tensor-core tile with position L's loads before its loop ("kvearly",
    # python bench/decode_sweep.py --build after the change, renamed) against "default"
    # (built before it) in .device/s39kv, B = 2..64
    SWEEP_TMP=/tmp/s39 sweep_passes s39_kvearly default,kvearly ${SWEEP_BATCHES:-2,8,16,32,64} \
      ${SWEEP_CONTEXTS:-1024,4096} .device/s39kv
    ;;
  vstore)  # "vstore" (the cache row of position L written from the values loaded before
    # the loop; python bench/decode_sweep.py --build after the change, renamed) against
    # "kvearly" (built before it) in .device/s39kv2
    SWEEP_TMP=/tmp/s39 sweep_passes s39_vstore kvearly,vstore ${SWEEP_BATCHES:-2,8,64} \
      ${SWEEP_CONTEXTS:-1024,4096} .device/s39kv2
    ;;
  tests)  # the tiny decoders against the simulator (python test/gpu/make_artifacts.py
    # .device/s39art --only llama_tiny_mma_tma_capped, and ..._read_early, llama_tiny_buckets)
    ETC_ARTIFACTS=${TESTS_ARTS:-.device/s39art} timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "${TESTS_K:-capped or read_early or tiny_buckets}" 2>&1 \
      | tee "$OUT/tests.txt" | tail -8
    ;;
  decbench)  # bench/decode.py over the new default artifact (the B = 2..16 kernel on the
    # tensor-core attention, capped split counts): the check against Hugging Face, and the
    # timings with torch.compile at COMPILE_BATCHES and COMPILE_CONTEXTS
    # (python bench/decode.py --build .device/s39dec)
    DECODE_PARTS=${DECODE_PARTS:-check,time} decode_bench .device/s39dec \
      --compile-batches ${COMPILE_BATCHES:-1,8,32,64} --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

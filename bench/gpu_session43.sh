#!/usr/bin/env bash
# Forty-third session (bench/RESULTS.md, items 200-): L2 evict-first on the
# large kernel's weight boxes and on the attention's KV ring; which weights
# made the short B = 1 kernel slower with it. Each step's CPU-side build is
# in its comment.
# Usage: bash bench/gpu_session43.sh [tests] [large] [mid] [one] [decbench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s43
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoders with evict-first TMA copies against the simulator
    # (python test/gpu/make_artifacts.py .device/s43art --only PREFIX)
    ETC_ARTIFACTS=${TESTS_ARTS:-.device/s43art} timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "${TESTS_K:-tma_evict_first or kv_evict_first}" 2>&1 \
      | tee "$OUT/tests.txt" | tail -8
    ;;
  large)  # the large kernel's weight boxes and/or KV ring evict-first (DECODE_SWEEP_VARIANTS=
    # default,large_evict,large_kv_evict,large_both_evict,mid_kv_evict python
    # bench/decode_sweep.py --build .device/s43ev)
    SWEEP_TMP=/tmp/s43 sweep_passes s43_large ${SWEEP_VARIANTS:-default,large_evict,large_kv_evict,large_both_evict} \
      ${SWEEP_BATCHES:-32,64} ${SWEEP_CONTEXTS:-1024,4096} ${SWEEP_DIR:-.device/s43ev}
    ;;
  mid)  # the B = 2..16 kernel's KV ring evict-first (the same build)
    SWEEP_TMP=/tmp/s43 sweep_passes s43_mid ${MID_VARIANTS:-default,mid_kv_evict} \
      ${MID_BATCHES:-8,16} ${MID_CONTEXTS:-1024,4096} .device/s43ev
    ;;
  one)  # the short B = 1 kernel: all, the LM head's or the layers' weights evict-first
    # (DECODE_SWEEP_VARIANTS=default,one_ef_all,one_ef_lm,one_ef_layers python
    # bench/decode_sweep.py --build .device/s43one)
    SWEEP_TMP=/tmp/s43 sweep_passes s43_one ${ONE_VARIANTS:-default,one_ef_all,one_ef_lm,one_ef_layers} \
      1 ${ONE_CONTEXTS:-1024} .device/s43one
    ;;
  kvall)  # with the large kernel's streams evict-first (item 200): the KV ring evict-first
    # in the B = 2..16 kernel and B = 1's long one too (DECODE_SWEEP_VARIANTS=default,kv_evict_all
    # python bench/decode_sweep.py --build .device/s43b)
    SWEEP_TMP=/tmp/s43 sweep_passes s43_kvall ${KVALL_VARIANTS:-default,kv_evict_all} \
      ${KVALL_BATCHES:-1,8,16} ${KVALL_CONTEXTS:-1024,4096} .device/s43b
    ;;
  trace)  # the short B = 1 kernel with and without its LM head's weights evict-first, traced
    # (DECODE_TRACE_VARIANTS=default,one_ef_lm python bench/decode_trace.py --build .device/s43tr)
    DECODE_TRACE_VARIANTS=default,one_ef_lm DECODE_TRACE_BATCHES=1 DECODE_TRACE_CONTEXT=1024 \
      timeout 200 python bench/decode_trace.py --artifacts .device/s43tr --out /tmp/s43/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep -A14 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s43 tr
    ;;
  body)  # evict-first on the tiles' own copies, not their ring fills' (DECODE_SWEEP_VARIANTS=
    # default,one_ef_lm_body,one_ef_body,long_ef_body,mid_ef_body python bench/decode_sweep.py
    # --build .device/s43c): the short B = 1 kernel, the long one, the B = 2..16 one
    SWEEP_TMP=/tmp/s43 sweep_passes s43_body_one default,one_ef_lm_body,one_ef_body 1 1024 .device/s43c
    SWEEP_TMP=/tmp/s43 sweep_passes s43_body_long default,long_ef_body 1 2048,4096 .device/s43c
    SWEEP_TMP=/tmp/s43 sweep_passes s43_body_mid default,mid_ef_body 8,16 1024,4096 .device/s43c
    ;;
  retune)  # the large kernel's split and meeting settings again, now that its streams
    # are evict-first (DECODE_SWEEP_VARIANTS=default,large_items2,frag_o8,frag_q8,share2,
    # share4_down python bench/decode_sweep.py --build .device/s43r)
    SWEEP_TMP=/tmp/s43 sweep_passes s43_retune \
      ${RETUNE_VARIANTS:-default,large_items2,frag_o8,frag_q8,share2,share4_down} \
      ${RETUNE_BATCHES:-32,64} ${RETUNE_CONTEXTS:-1024,4096} .device/s43r
    ;;
  ncu)  # L2 hit rates and DRAM bytes with and without the hints (Nsight Compute,
    # clocks left alone): the large kernel at B = 64 (.device/s43ev: default = no hints
    # there, large_both_evict = both), the short B = 1 kernel (.device/s43one: default,
    # one_ef_all)
    M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_op_read.sum,gpu__time_duration.sum
    for spec in "s43ev default 64 1024" "s43ev large_both_evict 64 1024" "s43ev default 64 4096" \
        "s43ev large_both_evict 64 4096" "s43one default 1 1024" "s43one one_ef_all 1 1024"; do
      set -- $spec
      echo "== $2 B=$3 L=$4" >> "$OUT/ncu.txt"
      timeout 120 ncu --clock-control none -k regex:llama --launch-skip 2 --launch-count 1 --metrics $M \
        python bench/decode_ncu.py .device/$1/$2 $3 $4 $2 2>&1 \
        | grep -E "^\s+(gpu__|dram__|lts__)|==ERR|rror" >> "$OUT/ncu.txt"
    done
    cat "$OUT/ncu.txt"
    ;;
  trace2)  # the default artifact traced at B = 8 and 64, L = 1024 and 4096 (after the hints;
    # DECODE_TRACE_VARIANTS=default python bench/decode_trace.py --build .device/s43tr2)
    DECODE_TRACE_VARIANTS=default DECODE_TRACE_BATCHES=${TRACE_BATCHES:-8,64} \
      DECODE_TRACE_CONTEXT=${TRACE_CONTEXTS:-1024,4096} timeout 300 \
      python bench/decode_trace.py --artifacts .device/s43tr2 --out /tmp/s43/tr2 \
      2>&1 | tee -a "$OUT/trace2.txt" | grep -B14 -A8 "layer"
    tar czf "$OUT/traces2.tgz" -C /tmp/s43 tr2
    ;;
  decbench)  # bench/decode.py over the default artifact (python bench/decode.py --build
    # .device/s43dec): the check against Hugging Face, and the timings with torch.compile
    DECODE_PARTS=${DECODE_PARTS:-check,time} decode_bench ${DECBENCH_DIR:-.device/s43dec2} \
      --compile-batches ${COMPILE_BATCHES:-1,8,32,64} --compile-contexts ${COMPILE_CONTEXTS:-1024,4096}
    ;;
  raw) tar czf "$OUT/sweep_raw.tgz" -C /tmp/s43 raw ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

#!/usr/bin/env bash
# Forty-eighth session (bench/RESULTS.md, items 236-): the phased attention's
# own phases (clock stamps), and its RoPE one round trip. Each step's
# CPU-side build is in its comment.
# Usage: bash bench/gpu_session48.sh [tests] [stamps] [rope] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s48
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoders whose attention is the phased tile (python
    # test/gpu/make_artifacts.py .device/s48/art --only V, V in llama_tiny_context_span,
    # llama_tiny_context_buckets, llama_tiny_buckets, llama_tiny_single_fused,
    # llama_tiny_attn_pf, llama_tiny_static)
    ETC_ARTIFACTS=.device/s48/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "matches_the_simulator and (context_span or context_buckets \
      or tiny_buckets or single_fused or attn_pf or llama_tiny-static) \
      or bit_reproducible and static-llama_tiny]" 2>&1 | tee -a "$OUT/tests.txt" | tail -4
    ;;
  stamps)  # B = 1, L = 1024 traced with the phased attention's stamps, before and after
    # its RoPE takes one round trip (DECODE_TRACE_VARIANTS=stamps_b1 python
    # bench/decode_trace.py --build .device/s48/tr before, stamps_b1_rope after)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-stamps_b1,stamps_b1_rope} DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s48/tr} --out /tmp/s48/tr \
      2>&1 | tee -a "$OUT/stamps.txt" | grep -A40 "layer"
    tar czf "$OUT/stamps.tgz" -C /tmp/s48 tr
    ;;
  rope)  # the step with the RoPE in one round trip: the default artifact and B = 1's
    # short kernel alone, before and after (DECODE_SWEEP_VARIANTS=default,b1_alone
    # python bench/decode_sweep.py --build .device/s48/sweep before, rope,b1_rope after)
    SWEEP_TMP=/tmp/s48 sweep_passes s48_rope default,rope,b1_alone,b1_rope 1 512,1024 \
      .device/s48/sweep
    ;;
  merge)  # B = 1's merge loading 1, 2 or 3 of a lane's splits at once, stamped at
    # L = 1024 (DECODE_TRACE_VARIANTS=stamps_b1_rope,stamps_b1_m2,stamps_b1_m3 python
    # bench/decode_trace.py --build .device/s48/tr2) and timed (DECODE_SWEEP_VARIANTS=
    # default,b1_m2,b1_m3 python bench/decode_sweep.py --build .device/s48/sweep2)
    DECODE_TRACE_VARIANTS=stamps_b1_rope,stamps_b1_m2,stamps_b1_m3 DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts .device/s48/tr2 --out /tmp/s48/tr2 \
      2>&1 | tee -a "$OUT/stamps_merge.txt" | grep -A40 "layer"
    tar czf "$OUT/stamps_merge.tgz" -C /tmp/s48 tr2
    SWEEP_TMP=/tmp/s48 sweep_passes s48_merge default,b1_m2,b1_m3 1 512,1024 .device/s48/sweep2
    ;;
  splits9)  # B = 1 up to L = 1151 in 9 splits of 128 (merge 1 or 2 splits a load),
    # stamped (DECODE_TRACE_VARIANTS=stamps_b1_s9,stamps_b1_s9_m2 python
    # bench/decode_trace.py --build .device/s48/tr3) and timed (DECODE_SWEEP_VARIANTS=
    # b1_s9,b1_s9_m2 python bench/decode_sweep.py --build .device/s48/sweep2)
    DECODE_TRACE_VARIANTS=stamps_b1_s9,stamps_b1_s9_m2 DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts .device/s48/tr3 --out /tmp/s48/tr3 \
      2>&1 | tee -a "$OUT/stamps_splits9.txt" | grep -A40 "layer"
    tar czf "$OUT/stamps_splits9.tgz" -C /tmp/s48 tr3
    SWEEP_TMP=/tmp/s48 sweep_passes s48_splits9 default,b1_s9,b1_s9_m2,b1_m2 1 512,1024 \
      .device/s48/sweep2
    ;;
  slots)  # 9 splits with the attention taking the deal's 136 positions (deal_slots):
    # stamped, with the default beside it (DECODE_TRACE_VARIANTS=stamps_b1_s9_slots,
    # stamps_b1_rope python bench/decode_trace.py --build .device/s48/tr4), and timed
    # (DECODE_SWEEP_VARIANTS=b1_s9_slots,b1_s9_m2_slots python bench/decode_sweep.py
    # --build .device/s48/sweep2)
    DECODE_TRACE_VARIANTS=stamps_b1_s9_slots,stamps_b1_rope DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts .device/s48/tr4 --out /tmp/s48/tr4 \
      2>&1 | tee -a "$OUT/stamps_slots.txt" | grep -A40 "layer"
    tar czf "$OUT/stamps_slots.tgz" -C /tmp/s48 tr4
    SWEEP_TMP=/tmp/s48 sweep_passes s48_slots default,b1_s9,b1_s9_slots,b1_s9_m2_slots 1 \
      512,1024 .device/s48/sweep2
    ;;
  slots64)  # 9 splits of at least 64 positions with deal slots, across L, and the tiny
    # decoder whose B = 1 kernel runs 3 splits in 10 deal slots (DECODE_SWEEP_VARIANTS=
    # default,b1_s9_slots,b1_s9x64_slots python bench/decode_sweep.py --build .device/s48/sw5;
    # python test/gpu/make_artifacts.py .device/s48/art --only llama_tiny_context_slots)
    ETC_ARTIFACTS=.device/s48/art timeout 200 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "matches_the_simulator and context_slots" 2>&1 \
      | tee -a "$OUT/tests_slots.txt" | tail -3
    SWEEP_TMP=/tmp/s48 sweep_passes s48_slots64 default,b1_s9_slots,b1_s9x64_slots 1 \
      512,768,1024,2048 .device/s48/sw5
    ;;
  # (steps "warm" and "check" ran attn_warm, since removed: bench/RESULTS.md item 240)
  final)  # the tiny decoders over the session's final code (python test/gpu/make_artifacts.py
    # .device/s48/art --only V, V in llama_tiny_context_span, llama_tiny_context_slots,
    # llama_tiny_context_buckets, llama_tiny_buckets, llama_tiny_single_fused,
    # llama_tiny_attn_pf, llama_tiny_static)
    ETC_ARTIFACTS=.device/s48/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "matches_the_simulator and (context_span or context_slots \
      or context_buckets or tiny_buckets or single_fused or attn_pf or llama_tiny-static) \
      or bit_reproducible and static-llama_tiny]" 2>&1 | tee -a "$OUT/tests_final.txt" | tail -4
    ;;
  decbench)  # the issue's table over the default artifact (python bench/decode.py --build
    # .device/s48/dec)
    issue_bench .device/s48/dec
    ;;
  warmup)  # cold process to the first token over the same artifact
    mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s48/dec
    ;;
  onepass)  # B = 1's attention in one pass of each warp: the tiny decoders (python
    # test/gpu/make_artifacts.py .device/s48/art --only llama_tiny_context_one_pass, then
    # llama_tiny_one_pass), stamped (DECODE_TRACE_VARIANTS=stamps_b1_one_pass,stamps_b1_rope
    # python bench/decode_trace.py --build .device/s48/tr7) and timed (DECODE_SWEEP_VARIANTS=
    # default,b1_one_pass python bench/decode_sweep.py --build .device/s48/sw7)
    ETC_ARTIFACTS=.device/s48/art timeout 200 python -m pytest -q -rfs --tb=line \
      test/gpu/test_llama_gpu.py -k "matches_the_simulator and one_pass" 2>&1 \
      | tee -a "$OUT/tests_one_pass.txt" | tail -4
    DECODE_TRACE_VARIANTS=stamps_b1_one_pass,stamps_b1_rope DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts .device/s48/tr7 --out /tmp/s48/tr7 \
      2>&1 | tee -a "$OUT/stamps_one_pass.txt" | grep -A40 "layer"
    SWEEP_TMP=/tmp/s48 sweep_passes s48_one_pass default,b1_one_pass 1 512,1024 .device/s48/sw7
    ;;
  ncu)  # the B = 1 kernel's stall reasons, kernel-wide (Nsight Compute's warp-state
    # sampling ratios), over the default artifact (python bench/decode.py --build .device/s48/dec)
    timeout 200 ncu --clock-control none -k regex:llama --launch-skip 2 --launch-count 1 \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__cycles_elapsed.avg" \
      python bench/decode_ncu.py .device/s48/dec/static 1 1024 2>&1 \
      | grep -E "^\s+(smsp__|sm__)|==ERR|rror" | tee "$OUT/ncu_b1.txt"
    ;;
  sass)  # the B = 1 kernel's stalls per SASS instruction (Nsight Compute source
    # counters) over the default artifact, exported as CSV (per-SASS rows; bench/ncu_sass.py reads them)
    timeout 300 ncu --clock-control none -k regex:llama --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --import-source no -f -o /tmp/s48/b1 \
      python bench/decode_ncu.py .device/s48/dec/static 1 1024 2>&1 | tail -3
    ncu -i /tmp/s48/b1.ncu-rep --page source --csv --print-source sass > /tmp/s48/b1_sass.csv \
      2> "$OUT/sass_err.txt"; head -c 600 /tmp/s48/b1_sass.csv; wc -l /tmp/s48/b1_sass.csv
    gzip -c /tmp/s48/b1_sass.csv > "$OUT/b1_sass.csv.gz"; cat "$OUT/sass_err.txt" | head -5
    ;;
  review)  # after the review: one_pass and the online and tensor-core tiles on the shared
    # warp merge (python test/gpu/make_artifacts.py .device/s48/art --only V, V in
    # llama_tiny_context_one_pass, llama_tiny_one_pass, llama_tiny_online, llama_tiny_mma_tma)
    ETC_ARTIFACTS=.device/s48/art timeout 250 python -m pytest -q -rfs --tb=line \
      test/gpu/test_llama_gpu.py -k "matches_the_simulator and (one_pass or online \
      or llama_tiny_mma_tma-)" 2>&1 | tee -a "$OUT/tests_review.txt" | tail -4
    ;;
  raw)
    tar czf "$OUT/sweep_raw.tgz" -C /tmp/s48 raw
    ;;
  esac
done

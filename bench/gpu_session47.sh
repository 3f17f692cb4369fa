#!/usr/bin/env bash
# Forty-seventh session (bench/RESULTS.md, items 227-): the B = 2..16 kernels'
# gemv tiles with whole-line weight copies. Each step's CPU-side build is in
# its comment.
# Usage: bash bench/gpu_session47.sh [tests] [lines] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s47
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoders with whole-line copies, and the rows mode as it was
    # (python test/gpu/make_artifacts.py .device/s47art --only llama_tiny_gemv8_lines, then
    # llama_tiny_gemv16_lines, llama_tiny_gemv16, llama_tiny_gemv8_lm128)
    for k in "lines" "gemv16 and not lines" "lm128"; do
      ETC_ARTIFACTS=.device/s47art timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests.txt" | tail -4
    done
    ;;
  lines)  # B = 2..16 with whole-line copies (DECODE_SWEEP_VARIANTS=default,mid_lines
    # python bench/decode_sweep.py --build .device/s47a)
    SWEEP_TMP=/tmp/s47 sweep_passes s47_lines default,mid_lines ${LINES_BATCHES:-2,4,8,16} \
      1024,4096 .device/s47a
    ;;
  tune)  # with whole lines the default: the half-line copies again, B = 2..8's LM head in
    # 64-column blocks, 5- or 3-stage rings (DECODE_SWEEP_VARIANTS=default,mid_halves,few_lm64,
    # mid_s5,mid_s3 python bench/decode_sweep.py --build .device/s47b)
    SWEEP_TMP=/tmp/s47 sweep_passes s47_tune default,mid_halves,few_lm64,mid_s5,mid_s3 \
      ${TUNE_BATCHES:-8} ${TUNE_CONTEXTS:-1024,4096} .device/s47b
    ;;
  b1kv)  # B = 1's cached K and V into shared memory before the waits, or at the start
    # (DECODE_SWEEP_VARIANTS=default,one_pfkv,one_stagekv python bench/decode_sweep.py
    # --build .device/s47c)
    SWEEP_TMP=/tmp/s47 sweep_passes s47_b1kv default,one_pfkv,one_stagekv 1 512,1024 .device/s47c
    ;;
  b1o)  # B = 1's o_proj in 16- or 32-column blocks, both of its kernels
    # (DECODE_SWEEP_VARIANTS=default,b1_o16,b1_o32 python bench/decode_sweep.py
    # --build .device/s47d)
    SWEEP_TMP=/tmp/s47 sweep_passes s47_b1o default,b1_o16,b1_o32 1 1024,4096 .device/s47d
    ;;
  trace)  # B = 1, L = 1024 traced, the default and o_proj in 16-column blocks
    # (DECODE_TRACE_VARIANTS=default,b1_o16 DECODE_TRACE_BATCHES=1
    # python bench/decode_trace.py --build .device/s47tr)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-default,b1_o16} DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s47tr} --out /tmp/s47/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep -A16 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s47 tr
    ;;
  b1span)  # B = 1's phased tile sized to its 64-position splits, and its K and V
    # copied to shared memory before the waits or at the start (DECODE_SWEEP_VARIANTS=default,
    # b1_span64,b1_span64_pfkv,b1_span64_stagekv python bench/decode_sweep.py --build .device/s47e)
    SWEEP_TMP=/tmp/s47 sweep_passes s47_b1span default,b1_span64,b1_span64_pfkv,b1_span64_stagekv \
      1 512,1024 .device/s47e
    ;;
  b1final)  # B = 1's kernels with items 231-232 against before (DECODE_SWEEP_VARIANTS=
    # default,before47_b1 python bench/decode_sweep.py --build .device/s47f), and the tiny
    # decoders whose B = 1 kernel is sized to its splits (python test/gpu/make_artifacts.py
    # .device/s47art2 --only V, V in llama_tiny_context_span, llama_tiny_context_buckets,
    # llama_tiny_buckets, llama_tiny_single_fused_gemv)
    for k in "context_span" "context_buckets" "tiny_buckets" "single_fused_gemv"; do
      ETC_ARTIFACTS=.device/s47art2 timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests_b1.txt" | tail -4
    done
    SWEEP_TMP=/tmp/s47 sweep_passes s47_b1final default,before47_b1 1 512,1024,2048,4096 \
      .device/s47f
    ;;
  trace8)  # B = 8, L = 4096 traced: whole lines and half lines (DECODE_TRACE_VARIANTS=
    # default,mid_halves DECODE_TRACE_BATCHES=8 DECODE_TRACE_CONTEXT=4096
    # python bench/decode_trace.py --build .device/s47tr8)
    DECODE_TRACE_VARIANTS=default,mid_halves DECODE_TRACE_BATCHES=8 DECODE_TRACE_CONTEXT=4096 \
      timeout 200 python bench/decode_trace.py --artifacts .device/s47tr8 --out /tmp/s47/tr8 \
      2>&1 | tee -a "$OUT/trace8.txt" | grep -A16 "layer"
    tar czf "$OUT/traces8.tgz" -C /tmp/s47 tr8
    ;;
  merge)  # each merge lane's splits loaded 2 at a time (the new default), 1 or 4
    # (DECODE_SWEEP_VARIANTS=default,merge1,merge4 python bench/decode_sweep.py --build
    # .device/s47g)
    SWEEP_TMP=/tmp/s47 sweep_passes s47_merge default,merge1,merge4 1,2,8 1024,4096 .device/s47g
    ;;
  decbench)  # the issue's table over the default artifact (python bench/decode.py --build
    # .device/s47dec)
    issue_bench ${DECBENCH_DIR:-.device/s47dec}
    ;;
  final)  # the tiny decoders over the session's final code: whole lines, the short B = 1
    # kernel sized to its splits, the fused merge two splits a load (python
    # test/gpu/make_artifacts.py .device/s47fin --only V, V in llama_tiny_context_span,
    # llama_tiny_context_buckets, llama_tiny_buckets, llama_tiny_single_fused,
    # llama_tiny_gemv8_lines, llama_tiny_gemv16_lines)
    for k in "context_span" "context_buckets" "tiny_buckets" "single_fused" "_lines"; do
      ETC_ARTIFACTS=.device/s47fin timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests_final.txt" | tail -4
    done
    ;;
  warmup)  # cold process to the first token over the default artifact (same build)
    mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench ${DECBENCH_DIR:-.device/s47dec}
    ;;
  raw)
    tar czf "$OUT/sweep_raw.tgz" -C /tmp/s47 raw
    ;;
  esac
done

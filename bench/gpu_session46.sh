#!/usr/bin/env bash
# Forty-sixth session (bench/RESULTS.md, items 218-): weights asked into L2
# while B = 1's attention runs, now that the gemv core's gate/up is bound by
# the HBM. Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session46.sh [tests] [pf] [pflong] [trace] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s46
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoders on the gemv core (rows mode after session 45's last
    # refactor, and beside the L2 prefetch task), a process per group
    # (python test/gpu/make_artifacts.py .device/s46art --only llama_tiny_gemv)
    for k in "gemv16" "gemv8" "gemv_rows_buckets" "gemv_prefetch"; do
      ETC_ARTIFACTS=${TESTS_ARTS:-.device/s46art} timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests.txt" | tail -4
    done
    ;;
  pf)  # B = 1, L = 1024 with the prefetch task (DECODE_SWEEP_VARIANTS=default,one_pf_o,
    # one_pf_o_gu2,one_pf_o_gu4,one_pf_o_gu4_c128,one_pf_gu4,one_pf_o_gu6,long_pf_o_gu4
    # python bench/decode_sweep.py --build .device/s46pf)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_pf \
      ${PF_VARIANTS:-default,one_pf_o,one_pf_o_gu2,one_pf_o_gu4,one_pf_o_gu4_c128,one_pf_gu4,one_pf_o_gu6} \
      ${PF_BATCHES:-1} ${PF_CONTEXTS:-1024} ${PF_DIR:-.device/s46pf}
    ;;
  pflong)  # the same in B = 1's long-context kernel, at L = 4096 (same build)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_pflong default,long_pf_o_gu4 1 4096 .device/s46pf
    ;;
  b1)  # B = 1: its combine fused into the attention (one kernel, against the same
    # kernel without), deeper gemv rings (DECODE_SWEEP_VARIANTS=default,one_only,
    # one_only_fuse,mid_b8_512,one_s10,one_s12,one_gu12 python bench/decode_sweep.py
    # --build .device/s46b)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_b1 \
      ${B1_VARIANTS:-default,one_only,one_only_fuse,one_s10,one_s12,one_gu12} 1 \
      ${B1_CONTEXTS:-1024} .device/s46b
    ;;
  b8)  # spans of 512 at B = 5..8 (same build)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_b8 default,mid_b8_512 6,8 1024,4096 .device/s46b
    ;;
  fused)  # the tiny decoders with the combine fused into the attention (spread splits:
    # the fixed split count), the plain B = 1 tier and the grouped combine beside them
    # (python test/gpu/make_artifacts.py .device/s46art2 --only llama_tiny_single, and
    # --only llama_tiny_combine, --only llama_tiny_gemv_buckets), then B = 1 timed
    # (DECODE_SWEEP_VARIANTS=default,one_only,one_only_fuse python bench/decode_sweep.py
    # --build .device/s46c) and traced (DECODE_TRACE_VARIANTS=one_only,one_only_fuse
    # DECODE_TRACE_BATCHES=1 python bench/decode_trace.py --build .device/s46tr2)
    for k in "single" "combine_group" "gemv_buckets"; do
      ETC_ARTIFACTS=.device/s46art2 timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests_fused.txt" | tail -4
    done
    SWEEP_TMP=/tmp/s46 sweep_passes s46_fused default,one_only,one_only_fuse 1 1024 .device/s46c
    TRACE_VARIANTS=one_only,one_only_fuse TRACE_DIR=.device/s46tr2 bash "$0" trace
    ;;
  newtests)  # the tiny decoders whose B = 1 kernel is the new default's (combine fused)
    # (python test/gpu/make_artifacts.py .device/s46art3 --only V for V in llama_tiny_buckets,
    # llama_tiny_context_buckets, llama_tiny_single, llama_tiny_gemv_rows_buckets)
    for k in "tiny_buckets" "context_buckets" "single" "gemv_rows_buckets"; do
      ETC_ARTIFACTS=.device/s46art3 timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests_new.txt" | tail -4
    done
    ;;
  ab)  # the new default against the one before it, B = 1..8 at L = 1024
    # (DECODE_SWEEP_VARIANTS=default,before46 python bench/decode_sweep.py --build .device/s46d)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_ab default,before46 1,2,4,6,8 1024 .device/s46d
    ;;
  ab6)  # ... once more at B = 6 (one pass), with the logits' error against PyTorch's
    SWEEP_PASSES=1 SWEEP_TMP=/tmp/s46 sweep_passes s46_ab6 default,before46 6 1024 .device/s46d
    ;;
  check1)  # bench/decode.py's check against Hugging Face at B = 1 (the fused combine)
    DECODE_CHECK_BATCH=1 DECODE_PARTS=check decode_bench .device/s46dec
    cp "$OUT/decode.txt" "$OUT/check1.txt"; cp "$OUT/decode.json" "$OUT/check1.json"
    ;;
  midfuse)  # the B = 2..16 kernels' combine in their tensor-core attention: the tiny
    # decoders against the simulator (python test/gpu/make_artifacts.py .device/s46art4
    # --only llama_tiny_mma_tma_capped, and --only llama_tiny_mma_fused), then timed
    # (DECODE_SWEEP_VARIANTS=default,mid_fuse python bench/decode_sweep.py --build
    # .device/s46e) and traced at B = 8 (DECODE_TRACE_VARIANTS=default,mid_fuse
    # DECODE_TRACE_BATCHES=8 python bench/decode_trace.py --build .device/s46tr3)
    for k in "capped" "mma_fused"; do
      ETC_ARTIFACTS=.device/s46art4 timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests_midfuse.txt" | tail -4
    done
    SWEEP_TMP=/tmp/s46 sweep_passes s46_midfuse default,mid_fuse 2,8,16 1024,4096 .device/s46e
    for L in 1024 4096; do
      DECODE_TRACE_VARIANTS=default,mid_fuse DECODE_TRACE_BATCHES=8 DECODE_TRACE_CONTEXT=$L \
        timeout 200 python bench/decode_trace.py --artifacts .device/s46tr3 --out /tmp/s46/mf$L \
        2>&1 | tee -a "$OUT/trace_midfuse.txt" | grep -A9 "layer"
    done
    tar czf "$OUT/traces_midfuse.tgz" -C /tmp/s46 mf1024 mf4096
    ;;
  longfuse)  # B = 1's long-context kernel with its combine fused, L = 2048 and 4096
    # (DECODE_SWEEP_VARIANTS=default,long_fuse python bench/decode_sweep.py --build .device/s46f)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_longfuse default,long_fuse 1 2048,4096 .device/s46f
    ;;
  final)  # after the fused combine's text became one helper: its tiny decoders again
    # (python test/gpu/make_artifacts.py .device/s46art5 --only V for V in
    # llama_tiny_single_fused, llama_tiny_mma_tma_capped_fused, llama_tiny_mma_fused) and
    # the default at B = 1, 8 (DECODE_SWEEP_VARIANTS=default python bench/decode_sweep.py
    # --build .device/s46g)
    for k in "single_fused" "capped_fused" "mma_fused"; do
      ETC_ARTIFACTS=.device/s46art5 timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests_final.txt" | tail -4
    done
    SWEEP_PASSES=1 SWEEP_TMP=/tmp/s46 sweep_passes s46_final default 1,2,8 1024 .device/s46g
    ;;
  downring)  # down's ring 5 or 6 stages deep at B = 2..8, the slots before the waits as
    # they are, and session 45's 6 with one slot before them (DECODE_SWEEP_VARIANTS=default,
    # few_d5,few_d6,few_d6p1 python bench/decode_sweep.py --build .device/s46h)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_downring default,few_d5,few_d6,few_d6p1 4,8 1024,4096 \
      .device/s46h
    ;;
  rows32)  # the B = 9..16 kernel's tiles up to B = 32 (DECODE_SWEEP_VARIANTS=default,rows32
    # python bench/decode_sweep.py --build .device/s46i)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_rows32 default,rows32 24,32 1024,4096 .device/s46i
    ;;
  lmhead)  # B = 2..8's LM head in 32- or 128-column blocks, or on the mma.sync core
    # (DECODE_SWEEP_VARIANTS=default,few_lm32,few_lm128,few_lm_sync python
    # bench/decode_sweep.py --build .device/s46j)
    SWEEP_TMP=/tmp/s46 sweep_passes s46_lmhead default,few_lm32,few_lm128,few_lm_sync 8 \
      1024,4096 .device/s46j
    ;;
  lm128)  # 128-column LM head blocks at B = 2..8 again, three passes (same build)
    SWEEP_PASSES="1 2 1" SWEEP_TMP=/tmp/s46 sweep_passes s46_lm128 default,few_lm128 4,8 \
      1024,4096 .device/s46j
    ;;
  trace)  # B = 1, L = 1024 traced, the default and o_proj + half of gate/up prefetched
    # (DECODE_TRACE_VARIANTS=default,one_pf_o_gu4 DECODE_TRACE_BATCHES=1
    # python bench/decode_trace.py --build .device/s46tr)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-default,one_pf_o_gu4} DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s46tr} --out /tmp/s46/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep -A16 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s46 tr
    ;;
  decbench)  # the issue's table over the default artifact (python bench/decode.py --build
    # .device/s46dec; item 223's: .device/s46dec2, DECBENCH_DIR)
    issue_bench ${DECBENCH_DIR:-.device/s46dec}
    ;;
  raw) tar czf "$OUT/sweep_raw.tgz" -C /tmp/s46 raw ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

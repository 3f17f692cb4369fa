#!/usr/bin/env bash
# Sixty-fifth session.
# `card`: which GPU came. `h200`: only on an H200, the issue's table and its
# warm-up over the default artifact (python bench/decode.py --build
# .device/s64/dec; carry .device/s64/dec); on any other card it says so.
# `proto`: bench/cluster_merge_proto.cu, B = 1's attention splits meeting on
# a thread-block cluster against today's global count and merge, and how
# many CTAs fit in clusters of 2-16 with the B = 1 kernel's block.
# `tests`: the tiny decoder whose B = 1 kernel meets each kv head's splits on
# clusters of 4 (llama_tiny_context_cluster) against the simulator, three
# schedules (python test/gpu/make_artifacts.py .device/s65/tiny --only
# llama_tiny_context_cluster).
# `c8`: B = 1 in exactly 8 splits up to L = 1087 meeting through the L2
# (b1_s8) or on clusters of 8 (b1_c8) against the default, four passes at
# L = 1024 (C8_PASSES="1 2" for two; C8_CONTEXTS=512,1024 for more; DECODE_SWEEP_VARIANTS=default,b1_s8,b1_c8 python
# bench/decode_sweep.py --build .device/s65/c8). Predicted in bench/RESULTS.md.
# `stamps`: B = 1's short kernel alone, traced with the phased attention's
# stamps at L = 1024: today's, 8 splits through the L2, 8 on a cluster
# (DECODE_TRACE_VARIANTS=stamps_b1,stamps_b1_s8,stamps_b1_c8 python
# bench/decode_trace.py --build .device/s65/tr).
# `grid`: etc bench of default, b1_s8 and b1_c8 (B = 1, L = 1024, 4 passes) on
# every co-resident CTA, then all three on 240 (what 30 clusters of 8 hold):
# how much of b1_c8's loss is its grid.
# Usage: bash bench/gpu_session65.sh [card] [h200] [proto] [tests] [c8] [stamps] [grid]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-card}; do
  case $step in
  card) nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$OUT/s65_card.txt" ;;
  h200) if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
      issue_bench .device/s64/dec
      mkdir -p "$OUT/warmup"; OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s64/dec
    else echo "not an H200: table skipped"; fi ;;
  proto) nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
      bench/cluster_merge_proto.cu -o /tmp/cmp && \
      { /tmp/cmp 64; /tmp/cmp 64; } 2>&1 | tee "$OUT/s65_proto.txt" ;;
  tests) ETC_ARTIFACTS=.device/s65/tiny timeout 300 python -m pytest -q -p no:cacheprovider -rs \
      test/gpu/test_llama_gpu.py -k context_cluster 2>&1 | tail -15 | tee "$OUT/s65_tests.txt" ;;
  c8) SWEEP_PASSES=${C8_PASSES:-1 2 1 2} SWEEP_TMP=/tmp/s65 sweep_passes s65_c8 default,b1_s8,b1_c8 1 \
    ${C8_CONTEXTS:-1024} .device/s65/c8; tar czf "$OUT/s65_c8_raw.tgz" -C /tmp/s65 raw ;;
  stamps) DECODE_TRACE_VARIANTS=stamps_b1,stamps_b1_s8,stamps_b1_c8 DECODE_TRACE_BATCHES=1 \
      DECODE_TRACE_CONTEXT=1024 timeout 240 python bench/decode_trace.py --artifacts \
      .device/s65/tr --out /tmp/s65/tr 2>&1 | tee "$OUT/s65_stamps.txt" | grep -A30 "layer 8"
    tar czf "$OUT/s65_stamps.tgz" -C /tmp/s65 tr ;;
  grid) d=.device/s65/c8
    for g in "" 240; do
      python -m etc bench $d/default $d/b1_s8 $d/b1_c8 --symbols B=1,L=1024,S=1025 --scale 0.02 \
        --passes 4 ${g:+--grid $g} --json "$OUT/s65_grid${g:-_all}.json"
    done 2>&1 | tee "$OUT/s65_grid.txt" ;;
  esac
done

#!/usr/bin/env bash
# Fiftieth session (bench/RESULTS.md): B = 1's split count tiered by context
# (attn_single_tiers), the tma core's parts stamped (gemm_stamps), ragged
# batches (LlamaConfig.ragged), a model of a cluster split-K meeting
# (bench/meeting_proto.cu), and session 49's unreturned one-pass trace. No device
# was lent in the fiftieth session: a later session runs this. Each step's
# CPU-side build is in its comment.
# The CPU-side builds: bash bench/gpu_session50_build.sh (carry .device/s50, 58 MB).
# Usage: bash bench/gpu_session50.sh [tests] [tiers] [trace] [stamps] [ragged] [dyntrace] [meeting] [decbench] [warmup] [raw]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s50
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoder split by context three ways, its B = 1 split count
    # tiered by L; the tma decoder with its parts stamped; the ragged batches
    # on every attention tile (the artifacts above)
    ETC_ARTIFACTS=.device/s50/art timeout 400 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "(context or gemm_stamps or ragged) and not paged" 2>&1 \
      | tee -a "$OUT/tests.txt" | tail -8
    ;;
  tiers)  # B = 1 at L = 512..2048, the default against nine splits of up to 128
    # positions at L = 576..1151 only (DECODE_SWEEP_VARIANTS=default,b1_tiers python
    # bench/decode_sweep.py --build .device/s50/sweep); item 239 predicts L = 768
    # -0.8 %, 1024 -1.2 %, 512 and 2048 even
    SWEEP_TMP=/tmp/s50 sweep_passes s50_tiers ${TIER_VARIANTS:-default,b1_tiers} 1 \
      ${TIER_CONTEXTS:-512,768,1024,2048} .device/s50/sweep
    ;;
  trace)  # B = 1, L = 1024 traced, the default and attn_one_pass (item 242's 2 %
    # loss in the default artifact; DECODE_TRACE_VARIANTS=default,b1_one_pass python
    # bench/decode_trace.py --build .device/s50/tr)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-default,b1_one_pass} \
      DECODE_TRACE_BATCHES=${TRACE_BATCHES:-1} DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s50/tr} --out /tmp/s50/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep -A30 "layer"
    tar czf "$OUT/trace.tgz" -C /tmp/s50 tr
    ;;
  stamps)  # B = 32 and 64, L = 1024 traced with the tma core's parts stamped: where a
    # part's ~5.8 µs for 64 KB of weights goes (the k loop, the store and count) and the
    # last part's ~1.2 µs more (DECODE_TRACE_VARIANTS=default,stamps_large python
    # bench/decode_trace.py --build .device/s50/st)
    DECODE_TRACE_VARIANTS=default,stamps_large DECODE_TRACE_BATCHES=32,64 \
      DECODE_TRACE_CONTEXT=1024 timeout 300 \
      python bench/decode_trace.py --artifacts .device/s50/st --out /tmp/s50/st \
      2>&1 | tee -a "$OUT/stamps.txt" | grep -A40 "layer"
    tar czf "$OUT/stamps.tgz" -C /tmp/s50 st
    ;;
  ragged)  # the default against its ragged twin (LlamaConfig.ragged, every sequence
    # at L) at B = 1, 8, 32, 64 (DECODE_SWEEP_VARIANTS=default,ragged python
    # bench/decode_sweep.py --build .device/s50/sweep): expected even
    SWEEP_TMP=/tmp/s50 sweep_passes s50_ragged default,ragged 1,8,32,64 1024,4096 .device/s50/sweep
    # ... and the ragged kernels at random positions up to L (one at L; the floor
    # reads their rows only), checked against torch_decode_step's ragged path
    DECODE_SWEEP_RAGGED=random SWEEP_TMP=/tmp/s50 SWEEP_PASSES=1 \
      sweep_passes s50_ragged_random ragged 8,32,64 1024,4096 .device/s50/sweep
    ;;
  dyntrace)  # B = 1 and 8, L = 1024 traced under both schedules: where the dynamic
    # schedule's 1.1-1.2x goes (the last dynamic traces are the eleventh session's;
    # python bench/decode_trace.py --build .device/s50/dyn)
    DECODE_TRACE_BATCHES=1,8 DECODE_TRACE_CONTEXT=1024 timeout 240 \
      python bench/decode_trace.py --artifacts .device/s50/dyn --out /tmp/s50/dyn \
      2>&1 | tee -a "$OUT/dyntrace.txt" | grep -B12 -A8 "layer"
    tar czf "$OUT/dyntrace.tgz" -C /tmp/s50 dyn
    ;;
  meeting)  # bench/meeting_proto.cu (built here: nvcc needs no GPU): the four
    # projection stages with today's L2 meeting against the parts meeting in a
    # cluster's shared memory (clusters of 2, 4, 8) and no meeting at all
    nvcc -O3 -gencode arch=compute_90a,code=sm_90a bench/meeting_proto.cu -o /tmp/s50/mt \
      && timeout 120 /tmp/s50/mt 2>&1 | tee "$OUT/meeting_proto.txt"
    ;;
  decbench)  # the issue's table over the default artifact (python bench/decode.py --build
    # .device/s50/dec)
    issue_bench .device/s50/dec
    ;;
  warmup)  # cold process to the first token over the same artifact
    mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s50/dec
    ;;
  raw)  # every sweep's raw rows
    tar czf "$OUT/raw.tgz" -C /tmp/s50 raw 2>/dev/null || true
    ;;
  esac
done

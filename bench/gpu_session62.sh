#!/usr/bin/env bash
# Sixty-second session: B = 1's argmax folded into the LM head of its phased
# kernel (M.SINGLE_SEQUENCE_SHORT's argmax_fused) made the default.
# `tests`: the tiny decoders whose B = 1 bucket is the default's (so they
# fold) against the simulator on the GPU, both schedules (python
# test/gpu/make_artifacts.py .device/s62/arts --only llama_tiny_buckets).
# `fold`: the default against the one before (before62), four passes at B = 1,
# L = 512 and 1024 (DECODE_SWEEP_VARIANTS=before62,default python
# bench/decode_sweep.py --build .device/s62/fold). Predicted: -8..-12 us
# (-1..-1.5 %) at both, from items 272 and 275 on H100s.
# `decbench`, `warmup`: the issue's table and its warm-up over the default
# artifact (python bench/decode.py --build .device/s62/dec).
# `emb`: the embedding tile called in the B = 1..16 kernels (emb), and with
# the fold in B = 1's tensor-core kernel and at B = 2..8 (emb_key), against
# the default, four passes at B = 1, 2, 8, 16 and L = 1024, 4096
# (DECODE_SWEEP_VARIANTS=default,emb,emb_key python bench/decode_sweep.py
# --build .device/s62/emb; predictions in bench/decode_sweep.py).
# `emb2`: the default after item 278 (the B = 2..8 kernel's embedding called,
# B = 1's tensor-core kernel folding with its embedding called) against the
# one before (before_emb), two passes at B = 1, 2, 4, 8 and L = 1024, 4096
# (DECODE_SWEEP_VARIANTS=before_emb,default python bench/decode_sweep.py
# --build .device/s62/emb2). Predicted: item 278's -2.0..-2.6 % at B = 2..8,
# -1.0 % at B = 1, L = 4096, even at B = 1, L = 1024.
# `trace`: why the B = 2..8 kernel gained (its spills fell by 8 bytes only):
# B = 8, L = 1024 traced, before_emb and default (DECODE_TRACE_VARIANTS=
# before_emb,default python bench/decode_trace.py --build .device/s62/tr),
# and both B = 2..8 kernels' SASS spill and call counts (cuobjdump).
# `tests` (since item 278) also takes llama_tiny_context_buckets, whose
# tensor-core B = 1 kernel is SINGLE_SEQUENCE_LONG (make_artifacts.py --only
# llama_tiny_buckets,llama_tiny_context_buckets).
# `ncu`: the same question without the trace (whose build reversed the gain,
# item 278): both B = 2..8 kernels at B = 8, L = 1024 under Nsight Compute
# (clocks left alone), instructions, DRAM bytes, L2 hits and stall ratios.
# `outline`: the LM head and argmax called in the B = 2..8 kernel (few_lm),
# the embedding alone or with them called in the B = 9..16 kernel (mid_emb,
# mid_lm), two passes at B = 4, 8, 12, 16 and L = 1024
# (DECODE_SWEEP_VARIANTS=default,few_lm,mid_emb,mid_lm python
# bench/decode_sweep.py --build .device/s62/out).
# `kept`: the runtime's failure paths with a kept-zero tensor
# (Graph.tensor(kept_zero=True), zeroed after a failed launch) and without
# (python test/gpu/make_artifacts.py .device/s62/kz --only 'splitk$,broken').
# `twin`: the default against itself built again (twin), four passes at B =
# 1 and 8, L = 1024: how far two artifacts of one kernel drift (item 280's
# 1 % at B = 4; DECODE_SWEEP_VARIANTS=default,twin python
# bench/decode_sweep.py --build .device/s62/twin).
# `b1call`: B = 1's phased kernel calling its attention or final norm
# (b1_call_attention, b1_call_final_norm) against the default, four passes at
# L = 512 and 1024 (DECODE_SWEEP_VARIANTS=default,b1_call_attention,
# b1_call_final_norm python bench/decode_sweep.py --build .device/s62/b1c).
# Carry .device/s62. Usage: bash bench/gpu_session62.sh [tests] [fold] [warmup] [decbench] [emb] [emb2] [trace] [ncu] [outline] [kept] [twin] [b1call]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-tests fold warmup}; do
  case $step in
  tests) ETC_ARTIFACTS=.device/s62/arts timeout 200 python -m pytest -q -rfE -p no:cacheprovider \
    test/gpu/test_llama_gpu.py -k "matches_the_simulator and (llama_tiny_buckets or llama_tiny_context)" \
    > "$OUT/s62_tests.txt" 2>&1
    tail -4 "$OUT/s62_tests.txt" ;;
  fold) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s62 sweep_passes s62_fold before62,default 1 \
    512,1024 .device/s62/fold ;;
  warmup) mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s62/dec ;;
  decbench) issue_bench .device/s62/dec ;;
  emb) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s62 sweep_passes s62_emb default,emb,emb_key 1,2,8,16 \
    1024,4096 .device/s62/emb ;;
  emb2) SWEEP_PASSES="1 2" SWEEP_TMP=/tmp/s62 sweep_passes s62_emb2 before_emb,default 1,2,4,8 \
    1024,4096 .device/s62/emb2 ;;
  trace) DECODE_TRACE_VARIANTS=before_emb,default DECODE_TRACE_BATCHES=8 DECODE_TRACE_CONTEXT=1024 \
    timeout 200 python bench/decode_trace.py --artifacts .device/s62/tr --out /tmp/s62/tr \
    > "$OUT/s62_trace.txt" 2>&1; grep -A16 "layer" "$OUT/s62_trace.txt" | head -60
    tar czf "$OUT/s62_trace.tgz" -C /tmp/s62 tr
    for v in before_emb default; do
      cuobjdump -sass .device/s62/emb2/$v/bucket1/kernel.cubin > /tmp/s62/$v.sass 2>&1
      echo "$v: $(grep -c LDL /tmp/s62/$v.sass) LDL, $(grep -c STL /tmp/s62/$v.sass) STL," \
        "$(grep -c CALL /tmp/s62/$v.sass) CALL, $(wc -l < /tmp/s62/$v.sass) lines" | tee -a "$OUT/s62_sass.txt"
    done
    tar czf "$OUT/s62_sass.tgz" -C /tmp/s62 before_emb.sass default.sass ;;
  ncu) M="gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct"
    M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
    for v in before_emb default; do
      echo "== $v B=8 L=1024" >> "$OUT/s62_ncu.txt"
      timeout 150 ncu --clock-control none -k regex:llama --launch-skip 2 --launch-count 1 \
        --metrics "$M" python bench/decode_ncu.py .device/s62/emb2/$v 8 1024 $v 2>&1 \
        | grep -E "^\s+(smsp__|sm__|gpu__|dram__|lts__)|==ERR|rror" >> "$OUT/s62_ncu.txt"
    done
    cat "$OUT/s62_ncu.txt" ;;
  outline) SWEEP_TMP=/tmp/s62 sweep_passes s62_outline default,few_lm,mid_emb,mid_lm 4,8,12,16 1024 \
    .device/s62/out ;;
  kept) ETC_ARTIFACTS=.device/s62/kz timeout 200 python -m pytest -q -rfE -p no:cacheprovider \
    test/gpu/test_runtime_gpu.py -k "kept_zero or deadlock or sticky or timeout or counters_reset" \
    2>&1 | tail -15 | tee "$OUT/s62_kept.txt" ;;
  twin) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s62 sweep_passes s62_twin default,twin 1,4,8 1024 \
    .device/s62/twin ;;
  b1call) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s62 sweep_passes s62_b1call \
    default,b1_call_attention,b1_call_final_norm 1 512,1024 .device/s62/b1c ;;
  esac
done
tar czf "$OUT/s62_raw.tgz" -C /tmp/s62 raw 2>/dev/null || true

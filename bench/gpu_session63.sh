#!/usr/bin/env bash
# Sixty-third session.
# `card`: which GPU came (the issue's table is re-measured only on an H200;
# sessions 60-62 got H100s only).
# `decbench`, `warmup`: the issue's table and its warm-up over the default
# artifact (python bench/decode.py --build .device/s63/dec).
# `qo`: qkv's and o_proj's TMA rings 6 or 7 stages deep in the large kernel
# (tma6_qo, tma7_qo: 6 or 7 of a part's 8 weight k-tiles loaded before the
# waits) against the default, four passes at B = 32, 64 and L = 1024, 4096
# (DECODE_SWEEP_VARIANTS=default,tma6_qo,tma7_qo python bench/decode_sweep.py
# --build .device/s63/qo). Predicted in bench/RESULTS.md (sixty-third session).
# `suite`: the whole GPU suite over every test artifact of today's compiler
# (python test/gpu/make_artifacts.py .device/s63/arts; python
# test/gpu/make_fuzz_artifacts.py .device/s63/fuzz --count 10; tar cf - -C
# .device/s63 arts fuzz | xz > .device/s63/arts.tar.xz; carry that file),
# each file's verbose log kept if the call's limit cuts it; two calls:
# SUITE_FILES="gemm schedules runtime moe fuzz collective", then "llama".
# `t9`: B = 1 from L = 1088 to 1151 without a sixth kernel: the tensor-core
# kernel in 9 splits there (long9; long9s with deal slots) and the phased
# tier from 1088 (tier1088) against the default, four passes at B = 1 and 8,
# L = 1024, 1100, 1150 (the tiers change every kernel's split expression,
# so B = 8 and L = 1024 are the controls; DECODE_SWEEP_VARIANTS=default,
# long9,long9s,tier1088 python bench/decode_sweep.py --build .device/s63/t9).
# `splits`: B = 1's tensor-core kernel in up to 25 or 33 splits past L = 1087
# (splits25, splits33) against the default, four passes at B = 1 and 8, L =
# 1024, 2048 and 4096 (DECODE_SWEEP_VARIANTS=default,splits25,splits33 python
# bench/decode_sweep.py --build .device/s63/sp).
# `examples`: the examples' GPU path after their command line moved into
# _common's parser and cli wrapper (artifacts: python examples/<ex>.py
# [--tiny] --save-artifact .device/s63/ex/<name> for splitk_rowsum,
# symbolic_batch, llama_decode and llama_serve), and an unreadable artifact
# as one error line.
# `hyb`: o_proj alone on the gemv core at B = 17..32 (hyb32_o) against the
# default and qkv with it (hyb32), four passes at B = 24, 32 and L = 1024,
# 4096 (DECODE_SWEEP_VARIANTS=default,hyb32,hyb32_o python
# bench/decode_sweep.py --build .device/s63/hyb).
# Carry .device/s63 (or its parts). Usage: [SUITE_FILES=...] [SUITE_BUDGET=s]
# bash bench/gpu_session63.sh [card] [decbench] [warmup] [qo] [suite] [t9] [splits] [examples] [hyb]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-card}; do
  case $step in
  card) nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$OUT/s63_card.txt" ;;
  decbench) issue_bench .device/s63/dec ;;
  warmup) mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s63/dec ;;
  qo) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s63 sweep_passes s63_qo default,tma6_qo,tma7_qo 32,64 \
    1024,4096 .device/s63/qo; tar czf "$OUT/s63_qo_raw.tgz" -C /tmp/s63 raw ;;
  t9) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s63 sweep_passes s63_t9 default,long9,long9s,tier1088 \
    1,8 1024,1100,1150 .device/s63/t9; tar czf "$OUT/s63_t9_raw.tgz" -C /tmp/s63 raw ;;
  splits) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s63 sweep_passes s63_splits default,splits25,splits33 \
    1,8 1024,2048,4096 .device/s63/sp; tar czf "$OUT/s63_splits_raw.tgz" -C /tmp/s63 raw ;;
  examples) { python examples/splitk_rowsum.py --artifact .device/s63/ex/splitk --sizes 1,7,1000
    python examples/symbolic_batch.py --artifact .device/s63/ex/symb
    python examples/llama_decode.py --tiny --artifact .device/s63/ex/llama_tiny
    python examples/llama_serve.py --tiny --artifact .device/s63/ex/serve_tiny
    python examples/splitk_rowsum.py --artifact .device/s63/ex/none; echo "rc=$?"
    } > "$OUT/s63_examples.txt" 2>&1; tail -30 "$OUT/s63_examples.txt" ;;
  hyb) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s63 sweep_passes s63_hyb default,hyb32,hyb32_o 24,32 \
    1024,4096 .device/s63/hyb; tar czf "$OUT/s63_hyb_raw.tgz" -C /tmp/s63 raw ;;
  suite) gpu_suite s63 .device/s63/arts.tar.xz /tmp/s63 ;;
  esac
done

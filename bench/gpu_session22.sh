#!/usr/bin/env bash
# Twenty-second session (bench/RESULTS.md item 89): an expert's only row
# block, when it has at most 64 rows, on one warpgroup (`short_blocks`),
# against the prefill preset in alternation; the MoE GPU tests of the
# short-block layer and the real-size prefill examples with short blocks.
# Built with:
#   BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=tma128wtc,pre_short python bench/moe.py --build .device/n22g/moe
#   (run 12: BENCH_MOE_CONFIGS=tma128wtc,pre_tk,pre_short,pre_short_tk into .device/n22k, timed at T = 1024, 4096)
#   python test/gpu/make_artifacts.py .device/n22g/arts --only moe_small_tma
#   (run 10, the final code: the same for moe_small_tma_short, moe_small_tma_static,
#   moe_small_tma_dynamic into .device/n22i/arts, and pre_short into .device/n22i/trip)
#   python examples/moe.py --preset prefill [--topk 1 --routing top1] --save-artifact .device/n22g/ex/moe_prefill[_top1]
#   (the examples with short_blocks added to PRESETS["prefill"]'s GEMM options)
# The first variants of item 89 (every block of at most 64 rows short, with
# A loaded as two 64-row boxes; then per-part and predicated variants) ran
# from .device/n22{,b,c,d,e,f} with the same commands.
# Usage: bash bench/gpu_session22.sh [tests] [moe] [examples]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-tests moe examples}; do
  case $step in
  tests)
    echo "== MoE GPU tests (TMA tiles)" | tee "$OUT/tests.txt"
    ETC_ARTIFACTS=.device/n22g/arts timeout 300 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k "_tma_short or short_blocks" 2>&1 | tail -15 | tee -a "$OUT/tests.txt"
    ;;
  moe)
    mkdir -p "$OUT/j"
    for pass in 1 2 3; do
      cfgs=tma128wtc,pre_short
      [ $pass = 2 ] && cfgs=pre_short,tma128wtc
      echo "== MoE pass $pass" | tee -a "$OUT/moe_ab.txt"
      BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=${MOE_SIZES:-128,1024,4096} timeout 300 \
        python bench/moe.py --artifacts .device/n22g/moe --out "$OUT/j/moe_$pass.json" 2>&1 \
        | grep -E "GPU time|copy bandwidth|WRONG|rror" | tee -a "$OUT/moe_ab.txt"
    done
    tar czf "$OUT/moe_json.tgz" -C "$OUT" j && rm -rf "$OUT/j"
    ;;
  examples)
    echo "== MoE examples, prefill with short blocks, static" | tee "$OUT/examples.txt"
    run() { timeout 240 python examples/moe.py --preset prefill "$@" 2>&1 | tee -a "$OUT/examples.txt"; }
    run --artifact .device/n22g/ex/moe_prefill --tokens 1,7,16,128,1024,4096
    run --artifact .device/n22g/ex/moe_prefill --routing one-expert --tokens 1,16,1000
    run --artifact .device/n22g/ex/moe_prefill --routing few-experts --tokens 7,128,4095
    run --artifact .device/n22g/ex/moe_prefill_top1 --topk 1 --routing top1 --tokens 1,33,1000
    ;;
  esac
done

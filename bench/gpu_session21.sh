#!/usr/bin/env bash
# Twenty-first session (bench/RESULTS.md items 86-87): triggered tiles with a
# guarded table kept in registers. The MoE presets compiled with and without
# `guarded_indptr` (the old kernels: bench/build_unguarded.py), timed in
# alternation in one run; a traced prefill launch; the MoE GPU tests and the
# real-size examples on the new kernels. Item 87's runs (a compiler since
# reverted) put item 86's kernels in `moe_g` and the tried ones in
# `moe_new`/`moe_new3`, and set MOE_AB_TAGS ("old g new", "g new3 new").
# Built with:
#   BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=dec_pf_gu32,tma128wtc,pre64 python bench/moe.py --build .device/n21/moe_new
#   BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=dec_pf_gu32,tma128wtc,pre64 python bench/build_unguarded.py bench/moe.py --build .device/n21/moe_old
#   BENCH_MOE_LEAN=1 BENCH_MOE_SCHEDULES=static BENCH_MOE_CONFIGS=tma128wtc python bench/moe.py --build .device/n21/moe_tr --trace
#   python test/gpu/make_artifacts.py .device/n21/arts --only moe_small
#   python examples/moe.py --preset P [--topk 1 --routing top1] --save-artifact .device/n21/ex/moe_P[_top1]
# Item 88 (GEMM tiles dealt by ticket), same machine layout:
#   BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=dec_tk,pre_tk,mid_tk python bench/moe.py --build .device/n21/moe_tk
#   (and the listed presets in .device/n21/moe_g, as for moe_new above)
#   python examples/moe.py --preset mid [--topk 1 --routing top1] --save-artifact .device/n21/ex/moe_mid[_top1]
# Usage: bash bench/gpu_session21.sh [tests] [examples] [moe] [trace] [ticket] [mid]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-tests examples moe trace}; do
  case $step in
  tests)
    echo "== MoE GPU tests" | tee "$OUT/tests.txt"
    ETC_ARTIFACTS=.device/n21/arts timeout 300 python -m pytest -q -rs test/gpu/test_moe_gpu.py 2>&1 \
      | tail -15 | tee -a "$OUT/tests.txt"
    ;;
  examples)
    echo "== MoE examples, static" | tee "$OUT/examples.txt"
    for p in decode prefill; do
      run() { timeout 240 python examples/moe.py --preset $p "$@" 2>&1 | tee -a "$OUT/examples.txt"; }
      run --artifact ".device/n21/ex/moe_$p" --tokens 1,7,16,128,1024,4096
      run --artifact ".device/n21/ex/moe_$p" --routing one-expert --tokens 1,16,1000
      run --artifact ".device/n21/ex/moe_$p" --routing few-experts --tokens 7,128,4095
      run --artifact ".device/n21/ex/moe_${p}_top1" --topk 1 --routing top1 --tokens 1,33,1000
    done
    ;;
  moe)
    for pass in 1 2; do
      for tag in ${MOE_AB_TAGS:-old new}; do
        echo "== MoE $tag pass $pass" | tee -a "$OUT/moe_ab.txt"
        BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=dec_pf_gu32,tma128wtc,pre64 BENCH_MOE_SIZES=1,16,128,1024,4096 timeout 300 \
          python bench/moe.py --artifacts ".device/n21/moe_$tag" --out "$OUT/moe_${tag}_$pass.json" 2>&1 \
          | grep -E "^T=|GPU time|copy bandwidth|WRONG" | tee -a "$OUT/moe_ab.txt"
      done
    done
    ;;
  ticket)
    for pass in 1 2; do
      for tag in g tk; do
        cfgs=dec_pf_gu32,tma128wtc,pre64; [ $tag = tk ] && cfgs=dec_tk,pre_tk,mid_tk
        echo "== MoE $tag pass $pass" | tee -a "$OUT/ab.txt"
        BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,16,128,1024,4096 timeout 200 \
          python bench/moe.py --artifacts ".device/n21/moe_$tag" --out "$OUT/moe_${tag}_$pass.json" 2>&1 \
          | grep -E "GPU time|copy|WRONG" | tee -a "$OUT/ab.txt"
      done
    done
    ;;
  mid)
    run() { timeout 200 python examples/moe.py --preset mid "$@" 2>&1 | tee -a "$OUT/examples_mid.txt"; }
    run --artifact .device/n21/ex/moe_mid --tokens 1,7,16,128,1024,4096
    run --artifact .device/n21/ex/moe_mid --routing one-expert --tokens 1,16,1000
    run --artifact .device/n21/ex/moe_mid --routing few-experts --tokens 7,128,4095
    run --artifact .device/n21/ex/moe_mid_top1 --topk 1 --routing top1 --tokens 1,33,1000
    ;;
  trace)
    echo "== MoE trace (prefill preset, new)" | tee "$OUT/trace.txt"
    BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=tma128wtc BENCH_MOE_SIZES=1024,4096 BENCH_MOE_SCHEDULES=static timeout 300 \
      python bench/moe.py --artifacts .device/n21/moe_tr --out "$OUT/trace.json" --trace 2>&1 | tee -a "$OUT/trace.txt"
    ;;
  esac
done

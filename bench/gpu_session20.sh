#!/usr/bin/env bash
# Twentieth session (bench/RESULTS.md item 85): the MoE presets and the
# decoder's default kernels compiled by two compilers (before / after the
# static loop's cache of completed waits), timed in alternation in one run,
# and the whole GPU suite on the new compiler's artifacts. Built with:
#   BENCH_MOE_CONFIGS=dec_pf_gu32,tma128wtc,pre64 python bench/moe.py --build .device/n20/moe_{old,new}
#   DECODE_SWEEP_VARIANTS=default python bench/decode_sweep.py --build .device/n20/dec_{old,new}
#   python test/gpu/make_artifacts.py .device/n20/full; python test/gpu/make_fuzz_artifacts.py .device/n20/fuzz --count 10
# Usage: bash bench/gpu_session20.sh [moe] [decoder] [tests]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-moe decoder tests}; do
  case $step in
  moe)
    for pass in 1 2; do
      for tag in old new; do
        echo "== MoE $tag pass $pass" | tee -a "$OUT/moe_ab.txt"
        BENCH_MOE_CONFIGS=dec_pf_gu32,tma128wtc,pre64 BENCH_MOE_SIZES=1,16,1024,4096 timeout 300 \
          python bench/moe.py --artifacts ".device/n20/moe_$tag" --out "$OUT/moe_${tag}_$pass.json" 2>&1 \
          | grep -E "^T=|GPU time|copy bandwidth|WRONG" | tee -a "$OUT/moe_ab.txt"
      done
    done
    ;;
  decoder)
    for ctx in 1024 4096; do
      for tag in old new old new; do
        echo "== decoder $tag L=$ctx" | tee -a "$OUT/dec_ab.txt"
        DECODE_SWEEP_VARIANTS=default DECODE_SWEEP_CONTEXT=$ctx DECODE_SWEEP_BATCHES=1,64 timeout 300 \
          python bench/decode_sweep.py --artifacts ".device/n20/dec_$tag" 2>&1 | tail -n 4 | tee -a "$OUT/dec_ab.txt"
      done
    done
    ;;
  tests)
    echo "== GPU tests" | tee "$OUT/tests.txt"
    ETC_ARTIFACTS=.device/n20/full ETC_FUZZ_ARTIFACTS=.device/n20/fuzz timeout 400 \
      python -m pytest -q -rs test/gpu 2>&1 | tail -15 | tee -a "$OUT/tests.txt"
    ;;
  esac
done

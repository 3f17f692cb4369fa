#!/usr/bin/env bash
# The MoE work (issue 6) on the H200 in one device call, from artifacts
# compiled on a CPU machine:
#   python test/gpu/make_artifacts.py .device/arts
#   python test/gpu/make_fuzz_artifacts.py .device/fuzz --count 10
#   python bench/gemm.py --build .device/gemm          (and --sweep --build .device/sweep)
#   python bench/gemm_tc.py --build .device/gemm_tc
#   python bench/moe.py --build .device/moe --trace
#   python bench/gemm_tma.py --build .device/gemm_tma
#   python examples/moe.py [--schedule dynamic] --save-artifact .device/ex/moe[_dynamic]
#   python examples/moe.py --topk 1 --routing top1 [--schedule dynamic] --save-artifact .device/ex/moe_top1[_dynamic]
#   (the same with --preset prefill, saved as .device/ex/moe_prefill[_top1][_dynamic], for MOE_PRESET=prefill)
#   BENCH_MOE_CONFIGS=bm16cp,tma128wtc python bench/moe.py --build .device/moe_presets  (MOE_ARTIFACTS, MOE_TRACE=0)
# then, on the GPU machine: bash bench/gpu_moe.sh [tests|examples|gemm|sweep|gemm_tc|tma|bench ...]
# (writes to $OUT)
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
STEPS=${*:-tests examples bench}

for step in $STEPS; do
  case $step in
  tests)
    gpu_tests -x
    ;;
  examples)
    # MOE_PRESET=prefill runs the artifacts saved with --preset prefill as
    # .device/ex/moe_prefill[_top1][_dynamic].
    echo "== MoE example on the GPU ${MOE_PRESET:-}" | tee "$OUT/examples.txt"
    name=moe${MOE_PRESET:+_$MOE_PRESET}
    for sfx in "" _dynamic; do
      sched=static; [ -n "$sfx" ] && sched=dynamic
      run() { timeout 240 python examples/moe.py --schedule $sched ${MOE_PRESET:+--preset $MOE_PRESET} "$@" 2>&1 | tee -a "$OUT/examples.txt"; }
      run --artifact ".device/ex/$name$sfx" --tokens 1,7,16,128,1024,4096
      run --artifact ".device/ex/$name$sfx" --routing one-expert --tokens 1,16,1000
      run --artifact ".device/ex/$name$sfx" --routing few-experts --tokens 7,128,4095
      run --artifact ".device/ex/${name}_top1$sfx" --topk 1 --routing top1 --tokens 1,33,1000
    done
    ;;
  gemm)
    echo "== GEMM tiles vs cuBLAS" | tee "$OUT/gemm.txt"
    timeout 300 python bench/gemm.py --artifacts .device/gemm --out "$OUT/gemm.json" 2>&1 | tee -a "$OUT/gemm.txt"
    ;;
  sweep)
    echo "== decode GEMM tile variants (weight streaming)" | tee "$OUT/sweep.txt"
    timeout 200 python bench/gemm.py --sweep --artifacts .device/sweep --out "$OUT" 2>&1 | tee -a "$OUT/sweep.txt"
    ;;
  gemm_tc)
    echo "== pipelined GEMM tiles vs cuBLAS" | tee "$OUT/gemm_tc.txt"
    timeout 200 python bench/gemm_tc.py --artifacts .device/gemm_tc --out "$OUT" 2>&1 | tee -a "$OUT/gemm_tc.txt"
    ;;
  bench)
    # MOE_ARTIFACTS (default .device/moe) built with --trace unless MOE_TRACE=0;
    # BENCH_MOE_CONFIGS=a,b as for the build.
    echo "== MoE benchmark" | tee "$OUT/moe.txt"
    trace=--trace; [ "${MOE_TRACE:-1}" = 0 ] && trace=
    timeout 500 python bench/moe.py --artifacts "${MOE_ARTIFACTS:-.device/moe}" --out "$OUT" $trace 2>&1 | tee -a "$OUT/moe.txt"
    ;;
  tma)
    echo "== TMA GEMM tiles vs cuBLAS" | tee "$OUT/gemm_tma.txt"
    timeout 300 python bench/gemm_tma.py --artifacts .device/gemm_tma --out "$OUT" 2>&1 | tee -a "$OUT/gemm_tma.txt"
    ;;
  esac
done

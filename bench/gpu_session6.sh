#!/usr/bin/env bash
# Session 6's run on the H200 (issue 6: TMA tiles, router on TMA, the
# dynamic schedule's whole-task ready counters), from artifacts built on the CPU:
#   python test/gpu/make_artifacts.py .device/arts
#   BENCH_MOE_CONFIGS=bm16cp,tma128w,tma128wtc python bench/moe.py --build .device/moe_tma4 --trace
# then: bash bench/gpu_session6.sh (writes to $OUT).
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
export BENCH_MOE_CONFIGS=${BENCH_MOE_CONFIGS:-bm16cp,tma128w,tma128wtc} BENCH_MOE_CHROME=1024
ART=${MOE_ARTIFACTS:-.device/moe_tma4}
gpu_tests -x
timeout 300 python bench/moe.py --artifacts "$ART" --out "$OUT" > "$OUT/moe.txt" 2>&1
grep "GPU time\|CUDA graph" "$OUT/moe.txt"
timeout 200 python bench/moe_trace.py --artifacts "$ART" --out /tmp/tr --tokens 1,1024,4096 > /dev/null 2>&1
cp /tmp/tr/moe_trace.txt "$OUT/"

#!/usr/bin/env bash
# Session 6's last MoE run on the H200 (issue 6): the prefill preset (TMA
# tiles and router) in the example, on every size and skewed routing, and
# the benchmark of the presets. Built on the CPU first:
#   BENCH_MOE_CONFIGS=bm16cp,tma128wtc,tma16 python bench/moe.py --build .device/moe_tma5
#   python examples/moe.py --preset prefill [--topk 1 --routing top1] [--schedule dynamic] \
#       --save-artifact .device/ex/moe_prefill[_top1][_dynamic]
# then: bash bench/gpu_session6.sh (writes to $OUT).
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
export BENCH_MOE_CONFIGS=${BENCH_MOE_CONFIGS:-bm16cp,tma128wtc,tma16}
echo "== MoE example, prefill preset" | tee "$OUT/examples.txt"
for sfx in "" _dynamic; do
  sched=static; [ -n "$sfx" ] && sched=dynamic
  ex() { timeout 200 python examples/moe.py --preset prefill --schedule $sched "$@" 2>&1 | tail -8 | tee -a "$OUT/examples.txt"; }
  ex --artifact ".device/ex/moe_prefill$sfx" --tokens 1,7,16,128,1024,4096
  ex --artifact ".device/ex/moe_prefill$sfx" --routing one-expert --tokens 1,16,1000
  ex --artifact ".device/ex/moe_prefill$sfx" --routing few-experts --tokens 7,128,4095
  ex --artifact ".device/ex/moe_prefill_top1$sfx" --topk 1 --routing top1 --tokens 1,33,1000
done
timeout 300 python bench/moe.py --artifacts "${MOE_ARTIFACTS:-.device/moe_tma5}" --out "$OUT" > "$OUT/moe.txt" 2>&1
grep "GPU time\|CUDA graph" "$OUT/moe.txt"

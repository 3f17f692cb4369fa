#!/usr/bin/env bash
# The decoder work (issue 7) on the H200 in one device call, from artifacts
# compiled on a CPU machine:
#   python test/gpu/make_artifacts.py .device/arts
#   python test/gpu/make_fuzz_artifacts.py .device/fuzz --count 10
#   python bench/decode.py --build .device/decode
#   python bench/decode_sweep.py --build .device/sweep
#   python bench/decode_trace.py --build .device/trace
#   python examples/llama_decode.py --tiny [--schedule dynamic] --save-artifact .device/ex/llama_tiny[_dynamic]
# then, on the GPU machine (carry the .device folders it uses):
#   bash bench/gpu_decode.sh [tests|example|sweep|trace|bench ...]   (writes to $OUT)
# bench reads DECODE_ARTIFACTS (default .device/decode; e.g. a build with
# `bench/decode.py --build DIR --set FIELD=VALUE`) and DECODE_PARTS.
# Manifests are format etc-artifact/5 (the runtime also reads 4): rebuild artifacts made before 4.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
STEPS=${*:-tests example sweep bench}

for step in $STEPS; do
  case $step in
  tests)
    gpu_tests
    ;;
  example)
    echo "== tiny decoder example on the GPU (greedy steps, plans shared across L)" | tee "$OUT/example.txt"
    for sfx in "" _dynamic; do
      sched=static; [ -n "$sfx" ] && sched=dynamic
      timeout 240 python examples/llama_decode.py --tiny --schedule $sched --batch 3 --prompt 5 \
        --steps 12 --artifact ".device/ex/llama_tiny$sfx" 2>&1 | tee -a "$OUT/example.txt"
    done
    ;;
  sweep)
    echo "== decode tile sweep" | tee "$OUT/sweep.txt"
    timeout 400 python bench/decode_sweep.py --artifacts .device/sweep --out "$OUT" --reps 5 2>&1 \
      | grep -v -i warn | tee -a "$OUT/sweep.txt"
    ;;
  trace)
    echo "== where the time goes" | tee "$OUT/trace.txt"
    timeout 300 python bench/decode_trace.py --artifacts .device/trace --out "$OUT" 2>&1 \
      | tee -a "$OUT/trace.txt"
    ;;
  bench)
    echo "== decode benchmark" | tee "$OUT/bench.txt"
    timeout 500 python bench/decode.py --artifacts "${DECODE_ARTIFACTS:-.device/decode}" --out "$OUT" \
      --reps 5 --parts "${DECODE_PARTS:-check,time,warmup}" 2>&1 \
      | grep -v -i "warn\|attention mask\|cudagraph" | tee -a "$OUT/bench.txt"
    ;;
  *)
    echo "unknown step $step (tests|example|sweep|trace|bench)" >&2
    exit 2
    ;;
  esac
done

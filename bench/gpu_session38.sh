#!/usr/bin/env bash
# Thirty-eighth session (bench/RESULTS.md, items 170-): the compiled PyTorch
# step with one cache buffer a layer, and the decoder's timings against it.
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session38.sh [probe] [decbench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s38
for step in ${*:-probe}; do
  case $step in
  probe)  # the compiled step's time and kernels at each B, L = 1024 (no CPU-side build)
    timeout ${PROBE_TIMEOUT:-300} python bench/torch_compile_probe.py ${PROBE_BATCHES:-1 8 64} 2>&1 \
      | tee "$OUT/compile_probe.txt" | grep -v "^\s*$\|template_heuristics\|^I1\|^W1" | tail -90
    ;;
  decbench)  # bench/decode.py's timings over the default artifact, torch.compile at
    # every B and both contexts (python bench/decode.py --build .device/s38dec)
    timeout ${DECBENCH_TIMEOUT:-560} python bench/decode.py --artifacts .device/s38dec --out "$OUT" \
      --reps 5 --parts time --compile-batches ${COMPILE_BATCHES:-1,8,32,64} \
      --compile-contexts ${COMPILE_CONTEXTS:-1024,4096} \
      2>&1 | grep -v -i "warn\|attention mask\|cudagraph" | tee "$OUT/bench.txt"
    ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done

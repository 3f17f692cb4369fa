#!/usr/bin/env bash
# The CPU-side builds of bench/gpu_session51.sh: the tiny GPU-test artifacts
# of the paged caches into .device/s51/art and the Llama-3.2-1B sweep's
# default, paged128, paged16, ragged and ragged_pool artifacts into
# .device/s51/sweep (sizes
# printed at the end; ~2.5 minutes on 2 cores, 27 MB: carry .device/s51).
# The serving example's artifacts go to .device/s51/serve_{tiny,1b}.
# Usage: bash bench/gpu_session51_build.sh [art] [sweep] [serve]
set -euo pipefail
cd "$(dirname "$0")/.."
for part in ${*:-art sweep serve}; do
  case $part in
  art)
    for p in $(python -c "import sys; sys.path.insert(0, 'test/gpu'); from graphs import \
llama_tiny_variants as v; print(' '.join(k for k, c in v().items() if c.page_size))") \
      llama_tiny_static llama_tiny_dynamic; do  # (the last two: the token clamp's test)
      python test/gpu/make_artifacts.py .device/s51/art --only $p | tail -1
    done
    ;;
  sweep)
    DECODE_SWEEP_VARIANTS=default,paged128,paged16,ragged,ragged_pool python bench/decode_sweep.py \
      --build .device/s51/sweep
    ;;
  serve)
    python examples/llama_serve.py --tiny --save-artifact .device/s51/serve_tiny
    python examples/llama_serve.py --save-artifact .device/s51/serve_1b
    ;;
  esac
done
du -sh .device/s51/* 2>/dev/null

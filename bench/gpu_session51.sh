#!/usr/bin/env bash
# Fifty-first session (bench/RESULTS.md): paged KV caches (LlamaConfig.page_size).
# No device was lent in the fifty-first session: a later session runs this,
# after bench/gpu_session50.sh's steps. Each step's CPU-side build is in its
# comment.
# The CPU-side builds: bash bench/gpu_session51_build.sh (carry .device/s51).
# Usage: bash bench/gpu_session51.sh [tests] [serve] [paged] [ragged] [raw]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s51
for step in ${*:-tests}; do
  case $step in
  tests)  # every attention tile over a paged cache against the simulator, both
    # schedules, ragged and not (the *_paged* variants of test/gpu/graphs.py), and
    # tokens outside the vocabulary launched without a fault
    ETC_ARTIFACTS=.device/s51/art timeout 500 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "paged or vocabulary" 2>&1 | tee -a "$OUT/tests.txt" \
      | tail -8
    ;;
  serve)  # examples/llama_serve.py on the GPU: requests joining and leaving a
    # batch over a paged cache, every step against the numpy model (the tiny
    # model's three kernels, then Llama-3.2-1B's five)
    timeout 200 python examples/llama_serve.py --tiny --artifact .device/s51/serve_tiny \
      2>&1 | tee "$OUT/serve_tiny.txt" | tail -4
    timeout 400 python examples/llama_serve.py --artifact .device/s51/serve_1b --requests 5 \
      --max-batch 3 2>&1 | tee "$OUT/serve_1b.txt" | tail -8
    ;;
  paged)  # Llama-3.2-1B over pages of 128 and 16 against the contiguous default
    # (DECODE_SWEEP_VARIANTS=default,paged128,paged16 python bench/decode_sweep.py
    # --build .device/s51/sweep): a table lookup per box (TMA) or per row
    # (phased tile) is one more dependent load; expected within 1-2 % at 128
    SWEEP_TMP=/tmp/s51 sweep_passes s51_paged ${PAGED_VARIANTS:-default,paged128,paged16} \
      1,8,32,64 1024,4096 .device/s51/sweep
    ;;
  ragged)  # ragged batches at random positions up to L (one at L), checked against
    # torch_decode_step's ragged path: the attention on static lists against dealt
    # at run time (pool), where short sequences' splits end early
    DECODE_SWEEP_RAGGED=random SWEEP_TMP=/tmp/s51 sweep_passes s51_ragged ragged,ragged_pool \
      8,32,64 1024,4096 .device/s51/sweep
    ;;
  raw)  # every sweep's raw rows
    tar czf "$OUT/raw.tgz" -C /tmp/s51 raw 2>/dev/null || true
    ;;
  esac
done

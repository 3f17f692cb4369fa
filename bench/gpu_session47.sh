#!/usr/bin/env bash
# Forty-seventh session (bench/RESULTS.md, items 227-): the B = 2..16 kernels'
# gemv tiles with whole-line weight copies. Each step's CPU-side build is in
# its comment.
# Usage: bash bench/gpu_session47.sh [tests] [lines] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s47
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoders with whole-line copies, and the rows mode as it was
    # (python test/gpu/make_artifacts.py .device/s47art --only llama_tiny_gemv8_lines, then
    # llama_tiny_gemv16_lines, llama_tiny_gemv16, llama_tiny_gemv8_lm128)
    for k in "lines" "gemv16 and not lines" "lm128"; do
      ETC_ARTIFACTS=.device/s47art timeout 200 python -m pytest -q -rfs --tb=short \
        test/gpu/test_llama_gpu.py -k "$k" 2>&1 | tee -a "$OUT/tests.txt" | tail -4
    done
    ;;
  lines)  # B = 2..16 with whole-line copies (DECODE_SWEEP_VARIANTS=default,mid_lines
    # python bench/decode_sweep.py --build .device/s47a)
    SWEEP_TMP=/tmp/s47 sweep_passes s47_lines default,mid_lines ${LINES_BATCHES:-2,4,8,16} \
      1024,4096 .device/s47a
    ;;
  tune)  # with whole lines the default: the half-line copies again, B = 2..8's LM head in
    # 64-column blocks, 5- or 3-stage rings (DECODE_SWEEP_VARIANTS=default,mid_halves,few_lm64,
    # mid_s5,mid_s3 python bench/decode_sweep.py --build .device/s47b)
    SWEEP_TMP=/tmp/s47 sweep_passes s47_tune default,mid_halves,few_lm64,mid_s5,mid_s3 \
      ${TUNE_BATCHES:-8} ${TUNE_CONTEXTS:-1024,4096} .device/s47b
    ;;
  decbench)  # the issue's table over the default artifact (python bench/decode.py --build
    # .device/s47dec)
    issue_bench ${DECBENCH_DIR:-.device/s47dec}
    ;;
  raw)
    tar czf "$OUT/sweep_raw.tgz" -C /tmp/s47 raw
    ;;
  esac
done

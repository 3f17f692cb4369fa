#!/usr/bin/env bash
# Forty-ninth session (bench/RESULTS.md, items 244-): B >= 17 on the gemv
# core's rows mode in 32-row tiles. Each step's CPU-side build is in its
# comment.
# Usage: bash bench/gpu_session49.sh [tests] [rows] [rows4096] [trace] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s49
for step in ${*:-tests}; do
  case $step in
  tests)  # the tiny decoders on the gemv core, 8 to 64 rows a tile (python
    # test/gpu/make_artifacts.py .device/s49/art --only llama_tiny_gemv)
    ETC_ARTIFACTS=.device/s49/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "gemv" 2>&1 | tee -a "$OUT/tests.txt" | tail -6
    ;;
  rows)  # B = 24, 32, 64 at L = 1024 (DECODE_SWEEP_VARIANTS=default,g32,g32l,g32_all,
    # g32l_all,g64l python bench/decode_sweep.py --build .device/s49/sweep); then
    # ROWS_VARIANTS=default,g32l,g32l_ahead,g32l_wide ROWS_BATCHES=24,32 (g32l built
    # before, g32l_ahead after the half-chunk look-ahead), and ROWS_VARIANTS=default,
    # hyb32,hyb,hyb64 ROWS_BATCHES=24,32,48,64 with rows4096 (their tiny GPU tests:
    # make_artifacts.py --only llama_tiny_tma_gemv, pytest -k tma_gemv)
    SWEEP_TMP=/tmp/s49 sweep_passes s49_rows ${ROWS_VARIANTS:-default,g32,g32l,g32_all,g32l_all,g64l} \
      ${ROWS_BATCHES:-24,32,64} 1024 .device/s49/sweep
    ;;
  rows4096)  # the same at L = 4096
    SWEEP_TMP=/tmp/s49 sweep_passes s49_rows4096 ${ROWS_VARIANTS:-default,g32,g32l,g32_all,g32l_all,g64l} \
      ${ROWS_BATCHES:-24,32,64} 4096 .device/s49/sweep
    ;;
  trace)  # B = 32, L = 1024 traced, the large kernel and 32-row gemv tiles
    # (DECODE_TRACE_VARIANTS=default,g32l_ahead python bench/decode_trace.py --build
    # .device/s49/tr; TRACE_VARIANTS=default,g32l_ahead), then the hybrid (default,hyb32)
    DECODE_TRACE_VARIANTS=${TRACE_VARIANTS:-default,g32l} DECODE_TRACE_BATCHES=${TRACE_BATCHES:-32} \
      DECODE_TRACE_CONTEXT=1024 timeout 200 \
      python bench/decode_trace.py --artifacts ${TRACE_DIR:-.device/s49/tr} --out /tmp/s49/tr \
      2>&1 | tee -a "$OUT/trace.txt" | grep -A30 "layer"
    tar czf "$OUT/trace.tgz" -C /tmp/s49 tr
    ;;
  ncu)  # DRAM bytes read and written, L2 hit rate at B = 32, L = 1024 (Nsight Compute,
    # clocks left alone): the default, hyb32 and g32l_ahead (whose gemv weight copies
    # carry no evict-first hint, where the tma core's do); artifacts of step rows
    M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_op_read.sum,gpu__time_duration.sum
    for v in ${NCU_VARIANTS:-default hyb32 g32l_ahead}; do
      echo "== $v B=32 L=1024" >> "$OUT/ncu.txt"
      timeout 120 ncu --clock-control none -k regex:llama --launch-skip 2 --launch-count 1 --metrics $M \
        python bench/decode_ncu.py .device/s49/sweep/$v 32 1024 $v 2>&1 \
        | grep -E "^\s+(gpu__|dram__|lts__)|==ERR|rror" >> "$OUT/ncu.txt"
    done
    cat "$OUT/ncu.txt"
    ;;
  decbench)  # the issue's table over the default artifact (python bench/decode.py --build
    # .device/s49/dec)
    issue_bench .device/s49/dec
    ;;
  warmup)  # cold process to the first token over the same artifact
    mkdir -p "$OUT/warmup"
    OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s49/dec
    ;;
  sass8)  # B = 8, L = 4096 (the cell at the 1.3x edge): stalls per SASS instruction
    # (Nsight Compute source counters, clocks left alone) over the default artifact
    # (python bench/decode.py --build .device/s49/dec), the CSV into $OUT (read with
    # python bench/ncu_sass.py b8_sass.csv.gz [--region N])
    timeout 300 ncu --clock-control none -k regex:llama --launch-skip 2 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --import-source no -f -o /tmp/s49/b8 \
      python bench/decode_ncu.py .device/s49/dec/static 8 4096 2>&1 | tail -3
    ncu -i /tmp/s49/b8.ncu-rep --page source --csv --print-source sass > /tmp/s49/b8_sass.csv \
      2> "$OUT/sass_err.txt"; wc -l /tmp/s49/b8_sass.csv
    gzip -c /tmp/s49/b8_sass.csv > "$OUT/b8_sass.csv.gz"; head -5 "$OUT/sass_err.txt"
    timeout 120 ncu --clock-control none -k regex:llama --launch-skip 2 --launch-count 1 \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__cycles_elapsed.avg" \
      python bench/decode_ncu.py .device/s49/dec/static 8 4096 2>&1 \
      | grep -E "^\s+(smsp__|sm__)|==ERR|rror" | tee "$OUT/ncu_b8.txt"
    ;;
  raw)  # every sweep's raw rows
    tar czf "$OUT/raw.tgz" -C /tmp/s49 raw 2>/dev/null || true
    ;;
  esac
done

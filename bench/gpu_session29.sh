#!/usr/bin/env bash
# Twenty-ninth session (bench/RESULTS.md, decoder item 84): the TMA-fed
# attention's ring stages given back once read. Each step's CPU-side build
# is in its comment. Usage: bash bench/gpu_session29.sh [tests] [sweep] [trace] [b1]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
V=default,attn_read,attn_read_early,attn_read3
V_REV=attn_read3,attn_read_early,attn_read,default
for step in ${*:-tests sweep}; do
  case $step in
  tests)  # (python test/gpu/make_artifacts.py .device/s29/art --only llama_tiny_mma_tma;
    #  ... --only llama_1b_large)
    ETC_ARTIFACTS=.device/s29/art timeout 300 python -m pytest -q -rs test/gpu/test_llama_gpu.py \
      -k "mma_tma or ring_layouts" 2>&1 | tee "$OUT/tests_llama.txt" | tail -4
    ;;
  sweep)  # two passes, the second reversed, L = 1024 and 4096, B = 32 and 64
    # (DECODE_SWEEP_VARIANTS=$V python bench/decode_sweep.py --build .device/s29/dec)
    for pass in 1 2; do
      v=$V; [ $pass = 2 ] && v=$V_REV
      for L in 1024 4096; do
        DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=32,64 DECODE_SWEEP_CONTEXT=$L timeout 280 \
          python bench/decode_sweep.py --artifacts .device/s29/dec --out /tmp/s29/sw$pass$L --reps 7 \
          2>&1 | grep "B=" | tee -a "$OUT/sweep.txt"
        cp /tmp/s29/sw$pass$L/decode_sweep.json "$OUT/sweep_${pass}_$L.json"
      done
    done
    ;;
  trace)  # B = 64, L = 4096, the attention's window per layer
    # (DECODE_TRACE_VARIANTS=default,attn_read python bench/decode_trace.py --build .device/s29/tr)
    DECODE_TRACE_VARIANTS=default,attn_read DECODE_TRACE_BATCHES=64 DECODE_TRACE_CONTEXT=4096 \
      timeout 200 python bench/decode_trace.py --artifacts .device/s29/tr --out /tmp/s29/tr 2>&1 \
      | tee "$OUT/trace.txt" | grep -A8 "layer"
    cp /tmp/s29/tr/*.npz "$OUT/"
    ;;
  b1)  # B = 1, L = 1024: 16 attention splits, LM head blocks of 128 or 32; two passes, then traced
    # (B1=default,single16,lm128_b1,lm32_b1; DECODE_SWEEP_VARIANTS=$B1 python bench/decode_sweep.py
    #  --build .device/s29/b1; DECODE_TRACE_VARIANTS=$B1 python bench/decode_trace.py --build .device/s29/b1tr)
    for v in default,single16,lm128_b1,lm32_b1 lm32_b1,lm128_b1,single16,default; do
      DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=1 timeout 200 python bench/decode_sweep.py \
        --artifacts .device/s29/b1 --reps 9 2>&1 | grep "B=" | tee -a "$OUT/b1.txt"
    done
    DECODE_TRACE_VARIANTS=default,single16,lm128_b1,lm32_b1 DECODE_TRACE_BATCHES=1 timeout 200 \
      python bench/decode_trace.py --artifacts .device/s29/b1tr --out /tmp/s29/b1tr 2>&1 \
      | tee "$OUT/b1_trace.txt" | grep -E "^==|lm_head|attention|step"
    cp /tmp/s29/b1tr/*.npz "$OUT/"
    ;;
  esac
done

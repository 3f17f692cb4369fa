#!/usr/bin/env bash
# Twenty-ninth session (bench/RESULTS.md, decoder items 116-122): the
# TMA-fed attention's ring stages given back once read, traces per SM, the
# TMA tiles' epilogue loads ahead. Each step's CPU-side build is in its
# comment. Usage: bash bench/gpu_session29.sh [tests] [sweep] [trace] [b1] [hoist] [ahead]
#   [final] [bench]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
V=default,attn_read,attn_read_early,attn_read3
V_REV=attn_read3,attn_read_early,attn_read,default
# Two bench/decode_sweep.py passes (the second over REVERSED variants) at B =
# 32 and 64, L = 1024 and 4096: sweep_passes NAME VARIANTS REVERSED DIR; rows
# into $OUT/NAME.txt, raw NAME_<pass>_<L>.json.
sweep_passes() {
  local name=$1 variants=$2 reversed=$3 dir=$4 pass v L
  for pass in 1 2; do
    v=$variants; [ $pass = 2 ] && v=$reversed
    for L in 1024 4096; do
      DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=32,64 DECODE_SWEEP_CONTEXT=$L timeout 280 \
        python bench/decode_sweep.py --artifacts $dir --out /tmp/s29/$name$pass$L --reps 7 \
        2>&1 | grep "B=" | tee -a "$OUT/$name.txt"
      cp /tmp/s29/$name$pass$L/decode_sweep.json "$OUT/${name}_${pass}_$L.json"
    done
  done
}
for step in ${*:-tests sweep}; do
  case $step in
  tests)  # (python test/gpu/make_artifacts.py .device/s29/art --only llama_tiny_mma_tma;
    #  ... --only llama_1b_large)
    ETC_ARTIFACTS=.device/s29/art timeout 300 python -m pytest -q -rs test/gpu/test_llama_gpu.py \
      -k "mma_tma or ring_layouts" 2>&1 | tee "$OUT/tests_llama.txt" | tail -4
    ;;
  sweep)  # two passes, the second reversed, L = 1024 and 4096, B = 32 and 64
    # (DECODE_SWEEP_VARIANTS=$V python bench/decode_sweep.py --build .device/s29/dec)
    sweep_passes sweep $V $V_REV .device/s29/dec
    ;;
  trace)  # B = 64, L = 4096, the attention's window per layer
    # (DECODE_TRACE_VARIANTS=default,attn_read_early python bench/decode_trace.py --build .device/s29/tr)
    DECODE_TRACE_VARIANTS=default,attn_read_early DECODE_TRACE_BATCHES=64 DECODE_TRACE_CONTEXT=4096 \
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
  hoist)  # the folded norms' row sums loaded before the k loop (sync core): the tiny
    # decoder against the simulator, then the default artifact before / after, alternating
    # (python test/gpu/make_artifacts.py .device/s29/hoist/art --only llama_tiny_static, ...
    #  _dynamic, ..._regions; DECODE_SWEEP_VARIANTS=default python bench/decode_sweep.py
    #  --build .device/s29/hoist/{old,new}, old from the tree before the change)
    ETC_ARTIFACTS=.device/s29/hoist/art timeout 200 python -m pytest -q -rs test/gpu/test_llama_gpu.py \
      -k "llama_tiny-static or llama_tiny-dynamic or llama_tiny_regions-" 2>&1 \
      | tee "$OUT/tests_hoist.txt" | tail -3
    for tag in old new old new; do
      echo "== $tag" | tee -a "$OUT/hoist.txt"
      DECODE_SWEEP_VARIANTS=default DECODE_SWEEP_BATCHES=1,8 timeout 150 python bench/decode_sweep.py \
        --artifacts .device/s29/hoist/$tag --reps 9 2>&1 | grep "B=" | tee -a "$OUT/hoist.txt"
    done
    ;;
  ahead)  # the tma tiles' epilogue loads before their k loops (tma_epilogue_ahead): the tiny
    # decoder and the 1B large-batch kernel (bit-identical logits), then two sweep passes
    # (python test/gpu/make_artifacts.py .device/s29/art2 --only llama_tiny_tma_ahead; ...
    #  --only llama_1b_large; DECODE_SWEEP_VARIANTS=$A python bench/decode_sweep.py
    #  --build .device/s29/dec2; DECODE_TRACE_VARIANTS=tma_ahead python bench/decode_trace.py
    #  --build .device/s29/tr2)
    ETC_ARTIFACTS=.device/s29/art2 timeout 250 python -m pytest -q -rs test/gpu/test_llama_gpu.py \
      -k "llama_tiny_tma_ahead or ring_layouts" 2>&1 | tee "$OUT/tests_ahead.txt" | tail -3
    A=default,attn_read_early,tma_ahead,ahead_read_early
    A_REV=ahead_read_early,tma_ahead,attn_read_early,default
    sweep_passes ahead $A $A_REV .device/s29/dec2
    if [ -d .device/s29/tr2 ]; then
      DECODE_TRACE_VARIANTS=tma_ahead DECODE_TRACE_BATCHES=64 DECODE_TRACE_CONTEXT=4096 timeout 120 \
        python bench/decode_trace.py --artifacts .device/s29/tr2 --out /tmp/s29/tr2 2>&1 \
        | tee "$OUT/ahead_trace.txt" | grep -A6 "layer"
      cp /tmp/s29/tr2/*.npz "$OUT/"
    fi
    ;;
  final)  # (ran at commit 2ffabfd, whose attention had release="auto") "auto" with
    # tma_epilogue_ahead (auto_ahead) against the starting defaults: the TMA-fed tiny
    # decoders and the 1B large-batch kernel's variants (bit-identical), then the session's
    # defaults before / after at L = 1024, 2048, 4096, two passes
    # (python test/gpu/make_artifacts.py .device/s29/art3 --only llama_1b_large; ...
    #  --only llama_tiny_mma_tma; DECODE_SWEEP_VARIANTS=math_plain,auto_ahead
    #  python bench/decode_sweep.py --build .device/s29/dec3)
    ETC_ARTIFACTS=.device/s29/art3 timeout 250 python -m pytest -q -rs test/gpu/test_llama_gpu.py \
      -k "mma_tma or ring_layouts" 2>&1 | tee "$OUT/tests_final.txt" | tail -3
    for v in math_plain,auto_ahead auto_ahead,math_plain; do
      for L in 1024 2048 4096; do
        DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=32,64 DECODE_SWEEP_CONTEXT=$L timeout 150 \
          python bench/decode_sweep.py --artifacts .device/s29/dec3 --reps 7 2>&1 | grep "B=" \
          | sed "s/^/L=$L /" | tee -a "$OUT/final.txt"
      done
    done
    ;;
  bench)  # bench/decode.py on the session's defaults (python bench/decode.py --build .device/s29/decode)
    decode_bench .device/s29/decode
    ;;
  esac
done

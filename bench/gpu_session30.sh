#!/usr/bin/env bash
# Thirtieth session (bench/RESULTS.md, decoder items 123-): tiles as called
# functions (etc.compile(outline=...)). Each step's CPU-side build is in its
# comment. Usage: bash bench/gpu_session30.sh [outline] [ol2] [moe] [b1ol] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s30/raw
# Two bench/decode_sweep.py passes (the second over the reversed variants):
# sweep_passes NAME VARIANTS BATCHES CONTEXTS DIR; rows into $OUT/NAME.txt,
# raw NAME_<pass>_<L>_<B>.json into $OUT/raw.tgz at the end (few files come back).
sweep_passes() {
  local name=$1 variants=$2 batches=$3 contexts=$4 dir=$5 pass v L
  for pass in 1 2; do
    v=$variants; [ $pass = 2 ] && v=$(echo "$variants" | tr , '\n' | tac | paste -sd,)
    for L in ${contexts//,/ }; do
      DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=$batches DECODE_SWEEP_CONTEXT=$L timeout 280 \
        python bench/decode_sweep.py --artifacts $dir --out /tmp/s30/$name$pass$L --reps 7 \
        2>&1 | grep "B=" | sed "s/^/L=$L /" | tee -a "$OUT/$name.txt"
      cp /tmp/s30/$name$pass$L/decode_sweep.json "/tmp/s30/raw/${name}_${pass}_${L}_${batches//,/-}.json"
    done
  done
}
for step in ${*:-outline}; do
  case $step in
  outline)  # every tile called, not inlined; with the variants other tiles' spills held back
    # (DECODE_SWEEP_VARIANTS=default,outline,outline_attn3,outline_read_early,outline_argparts,outline_lm128
    #  python bench/decode_sweep.py --build .device/s30/dec)
    sweep_passes small default,outline,outline_lm128 1,8 1024 .device/s30/dec
    sweep_passes large default,outline,outline_attn3,outline_read_early,outline_argparts 32,64 \
      1024,4096 .device/s30/dec
    ;;
  ol2)  # the large kernel outlined with read_early, and the options that lost to spills before
    # (DECODE_SWEEP_VARIANTS=default,ol_re,ol_attn_re,ol_read,ol_re_a3,ol_re_s6,ol_re_gu64,ol_re_rot
    #  python bench/decode_sweep.py --build .device/s30/dec2)
    sweep_passes ol2 default,ol_re,ol_attn_re,ol_read,ol_re_a3,ol_re_s6,ol_re_gu64,ol_re_rot 32,64 \
      1024,4096 .device/s30/dec2
    ;;
  moe)  # the MoE presets' tiles called, not inlined (mid also at 2 CTAs per SM)
    # (BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=prefill,prefill_ol,mid,mid_ol python bench/moe.py
    #  --build .device/s30/moeab/moe)
    AB_TMP=/tmp/s30/ab AB_GREP=GPU moe_ab moe_prefill_ol prefill,prefill_ol 1024,4096 .device/s30/moeab
    AB_TMP=/tmp/s30/ab AB_GREP=GPU moe_ab moe_mid_ol mid,mid_ol 128,512,896 .device/s30/moeab
    mv "$OUT"/moe_*[12].json /tmp/s30/raw/
    ;;
  b1ol)  # B = 1: only the attention, or only the LM head and argmax, called
    # (DECODE_SWEEP_VARIANTS=default,ol1_attn,ol1_lm python bench/decode_sweep.py --build .device/s30/b1)
    sweep_passes b1ol default,ol1_attn,ol1_lm 1 1024 .device/s30/b1
    ;;
  esac
done
tar czf "$OUT/raw.tgz" -C /tmp/s30 raw

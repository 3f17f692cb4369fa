#!/usr/bin/env bash
# Thirtieth session (bench/RESULTS.md, decoder items 123-): tiles as called
# functions (etc.compile(outline=...)). Each step's CPU-side build is in its
# comment. Usage: bash bench/gpu_session30.sh [outline] [ol2] [moe] [b1ol] [trace] [tests] [embed] [splits] [b1ol2] [poll] [polltests] [bench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s30/raw
export SWEEP_TMP=/tmp/s30  # sweep_passes (gpu_common.sh) keeps its raw rows in $SWEEP_TMP/raw
# The default artifact before (DIR/old) and after (DIR/new) a change, alternating, two passes
# each: every B at L = 1024 and B = 32, 64 at L = 4096, into $OUT/NAME.txt: before_after DIR NAME
before_after() {
  local tag
  for tag in old new old new; do
    DECODE_SWEEP_VARIANTS=default DECODE_SWEEP_BATCHES=1,8,32,64 timeout 200 python bench/decode_sweep.py \
      --artifacts "$1/$tag" --reps 7 2>&1 | grep "B=" | sed "s/^/$tag L=1024 /" | tee -a "$OUT/$2.txt"
    DECODE_SWEEP_VARIANTS=default DECODE_SWEEP_BATCHES=32,64 DECODE_SWEEP_CONTEXT=4096 timeout 200 \
      python bench/decode_sweep.py --artifacts "$1/$tag" --reps 7 2>&1 | grep "B=" \
      | sed "s/^/$tag L=4096 /" | tee -a "$OUT/$2.txt"
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
  trace)  # the new defaults traced: B = 1, L = 1024 and B = 64, L = 4096 (raw records kept)
    # (DECODE_TRACE_VARIANTS=default python bench/decode_trace.py --build .device/s30/tr)
    decode_traces .device/s30/tr /tmp/s30
    ;;
  tests)  # the GPU tests the session's changes reach: the split-K graph outlined, the tiny
    # decoders (embed's sums dealt over the tiles; the buckets' outlined kernels) against the
    # simulator, the 1B large-batch kernel inlined / outlined / its variants bit-identical
    # (python test/gpu/make_artifacts.py .device/s30/art --only llama_1b_large; ... --only
    #  llama_tiny; ... --only splitk_outlined)
    ETC_ARTIFACTS=.device/s30/art timeout 400 python -m pytest -q -rs test/gpu/test_llama_gpu.py \
      test/gpu/test_schedules_gpu.py -k "(llama and not argmax) or outlined" 2>&1 | tee "$OUT/tests.txt" | tail -4
    ;;
  embed)  # embed's sums dealt over the tiles: the default before (old) / after (new),
    # alternating, B = 1, 8, 32, 64 at L = 1024 and 32, 64 at L = 4096; and the B = 2..16 kernel
    # with its LM head and argmax called (ol_mid_lm)
    # (DECODE_SWEEP_VARIANTS=default python bench/decode_sweep.py --build .device/s30/emb/{old,new},
    #  old from the tree before the change; DECODE_SWEEP_VARIANTS=ol_mid_lm ... --build .device/s30/emb/new)
    before_after .device/s30/emb embed
    for v in default,ol_mid_lm ol_mid_lm,default; do
      DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=8 timeout 120 python bench/decode_sweep.py \
        --artifacts .device/s30/emb/new --reps 7 2>&1 | grep "B=" | tee -a "$OUT/embed.txt"
    done
    ;;
  splits)  # the large kernel's split counts, block widths and ring prefetch again, now that
    # its tiles are called (items 53-55 and 77 lost inlined)
    # (DECODE_SWEEP_VARIANTS=default,splits_888,down_s4,splits_224,qkv96,down128_s16,tma_pf8,gu16
    #  python bench/decode_sweep.py --build .device/s30/dec3)
    sweep_passes splits default,splits_888,down_s4,splits_224,qkv96,down128_s16,tma_pf8,gu16 32,64 \
      1024,4096 .device/s30/dec3
    ;;
  b1ol2)  # the B = 1 kernel with one more task called besides its LM head and argmax
    # (DECODE_SWEEP_VARIANTS=default,ol1_embed,ol1_qkv,ol1_combine,ol1_o_proj,ol1_gate_up,ol1_down
    #  python bench/decode_sweep.py --build .device/s30/b1b)
    sweep_passes b1ol2 default,ol1_embed,ol1_qkv,ol1_combine,ol1_o_proj,ol1_gate_up,ol1_down 1 1024 \
      .device/s30/b1b
    ;;
  poll)  # waits polling with relaxed loads and one acquire fence on success, against acquire
    # loads at every poll: the default before (old) / after (new), alternating, every B at L = 1024
    # and B = 32, 64 at L = 4096
    # (DECODE_SWEEP_VARIANTS=default python bench/decode_sweep.py --build .device/s30/poll/{old,new},
    #  new from pollCounter's relaxed loads + fence.acq_rel, reverted after: RESULTS item 131)
    before_after .device/s30/poll poll
    ;;
  polltests)  # GPU tests over kernels whose waits poll relaxed, then fence: the runtime and
    # schedules' graphs, the tiny decoders and the 1B large kernel, the small MoE layers, the
    # GEMM meeting (python test/gpu/make_artifacts.py .device/s30/art2 --only PREFIX for PREFIX in
    #  splitk broken symbolic greedy diamond fanin skewed empty chain moe_small_static
    #  moe_small_dynamic moe_small_ticket moe_small_slots_static gemm_meet llama_tiny_static
    #  llama_tiny_dynamic llama_tiny_buckets llama_tiny_tma_static llama_tiny_mma_tma_static
    #  llama_1b_large)
    ETC_ARTIFACTS=.device/s30/art2 timeout 420 python -m pytest -q -rfs --tb=line test/gpu/test_runtime_gpu.py \
      test/gpu/test_schedules_gpu.py test/gpu/test_llama_gpu.py test/gpu/test_moe_gpu.py \
      test/gpu/test_gemm_gpu.py 2>&1 | tee "$OUT/polltests.txt" | grep -v "^FAILED.*\(No such file\|not found\|FileNotFound\)" | tail -25
    ;;
  bench)  # bench/decode.py on the session's defaults (python bench/decode.py --build .device/s30/decode)
    decode_bench .device/s30/decode
    ;;
  esac
done
tar czf "$OUT/raw.tgz" -C /tmp/s30 raw

#!/usr/bin/env bash
# Thirty-first session (bench/RESULTS.md, decoder items 133-): tasks dealt at
# run time (Graph.task(deal="pool"), LlamaConfig.pool). Each step's CPU-side
# build is in its comment. Usage: bash bench/gpu_session31.sh [tests] [b1] [large] [trace] [dyn]
# [moe] [alltests] [bench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s31/raw
export SWEEP_TMP=/tmp/s31  # sweep_passes (gpu_common.sh) keeps its raw rows in $SWEEP_TMP/raw
# bench/moe.py's fused static kernels, a run per entry of RUNS (TAG then a digit: the
# artifacts in .device/s31/moeTAG/moe), CONFIGS at SIZES; GPU times into $OUT/NAME.txt:
# moe_runs NAME RUNS CONFIGS SIZES
moe_runs() {
  local name=$1 runs=$2 cfgs=$3 sizes=$4 run
  for run in ${runs//,/ }; do
    BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=$sizes \
      timeout 150 python bench/moe.py --artifacts .device/s31/moe${run%?}/moe \
      --out /tmp/s31/raw/${name}_${cfgs//,/-}_$run.json 2>&1 | grep "GPU" | sed "s/^/${run%?} /" \
      | tee -a "$OUT/$name.txt"
  done
}
for step in ${*:-tests}; do
  case $step in
  tests)  # the pooled split-K graphs (one pool, a pool per row), the skewed graph's heavy
    # stage pooled, and the tiny decoders with their attention, projections and LM head pooled,
    # against numpy / the simulator, relaunched, bit-reproducible
    # (python test/gpu/make_artifacts.py .device/s31/art --only PREFIX for PREFIX in
    #  splitk_pool skewed_pooled llama_tiny_pool llama_tiny_tma_buckets_pool)
    ETC_ARTIFACTS=.device/s31/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_schedules_gpu.py test/gpu/test_llama_gpu.py -k "pool" 2>&1 \
      | tee "$OUT/tests.txt" | tail -15
    ;;
  b1)  # the B = 1 kernel's LM head pooled; every tile called, alone and with the LM head
    # pooled; the B = 2..16 kernel's LM head pooled
    # (DECODE_SWEEP_VARIANTS=default,pool1_lm,ol1_all,pool1_lm_ol,pool_mid_lm,pool_lm,
    #  pool_attn,pool_attn_lm,pool_all python bench/decode_sweep.py --build .device/s31/dec;
    #  the first call also timed pool1_lm_gu and pool1_lm_attn, before a pool's draw ahead
    #  stopped near its end: RESULTS item 133)
    sweep_passes b1 default,pool1_lm,ol1_all,pool1_lm_ol 1 1024 .device/s31/dec
    sweep_passes mid default,pool_mid_lm 8 1024 .device/s31/dec
    ;;
  large)  # the large-batch kernel's LM head, attention, both, and every stage pooled
    sweep_passes large default,pool_lm,pool_attn,pool_attn_lm,pool_all 32,64 1024,4096 \
      .device/s31/dec
    ;;
  trace)  # the default and the LM head pooled at B = 1, L = 1024; the default and the attention
    # and LM head pooled at B = 64, L = 4096; traced, raw records kept
    # (DECODE_TRACE_VARIANTS=default,pool1_lm,pool_attn_lm python bench/decode_trace.py
    #  --build .device/s31/tr)
    DECODE_TRACE_VARIANTS=default,pool1_lm DECODE_TRACE_BATCHES=1 timeout 200 \
      python bench/decode_trace.py --artifacts .device/s31/tr --out /tmp/s31/tr1 2>&1 \
      | tee "$OUT/trace_b1.txt" | grep -A9 "layer"
    DECODE_TRACE_VARIANTS=default,pool_attn_lm DECODE_TRACE_BATCHES=64 DECODE_TRACE_CONTEXT=4096 \
      timeout 200 python bench/decode_trace.py --artifacts .device/s31/tr --out /tmp/s31/tr64 2>&1 \
      | tee "$OUT/trace_b64.txt" | grep -A9 "layer"
    tar czf "$OUT/traces.tgz" -C /tmp/s31 tr1 tr64
    ;;
  dyn)  # the kernel's own shared-memory words (broadcast word, push records) after the tiles'
    # buffers instead of static .shared variables before them: the default buckets under the
    # dynamic schedule (and the static default), before (old) / after (new), alternating
    # (DECODE_SWEEP_VARIANTS=default,dyn python bench/decode_sweep.py --build .device/s31/dyn/{old,new};
    #  old with ETensorToGPU.cpp of 7b143ef)
    for tag in old new old new; do
      DECODE_SWEEP_VARIANTS=default,dyn DECODE_SWEEP_BATCHES=1,8,64 timeout 200 python bench/decode_sweep.py \
        --artifacts .device/s31/dyn/$tag --reps 7 2>&1 | grep "B=" | sed "s/^/$tag /" | tee -a "$OUT/dyn.txt"
    done
    ;;
  moe)  # the same for the MoE presets: prefill and its GEMM tiles by ticket at T = 4096,
    # mid (by ticket) and its list twin at T = 16, 128; old / new alternating
    # (BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=prefill,pre_tk,mid,mid_list python bench/moe.py
    #  --build .device/s31/moe{old,new}/moe)
    for run in new1 old1 new2 old2; do
      moe_runs moe $run prefill,pre_tk 4096
      moe_runs moe $run mid,mid_list 16,128
    done
    ;;
  layout)  # where the kernel's own words go: after the tiles' buffers (new) or before them,
    # the tiles then starting on a line of their largest alignment, at least 128 bytes (first);
    # MoE presets by ticket and list, old = static words, and the decoder's dynamic schedule and
    # pooled LM head (ETC_WORDS_FIRST=1 builds of the same commands into .device/s31/moefirst and
    #  .device/s31/dyn/first, DECODE_SWEEP_VARIANTS=default,dyn,pool1_lm)
    for run in new1 first1 old1 new2 first2 old2; do
      moe_runs layout $run prefill,pre_tk 4096
      moe_runs layout $run mid,mid_list 16,128
    done
    for tag in new first new first; do
      DECODE_SWEEP_VARIANTS=default,dyn,pool1_lm DECODE_SWEEP_BATCHES=1,64 timeout 200 python bench/decode_sweep.py \
        --artifacts .device/s31/dyn/$tag --reps 7 2>&1 | grep "B=" | sed "s/^/$tag /" | tee -a "$OUT/layout.txt"
    done
    ;;
  sym)  # a static worker's broadcast word as a static .shared variable again, with the
    # tiles' dynamic buffer aligned to at least 128 bytes (sym), against the word at the
    # buffer's end (new) and the static word with the tiles' own alignment (old)
    # (ETC_WORDS_SYM=1 builds into .device/s31/moesym and .device/s31/dyn/sym,
    #  DECODE_SWEEP_VARIANTS=default,pool1_lm)
    for run in sym1 new1 old1 sym2 new2 old2; do
      moe_runs sym $run pre_tk 4096
      moe_runs sym $run mid 16,128
    done
    for tag in sym new sym new; do
      DECODE_SWEEP_VARIANTS=default,pool1_lm DECODE_SWEEP_BATCHES=1 timeout 200 python bench/decode_sweep.py \
        --artifacts .device/s31/dyn/$tag --reps 7 2>&1 | grep "B=" | sed "s/^/$tag /" | tee -a "$OUT/sym.txt"
    done
    ;;
  final)  # the committed layout (a static worker's word its own .shared variable, the dynamic
    # worker's words after the tiles): the pooled and ticketed graphs, the tiny decoders, the
    # split-K graph under the dynamic schedule (python test/gpu/make_artifacts.py .device/s31/art
    #  --only PREFIX for PREFIX in splitk_pool skewed_pooled llama_tiny_pool
    #  llama_tiny_tma_buckets_pool moe_small_ticket splitk_dynamic llama_tiny_dynamic)
    ETC_ARTIFACTS=.device/s31/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_schedules_gpu.py test/gpu/test_llama_gpu.py test/gpu/test_moe_gpu.py \
      -k "pool or ticket or (splitk and dynamic) or (llama_tiny and dynamic)" 2>&1 \
      | tee "$OUT/final.txt" | grep -v "^FAILED.*\(No such file\|not found\|FileNotFound\)" | tail -8
    ;;
  moedyn)  # not run this session (device time spent): the MoE presets under the dynamic
    # schedule with the dynamic worker's words after the tiles' buffer (new, HEAD) against
    # static .shared words before it (old: lib/Conversion/ETensorToGPU/ETensorToGPU.cpp of
    # e7a9f00, rebuilt with ninja -C build, then HEAD's again). Inlined TMA tiles lost 15-18 %
    # with a static worker's word inside the buffer (RESULTS item 134), so these may too.
    # (BENCH_MOE_CONFIGS=prefill,mid python bench/moe.py --build .device/s31/moedyn{new,old}/moe,
    #  not LEAN: the dynamic kernels)
    for tag in new old new old; do
      BENCH_MOE_CONFIGS=prefill,mid BENCH_MOE_SIZES=128,4096 timeout 300 \
        python bench/moe.py --artifacts .device/s31/moedyn$tag/moe --out /tmp/s31/raw/moedyn_$tag.json \
        2>&1 | grep "GPU" | sed "s/^/$tag /" | tee -a "$OUT/moedyn.txt"
    done
    ;;
  alltests)  # the GPU tests over kernels whose own words moved (every dynamic-schedule kernel,
    # static ones that draw): runtime and schedules' graphs, tiny decoders, small MoE layers,
    # the GEMM meeting (python test/gpu/make_artifacts.py .device/s31/art --only PREFIX for PREFIX
    #  in splitk broken symbolic greedy diamond fanin skewed empty chain moe_small_static
    #  moe_small_dynamic moe_small_ticket moe_small_slots llama_tiny_static llama_tiny_dynamic
    #  llama_tiny_tma_static llama_tiny_tma_dynamic llama_tiny_mma_tma_dynamic gemm_meet)
    ETC_ARTIFACTS=.device/s31/art timeout 420 python -m pytest -q -rfs --tb=line test/gpu/test_runtime_gpu.py \
      test/gpu/test_schedules_gpu.py test/gpu/test_llama_gpu.py test/gpu/test_moe_gpu.py \
      test/gpu/test_gemm_gpu.py 2>&1 | tee "$OUT/alltests.txt" \
      | grep -v "^FAILED.*\(No such file\|not found\|FileNotFound\)" | tail -25
    ;;
  bench)  # bench/decode.py on the session's defaults (python bench/decode.py --build .device/s31/decode)
    decode_bench .device/s31/decode
    ;;
  esac
done
tar czf "$OUT/raw.tgz" -C /tmp/s31 raw

#!/usr/bin/env bash
# Twenty-third session (bench/RESULTS.md items 91-92).
# Built with (CPU machine):
#   item 91 (.device/n23a): python examples/moe.py --preset auto [--topk 1] --save-artifact .device/n23a/ex/auto[_top1]
#     python test/gpu/make_artifacts.py .device/n23a/arts --only moe_small_family
#     BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=tma128wtc,mid_tk python bench/moe.py --build .device/n23a/moe
#   item 92 (.device/n23b): BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=tma128wtc,pre_atomic16 \
#       python bench/moe.py --build .device/n23b/moe --trace
#     python test/gpu/make_artifacts.py .device/n23b/arts --only V   (V: moe_small_atomic16,
#       moe_small_route_atomic16, moe_small_tma_, moe_small_route_tma_)
#     python examples/moe.py --preset prefill --combine atomic --combine-dtype f16 [--topk 1] \
#       --save-artifact .device/n23b/ex/pre16[_top1]
#   .device/n23c: BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=pre_atomic16_cast \
#       python bench/moe.py --build .device/n23c/moe --trace   (before the token table), plus n23b's tma128wtc
#   .device/n23d: the same after it, the small atomic16 layers and the plain TMA ones into .device/n23d/arts
#   item 93 (.device/n23e): BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=tma128wtc,pre_dn,\
#       pre_atomic16_cast,pre_atomic16_dn,mid_tk,mid_tk_dn,dec_pf_gu32,dec_dn python bench/moe.py --build .device/n23e/moe --trace
#     DECODE_SWEEP_VARIANTS=default,defer python bench/decode_sweep.py --build .device/n23e/dec
#     python test/gpu/make_artifacts.py .device/n23e/arts --only V   (V: moe_small_tma_defer,
#       moe_small_atomic16_defer, moe_small_tma_static, moe_small_atomic16_, moe_small_route_atomic16_,
#       moe_small_route_tma_, moe_small_family)
#     python examples/moe.py --preset auto --save-artifact .device/n23e/ex/auto
#   final (.device/n23f): python examples/moe.py --preset prefill --combine atomic --combine-dtype f16 [--topk 1] \
#       --save-artifact .device/n23f/ex/pre16[_top1]
#     python test/gpu/make_artifacts.py .device/n23f/arts --only moe_small
#   item 94 (.device/n23g): BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=pre_l2pf,pre_atomic16_l2pf \
#       python bench/moe.py --build .device/n23g/moe --trace  (+ n23c's kernels)
#     python test/gpu/make_artifacts.py .device/n23g/arts --only V   (V: moe_small_l2pf, moe_small_tma_static)
# Usage: bash bench/gpu_session23.sh [auto] [boundary] [tests16] [moe16] [trace16] [examples16] [tests16d] [cast16] [atomics] [tests_e] [defer] [decoder] [final] [ncu] [l2pf]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
# The real-size f16-sum layer (examples/moe.py) from the artifacts under $1/ex.
examples16() {
  ex() { timeout 120 python examples/moe.py --preset prefill --combine atomic --combine-dtype f16 "$@" 2>&1 \
    | tee -a "$OUT/examples.txt"; }
  ex --artifact $1/ex/pre16 --tokens 1,7,16,128,1024,4096
  ex --artifact $1/ex/pre16 --routing one-expert --tokens 1,16,1000
  ex --artifact $1/ex/pre16 --routing few-experts --tokens 7,128,4095
  ex --artifact $1/ex/pre16_top1 --topk 1 --routing top1 --tokens 1,33,1000
}
A=.device/n23a
B=.device/n23b
E=.device/n23e
F=.device/n23f
G=.device/n23g
for step in ${*:-tests16 moe16 boundary examples16 trace16}; do
  case $step in
  auto)
    ETC_ARTIFACTS=$A/arts timeout 60 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k one_artifact 2>&1 \
      | tail -3 | tee "$OUT/tests.txt"
    run() { timeout 60 python examples/moe.py --preset auto "$@" 2>&1 | tee -a "$OUT/examples.txt"; }
    run --artifact $A/ex/auto --tokens 1,7,8,9,16,128,256,257,1024,4096
    run --artifact $A/ex/auto --routing one-expert --tokens 1,16,1000
    run --artifact $A/ex/auto --routing few-experts --tokens 7,128,4095
    run --artifact $A/ex/auto_top1 --topk 1 --routing top1 --tokens 1,33,1000
    ;;
  boundary)
    echo "== mid vs prefill" | tee -a "$OUT/boundary.txt"
    for pass in 1 2; do
      cfgs=tma128wtc,mid_tk; [ $pass = 2 ] && cfgs=mid_tk,tma128wtc
      BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=${BOUNDARY_SIZES:-256,512,640,768,1024} timeout 200 \
        python bench/moe.py --artifacts $A/moe --out /tmp/b_$pass.json 2>&1 \
        | grep -E "GPU time|copy|WRONG|rror" | tee -a "$OUT/boundary.txt"
    done
    ;;
  tests16)
    echo "== MoE GPU tests (f16 sums)" | tee -a "$OUT/tests.txt"
    ETC_ARTIFACTS=$B/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k "atomic16" 2>&1 \
      | tail -8 | tee -a "$OUT/tests.txt"
    ;;
  moe16)
    mkdir -p "$OUT/j"
    for pass in 1 2 3; do
      cfgs=tma128wtc,pre_atomic16; [ $pass = 2 ] && cfgs=pre_atomic16,tma128wtc
      echo "== MoE pass $pass" | tee -a "$OUT/moe_ab.txt"
      BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=${MOE_SIZES:-128,1024,4096} timeout 200 \
        python bench/moe.py --artifacts $B/moe --out "$OUT/j/moe_$pass.json" 2>&1 \
        | grep -E "GPU time|copy|WRONG|rror|err" | tee -a "$OUT/moe_ab.txt"
    done
    tar czf "$OUT/moe_json.tgz" -C "$OUT" j && rm -rf "$OUT/j"
    ;;
  trace16)
    BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=tma128wtc,pre_atomic16 BENCH_MOE_SIZES=1024,4096 \
      timeout 200 python bench/moe.py --artifacts $B/moe --out /tmp/t.json --trace 2>&1 | tail -60 > "$OUT/trace.txt"
    ;;
  examples16)
    examples16 $B
    ;;
  tests16d)
    echo "== MoE GPU tests (f16 sums, token table, cast unrolled)" | tee -a "$OUT/tests.txt"
    ETC_ARTIFACTS=.device/n23d/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k "atomic16" 2>&1 \
      | tail -8 | tee -a "$OUT/tests.txt"
    ;;
  cast16)
    # The cast on 32 tokens a CTA, 8 chunks in flight (n23c), and with each
    # row's token from a shared-memory table (n23d), in alternation.
    mkdir -p "$OUT/j"
    for pass in 1 2 3 4; do
      dir=.device/n23c; [ $((pass % 2)) = 0 ] && dir=.device/n23d
      echo "== MoE pass $pass ($dir)" | tee -a "$OUT/cast_ab.txt"
      BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=tma128wtc,pre_atomic16_cast BENCH_MOE_SIZES=${MOE_SIZES:-1024,4096} timeout 200 \
        python bench/moe.py --artifacts $dir/moe --out "$OUT/j/cast_$pass.json" 2>&1 \
        | grep -E "GPU time|copy|WRONG|rror|err" | tee -a "$OUT/cast_ab.txt"
    done
    tar czf "$OUT/cast_json.tgz" -C "$OUT" j && rm -rf "$OUT/j"
    for dir in .device/n23c .device/n23d; do
      echo "== trace $dir" >> "$OUT/trace.txt"
      BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=pre_atomic16_cast BENCH_MOE_SIZES=4096 \
        timeout 200 python bench/moe.py --artifacts $dir/moe --out /tmp/t.json --trace 2>&1 | tail -14 >> "$OUT/trace.txt"
    done
    ;;
  tests_e)
    echo "== MoE GPU tests (deferred notifications, f16 sums, the one artifact)" | tee -a "$OUT/tests.txt"
    ETC_ARTIFACTS=$E/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k "atomic16 or deferred or one_artifact" 2>&1 | tail -8 | tee -a "$OUT/tests.txt"
    timeout 100 python examples/moe.py --preset auto --artifact $E/ex/auto --tokens 896,897,1000 2>&1 \
      | tee -a "$OUT/examples.txt"
    ;;
  defer)  # item 93, reverted: its configurations and the compiler option are in commit 00d4399
    # Deferred notifications (item 93) against the same kernels without, in
    # alternation: prefill (Yp and f16 sums) at T = 1024, 4096; mid at 16,
    # 128; decode at 1, 16.
    mkdir -p "$OUT/j"
    for pass in 1 2; do
      for set in "tma128wtc,pre_dn,pre_atomic16_cast,pre_atomic16_dn 1024,4096" \
                 "mid_tk,mid_tk_dn 16,128" "dec_pf_gu32,dec_dn 1,16"; do
        cfgs=${set% *}; sizes=${set#* }
        [ $pass = 2 ] && cfgs=$(echo $cfgs | tr , '\n' | tac | paste -sd,)
        echo "== pass $pass: $cfgs" | tee -a "$OUT/defer_ab.txt"
        BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=$sizes timeout 200 \
          python bench/moe.py --artifacts $E/moe --out "$OUT/j/defer_${pass}_${cfgs%%,*}.json" 2>&1 \
          | grep -E "GPU time|copy|WRONG|rror" | tee -a "$OUT/defer_ab.txt"
      done
    done
    tar czf "$OUT/defer_json.tgz" -C "$OUT" j && rm -rf "$OUT/j"
    BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=pre_dn,pre_atomic16_dn BENCH_MOE_SIZES=4096 \
      timeout 200 python bench/moe.py --artifacts $E/moe --out /tmp/t.json --trace 2>&1 | tail -24 > "$OUT/trace.txt"
    ;;
  decoder)
    for pass in 1 2; do
      v=default,defer; [ $pass = 2 ] && v=defer,default
      DECODE_SWEEP_VARIANTS=$v DECODE_SWEEP_BATCHES=${DEC_BATCHES:-1,8,64} timeout 250 \
        python bench/decode_sweep.py --artifacts $E/dec --out "$OUT/dec_$pass.json" 2>&1 | tail -12 | tee -a "$OUT/decoder.txt"
    done
    ;;
  final)
    # The whole MoE GPU file and the real-size f16-sum examples on the final
    # code; the f16 sums against the prefill preset once more (n23c holds
    # the final code's kernels).
    echo "== MoE GPU tests (final code)" | tee -a "$OUT/tests.txt"
    ETC_ARTIFACTS=$F/arts timeout 400 python -m pytest -q -rs test/gpu/test_moe_gpu.py 2>&1 | tail -8 \
      | tee -a "$OUT/tests.txt"
    examples16 $F
    for pass in 1 2; do
      cfgs=tma128wtc,pre_atomic16_cast; [ $pass = 2 ] && cfgs=pre_atomic16_cast,tma128wtc
      BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=128,1024,4096 timeout 200 \
        python bench/moe.py --artifacts .device/n23c/moe --out "$OUT/final_$pass.json" 2>&1 \
        | grep -E "GPU time|copy|WRONG|rror" | tee -a "$OUT/final_ab.txt"
    done
    ;;
  ncu)
    # What the f16 sums cost the memory system at T = 4096: the prefill preset
    # (Yp + combine) against f16 sums, one profiled launch each (n23c).
    for cfg in tma128wtc pre_atomic16_cast; do
      echo "== $cfg" >> "$OUT/ncu.txt"
      timeout 250 ncu --clock-control none -k regex:moe --launch-skip 2 --launch-count 1 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_atom.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed \
        python bench/moe_ncu.py $cfg .device/n23c/moe/fused_${cfg}_static 4096 2>&1 | grep -E "^\s+(gpu__|dram__|lts__)|==ERR|rror" >> "$OUT/ncu.txt"
    done
    cat "$OUT/ncu.txt"
    ;;
  l2pf)  # item 94, reverted: its tile option, compiler change and configurations are in commit daa0eb1
    # Item 94: GEMM tiles with an L2 prefetch, each CTA running it for its
    # next GEMM instance (prefetch_next), against the same kernels without;
    # prefill and f16 sums, in alternation; its bit-identity GPU test.
    echo "== MoE GPU test (L2 prefetch of the next instance)" | tee -a "$OUT/tests.txt"
    ETC_ARTIFACTS=$G/arts timeout 100 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k "l2_prefetch" 2>&1 \
      | tail -3 | tee -a "$OUT/tests.txt"
    mkdir -p "$OUT/j"
    for pass in 1 2; do
      cfgs=tma128wtc,pre_l2pf,pre_atomic16_cast,pre_atomic16_l2pf
      [ $pass = 2 ] && cfgs=pre_atomic16_l2pf,pre_atomic16_cast,pre_l2pf,tma128wtc
      BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1024,4096 timeout 200 \
        python bench/moe.py --artifacts $G/moe --out "$OUT/j/l2pf_$pass.json" 2>&1 \
        | grep -E "GPU time|copy|WRONG|rror" | tee -a "$OUT/l2pf_ab.txt"
    done
    tar czf "$OUT/l2pf_json.tgz" -C "$OUT" j && rm -rf "$OUT/j"
    BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=pre_atomic16_cast,pre_atomic16_l2pf BENCH_MOE_SIZES=4096 \
      timeout 200 python bench/moe.py --artifacts $G/moe --out /tmp/t.json --trace 2>&1 | tail -24 > "$OUT/trace.txt"
    ;;
  atomics)
    nvcc -O3 -arch=sm_90a bench/moe_combine_atomics.cu -o /tmp/mca && /tmp/mca | tee "$OUT/atomics.txt"
    ;;
  esac
done

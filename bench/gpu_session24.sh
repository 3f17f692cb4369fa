#!/usr/bin/env bash
# Twenty-fourth session (bench/RESULTS.md items 95-).
# Built with (CPU machine):
#   item 95 (.device/n24a): BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 \
#       BENCH_MOE_CONFIGS=dec_pf_gu32,single,single_gu24,single_dn128 BENCH_MOE_SIZES=1,2,4,8 \
#       python bench/moe.py --build .device/n24a/moe --trace
#   item 95 (.device/n24b): the same with BENCH_MOE_CONFIGS=dec_pf_gu32,single,single_sl,single_sl_re1
#       BENCH_MOE_SIZES=1,2,4; python test/gpu/make_artifacts.py .device/n24b/arts --only moe_small_slots
#   item 96 (.device/n24c): BENCH_MOE_CONFIGS=single_sl,single_sl_s6,single_sl_s8,single_sl_dn6,single_sl_gu16
#       BENCH_MOE_SIZES=1,2 (same command, --trace)
#   item 97 (.device/n24d): python test/gpu/make_artifacts.py .device/n24d/arts --only moe_small_family
#     python examples/moe.py --preset auto [--topk 1 --routing top1] --save-artifact .device/n24d/ex/auto[_top1]
#     BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=dec_pf_gu32,single,single_ids \
#       BENCH_MOE_SIZES=1,3,4,5,6,8 python bench/moe.py --build .device/n24d/moe
#   item 98 (.device/n24e): BENCH_MOE_CONFIGS=single,single_u4,single_u4s3,single_u4d,single_u8s2
#       BENCH_MOE_SIZES=1,2 (same command, --trace)
#   item 98 (.device/n24f): BENCH_MOE_CONFIGS=single,single_m3,single_gu16_m3,single_gu16_dn32_m3
#       BENCH_MOE_SIZES=1,2 (same command, --trace)
#   item 99 (.device/n24g): python test/gpu/make_artifacts.py .device/n24g/arts --only moe_small_slots
#     BENCH_MOE_CONFIGS=single,single_dnl2,single_dnring,few,few_dnl2 BENCH_MOE_SIZES=1,2,4 (--trace)
#   final (.device/n24i): python test/gpu/make_artifacts.py .device/n24i/arts --only moe_small_slots (and
#       --only moe_small_family); python examples/moe.py --preset auto [--topk 1 --routing top1]
#       --save-artifact .device/n24i/ex/auto[_top1]; BENCH_MOE_CONFIGS=dec_pf_gu32,single,single_noring,few
#       BENCH_MOE_SIZES=1,2,3,4 python bench/moe.py --build .device/n24i/moe
# Usage: bash bench/gpu_session24.sh [slots] [slots2] [rings] [auto] [unroll] [m3] [dnpf] [final]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
A=.device/n24a
B=.device/n24b
C=.device/n24c
D=.device/n24d
E=.device/n24e
F=.device/n24f
G=.device/n24g
I=.device/n24i
mkdir -p /tmp/s24
for step in ${*:-slots}; do
  case $step in
  slots)
    for pass in 1 2; do
      cfgs=dec_pf_gu32,single,single_gu24,single_dn128; [ $pass = 2 ] && cfgs=single_dn128,single_gu24,single,dec_pf_gu32
      BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,2,4,8 \
        timeout 280 python bench/moe.py --artifacts $A/moe --out "/tmp/s24/slots$pass.json" $([ $pass = 1 ] && echo --trace) \
        2>&1 | tee -a "$OUT/slots.txt" | tail -40
    done
    cp /tmp/s24/slots1.json /tmp/s24/slots2.json "$OUT/"; cp /tmp/s24/moe_trace.txt "$OUT/slots_trace.txt"
    ;;
  slots2)
    ETC_ARTIFACTS=$B/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k slots 2>&1 \
      | tail -3 | tee "$OUT/tests.txt"
    for pass in 1 2; do
      cfgs=dec_pf_gu32,single,single_sl,single_sl_re1; [ $pass = 2 ] && cfgs=single_sl_re1,single_sl,single,dec_pf_gu32
      BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,2,4 \
        timeout 200 python bench/moe.py --artifacts $B/moe --out "/tmp/s24/sl$pass.json" $([ $pass = 1 ] && echo --trace) \
        2>&1 | tee -a "$OUT/sl.txt" | grep "T=    1\|T=    2\|T=    4" | grep occ
    done
    cp /tmp/s24/sl1.json /tmp/s24/sl2.json "$OUT/"; cp /tmp/s24/moe_trace.txt "$OUT/sl_trace.txt"
    ;;
  rings)
    v=single_sl,single_sl_s6,single_sl_s8,single_sl_dn6,single_sl_gu16
    for pass in 1 2; do
      cfgs=$v; [ $pass = 2 ] && cfgs=$(echo $v | tr , '\n' | tac | paste -sd,)
      BENCH_MOE_CHROME=1 BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,2 \
        timeout 200 python bench/moe.py --artifacts $C/moe --out "/tmp/s24/rings$pass.json" $([ $pass = 1 ] && echo --trace) \
        2>&1 | tee -a "$OUT/rings.txt" | grep "T=    1\|T=    2" | grep "occ.*GPU"
    done
    cp /tmp/s24/rings1.json /tmp/s24/rings2.json "$OUT/"; cp /tmp/s24/moe_trace.txt "$OUT/rings_trace.txt"
    for v in single_sl single_sl_gu16; do
      f=$(ls /tmp/s24/trace_${v}*T1.json 2>/dev/null | head -1); echo "== $v $f"
      [ -n "$f" ] && python bench/trace_sm_load.py $f gate_up && python bench/trace_sm_load.py $f down
    done 2>&1 | tee "$OUT/smload.txt"
    ;;
  auto)
    ETC_ARTIFACTS=$D/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k one_artifact 2>&1 \
      | tail -3 | tee "$OUT/tests_auto.txt"
    run() { timeout 60 python examples/moe.py --preset auto "$@" 2>&1 | tee -a "$OUT/examples.txt"; }
    run --artifact $D/ex/auto --tokens 1,2,3,4,5,7,8,9,16,128,1024,4096
    run --artifact $D/ex/auto --routing one-expert --tokens 1,4,16,1000
    run --artifact $D/ex/auto --routing few-experts --tokens 1,3,7,128
    run --artifact $D/ex/auto_top1 --topk 1 --routing top1 --tokens 1,4,33,1000
    v=dec_pf_gu32,single,single_ids
    for pass in 1 2; do
      cfgs=$v; [ $pass = 2 ] && cfgs=$(echo $v | tr , '\n' | tac | paste -sd,)
      BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,3,4,5,6,8 \
        timeout 200 python bench/moe.py --artifacts $D/moe --out "$OUT/bucket$pass.json" \
        2>&1 | tee -a "$OUT/bucket.txt" | grep "occ.*GPU"
    done
    ;;
  unroll)
    v=single,single_u4,single_u4s3,single_u4d,single_u8s2
    for pass in 1 2; do
      cfgs=$v; [ $pass = 2 ] && cfgs=$(echo $v | tr , '\n' | tac | paste -sd,)
      BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,2 \
        timeout 200 python bench/moe.py --artifacts $E/moe --out "/tmp/s24/unroll$pass.json" $([ $pass = 1 ] && echo --trace) \
        2>&1 | tee -a "$OUT/unroll.txt" | grep "T=    1\|T=    2" | grep "occ.*GPU"
    done
    cp /tmp/s24/unroll1.json /tmp/s24/unroll2.json "$OUT/"; cp /tmp/s24/moe_trace.txt "$OUT/unroll_trace.txt"
    ;;
  m3)
    for a in $F/moe/fused_*_occ_static; do
      python -c "import etc.runtime,sys; k=etc.runtime.load(sys.argv[1]); print(sys.argv[1], k.num_ctas, 'CTAs')" $a
    done 2>&1 | tee "$OUT/m3_ctas.txt"
    v=single,single_m3,single_gu16_m3,single_gu16_dn32_m3
    for pass in 1 2; do
      cfgs=$v; [ $pass = 2 ] && cfgs=$(echo $v | tr , '\n' | tac | paste -sd,)
      BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,2 \
        timeout 200 python bench/moe.py --artifacts $F/moe --out "/tmp/s24/m3$pass.json" $([ $pass = 1 ] && echo --trace) \
        2>&1 | tee -a "$OUT/m3.txt" | grep "T=    1\|T=    2" | grep "occ.*GPU"
    done
    cp /tmp/s24/m31.json /tmp/s24/m32.json "$OUT/"; cp /tmp/s24/moe_trace.txt "$OUT/m3_trace.txt"
    ;;
  dnpf)
    ETC_ARTIFACTS=$G/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k slots 2>&1 \
      | tail -3 | tee "$OUT/tests_dnpf.txt"
    v=single,single_dnl2,single_dnring,few,few_dnl2
    for pass in 1 2; do
      cfgs=$v; [ $pass = 2 ] && cfgs=$(echo $v | tr , '\n' | tac | paste -sd,)
      BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,2,4 \
        timeout 200 python bench/moe.py --artifacts $G/moe --out "/tmp/s24/dnpf$pass.json" $([ $pass = 1 ] && echo --trace) \
        2>&1 | tee -a "$OUT/dnpf.txt" | grep "T=    [124] " | grep "occ.*GPU"
    done
    cp /tmp/s24/dnpf1.json /tmp/s24/dnpf2.json "$OUT/"; cp /tmp/s24/moe_trace.txt "$OUT/dnpf_trace.txt"
    ;;
  final)
    ETC_ARTIFACTS=$I/arts timeout 250 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k "slots or one_artifact" 2>&1 \
      | tail -3 | tee "$OUT/tests_final.txt"
    run() { timeout 60 python examples/moe.py --preset auto "$@" 2>&1 | tee -a "$OUT/examples_final.txt"; }
    run --artifact $I/ex/auto --tokens 1,2,3,5,6,8,9,16,128,1024,4096
    run --artifact $I/ex/auto --routing one-expert --tokens 1,2,5,16,1000
    run --artifact $I/ex/auto --routing few-experts --tokens 1,3,7,128
    run --artifact $I/ex/auto_top1 --topk 1 --routing top1 --tokens 1,2,4,33,1000
    v=dec_pf_gu32,single,single_noring,few
    for pass in 1 2; do
      cfgs=$v; [ $pass = 2 ] && cfgs=$(echo $v | tr , '\n' | tac | paste -sd,)
      BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,2,3,4 \
        timeout 200 python bench/moe.py --artifacts $I/moe --out "$OUT/final$pass.json" \
        2>&1 | tee -a "$OUT/final.txt" | grep "occ.*GPU"
    done
    ;;
  esac
done

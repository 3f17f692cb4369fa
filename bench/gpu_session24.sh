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
# The configurations were renamed as the single preset changed: the steps name
# them as bench/moe.py does now (the raw files, as they were run: "single" there
# is single_ids in step slots and slots2, single_sl in auto, unroll and m3, and
# single_noring in dnpf, whose single_dnring is today's single). Rebuild with
# those names before rerunning a step.
#   autotime (.device/n24k): BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=auto
#       BENCH_MOE_SIZES=1,2,4,8 python bench/moe.py --build .device/n24k/moe
# Usage: bash bench/gpu_session24.sh [slots] [slots2] [rings] [auto] [unroll] [m3] [dnpf] [final] [autotime]
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
K=.device/n24k
mkdir -p /tmp/s24
export AB_TMP=/tmp/s24
ab() { moe_ab "$@"; }
slot_tests() {  # the slot layers' GPU tests (and the bucketed artifact's) from $1/arts
  ETC_ARTIFACTS=$1/arts timeout 250 python -m pytest -q -rs test/gpu/test_moe_gpu.py -k "$2" 2>&1 \
    | tail -3 | tee "$OUT/tests_$3.txt"
}
auto_examples() {  # examples/moe.py --preset auto from $1/ex, every bucket and routing
  run() { timeout 60 python examples/moe.py --preset auto "$@" 2>&1 | tee -a "$OUT/examples_$2.txt"; }
  run --artifact $1/ex/auto --tokens 1,2,3,4,5,6,7,8,9,16,128,1024,4096
  run --artifact $1/ex/auto --routing one-expert --tokens 1,2,4,5,16,1000
  run --artifact $1/ex/auto --routing few-experts --tokens 1,3,7,128
  run --artifact $1/ex/auto_top1 --topk 1 --routing top1 --tokens 1,2,4,33,1000
}
for step in ${*:-final}; do
  case $step in
  slots) ab slots dec_pf_gu32,single_ids,single_gu24,single_dn128 1,2,4,8 $A 1 ;;
  slots2)
    slot_tests $B slots slots2
    ab sl dec_pf_gu32,single_ids,single_sl,single_sl_re1 1,2,4 $B 1
    ;;
  rings)
    BENCH_MOE_CHROME=1 ab rings single_sl,single_sl_s6,single_sl_s8,single_sl_dn6,single_sl_gu16 1,2 $C 1
    for v in single_sl single_sl_gu16; do
      f=$(ls /tmp/s24/trace_${v}_static_T1.json 2>/dev/null | head -1); echo "== $v $f"
      [ -n "$f" ] && python bench/trace_sm_load.py $f gate_up && python bench/trace_sm_load.py $f down
    done 2>&1 | tee "$OUT/smload.txt"
    ;;
  auto)
    slot_tests $D one_artifact auto
    auto_examples $D auto
    ab bucket dec_pf_gu32,single_sl,single_ids 1,3,4,5,6,8 $D
    ;;
  unroll) ab unroll single_sl,single_u4,single_u4s3,single_u4d,single_u8s2 1,2 $E 1 ;;
  m3)
    for a in $F/moe/fused_*_occ_static; do
      python -c "import etc.runtime,sys; k=etc.runtime.load(sys.argv[1]); print(sys.argv[1], k.num_ctas, 'CTAs')" $a
    done 2>&1 | tee "$OUT/m3_ctas.txt"
    ab m3 single_sl,single_m3,single_gu16_m3,single_gu16_dn32_m3 1,2 $F 1
    ;;
  dnpf)
    slot_tests $G slots dnpf
    ab dnpf single_noring,single_dnl2,single,few,few_dnl2 1,2,4 $G 1
    ;;
  final)
    slot_tests $I "slots or one_artifact" final
    auto_examples $I final
    ab final dec_pf_gu32,single,single_noring,few 1,2,3,4 $I
    ;;
  autotime)  # the shipped five-kernel artifact itself, one pass
    BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=auto BENCH_MOE_SIZES=1,2,4,8 \
      timeout 200 python bench/moe.py --artifacts $K/moe --out "$OUT/autotime.json" 2>&1 \
      | tee "$OUT/autotime.txt" | grep "T=   "
    ;;
  esac
done

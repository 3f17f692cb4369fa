#!/usr/bin/env bash
# Thirty-third session (bench/RESULTS.md): the large-batch decoder's o_proj and down
# grids, and the MoE prefill tiles refilling their rings without holding a warpgroup.
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session33.sh [sweep] [moe] [a16] [pu] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s33/raw
for step in ${*:-sweep}; do
  case $step in
  sweep)  # o_proj on 256 instances (32-column blocks, or 8 parts), down in 32-column blocks
    # of 4 parts (DECODE_SWEEP_VARIANTS=default,sm_o32,sm_o8p,sm_d32s4,sm_o32_d32s4
    # python bench/decode_sweep.py --build .device/s33/sweep)
    SWEEP_TMP=/tmp/s33 sweep_passes s33_sweep default,sm_o32,sm_o8p,sm_d32s4,sm_o32_d32s4 \
      32,64 1024,4096 .device/s33/sweep
    ;;
  moe)  # the prefill preset with refill="test" in its gate/up, down or both tiles, the
    # first pass traced (BENCH_MOE_LEAN=1 BENCH_MOE_SCHEDULES=static
    # BENCH_MOE_CONFIGS=prefill,pre_refill,pre_refill_gu,pre_refill_dn python bench/moe.py
    # --build .device/s33/moeab/moe --trace)
    AB_TMP=/tmp/s33/ab AB_GREP=GPU moe_ab moe_refill prefill,pre_refill,pre_refill_gu,pre_refill_dn \
      1024,4096 .device/s33/moeab 1
    mv "$OUT"/moe_*[12].json /tmp/s33/raw/
    ;;
  a16)  # item 92's half-precision sums in the down tiles, with and without refill="test",
    # against the preset, the first pass traced (BENCH_MOE_LEAN=1 BENCH_MOE_SCHEDULES=static
    # BENCH_MOE_CONFIGS=prefill,pre_refill,pre_atomic16_cast,pre_a16c_refill python
    # bench/moe.py --build .device/s33/moe2/moe --trace)
    AB_TMP=/tmp/s33/ab AB_GREP=GPU moe_ab moe_a16 prefill,pre_refill,pre_atomic16_cast,pre_a16c_refill \
      1024,4096 .device/s33/moe2 1
    mv "$OUT"/moe_*[12].json /tmp/s33/raw/
    ;;
  pu)  # the a16c_refill configuration with 16 / 32 loads in flight per permute thread, the
    # first pass traced (BENCH_MOE_LEAN=1 BENCH_MOE_SCHEDULES=static BENCH_MOE_CONFIGS=
    # pre_a16c_refill,pre_a16c_refill_pu16,pre_a16c_refill_pu32 python bench/moe.py
    # --build .device/s33/moe3/moe --trace)
    AB_TMP=/tmp/s33/ab AB_GREP=GPU moe_ab moe_pu pre_a16c_refill,pre_a16c_refill_pu16,pre_a16c_refill_pu32 \
      1024,4096 .device/s33/moe3 1
    mv "$OUT"/moe_*[12].json /tmp/s33/raw/
    ;;
  esac
done
tar czf "$OUT/raw.tgz" -C /tmp/s33 raw

#!/usr/bin/env bash
# Sixtieth session: B = 1's leads on whatever card comes (an H200 is the
# issue's card; H100 rows are recorded as such).
# `tiers`: B = 1's nine splits from L = 900 (item 262 on an H100: -0.9 % at
# L = 1024, -3.1 % at 1100) over .device/s57/tiers (built by
# DECODE_SWEEP_VARIANTS=default,b1_tiers900 python bench/decode_sweep.py
# --build .device/s57/tiers; the decoder's PTX has not changed since).
# `gu`: B = 1's gate/up ring with 2 or 4 of its 7 first chunks issued before
# the wait (bench/decode_sweep.py's b1_gu_pf*; DECODE_SWEEP_VARIANTS=
# default,b1_gu_pf2,b1_gu_pf4 python bench/decode_sweep.py --build
# .device/s60/gu). Carry .device/s57/tiers and .device/s60/gu.
# `merge`: bench/merge_proto.cu (built there: nvcc needs no GPU here either),
# the model of B = 1's attention hand-off with o_proj merging the splits.
# Usage: [TIERS_CONTEXTS=L,...] [GU_CONTEXTS=L,...] bash bench/gpu_session60.sh [merge] [tiers] [gu]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-merge tiers gu}; do
  case $step in
  merge) mkdir -p /tmp/s60 && nvcc -O3 -gencode arch=compute_90a,code=sm_90a \
      bench/merge_proto.cu -o /tmp/s60/mp && timeout 60 /tmp/s60/mp 2>&1 | tee "$OUT/merge_proto.txt" ;;
  tiers) SWEEP_TMP=/tmp/s60 sweep_passes s60_tiers default,b1_tiers900 1 ${TIERS_CONTEXTS:-768,960,1024,1100} \
    .device/s57/tiers ;;
  gu) SWEEP_TMP=/tmp/s60 sweep_passes s60_gu default,b1_gu_pf2,b1_gu_pf4 1 ${GU_CONTEXTS:-512,1024} \
    .device/s60/gu ;;
  esac
done
tar czf "$OUT/s60_raw.tgz" -C /tmp/s60 raw 2>/dev/null

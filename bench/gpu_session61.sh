#!/usr/bin/env bash
# Sixty-first session: B = 1's leads on whatever card comes (an H200 is the
# issue's card; H100 rows are recorded as such).
# `key`: B = 1's greedy argmax folded into its LM head (argmax_fused), alone
# and with the nine-split tier from L = 900, against the default and
# b1_tiers900, over .device/s61/key (built by DECODE_SWEEP_VARIANTS=
# default,b1_argmax_key,b1_tiers900,b1_tiers900_key python
# bench/decode_sweep.py --build .device/s61/key). Carry .device/s61/key.
# `key2`: the fold in B = 1's phased kernels only (b1s_argmax_key,
# b1_tiers900s_key; the first build's tensor-core kernel spilled with it),
# over .device/s61/key2 (DECODE_SWEEP_VARIANTS=
# default,b1s_argmax_key,b1_tiers900,b1_tiers900s_key python
# bench/decode_sweep.py --build .device/s61/key2), at L = 1024, 1100, 4096.
# `key3`: key2's variants over the final code (one key a row), over
# .device/s61/key3 (the same build command into that directory), four
# passes at L = 1024 and 1100.
# `midkey`: the same fold in the B = 2..16 kernels (mid_argmax_key) against
# the default at B = 8 and 16, over .device/s61/mid (DECODE_SWEEP_VARIANTS=
# default,mid_argmax_key python bench/decode_sweep.py --build .device/s61/mid).
# `merge`, `gu`: bench/gpu_session60.sh's (carry .device/s60/gu for `gu`).
# Usage: [KEY_CONTEXTS=L,...] [GU_CONTEXTS=L,...] bash bench/gpu_session61.sh [key] [key2] [key3] [midkey] [merge] [gu]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-key merge gu}; do
  case $step in
  key) SWEEP_TMP=/tmp/s61 sweep_passes s61_key default,b1_argmax_key,b1_tiers900,b1_tiers900_key 1 \
    ${KEY_CONTEXTS:-1024,1100} .device/s61/key ;;
  key2) SWEEP_TMP=/tmp/s61 sweep_passes s61_key2 default,b1s_argmax_key,b1_tiers900,b1_tiers900s_key \
    1 ${KEY_CONTEXTS:-1024,1100,4096} .device/s61/key2 ;;
  key3) SWEEP_PASSES="1 2 1 2" SWEEP_TMP=/tmp/s61 sweep_passes s61_key3 \
    default,b1s_argmax_key,b1_tiers900,b1_tiers900s_key 1 ${KEY_CONTEXTS:-1024,1100} .device/s61/key3 ;;
  midkey) SWEEP_TMP=/tmp/s61 sweep_passes s61_midkey default,mid_argmax_key 8,16 1024 .device/s61/mid ;;
  merge | gu) bash "$(dirname "$0")/gpu_session60.sh" "$step" ;;
  esac
done
tar czf "$OUT/s61_raw.tgz" -C /tmp/s61 raw 2>/dev/null

#!/usr/bin/env bash
# Fifty-eighth session. `diagnose`: fuzz variants that keep one ticket alone
# (seed 5's only_t3, seed 6's only_t2) stopped with
# CUDA_ERROR_ILLEGAL_INSTRUCTION on an H100 with the scheduler's aligned
# barriers (bar.sync, bar.red); each was built both ways into
# .device/s58/{aligned,nonaligned} (a temporary ETC_TMP_BARRIERS switch, not
# kept), run under fuzz_hang.py, and the aligned one under
# compute-sanitizer (synccheck names the divergent barrier) with its SASS.
# `verify`: today's compiler (non-aligned barriers in every kernel that
# draws): the MoE artifacts whose PTX changed (python
# test/gpu/make_artifacts.py .device/s58/arts --only
# moe_small_ticket,moe_small_tma_ticket,moe_small_family), the fuzz suite
# (make_fuzz_artifacts.py .device/s58/fuzz --count 10), every variant of
# seeds 5 and 6 (fuzz_hang.py --build .device/s58/hang --seeds 5,6), and
# synccheck over the variants that failed; the MoE tests run over the
# fifty-seventh session's artifacts with the changed ones replaced. Carry
# .device/s58 and .device/s57/arts.tar.xz.
# Usage: bash bench/gpu_session58.sh [diagnose|verify|synccheck]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
synccheck() {  # synccheck NAME ARTIFACT SEED N DEALS
  timeout 120 "$san" --tool synccheck --print-limit 20 python test/gpu/fuzz_case.py variant "$2" \
    "$3" "$4" --grid 1 --max-polls 1000000 ${5:+--deals $5} > "$OUT/s58_synccheck_$1.txt" 2>&1
  echo "synccheck $1 rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/s58_synccheck_$1.txt")"
}
case ${1:-verify} in
diagnose)
  for kind in aligned nonaligned; do
    timeout 200 python bench/fuzz_hang.py --artifacts .device/s58/$kind \
      --out "$OUT/s58_$kind.json" --budget 90 2>&1 | tee "$OUT/s58_$kind.txt"
  done
  art=.device/s58/aligned/fuzz5_only_t3
  command -v cuobjdump && cuobjdump -sass $art/kernel.cubin > "$OUT/s58_fuzz5_only_t3.sass" 2>&1
  synccheck fuzz5_only_t3 $art 5 3354 1=list,5=list
  ;;
verify)
  timeout 150 python bench/fuzz_hang.py --artifacts .device/s58/hang \
    --out "$OUT/s58_hang.json" --budget 120 2>&1 | grep -v '"ok"' | tee "$OUT/s58_hang.txt"
  echo "hang variants ok: $(grep -c '"ok"' "$OUT/s58_hang.json")"
  mkdir -p /tmp/s58 && python -c \
    "import tarfile; tarfile.open('.device/s57/arts.tar.xz').extractall('/tmp/s58')"
  cp -r .device/s58/arts/. /tmp/s58/arts/
  ETC_ARTIFACTS=/tmp/s58/arts ETC_FUZZ_ARTIFACTS=.device/s58/fuzz ETC_FUZZ_TIMEOUT=30 \
    timeout 200 python -m pytest -q -rfE -p no:cacheprovider test/gpu/test_fuzz_gpu.py \
    test/gpu/test_moe_gpu.py > "$OUT/s58_tests.txt" 2>&1
  tail -5 "$OUT/s58_tests.txt"
  synccheck fuzz5_only_t3 .device/s58/hang/fuzz5_only_t3 5 3354 1=list,5=list
  synccheck fuzz6_only_t2 .device/s58/hang/fuzz6_only_t2 6 2226 0=list,1=list,3=list,5=list,7=list
  synccheck fuzz5_drawn .device/s58/hang/fuzz5_drawn 5 3354
  ;;
esac
# `synccheck`: compute-sanitizer's synccheck over the GPU tests of every
# kernel that draws (static MoE ticket artifacts, the pooled split-K and
# skewed graphs, the pooled tiny decoders), tiles' own barriers included:
# carry .device/s57/arts.tar.xz and .device/s58/arts.
if [ "${1:-}" = synccheck ]; then
  mkdir -p /tmp/s58 && python -c \
    "import tarfile; tarfile.open('.device/s57/arts.tar.xz').extractall('/tmp/s58')"
  cp -r .device/s58/arts/. /tmp/s58/arts/
  for group in "moe:static and ticket" "schedules:pooled and static" \
      "llama:decoder_matches_the_simulator and pool and static"; do
    file=${group%%:*}
    ETC_ARTIFACTS=/tmp/s58/arts timeout ${SYNC_TIMEOUT:-60} "$san" --tool synccheck --print-limit 10 \
      python -m pytest -q -p no:cacheprovider "test/gpu/test_${file}_gpu.py" -k "${group#*:}" \
      > "$OUT/s58_synccheck_$file.txt" 2>&1
    echo "$file rc=$?: $(grep -E 'passed|failed' "$OUT/s58_synccheck_$file.txt" | tail -1)" \
      "$(grep -E 'ERROR SUMMARY' "$OUT/s58_synccheck_$file.txt")"
  done
fi

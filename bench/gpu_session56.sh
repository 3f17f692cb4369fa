#!/usr/bin/env bash
# Fifty-sixth session: why the cluster meeting lost (item 259): the
# co-resident CTAs of each sweep kernel (`ctas`), the stamped large and
# cluster kernels with whole tables and raw stamps (`stamps`), and the whole
# GPU suite over every test artifact (`suite`: python test/gpu/make_artifacts.py
# .device/s56/arts; python test/gpu/make_fuzz_artifacts.py .device/s56/fuzz
# --count 10; tar cf - -C .device/s56 arts fuzz | xz > .device/s56/arts.tar.xz).
# Carry .device/s53 and .device/s56/arts.tar.xz (20 MB).
# Usage: [SUITE_FILES=...] bash bench/gpu_session56.sh [ctas] [stamps] [suite]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s56
for step in ${*:-ctas stamps}; do
  case $step in
  ctas)  # the grid each kernel launches at most (SMs x occupancy, or whole clusters)
    timeout 120 python - <<'PY' 2>&1 | tee "$OUT/s56_ctas.txt"
import etc.runtime as rt


def walk(variant, kernel, path):  # buckets nest (B, then L for B = 1)
    if hasattr(kernel, "kernels"):
        for bound, inner in zip(kernel.bounds, kernel.kernels):
            walk(variant, inner, f"{path} {kernel.symbol}<={bound}")
    else:
        print(f"{variant:9s}{path}: cluster {kernel.cluster}, up to {kernel.num_ctas} CTAs")


for v in ("default", "unshared", "cluster"):
    walk(v, rt.load(f".device/s53/sweep/{v}"), "")
PY
    ;;
  stamps)  # both kernels' tables in full, their raw stamps into $OUT
    DECODE_TRACE_VARIANTS=stamps_large,stamps_cluster DECODE_TRACE_BATCHES=32,64 \
      DECODE_TRACE_CONTEXT=1024 timeout 300 \
      python bench/decode_trace.py --artifacts .device/s53/st --out /tmp/s56/st 2>&1 \
      | tee "$OUT/s56_stamps.txt" | grep -A6 "^==\|layer 8"
    tar czf "$OUT/s56_st.tgz" -C /tmp/s56 st
    ;;
  suite)  # the GPU tests of SUITE_FILES (default: every file), each file
    # within SUITE_TIMEOUT seconds (400), so a slow file leaves the others'
    # results; the failures' names and first lines into $OUT/s56_suite.txt
    [ -d /tmp/s56/arts ] || python -c \
      "import tarfile; tarfile.open('.device/s56/arts.tar.xz').extractall('/tmp/s56')"
    for f in ${SUITE_FILES:-$(ls test/gpu/test_*.py)}; do
      echo "== $f" | tee -a "$OUT/s56_suite.txt"
      ETC_ARTIFACTS=/tmp/s56/arts ETC_FUZZ_ARTIFACTS=/tmp/s56/fuzz timeout ${SUITE_TIMEOUT:-400} \
        python -m pytest -q -rfE --durations=5 "$f" 2>&1 | tail -20 | tee -a "$OUT/s56_suite.txt"
    done
    ;;
  esac
done

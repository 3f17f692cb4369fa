# Sourced by bench/gpu_*.sh: what every device call sets up first (the
# repository's Python on the path, $OUT, the GPU and its clocks recorded).
export PYTHONPATH="$PWD/python:$PWD"
OUT=${OUT:-/tmp/etc-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

# The GPU tests over the artifacts in .device/arts and .device/fuzz, into
# $OUT/tests.txt; arguments go to pytest (e.g. -x).
gpu_tests() {
  echo "== GPU tests" | tee "$OUT/tests.txt"
  ETC_ARTIFACTS=.device/arts ETC_FUZZ_ARTIFACTS=.device/fuzz timeout 300 \
    python -m pytest -q -rs "$@" test/gpu 2>&1 | tail -15 | tee -a "$OUT/tests.txt"
}

#!/usr/bin/env bash
# Everything this project runs on the H200 in one device call, from artifacts
# compiled on a CPU machine (the GPU machine has no compiler):
#   python test/gpu/make_artifacts.py .device/arts
#   python bench/splitk.py --build .device/bench
#   python examples/splitk_rowsum.py --save-artifact .device/ex/splitk_rowsum
#   python examples/symbolic_batch.py --save-artifact .device/ex/symbolic_batch
#   (and the same with --schedule dynamic into .device/ex/<name>_dynamic)
#   python bench/schedules.py --build .device/sched
# then, on the GPU machine: bash bench/gpu_session.sh  (writes to $OUT)
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
python -c "import etc.runtime, sys; print('runtime imports without the compiler:', 'etc._mlir_libs' not in sys.modules)" | tee -a "$OUT/gpu.txt"

echo "== GPU tests" | tee "$OUT/tests.txt"
ETC_ARTIFACTS=.device/arts timeout 400 python -m pytest -q -rs -x test/gpu 2>&1 | tail -30 | tee -a "$OUT/tests.txt"

echo "== examples on the GPU" | tee "$OUT/examples.txt"
python examples/splitk_rowsum.py --artifact .device/ex/splitk_rowsum --sizes 1,3,7,8,33,1000,4099 2>&1 | tee -a "$OUT/examples.txt"
if [ -d .device/ex/symbolic_batch ]; then
  python examples/symbolic_batch.py --artifact .device/ex/symbolic_batch 2>&1 | tee -a "$OUT/examples.txt"
fi
for ex in splitk_rowsum symbolic_batch; do
  if [ -d ".device/ex/${ex}_dynamic" ]; then
    python "examples/$ex.py" --schedule dynamic --artifact ".device/ex/${ex}_dynamic" 2>&1 | tee -a "$OUT/examples.txt"
  fi
done

echo "== split-K benchmark" | tee "$OUT/bench.txt"
python bench/splitk.py --artifacts .device/bench --out "$OUT/splitk.json" 2>&1 | tee -a "$OUT/bench.txt"

echo "== schedules benchmark" | tee "$OUT/schedules.txt"
if [ -d .device/sched ]; then
  python bench/schedules.py --artifacts .device/sched --out "$OUT/schedules.json" 2>&1 | tee -a "$OUT/schedules.txt"
fi

#!/usr/bin/env bash
# Twenty-seventh session (bench/RESULTS.md, MoE section): the combine in the
# slot down tiles (MoEConfig(combine="last")), narrower gate/up blocks, and
# the few preset's range.
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session27.sh [tests] [last] [few] [final] [suite] [queue] [fewre1] [full] [dynamic]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s27
export AB_TMP=/tmp/s27
for step in ${*:-tests last few final suite queue fewre1 full dynamic}; do
  case $step in
  tests)  # (.device/n27c: python test/gpu/make_artifacts.py .device/n27c/arts --only
    #  moe_small_slots_gemv_last)
    ETC_ARTIFACTS=.device/n27c/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k slots_gemv_last 2>&1 | tee "$OUT/tests_last.txt" | tail -4
    ;;
  last)  # (.device/n27a: BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=single,
    #  single_gemv_gu24,single_last,single_gu24_last python bench/moe.py --build .device/n27a/moe --trace)
    AB_TIMEOUT=400 moe_ab moe-last single,single_gemv_gu24,single_last,single_gu24_last 1,2 \
      .device/n27a 1
    ;;
  few)  # (.device/n27b: BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=few,
    #  few_last,few_gu24_last,mid python bench/moe.py --build .device/n27b/moe)
    AB_GREP="(few.*occ|mid) static, GPU" moe_ab moe-few-last few,few_last,few_gu24_last,mid \
      3,5,8,9,12,16 .device/n27b
    ;;
  final)  # the presets with combine="last" and the buckets (single <= 2, few <= 8, mid, prefill).
    # (.device/n27d: python test/gpu/make_artifacts.py .device/n27d/arts --only moe_small_family;
    #  python examples/moe.py --preset auto [--topk 1 --routing top1] --save-artifact
    #  .device/n27d/ex/auto[_top1]; BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1
    #  BENCH_MOE_CONFIGS=auto,single,single_re1 python bench/moe.py --build .device/n27d/moe)
    ETC_ARTIFACTS=.device/n27d/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k one_artifact 2>&1 | tee "$OUT/tests_family.txt" | tail -3
    run() { timeout 120 python examples/moe.py --preset auto "$@" 2>&1 | tee -a "$OUT/examples.txt"; }
    run --artifact .device/n27d/ex/auto --tokens 1,2,3,5,8,9,16,128,1024,4096 | tail -12
    run --artifact .device/n27d/ex/auto --routing one-expert --tokens 1,2,8,9,1000 | tail -6
    run --artifact .device/n27d/ex/auto --routing few-experts --tokens 3,7,128 | tail -4
    run --artifact .device/n27d/ex/auto_top1 --topk 1 --routing top1 --tokens 1,2,8,33 | tail -5
    AB_GREP="(single|auto).*GPU" AB_TIMEOUT=400 moe_ab moe-final single,single_re1 1,2 .device/n27d
    AB_GREP="auto.*GPU" AB_TIMEOUT=400 moe_ab moe-auto auto 1,2,3,5,8,9,16,128,1024,4096 .device/n27d
    ;;
  suite)  # every GPU test (.device/n27g: python test/gpu/make_artifacts.py .device/n27g/arts;
    #  in item 105 on the strided static queue of commit b447b2f)
    ETC_ARTIFACTS=.device/n27g/arts timeout 540 python -m pytest -q -rs test/gpu 2>&1 \
      | tee "$OUT/tests_suite.txt" | tail -8
    ;;
  queue)  # the static loop before / after the strided queue (one load to the first
    # entry; item 105, tried and reverted: build .device/n27f and .device/n27g with the
    # compiler of commit b447b2f), the same configurations: .device/n27d (the older
    # compiler; its single_re1 is the new single) against .device/n27f
    # (BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=auto,single python
    # bench/moe.py --build .device/n27f/moe).
    for pass in 1 2; do
      for side in sliced strided; do
        if [ $side = sliced ]; then dir=.device/n27d cfgs=single_re1,auto; else dir=.device/n27f cfgs=single,auto; fi
        BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=$cfgs BENCH_MOE_SIZES=1,2,3,16,128,1024 \
          timeout 200 python bench/moe.py --artifacts $dir/moe --out "$AB_TMP/queue-$side$pass.json" 2>&1 \
          | tee -a "$OUT/moe-queue.txt" | grep -E "(single.*occ|auto).*GPU" | sed "s/^/$side /"
      done
    done
    python - "$AB_TMP" "$OUT/moe-queue.json" <<'PY'
import json, sys
from pathlib import Path
tmp = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(tmp.glob("queue-*.json"))}
Path(sys.argv[2]).write_text(json.dumps(runs, indent=1) + "\n")
PY
    ;;
  fewre1)  # one expert per router CTA in the few preset too (.device/n27h:
    #  BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=few,few_re1
    #  python bench/moe.py --build .device/n27h/moe)
    AB_GREP="few.*occ.*GPU" moe_ab moe-few-re1 few,few_re1 3,5,8 .device/n27h
    ;;
  full)  # the issue's benchmark on the shipped artifact: static and dynamic, the unfused
    # path, eager / _grouped_mm / CUDA graph baselines (.device/n27e:
    #  BENCH_MOE_CONFIGS=auto,single,mid,prefill python bench/moe.py --build .device/n27e/moe)
    BENCH_MOE_CONFIGS=auto,mid,prefill timeout 400 python bench/moe.py --artifacts .device/n27e/moe \
      --out "$OUT/moe-full.json" 2>&1 | tee "$OUT/moe-full.txt" | grep -E "graph|auto|floor" | head -60
    ;;
  dynamic)  # compile_moe(schedule="dynamic") with the slot presets kept static (item 106).
    # (.device/n27i: python test/gpu/make_artifacts.py .device/n27i/arts --only moe_small_family;
    #  python examples/moe.py --preset auto --schedule dynamic --save-artifact
    #  .device/n27i/ex/auto_dynamic; BENCH_MOE_CONFIGS=auto python bench/moe.py --build .device/n27i/moe)
    ETC_ARTIFACTS=.device/n27i/arts timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k one_artifact 2>&1 | tee "$OUT/tests_family_dynamic.txt" | tail -3
    run() { timeout 120 python examples/moe.py --preset auto --schedule dynamic "$@" 2>&1 \
      | tee -a "$OUT/examples_dynamic.txt"; }
    run --artifact .device/n27i/ex/auto_dynamic --tokens 1,2,8,9,128,4096 | tail -7
    run --artifact .device/n27i/ex/auto_dynamic --routing one-expert --tokens 1,9,1000 | tail -4
    BENCH_MOE_CONFIGS=auto BENCH_MOE_SIZES=1,2,3,16 timeout 200 python bench/moe.py \
      --artifacts .device/n27i/moe --out "$OUT/moe-auto-dynamic.json" 2>&1 \
      | tee "$OUT/moe-auto-dynamic.txt" | grep -E "auto.*GPU"
    ;;
  esac
done

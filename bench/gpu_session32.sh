#!/usr/bin/env bash
# Thirty-second session (bench/RESULTS.md, decoder items 135-136): static queues dealt by
# SM (Kernel.deal_by_sm). Each step's CPU-side build is in its comment. The claim-at-start
# and exit-record builds of item 135 are in no commit; `smdeal` here is the trace-placement
# version (bench/sm_deal.py as committed).
# Usage: bash bench/gpu_session32.sh [final] [smdeal] [slices] [tests] [confirm] [finaltests] [bench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s32/raw
for step in ${*:-final}; do
  case $step in
  final)  # session 31's committed layout (a static worker's word its own .shared variable,
    # the dynamic worker's words after the tiles): the pooled and ticketed graphs, the tiny
    # decoders, the split-K graph under the dynamic schedule (python test/gpu/make_artifacts.py
    # .device/s32/art --only PREFIX for PREFIX in splitk_pool skewed_pooled llama_tiny_pool
    # llama_tiny_tma_buckets_pool moe_small_ticket splitk_dynamic llama_tiny_dynamic)
    ETC_ARTIFACTS=.device/s32/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_schedules_gpu.py test/gpu/test_llama_gpu.py test/gpu/test_moe_gpu.py \
      -k "pool or ticket or (splitk and dynamic) or (llama_tiny and dynamic)" 2>&1 \
      | tee "$OUT/final.txt" | grep -v "^FAILED.*\(No such file\|not found\|FileNotFound\)" | tail -8
    ;;
  smdeal)  # round-robin against queues dealt by a trace's placement, on the traced
    # default decoder (python bench/sm_deal.py --build .device/s32/smdeal)
    SM_DEAL_BATCHES=${SM_DEAL_BATCHES:-1,8,64} timeout 400 python bench/sm_deal.py \
      --artifacts .device/s32/smdeal --out "$OUT" 2>&1 | grep -v "^    [a-z_]* *[0-9]* instances, window" \
      | tail -40
    ;;
  slices)  # the decoder with its large-batch kernel compiled with sm_slices (the default that
    # day) dealt by SM and round-robin, and the decoder without sm_slices, untraced
    # (python bench/sm_deal.py --build .device/s32/smdeal)
    for L in 1024 4096; do
      SM_DEAL_UNTRACED=1 SM_DEAL_BATCHES=$([ $L = 1024 ] && echo 1,8,32,64 || echo 1,64) \
        SM_DEAL_CONTEXT=$L timeout 280 python bench/sm_deal.py --artifacts .device/s32/smdeal \
        --out "$OUT" 2>&1 | grep "B="
    done
    ;;
  tests)  # the GPU tests of static kernels (every one now records its CTAs' SMs at exit; the
    # dynamic worker did not change and its artifacts would not fit the carry): python
    # test/gpu/make_artifacts.py .device/s32/art, then the *dynamic* ones moved out
    ETC_ARTIFACTS=.device/s32/art timeout 400 python -m pytest -q -rfs --tb=short -k "not dynamic" test/gpu \
      2>&1 | tee "$OUT/tests.txt" | grep -v "cannot read the artifact manifest" | tail -12
    ;;
    confirm)  # the committed default artifact (python bench/decode.py --build .device/s32/decode):
    # the large-batch kernel as the artifact says (sm_deal="spread") against round-robin
    timeout 200 python - <<'PY' 2>&1 | grep "B=" | tee "$OUT/confirm.txt"
import sys, torch
sys.path.insert(0, ".")
import etc.runtime
from bench.timing import timed
from etc.models import llama as M
cfg = M.LLAMA_3_2_1B
w = M.random_weights_torch(cfg)
k = etc.runtime.load(".device/s32/decode/static")
for L, Bs in ((1024, (1, 64)), (4096, (64,))):
    for B in Bs:
        bufs = M.torch_inputs(cfg, w, B, L, L + 1)
        syms = {"B": B, "L": L, "S": L + 1}
        kern = k.kernel_for(syms)
        for how in ("default", None, "default", None):
            kern.deal_by_sm(kern.manifest.sm_deal if how == "default" else None)
            kern.launch(bufs, syms)
            us = timed(torch, lambda i: kern.launch(bufs, syms, sync=False), 10, 7)
            kern.check()
            print(f"B={B} L={L} {('artifact ' + str(kern.manifest.sm_deal)) if how else 'round-robin'}: {us:.1f} us", flush=True)
        del bufs; torch.cuda.empty_cache()
PY
    ;;
  finaltests)  # the final build's tests: the three-kernel tiny decoders (the large-batch
    # kernel records and deals by SM), llama_tiny_sm_slices, split-K (python
    # test/gpu/make_artifacts.py .device/s32/art --only PREFIX for PREFIX in
    # llama_tiny_tma_buckets llama_tiny_sm splitk)
    ETC_ARTIFACTS=.device/s32/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py test/gpu/test_schedules_gpu.py test/gpu/test_runtime_gpu.py \
      -k "tma_buckets or sm_slices or splitk" 2>&1 | tee "$OUT/final_tests.txt" | tail -8
    ;;
  bench)  # bench/decode.py on the session's defaults (the large-batch kernel's queues dealt by
    # SM from the first launch's record; python bench/decode.py --build .device/s32/decode)
    decode_bench .device/s32/decode
    ;;
  esac
done
tar czf "$OUT/raw.tgz" -C /tmp/s32 raw

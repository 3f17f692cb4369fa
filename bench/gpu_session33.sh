#!/usr/bin/env bash
# Thirty-third session (bench/RESULTS.md): the large-batch decoder's o_proj and down
# grids, and the MoE prefill tiles refilling their rings without holding a warpgroup.
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session33.sh [sweep] [moe] [a16] [pu] [bp] [gt] [tests] [final] [bench] [gusweep] [dectests] [front] [front2] ...
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
  bp)  # the permute by bulk copies through 32 / 48 shared slots, on the preset and on the
    # f16-sum + refill configuration, the first pass traced (BENCH_MOE_LEAN=1
    # BENCH_MOE_SCHEDULES=static BENCH_MOE_CONFIGS=prefill,pre_bp32,pre_a16c_refill,
    # pre_a16c_refill_bp32,pre_a16c_refill_bp48 python bench/moe.py --build .device/s33/moe4/moe --trace)
    AB_TMP=/tmp/s33/ab AB_GREP=GPU moe_ab moe_bp \
      prefill,pre_bp32,pre_a16c_refill,pre_a16c_refill_bp32,pre_a16c_refill_bp48 1024,4096 .device/s33/moe4 1
    mv "$OUT"/moe_*[12].json /tmp/s33/raw/
    ;;
  gt)  # no permuted copy: the gate/up tiles gather their rows by one-row TMA boxes
    # (gather_tma) against item 81's cp.async gather and the preset, alone and with the
    # f16 sums, the first pass traced (BENCH_MOE_LEAN=1 BENCH_MOE_SCHEDULES=static
    # BENCH_MOE_CONFIGS=prefill,pre_gather,pre_gt,pre_a16c_refill,pre_a16c_refill_gt
    # python bench/moe.py --build .device/s33/moe5/moe --trace)
    AB_TMP=/tmp/s33/ab AB_GREP="GPU\|rr\|FAIL" moe_ab moe_gt \
      prefill,pre_gather,pre_gt,pre_a16c_refill,pre_a16c_refill_gt 128,1024,4096 .device/s33/moe5 1
    mv "$OUT"/moe_*[12].json /tmp/s33/raw/
    ;;
  tests)  # the GPU tests of the session's MoE variants: each against float32 numpy and the
    # simulator (three schedules, three routings) and bit for bit against the plain TMA layer
    # (python test/gpu/make_artifacts.py .device/s33/art --only PREFIX for PREFIX in
    # moe_small_gather_tma moe_small_tma_refill moe_small_bulk_permute moe_small_tma_)
    ETC_ARTIFACTS=.device/s33/art timeout 300 python -m pytest -q -rfs --tb=short \
      test/gpu/test_moe_gpu.py -k "gather_tma or tma_refill or bulk_permute or session33" 2>&1 \
      | tee "$OUT/tests.txt" | tail -8
    ;;
  final)  # the prefill preset with f16 sums and refilled rings, adopted: the one-artifact
    # family's GPU tests, the real-size examples of the auto artifact and of the preset on
    # both sides of every bound and over skewed routings (python test/gpu/make_artifacts.py
    # .device/s33/art --only moe_small_family; python examples/moe.py --preset auto [--topk 1
    # --routing top1] --save-artifact .device/s33/ex/auto[_top1]; python examples/moe.py
    # --preset prefill --save-artifact .device/s33/ex/prefill)
    ETC_ARTIFACTS=.device/s33/art timeout 200 python -m pytest -q -rs test/gpu/test_moe_gpu.py \
      -k one_artifact 2>&1 | tee "$OUT/tests_family.txt" | tail -3
    run() { timeout 150 python examples/moe.py "$@" 2>&1 | tee -a "$OUT/examples.txt"; }
    run --preset auto --artifact .device/s33/ex/auto --tokens 1,2,3,5,8,9,16,128,1024,4096 | tail -12
    run --preset auto --artifact .device/s33/ex/auto --routing one-expert --tokens 1,2,8,9,1000 | tail -6
    run --preset auto --artifact .device/s33/ex/auto --routing few-experts --tokens 3,7,128 | tail -4
    run --preset auto --artifact .device/s33/ex/auto_top1 --topk 1 --routing top1 --tokens 1,2,8,33 | tail -5
    run --preset prefill --artifact .device/s33/ex/prefill --tokens 1,7,16,128,1024,4096 | tail -7
    run --preset prefill --artifact .device/s33/ex/prefill --routing one-expert --tokens 1,16,1000 | tail -4
    run --preset prefill --artifact .device/s33/ex/prefill --routing few-experts --tokens 7,128,4095 | tail -4
    ;;
  bench)  # the issue's benchmark (every baseline, both schedules, the unfused path) over the
    # adopted presets, with the former prefill preset next to them
    # (BENCH_MOE_CONFIGS=auto,mid,prefill,prefill_yp python bench/moe.py --build .device/s33/full/moe)
    BENCH_MOE_CONFIGS=auto,mid,prefill,prefill_yp timeout 560 python bench/moe.py \
      --artifacts .device/s33/full/moe --out "$OUT" 2>&1 | tee "$OUT/moe_full.txt" | tail -60
    ;;
  gusweep)  # gate/up at B = 32 and 64 in parts: 32 columns x 2 parts (512 instances), 64 x 2
    # (256) and 64 x 4 (512) (DECODE_SWEEP_VARIANTS=default,sm_gu32s2,sm_gu64s2,sm_gu64s4
    # python bench/decode_sweep.py --build .device/s33/sweep2)
    SWEEP_TMP=/tmp/s33 sweep_passes s33_gusweep default,sm_gu32s2,sm_gu64s2,sm_gu64s4 \
      32,64 1024,4096 .device/s33/sweep2
    ;;
  dectests)  # the decoder's large-batch kernel with gate/up in 64-column blocks of 2 parts
    # (the new LARGE_BATCH default): the tiny three-kernel decoders against the simulator and
    # bit-reproducible, and the 1B large kernel's variants bit-identical to each other
    # (python test/gpu/make_artifacts.py .device/s33/art --only PREFIX for PREFIX in
    # llama_tiny_tma_buckets llama_1b_large)
    ETC_ARTIFACTS=.device/s33/art timeout 400 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "tma_buckets or 1b_large" 2>&1 | tee "$OUT/dectests.txt" | tail -8
    ;;
  front)  # the adopted prefill preset with 32-token top-k blocks, the bulk permute through 48
    # slots, or both (BENCH_MOE_LEAN=1 BENCH_MOE_SCHEDULES=static BENCH_MOE_CONFIGS=prefill,
    # pre16_tb32,pre16_bp48,pre16_tb32_bp48 python bench/moe.py --build .device/s33/front/moe)
    AB_TMP=/tmp/s33/ab AB_GREP=GPU moe_ab moe_front prefill,pre16_tb32,pre16_bp48,pre16_tb32_bp48 \
      1024,4096 .device/s33/front
    mv "$OUT"/moe_*[12].json /tmp/s33/raw/
    ;;
  front2)  # the same artifacts at T = 2048 and 3072: where the front variants stop losing
    AB_TMP=/tmp/s33/ab AB_GREP=GPU moe_ab moe_front2 prefill,pre16_bp48,pre16_tb32_bp48 \
      2048,3072 .device/s33/front
    mv "$OUT"/moe_*[12].json /tmp/s33/raw/
    ;;
  esac
done
tar czf "$OUT/raw.tgz" -C /tmp/s33 raw

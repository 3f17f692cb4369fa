#!/usr/bin/env bash
# Thirty-fourth session (bench/RESULTS.md, items 146-): a model of the B = 1 step with a
# loader warp, and the large-batch decoder's split-K parts meeting in fragment order.
# Each step's CPU-side build is in its comment.
# Usage: bash bench/gpu_session34.sh [proto] [tests] [sweep] [sweep2] [sweep3] [sweep4] [l2kv] [l2kv2] [trace] [bench] ...
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
mkdir -p /tmp/s34/raw
for step in ${*:-sweep}; do
  case $step in
  proto)  # the loader-warp model of the B = 1 step (nothing to build here)
    nvcc -O3 -arch=sm_90a bench/loader_proto.cu -o /tmp/lp && timeout 280 /tmp/lp 2>&1 \
      | tee "$OUT/loader-proto.txt"
    ;;
  tests)  # the parts meeting in fragment order: the tiny TMA decoders against the simulator
    # and bit-reproducible, the 1B large kernel bit-identical to the rows meeting
    # (python test/gpu/make_artifacts.py .device/s34/art --only PREFIX for PREFIX in
    # llama_1b_large llama_tiny_tma_rows llama_tiny_tma_buckets_rows llama_tiny_tma_buckets;
    # before "fragments" became the default the variants were llama_tiny_tma_frag and
    # llama_tiny_tma_buckets_frag, and llama_1b_large_frag)
    ETC_ARTIFACTS=.device/s34/art timeout 400 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "tma_buckets or tma_rows or 1b_large" 2>&1 \
      | tee "$OUT/dectests.txt" | tail -8
    ;;
  sweep)  # the meeting in fragment order, alone and with o_proj or qkv in 8 parts (run while
    # "rows" was the default: rerun now, "default" and "frag" are the same kernel)
    # (DECODE_SWEEP_VARIANTS=default,frag,frag_o8,frag_q8 python bench/decode_sweep.py
    # --build .device/s34/sweep)
    SWEEP_TMP=/tmp/s34 sweep_passes s34_sweep default,frag,frag_o8,frag_q8 \
      32,64 1024,4096 .device/s34/sweep
    ;;
  sweep2)  # the adopted default (fragments) against the rows meeting
    # (DECODE_SWEEP_VARIANTS=default,rows python bench/decode_sweep.py --build .device/s34/sweep2)
    SWEEP_TMP=/tmp/s34 sweep_passes s34_sweep2 default,rows 32,64 1024,4096 .device/s34/sweep2
    ;;
  sweep3)  # o_proj in 128-column blocks of 8 parts (qkv so spilled 964 bytes in ptxas: not run)
    # (DECODE_SWEEP_VARIANTS=default,o128s8 python bench/decode_sweep.py --build .device/s34/sweep3)
    SWEEP_TMP=/tmp/s34 sweep_passes s34_sweep3 default,o128s8 32,64 4096 .device/s34/sweep3
    ;;
  sweep4)  # the large kernel's attention in spans of 2048 (1024 instances at B = 64, L = 4096,
    # a combine after them) against 4096 (512 instances in two waves, the second's tail ~15 us)
    # (DECODE_SWEEP_VARIANTS=default,chunk2048 python bench/decode_sweep.py --build .device/s34/sweep4)
    SWEEP_TMP=/tmp/s34 sweep_passes s34_sweep4 default,chunk2048 32,64 4096 .device/s34/sweep4
    ;;
  l2kv)  # the small kernels' attention asking the L2 for its cached K and V before its waits:
    # the tiny decoder with it against the simulator, then the sweep at B = 1 and 8
    # (python test/gpu/make_artifacts.py .device/s34/art --only llama_tiny_attn_l2pf;
    # DECODE_SWEEP_VARIANTS=default,attn_l2kv,attn_l2kv1 python bench/decode_sweep.py
    # --build .device/s34/sweep5)
    ETC_ARTIFACTS=.device/s34/art timeout 200 python -m pytest -q -rfs --tb=short \
      test/gpu/test_llama_gpu.py -k "attn_l2pf" 2>&1 | tee "$OUT/l2kv_tests.txt" | tail -3
    SWEEP_TMP=/tmp/s34 sweep_passes s34_sweep5 default,attn_l2kv,attn_l2kv1 1,8 1024,4096 \
      .device/s34/sweep5
    ;;
  l2kv2)  # the B = 1 kernel with its attention called, without and with the L2 prefetch
    # (DECODE_SWEEP_VARIANTS=default,attn_l2kv1,ol1_lm_attn,ol1_lm_attn_l2kv python
    # bench/decode_sweep.py --build .device/s34/sweep6)
    SWEEP_TMP=/tmp/s34 sweep_passes s34_sweep6 default,attn_l2kv1,ol1_lm_attn,ol1_lm_attn_l2kv \
      1 1024,4096 .device/s34/sweep6
    ;;
  trace)  # the default traced at B = 1, L = 1024 and B = 64, L = 4096 (raw records kept)
    # (DECODE_TRACE_VARIANTS=default python bench/decode_trace.py --build .device/s34/tr)
    decode_traces .device/s34/tr /tmp/s34
    ;;
  bench)  # the issue's benchmark over the default artifact
    # (python bench/decode.py --build .device/s34/decode)
    decode_bench .device/s34/decode
    ;;
  esac
done
tar czf "$OUT/session34-raw.tgz" -C /tmp/s34 raw 2>/dev/null || true

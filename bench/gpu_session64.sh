#!/usr/bin/env bash
# Sixty-fourth session.
# `card`: which GPU came. `h200`: only on an H200, the issue's table and its
# warm-up over the default artifact (python bench/decode.py --build
# .device/s64/dec; carry .device/s64/dec); on any other card it prints the
# card and stops, since the table's H100 rows are already measured (item 279).
# `cli`: `etc run` and `etc bench` as commands: test/gpu/test_cli_gpu.py over
# .device/s64/cli (python test/gpu/make_artifacts.py .device/s64/cli --only
# 'splitk$,broken$,symbolic_batch,moe_small_static$,splitk_traced_static$'), then the decoder's
# static artifact run once and timed by `etc bench` at B = 1 and 64, L = 1024,
# against bench/decode.py's timing of the same artifact in the same call
# (B = 1 and 64, no torch.compile).
# `compare`: test/gpu/test_cli_gpu.py again, then `etc bench` comparing the
# decoder's static and dynamic artifacts (B = 1 and 64, L = 1024, 4 passes).
# `conv`: lead 3 of docs/decoder.md, the scheduler's CTA reductions as NVVM's
# barrier reductions (convergent to LLVM) instead of inline bar.red
# (python -c "from etc.models import llama as M; M.compile_decoder(
# M.LLAMA_3_2_1B, 'static', convergent_reductions=True).save(
# '.device/s64/conv/static')"): the same step's logits and tokens bit for
# bit, then `etc bench` of both, four passes, at B = 1 (L = 1024, 4096),
# 8, 16 and 64 (L = 1024). Carry .device/s64/dec and .device/s64/conv.
# Usage: bash bench/gpu_session64.sh [card] [h200] [cli] [compare] [conv]
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
for step in ${*:-card}; do
  case $step in
  card) nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$OUT/s64_card.txt" ;;
  h200) if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
      issue_bench .device/s64/dec
      mkdir -p "$OUT/warmup"; OUT="$OUT/warmup" DECODE_PARTS=warmup decode_bench .device/s64/dec
    else echo "not an H200: table skipped"; fi ;;
  cli) ETC_ARTIFACTS=.device/s64/cli python -m pytest -q -p no:cacheprovider -rs \
      test/gpu/test_cli_gpu.py > "$OUT/s64_cli_tests.txt" 2>&1; tail -15 "$OUT/s64_cli_tests.txt"
    dec=.device/s64/dec/static
    { python -m etc run $dec --symbols B=1,L=1024,S=1025 --scale 0.02
      for B in 1 64; do
        python -m etc bench $dec --symbols B=$B,L=1024,S=1025 --scale 0.02 \
          --json "$OUT/s64_dec_bench_B$B.json"
      done; } > "$OUT/s64_dec_cli.txt" 2>&1; cat "$OUT/s64_dec_cli.txt"
    DECODE_BATCHES=1,64 DECODE_PARTS=time decode_bench .device/s64/dec --compile-batches "" ;;
  compare) ETC_ARTIFACTS=.device/s64/cli python -m pytest -q -p no:cacheprovider -rs \
      test/gpu/test_cli_gpu.py > "$OUT/s64_cli_tests.txt" 2>&1; tail -15 "$OUT/s64_cli_tests.txt"
    for B in 1 64; do
      python -m etc bench .device/s64/dec/static .device/s64/dec/dynamic \
        --symbols B=$B,L=1024,S=1025 --scale 0.02 --passes 4 --json "$OUT/s64_compare_B$B.json"
    done 2>&1 | tee "$OUT/s64_compare.txt" ;;
  conv) a=.device/s64/dec/static; c=.device/s64/conv/static; t=/tmp/s64conv; mkdir -p $t
    { for s in B=1,L=1024,S=1025 B=1,L=4096,S=4097 B=64,L=1024,S=1025; do
        python -m etc run $a --symbols $s --scale 0.02 --save-inputs $t/in.npz -o $t/ref.npz > /dev/null
        python -m etc run $c --symbols $s --inputs $t/in.npz --expect $t/ref.npz \
          --compare logits,next_tokens,k_cache,v_cache,h --rtol 0 --atol 0 | grep -A9 "against"
      done; } 2>&1 | tee "$OUT/s64_conv_check.txt"
    for s in B=1,L=1024,S=1025 B=1,L=4096,S=4097 B=8,L=1024,S=1025 B=16,L=1024,S=1025 \
        B=64,L=1024,S=1025; do
      python -m etc bench $a $c --symbols $s --scale 0.02 --passes 4 --reps 10 \
        --json "$OUT/s64_conv_$(echo ${s%%,S=*} | tr =, __).json"
    done 2>&1 | tee "$OUT/s64_conv.txt" ;;
  esac
done

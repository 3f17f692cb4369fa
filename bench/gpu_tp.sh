#!/usr/bin/env bash
# Multi-GPU session (nvidia-h200-x2): the tensor-parallel graphs' GPU tests and
# examples, the cuBLAS + NCCL baseline and ETC's fused kernels, one run.
# Build on the CPU machine first (artifacts travel in .device/, git-ignored):
#   python test/gpu/make_artifacts.py .device/arts
#   python bench/tensor_parallel.py --build .device/tp --ranks 2
#   python examples/gemm_reduce_scatter.py --schedule S --save-artifact .device/ex/gemm_rs_S
#   python examples/allgather_gemm.py --schedule S --save-artifact .device/ex/ag_gemm_S
# Run: bench/gpu_tp.sh [tests|examples|baseline|etc]... (default: all), results in $OUT.
set -uo pipefail
export PYTHONPATH=$PWD/python:$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off (it can take the host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
RANKS=${RANKS:-2}
steps=${*:-tests examples baseline etc}
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
for step in $steps; do
  case $step in
    tests)
      ETC_ARTIFACTS=.device/arts timeout 300 python3 -m pytest -q -x test/gpu/test_collective_gpu.py \
        2>&1 | tee "$OUT/tests.txt" ;;
    examples)
      for ex in gemm_rs:gemm_reduce_scatter ag_gemm:allgather_gemm; do
        for s in static dynamic; do
          timeout 120 python3 "examples/${ex#*:}.py" --artifact ".device/ex/${ex%%:*}_$s" \
            --ranks "$RANKS" --schedule $s
        done
      done 2>&1 | tee "$OUT/examples.txt" ;;
    baseline)
      timeout 400 python3 bench/collective_baseline.py --ranks "$RANKS" --json "$OUT/baseline.json" \
        --save-io /tmp/nccl_io 2>&1 | tee "$OUT/baseline.txt" ;;
    etc)
      # TP_ARTIFACTS (default .device/tp), TP_CORES (default: every core built).
      timeout 400 python3 bench/tensor_parallel.py --run "${TP_ARTIFACTS:-.device/tp}" --ranks "$RANKS" \
        ${TP_CORES:+--cores "$TP_CORES"} --json "$OUT/tp.json" --nccl-io /tmp/nccl_io 2>&1 | tee "$OUT/tp.txt" ;;
  esac
done

#!/usr/bin/env bash
# The CPU-side builds of bench/gpu_session25.sh (into .device/n25a; about 10 minutes on 2 cores).
set -e
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/build/python_packages:$PWD/python
PY=.venv/bin/python
rm -rf .device/n25a
BENCH_MOE_SCHEDULES=static BENCH_MOE_LEAN=1 BENCH_MOE_CONFIGS=single,single_ch32,single_ch64,single_ch128,single_ch32b,few,few_ch32,few_ch64,few_ch32b,dec_pf_gu32,dec_pf_gu32_ch32,dec_pf_gu32_ch64,dec_pf_gu32_ch32b,mid,mid_ch64,prefill,prefill_ch64,auto,auto_ch64 $PY bench/moe.py --build .device/n25a/moe
for o in moe_small_chunk moe_small_ringpf_chunk moe_small_slots_chunk moe_small_slots_bulk_chunk moe_small_tma_chunk moe_small_family llama_tiny_chunk llama_tiny_tma_chunk llama_tiny_bulk_chunk; do
  $PY test/gpu/make_artifacts.py .device/n25a/arts --only $o
done
DECODE_SWEEP_VARIANTS=sync_only,sync_only_ch32,sync_only_ch64,sync_only_ch128,sync_only_ch32b,default,default_ch64 $PY bench/decode_sweep.py --build .device/n25a/dec
echo BUILD-DONE

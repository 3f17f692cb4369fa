source bench/gpu_common.sh
export BENCH_MOE_CONFIGS=bm16cp,tma128w
echo "== GPU tests (MoE)" | tee $OUT/tests.txt
ETC_ARTIFACTS=.device/arts timeout 200 python -m pytest -q -x test/gpu/test_moe_gpu.py test/gpu/test_runtime_gpu.py 2>&1 | tail -3 | tee -a $OUT/tests.txt
timeout 200 python bench/gemm_tma.py --artifacts .device/gemm_tma2 --out $OUT 2>&1 | tee $OUT/gemm_tma.txt | grep -v "^$"
timeout 300 python bench/moe.py --artifacts .device/moe_tma2 --out $OUT 2>&1 > $OUT/moe.txt; grep "GPU time\|CUDA graph" $OUT/moe.txt
timeout 200 python bench/moe_trace.py --artifacts .device/moe_tma2 --out /tmp/tr --tokens 1,1024,4096 > /dev/null 2>&1; cp /tmp/tr/moe_trace.txt $OUT/

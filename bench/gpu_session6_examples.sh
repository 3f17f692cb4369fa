source bench/gpu_common.sh
echo "== MoE example, prefill preset" | tee "$OUT/examples.txt"
for sfx in "" _dynamic; do
  sched=static; [ -n "$sfx" ] && sched=dynamic
  ex() { timeout 150 python examples/moe.py --preset prefill --schedule $sched "$@" 2>&1 | tail -7 | tee -a "$OUT/examples.txt"; }
  ex --artifact ".device/ex/moe_prefill$sfx" --tokens 1,7,16,128,1024,4096
  ex --artifact ".device/ex/moe_prefill$sfx" --routing one-expert --tokens 1,16,1000
  ex --artifact ".device/ex/moe_prefill$sfx" --routing few-experts --tokens 7,128,4095
  ex --artifact ".device/ex/moe_prefill_top1$sfx" --topk 1 --routing top1 --tokens 1,33,1000
done

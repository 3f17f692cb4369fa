"""Why is bench/decode.py's ``torch.compile(mode="reduce-overhead")`` step slower
than eager at B > 1? (bench/RESULTS.md item 169: 17.8 ms at B = 64, L = 1024,
against 1730 µs in issue 7's own measurement.)

    python bench/torch_compile_probe.py [B ...]     # GPU: B = 1 8 64 by default, L = 1024

For each B: the decode step compiled as bench/decode.py compiles it (the
buffers a module's, ``mode="reduce-overhead"``) with inductor's
"skipping cudagraphs" reasons and graph breaks printed, its time against
eager's, and the fifteen CUDA kernels that take most of one compiled step
(``torch.profiler``), so the next baseline can avoid what is slow.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.decode import _StepModule  # noqa: E402
from etc.models import llama as M  # noqa: E402

L = 1024


def main(argv: list[str]) -> int:
    import torch

    torch._logging.set_logs(perf_hints=True, graph_breaks=True, recompiles=True)
    logging.getLogger("torch._inductor").setLevel(logging.INFO)
    cfg = M.LLAMA_3_2_1B
    weights = M.graph_weights(cfg, M.random_weights_torch(cfg))
    for B in [int(b) for b in argv] or [1, 8, 64]:
        bufs = M.torch_inputs(cfg, weights, B, L, L + 1)
        torch._dynamo.reset()
        step = torch.compile(_StepModule(cfg, bufs, L), mode="reduce-overhead")
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(3):
                step()
        torch.cuda.synchronize()
        print(f"B={B}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)

        def timed(fn, n=10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.no_grad():
                fn()
                start.record()
                for _ in range(n):
                    fn()
                end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1000 / n

        eager_us = timed(lambda b=bufs: M.torch_decode_step(cfg, b, L))
        compiled_us = timed(step)
        print(f"B={B}: eager {eager_us:.1f} us, compiled {compiled_us:.1f} us a step", flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.no_grad():
                step()
            torch.cuda.synchronize()
        for key in ("device_time_total", "cuda_time_total"):  # the name by torch version
            try:
                print(prof.key_averages().table(sort_by=key, row_limit=15), flush=True)
                break
            except (KeyError, AttributeError, ValueError):
                continue
        del bufs, step
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""What an ETC launch costs with no work: the empty-task graph's kernel
(`test/gpu/graphs.py::empty_tasks`) at one instance and at one per CTA, next
to a bare CUDA kernel's launch (`bench/stream_ceiling.cu`'s "no stream"
rows, same method): the persistent kernel's own start and exit (queue
reads, the last CTA's counter reset) on top of the launch.

    python bench/launch_floor.py --build DIR       # CPU
    python bench/launch_floor.py --artifacts DIR   # GPU

GPU time (`bench.timing.gpu_timed`: a sleep kernel ahead, medians of 15 x 20
back-to-back launches).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "test" / "gpu"))

from graphs import empty_tasks  # noqa: E402

from bench.timing import gpu_timed, two_step_main  # noqa: E402

#: (artifact, schedule, min_ctas_per_sm)
KERNELS = (("static", "static", 0), ("static_2", "static", 2), ("dynamic", "dynamic", 0))


def build(out: Path) -> None:
    import etc

    for name, schedule, ctas in KERNELS:
        art = etc.compile(empty_tasks(), schedule=schedule, min_ctas_per_sm=ctas)
        art.save(out / f"empty_{name}")
        print("built", name)


def run(artifacts: Path, out: Path | None, reps: int) -> None:
    import torch

    import etc.runtime

    lines = []
    for name, _, _ in KERNELS:
        kernel = etc.runtime.load(artifacts / f"empty_{name}")
        for t in (1, kernel.num_ctas):
            us = gpu_timed(
                torch, lambda i, k=kernel, t=t: k.launch({}, {"t": t}, sync=False), 20, reps
            )
            kernel.check()
            line = f"empty {name:9s} {kernel.num_ctas:4d} CTAs, t = {t:4d}: {us:6.2f} us"
            print(line, flush=True)
            lines.append(line)
    # The same clock around PyTorch's launches: a one-element add and
    # cuBLAS GEMMs of one 128 x 128 block and of the MoE down shape at M = 1024.
    x = torch.zeros(1, device="cuda")
    baselines = {"torch add_, 1 element": lambda i: x.add_(1)}
    for m, n, k in ((128, 128, 128), (1024, 2048, 768)):
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        baselines[f"cuBLAS {m}x{n}x{k}"] = lambda i, a=a, b=b, c=c: torch.matmul(a, b.T, out=c)
    for what, launch in baselines.items():
        line = f"{what:32s}: {gpu_timed(torch, launch, 20, reps):6.2f} us"
        print(line, flush=True)
        lines.append(line)
    if out is not None:
        out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(two_step_main(__doc__.splitlines()[0], build, run, sys.argv[1:], reps=15))

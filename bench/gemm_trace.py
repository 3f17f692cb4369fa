"""Where a dense TMA GEMM launch's time goes: traced one-task graphs
(``etc.compile(..., trace=True)``) of ``etc.tiles.gemm_tc`` on the MoE expert
shapes at M = 1024, next to the same kernels untraced.

    python bench/gemm_trace.py --build DIR                # CPU: traced + plain artifacts
    python bench/gemm_trace.py --artifacts DIR --out OUT  # GPU: one table

Method: random bf16 inputs (fresh per shape); each kernel checked against a
float32 torch product first; GPU time of the plain kernel (``bench.timing.
gpu_timed``: medians of back-to-back launches over 8 rotating input copies
past L2); then three traced launches, the last one read. From its records
(start after the instance's waits, end after its closing barrier,
``%globaltimer``): the span from the first start to the last end, the
instances' durations (median, max) and the spread of their starts. What the
GPU time holds beyond the span is the launch, the kernel's start before the
first instance and its exit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._gemm_common import dense_graph, dense_launch  # noqa: E402
from bench.timing import gpu_timed, two_step_main  # noqa: E402

# name: (M, N, K, block_m, block_n, parts)
CASES = {
    "down_128x128": (1024, 2048, 768, 128, 128, 1),
    "gate_up_128x128": (1024, 1536, 2048, 128, 128, 1),
    "gate_up_128x192_k2": (1024, 1536, 2048, 128, 192, 2),
    "gate_up_256rows_128x128": (256, 1536, 2048, 128, 128, 1),
}
COPIES = 8


def _tile(bm: int, bn: int, k: int, parts: int):
    from etc.tiles import gemm_tc as G

    return G.gemm(
        bm, bn, k, core="tma", block_size=2 * bm, stages=4, smem_limit=220 << 10, k_splits=parts
    )


def build(out: Path) -> None:
    import etc

    for name, (_, _, k, bm, bn, parts) in CASES.items():
        for traced in (False, True):
            g = dense_graph(name, _tile(bm, bn, k, parts), k, bm, bn)
            art = etc.compile(g, target="sm_90a", schedule="static", trace=traced)
            art.save(out / (f"{name}_traced" if traced else name))
        print("built", name)


def run(artifacts: Path, out: Path | None, reps: int) -> None:
    import torch

    import etc.runtime

    torch.manual_seed(0)
    lines = []
    for name, (M, N, K, bm, bn, parts) in CASES.items():
        As = [torch.randn(M, K, device="cuda").to(torch.bfloat16) for _ in range(COPIES)]
        Ws = [
            (torch.randn(N, K, device="cuda") * K**-0.5).to(torch.bfloat16) for _ in range(COPIES)
        ]
        C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        split = (torch, bm, bn, parts) if parts > 1 else None
        row = []
        for traced in (False, True):
            kernel = etc.runtime.load(artifacts / (f"{name}_traced" if traced else name))
            launch = dense_launch(kernel, M, N, As, Ws, C, split)
            launch(0)
            kernel.check()
            want = As[0].float() @ Ws[0].float().T
            err = ((C.float() - want).abs().max() / want.abs().max()).item()
            if not err <= 1e-2:
                raise SystemExit(f"{name}: wrong result (rel err {err:.3g})")
            if not traced:
                row.append(gpu_timed(torch, launch, COPIES, reps))
                continue
            for i in range(3):
                launch(i)
            kernel.check()
            ev = kernel.trace().events()
            starts = np.array([e["start_ns"] for e in ev], np.float64)
            ends = np.array([e["end_ns"] for e in ev], np.float64)
            dur = (ends - starts) / 1e3
            row += [
                (ends.max() - starts.min()) / 1e3, float(np.median(dur)), float(dur.max()),
                (starts.max() - starts.min()) / 1e3, len(ev),
            ]  # fmt: skip
        gpu, span, med, longest, spread, n = row
        line = (
            f"{name:24s} {M}x{N}x{K}: GPU time {gpu:6.2f} us, traced span {span:6.2f}, "
            f"{n} instances: median {med:6.2f} max {longest:6.2f}, starts spread {spread:5.2f}; "
            f"outside the span {gpu - span:5.2f} us"
        )
        print(line, flush=True)
        lines.append(line)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemm_trace.txt").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=10)


if __name__ == "__main__":
    sys.exit(main())

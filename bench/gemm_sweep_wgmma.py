"""The dense wgmma GEMM tile (etc.tiles.gemm_tc, core="wgmma", sm_90a) over tile
configurations, against torch.matmul (cuBLAS), on the tensor-parallel GEMM shapes.

    python bench/gemm_sweep_wgmma.py --build DIR          # CPU: compile every config
    python bench/gemm_sweep_wgmma.py --artifacts DIR --out OUT   # GPU: check, time

Method: C = A @ B^T, bf16 in, fp32 accumulation, bf16 out; shapes (M, N, K): 8192^3
and the per-rank GEMMs of the 2-GPU Table 4 cases (GEMM + RS: 8192 x H x I/2; AG +
GEMM: 8192 x I/2 x H). Each config is a one-task ETC graph (static schedule) launched
eagerly; A and B rotate over enough copies to exceed L2. Checked against a float32
torch product (max |err| / max |ref| <= 1e-2) first; times are GPU time (a sleep kernel
hides the host), medians of REPS repetitions of CALLS back-to-back calls.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._gemm_common import (  # noqa: E402
    dense_graph,
    dense_launch,
    measure_variant,
    save_sweep,
    sweep_shapes,
)
from bench.timing import two_step_main  # noqa: E402

# name: (block_m, block_n, stages, inflight, block_k, copies after the MMAs)
CONFIGS = {
    "128x128s3": (128, 128, 3, 0, 32, False),
    "256x128s4i1": (256, 128, 4, 1, 32, False),
    "128x128k64s3": (128, 128, 3, 0, 64, False),
    "128x128k64s3late": (128, 128, 3, 0, 64, True),
    "128x128k64s4late": (128, 128, 4, 0, 64, True),
    "256x128k64s3": (256, 128, 3, 0, 64, False),
    "256x128k64s4i1": (256, 128, 4, 1, 64, False),
    "256x128k64s3late": (256, 128, 3, 0, 64, True),
    "128x256k64s3i1": (128, 256, 3, 1, 64, False),
}
SHAPES = [(8192, 8192, 8192), (8192, 4096, 6144), (8192, 6144, 4096), (8192, 5120, 12800)]
SMEM = 220 * 1024
WORKING_SET = 160 << 20


def name(config: str, k: int) -> str:
    return f"wgmma_{config}_k{k}"


def build(out: Path) -> None:
    import etc
    from etc.tiles import gemm_tc as G

    for config, (bm, bn, stages, inflight, bk, late) in CONFIGS.items():
        for k in sorted({s[2] for s in SHAPES}):
            tile = G.gemm(
                bm, bn, k, stages=stages, core="wgmma", inflight=inflight,
                block_size=128 * bm // 64, smem_limit=SMEM, block_k=bk, copies_after_mma=late,
            )  # fmt: skip
            graph = dense_graph(f"wgmma_{bm}x{bn}", tile, k, bm, bn)
            etc.compile(graph, target="sm_90a").save(out / name(config, k))
            print("built", name(config, k))


def run(artifacts: Path, out: Path | None, reps: int) -> dict:
    import torch

    import etc.runtime

    rows = []
    for row, As, Ws, C, copies in sweep_shapes(torch, SHAPES, WORKING_SET, reps):
        M, N, K = row["M"], row["N"], row["K"]
        for config in CONFIGS:
            kernel = etc.runtime.load(artifacts / name(config, K))
            launch = dense_launch(kernel, M, N, As, Ws, C)
            measure_variant(
                torch, row, config, kernel, launch, C,
                lambda i, As=As, Ws=Ws: As[i].float() @ Ws[i].float().T, copies, reps,
            )  # fmt: skip
        print(
            f"{M}x{N}x{K}: "
            + ", ".join(f"{k} {v:.0f}" for k, v in row["tflops"].items())
            + " TFLOP/s"
        )
        rows.append(row)
    return save_sweep(torch, __doc__, rows, out, "gemm_sweep_wgmma.json", configs=CONFIGS)


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=10)


if __name__ == "__main__":
    sys.exit(main())

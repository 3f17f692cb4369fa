"""TMA-fed wgmma GEMM tiles (etc.tiles.gemm_tc, core="tma", sm_90a) against torch.matmul
(cuBLAS), on the MoE layer's GEMM shapes and the dense tensor-parallel ones.

    python bench/gemm_tma.py --build DIR                  # CPU: compile every config
    python bench/gemm_tma.py --artifacts DIR --out OUT    # GPU: check, then time

Method: C = A @ B^T, bf16 in, fp32 accumulation, bf16 out. Shapes (M, N, K): the
Qwen3-30B-A3B expert GEMMs (gate/up N = 2 x 768, K = 2048; down N = 2048, K = 768) for
M = 1024, 4096, 8192 rows, 8192^3, and the per-rank GEMMs of the 2-GPU tensor-parallel
cases. Variants: the dense tile in each TMA configuration, the previous best dense
wgmma tile (cp.async ring, 64-wide k-tiles, 3 stages), and on the MoE shapes the MoE
tiles themselves (`moe_gate_up` with its SwiGLU epilogue, `moe_down`; one expert holding
all M rows) on TMA. Each is a one-task ETC graph (static schedule) launched eagerly; A
and B rotate over enough copies to exceed L2. Every variant is checked against a
float32 torch product first (max |err| / max |ref| <= 1e-2; a wrong one is reported and
not timed); times are GPU time (a sleep kernel hides the host), medians of REPS
repetitions of back-to-back calls over all copies.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._gemm_common import (  # noqa: E402
    dense_graph,
    dense_launch,
    measure_variant,
    moe_graph,
    moe_launch,
    save_sweep,
    sweep_shapes,
    swiglu,
)
from bench.timing import two_step_main  # noqa: E402

HIDDEN, INTER = 2048, 768
# name: (block_m, block_n, stages, min CTAs per SM or None, output staged
# through shared memory[, parts of k meeting in the tile[, refill[, meet_share]]]); core
# "tma" unless the name starts with "wg" (the cp.async-ring wgmma tile, 64-wide
# k-tiles). "d": direct 4-byte stores; "k2": two parts of k; "t": refill="test",
# "w": refill="wait" (the default) under another name.
CONFIGS = {
    "wg128x128s3": (128, 128, 3, 2, False),
    "tma128x128s4": (128, 128, 4, None, True),
    "tma128x128s4d": (128, 128, 4, None, False),
    "tma128x256s4": (128, 256, 4, None, True),
    "tma128x256s4d": (128, 256, 4, None, False),
    "tma256x128s4": (256, 128, 4, None, True),
    "tma128x128s3o2": (128, 128, 3, 2, True),
    # One wave at M = 1024: 128 x 96 blocks give 8 x 16 = 128 blocks for
    # 1536 columns; 128 x 64 with two CTAs per SM, 256 for 2048.
    "tma128x96s4": (128, 96, 4, None, True),
    "tma128x64s4o2": (128, 64, 4, 2, True),
    # Split-K for the grids under a wave (M = 1024: 48-96 blocks of 128 x
    # 128..256 for 132 SMs), and 128 x 192 (M = 4096 gate/up: 256 blocks, two
    # waves of 132 SMs where 128 x 256 gives 1.45).
    "tma128x192s4": (128, 192, 4, None, True),
    "tma128x192s4k2": (128, 192, 4, None, True, 2),
    "tma128x256s4k2": (128, 256, 4, None, True, 2),
    "tma128x128s4k2": (128, 128, 4, None, True, 2),
    "tma128x256s4k3": (128, 256, 4, None, True, 3),
    "tma128x128s4k4": (128, 128, 4, None, True, 4),
    # Deeper rings: whether a block's k loop waits on its loads' latency (a
    # block of 24 on an idle GPU ran its k-tiles no faster than 128 at once).
    "tma128x128s5": (128, 128, 5, None, True),
    "tma128x128s6": (128, 128, 6, None, True),
    "tma128x192s5": (128, 192, 5, None, True),
    "tma128x128s6k2": (128, 128, 6, None, True, 2),
    # Stages refilled when free (refill="test": thread 0 tests the empty
    # barrier instead of holding its warp until the others release it).
    "tma128x128s4t": (128, 128, 4, None, True, 1, "test"),
    "tma128x192s4t": (128, 192, 4, None, True, 1, "test"),
    "tma128x256s4t": (128, 256, 4, None, True, 1, "test"),
    "tma128x192s4k2t": (128, 192, 4, None, True, 2, "test"),
    # ... and "wait" named (the default): a run's noise between twins.
    "tma128x128s4w": (128, 128, 4, None, True, 1, "wait"),
    "tma128x192s4w": (128, 192, 4, None, True, 1, "wait"),
    "tma128x256s4w": (128, 256, 4, None, True, 1, "wait"),
    # One warpgroup of 64 rows per CTA with 256 (or 192) columns: the wide
    # wgmma (~85 % of peak against ~58 % at 128 columns, item 114) and twice
    # the blocks of 128 x 256 (96 at M = 1024 gate/up, 128 for down).
    "tma64x256s4": (64, 256, 4, None, True),
    "tma64x256s2o2": (64, 256, 2, 2, True),
    "tma64x192s4": (64, 192, 4, None, True),
    # Session 35: the split-K meeting shared by the block's last parts to
    # arrive (meet_share: each adds and stores its share of the block; pair
    # stores from the registers instead of the staged block).
    "tma128x192s4k2sh2": (128, 192, 4, None, True, 2, "wait", 2),
    "tma128x256s4k2sh2": (128, 256, 4, None, True, 2, "wait", 2),
    "tma128x128s4k4sh4": (128, 128, 4, None, True, 4, "wait", 4),
    "tma128x192s4k2d": (128, 192, 4, None, False, 2),
}
# MoE tiles on TMA: name: (shape, block_m, block_n of the output, stages, min
# CTAs, staged output).
MOE_CONFIGS = {
    "moe_gu_128x64s4": ("gate_up", 128, 64, 4, None, True),
    "moe_gu_128x128s4": ("gate_up", 128, 128, 4, None, True),
    "moe_gu_128x128s4d": ("gate_up", 128, 128, 4, None, False),
    "moe_dn_128x128s4": ("down", 128, 128, 4, None, True),
    "moe_dn_128x256s4": ("down", 128, 256, 4, None, True),
    "moe_dn_128x256s4d": ("down", 128, 256, 4, None, False),
    "moe_gu_128x48s4": ("gate_up", 128, 48, 4, None, True),
    "moe_dn_128x64s4o2": ("down", 128, 64, 4, 2, True),
}
# BENCH_GEMM_CONFIGS=a,b and BENCH_GEMM_M=1024 (build and run) narrow the sweep;
# BENCH_GEMM_SHAPES (below) replaces its shapes.
if os.environ.get("BENCH_GEMM_CONFIGS"):
    _keep = os.environ["BENCH_GEMM_CONFIGS"].split(",")
    CONFIGS = {k: v for k, v in CONFIGS.items() if k in _keep}
    MOE_CONFIGS = {k: v for k, v in MOE_CONFIGS.items() if k in _keep}
MOE_SHAPES = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
SHAPES = [
    *((M, 2 * INTER, HIDDEN) for M in (1024, 4096, 8192)),
    *((M, HIDDEN, INTER) for M in (1024, 4096, 8192)),
    (8192, 8192, 8192),
    (8192, 4096, 6144),
    (8192, 6144, 4096),
    (8192, 5120, 12800),
]
if os.environ.get("BENCH_GEMM_M"):
    SHAPES = [s for s in SHAPES if s[0] == int(os.environ["BENCH_GEMM_M"])]
# BENCH_GEMM_SHAPES=8192x4096x7168,... (M x N x K): these shapes instead.
if os.environ.get("BENCH_GEMM_SHAPES"):
    SHAPES = [
        tuple(int(d) for d in shape.split("x"))
        for shape in os.environ["BENCH_GEMM_SHAPES"].split(",")
    ]
SMEM = 220 * 1024
WORKING_SET = 160 << 20


def name(config: str, k: int) -> str:
    return f"{config}_k{k}"


def _options(min_ctas: int | None) -> dict:
    return {"target": "sm_90a", **({"min_ctas_per_sm": min_ctas} if min_ctas else {})}


def build(out: Path) -> None:
    import etc
    from etc.tiles import gemm_tc as G

    for config, (bm, bn, stages, occ, staged, *more) in CONFIGS.items():  # more: parts, refill
        core = "wgmma" if config.startswith("wg") else "tma"
        extra = {"block_k": 64} if core == "wgmma" else {"stage_output": staged}
        parts = more[0] if more else 1
        if len(more) > 1:
            extra["refill"] = more[1]
        if len(more) > 2:
            extra["meet_share"] = more[2]
        for k in sorted({s[2] for s in SHAPES}):
            if k % (parts * 64):
                continue
            tile = G.gemm(
                bm, bn, k, stages=stages, core=core, block_size=2 * bm, smem_limit=SMEM,
                k_splits=parts, **extra,
            )  # fmt: skip
            graph = dense_graph(f"g_{config}", tile, k, bm, bn)
            etc.compile(graph, **_options(occ)).save(out / name(config, k))
            print("built", name(config, k))
    for config, (shape, bm, bn, stages, occ, staged) in MOE_CONFIGS.items():
        graph = moe_graph(
            config, shape, G, bm, bn, HIDDEN, INTER, stages=stages, core="tma",
            block_size=2 * bm, smem_limit=SMEM, stage_output=staged,
        )  # fmt: skip
        etc.compile(graph, **_options(occ)).save(out / config)
        print("built", config)


def run(artifacts: Path, out: Path | None, reps: int) -> dict:
    import torch

    import etc.runtime

    rows = []
    for row, As, Ws, C, copies in sweep_shapes(torch, SHAPES, WORKING_SET, reps):
        M, N, K = row["M"], row["N"], row["K"]

        def ref(i, As=As, Ws=Ws):
            return As[i].float() @ Ws[i].float().T

        def measure(variant, kernel, launch, out_tensor, want, row=row, copies=copies):
            measure_variant(torch, row, variant, kernel, launch, out_tensor, want, copies, reps)

        for config, (bm, bn, _, _, _, *more) in CONFIGS.items():
            if not (artifacts / name(config, K)).exists():  # K does not split into its parts
                continue
            kernel = etc.runtime.load(artifacts / name(config, K))
            meet = (torch, bm, bn, more[0]) if more and more[0] > 1 else None
            measure(config, kernel, dense_launch(kernel, M, N, As, Ws, C, meet), C, ref)
        for config, (shape, bm, bn, *_) in MOE_CONFIGS.items():
            if MOE_SHAPES[shape] != (N, K):
                continue
            kernel = etc.runtime.load(artifacts / config)
            n_total = INTER if shape == "gate_up" else HIDDEN
            launch, Y = moe_launch(torch, kernel, shape, M, bm, bn, n_total, As, Ws)

            def want(i, shape=shape):
                return swiglu(torch, ref(i), INTER) if shape == "gate_up" else ref(i)

            measure(config, kernel, launch, Y, want)
        best = max((v for k, v in row["tflops"].items() if k != "cublas"), default=0.0)
        row["best_over_cublas"] = best / row["tflops"]["cublas"]
        print(
            f"{M}x{N}x{K}: "
            + ", ".join(f"{k} {v:.0f}" for k, v in row["tflops"].items())
            + f" TFLOP/s; best/cuBLAS {row['best_over_cublas']:.2f}",
            flush=True,
        )
        rows.append(row)
    return save_sweep(
        torch, __doc__, rows, out, "gemm_tma.json", configs=CONFIGS, moe_configs=MOE_CONFIGS
    )


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=10)


if __name__ == "__main__":
    sys.exit(main())

"""One decoder projection alone: the decode GEMM cores' streaming rate (issue 7).

    python bench/decode_gemm.py --build DIR                  # CPU: one artifact per variant
    python bench/decode_gemm.py --artifacts DIR --out OUT    # GPU: check, then time

Each variant is one ``etc.tiles.gemm.layer_gemm`` task over the whole weight
of one Llama-3.2-1B projection (gate/up: 2 x 8192 x 2048, SwiGLU; down: 2048
x 8192, residual), as a one-task graph with the batch ``B`` a symbol. On the
GPU, for B in BATCHES: the output against PyTorch (bf16 matmul, same
epilogue), then the median time of REPS x CALLS back-to-back launches, and
the weight bytes over that time against the device's copy bandwidth (2 GiB
copy, same run). This isolates a core's streaming from the model's stage
boundaries.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import timed, two_step_main  # noqa: E402

H, INTER, VOCAB = 2048, 8192, 128256
SYNC = dict(stages=4, unroll=2, rotate_k=True)
# name -> (projection, block_m, block_n, layer_gemm options).
VARIANTS = {
    "gu_sync": ("gate_up", 16, 16, SYNC),
    "gu_bulk_kc512_s2": ("gate_up", 16, 16, dict(core="bulk", kc=512, stages=2)),
    "down_sync": ("down", 16, 8, SYNC),
    "down_bulk": ("down", 16, 8, dict(core="bulk", rotate_k=True)),
    "lm_sync": ("lm_head", 16, 64, SYNC),
    "lm_sync_bn32_s6": ("lm_head", 16, 32, dict(stages=6, unroll=2, rotate_k=True)),
    "lm_sync_bn16_s6": ("lm_head", 16, 16, dict(stages=6, unroll=2, rotate_k=True)),
    "lm_bulk": ("lm_head", 16, 64, dict(core="bulk", rotate_k=True)),
}
# The large-batch kernel's cores (TMA + wgmma, 64-row blocks, split-K; the
# decoder's settings, and wider/narrower splits and k rotated by column block).
TMA = dict(core="tma", prefetch_ring=True)
VARIANTS.update(
    {
        "qkv_tma_bn64_s4": ("qkv", 64, 64, dict(TMA, k_splits=4)),
        "qkv_tma_bn64_s4_rot": ("qkv", 64, 64, dict(TMA, k_splits=4, rotate_k=True)),
        "qkv_tma_bn128_s4": ("qkv", 64, 128, dict(TMA, k_splits=4)),
        "qkv_tma_bn64_s2": ("qkv", 64, 64, dict(TMA, k_splits=2)),
        "gu_tma_bn32": ("gate_up", 64, 32, dict(TMA)),
        "gu_tma_bn32_rot": ("gate_up", 64, 32, dict(TMA, rotate_k=True)),
        "gu_tma_bn32_s6": ("gate_up", 64, 32, dict(TMA, stages=6)),
        "down_tma_bn64_s8": ("down", 64, 64, dict(TMA, k_splits=8)),
        "down_tma_bn64_s8_rot": ("down", 64, 64, dict(TMA, k_splits=8, rotate_k=True)),
        "down_tma_bn128_s8": ("down", 64, 128, dict(TMA, k_splits=8)),
        "down_tma_bn64_s4": ("down", 64, 64, dict(TMA, k_splits=4)),
    }
)
# Session 35: the large kernel's four projections as it runs them (64-column
# blocks, the parts meeting in fragment order, down's sums shared by 2), for
# Nsight Compute at B = 64: what bounds a stage's instances.
FRAG = dict(TMA, meeting="fragments")
VARIANTS.update(
    {
        "qkv_tma_frag_s4": ("qkv", 64, 64, dict(FRAG, k_splits=4)),
        "o_tma_frag_s4": ("o_proj", 64, 64, dict(FRAG, k_splits=4)),
        "gu_tma_frag_s2": ("gate_up", 64, 64, dict(FRAG, k_splits=2)),
        "down_tma_frag_s8_sh2": ("down", 64, 64, dict(FRAG, k_splits=8, meet_share=2)),
    }
)
BATCHES = (1, 16)
#: ``GEMM_VARIANTS=a,b`` and ``GEMM_BATCHES=32,64`` pick a subset.
if os.environ.get("GEMM_VARIANTS"):
    VARIANTS = {k: VARIANTS[k] for k in os.environ["GEMM_VARIANTS"].split(",")}
if os.environ.get("GEMM_BATCHES"):
    BATCHES = tuple(int(b) for b in os.environ["GEMM_BATCHES"].split(","))
CALLS = 20


def shapes(projection: str) -> tuple[str, int, int, int]:
    """(epilogue, n, k, weight rows)."""
    if projection == "gate_up":
        return "swiglu", INTER, H, 2 * INTER
    if projection == "qkv":
        return "store", 3072, H, 3072
    if projection == "o_proj":
        return "residual", H, H, H
    if projection == "lm_head":
        return "store", VOCAB, H, VOCAB
    return "residual", H, INTER, H


def graph(name: str):
    import etc
    from etc.tiles.gemm import layer_gemm

    projection, bm, bn, options = VARIANTS[name]
    epilogue, n, k, rows = shapes(projection)
    g = etc.Graph(name)
    B, NL = g.symbol("B"), g.symbol("NL")
    A = g.tensor("A", (B, k), "bf16")
    W = g.tensor("W", (2, rows, k), "bf16")
    C = g.tensor("C", (B, n), "bf16")
    grid = (n // bn, (B + bm - 1) // bm)
    parts = options.get("k_splits", 1)
    if parts == 1:
        tile = layer_gemm(
            bm, bn, n, k, layers=2, epilogue=epilogue, name=projection, columns_first=True,
            **options,
        )  # fmt: skip
        g.task(tile, grid=(NL, *grid), args=(A, W, C))
        return g
    # Split-K parts meet on per-block counters and a workspace that a layer's
    # blocks share: the second layer (a task of its own, on ``W1[0]``) gets
    # its own counter row and workspace, so the two run independently.
    cnt = g.tensor("cnt", (2, 4096), "i32")  # zero between launches
    for layer, (weights, tiles) in enumerate(
        ((W, 1), (g.tensor("W1", (2, rows, k), "bf16"), NL - 1))
    ):
        tile = layer_gemm(
            bm, bn, n, k, layers=2, epilogue=epilogue, name=f"{projection}{layer}",
            columns_first=True, counter_row=layer, **options,
        )  # fmt: skip
        P = g.tensor(f"P{layer}", (parts * B, rows), "f32")
        g.task(tile, grid=(tiles, *grid, parts), args=(A, weights, C, P, cnt))
    return g


def build(out: Path) -> None:
    import etc

    for name in VARIANTS:
        tma = VARIANTS[name][3].get("core") == "tma"
        # As the decoder's kernels: two CTAs per SM; TMA and wgmma need sm_90a.
        options = {"min_ctas_per_sm": 2, **({"target": "sm_90a"} if tma else {})}
        etc.compile(graph(name), schedule="static", **options).save(out / name)
        print("built", name, flush=True)


def run(artifacts: Path, out: Path | None, reps: int) -> None:
    import torch

    import etc.runtime
    from bench.splitk import copy_bandwidth

    copy_bps = copy_bandwidth(torch, reps)
    print(f"copy bandwidth {copy_bps / 1e12:.2f} TB/s", flush=True)
    rows_out = []
    baselines = {}
    for name, (projection, _, _, options) in VARIANTS.items():
        epilogue, n, k, wrows = shapes(projection)
        kernel = etc.runtime.load(artifacts / name)
        W = (torch.randn(2, wrows, k, device="cuda") * 0.02).to(torch.bfloat16)
        parts = options.get("k_splits", 1)
        for B in BATCHES:
            if (projection, B) not in baselines:  # cuBLAS on the same shape
                A0 = torch.randn(B, k, device="cuda").to(torch.bfloat16)
                t_us = timed(torch, lambda i, a=A0, w=W[0]: a @ w.T, CALLS, reps)
                baselines[projection, B] = t_us
                rows_out.append(
                    {"variant": "torch.matmul", "projection": projection, "B": B, "us_1": t_us,
                     "TBps": W[0].numel() * 2 / (t_us * 1e-6) / 1e12}
                )  # fmt: skip
                print(
                    f"{'torch.matmul ' + projection:22s} B={B:3d} {t_us:7.1f} us: "
                    f"{W[0].numel() * 2 / (t_us * 1e-6) / 1e12:5.2f} TB/s",
                    flush=True,
                )
            A = torch.randn(B, k, device="cuda").to(torch.bfloat16)
            C0 = torch.randn(B, n, device="cuda").to(torch.bfloat16)
            C = C0.clone()
            bufs = {"A": A, "W": W, "C": C}
            if parts > 1:
                bufs["W1"] = (torch.randn(2, wrows, k, device="cuda") * 0.02).to(torch.bfloat16)
                for layer in range(2):
                    bufs[f"P{layer}"] = torch.zeros(parts * B, wrows, device="cuda")
                bufs["cnt"] = torch.zeros(2, 4096, dtype=torch.int32, device="cuda")
            kernel.launch(bufs, {"B": B, "NL": 1})
            kernel.check()
            acc = (A.float() @ W[0].float().T).to(torch.bfloat16).float()
            if epilogue == "swiglu":
                g, u = acc[:, :n], acc[:, n:]
                want = torch.nn.functional.silu(g).to(torch.bfloat16).float() * u
            elif epilogue == "residual":
                want = acc + C0.float()
            else:
                want = acc
            err = float((C.float() - want).norm() / want.norm())
            us = {}
            for nl in (1, 2):
                syms = {"B": B, "NL": nl}
                us[nl] = timed(
                    torch,
                    lambda i, k=kernel, b=bufs, s=syms: k.launch(b, s, sync=False),
                    CALLS,
                    reps,
                )
            # One more layer's weights: the streaming rate without the launch.
            marginal = us[2] - us[1]
            tbps = W[0].numel() * 2 / (marginal * 1e-6) / 1e12
            rows_out.append(
                {"variant": name, "B": B, "us_1": us[1], "us_2": us[2], "marginal_us": marginal,
                 "TBps": tbps, "of_copy": tbps * 1e12 / copy_bps, "rel_err": err}
            )  # fmt: skip
            print(
                f"{name:22s} B={B:3d} 1 layer {us[1]:7.1f} us, 2 layers {us[2]:7.1f} us: "
                f"{tbps:5.2f} TB/s ({100 * tbps * 1e12 / copy_bps:4.1f}% of copy)  rel err {err:.1e}",
                flush=True,
            )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode_gemm.json").write_text(
            json.dumps({"copy_TBps": copy_bps / 1e12, "rows": rows_out}, indent=1)
        )


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=7)


if __name__ == "__main__":
    raise SystemExit(main())

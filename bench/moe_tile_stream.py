"""The MoE slot tiles alone at T = 1: each GEMM task's own kernel (the
unfused path's one-task graph) timed by itself, so a tile's weight stream is
seen without the layer's routing and hops, next to the same bytes streamed
by ``bench/stream_ceiling.cu`` (bench/RESULTS.md, MoE, twenty-sixth session).

    python bench/moe_tile_stream.py --build DIR        # CPU: compile the kernels
    python bench/moe_tile_stream.py --artifacts DIR    # GPU: check, then time

Each call reads the experts of the next of 8 routings (different tokens), so
the 50 MB L2 does not serve one call from the last; GPU time (``bench.timing``:
a sleep kernel ahead, medians of 15 x 16 calls), checked first against float32
torch (gate/up: the slots' ``Hb`` rows; down: their ``Yp`` rows).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import gpu_timed, two_step_main  # noqa: E402
from etc.models import moe as M  # noqa: E402

_DOWN = (("warps", (1, 4, 2)), ("stages", 4), ("unroll", 2), ("rotate_k", True))


def _variant(gate_up: tuple, down: tuple = _DOWN, chunk: int = 0) -> dict:
    extra = (("weight_chunk", chunk),) if chunk else ()
    return dict(
        M.SLOT_MMA_PRESETS["few"],
        gate_up_options=(*gate_up, ("rotate_k", True), *extra),
        down_options=(*down, *extra),
    )


#: The ``few`` preset's slot tiles (experts from ``topk_ids``) with other
#: weight rings: (stages, unroll) of the gate/up tile, and chunked weights.
VARIANTS = {
    "s4u2": _variant((("stages", 4), ("unroll", 2))),
    "s3u2": _variant((("stages", 3), ("unroll", 2))),
    "s4u1": _variant((("stages", 4), ("unroll", 1))),
    "s6u1": _variant((("stages", 6), ("unroll", 1))),
    "s2u4": _variant((("stages", 2), ("unroll", 4))),
    "s4u2_ch32": _variant((("stages", 4), ("unroll", 2)), chunk=32),
    "s3u2_ch32": _variant((("stages", 3), ("unroll", 2)), chunk=32),
    "s4u1_ch32": _variant((("stages", 4), ("unroll", 1)), chunk=32),
    # ... with the activations loaded one or two groups ahead (a_ahead), and
    # with other warp layouts (rows x columns x k slices).
    "s4u2_a1": _variant((("stages", 4), ("unroll", 2), ("a_ahead", 1))),
    "s4u2_a2": _variant((("stages", 4), ("unroll", 2), ("a_ahead", 2))),
    "s4u2_ch32_a1": _variant((("stages", 4), ("unroll", 2), ("a_ahead", 1)), chunk=32),
    "s4u2_w124": _variant((("stages", 4), ("unroll", 2), ("warps", (1, 2, 4)))),
    "s4u1_w118": _variant((("stages", 4), ("unroll", 1), ("warps", (1, 1, 8)))),
    # The CUDA-core GEMV slot tiles (etc.tiles.gemv), 4 and 8 ring slots.
    "gemv_s4": dict(
        M.PRESETS["few"],
        gemm="gemv",
        gate_up_options=(("stages", 4),),
        down_options=(("stages", 4),),
    ),
    "gemv_s8": dict(
        M.PRESETS["few"],
        gemm="gemv",
        gate_up_options=(("stages", 8),),
        down_options=(("stages", 8),),
    ),
}
if os.environ.get("BENCH_TILE_VARIANTS"):
    VARIANTS = {k: VARIANTS[k] for k in os.environ["BENCH_TILE_VARIANTS"].split(",")}
TASKS = ("gate_up", "down")
ROUTINGS = 8


def build(out: Path) -> None:
    import etc

    for key, fields in VARIANTS.items():
        cfg = M.MoEConfig(**fields)
        for task, g in M.build_unfused_graphs(cfg, prefix=f"tile_{key}"):
            if task in TASKS:
                art = etc.compile(g, schedule="static", target="sm_90", min_ctas_per_sm=2)
                art.save(out / f"{key}_{task}")
                print("built", key, task)


def run(artifacts: Path, out: Path | None, reps: int) -> None:
    import torch
    import torch.nn.functional as F

    import etc.runtime

    cfg0 = M.MoEConfig(**next(iter(VARIANTS.values())))
    W = M.random_weights_torch(cfg0, seed=0)
    K, inter = cfg0.topk, cfg0.inter
    routes = []  # (topk_ids, x, Hb reference, Yp reference) per routing
    for r in range(ROUTINGS):
        x = M.random_tokens_torch(cfg0, 1, seed=r)
        _, ids, _ = M.reference_moe_torch(x, W["Wr"], W["Wgu"], W["Wd"], K)
        ids = ids.to(torch.int32)
        hb, yp = [], []
        for k in range(K):
            wgu = W["Wgu"][int(ids[0, k])].float()
            g, u = x.float() @ wgu[:inter].t(), x.float() @ wgu[inter:].t()
            h = (F.silu(g) * u).to(torch.bfloat16)
            hb.append(h)
            yp.append(h.float() @ W["Wd"][int(ids[0, k])].float().t())
        routes.append((ids, x, torch.cat(hb), torch.cat(yp)))
    gu_bytes = K * W["Wgu"][0].numel() * 2
    dn_bytes = K * W["Wd"][0].numel() * 2
    lines = []
    for key, fields in VARIANTS.items():
        cfg = M.MoEConfig(**fields)
        bufs = M.torch_inputs(cfg, 1, W)
        per_route = [
            dict(bufs, topk_ids=ids.contiguous(), X=x, Hb=hb.clone()) for ids, x, hb, _ in routes
        ]
        for task in TASKS:
            kernel = etc.runtime.load(artifacts / f"{key}_{task}")
            names = {p.name for p in kernel.manifest.inputs}
            mine = [{n: b[n] for n in names} for b in per_route]
            ids, _, hb, yp = routes[0]
            first = per_route[0]
            first["Hb"].copy_(hb if task == "down" else torch.zeros_like(hb))
            first["Yp"].zero_()
            kernel.launch(mine[0], {"T": 1})
            got, want = (first["Hb"], hb) if task == "gate_up" else (first["Yp"], yp)
            err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
            us = gpu_timed(
                torch,
                lambda i, k=kernel, m=mine: k.launch(m[i % ROUTINGS], {"T": 1}, sync=False),
                2 * ROUTINGS,
                reps,
            )
            nbytes = gu_bytes if task == "gate_up" else dn_bytes
            line = (
                f"{key:10s} {task:8s} {us:7.2f} us  {nbytes / us / 1e6:5.2f} TB/s  "
                f"(rel err {err:.2g}{', WRONG' if err > 1e-2 else ''})"
            )
            print(line, flush=True)
            lines.append(line)
    if out is not None:
        out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(two_step_main(__doc__.splitlines()[0], build, run, sys.argv[1:], reps=15))

"""The MoE layer's expert GEMMs as the layer runs them (E experts, each with its
own rows and weights): ETC's grouped tiles against torch.matmul (cuBLAS) on the
same shapes.

    python bench/gemm_grouped.py --build DIR                  # CPU: compile the tiles
    python bench/gemm_grouped.py --artifacts DIR --out OUT    # GPU: check, then time

Method: Qwen3-30B-A3B's experts (E = 128, hidden 2048, inter 768), bf16 in, fp32
accumulation, bf16 out. Gate/up: ``Hb = silu(Xp @ Wg[e]^T) * (Xp @ Wu[e]^T)`` (ETC's
tile has the SwiGLU in its epilogue); down: ``Yp = Hb @ Wd[e]^T``. The rows are token
slots sorted by expert (``row_off``): ``M_e`` rows for every expert (the uniform case;
``M_e = 8 T / 128`` for T routed tokens) or the counts of a random top-8 routing of T
tokens (ragged). ETC: the MoE presets' tiles (``prefill``: 128-row TMA blocks, gate/up
128 and down 256 columns, refill "test"; ``prefill_large``: down 512 columns in two
passes through one ring; ``mid``: 64-row blocks, the columns split between two
warpgroups, dealt by ticket), each as a task triggered per expert over
its ``indptr`` range (one launch, static schedule); the tables are made on the host.
Baselines in the same run: ``torch.matmul`` of the ``(E, M_e, K)`` rows by the
``(E, K, N)`` weights (one cuBLAS strided-batched GEMM; uniform only), the same plus
the SwiGLU for gate/up, and ``torch._grouped_mm`` with the group offsets (uniform and
ragged). Every variant is checked first against a float32 torch product (max |err| /
max |ref| <= 1e-2; a wrong one is reported and not timed); weights and rows rotate
over copies past L2; times are GPU time (a sleep kernel hides the host), medians of
REPS repetitions; TFLOP/s count ``2 * rows * N * K`` with N the GEMM's full width
(1536 for gate/up). ETC / cuBLAS is against the GEMM alone (the SwiGLU not counted
in cuBLAS's time).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._gemm_common import rel_err, save_sweep, swiglu  # noqa: E402
from bench.timing import two_step_main  # noqa: E402

EXPERTS, HIDDEN, INTER, TOPK = 128, 2048, 768, 8
#: name: (MoE preset, field overrides). "prefill_large": its down tiles of
#: 512 columns in two passes through one ring (session 36). "ring": the prefill tiles twice as
#: wide, each instance's two column passes through one TMA ring (``sub_ring``;
#: 4 stages and a staging buffer of their own, down's in two halves, under a
#: 226 KiB limit), "ring3" with 3 stages (whole staging buffers under 220
#: KiB), "ringd" with 4 stages and direct stores.
_RING = (("sub_ring", True), ("refill", "test"))
VARIANTS = {
    "prefill": ("prefill", {}),
    "prefill_large": ("prefill_large", {}),
    "mid": ("mid", {}),
    "ring": ("prefill", dict(
        block_n_gu=256, block_n_dn=512,
        gate_up_options=(*_RING, ("sub_n", 128), ("smem_limit", 226 << 10)),
        down_options=(*_RING, ("sub_n", 256), ("smem_limit", 226 << 10)),
    )),
    "large1024": ("prefill_large", dict(block_n_dn=1024)),
    "ring3": ("prefill", dict(
        block_n_gu=256, block_n_dn=512,
        gate_up_options=(*_RING, ("sub_n", 128), ("stages", 3)),
        down_options=(*_RING, ("sub_n", 256), ("stages", 3)),
    )),
    "ringd": ("prefill", dict(
        block_n_gu=256, block_n_dn=512,
        gate_up_options=(*_RING, ("sub_n", 128), ("stage_output", False)),
        down_options=(*_RING, ("sub_n", 256), ("stage_output", False)),
    )),
}  # fmt: skip
if os.environ.get("BENCH_GROUPED_VARIANTS"):
    VARIANTS = {k: VARIANTS[k] for k in os.environ["BENCH_GROUPED_VARIANTS"].split(",")}
# (label, rows per expert or None for a routing of T tokens, T)
CASES = [
    ("uniform", 64, 1024),
    ("uniform", 128, 2048),
    ("uniform", 256, 4096),
    ("uniform", 512, 8192),
    ("ragged", None, 1024),
    ("ragged", None, 4096),
]
if os.environ.get("BENCH_GROUPED_T"):
    _keep = {int(t) for t in os.environ["BENCH_GROUPED_T"].split(",")}
    CASES = [c for c in CASES if c[2] in _keep]
COPIES = 2


def _config(variant: str, experts: int = EXPERTS, hidden: int = HIDDEN, inter: int = INTER):
    from etc.models import moe as M

    preset, changes = VARIANTS[variant]
    fields = dict(changes)
    for key in ("gate_up_options", "down_options"):  # on top of the preset's options
        if key in fields:
            fields[key] = (*M.PRESETS[preset][key], *fields[key])
    # The GEMM tiles writing their outputs (no combine inside the down tile).
    return M.preset(
        preset, experts=experts, hidden=hidden, inter=inter, combine="task", combine_dtype="f32",
        **fields,
    )  # fmt: skip


def grouped_graph(shape: str, variant: str, **sizes):
    """One launch of ``variant``'s ``shape`` tile over every expert: a release
    task per expert triggers the expert's ``[indptr[e], indptr[e+1])`` tiles
    (buffers ``X, W, row_off, indptr, Y``; symbols ``m`` rows, ``tiles`` the
    grid's bound)."""
    import etc
    from etc.models.moe import expert_gemm_tiles
    from etc.tiles import moe as moe_tiles

    cfg = _config(variant, **sizes)
    E, H, II = cfg.experts, cfg.hidden, cfg.inter
    tile = expert_gemm_tiles(cfg)[0 if shape == "gate_up" else 1]
    g = etc.Graph(f"grouped_{shape}_{variant}", block_size=cfg.block_size)
    m, tiles = g.symbol("m"), g.symbol("tiles")
    k, n_w, n_y = (H, 2 * II, II) if shape == "gate_up" else (II, H, H)
    X, W = g.tensor("X", (m, k), "bf16"), g.tensor("W", (E, n_w, k), "bf16")
    row_off, indptr = g.tensor("row_off", (E + 1,), "i32"), g.tensor("indptr", (E + 1,), "i32")
    Y = g.tensor("Y", (m, n_y), "bf16")
    ready = g.event((E,), wait_count=1, name="ready")
    g.task(
        moe_tiles.release(E, block_size=cfg.block_size), grid=(E,), args=(row_off,),
        out_edges=[(ready, "e->e")], name="release",
    )  # fmt: skip
    g.task(
        tile, grid=(tiles,), args=(X, W, row_off, indptr, Y), triggered_by=(ready, indptr),
        name=shape, deal=cfg.gemm_deal,
    )  # fmt: skip
    return g


def tables(counts, block_m: int, n_blocks: int):
    """``(row_off, indptr, tiles)`` of per-expert row ``counts`` for tiles of
    ``block_m`` rows and ``n_blocks`` column blocks: the layer's plan tables
    (``etc.tiles.moe.plan_tables``) of rows sorted by expert."""
    import numpy as np

    from etc.tiles.moe import plan_tables

    ids = np.repeat(np.arange(len(counts)), counts)
    plan = plan_tables(ids, block_m, n_blocks, n_blocks, len(counts))
    return plan["row_off"], plan["gu_indptr"], int(plan["gu_indptr"][-1])


def routing_counts(T: int, seed: int):
    """Rows per expert of a random top-8 routing of ``T`` tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = np.argsort(-rng.standard_normal((T, EXPERTS)), axis=1)[:, :TOPK]
    return np.bincount(ids.reshape(-1), minlength=EXPERTS)


def _name(shape: str, variant: str) -> str:
    return f"{shape}_{variant}"


def build(out: Path) -> None:
    import etc
    from etc.models import moe as M

    for variant, (preset, _) in VARIANTS.items():
        for shape in ("gate_up", "down"):
            options = {
                "target": M.PRESET_TARGETS[preset],
                "min_ctas_per_sm": M.PRESET_MIN_CTAS_PER_SM[preset],
            }
            graph = grouped_graph(shape, variant)
            etc.compile(graph, **options).save(out / _name(shape, variant))
            print("built", _name(shape, variant), flush=True)


def _measure(torch, kernels, gmm, counts, shape: str, case: tuple, reps: int) -> dict:
    """One result row: ``shape``'s GEMM over experts with ``counts`` rows
    each, every variant checked against float32 torch first, then timed."""
    import numpy as np

    from bench.timing import gpu_timed

    label, per_expert, T = case
    M_rows = int(counts.sum())
    k, n_w = (HIDDEN, 2 * INTER) if shape == "gate_up" else (INTER, HIDDEN)
    Xs = [torch.randn(M_rows, k, device="cuda").to(torch.bfloat16) for _ in range(COPIES)]
    Ws = [
        (torch.randn(EXPERTS, n_w, k, device="cuda") * k**-0.5).to(torch.bfloat16)
        for _ in range(COPIES)
    ]
    Wts = [w.transpose(1, 2) for w in Ws]
    row_off_np = np.concatenate([[0], np.cumsum(counts)])

    def finish(y):  # the float32 product of the GEMM's full width -> the output
        return swiglu(torch, y, INTER) if shape == "gate_up" else y

    def want(i):
        y = torch.empty(M_rows, n_w, device="cuda")
        for e in range(EXPERTS):
            a, b = int(row_off_np[e]), int(row_off_np[e + 1])
            if b > a:
                y[a:b] = Xs[i][a:b].float() @ Ws[i][e].float().T
        return finish(y)

    wants = [want(i) for i in range(COPIES)]
    flops = 2 * M_rows * n_w * k
    row = {
        "case": label, "T": T, "rows": M_rows, "shape": shape,
        "rows_per_expert": {"min": int(counts.min()), "max": int(counts.max())},
        "us": {}, "tflops": {}, "rel_err": {},
    }  # fmt: skip

    def record(variant, fn, check=None):
        if check is not None:
            err = max(rel_err(check(i), wants[i]) for i in range(COPIES))
            row["rel_err"][variant] = err
            if not err <= 1e-2:
                print(f"{variant}: WRONG (rel err {err:.3g}) at {label} T={T} {shape}")
                return
        us = gpu_timed(torch, fn, COPIES, reps)
        row["us"][variant] = us
        row["tflops"][variant] = flops / us / 1e6

    if per_expert:
        Xbs = [x.view(EXPERTS, per_expert, k) for x in Xs]

        def bmm(i):
            return torch.matmul(Xbs[i % COPIES], Wts[i % COPIES])

        record("cublas", bmm, lambda i: finish(bmm(i).reshape(M_rows, -1)))
        if shape == "gate_up":

            def bmm_act(i):
                y = bmm(i)
                return torch.nn.functional.silu(y[..., :INTER]) * y[..., INTER:]

            record("cublas+swiglu", bmm_act)
    if gmm is not None:
        offs = torch.tensor(row_off_np[1:], dtype=torch.int32, device="cuda")

        def grouped(i):
            return gmm(Xs[i % COPIES], Wts[i % COPIES], offs=offs)

        try:
            record("torch._grouped_mm", grouped, lambda i: finish(grouped(i)))
        except Exception as exc:  # an older torch: report, go on
            row["rel_err"]["torch._grouped_mm"] = repr(exc)
    for variant in VARIANTS:
        _measure_etc(torch, kernels[(shape, variant)], variant, shape, counts, Xs, Ws, record)
    base = row["tflops"].get("cublas") or row["tflops"].get("torch._grouped_mm")
    best = max((v for key, v in row["tflops"].items() if key.startswith("etc")), default=0)
    row["best_etc_over_base"] = best / base if base else None
    print(
        f"{label:7s} T={T:5d} {shape:7s} rows/expert {counts.min()}-{counts.max()}: "
        + ", ".join(f"{key} {v:.1f} us" for key, v in row["us"].items())
        + f"; best ETC / {'cuBLAS' if 'cublas' in row['tflops'] else 'grouped_mm'} "
        + (f"{row['best_etc_over_base']:.2f}" if base else "-"),
        flush=True,
    )
    return row


def _measure_etc(torch, kernel, variant: str, shape: str, counts, Xs, Ws, record) -> None:
    """``record`` the ETC ``kernel`` (a failure is reported, not raised)."""
    cfg = _config(variant)
    M_rows = int(counts.sum())
    n_y = INTER if shape == "gate_up" else HIDDEN
    bn = cfg.block_n_gu if shape == "gate_up" else cfg.block_n_dn
    row_off, indptr, n_tiles = tables(counts, cfg.block_m, n_y // bn)
    Y = torch.empty(M_rows, n_y, device="cuda", dtype=torch.bfloat16)
    fixed = {
        "row_off": torch.from_numpy(row_off).cuda(),
        "indptr": torch.from_numpy(indptr).cuda(),
        "Y": Y,
    }

    def launch(i):
        kernel.launch(
            {"X": Xs[i % COPIES], "W": Ws[i % COPIES], **fixed},
            {"m": M_rows, "tiles": n_tiles},
            sync=False,
        )

    def launched(i):
        Y.fill_(float("nan"))
        launch(i)
        kernel.check()
        return Y.clone()

    try:
        record(f"etc {variant}", launch, launched)
    except Exception as exc:  # report and go on with the others
        print(f"etc {variant}: FAILED on {shape}: {exc}")


def run(artifacts: Path, out: Path | None, reps: int) -> dict:
    import numpy as np
    import torch

    import etc.runtime

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    gmm = getattr(torch, "_grouped_mm", None)
    kernels = {
        (s, p): etc.runtime.load(artifacts / _name(s, p))
        for p in VARIANTS
        for s in ("gate_up", "down")
    }
    rows = []
    for case in CASES:
        _, per_expert, T = case
        counts = np.full(EXPERTS, per_expert) if per_expert else routing_counts(T, seed=T)
        for shape in ("gate_up", "down"):
            rows.append(_measure(torch, kernels, gmm, counts.astype(np.int64), shape, case, reps))
            torch.cuda.empty_cache()
    variants = {k: repr(v) for k, v in VARIANTS.items()}
    return save_sweep(torch, __doc__, rows, out, "gemm_grouped.json", variants=variants)


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=10)


if __name__ == "__main__":
    sys.exit(main())

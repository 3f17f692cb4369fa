"""bf16 tensor-core GEMM tiles (etc.tiles.gemm) on the GPU against torch.matmul (cuBLAS).

Two steps, because the GPU machine has no compiler:

    python bench/gemm.py --build DIR                  # CPU: compile every config
    python bench/gemm.py --artifacts DIR --out OUT    # GPU: check, then time

Method: the MoE layer's GEMM shapes (Qwen3-30B-A3B: hidden 2048, expert
intermediate 768): gate/up N=2*768 K=2048 and down N=2048 K=768, for M in
(1, 16, 64, 256, 1024) rows. Variants: the dense `gemm` tile (C = A @ B^T),
and the MoE tiles `moe_gate_up` (with its SwiGLU epilogue) and `moe_down` on
one expert holding all M rows (grid (tiles, 1), row_off = [0, M]), each a
one-task ETC graph launched eagerly; baselines torch.matmul(A, B.T) (cuBLAS)
and, for gate/up, matmul + silu(g) * u. Inputs are fresh random bf16 values,
A and the weights rotated over enough copies that the working set exceeds
L2 (> 128 MiB), so weights stream from HBM as in decode. Every variant is
checked against float32 torch (relative max error <= 1e-2) before it is
timed. Times are medians of REPS repetitions of CALLS back-to-back calls
between two CUDA events, divided by CALLS, after a warm-up round; "GPU
time" hides the host's launch cost behind a sleep kernel (bench/timing.py).
Results go to OUT/gemm.json.

Bandwidth sweep (`--sweep`, same two steps): decode-shaped MoE tiles over
8 experts' weights (8 x 6.3 MB gate/up, 8 x 3.1 MB down) as one
`moe_gate_up` (or `moe_down`) task covering every n-tile of all 8 experts
with 1 row per expert (like the MoE layer at T=1) and with 16. The 8
experts are laid out as one expert 8x as wide (gate/up: inter 8*768; down:
hidden 8*2048), which reads the same tiles and bytes without the triggered
grid. Variants (SWEEP) differ in BN, warp layout, unroll, register
prefetch and cp.async ring depth; each reports weight bytes / GPU time
against the device copy bandwidth measured in the same run. Results go to
OUT/gemm_sweep.json.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._gemm_common import (  # noqa: E402
    check_and_time,
    checker,
    dense_graph,
    dense_launch,
    moe_graph,
    moe_launch,
    rotated_inputs,
    swiglu,
    time_baselines,
)
from bench.timing import gpu_timed, two_step_main  # noqa: E402

HIDDEN, INTER = 2048, 768
MS = (1, 16, 64, 256, 1024)
# (block_m, block_n of the dense gate/up GEMM, block_n of gate/up (of I), block_n of down)
CONFIGS = {"decode": (16, 64, 32, 64), "prefill": (64, 64, 64, 64)}
SHAPES = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
WORKING_SET = 160 << 20  # bytes of weights rotated over (> L2)


def config_for(M: int) -> str:
    return "decode" if M <= 16 else "prefill"


def build_dense(shape: str, config: str):
    from etc.tiles import gemm as G

    _, k = SHAPES[shape]
    bm, bn = CONFIGS[config][0], CONFIGS[config][1]
    return dense_graph(f"gemm_{shape}_{config}", G.gemm(bm, bn, k), k, bm, bn)


def build_moe(shape: str, config: str):
    """One expert holding all m rows; tile i of expert 0 (the trigger's e)."""
    from etc.tiles import gemm as G

    bm, _, bn_gu, bn_dn = CONFIGS[config]
    bn = bn_gu if shape == "gate_up" else bn_dn
    return moe_graph(f"moe_{shape}_{config}", shape, G, bm, bn, HIDDEN, INTER)


def artifact_name(kind: str, shape: str, config: str) -> str:
    return f"{kind}_{shape}_{config}"


def build(out: Path) -> None:
    import etc

    for shape in SHAPES:
        for config in CONFIGS:
            for kind, make in (("dense", build_dense), ("moe", build_moe)):
                name = artifact_name(kind, shape, config)
                etc.compile(make(shape, config), schedule="static").save(out / name)
                print("built", name)


def bench_case(torch, artifacts: Path, shape: str, M: int, reps: int) -> dict:
    import etc.runtime

    n_out, k = SHAPES[shape]
    config = config_for(M)
    bm, _, bn_gu, bn_dn = CONFIGS[config]
    copies, As, Ws = rotated_inputs(torch, M, n_out, k, WORKING_SET)
    row = {"shape": shape, "M": M, "N": n_out, "K": k, "config": config, "variants": {}}
    flops, bytes_ = 2 * M * n_out * k, n_out * k * 2 + M * k * 2 + M * n_out * 2

    def record(name: str, us: float) -> None:
        row["variants"][name] = us
        print(
            f"{shape:8s} M={M:5d} {name:34s} {us:9.2f} us  "
            f"{bytes_ / us / 1e6:6.2f} TB/s  {flops / us / 1e6:7.1f} TFLOP/s"
        )

    check = checker(row, shape, M, verbose=False)

    def ref(i):
        return As[i].float() @ Ws[i].float().T

    time_baselines(torch, shape, As, Ws, copies, INTER, check, record, reps, eager=True)

    # Dense tile.
    dense = etc.runtime.load(artifacts / artifact_name("dense", shape, config))
    C = torch.empty(M, n_out, device="cuda", dtype=torch.bfloat16)
    launch_dense = dense_launch(dense, M, n_out, As, Ws, C)
    names = ("ETC gemm", "ETC gemm")
    check_and_time(torch, dense, launch_dense, C, ref, names, check, record, copies, reps, False)

    # MoE tile: one expert with all M rows.
    moe = etc.runtime.load(artifacts / artifact_name("moe", shape, config))
    bn, n_total = (bn_gu, INTER) if shape == "gate_up" else (bn_dn, HIDDEN)
    launch_moe, Y = moe_launch(torch, moe, shape, M, bm, bn, n_total, As, Ws)

    def want(i):
        return swiglu(torch, ref(i), INTER) if shape == "gate_up" else ref(i)

    names = ("ETC moe tile", f"ETC moe_{shape}")
    check_and_time(torch, moe, launch_moe, Y, want, names, check, record, copies, reps, False)
    v = row["variants"]
    row["cublas_over_etc_gemm_gpu"] = v["torch.matmul, GPU time"] / v["ETC gemm, GPU time"]
    return row


def run(artifacts: Path, out: Path | None, reps: int) -> dict:
    import torch

    torch.manual_seed(0)
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "method": __doc__.split("Method: ")[1].strip(),
        "configs": {
            k: dict(zip(("block_m", "bn_dense", "bn_gate_up", "bn_down"), v, strict=True))
            for k, v in CONFIGS.items()
        },
        "rows": [],
    }
    for shape in SHAPES:
        for M in MS:
            results["rows"].append(bench_case(torch, artifacts, shape, M, reps))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemm.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


SWEEP_EXPERTS = 8
# name -> (op, block_n, tile kwargs); block_m = 16 (decode), block_size 256.
SWEEP = {
    "gu_bn64_base": ("gate_up", 64, {}),
    "gu_bn16_base": ("gate_up", 16, {}),
    "gu_bn16_u2_pf1": ("gate_up", 16, {"unroll": 2, "prefetch": 1}),
    "gu_bn16_u1_pf2": ("gate_up", 16, {"unroll": 1, "prefetch": 2}),
    "gu_bn16_cp3": ("gate_up", 16, {"unroll": 1, "stages": 3}),
    "gu_bn16_cp4": ("gate_up", 16, {"unroll": 1, "stages": 4}),
    "gu_bn32_cp4": ("gate_up", 32, {"unroll": 1, "stages": 4}),
    "gu_bn8_cp4": ("gate_up", 8, {"unroll": 1, "stages": 4}),
    "dn_bn128_base": ("down", 128, {}),
    "dn_bn64_base": ("down", 64, {}),
    "dn_bn128_u1_pf2": ("down", 128, {"unroll": 1, "prefetch": 2}),
    "dn_bn128_cp4": ("down", 128, {"unroll": 1, "stages": 4}),
    "dn_bn64_cp5": ("down", 64, {"warps": (1, 4, 2), "unroll": 1, "stages": 5}),
    "dn_bn32_cp4": ("down", 32, {"unroll": 1, "stages": 4}),
}
SWEEP_MS = (1, 16)


def sweep_dims(op: str) -> tuple[int, int, int, int]:
    """(hidden, inter, weight rows, k) of the 8-experts-as-one layout."""
    if op == "gate_up":
        return HIDDEN, SWEEP_EXPERTS * INTER, 2 * SWEEP_EXPERTS * INTER, HIDDEN
    return SWEEP_EXPERTS * HIDDEN, INTER, SWEEP_EXPERTS * HIDDEN, INTER


def build_sweep_variant(name: str):
    import etc
    from etc.tiles import gemm as G

    op, bn, kw = SWEEP[name]
    hidden, inter, rows, k = sweep_dims(op)
    g = etc.Graph(f"sweep_{name}")
    m = g.symbol("m")
    row_off = g.tensor("row_off", (2,), "i32")
    indptr = g.tensor("indptr", (2,), "i32")
    X = g.tensor("A", (m, k), "bf16")
    W = g.tensor("B", (1, rows, k), "bf16")
    if op == "gate_up":
        Y = g.tensor("C", (m, inter), "bf16")
        tile = G.moe_gate_up(16, bn, hidden, inter, experts=1, **kw)
        grid = (((m + 15) // 16) * (inter // bn), 1)
    else:
        Y = g.tensor("C", (m, hidden), "bf16")
        tile = G.moe_down(16, bn, hidden, inter, experts=1, **kw)
        grid = (((m + 15) // 16) * (hidden // bn), 1)
    g.task(tile, grid=grid, args=(X, W, row_off, indptr, Y))
    return g


def build_sweep(out: Path) -> None:
    import re
    import shutil
    import subprocess
    import tempfile

    import etc

    for name in SWEEP:
        art = etc.compile(build_sweep_variant(name), schedule="static")
        art.save(out / name)
        regs = ""
        if shutil.which("ptxas"):
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "k.ptx"
                src.write_text(art.ptx)
                done = subprocess.run(
                    ["ptxas", "-arch=sm_90", "-O3", "-v", str(src), "-o", str(Path(tmp) / "k")],
                    capture_output=True,
                    text=True,
                )
            found = re.findall(r"Used (\d+) registers|(\d+) bytes spill stores", done.stderr)
            regs = " ".join(a or b for a, b in found)
        print("built", name, "(spill store bytes, registers:", regs + ")")


def run_sweep(artifacts: Path, out: Path | None, reps: int) -> dict:
    import torch

    import etc.runtime

    torch.manual_seed(0)
    buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(buf)
    copy_us = gpu_timed(torch, lambda i: dst.copy_(buf), 10, reps)
    copy_tbs = 2 * buf.numel() / copy_us / 1e6
    print(f"copy bandwidth {copy_tbs:.3f} TB/s")
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "method": __doc__.split("Bandwidth sweep ")[1].strip(),
        "copy_tb_s": copy_tbs,
        "rows": [],
    }
    cache: dict = {}
    for name, (op, bn, kw) in SWEEP.items():
        hidden, inter, rows, k = sweep_dims(op)
        n_out = inter if op == "gate_up" else hidden
        w_bytes = rows * k * 2
        copies = max(2, -(-WORKING_SET // w_bytes))
        if op not in cache:
            cache[op] = [
                (torch.randn(1, rows, k, device="cuda") * k**-0.5).to(torch.bfloat16)
                for _ in range(copies)
            ]
        Ws = cache[op]
        kern = etc.runtime.load(artifacts / name)
        for M in SWEEP_MS:
            rows_total = M  # rows per expert: all 8 (one wide expert) share them
            A = torch.randn(rows_total, k, device="cuda").to(torch.bfloat16)
            Y = torch.empty(rows_total, n_out, device="cuda", dtype=torch.bfloat16)
            n_tiles = -(-rows_total // 16) * (n_out // bn)
            row_off = torch.tensor([0, rows_total], dtype=torch.int32, device="cuda")
            indptr = torch.tensor([0, n_tiles], dtype=torch.int32, device="cuda")

            def launch(i, A=A, Y=Y, row_off=row_off, indptr=indptr, kern=kern, Ws=Ws, n=rows_total):
                kern.launch(
                    {"A": A, "B": Ws[i % len(Ws)], "row_off": row_off, "indptr": indptr, "C": Y},
                    {"m": n},
                    sync=False,
                )

            launch(0)
            kern.check()
            y = A.float() @ Ws[0][0].float().T
            want = (
                y[:, :inter] * torch.sigmoid(y[:, :inter]) * y[:, inter:] if op == "gate_up" else y
            )
            err = ((Y.float() - want).abs().max() / (want.abs().max() + 1e-30)).item()
            us = gpu_timed(torch, launch, copies, reps)
            tbs = w_bytes / us / 1e6
            row = {"variant": name, "op": op, "block_n": bn, "kwargs": {k_: list(v) if isinstance(v, tuple) else v for k_, v in kw.items()},
                   "M": M, "tiles": n_tiles, "us": us, "weight_tb_s": tbs,
                   "of_copy": tbs / copy_tbs, "rel_err": err, "ok": err <= 1e-2}  # fmt: skip
            results["rows"].append(row)
            print(
                f"{name:18s} M={M:3d} tiles={n_tiles:4d} {us:8.2f} us  {tbs:5.2f} TB/s "
                f"({100 * tbs / copy_tbs:5.1f}% of copy)  err {err:.1e}{'' if err <= 1e-2 else ' WRONG'}"
            )
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemm_sweep.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--sweep" in argv:
        argv.remove("--sweep")
        return two_step_main("GEMM tile bandwidth sweep", build_sweep, run_sweep, argv, reps=10)
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=20)


if __name__ == "__main__":
    sys.exit(main())

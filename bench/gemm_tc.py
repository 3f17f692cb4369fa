"""Pipelined bf16 GEMM tiles (etc.tiles.gemm_tc) on the GPU against torch.matmul (cuBLAS).

Two steps, because the GPU machine has no compiler:

    python bench/gemm_tc.py --build DIR                  # CPU: compile every config
    python bench/gemm_tc.py --artifacts DIR --out OUT    # GPU: check, then time

Method: the prefill MoE GEMM shapes (Qwen3-30B-A3B: hidden 2048, expert
intermediate 768): gate/up N=2*768 K=2048 and down N=2048 K=768, for M in
(256, 1024, 4096, 8192) rows, plus one square M=N=K=8192 GEMM. Variants:
the dense `gemm_tc` tile (C = A @ B^T) and, for the MoE shapes, the MoE
tiles `moe_gate_up` (SwiGLU epilogue) and `moe_down` of etc.tiles.gemm_tc on
one expert holding all M rows (grid (tiles, 1), row_off = [0, M]); each a
one-task ETC graph (static schedule) launched eagerly. Baselines in the same
run: torch.matmul(A, B.T) (cuBLAS) and, for gate/up, matmul + silu(g) * u.
Inputs are random bf16, A and the weights rotated over enough copies that
the working set exceeds L2 (> 128 MiB). Every variant is first checked
against a float32 torch product (max |err| / max |ref| <= 1e-2, printed as
"rel err" per case); a wrong result stops the run. Times are medians of REPS
repetitions of CALLS back-to-back calls between two CUDA events, divided by
CALLS, after a warm-up round; "GPU time" hides the host's launch cost behind
a sleep kernel (bench/timing.py). Results go to OUT/gemm_tc.json.
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
from bench.timing import two_step_main  # noqa: E402

HIDDEN, INTER = 2048, 768
MS = (256, 1024, 4096, 8192)
SQUARE = 8192
# name: (block_m, block_n dense, block_n gate/up (of I), block_n down, stages)
CONFIGS = {"mid": (64, 128, 64, 128, 4), "large": (128, 128, 64, 128, 3)}
SHAPES = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER), "square": (SQUARE, SQUARE)}
WORKING_SET = 160 << 20  # bytes rotated over (> L2)


def config_for(M: int) -> str:
    return "mid" if M <= 512 else "large"


def build_dense(shape: str, config: str, core: str = "mma"):
    from etc.tiles import gemm_tc as G

    _, k = SHAPES[shape]
    bm, bn, _, _, stages = CONFIGS[config]
    # wgmma: a warpgroup (128 threads) per 64 rows.
    threads = 256 if core == "mma" else 128 * bm // 64
    tile = G.gemm(bm, bn, k, stages=stages, core=core, block_size=threads)
    return dense_graph(f"gemm_tc_{shape}_{config}", tile, k, bm, bn)


def build_moe(shape: str, config: str):
    """One expert holding all m rows; tile i of expert 0 (the trigger's e)."""
    from etc.tiles import gemm_tc as G

    bm, _, bn_gu, bn_dn, stages = CONFIGS[config]
    bn = bn_gu if shape == "gate_up" else bn_dn
    name = f"moe_tc_{shape}_{config}"
    return moe_graph(name, shape, G, bm, bn, HIDDEN, INTER, stages=stages)


def artifact_name(kind: str, shape: str, config: str) -> str:
    return f"tc_{kind}_{shape}_{config}"


def cases() -> list[tuple[str, int]]:
    return [(s, M) for s in ("gate_up", "down") for M in MS] + [("square", SQUARE)]


def build(out: Path) -> None:
    import etc

    done = set()
    for shape, M in cases():
        config = config_for(M)
        kinds = [("dense", build_dense)]
        if shape != "square":
            kinds.append(("moe", build_moe))
        for kind, make in kinds:
            name = artifact_name(kind, shape, config)
            if name in done:
                continue
            done.add(name)
            etc.compile(make(shape, config), schedule="static").save(out / name)
            print("built", name)
        # The same dense tile on wgmma (sm_90a).
        name = artifact_name("dense", shape, config) + "_wgmma"
        if name not in done:
            done.add(name)
            graph = build_dense(shape, config, core="wgmma")
            etc.compile(graph, schedule="static", target="sm_90a").save(out / name)
            print("built", name)


def bench_case(torch, artifacts: Path, shape: str, M: int, reps: int) -> dict:
    import etc.runtime

    n_out, k = SHAPES[shape]
    config = config_for(M)
    bm, _, bn_gu, bn_dn, _ = CONFIGS[config]
    copies, As, Ws = rotated_inputs(torch, M, n_out, k, WORKING_SET)
    row = {"shape": shape, "M": M, "N": n_out, "K": k, "config": config, "variants": {}}
    flops = 2 * M * n_out * k

    def record(name: str, us: float) -> None:
        row["variants"][name] = us
        print(f"{shape:8s} M={M:5d} {name:34s} {us:10.2f} us  {flops / us / 1e6:7.1f} TFLOP/s")

    check = checker(row, shape, M, verbose=True)

    def ref(i):
        return As[i].float() @ Ws[i].float().T

    time_baselines(torch, shape, As, Ws, copies, INTER, check, record, reps, eager=False)

    dense = etc.runtime.load(artifacts / artifact_name("dense", shape, config))
    C = torch.empty(M, n_out, device="cuda", dtype=torch.bfloat16)
    launch_dense = dense_launch(dense, M, n_out, As, Ws, C)
    names = ("ETC gemm_tc", "ETC gemm_tc")
    check_and_time(torch, dense, launch_dense, C, ref, names, check, record, copies, reps, True)
    wgmma = etc.runtime.load(artifacts / (artifact_name("dense", shape, config) + "_wgmma"))
    launch_wgmma = dense_launch(wgmma, M, n_out, As, Ws, C)
    names = ("ETC gemm_tc wgmma", "ETC gemm_tc wgmma")
    check_and_time(torch, wgmma, launch_wgmma, C, ref, names, check, record, copies, reps, True)
    v = row["variants"]
    row["cublas_over_etc_gemm_gpu"] = v["torch.matmul, GPU time"] / v["ETC gemm_tc, GPU time"]
    row["cublas_over_etc_wgmma_gpu"] = (
        v["torch.matmul, GPU time"] / v["ETC gemm_tc wgmma, GPU time"]
    )
    if shape == "square":
        return row

    # MoE tile: one expert with all M rows.
    moe = etc.runtime.load(artifacts / artifact_name("moe", shape, config))
    bn, n_total = (bn_gu, INTER) if shape == "gate_up" else (bn_dn, HIDDEN)
    launch_moe, Y = moe_launch(torch, moe, shape, M, bm, bn, n_total, As, Ws)

    def want(i):
        return swiglu(torch, ref(i), INTER) if shape == "gate_up" else ref(i)

    names = (f"ETC moe_{shape}_tc",) * 2
    check_and_time(torch, moe, launch_moe, Y, want, names, check, record, copies, reps, True)
    return row


def run(artifacts: Path, out: Path | None, reps: int) -> dict:
    import torch

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 references stay float32
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "method": __doc__.split("Method: ")[1].strip(),
        "configs": {
            k: dict(zip(("block_m", "bn_dense", "bn_gate_up", "bn_down", "stages"), v, strict=True))
            for k, v in CONFIGS.items()
        },
        "rows": [],
    }
    for shape, M in cases():
        results["rows"].append(bench_case(torch, artifacts, shape, M, reps))
        torch.cuda.empty_cache()
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemm_tc.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=20)


if __name__ == "__main__":
    sys.exit(main())

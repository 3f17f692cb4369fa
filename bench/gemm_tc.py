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

from bench.timing import gpu_timed, timed, two_step_main  # noqa: E402

HIDDEN, INTER = 2048, 768
MS = (256, 1024, 4096, 8192)
SQUARE = 8192
# name: (block_m, block_n dense, block_n gate/up (of I), block_n down, stages)
CONFIGS = {"mid": (64, 128, 64, 128, 4), "large": (128, 128, 64, 128, 3)}
SHAPES = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER), "square": (SQUARE, SQUARE)}
WORKING_SET = 160 << 20  # bytes rotated over (> L2)


def config_for(M: int) -> str:
    return "mid" if M <= 512 else "large"


def build_dense(shape: str, config: str):
    import etc
    from etc.tiles import gemm_tc as G

    _, k = SHAPES[shape]
    bm, bn, _, _, stages = CONFIGS[config]
    g = etc.Graph(f"gemm_tc_{shape}_{config}")
    m, n = g.symbol("m"), g.symbol("n")
    A, B = g.tensor("A", (m, k), "bf16"), g.tensor("B", (n, k), "bf16")
    C = g.tensor("C", (m, n), "bf16")
    tile = G.gemm(bm, bn, k, stages=stages)
    g.task(tile, grid=((m + bm - 1) // bm, (n + bn - 1) // bn), args=(A, B, C))
    return g


def build_moe(shape: str, config: str):
    """One expert holding all m rows; tile i of expert 0 (the trigger's e)."""
    import etc
    from etc.tiles import gemm_tc as G

    bm, _, bn_gu, bn_dn, stages = CONFIGS[config]
    g = etc.Graph(f"moe_tc_{shape}_{config}")
    m = g.symbol("m")
    row_off = g.tensor("row_off", (2,), "i32")
    indptr = g.tensor("indptr", (2,), "i32")
    blocks = (m + bm - 1) // bm
    if shape == "gate_up":
        X = g.tensor("A", (m, HIDDEN), "bf16")
        W = g.tensor("B", (1, 2 * INTER, HIDDEN), "bf16")
        Y = g.tensor("C", (m, INTER), "bf16")
        tile = G.moe_gate_up(bm, bn_gu, HIDDEN, INTER, experts=1, stages=stages)
        grid = (blocks * (INTER // bn_gu), 1)
    else:
        X = g.tensor("A", (m, INTER), "bf16")
        W = g.tensor("B", (1, HIDDEN, INTER), "bf16")
        Y = g.tensor("C", (m, HIDDEN), "bf16")
        tile = G.moe_down(bm, bn_dn, HIDDEN, INTER, experts=1, stages=stages)
        grid = (blocks * (HIDDEN // bn_dn), 1)
    g.task(tile, grid=grid, args=(X, W, row_off, indptr, Y))
    return g


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


def bench_case(torch, artifacts: Path, shape: str, M: int, reps: int) -> dict:
    import etc.runtime

    n_out, k = SHAPES[shape]
    config = config_for(M)
    bm, _, bn_gu, bn_dn, _ = CONFIGS[config]
    w_bytes = n_out * k * 2
    copies = max(2, -(-WORKING_SET // (w_bytes + M * k * 2)))
    calls = copies
    As = [torch.randn(M, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
    Ws = [
        (torch.randn(n_out, k, device="cuda") * k**-0.5).to(torch.bfloat16) for _ in range(copies)
    ]
    row = {"shape": shape, "M": M, "N": n_out, "K": k, "config": config, "variants": {}}
    flops = 2 * M * n_out * k

    def record(name: str, us: float) -> None:
        row["variants"][name] = us
        print(f"{shape:8s} M={M:5d} {name:34s} {us:10.2f} us  {flops / us / 1e6:7.1f} TFLOP/s")

    def swiglu(y):
        g, u = y[:, :INTER].float(), y[:, INTER:].float()
        return g * torch.sigmoid(g) * u

    def check(name: str, got, want) -> None:
        err = ((got.float() - want).abs().max() / (want.abs().max() + 1e-30)).item()
        row.setdefault("rel_err", {})[name] = err
        print(f"{shape:8s} M={M:5d} {name:34s} max rel err {err:.3e}")
        if not err <= 1e-2:
            raise SystemExit(f"{name}: wrong result for {shape} M={M} (rel error {err:.3g})")

    def ref(i):
        return As[i].float() @ Ws[i].float().T

    def mm(i):
        return torch.matmul(As[i % copies], Ws[i % copies].T)

    check("torch.matmul", mm(0), ref(0))
    record("torch.matmul, GPU time", gpu_timed(torch, mm, calls, reps))
    if shape == "gate_up":

        def mm_act(i):
            y = torch.matmul(As[i % copies], Ws[i % copies].T)
            return torch.nn.functional.silu(y[:, :INTER]) * y[:, INTER:]

        record("torch.matmul+swiglu, GPU time", gpu_timed(torch, mm_act, calls, reps))

    dense = etc.runtime.load(artifacts / artifact_name("dense", shape, config))
    C = torch.empty(M, n_out, device="cuda", dtype=torch.bfloat16)

    def launch_dense(i):
        dense.launch(
            {"A": As[i % copies], "B": Ws[i % copies], "C": C}, {"m": M, "n": n_out}, sync=False
        )

    for i in range(2):
        C.fill_(float("nan"))  # every element must be written
        launch_dense(i)
        dense.check()
        check("ETC gemm_tc", C, ref(i))
    record("ETC gemm_tc, eager", timed(torch, launch_dense, calls, reps))
    record("ETC gemm_tc, GPU time", gpu_timed(torch, launch_dense, calls, reps))
    v = row["variants"]
    row["cublas_over_etc_gemm_gpu"] = v["torch.matmul, GPU time"] / v["ETC gemm_tc, GPU time"]
    if shape == "square":
        return row

    # MoE tile: one expert with all M rows.
    moe = etc.runtime.load(artifacts / artifact_name("moe", shape, config))
    bn = bn_gu if shape == "gate_up" else bn_dn
    n_tiles = (INTER if shape == "gate_up" else HIDDEN) // bn * -(-M // bm)
    row_off = torch.tensor([0, M], dtype=torch.int32, device="cuda")
    indptr = torch.tensor([0, n_tiles], dtype=torch.int32, device="cuda")
    Y = torch.empty(M, INTER if shape == "gate_up" else HIDDEN, device="cuda", dtype=torch.bfloat16)
    W3 = [w.view(1, n_out, k) for w in Ws]

    def launch_moe(i):
        moe.launch(
            {
                "A": As[i % copies],
                "B": W3[i % copies],
                "row_off": row_off,
                "indptr": indptr,
                "C": Y,
            },
            {"m": M},
            sync=False,
        )

    for i in range(2):
        Y.fill_(float("nan"))
        launch_moe(i)
        moe.check()
        check(f"ETC moe_{shape}_tc", Y, swiglu(ref(i)) if shape == "gate_up" else ref(i))
    record(f"ETC moe_{shape}_tc, eager", timed(torch, launch_moe, calls, reps))
    record(f"ETC moe_{shape}_tc, GPU time", gpu_timed(torch, launch_moe, calls, reps))
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

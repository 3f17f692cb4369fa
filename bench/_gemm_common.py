"""Pieces shared by the GEMM tile benchmarks (bench/gemm.py, bench/gemm_tc.py):
the one-task graphs, the rotated inputs, result checks and the MoE-tile run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def dense_graph(name: str, tile, k: int, bm: int, bn: int):
    """``C = A @ B^T`` as one task of ``tile`` over its grid (with the
    workspace of parts that meet: :func:`etc.tiles.gemm_tc.add_gemm_task`)."""
    import etc
    from etc.tiles.gemm_tc import add_gemm_task

    g = etc.Graph(name)
    m, n = g.symbol("m"), g.symbol("n")
    A, B = g.tensor("A", (m, k), "bf16"), g.tensor("B", (n, k), "bf16")
    add_gemm_task(g, tile, A, B, g.tensor("C", (m, n), "bf16"))
    return g


def moe_graph(name: str, shape: str, G, bm: int, bn: int, hidden: int, inter: int, **kw):
    """One expert holding all m rows; tile i of expert 0 (the trigger's e).
    ``G``: the tile module (``moe_gate_up`` / ``moe_down``), ``kw`` its options."""
    import etc

    g = etc.Graph(name)
    m = g.symbol("m")
    row_off = g.tensor("row_off", (2,), "i32")
    indptr = g.tensor("indptr", (2,), "i32")
    blocks = (m + bm - 1) // bm
    if shape == "gate_up":
        X = g.tensor("A", (m, hidden), "bf16")
        W = g.tensor("B", (1, 2 * inter, hidden), "bf16")
        Y = g.tensor("C", (m, inter), "bf16")
        tile = G.moe_gate_up(bm, bn, hidden, inter, experts=1, **kw)
        grid = (blocks * (inter // bn), 1)
    else:
        X = g.tensor("A", (m, inter), "bf16")
        W = g.tensor("B", (1, hidden, inter), "bf16")
        Y = g.tensor("C", (m, hidden), "bf16")
        tile = G.moe_down(bm, bn, hidden, inter, experts=1, **kw)
        grid = (blocks * (hidden // bn), 1)
    g.task(tile, grid=grid, args=(X, W, row_off, indptr, Y))
    return g


def rotated_inputs(torch, M: int, n_out: int, k: int, working_set: int):
    """``(copies, As, Ws)``: enough random bf16 ``A`` (M x k) and weights
    (n_out x k, fan-in scaled) that the rotation exceeds ``working_set`` bytes."""
    w_bytes = n_out * k * 2
    copies = max(2, -(-working_set // (w_bytes + M * k * 2)))
    As = [torch.randn(M, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
    Ws = [
        (torch.randn(n_out, k, device="cuda") * k**-0.5).to(torch.bfloat16) for _ in range(copies)
    ]
    return copies, As, Ws


def rel_err(got, want) -> float:
    return ((got.float() - want).abs().max() / (want.abs().max() + 1e-30)).item()


def checker(row: dict, shape: str, M: int, verbose: bool) -> Callable[[str, Any, Any], None]:
    """``check(name, got, want)``: record the relative error in ``row``; stop
    the run on a wrong result."""

    def check(name: str, got, want) -> None:
        err = rel_err(got, want)
        row.setdefault("rel_err", {})[name] = err
        if verbose:
            print(f"{shape:8s} M={M:5d} {name:34s} max rel err {err:.3e}")
        if not err <= 1e-2:
            raise SystemExit(f"{name}: wrong result for {shape} M={M} (rel error {err:.3g})")

    return check


def swiglu(torch, y, inter: int):
    """``silu(g) * u`` of the float32 product ``y = [g | u]``."""
    g, u = y[:, :inter].float(), y[:, inter:].float()
    return g * torch.sigmoid(g) * u


def time_baselines(torch, shape, As, Ws, copies, inter, check, record, reps, eager: bool):
    """torch.matmul (checked, then timed) and, for gate/up, matmul + SwiGLU."""
    from bench.timing import gpu_timed, timed

    def mm(i):
        return torch.matmul(As[i % copies], Ws[i % copies].T)

    check("torch.matmul", mm(0), As[0].float() @ Ws[0].float().T)
    if eager:
        record("torch.matmul, eager", timed(torch, mm, copies, reps))
    record("torch.matmul, GPU time", gpu_timed(torch, mm, copies, reps))
    if shape == "gate_up":

        def mm_act(i):
            y = torch.matmul(As[i % copies], Ws[i % copies].T)
            return torch.nn.functional.silu(y[:, :inter]) * y[:, inter:]

        record("torch.matmul+swiglu, GPU time", gpu_timed(torch, mm_act, copies, reps))


def check_and_time(torch, kernel, launch, out, want, names, check, record, calls, reps, fill):
    """Check ``launch(i)`` of ``kernel`` (writing ``out``) against ``want(i)``
    on two copies, ``out`` filled with NaN first when ``fill`` (every element
    must be written); then time it eagerly and as GPU time. ``names``: (the
    check's name, the timings' prefix)."""
    from bench.timing import gpu_timed, timed

    for i in range(2):
        if fill:
            out.fill_(float("nan"))
        launch(i)
        kernel.check()
        check(names[0], out, want(i))
    record(f"{names[1]}, eager", timed(torch, launch, calls, reps))
    record(f"{names[1]}, GPU time", gpu_timed(torch, launch, calls, reps))


def dense_launch(dense, M: int, n_out: int, As, Ws, C, split=None):
    """``launch(i)``: the dense tile's graph on copy ``i`` into ``C``;
    ``split=(torch, block_m, block_n, k_splits)`` for parts meeting in the
    tile (its workspace and zeroed counters allocated here)."""
    copies = len(As)
    extra = {}
    if split is not None:
        torch, bm, bn, parts = split
        blocks = -(-M // bm) * -(-n_out // bn)
        extra = {
            "C_parts": torch.empty(blocks * parts * bm * bn, device="cuda", dtype=torch.float32),
            "C_count": torch.zeros(1, blocks, device="cuda", dtype=torch.int32),
        }

    def launch(i):
        dense.launch(
            {"A": As[i % copies], "B": Ws[i % copies], "C": C, **extra},
            {"m": M, "n": n_out},
            sync=False,
        )

    return launch


def moe_launch(torch, moe, shape: str, M: int, bm: int, bn: int, n_total: int, As, Ws):
    """``(launch(i), Y)``: the MoE tile's graph on one expert holding all M
    rows (``n_total`` output columns), copy ``i``."""
    copies = len(As)
    n_out, k = Ws[0].shape
    n_tiles = n_total // bn * -(-M // bm)
    row_off = torch.tensor([0, M], dtype=torch.int32, device="cuda")
    indptr = torch.tensor([0, n_tiles], dtype=torch.int32, device="cuda")
    Y = torch.empty(M, n_total, device="cuda", dtype=torch.bfloat16)
    W3 = [w.view(1, n_out, k) for w in Ws]

    def launch(i):
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

    return launch, Y


def save_sweep(torch, doc: str, rows: list, out, file: str, **configs) -> dict:
    """The results of a tile sweep (date, device, the module docstring's
    method, ``configs``, ``rows``), written as ``out/file`` when ``out``."""
    import datetime
    import json

    results = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "method": doc.split("Method: ")[1].strip(),
        **configs,
        "rows": rows,
    }
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / file).write_text(json.dumps(results, indent=2) + "\n")
    return results


def sweep_shapes(torch, shapes, working_set: int, reps: int):
    """For each ``(M, N, K)``: fresh rotated inputs, an output ``C`` and a
    result row holding cuBLAS's TFLOP/s; yields ``(row, As, Ws, C, copies)``
    and frees the inputs afterwards."""
    from bench.timing import gpu_timed

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    for M, N, K in shapes:
        copies, As, Ws = rotated_inputs(torch, M, N, K, working_set)
        C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        row = {"M": M, "N": N, "K": K, "tflops": {}, "rel_err": {}}

        def mm(i, As=As, Ws=Ws, copies=copies, C=C):
            torch.matmul(As[i % copies], Ws[i % copies].T, out=C)

        row["tflops"]["cublas"] = 2 * M * N * K / gpu_timed(torch, mm, copies, reps) / 1e6
        yield row, As, Ws, C, copies
        del As, Ws, C
        torch.cuda.empty_cache()


def measure_variant(torch, row, variant, kernel, launch, out, want, copies, reps) -> None:
    """Check ``launch(0)`` against ``want(0)``, then time it into ``row``; a
    failure or a wrong result is reported and not timed."""
    from bench.timing import gpu_timed

    where = f"{row['M']}x{row['N']}x{row['K']}"
    out.fill_(float("nan"))
    try:
        launch(0)
        kernel.check()
    except Exception as exc:  # report and go on with the other variants
        row["rel_err"][variant] = repr(exc)
        print(f"{variant}: FAILED at {where}: {exc}")
        return
    err = rel_err(out, want(0))
    row["rel_err"][variant] = err
    if not err <= 1e-2:
        print(f"{variant}: WRONG (rel err {err:.3g}) at {where}")
        return
    flops = 2 * row["M"] * row["N"] * row["K"]
    row["tflops"][variant] = flops / gpu_timed(torch, launch, copies, reps) / 1e6

"""Shape dynamism, the Event Tensor paper's Figure 4: one RMSNorm kernel for every batch size.

RMSNorm over a batch of b rows, ``Y = X * rsqrt(mean(X**2, axis=1) + eps) * W``,
as two tiled stages over the grid (b, S). ``sum_squares`` (i, j) writes the
sum of squares of chunk j of row i into P[i, j]; ``scale`` (i, j) waits on
E[i] (wait count S: row i's partials are all in) and normalises chunk j of
row i. The batch size b is a symbol: it sizes the tensors, the grids and the
event E, and is bound only at launch, so the artifact is compiled once and
serves every batch size.

    python examples/symbolic_batch.py --simulate --hidden 256
    python examples/symbolic_batch.py                  # on the GPU, b = 1..512
    python examples/symbolic_batch.py --emit-ptx rmsnorm.ptx
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import etc
from etc.tiles import rmsnorm

try:
    from examples._common import (
        cli,
        compile_only,
        count,
        counts,
        load_kernel,
        parser,
        positive,
        run_case,
    )
except ImportError:  # run as a script
    from _common import cli, compile_only, count, counts, load_kernel, parser, positive, run_case


def build(hidden: int = 2048, splits: int = 2, eps: float = 1e-6) -> etc.Graph:
    """The two-stage RMSNorm graph with a symbolic batch size ``b``."""
    g = etc.Graph("rmsnorm")
    b = g.symbol("b")
    X = g.tensor("X", (b, hidden), "f32")
    W = g.tensor("W", (hidden,), "f32")
    P = g.tensor("P", (b, splits), "f32")
    Y = g.tensor("Y", (b, hidden), "f32")
    E = g.event((b,), wait_count=splits, name="E")
    g.task(
        rmsnorm.sum_squares(hidden, splits),
        grid=(b, splits),
        args=(X, P),
        out_edges={E: "ij->i"},
    )
    g.task(
        rmsnorm.scale(hidden, splits, eps),
        grid=(b, splits),
        args=(X, W, P, Y),
        in_edges={E: "ij->i"},
    )
    return g


def expected(X: np.ndarray, W: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm in float64."""
    x = X.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * W


@contextmanager
def counting_compilations() -> Iterator[list[int]]:
    """Counts compiler calls inside the block (the count is ``box[0]``).

    ``etc.compile`` looks ``etc.compiler.compile`` up at every call, so
    wrapping that one entry point sees every compilation, including any that a
    launch might trigger behind the caller's back.
    """
    import etc.compiler

    original, box = etc.compiler.compile, [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        box[0] += 1
        return original(*args, **kwargs)

    etc.compiler.compile = counted
    try:
        yield box
    finally:
        etc.compiler.compile = original


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--batches", type=counts(), default="1,2,3,7,64,511,512", help="batch sizes b to run"
    )
    p.add_argument("--hidden", type=count(1), default=2048, help="hidden size H")
    # H / S = 1024 gives each of the 256 threads exactly one 16-byte load.
    p.add_argument(
        "--splits", type=count(1), default=2, help="chunks S per row (H / S columns each)"
    )
    p.add_argument("--eps", type=positive, default=1e-6)
    args = p.parse_args(argv)
    g = build(args.hidden, args.splits, args.eps)
    # --save-artifact / --artifact: compile on one machine, run on another.
    done = compile_only(g, args)
    if done is not None:
        return done
    batches = args.batches
    rng = np.random.default_rng(args.seed)
    W = rng.standard_normal(args.hidden).astype(np.float32)
    failures, served = 0, set()
    with counting_compilations() as compilations:
        kernel = load_kernel(g, args)  # without --artifact: the one compilation
        if kernel is not None:
            print(f"loaded {kernel!r}; symbols {list(kernel.manifest.symbols)}")
        for b in batches:
            X = rng.standard_normal((b, args.hidden)).astype(np.float32)
            symbols, inputs = {"b": b}, {"X": X, "W": W}
            out = run_case(g, kernel, args, inputs, symbols)
            if kernel is not None:
                served.add((id(kernel), int(kernel.function)))
            want = expected(X, W, args.eps)
            ok = np.allclose(out["Y"], want, rtol=1e-4, atol=1e-5)
            err = float(np.max(np.abs(out["Y"] - want))) if want.size else 0.0
            print(f"{'ok  ' if ok else 'FAIL'} b={b:<4d} Y: max abs error {err:.3g}")
            failures += not ok

    where = "simulator" if kernel is None else "GPU"
    print(f"{len(batches) - failures}/{len(batches)} batch sizes match numpy on the {where}")
    if kernel is None:
        print(f"one graph, symbols {[s.name for s in g.symbols]} bound per run; nothing rebuilt")
    else:
        want_compiles = 0 if args.artifact else 1
        one_kernel = len(served) == 1
        print(
            f"compilations: {compilations[0]} (expected {want_compiles}); one kernel object and "
            f"CUfunction served all {len(batches)} batch sizes: {one_kernel}"
        )
        failures += compilations[0] != want_compiles or not one_kernel
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(cli(main))

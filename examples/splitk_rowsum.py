"""Split-K row sum, the Event Tensor paper's Figure 3, with a symbolic row count.

``partial_sum`` tile (i, j) sums rows ``[i*R, (i+1)*R)`` over the j-th of S
column chunks into B; ``final_sum`` tile i adds row block i's S partials into
C. Event E has one counter per row block with wait count S, so row block i is
finished as soon as its own S partials are, not after all of partial_sum.

    python examples/splitk_rowsum.py --simulate
    python examples/splitk_rowsum.py            # on the GPU
    python examples/splitk_rowsum.py --tiles builder --simulate

``--tiles`` picks the tiles: ``mlir`` (MLIR text, :mod:`etc.tiles.rowsum`)
or ``builder`` (the same tiles written with the Python tile builder,
:mod:`etc.tiles.rowsum_builder`; needs the MLIR bindings). ``--deal`` picks
how the static schedule deals the partial sums: precomputed lists, tickets,
or a pool that each CTA draws from until it is empty (``docs/scheduling.md``).
"""

from __future__ import annotations

import sys

import numpy as np

import etc
from etc.tiles import rowsum

try:
    from examples._common import cli, count, counts, parser, run
except ImportError:  # run as a script
    from _common import cli, count, counts, parser, run


def build(
    K: int = 256, k_split: int = 4, rows_per_task: int = 8, tiles: str = "mlir", deal: str = "list"
) -> etc.Graph:
    if tiles == "builder":
        from etc.tiles import rowsum_builder as lib
    elif tiles == "mlir":
        lib = rowsum
    else:
        raise ValueError(f"tiles must be 'mlir' or 'builder', got {tiles!r}")
    g = etc.Graph("splitk")
    n = g.symbol("n")
    A = g.tensor("A", (n, K), "f32")
    B = g.tensor("B", (n, k_split), "f32")
    C = g.tensor("C", (n,), "f32")
    row_blocks = (n + rows_per_task - 1) // rows_per_task
    E = g.event((row_blocks,), wait_count=k_split, name="E")
    g.task(
        lib.partial_sum(rows_per_task, k_split, K),
        grid=(row_blocks, k_split),
        args=(A, B),
        out_edges={E: "ij->i"},
        deal=deal,
    )
    g.task(
        lib.final_sum(rows_per_task, k_split),
        grid=(row_blocks,),
        args=(B, C),
        in_edges={E: "i->i"},
    )
    return g


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=counts(), default="1,3,8,33,1000", help="values of n to run")
    p.add_argument("-K", type=count(1), default=256)
    p.add_argument("--k-split", type=count(1), default=4)
    p.add_argument("--rows-per-task", type=count(1), default=8)
    p.add_argument(
        "--tiles",
        choices=("mlir", "builder"),
        default="mlir",
        help="tiles written as MLIR text or with the Python tile builder",
    )
    p.add_argument(
        "--deal",
        choices=etc.graph.DEALS,
        default="list",
        help="how the static schedule deals the partial sums",
    )
    args = p.parse_args(argv)
    g = build(args.K, args.k_split, args.rows_per_task, args.tiles, args.deal)
    rng = np.random.default_rng(args.seed)
    cases = []
    for n in args.sizes:
        A = rng.standard_normal((n, args.K)).astype(np.float32)
        cases.append(({"n": n}, {"A": A}))
    return run(g, args, cases, lambda sym, inp: {"C": inp["A"].astype(np.float64).sum(1)})


if __name__ == "__main__":
    sys.exit(cli(main))

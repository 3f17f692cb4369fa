"""A dense GEMM on the TMA + wgmma tile (sm_90a), with parts of k that meet in the tile.

``C = A @ B^T`` (bf16 in, float32 accumulation, bf16 out) as one task of
``etc.tiles.gemm_tc.gemm(core="tma")`` over ``(ceil(M/BM), ceil(N/BN))``, M
and N symbolic. With ``--k-splits S`` the grid gets a third coordinate: part
``s`` multiplies the s-th part of k, the block's last part to finish adds the
parts in part order and stores C (split-K without a second task; the same
bits whichever part comes last), through the workspace and block counters
that ``gemm_tc.add_gemm_task`` declares. Split-K pays where the grid is a few
blocks and k is long (``bench/RESULTS.md``, GEMM tiles).

    python examples/gemm.py --simulate --shapes 200x300 -K 256 --k-splits 2
    python examples/gemm.py --shapes 512x4096,1024x1536 -K 2048 --k-splits 2   # GPU
    python examples/gemm.py --emit-ptx gemm.ptx && ptxas -arch=sm_90a gemm.ptx
"""

from __future__ import annotations

import sys

import numpy as np

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.tiles import gemm_tc

try:
    from examples._common import cli, count, counts, pairs, parser, run
except ImportError:  # run as a script
    from _common import cli, count, counts, pairs, parser, run


def build(
    K: int = 2048, block_m: int = 128, block_n: int = 128, stages: int = 4, k_splits: int = 1,
    meet_share: int = 1,
) -> etc.Graph:  # fmt: skip
    g = etc.Graph("gemm")
    m, n = g.symbol("m"), g.symbol("n")
    A, B = g.tensor("A", (m, K), "bf16"), g.tensor("B", (n, K), "bf16")
    C = g.tensor("C", (m, n), "bf16")
    tile = gemm_tc.gemm(
        block_m, block_n, K, core="tma", block_size=2 * block_m, stages=stages,
        smem_limit=220 << 10, k_splits=k_splits, meet_share=meet_share,
    )  # fmt: skip
    gemm_tc.add_gemm_task(g, tile, A, B, C)
    return g


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(target="sm_90a")
    p.add_argument(
        "--shapes", type=pairs, default="1x64,200x300,1024x1536", help="M x N pairs to run"
    )
    p.add_argument("-K", type=count(1), default=2048)
    p.add_argument(
        "--block", type=counts(sep="x", length=2), default="128x128",
        help="block rows x columns (BM x BN)",
    )  # fmt: skip
    p.add_argument("--stages", type=count(1), default=4)
    p.add_argument("--k-splits", type=count(1), default=1, help="parts of k that meet in the tile")
    p.add_argument(
        "--meet-share", type=count(1), default=1,
        help="the parts' last N to arrive share the sums (static schedule only)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.target != "sm_90a":
        p.error("the TMA + wgmma tile needs --target sm_90a")
    if args.meet_share > 1 and args.schedule != "static":
        p.error("--meet-share needs --schedule static (its parts wait for each other)")
    block_m, block_n = args.block
    try:
        g = build(args.K, block_m, block_n, args.stages, args.k_splits, args.meet_share)
    except etc.EtcError as exc:  # a configuration the tile cannot take, named by the error
        p.error(str(exc))
    rng = np.random.default_rng(args.seed)
    cases = []
    for M, N in args.shapes:
        A = f32_to_bf16(rng.standard_normal((M, args.K)).astype(np.float32))
        B = f32_to_bf16((rng.standard_normal((N, args.K)) * args.K**-0.5).astype(np.float32))
        blocks = -(-M // block_m) * -(-N // block_n)
        counters = {"C_count": np.zeros((1, blocks), np.int32)} if args.k_splits > 1 else {}
        cases.append(({"m": M, "n": N}, {"A": A, "B": B, **counters}))

    def expect(symbols, inputs):
        out = {"C": bf16_to_f32(inputs["A"]).astype(np.float64) @ bf16_to_f32(inputs["B"]).T}
        if args.k_splits > 1:  # every launch leaves the block counters at zero
            out["C_count"] = np.zeros_like(inputs["C_count"])
        return out

    # C's bf16 bits as floats against the float64 product: one bf16 rounding.
    return run(g, args, cases, expect, rtol=1e-2, atol=1e-2, decode={"C": bf16_to_f32})


if __name__ == "__main__":
    sys.exit(cli(main))

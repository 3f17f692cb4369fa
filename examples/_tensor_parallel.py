"""Shared driver of the multi-GPU examples (gemm_reduce_scatter.py, allgather_gemm.py).

Inputs are random bf16 values (float32 arrays holding bf16-rounded numbers, one set per
rank); each rank's output is checked against a float32 numpy reference:
max|out - ref| / max|ref| <= --tolerance. ``--simulate --ranks N`` runs every rank's
schedule on the CPU; without it the ranks run on GPUs 0..N-1 through
``etc.runtime.RankGroup`` (one process, CUDA peer access between the GPUs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.models import collective as C

try:
    from examples._common import compile_graph, compile_only, count, parser, positive
except ImportError:  # run as a script
    from _common import compile_graph, compile_only, count, parser, positive


@dataclass
class Example:
    """One of the two fused layers: how to build it, its inputs and its check."""

    build: Callable[[C.CollectiveConfig], etc.Graph]
    #: per rank: {input name: float32 array} for (rows, n, k, ranks, rng)
    inputs: Callable[[int, int, int, int, np.random.Generator], list[dict[str, np.ndarray]]]
    #: per rank: (output name, reference float32 array, shape to compare in)
    expect: Callable[[list[dict[str, np.ndarray]], int, int], list[tuple[str, np.ndarray]]]
    #: per rank: the peer-table inputs, from the per-rank buffers of their tensors
    peers: dict[str, str]


def bf16_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return bf16_to_f32(f32_to_bf16((rng.standard_normal(shape) * 0.1).astype(np.float32)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=count(1), default=2, help="ranks (GPUs 0..N-1), default 2")
    p.add_argument(
        "--rows", type=count(1), help="rows per rank S/R (default 64 simulated, 1024 GPU)"
    )
    p.add_argument("--n", type=count(1), help="output columns N (default 64 simulated, 1024 GPU)")
    p.add_argument("--k", type=count(1), help="inner dimension K (default 64 simulated, 1024 GPU)")
    p.add_argument("--block", type=count(1), help="GEMM block rows/columns (32 simulated, 128 GPU)")
    p.add_argument("--stages", type=count(1), help="cp.async stages (default 2 simulated, 3 GPU)")
    p.add_argument("--tolerance", type=positive, default=2e-2)
    p.add_argument(
        "--fused-reduce",
        action="store_true",
        help="GEMM + RS: the peers' rows first, the reduction in the own rows' GEMM epilogue",
    )
    p.add_argument(
        "--gathered",
        action="store_true",
        help="AG + GEMM: every chunk from the gathered buffer (default: the own chunk first, "
        "from the local rows)",
    )
    p.add_argument(
        "--gemm-order",
        help="the GEMM grid's order, a permutation of r (rank), i (row block), j (column "
        f"block); default {C.GEMM_ORDER['gemm_rs']} for GEMM + RS, "
        f"{C.GEMM_ORDER['ag_gemm']} for AG + GEMM",
    )


def config(example: Example, args: argparse.Namespace) -> C.CollectiveConfig:
    """The layer's configuration from the flags; a flag of the other layer is an error."""
    flag, given = (
        ("--gathered", args.gathered)
        if example is GEMM_REDUCE_SCATTER
        else ("--fused-reduce", args.fused_reduce)
    )
    if given:
        raise etc.GraphError(f"{flag} does not apply to this layer")
    small = args.simulate
    block = args.block or (32 if small else 128)
    stages = args.stages or (2 if small else 3)
    return C.CollectiveConfig(
        k=args.k or (64 if small else 1024),
        block_m=block,
        block_n=block,
        stages=stages,
        block_size=128 if small else 256,
        fused_reduce=args.fused_reduce,
        own_first=not args.gathered,
        gemm_order=args.gemm_order,
    )


def main(example: Example, description: str, argv: list[str] | None = None) -> int:
    p = parser(description)
    add_arguments(p)
    args = p.parse_args(argv)
    if args.ranks < 1:
        p.error("--ranks must be >= 1")
    try:
        cfg = config(example, args)
        g = example.build(cfg)
    except etc.EtcError as exc:  # sizes the tiles cannot take, named by the error
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = compile_only(g, args)
    if done is not None:
        return done
    rows = args.rows or (64 if args.simulate else 1024)
    n = args.n or (64 if args.simulate else 1024)
    rng = np.random.default_rng(args.seed)
    inputs = example.inputs(rows, n, cfg.k, args.ranks, rng)
    symbols = {"rows": rows, "N": n}
    if args.simulate:
        given = [{k: v for k, v in x.items()} for x in inputs]
        outputs = etc.simulate_ranks(
            g, given, symbols, schedule=args.schedule, seed=args.seed, early_push=args.early_push
        )
        got = [
            {k: bf16_to_f32(v) if v.dtype == np.uint16 else v for k, v in o.items()}
            for o in outputs
        ]
    else:
        got = run_gpu(g, args, example, inputs, symbols)
    failures = 0
    for r, (name, want) in enumerate(example.expect(inputs, rows, n)):
        out = got[r][name].reshape(want.shape)
        err = float(np.max(np.abs(out - want)) / max(float(np.max(np.abs(want))), 1e-30))
        ok = err <= args.tolerance
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} rank {r} {name}: rel err {err:.3g}")
    where = "simulator" if args.simulate else f"{args.ranks} GPUs"
    print(
        f"{args.ranks - failures}/{args.ranks} ranks match numpy on the {where} "
        f"({args.schedule} schedule, rows={rows} N={n} K={cfg.k})"
    )
    return 1 if failures else 0


def run_gpu(
    g: etc.Graph,
    args: argparse.Namespace,
    example: Example,
    inputs: list[dict[str, np.ndarray]],
    symbols: dict[str, int],
) -> list[dict[str, Any]]:
    """One launch of every rank on GPUs 0..R-1; the outputs as float32 numpy arrays."""
    import torch

    from etc import runtime

    directory = args.artifact
    if directory is None:
        directory = tempfile.mkdtemp(prefix=f"etc-{g.name}-")
        compile_graph(g, args).save(directory)
    group = runtime.RankGroup(directory, devices=list(range(args.ranks)))
    tensors = per_rank_tensors(g, inputs, symbols, example.peers)
    group.launch(tensors, symbols)
    for r in range(args.ranks):
        torch.cuda.synchronize(r)
    return [
        {k: v.float().cpu().numpy() for k, v in t.items() if v.dtype == torch.bfloat16}
        for t in tensors
    ]


def per_rank_tensors(
    g: etc.Graph,
    inputs: list[dict[str, np.ndarray]],
    symbols: dict[str, int],
    peers: dict[str, str],
) -> list[dict[str, Any]]:
    """Every graph tensor on every rank's GPU: the inputs (bf16), zeroed buffers, and
    the peer tables of the buffers that ``peers`` names (table -> buffer)."""
    import torch

    from etc import runtime

    env = {**symbols, "ranks": len(inputs)}
    tensors: list[dict[str, Any]] = []
    for r, given in enumerate(inputs):
        ts: dict[str, Any] = {}
        for t in g.tensors:
            if t.name in peers or t.map_of is not None:  # maps: the runtime encodes them
                continue
            shape = tuple(d if isinstance(d, int) else d.evaluate(env) for d in t.shape)
            if t.name in given:
                ts[t.name] = torch.from_numpy(given[t.name]).to(f"cuda:{r}", torch.bfloat16)
            else:
                ts[t.name] = torch.zeros(shape, dtype=torch.bfloat16, device=f"cuda:{r}")
        tensors.append(ts)
    for table, buffer in peers.items():
        addresses = runtime.peer_table([ts[buffer] for ts in tensors])
        for r, ts in enumerate(tensors):
            ts[table] = torch.from_numpy(addresses[r]).to(f"cuda:{r}")
    return tensors


GEMM_REDUCE_SCATTER = Example(
    build=C.gemm_reduce_scatter,
    inputs=lambda rows, n, k, ranks, rng: [
        {"X": bf16_values(rng, (ranks * rows, k)), "W": bf16_values(rng, (n, k))}
        for _ in range(ranks)
    ],
    expect=lambda inputs, rows, n: [
        ("out", ref)
        for ref in C.reference_gemm_reduce_scatter(
            [x["X"] for x in inputs], [x["W"] for x in inputs]
        )
    ],
    peers={"staging_peers": "staging"},
)

ALLGATHER_GEMM = Example(
    build=C.allgather_gemm,
    inputs=lambda rows, n, k, ranks, rng: [
        {"A": bf16_values(rng, (rows, k)), "W": bf16_values(rng, (n, k))} for _ in range(ranks)
    ],
    expect=lambda inputs, rows, n: [
        ("C", ref)
        for ref in C.reference_allgather_gemm([x["A"] for x in inputs], [x["W"] for x in inputs])
    ],
    peers={"A_full_peers": "A_full"},
)

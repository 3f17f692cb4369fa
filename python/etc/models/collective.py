"""Tensor-parallel GEMMs fused with their collectives, one megakernel per rank.

* :func:`gemm_reduce_scatter` (row-parallel layer, e.g. an MLP's down projection):
  rank ``r`` holds ``X_r`` (``S x K``, its ``K`` slice of the inner dimension) and
  ``W_r`` (``N x K``); the result ``sum_r X_r @ W_r^T`` is scattered by rows: rank ``r``
  gets rows ``[r*S/R, (r+1)*S/R)`` in ``out`` (``S/R x N``). A GEMM tile sends its
  partial block to the rank that owns its rows as soon as it is done (into that rank's
  ``staging`` slot for the sender) and notifies the ranked event ``rs`` there; the
  owner's reduce tile for that block waits for all ``R`` partials and sums them
  (``fused_reduce``: the owner computes its own rows last and adds the peers'
  partials in that GEMM's epilogue, with no reduce tiles).
* :func:`allgather_gemm` (column-parallel layer, e.g. gate/up): rank ``r`` holds ``S/R``
  rows ``A`` (``S/R x K``) and ``W_r`` (``N x K``); ``C_r = allgather(A) @ W_r^T``
  (``S x N``, given as ``R x S/R x N``). Copy tiles push this rank's rows into every
  rank's gathered buffer and notify the ranked event ``ag`` there; the GEMM tiles of a
  chunk wait only for that chunk's rows (``own_first``: a rank's own chunk is computed
  first, straight from ``A``).

Symbols: ``rows`` (``S/R``) and ``N``; ``K`` is compiled in. The ranks and the rank are
bound by :class:`etc.runtime.RankGroup` (or :func:`etc.simulate_ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._fields import check_config
from ..dtypes import bf16_to_f32, f32_to_bf16
from ..errors import GraphError
from ..graph import Graph
from ..tiles import collective as tiles

__all__ = [
    "CollectiveConfig",
    "gemm_reduce_scatter",
    "allgather_gemm",
    "reference_gemm_reduce_scatter",
    "reference_allgather_gemm",
]


@dataclass(frozen=True)
class CollectiveConfig:
    """Tile sizes; ``k`` is the GEMM's inner dimension (per rank for GEMM + RS)."""

    k: int = 4096
    block_m: int = 128
    block_n: int = 128
    stages: int = 3
    warps: tuple[int, int] | None = None
    block_size: int = 256
    #: The GEMM tiles' tensor-core path: "mma" (mma.sync, sm_90), "wgmma" or
    #: "tma" (TMA-fed wgmma; both sm_90a: compile with target="sm_90a").
    core: str = "mma"
    #: wgmma: k-tiles' MMAs left running while the next is issued (0 or 1).
    inflight: int = 0
    #: Shared-memory bytes a GEMM tile may use (past 47 KiB: dynamic).
    smem_limit: int = 48 * 1024
    #: wgmma: k-tile width (32: 64-byte swizzle, 64: 128-byte swizzle).
    block_k: int = 32
    #: All-Gather: copy tiles per GEMM row block.
    copy_parts: int = 1
    #: The copy and reduce tiles: 16-byte vectors each thread loads before it
    #: stores any, at most (``unroll`` of ``tiles.copy_to_peers`` and
    #: ``tiles.reduce_slots``: the largest divisor of a thread's share).
    loads_in_flight: int = 8
    #: The order of the GEMM tasks' grid: a permutation of ``r`` (the rank
    #: coordinate: the destination of GEMM + RS, the source chunk of All-Gather
    #: + GEMM), ``i`` (row block) and ``j`` (column block), outermost first.
    #: ``"ijr"`` (GEMM + RS's default): the ranks' rows of a block in turn, so
    #: a wave's epilogues do not all go to one rank over NVLink at once.
    #: ``"rji"`` (All-Gather + GEMM's): a column block's row blocks in turn, so
    #: a wave reads a few column blocks of ``B`` instead of all of them (less
    #: DRAM traffic when ``N`` is large). ``None``: the layer's default
    #: (``GEMM_ORDER``, the best measured: bench/RESULTS.md, "Multi-GPU";
    #: ``"rij"`` for GEMM + RS with ``fused_reduce``).
    gemm_order: str | None = None
    #: GEMM + Reduce-Scatter: the peers' rows first, then this rank's own
    #: rows with the peers' partials added in the GEMM epilogue
    #: (``tiles.gemm_reduce_own``) instead of separate reduce tiles.
    fused_reduce: bool = False
    #: All-Gather + GEMM: each rank's GEMM on its own rows first, straight
    #: from ``A`` (no copy to itself, no wait), then the peers' chunks as
    #: their copies land. ``False``: every chunk from the gathered buffer.
    own_first: bool = True

    def __post_init__(self) -> None:
        check_config(self, self._check)

    def _check(self) -> None:
        """The checks of the fields' values (:func:`check_config` adds their types)."""
        for key in (
            "k", "block_m", "block_n", "stages", "block_size", "smem_limit", "block_k",
            "copy_parts", "loads_in_flight",
        ):  # fmt: skip
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GraphError(f"CollectiveConfig: {key} must be a positive int, got {value!r}")
        if self.core not in CORES:
            raise GraphError(
                f"CollectiveConfig: core must be one of {', '.join(CORES)}, got {self.core!r}"
            )
        if self.inflight not in (0, 1) or isinstance(self.inflight, bool):
            raise GraphError(f"CollectiveConfig: inflight must be 0 or 1, got {self.inflight!r}")
        for key in ("fused_reduce", "own_first"):
            if not isinstance(getattr(self, key), bool):
                raise GraphError(
                    f"CollectiveConfig: {key} must be a bool, got {getattr(self, key)!r}"
                )
        order = self.gemm_order
        if order is not None and (not isinstance(order, str) or sorted(order) != ["i", "j", "r"]):
            raise GraphError(
                "CollectiveConfig: gemm_order must order the letters r, i and j (e.g. 'rij', "
                f"'ijr'), got {self.gemm_order!r}"
            )
        warps = self.warps
        if warps is not None and (
            not isinstance(warps, tuple)
            or len(warps) != 2
            or any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in warps)
        ):
            raise GraphError(
                f"CollectiveConfig: warps must be None or a pair of positive ints, got {warps!r}"
            )


#: The GEMM tiles' tensor-core paths (``CollectiveConfig.core``).
CORES = ("mma", "wgmma", "tma")
#: ``CollectiveConfig.gemm_order`` by default, per layer (bench/RESULTS.md, issue 8).
GEMM_ORDER = {"gemm_rs": "ijr", "ag_gemm": "rji"}


def _grid(order: str, **extents) -> tuple:
    """The grid whose dimensions are ``extents``' in the order of ``order``'s letters."""
    return tuple(extents[c] for c in order)


def gemm_reduce_scatter(cfg: CollectiveConfig, name: str = "gemm_rs") -> Graph:
    g = Graph(name, block_size=cfg.block_size)
    rank, ranks = g.ranks()
    rows, n = g.symbol("rows"), g.symbol("N")
    X = g.tensor("X", (ranks * rows, cfg.k), "bf16")
    W = g.tensor("W", (n, cfg.k), "bf16")
    staging = g.tensor("staging", (ranks, rows, n), "bf16")
    staging_peers = g.peer_table(staging)
    out = g.tensor("out", (rows, n), "bf16")
    mt, nt = rows // cfg.block_m, n // cfg.block_n
    rs = g.event((ranks, mt, nt), wait_count=ranks, name="rs", ranked=True)
    gemm_opts = dict(
        block_size=cfg.block_size, warps=cfg.warps, stages=cfg.stages, core=cfg.core,
        inflight=cfg.inflight, smem_limit=cfg.smem_limit, block_k=cfg.block_k,
    )  # fmt: skip
    # With fused_reduce the own-row instances of this task do nothing: the
    # rank coordinate outermost keeps them out of the way (interleaved, the
    # static schedule's round-robin would give all the work to half the CTAs).
    default = "rij" if cfg.fused_reduce else GEMM_ORDER["gemm_rs"]
    order = (cfg.gemm_order or default).replace("r", "d")
    gemm = tiles.gemm_to_peer(
        cfg.block_m, cfg.block_n, cfg.k, skip_own=cfg.fused_reduce, coords=order, **gemm_opts
    )
    # With fused_reduce an own-row instance only notifies (the count stays R).
    g.task(
        gemm, grid=_grid(order, d=ranks, i=mt, j=nt), args=(rank, X, W, staging_peers),
        out_edges={rs: f"{order}->d,i,j"}, name="gemm",
    )  # fmt: skip
    if cfg.fused_reduce:
        own = tiles.gemm_reduce_own(cfg.block_m, cfg.block_n, cfg.k, **gemm_opts)
        g.task(
            own, grid=(mt, nt), args=(rank, X, W, staging, out), in_edges={rs: "ij->rank,i,j"},
            name="gemm_own",
        )  # fmt: skip
        return g
    reduce = tiles.reduce_slots(
        cfg.block_m, cfg.block_n, block_size=cfg.block_size, unroll=cfg.loads_in_flight
    )
    g.task(
        reduce, grid=(mt, nt), args=(staging, out), in_edges={rs: "ij->rank,i,j"},
        name="reduce",
    )  # fmt: skip
    return g


def allgather_gemm(cfg: CollectiveConfig, name: str = "ag_gemm") -> Graph:
    g = Graph(name, block_size=cfg.block_size)
    rank, ranks = g.ranks()
    rows, n = g.symbol("rows"), g.symbol("N")
    A = g.tensor("A", (rows, cfg.k), "bf16")
    full = g.tensor("A_full", (ranks * rows, cfg.k), "bf16")
    full_peers = g.peer_table(full)
    W = g.tensor("W", (n, cfg.k), "bf16")
    C = g.tensor("C", (ranks, rows, n), "bf16")
    mt, nt = rows // cfg.block_m, n // cfg.block_n
    # A GEMM row block's rows arrive in `parts` copy tiles (spread over CTAs:
    # one CTA copies only ~10 GB/s); a GEMM tile waits for exactly its rows.
    parts = cfg.copy_parts
    ag = g.event((ranks, ranks, mt), wait_count=parts, name="ag", ranked=True)
    copy = tiles.copy_to_peers(
        cfg.block_m,
        cfg.k,
        parts=parts,
        block_size=cfg.block_size,
        skip_own=cfg.own_first,
        unroll=cfg.loads_in_flight,
    )
    gemm_opts = dict(
        block_size=cfg.block_size, warps=cfg.warps, stages=cfg.stages, core=cfg.core,
        inflight=cfg.inflight, smem_limit=cfg.smem_limit, block_k=cfg.block_k,
    )  # fmt: skip
    # own_first: a copy to this rank only notifies (its wait count stays `parts`).
    g.task(
        copy, grid=(ranks, mt, parts), args=(rank, A, full_peers),
        out_edges={ag: "dtp->d,rank,t"}, name="copy",
    )  # fmt: skip
    order = (cfg.gemm_order or GEMM_ORDER["ag_gemm"]).replace("r", "s")
    grid = _grid(order, s=ranks, i=mt, j=nt)
    if not cfg.own_first:
        gemm = tiles.gemm_chunk(cfg.block_m, cfg.block_n, cfg.k, coords=order, **gemm_opts)
        g.task(
            gemm, grid=grid, args=(full, W, C), in_edges={ag: f"{order}->rank,s,i"},
            name="gemm",
        )  # fmt: skip
        return g
    own_order = order.replace("s", "")
    own = tiles.gemm_chunk(
        cfg.block_m, cfg.block_n, cfg.k, chunks="own", name="gemm_chunk_own", coords=own_order,
        **gemm_opts,
    )  # fmt: skip
    peers = tiles.gemm_chunk(
        cfg.block_m,
        cfg.block_n,
        cfg.k,
        chunks="peers",
        name="gemm_chunk_peers",
        coords=order,
        **gemm_opts,
    )
    g.task(own, grid=_grid(own_order, i=mt, j=nt), args=(rank, A, W, C), name="gemm_own")
    g.task(
        peers, grid=grid, args=(rank, full, W, C), in_edges={ag: f"{order}->rank,s,i"},
        name="gemm",
    )  # fmt: skip
    return g


def _bf16_round(x: np.ndarray) -> np.ndarray:
    return bf16_to_f32(f32_to_bf16(x))


def reference_gemm_reduce_scatter(xs: list[np.ndarray], ws: list[np.ndarray]) -> list[np.ndarray]:
    """Per rank, its rows of ``sum_r bf16(X_r @ W_r^T)`` (float32; inputs float32 holding
    bf16 values). Each partial is rounded to bf16, as the tiles send it."""
    total = sum(_bf16_round(x @ w.T) for x, w in zip(xs, ws, strict=True))
    return list(np.split(total, len(xs), axis=0))


def reference_allgather_gemm(as_: list[np.ndarray], ws: list[np.ndarray]) -> list[np.ndarray]:
    """Per rank, ``concat(A) @ W_r^T`` (float32)."""
    full = np.concatenate(as_, axis=0)
    return [full @ w.T for w in ws]

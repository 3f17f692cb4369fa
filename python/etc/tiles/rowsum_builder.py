"""The split-K row-sum tiles of :mod:`etc.tiles.rowsum`, written with the Python tile builder.

Same signatures, semantics, numpy references and algorithm (one warp per
row of ``partial_sum`` with 16-byte loads and a shuffle reduction, one
thread per row of ``final_sum``) as the MLIR-text versions, so either can
be used in a graph. Importing this module needs the MLIR bindings, which is
why :mod:`etc.tiles` does not import it.
"""

from __future__ import annotations

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..tilebuilder import TileBuilder, Val, f32, memref_type, tile
from . import rowsum

__all__ = ["partial_sum", "final_sum"]


@checked_arguments
def partial_sum(
    rows_per_task: int,
    k_split: int,
    K: int,
    *,
    name: str = "partial_sum",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``(i, j)``: ``B[rows(i), j] = A[rows(i), chunk(j)].sum(axis=1)``.

    See :func:`etc.tiles.rowsum.partial_sum` for the requirements on the sizes.
    """
    # The MLIR-text tile checks the configuration and owns the reference.
    text = rowsum.partial_sum(rows_per_task, k_split, K, name=name, block_size=block_size)
    R, S, chunk = rows_per_task, k_split, K // k_split

    @tile(
        grid_rank=2,
        args=[memref_type((None, K), f32), memref_type((None, S), f32)],
        block_size=block_size,
        reference=text.reference,
        name=name,
    )
    def body(t: TileBuilder, i: Val, j: Val, A: Val, B: Val) -> None:
        row_begin = i * R
        row_end = t.min(row_begin + R, t.dim(A, 0))  # the last task may be partial
        col_begin = j * chunk
        # Warps stride over the rows: the trip count is warp-uniform, so every
        # lane reaches the shuffles.
        for row in t.range(row_begin + t.warp_id(), row_end, t.num_warps):
            loop = t.range(t.lane_id() * 4, chunk, 4 * 32, carry=[t.zeros(4)])
            for k, part in loop:
                loop.yield_(part + t.load_vec(A, [row, col_begin + k], width=4))
            total = t.warp_reduce(t.vector_sum(loop.result), "add")
            with t.if_(t.lane_id() == 0):
                t.store(total, B, [row, j])

    return body


@checked_arguments
def final_sum(
    rows_per_task: int,
    k_split: int,
    *,
    name: str = "final_sum",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``i``: ``C[rows(i)] = B[rows(i), :].sum(axis=1)``, one thread per row."""
    text = rowsum.final_sum(rows_per_task, k_split, name=name, block_size=block_size)
    R, S = rows_per_task, k_split

    @tile(
        grid_rank=1,
        args=[memref_type((None, S), f32), memref_type((None,), f32)],
        block_size=block_size,
        reference=text.reference,
        name=name,
    )
    def body(t: TileBuilder, i: Val, B: Val, C: Val) -> None:
        row_begin = i * R
        row_end = t.min(row_begin + R, t.dim(B, 0))
        for row in t.range(row_begin + t.thread_id(), row_end, t.block_size):
            if S % 4 == 0:  # 16-byte loads
                loop = t.range(0, S, 4, carry=[t.zeros(4)])
                for k, part in loop:
                    loop.yield_(part + t.load_vec(B, [row, k], width=4))
                total = t.vector_sum(loop.result)
            else:
                loop = t.range(0, S, carry=[t.f32(0.0)])
                for k, acc in loop:
                    loop.yield_(acc + t.load(B, [row, k]))
                total = loop.result
            t.store(total, C, [row])

    return body

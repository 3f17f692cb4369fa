"""RMSNorm over a batch of rows as two tile functions.

``Y[r] = X[r] * rsqrt(mean(X[r] ** 2) + eps) * W`` for ``X`` of shape
``(b, H)``, with the hidden dimension split into ``S`` chunks of ``H / S``:

* ``sum_squares`` over the grid ``(b, S)``: instance ``(i, j)`` writes the
  sum of squares of chunk ``j`` of row ``i`` into ``P[i, j]``;
* ``scale`` over the grid ``(b, S)``: once row ``i``'s ``S`` partials are
  in (an event with wait count ``S``), instance ``(i, j)`` normalises chunk
  ``j`` of row ``i`` into ``Y``.

Buffers: ``X, Y: memref<?xHxf32>``, ``W: memref<Hxf32>``, ``P:
memref<?xSxf32>``. The tiles are written for one CTA of ``block_size``
threads (256 by default): all warps share a chunk, each thread reading 16
bytes (``vector<4xf32>``) per step, so the buffers' base addresses must be
16-byte aligned (every CUDA/torch allocation is).
"""

from __future__ import annotations

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..errors import GraphError
from . import _text

__all__ = ["sum_squares", "scale"]


def _check(name: str, hidden: int, splits: int, block_size: int) -> int:
    """The chunk width ``hidden / splits``, after checking the configuration."""
    for key, value in (("hidden", hidden), ("splits", splits), ("block_size", block_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GraphError(f"tile '{name}': {key} must be a positive int, got {value!r}")
    if hidden % splits:
        raise GraphError(f"tile '{name}': hidden={hidden} is not divisible by splits={splits}")
    chunk = hidden // splits
    if chunk % 4:
        raise GraphError(
            f"tile '{name}': the chunk hidden/splits={chunk} must be a multiple of 4 for "
            "16-byte vector loads"
        )
    if block_size % 32:
        raise GraphError(f"tile '{name}': block_size={block_size} is not a multiple of 32")
    return chunk


@checked_arguments
def sum_squares(
    hidden: int,
    splits: int,
    *,
    name: str = "sum_squares",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``(i, j)``: ``P[i, j] = sum(X[i, chunk(j)] ** 2)``.

    Threads stride the chunk by ``4 * block_size`` columns with 16-byte
    loads and fused multiply-adds; a ``gpu.shuffle xor`` butterfly reduces
    each warp, lane 0 of every warp leaves its sum in workgroup memory and
    thread 0 adds the per-warp sums. The workgroup buffer is a
    ``memref.global`` (an ``alloca`` in workgroup memory cannot lower on
    NVPTX) named ``@<name>__warp_sums``.
    """
    chunk = _check(name, hidden, splits, block_size)
    warps = block_size // 32
    x_type, p_type = f"memref<?x{hidden}xf32>", f"memref<?x{splits}xf32>"
    smem_type = f"memref<{warps}xf32, #gpu.address_space<workgroup>>"
    shuffles, value = _text.warp_sum("%sum", "  ")
    source = f"""\
// {name}: P[i, j] = sum(X[i, j*{chunk} : (j+1)*{chunk}] ** 2), one CTA of {block_size} threads.
memref.global "private" @{name}__warp_sums : {smem_type} {{alignment = 16 : i64}}
func.func @{name}(%i: index, %j: index, %X: {x_type}, %P: {p_type}) {{
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %c32 = arith.constant 32 : index
  %cStride = arith.constant {4 * block_size} : index
  %cChunk = arith.constant {chunk} : index
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %zero = arith.constant dense<0.0> : vector<4xf32>
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_lane0 = arith.cmpi eq, %lane, %c0 : index
  %is_thread0 = arith.cmpi eq, %tid, %c0 : index
  %col_begin = arith.muli %j, %cChunk : index
  %first = arith.muli %tid, %c4 : index
  // Threads past the chunk run no iteration but still join the shuffles.
  %acc = scf.for %k = %first to %cChunk step %cStride iter_args(%part = %zero) -> (vector<4xf32>) {{
    %col = arith.addi %col_begin, %k : index
    %v = vector.load %X[%i, %col] {{alignment = 16 : i64}} : {x_type}, vector<4xf32>
    %next = vector.fma %v, %v, %part : vector<4xf32>
    scf.yield %next : vector<4xf32>
  }}
  %sum = vector.reduction <add>, %acc : vector<4xf32> into f32
{shuffles}
  %warp_sums = memref.get_global @{name}__warp_sums : {smem_type}
  // Thread 0 of this CTA's previous {name} call may still be reading.
  gpu.barrier
  scf.if %is_lane0 {{
    memref.store {value}, %warp_sums[%warp] : {smem_type}
  }}
  gpu.barrier
  scf.if %is_thread0 {{
    %parts = vector.load %warp_sums[%c0] {{alignment = 16 : i64}} : {smem_type}, vector<{warps}xf32>
    %total = vector.reduction <add>, %parts : vector<{warps}xf32> into f32
    memref.store %total, %P[%i, %j] : {p_type}
  }}
  return
}}
"""

    def reference(i: int, j: int, X: np.ndarray, P: np.ndarray) -> None:
        part = X[i, j * chunk : (j + 1) * chunk].astype(np.float32)
        P[i, j] = np.dot(part, part)

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


@checked_arguments
def scale(
    hidden: int,
    splits: int,
    eps: float = 1e-6,
    *,
    name: str = "rms_scale",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``(i, j)``: ``Y[i, c] = X[i, c] * rsqrt(sum(P[i, :]) / hidden + eps) * W[c]``.

    ``c`` ranges over chunk ``j``. ``P[i, :]`` is only ``splits`` floats, so
    every thread adds the row itself (a broadcast read) instead of reducing
    across the CTA; the chunk is then scaled with 16-byte loads and stores.
    ``math.rsqrt`` lowers to ``rsqrt.approx.f32`` (relative error < 2**-22).
    """
    chunk = _check(name, hidden, splits, block_size)
    _text.check_eps(name, eps)
    S = splits
    x_type, w_type, p_type = (
        f"memref<?x{hidden}xf32>",
        f"memref<{hidden}xf32>",
        f"memref<?x{S}xf32>",
    )
    row_sum = _text.row_sum("%P", p_type, "%i", S, "%total", "  ")
    source = f"""\
// {name}: Y[i, c] = X[i, c] * rsqrt(sum(P[i, :]) / {hidden} + {eps!r}) * W[c], c in chunk j of {chunk}.
func.func @{name}(%i: index, %j: index, %X: {x_type}, %W: {w_type}, %P: {p_type}, %Y: {x_type}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %cS = arith.constant {S} : index
  %cStride = arith.constant {4 * block_size} : index
  %cChunk = arith.constant {chunk} : index
  %zero = arith.constant dense<0.0> : vector<4xf32>
  %fzero = arith.constant 0.0 : f32
  %hidden = arith.constant {float(hidden):.9e} : f32
  %eps = arith.constant {float(eps):.9e} : f32
  %tid = gpu.thread_id x
{row_sum}
  %mean = arith.divf %total, %hidden : f32
  %shifted = arith.addf %mean, %eps : f32
  %inv = math.rsqrt %shifted : f32
  %inv4 = vector.broadcast %inv : f32 to vector<4xf32>
  %col_begin = arith.muli %j, %cChunk : index
  %first = arith.muli %tid, %c4 : index
  scf.for %k = %first to %cChunk step %cStride {{
    %col = arith.addi %col_begin, %k : index
    %x = vector.load %X[%i, %col] {{alignment = 16 : i64}} : {x_type}, vector<4xf32>
    %w = vector.load %W[%col] {{alignment = 16 : i64}} : {w_type}, vector<4xf32>
    %xs = arith.mulf %x, %inv4 : vector<4xf32>
    %y = arith.mulf %xs, %w : vector<4xf32>
    vector.store %y, %Y[%i, %col] {{alignment = 16 : i64}} : {x_type}, vector<4xf32>
  }}
  return
}}
"""
    eps32 = np.float32(eps)

    def reference(
        i: int, j: int, X: np.ndarray, W: np.ndarray, P: np.ndarray, Y: np.ndarray
    ) -> None:
        cols = slice(j * chunk, (j + 1) * chunk)
        mean = P[i].sum(dtype=np.float32) / np.float32(hidden)
        inv = np.float32(1) / np.sqrt(mean + eps32)
        Y[i, cols] = X[i, cols] * inv * W[cols]

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)

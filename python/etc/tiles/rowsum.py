"""Split-K row sum (the paper's Figure 3) as two tile functions.

``C[r] = sum_k A[r, k]`` for ``A`` of shape ``(n, K)``, split in two tasks:

* ``partial_sum`` over the grid ``(ceil(n / R), S)``: instance ``(i, j)``
  sums rows ``[i*R, (i+1)*R)`` of ``A`` over the column chunk
  ``[j*K/S, (j+1)*K/S)`` into ``B[row, j]``;
* ``final_sum`` over the grid ``(ceil(n / R),)``: instance ``i`` sums
  ``B[row, :]`` into ``C[row]``.

Rows at or past ``n`` are skipped (``n`` need not be a multiple of ``R``).
Buffers: ``A: memref<?xKxf32>``, ``B: memref<?xSxf32>``, ``C: memref<?xf32>``.
The vector loads promise 16-byte alignment: the buffers' base addresses
must be 16-byte aligned (every CUDA/torch allocation is).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..errors import GraphError
from . import _text

__all__ = ["partial_sum", "final_sum"]


def _check(name: str, **values: int) -> None:
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GraphError(f"tile '{name}': {key} must be a positive int, got {value!r}")


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

    One warp per row (warps stride over the task's rows); each lane reads
    16 bytes (``vector<4xf32>``) per step, lanes stride the chunk by 128
    columns, then a ``gpu.shuffle xor`` butterfly reduces the warp and lane
    0 stores. Needs ``K % k_split == 0`` and a chunk ``K / k_split`` that is
    a multiple of 4 (one 16-byte load per lane step).
    """
    R, S = rows_per_task, k_split
    _check(name, rows_per_task=R, k_split=S, K=K)
    if K % S:
        raise GraphError(f"tile '{name}': K={K} is not divisible by k_split={S}")
    chunk = K // S
    if chunk % 4:
        raise GraphError(
            f"tile '{name}': the column chunk K/k_split={chunk} must be a multiple of "
            "4 for 16-byte vector loads"
        )
    warps = block_size // 32
    a_type, b_type = f"memref<?x{K}xf32>", f"memref<?x{S}xf32>"
    shuffles, value = _text.warp_sum("%sum", "      ")
    source = f"""\
// {name}: B[i*{R} + r, j] = sum(A[i*{R} + r, j*{chunk} : (j+1)*{chunk}]), r < {R}, rows < n.
func.func @{name}(%i: index, %j: index, %A: {a_type}, %B: {b_type}) {{
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %c32 = arith.constant 32 : index
  %c128 = arith.constant 128 : index
  %cR = arith.constant {R} : index
  %cWarps = arith.constant {warps} : index
  %cChunk = arith.constant {chunk} : index
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %zero = arith.constant dense<0.0> : vector<4xf32>
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_lane0 = arith.cmpi eq, %lane, %c0 : index
  // Rows of this task, clipped to n (the last task may be partial).
  %n = memref.dim %A, %c0 : {a_type}
  %row_begin = arith.muli %i, %cR : index
  %row_stop = arith.addi %row_begin, %cR : index
  %row_end = arith.minui %row_stop, %n : index
  %first_row = arith.addi %row_begin, %warp : index
  %col_begin = arith.muli %j, %cChunk : index
  %lane_col = arith.muli %lane, %c4 : index
  // Warp-uniform trip count, so every lane reaches the shuffles.
  scf.for %row = %first_row to %row_end step %cWarps {{
    %acc = scf.for %k = %lane_col to %cChunk step %c128 iter_args(%part = %zero) -> (vector<4xf32>) {{
      %col = arith.addi %col_begin, %k : index
      %v = vector.load %A[%row, %col] {{alignment = 16 : i64}} : {a_type}, vector<4xf32>
      %next = arith.addf %part, %v : vector<4xf32>
      scf.yield %next : vector<4xf32>
    }}
    %sum = vector.reduction <add>, %acc : vector<4xf32> into f32
{shuffles}
    scf.if %is_lane0 {{
      memref.store {value}, %B[%row, %j] : {b_type}
    }}
  }}
  return
}}
"""

    def reference(i: int, j: int, A: np.ndarray, B: np.ndarray) -> None:
        rows = slice(i * R, min((i + 1) * R, A.shape[0]))
        B[rows, j] = A[rows, j * chunk : (j + 1) * chunk].sum(axis=1, dtype=np.float32)

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


@checked_arguments
def final_sum(
    rows_per_task: int,
    k_split: int,
    *,
    name: str = "final_sum",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``i``: ``C[rows(i)] = B[rows(i), :].sum(axis=1)``.

    A row of ``B`` is only ``k_split`` floats, so one thread per row (threads
    stride over the task's rows) beats a warp per row; with ``k_split % 4 ==
    0`` each thread reads its row in 16-byte vector loads.
    """
    R, S = rows_per_task, k_split
    _check(name, rows_per_task=R, k_split=S)
    b_type, c_type = f"memref<?x{S}xf32>", "memref<?xf32>"
    row_sum = _text.row_sum("%B", b_type, "%row", S, "%sum", "    ")
    source = f"""\
// {name}: C[i*{R} + r] = sum(B[i*{R} + r, :]), r < {R}, rows < n.
func.func @{name}(%i: index, %B: {b_type}, %C: {c_type}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %cR = arith.constant {R} : index
  %cS = arith.constant {S} : index
  %cThreads = arith.constant {block_size} : index
  %zero = arith.constant dense<0.0> : vector<4xf32>
  %fzero = arith.constant 0.0 : f32
  %tid = gpu.thread_id x
  %n = memref.dim %B, %c0 : {b_type}
  %row_begin = arith.muli %i, %cR : index
  %row_stop = arith.addi %row_begin, %cR : index
  %row_end = arith.minui %row_stop, %n : index
  %first_row = arith.addi %row_begin, %tid : index
  scf.for %row = %first_row to %row_end step %cThreads {{
{row_sum}
    memref.store %sum, %C[%row] : {c_type}
  }}
  return
}}
"""

    def reference(i: int, B: np.ndarray, C: np.ndarray) -> None:
        rows = slice(i * R, min((i + 1) * R, B.shape[0]))
        C[rows] = B[rows].sum(axis=1, dtype=np.float32)

    fn: Callable[..., None] = reference
    return DeviceFunction.from_mlir(source, name, fn, block_size=block_size)

"""Synthetic tiles for schedule tests and benchmarks: known costs, checkable
results.

* ``lincomb(k)``: ``out[i] = sum_j coef_j * in_j[i] + bias`` over blocks of
  ``block_size`` elements (one element per thread), for DAG tests whose
  every edge changes the numbers;
* ``spin(iterations, heavy_every, heavy_factor)``: instance ``i`` runs
  ``iterations`` dependent FMAs per thread, ``heavy_factor`` times more when
  ``i % heavy_every == 0``, then writes a value derived from ``i`` into
  ``out[i]``: the skewed workload of the scheduling benchmark;
* ``empty(rank)``: does nothing; measures scheduling overhead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..errors import GraphError

__all__ = ["lincomb", "spin", "empty", "spin_value"]


def _fmt(x: float) -> str:
    return f"{float(x):.9e}"


@checked_arguments
def lincomb(
    coefs: Sequence[float],
    bias: float = 0.0,
    *,
    span: int | None = None,
    name: str = "lincomb",
    block_size: int = 256,
) -> DeviceFunction:
    """``out[b*S + t] = sum_j coefs[j] * in_j[b*S + t] + bias`` for instance
    ``b`` and thread ``t < S``, with ``S = span`` elements per instance
    (default: one per thread); elements past the buffer's end are skipped.
    Arguments: the instance index, then ``len(coefs)`` inputs and the
    output, all ``memref<?xf32>``."""
    if not coefs:
        raise GraphError(f"tile '{name}': needs at least one input coefficient")
    span = block_size if span is None else span
    if not isinstance(span, int) or not 1 <= span <= block_size:
        raise GraphError(f"tile '{name}': span must be in 1..{block_size}, got {span!r}")
    ins = [f"%in{j}: memref<?xf32>" for j in range(len(coefs))]
    terms = []
    acc = "%bias"
    for j, c in enumerate(coefs):
        terms.append(
            f"      %x{j} = memref.load %in{j}[%e] : memref<?xf32>\n"
            f"      %k{j} = arith.constant {_fmt(c)} : f32\n"
            f"      %t{j} = arith.mulf %x{j}, %k{j} : f32\n"
            f"      %s{j} = arith.addf {acc}, %t{j} : f32"
        )
        acc = f"%s{j}"
    source = f"""
func.func @{name}(%b: index, {", ".join(ins)}, %out: memref<?xf32>) {{
  %c0 = arith.constant 0 : index
  %cT = arith.constant {span} : index
  %tid = gpu.thread_id x
  %base = arith.muli %b, %cT : index
  %e = arith.addi %base, %tid : index
  %n = memref.dim %out, %c0 : memref<?xf32>
  %inBuffer = arith.cmpi ult, %e, %n : index
  %inSpan = arith.cmpi ult, %tid, %cT : index
  %inside = arith.andi %inBuffer, %inSpan : i1
  scf.if %inside {{
      %bias = arith.constant {_fmt(bias)} : f32
{chr(10).join(terms)}
      memref.store {acc}, %out[%e] : memref<?xf32>
  }}
  return
}}
"""

    def reference(b: int, *arrays: np.ndarray) -> None:
        *inputs, out = arrays
        lo, hi = min(b * span, len(out)), min((b + 1) * span, len(out))
        value = np.full(hi - lo, np.float32(bias), np.float32)
        for c, x in zip(coefs, inputs, strict=True):
            value = value + np.float32(c) * x[lo:hi]
        out[lo:hi] = value

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def spin_value(i: int, iterations: int) -> float:
    """What ``spin`` writes for instance ``i`` (its numpy reference)."""
    return float(i) + float(iterations)


@checked_arguments
def spin(
    iterations: int,
    heavy_every: int = 0,
    heavy_factor: int = 10,
    *,
    name: str = "spin",
    block_size: int = 256,
) -> DeviceFunction:
    """Instance ``i`` (1-D grid) spins ``iterations`` dependent steps per
    thread (``heavy_factor`` times more when ``heavy_every`` divides ``i``),
    then thread 0 writes ``i + iterations`` to ``out[i]``. The loop carries a
    value the compiler cannot fold, so its cost is real."""
    for key, value in (("iterations", iterations), ("heavy_factor", heavy_factor)):
        if not isinstance(value, int) or value < 1:
            raise GraphError(f"tile '{name}': {key} must be a positive int, got {value!r}")
    heavy = (
        f"""  %cEvery = arith.constant {heavy_every} : index
  %rem = arith.remui %i, %cEvery : index
  %isHeavy = arith.cmpi eq, %rem, %c0 : index
  %cHeavy = arith.constant {iterations * heavy_factor} : index
  %trips = arith.select %isHeavy, %cHeavy, %cIters : index"""
        if heavy_every
        else "  %trips = arith.addi %cIters, %c0 : index"
    )
    source = f"""
func.func @{name}(%i: index, %out: memref<?xf32>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cIters = arith.constant {iterations} : index
{heavy}
  %tid = gpu.thread_id x
  %tidi = arith.index_cast %tid : index to i32
  %seed = arith.sitofp %tidi : i32 to f32
  %one = arith.constant 1.0 : f32
  %half = arith.constant 0.5 : f32
  %r = scf.for %k = %c0 to %trips step %c1 iter_args(%acc = %seed) -> (f32) {{
    %m = arith.mulf %acc, %half : f32
    %a = arith.addf %m, %one : f32
    scf.yield %a : f32
  }}
  %first = arith.cmpi eq, %tid, %c0 : index
  scf.if %first {{
    // %r converges to 2; subtracting it keeps the value exact while the
    // loop stays live.
    %two = arith.constant 2.0 : f32
    %d = arith.subf %r, %two : f32
    %tiny = arith.constant 1.0e-30 : f32
    %z = arith.mulf %d, %tiny : f32
    %ii = arith.index_cast %i : index to i64
    %fi = arith.sitofp %ii : i64 to f32
    %it = arith.constant {float(iterations):.1f} : f32
    %v0 = arith.addf %fi, %it : f32
    %v = arith.addf %v0, %z : f32
    memref.store %v, %out[%i] : memref<?xf32>
  }}
  return
}}
"""

    def reference(i: int, out: np.ndarray) -> None:
        out[i] = spin_value(i, iterations)

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


@checked_arguments
def empty(rank: int = 1, *, name: str = "empty", block_size: int = 256) -> DeviceFunction:
    """A tile that does nothing: the cost of scheduling alone."""
    coords = ", ".join(f"%i{d}: index" for d in range(rank))
    source = f"func.func @{name}({coords}) {{\n  return\n}}\n"
    return DeviceFunction.from_mlir(source, name, lambda *a: None, block_size=block_size)

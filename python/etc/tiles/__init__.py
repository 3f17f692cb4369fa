"""Tile library: device functions for real workloads, each with a numpy reference.

Every factory returns an :class:`etc.DeviceFunction` whose MLIR body uses
only upstream dialects (arith, scf, memref, vector, gpu, math) and whose
``reference`` computes the same tile on numpy arrays for the simulator.

:mod:`etc.tiles.rowsum_builder` holds the ``rowsum`` tiles written with the
Python tile builder; it needs the MLIR bindings, so it is not imported here.
"""

from . import rmsnorm, rowsum, synthetic
from .rmsnorm import scale as rms_scale
from .rmsnorm import sum_squares
from .rowsum import final_sum, partial_sum

__all__ = ["rowsum", "rmsnorm", "synthetic", "partial_sum", "final_sum", "sum_squares", "rms_scale"]

from . import gemm  # noqa: E402  (bf16 tensor-core GEMM tiles: gemm.gemm, gemm.moe_gate_up, gemm.moe_down)

__all__ += ["gemm"]

from . import llama  # noqa: E402  (Llama decoder tiles: embed, rmsnorm, attention, combine, argmax)

__all__ += ["llama"]

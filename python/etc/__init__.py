"""ETC, the Event Tensor Compiler.

Build task graphs wired by event tensors (:class:`Graph`), check and run
them on the CPU (:func:`simulate`), compile them to one persistent GPU
kernel (:func:`compile`) and launch them (:mod:`etc.runtime`).

Importing ``etc`` needs only numpy: the compiled MLIR extension is loaded by
:func:`compile` (and ``etc.ir`` & co.) on first use, so artifacts can be run
on machines that only have the runtime. The Python tile builder
(:func:`tile`, :class:`TileBuilder`, :func:`memref_type`, the element types
``f32`` & co.; see :mod:`etc.tilebuilder`) is built on the MLIR bindings and
imported on first access; it is left out of ``__all__`` so that
``from etc import *`` still needs only numpy.
"""

from typing import Any

from .buckets import compile_buckets
from .device import DeviceFunction
from .dtypes import bf16_to_f32, f32_to_bf16
from .edgemap import EdgeMap
from .errors import (
    CompileError,
    DeadlockError,
    EtcError,
    GraphError,
    LaunchError,
    LaunchTimeoutError,
    ShapeError,
    TriggerRangeError,
    WaitCountError,
)
from .graph import Edge, Event, Graph, Task, Tensor
from .simulator import simulate, simulate_ranks, static_queues
from .symbolic import Symbol, SymExpr

__version__ = "0.1.0"

__all__ = [
    "Graph",
    "Tensor",
    "Event",
    "Task",
    "Edge",
    "EdgeMap",
    "Symbol",
    "SymExpr",
    "DeviceFunction",
    "EtcError",
    "GraphError",
    "ShapeError",
    "CompileError",
    "LaunchError",
    "LaunchTimeoutError",
    "DeadlockError",
    "TriggerRangeError",
    "WaitCountError",
    "simulate",
    "simulate_ranks",
    "static_queues",
    "compile",
    "compile_buckets",
    "f32_to_bf16",
    "bf16_to_f32",
    "__version__",
]


# Names of etc.tilebuilder, which needs the MLIR bindings: imported on first use.
_TILEBUILDER = frozenset(
    {
        "tile",
        "TileBuilder",
        "Val",
        "MemRefSpec",
        "memref_type",
        "f64",
        "f32",
        "f16",
        "bf16",
        "i64",
        "i32",
        "i16",
        "i8",
        "i1",
    }
)


def __getattr__(name: str) -> Any:
    if name in _TILEBUILDER:
        from . import tilebuilder

        return getattr(tilebuilder, name)
    raise AttributeError(f"module 'etc' has no attribute {name!r}")


def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - the public name
    """Compile a graph; see :func:`etc.compiler.compile` (loads the MLIR extension)."""
    from .compiler import compile as _compile

    return _compile(*args, **kwargs)

"""ETC, the Event Tensor Compiler.

Build task graphs wired by event tensors (:class:`Graph`), check and run
them on the CPU (:func:`simulate`), compile them to one persistent GPU
kernel (:func:`compile`) and launch them (:mod:`etc.runtime`).

Importing ``etc`` needs only numpy: the compiled MLIR extension is loaded by
:func:`compile` (and ``etc.ir`` & co.) on first use, so artifacts can be run
on machines that only have the runtime.
"""

from typing import Any

from .device import DeviceFunction
from .dtypes import bf16_to_f32, f32_to_bf16
from .edgemap import EdgeMap
from .errors import (
    CompileError,
    DeadlockError,
    EtcError,
    GraphError,
    LaunchError,
    ShapeError,
)
from .graph import Edge, Event, Graph, Task, Tensor
from .simulator import simulate, static_queues
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
    "DeadlockError",
    "simulate",
    "static_queues",
    "compile",
    "f32_to_bf16",
    "bf16_to_f32",
    "__version__",
]


def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - the public name
    """Compile a graph; see :func:`etc.compiler.compile` (loads the MLIR extension)."""
    from .compiler import compile as _compile

    return _compile(*args, **kwargs)

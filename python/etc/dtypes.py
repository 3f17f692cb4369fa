"""Element types: ETC names, MLIR element types and numpy dtypes.

ETC names are short (``f32``, ``bf16``, ``i32``, ``u8``, ...). Unsigned types
map to MLIR's *signless* integers (``u8`` -> ``i8``) because arith ops only
take signless integers; numpy keeps the unsigned dtype.

numpy has no bfloat16: the simulator stores ``bf16`` tensors as ``uint16``
holding the raw bits (the upper half of an IEEE float32). Use
:func:`f32_to_bf16` / :func:`bf16_to_f32` to convert; :func:`etc.simulate`
converts floating-point inputs of ``bf16`` tensors automatically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import GraphError

__all__ = ["DType", "dtype", "torch_dtype", "f32_to_bf16", "bf16_to_f32"]


@dataclass(frozen=True)
class DType:
    """An element type: ``name`` (ETC), ``mlir`` (MLIR type), ``numpy`` (storage)."""

    name: str
    mlir: str
    numpy: np.dtype

    @property
    def is_integer(self) -> bool:
        return self.mlir.startswith("i")

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    def __str__(self) -> str:
        return self.name


_TABLE: dict[str, tuple[str, str]] = {
    "f64": ("f64", "float64"),
    "f32": ("f32", "float32"),
    "f16": ("f16", "float16"),
    "bf16": ("bf16", "uint16"),  # raw bits; numpy has no bfloat16
    "i64": ("i64", "int64"),
    "i32": ("i32", "int32"),
    "i16": ("i16", "int16"),
    "i8": ("i8", "int8"),
    "u64": ("i64", "uint64"),
    "u32": ("i32", "uint32"),
    "u16": ("i16", "uint16"),
    "u8": ("i8", "uint8"),
    "i1": ("i1", "bool"),
}

#: Other names of the element types: numpy's and torch's (``torch.long`` is
#: ``long``); the runtime matches tensors' dtypes with the same table.
ALIASES = {
    "float64": "f64",
    "double": "f64",
    "float32": "f32",
    "float": "f32",
    "float16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "long": "i64",
    "int32": "i32",
    "int": "i32",
    "int16": "i16",
    "short": "i16",
    "int8": "i8",
    "uint64": "u64",
    "uint32": "u32",
    "uint16": "u16",
    "uint8": "u8",
    "bool": "i1",
}

_DTYPES = {name: DType(name, mlir, np.dtype(storage)) for name, (mlir, storage) in _TABLE.items()}
#: Bytes an element of each type takes in memory (``i1`` one, as LLVM stores
#: ``memref<?xi1>``).
SIZES = {name: d.itemsize for name, d in _DTYPES.items()}


def dtype(spec: Any) -> DType:
    """Resolve ``spec`` (an ETC name, an alias, a numpy dtype or a DType)."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str):
        key = ALIASES.get(spec, spec)
        if key in _DTYPES:
            return _DTYPES[key]
        raise GraphError(f"unknown element type '{spec}'; expected one of {', '.join(_DTYPES)}")
    try:
        np_dtype = np.dtype(spec)
    except TypeError:
        raise GraphError(f"unknown element type {spec!r}") from None
    # uint16 means u16 here, never bf16: bf16 must be asked for by name.
    key = ALIASES.get(np_dtype.name)
    if key is None:
        raise GraphError(f"element type {np_dtype} is not supported")
    return _DTYPES[key]


def torch_dtype(spec: Any) -> Any:
    """The torch dtype of an element type (``bf16``: ``torch.bfloat16``, not
    its uint16 storage); imports torch."""
    import torch

    d = dtype(spec)
    return torch.bfloat16 if d.name == "bf16" else getattr(torch, d.numpy.name)


def f32_to_bf16(values: Any) -> np.ndarray:
    """Round float values to bfloat16 (nearest even) and return the uint16 bits."""
    f = np.asarray(values, dtype=np.float32)
    bits = np.ascontiguousarray(f.reshape(-1)).view(np.uint32)
    # In 32 bits: only NaNs' payloads can carry past the top, and they are redone below.
    one = np.uint32(1)
    out = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & one)) >> np.uint32(16)).astype(
        np.uint16
    )
    # NaN must stay NaN (rounding could carry it into infinity): keep a quiet NaN.
    nan = np.isnan(f.reshape(-1))
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out.reshape(f.shape)


def bf16_to_f32(bits: Any) -> np.ndarray:
    """Widen bfloat16 bits (uint16) to float32 values."""
    b = np.asarray(bits, dtype=np.uint16)
    wide = np.ascontiguousarray(b.reshape(-1)).astype(np.uint32) << 16
    return wide.view(np.float32).reshape(b.shape)

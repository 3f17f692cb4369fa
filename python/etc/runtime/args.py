"""Launch argument validation, kept free of driver calls so it is testable without a GPU.

Convention: a missing or unknown name, or a tensor on the wrong device, is a `LaunchError`;
a value that does not match its declaration (symbol value, shape, dtype, layout, size) is a
`ShapeError`. Both name the symbol or tensor and say what differed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from etc.errors import LaunchError, ShapeError
from etc.runtime.manifest import DTYPE_SIZES, Manifest, bind_size, canonical_dtype, numel

# Kernel index arithmetic is 64-bit signed; keep every byte count below that.
MAX_BYTES = (1 << 63) - 1
MAX_POINTER = (1 << 64) - 1

TORCH, NUMPY, POINTER = "torch", "numpy", "pointer"


@dataclass
class BoundTensor:
    """One graph tensor as given to `launch`: its kind, device address and host object."""

    name: str
    kind: str
    ptr: int  # 0 for numpy arrays until they are staged on the device
    value: Any
    nbytes: int


def _fmt_shape(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _names_diff(kind: str, given: Sequence[str], expected: Sequence[str]) -> str:
    missing = [n for n in expected if n not in given]
    unknown = [n for n in given if n not in expected]
    parts = []
    if missing:
        parts.append(f"missing {kind} {', '.join(map(repr, missing))}")
    if unknown:
        parts.append(
            f"unknown {kind} {', '.join(map(repr, unknown))} (expected {', '.join(map(repr, expected))})"
        )
    return "; ".join(parts)


def check_mapping(graph: str, what: str, given: Any) -> None:
    """A launch's ``tensors`` or ``symbols`` must be a mapping of names."""
    if not isinstance(given, Mapping):
        raise LaunchError(f"{graph}: {what} must map names to values, got {type(given).__name__}")


def bind_symbols(manifest: Manifest, symbols: Mapping[str, Any] | None) -> tuple[int, ...]:
    """Symbol values in manifest order; every symbol given, each an int >= 0."""
    check_mapping(manifest.graph, "symbols", {} if symbols is None else symbols)
    symbols = dict(symbols or {})
    if len(symbols) != len(manifest.symbols) or any(s not in symbols for s in manifest.symbols):
        raise LaunchError(
            f"{manifest.graph}: {_names_diff('symbol', list(symbols), manifest.symbols)}"
        )
    out = [symbol_value(manifest, name, symbols[name]) for name in manifest.symbols]
    bound = dict(zip(manifest.symbols, out, strict=True))
    check_requirements(
        manifest.graph, ((s, bind_size(s, bound), m) for s, m in manifest.requirements), bound
    )
    return tuple(out)


def symbol_value(manifest: Manifest, name: str, v: Any) -> int:
    """The value ``v`` of the manifest's symbol ``name``: an int from 0 to
    the symbol's bound (``Graph.symbol(max=)``), else a ShapeError."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ShapeError(
            f"{manifest.graph}: symbol {name!r} must be an int, got {type(v).__name__} {v!r}"
        )
    if not 0 <= int(v) <= MAX_BYTES:
        raise ShapeError(f"{manifest.graph}: symbol {name!r} must be an int >= 0, got {int(v)}")
    bound = manifest.symbol_max.get(name)
    if bound is not None and int(v) > bound:
        raise ShapeError(
            f"{manifest.graph}: symbol {name!r} = {int(v)} is above {bound}, the largest this "
            "kernel was built for (a bucketed artifact picks the kernel by the symbol: "
            "etc.runtime.load of its directory)"
        )
    return int(v)


def check_requirements(
    where: str, checks: Iterable[tuple[Any, int, str]], symbols: Mapping[str, int]
) -> None:
    """Raises ShapeError for the first ``(size, value, message)`` of a
    graph's requirements (``Graph.require``) whose value is negative, with
    the message and the symbols' values: the runtime's and the simulator's
    check."""
    for size, value, message in checks:
        if value < 0:
            values = ", ".join(f"{n}={v}" for n, v in symbols.items())
            raise ShapeError(f"{where}: {message} ({size} = {value} < 0 for {values})")


def bound_shapes(manifest: Manifest, symbols: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Concrete tensor shapes with symbols bound; checks that no dimension is
    negative (as the simulator does) and that byte sizes fit in 63 bits."""
    shapes = {}
    for t in manifest.tensors:
        shape = manifest.bind(t.shape, symbols)
        for k, d in enumerate(shape):
            if d < 0:
                values = ", ".join(f"{n}={v}" for n, v in symbols.items())
                raise ShapeError(
                    f"{manifest.graph}: tensor {t.name!r}: dimension {k} ({t.shape[k]}) "
                    f"evaluates to {d} for {values}"
                )
        if numel(shape) * DTYPE_SIZES[t.dtype] > MAX_BYTES:
            raise ShapeError(
                f"{manifest.graph}: tensor {t.name!r} of shape {_fmt_shape(shape)} {t.dtype} "
                "has more bytes than a 64-bit index can address"
            )
        shapes[t.name] = shape
    return shapes


_TORCH_DTYPE_NAMES = (
    "float64 float32 float16 bfloat16 int64 int32 int16 int8 uint64 uint32 uint16 uint8 bool"
).split()
_torch_dtypes: dict[Any, str] = {}


def _torch_dtype_table(torch: Any) -> dict[Any, str]:
    """torch dtype object -> manifest dtype name (filled on first use; torch is optional)."""
    if not _torch_dtypes:
        for name in _TORCH_DTYPE_NAMES:
            if hasattr(torch, name):  # older torch lacks uint16/32/64
                _torch_dtypes[getattr(torch, name)] = canonical_dtype(name)  # type: ignore[assignment]
    return _torch_dtypes


def _torch_dtype(torch: Any, dtype: Any) -> str | None:
    return _torch_dtype_table(torch).get(dtype) or canonical_dtype(str(dtype))


def bind_tensors(
    manifest: Manifest,
    shapes: Mapping[str, tuple[int, ...]],
    tensors: Mapping[str, Any],
    device: int | None = None,
) -> list[BoundTensor]:
    """Validates `tensors` against the manifest's inputs (in manifest order, tensor maps
    left out) without touching the GPU.

    `device` is the CUDA ordinal torch tensors must live on (None skips that check).
    """
    check_mapping(manifest.graph, "tensors", tensors)
    inputs = manifest.inputs
    if len(tensors) != len(inputs) or any(t.name not in tensors for t in inputs):
        maps = [t.name for t in manifest.tensors if t.tensor_map is not None and t.name in tensors]
        if maps:
            raise LaunchError(
                f"{manifest.graph}: tensor {maps[0]!r} is a TMA tensor map; the runtime encodes "
                "it from its source tensor at every launch, so do not pass it"
            )
        expected = [t.name for t in inputs]
        raise LaunchError(f"{manifest.graph}: {_names_diff('tensor', list(tensors), expected)}")
    torch = sys.modules.get("torch")  # never import torch ourselves
    out = []
    for spec in inputs:
        x = tensors[spec.name]
        shape = shapes[spec.name]
        nbytes = numel(shape) * DTYPE_SIZES[spec.dtype]
        where = f"{manifest.graph}: tensor {spec.name!r}"
        if torch is not None and isinstance(x, torch.Tensor):
            if not x.is_cuda:
                raise LaunchError(
                    f"{where} is on {x.device}; pass a CUDA tensor (or a numpy array to copy)"
                )
            if device is not None and x.get_device() != device:
                raise LaunchError(
                    f"{where} is on {x.device} but the kernel is loaded on cuda:{device}"
                )
            _check_shape(where, tuple(x.shape), shape, spec.shape)
            _check_dtype(where, _torch_dtype(torch, x.dtype), str(x.dtype), spec.dtype)
            if not x.is_contiguous():
                raise ShapeError(
                    f"{where} must be contiguous (row-major); strides are {tuple(x.stride())}"
                )
            out.append(BoundTensor(spec.name, TORCH, int(x.data_ptr()), x, nbytes))
        elif isinstance(x, np.ndarray):
            _check_shape(where, x.shape, shape, spec.shape)
            canon = canonical_dtype(x.dtype.name)
            if spec.dtype == "bf16" and canon == "u16":
                canon = "bf16"  # numpy has no bfloat16: raw bits in uint16, as etc.dtypes does
            _check_dtype(where, canon, f"numpy {x.dtype.name}", spec.dtype)
            out.append(BoundTensor(spec.name, NUMPY, 0, x, nbytes))
        elif isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
            # A raw device address: the shape is trusted to be the declared one.
            if not 0 <= int(x) <= MAX_POINTER:
                raise LaunchError(f"{where}: device pointer {int(x):#x} is not a 64-bit address")
            if int(x) == 0 and nbytes:
                raise LaunchError(f"{where}: null device pointer for {nbytes} bytes")
            out.append(BoundTensor(spec.name, POINTER, int(x), x, nbytes))
        else:
            raise LaunchError(
                f"{where}: expected a torch CUDA tensor, a numpy array or a device pointer (int), "
                f"got {type(x).__module__}.{type(x).__qualname__}"
            )
    return out


class FastBinder:
    """The hot path of `bind_tensors` for one concrete shape: torch tensors and pointers only.

    Returns the device pointers in manifest order (plus whether torch tensors were given),
    or None whenever anything is unusual (numpy arrays, subclasses, any mismatch), in which
    case the caller runs `bind_tensors`, which handles the rest or raises the precise error.
    """

    def __init__(self, manifest: Manifest, shapes: Mapping[str, tuple[int, ...]], device: int):
        self.count = len(manifest.inputs)
        self.device = device
        torch = sys.modules.get("torch")
        self.tensor_type = torch.Tensor if torch is not None else None
        self.checks = []
        for spec in manifest.inputs:
            tdtype = None
            if torch is not None:
                table = _torch_dtype_table(torch)
                tdtype = next((k for k, v in table.items() if v == spec.dtype), None)
            nonempty = numel(shapes[spec.name]) > 0
            self.checks.append((spec.name, shapes[spec.name], tdtype, nonempty))

    def __call__(self, tensors: Mapping[str, Any]) -> tuple[list[int], bool] | None:
        try:
            if len(tensors) != self.count:
                return None
            get = tensors.get
        except (TypeError, AttributeError):  # not a mapping: bind_tensors names it
            return None
        ptrs = []
        has_torch = False
        tensor_type, device = self.tensor_type, self.device
        for name, shape, tdtype, nonempty in self.checks:
            x = get(name)
            if type(x) is tensor_type:
                if (
                    x.dtype is not tdtype
                    or x.shape != shape
                    or x.get_device() != device
                    or not x.is_contiguous()
                ):
                    return None
                ptrs.append(x.data_ptr())
                has_torch = True
            elif type(x) is int and (0 < x <= MAX_POINTER or (x == 0 and not nonempty)):
                ptrs.append(x)
            else:
                return None
        return ptrs, has_torch


def _check_shape(
    where: str, got: tuple[int, ...], expected: tuple[int, ...], declared: Sequence[Any]
) -> None:
    if got != expected:
        if len(got) != len(expected):
            what = f"rank {len(got)} instead of {len(expected)}"
        else:
            dims = [str(d) for d, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
            what = f"dim {', '.join(dims)} differ"
        decl = f" = {_fmt_shape(declared)}" if any(isinstance(d, str) for d in declared) else ""
        raise ShapeError(
            f"{where} has shape {_fmt_shape(got)}, expected {_fmt_shape(expected)}{decl} ({what})"
        )


def _check_dtype(where: str, canon: str | None, shown: str, expected: str) -> None:
    if canon != expected:
        raise ShapeError(f"{where} has dtype {shown}, expected {expected}")

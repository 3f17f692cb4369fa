"""Kernel parameter packing: every PTX parameter is 64 bits wide.

A ``symbol`` or ``max_polls`` param is one u64. A memref of rank r (graph tensors, and the
rank-1 ``counters``/``queue``/``status`` buffers) expands to ``3 + 2r`` u64s: allocated
pointer, aligned pointer, offset (elements, always 0 here), sizes[r], strides[r] (elements,
row-major contiguous). `ParamPack` keeps the values in one numpy array and the ``void*[]``
that ``cuLaunch*Kernel`` takes in another, so a launch passes one prebuilt address and only
the slots that changed are rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from etc.runtime.manifest import ParamSpec

BUFFER_KINDS = ("counters", "queue", "status")


def param_width(p: ParamSpec) -> int:
    """Number of u64 PTX parameters the manifest param expands to."""
    if p.kind in ("symbol", "max_polls"):
        return 1
    if p.kind == "tensor":
        assert p.rank is not None
        return 3 + 2 * p.rank
    return 5  # rank-1 memref


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * max(int(shape[d + 1]), 1)
    return tuple(strides)


def memref_words(ptr: int, shape: Sequence[int]) -> list[int]:
    """The ``3 + 2r`` descriptor words of a contiguous memref at ``ptr``."""
    return [ptr, ptr, 0, *(int(s) for s in shape), *contiguous_strides(shape)]


class ParamPack:
    """Parameter values (u64) and the ``void*[]`` pointing at each of them."""

    def __init__(self, params: Sequence[ParamSpec]):
        self.params = tuple(params)
        self.slots: dict[tuple[str, str | None], int] = {}
        offset = 0
        for p in self.params:
            self.slots[(p.kind, p.name)] = offset
            offset += param_width(p)
        self.size = offset
        # One extra word so the arrays are never empty (a zero-size array has no stable address).
        self.values = np.zeros(offset + 1, dtype=np.uint64)
        base = self.values.ctypes.data
        self.argv = base + 8 * np.arange(offset + 1, dtype=np.uint64)
        #: What the driver's ``kernelParams`` argument takes (an int address of ``void*[]``).
        self.address: int = self.argv.ctypes.data

    def slot(self, kind: str, name: str | None = None) -> int:
        return self.slots[(kind, name)]

    def set_symbol(self, name: str, value: int) -> None:
        if ("symbol", name) in self.slots:
            self.values[self.slots[("symbol", name)]] = value

    def set_max_polls(self, value: int) -> None:
        self.values[self.slots[("max_polls", None)]] = value

    def set_memref(self, kind: str, name: str | None, ptr: int, shape: Sequence[int]) -> None:
        if (kind, name) not in self.slots:
            return
        words = memref_words(ptr, shape)
        base = self.slots[(kind, name)]
        self.values[base : base + len(words)] = np.array(words, dtype=np.uint64)

    def pointer_slots(self, keys: Iterable[tuple[str, str | None]]) -> np.ndarray:
        """Slot indices of (allocated, aligned) pointer pairs for the given params, in order."""
        out: list[int] = []
        for key in keys:
            base = self.slots[key]
            out += [base, base + 1]
        return np.array(out, dtype=np.intp)

    def words(self) -> list[int]:
        """The packed parameter values as Python ints (for tests and debugging)."""
        return [int(v) for v in self.values[: self.size]]

"""TMA tensor maps (``Graph.tensor_map``): encoded by the runtime at launch.

A map is a 128-byte ``CUtensorMap`` that holds its tensor's address and shape, so it
is rebuilt whenever a launch binds a different buffer or shape. Maps are cached per
(address, shape, box) in small device buffers that are never rewritten while cached,
so launches in flight on any stream keep reading the map they were given.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np

from etc.errors import LaunchError, ShapeError
from etc.runtime import driver
from etc.runtime.manifest import DTYPE_SIZES, Manifest, numel

MAP_BYTES = 128
#: Encoded maps kept per kernel; the oldest is freed past this.
MAX_MAPS = 512
_DATA_TYPES = {
    "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
    "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
    "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
    "i32": "CU_TENSOR_MAP_DATA_TYPE_INT32",
    "u8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    "i8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
}


def map_geometry(
    where: str, shape: Sequence[int], dtype: str, box: tuple[int, int], chunk: int = 0
) -> tuple[list[int], list[int], list[int]] | None:
    """``(global dims, global strides in bytes, box dims)``, innermost first, of the
    2-D view (last dimension x the product of the others) of a tensor; None when
    it is empty (no tile reads it). Raises `ShapeError` for what TMA cannot map.

    ``chunk`` (the box's columns): the tensor is in ``etc.tiles.gemm.chunk_weights``'
    layout, 8-row groups of ``chunk``-wide k chunks, each chunk its 8 rows one
    after another. The view is then 4-D, ``(k in chunk, row in group, chunk,
    group)``, and a box ``(chunk, 8, 1, rows / 8)`` at ``(0, 0, k / chunk,
    row / 8)`` lands in shared memory as the 2-D view's ``(cols, rows)`` box
    at ``(k, row)`` would: ``rows`` rows of ``chunk`` values, one after another."""
    if dtype not in _DATA_TYPES:
        raise ShapeError(f"{where}: TMA maps do not support dtype {dtype}")
    if not numel(shape):
        return None
    cols = int(shape[-1])
    rows = numel(shape[:-1])
    size = DTYPE_SIZES[dtype]
    if (cols * size) % 16:
        raise ShapeError(
            f"{where}: rows of {cols} {dtype} are {cols * size} bytes; TMA needs a multiple of 16"
        )
    if max(rows, cols) > 1 << 32:
        raise ShapeError(f"{where}: {rows} x {cols} is over TMA's 2**32 per dimension")
    if not chunk:
        return [cols, rows], [cols * size], [box[1], box[0]]
    if rows % 8 or cols % chunk:
        raise ShapeError(
            f"{where}: a tensor of {rows} rows of {cols} in chunks of {chunk} is not in 8-row "
            "groups of whole chunks"
        )
    dims = [chunk, 8, cols // chunk, rows // 8]
    strides = [chunk * size, 8 * chunk * size, 8 * cols * size]
    return dims, strides, [box[1], 8, 1, box[0] // 8]


def encode(
    where: str, ptr: int, shape: Sequence[int], dtype: str, box: tuple[int, int], chunk: int = 0
) -> bytes:
    """The 128 bytes of the map of the tensor at ``ptr`` (128-byte swizzle,
    zeros past the end; ``chunk``: see :func:`map_geometry`), or zeros for an
    empty tensor."""
    geometry = map_geometry(where, shape, dtype, box, chunk)
    if geometry is None:
        return bytes(MAP_BYTES)
    if ptr % 16:
        raise ShapeError(f"{where}: TMA needs a 16-byte aligned address, got {ptr:#x}")
    dims, strides, boxes = geometry
    cu = driver._require()
    err, tmap = cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, _DATA_TYPES[dtype]),
        len(dims),
        ptr,
        [cu.cuuint64_t(d) for d in dims],
        [cu.cuuint64_t(d) for d in strides],
        [cu.cuuint32_t(d) for d in boxes],
        [cu.cuuint32_t(1)] * len(dims),
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != cu.CUresult.CUDA_SUCCESS:
        raise LaunchError(
            f"{where}: cuTensorMapEncodeTiled({dims}, strides {strides}, box {boxes}) failed: "
            f"{driver.error_name(err)}"
        )
    return ctypes.string_at(tmap.getPtr(), MAP_BYTES)


class TensorMaps:
    """The tensor maps of one kernel: device addresses for a launch's bound tensors."""

    def __init__(self, manifest: Manifest):
        self.graph = manifest.graph
        self.specs = [
            (t.name, source, manifest.tensor(source).dtype, box, chunk)
            for t in manifest.tensors
            if t.tensor_map is not None
            for source, box, chunk in [t.tensor_map]
        ]
        self._cache: OrderedDict[tuple, driver.DeviceBuffer] = OrderedDict()
        #: Bumped whenever a cached map is freed: launches compare it to know
        #: whether the addresses they wrote last time are still valid.
        self.generation = 0

    def __bool__(self) -> bool:
        return bool(self.specs)

    def pointers(
        self, ptrs: Mapping[str, int], shapes: Mapping[str, tuple[int, ...]], stream: int
    ) -> dict[str, int]:
        """The map address of every map tensor, given the sources' addresses."""
        out = {}
        for name, source, dtype, box, chunk in self.specs:
            key = (ptrs[source], shapes[source], dtype, box, chunk)
            buf = self._cache.get(key)
            if buf is None:
                where = f"{self.graph}: tensor map {name!r} of tensor {source!r}"
                host = np.frombuffer(
                    encode(where, ptrs[source], shapes[source], dtype, box, chunk), np.uint8
                )
                if len(self._cache) >= MAX_MAPS:
                    # Launches in flight may still read the oldest map; parameter
                    # blocks that point at it are rewritten (a new generation).
                    driver.check(driver.cu.cuCtxSynchronize(), "cuCtxSynchronize")
                    self._cache.popitem(last=False)[1].release()
                    self.generation += 1
                buf = self._cache[key] = driver.DeviceBuffer(MAP_BYTES)
                driver.htod(buf.ptr, host.ctypes.data, MAP_BYTES, stream)
                driver.synchronize(stream)  # the host bytes are a temporary
            else:
                self._cache.move_to_end(key)
            out[name] = buf.ptr
        return out

    def release(self) -> None:
        for buf in self._cache.values():
            buf.release()
        self._cache.clear()
        self.generation += 1

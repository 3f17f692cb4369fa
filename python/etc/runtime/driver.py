"""Thin layer over ``cuda.bindings.driver``: devices, the module cache, memory, launches.

Every binding returns ``(CUresult, *values)``; `check` turns failures into `LaunchError`.
Device pointers and streams are passed as plain ints, which the bindings accept. The
primary context is used so the runtime shares torch's context on the same device.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from etc.errors import LaunchError, LaunchTimeoutError

try:
    from cuda.bindings import driver as cu
except ImportError:  # the manifest/queue/params modules stay usable without cuda-python
    cu = None


def _require() -> Any:
    if cu is None:
        raise LaunchError("etc.runtime needs cuda-python: pip install cuda-python (cuda.bindings)")
    return cu


def error_name(err: Any) -> str:
    try:
        name = cu.cuGetErrorName(err)[1]
        text = cu.cuGetErrorString(err)[1]
        return f"{name.decode()} ({text.decode()})"
    except Exception:  # an unknown code, or a driver too broken to describe it
        return f"CUresult {int(err)}"


def check(result: tuple, what: str) -> Any:
    """Unpacks ``(CUresult, *values)``; raises `LaunchError` saying what failed."""
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"{what} failed: {error_name(err)}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


@dataclass
class Device:
    ordinal: int
    handle: Any
    context: Any
    sm_count: int
    compute_capability: tuple[int, int]
    name: str

    def make_current(self) -> None:
        check(cu.cuCtxSetCurrent(self.context), f"cuCtxSetCurrent(cuda:{self.ordinal})")


_lock = threading.Lock()
_devices: dict[int, Device] = {}
# (context, image key) -> (module, function, image kind); modules live as long as the process:
# loading the same image twice in a context costs 20 ms (cubin) or a full JIT (PTX).
_modules: dict[tuple[int, str], tuple[Any, Any, str]] = {}


def _raw_init() -> None:
    drv = _require()
    try:
        res = drv.cuInit(0)
    except RuntimeError as e:  # cuda-python raises when libcuda.so cannot be loaded
        raise LaunchError(f"cuInit: no CUDA driver ({e})") from None
    check(res, "cuInit")


def device_count() -> int:
    """Number of CUDA devices, 0 when there is no driver (never raises)."""
    try:
        _raw_init()
        return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))
    except LaunchError:
        return 0


def get_device(ordinal: int = 0) -> Device:
    """The device's primary context (retained once per process), made current on this thread."""
    with _lock:
        dev = _devices.get(ordinal)
        if dev is None:
            _raw_init()
            count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
            if not 0 <= ordinal < count:
                raise LaunchError(f"CUDA device {ordinal} does not exist ({count} present)")
            handle = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
            ctx = check(cu.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")
            attr = cu.CUdevice_attribute

            def get(a: Any) -> int:
                return int(
                    check(cu.cuDeviceGetAttribute(a, handle), f"cuDeviceGetAttribute({a.name})")
                )

            name = check(cu.cuDeviceGetName(256, handle), "cuDeviceGetName")
            dev = Device(
                ordinal,
                handle,
                ctx,
                get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                (
                    get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                    get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
                ),
                name.split(b"\0", 1)[0].decode(errors="replace"),
            )
            _devices[ordinal] = dev
    dev.make_current()
    return dev


def load_function(
    dev: Device, key: str, kernel: str, images: Sequence[tuple[str, bytes]]
) -> tuple[Any, str]:
    """Loads the first image that the driver accepts (cached per context and `key`).

    `images` are ``(kind, bytes)`` with kind ``"cubin"`` or ``"ptx"``; PTX gets a trailing
    NUL. Returns the function and the kind of the image that loaded.
    """
    ctx_key = (int(dev.context), key)
    with _lock:
        hit = _modules.get(ctx_key)
        if hit is not None:
            return hit[1], hit[2]
        errors = []
        for kind, data in images:
            blob = data + b"\0" if kind == "ptx" and not data.endswith(b"\0") else data
            res = cu.cuModuleLoadData(blob)
            if res[0] != cu.CUresult.CUDA_SUCCESS:
                errors.append(f"{kind}: {error_name(res[0])}")
                continue
            module = res[1]
            fn = cu.cuModuleGetFunction(module, kernel.encode())
            if fn[0] != cu.CUresult.CUDA_SUCCESS:
                errors.append(f"{kind}: no kernel {kernel!r}: {error_name(fn[0])}")
                cu.cuModuleUnload(module)
                continue
            _modules[ctx_key] = (module, fn[1], kind)
            return fn[1], kind
    raise LaunchError(
        f"cannot load kernel {kernel!r} on {dev.name} (sm_{dev.compute_capability[0]}"
        f"{dev.compute_capability[1]}): " + "; ".join(errors)
    )


def allow_dynamic_shared_memory(fn: Any, nbytes: int) -> None:
    """Lets `fn` launch with `nbytes` of dynamic shared memory (past 48 KiB needs opting in)."""
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(cu.cuFuncSetAttribute(fn, attr, int(nbytes)), f"cuFuncSetAttribute({nbytes} B shared)")


def max_active_ctas(dev: Device, fn: Any, block_size: int, dynamic_smem: int = 0) -> int:
    """CTAs that can be co-resident on the whole device (the cooperative launch limit)."""
    per_sm = check(
        cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, block_size, dynamic_smem),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    )
    return int(per_sm) * dev.sm_count


def cluster_launch_config(
    grid: int, block_size: int, dynamic_smem: int, cluster: int, cooperative: bool = True
) -> Any:
    """A ``CUlaunchConfig`` for ``cuLaunchKernelEx``: ``grid`` CTAs of
    ``block_size`` threads in 1-D thread-block clusters of ``cluster`` CTAs
    (CTAs ``c*cluster .. c*cluster + cluster - 1`` form cluster ``c``), a
    cooperative launch (all CTAs co-resident, or the launch fails) when
    ``cooperative``. The caller sets ``hStream``."""
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = int(grid), 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = int(block_size), 1, 1
    config.sharedMemBytes = int(dynamic_smem)
    ids = cu.CUlaunchAttributeID
    shape = cu.CUlaunchAttribute()
    shape.id = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    dim = shape.value.clusterDim
    dim.x, dim.y, dim.z = int(cluster), 1, 1
    attrs = [shape]
    if cooperative:
        together = cu.CUlaunchAttribute()
        together.id = ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        together.value.cooperative = 1
        attrs.append(together)
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


def max_active_clusters(fn: Any, cluster: int, block_size: int, dynamic_smem: int = 0) -> int:
    """Clusters of ``cluster`` CTAs that can be co-resident on the whole
    device (``cuOccupancyMaxActiveClusters``: a GPC holds whole clusters, so
    this can be fewer CTAs than :func:`max_active_ctas`)."""
    config = cluster_launch_config(cluster, block_size, dynamic_smem, cluster, cooperative=False)
    return int(check(cu.cuOccupancyMaxActiveClusters(fn, config), "cuOccupancyMaxActiveClusters"))


def alloc(nbytes: int) -> int:
    return int(check(cu.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes})"))


def free(ptr: int) -> None:
    if ptr and cu is not None:
        try:
            cu.cuMemFree(ptr)  # errors at teardown are harmless: the context is going away
        except Exception:
            pass


def htod(ptr: int, host_addr: int, nbytes: int, stream: int | None = None) -> None:
    if nbytes:
        if stream is None:
            check(cu.cuMemcpyHtoD(ptr, host_addr, nbytes), "cuMemcpyHtoD")
        else:
            check(cu.cuMemcpyHtoDAsync(ptr, host_addr, nbytes, stream), "cuMemcpyHtoDAsync")


def dtoh(host_addr: int, ptr: int, nbytes: int) -> None:
    if nbytes:
        check(cu.cuMemcpyDtoH(host_addr, ptr, nbytes), "cuMemcpyDtoH")


def synchronize(stream: int, timeout: float | None = None, what: str = "the stream") -> None:
    """Waits for ``stream``'s work. With ``timeout`` (seconds) it polls the
    stream instead (sleeps from 20 µs doubling to 1 ms, so a finished launch
    is seen that much later) and raises `LaunchTimeoutError` naming ``what``
    once the time is up; the work goes on running."""
    failed = "a kernel on this stream failed; the CUDA context may be unusable"
    if timeout is None:
        check(cu.cuStreamSynchronize(stream), f"cuStreamSynchronize ({failed})")
        return
    deadline = time.monotonic() + timeout
    pause = 20e-6
    while True:
        err = cu.cuStreamQuery(stream)[0]
        if err != cu.CUresult.CUDA_ERROR_NOT_READY:
            check((err,), f"cuStreamQuery ({failed})")
            return
        if time.monotonic() >= deadline:
            raise LaunchTimeoutError(
                f"{what}: the launch did not finish within {timeout:g} s, and the kernel's "
                "watchdog did not stop it (a hang outside its waits, such as a barrier); the "
                "kernel still runs, so this CUDA context stays busy: restart the process"
            )
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


class HostBuffer:
    """Page-locked host memory (pageable numpy memory if pinning fails)."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self._pinned = 0
        res = cu.cuMemAllocHost(max(self.nbytes, 1))
        if res[0] == cu.CUresult.CUDA_SUCCESS:
            self._pinned = int(res[1])
            self._array = np.ctypeslib.as_array(
                (ctypes.c_uint8 * self.nbytes).from_address(self._pinned)
            )
        else:
            self._array = np.zeros(self.nbytes, dtype=np.uint8)
        self.ptr = self._array.ctypes.data

    def view(self, dtype: Any) -> np.ndarray:
        return self._array.view(dtype)

    def __del__(self) -> None:
        if self._pinned and cu is not None:
            try:
                cu.cuMemFreeHost(self._pinned)
            except Exception:
                pass


class DeviceBuffer:
    """An owned device allocation; freed by `release` or when garbage-collected."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.ptr = alloc(self.nbytes)

    def release(self) -> None:
        free(self.ptr)
        self.ptr = 0

    def __del__(self) -> None:
        self.release()

"""Timing launches with CUDA events, without torch (``etc bench``).

Two numbers matter to a caller: the time from launch to launch as a Python
loop sees it (the host's enqueue cost included), and the GPU's own time per
launch. For the second, a spin kernel holds the stream for a while (20 ms by
default) while the host enqueues the launches behind it, so the events
bracket back-to-back kernels (as ``torch.cuda._sleep`` does in
``bench/timing.py``). The spin kernel is PTX that the driver compiles, so no
toolkit is needed where the runtime runs.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from etc.errors import LaunchError
from etc.runtime import driver

#: Spins until ``ns`` nanoseconds of ``%globaltimer`` have passed (one thread).
_SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry etc_spin(.param .u64 ns)
{
    .reg .u64 %n, %t0, %t1, %d;
    .reg .pred %p;
    ld.param.u64 %n, [ns];
    mov.u64 %t0, %globaltimer;
WAIT:
    nanosleep.u32 1000;
    mov.u64 %t1, %globaltimer;
    sub.u64 %d, %t1, %t0;
    setp.lt.u64 %p, %d, %n;
    @%p bra WAIT;
    ret;
}
"""


@dataclass(frozen=True)
class Samples:
    """Microseconds per launch, one sample per repetition."""

    us: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.us)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) by the nearest rank."""
        ordered = sorted(self.us)
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    def as_dict(self) -> dict[str, Any]:
        return {
            "median_us": self.median,
            "p10_us": self.quantile(0.1),
            "p90_us": self.quantile(0.9),
            "min_us": min(self.us),
            "samples_us": list(self.us),
        }


class Stream:
    """A stream of its own and two timing events on it."""

    def __init__(self, device: driver.Device) -> None:
        cu = driver.cu
        self.device = device
        device.make_current()
        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        self.handle = int(driver.check(cu.cuStreamCreate(flags), "cuStreamCreate"))
        make = cu.CUevent_flags.CU_EVENT_DEFAULT
        self._start = driver.check(cu.cuEventCreate(make), "cuEventCreate")
        self._end = driver.check(cu.cuEventCreate(make), "cuEventCreate")
        self._spin: Any = None

    def time(self, enqueue: Callable[[], None], after: Callable[[], None]) -> float:
        """Milliseconds between events recorded before and after ``enqueue()``;
        ``after()`` waits for the work (and raises what it reports)."""
        cu = driver.cu
        driver.check(cu.cuEventRecord(self._start, self.handle), "cuEventRecord")
        enqueue()
        driver.check(cu.cuEventRecord(self._end, self.handle), "cuEventRecord")
        after()
        driver.check(cu.cuEventSynchronize(self._end), "cuEventSynchronize")
        return float(driver.check(cu.cuEventElapsedTime(self._start, self._end), "elapsed"))

    def spin(self, ns: int) -> None:
        """Holds the stream for ``ns`` nanoseconds (one thread, asleep)."""
        cu = driver.cu
        if self._spin is None:
            self._spin, _ = driver.load_function(
                self.device, "etc:spin", "etc_spin", [("ptx", _SPIN_PTX)]
            )
        value = ctypes.c_uint64(int(ns))
        argv = (ctypes.c_void_p * 1)(ctypes.addressof(value))
        err = cu.cuLaunchKernel(
            self._spin, 1, 1, 1, 1, 1, 1, 0, self.handle, ctypes.addressof(argv), 0
        )
        driver.check(err, "cuLaunchKernel(etc_spin)")

    def idle(self) -> bool:
        """Whether the stream's work has ended (failed work counts as ended)."""
        return driver.cu.cuStreamQuery(self.handle)[0] != driver.cu.CUresult.CUDA_ERROR_NOT_READY

    def close(self) -> None:
        cu = driver.cu
        for event in (self._start, self._end):
            cu.cuEventDestroy(event)
        cu.cuStreamDestroy(self.handle)


def time_launches(
    launch: Callable[[int], None],
    check: Callable[[], None],
    stream: Stream,
    calls: int,
    reps: int,
    warmup: int = 1,
    spin_ns: int = 0,
) -> tuple[Samples, Samples]:
    """µs per call of ``launch(i)`` for ``calls`` calls back to back, one
    sample per repetition, after ``warmup`` rounds, by the events; and the
    host's µs per call to enqueue them. ``check()`` after each round waits
    and raises a launch's failure. ``spin_ns``: hold the stream that long
    before each round, so the events time the GPU's work alone; a round
    whose enqueueing outlasted the spin is an error, since its sample would
    include the host's time."""
    if calls < 1 or reps < 1 or warmup < 0:
        raise LaunchError(
            f"time_launches: calls ({calls}) and reps ({reps}) must be >= 1, warmup ({warmup}) >= 0"
        )
    counter = iter(range(1 << 62))
    host: list[float] = []

    def round_() -> None:
        started = time.perf_counter()
        for _ in range(calls):
            launch(next(counter))
        host.append((time.perf_counter() - started) * 1e6 / calls)

    for _ in range(warmup):
        round_()
        check()
    host.clear()
    samples = []
    for _ in range(reps):
        if spin_ns:
            stream.spin(spin_ns)
        ms = stream.time(round_, check)
        if spin_ns and host[-1] * calls * 1e3 >= spin_ns:
            raise LaunchError(
                f"time_launches: enqueueing {calls} launches took {host[-1] * calls:.0f} µs, "
                f"longer than the {spin_ns / 1e6:g} ms spin, so the events would time the "
                "host too; give fewer calls or a longer spin"
            )
        samples.append(ms * 1e3 / calls)
    return Samples(tuple(samples)), Samples(tuple(host))


def copy_bandwidth(stream: Stream, nbytes: int = 1 << 31, reps: int = 10, calls: int = 8) -> float:
    """Bytes per second read plus written by device-to-device copies of
    ``nbytes`` (as ``bench/splitk.copy_bandwidth`` measures it: 2 GiB, after
    a warm-up long enough for the clocks to settle; the median of ``reps``
    rounds of ``calls`` copies back to back), the figure the benchmarks
    compare kernels against. Half the free memory at most."""
    cu = driver.cu
    nbytes = max(1 << 20, min(int(nbytes), free_bytes() // 4))
    src, dst = driver.DeviceBuffer(nbytes), driver.DeviceBuffer(nbytes)
    try:

        def copies() -> None:
            for _ in range(calls):
                err = cu.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, stream.handle)
                driver.check(err, "cuMemcpyDtoDAsync")

        def wait() -> None:
            driver.synchronize(stream.handle)

        for _ in range(6):  # ~50 copies: the clocks settle
            copies()
        wait()
        ms = statistics.median(stream.time(copies, wait) for _ in range(reps))
    finally:
        src.release()
        dst.release()
    return 2 * nbytes * calls / (ms * 1e-3)


def l2_bytes(device: driver.Device) -> int:
    attr = driver.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
    return int(driver.check(driver.cu.cuDeviceGetAttribute(attr, device.handle), "L2 size"))


def free_bytes() -> int:
    free, _total = driver.check(driver.cu.cuMemGetInfo(), "cuMemGetInfo")
    return int(free)

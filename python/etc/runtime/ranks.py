"""Graphs that span several GPUs of one host: one kernel per rank, connected by peer access.

Two ways to run the ranks: :class:`RankGroup` drives every GPU from one process
(in-process peer access); :class:`ProcessRank` is one rank in its own process (the
serving-engine layout), sharing memory with the others through CUDA IPC handles.

A graph built with :meth:`etc.Graph.ranks` runs the same megakernel on every rank (GPU).
Its ranked events notify other ranks' counters and its tiles write other ranks' buffers
through plain peer pointers (CUDA peer access over NVLink or PCIe; no transport of our
own). :class:`RankGroup` loads the artifact on each device, enables peer access between
them, allocates each rank's counters once (peers hold their addresses, so they never
move) and launches all ranks, binding the graph's ``rank`` and ranks-count symbols::

    group = etc.runtime.RankGroup("artifacts/gemm_rs", devices=[0, 1])
    group.launch([{"X": x0, ...}, {"X": x1, ...}], {"S": 8192})

:func:`peer_table` turns one buffer per rank into the per-rank ``i64`` tables of their
addresses that tiles take to write a peer's buffer.

One launch of a group is in flight at a time: each launch starts with a rank barrier
(every rank has finished the previous launch and started this one) that the kernels
run themselves, so launches on the ranks' streams need no host synchronisation.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from etc._fields import is_int
from etc.errors import LaunchError
from etc.runtime import driver
from etc.runtime.kernel import Kernel, _stream_handle, load

__all__ = ["ProcessRank", "RankGroup", "SymmetricBuffer", "enable_peer_access", "peer_table"]

# Scratch words (i32) per rank: status, counters and the dynamic queue.
DEFAULT_SCRATCH_WORDS = 1 << 22


def enable_peer_access(devices: Sequence[int]) -> None:
    """Lets every device of `devices` read, write and do atomics on every other's memory.

    Raises LaunchError naming the pair when the hardware cannot (no P2P path, or no native
    peer atomics, which the ranked events' system-scope atomics need)."""
    cu = driver._require()
    devs = [driver.get_device(d) for d in devices]
    attr = cu.CUdevice_P2PAttribute
    for a in devs:
        for b in devs:
            if a.ordinal == b.ordinal:
                continue
            can = driver.check(
                cu.cuDeviceCanAccessPeer(a.handle, b.handle), "cuDeviceCanAccessPeer"
            )
            atomics = driver.check(
                cu.cuDeviceGetP2PAttribute(
                    attr.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, a.handle, b.handle
                ),
                "cuDeviceGetP2PAttribute",
            )
            if not can or not atomics:
                raise LaunchError(
                    f"cuda:{a.ordinal} cannot {'access' if not can else 'do atomics on'} the "
                    f"memory of cuda:{b.ordinal}; ranked graphs need peer access with native "
                    "atomics between every pair of ranks"
                )
            a.make_current()
            err = cu.cuCtxEnablePeerAccess(b.context, 0)[0]
            if err not in (
                cu.CUresult.CUDA_SUCCESS,
                cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
            ):
                raise LaunchError(
                    f"cuCtxEnablePeerAccess(cuda:{a.ordinal} -> cuda:{b.ordinal}) failed: "
                    f"{driver.error_name(err)}"
                )


def _free_symbols(m: Any, symbols: Mapping[str, int] | None, binder: str) -> dict[str, int]:
    """`symbols` as a dict, refusing the rank symbols, which `binder` binds."""
    symbols = dict(symbols or {})
    for name in m.ranks:
        if name in symbols:
            raise LaunchError(f"{m.graph}: symbol '{name}' is bound by {binder}; do not pass it")
    return symbols


def _zero(kernel: Kernel, buf: driver.DeviceBuffer) -> None:
    """Waits for `kernel`'s device, zeroes `buf` there and waits for that too."""
    cu = driver._require()
    kernel._ensure_context()
    driver.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    driver.check(cu.cuMemsetD8(buf.ptr, 0, buf.nbytes), "cuMemsetD8")
    driver.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


def _zeroed(kernel: Kernel, nbytes: int) -> driver.DeviceBuffer:
    """A zeroed allocation of `nbytes` on `kernel`'s device."""
    kernel._ensure_context()
    buf = driver.DeviceBuffer(nbytes)
    _zero(kernel, buf)
    return buf


def _address(buffer: Any) -> int:
    if isinstance(buffer, (int, np.integer)) and not isinstance(buffer, bool):
        return int(buffer)
    if hasattr(buffer, "data_ptr"):
        return int(buffer.data_ptr())
    if hasattr(buffer, "ptr"):
        return int(buffer.ptr)
    raise LaunchError(
        f"peer_table: {type(buffer).__name__} is not a device buffer (a torch CUDA tensor, "
        "a DeviceBuffer or an int address)"
    )


def peer_table(buffers: Sequence[Any]) -> list[np.ndarray]:
    """Per rank, the ``int64`` addresses of ``buffers`` (one per rank, in rank order).

    Rank ``r``'s table is what its tiles index with a destination rank to write that
    rank's buffer; copy it to rank ``r``'s device (e.g. ``torch.from_numpy(t).cuda(r)``).
    Every rank's table is the same list: addresses are valid on every peer once peer
    access is enabled (unified addressing)."""
    table = np.array([_address(b) for b in buffers], dtype=np.int64)
    return [table.copy() for _ in buffers]


class RankGroup:
    """One ranked artifact loaded on `devices` (rank r on ``devices[r]``)."""

    def __init__(
        self,
        directory: str | Path,
        devices: Sequence[int],
        *,
        max_polls: int | None = None,
        scratch_words: int = DEFAULT_SCRATCH_WORDS,
    ) -> None:
        devices = [int(d) for d in devices]
        if not devices or len(set(devices)) != len(devices):
            raise LaunchError(f"RankGroup: devices must be distinct ordinals, got {devices}")
        enable_peer_access(devices)
        self.kernels: list[Kernel] = [load(directory, d, max_polls) for d in devices]
        m = self.kernels[0].manifest
        if m.ranks is None:
            raise LaunchError(
                f"{m.graph}: the graph does not span ranks (build it with graph.ranks()); "
                "load it with etc.runtime.load"
            )
        self.manifest = m
        self.devices = devices
        self.rank_symbol, self.count_symbol = m.ranks
        # Each rank's scratch once, zeroed: the rank barrier's words must survive
        # launches, and peers hold the counters' addresses.
        self._scratch = [_zeroed(k, 4 * scratch_words) for k in self.kernels]
        counters = [b.ptr + 4 * m.status_words for b in self._scratch]
        table = np.array(counters, dtype=np.int64)
        for k in self.kernels:
            k._ensure_context()
            peers = driver.DeviceBuffer(table.nbytes)
            driver.htod(peers.ptr, table.ctypes.data, table.nbytes)
            k._peers, k._num_ranks = peers, len(devices)

    @property
    def num_ranks(self) -> int:
        return len(self.kernels)

    def __repr__(self) -> str:
        return (
            f"<etc.runtime.RankGroup {self.manifest.graph!r} ({self.manifest.schedule}) on "
            f"cuda:{', cuda:'.join(map(str, self.devices))}>"
        )

    def launch(
        self,
        tensors: Sequence[Mapping[str, Any]],
        symbols: Mapping[str, int] | None = None,
        streams: Sequence[Any] | None = None,
        sync: bool = True,
        max_polls: int | None = None,
    ) -> None:
        """Launches every rank: ``tensors[r]`` are rank r's (device tensors or pointers on
        ``devices[r]``), `symbols` every symbol but the rank and the ranks count.

        `streams` (one per rank) default to torch's current stream of each device, else
        the legacy default stream. With ``sync=False`` call `check` later. A failure on
        any rank raises, naming the rank."""
        m, n = self.manifest, self.num_ranks
        symbols = _free_symbols(m, symbols, f"the RankGroup (rank r on devices[r], {n} ranks)")
        if len(tensors) != n:
            raise LaunchError(f"{m.graph}: expected tensors for {n} ranks, got {len(tensors)}")
        if streams is not None and len(streams) != n:
            raise LaunchError(f"{m.graph}: expected {n} streams, got {len(streams)}")
        has_torch = "torch" in sys.modules
        for r, given in enumerate(tensors):
            for name, value in given.items():
                if isinstance(value, np.ndarray):
                    # A numpy launch synchronises before the next rank launches:
                    # the rank barrier would wait for a rank never launched.
                    raise LaunchError(
                        f"{m.graph}: rank {r} tensor '{name}' is a numpy array; ranked "
                        "launches take device tensors (torch CUDA tensors or pointers)"
                    )
        for r, kernel in enumerate(self.kernels):
            stream = None if streams is None else streams[r]
            handle = _stream_handle(stream, has_torch, kernel.device.ordinal)
            kernel._scratch[handle] = self._scratch[r]
            bound = {**symbols, self.rank_symbol: r, self.count_symbol: n}
            kernel._ensure_context()
            try:
                kernel.launch(tensors[r], bound, stream=handle, sync=False, max_polls=max_polls)
            except LaunchError as exc:
                raise type(exc)(f"rank {r}: {exc}") from None
        if sync:
            self.check()

    def reset(self) -> None:
        """Waits for every rank, then zeroes every rank's counters, queue and rank
        barrier (after a failed launch; `check` does it)."""
        cu = driver._require()
        for k in self.kernels:
            k._ensure_context()
            driver.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        for k, buf in zip(self.kernels, self._scratch, strict=True):
            _zero(k, buf)

    def check(self) -> None:
        """Waits for every rank's latest launch; raises the first rank's failure."""
        failures = []
        for r, kernel in enumerate(self.kernels):
            try:
                kernel._ensure_context()
                kernel.check()
            except Exception as exc:  # every rank is waited for before raising
                failures.append((r, exc))
        if failures:
            # A failed launch leaves counters and the rank barrier's words
            # mid-way on some ranks; every rank has stopped now, so start over.
            self.reset()
            r, exc = failures[0]
            others = f" (ranks {', '.join(str(f[0]) for f in failures[1:])} failed too)"
            raise type(exc)(f"rank {r}: {exc}{others if len(failures) > 1 else ''}") from exc


class SymmetricBuffer:
    """A device buffer allocated by every rank alike (`ProcessRank.symmetric_empty`):
    ``ptr`` is this rank's, ``peers`` the device address of its ``int64`` peer table
    (rank ``q``'s address of the buffer, mapped into this process) for a graph's
    ``Graph.peer_table`` tensor."""

    def __init__(self, nbytes: int, ptr: int, peers: int, owned: list[Any]) -> None:
        self.nbytes = nbytes
        self.ptr = ptr
        self.peers = peers
        self._owned = owned

    def __repr__(self) -> str:
        return f"<etc.runtime.SymmetricBuffer {self.nbytes} bytes at {self.ptr:#x}>"


class ProcessRank:
    """This process's rank of a graph that spans ranks, one process per GPU.

    Every rank's process builds one with the same artifact and calls every method
    in the same order (they exchange CUDA IPC handles through ``all_gather``).
    ``all_gather(data: bytes) -> list[bytes]`` returns every rank's ``data`` in rank
    order: e.g. ``torch.distributed.all_gather_object``. Counters, the rank barrier
    and :meth:`symmetric_empty` buffers are ``cuMemAlloc`` allocations that the
    peers map with ``cuIpcOpenMemHandle``; the kernel is the same as under
    :class:`RankGroup`, which runs all ranks in one process::

        me = etc.runtime.ProcessRank("artifacts/gemm_rs", rank, ranks, all_gather)
        staging = me.symmetric_empty(ranks * rows * n * 2)
        me.launch({"X": x, "W": w, "out": out, "staging": staging.ptr,
                   "staging_peers": staging.peers}, {"rows": rows, "N": n})

    After a failed launch every rank calls :meth:`reset` (it is collective).
    """

    def __init__(
        self,
        directory: str | Path,
        rank: int,
        ranks: int,
        all_gather: Any,
        *,
        device: int | None = None,
        max_polls: int | None = None,
        scratch_words: int = DEFAULT_SCRATCH_WORDS,
    ) -> None:
        if not is_int(ranks, 1):
            raise LaunchError(f"ProcessRank: ranks must be an int >= 1, got {ranks!r}")
        if not is_int(rank) or not 0 <= rank < ranks:
            raise LaunchError(f"ProcessRank: rank must be an int in 0..{ranks - 1}, got {rank!r}")
        if not callable(all_gather):
            raise LaunchError("ProcessRank: all_gather must be callable(bytes) -> list[bytes]")
        self.rank, self.ranks = rank, ranks
        self._all_gather = all_gather
        self.kernel = load(directory, rank if device is None else device, max_polls)
        m = self.kernel.manifest
        if m.ranks is None:
            raise LaunchError(
                f"{m.graph}: the graph does not span ranks (build it with graph.ranks()); "
                "load it with etc.runtime.load"
            )
        self.manifest = m
        self.rank_symbol, self.count_symbol = m.ranks
        self._opened: list[int] = []  # peers' allocations mapped here
        self._owned: list[Any] = []
        self._scratch = _zeroed(self.kernel, 4 * scratch_words)
        # Peers notify each other's counters, after the status words.
        table = self._table(self._scratch, 4 * m.status_words)
        self.kernel._peers, self.kernel._num_ranks = table, ranks

    def _exchange(self, buf: driver.DeviceBuffer, offset: int = 0) -> list[int]:
        """Every rank's address of its `buf` (+ `offset`), mapped into this process.
        Collective: every rank calls it for the same allocation in the same order."""
        cu = driver._require()
        self.kernel._ensure_context()
        handle = driver.check(cu.cuIpcGetMemHandle(buf.ptr), "cuIpcGetMemHandle")
        handles = list(self._all_gather(bytes(handle.reserved)))
        if len(handles) != self.ranks:
            raise LaunchError(
                f"ProcessRank: all_gather returned {len(handles)} entries for {self.ranks} ranks"
            )
        addresses = []
        flags = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        for q, data in enumerate(handles):
            if q == self.rank:
                addresses.append(buf.ptr + offset)
                continue
            peer = cu.CUipcMemHandle()
            peer.reserved = bytes(data)
            ptr = int(
                driver.check(cu.cuIpcOpenMemHandle(peer, flags), f"cuIpcOpenMemHandle(rank {q})")
            )
            self._opened.append(ptr)
            addresses.append(ptr + offset)
        return addresses

    def _table(self, buf: driver.DeviceBuffer, offset: int = 0) -> driver.DeviceBuffer:
        """A device table of every rank's address of `buf` + `offset` (collective)."""
        table = np.array(self._exchange(buf, offset), dtype=np.int64)
        buf = driver.DeviceBuffer(table.nbytes)
        driver.htod(buf.ptr, table.ctypes.data, table.nbytes)
        self._owned.append(buf)
        return buf

    def symmetric_empty(self, nbytes: int) -> SymmetricBuffer:
        """A zeroed buffer of `nbytes` on every rank, and its peer table (collective)."""
        if not is_int(nbytes, 1):
            raise LaunchError(f"symmetric_empty: nbytes must be an int >= 1, got {nbytes!r}")
        buf = _zeroed(self.kernel, nbytes)
        peers = self._table(buf)
        return SymmetricBuffer(nbytes, buf.ptr, peers.ptr, [buf, peers])

    def launch(
        self,
        tensors: Mapping[str, Any],
        symbols: Mapping[str, int] | None = None,
        stream: Any = None,
        sync: bool = True,
        max_polls: int | None = None,
    ) -> None:
        """Launches this rank (the other ranks' processes launch theirs); as
        :meth:`etc.runtime.Kernel.launch`, with the rank symbols bound here."""
        symbols = _free_symbols(
            self.manifest, symbols, f"the ProcessRank (rank {self.rank} of {self.ranks})"
        )
        k = self.kernel
        handle = _stream_handle(stream, "torch" in sys.modules, k.device.ordinal)
        k._scratch[handle] = self._scratch
        bound = {**symbols, self.rank_symbol: self.rank, self.count_symbol: self.ranks}
        k._ensure_context()
        k.launch(tensors, bound, stream=handle, sync=sync, max_polls=max_polls)

    def check(self) -> None:
        """Waits for this rank's latest launch; raises its failure."""
        self.kernel._ensure_context()
        self.kernel.check()

    def reset(self) -> None:
        """After a failed launch: waits for this GPU, zeroes this rank's counters and
        rank barrier, then waits for every rank to have done so (collective)."""
        _zero(self.kernel, self._scratch)
        self._all_gather(b"reset")

    def close(self) -> None:
        """Unmaps the peers' allocations (also when garbage-collected)."""
        cu = driver.cu
        for ptr in self._opened:
            try:
                cu.cuIpcCloseMemHandle(ptr)
            except Exception:
                pass
        self._opened.clear()

    def __del__(self) -> None:
        if getattr(self, "_opened", None):
            self.close()

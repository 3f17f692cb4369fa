"""Exceptions raised by ETC.

Every error ETC raises on purpose is an :class:`EtcError`. This module has no
dependencies so that the graph API, the simulator and the runtime (which runs
on machines without the compiled MLIR extension) can all share it.
"""

from __future__ import annotations

__all__ = [
    "EtcError",
    "GraphError",
    "ShapeError",
    "CompileError",
    "LaunchError",
    "LaunchTimeoutError",
    "DeadlockError",
]


class EtcError(Exception):
    """Base class of every ETC error."""


class GraphError(EtcError):
    """The task graph is wrong: bad edge map, arity, cycle, wait count, ..."""


class ShapeError(EtcError):
    """A concrete tensor or symbol does not fit the graph's declared shapes."""


class CompileError(EtcError):
    """A compilation pipeline failed."""


class LaunchError(EtcError):
    """A megakernel could not be launched or reported a failure."""


class LaunchTimeoutError(LaunchError):
    """A launch did not finish within the caller's ``timeout``: a hang the
    kernel's watchdog does not see (its waits are bounded, a barrier is not).
    The kernel still runs, so its CUDA context stays busy."""


class DeadlockError(EtcError):
    """No task instance can make progress although work remains.

    Attributes describe the first stuck wait (``None`` when unknown):
    ``event`` (event name), ``coordinate`` (tuple of ints), ``task`` (name of
    the waiting task), ``instance`` (its grid coordinates), ``counter`` (the
    counter value seen) and ``wait_count`` (the count it needed).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        event: str | None = None,
        coordinate: tuple[int, ...] | None = None,
        task: str | None = None,
        instance: tuple[int, ...] | None = None,
        counter: int | None = None,
        wait_count: int | None = None,
    ) -> None:
        self.event = event
        self.coordinate = None if coordinate is None else tuple(coordinate)
        self.task = task
        self.instance = None if instance is None else tuple(instance)
        self.counter = counter
        self.wait_count = wait_count
        if message is None:
            message = self.describe()
        super().__init__(message)

    def describe(self) -> str:
        """A one-line description built from the attributes."""
        subject = ""
        if self.task is not None:
            subject = f"task '{self.task}'"
            if self.instance is not None:
                subject += f" instance {_fmt(self.instance)}"
            subject += " "
        if self.event is None:
            return f"deadlock: {subject}cannot make progress"
        text = f"deadlock: {subject}waits on event '{self.event}'"
        if self.coordinate is not None:
            text += f" at {_fmt(self.coordinate)}"
        if self.counter is not None and self.wait_count is not None:
            text += f": counter {self.counter} < wait count {self.wait_count}"
        return text


def _fmt(coords: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(c) for c in coords) + ")"

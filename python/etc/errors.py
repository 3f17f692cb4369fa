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
    "TriggerRangeError",
    "WaitCountError",
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


class TriggerRangeError(LaunchError):
    """A data-dependent trigger's ``indptr`` table is not a partition of the
    task's grid: it does not start at 0, decreases, or ends past the grid's
    bound. Raised by the simulator and, from the kernel's status record, by
    the runtime; the kernel stops instead of running instances outside their
    ranges or dropping the ones past the bound.

    Attributes: ``task`` and ``table`` (names), ``coordinate`` (``c``),
    ``begin`` and ``end`` (``indptr[c]``, ``indptr[c+1]``), ``bound`` (the
    task's grid) and ``instance`` (the instance that found no range, or
    None).
    """

    def __init__(
        self,
        task: str,
        table: str,
        coordinate: int,
        begin: int,
        end: int,
        bound: int,
        instance: int | None = None,
        *,
        graph: str | None = None,
    ) -> None:
        self.task, self.table, self.coordinate = task, table, coordinate
        self.begin, self.end, self.bound, self.instance = begin, end, bound, instance
        prefix = f"{graph}: " if graph else ""
        super().__init__(prefix + self.describe())

    def describe(self) -> str:
        """One line naming the task, the table, the entries and the fix."""
        t, c = self.table, self.coordinate
        head = f"task '{self.task}': trigger table '{t}'"
        if c == 0 and self.begin != 0:
            return (
                f"{head} starts at {t}[0] = {self.begin}, not 0 (instances below it would "
                "belong to no coordinate)"
            )
        if self.end < self.begin:
            return (
                f"{head} decreases at coordinate {c}: {t}[{c}] = {self.begin} > "
                f"{t}[{c + 1}] = {self.end} (a trigger table must be nondecreasing)"
            )
        if self.end > self.bound:
            return (
                f"{head} ends coordinate {c}'s range at {t}[{c + 1}] = {self.end}, past the "
                f"task's grid of {self.bound} instances: instances {self.bound}..{self.end - 1} "
                "would never run (raise the grid's bound)"
            )
        return (
            f"{head} is not nondecreasing: instance {self.instance} counted coordinate {c}, "
            f"whose range is [{self.begin}, {self.end})"
        )


class WaitCountError(LaunchError, GraphError):
    """A coordinate of an event whose wait counts are read from a table
    received more notifications than its count: the count released its
    waiters before its last producers finished, so they may have read
    results still being written (a race no schedule orders). The kernel
    checks as the launch ends, the static simulator as its run ends and the
    dynamic one at the notification past the count (its message then names
    the producer); the launch checks compare only constant and symbolic
    counts. A :class:`LaunchError` and a :class:`GraphError`.

    Attributes: ``event``, ``coordinate`` (a tuple), ``table`` (the count
    tensor's name), ``counter`` (the notifications) and ``wait_count``.
    """

    def __init__(
        self,
        event: str,
        coordinate: tuple[int, ...],
        table: str,
        counter: int,
        wait_count: int,
        *,
        graph: str | None = None,
        message: str | None = None,
    ) -> None:
        self.event, self.coordinate, self.table = event, tuple(coordinate), table
        self.counter, self.wait_count = counter, wait_count
        prefix = f"{graph}: " if graph else ""
        super().__init__(
            message
            or f"{prefix}event '{event}' at {self.coordinate} was notified {counter} "
            f"times, but its wait count ({table}{list(self.coordinate)}) is {wait_count}: its "
            f"waiters were released after {wait_count} notifications, before the rest of its "
            "producers finished (the table's count is too low)"
        )


def _fmt(coords: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(c) for c in coords) + ")"

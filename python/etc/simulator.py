"""CPU reference executor: runs a graph's numpy reference tiles with real
event-counter semantics, in the order a chosen schedule would.

* Counters start at 0. When a task instance finishes (its reference has
  run), each of its out-edge coordinates gets +1. A wait is satisfied when
  the counter at the coordinate is at least the event's wait count there (an
  int, a symbol expression, or the value of the wait-count tensor at that
  coordinate, read at the time of the check).
* ``schedule="static"``: the per-CTA queues of :func:`static_queues`, each
  CTA running its queue in order and blocking at its head; CTAs are stepped
  round-robin, one instance per step.
* ``schedule="dynamic"``: the ready queue of ``etensor-dynamic-schedule``
  (see docs/scheduling.md), run by ``num_ctas`` simulated CTAs. Positions
  ``[0, R0)`` name the instances of tasks without in-edges; later ones are
  ring slots filled by pushes. A CTA claims positions in chunks (requested
  one pop ahead, as the kernel does), takes them in order, blocks on an
  unfilled slot and exits at a position past the last instance. A notification that makes a
  counter *equal* its wait count pushes the consumers of that coordinate
  (through ``ready.<task>`` when a consumer has several in-edges); with
  ``early_push`` it is counted on ``dispatched.<event>`` when the producer
  starts and consumers then wait for the real counters. Each step, a seeded
  RNG picks a runnable CTA and it performs one atomic action (claim,
  notification, push, wait check, body): seeds are interleavings.

A hang raises :class:`~etc.errors.DeadlockError` naming what is stuck; in
the dynamic schedule, as on the GPU, "no task became ready for queue
position p of N", plus the instances never pushed and why (a wait count of
0 is never *equalled*, so it never releases consumers). A notification to a
coordinate that already released its consumers raises GraphError (the GPU
would race), pushing an instance twice raises LaunchError (the GPU's queue
overflow).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._fields import is_int
from .dtypes import f32_to_bf16
from .errors import (
    DeadlockError,
    EtcError,
    GraphError,
    LaunchError,
    ShapeError,
    TriggerRangeError,
    WaitCountError,
)
from .graph import Edge, Event, Graph, Task, Tensor
from .symbolic import Symbol, SymExpr, evaluate

__all__ = ["simulate", "static_queues"]

# How many stuck waits a DeadlockError message lists.
_MAX_REPORTED = 8
# Ranked graphs' wait counts are checked by enumeration up to this many instances.
_MAX_ENUMERATED_RANKS = 1 << 20


def bind_symbols(graph: Graph, symbols: Mapping[Any, Any] | None) -> dict[str, int]:
    """Check concrete symbol values: every symbol given, each an int >= 0."""
    given: dict[str, Any] = {}
    for key, value in (symbols or {}).items():
        name = key.name if isinstance(key, Symbol) else key
        given[name] = value
    known = {s.name for s in graph.symbols}
    for name in given:
        if name not in known:
            raise ShapeError(f"graph '{graph.name}' has no symbol '{name}'")
    env: dict[str, int] = {}
    for sym in graph.symbols:
        if sym.name not in given:
            raise ShapeError(f"no value given for symbol '{sym.name}'")
        value = given[sym.name]
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise ShapeError(f"symbol '{sym.name}' must be an int, got {value!r}")
        value = value.__index__()
        if value < 0:
            raise ShapeError(f"symbol '{sym.name}' must be >= 0, got {value}")
        if sym.max is not None and value > sym.max:
            raise ShapeError(
                f"graph '{graph.name}': symbol '{sym.name}' = {value} is above {sym.max}, the "
                "largest its tiles take"
            )
        env[sym.name] = value
    from .runtime.args import check_requirements

    checks = ((size, evaluate(size, env), message) for size, message in graph.requirements)
    check_requirements(f"graph '{graph.name}'", checks, env)
    return env


def _concrete_shape(shape: tuple[Any, ...], env: dict[str, int], what: str) -> tuple[int, ...]:
    dims = tuple(evaluate(d, env) for d in shape)
    for k, (d, expr) in enumerate(zip(dims, shape, strict=True)):
        if d < 0:
            raise ShapeError(
                f"{what}: dimension {k} ({expr}) evaluates to {d} for "
                f"{', '.join(f'{n}={v}' for n, v in env.items())}"
            )
    return dims


def _grid_points(extents: tuple[int, ...]) -> list[tuple[int, ...]]:
    # Row-major linear order (last grid dimension fastest).
    return list(itertools.product(*(range(e) for e in extents)))


def _check_graph(graph: Any, caller: str) -> None:
    if not isinstance(graph, Graph):
        raise EtcError(f"{caller}: expected an etc.Graph, got {type(graph).__name__}")


def static_queues(
    graph: Graph, symbols: Mapping[Any, Any], num_ctas: int
) -> list[list[tuple[int, int]]]:
    """The static schedule's per-CTA queues for concrete ``symbols``.

    Instances are enumerated by phase (``Graph.task``'s ``phase``), then
    task by task in :meth:`Graph.topological_tasks` order, each task's
    instances in row-major linear order; global index ``g`` goes to CTA
    ``g % num_ctas``. Entries are ``(task number, linear instance index)``,
    the task number being the position in ``topological_tasks()``; a
    ``deal="pool"`` task has one entry ``(task number, pool)`` per phase in
    each CTA that received any of the phase's instances
    (:func:`etc.runtime.queue.pool_entries`). A clustered tile's groups
    (``etc.DeviceFunction.cluster``) go to one cluster's CTAs
    (:func:`etc.runtime.queue.cluster_ctas`).
    """
    _check_graph(graph, "static_queues")
    if not is_int(num_ctas, 1):
        raise EtcError(f"num_ctas must be a positive int, got {num_ctas!r}")
    # The runtime's own queue builder: one definition of the static order.
    from .runtime.queue import build_static_queue, decode, instance_phases

    env = bind_symbols(graph, symbols)
    tasks = graph.topological_tasks()
    grids = [_concrete_shape(t.grid, env, f"task '{t.name}': grid") for t in tasks]
    counts = [int(np.prod(grid, dtype=np.int64)) for grid in grids]
    phases = [instance_phases(t.phase, grid) for t, grid in zip(tasks, grids, strict=True)]
    pooled = [t.deal == "pool" for t in tasks]
    limits = [t.ctas or 0 for t in tasks]
    slots = [t.deal_slots or 0 for t in tasks]
    clusters = [getattr(t.function, "cluster", 0) for t in tasks]
    size = max(clusters, default=0)
    if size and num_ctas % size:
        raise EtcError(
            f"num_ctas={num_ctas} is not whole thread-block clusters of {size} CTAs (task "
            f"'{tasks[clusters.index(size)].name}' runs on clusters)"
        )
    return decode(
        build_static_queue(
            counts, num_ctas, phases, pooled, limits=limits, slots=slots, clusters=clusters
        )
    )


def _bind_inputs(
    graph: Graph, inputs: Mapping[Any, Any] | None, env: dict[str, int]
) -> dict[str, np.ndarray]:
    given: dict[str, Any] = {}
    if inputs is not None and not isinstance(inputs, Mapping):
        raise ShapeError(
            f"graph '{graph.name}': inputs must map tensor names to arrays, got "
            f"{type(inputs).__name__}"
        )
    for key, value in (inputs or {}).items():
        name = key.name if isinstance(key, Tensor) else key
        given[name] = value
    by_name = {t.name: t for t in graph.tensors}
    for name in given:
        if name not in by_name:
            raise ShapeError(f"graph '{graph.name}' has no tensor '{name}'")
        if by_name[name].map_of is not None:
            raise ShapeError(
                f"tensor '{name}' is a TMA tensor map, which the runtime encodes from "
                f"'{by_name[name].map_of.name}'; do not pass it"
            )
    arrays: dict[str, np.ndarray] = {}
    for t in graph.tensors:
        shape = _concrete_shape(t.shape, env, f"tensor '{t.name}'")
        if t.name not in given:
            arrays[t.name] = np.zeros(shape, dtype=t.dtype.numpy)
            continue
        value = np.asarray(given[t.name])
        if tuple(value.shape) != shape:
            raise ShapeError(
                f"tensor '{t.name}': expected shape {shape} (declared "
                f"{_fmt(t.shape)}), got {tuple(value.shape)}"
            )
        if t.dtype.name == "bf16" and value.dtype.kind == "f":
            arrays[t.name] = f32_to_bf16(value)  # bf16 is stored as its uint16 bits
        elif value.dtype == t.dtype.numpy or np.can_cast(value.dtype, t.dtype.numpy, "same_kind"):
            arrays[t.name] = np.array(value, dtype=t.dtype.numpy, copy=True)
        else:
            raise ShapeError(f"tensor '{t.name}': expected {t.dtype} data, got {value.dtype}")
    return arrays


def _fmt(shape: tuple[Any, ...]) -> str:
    items = [str(s) for s in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


class _Machine:
    """Counters, arrays and instance bookkeeping shared by both schedules.

    In a graph that spans ranks there is one machine per rank (``rank``);
    ``world`` lists them all: a notification of a ranked event goes to the
    counters of the machine its coordinate 0 names, and a peer table tensor
    reaches the references as the list of every rank's buffer."""

    def __init__(
        self,
        graph: Graph,
        arrays: dict[str, np.ndarray],
        env: dict[str, int],
        rank: int = 0,
        world: list[_Machine] | None = None,
    ):
        self.graph = graph
        self.arrays = arrays
        self.env = env
        self.rank = rank
        self.world = [self] if world is None else world
        self.order = graph.topological_tasks()
        # Triggered tasks whose in-edges made their table final: past
        # indptr[C] they wait for nothing (the GPU's register table).
        self.guarded = {t.index for t in self.order if graph.guarded_indptr(t)}
        self.grids = [_concrete_shape(t.grid, env, f"task '{t.name}': grid") for t in self.order]
        self.points = [_grid_points(grid) for grid in self.grids]
        self.counters: dict[int, np.ndarray] = {}
        self.shapes: dict[int, tuple[int, ...]] = {}
        self.counts: dict[int, Callable[[tuple[int, ...]], int]] = {}
        # Waits passed against a wait-count table: (event, coord, count read,
        # task, instance); the table must not change afterwards.
        self.table_reads: dict[tuple[int, tuple[int, ...], int, str, tuple[int, ...]], Event] = {}
        for e in graph.events:
            shape = _concrete_shape(e.shape, env, f"event '{e.name}'")
            self.shapes[e.index] = shape
            self.counters[e.index] = np.zeros(shape, dtype=np.int64)
            self.counts[e.index] = self._count_reader(e, shape, env)
        for t, points in zip(self.order, self.points, strict=True):
            if t.function.reference is None and points:
                raise EtcError(
                    f"task '{t.name}': device function '{t.function.name}' has no "
                    "numpy reference, so it cannot be simulated"
                )

    def _count_reader(
        self, event: Event, shape: tuple[int, ...], env: dict[str, int]
    ) -> Callable[[tuple[int, ...]], int]:
        count = event.wait_count
        if isinstance(count, Tensor):
            table = self.arrays[count.name]
            if tuple(table.shape) != shape:
                raise ShapeError(
                    f"event '{event.name}': wait count tensor '{count.name}' has shape "
                    f"{tuple(table.shape)} but the event has shape {shape}"
                )
            return lambda coord: int(table[coord])
        value = evaluate(count, env) if isinstance(count, SymExpr) else int(count)
        return lambda coord: value

    def check_table_counts(self) -> None:
        """After a static run: no coordinate of an event whose wait counts are
        read from a table got more notifications than its count (the kernel
        checks the same as the launch ends; the dynamic run reports it at the
        notification)."""
        for e in self.graph.events:
            if not isinstance(e.wait_count, Tensor) or e.ranked:
                continue
            counters = self.counters[e.index]
            for coord in np.ndindex(counters.shape):
                counter, count = int(counters[coord]), self.counts[e.index](coord)
                if counter > count:
                    raise WaitCountError(
                        e.name, coord, e.wait_count.name, counter, count, graph=self.graph.name
                    )

    def trigger_table(self, number: int) -> np.ndarray:
        """The ``C + 1`` entries of a triggered task's current ``indptr``."""
        task = self.order[number]
        assert task.trigger is not None
        extent = self.shapes[task.trigger.event.index][0]
        indptr = self.arrays[task.trigger.indptr.name].reshape(-1)[: extent + 1]
        if len(indptr) < extent + 1:
            raise ShapeError(
                f"task '{task.name}': indptr '{task.trigger.indptr.name}' has "
                f"{len(indptr)} entries, the trigger event needs {extent + 1}"
            )
        return indptr.astype(np.int64)

    def trigger_coordinate(
        self, number: int, linear: int, indptr: np.ndarray | None = None
    ) -> int | None:
        """Coordinate ``c`` with ``indptr[c] <= linear < indptr[c+1]`` of a
        triggered instance, read from the current ``indptr`` (or the table
        the caller read) as the GPU does (the count of entries ``<= linear``,
        less one); None when the instance is at or past ``indptr[C]`` (no
        work)."""
        if indptr is None:
            indptr = self.trigger_table(number)
        below = int(np.count_nonzero(indptr <= linear))
        if below >= len(indptr):
            return None
        return min(max(below, 1), len(indptr) - 1) - 1

    def trigger_range_error(
        self, number: int, c: int, instance: int | None = None
    ) -> TriggerRangeError:
        task, indptr = self.order[number], self.trigger_table(number)
        assert task.trigger is not None
        return TriggerRangeError(
            task.name,
            task.trigger.indptr.name,
            c,
            int(indptr[c]),
            int(indptr[c + 1]),
            self.instance_count(number),
            instance,
            graph=self.graph.name,
        )

    def bad_ranges(self, number: int, indptr: np.ndarray) -> np.ndarray:
        """Per coordinate ``c``, whether range ``c`` of ``indptr`` lies outside
        the task's grid (the GPU's check: ``begin <= end <= bound``, and
        ``begin == 0`` at 0)."""
        begin, end = indptr[:-1], indptr[1:]
        bad = (begin > end) | (end > self.instance_count(number))
        bad[:1] |= begin[:1] != 0
        return bad

    def check_trigger_table(self, number: int, indptr: np.ndarray) -> None:
        """Raise for the first range of a final trigger table (``indptr``, as
        the caller read it) outside the grid (the static GPU lowering checks
        the whole table once it is final)."""
        bad = self.bad_ranges(number, indptr)
        if bad.any():
            raise self.trigger_range_error(number, int(np.argmax(bad)))

    def instance_count(self, number: int) -> int:
        return len(self.points[number])

    def pool_instance(self, number: int, pool: int, drawn: int) -> int | None:
        """The linear index of draw number ``drawn`` from pool ``pool`` of a
        ``deal="pool"`` task (its instances whose phase coordinate is
        ``pool``, in linear order, as the GPU maps them), or None past the
        last: the pool is empty."""
        task, count = self.order[number], len(self.points[number])
        if task.phase[0] != "dim":
            return drawn if drawn < count else None
        grid, d = self.grids[number], task.phase[1]
        inner = int(np.prod(grid[d + 1 :], dtype=np.int64))
        if drawn >= count // grid[d]:
            return None
        return (drawn // inner) * grid[d] * inner + pool * inner + drawn % inner

    def point(self, number: int, linear: int, c: int | None = None) -> tuple[int, ...]:
        """The coordinates an instance's function and edge maps take: its grid
        point, plus the trigger coordinate of a triggered task."""
        grid_point = self.points[number][linear]
        if self.order[number].trigger is None:
            return grid_point
        return (*grid_point, 0 if c is None else c)

    def trigger_blocker(self, task: Task, c: int | None) -> tuple[Any, ...] | None:
        """Static schedule: what a triggered instance of coordinate ``c`` (from
        the current ``indptr``) waits for: ``e[c]`` alone, or, past
        ``indptr[C]`` (``c`` None), the first incomplete coordinate of the
        whole event (the GPU waits for the event, then searches again), or
        nothing when the table was final at the in-edges (``guarded_indptr``)."""
        assert task.trigger is not None
        if c is None and task.index in self.guarded:
            return None
        e = task.trigger.event.index
        coords = range(self.shapes[e][0]) if c is None else (c,)
        for c in coords:
            counter, needed = int(self.counters[e][(c,)]), self.counts[e]((c,))
            if counter < needed:
                return (task.trigger.event.name, (c,), task.name, counter, needed)
        return None

    def coord(self, task: Task, edge: Any, point: tuple[int, ...], kind: str) -> tuple[int, ...]:
        coord = edge.map.apply(point, self.rank)
        shape = self.shapes[edge.event.index]
        if any(not 0 <= c < s for c, s in zip(coord, shape, strict=True)):
            raise GraphError(
                f"task '{task.name}' instance {point}: {kind}-edge map '{edge.map}' "
                f"addresses coordinate {coord} outside event '{edge.event.name}' of "
                f"shape {shape}"
            )
        return coord

    def blocker(self, number: int, linear: int) -> tuple[Any, ...] | None:
        """The first unsatisfied wait of an instance, or None if it may start.

        A triggered instance (static schedule) waits for its in-edges, then
        for its trigger coordinate (see :meth:`trigger_blocker`)."""
        task, point = self.order[number], self.point(number, linear)
        reads = []
        for edge in task.in_edges:
            coord = self.coord(task, edge, point, "in")
            counter = int(self.counters[edge.event.index][coord])
            needed = self.counts[edge.event.index](coord)
            if counter < needed:
                return (edge.event.name, coord, task.name, point, counter, needed)
            if isinstance(edge.event.wait_count, Tensor):
                reads.append(((edge.event.index, coord, needed, task.name, point), edge.event))
        if task.trigger is not None:
            stuck = self.trigger_blocker(task, self.trigger_coordinate(number, linear))
            if stuck is not None:
                ev, c, name, counter, needed = stuck
                return (ev, c, name, self.points[number][linear], counter, needed)
        self.table_reads.update(reads)
        return None

    def check_table_reads(self, how: str) -> None:
        """A wait passed against a wait-count table read a count the table
        later lost: on the GPU the wait could pass before the table's
        producer ran (the static schedule reads the table when the wait
        starts), so the graph has a race the GPU may or may not lose."""
        for (_, coord, used, task, point), event in self.table_reads.items():
            now = self.counts[event.index](coord)
            if now != used:
                assert isinstance(event.wait_count, Tensor)
                raise GraphError(
                    f"graph '{self.graph.name}' ({how}): task '{task}' instance {point} passed "
                    f"its wait on event '{event.name}' at {coord} with wait count {used} read "
                    f"from tensor '{event.wait_count.name}', which later became {now}; a "
                    "wait reads its count table when it starts, so the table must be final "
                    "by then: make the task first wait on an event that the table's producer "
                    "notifies after writing it (an earlier in-edge)"
                )

    def body(self, number: int, linear: int, c: int | None = None) -> None:
        """Run one instance's numpy reference."""
        task, point = self.order[number], self.point(number, linear, c)
        buffers = [self.argument(a) for a in task.args]
        reference = task.function.reference
        assert reference is not None
        try:
            reference(*point, *buffers)
        except EtcError:
            raise
        except Exception as exc:
            raise EtcError(
                f"task '{task.name}' instance {point}: the reference of device function "
                f"'{task.function.name}' raised {type(exc).__name__}: {exc}"
            ) from exc

    def argument(self, arg: Tensor | Symbol) -> Any:
        """What a reference gets for a task argument: a symbol's value, a
        tensor's array, or for a peer table every rank's array of its tensor."""
        if isinstance(arg, Symbol):
            return self.env[arg.name]
        if arg.peers_of is not None:
            return [m.arrays[arg.peers_of.name] for m in self.world]
        return self.arrays[arg.name]

    def counters_of(self, event: Event, coord: tuple[int, ...]) -> np.ndarray:
        """The counters a notification of ``coord`` updates: a ranked event's
        live on the rank its coordinate 0 names."""
        if event.ranked:
            return self.world[coord[0]].counters[event.index]
        return self.counters[event.index]

    def run(self, number: int, linear: int) -> None:
        """Run one instance, then notify each of its out-edge coordinates (a
        triggered instance past ``indptr[C]`` does neither)."""
        task, c = self.order[number], None
        if task.trigger is not None:
            # The instance waited for a coordinate (or the table was guarded):
            # by the trigger's contract the table is final.
            indptr = self.trigger_table(number)
            self.check_trigger_table(number, indptr)
            c = self.trigger_coordinate(number, linear, indptr)
            if c is None:
                return
        self.body(number, linear, c)
        point = self.point(number, linear, c)
        for edge in task.out_edges:
            coord = self.coord(task, edge, point, "out")
            self.counters_of(edge.event, coord)[coord] += 1

    def deadlock(self, stuck: list[tuple[Any, ...]], remaining: int, how: str) -> DeadlockError:
        lines = [
            f"task '{t}' instance {p} waits on event '{e}' at {c}: counter {n} < wait count {w}"
            for e, c, t, p, n, w in stuck[:_MAX_REPORTED]
        ]
        if len(stuck) > _MAX_REPORTED:
            lines.append(f"... and {len(stuck) - _MAX_REPORTED} more")
        events = sorted({s[0] for s in stuck})
        message = (
            f"deadlock in graph '{self.graph.name}' ({how}): {remaining} task "
            f"instance(s) cannot start; stuck on event(s) "
            f"{', '.join(repr(e) for e in events)}:\n  " + "\n  ".join(lines)
        )
        e, c, t, p, n, w = stuck[0]
        return DeadlockError(
            message, event=e, coordinate=c, task=t, instance=p, counter=n, wait_count=w
        )


def _run_static(machines: list[_Machine], num_ctas: int) -> None:
    """Every rank's CTAs (one machine per rank), stepped round-robin."""
    ctas = [(m, queue) for m in machines for queue in static_queues(m.graph, m.env, num_ctas)]
    heads = [0] * len(ctas)
    remaining = sum(m.instance_count(n) for m in machines for n in range(len(m.order)))
    # deal="ticket" tasks: an entry runs the next unclaimed instance, claimed
    # when the entry reaches its CTA's head (the GPU claims it one entry
    # earlier; any claim order runs each instance once). deal="pool" entries
    # claim the next instance of their pool until it is empty, then move on.
    tickets = [{n: 0 for n, t in enumerate(m.order) if t.deal == "ticket"} for m in machines]
    pools: list[dict[tuple[int, int], int]] = [{} for _ in machines]
    # Per CTA, the instance its head entry runs (None: not claimed yet).
    current: list[tuple[int, int] | None] = [None] * len(ctas)
    while remaining:
        for cta, (machine, queue) in enumerate(ctas):
            while heads[cta] < len(queue) and current[cta] is None:
                number, linear = queue[heads[cta]]
                rank = cta // num_ctas  # the CTA's rank's counters
                if number in tickets[rank]:
                    current[cta] = (number, tickets[rank][number])
                    tickets[rank][number] += 1
                elif machine.order[number].deal == "pool":
                    drawn = pools[rank].get((number, linear), 0)
                    pools[rank][(number, linear)] = drawn + 1
                    instance = machine.pool_instance(number, linear, drawn)
                    if instance is None:
                        heads[cta] += 1  # the pool is empty
                    else:
                        current[cta] = (number, instance)
                else:
                    current[cta] = (number, linear)
        # Every CTA looks at its head before any runs, as CTAs that start
        # together on a GPU do (a wait may read a count table before the
        # instance that writes it has run).
        ready = [
            cta
            for cta, (machine, _) in enumerate(ctas)
            if (now := current[cta]) is not None and machine.blocker(*now) is None
        ]
        ready = _whole_clusters(ready, ctas, current)
        for cta in ready:
            machine, queue = ctas[cta]
            now = current[cta]
            assert now is not None
            machine.run(*now)
            if machine.order[now[0]].deal != "pool":
                heads[cta] += 1  # a pool entry draws again
            current[cta] = None
            remaining -= 1
        progressed = bool(ready)
        if not progressed:
            stuck: list[tuple[_Machine, tuple[Any, ...]]] = []
            waiting_cluster = None
            for cta, (machine, _) in enumerate(ctas):
                if (now := current[cta]) is not None:
                    block = machine.blocker(*now)
                    if block is None:  # unblocked, but its cluster's other CTAs are not there
                        waiting_cluster = waiting_cluster or (cta, machine, now)
                        continue
                    stuck.append((machine, block))
            if not stuck:
                assert waiting_cluster is not None
                cta, machine, (number, linear) = waiting_cluster
                task = machine.order[number]
                raise DeadlockError(
                    f"deadlock in graph '{machine.graph.name}' (static schedule, {num_ctas} "
                    f"CTAs): CTA {cta} runs task '{task.name}' instance "
                    f"{machine.point(number, linear)}, whose thread-block cluster's other CTAs "
                    f"never reach its group; {remaining} task instance(s) remain",
                    task=task.name,
                    instance=machine.point(number, linear),
                )
            # Waits on a rank's own (unranked) events first: where a hang
            # that spans ranks starts.
            ranked = {e.name for e in machines[0].graph.events if e.ranked}
            stuck.sort(key=lambda mb: mb[1][0] in ranked)
            first = stuck[0][0]
            how = f"static schedule, {num_ctas} CTAs"
            if len(machines) > 1:
                how += f" per rank, {len(machines)} ranks; rank {first.rank} is stuck first"
                stuck = [
                    (m, (e, c, f"{t}' on rank '{m.rank}", p, n, w))
                    for m, (e, c, t, p, n, w) in stuck
                ]
            raise first.deadlock([b for _, b in stuck], remaining, how)
    for machine in machines:
        machine.check_table_reads(f"static schedule, {num_ctas} CTAs")


def _whole_clusters(
    ready: list[int], ctas: list[tuple[_Machine, Any]], current: list[tuple[int, int] | None]
) -> list[int]:
    """The ready CTAs less those at a clustered instance whose cluster's
    other CTAs are not at its group's other instances, ready too: the group
    waits for itself at cluster barriers, so it runs together or not at all."""
    ready_set = set(ready)
    out = []
    for cta in ready:
        machine, _ = ctas[cta]
        now = current[cta]
        assert now is not None
        size = getattr(machine.order[now[0]].function, "cluster", 0)
        if size:
            leader = cta - cta % size
            group = now[1] - now[1] % size
            if any(
                current[leader + r] != (now[0], group + r) or leader + r not in ready_set
                for r in range(size)
            ):
                continue
        out.append(cta)
    return out


@dataclass(frozen=True)
class _SlotWait:
    """A CTA waiting for ring slot ``slot`` (queue ``position``) to be filled."""

    position: int
    slot: int


@dataclass(frozen=True)
class _EventWait:
    """A CTA whose instance waits for ``edge``'s counter at ``coord``."""

    number: int
    linear: int
    edge: Edge
    coord: tuple[int, ...]


# What a simulated CTA needs before its next action (None: nothing).
_Gate = _SlotWait | _EventWait | None
_Instance = tuple[int, int]  # (task number, linear instance index)


class _DynamicRun:
    """The ready queue and CTAs of ``etensor-dynamic-schedule`` on the CPU.

    Each CTA is a generator that yields, before every atomic action, the
    condition that action needs; :meth:`run` resumes one runnable CTA per
    step, chosen with a seeded RNG.
    """

    def __init__(
        self, machine: _Machine, num_ctas: int, seed: int, early_push: bool, max_pop_chunk: int = 8
    ) -> None:
        self.m = machine
        self.num_ctas = num_ctas
        self.early_push = early_push
        self.rng = random.Random(seed)
        order = machine.order
        for task in order:
            for k, edge in enumerate(task.in_edges):
                dims = [v for kind, v in edge.map.results if kind == "dim"]
                if len(set(dims)) != len(dims):
                    raise GraphError(
                        f"task '{task.name}': in-edge #{k} map '{edge.map}' is not a "
                        "projection (each result a distinct grid dimension or a "
                        "constant): the dynamic schedule cannot enumerate the "
                        "consumers of a coordinate"
                    )
        self.initial: list[_Instance] = [
            (n, i)
            for n, t in enumerate(order)
            if not _pushing(t) and t.trigger is None
            for i in range(len(machine.points[n]))
        ]
        self.total = sum(len(p) for p in machine.points)
        # Data-dependent triggers: the tasks each event triggers, how many of
        # their trigger's coordinates fired, and the bound's unused instances
        # retired by the last one (they lower the termination count).
        self.triggers: dict[int, list[int]] = {}
        for n, t in enumerate(order):
            if t.trigger is not None:
                self.triggers.setdefault(t.trigger.event.index, []).append(n)
        self.fired: dict[int, int] = {}
        # Each triggered task's table when its first coordinate fired (final
        # by the trigger's contract), to tell a changed table from a bad one.
        self.fired_tables: dict[int, np.ndarray] = {}
        self.retired = 0
        self.ring: list[_Instance | None] = [None] * (self.total - len(self.initial))
        self.head = 0  # next queue position to claim
        # Positions per head request, as the kernel picks it: 1 unless many
        # instances are ready at start (then up to 8, >= 4 chunks per CTA).
        self.chunk = min(max(len(self.initial) // (4 * num_ctas), 1), max_pop_chunk)
        self.tail = 0  # next ring slot to fill
        self.pushed: set[_Instance] = set()
        self.steps = 0
        # Consumers of each coordinate, in the pass's order: tasks in graph
        # order, their in-edges in order, instances in row-major order.
        number = {t.index: n for n, t in enumerate(order)}
        self.consumers: dict[int, dict[tuple[int, ...], list[_Instance]]] = {}
        for event in machine.graph.events:
            # A triggered task is pushed by its trigger only; it waits for its
            # other in-edges after the pop. So does a ranked event's consumer.
            if event.ranked:
                continue
            edges = [(t, e) for t, e in machine.graph.consumers(event) if t.trigger is None]
            if not edges:
                continue
            by_coord: dict[tuple[int, ...], list[_Instance]] = {}
            for task, edge in edges:
                n = number[task.index]
                for linear, point in enumerate(machine.points[n]):
                    coord = machine.coord(task, edge, point, "in")
                    by_coord.setdefault(coord, []).append((n, linear))
            self.consumers[event.index] = by_coord
        # ready.<task>: completed in-edges of instances with several in-edges.
        self.ready: dict[_Instance, int] = {}
        # Events whose consumers are pushed at their producers' dispatch
        # (dispatched.<event>): with early push, unless the wait count is a
        # table, which may not be computed yet when a producer is dispatched.
        self.early = {
            e.index
            for e in machine.graph.events
            if early_push and e.index in self.consumers and not isinstance(e.wait_count, Tensor)
        }
        # The counters whose completion pushes: dispatched.<event> for those,
        # the real counters otherwise.
        self.gating: dict[int, np.ndarray] = {
            e: (np.zeros_like(machine.counters[e]) if e in self.early else machine.counters[e])
            for e in self.consumers
        }
        self.completed: set[tuple[int, tuple[int, ...]]] = set()

    # -- the scheduler -----------------------------------------------------
    def run(self) -> None:
        _run_dynamic([self])

    def _open(self, gate: _Gate) -> bool:
        if gate is None:
            return True
        if isinstance(gate, _SlotWait):
            return self.ring[gate.slot] is not None or gate.position >= self.total - self.retired
        e = gate.edge.event.index
        needed = self.m.counts[e](gate.coord)
        if int(self.m.counters[e][gate.coord]) < needed:
            return False
        if isinstance(gate.edge.event.wait_count, Tensor):
            task, point = self.m.order[gate.number], self.m.points[gate.number][gate.linear]
            key = (e, gate.coord, needed, task.name, point)
            self.m.table_reads[key] = gate.edge.event
        return True

    # -- one CTA -----------------------------------------------------------
    def _request(self) -> int:
        """Claim the next ``chunk`` queue positions (one atomic add on the head)."""
        first = self.head
        self.head += self.chunk
        return first

    def _cta(self) -> Iterator[_Gate]:
        # As the kernel's thread 0: positions [next, end) are claimed and
        # unused; `pending` starts a chunk requested one pop ahead.
        yield None
        pending, next_position, end = self._request(), 0, 0
        while True:
            yield None
            if next_position < end:
                position = next_position
            else:
                position, end = pending, pending + self.chunk
                pending = self._request()
            next_position = position + 1
            if position >= self.total - self.retired:
                return
            if position < len(self.initial):
                instance = self.initial[position]
            else:
                slot = position - len(self.initial)
                yield _SlotWait(position, slot)
                instance = self.ring[slot]
                if instance is None:  # retired: nobody fills this position
                    return
            yield from self._instance(*instance)

    def _instance(self, number: int, linear: int) -> Iterator[_Gate]:
        m = self.m
        task, c = m.order[number], None
        if task.trigger is not None:
            indptr = m.trigger_table(number)
            self._check_table_unchanged(number, indptr)
            c = m.trigger_coordinate(number, linear, indptr)
            if c is None:
                m.check_trigger_table(number, indptr)
                raise GraphError(
                    f"{self._where()}: task '{task.name}' instance {linear} was pushed but "
                    f"lies past {task.trigger.indptr.name}[C]"
                )
            if not indptr[c] <= linear < indptr[c + 1]:
                raise m.trigger_range_error(number, c, linear)
        point = m.point(number, linear, c)
        outs = [(edge, m.coord(task, edge, point, "out")) for edge in task.out_edges]
        for edge, coord in outs:
            if edge.event.index in self.early:
                yield None
                if self._notify(edge.event, coord, number, linear):
                    yield from self._push_consumers(edge.event.index, coord)
        for edge in task.in_edges:
            if self.early_push or task.trigger is not None or edge.event.ranked:
                yield _EventWait(number, linear, edge, m.coord(task, edge, point, "in"))
        yield None
        m.body(number, linear, c)
        for edge, coord in outs:
            yield None
            e = edge.event.index
            if e in self.early or e not in self.consumers:
                m.counters_of(edge.event, coord)[coord] += 1
                # A trigger fires when the real counter completes.
                if e in self.triggers and int(m.counters[e][coord]) == m.counts[e](coord):
                    yield from self._fire(e, coord)
            elif self._notify(edge.event, coord, number, linear):
                yield from self._push_consumers(e, coord)
                if e in self.triggers:
                    yield from self._fire(e, coord)

    def _check_table_unchanged(self, number: int, indptr: np.ndarray) -> None:
        """A triggered instance's table (``indptr``, as read now) must be the
        one its trigger fired with (the GPU counts over the table as it is
        when the instance runs)."""
        task, fired = self.m.order[number], self.fired_tables.get(number)
        if fired is not None and not np.array_equal(fired, indptr):
            assert task.trigger is not None
            raise GraphError(
                f"{self._where()}: task '{task.name}': the indptr table "
                f"'{task.trigger.indptr.name}' changed after its trigger fired (it must be "
                "final before any coordinate of the trigger event completes)"
            )

    def _fire(self, event: int, coord: tuple[int, ...]) -> Iterator[_Gate]:
        """Coordinate ``c`` of a trigger event completed: push each triggered
        task's range ``[indptr[c], indptr[c+1])``; the last coordinate to fire
        retires the bound's unused instances."""
        (c,) = coord
        for number in self.triggers[event]:
            task = self.m.order[number]
            assert task.trigger is not None
            extent = self.m.shapes[event][0]
            indptr = self.m.trigger_table(number)
            self._check_table_unchanged(number, indptr)
            self.fired_tables.setdefault(number, indptr)
            if self.m.bad_ranges(number, indptr)[c]:
                raise self.m.trigger_range_error(number, c)
            for linear in range(int(indptr[c]), int(indptr[c + 1])):
                yield None
                self._push((number, linear))
            yield None
            self.fired[number] = self.fired.get(number, 0) + 1
            if self.fired[number] == extent:
                self.retired += len(self.m.points[number]) - int(indptr[extent])

    def _notify(self, event: Event, coord: tuple[int, ...], number: int, linear: int) -> bool:
        """+1 on the gating counter; True when it now equals the wait count."""
        counter = self.gating[event.index]
        counter[coord] += 1
        now, needed = int(counter[coord]), self.m.counts[event.index](coord)
        key = (event.index, coord)
        if key in self.completed and now != needed:
            # The consumers already pushed may run before this producer
            # finishes; the GPU reports a table's count as the launch ends.
            what = "dispatch" if event.index in self.early else "notification"
            message = (
                f"{self._where()}: task '{self.m.order[number].name}' instance "
                f"{self.m.points[number][linear]}: {what} {now} of event '{event.name}' at "
                f"{coord} comes after the coordinate reached its wait count {needed} and "
                "released its consumers, which may then run before this producer "
                "finishes; the wait count is too low (the dynamic schedule needs it to "
                "equal the number of notifications)"
            )
            if isinstance(event.wait_count, Tensor):
                raise WaitCountError(
                    event.name, coord, event.wait_count.name, now, needed, message=message
                )
            raise GraphError(message)
        if now == needed:
            self.completed.add(key)
            return True
        return False

    def _push_consumers(self, event: int, coord: tuple[int, ...]) -> Iterator[_Gate]:
        for instance in self.consumers[event].get(coord, ()):
            task = self.m.order[instance[0]]
            pushing = len(_pushing(task))
            if pushing >= 2:
                yield None
                count = self.ready[instance] = self.ready.get(instance, 0) + 1
                if count != pushing:
                    continue
            yield None
            self._push(instance)

    def _push(self, instance: _Instance) -> None:
        if instance in self.pushed:
            number, linear = instance
            if self.m.order[number].trigger is not None:
                # Overlapping ranges: the table changed, or it decreases
                # somewhere, which names the mistake.
                indptr = self.m.trigger_table(number)
                self._check_table_unchanged(number, indptr)
                self.m.check_trigger_table(number, indptr)
            raise LaunchError(
                f"{self._where()}: ready-queue overflow: task "
                f"'{self.m.order[number].name}' instance {self.m.points[number][linear]} "
                f"is pushed a second time (the ring holds {len(self.ring)} slots, one per "
                "instance with in-edges); its dependencies completed twice, so a "
                "wait-count table changed during the run"
            )
        self.pushed.add(instance)
        self.ring[self.tail] = instance
        self.tail += 1

    # -- reports -------------------------------------------------------------
    def _where(self) -> str:
        mode = "early push" if self.early_push else "push on completion"
        return (
            f"graph '{self.m.graph.name}' (dynamic schedule, {mode}, {self.num_ctas} CTA"
            f"{'s' if self.num_ctas != 1 else ''})"
        )

    def _unpushed(self) -> list[tuple[Any, ...]]:
        """(event, coord, task, instance, counter, wait count) of each in-edge
        that kept an instance from being pushed, in task and linear order."""
        m, stuck = self.m, []
        for number, task in enumerate(m.order):
            if not _pushing(task) or task.trigger is not None:
                continue
            for linear, point in enumerate(m.points[number]):
                if (number, linear) in self.pushed:
                    continue
                for edge in _pushing(task):
                    coord = m.coord(task, edge, point, "in")
                    e = edge.event.index
                    if (e, coord) not in self.completed:
                        counter = int(self.gating[e][coord])
                        stuck.append(
                            (edge.event.name, coord, task.name, point, counter, m.counts[e](coord))
                        )
        return stuck

    def _deadlock(self, gates: dict[int, _Gate]) -> DeadlockError:
        m = self.m
        slots = sorted((g.position, k) for k, g in gates.items() if isinstance(g, _SlotWait))
        # (CTA, (event, coord, task, instance, counter, wait count))
        waits: list[tuple[int, tuple[Any, ...]]] = []
        for k, g in gates.items():
            if isinstance(g, _EventWait):
                e = g.edge.event.index
                task, point = m.order[g.number], m.points[g.number][g.linear]
                counter, needed = int(m.counters[e][g.coord]), m.counts[e](g.coord)
                waits.append((k, (g.edge.event.name, g.coord, task.name, point, counter, needed)))
        lines = [f"CTA {k} waits for queue position {position}" for position, k in slots]
        for k, (ev, c, t, p, n, w) in waits:
            lines.append(
                f"CTA {k}: task '{t}' instance {p} waits on event '{ev}' at {c}: "
                f"counter {n} < wait count {w}"
            )
        unpushed = self._unpushed() if slots else []
        early = {self.m.graph.events[e].name for e in self.early}
        for ev, c, t, p, n, w in unpushed[:_MAX_REPORTED]:
            what = "dispatches" if ev in early else "notifications"
            hint = (
                " (a wait count of 0 never releases consumers: only a notification that "
                "makes the counter equal to it does)"
                if w == 0
                else ""
            )
            lines.append(
                f"task '{t}' instance {p} was never pushed: event '{ev}' at {c} got {n} "
                f"producer {what}, wait count {w}{hint}"
            )
        if len(unpushed) > _MAX_REPORTED:
            lines.append(f"... and {len(unpushed) - _MAX_REPORTED} more never pushed")
        if slots:
            head = f"no task became ready for queue position {slots[0][0]} of {self.total}"
            cause = unpushed[0] if unpushed else None
        else:
            cause = waits[0][1]
            head = f"task '{cause[2]}' instance {cause[3]} waits forever on event '{cause[0]}'"
        message = f"deadlock in {self._where()}: {head}:\n  " + "\n  ".join(lines)
        if cause is None:  # as the GPU reports it: the counter is the position
            return DeadlockError(message, counter=slots[0][0])
        e, c, t, p, n, w = cause
        return DeadlockError(
            message, event=e, coordinate=c, task=t, instance=p, counter=n, wait_count=w
        )


def _pushing(task: Task) -> list[Edge]:
    """The in-edges whose completion pushes an instance (not ranked ones,
    which are awaited after the pop)."""
    return [e for e in task.in_edges if not e.event.ranked]


def _run_dynamic(runs: list[_DynamicRun]) -> None:
    """Interleaves the CTAs of every rank's run, one atomic action per step,
    picked with the first run's seeded RNG."""
    rng = runs[0].rng
    ctas = [(run, k, run._cta()) for run in runs for k in range(run.num_ctas)]
    gates: list[_Gate] = [next(cta) for _, _, cta in ctas]
    live = list(range(len(ctas)))
    while live:
        runnable = [k for k in live if ctas[k][0]._open(gates[k])]
        if not runnable:
            # Report a rank stuck on its own (unranked) events if there is
            # one: where a hang that spans ranks starts.
            def local(k: int) -> bool:
                gate = gates[k]
                return not (isinstance(gate, _EventWait) and gate.edge.event.ranked)

            stuck = ctas[next((k for k in live if local(k)), live[0])][0]
            error = stuck._deadlock({ctas[k][1]: gates[k] for k in live if ctas[k][0] is stuck})
            if len(runs) > 1:
                error.args = (f"rank {stuck.m.rank}: {error.args[0]}", *error.args[1:])
            raise error
        k = rng.choice(runnable)
        ctas[k][0].steps += 1
        try:
            gates[k] = next(ctas[k][2])
        except StopIteration:
            live.remove(k)
    for run in runs:
        run.m.check_table_reads(run._where())


def simulate(
    graph: Graph,
    inputs: Mapping[Any, Any] | None = None,
    symbols: Mapping[Any, Any] | None = None,
    schedule: str = "static",
    num_ctas: int = 4,
    seed: int = 0,
    early_push: bool = True,
    stats: dict[str, int] | None = None,
    max_pop_chunk: int = 8,
) -> dict[str, np.ndarray]:
    """Run ``graph`` on the CPU and return every tensor by name.

    ``inputs`` maps tensor names (or Tensors) to arrays, which are copied;
    tensors not given start as zeros. ``symbols`` maps every symbol name (or
    Symbol) to an int >= 0. ``bf16`` tensors hold uint16 bits (floating-point
    inputs are rounded to bf16). ``seed`` picks the dynamic schedule's
    interleaving, ``early_push`` its push mode and ``max_pop_chunk`` its
    queue claims (as the compiler's options);
    the static schedule ignores them. A ``stats`` dict receives
    ``instances``, and for the dynamic schedule ``ready_at_start``,
    ``pushes``, ``steps`` (atomic actions) and ``chunk`` (queue positions per
    claim), also when the run fails.
    Raises ShapeError for bad bindings, GraphError for graph mistakes,
    DeadlockError when the run hangs and LaunchError where the GPU would
    report a queue overflow.
    """
    _check_graph(graph, "simulate")
    _check_options(schedule, num_ctas, early_push, max_pop_chunk, seed)
    if graph.rank is not None:
        raise EtcError(
            f"graph '{graph.name}' spans ranks; run it with etc.simulate_ranks (one input "
            "mapping per rank)"
        )
    graph.validate()
    env = bind_symbols(graph, symbols)
    arrays = _bind_inputs(graph, inputs, env)
    _check_kept_zero(graph, arrays, start=True)
    machine = _Machine(graph, arrays, env)
    if stats is not None:
        stats["instances"] = sum(len(p) for p in machine.points)
    if schedule == "static":
        _run_static([machine], num_ctas)
        machine.check_table_counts()
    else:
        run = _DynamicRun(machine, num_ctas, seed, early_push, max_pop_chunk)
        try:
            run.run()
        finally:
            if stats is not None:
                stats.update(
                    ready_at_start=len(run.initial), pushes=run.tail, steps=run.steps,
                    chunk=run.chunk,
                )  # fmt: skip
    _check_kept_zero(graph, arrays, start=False)
    return arrays


def _check_kept_zero(graph: Graph, arrays: dict[str, np.ndarray], start: bool) -> None:
    """The kept-zero tensors (``Graph.tensor(kept_zero=True)``) are all zeros
    before the run (the caller's promise) and after it (the tiles' own)."""
    for t in graph.tensors:
        a = arrays[t.name]
        if not t.kept_zero or not a.any():
            continue
        first = tuple(int(i) for i in np.argwhere(a)[0])
        n = np.count_nonzero(a)
        where = f"{n} nonzero value{'s' if n > 1 else ''}, the first {a[first].item()!r} at {first}"
        if start:
            raise ShapeError(
                f"tensor '{t.name}' is kept zero (Graph.tensor(kept_zero=True)) but its "
                f"input holds {where}: zero it before the launch"
            )
        raise GraphError(
            f"graph '{graph.name}': the run completed but left kept-zero tensor '{t.name}' "
            f"with {where}: a tile that counts on it does not reset it"
        )


def _check_options(
    schedule: str, num_ctas: int, early_push: bool, max_pop_chunk: int, seed: Any
) -> None:
    if schedule not in ("static", "dynamic"):
        raise EtcError(f"unknown schedule {schedule!r}; expected 'static' or 'dynamic'")
    if not is_int(num_ctas, 1):
        raise EtcError(f"num_ctas must be a positive int, got {num_ctas!r}")
    if not isinstance(early_push, bool):
        raise EtcError(f"early_push must be a bool, got {early_push!r}")
    if not is_int(max_pop_chunk, 1):
        raise EtcError(f"max_pop_chunk must be an int >= 1, got {max_pop_chunk!r}")
    if not is_int(seed, 0):
        raise EtcError(f"seed must be an int >= 0, got {seed!r}")


def simulate_ranks(
    graph: Graph,
    inputs: Sequence[Mapping[Any, Any] | None],
    symbols: Mapping[Any, Any] | None = None,
    schedule: str = "static",
    num_ctas: int = 4,
    seed: int = 0,
    early_push: bool = True,
    max_pop_chunk: int = 8,
) -> list[dict[str, np.ndarray]]:
    """Run a graph that spans ranks (:meth:`Graph.ranks`) on ``len(inputs)``
    simulated GPUs and return every rank's tensors.

    ``inputs[r]`` are rank r's tensors; ``symbols`` bind every symbol but the
    rank and the ranks count, which are bound per rank. Every rank runs
    ``num_ctas`` CTAs of the schedule; the CTAs of all ranks are interleaved
    (round-robin for the static schedule, a seeded RNG for the dynamic one).
    A ranked event's notifications go to the rank its coordinate 0 names,
    and a tile's peer table argument is the list of every rank's buffer.
    Wait counts are checked first against the notifications of all ranks.
    Raises as :func:`simulate`; a deadlock names the rank that is stuck.
    """
    _check_graph(graph, "simulate_ranks")
    _check_options(schedule, num_ctas, early_push, max_pop_chunk, seed)
    if not isinstance(inputs, Sequence) or isinstance(inputs, str):
        raise EtcError(
            f"simulate_ranks: inputs must be a list of each rank's tensors, got "
            f"{type(inputs).__name__}"
        )
    if graph.rank is None or graph.num_ranks is None:
        raise EtcError(
            f"graph '{graph.name}' does not span ranks (build it with graph.ranks()); "
            "run it with etc.simulate"
        )
    n = len(inputs)
    if n < 1:
        raise EtcError("simulate_ranks needs the inputs of at least one rank")
    given: dict[str, Any] = {}
    for key, value in (symbols or {}).items():
        given[key.name if isinstance(key, Symbol) else key] = value
    for sym in (graph.rank, graph.num_ranks):
        if sym.name in given:
            raise ShapeError(
                f"symbol '{sym.name}' is bound per rank by simulate_ranks; do not pass it"
            )
    graph.validate()
    world: list[_Machine] = []
    for r in range(n):
        env = bind_symbols(graph, {**given, graph.rank.name: r, graph.num_ranks.name: n})
        arrays = _bind_inputs(graph, inputs[r], env)
        _check_kept_zero(graph, arrays, start=True)
        world.append(_Machine(graph, arrays, env, r, world))
    _check_rank_fan_in(world)
    if schedule == "static":
        _run_static(world, num_ctas)
    else:
        _run_dynamic([_DynamicRun(m, num_ctas, seed, early_push, max_pop_chunk) for m in world])
    for m in world:
        _check_kept_zero(graph, m.arrays, start=False)
    return [m.arrays for m in world]


def _check_rank_fan_in(world: list[_Machine]) -> None:
    """Every rank's copy of every event with a constant or symbolic wait count
    receives exactly that many notifications from all ranks together."""
    graph = world[0].graph
    if sum(len(p) for m in world for p in m.points) > _MAX_ENUMERATED_RANKS:
        return
    for event in graph.events:
        if isinstance(event.wait_count, Tensor):
            continue
        producers = graph.producers(event)
        if not producers:
            continue
        received = [np.zeros(m.shapes[event.index], dtype=np.int64) for m in world]
        for m in world:
            for task, edge in producers:
                if task.trigger is not None:
                    continue
                n = m.order.index(task)
                for point in m.points[n]:
                    coord = m.coord(task, edge, point, "out")
                    target = coord[0] if event.ranked else m.rank
                    received[target][coord] += 1
        if event.ranked:
            _check_ranked_waiters(world, event, received)
        for m, counts in zip(world, received, strict=True):
            expected = m.counts[event.index](())
            # A rank's copy of a ranked event only holds its own coordinates.
            mine = counts[m.rank] if event.ranked else counts
            bad = np.argwhere(mine != expected)
            if len(bad):
                coord = (m.rank,) * event.ranked + tuple(int(x) for x in bad[0])
                raise GraphError(
                    f"event '{event.name}' on rank {m.rank}: coordinate {coord} receives "
                    f"{int(counts[coord])} notifications from all {len(world)} ranks but its "
                    f"wait count is {expected}"
                )


def _check_ranked_waiters(world: list[_Machine], event: Event, received: list[np.ndarray]) -> None:
    """Every notified coordinate of a ranked event has a waiter on its rank: a
    peer's notification to one nobody waits on could land, on the GPU, after
    that rank finished and reset its counters for the next launch."""
    graph = world[0].graph
    for m, counts in zip(world, received, strict=True):
        waited = np.zeros_like(counts, dtype=bool)
        for task, edge in graph.consumers(event):
            n = m.order.index(task)
            for point in m.points[n]:
                waited[m.coord(task, edge, point, "in")] = True
        lonely = np.argwhere((counts[m.rank] > 0) & ~waited[m.rank])
        if len(lonely):
            coord = (m.rank, *(int(x) for x in lonely[0]))
            raise GraphError(
                f"ranked event '{event.name}' coordinate {coord} is notified but no task of "
                f"rank {m.rank} waits on it; on the GPU a peer's notification could land "
                "after that rank reset its counters for the next launch"
            )

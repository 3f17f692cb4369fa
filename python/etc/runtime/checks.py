"""Graph checks that need the symbols' values, run once per shape at launch.

The compiler proves what it can symbolically; what it cannot (maps whose
fan-in is not uniform, extents that are expressions of several symbols) is
checked here with the concrete shape, before anything reaches the GPU:

* every edge map sends every task instance inside its event;
* every event whose wait count is a constant or a symbol expression receives
  exactly that many notifications at every coordinate (count conservation).
  Counts read from a tensor are data: the watchdog covers them. A ranked
  event's notifications come from every rank (each runs the same graph, its
  maps' ``rank`` bound to its own rank), so they are summed over the ranks.

Both are numpy computations over the event shapes (and, for maps that use a
grid dimension twice, over the instances), cached with the launch plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from etc.errors import LaunchError

from .manifest import Manifest, bind_size

# Maps that repeat a grid dimension are checked instance by instance up to
# this many instances per task; larger ones are left to the watchdog.
_MAX_ENUMERATED = 1 << 24


def _parts(results) -> list[tuple[str, int, int]]:
    """``(kind, value, offset)`` per map result (only shifted dims carry one)."""
    return [(r[0], r[1], r[2] if len(r) > 2 else 0) for r in results]


def _fmt_map(results) -> str:
    def fmt(kind: str, v: int, off: int) -> str:
        if kind == "dim":
            return f"d{v} + {off}" if off else f"d{v}"
        return "rank" if kind == "rank" else str(v)

    return "(" + ", ".join(fmt(*r) for r in _parts(results)) + ")"


def _at_rank(results, rank: int):
    """The map with its rank result replaced by the constant ``rank``."""
    return tuple(("const", rank) if r[0] == "rank" else r for r in results)


def check_bound_graph(manifest: Manifest, symbols: Mapping[str, int]) -> None:
    """Raises LaunchError naming the task, event, map and coordinate at fault."""
    events = manifest.events
    shapes = [manifest.bind(e.shape, symbols) for e in events]
    fan_in = [np.zeros(shape, dtype=np.int64) for shape in shapes]
    # Ranked events: this rank's waits per coordinate.
    awaited = {k: np.zeros(shapes[k], dtype=np.int64) for k, e in enumerate(events) if e.ranked}
    bound = ", ".join(f"{k}={v}" for k, v in symbols.items())
    # Ranks whose instances notify this rank's copy of an event: every rank
    # for a ranked event, this one for the others.
    this_rank, num_ranks = 0, 1
    if manifest.ranks is not None:
        this_rank, num_ranks = symbols[manifest.ranks[0]], symbols[manifest.ranks[1]]
        if not 0 <= this_rank < num_ranks:
            raise LaunchError(
                f"{manifest.graph}: rank {this_rank} is outside 0..{num_ranks - 1} "
                f"({manifest.ranks[1]}={num_ranks})"
            )
    for task in manifest.tasks:
        grid = manifest.bind(task.grid, symbols)
        if 0 in grid:
            continue
        if task.trigger is not None:
            # Maps take (i, c): c ranges over the trigger event. The counts of
            # the events it notifies are tables, so only the reach is checked.
            grid = (*grid, shapes[task.trigger[0]][0])
        for kind, edges in (("in", task.in_edges), ("out", task.out_edges)):
            for event_index, results in edges:
                event, shape = events[event_index], shapes[event_index]
                where = (
                    f"{manifest.graph}: task '{task.name}' {kind}-edge to event "
                    f"'{event.name}' with map {_fmt_map(results)}"
                )
                for k, (rkind, v, off) in enumerate(_parts(results)):
                    reach = (
                        grid[v] + off if rkind == "dim" else num_ranks if rkind == "rank" else v + 1
                    )
                    if reach > shape[k]:
                        coord = [
                            grid[d] - 1 + o if r == "dim" else num_ranks - 1 if r == "rank" else d
                            for r, d, o in _parts(results)
                        ]
                        raise LaunchError(
                            f"{where} reaches coordinate {tuple(coord)} outside the event's "
                            f"shape {shape} (dimension {k}) with {bound}"
                        )
                if kind == "out" and task.trigger is None:
                    ranks = range(num_ranks) if event.ranked else (this_rank,)
                    for rank in ranks:
                        _add_fan_in(fan_in[event_index], grid, _at_rank(results, rank), where)
                elif kind == "in" and event_index in awaited:
                    _add_fan_in(awaited[event_index], grid, _at_rank(results, this_rank), where)
    if not any(t.out_edges or t.in_edges for t in manifest.tasks):
        return  # an artifact without edge data: nothing more to check
    for k, waits in awaited.items():
        # A notification from a peer to a coordinate nobody here waits on
        # could land after this rank finished and reset its counters.
        lonely = np.argwhere((fan_in[k][this_rank] > 0) & (waits[this_rank] == 0))
        if len(lonely):
            coord = (this_rank, *(int(x) for x in lonely[0]))
            raise LaunchError(
                f"{manifest.graph}: ranked event '{events[k].name}' coordinate {coord} is "
                f"notified but no task of rank {this_rank} waits on it (with {bound}); a "
                "peer's notification could then land after this rank reset its counters "
                "for the next launch: every notified coordinate of a ranked event needs "
                "a waiter on its rank"
            )
    for event, counts in zip(events, fan_in, strict=True):
        if event.implicit or isinstance(event.wait_count, dict):
            continue  # correct by construction, or data-dependent (the watchdog's)
        expected = bind_size(event.wait_count, symbols)
        bad = np.argwhere(counts != expected)
        if len(bad):
            coord = tuple(int(x) for x in bad[0])
            raise LaunchError(
                f"{manifest.graph}: event '{event.name}' coordinate {coord} receives "
                f"{int(counts[coord])} notifications but its wait count is {expected} "
                f"(with {bound}); {len(bad)} coordinate(s) disagree"
            )


def _add_fan_in(counts: np.ndarray, grid, results, where: str) -> None:
    """counts[map(p)] += 1 for every grid point p."""
    parts = _parts(results)
    dims = [v for kind, v, _ in parts if kind == "dim"]
    if len(set(dims)) == len(dims):
        # Each event dimension is a distinct grid range or a constant: every
        # coordinate of that box gets the product of the dropped extents.
        index = tuple(slice(off, off + grid[v]) if kind == "dim" else v for kind, v, off in parts)
        dropped = [grid[d] for d in range(len(grid)) if d not in dims]
        counts[index] += int(np.prod(dropped, dtype=np.int64))
        return
    if int(np.prod(grid, dtype=np.int64)) > _MAX_ENUMERATED:
        return
    np.add.at(counts, _coordinates(np.indices(grid).reshape(len(grid), -1), parts), 1)


def _coordinates(points: np.ndarray, parts) -> tuple[np.ndarray, ...]:
    """The event coordinates (one array per event dimension) that the grid
    points (one column each) map to."""
    n = points.shape[1]
    return tuple(points[v] + off if kind == "dim" else np.full(n, v) for kind, v, off in parts)


def check_phase_order(
    manifest: Manifest,
    symbols: Mapping[str, int],
    phases: Sequence[np.ndarray | int] | None = None,
) -> None:
    """With phases, the static order (phase, task number, instance) must put
    every notification of an event coordinate before every wait on it, or a
    CTA could wait on an instance dealt after it: raises LaunchError naming
    the first such pair. Ranked events (a peer's order is its own) and
    triggered tasks (data-dependent instances) are not checked. ``phases``:
    every task's :func:`~etc.runtime.queue.instance_phases` at ``symbols``,
    if the caller has them."""
    from .queue import instance_phases

    if phases is None:
        phases = [instance_phases(t.phase, manifest.bind(t.grid, symbols)) for t in manifest.tasks]
    events = manifest.events
    shapes = [manifest.bind(e.shape, symbols) for e in events]
    tasks = manifest.tasks
    big = np.iinfo(np.int64).max
    latest = [np.full(int(np.prod(s, dtype=np.int64)), -1, np.int64) for s in shapes]
    earliest = [np.full(int(np.prod(s, dtype=np.int64)), big, np.int64) for s in shapes]
    for number, task in enumerate(tasks):
        grid = manifest.bind(task.grid, symbols)
        n = int(np.prod(grid, dtype=np.int64))
        if task.trigger is not None or n == 0 or n > _MAX_ENUMERATED:
            continue
        key = np.broadcast_to(np.asarray(phases[number], np.int64) * len(tasks) + number, (n,))
        points = np.indices(grid).reshape(len(grid), -1)
        for edges, table, reduce in (
            (task.out_edges, latest, np.maximum),
            (task.in_edges, earliest, np.minimum),
        ):
            for event_index, results in edges:
                if events[event_index].ranked:
                    continue
                coords = _coordinates(points, _parts(results))
                flat = (
                    np.ravel_multi_index(coords, shapes[event_index])
                    if coords
                    else np.zeros(n, np.int64)
                )
                reduce.at(table[event_index], flat, key)
    for k, event in enumerate(events):
        bad = np.flatnonzero((earliest[k] < big) & (latest[k] >= earliest[k]))
        if len(bad):
            coord = tuple(int(x) for x in np.unravel_index(bad[0], shapes[k]))

            def who(key: int) -> str:
                task = tasks[key % len(tasks)]
                return f"task '{task.name}' (phase {key // len(tasks)})"

            raise LaunchError(
                f"{manifest.graph}: the static order waits on event '{event.name}' "
                f"coordinate {coord} in {who(int(earliest[k][bad[0]]))} before "
                f"{who(int(latest[k][bad[0]]))} notifies it: give the tasks phases "
                "that follow the dependencies (Graph.task's phase)"
            )

"""CPU reference executor: runs a graph's numpy reference tiles with real
event-counter semantics, in the order a chosen schedule would.

* Counters start at 0. When a task instance finishes (its reference has
  run), each of its out-edge coordinates gets +1. An instance may start only
  when, for every in-edge, the counter at the coordinate it maps to is at
  least the event's wait count there (an int, a symbol expression, or the
  value of the wait-count tensor at that coordinate, read at wait time).
* ``schedule="static"``: the per-CTA queues of :func:`static_queues`, each
  CTA running its queue in order and blocking at its head; CTAs are stepped
  round-robin, one instance per step.
* ``schedule="dynamic"``: a ready pool; an instance becomes ready when all
  its in-edge coordinates are complete, and each step runs a ready instance
  chosen with a seeded RNG.

If work remains and nothing can start, :class:`~etc.errors.DeadlockError`
names the stuck event(s), coordinate(s), waiting task(s), counters and wait
counts.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .dtypes import f32_to_bf16
from .errors import DeadlockError, EtcError, GraphError, ShapeError
from .graph import Event, Graph, Task, Tensor
from .symbolic import Symbol, SymExpr, evaluate

__all__ = ["simulate", "static_queues"]

# How many stuck waits a DeadlockError message lists.
_MAX_REPORTED = 8


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
        env[sym.name] = value
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


def _grid_points(task: Task, env: dict[str, int]) -> list[tuple[int, ...]]:
    extents = _concrete_shape(task.grid, env, f"task '{task.name}': grid")
    # Row-major linear order (last grid dimension fastest).
    return list(itertools.product(*(range(e) for e in extents)))


def static_queues(
    graph: Graph, symbols: Mapping[Any, Any], num_ctas: int
) -> list[list[tuple[int, int]]]:
    """The static schedule's per-CTA queues for concrete ``symbols``.

    Instances are enumerated task by task in :meth:`Graph.topological_tasks`
    order, each task's instances in row-major linear order; global index
    ``g`` goes to CTA ``g % num_ctas``. Entries are ``(task number, linear
    instance index)``, the task number being the position in
    ``topological_tasks()``.
    """
    if isinstance(num_ctas, bool) or not isinstance(num_ctas, int) or num_ctas < 1:
        raise EtcError(f"num_ctas must be a positive int, got {num_ctas!r}")
    env = bind_symbols(graph, symbols)
    queues: list[list[tuple[int, int]]] = [[] for _ in range(num_ctas)]
    g = 0
    for number, task in enumerate(graph.topological_tasks()):
        for linear in range(len(_grid_points(task, env))):
            queues[g % num_ctas].append((number, linear))
            g += 1
    return queues


def _bind_inputs(
    graph: Graph, inputs: Mapping[Any, Any] | None, env: dict[str, int]
) -> dict[str, np.ndarray]:
    given: dict[str, Any] = {}
    for key, value in (inputs or {}).items():
        name = key.name if isinstance(key, Tensor) else key
        given[name] = value
    by_name = {t.name: t for t in graph.tensors}
    for name in given:
        if name not in by_name:
            raise ShapeError(f"graph '{graph.name}' has no tensor '{name}'")
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
    """Counters, arrays and instance bookkeeping shared by both schedules."""

    def __init__(self, graph: Graph, arrays: dict[str, np.ndarray], env: dict[str, int]):
        self.graph = graph
        self.arrays = arrays
        self.order = graph.topological_tasks()
        self.points = [_grid_points(t, env) for t in self.order]
        self.counters: dict[int, np.ndarray] = {}
        self.shapes: dict[int, tuple[int, ...]] = {}
        self.counts: dict[int, Callable[[tuple[int, ...]], int]] = {}
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

    def coord(self, task: Task, edge: Any, point: tuple[int, ...], kind: str) -> tuple[int, ...]:
        coord = edge.map.apply(point)
        shape = self.shapes[edge.event.index]
        if any(not 0 <= c < s for c, s in zip(coord, shape, strict=True)):
            raise GraphError(
                f"task '{task.name}' instance {point}: {kind}-edge map '{edge.map}' "
                f"addresses coordinate {coord} outside event '{edge.event.name}' of "
                f"shape {shape}"
            )
        return coord

    def blocker(self, number: int, linear: int) -> tuple[Any, ...] | None:
        """The first unsatisfied wait of an instance, or None if it may start."""
        task, point = self.order[number], self.points[number][linear]
        for edge in task.in_edges:
            coord = self.coord(task, edge, point, "in")
            counter = int(self.counters[edge.event.index][coord])
            needed = self.counts[edge.event.index](coord)
            if counter < needed:
                return (edge.event.name, coord, task.name, point, counter, needed)
        return None

    def run(self, number: int, linear: int) -> list[tuple[int, tuple[int, ...]]]:
        """Run one instance and notify; returns the notified (event, coordinate)s."""
        task, point = self.order[number], self.points[number][linear]
        buffers = [self.arrays[a.name] for a in task.args]
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
        notified = []
        for edge in task.out_edges:
            coord = self.coord(task, edge, point, "out")
            self.counters[edge.event.index][coord] += 1
            notified.append((edge.event.index, coord))
        return notified

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


def _run_static(machine: _Machine, env: dict[str, int], num_ctas: int) -> None:
    queues = static_queues(machine.graph, env, num_ctas)
    heads = [0] * num_ctas
    remaining = sum(len(q) for q in queues)
    while remaining:
        progressed = False
        for cta, queue in enumerate(queues):
            if heads[cta] == len(queue):
                continue
            number, linear = queue[heads[cta]]
            if machine.blocker(number, linear) is not None:
                continue
            machine.run(number, linear)
            heads[cta] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            stuck = []
            for cta, queue in enumerate(queues):
                if heads[cta] < len(queue):
                    block = machine.blocker(*queue[heads[cta]])
                    assert block is not None
                    stuck.append(block)
            raise machine.deadlock(stuck, remaining, f"static schedule, {num_ctas} CTAs")


def _run_dynamic(machine: _Machine, seed: int) -> None:
    rng = random.Random(seed)
    instances = [(n, i) for n, pts in enumerate(machine.points) for i in range(len(pts))]
    state = {inst: 0 for inst in instances}  # 0 pending, 1 ready, 2 done
    waiters: dict[tuple[int, tuple[int, ...]], list[tuple[int, int]]] = {}
    for number, linear in instances:
        task, point = machine.order[number], machine.points[number][linear]
        for edge in task.in_edges:
            key = (edge.event.index, machine.coord(task, edge, point, "in"))
            waiters.setdefault(key, []).append((number, linear))
    ready: list[tuple[int, int]] = []

    def scan(candidates: list[tuple[int, int]]) -> None:
        for inst in candidates:
            if state[inst] == 0 and machine.blocker(*inst) is None:
                state[inst] = 1
                ready.append(inst)

    scan(instances)
    remaining = len(instances)
    while remaining:
        if not ready:
            # Wait-count tables may have changed since the last check.
            scan([inst for inst in instances if state[inst] == 0])
            if not ready:
                stuck = [
                    b
                    for inst in instances
                    if state[inst] == 0
                    for b in [machine.blocker(*inst)]
                    if b is not None
                ]
                raise machine.deadlock(stuck, remaining, "dynamic schedule")
        k = rng.randrange(len(ready))
        ready[k], ready[-1] = ready[-1], ready[k]
        inst = ready.pop()
        state[inst] = 2
        remaining -= 1
        for key in machine.run(*inst):
            scan(waiters.get(key, []))


def simulate(
    graph: Graph,
    inputs: Mapping[Any, Any] | None = None,
    symbols: Mapping[Any, Any] | None = None,
    schedule: str = "static",
    num_ctas: int = 4,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Run ``graph`` on the CPU and return every tensor by name.

    ``inputs`` maps tensor names (or Tensors) to arrays, which are copied;
    tensors not given start as zeros. ``symbols`` maps every symbol name (or
    Symbol) to an int >= 0. ``bf16`` tensors hold uint16 bits (floating-point
    inputs are rounded to bf16). Raises ShapeError for bad bindings,
    GraphError for graph mistakes and DeadlockError when the run hangs.
    """
    if schedule not in ("static", "dynamic"):
        raise EtcError(f"unknown schedule {schedule!r}; expected 'static' or 'dynamic'")
    if isinstance(num_ctas, bool) or not isinstance(num_ctas, int) or num_ctas < 1:
        raise EtcError(f"num_ctas must be a positive int, got {num_ctas!r}")
    graph.validate()
    env = bind_symbols(graph, symbols)
    arrays = _bind_inputs(graph, inputs, env)
    machine = _Machine(graph, arrays, env)
    if schedule == "static":
        _run_static(machine, env, num_ctas)
    else:
        _run_dynamic(machine, seed)
    return arrays

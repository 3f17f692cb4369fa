"""Static schedule queues: per-CTA lists of task instances, built with numpy.

Layout of the i64 array the kernel reads (``etensor-static-schedule`` ABI):
``queue[0 : grid + 1]`` are absolute offsets into the same array, so CTA ``c`` runs
``queue[queue[c] : queue[c + 1]]`` in order; each entry is ``task << 48 | linear_instance``.

Order (shared with the CPU simulator): instances are enumerated by phase (``Graph.task``'s
``phase``: 0 unless given), then task by task in task-index order (a topological order),
each task's instances in row-major linear order; global position ``p`` goes to CTA
``p % grid``, keeping order within a CTA (a ``deal="pool"`` task's instances of one phase
then become one entry per CTA that drew any: :func:`pool_entries`). When every event coordinate's notifiers come
before its waiters in this order (always true without phases; checked at launch with them:
``etc.runtime.checks.check_phase_order``), every CTA's list is a linear extension of the
instance dependencies, and with all CTAs resident this cannot deadlock: the unfinished
instance at the lowest global position only waits on lower positions (all finished), and
everything before it in its own CTA's list is lower too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

INSTANCE_BITS = 48
INSTANCE_MASK = (1 << INSTANCE_BITS) - 1
MAX_TASKS = 1 << 15  # keeps entries non-negative as i64
# Dynamic schedule: i64 words before the ring (head, tail, retired instances).
QUEUE_HEADER_WORDS = 3


def instance_phases(phase: tuple[str, int], grid: Sequence[int]) -> np.ndarray | int:
    """The phase of every instance of a task over ``grid`` (row-major), or
    the constant phase of all of them."""
    kind, v = phase
    if kind == "const":
        return v
    inner = int(np.prod(grid[v + 1 :], dtype=np.int64))
    return (np.arange(int(np.prod(grid, dtype=np.int64)), dtype=np.int64) // inner) % grid[v]


def global_order(
    counts: Sequence[int], phases: Sequence[np.ndarray | int] | None = None
) -> np.ndarray:
    """Entries ``task << 48 | instance`` for all instances, in global (dealing)
    order: by phase (``phases[task]``, per instance or one int), then task,
    then instance."""
    counts_arr = np.asarray(counts, dtype=np.int64).reshape(-1)
    if len(counts_arr) > MAX_TASKS:
        raise ValueError(f"{len(counts_arr)} tasks exceed the queue's task field ({MAX_TASKS})")
    if (counts_arr < 0).any() or (counts_arr > INSTANCE_MASK).any():
        raise ValueError(f"instance counts {counts_arr.tolist()} must be in 0..2**48-1")
    total = int(counts_arr.sum())
    starts = np.cumsum(counts_arr) - counts_arr
    tasks = np.arange(len(counts_arr), dtype=np.int64)
    # entry(p) = (task << 48) + (p - start(task)), expanded per instance without a loop.
    entries = np.arange(total, dtype=np.int64) + np.repeat(
        (tasks << INSTANCE_BITS) - starts, counts_arr
    )
    if phases is None or not any(np.any(np.asarray(p) != 0) for p in phases):
        return entries
    key = np.concatenate(
        [
            np.broadcast_to(np.asarray(p, dtype=np.int64), (int(n),))
            for p, n in zip(phases, counts_arr, strict=True)
        ]
    )
    # A stable sort keeps task-then-instance order within a phase.
    return entries[np.argsort(key, kind="stable")]


def cta_counts(total: int, grid: int) -> np.ndarray:
    """How many entries each CTA receives when ``total`` positions are dealt round-robin."""
    base, extra = divmod(total, grid)
    out = np.full(grid, base, dtype=np.int64)
    out[:extra] += 1
    return out


def build_static_queue(
    counts: Sequence[int],
    grid: int,
    phases: Sequence[np.ndarray | int] | None = None,
    pooled: Sequence[bool] | None = None,
) -> np.ndarray:
    """The queue array (offset header + entries) for instance ``counts`` per
    task and ``grid`` CTAs (``phases``: see :func:`global_order`; ``pooled``:
    see :func:`pool_entries`)."""
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    entries = global_order(counts, phases)
    if pooled is not None and any(pooled):
        return _queue_of(*pool_entries(entries, grid, phases, pooled), grid)
    total = len(entries)
    base, extra = divmod(total, grid)
    out = np.empty(grid + 1 + total, dtype=np.int64)
    out[0] = grid + 1
    np.cumsum(cta_counts(total, grid), out=out[1 : grid + 1])
    out[1 : grid + 1] += grid + 1
    # Position p = r * grid + c is row r, column c of `full` (plus a partial last row);
    # CTA c's list is column c, so each group of equally long lists is one transpose.
    full = entries[: base * grid].reshape(base, grid)
    body = out[grid + 1 :]
    longer = body[: extra * (base + 1)].reshape(extra, base + 1)  # CTAs < extra: one more entry
    longer[:, :base] = full[:, :extra].T
    longer[:, base] = entries[base * grid :]
    body[extra * (base + 1) :].reshape(grid - extra, base)[...] = full[:, extra:].T
    return out


def pool_entries(
    entries: np.ndarray,
    grid: int,
    phases: Sequence[np.ndarray | int] | None,
    pooled: Sequence[bool],
) -> tuple[np.ndarray, np.ndarray]:
    """Deals the global order round-robin, then replaces the instances of
    each phase of a ``pooled`` task by one entry per CTA that received any,
    where its first one was: ``task << 48 | pool`` (``pool``: the instances'
    grid coordinate along a grid-dimension phase, else 0), which draws the
    phase's instances at run time. Returns the kept entries and their CTAs,
    in global order."""
    total = len(entries)
    pos = np.arange(total, dtype=np.int64)
    task = entries >> INSTANCE_BITS
    inst = entries & INSTANCE_MASK
    is_pool = np.asarray(pooled, dtype=bool)[task]
    pool = np.zeros(total, dtype=np.int64)
    for t in np.flatnonzero(pooled):
        if phases is not None and np.ndim(phases[t]):
            mine = task == t
            pool[mine] = np.asarray(phases[t])[inst[mine]]
    # A phase of a task is contiguous in the global order: a run starts where
    # the (task, pool) pair changes; its first `grid` positions reach every CTA once.
    starts = is_pool.copy()
    starts[1:] &= (task[1:] != task[:-1]) | (pool[1:] != pool[:-1]) | ~is_pool[:-1]
    run_start = np.maximum.accumulate(np.where(starts, pos, 0))
    keep = ~is_pool | (pos - run_start < grid)
    out = np.where(is_pool, (task << INSTANCE_BITS) | pool, entries)
    return out[keep], (pos % grid)[keep]


def _queue_of(entries: np.ndarray, ctas: np.ndarray, grid: int) -> np.ndarray:
    """The queue array of ``entries`` (global order) dealt to ``ctas``."""
    out = np.empty(grid + 1 + len(entries), dtype=np.int64)
    out[0] = grid + 1
    np.cumsum(np.bincount(ctas, minlength=grid), out=out[1 : grid + 1])
    out[1 : grid + 1] += grid + 1
    out[grid + 1 :] = entries[np.argsort(ctas, kind="stable")]
    return out


def decode(queue: np.ndarray) -> list[list[tuple[int, int]]]:
    """Per-CTA ``(task, instance)`` lists of a queue array (for tests and debugging)."""
    grid = int(queue[0]) - 1
    out = []
    for c in range(grid):
        part = queue[int(queue[c]) : int(queue[c + 1])]
        out.append(
            list(
                zip((part >> INSTANCE_BITS).tolist(), (part & INSTANCE_MASK).tolist(), strict=True)
            )
        )
    return out

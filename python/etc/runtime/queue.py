"""Static schedule queues: per-CTA lists of task instances, built with numpy.

Layout of the i64 array the kernel reads (``etensor-static-schedule`` ABI):
``queue[0 : grid + 1]`` are absolute offsets into the same array, so CTA ``c`` runs
``queue[queue[c] : queue[c + 1]]`` in order; each entry is ``task << 48 | linear_instance``.

Order (shared with the CPU simulator): instances are enumerated by phase (``Graph.task``'s
``phase``: 0 unless given), then task by task in task-index order (a topological order),
each task's instances in row-major linear order; global position ``p`` goes to CTA
``p % grid``, keeping order within a CTA (a ``deal="pool"`` task's instances of one phase
then become one entry per CTA that drew any: :func:`pool_entries`; dealt by SM, each
task's remainder goes to CTAs picked by the SMs they ran on instead: :func:`sm_deal`). When every event coordinate's notifiers come
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
    sm_of_cta: Sequence[int] | None = None,
    how: str = "spread",
    meets: Sequence[int] | None = None,
    limits: Sequence[int] | None = None,
    slots: Sequence[int] | None = None,
    clusters: Sequence[int] | None = None,
) -> np.ndarray:
    """The queue array (offset header + entries) for instance ``counts`` per
    task and ``grid`` CTAs (``phases``: see :func:`global_order`; ``pooled``:
    see :func:`pool_entries`; ``sm_of_cta``: the SM each CTA runs on, to deal
    by, :func:`sm_deal`, graphs without pools only; ``meets``: per task, the
    parts that wait for each other (:func:`parts_apart`), which a deal by SM
    that would put two of one block on a CTA gives up for round-robin;
    ``limits``: per task, the CTAs it is dealt over, :func:`limited_ctas`,
    graphs without pools only, which then deal the other tasks
    round-robin, not by SM; ``slots``: per task, the round-robin positions
    each run of its entries takes at least, :func:`slotted_ctas`, graphs
    without pools only, dealt round-robin, not by SM; ``clusters``: per
    task, the size of the thread-block cluster whose CTAs run each group of
    that many consecutive instances, :func:`cluster_ctas`, which moves
    them there after any of the other deals)."""
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    if meets is not None and max(meets, default=0) > grid:
        raise ValueError(
            f"{max(meets)} parts that wait for each other need as many CTAs, got {grid}"
        )
    entries = global_order(counts, phases)
    dealt = _deal(entries, grid, phases, pooled, sm_of_cta, how, meets, limits, slots)
    if clusters is not None and any(clusters):
        entries, ctas = dealt or (entries, np.arange(len(entries), dtype=np.int64) % grid)
        return _queue_of(entries, cluster_ctas(entries, ctas, clusters, grid), grid)
    return _round_robin_queue(entries, grid) if dealt is None else _queue_of(*dealt, grid)


def _deal(
    entries: np.ndarray,
    grid: int,
    phases: Sequence[np.ndarray | int] | None,
    pooled: Sequence[bool] | None,
    sm_of_cta: Sequence[int] | None,
    how: str,
    meets: Sequence[int] | None,
    limits: Sequence[int] | None,
    slots: Sequence[int] | None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The entries (global order) :func:`build_static_queue` keeps and the
    CTA of each, by its deals; None for plain round-robin."""
    limited = limits is not None and any(limits)
    slotted = slots is not None and any(slots)
    if limited or slotted:
        if pooled is not None and any(pooled):
            raise ValueError(
                "a CTA limit or deal slots per task (limits, slots) take no pooled task"
            )
        ctas = slotted_ctas(entries, grid, slots) if slotted else None
        if limited:
            ctas = limited_ctas(entries, grid, limits, ctas)
        assert ctas is not None
        return entries, ctas
    if pooled is not None and any(pooled):
        return pool_entries(entries, grid, phases, pooled)
    if sm_of_cta is not None:
        ctas = sm_deal(entries, grid, sm_of_cta, how)
        if meets is None or parts_apart(entries, ctas, meets, grid):
            return entries, ctas
    return None


def _round_robin_queue(entries: np.ndarray, grid: int) -> np.ndarray:
    """The queue array of the global order dealt round-robin: position ``p``
    to CTA ``p % grid`` (what ``_queue_of`` makes of that deal, without a sort)."""
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


def slotted_ctas(entries: np.ndarray, grid: int, slots: Sequence[int]) -> np.ndarray:
    """The CTA of each entry (global order) when each run of task ``t``'s
    consecutive entries (a phase's) takes at least ``slots[t]`` positions
    of the round-robin deal: a run of ``n < slots[t]`` entries leaves
    ``slots[t] - n`` positions empty, so the tasks after it land on the same
    CTAs whatever ``n`` is (``Graph.task(deal_slots=...)``). Each CTA's
    entries stay in global order (the module's deadlock argument)."""
    if not len(entries):
        return np.zeros(0, dtype=np.int64)
    task = entries >> INSTANCE_BITS
    starts = np.r_[0, np.flatnonzero(np.diff(task)) + 1]
    runs = np.diff(np.r_[starts, len(entries)])
    want = np.asarray(slots, dtype=np.int64)[task[starts]]
    gap = np.maximum(want - runs, 0)  # empty positions after each run
    shift = np.repeat(np.cumsum(gap) - gap, runs)  # the gaps of the runs before
    return (np.arange(len(entries), dtype=np.int64) + shift) % grid


def limited_ctas(
    entries: np.ndarray, grid: int, limits: Sequence[int], ctas: np.ndarray | None = None
) -> np.ndarray:
    """The CTA of each entry (global order): position ``p`` to ``p % grid``
    (or ``ctas``, another deal's), but task ``t`` with ``limits[t] = n > 0``
    round-robin over CTAs ``0 .. min(n, grid) - 1`` by its own entries'
    order. Each CTA's entries stay in global order, so the lists keep the
    module's deadlock argument."""
    if ctas is None:
        ctas = np.arange(len(entries), dtype=np.int64) % grid
    tasks = entries >> INSTANCE_BITS
    for task, n in enumerate(limits):
        if n:
            mine = np.flatnonzero(tasks == task)
            ctas[mine] = np.arange(len(mine), dtype=np.int64) % min(int(n), grid)
    return ctas


def cluster_ctas(
    entries: np.ndarray, ctas: np.ndarray, clusters: Sequence[int], grid: int
) -> np.ndarray:
    """The CTA of each entry (global order) once every group of
    ``clusters[t] = C > 1`` consecutive instances of task ``t`` (instances
    ``g*C .. g*C + C - 1``, a block's split-K parts) runs on the CTAs of one
    thread-block cluster, instance ``g*C + r`` on its CTA of rank ``r``: the
    cluster of the CTA the group's first instance was dealt to (CTAs
    ``c - c % C .. c - c % C + C - 1``; a launch's clusters tile its grid).
    Every list stays in global order, and a group's instances are adjacent
    in it, so its CTAs reach the group in the same order of their other
    cluster groups: the first unfinished group has every instance at the
    head of its list, and the module's deadlock argument holds for
    instances that wait for their cluster's other CTAs (cluster barriers)."""
    sizes = np.asarray(clusters, dtype=np.int64)
    if len(sizes) and sizes.max() > 1 and grid % int(sizes.max()):
        raise ValueError(f"a grid of {grid} CTAs is not whole clusters of {int(sizes.max())}")
    ctas = np.array(ctas, dtype=np.int64)
    task = entries >> INSTANCE_BITS
    for t in np.flatnonzero(sizes > 1):
        size = int(sizes[t])
        mine = np.flatnonzero(task == t)
        if len(mine) % size:
            raise ValueError(f"task {t}: {len(mine)} instances are not whole groups of {size}")
        rank = (entries[mine] & INSTANCE_MASK) % size
        first = mine[rank == 0]
        # A group's instances must be adjacent in the global order, first to last.
        if (np.diff(mine.reshape(-1, size), axis=1) != 1).any() or (
            rank.reshape(-1, size) != np.arange(size)
        ).any():
            raise ValueError(
                f"task {t}: the groups of {size} instances of one cluster are not "
                "consecutive in the global order (a phase splits them)"
            )
        leader = ctas[first] - ctas[first] % size
        ctas[mine] = np.repeat(leader, size) + np.tile(np.arange(size, dtype=np.int64), len(first))
    return ctas


def parts_apart(entries: np.ndarray, ctas: np.ndarray, meets: Sequence[int], grid: int) -> bool:
    """Whether every block of a task with ``meets[task]`` parts (instances
    ``b * meets .. b * meets + meets - 1``, consecutive in the global order)
    has its parts on different CTAs. With each list in global order that
    keeps parts that wait for each other from deadlocking: the first
    unfinished block's parts are all at the heads of their lists.
    Round-robin over ``grid >= meets`` CTAs always does."""
    task = entries >> INSTANCE_BITS
    for t in np.flatnonzero(np.asarray(meets)):
        mine = task == t
        key = (entries[mine] & INSTANCE_MASK) // meets[t] * grid + ctas[mine]
        if len(np.unique(key)) != int(mine.sum()):
            return False
    return True


def placement_of(sm_words: np.ndarray, sms: int) -> np.ndarray | None:
    """The SM of each CTA, from the words a static kernel writes at its exit
    (``convert-etensor-to-gpu``), when they place the same number of CTAs on
    each of SMs ``0..sms-1``; None otherwise (an artifact that does not
    record them, another device)."""
    sm = np.asarray(sm_words, dtype=np.int64).reshape(-1)
    if sms < 1 or len(sm) % sms or (sm < 0).any() or (sm >= sms).any():
        return None
    if (np.bincount(sm, minlength=sms) != len(sm) // sms).any():
        return None
    return sm


#: How :func:`sm_deal` places a task's instances that do not fill a round of
#: every CTA: ``"pairs"`` fills whole SMs (no CTA runs the task beside an idle
#: one, unless the count is odd); ``"spread"`` puts at most one on an SM while
#: the SMs last, then pairs.
SM_DEALS = ("pairs", "spread")


def sm_deal(
    entries: np.ndarray, grid: int, sm_of_cta: Sequence[int], how: str = "spread"
) -> np.ndarray:
    """The CTA of every entry (global order), chosen by the SM each CTA runs
    on (``sm_of_cta[c]``) instead of round-robin over CTA indices.

    Each run of one task's consecutive entries deals whole rounds (one entry
    to every CTA) first; its remainder goes to CTAs picked per ``how``
    (:data:`SM_DEALS`), starting at an SM cursor that moves on from run to
    run (so the SMs left idle change), and on an SM to its CTA with the
    fewest entries so far. Any assignment keeps every CTA's list in global
    order, so the deadlock argument of the module docstring holds as for
    round-robin."""
    if how not in SM_DEALS:
        raise ValueError(f"sm_deal: how must be one of {SM_DEALS}, got {how!r}")
    sm = np.asarray(sm_of_cta, dtype=np.int64).reshape(-1)
    if len(sm) != grid:
        raise ValueError(f"sm_deal: {len(sm)} SM ids for a grid of {grid} CTAs")
    sms, inverse = np.unique(sm, return_inverse=True)
    ctas_on = [np.flatnonzero(inverse == i) for i in range(len(sms))]
    n_sm = len(sms)
    load = np.zeros(grid, dtype=np.int64)
    out = np.empty(len(entries), dtype=np.int64)
    task = entries >> INSTANCE_BITS
    bounds = np.flatnonzero(np.diff(task)) + 1
    cursor = 0
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(entries)], strict=True):
        n = int(hi - lo)
        rounds, rest = divmod(n, grid)
        chosen: list[int] = []
        if rest:
            order = [(cursor + i) % n_sm for i in range(n_sm)]
            if how == "spread" and rest <= n_sm:
                for s in order[:rest]:
                    on = ctas_on[s]
                    chosen.append(int(on[np.argmin(load[on])]))
                cursor = (cursor + rest) % n_sm
            else:
                used = 0
                for s in order:
                    if len(chosen) == rest:
                        break
                    on = ctas_on[s][np.argsort(load[ctas_on[s]], kind="stable")]
                    chosen.extend(int(c) for c in on[: rest - len(chosen)])
                    used += 1
                cursor = (cursor + used) % n_sm
        # Whole rounds over every CTA, then the remainder; within the run the
        # positions keep their order, each CTA's share in global order.
        ctas = np.concatenate(
            [np.tile(np.arange(grid, dtype=np.int64), rounds), np.asarray(chosen, dtype=np.int64)]
        )
        out[lo:hi] = ctas
        load += np.bincount(ctas, minlength=grid)
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

"""`Kernel`: one loaded megakernel artifact, launched cooperatively on real tensors."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from etc.errors import DeadlockError, LaunchError, TriggerRangeError, WaitCountError
from etc.runtime import driver
from etc.runtime.args import (
    NUMPY,
    TORCH,
    BoundTensor,
    FastBinder,
    bind_symbols,
    bind_tensors,
    bound_shapes,
    check_mapping,
)
from etc.runtime.checks import check_bound_graph, check_phase_order
from etc.runtime.manifest import DTYPE_SIZES, Manifest, bind_size, load_manifest, numel
from etc.runtime.params import ParamPack
from etc.runtime.queue import (
    INSTANCE_MASK,
    QUEUE_HEADER_WORDS,
    SM_DEALS,
    build_static_queue,
    instance_phases,
    placement_of,
)
from etc.runtime.tensormap import TensorMaps
from etc.runtime.trace import RECORD_WORDS as TRACE_RECORD_WORDS
from etc.runtime.trace import Trace

if TYPE_CHECKING:
    from etc.runtime.buckets import BucketedKernel

# Status record words (see ETensorToGPU.cpp).
ST_STATE, ST_EVENT, ST_TASK, ST_COUNTER, ST_WAIT, ST_INSTANCE, ST_CTA, ST_COORD = range(8)
STATE_OK, STATE_WATCHDOG, STATE_BAD_TASK, STATE_QUEUE_OVERFLOW = 0, 1, 2, 3
# A trigger range outside the task's grid (the coordinate, indptr[c] and
# indptr[c+1] in the event, counter and wait-count words).
STATE_BAD_TRIGGER = 4
# A table-counted event's coordinate notified more times than its count (the
# event, the coordinate, the notifications and the count).
STATE_COUNT_EXCEEDED = 5
_cu = driver.cu
_INT = {int}
_SUCCESS = _cu.CUresult.CUDA_SUCCESS if _cu is not None else None
# What a driver that cannot launch clusters cooperatively answers.
_COOPERATIVE_REFUSED = (
    (_cu.CUresult.CUDA_ERROR_INVALID_VALUE, _cu.CUresult.CUDA_ERROR_NOT_SUPPORTED)
    if _cu is not None
    else ()
)
# A launch from a thread whose current context is missing, or another device's
# (multi-GPU processes): make the kernel's context current and launch again.
_WRONG_CONTEXT = (
    (_cu.CUresult.CUDA_ERROR_INVALID_CONTEXT, _cu.CUresult.CUDA_ERROR_INVALID_HANDLE)
    if _cu is not None
    else ()
)
# Status words are i32: larger event tensors could not be reported.
MAX_COUNTERS = (1 << 31) - 1
#: Launch plans kept per kernel. A *shape* (tensor shapes, task grids, event
#: shapes and wait counts) owns the GPU copy of the static queues; symbol
#: values with the same shape (a decode step's context L within one
#: attention chunk) share it and only get their own parameter block.
MAX_SHAPES = 64
MAX_PLANS = 4096


def delinearize(linear: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Row-major coordinates of `linear` in `shape`; None when out of range."""
    if not 0 <= linear < numel(shape):
        return None
    coords = []
    for extent in reversed(shape):
        linear, r = divmod(linear, extent)
        coords.append(r)
    return tuple(reversed(coords))


def total_instances(manifest: Manifest, symbols: Mapping[str, int]) -> list[int]:
    """Instances per task, in task-index order."""
    return [numel(manifest.bind(t.grid, symbols)) for t in manifest.tasks]


def status_error(
    manifest: Manifest, symbols: Mapping[str, int], words: np.ndarray, max_polls: int
) -> Exception | None:
    """The exception a status record stands for (None when the launch succeeded)."""
    state = int(words[ST_STATE])
    if state == STATE_OK:
        return None
    task_id = int(words[ST_TASK])
    task = manifest.tasks[task_id] if 0 <= task_id < len(manifest.tasks) else None
    if state == STATE_BAD_TASK:
        return LaunchError(
            f"{manifest.graph}: the kernel found a bad task descriptor (task index "
            f"{task_id}) in its queue; the queue or the artifact is corrupt"
        )
    if state == STATE_QUEUE_OVERFLOW:
        return LaunchError(
            f"{manifest.graph}: a push of task {task.name if task else task_id!r} instance "
            f"{int(words[ST_INSTANCE])} found the ready queue full (slot {int(words[ST_COUNTER])} "
            f"of {int(words[ST_WAIT])}): an instance was pushed twice, which happens when a "
            "wait-count table changes while the kernel runs"
        )
    if state == STATE_BAD_TRIGGER and task is not None and task.trigger is not None:
        (bound,) = manifest.bind(task.grid, symbols)
        instance = int(words[ST_INSTANCE])
        return TriggerRangeError(
            task.name,
            task.trigger[1],
            int(words[ST_COORD]),
            int(words[ST_COUNTER]),
            int(words[ST_WAIT]),
            bound,
            instance if instance >= 0 else None,
            graph=manifest.graph,
        )
    if state == STATE_COUNT_EXCEEDED:
        event_id = int(words[ST_EVENT])
        if 0 <= event_id < len(manifest.events):
            event = manifest.events[event_id]
            linear = int(words[ST_COORD]) & 0xFFFFFFFF
            coordinate = delinearize(linear, manifest.bind(event.shape, symbols))
            table = event.wait_count.get("table") if isinstance(event.wait_count, dict) else None
            return WaitCountError(
                event.name,
                coordinate if coordinate is not None else (linear,),
                str(table),
                int(words[ST_COUNTER]),
                int(words[ST_WAIT]),
                graph=manifest.graph,
            )
    if state == STATE_WATCHDOG and int(words[ST_EVENT]) == -1:
        # Dynamic schedule: a CTA claimed a queue position nobody ever filled.
        message = (
            f"{manifest.graph}: no task became ready for ready-queue position "
            f"{int(words[ST_COUNTER])} of {int(words[ST_WAIT])} [watchdog expired after "
            f"{max_polls} polls on CTA {int(words[ST_CTA])}]; some instance's dependencies "
            "never completed (a wait count above its event's notifications?)"
        )
        return DeadlockError(message, counter=int(words[ST_COUNTER]))
    if state == STATE_WATCHDOG and int(words[ST_EVENT]) == -2:
        # Ranked graphs: the rank barrier at the start of the launch.
        message = (
            f"{manifest.graph}: not every rank started this launch: the rank barrier saw "
            f"{int(words[ST_COUNTER])} of the {int(words[ST_WAIT])} arrivals it needs "
            f"[watchdog expired after {max_polls} polls on CTA {int(words[ST_CTA])}]; "
            "launch every rank of the group (etc.runtime.RankGroup.launch does)"
        )
        return DeadlockError(message, counter=int(words[ST_COUNTER]))
    if state != STATE_WATCHDOG:
        return LaunchError(
            f"{manifest.graph}: the kernel reported unknown status state {state} "
            f"(status words {[int(w) for w in words]})"
        )
    event_id = int(words[ST_EVENT])
    event = manifest.events[event_id] if 0 <= event_id < len(manifest.events) else None
    # Status words are i32; the kernel truncates linear indices to 32 bits.
    coord_linear = int(words[ST_COORD]) & 0xFFFFFFFF
    coordinate = delinearize(coord_linear, manifest.bind(event.shape, symbols)) if event else None
    instance_linear = int(words[ST_INSTANCE]) & 0xFFFFFFFF
    instance = delinearize(instance_linear, manifest.bind(task.grid, symbols)) if task else None
    counter, wait_count = int(words[ST_COUNTER]), int(words[ST_WAIT])
    attrs: dict[str, Any] = dict(
        event=event.name if event else f"#{event_id}",
        coordinate=coordinate if coordinate is not None else (coord_linear,),
        task=task.name if task else f"#{task_id}",
        instance=instance if instance is not None else (instance_linear,),
        counter=counter,
        wait_count=wait_count,
    )
    hint = (
        "; its producers notified fewer times than the wait count (check the wait count "
        "and the out_edges maps)"
        if counter < wait_count
        else ""
    )
    bound = ", ".join(f"{k}={v}" for k, v in symbols.items())
    message = (
        f"{manifest.graph}: {DeadlockError(**attrs).describe()}{hint} [watchdog expired "
        f"after {max_polls} polls on CTA {int(words[ST_CTA])}{'; ' + bound if bound else ''}]"
    )
    return DeadlockError(message, **attrs)


@dataclass
class _Plan:
    """Everything that depends only on the concrete symbols (and grid): built once, cached."""

    symbols: dict[str, int]
    shapes: dict[str, tuple[int, ...]]
    grid: int
    queue: np.ndarray | None  # static schedule: the per-CTA queues
    queue_buffer: driver.DeviceBuffer | None
    counters: int  # words of the events' counters, the words after them not included
    #: Dynamic schedule: i64 words of the ready queue (head, tail, ring).
    queue_words: int
    #: i32 words of the per-stream scratch buffer (status, counters, queue).
    scratch_words: int
    pack: ParamPack
    dynamic_slots: np.ndarray
    #: The same slots as Python ints, for the per-launch writes.
    dynamic_slot_list: list[int] = field(default_factory=list)
    #: Traced artifacts: the record buffer (u64 words, see etc.runtime.trace).
    trace_buffer: driver.DeviceBuffer | None = None
    last_dynamic: tuple | None = None
    fast: FastBinder | None = None
    #: The shape key (see MAX_SHAPES) whose buffers this plan uses.
    shape_key: tuple = ()
    #: Static schedule: what the queue was dealt from (instance counts, grid,
    #: phases, pooled tasks), to deal it again by SM (`Kernel.deal_by_sm`).
    deal_inputs: tuple | None = None
    #: Clustered kernels: the ``CUlaunchConfig`` of this plan's grid and
    #: whether it is cooperative (built at the first launch).
    cluster_config: tuple[Any, bool] | None = None

    def with_symbols(self, values: dict[str, int]) -> _Plan:
        """This plan for other symbol values of the same shape: a new
        parameter block, the same queues and buffers."""
        pack = ParamPack(self.pack.params)
        pack.values[:] = self.pack.values
        for name, v in values.items():
            pack.set_symbol(name, v)
        return replace(self, symbols=dict(values), pack=pack, last_dynamic=None, fast=None)

    def release(self) -> None:
        for buf in (self.queue_buffer, self.trace_buffer):
            if buf is not None:
                buf.release()


class Kernel:
    """A loaded artifact. Build with `load`; launch with `launch`."""

    #: CTAs a thread-block cluster of every launch (1: no clusters,
    #: ``Manifest.cluster``); grids are then whole clusters.
    cluster = 1
    #: Clustered launches go through cuLaunchKernelEx, cooperative unless
    #: the driver refused a cooperative cluster launch once (then plain:
    #: the grid stays within the co-resident clusters).
    _cluster_cooperative = True

    def __init__(
        self,
        manifest: Manifest,
        device: driver.Device,
        function: Any,
        image: str,
        max_polls: int | None = None,
        timeout: float | None = None,
    ):
        self.manifest = manifest
        self.device = device
        self.function = function
        #: ``"cubin"`` or ``"ptx"``: which image the driver accepted.
        self.image = image
        #: Watchdog bound (polls per wait) used when `launch` is not given one.
        self.max_polls = manifest.watchdog_polls if max_polls is None else _check_polls(max_polls)
        #: Seconds a synchronising `launch` or `check` waits before it raises
        #: `LaunchTimeoutError` (None: as long as the kernel runs).
        self.timeout = _check_timeout(timeout)
        #: CTAs that can be co-resident: SMs x occupancy at the manifest's block size.
        smem = manifest.dynamic_shared_memory
        if smem:
            driver.allow_dynamic_shared_memory(function, smem)
        self.cluster = cluster = manifest.cluster
        if cluster > 1:
            clusters = driver.max_active_clusters(function, cluster, manifest.block_size, smem)
            self.num_ctas = clusters * cluster
        else:
            self.num_ctas = driver.max_active_ctas(device, function, manifest.block_size, smem)
        if self.num_ctas < 1:
            raise LaunchError(
                f"{manifest.graph}: the kernel cannot run a single "
                + (f"cluster of {cluster} CTAs" if cluster > 1 else "CTA")
                + f" of {manifest.block_size} threads on {device.name} (registers/shared memory)"
            )
        self._param_tensors = [p.name for p in manifest.params if p.kind == "tensor"]
        self._symbol_names = manifest.symbols
        self._plans: dict[tuple, _Plan] = {}
        self._shapes: dict[tuple, _Plan] = {}  # by shape key, oldest first
        self._scratch: dict[
            int, driver.DeviceBuffer
        ] = {}  # per stream: status words, then counters
        self._staging: dict[str, driver.DeviceBuffer] = {}  # device copies of numpy arrays
        self._maps = TensorMaps(manifest)  # TMA maps, encoded at launch
        self._input_names = [t.name for t in manifest.inputs]
        # Pinned, so a sync launch can queue the status read-back before synchronising.
        self._status_host = driver.HostBuffer(4 * manifest.status_words)
        self._status = self._status_host.view(np.int32)
        #: The latest launch: stream, scratch, plan, polls, tensor pointers and
        #: bound tensors (numpy arrays), for `check` and a failure's clean-up.
        self._last: tuple[int, driver.DeviceBuffer, _Plan, int, list[int], list] | None = None
        #: The inputs a failed launch must zero again (Graph.tensor(kept_zero=True)).
        self._kept_zero = [(i, t) for i, t in enumerate(manifest.inputs) if t.kept_zero]
        #: Ranked kernels: every rank's counters address, set by `RankGroup`
        #: with the per-stream scratch buffers it allocated (never regrown:
        #: peers address them).
        self._peers: driver.DeviceBuffer | None = None
        self._num_ranks = 0
        #: Static schedule: how full-grid queues deal by SM (None: round-robin;
        #: `deal_by_sm`; the artifact's ``sm_deal`` by default), and the SM each
        #: CTA runs on, given or recorded by the kernel. Kernels compiled with
        #: ``sm_slices`` take their lists by SM themselves.
        self._sm_deal = manifest.sm_deal or ("spread" if manifest.sm_slices else None)
        self._sm_of_cta: np.ndarray | None = None

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"<etc.runtime.Kernel {m.graph!r} ({m.schedule}, {self.image}) on cuda:{self.device.ordinal} "
            f"{self.device.name}, up to {self.num_ctas} CTAs x {m.block_size} threads>"
        )

    # -- planning -------------------------------------------------------------------------

    def grid_size(self, symbols: Mapping[str, int]) -> int:
        """CTAs a launch with these symbols uses: min(instances, `num_ctas`), at least 1."""
        values = dict(zip(self.manifest.symbols, bind_symbols(self.manifest, symbols), strict=True))
        return self._whole_clusters(sum(total_instances(self.manifest, values)))

    def _whole_clusters(self, instances: int) -> int:
        """min(instances, `num_ctas`), at least 1, rounded up to whole clusters."""
        c = self.cluster
        return min(-(-max(1, min(instances, self.num_ctas)) // c) * c, self.num_ctas)

    def _plan(self, symbols: Mapping[str, Any], grid: int | None) -> _Plan:
        m = self.manifest
        key = bind_symbols(m, symbols)
        plan = self._plans.get((key, grid))
        if plan is not None:
            return plan
        self._ensure_context()  # a new thread may have no current context yet
        values = dict(zip(m.symbols, key, strict=True))
        shapes = bound_shapes(m, values)
        counts = total_instances(m, values)
        for t, n in zip(m.tasks, counts, strict=True):
            if n > INSTANCE_MASK:
                raise LaunchError(
                    f"{m.graph}: task {t.name!r} has {n} instances; the queue holds < 2**48"
                )
        counters = sum(numel(m.bind(e.shape, values)) for e in m.events)
        if counters > MAX_COUNTERS:
            raise LaunchError(
                f"{m.graph}: {counters} event counters exceed the 2**31 the status record can name"
            )
        shape_key = self._shape_key(values, shapes, grid)
        same_shape = self._shapes.get(shape_key)
        if same_shape is not None:
            plan = same_shape.with_symbols(values)
            return self._remember(key, grid, plan)
        check_bound_graph(m, values)
        actual = self._whole_clusters(sum(counts))
        if grid is not None:
            if not 1 <= grid <= self.num_ctas:
                raise LaunchError(
                    f"{m.graph}: grid {grid} is outside 1..{self.num_ctas} (co-resident CTAs)"
                )
            if grid % self.cluster:
                raise LaunchError(
                    f"{m.graph}: grid {grid} is not whole thread-block clusters of "
                    f"{self.cluster} CTAs (its clustered tasks)"
                )
            actual = grid
        if m.ranked and self._peers is None:
            raise LaunchError(
                f"{m.graph}: the graph spans ranks; launch it through "
                "etc.runtime.RankGroup, which connects the ranks' kernels"
            )
        pack = ParamPack(m.params)
        keys = [("tensor", n) for n in self._param_tensors] + [("status", None), ("counters", None)]
        if m.schedule == "static":
            phases = None
            if any(t.phase != ("const", 0) for t in m.tasks):
                phases = [instance_phases(t.phase, m.bind(t.grid, values)) for t in m.tasks]
                check_phase_order(m, values, phases)
            deal_inputs = (counts, actual, phases, [t.pooled for t in m.tasks])
            queue = self._static_queue(*deal_inputs)
            qbuf = driver.DeviceBuffer(queue.nbytes)
            driver.htod(qbuf.ptr, queue.ctypes.data, queue.nbytes)
            pack.set_memref("queue", None, qbuf.ptr, (len(queue),))
            queue_words = 0
            # sm_slices: each SM's CTA count, after the done counter.
            sm_words = self.device.sm_count if m.sm_slices else 0
        else:
            # Head, tail, retired (a trigger's unused bound), then a ring slot
            # per instance that is pushed (the ready-at-start ones are popped
            # without one). It lives in the per-stream scratch buffer, like
            # the counters.
            queue, qbuf, sm_words, deal_inputs = None, None, 0, None
            at_start = sum(n for t, n in zip(m.tasks, counts, strict=True) if t.ready_at_start)
            queue_words = QUEUE_HEADER_WORDS + sum(counts) - at_start
            pack.set_memref("queue", None, 0, (queue_words,))
            keys.append(("queue", None))
        for name, v in values.items():
            pack.set_symbol(name, v)
        for name, shape in shapes.items():
            pack.set_memref("tensor", name, 0, shape)
        pack.set_memref("status", None, 0, (m.status_words,))
        # One more word after the events: the kernel's "CTAs done" counter.
        pack.set_memref("counters", None, 0, (counter_words(m, counters) + sm_words,))
        if m.ranked:
            assert self._peers is not None
            pack.set_memref("peers", None, self._peers.ptr, (self._num_ranks,))
        slots = np.append(pack.pointer_slots(keys), pack.slot("max_polls"))
        trace_buffer = None
        if m.traced:
            words64 = 1 + TRACE_RECORD_WORDS * sum(counts)
            trace_buffer = driver.DeviceBuffer(8 * words64)
            pack.set_memref("trace", None, trace_buffer.ptr, (words64,))
        scratch_words = _queue_offset(m, counters) + 2 * queue_words + sm_words
        plan = _Plan(
            values,
            shapes,
            actual,
            queue,
            qbuf,
            counters,
            queue_words,
            scratch_words,
            pack,
            slots,
            [int(slot) for slot in slots],
            trace_buffer,
        )
        plan.shape_key = shape_key
        plan.deal_inputs = deal_inputs
        if len(self._shapes) >= MAX_SHAPES:
            self._forget_shape(next(iter(self._shapes)))
        self._shapes[shape_key] = plan
        return self._remember(key, grid, plan)

    def _static_queue(
        self, counts: list[int], grid: int, phases: list | None, pooled: list[bool]
    ) -> np.ndarray:
        """The static queue array: the lists, dealt by SM where the kernel
        allows and the SMs are known (`deal_by_sm`), then the by-SM word
        (``sm_slices``) or a word per CTA for the SM it records (``sm_deal``)."""
        m = self.manifest
        by_sm, word = None, 0
        if self._sm_deal is not None and grid == self.num_ctas and not any(pooled):
            sms = self.device.sm_count
            if m.sm_slices and grid % sms == 0 and grid // sms <= 255:
                # List k * sms + s runs on SM s (the kernel's staticSlice).
                by_sm, word = np.arange(grid, dtype=np.int64) % sms, sms << 8 | grid // sms
            elif self._sm_of_cta is not None:
                by_sm = self._sm_of_cta
        meets = [t.meets for t in m.tasks]
        if max(meets, default=0) > grid:
            task = m.tasks[meets.index(max(meets))]
            raise LaunchError(
                f"{m.graph}: task '{task.name}' has {task.meets} split-K parts that wait for "
                f"each other, which need as many co-resident CTAs; this launch has {grid}"
            )
        limits = [t.ctas for t in m.tasks]
        slots = [t.deal_slots for t in m.tasks]
        clusters = [t.cluster for t in m.tasks]
        queue = build_static_queue(
            counts, grid, phases, pooled, by_sm, self._sm_deal or "spread", meets, limits, slots,
            clusters,
        )  # fmt: skip
        if m.sm_slices:
            return np.append(queue, np.int64(word))
        if m.sm_deal is not None:
            return np.append(queue, np.zeros(grid, dtype=np.int64))
        return queue

    def deal_by_sm(
        self, how: str | None = "spread", placement: Sequence[int] | None = None
    ) -> None:
        """Static schedule: deal full-grid queues by SM (``how``, one of
        ``etc.runtime.queue.SM_DEALS``: :func:`etc.runtime.queue.sm_deal`;
        ``"spread"`` by default), or round-robin over CTA indices (None).
        Where each CTA runs: ``placement[c]`` if given, else what a kernel
        compiled with ``sm_deal`` recorded at the exit of the first
        synchronised full-grid launch (a ``sync=True`` launch or `check`),
        after which the cached queues are dealt again; a kernel compiled with
        ``sm_slices`` instead takes the list of its SM as each CTA starts.
        The hardware may place a later launch's CTAs elsewhere: that costs
        speed, never correctness. Drops the cached plans (their queues)."""
        m = self.manifest
        if how is not None and how not in SM_DEALS:
            raise LaunchError(f"{m.graph}: deal_by_sm how={how!r}, not one of {SM_DEALS} or None")
        if placement is not None:
            if m.sm_slices:
                raise LaunchError(
                    f"{m.graph}: compiled with sm_slices, its CTAs take their lists by the SM "
                    "they run on; give deal_by_sm no placement"
                )
            given = np.asarray(placement)
            sms = self.device.sm_count
            if (
                not np.issubdtype(given.dtype, np.integer)
                or given.size
                and not (0 <= given.min() and given.max() < sms)
            ):
                raise LaunchError(
                    f"{m.graph}: deal_by_sm placement must hold SM ids in 0..{sms - 1}, "
                    f"got {placement!r:.80}"
                )
            placement = given.astype(np.int64).reshape(-1)
            if len(placement) != self.num_ctas:
                raise LaunchError(
                    f"{m.graph}: deal_by_sm got {len(placement)} SM ids for "
                    f"{self.num_ctas} co-resident CTAs"
                )
        elif how is not None and not m.sm_slices and m.sm_deal is None:
            raise LaunchError(
                f"{m.graph}: compiled without sm_deal, its CTAs record no SM; give "
                "deal_by_sm the placement (the SM of each CTA)"
            )
        for key in list(self._shapes):
            self._forget_shape(key)
        self._sm_deal, self._sm_of_cta = how, placement

    def _learn_placement(self, plan: _Plan) -> None:
        """After a synchronised full-grid launch: the SM each CTA ran on (the
        queue's last words, which the kernel wrote at its exit), once; the
        cached queues are then dealt again by it, in their buffers."""
        m = self.manifest
        if (
            m.sm_slices
            or m.sm_deal is None  # compiled without the records
            or plan.deal_inputs is None
            or self._sm_deal is None
            or self._sm_of_cta is not None
            or plan.grid != self.num_ctas
        ):
            return
        words = np.empty(plan.grid, dtype=np.int64)
        assert plan.queue is not None and plan.queue_buffer is not None
        driver.dtoh(
            words.ctypes.data,
            plan.queue_buffer.ptr + 8 * (len(plan.queue) - plan.grid),
            words.nbytes,
        )
        placement = placement_of(words, self.device.sm_count)
        if placement is None:
            return
        self._sm_of_cta = placement
        for handle in list(self._scratch):  # launches still queued read the queues
            driver.synchronize(handle)
        for shape in self._shapes.values():
            if shape.deal_inputs is None or shape.grid != self.num_ctas:
                continue  # dynamic, or a partial grid: round-robin
            lists = len(shape.queue) - shape.grid  # the SM records after them stay
            shape.queue[:lists] = self._static_queue(*shape.deal_inputs)[:lists]
            driver.htod(shape.queue_buffer.ptr, shape.queue.ctypes.data, 8 * lists)

    def _shape_key(self, values: dict[str, int], shapes: dict, grid: int | None) -> tuple:
        """Everything a plan's queues, buffers and checks depend on, except
        the symbol values themselves (which only fill parameter words)."""
        m = self.manifest
        return (
            grid,
            tuple(shapes.values()),
            tuple(m.bind(t.grid, values) for t in m.tasks),
            tuple(m.bind(e.shape, values) for e in m.events),
            tuple(
                None if isinstance(e.wait_count, dict) else bind_size(e.wait_count, values)
                for e in m.events
            ),
            tuple(values[s] for s in m.ranks) if m.ranks else (),
        )

    def _remember(self, key: tuple, grid: int | None, plan: _Plan) -> _Plan:
        if len(self._plans) >= MAX_PLANS:
            del self._plans[next(iter(self._plans))]  # the oldest
        self._plans[(key, grid)] = plan
        return plan

    def _forget_shape(self, shape_key: tuple) -> None:
        """Drops the oldest shape: waits for the launches that may still read
        its queues, frees them, and drops the plans that use them."""
        for handle in list(self._scratch):
            driver.synchronize(handle)
        self._shapes.pop(shape_key).release()
        for k in [k for k, p in self._plans.items() if p.shape_key == shape_key]:
            del self._plans[k]

    def _grow_scratch(self, stream: int, words: int) -> driver.DeviceBuffer:
        """The stream's status + counters buffer, (re)allocated to hold `words` words.

        Zeroed once here: afterwards the kernel leaves every counter at zero when it exits
        (its last CTA resets them) and writes the status only on failure, so launches need
        no host-side reset."""
        self._ensure_context()
        buf = self._scratch.get(stream)
        if buf is not None:
            driver.synchronize(stream)  # an earlier launch may still use it
            buf.release()
        buf = self._scratch[stream] = driver.DeviceBuffer(4 * max(words, 1024))
        driver.check(_cu.cuMemsetD32(buf.ptr, 0, buf.nbytes // 4), "cuMemsetD32")
        return buf

    def _clear_status(self, stream: int, status_ptr: int) -> None:
        """Re-arms the status record after a failure was read from it."""
        driver.check(
            _cu.cuMemsetD32Async(status_ptr, 0, self.manifest.status_words, stream),
            "cuMemsetD32Async",
        )
        driver.synchronize(stream)

    def _write_dynamic(
        self, plan: _Plan, ptrs: list[int], status_ptr: int, polls: int, stream: int
    ) -> None:
        """Writes tensor (and tensor map), status and counters pointers and max_polls into
        the parameter array."""
        by_name = dict(zip(self._input_names, ptrs, strict=True))
        if self._maps:
            by_name.update(self._maps.pointers(by_name, plan.shapes, stream))
        counters_ptr = status_ptr + 4 * self.manifest.status_words
        values = [v for n in self._param_tensors for v in (by_name[n], by_name[n])]
        values += [status_ptr, status_ptr, counters_ptr, counters_ptr]
        if plan.queue_words:
            queue_ptr = status_ptr + 4 * _queue_offset(self.manifest, plan.counters)
            values += [queue_ptr, queue_ptr]
        values.append(polls)
        # Item by item: cheaper than building an array for ~10 words.
        target = plan.pack.values
        for slot, value in zip(plan.dynamic_slot_list, values, strict=True):
            target[slot] = value

    def _stage(self, b: BoundTensor, stream: int) -> None:
        """Copies a numpy array to a (reused) device buffer, ordered on `stream`."""
        if not b.nbytes:
            return
        buf = self._staging.get(b.name)
        if buf is None or buf.nbytes < b.nbytes:
            if buf is not None:
                driver.synchronize(stream)
                buf.release()
            buf = self._staging[b.name] = driver.DeviceBuffer(b.nbytes)
        host = np.ascontiguousarray(b.value)
        driver.htod(buf.ptr, host.ctypes.data, b.nbytes, stream)
        b.ptr = buf.ptr

    # -- launching ------------------------------------------------------------------------

    def launch(
        self,
        tensors: Mapping[str, Any],
        symbols: Mapping[str, int] | None = None,
        stream: Any = None,
        sync: bool = True,
        max_polls: int | None = None,
        grid: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Runs the graph once.

        `tensors` maps every graph tensor name to a torch CUDA tensor (contiguous, on this
        kernel's device), a numpy array, or a raw device pointer (int; its size is trusted to
        match the declared shape). numpy arrays are copied to the device before the launch and
        copied back into the same arrays afterwards, so outputs appear in them; that makes the
        launch synchronous whatever `sync` says (read-only arrays are not written back).

        `stream`: a CUstream, int handle, torch.cuda.Stream or ``__cuda_stream__`` object;
        None means torch's current stream when torch tensors are given, else the legacy
        default stream. With ``sync=False`` the call returns after enqueueing; call `check`
        later to wait and raise any deadlock. `max_polls` overrides the watchdog bound;
        `grid` forces a CTA count in 1..`num_ctas` (for testing schedules).
        `timeout` overrides the kernel's (`load(..., timeout=)`): seconds a synchronising
        launch waits before it raises `LaunchTimeoutError`, for hangs the watchdog cannot see.
        Raises `ShapeError`/`LaunchError` before launching, `DeadlockError` after a hang.
        """
        m = self.manifest
        symbols = {} if symbols is None else symbols
        plan = None
        try:
            key = (
                tuple(map(symbols.__getitem__, self._symbol_names))
                if len(symbols) == len(self._symbol_names)
                else None
            )
        except (KeyError, TypeError):  # a name missing, or not a mapping: the slow path says
            key = None
        if key is not None and set(map(type, key)) <= _INT:  # bools/floats: slow path
            plan = self._plans.get((key, grid))
        if plan is None:
            check_mapping(m.graph, "tensors", tensors)  # before planning costs anything
            plan = self._plan(symbols, grid)
        polls = self.max_polls if max_polls is None else _check_polls(max_polls)
        wait = self.timeout if timeout is None else _check_timeout(timeout)
        fast = plan.fast
        if fast is None or fast.tensor_type is None and "torch" in sys.modules:
            fast = plan.fast = FastBinder(m, plan.shapes, self.device.ordinal)
        hot = fast(tensors)
        bound: list[BoundTensor] = []
        has_numpy = False
        if hot is not None:
            ptrs, has_torch = hot
        else:  # numpy arrays, or an error to report
            bound = bind_tensors(m, plan.shapes, tensors, self.device.ordinal)
            has_torch = any(b.kind == TORCH for b in bound)
            has_numpy = any(b.kind == NUMPY for b in bound)
        handle = _stream_handle(stream, has_torch, self.device.ordinal)
        words = plan.scratch_words
        scratch = self._scratch.get(handle)
        if scratch is None or scratch.nbytes < 4 * words:
            if m.ranked:
                raise LaunchError(
                    f"{m.graph}: this launch needs {words} scratch words on stream {handle}; "
                    "the RankGroup allocated "
                    f"{0 if scratch is None else scratch.nbytes // 4} there (give the group's "
                    "launch this stream, or a larger scratch_words)"
                )
            scratch = self._grow_scratch(handle, words)
        if hot is None:
            if has_numpy:
                self._ensure_context()
                for b in bound:
                    if b.kind == NUMPY:
                        self._stage(b, handle)
            ptrs = [b.ptr for b in bound]
        status_ptr = scratch.ptr
        dynamic = (*ptrs, status_ptr, polls, self._maps.generation)
        if dynamic != plan.last_dynamic:
            self._write_dynamic(plan, ptrs, status_ptr, polls, handle)
            plan.last_dynamic = dynamic

        cu = _cu
        if plan.trace_buffer is not None:
            # A fresh record count per launch (tracing is not a hot path).
            driver.check(
                cu.cuMemsetD32Async(plan.trace_buffer.ptr, 0, 2, handle), "cuMemsetD32Async"
            )
        # The hot path: the arguments as one tuple, launched once (twice when
        # another context was current).
        if self.cluster > 1:
            err = self._launch_clusters(plan, handle)
        else:
            launch = (
                self.function, plan.grid, 1, 1, m.block_size, 1, 1, m.dynamic_shared_memory,
                handle, plan.pack.address,
            )  # fmt: skip
            err = cu.cuLaunchCooperativeKernel(*launch)[0]
            if err in _WRONG_CONTEXT:  # no current context, or another device's
                self._ensure_context()
                err = cu.cuLaunchCooperativeKernel(*launch)[0]
        if err != _SUCCESS:
            how = f", clusters of {self.cluster}" if self.cluster > 1 else ""
            raise LaunchError(
                f"{m.graph}: cuLaunch{'KernelEx' if how else 'CooperativeKernel'} (grid "
                f"{plan.grid} x {m.block_size}{how}) failed: {driver.error_name(err)}"
            )
        self._last = (handle, scratch, plan, polls, ptrs, bound)
        if has_numpy:
            driver.synchronize(handle, wait, m.graph)
            for b in bound:
                if b.kind == NUMPY and b.nbytes and b.value.flags.writeable:
                    _copy_back(b)
            self.check(wait)
        elif sync:
            # Queue the status copy behind the kernel so one synchronisation covers both.
            err = cu.cuMemcpyDtoHAsync(
                self._status_host.ptr, status_ptr, self._status.nbytes, handle
            )[0]
            if err != _SUCCESS:
                raise LaunchError(f"{m.graph}: cuMemcpyDtoHAsync failed: {driver.error_name(err)}")
            driver.synchronize(handle, wait, m.graph)
            if self._status[ST_STATE]:
                failure = status_error(m, plan.symbols, self._status, polls)
                self._clear_status(handle, status_ptr)
                self._zero_kept(handle, plan, ptrs, bound)
                if failure is not None:
                    raise failure
            else:
                self._learn_placement(plan)

    def _launch_clusters(self, plan: _Plan, stream: int) -> Any:
        """The launch in thread-block clusters (``cuLaunchKernelEx``): its
        error code. Cooperative, unless the driver refuses that with
        clusters; then plain from here on, the grid being whole co-resident
        clusters (``cuOccupancyMaxActiveClusters``)."""
        m, cu = self.manifest, _cu

        def launch() -> Any:
            cooperative = self._cluster_cooperative
            if plan.cluster_config is None or plan.cluster_config[1] != cooperative:
                config = driver.cluster_launch_config(
                    plan.grid, m.block_size, m.dynamic_shared_memory, self.cluster, cooperative
                )
                plan.cluster_config = (config, cooperative)
            config = plan.cluster_config[0]
            config.hStream = stream
            return cu.cuLaunchKernelEx(config, self.function, plan.pack.address, 0)[0]

        err = launch()
        if err in _WRONG_CONTEXT:
            self._ensure_context()
            err = launch()
        if err in _COOPERATIVE_REFUSED and self._cluster_cooperative:
            self._cluster_cooperative = False
            err = launch()
        return err

    def check(self, timeout: float | None = None) -> None:
        """Waits for the latest launch and raises what its status record reports
        (`LaunchTimeoutError` after ``timeout`` seconds, default the kernel's).

        Failures are sticky: the kernel records the first one and nothing clears it until it
        is read here (or by a ``sync=True`` launch), so a failure of any earlier ``sync=False``
        launch on the stream is reported, and the launches after it fail fast (their waits
        give up at once) instead of hanging. After a `DeadlockError` the kernel has exited
        cleanly, the record is re-armed and the context stays usable.
        """
        if self._last is None:
            return
        handle, scratch, plan, polls, ptrs, bound = self._last
        wait = self.timeout if timeout is None else _check_timeout(timeout)
        driver.synchronize(handle, wait, self.manifest.graph)
        driver.dtoh(self._status_host.ptr, scratch.ptr, self._status.nbytes)
        if not self._status[ST_STATE]:
            self._learn_placement(plan)
            return
        err = status_error(self.manifest, plan.symbols, self._status, polls)
        self._clear_status(handle, scratch.ptr)
        self._zero_kept(handle, plan, ptrs, bound)
        if err is not None:
            raise err

    def _zero_kept(
        self, stream: int, plan: _Plan, ptrs: list[int], bound: list[BoundTensor]
    ) -> None:
        """After a failed launch: its kept-zero tensors (counters the tiles
        reset themselves, which a launch cut short leaves counting) back to
        zero on the device, and in the numpy arrays it was given, so the next
        launch starts right."""
        if not self._kept_zero:
            return
        for i, spec in self._kept_zero:
            nbytes = numel(plan.shapes[spec.name]) * DTYPE_SIZES[spec.dtype]
            if nbytes and ptrs[i]:
                driver.check(_cu.cuMemsetD8Async(ptrs[i], 0, nbytes, stream), "cuMemsetD8Async")
        driver.synchronize(stream)
        names = {spec.name for _, spec in self._kept_zero}
        for b in bound:
            if b.kind == NUMPY and b.name in names and b.value.flags.writeable:
                b.value[...] = 0

    def trace(self) -> Trace:
        """The per-instance timeline of the latest launch (artifacts compiled
        with ``trace=True``); waits for the launch to finish."""
        m = self.manifest
        if not m.traced:
            raise LaunchError(f"{m.graph}: compiled without trace=True; no timeline to read")
        if self._last is None:
            raise LaunchError(f"{m.graph}: no launch to trace yet")
        handle, _, plan, *_ = self._last
        driver.synchronize(handle)
        words = np.empty(plan.trace_buffer.nbytes // 8, dtype=np.uint64)
        driver.dtoh(words.ctypes.data, plan.trace_buffer.ptr, words.nbytes)
        grids = [m.bind(t.grid, plan.symbols) for t in m.tasks]
        return Trace.decode(words, m.graph, [t.name for t in m.tasks], grids)

    def _ensure_context(self) -> None:
        self.device.make_current()

    def __del__(self) -> None:
        # Device buffers are freed right after this; launches still queued may read them.
        if getattr(self, "_last", None) is not None and _cu is not None:
            try:
                _cu.cuCtxSynchronize()
            except Exception:
                pass

    def clear_cache(self) -> None:
        """Waits for all launches, then frees cached queues and staging buffers."""
        for handle in list(self._scratch):
            driver.synchronize(handle)
        for plan in self._shapes.values():
            plan.release()
        for buf in self._staging.values():
            buf.release()
        self._maps.release()
        self._plans.clear()
        self._shapes.clear()
        self._staging.clear()


def counter_words(m: Manifest, counters: int) -> int:
    """Words of the counters region: for ranked graphs first the rank barrier's
    `launches` and `arrivals` words (never reset), then the events' counters
    and the kernel's "done" counter."""
    return counters + (3 if m.ranked else 1)


def _queue_offset(m: Manifest, counters: int) -> int:
    """Scratch layout, in i32 words: status, the counters region, then (dynamic
    schedule) the 8-byte-aligned ready queue. This is its offset."""
    words = m.status_words + counter_words(m, counters)
    return words + (words & 1)


def _check_timeout(v: Any) -> float | None:
    """None, or a positive finite number of seconds."""
    if v is None:
        return None
    number = not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
    if not (number and 0 < float(v) < float("inf")):
        raise LaunchError(f"timeout must be a number of seconds > 0 or None, got {v!r}")
    return float(v)


def _check_polls(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 1 << 63:
        raise LaunchError(f"max_polls must be an int in 0..2**63-1, got {v!r}")
    return int(v)


def _copy_back(b: BoundTensor) -> None:
    arr = b.value
    if arr.flags.c_contiguous:
        driver.dtoh(arr.ctypes.data, b.ptr, b.nbytes)
    else:
        host = np.empty(arr.shape, dtype=arr.dtype)
        driver.dtoh(host.ctypes.data, b.ptr, b.nbytes)
        arr[...] = host


def _stream_handle(stream: Any, has_torch: bool, device: int) -> int:
    if stream is None:
        if not has_torch:
            return 0
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # an int, no Stream object
        return (
            int(raw(device))
            if raw is not None
            else int(torch.cuda.current_stream(device).cuda_stream)
        )
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol (cuda.core, cupy)
        return int(stream.__cuda_stream__()[1])
    return int(stream)  # CUstream


def load(
    directory: str | Path,
    device: int | None = None,
    max_polls: int | None = None,
    timeout: float | None = None,
) -> Kernel | BucketedKernel:
    """Loads an artifact directory (``manifest.json`` + ``kernel.ptx``/``kernel.cubin``),
    or a bucketed one (``buckets.json``: see :mod:`etc.runtime.buckets`), whose
    kernels are all loaded now.

    Verifies the manifest and image hashes, retains the device's primary context (shared
    with torch), and loads the module once per process and context, preferring the cubin
    and falling back to the PTX (driver JIT). `device` defaults to torch's current device
    when torch is imported, else 0. `timeout`: seconds a synchronising launch or `check`
    waits before raising `LaunchTimeoutError` (None: no bound).
    """
    _check_timeout(timeout)  # bad input fails before anything loads
    if (Path(directory) / "buckets.json").exists():
        from .buckets import load_buckets

        return load_buckets(directory, load, device=device, max_polls=max_polls, timeout=timeout)
    manifest = load_manifest(directory)
    if device is None:
        torch = sys.modules.get("torch")
        device = (
            int(torch.cuda.current_device())
            if torch is not None and torch.cuda.is_available()
            else 0
        )
    dev = driver.get_device(device)
    images = []
    if manifest.cubin_bytes is not None:
        images.append(("cubin", manifest.cubin_bytes))
    images.append(("ptx", manifest.ptx_bytes))
    digest = manifest.sha256[manifest.cubin or manifest.ptx]
    key = f"{Path(directory).resolve()}:{digest}"
    function, image = driver.load_function(dev, key, manifest.kernel, images)
    return Kernel(manifest, dev, function, image, max_polls, timeout)

"""Task graphs wired by event tensors: the Python API of the paper's Figure 3.

::

    g = etc.Graph("splitk")
    n = g.symbol("n")
    A = g.tensor("A", (n, 256), "f32")
    B = g.tensor("B", (n, 4), "f32")
    C = g.tensor("C", (n,), "f32")
    E = g.event((n,), wait_count=4, name="E")
    g.task(partial_sum, grid=(n, 4), args=(A, B), out_edges={E: "ij->i"})
    g.task(final_sum, grid=(n,), args=(B, C), in_edges={E: "i->i"})
    text = g.to_mlir()

Local mistakes (a map over the wrong grid rank, a buffer of the wrong type,
...) raise :class:`~etc.errors.GraphError` when the task or event is added;
whole-graph rules (cycles, unused events, wait count vs fan-in) are checked
by :meth:`Graph.validate`, which :meth:`Graph.to_mlir` and
:func:`etc.simulate` call. Messages name the task, event and map at fault.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ._fields import is_int
from .device import CLUSTER_SIZES, DeviceFunction, normalize_type
from .dtypes import DType
from .dtypes import dtype as to_dtype
from .edgemap import EdgeMap, parse_edge_map
from .errors import GraphError
from .symbolic import Size, Symbol, SymExpr, as_size

__all__ = ["Graph", "Tensor", "Event", "Task", "Trigger", "Edge", "Symbol", "SymExpr", "EdgeMap"]

_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Largest number of grid points / event coordinates enumerated to check a
# wait count whose fan-in is not uniform (mirrors etensor-verify-graph).
_MAX_ENUMERATED = 1 << 20


def _fmt_shape(shape: Iterable[Size]) -> str:
    items = [str(s) for s in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _mlir_dims(shape: Iterable[Size]) -> list[str]:
    """MLIR dimension text: ints as themselves, symbolic sizes as ``?``."""
    return ["?" if isinstance(d, SymExpr) else str(d) for d in shape]


@dataclass(eq=False)
class Tensor:
    """A buffer of the graph: a ``memref`` argument of the megakernel."""

    name: str
    shape: tuple[Size, ...]
    dtype: DType
    graph: Graph = field(repr=False)
    index: int = field(repr=False)
    #: A peer table (see Graph.peer_table): the tensor whose ranks' addresses it holds.
    peers_of: Tensor | None = field(default=None, repr=False)
    #: A TMA tensor map (see Graph.tensor_map): the tensor it describes, the
    #: box ``(rows, cols)`` one copy moves, and the k chunk of a tensor in
    #: ``etc.tiles.gemm.chunk_weights``' layout (0: row-major).
    map_of: Tensor | None = field(default=None, repr=False)
    map_box: tuple[int, int] | None = field(default=None, repr=False)
    map_chunk: int = field(default=0, repr=False)
    #: Zero before every launch, and left zero by every launch that
    #: completes (counters a tile resets itself: see Graph.tensor).
    kept_zero: bool = field(default=False, repr=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def mlir_type(self) -> str:
        """E.g. ``memref<?x256xf32>`` (symbolic dims are ``?``)."""
        return "memref<" + "".join(d + "x" for d in _mlir_dims(self.shape)) + self.dtype.mlir + ">"


WaitCount = int | SymExpr | Tensor
#: ``Graph.task(deal=...)`` values.
DEALS = ("list", "ticket", "pool")


@dataclass(eq=False)
class Event:
    """An event tensor: one counter per coordinate, and their wait counts."""

    name: str
    shape: tuple[Size, ...]
    wait_count: WaitCount
    graph: Graph = field(repr=False)
    index: int = field(repr=False)
    #: Spans the ranks: dimension 0 is the rank whose copy holds the coordinate.
    ranked: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def mlir_type(self) -> str:
        """E.g. ``!etensor.event<?x4>``."""
        return "!etensor.event<" + "x".join(_mlir_dims(self.shape)) + ">"


@dataclass(frozen=True, eq=False)
class Edge:
    """One in- or out-edge of a task: an event and the map onto it."""

    event: Event
    map: EdgeMap


@dataclass(frozen=True, eq=False)
class Trigger:
    """A data-dependent trigger: instances ``[indptr[c], indptr[c+1])`` of a
    task run once coordinate ``c`` of the 1-D ``event`` completes."""

    event: Event
    indptr: Tensor


@dataclass(eq=False)
class Task:
    """A device function launched over a grid; ``index`` is insertion order.

    A triggered task (``trigger`` set) has a 1-D grid whose extent bounds
    ``indptr[C]``; its function and edge maps take ``(i, c)``: the instance
    and its trigger coordinate.
    """

    name: str
    function: DeviceFunction
    grid: tuple[Size, ...]
    args: tuple[Tensor | Symbol, ...]
    in_edges: tuple[Edge, ...]
    out_edges: tuple[Edge, ...]
    graph: Graph = field(repr=False)
    index: int = field(repr=False)
    trigger: Trigger | None = None
    #: Static-schedule phase of an instance: ("const", c) or ("dim", d) (its
    #: grid coordinate d). Instances run in (phase, task number, linear) order.
    phase: tuple[str, int] = ("const", 0)
    #: Shared-memory region (``Graph.task(shared_region=...)``); 0 by default.
    shared_region: int = 0
    #: How the static schedule deals the instances: ``"list"`` (each queue
    #: entry names one), ``"ticket"`` (each entry runs the next unclaimed one)
    #: or ``"pool"`` (an entry per CTA and phase runs unclaimed ones until none is left).
    deal: str = "list"
    #: In-edge waits before the prefetch call (``Graph.task(prefetch_after=...)``).
    prefetch_after: int = 0
    #: Static schedule: the instances go to the first this many CTAs only
    #: (``Graph.task(ctas=...)``); None: to all.
    ctas: int | None = None
    #: Static schedule: the round-robin positions each phase's instances take
    #: at least (``Graph.task(deal_slots=...)``); None: their count.
    deal_slots: int | None = None

    @property
    def rank(self) -> int:
        return len(self.grid)

    @property
    def coordinates(self) -> tuple[Size, ...]:
        """Extents of the coordinates the function and edge maps take."""
        if self.trigger is None:
            return self.grid
        return (*self.grid, self.trigger.event.shape[0])

    @property
    def uses_rank(self) -> bool:
        """Whether an edge map names the rank running the instance."""
        return any(e.map.uses_rank for e in (*self.in_edges, *self.out_edges))


class Graph:
    """A megakernel under construction: symbols, tensors, events and tasks."""

    def __init__(self, name: str, *, block_size: int | None = None) -> None:
        if not isinstance(name, str) or not _C_IDENT.match(name):
            raise GraphError(
                f"graph name {name!r} must be an identifier ([A-Za-z_][A-Za-z0-9_]*): "
                "it names the GPU kernel"
            )
        if block_size is not None and (
            not isinstance(block_size, int) or not 32 <= block_size <= 1024 or block_size % 32
        ):
            raise GraphError(
                f"graph '{name}': block_size must be a multiple of 32 in [32, 1024], "
                f"got {block_size!r}"
            )
        self.name = name
        self._block_size = block_size
        self.symbols: list[Symbol] = []
        self.tensors: list[Tensor] = []
        self.events: list[Event] = []
        self.tasks: list[Task] = []
        self._params: dict[str, Symbol | Tensor] = {}
        self._event_names: dict[str, Event] = {}
        self._task_names: dict[str, Task] = {}
        self._functions: dict[str, DeviceFunction] = {}
        # Graphs that span several GPUs (see ranks()).
        self.rank: Symbol | None = None
        self.num_ranks: Symbol | None = None
        #: (size expression, message): each must be >= 0 at launch (require()).
        self.requirements: list[tuple[Size, str]] = []

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}, symbols={len(self.symbols)}, tensors="
            f"{len(self.tensors)}, events={len(self.events)}, tasks={len(self.tasks)})"
        )

    # ------------------------------------------------------------------
    # Construction
    # ------------------------------------------------------------------
    def symbol(self, name: str, *, max: int | None = None) -> Symbol:  # noqa: A002
        """Declare a symbolic size (an ``index`` argument bound at launch).

        The name must be a Python identifier, so that ``str()`` of every
        expression is valid Python over the symbol names (manifests use it).
        ``max``: the largest value the graph's tiles are written for (e.g. a
        kernel for batches of at most 16 with buffers sized for them); the
        runtime and the simulator refuse a larger one, naming the symbol.
        """
        self._check_param_name(name, "symbol")
        if not name.isidentifier():
            raise GraphError(f"symbol name {name!r} must be an identifier")
        if max is not None and (not isinstance(max, int) or isinstance(max, bool) or max < 0):
            raise GraphError(f"symbol {name!r}: max must be None or an int >= 0, got {max!r}")
        sym = Symbol(name, self, max)
        self.symbols.append(sym)
        self._params[name] = sym
        return sym

    def require(self, size: Any, message: str) -> None:
        """Require ``size``, an expression of the symbols, to be ``>= 0`` at
        every launch: the runtime and the simulator refuse symbols that make
        it negative with ``ShapeError`` naming ``message`` and the values
        (e.g. ``g.require(S - L - 1, "position L must be below the cache's
        S")``), before the kernel could index past a buffer."""
        if not isinstance(message, str) or not message:
            raise GraphError(f"require: message must be a non-empty string, got {message!r}")
        size = self._size(size, f"require({message!r})")
        if isinstance(size, int):
            if size < 0:
                raise GraphError(f"graph '{self.name}': {message} (never: {size} < 0)")
            return
        self.requirements.append((size, message))

    def ranks(self, count: str = "ranks", rank: str = "rank") -> tuple[Symbol, Symbol]:
        """Make the graph span several GPUs (ranks), one kernel each, and
        return the symbols ``(rank, count)``: the rank running the kernel and
        the number of ranks, both bound at launch.

        Ranked events (``event(..., ranked=True)``) then carry notifications
        between ranks, edge maps may name the rank (``"i->rank,i"``), and
        tasks may take ``rank`` as an argument (an ``index``) to address
        other ranks' buffers.
        """
        if self.rank is not None:
            raise GraphError(f"graph '{self.name}' already declared its ranks")
        count_sym = self.symbol(count)
        rank_sym = self.symbol(rank)
        self.num_ranks, self.rank = count_sym, rank_sym
        return rank_sym, count_sym

    def tensor(
        self, name: str, shape: Iterable[Any], dtype: Any, *, kept_zero: bool = False
    ) -> Tensor:
        """Declare a buffer of ``shape`` (ints or symbol expressions) and ``dtype``.

        ``kept_zero=True``: counters the tiles return to zero themselves (e.g.
        the last of a group to count resets the count), so the buffer must
        be all zeros before a launch and a launch that completes leaves it
        so. After a launch that fails (a deadlock, a wrong wait count) the
        runtime zeroes it again, so the next launch starts right; the
        simulator refuses one that is not zero at the start and reports a
        tile that leaves it nonzero at the end."""
        self._check_param_name(name, "tensor")
        if not isinstance(kept_zero, bool):
            raise GraphError(f"tensor '{name}': kept_zero must be a bool, got {kept_zero!r}")
        dims = self._shape(shape, f"tensor '{name}'")
        t = Tensor(name, dims, to_dtype(dtype), self, len(self.tensors), kept_zero=kept_zero)
        self.tensors.append(t)
        self._params[name] = t
        return t

    def peer_table(self, tensor: Tensor, name: str | None = None) -> Tensor:
        """Declare the peer table of ``tensor`` in a graph that spans ranks: an
        ``i64`` tensor of shape ``(ranks,)`` whose entry ``q`` is the address
        of rank ``q``'s ``tensor`` (fill it with
        :func:`etc.runtime.peer_table`). A tile takes it to write (or read)
        another rank's buffer; in the simulator its reference receives the
        list of every rank's array instead. ``name`` defaults to
        ``<tensor>_peers``."""
        if self.num_ranks is None:
            raise GraphError(
                f"peer table of tensor '{getattr(tensor, 'name', tensor)}': graph "
                f"'{self.name}' does not span ranks; call graph.ranks() first"
            )
        if not isinstance(tensor, Tensor) or tensor.graph is not self:
            raise GraphError(f"peer_table: {tensor!r} is not a tensor of graph '{self.name}'")
        table = self.tensor(name or f"{tensor.name}_peers", (self.num_ranks,), "i64")
        table.peers_of = tensor
        return table

    def tensor_map(
        self, tensor: Tensor, box: tuple[int, int], name: str | None = None, chunk: int = 0
    ) -> Tensor:
        """Declare the TMA tensor map of ``tensor`` for boxes of ``box = (rows,
        cols)``: an ``i64`` tensor of shape ``(16,)`` (a ``CUtensorMap``) that
        the runtime encodes at every launch from the bound tensor's address
        and shape, so it is never passed to ``launch``. The map views
        ``tensor`` as 2-D: its last dimension by the product of the others;
        rows past the end read as zeros. ``cols`` of the element type must
        make 128 bytes (the 128-byte swizzle that wgmma reads), ``rows`` is in
        1..256. A tile that copies through TMA takes the map as an argument
        (see ``DeviceFunction.tensor_maps``); the simulator hands its
        reference zeros. ``Graph.task`` declares a tile's maps itself when it
        is given only the tile's other buffers. ``chunk=cols``: the tensor is
        in ``etc.tiles.gemm.chunk_weights``' layout with chunks of ``cols``
        (8-row groups of k chunks); the map views it in 4-D (k in chunk, row
        in group, chunk, group) and a box of ``rows`` (a multiple of 8) lands
        in shared memory exactly as the row layout's 2-D box would. ``name``
        defaults to ``<tensor>_tma<rows>x<cols>`` (``_c<chunk>`` added);
        declaring the same map twice returns the first."""
        if not isinstance(tensor, Tensor) or tensor.graph is not self:
            raise GraphError(f"tensor_map: {tensor!r} is not a tensor of graph '{self.name}'")
        where = f"tensor map of '{tensor.name}'"
        if tensor.map_of is not None or tensor.peers_of is not None:
            raise GraphError(f"{where}: '{tensor.name}' is itself a derived table, not a buffer")
        if (
            not isinstance(box, (tuple, list))
            or len(box) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in box)
        ):
            raise GraphError(f"{where}: box must be (rows, cols) ints, got {box!r}")
        rows, cols = box
        size = tensor.dtype.itemsize
        if tensor.rank < 2:
            raise GraphError(f"{where}: the tensor has rank {tensor.rank}; TMA maps need rank >= 2")
        if cols * size != 128:
            raise GraphError(
                f"{where}: box cols={cols} of {tensor.dtype.name} make {cols * size} bytes; "
                f"the 128-byte swizzle needs {128 // size}"
            )
        if not 1 <= rows <= 256:
            raise GraphError(f"{where}: box rows={rows} must be in 1..256")
        last = tensor.shape[-1]
        if isinstance(last, int) and (last * size) % 16:
            raise GraphError(
                f"{where}: a row of {last} {tensor.dtype.name} is {last * size} bytes; "
                "TMA needs rows of a multiple of 16 bytes"
            )
        if chunk:
            rows_dim = tensor.shape[-2] if tensor.rank >= 2 else None
            if (
                chunk != cols
                or rows % 8
                or (isinstance(last, int) and last % chunk)
                or (isinstance(rows_dim, int) and rows_dim % 8)
            ):
                raise GraphError(
                    f"{where}: chunk={chunk} needs chunks of the box's {cols} columns, box rows "
                    f"in 8-row groups (rows={rows}) and a tensor of 8-row groups of whole "
                    f"chunks (shape {tuple(str(d) for d in tensor.shape)})"
                )
        for t in self.tensors:
            if (
                t.map_of is tensor
                and t.map_box == (rows, cols)
                and t.map_chunk == chunk
                and name in (None, t.name)
            ):
                return t
        suffix = f"_c{chunk}" if chunk else ""
        table = self.tensor(name or f"{tensor.name}_tma{rows}x{cols}{suffix}", (16,), "i64")
        table.map_of, table.map_box, table.map_chunk = tensor, (rows, cols), chunk
        return table

    def event(
        self,
        shape: Iterable[Any],
        wait_count: Any,
        *,
        name: str | None = None,
        ranked: bool = False,
    ) -> Event:
        """Declare an event tensor.

        ``wait_count`` is an int, a symbol expression, or an integer Tensor of
        the event's shape holding one count per coordinate (data-dependent).
        ``name`` defaults to ``e<k>``.

        ``ranked=True`` (graphs with :meth:`ranks`): dimension 0, of extent
        the number of ranks, is the rank whose copy of the counters holds
        the coordinate. Out-edges notify any rank's copy (``"di->d,i"``);
        in-edges wait on the waiting rank's own (``"i->rank,i"``); the wait
        count counts the notifications of all ranks together.
        """
        if name is None:
            k = len(self.events)
            while f"e{k}" in self._event_names:
                k += 1
            name = f"e{k}"
        if not isinstance(name, str) or not name:
            raise GraphError(f"event name {name!r} must be a non-empty string")
        if name in self._event_names:
            raise GraphError(f"event '{name}' is already declared in graph '{self.name}'")
        dims = self._shape(shape, f"event '{name}'")
        count = self._wait_count(wait_count, name, dims)
        if not isinstance(ranked, bool):
            raise GraphError(f"event '{name}': ranked must be a bool, got {ranked!r}")
        if ranked:
            if self.num_ranks is None:
                raise GraphError(
                    f"event '{name}': a ranked event needs a graph that spans ranks; "
                    f"call graph.ranks() first"
                )
            if not dims or SymExpr._lift(dims[0]) != SymExpr._lift(self.num_ranks):
                raise GraphError(
                    f"event '{name}': dimension 0 of a ranked event must be the number of "
                    f"ranks '{self.num_ranks.name}', got shape {_fmt_shape(dims)}"
                )
            if isinstance(count, Tensor):
                raise GraphError(
                    f"event '{name}': a ranked event cannot read its wait counts from a "
                    "tensor (its notifications come from every rank)"
                )
        e = Event(name, dims, count, self, len(self.events), ranked)
        self.events.append(e)
        self._event_names[name] = e
        return e

    def task(
        self,
        function: DeviceFunction,
        grid: Any,
        args: Iterable[Tensor] = (),
        in_edges: Any = None,
        out_edges: Any = None,
        name: str | None = None,
        triggered_by: Any = None,
        phase: Any = 0,
        shared_region: int = 0,
        deal: str = "list",
        prefetch_after: int = 0,
        ctas: int | None = None,
        deal_slots: int | None = None,
    ) -> Task:
        """Run ``function`` over ``grid``, waiting on ``in_edges`` and notifying ``out_edges``.

        Edges are ``{event: map}`` dicts (or iterables of ``(event, map)``
        pairs, to use one event twice). ``name`` defaults to the function's
        name, made unique with a ``_<k>`` suffix when the function is reused.

        ``triggered_by=(event, indptr)`` makes the task data-dependent: the
        1-D ``grid`` is a bound on ``indptr[C]`` known at launch, instances
        ``[indptr[c], indptr[c+1])`` run once coordinate ``c`` of the 1-D
        ``event`` completes (``indptr``, ``C + 1`` integers, must be final by
        then), and the function and the edge maps take ``(i, c)``. Out-edges
        may use ``c`` (``"ic->c"``); their events need table wait counts.

        ``phase`` orders the static schedule: a non-negative int, or a map
        with one result naming a grid dimension (``"lij->l"``). Instances run
        in (phase, task number, linear index) order, so a graph that repeats
        its tasks per layer (``grid=(layers, ...)``, the next layer fed
        through a shifted out-edge ``"(l, i, j) -> (l + 1)"``) runs layer by
        layer. Every event coordinate's notifiers must come before its
        waiters in that order; the runtime checks it at each new shape.

        ``shared_region`` (an int >= 0, default 0) keeps the tile's shared
        memory apart from that of tasks in other regions. The static schedule
        then runs the prefetch function of a CTA's next instance *ahead*,
        before the current instance's waits, whenever the two are in
        different regions: a projection's weight ring fills while the CTA
        still waits for, or runs, the stage before (``docs/scheduling.md``).
        The kernel needs the sum of the regions' shared memory.

        ``deal`` (static schedule): ``"list"`` (default) runs the instance
        each CTA's precomputed list names; ``"ticket"`` keeps the lists'
        slots but runs, at each of the task's slots, the next instance no CTA
        has claimed yet (one atomic counter, drawn one slot ahead), so
        instances go to the CTAs that are free first whatever their
        durations: a phase of unequal instances ends evenly across CTAs. The
        task's instances must not depend on each other (no grid-dimension
        phase). ``"pool"`` deals at run time phase by phase: each CTA whose
        list held instances of a phase gets one entry in their place, which
        runs unclaimed instances of that phase (one counter per phase, drawn
        one instance ahead while two per CTA are left) until none is left,
        so a CTA runs as many as it is free for: a stage whose CTAs stream
        at unequal paces (an LM head) ends when the work does, not with the
        slowest list. Not with ``triggered_by`` or shared regions other than
        0. The dynamic schedule deals by readiness and ignores it.

        ``prefetch_after=n`` (an int >= 0, default 0) runs the tile's
        prefetch function after the first ``n`` in-edge waits instead of
        before them (static schedule), so it may read what those waits'
        producers wrote: a routing table naming the weights to load, read
        while the later waits are still pending. Such a prefetch never runs
        ahead of its instance (``prefetch_next``, shared regions). Not with
        ``triggered_by``.

        ``ctas=n`` (static schedule, ``deal="list"``): the task's instances
        are dealt round-robin over the first ``n`` CTAs only (all of them when
        the launch has fewer), each CTA's list still in the global order, so
        the other CTAs go on to later tasks' instances meanwhile (e.g. a few
        CTAs copy an MoE layer's rows expert by expert while the rest start
        the experts' GEMMs). The dynamic schedule ignores it.

        ``deal_slots=n`` (static schedule, ``deal="list"``, round-robin
        lists): each phase's instances of the task take at least ``n``
        positions of the round-robin deal, the ones past their count left
        empty, so the tasks after it land on the same CTAs however many
        instances it has at launch (e.g. an attention whose split count
        changes with the context, kept from moving the next projections onto
        the CTAs that ran it). The dynamic schedule ignores it.
        """
        if not isinstance(function, DeviceFunction):
            raise GraphError(
                f"task {name or function!r}: expected an etc.DeviceFunction, got "
                f"{type(function).__name__}"
            )
        if name is None:
            name, k = function.name, 1
            while name in self._task_names:
                name, k = f"{function.name}_{k}", k + 1
        elif not isinstance(name, str) or not name:
            raise GraphError(f"task name {name!r} must be a non-empty string")
        elif name in self._task_names:
            raise GraphError(f"task '{name}' is already declared in graph '{self.name}'")
        where = f"task '{name}'"

        self._check_function(function, where)
        grid_t = self._grid(grid, where)
        args_t = self._args(args, where)
        trigger = self._trigger(triggered_by, grid_t, where)
        if trigger is not None:
            self._check_triggered_prefetch(function, where)
        coords = grid_t if trigger is None else (*grid_t, trigger.event.shape[0])
        args_t = self._append_maps(function, coords, args_t)
        self._check_signature(function, coords, args_t, where, trigger is not None)
        ins = self._edges(in_edges, "in", coords, where)
        outs = self._edges(out_edges, "out", coords, where)
        if trigger is not None:
            for edge in ins:
                if any(kind == "dim" and v == 1 for kind, v in edge.map.results):
                    raise GraphError(
                        f"{where}: in-edge map '{edge.map}' on event '{edge.event.name}' "
                        "uses the trigger coordinate (dimension 1); only out-edges may"
                    )

        phase_t = self._phase(phase, grid_t, trigger is not None, where)
        if deal not in DEALS:
            raise GraphError(
                f"{where}: deal must be one of {', '.join(map(repr, DEALS))}, got {deal!r}"
            )
        if deal == "ticket" and phase_t[0] == "dim":
            raise GraphError(
                f"{where}: deal='ticket' hands out instances in linear order, which a "
                f"grid-dimension phase ({phase!r}) would interleave with other tasks; "
                "use an int phase"
            )
        if not is_int(shared_region):
            raise GraphError(f"{where}: shared_region must be an int >= 0, got {shared_region!r}")
        if shared_region < 0:
            raise GraphError(f"{where}: shared_region must be >= 0, got {shared_region}")
        if deal == "pool" and (trigger is not None or shared_region):
            raise GraphError(
                f"{where}: deal='pool' runs a CTA's instances in a loop, which a data-dependent "
                "trigger's table and a prefetch ahead across shared regions cannot follow; "
                "use deal='ticket' or shared_region=0"
            )
        meets = getattr(function, "meets", 0)
        cluster = getattr(function, "cluster", 0)
        if not is_int(meets, 0):
            raise GraphError(
                f"{where}: tile '{function.name}' has meets={meets!r}; expected an int >= 0 "
                "(0: its parts do not wait for each other)"
            )
        if not is_int(cluster) or cluster not in (0, *CLUSTER_SIZES):
            raise GraphError(
                f"{where}: tile '{function.name}' has cluster={cluster!r}; expected 0 (none) or "
                f"a thread-block cluster of {', '.join(map(str, CLUSTER_SIZES))} CTAs"
            )
        last = grid_t[-1] if grid_t else None

        def grouped_along_last(last_bad: bool) -> list[str]:
            """Why the tile's groups along the last grid dimension (parts that
            wait for each other, a cluster's) cannot be dealt by the lists."""
            return [
                why
                for bad, why in (
                    (last_bad, f"its last grid dimension is {last}"),
                    (deal != "list", f"deal={deal!r}"),
                    (trigger is not None, "it has triggered_by"),
                    (phase_t == ("dim", len(grid_t) - 1), "its phase is that dimension"),
                )
                if bad
            ]

        broken = grouped_along_last(last != meets) if meets else []
        if broken:
            raise GraphError(
                f"{where}: tile '{function.name}' has {meets} parts that wait for each other "
                f"along its last grid dimension, which needs that dimension of extent {meets}, "
                "deal='list', no triggered_by and no phase on it (the static lists then deal a "
                f"block's parts to different CTAs); here {', '.join(broken)}"
            )
        broken = (
            grouped_along_last(not isinstance(last, int) or bool(last % cluster)) if cluster else []
        )
        if broken:
            raise GraphError(
                f"{where}: tile '{function.name}' runs each {cluster} instances along its last "
                f"grid dimension on one thread-block cluster, which needs that dimension a "
                "multiple of the cluster, deal='list', no triggered_by and no phase on it; "
                f"here {', '.join(broken)}"
            )
        for other in self.tasks:
            if other.function.name == function.name and other.shared_region != shared_region:
                raise GraphError(
                    f"{where}: tile '{function.name}' already runs in task '{other.name}' "
                    f"in shared region {other.shared_region}, not {shared_region}: a tile's "
                    "shared memory belongs to one region"
                )
        if not is_int(prefetch_after):
            raise GraphError(f"{where}: prefetch_after must be an int >= 0, got {prefetch_after!r}")
        if prefetch_after < 0:
            raise GraphError(f"{where}: prefetch_after must be >= 0, got {prefetch_after}")
        if prefetch_after and (
            function.prefetch is None or trigger is not None or prefetch_after > len(ins)
        ):
            raise GraphError(
                f"{where}: prefetch_after={prefetch_after} places tile '{function.name}''s "
                f"prefetch after that many in-edge waits: it needs a prefetch function "
                f"(has {function.prefetch!r}), no triggered_by, and at most {len(ins)} "
                "in-edges"
            )
        for key, value in (("ctas", ctas), ("deal_slots", deal_slots)):
            if value is not None and not is_int(value, 1):
                raise GraphError(f"{where}: {key} must be None or an int >= 1, got {value!r}")
        if ctas is not None and (deal != "list" or meets):
            raise GraphError(
                f"{where}: ctas={ctas} limits the CTAs the static lists deal this task to, "
                "which needs deal='list' and no parts that wait for each other (got "
                f"deal={deal!r}" + (f", {meets} such parts" if meets else "") + ")"
            )
        if deal_slots is not None and deal != "list":
            raise GraphError(
                f"{where}: deal_slots={deal_slots} pads the static lists' round-robin deal, "
                f"which needs deal='list' (got deal={deal!r})"
            )
        t = Task(
            name,
            function,
            grid_t,
            args_t,
            ins,
            outs,
            self,
            len(self.tasks),
            trigger,
            phase_t,
            shared_region,
            deal,
            prefetch_after,
            ctas,
            deal_slots,
        )
        self.tasks.append(t)
        self._task_names[name] = t
        self._functions.setdefault(function.name, function)
        return t

    def _append_maps(
        self, fn: DeviceFunction, coords: tuple[Size, ...], args: tuple[Tensor | Symbol, ...]
    ) -> tuple[Tensor | Symbol, ...]:
        """A TMA tile given only its other buffers gets its tensor maps
        (trailing buffers) declared and appended here."""
        maps = fn.tensor_maps
        if not maps or len(coords) + len(args) + len(maps) != len(fn.params):
            return args
        if sorted(maps) != list(range(len(args), len(args) + len(maps))):
            return args
        extra = []
        for k in sorted(maps):
            src, box, chunk = map_spec(maps[k])
            source = args[src] if 0 <= src < len(args) else None
            if not isinstance(source, Tensor):
                return args  # _check_signature reports it
            extra.append(self.tensor_map(source, box, chunk=chunk))
        return (*args, *extra)

    # ------------------------------------------------------------------
    # Local checks
    # ------------------------------------------------------------------
    def _foreign(self, where: str, what: str, owner: Graph) -> GraphError:
        """The error for a graph object of ``owner`` used in this graph (two
        graphs may share a name, which the message then says)."""
        if owner.name == self.name:
            whose = f"another graph also named '{self.name}'"
        else:
            whose = f"graph '{owner.name}', not to '{self.name}'"
        return GraphError(f"{where}: {what} belongs to {whose}")

    def _check_param_name(self, name: Any, kind: str) -> None:
        if not isinstance(name, str) or not name:
            raise GraphError(f"{kind} name {name!r} must be a non-empty string")
        if name in self._params:
            other = "symbol" if isinstance(self._params[name], Symbol) else "tensor"
            raise GraphError(
                f"{kind} '{name}': graph '{self.name}' already has a {other} named '{name}'"
            )

    def _size(self, value: Any, where: str) -> Size:
        try:
            size = as_size(value)
        except TypeError:
            raise GraphError(
                f"{where}: {value!r} is not a size (an int or an expression of "
                "this graph's symbols)"
            ) from None
        if isinstance(size, SymExpr):
            for sym in size.symbols():
                if sym.graph is not self:
                    raise self._foreign(where, f"symbol '{sym.name}'", sym.graph)
        return size

    def _shape(self, shape: Any, where: str) -> tuple[Size, ...]:
        if isinstance(shape, (int, SymExpr)) and not isinstance(shape, bool):
            shape = (shape,)
        try:
            items = tuple(shape)
        except TypeError:
            raise GraphError(f"{where}: shape {shape!r} must be a tuple of sizes") from None
        dims = tuple(self._size(d, where) for d in items)
        for k, d in enumerate(dims):
            if isinstance(d, int) and d < 0:
                raise GraphError(f"{where}: dimension {k} is negative ({d})")
        return dims

    def _wait_count(self, count: Any, name: str, dims: tuple[Size, ...]) -> WaitCount:
        where = f"event '{name}'"
        if isinstance(count, Tensor):
            if count.graph is not self:
                raise self._foreign(where, f"wait count tensor '{count.name}'", count.graph)
            if not count.dtype.is_integer:
                raise GraphError(
                    f"{where}: wait count tensor '{count.name}' must hold integers, "
                    f"got {count.dtype}"
                )
            if count.rank != len(dims):
                raise GraphError(
                    f"{where}: wait count tensor '{count.name}' has rank {count.rank} "
                    f"but the event has rank {len(dims)}"
                )
            for k, (td, ed) in enumerate(zip(count.shape, dims, strict=True)):
                if isinstance(td, int) and isinstance(ed, int) and td != ed:
                    raise GraphError(
                        f"{where}: wait count tensor '{count.name}' of shape "
                        f"{_fmt_shape(count.shape)} does not match the event shape "
                        f"{_fmt_shape(dims)} in dimension {k}"
                    )
            return count
        size = self._size(count, f"{where}: wait count")
        if isinstance(size, int) and size < 0:
            raise GraphError(f"{where}: wait count must be non-negative, got {size}")
        return size

    def _check_function(self, function: DeviceFunction, where: str) -> None:
        # One module holds every function and the graph: a symbol must have
        # one definition.
        # The kernel runs every tile with one CTA size, and tiles are written
        # for theirs (strides, shared buffers sized by warps, bar.sync counts).
        expected = self._block_size
        if expected is None and self._functions:
            expected = next(iter(self._functions.values())).block_size
        if expected is not None and function.block_size != expected:
            raise GraphError(
                f"{where}: device function '{function.name}' is written for "
                f"{function.block_size} threads per CTA but graph '{self.name}' runs "
                f"{expected}; every task of a graph shares one CTA size"
            )
        if self.name in function.defines:
            raise GraphError(
                f"{where}: device function '{function.name}' defines '@{self.name}', "
                f"the name of graph '{self.name}' (the kernel); rename one of them"
            )
        for other in self._functions.values():
            if other is function or other.source == function.source:
                continue
            clash = set(other.defines) & set(function.defines)
            if clash:
                sym = sorted(clash)[0]
                raise GraphError(
                    f"{where}: device function '{function.name}' defines "
                    f"'@{sym}', which device function '{other.name}' already "
                    "defines with a different source"
                )

    def _grid(self, grid: Any, where: str) -> tuple[Size, ...]:
        dims = self._shape(grid, where + ": grid")
        for k, d in enumerate(dims):
            if isinstance(d, int) and d == 0:
                raise GraphError(f"{where}: grid dimension {k} is empty, so the task can never run")
        return dims

    def _phase(
        self, spec: Any, grid: tuple[Size, ...], triggered: bool, where: str
    ) -> tuple[str, int]:
        if isinstance(spec, int) and not isinstance(spec, bool):
            if spec < 0:
                raise GraphError(f"{where}: phase {spec} must be >= 0")
            return ("const", spec)
        try:
            emap = parse_edge_map(spec)
        except GraphError as exc:
            raise GraphError(f"{where}: phase {spec!r}: {exc}") from None
        result = emap.results[0] if emap.n_results == 1 else None
        if (
            emap.n_dims != len(grid)
            or result is None
            or result[0] == "rank"
            or emap.shifted
            or (triggered and result[0] == "dim")
        ):
            raise GraphError(
                f"{where}: phase {spec!r} must be an int or a map from the "
                f"{len(grid)} grid dimensions to one of them (e.g. 'lij->l')"
                + ("; a triggered task's phase must be an int" if triggered else "")
            )
        return result

    @staticmethod
    def _check_triggered_prefetch(function: DeviceFunction, where: str) -> None:
        """A triggered instance may run its prefetch twice (a guessed, then
        the found coordinate: ``docs/scheduling.md``); the static schedule
        drains ``cp.async`` copies in between, so a prefetch that fills shared
        memory may use nothing else (bulk copies, mbarriers)."""
        if not getattr(function, "prefetch_fills_shared", False):
            return
        text = function.source.split(f"func.func @{function.prefetch}(", 1)[-1]
        if "cp.async.bulk" in text or "mbarrier" in text:
            raise GraphError(
                f"{where}: tile '{function.name}' has a prefetch that fills shared memory "
                "with bulk copies or mbarriers; a triggered task may run it twice and can "
                "only drain cp.async copies in between"
            )

    def _trigger(self, spec: Any, grid: tuple[Size, ...], where: str) -> Trigger | None:
        if spec is None:
            return None
        try:
            event, indptr = spec
        except (TypeError, ValueError):
            raise GraphError(
                f"{where}: triggered_by must be an (event, indptr tensor) pair, got {spec!r}"
            ) from None
        if not isinstance(event, Event) or event.graph is not self:
            raise GraphError(f"{where}: triggered_by event {event!r} is not an event of this graph")
        if not isinstance(indptr, Tensor) or indptr.graph is not self:
            raise GraphError(
                f"{where}: triggered_by indptr {indptr!r} is not a tensor of this graph"
            )
        if event.rank != 1:
            raise GraphError(
                f"{where}: trigger event '{event.name}' must be 1-D, got shape "
                f"{_fmt_shape(event.shape)}"
            )
        if indptr.rank != 1 or not indptr.dtype.is_integer:
            raise GraphError(
                f"{where}: indptr '{indptr.name}' must be a 1-D integer tensor, got "
                f"{indptr.mlir_type}"
            )
        if len(grid) != 1:
            raise GraphError(
                f"{where}: a triggered task needs a 1-D grid (a bound on indptr[C]), got "
                f"{_fmt_shape(grid)}"
            )
        extent = SymExpr._lift(event.shape[0]) + 1
        diff = as_size(SymExpr._lift(indptr.shape[0]) - extent)
        if isinstance(diff, int) and diff < 0:
            raise GraphError(
                f"{where}: indptr '{indptr.name}' of shape {_fmt_shape(indptr.shape)} is "
                f"shorter than the {as_size(extent)} entries event '{event.name}' needs"
            )
        return Trigger(event, indptr)

    def _args(self, args: Any, where: str) -> tuple[Tensor | Symbol, ...]:
        if isinstance(args, (Tensor, Symbol)):
            args = (args,)
        if not isinstance(args, Iterable) or isinstance(args, (str, Mapping)):
            raise GraphError(
                f"{where}: args must be a sequence of tensors and symbols, got {args!r}"
            )
        out: list[Tensor | Symbol] = []
        for k, a in enumerate(args):
            if not isinstance(a, (Tensor, Symbol)):
                raise GraphError(
                    f"{where}: argument #{k} ({a!r}) is not a Tensor or a Symbol of the graph"
                )
            if a.graph is not self:
                kind = "tensor" if isinstance(a, Tensor) else "symbol"
                raise self._foreign(where, f"{kind} '{a.name}'", a.graph)
            out.append(a)
        return tuple(out)

    def _check_signature(
        self,
        fn: DeviceFunction,
        grid: tuple[Size, ...],
        args: tuple[Tensor | Symbol, ...],
        where: str,
        triggered: bool = False,
    ) -> None:
        expected = len(grid) + len(args)
        if len(fn.params) != expected:
            what = (
                f"a rank-{len(grid)} grid {_fmt_shape(grid)}"
                if not triggered
                else f"a triggered task's coordinates (i, c) {_fmt_shape(grid)}"
            )
            raise GraphError(
                f"{where}: device function '{fn.name}' takes {len(fn.params)} "
                f"arguments, but {what} and {len(args)} buffers pass {expected}"
            )
        for k in range(len(grid)):
            if normalize_type(fn.params[k]) != "index":
                raise GraphError(
                    f"{where}: argument #{k} of device function '{fn.name}' is grid "
                    f"coordinate {k} and must be index, got {fn.params[k]}"
                )
        for k, t in enumerate(args):
            declared = fn.params[len(grid) + k]
            if isinstance(t, Symbol):
                if normalize_type(declared) != "index":
                    raise GraphError(
                        f"{where}: argument #{k} is symbol '{t.name}' (an index), but "
                        f"device function '{fn.name}' expects {declared}"
                    )
                continue
            if not _generalises(declared, t.mlir_type):
                raise GraphError(
                    f"{where}: buffer #{k} is tensor '{t.name}' of type "
                    f"{t.mlir_type}, but device function '{fn.name}' expects {declared}"
                )
        _check_tensor_maps(fn, args, where)

    def _edges(self, edges: Any, kind: str, grid: tuple[Size, ...], where: str) -> tuple[Edge, ...]:
        if edges is None:
            return ()
        if isinstance(edges, str) or not isinstance(edges, Iterable):
            raise GraphError(
                f"{where}: {kind}_edges must map events to edge maps ({{event: 'ij->i'}}), "
                f"got {edges!r}"
            )
        pairs = edges.items() if isinstance(edges, Mapping) else edges
        out: list[Edge] = []
        for pair in pairs:
            try:
                event, spec = pair
            except (TypeError, ValueError):
                raise GraphError(
                    f"{where}: {kind}-edges must map events to maps, got {pair!r}"
                ) from None
            if not isinstance(event, Event):
                raise GraphError(f"{where}: {kind}-edge key {event!r} is not an Event")
            if event.graph is not self:
                raise self._foreign(where, f"event '{event.name}'", event.graph)
            try:
                emap = parse_edge_map(spec)
            except GraphError as exc:
                raise GraphError(f"{where}: {kind}-edge on event '{event.name}': {exc}") from None
            self._check_map(emap, kind, event, grid, where)
            out.append(Edge(event, emap))
        return tuple(out)

    def _check_map(
        self, emap: EdgeMap, kind: str, event: Event, grid: tuple[Size, ...], where: str
    ) -> None:
        head = f"{where}: {kind}-edge map '{emap}' on event '{event.name}'"
        if emap.n_dims != len(grid):
            raise GraphError(
                f"{head} has {emap.n_dims} dims but the grid {_fmt_shape(grid)} has "
                f"rank {len(grid)}"
            )
        if emap.n_results != event.rank:
            raise GraphError(
                f"{head} has {emap.n_results} results but the event has rank "
                f"{event.rank} (shape {_fmt_shape(event.shape)})"
            )
        if emap.uses_rank and self.rank is None:
            raise GraphError(
                f"{head} names the rank, but graph '{self.name}' does not span ranks "
                "(call graph.ranks() first)"
            )
        if kind == "in" and event.ranked and emap.results[0] != ("rank", 0):
            raise GraphError(
                f"{head} must address dimension 0 of the ranked event with 'rank' "
                f"(e.g. 'i->rank,i'): a rank waits on its own copy of the counters"
            )
        if kind == "in" and emap.shifted:
            raise GraphError(
                f"{head} shifts a coordinate; only out-edges may ('(l, i) -> (l + 1)' "
                "notifies the next layer): a consumer's in-edges must be projections"
            )
        for r, (kind_r, v) in enumerate(emap.results):
            extent = event.shape[r]
            if kind_r == "rank":
                continue
            if kind_r == "const":
                if isinstance(extent, int) and v >= extent:
                    raise GraphError(
                        f"{head} addresses coordinate {v} outside event dimension {r} "
                        f"(extent {extent})"
                    )
                continue
            # A grid dimension longer than its event dimension would address
            # coordinates past the end; report it when it is known statically.
            off = emap.offsets[r]
            diff = as_size(SymExpr._lift(grid[v]) + off - extent)
            if isinstance(diff, int) and diff > 0:
                shifted = f" shifted by {off}" if off else ""
                raise GraphError(
                    f"{head} sends grid dimension {v} (extent {grid[v]}){shifted} past "
                    f"event dimension {r} (extent {extent})"
                )

    # ------------------------------------------------------------------
    # Whole-graph rules
    # ------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        """Threads per CTA: the graph's, else the largest of its functions' (256)."""
        if self._block_size is not None:
            return self._block_size
        return max((t.function.block_size for t in self.tasks), default=256)

    @property
    def functions(self) -> list[DeviceFunction]:
        """The distinct device functions, in first-use order."""
        return list(self._functions.values())

    def producers(self, event: Event) -> list[tuple[Task, Edge]]:
        """Tasks notifying ``event``, with the edge they notify it through."""
        return [(t, e) for t in self.tasks for e in t.out_edges if e.event is event]

    def consumers(self, event: Event) -> list[tuple[Task, Edge]]:
        """Tasks waiting on ``event``, with the edge they wait through."""
        return [(t, e) for t in self.tasks for e in t.in_edges if e.event is event]

    def triggered(self, event: Event) -> list[Task]:
        """Tasks that ``event`` triggers (``triggered_by``)."""
        return [t for t in self.tasks if t.trigger is not None and t.trigger.event is event]

    def guarded_indptr(self, task: Task) -> bool:
        """Whether ``task``'s in-edges order every write of its trigger table
        before its instances, so the table is final once they are satisfied
        (the ``guarded_indptr`` assertion the static schedule reads the table
        once per CTA under; ``docs/scheduling.md``).

        Proven from the edges alone, conservatively. The possible writers
        are the other tasks that take the table, less those that run only
        after a coordinate of the trigger event completed (tasks it triggers,
        tasks waiting on it, and everything after them or after ``task``):
        by the trigger's contract the table is final by then. Each writer
        must notify, from each of its instances, a constant coordinate
        ``c0`` of an event that ``task`` waits on at ``c0``, where the event's
        count (not a table) equals the notifications ``c0`` receives, so that
        waiting for it waits for every writer instance. A table no task
        writes is final at launch."""
        if task.trigger is None:
            return False
        table, trigger = task.trigger.indptr, task.trigger.event
        _, succs = self._dependencies()
        later: set[int] = set()
        frontier = [task.index]
        frontier += [t.index for t in self.triggered(trigger)]
        frontier += [t.index for t, _ in self.consumers(trigger)]
        while frontier:
            i = frontier.pop()
            if i not in later:
                later.add(i)
                frontier.extend(succs[i])

        def writes(t: Task) -> bool:
            return t.index not in later and any(a is table for a in t.args)

        return all(
            any(self._waits_for_all(task, edge, writer) for edge in task.in_edges)
            for writer in filter(writes, self.tasks)
        )

    def _waits_for_all(self, task: Task, edge: Edge, writer: Task) -> bool:
        """Whether ``task``'s in-edge ``edge`` completes only after every
        instance of ``writer`` has notified (see :meth:`guarded_indptr`)."""
        event, results = edge.event, edge.map.results
        if event.ranked or isinstance(event.wait_count, Tensor):
            return False
        if not all(kind == "const" for kind, _ in results):
            return False
        target = tuple(v for _, v in results)
        notifications: SymExpr = SymExpr.constant(0)
        writer_notifies = False
        for producer, out in self.producers(event):
            if not all(kind == "const" for kind, _ in out.map.results):
                return False  # may reach the target coordinate: not counted
            if tuple(v for _, v in out.map.results) != target:
                continue
            if producer.trigger is not None:
                return False  # a data-dependent number of its instances run
            notifications = notifications + math.prod(producer.grid, start=SymExpr.constant(1))
            writer_notifies = writer_notifies or producer is writer
        return writer_notifies and notifications == event.wait_count

    def _dependencies(self) -> tuple[list[list[int]], list[list[int]]]:
        # Same construction as the compiler's TaskGraph: events in declaration
        # order, producer x consumer pairs, duplicates dropped. A shifted
        # out-edge ("(l, i) -> (l + 1)") is loop-carried: it feeds a later
        # phase and does not order the tasks (see Graph.task's ``phase``).
        preds: list[list[int]] = [[] for _ in self.tasks]
        succs: list[list[int]] = [[] for _ in self.tasks]
        for event in self.events:
            producers = [t.index for t, e in self.producers(event) if not e.map.shifted]
            consumers = [t.index for t, _ in self.consumers(event)]
            consumers += [t.index for t in self.triggered(event)]
            for p in producers:
                for c in consumers:
                    if c not in succs[p]:
                        succs[p].append(c)
                    if p not in preds[c]:
                        preds[c].append(p)
        return preds, succs

    def _kahn(self) -> tuple[list[int], list[list[int]]]:
        preds, succs = self._dependencies()
        in_degree = [len(p) for p in preds]
        done = [False] * len(self.tasks)
        order: list[int] = []
        while len(order) < len(self.tasks):
            ready = [t for t in range(len(self.tasks)) if not done[t] and in_degree[t] == 0]
            if not ready:
                break
            nxt = ready[0]  # lowest insertion index among the ready tasks
            done[nxt] = True
            order.append(nxt)
            for s in succs[nxt]:
                in_degree[s] -= 1
        return order, preds

    def topological_tasks(self) -> list[Task]:
        """Tasks in the compiler's numbering order.

        Kahn's algorithm over task dependencies (a task depends on every task
        notifying an event it waits on), always taking the ready task with
        the lowest insertion index. Position in this list = task number in
        ``etensor.dispatch`` and in the static queues. Raises GraphError on a
        cycle.
        """
        order, _ = self._kahn()
        if len(order) != len(self.tasks):
            self._raise_cycle()
        return [self.tasks[i] for i in order]

    def _raise_cycle(self) -> NoReturn:
        order, preds = self._kahn()
        done = set(order)
        current = next(t for t in range(len(self.tasks)) if t not in done)
        path: list[int] = []
        position: dict[int, int] = {}
        # Walk predecessors among the unfinished tasks until one repeats.
        while current not in position:
            position[current] = len(path)
            path.append(current)
            current = next(p for p in preds[current] if p not in done)
        cycle = list(reversed(path[position[current] :]))
        names = [self.tasks[t].name for t in cycle]
        chain = " -> ".join(f"'{n}'" for n in [*names, names[0]])
        members = {self.tasks[t].name for t in cycle}
        events = sorted(
            {
                e.event.name
                for t in cycle
                for e in self.tasks[t].in_edges
                if any(p.name in members for p, _ in self.producers(e.event))
            }
        )
        raise GraphError(
            f"graph '{self.name}': tasks {chain} form a dependency cycle "
            f"(through event{'s' if len(events) != 1 else ''} "
            f"{', '.join(repr(e) for e in events)})"
        )

    def validate(self) -> list[str]:
        """Check whole-graph rules; raise GraphError on the first violation.

        Returns notes about wait counts that cannot be checked before launch
        (data-dependent counts are not noted). Nothing is printed.
        """
        self.topological_tasks()
        notes: list[str] = []
        for event in self.events:
            producers = self.producers(event)
            consumers = self.consumers(event)
            consumers += [(t, None) for t in self.triggered(event)]
            if not producers and not consumers:
                raise GraphError(f"event '{event.name}' is neither notified nor awaited")
            if not producers and event.wait_count == 0:
                continue  # complete from the start
            if not producers:
                raise GraphError(
                    f"event '{event.name}' is awaited (by task '{consumers[0][0].name}') "
                    "but never notified"
                )
            if not consumers:
                raise GraphError(
                    f"event '{event.name}' is notified (by task '{producers[0][0].name}') "
                    "but never awaited"
                )
            note = self._check_wait_count(event, producers)
            if note:
                notes.append(note)
        return notes

    def _check_wait_count(self, event: Event, producers: list[tuple[Task, Edge]]) -> str | None:
        if isinstance(event.wait_count, Tensor):
            return None  # data-dependent: only known at launch
        for task, _ in producers:
            if task.trigger is not None:
                raise GraphError(
                    f"event '{event.name}' is notified by task '{task.name}', which has a "
                    "data-dependent trigger and so runs a data-dependent number of "
                    "instances: its wait count must be a table (an integer Tensor)"
                )
        count = event.wait_count
        if any(e.map.uses_rank for _, e in producers):
            return (
                f"event '{event.name}': its fan-in depends on the rank (a producer map "
                f"names it); wait count {count} is checked in the simulator and at launch"
            )
        fan_in, reason = _uniform_fan_in(event, producers)
        if fan_in is not None and event.ranked:
            # Every rank runs every producer instance.
            fan_in = fan_in * self.num_ranks
        detail = "; ".join(f"task '{t.name}' through '{e.map}'" for t, e in producers)
        if fan_in is not None:
            if SymExpr._lift(count) == fan_in:
                return None
            ranks = " from all ranks together" if event.ranked else ""
            raise GraphError(
                f"event '{event.name}': wait count {count} differs from its fan-in "
                f"{as_size(fan_in)}{ranks} (notified by {detail})"
            )
        if isinstance(count, int) and not event.ranked:
            counts = _enumerate_fan_in(event, producers)
            if counts is not None:
                for coord, received in counts.items():
                    if received != count:
                        raise GraphError(
                            f"event '{event.name}': coordinate {coord} receives "
                            f"{received} notifications but its wait count is {count} "
                            f"(notified by {detail})"
                        )
                return None
        return (
            f"event '{event.name}': the fan-in cannot be computed before launch "
            f"({reason}); wait count {count} is not checked"
        )

    # ------------------------------------------------------------------
    # MLIR
    # ------------------------------------------------------------------
    def to_mlir(self) -> str:
        """The graph as MLIR text: its device functions and one ``etensor.graph``."""
        self.validate()
        return _Emitter(self).emit()

    # ------------------------------------------------------------------
    # Graphviz
    # ------------------------------------------------------------------
    def to_dot(self) -> str:
        """The task graph in Graphviz DOT, for ``dot -Tsvg``.

        Tasks are boxes (name and grid), events ellipses (name, shape and
        wait count); an edge runs from each producer to its event and from the
        event to each consumer, labelled with its map. Tasks of one
        topological level share a rank. The graph is not validated, so a
        graph with a cycle can be drawn too (its cyclic tasks go last,
        unranked).
        """
        order, preds = self._kahn()
        level: dict[int, int] = {}
        for t in order:
            level[t] = max((level[p] + 1 for p in preds[t]), default=0)
        cyclic = [t for t in range(len(self.tasks)) if t not in level]
        lines = [
            f"digraph {_dot_string(self.name)} {{",
            "  rankdir=TB;",
            '  node [fontname="Helvetica"];',
            '  edge [fontname="Helvetica", fontsize=10];',
        ]
        for t in [*order, *cyclic]:
            task = self.tasks[t]
            label = f"{task.name}\ngrid {_fmt_shape(task.grid)}"
            lines.append(f"  t{t} [shape=box, label={_dot_string(label)}];")
        for e in self.events:
            count = e.wait_count
            wait = f"from {count.name}" if isinstance(count, Tensor) else str(count)
            label = f"{e.name}\nshape {_fmt_shape(e.shape)}\nwait {wait}"
            lines.append(f"  e{e.index} [shape=ellipse, label={_dot_string(label)}];")
        for t in [*order, *cyclic]:
            task = self.tasks[t]
            for edge in task.in_edges:
                label = _dot_string(str(edge.map))
                lines.append(f"  e{edge.event.index} -> t{t} [label={label}];")
            for edge in task.out_edges:
                label = _dot_string(str(edge.map))
                lines.append(f"  t{t} -> e{edge.event.index} [label={label}];")
            if task.trigger is not None:
                label = _dot_string(f"triggers [{task.trigger.indptr.name}[c], ...)")
                lines.append(
                    f"  e{task.trigger.event.index} -> t{t} [style=dashed, label={label}];"
                )
        for rank in range(max(level.values(), default=-1) + 1):
            same = " ".join(f"t{t};" for t in order if level[t] == rank)
            lines.append(f"  {{ rank=same; {same} }}")
        lines.append("}")
        return "\n".join(lines) + "\n"


def map_spec(entry: tuple) -> tuple[int, tuple[int, int], int]:
    """A ``DeviceFunction.tensor_maps`` entry as ``(source, box, chunk)``."""
    src, box, *chunk = entry
    return src, tuple(box), int(chunk[0]) if chunk else 0


def _check_tensor_maps(fn: DeviceFunction, args: tuple[Tensor | Symbol, ...], where: str) -> None:
    """Buffer ``k`` of a tile that copies through TMA is the map it declares
    in ``fn.tensor_maps[k] = (source buffer, box)``, and only there."""
    wanted = fn.tensor_maps
    for k, t in enumerate(args):
        if not isinstance(t, Tensor):
            continue
        if k not in wanted:
            if t.map_of is not None:
                raise GraphError(
                    f"{where}: buffer #{k} is tensor map '{t.name}', but device function "
                    f"'{fn.name}' does not read buffer #{k} through TMA"
                )
            continue
        src, box, chunk = map_spec(wanted[k])
        source = args[src] if 0 <= src < len(args) else None
        if t.map_of is None or t.map_of is not source or t.map_box != box or t.map_chunk != chunk:
            want = getattr(source, "name", f"buffer #{src}")
            chunked = f", chunk={chunk}" if chunk else ""
            raise GraphError(
                f"{where}: buffer #{k} of device function '{fn.name}' must be "
                f"graph.tensor_map({want}, box={box}{chunked}), got tensor '{t.name}'"
                + (
                    f" (the map of '{t.map_of.name}' with box {t.map_box})"
                    if t.map_of is not None
                    else ""
                )
            )


def _memref_dims(text: str) -> tuple[list[str], str] | None:
    """(sizes, element type) of a plain ``memref<4x?xf32>``, else None."""
    match = re.fullmatch(r"memref<((?:(?:\d+|\?)x)*)([a-z]\w*)>", text)
    if match is None:
        return None
    return match.group(1).split("x")[:-1], match.group(2)


def _generalises(declared: str, actual: str) -> bool:
    """Whether a tensor of type ``actual`` may be passed for a parameter of
    type ``declared``: equal, or a memref that only fixes some of the
    parameter's dynamic sizes (the kernel casts it; etensor.task's rule)."""
    declared, actual = normalize_type(declared), normalize_type(actual)
    if declared == actual:
        return True
    d, a = _memref_dims(declared), _memref_dims(actual)
    if d is None or a is None or d[1] != a[1] or len(d[0]) != len(a[0]):
        return False
    return all(x in ("?", y) for x, y in zip(d[0], a[0], strict=True))


# ----------------------------------------------------------------------
# Fan-in analysis (mirrors etensor-verify-graph)
# ----------------------------------------------------------------------
def _uniform_fan_in(event: Event, producers: list[tuple[Task, Edge]]) -> tuple[SymExpr | None, str]:
    """Notifications per coordinate when every coordinate receives the same
    number: each producer map's results are distinct grid dims with the
    event's extents (or constants into extent-1 dims), and each producer adds
    the product of the extents of the grid dims its map drops."""
    total = SymExpr.constant(0)
    for task, edge in producers:
        if edge.map.shifted:
            return None, f"task '{task.name}': map '{edge.map}' shifts a coordinate"
        used: set[int] = set()
        for r, (kind, v) in enumerate(edge.map.results):
            extent = event.shape[r]
            if kind == "dim":
                if v in used:
                    return None, (
                        f"task '{task.name}': a grid dimension feeds two event dimensions"
                    )
                used.add(v)
                if SymExpr._lift(task.grid[v]) != extent:
                    return None, (
                        f"task '{task.name}': grid dimension {v} ({task.grid[v]}) and "
                        f"event dimension {r} ({extent}) have different extents"
                    )
            elif extent != 1:
                return None, (
                    f"task '{task.name}': map '{edge.map}' sends a constant into "
                    f"dimension {r} of extent {extent}"
                )
        part = SymExpr.constant(1)
        for d, extent in enumerate(task.grid):
            if d not in used:
                part = part * extent
        total = total + part
    return total, ""


def _enumerate_fan_in(
    event: Event, producers: list[tuple[Task, Edge]]
) -> dict[tuple[int, ...], int] | None:
    """Notifications per coordinate by enumeration, for static shapes only."""
    import itertools
    import math

    if not all(isinstance(d, int) for d in event.shape):
        return None
    shape = [int(d) for d in event.shape]
    if math.prod(shape) > _MAX_ENUMERATED:
        return None
    counts = {c: 0 for c in itertools.product(*(range(d) for d in shape))}
    for task, edge in producers:
        if not all(isinstance(d, int) for d in task.grid):
            return None
        if math.prod(int(d) for d in task.grid) > _MAX_ENUMERATED:
            return None
        for point in itertools.product(*(range(int(d)) for d in task.grid)):
            coord = edge.map.apply(point)
            if coord not in counts:
                raise GraphError(
                    f"task '{task.name}': out-edge map '{edge.map}' sends grid point "
                    f"{point} to {coord}, outside event '{event.name}' of shape "
                    f"{_fmt_shape(event.shape)}"
                )
            counts[coord] += 1
    return counts


# ----------------------------------------------------------------------
# MLIR emission
# ----------------------------------------------------------------------
def _mlir_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\' or not ch.isprintable() or ord(ch) > 126:
            out.extend(f"\\{b:02X}" for b in ch.encode("utf-8"))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _dot_string(text: str) -> str:
    """A quoted DOT string; a newline in ``text`` breaks the label's line."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped + '"'


def _symbol_ref(name: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$.]*", name):
        return "@" + name
    return "@" + _mlir_string(name)


class _Emitter:
    """Builds the MLIR text; SSA names come from user names where possible."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.used: set[str] = set()
        self.body: list[str] = []
        self.values: dict[Any, str] = {}  # SymExpr / atom key -> SSA name
        self.constants: dict[int, str] = {}
        self.counter = 0

    def fresh(self, hint: str, fallback: str) -> str:
        base = hint if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", hint) else fallback
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return "%" + name

    def const(self, value: int) -> str:
        if value not in self.constants:
            ssa = self.fresh(f"c{value}" if value >= 0 else f"c_m{-value}", "c")
            self.body.append(f"{ssa} = arith.constant {value} : index")
            self.constants[value] = ssa
        return self.constants[value]

    def size(self, value: Size) -> str:
        """An SSA value (or integer literal text) holding ``value``."""
        if isinstance(value, int):
            return self.const(value)
        return self.expr(value)

    def expr(self, expr: SymExpr) -> str:
        constant = expr.as_int()
        if constant is not None:
            return self.const(constant)
        key = ("expr", expr._key())
        if key in self.values:
            return self.values[key]
        acc: str | None = None
        for factors, coeff in expr.terms():
            if not factors:
                term = self.const(coeff)
            else:
                term = None
                for atom, power in factors:
                    for _ in range(power):
                        v = self.atom(atom)
                        term = v if term is None else self.op("muli", term, v)
                assert term is not None
                if coeff != 1:
                    term = self.op("muli", term, self.const(coeff))
            acc = term if acc is None else self.op("addi", acc, term)
        assert acc is not None
        self.values[key] = acc
        return acc

    def atom(self, atom: Any) -> str:
        from .symbolic import _DivAtom, _SymbolAtom

        if isinstance(atom, _SymbolAtom):
            return self.values[("sym", id(atom.symbol))]
        assert isinstance(atom, _DivAtom)
        key = ("atom", atom.key)
        if key not in self.values:
            inner = self.expr(atom.inner)
            c = self.const(atom.divisor)
            q = self.op("floordivsi", inner, c)
            if atom.op == "//":
                self.values[key] = q
            else:
                # Python's % (non-negative for a positive divisor): x - (x // c) * c.
                self.values[key] = self.op("subi", inner, self.op("muli", q, c))
        return self.values[key]

    def op(self, name: str, lhs: str, rhs: str) -> str:
        ssa = self.fresh(f"v{self.counter}", "v")
        self.counter += 1
        self.body.append(f"{ssa} = arith.{name} {lhs}, {rhs} : index")
        return ssa

    def emit(self) -> str:
        g = self.g
        params: list[str] = []
        for sym in g.symbols:
            ssa = self.fresh(sym.name, f"arg{len(params)}")
            self.values[("sym", id(sym))] = ssa
            params.append(f"{ssa}: index")
        tensor_ssa: dict[int, str] = {}
        for t in g.tensors:
            ssa = self.fresh(t.name, f"arg{len(params)}")
            tensor_ssa[id(t)] = ssa
            params.append(f"{ssa}: {t.mlir_type}")

        event_ssa: dict[int, str] = {}
        for e in g.events:
            sizes = [self.size(d) for d in e.shape if isinstance(d, SymExpr)]
            if isinstance(e.wait_count, Tensor):
                t = e.wait_count
                count = f"from {tensor_ssa[id(t)]} : {t.mlir_type}"
            elif isinstance(e.wait_count, SymExpr):
                count = self.expr(e.wait_count)
            else:
                count = str(e.wait_count)
            ssa = self.fresh(e.name, f"e{e.index}")
            event_ssa[id(e)] = ssa
            ranked = " ranked" if e.ranked else ""
            self.body.append(
                f"{ssa} = etensor.event({', '.join(sizes)}) count {count}{ranked} "
                f"{{name = {_mlir_string(e.name)}}} : {e.mlir_type}"
            )

        for t in g.tasks:
            grid = ", ".join(str(d) if isinstance(d, int) else self.size(d) for d in t.grid)
            line = f"etensor.task {_symbol_ref(t.function.name)} grid [{grid}]"
            if t.uses_rank:
                assert g.rank is not None
                line += f" rank({self.values[('sym', id(g.rank))]})"
            if t.args:
                names = ", ".join(
                    self.values[("sym", id(a))] if isinstance(a, Symbol) else tensor_ssa[id(a)]
                    for a in t.args
                )
                types = ", ".join("index" if isinstance(a, Symbol) else a.mlir_type for a in t.args)
                line += f" args({names} : {types})"
            for keyword, edges in (("ins", t.in_edges), ("outs", t.out_edges)):
                if edges:
                    items = ", ".join(
                        f"{event_ssa[id(e.event)]}[{e.map.to_mlir()}] : {e.event.mlir_type}"
                        for e in edges
                    )
                    line += f" {keyword}({items})"
            if t.trigger is not None:
                trig = t.trigger
                line += (
                    f" triggered_by({event_ssa[id(trig.event)]}, {tensor_ssa[id(trig.indptr)]} : "
                    f"{trig.event.mlir_type}, {trig.indptr.mlir_type})"
                )
            prefetch = t.function.prefetch
            extra = f", prefetch = {_symbol_ref(prefetch)}" if prefetch else ""
            if t.prefetch_after:
                extra += f", prefetch_after = {t.prefetch_after} : i64"
            if t.shared_region:
                extra += f", shared_region = {t.shared_region} : i64"
            if g.guarded_indptr(t):
                extra += ", guarded_indptr"
            if t.deal == "ticket":
                extra += ", ticketed"
            if t.deal == "pool":
                extra += ", pooled"
                if t.phase[0] == "dim":
                    extra += f", pool_dim = {t.phase[1]} : i64"
            line += f" {{name = {_mlir_string(t.name)}{extra}}}"
            self.body.append(line)

        out: list[str] = []
        seen_sources: set[str] = set()
        for fn in g.functions:
            if fn.source not in seen_sources:
                seen_sources.add(fn.source)
                out.append(fn.source.rstrip() + "\n")
        header = (
            f"etensor.graph {_symbol_ref(g.name)}({', '.join(params)}) "
            f"attributes {{etensor.block_size = {g.block_size} : i64}} {{"
        )
        out.append("\n".join([header, *("  " + line for line in self.body), "}"]) + "\n")
        return "\n".join(out)

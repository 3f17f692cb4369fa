"""Compile a :class:`~etc.graph.Graph` to a persistent-kernel artifact.

Stages, each a textual pipeline run on the MLIR bindings (so any failure can
be replayed with ``etc-opt``):

1. ``etensor-verify-graph, etensor-static-schedule`` on a copy, to read the
   task numbering the compiler chose (a topological order);
2. the registered ``etc-static-to-ptx`` pipeline, which ends in a
   ``gpu.binary`` holding PTX (the conversion leaves each kernel's dynamic
   shared memory on the host module for the manifest);
3. ``ptxas`` (when the CUDA toolkit is on the machine) for a cubin.

The result is an :class:`Artifact`: PTX, optional cubin and a JSON manifest
that :mod:`etc.runtime` reads without the compiler.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._fields import is_int
from .errors import CompileError
from .graph import Graph, Tensor
from .runtime.queue import SM_DEALS

__all__ = ["Artifact", "compile", "MANIFEST_FORMAT", "STATUS_WORDS"]

MANIFEST_FORMAT = "etc-artifact/5"
#: The format of a manifest with a chunked tensor map (``Graph.tensor_map(chunk=)``),
#: which a format-5 runtime would encode as a row-major one.
MANIFEST_FORMAT_CHUNKED = "etc-artifact/6"
#: The format of a manifest with a clustered task (``etc.DeviceFunction.cluster``),
#: which an older runtime would launch without clusters.
MANIFEST_FORMAT_CLUSTERED = "etc-artifact/7"
# Words of the status record the kernel writes (see ConvertETensorToGPU).
STATUS_WORDS = 8
DEFAULT_WATCHDOG_POLLS = 20_000_000
SCHEDULES = ("static", "dynamic")
TARGETS = ("sm_90", "sm_90a")
#: Threads one SM holds at once on the targets (sm_90).
SM_THREADS = 2048


@dataclass
class Artifact:
    """A compiled megakernel: PTX, optional cubin, and its manifest.

    ``warnings``: the passes' warnings (e.g. a dynamic-schedule fan-out that
    costs one dependent atomic per instance); ``etc compile`` prints them."""

    manifest: dict[str, Any]
    ptx: str
    cubin: bytes | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def kernel_name(self) -> str:
        return self.manifest["kernel"]

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``manifest.json``, ``kernel.ptx`` and ``kernel.cubin``. Saving
        over an earlier artifact replaces it: a bucket table left there
        (``buckets.json``, which :func:`etc.runtime.load` reads first) or a
        cubin this artifact lacks is removed, so the directory never loads
        the old kernels."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("buckets.json", "kernel.cubin"):  # the cubin is written again below
            (out / stale).unlink(missing_ok=True)
        manifest = dict(self.manifest)
        ptx_bytes = self.ptx.encode()
        (out / "kernel.ptx").write_bytes(ptx_bytes)
        digests = {"kernel.ptx": hashlib.sha256(ptx_bytes).hexdigest()}
        manifest["ptx"] = "kernel.ptx"
        manifest["cubin"] = None
        if self.cubin is not None:
            (out / "kernel.cubin").write_bytes(self.cubin)
            digests["kernel.cubin"] = hashlib.sha256(self.cubin).hexdigest()
            manifest["cubin"] = "kernel.cubin"
        manifest["sha256"] = digests
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        return out

    def load(self, directory: str | os.PathLike[str] | None = None, **options: Any):
        """Save (to a temporary directory unless given) and load for launching;
        ``options`` are :func:`etc.runtime.load`'s (``device``, ``max_polls``,
        ``timeout``)."""
        from . import runtime

        target = directory or tempfile.mkdtemp(prefix=f"etc-{self.kernel_name}-")
        return runtime.load(self.save(target), **options)


def _size(value: Any) -> int | str:
    """A manifest size: an int, or the text of a symbol expression."""
    return value if isinstance(value, int) else str(value)


def _wait_count(value: Any) -> int | str | dict[str, str]:
    if isinstance(value, Tensor):
        return {"table": value.name}
    return _size(value)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _pipeline_options(
    chip: str,
    block_size: int,
    watchdog_polls: int,
    opt_level: int,
    early_push: bool,
    trace: bool,
    min_ctas_per_sm: int = 0,
    max_pop_chunk: int = 8,
    prefetch_next: bool = False,
    pop_ahead: bool = True,
    outline: tuple[str, ...] = (),
    sm_slices: bool = False,
    record_sm: bool = False,
    queue_ahead: bool = False,
    wait_memo: bool = False,
    check_counts: bool = True,
    convergent_reductions: bool = False,
) -> str:
    # PTX 8.1: vector `red` (the MoE down tile's atomic combine); 7.8 is sm_90's least.
    return (
        f"chip={chip} features=+ptx81 opt-level={opt_level} format=isa "
        f"block-size={block_size} watchdog-polls={watchdog_polls} "
        f"early-push={_flag(early_push)} trace={_flag(trace)} "
        f"min-ctas-per-sm={min_ctas_per_sm} max-pop-chunk={max_pop_chunk} "
        f"prefetch-next={_flag(prefetch_next)} pop-ahead={_flag(pop_ahead)} "
        f"sm-slices={_flag(sm_slices)} record-sm={_flag(record_sm)} "
        f"queue-ahead={_flag(queue_ahead)} wait-memo={_flag(wait_memo)} "
        f"check-table-counts={_flag(check_counts)} "
        f"convergent-reductions={_flag(convergent_reductions)}"
        + (f" outline={','.join(outline)}" if outline else "")
    )


def _reproducer(text: str, pipeline: str, diagnostics: str) -> CompileError:
    """Writes the failing input and returns an error naming the etc-opt command."""
    directory = os.environ.get("ETC_REPRODUCER_PATH") or tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="etc-repro-", suffix=".mlir", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return CompileError(
        f"{diagnostics}\nreproduce with:\n  etc-opt --pass-pipeline='{pipeline}' "
        f"-mlir-print-ir-after-failure {path}"
    )


def _run(ir: Any, text: str, module: Any, pipeline: str, errors: list[str] | None = None) -> None:
    """Runs ``pipeline`` on ``module``. ``errors``: the error diagnostics
    the context's handler collects (:func:`_diagnostics`): a pass that
    reports an error but does not fail is a CompileError too (the bindings
    would otherwise abort the process)."""
    from .passmanager import PassManager

    if errors is not None:
        errors.clear()
    try:
        PassManager.parse(pipeline, context=module.context).run(module.operation)
    except ir.MLIRError as e:
        raise _reproducer(text, pipeline, "\n".join([_format(e), *(errors or [])])) from None
    if errors:
        raise _reproducer(
            text, pipeline, "a pass reported errors without failing:\n" + "\n".join(errors)
        )


@contextlib.contextmanager
def _diagnostics(ir: Any) -> Iterator[tuple[list[str], list[str]]]:
    """A current MLIR context whose diagnostics go to the lists it yields
    (warnings, errors), never to stderr. Errors reach the handler
    (``emit_error_diagnostics``) instead of the bindings' capture, which
    aborts the process when a pass reports an error but succeeds (an
    upstream conversion does, for one): :func:`_run` raises them."""
    warnings: list[str] = []
    errors: list[str] = []
    with ir.Context() as ctx:
        ctx.emit_error_diagnostics = True

        def on_diagnostic(d: Any) -> bool:
            if d.severity == ir.DiagnosticSeverity.ERROR:
                errors.append(_diagnostic_text(d))
                return True
            if d.severity == ir.DiagnosticSeverity.WARNING:
                # The scheduling pass runs twice (schedule, then pipeline).
                text = f"{d.location}: {d.message}"
                if text not in warnings:
                    warnings.append(text)
                return True
            return False

        handler = ctx.attach_diagnostic_handler(on_diagnostic)
        try:
            yield warnings, errors
        finally:
            handler.detach()


def _diagnostic_text(d: Any) -> str:
    """An error diagnostic and its notes, one line each."""
    lines = [f"{d.location}: {d.message}"]
    lines.extend(f"  note: {note.location}: {note.message}" for note in d.notes)
    return "\n".join(lines)


def _format(error: Any) -> str:
    lines = [str(error.message) if hasattr(error, "message") else "MLIR error"]
    for diag in getattr(error, "error_diagnostics", []):
        lines.append(f"{diag.location}: {diag.message}")
        lines.extend(f"  note: {note.location}: {note.message}" for note in diag.notes)
    return "\n".join(lines)


@dataclass
class _Schedule:
    """What the scheduling pass decided, read back from its output."""

    tasks: list[str]  # task names by task number
    ready_at_start: set[str]  # dynamic: tasks whose instances are ready at launch
    events: list[str]  # every event, in declaration (counter layout) order


def _read_schedule(ir: Any, module: Any) -> _Schedule:
    order: dict[int, str] = {}
    ready: set[str] = set()
    events: list[str] = []

    def visit(op: Any) -> Any:
        if op.name == "etensor.dispatch":
            name = ir.StringAttr(op.attributes["name"]).value
            order[ir.IntegerAttr(op.attributes["task"]).value] = name
            if "etensor.ready_at_start" in op.attributes:
                ready.add(name)
        elif op.name == "etensor.event":
            events.append(ir.StringAttr(op.attributes["name"]).value)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return _Schedule([order[i] for i in sorted(order)], ready, events)


def _dynamic_shared_memory(ir: Any, module: Any, kernel: str) -> int:
    """Bytes of dynamic shared memory `kernel` needs (0: none), as
    convert-etensor-to-gpu records them on the host module."""
    attrs = module.operation.attributes
    if "etensor.dynamic_shared_memory" not in attrs:
        return 0
    table = ir.DictAttr(attrs["etensor.dynamic_shared_memory"])
    return ir.IntegerAttr(table[kernel]).value if kernel in table else 0


def _extract_ptx(ir: Any, module: Any) -> str:
    from .dialects import gpu

    for op in module.body.operations:
        if op.operation.name == "gpu.binary":
            objects = op.attributes["objects"]
            return gpu.ObjectAttr(objects[0]).object.decode()
    raise CompileError("the pipeline produced no gpu.binary")


def _assemble(ptx: str, chip: str, name: str) -> bytes | None:
    """ptxas the PTX into a cubin; None when the toolkit is not installed."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return None
    with tempfile.TemporaryDirectory(prefix="etc-ptxas-") as tmp:
        src, dst = Path(tmp, f"{name}.ptx"), Path(tmp, f"{name}.cubin")
        src.write_text(ptx)
        done = subprocess.run(
            [ptxas, f"-arch={chip}", "-O3", str(src), "-o", str(dst)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise CompileError(f"ptxas -arch={chip} rejected the PTX of '{name}':\n{done.stderr}")
        return dst.read_bytes()


def _check_loop_phases(g: Graph) -> None:
    """A loop-carried (shifted) edge feeds a later instance of an earlier
    task: in the task-major static order its consumer comes first and waits
    forever. Phases must order such graphs (the launch checks them exactly)."""
    if any(t.phase != ("const", 0) for t in g.tasks):
        return
    for task in g.tasks:
        for edge in task.out_edges:
            if edge.map.shifted:
                raise CompileError(
                    f"graph '{g.name}': task '{task.name}' feeds event '{edge.event.name}' "
                    f"through the loop-carried map '{edge.map}', but no task has a phase: the "
                    "static schedule would run every instance of a task before the next task "
                    "and wait forever. Give the repeated tasks phase='<grid>->l' (the layer "
                    "dimension) or compile with schedule='dynamic'"
                )


def _edge(edge: Any) -> dict[str, Any]:
    """An edge as data: the event and, per event dimension, ["dim", d] (or
    ["dim", d, offset] for a shifted result), ["const", c] or ["rank", 0]."""
    results = edge.map.results
    return {
        "event": edge.event.name,
        "map": [
            [kind, v, off] if off else [kind, v]
            for (kind, v), off in zip(results, edge.map.offsets, strict=True)
        ],
    }


def _trigger(task: Any) -> dict[str, str] | None:
    """A data-dependent trigger as data: its event and indptr tensor."""
    if task.trigger is None:
        return None
    return {"event": task.trigger.event.name, "indptr": task.trigger.indptr.name}


def _implicit_event(g: Graph, name: str) -> dict[str, Any]:
    """The manifest entry of a counter tensor the dynamic schedule added:
    ``ready.<task>`` (over the task's grid, or one counter when every in-edge
    maps to a constant coordinate), ``fired.<task>`` (a triggered
    task's fired trigger coordinates), ``dispatched.<event>`` or, under the
    static schedule, ``ticket.<task>`` (a ``deal="ticket"`` task's tickets) and
    ``pool.<task>`` (a ``deal="pool"`` task's counter per phase)."""
    kind, _, of = name.partition(".")
    if kind == "ready":
        task = next(t for t in g.tasks if t.name == of)
        pushing = [e for e in task.in_edges if not e.event.ranked]
        shape, count = task.grid, len(pushing)
        if all(k == "const" for e in pushing for k, _ in e.map.results):
            shape = (1,)  # every instance ready at once: one counter (DynamicSchedule.cpp)
    elif kind == "fired":
        task = next(t for t in g.tasks if t.name == of)
        assert task.trigger is not None
        shape, count = (1,), task.trigger.event.shape[0]
    elif kind == "ticket":  # the static schedule's counter of a deal="ticket" task
        shape, count = (1,), 1
    elif kind == "pool":  # a deal="pool" task's counters: one per phase (StaticSchedule.cpp)
        task = next(t for t in g.tasks if t.name == of)
        shape, count = (task.grid[task.phase[1]],) if task.phase[0] == "dim" else (1,), 1
    else:
        event = next(e for e in g.events if e.name == of)
        shape, count = event.shape, event.wait_count
    return {
        "name": name,
        "shape": [_size(d) for d in shape],
        "wait_count": _wait_count(count),
        "implicit": True,
    }


def _manifest(
    g: Graph,
    sched: _Schedule,
    schedule: str,
    chip: str,
    block_size: int,
    polls: int,
    early_push: bool,
    trace: bool,
) -> dict[str, Any]:
    tasks = {t.name: t for t in g.tasks}
    user_events = {e.name for e in g.events}
    params: list[dict[str, Any]] = [{"kind": "symbol", "name": s.name} for s in g.symbols]
    params += [{"kind": "tensor", "name": t.name, "rank": t.rank} for t in g.tensors]
    params += [{"kind": k} for k in ("counters", "queue", "status", "max_polls")]
    if any(e.ranked for e in g.events):
        params.append({"kind": "peers"})
    if trace:
        params.append({"kind": "trace"})
    return {
        "format": MANIFEST_FORMAT_CLUSTERED
        if any(getattr(t.function, "cluster", 0) for t in g.tasks)
        else MANIFEST_FORMAT_CHUNKED
        if any(t.map_chunk for t in g.tensors)
        else MANIFEST_FORMAT,
        "graph": g.name,
        "kernel": g.name,
        "module": f"{g.name}_kernels",
        "schedule": schedule,
        "target": chip,
        "block_size": block_size,
        "watchdog_polls": polls,
        "symbols": [s.name for s in g.symbols],
        **_manifest_symbol_max(g),
        **(
            {"requirements": [{"size": _size(s), "message": m} for s, m in g.requirements]}
            if g.requirements
            else {}
        ),
        "tensors": [
            {
                "name": t.name,
                "shape": [_size(d) for d in t.shape],
                "dtype": t.dtype.name,
                **({"kept_zero": True} if t.kept_zero else {}),
                **(
                    {
                        "tensor_map": {
                            "source": t.map_of.name,
                            "box": list(t.map_box),
                            **({"chunk": t.map_chunk} if t.map_chunk else {}),
                        }
                    }
                    if t.map_of is not None and t.map_box is not None
                    else {}
                ),
            }
            for t in g.tensors
        ],
        "early_push": early_push if schedule == "dynamic" else None,
        "events": [
            {
                "name": e.name,
                "shape": [_size(d) for d in e.shape],
                "wait_count": _wait_count(e.wait_count),
                **({"ranked": True} if e.ranked else {}),
            }
            for e in g.events
        ]
        + [_implicit_event(g, name) for name in sched.events if name not in user_events],
        "tasks": [
            {
                "index": i,
                "name": name,
                "grid": [_size(d) for d in tasks[name].grid],
                "ready_at_start": name in sched.ready_at_start,
                # For the launch-time checks once the symbols are bound.
                "in_edges": [_edge(e) for e in tasks[name].in_edges],
                "out_edges": [_edge(e) for e in tasks[name].out_edges],
                "trigger": _trigger(tasks[name]),
                **({"phase": list(tasks[name].phase)} if tasks[name].phase != ("const", 0) else {}),
                **({"deal": "pool"} if tasks[name].deal == "pool" and schedule == "static" else {}),
                **({"ctas": tasks[name].ctas} if tasks[name].ctas and schedule == "static" else {}),
                **(
                    {"deal_slots": tasks[name].deal_slots}
                    if tasks[name].deal_slots and schedule == "static"
                    else {}
                ),
                **(
                    {"meets": meets} if (meets := getattr(tasks[name].function, "meets", 0)) else {}
                ),
                **(
                    {"cluster": cluster}
                    if (cluster := getattr(tasks[name].function, "cluster", 0))
                    else {}
                ),
            }
            for i, name in enumerate(sched.tasks)
        ],
        "params": params,
        "status_words": STATUS_WORDS,
        **(
            {"ranks": {"rank": g.rank.name, "count": g.num_ranks.name}}
            if g.rank is not None and g.num_ranks is not None
            else {}
        ),
    }


def _manifest_symbol_max(g: Graph) -> dict[str, Any]:
    """The manifest's ``symbol_max`` entry (none when no symbol has a max)."""
    bounds = {s.name: s.max for s in g.symbols if s.max is not None}
    return {"symbol_max": bounds} if bounds else {}


def _check_mbarriers_invalidated(g: Graph) -> None:
    """Tiles share one shared buffer (``docs/tiles.md``): a tile that keeps
    mbarriers there must ``mbarrier.inval`` them before its words serve
    another tile (PTX; without it the Llama decoder gave wrong tokens on an
    H200, ``bench/RESULTS.md`` item 72). Refuses a tile that initialises
    mbarriers and never invalidates one."""
    for task in g.tasks:
        source = task.function.source
        if "mbarrier.init" in source and "mbarrier.inval" not in source:
            raise CompileError(
                f"task '{task.name}': tile '{task.function.name}' initialises mbarriers "
                "(mbarrier.init) but never invalidates them (mbarrier.inval): another "
                "tile reuses its shared memory after each instance, which PTX allows only "
                "for invalidated barriers"
            )


def _outlined_functions(g: Graph, outline: bool | Iterable[str]) -> tuple[str, ...]:
    """The device functions ``compile(outline=...)`` keeps as calls, and
    those whose tile asks to be called (:attr:`etc.DeviceFunction.called`)."""
    if isinstance(outline, bool) and outline:
        return ("*",)
    if not isinstance(outline, bool) and (
        isinstance(outline, str) or not isinstance(outline, Iterable)
    ):
        raise CompileError(f"outline must be a bool or a collection of task names, got {outline!r}")
    tasks = {task.name: task for task in g.tasks}
    called = (t.function.name for t in g.tasks if getattr(t.function, "called", False))
    names = list(dict.fromkeys(called))
    for name in () if isinstance(outline, bool) else outline:
        if name not in tasks:
            raise CompileError(
                f"outline: graph '{g.name}' has no task {name!r} (tasks: {', '.join(tasks)})"
            )
        function = tasks[name].function.name
        if function not in names:
            names.append(function)
    return tuple(names)


def compile(  # noqa: A001 - the public name
    g: Graph,
    schedule: str = "static",
    target: str = "sm_90",
    *,
    watchdog_polls: int = DEFAULT_WATCHDOG_POLLS,
    opt_level: int = 3,
    cubin: bool = True,
    early_push: bool = True,
    trace: bool = False,
    min_ctas_per_sm: int = 0,
    max_pop_chunk: int = 8,
    prefetch_next: bool = False,
    pop_ahead: bool = True,
    outline: bool | Iterable[str] = False,
    sm_slices: bool = False,
    sm_deal: str | None = None,
    queue_ahead: bool = False,
    wait_memo: bool = False,
    check_counts: bool = True,
    convergent_reductions: bool = False,
) -> Artifact:
    """Compile ``g`` into one persistent kernel for ``target``.

    ``schedule="static"`` runs a per-CTA order precomputed at launch;
    ``"dynamic"`` pops ready tasks from an on-GPU queue, pushed by whoever
    completes (or, with ``early_push``, dispatches) their last dependency.

    ``watchdog_polls`` is the default bound of every wait (the runtime may
    override it per launch). Raises :class:`~etc.errors.CompileError` with the
    MLIR diagnostics and an ``etc-opt`` command that reproduces a failure.
    ``trace=True`` makes the kernel record every task instance's start, end
    and SM (read back with ``kernel.trace()``); without it the kernel has no
    tracing code at all. ``min_ctas_per_sm=N`` asks ptxas to fit N CTAs per
    SM (registers capped at 65536 / (block size x N)): every tile is inlined
    into the one kernel, which otherwise gets its hungriest tile's registers
    and so the occupancy of that tile for all of them. ``max_pop_chunk``
    (dynamic schedule): most queue positions a CTA claims at once when many
    instances are ready at start; 1 keeps CTAs on consecutive instances,
    which GEMM tiles sharing operands through L2 prefer. ``prefetch_next``
    (static schedule): each instance first calls the prefetch function (see
    :class:`~etc.DeviceFunction`) of the CTA's next instance, so the next
    tile's operands load while this one runs. ``pop_ahead`` (dynamic
    schedule): a CTA requests its next queue positions when it takes its
    current one, hiding the request's latency; an instance pushed into such
    a position then waits for the CTA's current task. ``False`` requests
    positions only when the CTA is free (layered graphs whose stages each
    wait for the previous one, like a decoder, prefer it). ``outline``: the
    tiles of these tasks (``True``: of every task, their prefetch functions
    included) stay functions that the kernel calls instead of being inlined
    into it, so ptxas allocates each one's registers apart: one tile's
    pressure no longer spills another's (``docs/design.md``, "One kernel,
    many tiles"). A tile function that several tasks share is called by all
    of them. ``sm_slices`` (static schedule): each CTA takes its list by the
    SM it runs on, so the runtime can deal each task's last partial round to
    whole SMs (``docs/scheduling.md``, "Dealt by SM"); its few instructions
    before the loop can change ptxas's allocation of an inlined kernel, so
    it suits kernels whose tiles are called (``outline``). ``sm_deal``
    (static schedule; ``"spread"`` or ``"pairs"``): the kernel records its
    CTAs' SMs as they exit, and the runtime deals full-grid queues by them
    after the first synchronised launch (``Kernel.deal_by_sm``); None: no
    record, round-robin (unless ``sm_slices``, whose default is ``"spread"``).
    ``queue_ahead`` (static schedule): each CTA loads its next queue entry as
    the current instance starts, not after it ends. ``wait_memo`` (static
    schedule): each CTA skips a wait on the coordinate its last completed
    wait saw (the same counter and count: counters only grow), so a CTA's
    consecutive instances of one stage poll once (``docs/scheduling.md``,
    "Between two instances"). ``check_counts``: as the launch ends, the
    kernel checks that no coordinate of an event whose wait counts come from
    a table got more notifications than its count (a count too low released
    its waiters early: :class:`~etc.errors.WaitCountError`); graphs without
    such events get no code either way. ``convergent_reductions``: the
    scheduler's CTA reductions in a kernel with aligned barriers (one that
    draws no ticket or pool) are NVVM's barrier reductions, which LLVM treats
    as convergent, instead of inline ``bar.red`` asm, which it does not (off:
    the PTX differs and its speed is measured in ``bench/RESULTS.md``).
    """
    if not isinstance(g, Graph):
        raise CompileError(f"compile: expected an etc.Graph, got {type(g).__name__}")
    if schedule not in SCHEDULES:
        raise CompileError(
            f"schedule {schedule!r} is not supported; choose one of {', '.join(SCHEDULES)}"
        )
    if target not in TARGETS:
        raise CompileError(
            f"target {target!r} is not supported; choose one of {', '.join(TARGETS)}"
        )
    if not is_int(watchdog_polls, 1) or watchdog_polls >= 1 << 63:
        raise CompileError(f"watchdog_polls must be an int in 1..2**63-1, got {watchdog_polls!r}")
    if not is_int(opt_level) or opt_level not in range(4):
        raise CompileError(f"opt_level must be 0, 1, 2 or 3 (NVVM's), got {opt_level!r}")
    for flag, value in (
        ("cubin", cubin),
        ("early_push", early_push),
        ("trace", trace),
        ("check_counts", check_counts),
        ("convergent_reductions", convergent_reductions),
    ):
        if not isinstance(value, bool):
            raise CompileError(f"{flag} must be a bool, got {value!r}")
    if not is_int(min_ctas_per_sm, 0):
        raise CompileError(f"min_ctas_per_sm must be an int >= 0, got {min_ctas_per_sm!r}")
    if min_ctas_per_sm * g.block_size > SM_THREADS:
        raise CompileError(
            f"min_ctas_per_sm={min_ctas_per_sm}: CTAs of {g.block_size} threads, and an SM "
            f"holds at most {SM_THREADS} threads"
        )
    if not is_int(max_pop_chunk, 1):
        raise CompileError(f"max_pop_chunk must be an int >= 1, got {max_pop_chunk!r}")
    if not isinstance(prefetch_next, bool):
        raise CompileError(f"prefetch_next must be a bool, got {prefetch_next!r}")
    if not isinstance(sm_slices, bool):
        raise CompileError(f"sm_slices must be a bool, got {sm_slices!r}")
    if sm_slices and schedule != "static":
        raise CompileError("sm_slices needs the static schedule (its queue holds the lists)")
    for flag, value in (("queue_ahead", queue_ahead), ("wait_memo", wait_memo)):
        if not isinstance(value, bool):
            raise CompileError(f"{flag} must be a bool, got {value!r}")
        if value and schedule != "static":
            raise CompileError(f"{flag} needs the static schedule (its CTAs walk lists)")
    if not (sm_deal is None or sm_deal in SM_DEALS and schedule == "static"):
        raise CompileError(
            f"sm_deal must be 'spread', 'pairs' or None, with the static schedule; got {sm_deal!r}"
        )
    slotted = [t.name for t in g.tasks if t.deal_slots]
    if slotted and schedule == "static" and (sm_deal is not None or sm_slices):
        raise CompileError(
            f"task '{slotted[0]}' has deal_slots, which pad the round-robin lists; "
            "sm_deal and sm_slices deal by SM instead: give one or the other"
        )
    if not isinstance(pop_ahead, bool):
        raise CompileError(f"pop_ahead must be a bool, got {pop_ahead!r}")
    if not pop_ahead and schedule != "dynamic":
        raise CompileError(
            "pop_ahead=False needs the dynamic schedule (the static one has no queue to pop)"
        )
    if prefetch_next and schedule != "static":
        raise CompileError(
            "prefetch_next needs the static schedule (a dynamic CTA does not know its next instance)"
        )
    meeting = next((task for task in g.tasks if getattr(task.function, "meets", 0)), None)
    if meeting is not None and schedule != "static":
        raise CompileError(
            f"task '{meeting.name}' (tile '{meeting.function.name}') has split-K parts that "
            "wait for each other, which only the static schedule's lists run safely; "
            "compile it with schedule='static' or build the tile without meet_share"
        )
    clustered = [task for task in g.tasks if getattr(task.function, "cluster", 0)]
    if clustered and (schedule != "static" or sm_slices):
        raise CompileError(
            f"task '{clustered[0].name}' (tile '{clustered[0].function.name}') runs each group "
            f"of {clustered[0].function.cluster} parts on one thread-block cluster, which only "
            "the static schedule's lists dealt by CTA place: compile it with "
            "schedule='static' and without sm_slices"
        )
    sizes = sorted({task.function.cluster for task in clustered})
    if len(sizes) > 1:
        raise CompileError(
            f"tasks {', '.join(repr(t.name) for t in clustered)} need clusters of "
            f"{' and '.join(map(str, sizes))} CTAs; one kernel launches with one cluster size"
        )
    regioned = next((task for task in g.tasks if task.shared_region), None)
    if prefetch_next and regioned is not None:
        raise CompileError(
            f"prefetch_next: task '{regioned.name}' has shared_region "
            f"{regioned.shared_region}; with shared regions the static schedule already "
            "runs a next instance's prefetch ahead when its region differs, and "
            "prefetch_next would run it into memory the current instance uses"
        )
    if prefetch_next:
        for task in g.tasks:
            if getattr(task.function, "prefetch_fills_shared", False):
                raise CompileError(
                    f"prefetch_next: task '{task.name}' (tile '{task.function.name}') has a "
                    "prefetch that fills shared memory for its own instance; running it for "
                    "the next instance would overwrite the current one's"
                )
    outlined = _outlined_functions(g, outline)
    _check_mbarriers_invalidated(g)
    if schedule == "static":
        _check_loop_phases(g)
    from . import ir

    text = g.to_mlir()
    block_size = g.block_size
    with _diagnostics(ir) as (warnings, errors):
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            detail = "\n".join([_format(e), *errors])
            raise _reproducer(text, "builtin.module()", detail) from None
        scheduled = ir.Module.parse(text)
        scheduler = (
            "etensor-static-schedule"
            if schedule == "static"
            else f"etensor-dynamic-schedule{{early-push={'true' if early_push else 'false'}}}"
        )
        _run(ir, text, scheduled, f"builtin.module(etensor-verify-graph,{scheduler})", errors)
        sched = _read_schedule(ir, scheduled)
        options = _pipeline_options(
            target, block_size, watchdog_polls, opt_level, early_push, trace, min_ctas_per_sm,
            max_pop_chunk, prefetch_next, pop_ahead, outlined, sm_slices,
            sm_deal is not None, queue_ahead, wait_memo, check_counts, convergent_reductions,
        )  # fmt: skip
        _run(ir, text, module, f"builtin.module(etc-{schedule}-to-ptx{{{options}}})", errors)
        ptx = _extract_ptx(ir, module)
        dynamic_smem = _dynamic_shared_memory(ir, module, g.name)
    binary = _assemble(ptx, target, g.name) if cubin else None
    manifest = _manifest(g, sched, schedule, target, block_size, watchdog_polls, early_push, trace)
    if dynamic_smem:
        manifest["dynamic_shared_memory"] = dynamic_smem
    if sm_slices:
        manifest["sm_slices"] = True
    if sm_deal is not None:
        manifest["sm_deal"] = sm_deal
    return Artifact(manifest=manifest, ptx=ptx, cubin=binary, warnings=warnings)


def symbols_of(manifest: Mapping[str, Any]) -> list[str]:
    """The symbol names an artifact expects at launch."""
    return list(manifest["symbols"])

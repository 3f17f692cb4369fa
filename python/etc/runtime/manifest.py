"""Artifact manifests (``manifest.json``, format ``etc-artifact/1``): parse and validate.

The manifest is plain JSON written by the compiler; it is never executed. Every structural
problem, a missing or tampered kernel image, or a hash mismatch raises `LaunchError` naming
the artifact and the offending field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from etc.device import CLUSTER_SIZES
from etc.dtypes import ALIASES, SIZES
from etc.errors import LaunchError

from .queue import SM_DEALS
from .sizes import SizeExpr, parse_size

FORMAT = "etc-artifact/5"
#: Formats this runtime reads: 5 added TMA tensor maps (`tensor_map` on a
#: tensor), which a format-4 runtime would have asked the caller to pass; a
#: format-4 manifest is a format-5 one without maps. 6 added chunked maps
#: (`tensor_map.chunk`), which a format-5 runtime would encode as row-major
#: ones; the compiler writes it only for a graph that has one. 7 added
#: thread-block clusters (`cluster` on a task), which an older runtime would
#: launch without; the compiler writes it only for a graph that has one.
READABLE_FORMATS = ("etc-artifact/4", FORMAT, "etc-artifact/6", "etc-artifact/7")
MANIFEST = "manifest.json"

#: Element sizes in bytes of the dtypes a graph tensor may have (`etc.dtypes`).
DTYPE_SIZES: dict[str, int] = dict(SIZES)
PARAM_KINDS = ("symbol", "tensor", "counters", "queue", "status", "max_polls", "peers", "trace")
# The kernel reads these eight status words; a manifest may reserve more.
MIN_STATUS_WORDS = 8

Dim = int | str | SizeExpr
WaitCount = int | str | SizeExpr | dict


def canonical_dtype(name: str) -> str | None:
    """Maps ``f32``/``float32``/``torch.float32``/numpy names to the manifest's short name."""
    name = str(name).removeprefix("torch.")
    if name in DTYPE_SIZES:
        return name
    return ALIASES.get(name)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[Dim, ...]
    dtype: str
    #: A TMA tensor map the runtime encodes at launch: (source tensor, box
    #: (rows, cols), chunk: 0, or the k chunk of a source in
    #: ``etc.tiles.gemm.chunk_weights``' layout); None for a buffer the caller passes.
    tensor_map: tuple[str, tuple[int, int], int] | None = None
    #: Counters the tiles keep at zero between launches (``Graph.tensor(
    #: kept_zero=True)``): the runtime zeroes them after a failed launch.
    kept_zero: bool = False


@dataclass(frozen=True)
class EventSpec:
    name: str
    shape: tuple[Dim, ...]
    wait_count: WaitCount
    #: Added by the dynamic schedule (ready.<task>, dispatched.<event>).
    implicit: bool = False
    #: Spans the ranks: dimension 0 is the rank whose copy holds the coordinate.
    ranked: bool = False


@dataclass(frozen=True)
class TaskSpec:
    index: int
    name: str
    grid: tuple[Dim, ...]
    #: Dynamic schedule: no in-edges, so every instance is ready at launch.
    ready_at_start: bool = False
    #: (event index, map) per edge; a map result is ("dim", d), ("dim", d,
    #: offset) (a shifted out-edge), ("const", c) or ("rank", 0) (the rank
    #: running the instance).
    #: A triggered task's maps take (i, c): dimension 1 is the trigger coordinate.
    in_edges: tuple[tuple[int, tuple[tuple[str, int], ...]], ...] = ()
    out_edges: tuple[tuple[int, tuple[tuple[str, int], ...]], ...] = ()
    #: Data-dependent trigger: (event index, indptr tensor name), or None.
    trigger: tuple[int, str] | None = None
    #: Static-schedule phase: ("const", c) or ("dim", d) (see Graph.task).
    phase: tuple[str, int] = ("const", 0)
    #: Static schedule: a queue entry per CTA and phase draws the phase's
    #: instances at run time (``Graph.task(deal="pool")``).
    pooled: bool = False
    #: Instances that differ only in the last grid coordinate (this many
    #: values) wait for each other (``etc.DeviceFunction.meets``); 0: none.
    meets: int = 0
    #: Static schedule: dealt over the first this many CTAs (``Graph.task(ctas=...)``); 0: all.
    ctas: int = 0
    #: Static schedule: round-robin positions each phase's instances take at
    #: least (``Graph.task(deal_slots=...)``); 0: their count.
    deal_slots: int = 0
    #: Each group of this many consecutive instances (a block's split-K
    #: parts) runs on the CTAs of one thread-block cluster, which wait for
    #: each other (``etc.DeviceFunction.cluster``); 0: none.
    cluster: int = 0


@dataclass(frozen=True)
class ParamSpec:
    kind: str
    name: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class Manifest:
    """A validated manifest plus the verified kernel image bytes."""

    directory: Path
    graph: str
    kernel: str
    module: str
    schedule: str
    target: str
    block_size: int
    watchdog_polls: int
    ptx: str
    cubin: str | None
    sha256: Mapping[str, str]
    symbols: tuple[str, ...]
    tensors: tuple[TensorSpec, ...]
    events: tuple[EventSpec, ...]
    tasks: tuple[TaskSpec, ...]
    params: tuple[ParamSpec, ...]
    status_words: int
    ptx_bytes: bytes = b""
    cubin_bytes: bytes | None = None
    #: Graphs that span ranks (GPUs): the symbols (rank, number of ranks).
    ranks: tuple[str, str] | None = None
    #: Bytes of dynamic shared memory the kernel's tiles need (0: static only).
    dynamic_shared_memory: int = 0
    #: The largest value of a symbol the kernel takes (``Graph.symbol(max=)``).
    symbol_max: Mapping[str, int] = field(default_factory=dict)
    #: (size, message): each must be >= 0 at launch (``Graph.require``).
    requirements: tuple[tuple[Dim, str], ...] = ()
    #: Compiled with ``sm_slices``: its queue ends in the by-SM word, and its
    #: CTAs take their lists by SM (``etc.compile(sm_slices=True)``).
    sm_slices: bool = False
    #: How the runtime deals full-grid queues by SM unless told
    #: (``etc.compile(sm_deal=...)``; None: round-robin).
    sm_deal: str | None = None

    @property
    def ranked(self) -> bool:
        return self.ranks is not None

    @property
    def cluster(self) -> int:
        """CTAs a thread-block cluster of the launch (1: no clusters): the
        size its clustered tasks share (``TaskSpec.cluster``)."""
        return max((t.cluster for t in self.tasks), default=0) or 1

    @property
    def traced(self) -> bool:
        """Compiled with ``trace=True``: the kernel records every instance."""
        return any(p.kind == "trace" for p in self.params)

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The tensors a launch takes: all but the tensor maps the runtime encodes."""
        return tuple(t for t in self.tensors if t.tensor_map is None)

    def tensor(self, name: str) -> TensorSpec:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def bind(self, shape: Sequence[Dim], symbols: Mapping[str, int]) -> tuple[int, ...]:
        """Substitutes symbol values into a shape or grid."""
        return tuple(bind_size(d, symbols) for d in shape)


def bind_size(d: Dim, symbols: Mapping[str, int]) -> int:
    """One size with the symbols bound."""
    if isinstance(d, str):
        return symbols[d]
    if isinstance(d, SizeExpr):
        return d.evaluate(symbols)
    return d


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Checker:
    """Collects the path of the field being read so errors say exactly what is wrong."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, what: str) -> LaunchError:
        return LaunchError(f"{self.source}: manifest field {where}: {what}")

    def get(self, obj: Mapping, key: str, types: type | tuple[type, ...], where: str) -> Any:
        if key not in obj:
            raise self.fail(f"{where}{key}", "is missing")
        value = obj[key]
        ok = _is_int(value) if types is int else isinstance(value, types)
        if not ok or (isinstance(value, bool) and types is not bool):
            tname = (
                types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
            )
            raise self.fail(
                f"{where}{key}", f"expected {tname}, got {type(value).__name__} {value!r}"
            )
        return value

    def name(self, obj: Mapping, key: str, where: str) -> str:
        value = self.get(obj, key, str, where)
        if not value:
            raise self.fail(f"{where}{key}", "must be a non-empty string")
        return value

    def dims(self, value: Any, where: str, symbols: Sequence[str]) -> tuple[Dim, ...]:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list of dims, got {type(value).__name__}")
        out: list[Dim] = []
        for i, d in enumerate(value):
            if _is_int(d) and d >= 0:
                out.append(d)
            elif isinstance(d, str) and d in symbols:
                out.append(d)
            elif isinstance(d, str):
                out.append(self.expr(d, f"{where}[{i}]", symbols))
            else:
                raise self.fail(
                    f"{where}[{i}]",
                    f"expected an int >= 0, a declared symbol or a size expression, got {d!r}",
                )
        return tuple(out)

    def expr(self, text: str, where: str, symbols: Sequence[str]) -> SizeExpr:
        try:
            return parse_size(text, symbols)
        except ValueError as e:
            raise self.fail(where, str(e)) from None

    def unique(self, names: Sequence[str], where: str) -> None:
        seen: set[str] = set()
        for n in names:
            if n in seen:
                raise self.fail(where, f"duplicate name {n!r}")
            seen.add(n)


SCHEDULES = ("static", "dynamic")


def _schedule(c: _Checker, data: Mapping) -> str:
    schedule = c.name(data, "schedule", "")
    if schedule not in SCHEDULES:
        raise c.fail("schedule", f"expected one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return schedule


def _edges(
    c: _Checker, value: Any, where: str, events: Sequence[EventSpec], rank: int
) -> tuple[tuple[int, tuple[tuple[str, int], ...]], ...]:
    """Validates a task's edge list (absent in older artifacts: no checks)."""
    if not isinstance(value, list):
        raise c.fail(where, f"expected a list, got {type(value).__name__}")
    index = {e.name: k for k, e in enumerate(events)}
    out = []
    for i, edge in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(edge, dict) or edge.get("event") not in index:
            raise c.fail(w, f"expected {{'event': <event name>, 'map': [...]}}, got {edge!r}")
        event = index[edge["event"]]
        results = edge.get("map")
        if not isinstance(results, list) or len(results) != len(events[event].shape):
            raise c.fail(
                f"{w}.map", f"expected {len(events[event].shape)} results, got {results!r}"
            )
        parsed = []
        for r in results:
            shifted = isinstance(r, list) and len(r) == 3 and r[0] == "dim"
            if shifted and not (_is_int(r[2]) and r[2] > 0):
                raise c.fail(f"{w}.map", f"bad map result {r!r}")
            if shifted:
                r = r[:2]
            ok = (
                isinstance(r, list)
                and len(r) == 2
                and r[0] in ("dim", "const", "rank")
                and _is_int(r[1])
                and (
                    r[1] >= 0
                    if r[0] == "const"
                    else r[1] == 0
                    if r[0] == "rank"
                    else 0 <= r[1] < rank
                )
            )
            if not ok:
                raise c.fail(f"{w}.map", f"bad map result {r!r}")
            parsed.append((r[0], r[1], results[len(parsed)][2]) if shifted else (r[0], r[1]))
        out.append((event, tuple(parsed)))
    return tuple(out)


def _trigger(
    c: _Checker, spec: Any, where: str, events: list[EventSpec], tensors: dict, rank: int
) -> tuple[int, str] | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) != {"event", "indptr"}:
        raise c.fail(where, f"expected {{'event': ..., 'indptr': ...}} or null, got {spec!r}")
    names = [e.name for e in events]
    if spec["event"] not in names or len(events[names.index(spec["event"])].shape) != 1:
        raise c.fail(f"{where}.event", f"expected a 1-D event, got {spec['event']!r}")
    indptr = tensors.get(spec["indptr"])
    if indptr is None or indptr.dtype not in ("i32", "i64") or len(indptr.shape) != 1:
        raise c.fail(f"{where}.indptr", f"expected a 1-D i32/i64 tensor, got {spec['indptr']!r}")
    if rank != 1:
        raise c.fail(where, f"a triggered task needs a 1-D grid, got rank {rank}")
    return names.index(spec["event"]), spec["indptr"]


def parse_manifest(data: Any, directory: Path | str = ".", source: str | None = None) -> Manifest:
    """Validates the decoded JSON structure; does not touch the kernel image files."""
    directory = Path(directory)
    c = _Checker(source or str(directory / MANIFEST))
    if not isinstance(data, dict):
        raise c.fail("<root>", f"expected an object, got {type(data).__name__}")
    fmt = c.get(data, "format", str, "")
    if fmt not in READABLE_FORMATS:
        raise c.fail(
            "format",
            f"expected {FORMAT!r} (or 'etc-artifact/4', or 'etc-artifact/6' with chunked "
            f"tensor maps), got {fmt!r}",
        )

    symbols = c.get(data, "symbols", list, "")
    for i, s in enumerate(symbols):
        if not isinstance(s, str) or not s:
            raise c.fail(f"symbols[{i}]", f"expected a non-empty string, got {s!r}")
    c.unique(symbols, "symbols")
    symbol_max = c.get(data, "symbol_max", dict, "") if "symbol_max" in data else {}
    for name, bound in symbol_max.items():
        if name not in symbols or not _is_int(bound) or bound < 0:
            raise c.fail(f"symbol_max.{name}", f"expected a symbol's int bound >= 0, got {bound!r}")

    requirements = []
    for i, r in enumerate(c.get(data, "requirements", list, "") if "requirements" in data else []):
        w = f"requirements[{i}]."
        if not isinstance(r, dict):
            raise c.fail(f"requirements[{i}]", f"expected an object, got {r!r}")
        (size,) = c.dims([c.get(r, "size", (int, str), w)], f"{w}size", symbols)
        requirements.append((size, c.get(r, "message", str, w)))

    tensors = []
    for i, t in enumerate(c.get(data, "tensors", list, "")):
        w = f"tensors[{i}]."
        if not isinstance(t, dict):
            raise c.fail(f"tensors[{i}]", "expected an object")
        dtype = c.get(t, "dtype", str, w)
        canon = canonical_dtype(dtype)
        if canon is None:
            raise c.fail(
                f"{w}dtype", f"unsupported dtype {dtype!r} (supported: {', '.join(DTYPE_SIZES)})"
            )
        tensor_map = None
        if "tensor_map" in t:
            tensor_map = _tensor_map(c, c.get(t, "tensor_map", dict, w), f"{w}tensor_map.")
        kept_zero = c.get(t, "kept_zero", bool, w) if "kept_zero" in t else False
        if kept_zero and tensor_map is not None:
            raise c.fail(f"{w}kept_zero", "a tensor map is encoded by the runtime, not kept zero")
        tensors.append(
            TensorSpec(
                c.name(t, "name", w),
                c.dims(c.get(t, "shape", list, w), f"{w}shape", symbols),
                canon,
                tensor_map,
                kept_zero,
            )
        )
    c.unique([t.name for t in tensors], "tensors")
    by_name = {t.name: t for t in tensors}
    for t in tensors:
        if t.tensor_map is None:
            continue
        src = by_name.get(t.tensor_map[0])
        if src is None or src.tensor_map is not None or len(src.shape) < 2:
            raise c.fail(
                f"tensor {t.name!r}",
                f"its tensor_map source {t.tensor_map[0]!r} is not a buffer of rank >= 2",
            )
        if t.shape != (16,) or t.dtype != "i64":
            raise c.fail(f"tensor {t.name!r}", "a tensor map must be i64 of shape (16,)")

    events = []
    for i, e in enumerate(c.get(data, "events", list, "")):
        w = f"events[{i}]."
        if not isinstance(e, dict):
            raise c.fail(f"events[{i}]", "expected an object")
        name = c.name(e, "name", w)
        shape = c.dims(c.get(e, "shape", list, w), f"{w}shape", symbols)
        wc = c.get(e, "wait_count", (int, str, dict), w)
        if _is_int(wc):
            if wc < 0:
                raise c.fail(f"{w}wait_count", f"must be >= 0, got {wc}")
        elif isinstance(wc, str):
            if wc not in symbols:
                wc = c.expr(wc, f"{w}wait_count", symbols)
        else:
            table = wc.get("table")
            if set(wc) != {"table"} or table not in by_name:
                raise c.fail(f"{w}wait_count", f"expected {{'table': <tensor name>}}, got {wc!r}")
            spec = by_name[table]
            if spec.dtype not in ("i32", "i64") or len(spec.shape) != len(shape):
                raise c.fail(
                    f"{w}wait_count",
                    f"table {table!r} must be an i32/i64 tensor of rank {len(shape)}",
                )
        implicit = e.get("implicit", False)
        if not isinstance(implicit, bool):
            raise c.fail(f"{w}implicit", f"expected a bool, got {implicit!r}")
        ranked = e.get("ranked", False)
        if not isinstance(ranked, bool):
            raise c.fail(f"{w}ranked", f"expected a bool, got {ranked!r}")
        events.append(EventSpec(name, shape, wc, implicit, ranked))
    c.unique([e.name for e in events], "events")

    tasks = []
    for i, t in enumerate(c.get(data, "tasks", list, "")):
        w = f"tasks[{i}]."
        if not isinstance(t, dict):
            raise c.fail(f"tasks[{i}]", "expected an object")
        index = c.get(t, "index", int, w)
        if index != i:
            raise c.fail(
                f"{w}index", f"tasks must be listed in index order; expected {i}, got {index}"
            )
        ready = t.get("ready_at_start", False)
        if not isinstance(ready, bool):
            raise c.fail(f"{w}ready_at_start", f"expected a bool, got {ready!r}")
        grid = c.dims(c.get(t, "grid", list, w), f"{w}grid", symbols)
        trigger = _trigger(c, t.get("trigger"), f"{w}trigger", events, by_name, len(grid))
        coords = len(grid) + (trigger is not None)
        edges = [
            _edges(c, t.get(key, []), f"{w}{key}", events, coords)
            for key in ("in_edges", "out_edges")
        ]
        phase = t.get("phase", ["const", 0])
        if not (
            isinstance(phase, list)
            and len(phase) == 2
            and phase[0] in ("const", "dim")
            and _is_int(phase[1])
            and (0 <= phase[1] < len(grid) if phase[0] == "dim" else phase[1] >= 0)
        ):
            raise c.fail(f"{w}phase", f"bad phase {phase!r}")
        deal = t.get("deal", "list")
        if deal not in ("list", "pool") or (deal == "pool" and trigger is not None):
            raise c.fail(f"{w}deal", f"expected 'list' or 'pool' (untriggered), got {deal!r}")
        meets = t.get("meets", 0)
        if not (_is_int(meets) and meets >= 0) or (meets and deal != "list"):
            raise c.fail(f"{w}meets", f"expected an int >= 0 (listed tasks only), got {meets!r}")
        ctas = t.get("ctas", 0)
        if not (_is_int(ctas) and ctas >= 0) or (ctas and (deal != "list" or meets)):
            raise c.fail(f"{w}ctas", f"expected an int >= 0 (listed tasks, no meets), got {ctas!r}")
        slots = t.get("deal_slots", 0)
        if not (_is_int(slots) and slots >= 0) or (slots and deal != "list"):
            raise c.fail(f"{w}deal_slots", f"expected an int >= 0 (listed tasks), got {slots!r}")
        cluster = t.get("cluster", 0)
        if not (_is_int(cluster) and cluster in CLUSTER_SIZES + (0,)) or (
            cluster and (deal != "list" or meets or trigger is not None)
        ):
            raise c.fail(
                f"{w}cluster",
                f"expected 0 or one of {CLUSTER_SIZES} (listed, untriggered tasks without "
                f"meets), got {cluster!r}",
            )
        tasks.append(
            TaskSpec(
                index,
                c.name(t, "name", w),
                grid,
                ready,
                *edges,
                trigger,
                (phase[0], phase[1]),
                deal == "pool",
                meets,
                ctas,
                slots,
                cluster,
            )
        )
    if len(tasks) >= 1 << 15:
        raise c.fail(
            "tasks", f"{len(tasks)} tasks do not fit the 15-bit task field of a queue entry"
        )

    params = []
    counts = dict.fromkeys(PARAM_KINDS, 0)
    seen_names: set[tuple[str, str]] = set()
    for i, p in enumerate(c.get(data, "params", list, "")):
        w = f"params[{i}]."
        if not isinstance(p, dict):
            raise c.fail(f"params[{i}]", "expected an object")
        kind = c.get(p, "kind", str, w)
        if kind not in PARAM_KINDS:
            raise c.fail(
                f"{w}kind", f"unknown kind {kind!r} (expected one of {', '.join(PARAM_KINDS)})"
            )
        counts[kind] += 1
        if kind == "symbol":
            name = c.name(p, "name", w)
            if name not in symbols:
                raise c.fail(f"{w}name", f"{name!r} is not a declared symbol")
            params.append(ParamSpec(kind, name))
        elif kind == "tensor":
            name = c.name(p, "name", w)
            if name not in by_name:
                raise c.fail(f"{w}name", f"{name!r} is not a declared tensor")
            rank = c.get(p, "rank", int, w)
            if rank != len(by_name[name].shape):
                raise c.fail(
                    f"{w}rank",
                    f"tensor {name!r} has rank {len(by_name[name].shape)}, param says {rank}",
                )
            params.append(ParamSpec(kind, name, rank))
        else:
            params.append(ParamSpec(kind))
            continue
        if (kind, name) in seen_names:
            raise c.fail(f"{w}name", f"{kind} {name!r} is passed twice")
        seen_names.add((kind, name))
    for kind in ("counters", "queue", "status", "max_polls"):
        if counts[kind] != 1:
            raise c.fail("params", f"expected exactly one {kind!r} param, found {counts[kind]}")
    if counts["trace"] > 1:
        raise c.fail("params", f"expected at most one 'trace' param, found {counts['trace']}")
    ranks = data.get("ranks")
    if ranks is not None:
        ok = (
            isinstance(ranks, dict)
            and set(ranks) == {"rank", "count"}
            and all(ranks[k] in symbols for k in ("rank", "count"))
        )
        if not ok:
            raise c.fail(
                "ranks", f"expected {{'rank': <symbol>, 'count': <symbol>}}, got {ranks!r}"
            )
        ranks = (ranks["rank"], ranks["count"])
    has_ranked = any(e.ranked for e in events)
    if counts["peers"] != (1 if has_ranked else 0) or (has_ranked and ranks is None):
        raise c.fail(
            "params",
            "a kernel with ranked events takes exactly one 'peers' param and names its ranks; "
            f"found {counts['peers']} peers param(s), ranks {ranks!r}",
        )

    block_size = c.get(data, "block_size", int, "")
    if not 1 <= block_size <= 1024:
        raise c.fail("block_size", f"must be in 1..1024, got {block_size}")
    watchdog = c.get(data, "watchdog_polls", int, "")
    if not 0 <= watchdog < 1 << 63:
        raise c.fail("watchdog_polls", f"must be in 0..2**63-1, got {watchdog}")
    status_words = c.get(data, "status_words", int, "")
    if not MIN_STATUS_WORDS <= status_words <= 1 << 20:
        raise c.fail("status_words", f"must be >= {MIN_STATUS_WORDS}, got {status_words}")

    sm_slices = data.get("sm_slices", False)
    if not isinstance(sm_slices, bool) or (sm_slices and data.get("schedule") != "static"):
        raise c.fail(
            "sm_slices", f"expected a bool, true only for the static schedule, got {sm_slices!r}"
        )
    meeting = next((t for t in tasks if t.meets), None)
    if meeting is not None and data.get("schedule") != "static":
        raise c.fail(
            f"tasks[{meeting.index}].meets",
            "parts that wait for each other need the static schedule",
        )
    clustered = [t for t in tasks if t.cluster]
    if clustered and (data.get("schedule") != "static" or sm_slices):
        raise c.fail(
            f"tasks[{clustered[0].index}].cluster",
            "clusters need the static schedule's lists, dealt by CTA (no sm_slices)",
        )
    if len({t.cluster for t in clustered}) > 1:
        raise c.fail(
            f"tasks[{clustered[-1].index}].cluster",
            f"one launch has one cluster size, got {sorted({t.cluster for t in clustered})}",
        )
    sm_deal = data.get("sm_deal")
    if not (sm_deal is None or sm_deal in SM_DEALS and data.get("schedule") == "static"):
        raise c.fail("sm_deal", f"expected 'spread' or 'pairs' (static schedule), got {sm_deal!r}")
    dynamic_smem = data.get("dynamic_shared_memory", 0)
    if not _is_int(dynamic_smem) or not 0 <= dynamic_smem <= 1 << 20:
        raise c.fail("dynamic_shared_memory", f"expected bytes in 0..2**20, got {dynamic_smem!r}")
    ptx = _file_name(c, c.name(data, "ptx", ""), "ptx")
    cubin = c.get(data, "cubin", (str, type(None)), "")
    if cubin is not None:
        cubin = _file_name(c, cubin, "cubin")
    sha = c.get(data, "sha256", dict, "")
    for f in (ptx, cubin):
        if f is None:
            continue
        digest = sha.get(f)
        if (
            not isinstance(digest, str)
            or len(digest) != 64
            or any(ch not in "0123456789abcdef" for ch in digest.lower())
        ):
            raise c.fail(f"sha256[{f!r}]", f"expected a 64-digit hex digest, got {digest!r}")

    return Manifest(
        directory=directory,
        graph=c.name(data, "graph", ""),
        kernel=c.name(data, "kernel", ""),
        module=c.get(data, "module", str, ""),
        schedule=_schedule(c, data),
        target=c.get(data, "target", str, ""),
        block_size=block_size,
        watchdog_polls=watchdog,
        ptx=ptx,
        cubin=cubin,
        sha256={k: v.lower() for k, v in sha.items() if isinstance(v, str)},
        symbols=tuple(symbols),
        tensors=tuple(tensors),
        events=tuple(events),
        tasks=tuple(tasks),
        params=tuple(params),
        status_words=status_words,
        ranks=ranks,
        dynamic_shared_memory=dynamic_smem,
        symbol_max=dict(symbol_max),
        requirements=tuple(requirements),
        sm_slices=sm_slices,
        sm_deal=sm_deal,
    )


def _tensor_map(c: _Checker, data: Mapping, w: str) -> tuple[str, tuple[int, int], int]:
    box = c.get(data, "box", list, w)
    if len(box) != 2 or not all(_is_int(b) and b > 0 for b in box):
        raise c.fail(f"{w}box", f"expected [rows, cols] positive ints, got {box!r}")
    chunk = data.get("chunk", 0)
    if chunk and (not _is_int(chunk) or chunk != box[1] or box[0] % 8):
        raise c.fail(
            f"{w}chunk",
            f"expected 0 or the box's columns ({box[1]}) with box rows in 8-row groups, "
            f"got {chunk!r}",
        )
    return c.name(data, "source", w), (int(box[0]), int(box[1])), int(chunk)


def _file_name(c: _Checker, name: str, field: str) -> str:
    # Image names are relative to the artifact directory and may not escape it.
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise c.fail(field, f"must be a file name inside the artifact directory, got {name!r}")
    return name


def _read_verified(m: Manifest, name: str, c: _Checker) -> bytes:
    path = m.directory / name
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LaunchError(
            f"{c.source}: cannot read kernel image {name!r}: {e.strerror or e}"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != m.sha256[name]:
        raise LaunchError(
            f"{c.source}: kernel image {name!r} does not match its sha256 "
            f"(manifest {m.sha256[name][:12]}..., file {digest[:12]}..., {len(data)} bytes): "
            "the artifact is truncated, tampered with or stale; recompile it"
        )
    return data


def load_manifest(directory: Path | str) -> Manifest:
    """Reads ``directory/manifest.json`` and the kernel images, verifying their sha256."""
    directory = Path(directory)
    path = directory / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(f"{path}: cannot read the artifact manifest: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise LaunchError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from None
    m = parse_manifest(data, directory, str(path))
    c = _Checker(str(path))
    ptx = _read_verified(m, m.ptx, c)
    # A cheap sanity check beyond the hash: the entry point must be in the PTX.
    if not re.search(rb"\.entry\s+" + re.escape(m.kernel.encode()) + rb"\s*\(", ptx):
        raise LaunchError(f"{path}: {m.ptx!r} has no entry point {m.kernel!r}")
    cubin = _read_verified(m, m.cubin, c) if m.cubin else None
    return replace(m, ptx_bytes=ptx, cubin_bytes=cubin)


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)

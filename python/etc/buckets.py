"""One artifact, a kernel per range of a symbol (e.g. batch-size buckets).

A graph's best tiles can depend on a size known only at launch: the
decoder's GEMM tiles of 16 rows stream the weights fastest for a few
sequences, tiles of 32 rows with every warp on every row for many. Instead
of one compromise, :func:`compile_buckets` compiles one graph per range of
the symbol and saves them as one artifact directory; ``etc.runtime.load``
returns a kernel that launches the one whose range holds the symbol's
value. Every graph of the family takes the same tensors and symbols, so
one set of buffers serves all of them, and no launch recompiles anything.
A bucket may itself be split by another symbol (the decoder's one-sequence
kernel by context length: its best attention tile depends on ``L``), so an
artifact can pick its kernel by several symbols.
Layout: ``buckets.json`` (format ``etc-buckets/1``) and one directory per
bucket: an artifact, or a bucketed one of its own.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import GraphError
from .graph import Graph

__all__ = ["BUCKETS_FORMAT", "BucketedArtifact", "compile_buckets"]

#: A graph, or ``(symbol, entries)``: a bucket split again by another symbol.
BucketGraph = Graph | tuple[str, Sequence]

#: The format of ``buckets.json`` (``etc.runtime.buckets`` reads it).
BUCKETS_FORMAT = "etc-buckets/1"


@dataclass
class BucketedArtifact:
    """Compiled kernels of one graph family: ``artifacts[i]`` runs launches
    whose ``symbol`` is at most ``bounds[i]`` (and above ``bounds[i-1]``);
    the last bound is None (no limit). An entry of ``artifacts`` is an
    artifact or a :class:`BucketedArtifact` by another symbol."""

    symbol: str
    bounds: list[int | None]
    artifacts: list[Any]

    @property
    def kernel_name(self) -> str:
        return self.artifacts[0].kernel_name

    def leaves(self) -> list[tuple[str, Any]]:
        """Every kernel's artifact with its ranges, in launch order:
        ``("B<=1, L<=2048", artifact)``, ``("B=2..16", artifact)``, ..."""
        out, low = [], 1
        for bound, art in zip(self.bounds, self.artifacts, strict=True):
            here = (
                f"{self.symbol}<={bound}"
                if low == 1 and bound is not None
                else f"{self.symbol}={low}..{'' if bound is None else bound}"
            )
            if isinstance(art, BucketedArtifact):
                out += [(f"{here}, {inner}", leaf) for inner, leaf in art.leaves()]
            else:
                out.append((here, art))
            low = (bound or 0) + 1
        return out

    @property
    def warnings(self) -> list[str]:
        seen: list[str] = []
        for art in self.artifacts:
            seen += [w for w in art.warnings if w not in seen]
        return seen

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write every bucket's artifact (``bucket<i>/``) and ``buckets.json``.
        Saving over a single artifact removes its ``manifest.json``,
        ``kernel.ptx`` and ``kernel.cubin``, so that the directory holds one
        artifact, this one (a fresh ``bucket<i>/`` replaces an old one's the
        same way; ``bucket<i>/`` past this artifact's last stay unread)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("manifest.json", "kernel.ptx", "kernel.cubin"):
            (out / stale).unlink(missing_ok=True)
        entries = []
        for i, (bound, art) in enumerate(zip(self.bounds, self.artifacts, strict=True)):
            art.save(out / f"bucket{i}")
            entries.append({"max": bound, "artifact": f"bucket{i}"})
        table = {"format": BUCKETS_FORMAT, "symbol": self.symbol, "buckets": entries}
        (out / "buckets.json").write_text(json.dumps(table, indent=2) + "\n")
        return out

    def load(self, directory: str | os.PathLike[str] | None = None, **options: Any):
        """Save (to a temporary directory unless given) and load for launching;
        ``options`` are :func:`etc.runtime.load`'s (``device``, ``max_polls``,
        ``timeout``)."""
        from . import runtime

        name = self.kernel_name
        target = directory or tempfile.mkdtemp(prefix=f"etc-{name}-")
        return runtime.load(self.save(target), **options)


def _signature(g: Graph) -> tuple:
    """What a launch passes: tensor names, shapes (as text) and dtypes, and
    symbols. TMA maps are not passed (each kernel's runtime encodes its own
    from their sources), so kernels may differ in them."""
    return (
        sorted(
            (t.name, tuple(map(str, t.shape)), str(t.dtype)) for t in g.tensors if t.map_of is None
        ),
        sorted(s.name for s in g.symbols),
    )


def compile_buckets(
    symbol: str,
    graphs: Sequence[
        tuple[int | None, BucketGraph] | tuple[int | None, BucketGraph, dict[str, Any]]
    ],
    **options: Any,
) -> BucketedArtifact:
    """Compile ``graphs`` (``(upper bound of symbol, graph)``, bounds
    increasing, the last None) with the same ``etc.compile`` options; an
    entry ``(bound, graph, more)`` adds or overrides options for that graph
    alone (a target, ``min_ctas_per_sm``: the MoE presets differ in both).
    In place of a graph, ``(other_symbol, entries)`` splits that bucket
    again by another symbol (entries as here; ``more`` applies to all of
    them): ``[(1, ("L", [(2048, g1), (None, g2)])), (None, g3)]`` runs ``g1``
    at B = 1 up to L = 2048, ``g2`` at B = 1 past it, ``g3`` past B = 1.

    Raises GraphError, naming the graph, when the graphs differ in their
    tensors or symbols, when a bucket's symbol is not one of them or splits
    a range of itself, or when the bounds are not increasing positive ints
    ending with None. Every entry is checked before any graph compiles."""
    _check_options(options, "")
    leaves = _check_entries(symbol, graphs, ())
    first = leaves[0]
    for g in leaves[1:]:
        if _signature(g) != _signature(first):
            raise GraphError(
                f"compile_buckets: graph '{g.name}' takes other tensors or symbols than "
                f"'{first.name}': one set of buffers must serve every bucket"
            )
    return _compile_entries(symbol, graphs, options)


def _check_options(options: dict[str, Any], where: str) -> None:
    """Every key of ``options`` must be a keyword of ``etc.compile``: checked
    before the first graph compiles, not when the bucket naming it does."""
    import inspect

    from .compiler import compile as compile_graph

    known = [p for p in inspect.signature(compile_graph).parameters if p != "g"]
    for key in options:
        if key not in known:
            raise GraphError(
                f"compile_buckets: {where}option {key!r} is not one of etc.compile's "
                f"({', '.join(known)})"
            )


def _check_entries(symbol: str, entries: Sequence, outer: tuple[str, ...]) -> list[Graph]:
    """The leaf graphs of ``entries`` (bucketed by ``symbol`` inside the
    buckets of ``outer``), after checking their form and bounds."""
    where = "".join(f" (in a bucket of '{o}')" for o in outer[-1:])
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise GraphError(
            f"compile_buckets: the buckets of '{symbol}'{where} must be a list of (bound, graph), "
            f"got {entries!r}"
        )
    if not entries:
        raise GraphError(f"compile_buckets: no graphs for symbol '{symbol}'{where}")
    if symbol in outer:
        raise GraphError(
            f"compile_buckets: a bucket of '{symbol}' is split by '{symbol}' again; "
            "give the inner bounds to the outer list"
        )
    leaves: list[Graph] = []
    for entry in entries:
        if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
            raise GraphError(
                f"compile_buckets: entry {entry!r} is not (bound, graph) or (bound, graph, options)"
            )
        graph = entry[1]
        if isinstance(graph, Graph):
            name = f"graph '{graph.name}'"
            here = [graph]
        elif (
            isinstance(graph, (tuple, list))
            and len(graph) == 2
            and isinstance(graph[0], str)
            and isinstance(graph[1], Sequence)
        ):
            name = f"the buckets of '{graph[0]}'"
            here = _check_entries(graph[0], graph[1], (*outer, symbol))
        else:
            raise GraphError(
                f"compile_buckets: bucket {entry[0]!r} of '{symbol}' holds {graph!r}, not a "
                "Graph or (symbol, entries)"
            )
        if len(entry) == 3 and not isinstance(entry[2], dict):
            raise GraphError(
                f"compile_buckets: {name}: its options must be a dict, got {entry[2]!r}"
            )
        if len(entry) == 3:
            _check_options(entry[2], f"{name}: ")
        leaves += here
    bounds = [entry[0] for entry in entries]
    if bounds[-1] is not None:
        raise GraphError(
            f"compile_buckets: the last bucket's bound must be None, got {bounds[-1]!r}{where}"
        )
    previous = 0
    for bound in bounds[:-1]:
        if not isinstance(bound, int) or isinstance(bound, bool) or bound <= previous:
            raise GraphError(
                f"compile_buckets: bounds must be increasing ints >= 1 then None, got "
                f"{bounds}{where}"
            )
        previous = bound
    if symbol not in {s.name for s in leaves[0].symbols}:
        raise GraphError(f"compile_buckets: graph '{leaves[0].name}' has no symbol '{symbol}'")
    return leaves


def _compile_entries(symbol: str, entries: Sequence, options: dict[str, Any]) -> BucketedArtifact:
    from . import compile as compile_graph

    artifacts = []
    for entry in entries:
        graph, extra = entry[1], {**options, **(entry[2] if len(entry) == 3 else {})}
        if isinstance(graph, Graph):
            artifacts.append(compile_graph(graph, **extra))
        else:
            artifacts.append(_compile_entries(graph[0], graph[1], extra))
    return BucketedArtifact(symbol, [entry[0] for entry in entries], artifacts)

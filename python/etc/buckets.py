"""One artifact, a kernel per range of one symbol (e.g. batch-size buckets).

A graph's best tiles can depend on a size known only at launch: the
decoder's GEMM tiles of 16 rows stream the weights fastest for a few
sequences, tiles of 32 rows with every warp on every row for many. Instead
of one compromise, :func:`compile_buckets` compiles one graph per range of
the symbol and saves them as one artifact directory; ``etc.runtime.load``
returns a kernel that launches the one whose range holds the symbol's
value. Every graph of the family takes the same tensors and symbols, so
one set of buffers serves all of them, and no launch recompiles anything.
Layout: ``buckets.json`` (format ``etc-buckets/1``) and one artifact
directory per bucket.
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

#: The format of ``buckets.json`` (``etc.runtime.buckets`` reads it).
BUCKETS_FORMAT = "etc-buckets/1"


@dataclass
class BucketedArtifact:
    """Compiled kernels of one graph family: ``artifacts[i]`` runs launches
    whose ``symbol`` is at most ``bounds[i]`` (and above ``bounds[i-1]``);
    the last bound is None (no limit)."""

    symbol: str
    bounds: list[int | None]
    artifacts: list[Any]

    @property
    def warnings(self) -> list[str]:
        seen: list[str] = []
        for art in self.artifacts:
            seen += [w for w in art.warnings if w not in seen]
        return seen

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write every bucket's artifact (``bucket<i>/``) and ``buckets.json``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        entries = []
        for i, (bound, art) in enumerate(zip(self.bounds, self.artifacts, strict=True)):
            art.save(out / f"bucket{i}")
            entries.append({"max": bound, "artifact": f"bucket{i}"})
        table = {"format": BUCKETS_FORMAT, "symbol": self.symbol, "buckets": entries}
        (out / "buckets.json").write_text(json.dumps(table, indent=2) + "\n")
        return out

    def load(self, directory: str | os.PathLike[str] | None = None):
        """Save (to a temporary directory unless given) and load for launching."""
        from . import runtime

        name = self.artifacts[0].kernel_name
        return runtime.load(self.save(directory or tempfile.mkdtemp(prefix=f"etc-{name}-")))


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
    graphs: Sequence[tuple[int | None, Graph] | tuple[int | None, Graph, dict[str, Any]]],
    **options: Any,
) -> BucketedArtifact:
    """Compile ``graphs`` (``(upper bound of symbol, graph)``, bounds
    increasing, the last None) with the same ``etc.compile`` options; an
    entry ``(bound, graph, more)`` adds or overrides options for that graph
    alone (a target, ``min_ctas_per_sm``: the MoE presets differ in both).

    Raises GraphError, naming the graph, when the graphs differ in their
    tensors or symbols, when ``symbol`` is not one of them, or when the
    bounds are not increasing positive ints ending with None."""
    from . import compile as compile_graph

    if not graphs:
        raise GraphError("compile_buckets: no graphs")
    for entry in graphs:
        if len(entry) == 3 and not isinstance(entry[2], dict):
            raise GraphError(
                f"compile_buckets: graph '{entry[1].name}': its options must be a dict, "
                f"got {entry[2]!r}"
            )
    more = [entry[2] if len(entry) == 3 else {} for entry in graphs]
    graphs = [(entry[0], entry[1]) for entry in graphs]
    bounds = [bound for bound, _ in graphs]
    if bounds[-1] is not None:
        raise GraphError(
            f"compile_buckets: the last bucket's bound must be None, got {bounds[-1]!r}"
        )
    previous = 0
    for bound in bounds[:-1]:
        if not isinstance(bound, int) or isinstance(bound, bool) or bound <= previous:
            raise GraphError(
                f"compile_buckets: bounds must be increasing ints >= 1 then None, got {bounds}"
            )
        previous = bound
    first = graphs[0][1]
    if symbol not in {s.name for s in first.symbols}:
        raise GraphError(f"compile_buckets: graph '{first.name}' has no symbol '{symbol}'")
    for _, g in graphs[1:]:
        if _signature(g) != _signature(first):
            raise GraphError(
                f"compile_buckets: graph '{g.name}' takes other tensors or symbols than "
                f"'{first.name}': one set of buffers must serve every bucket"
            )
    return BucketedArtifact(
        symbol,
        bounds,
        [
            compile_graph(g, **{**options, **extra})
            for (_, g), extra in zip(graphs, more, strict=True)
        ],
    )

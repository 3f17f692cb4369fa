"""Edge maps: which event coordinates a task instance notifies or waits on.

Users write einsum-like strings (``"ij->i"``, ``"ij->ji"``, ``"ij->"``,
``"ij->i0"``, ``"ij->i,0"``), MLIR affine-map text (``"(d0, d1) -> (d0)"``,
``"affine_map<(i, j) -> (i)>"``) or pass an MLIR Python ``AffineMap``. All
become an :class:`EdgeMap`: a grid rank plus one result per event dimension,
each a grid dimension, a constant, or the rank running the graph (in graphs
that span several GPUs: ``"i->rank,i"`` or ``"(i)[r] -> (r, i)"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .errors import GraphError

__all__ = ["EdgeMap", "parse_edge_map"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*\Z")
_AFFINE = re.compile(
    r"\s*(?:affine_map\s*<)?\s*\((?P<dims>[^()]*)\)\s*(?:\[(?P<syms>[^\]]*)\])?"
    r"\s*->\s*\((?P<results>.*)\)\s*>?\s*\Z",
    re.S,
)


@dataclass(frozen=True)
class EdgeMap:
    """A projection / permutation / constant map from a task grid to an event.

    ``results[k]`` is ``("dim", d)`` (event coordinate k = grid coordinate d),
    ``("const", c)`` or ``("rank", 0)`` (the rank that runs the instance).
    ``offsets[k]`` is added to a ``"dim"`` result (``(l, i) -> (l + 1)``: the
    next layer's coordinate; only out-edges may shift). ``text`` is the map
    as the user wrote it, used in error messages.
    """

    n_dims: int
    results: tuple[tuple[str, int], ...]
    text: str = field(default="", compare=False)
    dim_names: tuple[str, ...] = field(default=(), compare=False)
    offsets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.offsets:
            object.__setattr__(self, "offsets", (0,) * len(self.results))

    @property
    def shifted(self) -> bool:
        return any(self.offsets)

    @property
    def n_results(self) -> int:
        return len(self.results)

    @property
    def uses_rank(self) -> bool:
        return any(kind == "rank" for kind, _ in self.results)

    def apply(self, coords: tuple[int, ...], rank: int = 0) -> tuple[int, ...]:
        """The event coordinate that grid point ``coords`` of rank ``rank`` maps to."""
        return tuple(
            coords[v] + off if kind == "dim" else rank if kind == "rank" else v
            for (kind, v), off in zip(self.results, self.offsets, strict=True)
        )

    def to_mlir(self) -> str:
        """The map in MLIR affine-map syntax, e.g. ``(i, j) -> (i)``."""
        names = self.dim_names
        if len(names) != self.n_dims or not all(_plain_name(n) for n in names):
            names = tuple(f"d{k}" for k in range(self.n_dims))
        rank = "rank" if "rank" not in names else "s0"
        results = [
            (f"{names[v]} + {off}" if off else names[v])
            if kind == "dim"
            else rank
            if kind == "rank"
            else str(v)
            for (kind, v), off in zip(self.results, self.offsets, strict=True)
        ]
        symbols = f"[{rank}]" if self.uses_rank else ""
        return f"({', '.join(names)}){symbols} -> ({', '.join(results)})"

    def __str__(self) -> str:
        return self.text or self.to_mlir()


def _plain_name(name: str) -> bool:
    # Affine-expression keywords cannot name a dimension.
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)) and name not in {
        "floordiv",
        "ceildiv",
        "mod",
        "symbol",
    }


def parse_edge_map(spec: Any) -> EdgeMap:
    """Parse a map given as a string, an EdgeMap or an MLIR ``AffineMap``."""
    if isinstance(spec, EdgeMap):
        return spec
    if not isinstance(spec, str):
        # MLIR Python AffineMap (duck-typed so that no compiled module is
        # imported here): its str() is "(d0, d1) -> (d0)".
        if hasattr(spec, "n_dims") and hasattr(spec, "results"):
            return _parse_affine(str(spec), str(spec))
        raise GraphError(f"edge map {spec!r} must be a string like 'ij->i' or an affine map")
    if "(" in spec:
        return _parse_affine(spec, spec)
    return _parse_einsum(spec)


def _parse_einsum(text: str) -> EdgeMap:
    if text.count("->") != 1:
        raise GraphError(f"edge map '{text}' must have the form 'ij->i'")
    lhs, rhs = (part.strip() for part in text.split("->"))
    lhs = lhs.replace(" ", "")
    dims: list[str] = []
    for ch in lhs:
        if not ch.isalpha():
            raise GraphError(f"edge map '{text}': grid dimension '{ch}' must be a single letter")
        if ch in dims:
            raise GraphError(f"edge map '{text}': grid dimension '{ch}' is repeated")
        dims.append(ch)
    if "," in rhs:
        items = [item.strip() for item in rhs.split(",")]
    else:
        # One letter per result; "rank" is one token ("di->drank" = "di->d,rank").
        items = re.findall(r"rank|\S", rhs)
    results: list[tuple[str, int]] = []
    for item in items:
        if item in dims:
            results.append(("dim", dims.index(item)))
        elif item == "rank":
            results.append(("rank", 0))
        elif re.fullmatch(r"\d+", item):
            results.append(("const", int(item)))
        elif item.isalpha() and len(item) == 1:
            raise GraphError(
                f"edge map '{text}': result '{item}' is not a grid dimension "
                f"(the grid dimensions are '{lhs}')"
            )
        else:
            raise GraphError(
                f"edge map '{text}': result '{item}' must be a grid dimension "
                "letter, a non-negative integer or 'rank'"
            )
    return EdgeMap(len(dims), tuple(results), text, tuple(dims))


def _parse_affine(text: str, shown: str) -> EdgeMap:
    match = _AFFINE.match(text)
    if not match:
        raise GraphError(f"edge map '{shown}' is not of the form '(d0, d1) -> (d0)'")
    syms = [s.strip() for s in (match.group("syms") or "").split(",") if s.strip()]
    if len(syms) > 1:
        raise GraphError(
            f"edge map '{shown}' may use one symbol (the rank running the graph), got {len(syms)}"
        )
    dims = [d.strip() for d in match.group("dims").split(",") if d.strip()]
    for d in dims:
        if not _IDENT.match(d):
            raise GraphError(f"edge map '{shown}': '{d}' is not a dimension name")
    if len(set(dims)) != len(dims):
        raise GraphError(f"edge map '{shown}': a dimension name is repeated")
    results: list[tuple[str, int]] = []
    offsets: list[int] = []
    body = match.group("results").strip()
    for item in [r.strip() for r in body.split(",")] if body else []:
        # `l + 1`: a grid dimension shifted by a constant (loop-carried).
        shift = re.fullmatch(r"(\S+)\s*\+\s*(\d+)", item)
        offset = 0
        if shift and shift.group(1) in dims:
            item, offset = shift.group(1), int(shift.group(2))
        offsets.append(offset)
        if item in dims:
            results.append(("dim", dims.index(item)))
        elif item in syms:
            results.append(("rank", 0))
        elif re.fullmatch(r"\d+", item):
            results.append(("const", int(item)))
        else:
            raise GraphError(
                f"edge map '{shown}': result '{item}' is not supported; results "
                "must be grid dimensions (plus a non-negative constant: 'l + 1'), "
                "non-negative integer constants or the rank symbol"
            )
    return EdgeMap(len(dims), tuple(results), shown.strip(), tuple(dims), tuple(offsets))

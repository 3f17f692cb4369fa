"""Device (tile) functions: the code one task instance runs on one CTA.

A device function is a ``func.func`` whose arguments are the task's grid
coordinates (``index``) followed by its buffers (``memref``). ETC keeps its
MLIR source text as is (the compiler parses it with MLIR); this module only
reads the signature, textually, so that graphs can be checked and simulated
without the compiled MLIR extension.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from .errors import GraphError

#: CTAs a thread-block cluster may have (``DeviceFunction.cluster``; the
#: portable sizes on sm_90).
CLUSTER_SIZES = (2, 4, 8)

__all__ = ["DeviceFunction"]

_FUNC = re.compile(
    r"\bfunc\.func\s+(?:(?:private|public|nested)\s+)?"
    r"@(?:\"(?P<quoted>(?:[^\"\\]|\\.)*)\"|(?P<bare>[A-Za-z_][A-Za-z0-9_$.\-]*))\s*\("
)
_OPEN = "([{<"
_CLOSE = ")]}>"


class DeviceFunction:
    """A tile function: MLIR source, signature and an optional numpy reference.

    ``params`` are the MLIR types of the function's arguments (grid
    coordinates first). ``reference(*coords, *arrays)`` computes the same
    tile on numpy arrays, updating outputs in place; the simulator runs it.
    ``block_size`` is the number of threads per CTA the body is written for.

    Extension point: :meth:`from_mlir` is one way to obtain a device
    function; the Python tile builder (:func:`etc.tile`, in
    :mod:`etc.tilebuilder`) is another, which generates ``source`` with the
    MLIR bindings. Graphs, the simulator and the compiler depend only on the
    attributes set here. See ``docs/tiles.md``.
    """

    def __init__(
        self,
        name: str,
        source: str,
        params: tuple[str, ...],
        *,
        reference: Callable[..., Any] | None = None,
        block_size: int = 256,
        defines: tuple[str, ...] | None = None,
    ) -> None:
        if reference is not None and not callable(reference):
            raise GraphError(f"device function '{name}': reference must be callable")
        if (
            not isinstance(block_size, int)
            or isinstance(block_size, bool)
            or not 32 <= block_size <= 1024
            or block_size % 32
        ):
            raise GraphError(
                f"device function '{name}': block_size must be a multiple of 32 in "
                f"[32, 1024], got {block_size!r}"
            )
        for what, items, value in (
            ("params", "MLIR types", params),
            ("defines", "symbols", defines),
        ):
            if isinstance(value, str) or (value is not None and not isinstance(value, Iterable)):
                # A str would become a tuple of its characters.
                raise GraphError(
                    f"device function '{name}': {what} must be a sequence of {items}, got {value!r}"
                )
        self.name = name
        self.source = source
        self.params = tuple(params)
        self.reference = reference
        self.block_size = block_size
        # Every func.func symbol the source defines (helpers included): two
        # different sources must not define the same symbol in one module.
        self.defines = tuple(defines) if defines is not None else (name,)
        #: ``@<name>__prefetch`` when the source defines it: a function with
        #: the tile's signature that every task running the tile calls
        #: before its waits, to start loading what no task writes (weights).
        #: The simulator ignores it.
        self.prefetch = f"{name}__prefetch" if f"{name}__prefetch" in self.defines else None
        #: The prefetch starts copies into shared memory that the body then
        #: consumes (``layer_gemm(core="bulk")``): it must run right before
        #: its own instance, so ``etc.compile(prefetch_next=True)`` refuses it.
        self.prefetch_fills_shared = False
        #: The kernel calls the tile instead of inlining it, whatever
        #: ``etc.compile(outline=...)`` says (``layer_gemm(core="gemv")``:
        #: inlined next to another such tile, its results came out wrong on
        #: an H200, ``bench/RESULTS.md`` item 208).
        self.called = False
        #: Parts that wait for each other (0: none): instances that differ
        #: only in their last grid coordinate, of this many values, spin until
        #: all of them have stored (a split-K meeting shared among its parts,
        #: ``etc.tiles.gemm_tc.share_fragments``). Only the static schedule's
        #: lists run such a task: they deal those instances to different
        #: CTAs, in global order, so the first unfinished block always runs.
        self.meets = 0
        #: CTAs of a thread-block cluster that run each group of this many
        #: instances that differ only in their last grid coordinate (0: no
        #: cluster): instance ``g * cluster + r`` on the cluster's CTA of rank
        #: ``r``, all at once, so they may exchange data through distributed
        #: shared memory and wait for each other at cluster barriers (a
        #: split-K meeting in pairs, ``layer_gemm(meeting="cluster")``). Only
        #: the static schedule's lists place them (``etc.runtime.queue.cluster_ctas``);
        #: the kernel then launches in clusters of this size.
        self.cluster = 0
        #: Buffers the tile reads through TMA: buffer index (after the grid
        #: coordinates) -> (index of the buffer the map describes, box
        #: ``(rows, cols)``[, chunk]): ``chunk`` (default 0) when the source
        #: is in ``etc.tiles.gemm.chunk_weights``' layout. A graph checks
        #: that exactly those buffers are ``Graph.tensor_map`` tables of that
        #: source, box and chunk.
        self.tensor_maps: dict[int, tuple] = {}

    @classmethod
    def from_mlir(
        cls,
        source: str,
        name: str,
        reference: Callable[..., Any] | None = None,
        block_size: int = 256,
    ) -> DeviceFunction:
        """Take ``func.func @name`` from MLIR text ``source``.

        ``source`` may hold other functions (helpers the tile calls) and may
        be wrapped in a ``module { ... }``; everything is kept.
        """
        if not isinstance(source, str):
            raise GraphError(f"device function '{name}': source must be MLIR text")
        clean = _blank_comments(source)
        source, clean = _unwrap_module(source, clean)
        found: dict[str, re.Match[str]] = {}
        for match in _FUNC.finditer(clean):
            symbol = (
                match.group("quoted")
                if match.group("quoted") is not None
                else (match.group("bare"))
            )
            found.setdefault(symbol, match)
        if name not in found:
            known = ", ".join(f"@{s}" for s in found) or "none"
            raise GraphError(
                f"device function '{name}': no 'func.func @{name}' in the MLIR source "
                f"(functions found: {known})"
            )
        match = found[name]
        params, end = _parse_params(clean, match.end() - 1, name)
        _check_after_signature(clean, end, name)
        return cls(
            name,
            source.strip() + "\n",
            params,
            reference=reference,
            block_size=block_size,
            defines=tuple(found),
        )

    @property
    def num_coords(self) -> int:
        """Number of leading ``index`` parameters (the grid coordinates)."""
        count = 0
        for p in self.params:
            if p != "index":
                break
            count += 1
        return count

    def __repr__(self) -> str:
        return f"DeviceFunction({self.name!r}, params=({', '.join(self.params)}))"


def normalize_type(text: str) -> str:
    """A spacing-insensitive form of an MLIR type, for comparisons."""
    return re.sub(r"\s+", "", text)


def _blank_comments(text: str) -> str:
    """Replace ``//`` comments by spaces (positions kept), leaving strings alone."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        else:
            i += 1
    return "".join(out)


def _skip_balanced(clean: str, start: int) -> int:
    """Index just past the bracket group opening at ``start``."""
    depth = 0
    i, n = start, len(clean)
    while i < n:
        ch = clean[i]
        if ch == '"':
            i += 1
            while i < n and clean[i] != '"':
                i += 2 if clean[i] == "\\" else 1
        elif clean.startswith("->", i):
            i += 1  # the '>' of an arrow closes nothing
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise GraphError("unbalanced brackets in MLIR source")


def _split_top_level(clean: str, start: int, end: int) -> list[tuple[int, int]]:
    """Spans of the comma-separated items between ``start`` and ``end``."""
    spans: list[tuple[int, int]] = []
    depth, i, item_start = 0, start, start
    while i < end:
        ch = clean[i]
        if ch == '"':
            i += 1
            while i < end and clean[i] != '"':
                i += 2 if clean[i] == "\\" else 1
        elif clean.startswith("->", i):
            i += 1
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((item_start, i))
            item_start = i + 1
        i += 1
    if clean[item_start:end].strip():
        spans.append((item_start, end))
    return spans


def _parse_params(clean: str, open_paren: int, name: str) -> tuple[tuple[str, ...], int]:
    close = _skip_balanced(clean, open_paren)
    params: list[str] = []
    for lo, hi in _split_top_level(clean, open_paren + 1, close - 1):
        item = clean[lo:hi].strip()
        arg = re.match(r"%[A-Za-z0-9_$.\-]+\s*:\s*", item)
        if not arg:
            raise GraphError(
                f"device function '{name}': cannot read argument '{item}' (expected '%name: type')"
            )
        rest = item[arg.end() :]
        # The type ends where an argument attribute dict or a location begins.
        type_end = len(rest)
        depth = 0
        for k, ch in enumerate(rest):
            if ch in "<([":
                depth += 1
            elif ch in ">)]" and not (ch == ">" and rest[k - 1 : k] == "-"):
                depth -= 1
            elif depth == 0 and (ch == "{" or rest.startswith("loc(", k)):
                type_end = k
                break
        params.append(" ".join(rest[:type_end].split()))
    return tuple(params), close


def _check_after_signature(clean: str, pos: int, name: str) -> None:
    rest = clean[pos:].lstrip()
    if rest.startswith("->"):
        raise GraphError(
            f"device function '{name}' must not return values; write outputs to "
            "its memref arguments"
        )
    if rest.startswith("attributes"):
        brace = clean.index("{", pos)
        rest = clean[_skip_balanced(clean, brace) :].lstrip()
    if not rest.startswith("{"):
        raise GraphError(f"device function '{name}' has no body")


def _unwrap_module(source: str, clean: str) -> tuple[str, str]:
    """Strip an enclosing ``module { ... }`` so the functions can be spliced."""
    match = re.match(r"\s*module\b", clean)
    if not match:
        return source, clean
    pos = match.end()
    sym = re.match(r"\s*@[A-Za-z_][A-Za-z0-9_$.\-]*", clean[pos:])
    if sym:
        pos += sym.end()
    attrs = re.match(r"\s*attributes\s*", clean[pos:])
    if attrs:
        pos = _skip_balanced(clean, pos + attrs.end())
    brace = re.match(r"\s*\{", clean[pos:])
    if not brace:
        return source, clean
    start = pos + brace.end() - 1
    end = _skip_balanced(clean, start)
    return source[start + 1 : end - 1], clean[start + 1 : end - 1]

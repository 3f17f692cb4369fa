"""Paged KV caches for the attention tiles (their ``page_size`` option).

A paged cache is ``memref<LAYERSxPAGESxKVxPAGE_SIZExDxbf16>``: a pool of
pages of ``page_size`` positions, each holding every kv head's rows, and a
block table ``pages: memref<?x?xi32>`` whose row ``b`` lists sequence
``b``'s pages in position order, as a serving engine allocates them
(vLLM's block table). Position ``p`` of sequence ``b`` lies in page
``pages[b, p / page_size]`` at row ``p % page_size``. Several sequences may
share a page they only read (a common prefix).

A tile built for the contiguous cache ``memref<LAYERSxBxKVxSxDxbf16>``
indexes it ``[l, b, g, p, d]``; :func:`rewrite` turns every such load and
store into ``[l, page, g, offset, d]`` and adds the table as an argument.
The tiles that compute cache addresses themselves (``cp.async`` slots, TMA
boxes) call :func:`row` for the 2-D row (``d`` the column) of a position.

Every lookup is clamped: the table index to the page of the sequence's own
position ``L`` (an empty split's clamped position ``L + 1`` may lie past
the table's last column) and the page to the pool's last, so a bad table
gives wrong values, never an access outside the buffers. The host checks
the table before a launch (``etc.models.llama.check_block_table``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import GraphError
from . import _text

#: The block table: row ``b`` holds sequence ``b``'s pages, in order.
PAGES_TYPE = "memref<?x?xi32>"

#: An indexed load or store of a contiguous cache: ``%kc[%l, %b, g, p, d]``.
_ACCESS = re.compile(r"(%[kv]c)\[%l, %b, ([^,\]]+), ([^,\]]+), ([^,\]]+)\]")


def check_page_size(name: str, page_size: Any, least: int = 1) -> None:
    """``page_size`` must be 0 (a contiguous cache) or a power of two of at
    least ``least`` positions (a TMA box's swizzle atom)."""
    if page_size == 0 and not isinstance(page_size, bool):
        return
    if (
        not isinstance(page_size, int)
        or isinstance(page_size, bool)
        or page_size < 1
        or page_size & (page_size - 1)
    ):
        raise GraphError(f"tile '{name}': page_size={page_size!r} must be a power of two")
    if page_size < least:
        raise GraphError(
            f"tile '{name}': page_size={page_size} is below {least} positions: a TMA box "
            f"copies whole 128-byte swizzle atoms of {least} rows, and never crosses a page"
        )


def _prologue(page_size: int, c_t: str) -> str:
    """The constants every lookup uses: the shift and mask of a position,
    the page of ``L`` (the last table column read), the pool's last page."""
    shift = page_size.bit_length() - 1
    return (
        f"  %pg_shift = arith.constant {shift} : index\n"
        f"  %pg_mask = arith.constant {page_size - 1} : index\n"
        f"  %pg_size = arith.constant {page_size} : index\n"
        "  %pg_one = arith.constant 1 : index\n"
        f"  %pg_pool = memref.dim %kc, %pg_one : {c_t}\n"
        "  %pg_last = arith.subi %pg_pool, %pg_one : index\n"
        "  %pg_lastL = arith.shrui %L, %pg_shift : index\n"
    )


def index(prefix: str, pos: str) -> tuple[list[str], str, str]:
    """Lines finding position ``pos`` of sequence ``%b``: its page and the
    row in it (``%<prefix>``, ``%<prefix>_o``)."""
    p = f"%{prefix}"
    lines = [
        f"{p}_i0 = arith.shrui {pos}, %pg_shift : index",
        f"{p}_i = arith.minui {p}_i0, %pg_lastL : index",
        f"{p}_w = memref.load %pages[%b, {p}_i] : {PAGES_TYPE}",
        f"{p}_u = arith.index_castui {p}_w : i32 to index",
        f"{p} = arith.minui {p}_u, %pg_last : index",
        f"{p}_o = arith.andi {pos}, %pg_mask : index",
    ]
    return lines, p, f"{p}_o"


def row(prefix: str, pos: str, g: str, kv_heads: int) -> tuple[list[str], str]:
    """Lines computing the 2-D row (``d`` the column) of position ``pos`` of
    ``(%l, %b, g)``: ``((l * PAGES + page) * KV + g) * PAGE_SIZE + offset``."""
    lines, page, offset = index(prefix, pos)
    p = f"%{prefix}"
    lines += [
        f"{p}_r0 = arith.muli %l, %pg_pool : index",
        f"{p}_r1 = arith.addi {p}_r0, {page} : index",
        f"{p}_kv = arith.constant {kv_heads} : index",
        f"{p}_r2 = arith.muli {p}_r1, {p}_kv : index",
        f"{p}_r3 = arith.addi {p}_r2, {g} : index",
        f"{p}_r4 = arith.muli {p}_r3, %pg_size : index",
        f"{p}_row = arith.addi {p}_r4, {offset} : index",
    ]
    return lines, f"{p}_row"


def rewrite(source: str, name: str, page_size: int, c_t: str) -> str:
    """``source`` (a tile over the contiguous cache) over a paged one:
    ``@<name>`` and ``@<name>__prefetch`` take ``%pages`` after their other
    buffers (before any tensor map) and start with :func:`_prologue`, and
    each indexed load or store of ``%kc`` or ``%vc`` looks its position up
    first. Run before ``_text.with_lengths``, which defines ``%L`` above the
    prologue and adds the positions after ``%pages``."""
    headers = (f"func.func @{name}(", f"func.func @{name}__prefetch(")
    out, found, count = [], 0, 0
    lookups: list[str] = []  # the current line's, before it

    def paged(m: re.Match) -> str:
        nonlocal count
        count += 1
        lines, page, offset = index(f"pgx{count}", m.group(3))
        lookups.extend(lines)
        return f"{m.group(1)}[%l, {page}, {m.group(2)}, {offset}, {m.group(4)}]"

    for line in source.splitlines(keepends=True):
        if line.startswith(headers):
            head, brace = line.rstrip().rsplit(") {", 1)
            assert not brace, line
            maps = head.find(", %kc_map: ")
            maps = len(head) if maps < 0 else maps
            out.append(f"{head[:maps]}, %pages: {PAGES_TYPE}{head[maps:]}) {{\n")
            out.append(_prologue(page_size, c_t))
            found += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        line = _ACCESS.sub(paged, line)
        out.extend(f"{indent}{x}\n" for x in lookups)
        out.append(line)
        lookups.clear()
    assert found, f"no function @{name} in the source"
    text = "".join(out)
    # An access in another form would read the pool as the contiguous cache.
    left = re.findall(r"%[kv]c\[(?!%l, %pgx)[^\]]*\]", text)
    assert not left, f"tile '{name}': cache accesses the paged rewrite does not know: {left}"
    return text


class PagedCache:
    """A paged cache seen as the contiguous one by the numpy references:
    ``cache[l, b, g, p0:p1]`` gathers sequence ``b``'s rows through the
    table, ``cache[l, b, g, p] = row`` writes one."""

    def __init__(self, pages: np.ndarray, table: np.ndarray) -> None:
        self.pages, self.table = pages, np.asarray(table)
        self.page_size = pages.shape[3]

    def _at(self, b: int, positions: Any) -> tuple[Any, Any]:
        positions = np.asarray(positions)
        return self.table[b, positions // self.page_size], positions % self.page_size

    def __getitem__(self, key: tuple) -> np.ndarray:
        layer, b, g, positions = key
        if isinstance(positions, slice):
            positions = np.arange(positions.start, positions.stop)
        page, offset = self._at(b, positions)
        return self.pages[layer, page, g, offset]

    def __setitem__(self, key: tuple, value: np.ndarray) -> None:
        layer, b, g, position = key
        page, offset = self._at(b, position)
        self.pages[layer, page, g, offset] = value


def with_pages(reference, at: int):
    """An attention reference (coordinates, ``L``, ``qkv``, ``rope``, ``kc``,
    ``vc``, ...) over paged caches, the table its argument ``at``."""

    def paged(*args):
        table = args[at]
        kc, vc = (PagedCache(cache, table) for cache in args[7:9])
        return reference(*args[:7], kc, vc, *args[9:at], *args[at + 1 :])

    return paged


def paged_and_ragged(
    source: str, name: str, reference, at: int, page_size: int, lengths: bool, c_t: str
):
    """A tile's ``(source, reference)`` over a paged cache (``page_size``:
    the block table its argument ``at``), then for sequences at their own
    positions (``lengths``: ``lens`` after the table)."""
    if page_size:
        source, reference = rewrite(source, name, page_size, c_t), with_pages(reference, at)
    if lengths:
        source, reference = _text.with_lengths(source, name, reference, at + bool(page_size))
    return source, reference

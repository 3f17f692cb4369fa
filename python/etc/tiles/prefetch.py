"""L2 prefetch of weights: a task that loads what later tasks will read.

A decode step streams every weight once, so the HBM is the bottleneck except
where a stage reads little: at small batches the attention reads a few MB of
KV cache over several microseconds while the rest of the GPU waits for it.
:func:`l2_prefetch` is a tile that fills that idle time: its instances ask
the L2 for the next projections' weights (``cp.async.bulk.prefetch.L2``,
fire and forget), so those stages read part of their bytes from L2.

It reads nothing the graph writes and writes nothing, so it has no effect on
results: its reference is a no-op and its only edge is the wait that places
it in time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..errors import GraphError
from . import _text

__all__ = ["Region", "l2_prefetch"]

#: Rows are taken in runs of this many: an ``m16n8k16`` weight fragment is
#: 8 consecutive rows, so ``eighths`` of every run puts the same share of
#: every fragment (every warp, every k step) in L2.
RUN = 8


@dataclass(frozen=True)
class Region:
    """One weight ``W: memref<layers x rows x cols x bf16>`` to prefetch.

    ``eighths``: how many rows of every run of 8 (8: the whole weight).
    ``layer_offset``: instance ``(l, p)`` prefetches layer ``l +
    layer_offset`` (nothing past the last layer): 1 reads the next layer's
    weights ahead. ``evict_last``: the lines get L2's evict-last priority,
    so the weight stays while other data streams through."""

    rows: int
    cols: int
    eighths: int = RUN
    layer_offset: int = 0
    evict_last: bool = False


#: ``l2_prefetch`` modes: one bulk prefetch per run of rows (the TMA unit
#: walks it) or one ``prefetch.global.L2`` per 128-byte line (the LSUs).
MODES = ("bulk", "lines")
LINE = 128


@checked_arguments
def l2_prefetch(
    regions: Sequence[Region],
    instances: int,
    *,
    layers: int,
    name: str = "l2_prefetch",
    block_size: int = 256,
    mode: str = "bulk",
) -> DeviceFunction:
    """Tile ``(l, p)`` of grid ``(layers, instances)``: the ``p``-th share
    of the chosen rows of every region's layer ``l + layer_offset``.

    Args: one ``memref<layers x rows x cols x bf16>`` per region, in order.
    The work is dealt round-robin over the instances first (item ``q`` to
    instance ``q mod instances``), so every instance, on its own SM, issues
    the same number of bytes: one SM's copy engine alone cannot move
    megabytes in the few microseconds the attention leaves. ``mode="bulk"``:
    a ``cp.async.bulk.prefetch.L2`` per run of 8 rows (``eighths``
    consecutive rows, ``eighths * cols * 2`` bytes); ``mode="lines"``: a
    ``prefetch.global.L2`` per 128-byte line of those rows."""
    _text.check_block(name, block_size)
    _text.positive(name, instances=instances, layers=layers)
    if mode not in MODES:
        raise GraphError(f"tile '{name}': mode {mode!r} is not one of {', '.join(MODES)}")
    if not regions:
        raise GraphError(f"tile '{name}': give at least one region to prefetch")
    for k, r in enumerate(regions):
        if not isinstance(r, Region):
            raise GraphError(
                f"tile '{name}': region {k} is {r!r}, not an etc.tiles.prefetch.Region"
            )
        _text.positive(name, rows=r.rows, cols=r.cols)
        if r.rows % RUN:
            raise GraphError(
                f"tile '{name}': region {k} has {r.rows} rows, not a multiple of {RUN}"
            )
        if r.cols % (LINE // 2 if mode == "lines" else 8):
            raise GraphError(
                f"tile '{name}': region {k} has {r.cols} columns, not a multiple of "
                f"{LINE // 2 if mode == 'lines' else 8} (mode {mode!r})"
            )
        if not 1 <= r.eighths <= RUN:
            raise GraphError(f"tile '{name}': region {k} eighths={r.eighths} is not in 1..{RUN}")
        if not 0 <= r.layer_offset < layers:
            raise GraphError(
                f"tile '{name}': region {k} layer_offset={r.layer_offset} is not in 0..{layers - 1}"
            )
    types = [f"memref<{layers}x{r.rows}x{r.cols}xbf16>" for r in regions]
    signature = ", ".join(["%l: index", "%p: index", *(f"%W{k}: {t}" for k, t in enumerate(types))])
    lines = [
        f"// {name}: L2 prefetch of {len(regions)} weight region(s), "
        f"{instances} instances of {block_size} threads per layer.",
        f"func.func @{name}({signature}) {{",
        "  %tid = gpu.thread_id x",
        f"  %cP = arith.constant {instances} : index",
        f"  %cstride = arith.constant {instances * block_size} : index",
        f"  %cNL = arith.constant {layers} : index",
        "  %tp = arith.muli %tid, %cP : index",
        "  %gid = arith.addi %tp, %p : index",
    ]
    if mode == "bulk" and any(r.evict_last for r in regions):
        lines.append(f"  %policy = {_text.l2_policy('evict_last')}")
    for k, (r, t) in enumerate(zip(regions, types, strict=True)):
        row_bytes = 2 * r.cols
        if mode == "bulk":
            # Item q: run q (its first `eighths` rows, one copy).
            items = r.rows // RUN
            size = [f"    %size{k} = arith.constant {r.eighths * row_bytes} : i32"]
            if r.evict_last:
                asm = (
                    f'"cp.async.bulk.prefetch.L2.global.L2::cache_hint [$0], $1, $2;", "l,r,l" '
                    f"%addr{k}, %size{k}, %policy : (i64, i32, i64) -> ()"
                )
            else:
                asm = (
                    f'"cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r" %addr{k}, %size{k} : '
                    "(i64, i32) -> ()"
                )
            item = [
                f"      %ro{k} = arith.muli %q, %run_bytes{k} : index",
                f"      %a{k} = arith.addi %start{k}, %ro{k} : index",
            ]
        else:
            # Item q: line q % per_run of run q / per_run.
            per_run = r.eighths * row_bytes // LINE
            items, size = r.rows // RUN * per_run, []
            policy = "::evict_last" if r.evict_last else ""
            asm = f'"prefetch.global.L2{policy} [$0];", "l" %addr{k} : (i64) -> ()'
            item = [
                f"      %per_run{k} = arith.constant {per_run} : index",
                f"      %line_bytes{k} = arith.constant {LINE} : index",
                f"      %run{k} = arith.divui %q, %per_run{k} : index",
                f"      %line{k} = arith.remui %q, %per_run{k} : index",
                f"      %ro{k} = arith.muli %run{k}, %run_bytes{k} : index",
                f"      %lo{k} = arith.muli %line{k}, %line_bytes{k} : index",
                f"      %rl{k} = arith.addi %ro{k}, %lo{k} : index",
                f"      %a{k} = arith.addi %start{k}, %rl{k} : index",
            ]
        lines += [
            f"  %off{k} = arith.constant {r.layer_offset} : index",
            f"  %layer{k} = arith.addi %l, %off{k} : index",
            f"  %in{k} = arith.cmpi ult, %layer{k}, %cNL : index",
            f"  scf.if %in{k} {{",
            f"    %base{k} = memref.extract_aligned_pointer_as_index %W{k} : {t} -> index",
            f"    %items{k} = arith.constant {items} : index",
            f"    %run_bytes{k} = arith.constant {RUN * row_bytes} : index",
            f"    %layer_bytes{k} = arith.constant {r.rows * row_bytes} : index",
            *size,
            f"    %lb{k} = arith.muli %layer{k}, %layer_bytes{k} : index",
            f"    %start{k} = arith.addi %base{k}, %lb{k} : index",
            f"    scf.for %q = %gid to %items{k} step %cstride {{",
            *item,
            f"      %addr{k} = arith.index_cast %a{k} : index to i64",
            f"      llvm.inline_asm has_side_effects asm_dialect = att {asm}",
            "    }",
            "  }",
        ]
    lines += ["  return", "}"]

    def reference(layer: int, p: int, *weights: np.ndarray) -> None:
        """No effect on any buffer: the prefetch only warms the L2."""

    return DeviceFunction.from_mlir("\n".join(lines) + "\n", name, reference, block_size)

"""Decoder projections on TMA + ``wgmma`` with split-K (``layer_gemm(core="tma")``).

Same tile semantics, buffers and rounding as :func:`etc.tiles.gemm.layer_gemm`
(``store``, ``residual`` and ``swiglu`` epilogues, ``row_scale`` for a
folded RMSNorm, ``sums_out`` for the next one), for batches of up to 64
rows per block: the block's 64 rows of ``A`` (rows past ``M`` are zeros, the
TMA unit fills them) and its weight rows stream through the
``etc.tiles.gemm_tc`` TMA + mbarrier ring into ``wgmma``, the warpgroups
splitting the block's columns (``split_n``). A block then reads each weight
byte once for all of its rows, with one thread issuing whole 8-16 KB boxes,
where the ``mma.sync`` tiles re-read the activations once per 8-16 columns.

Why split-K: a 64-column block of ``down_proj`` (``N = 2048``) leaves only
32 blocks for 132 SMs. With ``k_splits = S`` tile ``(.., s)`` multiplies
the ``s``-th of ``S`` equal parts of ``k`` and stores its float32 product
in the workspace ``P[s*M + row, col]`` (``P: memref<?x?xf32>``, the up
rows' products ``n`` columns further). Thread 0 then adds 1 to the block's
counter ``cnt[counter_row, i * (N / BN) + j]`` (``cnt: memref<?x?xi32>``,
acquire-release at GPU scope, after a CTA barrier); the instance that
brings it to ``S`` resets it to 0, adds the ``S`` parts in part order
(loads that bypass L1, so an earlier layer's lines are never read) and
runs the epilogue. The sum's order does not depend on which part finished
last, so a step is bit-reproducible. Counters must be zero before the first
launch; every completed launch leaves them zero. Consecutive projections
may share ``P`` (each reads it only after its own parts are all written, and
the next stage starts after that).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..errors import GraphError
from . import _mma, _text
from . import gemm as _gemm
from . import gemm_tc as _tc

__all__ = [
    "layer_gemm_tma",
    "MEETINGS",
    "PART_TYPE",
    "COUNT_TYPE",
    "STAMPS",
    "STAMPS_TYPE",
    "STAMP_SLOTS",
]

#: How a split projection's parts meet (``layer_gemm_tma(meeting=...)``).
MEETINGS = ("rows", "fragments", "cluster")
#: The split-K workspace: (parts x rows) x columns of float32 products.
PART_TYPE = _tc.PART_TYPE
#: The split-K counters: one row per projection, one counter per block.
COUNT_TYPE = _tc.COUNT_TYPE
#: Shared memory a tile may take: two CTAs per SM (the decoder's kernels).
SMEM_LIMIT = _gemm.MAX_SHARED_BYTES // 2
#: ``layer_gemm_tma(stamps=True)``: what each of an instance's stamp words
#: holds (thread 0's ``%clock64``, then ``%globaltimer`` in ns).
STAMPS = (
    "entry",  # the function's first instruction (after the instance's waits)
    "loop_end",  # the k loop done, the accumulators final: the epilogue's start
    "met",  # the block's last part: the other parts' products loaded and added
    "end",  # the part stored and counted, or the block's output stored
    "entry_ns",
    "end_ns",
)
#: The stamps buffer: ``[layer, stamp row, slot, word]``.
STAMPS_TYPE = f"memref<?x?x?x{len(STAMPS)}xi64>"
#: Slots per 64-row block of a stamp row: instance ``(j, i, s)`` of a layer
#: writes slot ``(j * ceil(M / 64) + i) * k_splits + s``.
STAMP_SLOTS = 1024


class _Text(_tc._Text):
    """``gemm_tc``'s text buffer, whose function also defines the constants
    the ``etc.tiles.gemm`` epilogues name (``%c1``, ``%c<n>_``, ...)."""

    #: Functions appended to the tile's source (its prefetch).
    extra = ""

    def source(self, name: str, signature: str, globals_: list[str], comment: str) -> str:
        return _gemm._source(name, signature, self, globals_, comment) + self.extra


@checked_arguments
def layer_gemm_tma(
    block_m: int,
    block_n: int,
    n: int,
    k: int,
    *,
    layers: int | None,
    epilogue: str,
    name: str,
    block_size: int = 256,
    stages: int | None = None,
    columns_first: bool = False,
    row_scale: tuple[int, int, float] | None = None,
    sums_out: tuple[int, int] | None = None,
    k_splits: int = 1,
    counter_row: int = 0,
    smem_limit: int = SMEM_LIMIT,
    prefetch: bool | int | str = False,
    a_box: int = 64,
    rotate_k: bool = False,
    weight_chunk: int = 0,
    epilogue_ahead: bool = False,
    meeting: str = "rows",
    meet_share: int = 1,
    refill: str = "wait",
    l2_evict_first: bool = False,
    stamps: bool = False,
) -> DeviceFunction:
    """:func:`etc.tiles.gemm.layer_gemm` with ``core="tma"`` (module
    docstring; ``layer_gemm`` has checked the epilogue, ``n``, ``layers``
    and ``sums_out``). Coordinates ``(l, i, j)`` (``(l, j, i)`` with
    ``columns_first``; no ``l`` when ``layers`` is None), then ``s`` with
    ``k_splits > 1``; buffers as ``layer_gemm``'s, then ``P, cnt`` with
    ``k_splits > 1``, then the tensor maps of ``A`` and ``W`` (which
    ``Graph.task`` declares). ``stages`` (default 4) k-tiles of 64 in flight.

    ``prefetch`` adds ``@<name>__prefetch``: before the instance waits for
    its activations, thread 0 asks the L2 for the weight boxes of its first
    ``stages`` k-tiles (an int: that many) with
    ``cp.async.bulk.prefetch.tensor``, so the ring's first loads after the
    wait hit L2. ``prefetch="shared"``: thread 0 initialises the ring's
    barriers and loads the first stages' weight boxes into the ring itself
    (:func:`etc.tiles.gemm_tc.tma_prefetch_ring`); the body loads their
    activation boxes after the wait. ``"shared_l2"``: that, and the part's
    later weight boxes asked into L2, so the ring's refills after the wait
    hit L2. (Session 13 measured this 3-4 % faster
    on an H200 and withdrew it for wrong results after long waits; the cause
    was the tiles' missing ``mbarrier.inval``, ``bench/RESULTS.md`` items 52
    and 73.) ``a_box`` (16, 32 or 64): rows per activation
    box; boxes that start past ``M`` are not loaded (at B=8 a 64-row box
    made the TMA unit fill 56 rows of zeros per stage), their ring rows'
    products are garbage and never stored. ``rotate_k``: each tile starts
    its part's k loop at k-tile ``j`` (its column block) and wraps around,
    so a stage's tiles do not read the same activation boxes at once.
    ``weight_chunk=64``: ``W`` in ``etc.tiles.gemm.chunk_weights``' layout,
    read through a 4-D map (``Graph.tensor_map(chunk=64)``).
    ``epilogue_ahead``: the epilogue's loads that do not depend on the
    product (``row_scale``'s row sums, the ``residual``) are issued before
    the k loop instead of after the split-K meeting, off its critical path
    (a few registers held across the loop).

    ``meeting`` (with ``k_splits > 1``): how the parts meet in ``P``.
    ``"rows"``: each part stores its products at their rows and columns
    (8-byte stores), the last loads the others' likewise. ``"fragments"``:
    in the accumulators' fragment order (:func:`etc.tiles.gemm_tc.meet_fragments`,
    the dense tile's meeting: a warp's 512 contiguous bytes per 16-byte
    access, the last part's own products from its registers); block ``b`` of
    the projection (``i * (n / block_n) + j``) takes ``k_splits * 64 *
    block_n`` floats (twice with ``swiglu``) at ``b`` times that, so ``P``
    needs ``k_splits * 64 * ceil(M / 64) * n`` floats (``2 n``); the
    threads whose rows are all past ``M`` store and load none.
    ``"cluster"`` (an even ``k_splits``): parts ``2g`` and ``2g + 1`` run at
    once on the two CTAs of a thread-block cluster (the tile's
    :attr:`etc.DeviceFunction.cluster` is 2: the kernel launches in
    clusters of 2 and the static lists put each pair there); the odd part
    hands its products to the even one through its own shared memory (its
    idle ring, read over distributed shared memory between two cluster
    barriers, :func:`etc.tiles.gemm_tc.pair_fragments`) instead of the L2,
    and with more than 2 parts the pairs' even parts meet as
    ``"fragments"`` do, adding the pair sums ``(p[2g] + p[2g+1])`` in pair
    order (other bits than ``"fragments"``' part order then; the same with
    2 parts). Static schedule only.
    ``meet_share`` (with ``"fragments"``): the block's last ``meet_share``
    parts to arrive each add and store a ``meet_share``-th of every
    thread's fragments (:func:`etc.tiles.gemm_tc.share_fragments`; the
    earlier sharers spin until the last arrives), so the last part loads
    that much less; the tile then needs all of a block's parts able to run
    at once (:attr:`etc.DeviceFunction.meets`: the static schedule's lists,
    which deal them to different CTAs).

    ``stamps`` (a measuring aid): a last buffer ``%stamps`` (:data:`STAMPS_TYPE`)
    into which thread 0 writes its clock at the points of :data:`STAMPS`
    (``met`` only in a block's last part, and not with ``meet_share > 1``),
    at ``[l, counter_row, slot]`` (:data:`STAMP_SLOTS`)."""
    stages = 4 if stages is None else stages
    if meeting not in MEETINGS:
        raise GraphError(f"tile '{name}': meeting must be one of {MEETINGS}, got {meeting!r}")
    _mma.positive(name, "k_splits", k_splits)
    units = block_n // (block_size // 128) // 8
    needs = ("meeting='fragments'", meeting == "fragments")
    _tc.check_meet_share(name, meet_share, k_splits, units, needs)
    if meeting == "cluster" and (k_splits % 2 or stages < 2):
        raise GraphError(
            f"tile '{name}': meeting='cluster' meets parts in pairs, each pair's odd part "
            f"handing its products over in its ring: it needs an even k_splits and stages "
            f">= 2, got k_splits={k_splits}, stages={stages}"
        )
    if block_m != 64:
        raise GraphError(
            f"tile '{name}': core='tma' takes blocks of 64 rows (one wgmma M), got block_m={block_m}"
        )
    if block_size % 128:
        raise GraphError(f"tile '{name}': block_size={block_size} is not whole warpgroups of 128")
    groups = block_size // 128
    if block_n % (8 * groups) or n % block_n:
        raise GraphError(
            f"tile '{name}': block_n={block_n} must divide n={n} and split into {groups} "
            "warpgroup slices of a multiple of 8 columns"
        )
    if k % (k_splits * _tc.TMA_BLOCK_K):
        raise GraphError(
            f"tile '{name}': k={k} does not split into {k_splits} parts of a multiple of "
            f"{_tc.TMA_BLOCK_K}"
        )
    shared = prefetch in ("shared", "shared_l2")
    if not shared and (
        not isinstance(prefetch, (bool, int)) or (not isinstance(prefetch, bool) and prefetch < 1)
    ):
        raise GraphError(
            f"tile '{name}': prefetch must be a bool, an int >= 1, 'shared' or 'shared_l2', "
            f"got {prefetch!r}"
        )
    if a_box not in (16, 32, 64):
        raise GraphError(f"tile '{name}': a_box={a_box!r} must be 16, 32 or 64")
    if not isinstance(counter_row, int) or counter_row < 0:
        raise GraphError(f"tile '{name}': counter_row must be an int >= 0, got {counter_row!r}")
    per_n = 2 if epilogue == "swiglu" else 1
    chunk = _tc.check_tma_chunk(name, "tma", weight_chunk, k, per_n * n)
    cw, part, split = block_n // groups, k // k_splits, k_splits > 1
    _tc.plan_tma(name, block_m, per_n * block_n, part, block_size, stages, smem_limit)
    stacked = layers is not None
    if stamps and (not stacked or (n // block_n) * k_splits > STAMP_SLOTS):
        raise GraphError(
            f"tile '{name}': stamps take a layer's tiles (layers=None here: {layers is None}) "
            f"of at most {STAMP_SLOTS} column blocks x parts a row block, got "
            f"{n // block_n} x {k_splits}"
        )
    at, wt, ct = _gemm._layer_types(layers, per_n, n, k)
    st = _text.SUMS_TYPE
    t = _Text()
    r0, r1, n0, valid, m_rows = _gemm._layer_block(t, at, block_m, block_n, n)
    t.emit(f"scf.if {valid} {{")
    t.indent += "  "
    stamp = _stamper(t, stamps, m_rows, counter_row, k_splits)
    stamp(t, "entry", "entry_ns")
    sums = ("%S", st, _gemm._layer_slot(t, stacked, *sums_out)) if sums_out is not None else None
    scale = None
    if row_scale is not None:
        stride, offset, eps = row_scale
        scale = (("%R", st, _gemm._layer_slot(t, stacked, stride, offset)), eps)
    globals_: list[str] = []
    reduce = None
    if split:
        flag, flag_global = _mma.last_arrival_flag(name)
        if meeting != "cluster" or k_splits > 2:  # a pair alone meets without a count
            globals_.append(flag_global)
        ring_b = (name, stages, per_n * block_n)
        reduce = _split_reduce(
            n, block_n, k_splits, counter_row, per_n, r1, m_rows, flag, meeting, block_size,
            meet_share, ring_b,
        )  # fmt: skip

    def make_store(t: _Text, wn_i: str) -> Callable[..., None]:
        store = _gemm._layer_store(epilogue, t.add(n0, t.mul(wn_i, cw)), cw // 8, ct, r1, sums)
        if scale is not None:
            store = _gemm._scaled_rows(store, scale[0], k, scale[1], r1)
        return store

    ahead: list = []  # the store whose prologue ran before the k loop

    def finish(t: _Text, acc, rows, wn_i, col_lane) -> None:
        stamp(t, "loop_end")
        wcol = t.add(n0, t.mul(wn_i, cw))
        if reduce is not None and meet_share > 1:  # each sharer stores its fragments
            reduce(t, acc, rows, wcol, col_lane, ahead.pop() if ahead else make_store(t, wn_i))
            return
        if reduce is not None:
            acc = reduce(t, acc, rows, wcol, col_lane)  # opens "the last part" regions
            stamp(t, "met")
        store = ahead.pop() if ahead else make_store(t, wn_i)
        store(t, acc, rows, col_lane)
        for _ in range(reduce.regions if reduce is not None else 0):
            t.end()

    def prologue(t: _Text, rows, wn_i, col_lane) -> None:
        ahead.append(make_store(t, wn_i))
        ahead[-1].prologue(t, rows, col_lane)

    if epilogue_ahead:
        finish.prologue = prologue

    loads = _loads(t, per_n, n, n0, r0, m_rows, cw, groups, stacked, a_box, chunk)
    globals_ += _tc._body_tma(
        t, name=name, k=part, block_m=block_m, b_rows=per_n * block_n, block_size=block_size,
        stages=stages, a_loads=loads[0], b_loads=loads[1], r0=r0, epilogue=finish,
        stage_output=False, split_n=True, k_offset=t.mul("%ks", part) if split else None,
        weights_prefetched=shared, rotate="%j" if rotate_k else None, refill=refill,
        b_evict_first=l2_evict_first,
    )  # fmt: skip
    stamp(t, "end", "end_ns")
    t.close()
    ij = "%j: index, %i: index" if columns_first else "%i: index, %j: index"
    coords = (f"%l: index, {ij}" if stacked else ij) + (", %ks: index" if split else "")
    buffers = ["%A: " + at]
    buffers += [f"%R: {st}"] if row_scale is not None else []
    buffers += [f"%W: {wt}", f"%C: {ct}"]
    buffers += [f"%S: {st}"] if sums_out is not None else []
    buffers += [f"%P: {PART_TYPE}", f"%cnt: {COUNT_TYPE}"] if split else []
    buffers += [f"%stamps: {STAMPS_TYPE}"] if stamps else []
    reference = _reference(
        block_n, n, part, epilogue, stacked=stacked, columns_first=columns_first,
        row_scale=row_scale, sums_out=sums_out, k_splits=k_splits, counter_row=counter_row, k=k,
        chunk=chunk, pairs=meeting == "cluster",
    )  # fmt: skip
    w_index = 2 if row_scale is not None else 1
    signature = f"{coords}, {', '.join(buffers)}"
    if prefetch:
        tp = _Text()
        r0p, _, n0p, valid_p, m_rows_p = _gemm._layer_block(tp, at, block_m, block_n, n)
        tp.emit(f"scf.if {valid_p} {{")
        tp.indent += "  "
        k_offset = tp.mul("%ks", part) if split else None
        if shared:  # the same boxes as the body's: the stage's expected bytes
            a_p, b_p = _loads(tp, per_n, n, n0p, r0p, m_rows_p, cw, groups, stacked, a_box, chunk)
            _tc.tma_prefetch_ring(
                tp, name=name, k=part, block_m=block_m, b_rows=per_n * block_n,
                block_size=block_size, stages=stages, a_loads=a_p, b_loads=b_p,
                k_offset=k_offset, rotate="%j" if rotate_k else None,
                b_evict_first=l2_evict_first,
            )  # fmt: skip
            loaded = "the ring's barriers and first weight boxes, before the waits"
            rest = part // _tc.TMA_BLOCK_K
            if prefetch == "shared_l2" and rest > stages:  # the rest of the part into L2
                w_loads = _weight_loads(tp, per_n, n, n0p, cw, groups, stacked, chunk)
                rot = ("%j", rest) if rotate_k else None
                _tc.tma_prefetch_l2(tp, w_loads, rest, k_offset, rotate=rot, first=stages)
                loaded += ", the rest of its weights asked into L2"
        else:
            b_loads = _weight_loads(tp, per_n, n, n0p, cw, groups, stacked, chunk)
            tiles = min(stages if prefetch is True else int(prefetch), part // _tc.TMA_BLOCK_K)
            rot = ("%j", part // _tc.TMA_BLOCK_K) if rotate_k else None
            _tc.tma_prefetch_l2(tp, b_loads, tiles, k_offset, rotate=rot)
            loaded = "the first weight boxes into L2"
        tp.close()
        maps = "".join(f", %{arg}_map: {_tc.MAP_TYPE}" for arg in ("A", "W"))
        t.extra = tp.source(f"{name}__prefetch", signature + maps, [], f"{name}: {loaded}")
    fn = _tc.finish_tma(
        t, name, signature, globals_,
        f"{name}: {_gemm.LAYER_WHAT[epilogue]}, bf16, 64x{block_n} blocks, {stages} stages, TMA + wgmma"
        + (f", {k_splits} parts of k" if split else ""),
        reference, block_size, len(buffers), [("A", 0, a_box), ("W", w_index, cw, chunk)],
    )  # fmt: skip
    fn.prefetch_fills_shared = shared
    fn.meets = k_splits if meet_share > 1 else 0
    fn.cluster = 2 if meeting == "cluster" and split else 0
    return fn


def _stamper(t: _Text, stamps: bool, m_rows: str, row: int, parts: int) -> Callable[..., None]:
    """``stamp(t, *words)``: thread 0 writes its clock (``*_ns`` words: the
    ``%globaltimer``) at ``words`` of the instance's slot; nothing without
    ``stamps``."""
    if not stamps:
        return lambda t, *words: None
    first = t.op("st0", f"arith.cmpi eq, {t.op('tid', 'gpu.thread_id x')}, {t.c(0)} : index")
    row_blocks = t.op("strb", f"arith.ceildivui {m_rows}, {t.c(64)} : index")
    block = t.add(t.op("stj", f"arith.muli %j, {row_blocks} : index"), "%i")
    slot = t.add(t.mul(block, parts), "%ks") if parts > 1 else block
    at = f"%l, {t.c(row)}, {slot}"

    def stamp(t: _Text, *words: str) -> None:
        for word in words:
            timer = "globaltimer" if word.endswith("_ns") else "clock64"
            value = t.op("st", _text.read_timer(timer))
            t.emit(f"scf.if {first} {{")
            t.emit(
                f"  memref.store {value}, %stamps[{at}, {t.c(STAMPS.index(word))}] : {STAMPS_TYPE}"
            )
            t.emit("}")

    return stamp


def _loads(
    t: _Text, per_n: int, n: int, n0: str, r0: str, m_rows: str, cw: int, groups: int,
    stacked: bool, a_box: int, chunk: int = 0,
) -> tuple[list, list]:  # fmt: skip
    """The tile's TMA boxes: ``A``'s rows in boxes of ``a_box`` (all but the
    first only where they start before ``m_rows``), then the weight boxes."""
    a_map = _tc._map_pointer(t, "%A_map")
    a_loads = []
    for c in range(64 // a_box):
        row = t.add(r0, c * a_box)
        cond = () if c == 0 else (t.op("inb", f"arith.cmpi ult, {row}, {m_rows} : index"),)
        a_loads.append((a_map, row, a_box, *cond))
    return a_loads, _weight_loads(t, per_n, n, n0, cw, groups, stacked, chunk)


def _weight_loads(
    t: _Text, per_n: int, n: int, n0: str, cw: int, groups: int, stacked: bool, chunk: int = 0
) -> list:
    """Each warpgroup's weight boxes: its gate (or only) rows, then its up rows."""
    w_map = _tc.weight_map(t, "%W_map", chunk)
    w_row = t.add(t.mul("%l", per_n * n), n0) if stacked else n0
    b_loads = []
    for g in range(groups):
        b_loads.append((w_map, t.add(w_row, g * cw), cw))
        if per_n == 2:
            b_loads.append((w_map, t.add(w_row, g * cw + n), cw))
    return b_loads


def _split_reduce(
    n: int, block_n: int, parts: int, counter_row: int, per_n: int, r1: str, m_rows: str,
    flag: str, meeting: str, block_size: int, share: int = 1,
    ring_b: tuple[str, int, int] | None = None,
) -> Callable[..., list]:  # fmt: skip
    """The split-K meeting (module docstring) as an epilogue step: stores this
    part, counts it, and in the last part opens ``scf.if`` regions (``reduce.regions``
    of them, closed by the caller) and returns the summed accumulators; with
    ``share > 1`` the sharers store their fragments with the caller's
    ``store`` instead. ``meeting="cluster"``: the parts meet in pairs on a
    cluster's two CTAs first (:func:`etc.tiles.gemm_tc.pair_fragments`,
    through the odd part's ring ``ring_b = (tile, stages, rows)``, its
    ``B`` stages), then the pairs' even parts through ``P`` as
    ``"fragments"`` does, when more than one pair."""

    def reduce(t: _Text, acc, rows, wcol, col_lane, store=None) -> list | None:
        def block(t: _Text) -> str:
            return t.add(t.mul("%i", n // block_n), "%j")

        def slot(t: _Text) -> str:
            width = t.op("cw", f"memref.dim %cnt, {t.c(1)} : {COUNT_TYPE}")
            return t.add(t.op("cr", f"arith.muli {t.c(counter_row)}, {width} : index"), block(t))

        if meeting != "rows":
            # A thread whose first row is past the batch holds no row to keep.
            live = t.op("live", f"arith.cmpi ult, {rows[0]}, {r1} : index")
        if meeting == "cluster":
            assert ring_b is not None
            ring = _tc.ring_b_base(t, *ring_b)
            acc = _tc.pair_fragments(t, acc, "%ks", ring, block_size, live)
            if parts == 2:
                return acc
            pair = t.bin("divui", "%ks", 2)
            return _tc.meet_fragments(
                t, acc, parts // 2, pair, slot, flag, block_size, part_block=block,
                p_type=PART_TYPE, live=live,
            )  # fmt: skip
        if meeting == "fragments":
            if share > 1:
                _tc.share_fragments(
                    t, acc, parts, "%ks", slot, flag, block_size, share,
                    lambda t, sums, units: store(t, sums, rows, col_lane, frags=units),
                    per_n=per_n, part_block=block, p_type=PART_TYPE, live=live,
                )  # fmt: skip
                return None
            return _tc.meet_fragments(
                t, acc, parts, "%ks", slot, flag, block_size, part_block=block, p_type=PART_TYPE,
                live=live,
            )  # fmt: skip
        nf = len(acc[0]) // per_n
        cols = [
            t.add(t.add(wcol, 8 * (f % nf) + (n if f >= nf else 0)), col_lane)
            for f in range(per_n * nf)
        ]
        return _tc.meet_parts(t, acc, rows, cols, r1, m_rows, parts, "%ks", slot, flag)

    reduce.regions = 2 if meeting == "cluster" and parts > 2 else 1  # type: ignore[attr-defined]
    return reduce


def _reference(
    block_n: int, n: int, part: int, epilogue: str, *, stacked: bool, columns_first: bool,
    row_scale, sums_out, k_splits: int, counter_row: int, k: int, chunk: int = 0,
    pairs: bool = False,
) -> Callable[..., None]:  # fmt: skip
    """The numpy reference: the same parts, counters and part-order sum
    (``W`` in the ``chunk`` layout when given; ``pairs``: the sum of the
    pair sums ``p[2g] + p[2g+1]``, ``meeting="cluster"``'s order)."""
    block_m = 64
    n_coords = (3 if stacked else 2) + (1 if k_splits > 1 else 0)

    def reference(*args) -> None:
        coords, bufs = args[:n_coords], list(args[n_coords:])
        layer = coords[0] if stacked else 0
        a, b = coords[1:3] if stacked else coords[0:2]
        i, j = (b, a) if columns_first else (a, b)
        s = coords[-1] if k_splits > 1 else 0
        A = bufs.pop(0)
        R = bufs.pop(0) if row_scale is not None else None
        W, C = bufs.pop(0), bufs.pop(0)
        S_out = bufs.pop(0) if sums_out is not None else None
        W = W[layer] if stacked else W
        m = A.shape[0]
        rs = slice(i * block_m, min((i + 1) * block_m, m))
        cs = slice(j * block_n, (j + 1) * block_n)
        if rs.start >= rs.stop or cs.start >= n:
            return
        ks = slice(s * part, (s + 1) * part)
        acc = _mma.bf16_matmul(A[rs, ks], _mma.weight_rows(W, cs, chunk)[:, ks])
        up_cs = slice(cs.start + n, cs.stop + n)
        up = None
        if epilogue == "swiglu":
            up = _mma.bf16_matmul(A[rs, ks], _mma.weight_rows(W, up_cs, chunk)[:, ks])
        if k_splits > 1:
            P, cnt = bufs[:2]
            prs = slice(s * m + rs.start, s * m + rs.stop)
            P[prs, cs] = acc
            if up is not None:
                P[prs, up_cs] = up
            blk = i * (n // block_n) + j
            cnt[counter_row, blk] += 1
            if cnt[counter_row, blk] != k_splits:
                return
            cnt[counter_row, blk] = 0
            acc, up = np.zeros_like(acc), None if up is None else np.zeros_like(up)
            group = 2 if pairs else 1
            for q0 in range(0, k_splits, group):
                rows_of = [slice(q * m + rs.start, q * m + rs.stop) for q in range(q0, q0 + group)]
                # sum(...) adds left to right in float32: a pair's p[2g] first.
                acc = acc + sum((P[r, cs] for r in rows_of[1:]), P[rows_of[0], cs])
                if up is not None:
                    up = up + sum((P[r, up_cs] for r in rows_of[1:]), P[rows_of[0], up_cs])
        r = _gemm._row_scale_reference(row_scale, R, layer, rs, k)
        _gemm.finish_layer_reference(epilogue, acc, up, r, C, rs, cs, S_out, sums_out, layer)

    return reference

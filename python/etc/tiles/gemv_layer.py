"""A decoder projection for one row on CUDA cores (``layer_gemm(core="gemv")``).

At batch 1 a projection is a matrix-vector product: the tensor cores have
nothing to do, and what bounds it is how fast the weights stream. The MoE's
GEMV slot tiles (:mod:`etc.tiles.gemv`) showed the rate: whole 128-byte lines
copied by a per-thread ``cp.async`` ring reach ~4 TB/s on an H200 where the
``mma.sync`` tiles' half-line fragment copies reach ~3.2-3.5
(``bench/RESULTS.md``, MoE items 102-103). This tile is that stream with the
decoder's epilogues: the sync core's buffers, signature, reference and
rounding, over one row of ``A`` (``block_m = 1``; tile ``(l, i, j)`` is row
``i``).

Layout of a ``block_size``-thread CTA over the block's ``NR`` weight rows
(``block_n``, twice that for ``swiglu``: the gate rows, then the up rows
``n`` further): 8 lanes share a row (lane ``p`` copies the 16-byte piece
``p`` of each 128-byte k chunk), so a warp covers 4 rows, and each thread
owns ``rows_per_thread`` rows 4 apart. The ``NR / (4 * rows_per_thread)``
row groups of warps leave the other warps to split ``k``: warp ``w`` takes
row group ``w % G`` and the chunks ``c = w // G (mod KS)``, so a narrow
block (8 columns) still streams on all 8 warps. Each thread reads back only
its own ring slots (no barrier in the loop); the slices' sums meet in
workgroup memory, in slice order, and thread ``t < block_n`` finishes
column ``t``: the folded norm's row scale, then ``store``, ``residual`` (the
old value loaded before the loop) or ``swiglu`` (Hugging Face's rounding),
and ``sums_out``'s fixed-point sum of squares (one atomic per warp).

With ``block_m`` = 8 to 64 (a few to a few dozen decode sequences) the tile
runs the same stream on ``mma.sync``, the weights as the ``A`` operand
(``m16n8k16``: 16 weight rows by 8 sequences, one mma per 8-row block), so
each weight byte is read once for all of the tile's rows. A warp takes 16
weight rows; lane ``(g, q)`` (``g = lane / 4``) copies pieces ``q`` and ``q + 4`` of rows ``g`` and
``g + 8`` of each chunk into its own ring slots, so a warp's copies still
cover whole lines and no lane reads another's slots. ``k`` is permuted
inside each 32-value half chunk so that a lane's 16-byte piece *is* its
``A`` fragment for two mmas (logical ``k`` 2q, 2q + 1, 2q + 8, 2q + 9 of
mma ``h`` are the piece's values 4h .. 4h + 3); its ``B`` fragment is then
the same 16 bytes of sequence ``g``'s activation row, read from global
memory (the L1 serves the CTA's other warps) one chunk ahead. From 32 rows
on, a chunk's activations would not fit in the 128 registers of two CTAs
an SM beside the next chunk's: each half chunk's are loaded just before its
mmas, and the epilogue's row scales and residuals after the loop.

Those per-lane slots make each ``cp.async`` instruction of a warp read
half lines (pieces 0-3 of 8 rows, then pieces 4-7), where the one-row
mode's read 4 whole lines; with ``whole_lines`` (:class:`LineRing`) copy
``f`` of lane ``(s, p)`` (``s = lane / 8``) takes piece ``p`` of the warp's
row ``4 f + s``, so every instruction reads whole lines, and the lanes read
each other's copies: the loop syncs the warp after each wait and before
each refill.
"""

from __future__ import annotations

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..dtypes import bf16_to_f32
from ..errors import GraphError
from . import _mma, _text
from ._mma import Text as _Text
from .gemm import (
    LAYER_WHAT,
    _layer_signature,
    _layer_slot,
    _layer_types,
    _load_sum,
    _source,
    add_fixed_sum,
    layer_gemm_reference,
)
from .gemv import ThreadRing, cp_async_16, fma_chunk, lane_sum

#: Lanes that share a weight row (16 bytes each of a 128-byte chunk).
LANES_PER_ROW = 8
#: Elements of a k chunk (128 bytes of bf16).
CHUNK = 64
#: Rows of a tile: one row on CUDA cores, or 8 to 64 on ``mma.sync``.
BLOCK_ROWS = (1, 8, 16, 32, 64)
#: Weight rows of a warp on ``mma.sync`` (the ``m`` of ``m16n8k16``).
MMA_ROWS = 16


@checked_arguments
def layer_gemv(
    block_n: int,
    n: int,
    k: int,
    *,
    layers: int | None,
    epilogue: str,
    name: str,
    block_size: int = 256,
    stages: int | None = None,
    rows_per_thread: int = 2,
    columns_first: bool = False,
    row_scale: tuple[int, int, float] | None = None,
    sums_out: tuple[int, int] | None = None,
    prefetch_ring: bool | int = False,
    block_m: int = 1,
    short_path: bool = True,
    whole_lines: bool = False,
    argmax_key: bool = False,
) -> DeviceFunction:
    """:func:`etc.tiles.gemm.layer_gemm` with ``core="gemv"`` (module
    docstring): ``stages`` ring slots per thread and row (default 4; at most
    one more than the chunks of a k slice are used) and ``prefetch_ring``
    (the ring's first ``stages - 1`` chunks, or that many, issued by
    ``@<name>__prefetch`` before the instance's waits); ``block_m`` rows a
    tile (:data:`BLOCK_ROWS`; 8 to 64: on ``mma.sync``, ``rows_per_thread``
    unused; ``short_path``: a 16-row tile of at most 8 rows takes an 8-row
    loop, off where no tile has so few; ``whole_lines``: the weights'
    copies read whole lines, :class:`LineRing`; ``argmax_key``: the
    greedy argmax folded into the epilogue, :func:`argmax_key_reference`).
    No L2 evict-first
    hint: with the sync core's hinted copies the tiny decoder stopped with
    CUDA_ERROR_ILLEGAL_INSTRUCTION under the dynamic schedule without early
    pushes (``bench/RESULTS.md`` item 208), and at B = 1 the hint gained
    nothing (item 207)."""
    bs = block_size
    warps = _text.check_block(name, bs)
    stages = 4 if stages is None else stages
    _text.positive(name, block_n=block_n, k=k, stages=stages, rows_per_thread=rows_per_thread)
    if block_m not in BLOCK_ROWS:
        raise GraphError(
            f"tile '{name}': core='gemv' computes 1 row a tile (CUDA cores) or 8, 16, 32 or 64 "
            f"(mma.sync): block_m={block_m}"
        )
    per_n = 2 if epilogue == "swiglu" else 1
    nr = per_n * block_n
    rpt = rows_per_thread
    warp_rows = MMA_ROWS if block_m > 1 else 4 * rpt
    groups = nr // warp_rows
    if nr % warp_rows or warps % groups:
        how = "16 per warp on mma.sync" if block_m > 1 else f"4 per warp, rows_per_thread={rpt}"
        raise GraphError(
            f"tile '{name}': a gemv block of {nr} weight rows on {warps} warps needs a "
            f"multiple of {warp_rows} rows ({how}) in a number of warp groups dividing "
            f"{warps}; got block_n={block_n}"
        )
    if block_m > 1 and sums_out is not None and block_n % 32 and 32 % block_n:
        raise GraphError(
            f"tile '{name}': sums_out over {block_m} rows adds each row's squares over a "
            f"warp's lanes: block_n={block_n} must divide 32 or be a multiple of it"
        )
    if whole_lines and block_m == 1:
        raise GraphError(
            f"tile '{name}': whole_lines applies to block_m 8 to 64 (one row's copies "
            "already read whole lines)"
        )
    if argmax_key and (epilogue != "store" or (block_m > 1 and block_n % 32 and 32 % block_n)):
        raise GraphError(
            f"tile '{name}': argmax_key folds the argmax of stored logits into the epilogue: it "
            f"needs epilogue='store' (got {epilogue!r}) and, over {block_m} rows, block_n "
            f"dividing 32 or a multiple of it (a row's keys meet over its lanes; got {block_n})"
        )
    if block_m == 1 and block_n > bs:
        raise GraphError(f"tile '{name}': block_n={block_n} exceeds the {bs} threads")
    if n % block_n:
        raise GraphError(f"tile '{name}': block_n={block_n} must divide n={n}")
    slices = warps // groups
    if k % (CHUNK * slices):
        raise GraphError(
            f"tile '{name}': k={k} must be a multiple of {CHUNK * slices} ({slices} k slices "
            f"of 128-byte chunks)"
        )
    per_slice = k // CHUNK // slices
    if stages < 2:
        raise GraphError(f"tile '{name}': stages={stages}: the ring needs at least 2")
    stages = min(stages, per_slice + 1)
    pre = stages - 1
    early = 0
    if prefetch_ring:
        early = pre if prefetch_ring is True else int(prefetch_ring)
        if not 0 < early <= pre:
            raise GraphError(
                f"tile '{name}': prefetch_ring={prefetch_ring!r}: True or 1..{pre} chunks"
            )
    at, wt, ct = _layer_types(layers, per_n, n, k)
    stacked = layers is not None
    plan = dict(
        name=name, bs=bs, n=n, k=k, block_m=block_m, block_n=block_n, per_n=per_n, nr=nr, rpt=rpt,
        groups=groups, slices=slices, per_slice=per_slice, stages=stages, pre=pre, early=early,
        at=at, wt=wt, ct=ct, stacked=stacked, epilogue=epilogue, row_scale=row_scale,
        sums_out=sums_out, short_path=short_path, whole_lines=whole_lines, argmax_key=argmax_key,
    )  # fmt: skip
    st = _text.SUMS_TYPE
    signature = _layer_signature(
        at, wt, ct, columns_first=columns_first, stacked=stacked,
        before_w=f", %R: {st}" if row_scale is not None else "",
        after_c=(f", %S: {st}" if sums_out is not None else "")
        + (f", %K: {_text.KEYS_TYPE}" if argmax_key else ""),
    )  # fmt: skip
    t = _Text()
    emit = _emit_rows if block_m > 1 else _emit
    globals_ = emit(t, plan, "body" if early else "all")
    t.close()
    rows = f"{block_m} rows (mma.sync, weights as A)" if block_m > 1 else "one row (GEMV)"
    source = _source(name, signature, t, globals_, f"{name}: {LAYER_WHAT[epilogue]}, bf16, {rows}")
    if early:
        tp = _Text()
        emit(tp, plan, "fill")
        tp.close()
        source += _source(
            f"{name}__prefetch", signature, tp, [], f"{name}: the weight ring's first chunks"
        )
    reference = layer_gemm_reference(
        block_m, block_n, n, epilogue, stacked=stacked, columns_first=columns_first,
        sums_out=sums_out, row_scale=row_scale, k=k,
    )  # fmt: skip
    if argmax_key:
        reference = _with_argmax_key(reference, block_m, block_n, n, columns_first)
    fn = DeviceFunction.from_mlir(source, name, reference, block_size=bs)
    fn.prefetch_fills_shared = bool(early)
    # Inlined, two of these tiles in one kernel (o_proj and down) gave wrong
    # sums of squares on an H200 under the static schedule; called, right
    # (bench/RESULTS.md item 208). Called, each also keeps its own registers.
    fn.called = True
    return fn


def _emit(t: _Text, p: dict, part: str) -> list[str]:
    """The tile's body (``part="all"``), its body after the prefetch function
    filled the ring (``"body"``), or that function (``"fill"``). Returns the
    workgroup globals it declares."""
    name, bs, k, bn = p["name"], p["bs"], p["k"], p["block_n"]
    rpt, slices = p["rpt"], p["slices"]
    nr, at, ct = p["nr"], p["at"], p["ct"]
    _, n0, tid, lane, group, kslice = _open_tile(t, p, "%i")
    sub = t.op("sub", f"arith.divui {lane}, %c{LANES_PER_ROW}_ : index")
    piece = t.op("pc", f"arith.remui {lane}, %c{LANES_PER_ROW}_ : index")
    # The thread's rows of the block (0 .. NR), their weight rows, and the
    # byte address of each row's piece of the slice's first chunk.
    first = t.op("lr", f"arith.muli {group}, %c{4 * rpt}_ : index")
    first = t.op("lr", f"arith.addi {first}, {sub} : index")
    local = [
        t.op("lr", f"arith.addi {first}, %c{4 * q}_ : index") if q else first for q in range(rpt)
    ]
    wbase = _weight_base(t, p)
    start = t.op("ko", f"arith.muli {kslice}, %c{2 * CHUNK}_ : index")
    pk = t.op("pk", f"arith.muli {piece}, %c16_ : index")
    start = t.op("ko", f"arith.addi {start}, {pk} : index")
    srcs = [_row_source(t, p, n0, wbase, lr, start) for lr in local]
    ring, issue = _ring(t, p, part, srcs, tid)
    if part == "fill":
        return []
    globals_ = [ring.declaration]
    # What the epilogue reads, loaded before the loop: the row's scale and
    # the residual of the thread's column, min(t, block_n - 1) (every thread
    # computes one; only those below block_n store it).
    column = t.op("cl", f"arith.minui {tid}, %c{bn - 1}_ : index")
    col = t.op("col", f"arith.addi {n0}, {column} : index")
    scale = _row_scale(t, p, "%i")
    old = None
    if p["epilogue"] == "residual":
        old = t.op("old", f"memref.load %C[%i, {col}] : {ct}")
        old = t.op("old", f"arith.extf {old} : bf16 to f32")
    # The activation row into workgroup memory, 16 bytes per thread and pass
    # (every load of the row issued before its stores).
    a_t = f"memref<{k}xbf16, #gpu.address_space<workgroup>>"
    globals_.append(f'memref.global "private" @{name}__a : {a_t} {{alignment = 16 : i64}}')
    av = t.op("av", f"memref.get_global @{name}__a : {a_t}")
    acol = t.op("acol", f"arith.muli {tid}, %c8 : index")
    loaded = []
    for lo in range(0, k, 8 * bs):
        c = t.op("acol", f"arith.addi {acol}, %c{lo}_ : index") if lo else acol
        guard = k - lo < 8 * bs
        if guard:
            c = t.op("acol", f"arith.minui {c}, %c{k - 8}_ : index")
        v = t.op("a", f"vector.load %A[%i, {c}] {{alignment = 16 : i64}} : {at}, vector<8xbf16>")
        loaded.append((c, v))
    for c, v in loaded:
        t.emit(f"vector.store {v}, {av}[{c}] {{alignment = 16 : i64}} : {a_t}, vector<8xbf16>")
    t.emit("gpu.barrier")
    # The slice's chunk `it` is chunk `kslice + slices * it` of the row.
    apiece = t.op("ap", f"arith.muli {kslice}, %c{CHUNK}_ : index")
    pe = t.op("ap", f"arith.muli {piece}, %c8 : index")
    apiece = t.op("ap", f"arith.addi {apiece}, {pe} : index")
    zero = t.op("z", "arith.constant dense<0.0> : vector<8xf32>")

    def compute(it: str, stage: str, accs: list[str]) -> list[str]:
        ak = t.op("ak", f"arith.muli {it}, %c{CHUNK * slices}_ : index")
        ak = t.op("ak", f"arith.addi {ak}, {apiece} : index")
        return fma_chunk(t, (av, a_t), ak, ring, stage, accs)

    carried = [(f"%acc{q}", zero, "vector<8xf32>") for q in range(rpt)]
    accs = _ring_loop(t, p, issue, carried, lambda it, stage, accs, _: compute(it, stage, accs))
    # Each row's 8 lanes add their sums; lane 0 of the row writes the
    # slice's sum to `part[kslice, row]`.
    part_t = f"memref<{slices * nr}xf32, #gpu.address_space<workgroup>>"
    globals_.append(f'memref.global "private" @{name}__part : {part_t} {{alignment = 16 : i64}}')
    parts = t.op("part", f"memref.get_global @{name}__part : {part_t}")
    lead = t.op("lead", f"arith.cmpi eq, {piece}, %c0 : index")
    width = t.op("w32", "arith.constant 32 : i32")
    sums = [lane_sum(t, t.op("sum", f"vector.reduction <add>, {a} : vector<8xf32> into f32"),
                      (4, 2, 1), width) for a in accs]  # fmt: skip
    t.emit(f"scf.if {lead} {{")
    t.indent += "  "
    base = t.op("pb", f"arith.muli {kslice}, %c{nr}_ : index")
    for lr, v in zip(local, sums, strict=True):
        at_ = t.op("pa", f"arith.addi {base}, {lr} : index")
        t.emit(f"memref.store {v}, {parts}[{at_}] : {part_t}")
    t.end()
    t.emit("gpu.barrier")
    _finish(t, p, parts, part_t, tid, column, col, scale, old, width)
    return globals_


def _const(v: int) -> str:
    return f"%c{v}_" if v else "%c0"


class LineRing:
    """The rows mode's ring with whole-line copies (module docstring): per
    stage a warp's 16 weight rows of one 128-byte chunk (2 KB, the same
    bytes as :class:`ThreadRing`'s four slots of its 32 lanes). Piece ``p``
    of row ``r`` lies at ``p ^ 4 (r & 1)``, so the 8 lanes of a quarter warp
    (rows ``g`` and ``g + 1``, pieces ``q`` or ``q + 4``) read all 32 banks
    once, and so do a copy's 8 lanes (one row). Reads: ``slot(stage, f)`` is
    lane ``(g, q)``'s slot ``f`` of :func:`_emit_rows`' layout, pieces ``q``
    and ``q + 4`` of rows ``g`` (``f`` = 0, 1) and ``g + 8`` (2, 3)."""

    def __init__(self, t: _Text, name: str, ring_t: str, tid: str, bs: int, per_stage: int):
        assert per_stage == 4, "16 rows of 128 bytes: 4 copies of 16 bytes a lane"
        self.t, self.type, self.stage_bytes = t, ring_t, bs * 16 * per_stage
        self.declaration = (
            f'memref.global "private" @{name}__ring : {ring_t} {{alignment = 16 : i64}}'
        )
        self.ring = t.op("ring", f"memref.get_global @{name}__ring : {ring_t}")
        sb = t.op("sb", f"memref.extract_aligned_pointer_as_index {self.ring} : {ring_t} -> index")
        warp = t.op("lw", f"arith.divui {tid}, %c32 : index")
        lane = t.op("ll", f"arith.remui {tid}, %c32 : index")
        wb = t.op("lw", f"arith.muli {warp}, %c{32 * 16 * per_stage}_ : index")
        # Copies: lane (s, p) writes piece p of row 4 f + s (parity s & 1).
        sub = t.op("ls", f"arith.divui {lane}, %c{LANES_PER_ROW}_ : index")
        piece = t.op("lp", f"arith.remui {lane}, %c{LANES_PER_ROW}_ : index")
        flip = t.op("lf", f"arith.andi {sub}, %c1 : index")
        flip = t.op("lf", f"arith.muli {flip}, %c4 : index")
        at = t.op("lp", f"arith.xori {piece}, {flip} : index")
        at = t.op("lp", f"arith.muli {at}, %c16_ : index")
        row = t.op("ls", f"arith.muli {sub}, %c{2 * CHUNK}_ : index")
        self.write = t.op("lb", f"arith.addi {sb}, {wb} : index")
        self.write = t.op("lb", f"arith.addi {self.write}, {row} : index")
        self.write = t.op("lb", f"arith.addi {self.write}, {at} : index")
        # Reads: lane (g, q), piece q (+ 4) of row g at byte 16 q (+ 64),
        # or (rows of odd g) the other half.
        g = t.op("lg", f"arith.divui {lane}, %c4 : index")
        q = t.op("lq", f"arith.remui {lane}, %c4 : index")
        rd = t.op("lr", f"arith.muli {g}, %c{2 * CHUNK}_ : index")
        rd = t.op("lr", f"arith.addi {wb}, {rd} : index")
        q16 = t.op("lq", f"arith.muli {q}, %c16_ : index")
        rd = t.op("lr", f"arith.addi {rd}, {q16} : index")
        odd = t.op("lo", f"arith.andi {g}, %c1 : index")
        half = t.op("lo", f"arith.muli {odd}, %c64_ : index")
        other = t.op("lo", f"arith.subi %c64_, {half} : index")
        self.reads = [t.op("lr", f"arith.addi {rd}, {h} : index") for h in (half, other)]

    def _stage(self, stage: str) -> str:
        return self.t.op("lst", f"arith.muli {stage}, %c{self.stage_bytes}_ : index")

    def slot(self, stage: str, f: int, what: str) -> str:
        """Lane ``(g, q)``'s slot ``f`` of ``stage`` as an i32 index (reads)."""
        assert what == "index", "the ring's copies address it by copy, not slot"
        t = self.t
        at = t.op("lx", f"arith.addi {self.reads[f % 2]}, {self._stage(stage)} : index")
        if f // 2:
            at = t.op("lx", f"arith.addi {at}, %c{8 * 2 * CHUNK}_ : index")
        return t.op("lx", f"arith.divui {at}, %c4 : index")

    def copy(self, srcs: list[str], offset: str, stage: str) -> None:
        """Copy ``f``: 16 bytes from ``srcs[f] + offset`` to this lane's
        piece of row ``4 f + s`` of ``stage``, as one ``cp.async`` group."""
        t = self.t
        base = t.op("ld", f"arith.addi {self.write}, {self._stage(stage)} : index")
        for f, src in enumerate(srcs):
            d = t.op("ld", f"arith.addi {base}, %c{f * 4 * 2 * CHUNK}_ : index") if f else base
            cp_async_16(t, d, t.op("g", f"arith.addi {src}, {offset} : index"))
        t.emit("nvvm.cp.async.commit.group")


def _open_tile(t: _Text, p: dict, r0: str) -> tuple[str, str, str, str, str, str]:
    """The tile's guard (rows from ``r0`` and its columns exist), opened,
    and its thread's coordinates: ``(M, n0, tid, lane, group, kslice)``
    (warp ``w`` takes row group ``w % groups`` and k slice ``w // groups``)."""
    groups, slices = p["groups"], p["slices"]
    m_rows = t.op("M", f"memref.dim %A, %c0 : {p['at']}")
    n0 = t.op("n0", f"arith.muli %j, %c{p['block_n']}_ : index")
    n_rows = f"%c{p['n']}_"
    t.emit(f"scf.if {_mma.dense_valid(t, r0, n0, m_rows, n_rows)} {{")
    t.indent += "  "
    tid = t.op("tid", "gpu.thread_id x")
    warp = t.op("warp", f"arith.divui {tid}, %c32 : index")
    lane = t.op("lane", f"arith.remui {tid}, %c32 : index")
    group = t.op("grp", f"arith.remui {warp}, %c{groups}_ : index") if groups > 1 else "%c0"
    kslice = t.op("ks", f"arith.divui {warp}, %c{groups}_ : index") if slices > 1 else "%c0"
    return m_rows, n0, tid, lane, group, kslice


def _ring(t: _Text, p: dict, part: str, srcs: list[str], tid: str, kind=ThreadRing):
    """The thread's ring of ``len(srcs)`` slots a stage (a ``kind``:
    :class:`ThreadRing` or :class:`LineRing`) and its copy of a slice's
    chunk ``it`` (``issue(it, stage)``), after the copies of the ring's
    first chunks that ``part`` issues (:func:`_emit`)."""
    bs, stages, pre = p["bs"], p["stages"], p["pre"]
    ring_t = f"memref<{stages * len(srcs) * bs * 4}xi32, #gpu.address_space<workgroup>>"
    ring = kind(t, p["name"], ring_t, tid, bs, len(srcs))
    step = 2 * CHUNK * p["slices"]  # bytes of a row between a slice's chunks

    def issue(it: str, stage: str) -> None:
        ring.copy(srcs, t.op("kb", f"arith.muli {it}, %c{step}_ : index"), stage)

    filled = p["early"] if part == "body" else 0
    for it in range(filled, pre if part != "fill" else p["early"]):
        issue(_const(it), _const(it))
    return ring, issue


def _row_scale(t: _Text, p: dict, row: str) -> str | None:
    """The folded norm's scale of ``A``'s row ``row``, ``rsqrt(sum / k +
    eps)`` from its sum of squares (None without ``row_scale``)."""
    if p["row_scale"] is None:
        return None
    stride, offset, eps = p["row_scale"]
    slot_row = _layer_slot(t, p["stacked"], stride, offset)
    total = _load_sum(t, "%R", _text.SUMS_TYPE, slot_row, row)
    fk = t.op("fk", f"arith.constant {float(p['k']):.1f} : f32")
    feps = t.op("feps", f"arith.constant {float(np.float32(eps)):.9e} : f32")
    ms = t.op("ms", f"arith.divf {total}, {fk} : f32")
    ms = t.op("ms", f"arith.addf {ms}, {feps} : f32")
    return t.op("rs", f"math.rsqrt {ms} : f32")


def _weight_base(t: _Text, p: dict) -> str:
    """The byte address of the tile's layer of ``W``."""
    wbase = t.op("wb", f"memref.extract_aligned_pointer_as_index %W : {p['wt']} -> index")
    if p["stacked"]:
        lo = t.op("wl", f"arith.muli %l, %c{p['per_n'] * p['n'] * p['k'] * 2}_ : index")
        wbase = t.op("wb", f"arith.addi {wbase}, {lo} : index")
    return wbase


def _row_source(t: _Text, p: dict, n0: str, wbase: str, lr: str, start: str) -> str:
    """The byte address of block row ``lr``'s weights at byte ``start`` of
    the row (swiglu's up rows, ``lr >= block_n``, are ``n - block_n``
    further)."""
    bn = p["block_n"]
    row = t.op("wr", f"arith.addi {n0}, {lr} : index")
    if p["per_n"] == 2:
        up = t.op("up", f"arith.cmpi uge, {lr}, %c{bn}_ : index")
        far = t.op("wr", f"arith.addi {row}, %c{p['n'] - bn}_ : index")
        row = t.op("wr", f"arith.select {up}, {far}, {row} : index")
    off = t.op("wo", f"arith.muli {row}, %c{2 * p['k']}_ : index")
    off = t.op("wo", f"arith.addi {off}, {start} : index")
    return t.op("src", f"arith.addi {wbase}, {off} : index")


def _value(t: _Text, p: dict, gate: str, up: str | None, old: str | None) -> str:
    """The epilogue's bf16 value from the column's f32 sum ``gate`` (and
    ``up``'s for swiglu, ``old`` for residual), Hugging Face's rounding."""
    if p["epilogue"] == "swiglu":
        silu = _mma.bf16_round(t, _mma.silu(t, _mma.bf16_round(t, gate)))
        v = t.op("hv", f"arith.mulf {silu}, {_mma.bf16_round(t, up)} : f32")
    elif p["epilogue"] == "residual":
        v = t.op("res", f"arith.addf {_mma.bf16_round(t, gate)}, {old} : f32")
    else:
        v = gate
    return t.op("h", f"arith.truncf {v} : f32 to bf16")


def _finish(
    t: _Text, p: dict, parts: str, part_t: str, tid: str, column: str, col: str, scale, old,
    width: str,
) -> None:  # fmt: skip
    """Thread ``t < block_n``: column ``t``'s sums over the k slices (slice
    order), the row scale, the epilogue and its store; then ``sums_out``.
    Every thread computes its ``column`` (``min(t, block_n - 1)``, output
    column ``col``), so the sums of squares' shuffles run on whole warps;
    only the store and the atomic add are conditional."""
    bn, nr, slices = p["block_n"], p["nr"], p["slices"]

    def total(row: str) -> str:
        return _slices_total(t, (parts, part_t), row, nr, slices, scale)

    mine = t.op("mine", f"arith.cmpi ult, {tid}, %c{bn}_ : index")
    g = total(column)
    u = None
    if p["epilogue"] == "swiglu":
        u = total(t.op("ur", f"arith.addi {column}, %c{bn}_ : index"))
    hv = _value(t, p, g, u, old)

    def lead() -> str:  # lane 0 of each warp
        lane = t.op("ln", f"arith.remui {tid}, %c32 : index")
        return t.op("f0", f"arith.cmpi eq, {lane}, %c0 : index")

    _store_and_sum(t, p, hv, mine, ("%i", col), 32, width, lead)
    if p["argmax_key"]:
        _fold_argmax_key(t, hv, mine, ("%i", col), 32, width, lead)


def _fold_argmax_key(
    t: _Text, hv: str, valid: str, at: tuple[str, str], lanes: int, width: str, lead
) -> None:
    """``K[row] = max(K[row], key)`` over each group of ``lanes`` lanes (one
    row's stored logits; ``at = (row, column)``): each lane's
    :func:`argmax_keys` key (0 where ``valid`` is false or the logit is
    NaN), a butterfly maximum of the i64 keys (two i32 shuffles a step),
    then one relaxed atomic maximum by the group's ``lead()`` lane where the
    group held a key."""
    row, col = at
    v = t.op("kv", f"arith.extf {hv} : bf16 to f32")
    # -0 + +0 = +0: equal logits get equal keys, so ties go to the index.
    v = t.op("kv", f"arith.addf {v}, {t.op('kz', 'arith.constant 0.0 : f32')} : f32")
    bits = t.op("kb", f"arith.bitcast {v} : f32 to i32")
    ones = t.op("k1", "arith.constant -1 : i32")
    sign = t.op("ks", "arith.constant -2147483648 : i32")
    neg = t.op("kn", f"arith.cmpi slt, {bits}, {t.op('k0', 'arith.constant 0 : i32')} : i32")
    hi = t.op(
        "kh",
        f"arith.select {neg}, {t.op('kh', f'arith.xori {bits}, {ones} : i32')}, "
        f"{t.op('kh', f'arith.ori {bits}, {sign} : i32')} : i32",
    )
    lo = t.op("kl", f"arith.index_cast {col} : index to i32")
    lo = t.op("kl", f"arith.xori {lo}, {ones} : i32")
    c32 = t.op("k32", "arith.constant 32 : i64")

    def join(h: str, low: str) -> str:
        h = t.op("kj", f"arith.extui {h} : i32 to i64")
        h = t.op("kj", f"arith.shli {h}, {c32} : i64")
        return t.op("kj", f"arith.ori {h}, {t.op('kj', f'arith.extui {low} : i32 to i64')} : i64")

    key = join(hi, lo)
    ordered = t.op("ko", f"arith.cmpf ord, {v}, {v} : f32")
    keep = t.op("ko", f"arith.andi {valid}, {ordered} : i1")
    none = t.op("k0", "arith.constant 0 : i64")
    key = t.op("key", f"arith.select {keep}, {key}, {none} : i64")
    for off in (1 << s for s in reversed(range(lanes.bit_length() - 1))):
        o = t.op("off", f"arith.constant {off} : i32")
        halves = []
        for part in (t.op("kh", f"arith.shrui {key}, {c32} : i64"), key):
            word = t.op("kw", f"arith.trunci {part} : i64 to i32")
            sh = t.fresh("ksh")
            t.emit(f"{sh}, %{sh[1:]}ok = gpu.shuffle xor {word}, {o}, {width} : i32")
            halves.append(sh)
        key = t.op("key", f"arith.maxui {key}, {join(*halves)} : i64")
    held = t.op("kd", f"arith.cmpi ne, {key}, {none} : i64")
    t.emit(f"scf.if {t.op('kd', f'arith.andi {lead()}, {held} : i1')} {{")
    old = t.fresh("kold")
    t.emit(f"  {old} = memref.atomic_rmw maxu {key}, %K[{row}] : (i64, {_text.KEYS_TYPE}) -> i64")
    t.emit("}")


def argmax_keys(values: np.ndarray, first_column: int) -> np.ndarray:
    """The i64 keys :func:`layer_gemv`'s ``argmax_key`` epilogue takes the
    maximum of, for f32 logits ``values[..., c]`` of columns ``first_column
    + c``: the logit's bits made to order as unsigned integers (sign bit
    flipped; negatives all flipped; -0 as +0) in the high word and the
    column's complement in the low word, so the largest key is the first
    largest logit. NaNs get 0, which no logit's key is (NaNs are ignored, as
    :func:`etc.tiles.llama.argmax` does)."""
    v = np.asarray(values, np.float32) + np.float32(0.0)
    bits = v.view(np.uint32).astype(np.uint64)
    hi = np.where(bits >> 31 == 1, ~bits & 0xFFFFFFFF, bits | 0x80000000)
    cols = np.uint64(int(first_column)) + np.arange(v.shape[-1], dtype=np.uint64)
    keys = (hi << np.uint64(32)) | (~cols & np.uint64(0xFFFFFFFF))
    return np.where(np.isnan(v), np.uint64(0), keys).astype(np.uint64).view(np.int64)


def argmax_key_reference(keys: np.ndarray) -> np.ndarray:
    """The token each row's key in ``keys`` (i64) names: the low word's
    complement, 0 for a row that held no key (all its logits NaN)."""
    k = np.asarray(keys).view(np.uint64)
    return np.where(k == 0, 0, ~k & np.uint64(0xFFFFFFFF)).astype(np.int32)


def _with_argmax_key(reference, block_m: int, block_n: int, n: int, columns_first: bool):
    """``reference`` (of a one-weight ``store`` tile ``(i, j)``, ``(j, i)``
    with ``columns_first``), then for each row ``r`` of the block
    ``K[r] = max(K[r], the row's keys)``: the numpy model of the folded
    argmax, whose atomic maxima make the order of the tiles irrelevant."""

    def run(a: int, b: int, *args) -> None:
        *rest, K = args
        reference(a, b, *rest)
        i, j = (b, a) if columns_first else (a, b)
        cs = slice(j * block_n, min((j + 1) * block_n, n))
        keys, C = K.view(np.uint64), rest[-1]
        for r in range(i * block_m, min((i + 1) * block_m, C.shape[0])):
            best = argmax_keys(bf16_to_f32(C[r, cs]), cs.start).view(np.uint64).max()
            keys[r] = max(keys[r], best)

    return run


def _ring_loop(
    t: _Text, p: dict, issue, carried: list[tuple[str, str, str]], step, ahead=None,
    shared: bool = False,
):  # fmt: skip
    """The k slice's chunks through the ring, the carried values ``(name,
    initial value, type)`` threaded through them: each iteration issues the
    copy of chunk ``it + pre``, then ``ahead(next chunk)`` (loads for the
    next chunk, or None past the last), waits for chunk ``it`` and runs
    ``step(it, stage, values, ahead's result) -> values``; the last ``pre``
    chunks run unrolled, draining the ring. Returns the final values.
    ``shared``: the warp's lanes read each other's copies (:class:`LineRing`),
    so the warp syncs before each refill (every lane is done with the stage
    it overwrites) and after each wait (every lane's copies have landed)."""
    stages, pre, per_slice = p["stages"], p["pre"], p["per_slice"]

    def sync() -> None:
        if shared:
            t.emit(_text.asm_line("bar.warp.sync -1;", [], memory=True))

    res = t.fresh("accs")
    types = ", ".join(ty for _, _, ty in carried)
    inits = ", ".join(f"{name} = {init}" for name, init, _ in carried)
    t.emit(
        f"{res}:{len(carried)} = scf.for %c_it = %c0 to %c{per_slice - pre}_ step %c1 "
        f"iter_args({inits}) -> ({types}) {{"
    )
    t.indent += "  "
    sync()
    nxt = t.op("nx", f"arith.addi %c_it, %c{pre}_ : index")
    issue(nxt, t.op("st", f"arith.remui {nxt}, %c{stages}_ : index"))
    early = ahead(t.op("na", "arith.addi %c_it, %c1 : index")) if ahead else None
    t.emit(f"nvvm.cp.async.wait.group {pre}")
    sync()
    stage = t.op("st", f"arith.remui %c_it, %c{stages}_ : index")
    values = step("%c_it", stage, [name for name, _, _ in carried], early)
    t.emit(f"scf.yield {', '.join(values)} : {types}")
    t.end()
    values = [f"{res}#{i}" for i in range(len(carried))]
    for q in range(pre):
        it = per_slice - pre + q
        early = ahead(_const(it + 1)) if ahead and it + 1 < per_slice else None
        t.emit(f"nvvm.cp.async.wait.group {pre - 1 - q}")
        sync()
        values = step(_const(it), _const(it % stages), values, early)
    return values


def _slices_total(
    t: _Text, parts: tuple[str, str], first: str, stride: int, slices: int, scale: str | None
) -> str:
    """``part[first + s * stride]`` summed over the k slices ``s`` in slice
    order, times the row scale ``scale`` (if any)."""
    mem, part_t = parts
    v = None
    for s in range(slices):
        at_ = t.op("pa", f"arith.addi {first}, %c{s * stride}_ : index") if s else first
        x = t.op("px", f"memref.load {mem}[{at_}] : {part_t}")
        v = x if v is None else t.op("pt", f"arith.addf {v}, {x} : f32")
    return t.op("pt", f"arith.mulf {v}, {scale} : f32") if scale is not None else v


def _store_and_sum(
    t: _Text, p: dict, hv: str, valid: str, at: tuple[str, str], lanes: int, width: str, lead
) -> None:
    """``C[at] = hv`` where ``valid``; with ``sums_out``, the stored values'
    squares summed by a butterfly over each group of ``lanes`` lanes (one
    row's outputs), one fixed-point atomic add per group by the lane for
    which ``lead()`` emits true."""
    if p["sums_out"] is not None:
        value = t.op("val", f"arith.extf {hv} : bf16 to f32")
        value = t.op("val", f"arith.select {valid}, {value}, %fzero : f32")
        sq = t.op("sq", f"arith.mulf {value}, {value} : f32")
        sq = lane_sum(t, sq, tuple(1 << s for s in reversed(range(lanes.bit_length() - 1))), width)
    t.emit(f"scf.if {valid} {{")
    t.emit(f"  memref.store {hv}, %C[{at[0]}, {at[1]}] : {p['ct']}")
    t.emit("}")
    if p["sums_out"] is None:
        return
    first = t.op("f0", f"arith.andi {lead()}, {valid} : i1")
    t.emit(f"scf.if {first} {{")
    t.indent += "  "
    slot_row = _layer_slot(t, p["stacked"], *p["sums_out"])
    add_fixed_sum(t, sq, ("%S", _text.SUMS_TYPE, slot_row), at[0])
    t.end()


def _emit_rows(t: _Text, p: dict, part: str) -> list[str]:
    """:func:`_emit` for ``block_m`` = 8 to 64 rows on ``mma.sync`` (module
    docstring)."""
    name, bs, bn, bm = p["name"], p["bs"], p["block_n"], p["block_m"]
    slices, nr, ct = p["slices"], p["nr"], p["ct"]
    blocks = bm // 8  # of 8 rows: the n of m16n8k16
    r0 = t.op("r0", f"arith.muli %i, %c{bm}_ : index")
    m_rows, n0, tid, lane, group, kslice = _open_tile(t, p, r0)
    g = t.op("g", f"arith.divui {lane}, %c4 : index")
    q = t.op("q", f"arith.remui {lane}, %c4 : index")
    # The fragments' rows: g and g + 8 of the warp's 16 block rows.
    rows = t.op("lr", f"arith.muli {group}, %c{MMA_ROWS}_ : index")
    low = t.op("lr", f"arith.addi {rows}, {g} : index")
    high = t.op("lr", f"arith.addi {low}, %c8 : index")
    chunk = t.op("ko", f"arith.muli {kslice}, %c{2 * CHUNK}_ : index")
    wbase = _weight_base(t, p)

    def start(piece: str) -> str:  # byte of 16-byte piece `piece` of the slice's first chunk
        at = t.op("pk", f"arith.muli {piece}, %c16_ : index")
        return t.op("ko", f"arith.addi {chunk}, {at} : index")

    srcs = []
    if p["whole_lines"]:  # copy f: piece lane % 8 of the warp's row 4 f + lane / 8
        sub = t.op("ls", f"arith.divui {lane}, %c{LANES_PER_ROW}_ : index")
        at = start(t.op("lp", f"arith.remui {lane}, %c{LANES_PER_ROW}_ : index"))
        first = t.op("lr", f"arith.addi {rows}, {sub} : index")
        for f in range(4):
            lr = t.op("lr", f"arith.addi {first}, %c{4 * f}_ : index") if f else first
            srcs.append(_row_source(t, p, n0, wbase, lr, at))
    else:  # slots 0-3: pieces q and q + 4 of rows g, then g + 8
        at = start(q)
        for lr in (low, high):
            src = _row_source(t, p, n0, wbase, lr, at)
            srcs += [src, t.op("src", f"arith.addi {src}, %c64_ : index")]
    kind = LineRing if p["whole_lines"] else ThreadRing
    ring, issue = _ring(t, p, part, srcs, tid, kind)
    if part == "fill":
        return []
    globals_ = [ring.declaration]
    # The epilogue's outputs: pass e of thread t is output o = t + e * bs,
    # row o / block_n, column o % block_n, with its row scale and residual
    # (rows past M read row M - 1 and store nothing). Up to 16 rows they are
    # loaded before the loop; from 32 rows on (4+ outputs a thread, whose
    # inputs would hold registers through it) after it.
    ahead = blocks <= 2
    last = t.op("mlast", f"arith.subi {m_rows}, %c1 : index")

    def epilogue_inputs() -> list[dict]:
        outs = []
        for e in range((bm * bn + bs - 1) // bs):
            o = t.op("o", f"arith.addi {tid}, %c{e * bs}_ : index") if e else tid
            b = t.op("ob", f"arith.divui {o}, %c{bn}_ : index")
            c = t.op("oc", f"arith.remui {o}, %c{bn}_ : index")
            row = t.op("orow", f"arith.addi {r0}, {b} : index")
            valid = t.op("ov", f"arith.cmpi ult, {row}, {m_rows} : index")
            if (e + 1) * bs > bm * bn:
                inside = t.op("ov", f"arith.cmpi ult, {o}, %c{bm * bn}_ : index")
                valid = t.op("ov", f"arith.andi {valid}, {inside} : i1")
                b = t.op("ob", f"arith.minui {b}, %c{bm - 1}_ : index")
            row = t.op("orow", f"arith.minui {row}, {last} : index")
            col = t.op("col", f"arith.addi {n0}, {c} : index")
            scale = _row_scale(t, p, row)
            old = None
            if p["epilogue"] == "residual":
                old = t.op("old", f"memref.load %C[{row}, {col}] : {ct}")
                old = t.op("old", f"arith.extf {old} : bf16 to f32")
            outs.append(dict(b=b, c=c, row=row, col=col, valid=valid, scale=scale, old=old))
        return outs

    outs = epilogue_inputs() if ahead else []
    # The slices' sums meet in workgroup memory: part[kslice, row, block row].
    part_t = f"memref<{slices * bm * nr}xf32, #gpu.address_space<workgroup>>"
    globals_.append(f'memref.global "private" @{name}__part : {part_t} {{alignment = 16 : i64}}')
    parts = t.op("part", f"memref.get_global @{name}__part : {part_t}")
    rows = dict(
        r0=r0, g=g, q=q, kslice=kslice, last=last, low=low, high=high, ring=ring, issue=issue,
        parts=(parts, part_t),
    )  # fmt: skip
    if blocks == 2 and p["short_path"]:
        # A tile of at most 8 rows streams on the 8-row path: half the
        # activation loads and mmas (B = 8 in one B = 2..16 kernel on an
        # H200: 980 µs against 1018-1023 on the 16-row loop in an earlier
        # run, bench/RESULTS.md items 210 and 212).
        few = t.op("few", f"arith.subi {m_rows}, {r0} : index")
        few = t.op("few", f"arith.cmpi ule, {few}, %c8 : index")
        t.emit(f"scf.if {few} {{")
        t.indent += "  "
        _stream_rows(t, p, rows, 1)
        t.indent = t.indent[:-2]
        t.emit("} else {")
        t.indent += "  "
        _stream_rows(t, p, rows, 2)
        t.end()
    else:
        _stream_rows(t, p, rows, blocks)
    t.emit("gpu.barrier")
    if not ahead:
        outs = epilogue_inputs()
    width = t.op("w32", "arith.constant 32 : i32")
    for out in outs:
        _finish_row(t, p, parts, part_t, out, lane, width)
    return globals_


def _stream_rows(t: _Text, p: dict, v: dict, blocks: int) -> None:
    """The k loop of :func:`_emit_rows` over ``blocks`` 8-row blocks of the
    tile, its sums stored to ``part``."""
    bm, nr, at, slices = p["block_m"], p["nr"], p["at"], p["slices"]
    r0, g, q, kslice, last, ring = v["r0"], v["g"], v["q"], v["kslice"], v["last"], v["ring"]
    issue, (parts, part_t) = v["issue"], v["parts"]

    # Sequence g of each 8-row block: its activation row's pieces q and
    # q + 4 of the slice's chunk `it`, as i32 words (the B fragments).
    arows = []
    for blk in range(blocks):
        ar = t.op("ar", f"arith.addi {r0}, {g} : index")
        ar = t.op("ar", f"arith.addi {ar}, %c{8 * blk}_ : index") if blk else ar
        arows.append(t.op("ar", f"arith.minui {ar}, {last} : index"))
    acol = t.op("ac", f"arith.muli {kslice}, %c{CHUNK}_ : index")
    q8 = t.op("ac", f"arith.muli {q}, %c8 : index")
    acol = t.op("ac", f"arith.addi {acol}, {q8} : index")
    words = "vector<4xi32>"

    def activations(it: str, pieces: tuple[int, ...] = (0, 1)) -> list[str]:
        ak = t.op("ak", f"arith.muli {it}, %c{CHUNK * slices}_ : index")
        ak = t.op("ak", f"arith.addi {ak}, {acol} : index")
        ak4 = t.op("ak", f"arith.addi {ak}, %c32 : index")
        out = []
        for ar in arows:
            for col in [(ak, ak4)[pc] for pc in pieces]:
                x = t.op(
                    "x", f"vector.load %A[{ar}, {col}] {{alignment = 16 : i64}} : {at}, "
                    "vector<8xbf16>",
                )  # fmt: skip
                out.append(t.op("x", f"vector.bitcast {x} : vector<8xbf16> to {words}"))
        return out

    def word(x: str, i: int) -> str:
        return t.op("wd", f"vector.extract {x}[{i}] : i32 from {words}")

    def compute(stage: str, xs_of, accs: list[str], between=None) -> list[str]:
        """The chunk's mmas, piece ``pc``'s activation words (one per 8-row
        block) from ``xs_of(pc)``; ``between()`` runs between the halves."""
        w = [
            t.op("w", f"vector.load {ring.ring}[{ring.slot(stage, f, 'index')}] "
                 f"{{alignment = 16 : i64}} : {ring.type}, {words}")
            for f in range(4)
        ]  # fmt: skip
        accs = list(accs)
        for h in range(4):  # mma h: piece h // 2's values 4 (h % 2) .. + 3
            pc, lo = h // 2, 2 * (h % 2)
            if h == 2 and between is not None:
                between()
            a = [word(w[pc], lo), word(w[2 + pc], lo), word(w[pc], lo + 1), word(w[2 + pc], lo + 1)]
            for blk, x in enumerate(xs_of(pc)):
                d = _mma.mma(t, a, [word(x, lo), word(x, lo + 1)], accs[4 * blk : 4 * blk + 4])
                accs[4 * blk : 4 * blk + 4] = d
        return accs

    nacc = 4 * blocks
    carried = [(f"%acc{blocks}_{i}", "%fzero", "f32") for i in range(nacc)]
    if blocks > 2:
        # 32 rows and more: a whole chunk's activations ahead would not fit
        # beside the accumulators in 128 registers. Carried: the chunk's
        # first pieces; its second ones load as its mmas start, the next
        # chunk's first ones between the halves (half a chunk ahead, in the
        # 16-row tile's registers).
        carried += [(f"%xa{blocks}_{i}", x, words) for i, x in enumerate(activations("%c0", (0,)))]

        def step(it: str, stage: str, values: list[str], ahead: list[str] | None) -> list[str]:
            first, second, nxt = values[nacc:], activations(it, (1,)), []

            def between() -> None:
                if ahead is not None:
                    nxt.extend(activations(ahead[0], (0,)))

            accs = compute(stage, lambda pc: second if pc else first, values[:nacc], between)
            return accs + (nxt or first)

        # The ring loop's look-ahead hook only names the next chunk here.
        accs = _ring_loop(t, p, issue, carried, step, lambda it: [it], p["whole_lines"])[:nacc]
    else:
        # Carried: the accumulators, then the chunk's activation words (the
        # next chunk's loaded before each wait).
        xs = activations("%c0")
        carried += [(f"%xa{blocks}_{i}", x, words) for i, x in enumerate(xs)]

        def step(it: str, stage: str, values: list[str], ahead: list[str] | None) -> list[str]:
            xs = values[nacc:]
            accs = compute(stage, lambda pc: xs[pc::2], values[:nacc])
            return accs + ahead if ahead is not None else accs + values[nacc:]

        accs = _ring_loop(t, p, issue, carried, step, activations, p["whole_lines"])[:nacc]
    base = t.op("pb", f"arith.muli {kslice}, %c{bm * nr}_ : index")
    q2 = t.op("q2", f"arith.muli {q}, %c{2 * nr}_ : index")
    base = t.op("pb", f"arith.addi {base}, {q2} : index")
    for blk in range(blocks):
        for i, (lr, odd) in enumerate(
            ((v["low"], 0), (v["low"], 1), (v["high"], 0), (v["high"], 1))
        ):
            at_ = t.op("pa", f"arith.addi {base}, {lr} : index")
            off = (8 * blk + odd) * nr
            at_ = t.op("pa", f"arith.addi {at_}, %c{off}_ : index") if off else at_
            t.emit(f"memref.store {accs[4 * blk + i]}, {parts}[{at_}] : {part_t}")


def _finish_row(
    t: _Text, p: dict, parts: str, part_t: str, out: dict, lane: str, width: str
) -> None:
    """One output of a ``block_m``-row tile: its column's sums over the k
    slices (slice order), the row scale, the epilogue and its store; then
    ``sums_out`` added over each row's lanes (``block_n`` lanes, or a warp)."""
    bn, bm, nr, slices = p["block_n"], p["block_m"], p["nr"], p["slices"]
    at_row = t.op("po", f"arith.muli {out['b']}, %c{nr}_ : index")

    def total(c: str) -> str:
        first = t.op("pa", f"arith.addi {at_row}, {c} : index")
        return _slices_total(t, (parts, part_t), first, bm * nr, slices, out["scale"])

    g = total(out["c"])
    u = None
    if p["epilogue"] == "swiglu":
        u = total(t.op("ur", f"arith.addi {out['c']}, %c{bn}_ : index"))
    hv = _value(t, p, g, u, out["old"])
    seg = min(bn, 32)  # a row's outputs: block_n lanes, or whole warps

    def lead() -> str:  # the first lane of the row's group
        first = t.op("f0", f"arith.remui {lane}, %c{seg}_ : index")
        return t.op("f0", f"arith.cmpi eq, {first}, %c0 : index")

    _store_and_sum(t, p, hv, out["valid"], (out["row"], out["col"]), seg, width, lead)
    if p["argmax_key"]:
        _fold_argmax_key(t, hv, out["valid"], (out["row"], out["col"]), seg, width, lead)

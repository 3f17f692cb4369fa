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
"""

from __future__ import annotations

import numpy as np

from ..device import DeviceFunction
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
from .gemv import ThreadRing, fma_chunk, lane_sum

#: Lanes that share a weight row (16 bytes each of a 128-byte chunk).
LANES_PER_ROW = 8
#: Elements of a k chunk (128 bytes of bf16).
CHUNK = 64


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
) -> DeviceFunction:
    """:func:`etc.tiles.gemm.layer_gemm` with ``core="gemv"`` (module
    docstring): ``stages`` ring slots per thread and row (default 4; at most
    one more than the chunks of a k slice are used) and ``prefetch_ring``
    (the ring's first ``stages - 1`` chunks, or that many, issued by
    ``@<name>__prefetch`` before the instance's waits). No L2 evict-first
    hint: with the sync core's hinted copies the tiny decoder stopped with
    CUDA_ERROR_ILLEGAL_INSTRUCTION under the dynamic schedule without early
    pushes (``bench/RESULTS.md`` item 208), and at B = 1 the hint gained
    nothing (item 207)."""
    bs = block_size
    warps = _text.check_block(name, bs)
    stages = 4 if stages is None else stages
    _text.positive(name, block_n=block_n, k=k, stages=stages, rows_per_thread=rows_per_thread)
    per_n = 2 if epilogue == "swiglu" else 1
    nr = per_n * block_n
    rpt = rows_per_thread
    groups = nr // (4 * rpt)
    if nr % (4 * rpt) or warps % groups:
        raise GraphError(
            f"tile '{name}': a gemv block of {nr} weight rows on {warps} warps needs a "
            f"multiple of {4 * rpt} rows (4 per warp, rows_per_thread={rpt} each) in a number "
            f"of warp groups dividing {warps}; got block_n={block_n}"
        )
    if block_n > bs:
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
        name=name, bs=bs, n=n, k=k, block_n=block_n, per_n=per_n, nr=nr, rpt=rpt,
        groups=groups, slices=slices, per_slice=per_slice, stages=stages, pre=pre, early=early,
        at=at, wt=wt, ct=ct, stacked=stacked, epilogue=epilogue, row_scale=row_scale,
        sums_out=sums_out,
    )  # fmt: skip
    st = _text.SUMS_TYPE
    signature = _layer_signature(
        at, wt, ct, columns_first=columns_first, stacked=stacked,
        before_w=f", %R: {st}" if row_scale is not None else "",
        after_c=f", %S: {st}" if sums_out is not None else "",
    )  # fmt: skip
    t = _Text()
    globals_ = _emit(t, plan, "body" if early else "all")
    t.close()
    source = _source(
        name, signature, t, globals_, f"{name}: {LAYER_WHAT[epilogue]}, bf16, one row (GEMV)"
    )
    if early:
        tp = _Text()
        _emit(tp, plan, "fill")
        tp.close()
        source += _source(
            f"{name}__prefetch", signature, tp, [], f"{name}: the weight ring's first chunks"
        )
    reference = layer_gemm_reference(
        1, block_n, n, epilogue, stacked=stacked, columns_first=columns_first,
        sums_out=sums_out, row_scale=row_scale, k=k,
    )  # fmt: skip
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
    name, bs, k, n, bn = p["name"], p["bs"], p["k"], p["n"], p["block_n"]
    rpt, groups, slices, stages, pre = p["rpt"], p["groups"], p["slices"], p["stages"], p["pre"]
    nr, at, wt, ct = p["nr"], p["at"], p["wt"], p["ct"]
    m_rows = t.op("M", f"memref.dim %A, %c0 : {at}")
    n0 = t.op("n0", f"arith.muli %j, %c{bn}_ : index")
    t.emit(f"scf.if {_mma.dense_valid(t, '%i', n0, m_rows, f'%c{n}_')} {{")
    t.indent += "  "
    tid = t.op("tid", "gpu.thread_id x")
    warp = t.op("warp", f"arith.divui {tid}, %c32 : index")
    lane = t.op("lane", f"arith.remui {tid}, %c32 : index")
    group = t.op("grp", f"arith.remui {warp}, %c{groups}_ : index") if groups > 1 else "%c0"
    kslice = t.op("ks", f"arith.divui {warp}, %c{groups}_ : index") if slices > 1 else "%c0"
    sub = t.op("sub", f"arith.divui {lane}, %c{LANES_PER_ROW}_ : index")
    piece = t.op("pc", f"arith.remui {lane}, %c{LANES_PER_ROW}_ : index")
    # The thread's rows of the block (0 .. NR), their weight rows, and the
    # byte address of each row's piece of the slice's first chunk.
    first = t.op("lr", f"arith.muli {group}, %c{4 * rpt}_ : index")
    first = t.op("lr", f"arith.addi {first}, {sub} : index")
    local = [
        t.op("lr", f"arith.addi {first}, %c{4 * q}_ : index") if q else first for q in range(rpt)
    ]
    wbase = t.op("wb", f"memref.extract_aligned_pointer_as_index %W : {wt} -> index")
    if p["stacked"]:
        lo = t.op("wl", f"arith.muli %l, %c{p['per_n'] * n * k * 2}_ : index")
        wbase = t.op("wb", f"arith.addi {wbase}, {lo} : index")
    start = t.op("ko", f"arith.muli {kslice}, %c{2 * CHUNK}_ : index")
    pk = t.op("pk", f"arith.muli {piece}, %c16_ : index")
    start = t.op("ko", f"arith.addi {start}, {pk} : index")
    srcs = []
    for lr in local:
        row = t.op("wr", f"arith.addi {n0}, {lr} : index")
        if p["per_n"] == 2:  # the up rows: n - block_n further
            up = t.op("up", f"arith.cmpi uge, {lr}, %c{bn}_ : index")
            far = t.op("wr", f"arith.addi {row}, %c{n - bn}_ : index")
            row = t.op("wr", f"arith.select {up}, {far}, {row} : index")
        off = t.op("wo", f"arith.muli {row}, %c{2 * k}_ : index")
        off = t.op("wo", f"arith.addi {off}, {start} : index")
        srcs.append(t.op("src", f"arith.addi {wbase}, {off} : index"))
    ring_t = f"memref<{stages * rpt * bs * 4}xi32, #gpu.address_space<workgroup>>"
    ring = ThreadRing(t, name, ring_t, tid, bs, rpt)
    globals_ = [ring.declaration]
    step = 2 * CHUNK * slices  # bytes of a row between a slice's chunks

    def issue(it: str, stage: str) -> None:
        ring.copy(srcs, t.op("kb", f"arith.muli {it}, %c{step}_ : index"), stage)

    def const(v: int) -> str:
        return f"%c{v}_" if v else "%c0"

    filled = p["early"] if part == "body" else 0
    for it in range(filled, pre if part != "fill" else p["early"]):
        issue(const(it), const(it))
    if part == "fill":
        return []
    # What the epilogue reads, loaded before the loop: the row's scale and
    # the residual of the thread's column, min(t, block_n - 1) (every thread
    # computes one; only those below block_n store it).
    column = t.op("cl", f"arith.minui {tid}, %c{bn - 1}_ : index")
    col = t.op("col", f"arith.addi {n0}, {column} : index")
    scale = None
    if p["row_scale"] is not None:
        stride, offset, eps = p["row_scale"]
        slot_row = _layer_slot(t, p["stacked"], stride, offset)
        total = _load_sum(t, "%R", _text.SUMS_TYPE, slot_row, "%i")
        fk = t.op("fk", f"arith.constant {float(k):.1f} : f32")
        feps = t.op("feps", f"arith.constant {float(np.float32(eps)):.9e} : f32")
        ms = t.op("ms", f"arith.divf {total}, {fk} : f32")
        ms = t.op("ms", f"arith.addf {ms}, {feps} : f32")
        scale = t.op("rs", f"math.rsqrt {ms} : f32")
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

    per_slice = p["per_slice"]
    res = t.fresh("accs")
    vt = ", ".join(["vector<8xf32>"] * rpt)
    inits = ", ".join(f"%acc{q} = {zero}" for q in range(rpt))
    t.emit(
        f"{res}:{rpt} = scf.for %c_it = %c0 to %c{per_slice - pre}_ step %c1 "
        f"iter_args({inits}) -> ({vt}) {{"
    )
    t.indent += "  "
    nxt = t.op("nx", f"arith.addi %c_it, %c{pre}_ : index")
    issue(nxt, t.op("st", f"arith.remui {nxt}, %c{stages}_ : index"))
    t.emit(f"nvvm.cp.async.wait.group {pre}")
    stage = t.op("st", f"arith.remui %c_it, %c{stages}_ : index")
    accs = compute("%c_it", stage, [f"%acc{q}" for q in range(rpt)])
    t.emit(f"scf.yield {', '.join(accs)} : {vt}")
    t.end()
    accs = [f"{res}#{q}" for q in range(rpt)]
    for q in range(pre):
        it = per_slice - pre + q
        t.emit(f"nvvm.cp.async.wait.group {pre - 1 - q}")
        accs = compute(const(it), const(it % stages), accs)
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
        v = None
        for s in range(slices):
            at_ = t.op("pa", f"arith.addi {row}, %c{s * nr}_ : index") if s else row
            x = t.op("px", f"memref.load {parts}[{at_}] : {part_t}")
            v = x if v is None else t.op("pt", f"arith.addf {v}, {x} : f32")
        return t.op("pt", f"arith.mulf {v}, {scale} : f32") if scale is not None else v

    mine = t.op("mine", f"arith.cmpi ult, {tid}, %c{bn}_ : index")
    g = total(column)
    if p["epilogue"] == "swiglu":
        u = total(t.op("ur", f"arith.addi {column}, %c{bn}_ : index"))
        silu = _mma.bf16_round(t, _mma.silu(t, _mma.bf16_round(t, g)))
        v = t.op("hv", f"arith.mulf {silu}, {_mma.bf16_round(t, u)} : f32")
    elif p["epilogue"] == "residual":
        v = t.op("res", f"arith.addf {_mma.bf16_round(t, g)}, {old} : f32")
    else:
        v = g
    hv = t.op("h", f"arith.truncf {v} : f32 to bf16")
    if p["sums_out"] is not None:
        # The block's sum of squares of the stored values: a butterfly over
        # each warp that holds columns, one fixed-point atomic add per warp.
        value = t.op("val", f"arith.extf {hv} : bf16 to f32")
        value = t.op("val", f"arith.select {mine}, {value}, %fzero : f32")
        sq = t.op("sq", f"arith.mulf {value}, {value} : f32")
        sq = lane_sum(t, sq, (16, 8, 4, 2, 1), width)
    t.emit(f"scf.if {mine} {{")
    t.emit(f"  memref.store {hv}, %C[%i, {col}] : {p['ct']}")
    t.emit("}")
    if p["sums_out"] is None:
        return
    lane = t.op("ln", f"arith.remui {tid}, %c32 : index")
    first = t.op("f0", f"arith.cmpi eq, {lane}, %c0 : index")
    first = t.op("f0", f"arith.andi {first}, {mine} : i1")
    t.emit(f"scf.if {first} {{")
    t.indent += "  "
    slot_row = _layer_slot(t, p["stacked"], *p["sums_out"])
    add_fixed_sum(t, sq, ("%S", _text.SUMS_TYPE, slot_row), "%i")
    t.end()

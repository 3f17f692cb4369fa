"""Slot GEMV tiles for a few tokens: the MoE slot tiles (``slots=K``) on CUDA
cores, with weights streamed in whole 128-byte lines.

Same contract as :func:`etc.tiles.gemm.moe_gate_up` / :func:`moe_down` with
``slots=K`` (tile ``(s, j)`` of slot ``s``: token ``s // K``'s ``s % K``-th
expert, column block ``j``; the same buffers and numpy reference), for
``MoEConfig(route="slots", gemm="gemv")``. Why another tile: a T = 1 layer
is one matrix-vector product per slot, and the ``mma.sync`` tiles' fragment
copies fetch each weight row in 64-byte halves (8 rows 4 KB apart per warp
instruction) behind a per-iteration activation load; the same bytes
streamed in whole lines by a bare ``cp.async`` ring reach ~4 TB/s on an
H200 where the ``mma.sync`` tile alone reaches ~3.2 (``bench/RESULTS.md``,
MoE, items 102-103; this tile ~3.5, and the layer 6-12 % faster at T = 1-5).

Layout: thread ``tid`` of a ``block_size``-thread CTA owns two weight rows
(row ``tid // 8`` of each of the block's two halves) and the 16-byte piece
``tid % 8`` of every 128-byte k chunk of them, so a warp's copy covers 4 rows x 128
contiguous bytes. The weights go through a per-thread ``cp.async`` ring of
``stages`` chunks (``stages - 1`` in flight; every thread reads back only
its own slots: no CTA barrier in the loop); the activation row is copied
into workgroup memory once, after the waits. A thread keeps two
``vector<8xf32>`` partial sums; the 8 lanes of a row add theirs with three
shuffles, and lane 0 of each row stores it.

* gate/up (``block_n`` columns, a multiple of 4 up to ``block_size / 8``):
  rows ``n0 + r`` (gate) and ``inter + n0 + r`` (up), epilogue ``Hb[s, n0 +
  r] = bf16(silu(g) * u)``.
* down (``block_n`` a multiple of 8 up to ``block_size / 4``): rows ``n0 +
  r`` and ``n0 + block_n/2 + r``, ``Yp[s, n] = bf16(sum)``.

A narrower block leaves whole warps idle (``8 * rows`` threads work): more,
smaller tiles for a T = 1 layer whose gate/up grid would not fill the GPU.

``combine_topk=K`` (down): the token's combine in its down tiles, with no
task (and no event hop) after them. Tile ``(s, j)`` stores its row of
``Yp`` as before, then counts itself on ``Ycount[s // K, j]``
(acquire-release, GPU scope, after a CTA barrier); the K-th of the token's
tiles of block ``j`` resets the counter and writes ``Out[t, block j] =
bf16(sum_k topk_w[t, k] * Yp[t*K + k, block j])``, the combine task's sum
(float32, k order; L1-bypassing loads). The counters return to zero after
every launch: start them at zero.
"""

from __future__ import annotations

from typing import Any

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..errors import GraphError
from . import _mma, _text
from ._mma import Text as _Text
from .gemm import _slot_expert, _source

#: The options of :func:`moe_gate_up` / :func:`moe_down`, with their defaults:
#: ``block_size``, ``slots`` (required), ``slot_logits`` (gate/up: logits
#: parts, 0: read ``topk_ids``), ``stages`` (ring slots: ``stages - 1`` k
#: chunks of 128 bytes per row in flight; more than the chunks + 1 are not
#: used), ``prefetch_ring`` (down: a prefetch function fills the ring's first
#: ``stages - 1`` chunks before the waits; ``Graph.task(prefetch_after=1)``
#: runs it after the top-k's) and ``weight_chunk`` (the weights in
#: :func:`etc.tiles.gemm.chunk_weights`' layout; 0: nn.Linear rows).
#: ``combine_topk`` (down: 0, or K: the last of a token's K slot tiles of a
#: column block to finish sums the block's K rows into ``Out``; module
#: docstring).
GEMV_OPTIONS: dict[str, Any] = dict(
    block_size=256, slots=None, slot_logits=0, stages=4, prefetch_ring=False, weight_chunk=0,
    combine_topk=0,
)  # fmt: skip
#: Lanes that share a weight row (16 bytes each of a 128-byte k chunk).
LANES_PER_ROW = 8
#: Elements of a k chunk (128 bytes of bf16).
CHUNK = 64


@checked_arguments
def moe_gate_up(
    block_m: int,
    block_n: int,
    hidden: int,
    inter: int,
    *,
    experts: int | None = 128,
    name: str = "moe_gate_up_gemv",
    **options: Any,
) -> DeviceFunction:
    """Slot gate/up tile ``(s, j)``: ``Hb[s, n] = bf16(silu(g) * u)`` for the
    ``block_n`` columns of block ``j`` (a multiple of 4, at most ``block_size
    / 8``; module docstring).
    Buffers ``(X, topk_ids | L, Wgu, Hb)`` as
    :func:`etc.tiles.gemm.moe_gate_up` with ``slots``; ``block_m`` is
    unused (one token row per slot)."""
    return _gemv_tile("gate_up", block_m, block_n, hidden, inter, experts, name, options)


@checked_arguments
def moe_down(
    block_m: int,
    block_n: int,
    hidden: int,
    inter: int,
    *,
    experts: int | None = 128,
    name: str = "moe_down_gemv",
    **options: Any,
) -> DeviceFunction:
    """Slot down tile ``(s, j)``: ``Yp[s, n] = bf16(Hb[s] @ Wd[e, n]^T)`` for
    the ``block_n`` columns of block ``j`` (a multiple of 8, at most
    ``block_size / 4``). Buffers ``(Hb,
    topk_ids, Wd, Yp)`` as :func:`etc.tiles.gemm.moe_down` with ``slots``."""
    return _gemv_tile("down", block_m, block_n, hidden, inter, experts, name, options)


def _gemv_tile(
    kind: str, block_m: int, block_n: int, hidden: int, inter: int, experts: int | None,
    name: str, options: dict,
) -> DeviceFunction:  # fmt: skip
    o = _mma.tile_options(name, options, GEMV_OPTIONS)
    gate = kind == "gate_up"
    bs, slots, stages = o["block_size"], o["slots"], o["stages"]
    _text.check_block(name, bs)
    _text.positive(name, block_m=block_m, hidden=hidden, inter=inter)
    if slots is None:
        raise GraphError(f"tile '{name}': the GEMV tiles are slot tiles: give slots=K")
    _text.positive(name, slots=slots, stages=stages)
    _text.non_negative(name, slot_logits=o["slot_logits"])
    if experts is None:
        raise GraphError(f"tile '{name}': the GEMV tiles need the expert count (experts=)")
    _text.positive(name, experts=experts)
    combine = o["combine_topk"]
    _text.non_negative(name, combine_topk=combine)
    if combine and (gate or combine != slots):
        raise GraphError(
            f"tile '{name}': combine_topk sums a token's {slots} slot rows in its down tiles: "
            f"it takes the down tile and combine_topk = slots ({slots}); got kind={kind}, "
            f"combine_topk={combine}"
        )
    if o["slot_logits"] and not gate:
        raise GraphError(f"tile '{name}': slot_logits picks the expert of a gate/up slot tile")
    if o["prefetch_ring"] and (gate or stages < 2):
        raise GraphError(
            f"tile '{name}': prefetch_ring fills a down tile's ring before its waits (its "
            f"expert is in topk_ids by then) and needs stages >= 2; got kind={kind}, "
            f"stages={stages}"
        )
    k, n = (hidden, inter) if gate else (inter, hidden)
    # Two rows per thread, 8 lanes per row: a half of `rows` rows takes
    # 8 * rows threads, whole warps (the others idle in the loop).
    rows = block_n if gate else block_n // 2
    most = bs // LANES_PER_ROW
    if not gate and block_n % 2 or rows % 4 or not 0 < rows <= most:
        raise GraphError(
            f"tile '{name}': a {bs}-thread GEMV {kind} tile takes block_n a multiple of "
            f"{4 if gate else 8} up to {most if gate else 2 * most} ({LANES_PER_ROW} lanes per "
            f"weight row, two rows per thread, whole warps), got {block_n}"
        )
    _mma.check_divisible(name, block_n, n, "inter" if gate else "hidden")
    if k % CHUNK:
        raise GraphError(f"tile '{name}': k={k} must be a multiple of {CHUNK} (128-byte chunks)")
    chunks = k // CHUNK
    weight_chunk = _mma.check_weight_chunk(name, o["weight_chunk"], k, 2 * n if gate else n)
    # A ring deeper than the k loop would hold every chunk: one slot per
    # chunk and one more is all it can use (the presets' 12 slots at small k).
    stages = min(stages, chunks + 1)
    ed = str(experts)
    logits = o["slot_logits"]
    if gate:
        at, wt, ot = _mma.gate_up_types(hidden, inter, ed)
        ids_t = f"memref<?x{experts}xf32>" if logits else f"memref<?x{slots}xi32>"
        table = "%L" if logits else "%topk_ids"
        signature = f"%s: index, %j: index, %X: {at}, {table}: {ids_t}, %Wgu: {wt}, %Hb: {ot}"
        a, w, out = ("%X", at), ("%Wgu", wt), ("%Hb", ot)
        what = f"{name}: Hb[s] = silu(X[s/K] @ Wg[e]^T) * (X[s/K] @ Wu[e]^T), slot s (GEMV)"
    else:
        at, wt, ot = _mma.down_types(hidden, inter, ed)
        ids_t, table = f"memref<?x{slots}xi32>", "%topk_ids"
        signature = f"%s: index, %j: index, %Hb: {at}, %topk_ids: {ids_t}, %Wd: {wt}, %Yp: {ot}"
        a, w, out = ("%Hb", at), ("%Wd", wt), ("%Yp", ot)
        what = f"{name}: Yp[s] = Hb[s] @ Wd[e]^T, slot s (GEMV)"
        if combine:
            signature += (
                f", %topk_w: memref<?x{slots}xf32>, %Ycount: {count_type(hidden)}, "
                f"%Out: memref<?x{hidden}xbf16>"
            )
            what += ", the last of a token's slots of block j sums them into Out"
    early = stages - 1 if o["prefetch_ring"] else 0
    ring_t = f"memref<{stages * 2 * bs * 4}xi32, #gpu.address_space<workgroup>>"
    plan = dict(
        gate=gate, name=name, bs=bs, k=k, n=n, inter=inter, rows=rows, block_n=block_n,
        slots=slots, stages=stages, chunks=chunks, a=a, w=w, out=out, ring_t=ring_t,
        logits=logits, experts=experts, ids_t=ids_t, chunk=weight_chunk, combine=combine,
    )  # fmt: skip
    t = _Text()
    globals_ = _emit(t, plan, "body" if early else "all")
    t.close()
    source = _source(name, signature, t, globals_, what)
    if early:
        tp = _Text()
        _emit(tp, plan, "fill")
        tp.close()
        source += _source(
            f"{name}__prefetch", signature, tp, [], f"{name}: the weight ring's first chunks"
        )
    reference = _mma.slot_reference(
        kind, block_n, inter, slots, logits, chunk=weight_chunk, combine=bool(combine)
    )
    fn = DeviceFunction.from_mlir(source, name, reference, block_size=bs)
    fn.prefetch_fills_shared = bool(early)
    return fn


def _emit(t: _Text, p: dict, part: str) -> list[str]:
    """The tile's body (``part="all"``), its body after a prefetch function
    filled the ring (``"body"``) or that prefetch function (``"fill"``).
    Returns the workgroup globals it declares."""
    gate, bs, slots, stages = p["gate"], p["bs"], p["slots"], p["stages"]
    k, chunks, rows = p["k"], p["chunks"], p["rows"]
    a_mem, a_t = p["a"]
    w_mem, w_t = p["w"]
    out_mem, out_t = p["out"]
    token = t.op("tok", f"arith.divui %s, %c{slots}_ : index")
    r0 = token if gate else "%s"
    nrows = t.op("arows", f"memref.dim {a_mem}, %c0 : {a_t}")
    valid = t.op("valid", f"arith.cmpi ult, {r0}, {nrows} : index")
    t.emit(f"scf.if {valid} {{")
    t.indent += "  "
    kth = t.op("kth", f"arith.remui %s, %c{slots}_ : index")
    if p["logits"]:
        raw, _ = _slot_expert(t, token, kth, nrows, p["experts"], slots, p["logits"], p["ids_t"])
    else:
        raw = t.op("eid", f"memref.load %topk_ids[{token}, {kth}] : {p['ids_t']}")
    e = t.op("e", f"arith.index_cast {raw} : i32 to index")
    tid = t.op("tid", "gpu.thread_id x")
    r = t.op("r", f"arith.divui {tid}, %c{LANES_PER_ROW}_ : index")
    piece = t.op("pc", f"arith.remui {tid}, %c{LANES_PER_ROW}_ : index")
    n0 = t.op("n0", f"arith.muli %j, %c{p['block_n']}_ : index")
    row_a = t.op("ra", f"arith.addi {n0}, {r} : index")
    second = p["inter"] if gate else rows  # the up rows, or the block's second half
    row_b = t.op("rb", f"arith.addi {row_a}, %c{second}_ : index")
    # Byte address of each row's piece in chunk 0 (nn.Linear rows), or of
    # the row's place in its 8-row group (chunked: element (row // 8) * 8k
    # + (row % 8) * C; a k step then adds (kk // C) * 8C + kk % C).
    chunk = p["chunk"]
    wbase = t.op("wb", f"memref.extract_aligned_pointer_as_index {w_mem} : {w_t} -> index")
    per_expert = 2 * p["inter"] if gate else p["n"]
    erow = t.op("er", f"arith.muli {e}, %c{per_expert}_ : index")
    pk = t.op("pk", f"arith.muli {piece}, %c8 : index")  # the piece's first k in a chunk
    srcs = []
    for row in (row_a, row_b):
        lin = t.op("lin", f"arith.addi {erow}, {row} : index")
        if chunk:
            grp = t.op("grp", f"arith.divui {lin}, %c8 : index")
            grp = t.op("grp", f"arith.muli {grp}, %c{8 * k}_ : index")
            sub = t.op("sub", f"arith.remui {lin}, %c8 : index")
            sub = t.op("sub", f"arith.muli {sub}, %c{chunk}_ : index")
            lin = t.op("lin", f"arith.addi {grp}, {sub} : index")
        else:
            lin = t.op("lin", f"arith.muli {lin}, %c{k}_ : index")
            lin = t.op("lin", f"arith.addi {lin}, {pk} : index")
        lin = t.op("lin", f"arith.muli {lin}, %c2 : index")
        srcs.append(t.op("src", f"arith.addi {wbase}, {lin} : index"))
    ring = ThreadRing(t, p["name"], p["ring_t"], tid, bs, 2)
    globals_ = [ring.declaration]

    def issue(c: str, stage: str) -> None:
        if chunk:  # k = 64c + 8 * piece: chunk kk // C, element kk % C of it
            kk = t.op("kk", f"arith.muli {c}, %c{CHUNK}_ : index")
            kk = t.op("kk", f"arith.addi {kk}, {pk} : index")
            kc = t.op("kc", f"arith.divui {kk}, %c{chunk}_ : index")
            kc = t.op("kc", f"arith.muli {kc}, %c{8 * chunk}_ : index")
            ko = t.op("ko", f"arith.remui {kk}, %c{chunk}_ : index")
            kb = t.op("kb", f"arith.addi {kc}, {ko} : index")
            kb = t.op("kb", f"arith.muli {kb}, %c2 : index")
        else:
            kb = t.op("kb", f"arith.muli {c}, %c{2 * CHUNK}_ : index")
        ring.copy(srcs, kb, stage)

    # Threads past the block's rows (whole warps) copy and add nothing.
    active = LANES_PER_ROW * rows
    busy = t.op("busy", f"arith.cmpi ult, {tid}, %c{active}_ : index") if active < bs else None

    def open_busy() -> str:
        if busy is not None:
            t.emit(f"scf.if {busy} {{")
            t.indent += "  "
        return t.indent

    def close_busy() -> None:
        if busy is not None:
            t.end()

    pre = stages - 1
    first, last = (pre, pre) if part == "body" else (0, pre)
    if first < last:
        open_busy()
        for c in range(first, last):
            const = f"%c{c}_" if c else "%c0"
            issue(const, const)
        close_busy()
    if part == "fill":
        return []
    # The activation row into workgroup memory (16 bytes per thread).
    a_smem = f"memref<{k}xbf16, #gpu.address_space<workgroup>>"
    globals_.append(f'memref.global "private" @{p["name"]}__a : {a_smem} {{alignment = 16 : i64}}')
    av = t.op("av", f"memref.get_global @{p['name']}__a : {a_smem}")
    col = t.op("acol", f"arith.muli {tid}, %c8 : index")
    t.emit("gpu.barrier")  # the previous instance may still read the row
    for lo in range(0, k, 8 * bs):
        at = t.op("acol", f"arith.addi {col}, %c{lo}_ : index") if lo else col
        inside = t.op("ain", f"arith.cmpi ult, {at}, %c{k}_ : index")
        t.emit(f"scf.if {inside} {{")
        v = t.op(
            "a", f"vector.load {a_mem}[{r0}, {at}] {{alignment = 16 : i64}} : {a_t}, vector<8xbf16>"
        )
        t.emit(
            f"  vector.store {v}, {av}[{at}] {{alignment = 16 : i64}} : {a_smem}, vector<8xbf16>"
        )
        t.emit("}")
    t.emit("gpu.barrier")
    open_busy()
    apiece = t.op("ap", f"arith.muli {piece}, %c8 : index")
    zero = t.op("z", "arith.constant dense<0.0> : vector<8xf32>")

    def compute(c: str, stage: str, accs: list[str]) -> list[str]:
        ak = t.op("ak", f"arith.muli {c}, %c{CHUNK}_ : index")
        ak = t.op("ak", f"arith.addi {ak}, {apiece} : index")
        return fma_chunk(t, (av, a_smem), ak, ring, stage, accs)

    res = t.fresh("accs")
    t.emit(
        f"{res}:2 = scf.for %c_it = %c0 to %c{chunks - pre}_ step %c1 "
        f"iter_args(%acc_a = {zero}, %acc_b = {zero}) -> (vector<8xf32>, vector<8xf32>) {{"
    )
    outer = t.indent
    t.indent += "  "
    # The loop stops `pre` chunks early (the tail below), so chunk it + pre exists.
    nxt = t.op("nx", f"arith.addi %c_it, %c{pre}_ : index")
    issue(nxt, t.op("st", f"arith.remui {nxt}, %c{stages}_ : index"))
    t.emit(f"nvvm.cp.async.wait.group {pre}")
    accs = compute(
        "%c_it", t.op("st", f"arith.remui %c_it, %c{stages}_ : index"), ["%acc_a", "%acc_b"]
    )
    t.emit(f"scf.yield {', '.join(accs)} : vector<8xf32>, vector<8xf32>")
    t.indent = outer
    t.emit("}")
    accs = [f"{res}#0", f"{res}#1"]
    for q in range(pre):
        c = chunks - pre + q
        t.emit(f"nvvm.cp.async.wait.group {pre - 1 - q}")
        accs = compute(f"%c{c}_", f"%c{c % stages}_" if c % stages else "%c0", accs)
    # The 8 lanes of a row add their partial sums (xor 4, 2, 1 stays in the group).
    sums = []
    c32 = t.op("w32", "arith.constant 32 : i32")
    for acc in accs:
        v = t.op("sum", f"vector.reduction <add>, {acc} : vector<8xf32> into f32")
        sums.append(lane_sum(t, v, (4, 2, 1), c32))
    lead = t.op("lead", f"arith.cmpi eq, {piece}, %c0 : index")
    t.emit(f"scf.if {lead} {{")
    t.indent += "  "
    if gate:
        g, u = sums
        h = t.op("h", f"arith.mulf {_mma.silu(t, g)}, {u} : f32")
        hb = t.op("hb", f"arith.truncf {h} : f32 to bf16")
        t.emit(f"memref.store {hb}, {out_mem}[%s, {row_a}] : {out_t}")
    else:
        for row, v in zip((row_a, row_b), sums, strict=True):
            yb = t.op("yb", f"arith.truncf {v} : f32 to bf16")
            t.emit(f"memref.store {yb}, {out_mem}[%s, {row}] : {out_t}")
    t.end()
    close_busy()
    if p["combine"]:
        globals_.append(_last_combine(t, p, token, tid, n0))
    return globals_


class ThreadRing:
    """A per-thread ``cp.async`` ring in workgroup memory ``@<name>__ring``:
    each stage holds ``per_stage`` 16-byte slots for each of the ``bs``
    threads, slot ``(stage, f)`` of thread ``tid`` at 16 bytes x ((stage *
    per_stage + f) * bs + tid), so a warp's copies land side by side and
    each thread reads back only its own (no CTA barrier in the loop)."""

    def __init__(self, t: _Text, name: str, ring_t: str, tid: str, bs: int, per_stage: int):
        self.t, self.type, self.tid, self.bs, self.per = t, ring_t, tid, bs, per_stage
        self.declaration = (
            f'memref.global "private" @{name}__ring : {ring_t} {{alignment = 16 : i64}}'
        )
        self.ring = t.op("ring", f"memref.get_global @{name}__ring : {ring_t}")
        sb = t.op("sb", f"memref.extract_aligned_pointer_as_index {self.ring} : {ring_t} -> index")
        toff = t.op("sb", f"arith.muli {tid}, %c16_ : index")
        self.base = t.op("sb", f"arith.addi {sb}, {toff} : index")

    def slot(self, stage: str, f: int, what: str) -> str:
        """Slot (stage, f) of this thread: byte address or i32 index."""
        t = self.t
        q = t.op("q", f"arith.muli {stage}, %c{self.per}_ : index")
        q = t.op("q", f"arith.addi {q}, %c{f}_ : index") if f else q
        if what == "bytes":
            q = t.op("q", f"arith.muli {q}, %c{self.bs * 16}_ : index")
            return t.op("q", f"arith.addi {self.base}, {q} : index")
        q = t.op("q", f"arith.muli {q}, %c{self.bs}_ : index")
        q = t.op("q", f"arith.addi {q}, {self.tid} : index")
        return t.op("q", f"arith.muli {q}, %c4 : index")

    def copy(self, srcs: list[str], offset: str, stage: str) -> None:
        """16 bytes from each global address ``srcs[f] + offset`` into slot
        ``(stage, f)``, as one ``cp.async`` group."""
        t = self.t
        for f, src in enumerate(srcs):
            g = t.op("g", f"arith.addi {src}, {offset} : index")
            cp_async_16(t, self.slot(stage, f, "bytes"), g)
        t.emit("nvvm.cp.async.commit.group")


def cp_async_16(t: _Text, shared: str, source: str) -> None:
    """``cp.async.cg`` of 16 bytes from global byte address ``source`` to
    workgroup byte address ``shared`` (both index)."""
    g = t.op("g", f"arith.index_cast {source} : index to i64")
    g = t.op("g", f"llvm.inttoptr {g} : i64 to !llvm.ptr<1>")
    d = t.op("d", f"arith.index_cast {shared} : index to i64")
    d = t.op("d", f"llvm.inttoptr {d} : i64 to !llvm.ptr<3>")
    t.emit(f"nvvm.cp.async.shared.global {d}, {g}, 16, cache = cg : !llvm.ptr<3>, !llvm.ptr<1>")


def fma_chunk(
    t: _Text, a: tuple[str, str], ak: str, ring: ThreadRing, stage: str, accs: list[str]
) -> list[str]:
    """One k chunk of a GEMV thread: ``accs[f] += f32(w_f) * f32(x)``, ``x``
    the 8 activations at ``ak`` of workgroup row ``a = (memref, type)`` and
    ``w_f`` this thread's slot ``(stage, f)`` of ``ring``."""
    av, a_t = a
    x = t.op("x", f"vector.load {av}[{ak}] {{alignment = 16 : i64}} : {a_t}, vector<8xbf16>")
    x = t.op("x", f"arith.extf {x} : vector<8xbf16> to vector<8xf32>")
    out = []
    for f, acc in enumerate(accs):
        wv = t.op(
            "w", f"vector.load {ring.ring}[{ring.slot(stage, f, 'index')}] "
            f"{{alignment = 16 : i64}} : {ring.type}, vector<4xi32>",
        )  # fmt: skip
        wv = t.op("w", f"vector.bitcast {wv} : vector<4xi32> to vector<8xbf16>")
        wv = t.op("w", f"arith.extf {wv} : vector<8xbf16> to vector<8xf32>")
        out.append(t.op("acc", f"vector.fma {wv}, {x}, {acc} : vector<8xf32>"))
    return out


def lane_sum(t: _Text, v: str, offsets, width: str) -> str:
    """f32 ``v`` summed over the lanes ``xor offsets`` reach (every lane of
    the group gets it); ``width``: an i32 32."""
    for off in offsets:
        o = t.op("off", f"arith.constant {off} : i32")
        sh = t.fresh("sh")
        t.emit(f"{sh}, %{sh[1:]}ok = gpu.shuffle xor {v}, {o}, {width} : f32")
        v = t.op("sum", f"arith.addf {v}, {sh} : f32")
    return v


#: Output columns per ``Ycount`` column: a counter per (token, 8-column
#: group), so that one buffer serves any down tile width (block ``j`` uses
#: column ``j``).
COUNT_COLUMNS = 8


def count_type(hidden: int) -> str:
    """``Ycount``'s type (:data:`COUNT_COLUMNS`)."""
    return f"memref<?x{hidden // COUNT_COLUMNS}xi32>"


def _last_combine(t: _Text, p: dict, token: str, tid: str, n0: str) -> str:
    """``combine_topk``: count this tile on ``Ycount[token, j]``; the token's
    last slot tile of block ``j`` resets it and sums the block's K rows of
    ``Yp`` into ``Out`` (8 columns per thread). Returns the flag's global."""
    K, n, name = p["slots"], p["n"], p["name"]
    # Every row of this tile is stored (the barrier) before thread 0 counts
    # it, with release semantics at GPU scope; the K-th count acquires the others'.
    t.emit("gpu.barrier")
    is0 = t.op("is0", f"arith.cmpi eq, {tid}, %c0 : index")
    cnt_t = count_type(n)
    at = t.op("ct", f"arith.muli {token}, %c{n // COUNT_COLUMNS}_ : index")
    at = t.op("ct", f"arith.addi {at}, %j : index")
    at = t.op("ct", f"arith.muli {at}, %c4 : index")
    base = t.op("cb", f"memref.extract_aligned_pointer_as_index %Ycount : {cnt_t} -> index")
    at = t.op("ct", f"arith.addi {base}, {at} : index")
    at = t.op("ct", f"arith.index_cast {at} : index to i64")
    flag, flag_global = _mma.last_arrival_flag(name)
    _mma.open_last_arrival(t, flag, is0, at, K)
    inside = t.op("cin", f"arith.cmpi ult, {tid}, %c{p['block_n'] // 8}_ : index")
    t.emit(f"scf.if {inside} {{")
    t.indent += "  "
    col = t.op("col", f"arith.muli {tid}, %c8 : index")
    col = t.op("col", f"arith.addi {n0}, {col} : index")
    out_mem, out_t = p["out"]
    ybase = t.op("yb", f"memref.extract_aligned_pointer_as_index {out_mem} : {out_t} -> index")
    first = t.op("r0", f"arith.muli {token}, %c{K}_ : index")
    quad_t = "!llvm.struct<(i32, i32, i32, i32)>"
    rows = []
    for k in range(K):  # every row's load before the first add: one L2 round trip
        row = t.op("row", f"arith.addi {first}, %c{k}_ : index") if k else first
        at_k = t.op("ya", f"arith.muli {row}, %c{n}_ : index")
        at_k = t.op("ya", f"arith.addi {at_k}, {col} : index")
        at_k = t.op("ya", f"arith.muli {at_k}, %c2 : index")
        at_k = t.op("ya", f"arith.addi {ybase}, {at_k} : index")
        at_k = t.op("ya", f"arith.index_cast {at_k} : index to i64")
        rows.append(
            t.op(
                "yl",
                'llvm.inline_asm has_side_effects asm_dialect = att "ld.global.cg.v4.u32 '
                f'{{$0, $1, $2, $3}}, [$4];", "=r,=r,=r,=r,l" {at_k} : (i64) -> {quad_t}',
            )
        )
    acc = t.op("cz", "arith.constant dense<0.0> : vector<8xf32>")
    for k, got in enumerate(rows):
        words = [t.op("yw", f"llvm.extractvalue {got}[{e}] : {quad_t}") for e in range(4)]
        v = t.op("yv", f"vector.from_elements {', '.join(words)} : vector<4xi32>")
        v = t.op("yv", f"vector.bitcast {v} : vector<4xi32> to vector<8xbf16>")
        v = t.op("yv", f"arith.extf {v} : vector<8xbf16> to vector<8xf32>")
        w = t.op("wk", f"memref.load %topk_w[{token}, %c{k}_] : memref<?x{K}xf32>")
        w = t.op("wk", f"vector.broadcast {w} : f32 to vector<8xf32>")
        acc = t.op("cs", f"vector.fma {w}, {v}, {acc} : vector<8xf32>")
    o = t.op("co", f"arith.truncf {acc} : vector<8xf32> to vector<8xbf16>")
    t.emit(
        f"vector.store {o}, %Out[{token}, {col}] {{alignment = 16 : i64}} : "
        f"memref<?x{n}xbf16>, vector<8xbf16>"
    )
    t.end()
    t.end()
    return flag_global

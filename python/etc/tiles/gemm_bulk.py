"""Decode GEMM tiles that stream their weights with bulk copies (sm_90).

The main loop of :func:`etc.tiles.gemm.layer_gemm` with ``core="bulk"``: a
tile's weight block (``R`` consecutive rows of ``K`` values, two runs of rows
for SwiGLU) goes through a ring of ``stages`` shared-memory slots, each
holding ``kc`` values of ``k`` of every weight row and of every activation
row, loaded with ``cp.async.bulk`` (one copy per row and chunk, issued by
the lanes of warp 0) and counted on the slot's mbarrier.

* **The weights load before the waits.** The tile's prefetch function
  ``@<name>__prefetch``, which the kernel runs before an instance waits for
  its inputs, initialises the mbarriers and issues the first ``stages``
  chunks of weights: they stream in while the previous stage of the model
  finishes. The tile body then adds each slot's activation rows (only the
  ``M - r0`` rows that exist), so a slot's phase completes when both have
  landed. A CTA thus keeps ``stages`` chunks of every tile in flight from
  before its waits to its last chunk: a stage boundary no longer costs an
  HBM round trip plus the ramp of a ring.
* **Shared memory, not registers.** Rows are stored ``2 * kc + 16`` bytes
  apart, so the ``ldmatrix`` of 8 rows at one ``k`` hits 8 distinct bank
  groups. Warp ``w`` multiplies the ``w``-th of ``warps`` slices of each
  chunk (``mma.sync.m16n8k16``, fp32); the warps' partial sums meet in
  workgroup memory and warp 0 runs the epilogue.

Measured on an H200 (``bench/decode_gemm.py``, ``bench/RESULTS.md``): the
TMA unit's cost per copy makes rows of ``kc`` values slow below ~1 KB per
copy (256-byte copies: 1.6 TB/s); with 1 KB copies a projection streams at
3.3-3.5 TB/s against 4.1 for the ``cp.async`` core, and in the decoder the
bulk core is slower at every batch size. It stays an option
(``LlamaConfig(gemm_core="bulk")``), not the default.

Because the prefetch writes the shared memory that the body reads, a tile of
this core must not have its prefetch called for another instance first
(``etc.compile(prefetch_next=True)`` refuses it: see
:attr:`etc.DeviceFunction.prefetch_fills_shared`). The mbarrier waits trap
after ``MBAR_POLLS`` polls instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import GraphError
from . import _mma
from .gemm import MAX_SHARED_BYTES
from .gemm_tc import _FRAG, _asm, _asm_ops, _i32, _mbar_wait, _Text, _words, mbarrier_inval

__all__ = ["BulkPlan", "plan_bulk", "body", "prefetch"]

#: Shared memory a bulk tile plans for by default (ring + partials): two CTAs
#: of the decoder kernel still fit on one SM.
DEFAULT_SMEM = 100 * 1024
#: Weight bytes per slot the default chunk aims at.
DEFAULT_SLOT_WEIGHT_BYTES = 8 * 1024


@dataclass(frozen=True)
class BulkPlan:
    """The ring of one bulk tile: ``rows`` weight rows and ``a_rows``
    activation rows per slot, ``kc`` values of ``k`` each, ``stages`` slots;
    ``warps`` split each chunk along ``k``."""

    rows: int
    a_rows: int
    k: int
    kc: int
    stages: int
    warps: int

    @property
    def chunks(self) -> int:
        return self.k // self.kc

    @property
    def pitch(self) -> int:
        """Elements between two rows of a slot (16 bytes of padding)."""
        return self.kc + 8

    @property
    def slot_rows(self) -> int:
        return self.rows + self.a_rows

    @property
    def mf(self) -> int:
        return self.a_rows // 16

    @property
    def nf(self) -> int:
        return self.rows // 8

    @property
    def ring_bytes(self) -> int:
        return self.stages * self.slot_rows * self.pitch * 2

    @property
    def partial_bytes(self) -> int:
        return (self.warps - 1) * self.mf * self.nf * 4 * 32 * 4

    @property
    def smem_bytes(self) -> int:
        return self.ring_bytes + self.partial_bytes + 8 * self.stages


def plan_bulk(
    name: str,
    rows: int,
    block_m: int,
    k: int,
    block_size: int,
    kc: int | None = None,
    stages: int | None = None,
    smem: int = DEFAULT_SMEM,
) -> BulkPlan:
    """Check (or choose) the chunk ``kc`` and the ring depth ``stages``.

    Default ``kc``: the largest power of two dividing ``k`` whose weight part
    of a slot stays within 8 KiB (at least ``16 * warps``); default
    ``stages``: as many slots as fit in ``smem`` bytes, at most one per chunk."""
    warps = block_size // 32
    if rows % 8:
        raise GraphError(f"tile '{name}': bulk core needs weight rows in 8s, got {rows}")
    if block_m % 16 or block_m > 64:
        raise GraphError(f"tile '{name}': bulk core needs block_m in 16, 32, 48, 64, got {block_m}")
    step = 16 * warps
    if k % step:
        raise GraphError(
            f"tile '{name}': k={k} does not split into {warps} warp slices of 16 (bulk core)"
        )
    if kc is None:
        kc = step
        while k % (2 * kc) == 0 and rows * 2 * (2 * kc) <= DEFAULT_SLOT_WEIGHT_BYTES:
            kc *= 2
    elif not isinstance(kc, int) or kc <= 0 or kc % step or k % kc:
        raise GraphError(
            f"tile '{name}': kc={kc!r} must divide k={k} and be a multiple of {step} "
            f"(16 values per warp)"
        )
    plan = BulkPlan(rows, block_m, k, kc, 1, warps)
    if stages is None:
        per_slot = plan.slot_rows * plan.pitch * 2 + 8
        stages = max(2, min(plan.chunks, (smem - plan.partial_bytes) // per_slot))
    elif not isinstance(stages, int) or stages < 1:
        raise GraphError(f"tile '{name}': stages={stages!r} must be a positive int")
    stages = min(stages, plan.chunks)
    plan = BulkPlan(rows, block_m, k, kc, stages, warps)
    if plan.smem_bytes > MAX_SHARED_BYTES:
        raise GraphError(
            f"tile '{name}': {stages} slots of {plan.slot_rows} rows x {kc} bf16 need "
            f"{plan.smem_bytes} bytes of shared memory (> {MAX_SHARED_BYTES}, what an sm_90 CTA can have)"
        )
    return plan


# A run of weight rows: (index of its first row in the weight viewed as rows
# of k values, number of rows). ``segments(t)`` emits their index values.
Segments = Callable[[_Text], list[tuple[str, int]]]


def _globals(name: str, plan: BulkPlan) -> tuple[list[str], str, str, str]:
    ring_t = (
        f"memref<{plan.stages}x{plan.slot_rows}x{plan.pitch}xbf16, #gpu.address_space<workgroup>>"
    )
    bar_t = f"memref<{plan.stages}xi64, #gpu.address_space<workgroup>>"
    part_t = f"memref<{max(1, plan.partial_bytes // 4)}xf32, #gpu.address_space<workgroup>>"
    lines = [
        f'memref.global "private" @{name}__bulk_ring : {ring_t} {{alignment = 128 : i64}}',
        f'memref.global "private" @{name}__bulk_bar : {bar_t} {{alignment = 8 : i64}}',
        f'memref.global "private" @{name}__bulk_part : {part_t} {{alignment = 16 : i64}}',
    ]
    return lines, ring_t, bar_t, part_t


class _Ring:
    """Addresses of one tile's ring and mbarriers, in the function being emitted."""

    def __init__(self, t: _Text, name: str, plan: BulkPlan) -> None:
        _, self.ring_t, bar_t, _ = _globals(name, plan)
        self.t, self.plan = t, plan
        self.ring = t.op("ring", f"memref.get_global @{name}__bulk_ring : {self.ring_t}")
        bars = t.op("bars", f"memref.get_global @{name}__bulk_bar : {bar_t}")
        self.base = t.op(
            "rb", f"memref.extract_aligned_pointer_as_index {self.ring} : {self.ring_t} -> index"
        )
        self.bar_base = t.op(
            "bb", f"memref.extract_aligned_pointer_as_index {bars} : {bar_t} -> index"
        )

    def bar(self, stage: str | int) -> str:
        t = self.t
        off = t.c(8 * stage) if isinstance(stage, int) else t.mul(stage, 8)
        return _i32(t, t.op("x", f"arith.addi {self.bar_base}, {off} : index"))

    def row(self, stage: str | int, row: str | int) -> str:
        """Shared address (i32) of a slot row."""
        t, p = self.t, self.plan
        st = t.c(stage * p.slot_rows) if isinstance(stage, int) else t.mul(stage, p.slot_rows)
        r = t.add(st, row)
        return _i32(t, t.add(self.base, t.mul(r, 2 * p.pitch)))


def _copy(t: _Text, dst: str, src: str, nbytes: int, bar: str) -> None:
    """``cp.async.bulk`` of ``nbytes`` from global address ``src`` (index) to
    shared ``dst`` (i32), completing bytes on mbarrier ``bar`` (i32)."""
    src64 = t.op("src", f"arith.index_cast {src} : index to i64")
    _asm_ops(
        t,
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
        [(dst, "i32"), (src64, "i64"), (t.op("n", f"arith.constant {nbytes} : i32"), "i32"),
         (bar, "i32")],
    )  # fmt: skip


def _lane_rows(t: _Text, lane: str, bound: str, reps: int, emit: Callable[[str], None]) -> None:
    """``emit(row)`` for rows ``lane, lane + 32, ...`` (``reps`` of them) below ``bound``."""
    for rep in range(reps):
        r = t.add(lane, 32 * rep)
        _if(t, t.op("ok", f"arith.cmpi ult, {r}, {bound} : index"), lambda r=r: emit(r))


def _chunk_k(t: _Text, plan: BulkPlan, c: str | int, rot: str | None) -> str:
    """First ``k`` (elements) of logical chunk ``c`` (rotated by ``rot``)."""
    cv = t.c(c) if isinstance(c, int) else c
    if rot is not None:
        cv = t.bin("remui", t.op("x", f"arith.addi {cv}, {rot} : index"), plan.chunks)
    return t.mul(cv, plan.kc)


def _issue_rows(
    t: _Text, ring: _Ring, lane: str, stage: str | int, kchunk: str, base: str, first: str,
    slot_row: int, bound: str, reps: int,
) -> None:  # fmt: skip
    """Lanes copy chunk ``kchunk`` of rows ``first + r`` (``r`` below
    ``bound``, ``lane + 32 * rep``) of the matrix at ``base`` (``k`` bf16 per
    row) into slot rows ``slot_row + r`` of ``stage``."""
    p = ring.plan
    bar = ring.bar(stage)
    koff = t.mul(kchunk, 2)

    def one(r: str) -> None:
        row = t.op("x", f"arith.addi {first}, {r} : index")
        src = t.add(t.add(base, t.mul(row, 2 * p.k)), koff)
        _copy(t, ring.row(stage, t.add(r, slot_row)), src, 2 * p.kc, bar)

    _lane_rows(t, lane, bound, reps, one)


def _issue_weights(
    t: _Text, ring: _Ring, lane: str, segments: list[tuple[str, int]], w_base: str,
    stage: str | int, kchunk: str,
) -> None:  # fmt: skip
    """The weight rows of chunk ``kchunk`` into ``stage``: each run of
    ``segments`` after the previous one."""
    slot_row = 0
    for first, count in segments:
        _issue_rows(t, ring, lane, stage, kchunk, w_base, first, slot_row, t.c(count),
                    (count + 31) // 32)  # fmt: skip
        slot_row += count


def _issue_activations(
    t: _Text, ring: _Ring, lane: str, a_base: str, r0: str, nrows: str, stage: str | int,
    kchunk: str,
) -> None:  # fmt: skip
    """The block's activation rows that exist (at most ``a_rows``) of chunk
    ``kchunk`` into ``stage``, after its weight rows."""
    p = ring.plan
    bound = t.op("x", f"arith.minui {nrows}, {t.c(p.a_rows)} : index")
    _issue_rows(t, ring, lane, stage, kchunk, a_base, r0, p.rows, bound, (p.a_rows + 31) // 32)


def _if(t: _Text, cond: str, emit: Callable[[], None]) -> None:
    t.emit(f"scf.if {cond} {{")
    outer = t.indent
    t.indent += "  "
    emit()
    t.indent = outer
    t.emit("}")


def _lanes(t: _Text) -> tuple[str, str, str]:
    tid = t.op("tid", "gpu.thread_id x")
    return tid, t.bin("divui", tid, 32), t.bin("remui", tid, 32)


def prefetch(
    t: _Text,
    *,
    name: str,
    plan: BulkPlan,
    segments: Segments,
    w_base: Callable[[_Text], str],
    valid: Callable[[_Text], str],
    rotate: str | None,
) -> None:
    """Body of ``@<name>__prefetch``: every thread fences the shared memory
    that earlier tiles wrote through the generic proxy and joins; warp 0
    initialises the slots' mbarriers and issues the weight rows of the
    first ``stages`` chunks (thread 0 registers their bytes first)."""
    tid, warp, lane = _lanes(t)
    _asm(t, "fence.proxy.async.shared::cta;")
    t.emit("gpu.barrier")
    ok = valid(t)
    warp0 = t.op("w0", f"arith.cmpi eq, {warp}, {t.c(0)} : index")
    go = t.op("go", f"arith.andi {ok}, {warp0} : i1")

    def issue() -> None:
        ring = _Ring(t, name, plan)
        lane0 = t.op("l0", f"arith.cmpi eq, {lane}, {t.c(0)} : index")
        wbytes = t.op("tx", f"arith.constant {plan.rows * plan.kc * 2} : i32")

        def init() -> None:
            for s in range(plan.stages):
                _asm_ops(t, "mbarrier.init.shared::cta.b64 [$0], 1;", [(ring.bar(s), "i32")])
            _asm(t, "fence.mbarrier_init.release.cluster;")
            _each_bar(
                t, ring, plan.stages, "mbarrier.expect_tx.relaxed.cta.shared::cta.b64", wbytes
            )

        _if(t, lane0, init)
        _asm(t, "bar.warp.sync -1;")
        rot = _rotation(t, plan, rotate)
        segs, base = segments(t), w_base(t)
        for s in range(plan.stages):
            _issue_weights(t, ring, lane, segs, base, s, _chunk_k(t, plan, s, rot))

    _if(t, go, issue)


def _each_bar(t: _Text, ring: _Ring, stages: int, op: str, nbytes: str) -> None:
    """``op [bar], nbytes;`` on the mbarrier of every ring stage (``op`` up to
    the address operand: an expect_tx or an arrive.expect_tx)."""
    for s in range(stages):
        _asm_ops(t, f"{op} [$0], $1;", [(ring.bar(s), "i32"), (nbytes, "i32")])


def _rotation(t: _Text, plan: BulkPlan, rotate: str | None) -> str | None:
    return None if rotate is None else t.bin("remui", rotate, plan.chunks)


def body(
    t: _Text,
    *,
    name: str,
    plan: BulkPlan,
    segments: Segments,
    w_base: Callable[[_Text], str],
    a: tuple[str, str],
    r0: str,
    r1: str,
    rotate: str | None,
    epilogue: Callable[[_Text, list[list[list[str]]], list[str], str], None],
) -> list[str]:
    """The tile body (inside its ``r0 < M`` guard): activations into the
    prefetched slots, the chunk loop, the split-K join and ``epilogue(t,
    acc[mf][nf][4], rows, col_lane)`` on warp 0. Returns the globals."""
    p = plan
    globals_, _, _, part_t = _globals(name, p)
    tid, warp, lane = _lanes(t)
    ring = _Ring(t, name, p)
    a_mem, a_type = a
    a_base = t.op("ab", f"memref.extract_aligned_pointer_as_index {a_mem} : {a_type} -> index")
    nrows = t.op("nr", f"arith.subi {r1}, {r0} : index")
    rot = _rotation(t, p, rotate)
    warp0 = t.op("w0", f"arith.cmpi eq, {warp}, {t.c(0)} : index")
    lane0 = t.op("l0", f"arith.cmpi eq, {lane}, {t.c(0)} : index")
    arows = t.op("x", f"arith.minui {nrows}, {t.c(p.a_rows)} : index")
    abytes = _i32(t, t.mul(arows, 2 * p.kc))
    wbytes = t.op("tx", f"arith.constant {p.rows * p.kc * 2} : i32")
    both = t.op("tx", f"arith.addi {abytes}, {wbytes} : i32")
    segs, w_at = segments(t), w_base(t)  # for the refills

    def first_activations() -> None:
        _if(t, lane0, lambda: _each_bar(
            t, ring, p.stages, "mbarrier.arrive.expect_tx.shared::cta.b64 _,", abytes
        ))  # fmt: skip
        # Other CTAs wrote the activations through the generic proxy.
        _asm(t, "fence.proxy.async.global;")
        for s in range(p.stages):
            _issue_activations(t, ring, lane, a_base, r0, nrows, s, _chunk_k(t, p, s, rot))

    _if(t, warp0, first_activations)
    # Warp 0 initialised the mbarriers in the prefetch: every warp may poll them now.
    t.emit("gpu.barrier")

    # ldmatrix rows/columns of this lane (loop invariant).
    kw = p.kc // p.warps
    a_rows = [t.add(t.add(t.bin("remui", lane, 16), 16 * m), p.rows) for m in range(p.mf)]
    a_col = t.add(t.mul(warp, kw), t.mul(t.bin("divui", lane, 16), 8))
    mat = t.bin("divui", lane, 8)
    w_row = t.add(t.mul(t.bin("divui", mat, 2), 8), t.bin("remui", lane, 8))
    w_col = t.add(t.mul(warp, kw), t.mul(t.bin("remui", mat, 2), 8))
    w_row2 = t.bin("remui", lane, 8)  # .x2: lanes 0-15 give the addresses

    nacc = p.mf * p.nf * 4
    res, types = t.acc_loop("%kc", p.chunks, nacc)
    outer = t.indent
    t.indent += "  "
    stage = t.bin("remui", "%kc", p.stages)
    parity = _i32(t, t.bin("remui", t.bin("divui", "%kc", p.stages), 2))
    _mbar_wait(t, ring.bar(stage), parity)
    acc = [[[f"%acc_{(m * p.nf + f) * 4 + q}" for q in range(4)] for f in range(p.nf)]
           for m in range(p.mf)]  # fmt: skip
    vfrag2 = "vector<2x2xbf16>"
    for ks in range(kw // 16):
        fa = []
        for m in range(p.mf):
            v = t.op(
                "fa",
                f"nvgpu.ldmatrix {ring.ring}[{stage}, {a_rows[m]}, {t.add(a_col, 16 * ks)}] "
                f"{{numTiles = 4 : i32, transpose = false}} : {ring.ring_t} -> {_FRAG}",
            )
            fa.append(_words(t, v))
        fb: list[list[str]] = []
        for pair in range(p.nf // 2):
            v = t.op(
                "fb",
                f"nvgpu.ldmatrix {ring.ring}[{stage}, {t.add(w_row, 16 * pair)}, "
                f"{t.add(w_col, 16 * ks)}] {{numTiles = 4 : i32, transpose = false}} : "
                f"{ring.ring_t} -> {_FRAG}",
            )
            x = _words(t, v)
            fb += [x[0:2], x[2:4]]
        if p.nf % 2:
            v = t.op(
                "fb",
                f"nvgpu.ldmatrix {ring.ring}[{stage}, {t.add(w_row2, 8 * (p.nf - 1))}, "
                f"{t.add(w_col, 16 * ks)}] {{numTiles = 2 : i32, transpose = false}} : "
                f"{ring.ring_t} -> {vfrag2}",
            )
            fb.append(_words(t, v, tiles=2))
        for m in range(p.mf):
            for f in range(p.nf):
                acc[m][f] = _mma.mma(t, fa[m], fb[f], acc[m][f])
    # Every warp is done with this slot: warp 0 refills it with chunk kc + stages.
    t.emit("gpu.barrier")
    nxt = t.add("%kc", p.stages)
    more = t.op("more", f"arith.cmpi ult, {nxt}, {t.c(p.chunks)} : index")
    refill = t.op("refill", f"arith.andi {more}, {warp0} : i1")

    def refill_slot() -> None:
        def arrive() -> None:
            _asm_ops(
                t,
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
                [(ring.bar(stage), "i32"), (both, "i32")],
            )

        _if(t, lane0, arrive)
        kchunk = _chunk_k(t, p, nxt, rot)
        _issue_weights(t, ring, lane, segs, w_at, stage, kchunk)
        _issue_activations(t, ring, lane, a_base, r0, nrows, stage, kchunk)

    _if(t, refill, refill_slot)
    flat = [x for m in acc for f in m for x in f]
    t.emit(f"scf.yield {', '.join(flat)} : {types}")
    t.indent = outer
    t.emit("}")
    total = [f"{res}#{q}" for q in range(nacc)]

    # The loop's last barrier ended every wait: invalidate the slots' barriers.
    def invalidate() -> None:
        mbarrier_inval(t, (ring.bar(s) for s in range(p.stages)))

    _if(t, t.op("t0", f"arith.andi {warp0}, {lane0} : i1"), invalidate)

    # Split-K join: warps 1.. leave their sums in workgroup memory (the loop's
    # last barrier orders this after every read of the previous instance's).
    part = t.op("part", f"memref.get_global @{name}__bulk_part : {part_t}")
    not0 = t.op("n0", f"arith.cmpi ne, {warp}, {t.c(0)} : index")

    def store_partials() -> None:
        base = t.add(t.mul(t.op("x", f"arith.subi {warp}, {t.c(1)} : index"), nacc * 32), lane)
        for q, v in enumerate(total):
            t.emit(f"memref.store {v}, {part}[{t.add(base, 32 * q)}] : {part_t}")

    if p.warps > 1:
        _if(t, not0, store_partials)
        t.emit("gpu.barrier")

    def finish() -> None:
        sums = list(total)
        for w in range(1, p.warps):
            for q in range(nacc):
                at = t.add(lane, (w - 1) * nacc * 32 + 32 * q)
                v = t.op("pv", f"memref.load {part}[{at}] : {part_t}")
                sums[q] = t.op("sum", f"arith.addf {sums[q]}, {v} : f32")
        acc = [[[sums[(m * p.nf + f) * 4 + q] for q in range(4)] for f in range(p.nf)]
               for m in range(p.mf)]  # fmt: skip
        grp = t.bin("divui", lane, 4)
        rows = []
        for m in range(p.mf):
            for half in (0, 8):
                rows.append(t.add(t.add(r0, grp), 16 * m + half))
        epilogue(t, acc, rows, t.mul(t.bin("remui", lane, 4), 2))

    _if(t, warp0, finish)
    return globals_

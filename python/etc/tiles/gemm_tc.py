"""Pipelined bf16 tensor-core GEMM tiles for many rows (prefill MoE, dense GEMMs).

Same three factories, signatures and semantics as :mod:`etc.tiles.gemm`
(``C = A @ B^T``, ``A`` row-major ``(M, K)``, the weight ``B`` row-major
``(N, K)``; fp32 accumulation, bf16 out):

* :func:`gemm` (dense): coords ``(i, j)``, args ``(A: memref<?xKxbf16>,
  B: memref<?xKxbf16>, C: memref<?x?xbf16>)``; tile ``(i, j)`` writes
  ``C[i*BM:(i+1)*BM, j*BN:(j+1)*BN]`` clipped to ``M = dim(A, 0)`` and
  ``N = dim(B, 0)`` (``N`` even).
* :func:`moe_gate_up`: coords ``(i, e)``, args ``(Xp, Wgu, row_off,
  gu_indptr, Hb)``, ``Hb = bf16(silu(Xp @ Wg^T) * (Xp @ Wu^T))``; a block
  of ``BN`` output columns reads ``BN`` gate and ``BN`` up rows of ``Wgu``.
* :func:`moe_down`: coords ``(i, e)``, args ``(Hb, Wd, row_off, dn_indptr,
  Yp)``, ``Yp = bf16(Hb @ Wd[e]^T)``.

MoE tile ``i`` of expert ``e``: ``local = i - indptr[e]``, ``nmb =
ceil(cnt / BM)``, ``nb = local // nmb``, ``mb = local % nmb`` (no work
outside ``[indptr[e], indptr[e+1])``), as in ``/tmp/notes/moe_spec.md``.

Algorithm (the classic Ampere tile, one CTA, ``WM x WN`` warps):

* The block's ``BM`` rows of ``A`` and ``BR`` rows of ``B`` (``BR = BN``,
  or ``2 * BN`` for gate/up) go through a ``STAGES``-deep ring of workgroup
  buffers ``@<name>__smem_a : memref<STAGES x BM x 32 x bf16>`` and
  ``@<name>__smem_b``, 32 values of ``k`` per stage, filled with 16-byte
  ``cp.async.cg`` copies (``nvgpu.device_async_copy {bypassL1}``), one
  commit group per stage. Iteration ``kt`` waits until stage ``kt`` has
  landed (``wait_group STAGES-2``), puts one CTA barrier (which also
  retires the readers of the stage about to be refilled), issues the copies
  of k-tile ``kt + STAGES - 1`` and then computes on stage ``kt``.
* A 64-byte row holds four 16-byte chunks; chunk ``c`` of row ``r`` lives
  at chunk ``c ^ ((r >> 1) & 3)``, so the 8 row addresses of each
  ``ldmatrix`` 8x8 matrix (8 consecutive rows, one chunk) hit 8 distinct
  16-byte bank groups: no bank conflicts, no padding.
* Each warp computes ``MF x NF`` m16n8k16 fragments (``MF = BM / WM / 16``,
  ``NF = BR / WN / 8``): per 16-wide k step it loads ``A`` with ``MF``
  ``ldmatrix.x4`` and ``B`` with ``NF / 2`` ``ldmatrix.x4`` (two 8-row
  fragments each) and issues ``MF * NF`` ``mma.sync`` (``nvvm.mma.sync``,
  bf16 packed in i32). For gate/up a warp holds the gate and the up
  fragments of the same output columns, so the SwiGLU epilogue is local.
* Rows past the block's end are clamped to its last row for loading and not
  stored; the epilogue stores bf16 pairs straight from the accumulators.

bf16 buffers need 16-byte aligned base addresses; ``K % 32 == 0``. Shared
memory: ``STAGES * (BM + BR) * 64`` bytes, at most ``smem_limit`` (48 KiB,
the static limit; a graph's tiles share it, so MoE graphs that hold both
gate/up and down tiles need smaller configurations, e.g. ``stages=2``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._fields import checked_arguments, is_int
from ..device import DeviceFunction
from ..errors import GraphError
from . import _mma, _text
from ._mma import check_divisible as _check_divisible
from ._mma import experts_dim as _experts
from ._mma import positive as _positive

__all__ = ["gemm", "add_gemm_task", "moe_gate_up", "moe_down", "plan", "smem_bytes"]

BLOCK_K = 32
SMEM_LIMIT = 48 * 1024

_FRAG = "vector<4x2xbf16>"


def smem_bytes(block_m: int, b_rows: int, stages: int, block_k: int = BLOCK_K) -> int:
    """Workgroup bytes of a tile: ``stages`` k-tiles of ``block_k`` bf16 for ``A`` and ``B``."""
    return stages * (block_m + b_rows) * block_k * 2


def plan(
    name: str,
    block_m: int,
    block_n: int,
    k: int,
    block_size: int,
    warps: tuple[int, int] | None,
    stages: int,
    b_per_n: int = 1,
    smem_limit: int = SMEM_LIMIT,
    block_k: int = BLOCK_K,
) -> tuple[int, int]:
    """Check a configuration; return the warp grid ``(WM, WN)``.

    Default warps: ``2 x (warps / 2)`` (warp tile ``BM/2 x BN/(warps/2)``).
    ``b_per_n`` is 2 for gate/up (a block reads ``2 * BN`` weight rows)."""
    for key, value in (("block_m", block_m), ("block_n", block_n), ("k", k)):
        _positive(name, key, value)
    _positive(name, "block_size", block_size)
    _positive(name, "stages", stages)
    if block_size % 32:
        raise GraphError(f"tile '{name}': block_size={block_size} is not a multiple of 32")
    if k % BLOCK_K:
        raise GraphError(f"tile '{name}': k={k} must be a multiple of {BLOCK_K}")
    if stages < 2:
        raise GraphError(f"tile '{name}': stages={stages} must be at least 2")
    nw = block_size // 32
    if warps is None:
        wm = 2 if nw % 2 == 0 else 1
        wn = nw // wm
    else:
        if len(warps) != 2:
            raise GraphError(f"tile '{name}': warps must be (WM, WN), got {warps!r}")
        wm, wn = (_positive(name, "warps", w) for w in warps)
        if wm * wn != nw:
            raise GraphError(
                f"tile '{name}': warps {warps} do not multiply to block_size/32 = {nw}"
            )
    if block_m % (16 * wm):
        raise GraphError(
            f"tile '{name}': block_m={block_m} does not split over {wm} warp rows of 16"
        )
    if block_n % (16 * wn):
        raise GraphError(
            f"tile '{name}': block_n={block_n} does not split over {wn} warp columns "
            "of 16 (ldmatrix.x4 loads weight fragments in pairs)"
        )
    b_rows = b_per_n * block_n
    for key, rows in (("block_m", block_m), ("weight rows", b_rows)):
        if (rows * block_k // 8) % block_size:
            raise GraphError(
                f"tile '{name}': {key}={rows}: {rows} rows x {block_k // 8} 16-byte chunks "
                f"do not split evenly over {block_size} threads"
            )
    need = smem_bytes(block_m, b_rows, stages, block_k)
    if need > smem_limit:
        raise GraphError(
            f"tile '{name}': {stages} stages of {block_m}x{block_k} + {b_rows}x{block_k} "
            f"bf16 need {need} bytes of shared memory, over the limit of {smem_limit}"
        )
    return wm, wn


class _Text(_mma.Text):
    """An MLIR text buffer with fresh SSA names and hoisted index constants."""

    def __init__(self) -> None:
        super().__init__()
        self.consts: set[int] = set()
        #: Set by a main loop whose output goes through shared memory: takes
        #: over ``_store_pairs`` (see ``_staged_store``).
        self.staging: Callable[..., bool] | None = None
        #: Set by a TMA main loop: emits what must follow the first CTA
        #: barrier after the loop (the ring barriers' ``mbarrier.inval``).
        #: An epilogue step whose barrier comes first calls :meth:`joined`.
        self.after_join: Callable[[], None] | None = None

    def joined(self) -> None:
        """After a CTA barrier that every thread reaches past the main loop:
        runs the pending ``after_join`` once."""
        if self.after_join is not None:
            pending, self.after_join = self.after_join, None
            pending()

    def c(self, v: int) -> str:
        self.consts.add(v)
        return f"%c{v}_"

    def add(self, a: str, v: int | str) -> str:
        if isinstance(v, int):
            if v == 0:
                return a
            v = self.c(v)
        return self.op("x", f"arith.addi {a}, {v} : index")

    def mul(self, a: str, v: int) -> str:
        return a if v == 1 else self.op("x", f"arith.muli {a}, {self.c(v)} : index")

    def bin(self, kind: str, a: str, v: int | str) -> str:
        if isinstance(v, int):
            v = self.c(v)
        return self.op("x", f"arith.{kind} {a}, {v} : index")

    def acc_loop(
        self, var: str, trip: int | str, nacc: int, extra: tuple[tuple[str, str], ...] = ()
    ) -> tuple[str, str]:
        """Opens ``scf.for var = 0 to trip`` (a constant or an index value)
        carrying ``nacc`` f32 accumulators ``%acc_<q>``, zero at first, then
        the index values ``extra`` (``(name, initial value)``, results after
        the accumulators'); returns the loop's results name and their types
        (for the ``scf.yield``). The caller indents."""
        types = ", ".join(["f32"] * nacc + ["index"] * len(extra))
        inits = ", ".join(
            [f"%acc_{q} = %fzero" for q in range(nacc)] + [f"{n} = {v}" for n, v in extra]
        )
        res = self.fresh("accs")
        upper = self.c(trip) if isinstance(trip, int) else trip
        self.emit(
            f"{res}:{nacc + len(extra)} = scf.for {var} = {self.c(0)} to {upper} step {self.c(1)} "
            f"iter_args({inits}) -> ({types}) {{"
        )
        return res, types

    def source(self, name: str, signature: str, globals_: list[str], comment: str) -> str:
        consts = ["  %fzero = arith.constant 0.0 : f32", "  %fone = arith.constant 1.0 : f32"]
        consts += [f"  %c{v}_ = arith.constant {v} : index" for v in sorted(self.consts)]
        return (
            f"// {comment}\n"
            + "".join(g + "\n" for g in globals_)
            + f"func.func @{name}({signature}) {{\n"
            + "\n".join(consts)
            + "\n"
            + "\n".join(self.lines)
            + "\n  return\n}\n"
        )


# A load source: (memref, its type, index prefix before the row, the row).
Source = tuple[str, str, str, str]


def _body(
    t: _Text,
    *,
    name: str,
    k: int,
    block_m: int,
    b_rows: int,
    block_size: int,
    wm: int,
    wn: int,
    stages: int,
    a_src: Callable[[str], Source],
    b_src: Callable[[str], Source],
    b_pairs: Callable[[str], list[str]],
    r0: str,
    epilogue: Callable[[_Text, list[list[list[str]]], list[str], str, str], None],
    core: str = "mma",
    inflight: int = 0,
    block_k: int = BLOCK_K,
    copies_after_mma: bool = False,
) -> list[str]:
    """The cp.async / ldmatrix / mma.sync main loop and the epilogue call.

    ``a_src(row)``/``b_src(row)``: where block row ``row`` (an index value,
    ``row < BM`` resp. ``< BR``) of ``A``/``B`` comes from (clamped by the
    caller). ``b_pairs(wn)``: the first smem row of each 16-row weight pair
    of warp column ``wn`` (in fragment order). ``epilogue(t, acc[mf][f][4],
    rows, wn, col_lane)`` with ``rows[2*mf + h]`` the output row of half
    ``h`` (unclamped). Returns the workgroup globals.

    ``core="wgmma"`` (sm_90a): the same ring feeds ``wgmma.mma_async`` instead
    of ``ldmatrix`` + ``mma.sync``; the ring's swizzle is wgmma's 64-byte
    swizzle (K-major), so descriptors address the stages directly. Each
    warpgroup computes 64 rows x ``BR`` columns (``BM = 64 * warpgroups``);
    ``wm``/``wn`` are ignored; ``inflight``: see ``_body_wgmma``."""
    if core == "wgmma":
        return _body_wgmma(
            t, name=name, k=k, block_m=block_m, b_rows=b_rows, block_size=block_size,
            stages=stages, a_src=a_src, b_src=b_src, r0=r0, epilogue=epilogue,
            inflight=inflight, block_k=block_k, copies_after_mma=copies_after_mma,
        )  # fmt: skip
    kt_n = k // BLOCK_K
    mf = block_m // (16 * wm)
    globals_, sa, sb, a_t, b_t, tid, issue = _ring(
        t, name, block_m, b_rows, block_size, stages, a_src, b_src, 128
    )
    warp = t.bin("divui", tid, 32)
    lane = t.bin("remui", tid, 32)
    wm_i = t.bin("remui", warp, wm) if wm > 1 else t.c(0)
    wn_i = t.bin("divui", warp, wm) if wm > 1 else warp
    # -- ldmatrix addresses (loop invariant): A rows lane%16, k half lane/16;
    # B rows lane%8 + 8*(lane/16), k half (lane/8)%2; both swizzled by
    # ((row >> 1) & 3) = ((lane >> 1) & 3) since fragment bases are multiples of 8.
    lkey = t.bin("andi", t.bin("divui", lane, 2), 3)
    a_half = t.bin("divui", lane, 16)
    b_half = t.bin("andi", t.bin("divui", lane, 8), 1)
    a_cols, b_cols = [], []
    for ks in range(2):
        a_cols.append(t.mul(t.bin("xori", t.add(a_half, 2 * ks), lkey), 8))
        b_cols.append(t.mul(t.bin("xori", t.add(b_half, 2 * ks), lkey), 8))
    a_lrow = t.add(t.mul(wm_i, 16 * mf), t.bin("remui", lane, 16))
    a_rows = [t.add(a_lrow, 16 * m) for m in range(mf)]
    b_lrow = t.add(t.bin("remui", lane, 8), t.mul(a_half, 8))
    b_rows_l = [t.add(base, b_lrow) for base in b_pairs(wn_i)]
    nf = 2 * len(b_rows_l)

    # -- prologue: the previous call (or task) may still read the buffers.
    # One commit group per k-tile, empty past the end, so that "stage kt has
    # landed" is always "at most STAGES-2 younger groups pending".
    t.emit("gpu.barrier")
    for s in range(stages - 1):
        if s < kt_n:
            issue(s, s)
        t.emit("nvvm.cp.async.commit.group")

    nacc = mf * nf * 4
    res, types = t.acc_loop("%kt", kt_n, nacc)
    outer = t.indent
    t.indent += "  "
    t.emit(f"nvvm.cp.async.wait.group {stages - 2}")
    # All copies of stage kt are visible, and every warp is done with the
    # stage read in iteration kt-1, which is refilled next.
    t.emit("gpu.barrier")
    nxt = t.add("%kt", stages - 1)
    nstage = t.bin("remui", nxt, stages)
    inrange = t.op("inr", f"arith.cmpi ult, {nxt}, {t.c(kt_n)} : index")
    t.emit(f"scf.if {inrange} {{")
    t.indent += "  "
    issue(nxt, nstage)
    t.indent = outer + "  "
    t.emit("}")
    t.emit("nvvm.cp.async.commit.group")
    stage = t.bin("remui", "%kt", stages)
    acc = [
        [[f"%acc_{(m * nf + f) * 4 + q}" for q in range(4)] for f in range(nf)] for m in range(mf)
    ]
    for ks in range(2):
        fa = []
        for m in range(mf):
            v = t.op(
                "fa",
                f"nvgpu.ldmatrix {sa}[{stage}, {a_rows[m]}, {a_cols[ks]}] "
                f"{{numTiles = 4 : i32, transpose = false}} : {a_t} -> {_FRAG}",
            )
            fa.append(_words(t, v))
        fb = []
        for row in b_rows_l:
            v = t.op(
                "fb",
                f"nvgpu.ldmatrix {sb}[{stage}, {row}, {b_cols[ks]}] "
                f"{{numTiles = 4 : i32, transpose = false}} : {b_t} -> {_FRAG}",
            )
            x = _words(t, v)
            fb += [x[0:2], x[2:4]]
        for m in range(mf):
            a = fa[m]
            for f in range(nf):
                acc[m][f] = _mma.mma(t, a, fb[f], acc[m][f])
    flat = [x for m in acc for f in m for x in f]
    t.emit(f"scf.yield {', '.join(flat)} : {types}")
    t.indent = outer
    t.emit("}")
    # No copies may be in flight when the tile returns (they are all
    # redundant refetches by now, but they still write the buffers).
    t.emit("nvvm.cp.async.wait.group 0")
    acc = [
        [[f"{res}#{(m * nf + f) * 4 + q}" for q in range(4)] for f in range(nf)] for m in range(mf)
    ]
    grp = t.bin("divui", lane, 4)
    tig = t.bin("remui", lane, 4)
    rbase = t.add(t.add(r0, t.mul(wm_i, 16 * mf)), grp)
    rows = [t.add(rbase, 16 * m + h) for m in range(mf) for h in (0, 8)]
    epilogue(t, acc, rows, wn_i, t.mul(tig, 2))
    return globals_


def _ring(
    t: _Text,
    name: str,
    block_m: int,
    b_rows: int,
    block_size: int,
    stages: int,
    a_src: Callable[[str], Source],
    b_src: Callable[[str], Source],
    alignment: int,
    block_k: int = BLOCK_K,
):
    """The ``stages``-deep ring of ``A`` and ``B`` k-tiles in workgroup memory
    and ``issue(kt, stage)``, which ``cp.async``-copies k-tile ``kt`` into it.
    A row of a k-tile is ``block_k`` bf16: 64 bytes (4 chunks of 16, chunk
    ``c`` of row ``r`` at ``c ^ ((r >> 1) & 3)``: the 64-byte swizzle) or, for
    ``block_k=64``, 128 bytes (8 chunks, at ``c ^ (r & 7)``: the 128-byte
    swizzle). Returns ``(globals, sa, sb, a_t, b_t, tid, issue)``."""
    chunks = block_k // 8  # 16-byte chunks per row
    a_t = f"memref<{stages}x{block_m}x{block_k}xbf16, #gpu.address_space<workgroup>>"
    b_t = f"memref<{stages}x{b_rows}x{block_k}xbf16, #gpu.address_space<workgroup>>"
    globals_ = [
        f'memref.global "private" @{name}__smem_a : {a_t} {{alignment = {alignment} : i64}}',
        f'memref.global "private" @{name}__smem_b : {b_t} {{alignment = {alignment} : i64}}',
    ]
    sa = t.op("sa", f"memref.get_global @{name}__smem_a : {a_t}")
    sb = t.op("sb", f"memref.get_global @{name}__smem_b : {b_t}")
    tid = t.op("tid", "gpu.thread_id x")
    # -- copies: thread tid moves chunk tid % C of rows tid/C + j*(threads/C).
    quad = t.bin("remui", tid, chunks)
    crow = t.bin("divui", tid, chunks)
    # The swizzle key of every row this thread copies (steps keep it).
    key = t.bin("andi", t.bin("divui", tid, 8), chunks - 1)
    scol = t.mul(t.bin("xori", quad, key), 8)  # swizzled smem column
    gcol = t.mul(quad, 8)  # global column within the k-tile
    step = block_size // chunks
    copies = []  # (smem, smem type, smem row, source)
    for smem, st, rows, src in ((sa, a_t, block_m, a_src), (sb, b_t, b_rows, b_src)):
        for j in range(rows // step):
            r = t.add(crow, j * step)
            copies.append((smem, st, r, src(r)))

    def issue(kt: str | int, stage: str | int) -> None:
        """cp.async k-tile ``kt`` of A and B into ``stage``."""
        if isinstance(kt, int):
            k0 = t.c(kt * block_k)
        else:
            k0 = t.mul(kt, block_k)
        col = t.add(k0, gcol)
        st_i = t.c(stage) if isinstance(stage, int) else stage
        for smem, st, r, (mem, mt, prefix, grow) in copies:
            t.op(
                "cp",
                f"nvgpu.device_async_copy {mem}[{prefix}{grow}, {col}], "
                f"{smem}[{st_i}, {r}, {scol}], 8 {{bypassL1}} : {mt} to {st}",
            )

    return globals_, sa, sb, a_t, b_t, tid, issue


def _asm(t: _Text, text: str, memory: bool = False) -> None:
    """Side-effecting inline PTX without operands (``memory``: see
    :func:`_asm_ops`)."""
    _asm_ops(t, text, [], memory)


def _descriptor(t: _Text, address: str) -> str:
    """A wgmma shared-memory matrix descriptor (i64) for a K-major operand of
    the ring at shared address ``address`` (index): start address >> 4, then
    ``%c_desc_hi`` (see ``_desc_hi``)."""
    a64 = t.op("a64", f"arith.index_cast {address} : index to i64")
    lo = t.op("dlo", f"arith.andi {a64}, %c_desc_mask : i64")
    lo = t.op("dlo", f"arith.shrui {lo}, %c_desc_shift : i64")
    return t.op("desc", f"arith.ori {lo}, %c_desc_hi : i64")


def _desc_hi(block_k: int) -> int:
    """Descriptor bits above the start address, as a signed i64: leading byte
    offset 16 (unused when swizzled), stride byte offset 8 rows (512 B for
    64-byte rows, 1024 B for 128-byte ones), swizzle mode in bits 62-63 (2:
    64 B, 1: 128 B)."""
    row = block_k * 2
    mode = {64: 2, 128: 1}[row]
    bits = (1 << 16) | ((8 * row >> 4) << 32) | (mode << 62)
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def _wgmma(t: _Text, acc: list[str], desc_a: str, desc_b: str, n: int) -> list[str]:
    """``wgmma.mma_async`` m64nNk16 bf16 -> f32, accumulating into ``acc``
    (``n / 2`` f32 per thread, tied in and out)."""
    count = len(acc)
    regs = ", ".join(f"${i}" for i in range(count))
    text = (
        f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{regs}}}, "
        f"${2 * count}, ${2 * count + 1}, p, 1, 1, 0, 0;"
    )
    text = f"{{ .reg .pred p; setp.ne.b32 p, ${2 * count + 2}, 0; {text} }}"
    constraints = ",".join(["=f"] * count + [str(i) for i in range(count)] + ["l", "l", "r"])
    types = ", ".join(["f32"] * count)
    res = t.op(
        "wg",
        f'llvm.inline_asm has_side_effects asm_dialect = att "{text}", "{constraints}" '
        f"{', '.join(acc)}, {desc_a}, {desc_b}, %c_one_i32 : ({types}, i64, i64, i32) "
        f"-> !llvm.struct<({types})>",
    )
    return _unpack(t, res, count, types)


def _unpack(t: _Text, struct: str, count: int, types: str) -> list[str]:
    """The ``count`` f32 fields of an inline-asm result struct."""
    return [
        t.op("d", f"llvm.extractvalue {struct}[{i}] : !llvm.struct<({types})>")
        for i in range(count)
    ]


def _wgmma_wait(t: _Text, acc: list[str], pending: int = 0, commit: bool = True) -> list[str]:
    """``wgmma.commit_group`` + ``wait_group pending``, with the accumulators
    tied through it so that nothing reads them before the wait."""
    count = len(acc)
    types = ", ".join(["f32"] * count)
    constraints = ",".join(["=f"] * count + [str(i) for i in range(count)])
    res = t.op(
        "ww",
        "llvm.inline_asm has_side_effects asm_dialect = att "
        f'"{"wgmma.commit_group.sync.aligned; " if commit else ""}'
        f'wgmma.wait_group.sync.aligned {pending};", '
        f'"{constraints}" {", ".join(acc)} : ({types}) -> !llvm.struct<({types})>',
    )
    return _unpack(t, res, count, types)


def _body_wgmma(
    t: _Text,
    *,
    name: str,
    k: int,
    block_m: int,
    b_rows: int,
    block_size: int,
    stages: int,
    a_src: Callable[[str], Source],
    b_src: Callable[[str], Source],
    r0: str,
    epilogue: Callable[[_Text, list[list[list[str]]], list[str], str, str], None],
    inflight: int = 0,
    block_k: int = BLOCK_K,
    copies_after_mma: bool = False,
) -> list[str]:
    """The ring feeding ``wgmma`` (see ``_body``); k-tiles of ``block_k`` (32
    or 64) values. ``copies_after_mma`` issues the next k-tile's copies after
    this one's wgmma instead of before (they overlap the tensor cores). ``inflight=1`` leaves one
    k-tile's wgmma running while the next is issued: the ring then prefetches
    one stage less (``stages - 2`` ahead), so a stage is refilled only once
    the wgmma that read it has completed."""
    if inflight not in (0, 1) or stages < 2 + inflight:
        raise GraphError(f"tile '{name}': inflight={inflight} needs stages >= {2 + inflight}")
    ahead = stages - 1 - inflight  # k-tiles in flight in the ring
    groups = block_size // 128
    if block_size % 128 or block_m != 64 * groups:
        raise GraphError(
            f"tile '{name}': wgmma needs warpgroups of 128 threads, each 64 rows: "
            f"block_m={block_m} with block_size={block_size}"
        )
    if b_rows % 8 or not 8 <= b_rows <= 256:
        raise GraphError(f"tile '{name}': wgmma needs block_n in 8..256, a multiple of 8")
    if block_k not in (32, 64) or k % block_k:
        raise GraphError(f"tile '{name}': block_k={block_k} must be 32 or 64 and divide k={k}")
    kt_n = k // block_k
    # Swizzle atoms (8 rows) must start aligned.
    globals_, sa, sb, a_t, b_t, tid, issue = _ring(
        t, name, block_m, b_rows, block_size, stages, a_src, b_src, 1024, block_k
    )
    for line in (
        "%c_desc_mask = arith.constant 262143 : i64",
        "%c_desc_shift = arith.constant 4 : i64",
        # LBO 1 (16 B), SBO 32 (512 B), 64-byte swizzle (2 << 62).
        f"%c_desc_hi = arith.constant {_desc_hi(block_k)} : i64",
        "%c_one_i32 = arith.constant 1 : i32",
    ):
        t.emit(line)
    group = t.bin("divui", tid, 128)
    warp = t.bin("remui", t.bin("divui", tid, 32), 4)
    lane = t.bin("remui", tid, 32)
    base_a = t.op("ba", f"memref.extract_aligned_pointer_as_index {sa} : {a_t} -> index")
    base_b = t.op("bb", f"memref.extract_aligned_pointer_as_index {sb} : {b_t} -> index")
    base_a = t.add(base_a, t.mul(group, 64 * block_k * 2))
    t.emit("gpu.barrier")
    for s in range(ahead):
        if s < kt_n:
            issue(s, s)
        t.emit("nvvm.cp.async.commit.group")
    nacc = b_rows // 2
    res, types = t.acc_loop("%kt", kt_n, nacc)
    outer = t.indent
    t.indent += "  "
    t.emit(f"nvvm.cp.async.wait.group {ahead - 1}")
    # cp.async writes through the generic proxy; wgmma reads through the async one.
    _asm(t, "fence.proxy.async.shared::cta;")
    t.emit("gpu.barrier")
    nxt = t.add("%kt", ahead)
    nstage = t.bin("remui", nxt, stages)
    inrange = t.op("inr", f"arith.cmpi ult, {nxt}, {t.c(kt_n)} : index")

    def refill() -> None:
        """cp.async k-tile ``kt + ahead`` into the stage freed last iteration."""
        t.emit(f"scf.if {inrange} {{")
        t.indent += "  "
        issue(nxt, nstage)
        t.indent = outer + "  "
        t.emit("}")
        t.emit("nvvm.cp.async.commit.group")

    if not copies_after_mma:
        refill()
    stage = t.bin("remui", "%kt", stages)
    a_stage = t.add(base_a, t.op("x", f"arith.muli {stage}, {t.c(block_m * block_k * 2)} : index"))
    b_stage = t.add(base_b, t.op("x", f"arith.muli {stage}, {t.c(b_rows * block_k * 2)} : index"))
    _asm(t, "wgmma.fence.sync.aligned;")
    acc = [f"%acc_{q}" for q in range(nacc)]
    for ks in range(block_k // 16):
        da = _descriptor(t, t.add(a_stage, 32 * ks))
        db = _descriptor(t, t.add(b_stage, 32 * ks))
        acc = _wgmma(t, acc, da, db, b_rows)
    if copies_after_mma:  # issued while the tensor cores work
        refill()
    acc = _wgmma_wait(t, acc, pending=inflight)
    t.emit(f"scf.yield {', '.join(acc)} : {types}")
    t.indent = outer
    t.emit("}")
    t.emit("nvvm.cp.async.wait.group 0")
    final = [f"{res}#{q}" for q in range(nacc)]
    if inflight:  # the last k-tile's wgmma
        final = _wgmma_wait(t, final, commit=False)
    _wgmma_epilogue(t, final, b_rows, epilogue, _wgmma_place(t, group, warp, lane, r0, False))
    return globals_


def _wgmma_epilogue(t: _Text, final, b_rows: int, epilogue, place: tuple) -> None:
    """Hand a warpgroup's ``m64nN`` accumulators to ``epilogue`` in the
    ``mma.sync`` fragment layout: d[4f + q] is row lane/4 (q < 2) or lane/4 + 8
    of the warp's 16, column 8f + 2 * (lane % 4) + q % 2, with ``place``'s
    rows, ``wn_i`` and column lane (:func:`_wgmma_place`)."""
    acc_f = [[[final[4 * f + q] for q in range(4)] for f in range(b_rows // 8)]]
    epilogue(t, acc_f, *place)


def _wgmma_place(t: _Text, group, warp, lane, r0: str, split_n: bool) -> tuple:
    """The epilogue's ``(rows, wn_i, col_lane)`` for this thread: its
    fragments' two rows (``lane / 4`` and 8 more), its warpgroup's column
    slice (``split_n``: the warpgroup; else 0, the warpgroups owning 64-row
    slices) and its first column in a fragment."""
    grp = t.bin("divui", lane, 4)
    if split_n:
        rbase = t.add(t.add(r0, t.mul(warp, 16)), grp)
    else:
        rbase = t.add(t.add(t.add(r0, t.mul(group, 64)), t.mul(warp, 16)), grp)
    tig = t.bin("remui", lane, 4)
    return [rbase, t.add(rbase, 8)], group if split_n else t.c(0), t.mul(tig, 2)


# One TMA load: (the map's address as i64, first row (index), rows).
TmaLoad = tuple[str, str, int]
TMA_BLOCK_K = 64  # 128-byte rows: the TMA box's and wgmma's 128-byte swizzle
#: How thread 0 refills a TMA ring stage (``_body_tma``'s ``refill``).
REFILLS = ("wait", "test")


class ChunkedMap(str):
    """The address of a map whose tensor is in ``chunk_weights``' layout with
    chunks of ``TMA_BLOCK_K`` (``Graph.tensor_map(chunk=64)``): its boxes
    are copied as 4-D ``(0, 0, k / 64, row / 8)`` (the first row a multiple
    of 8), landing in shared memory as the row layout's 2-D boxes do."""


def _box_coords(t: _Text, tmap: str, col: str, row0: str) -> list[str]:
    """The i32 coordinates of the box at ``(col, row0)`` of map ``tmap``."""
    if not isinstance(tmap, ChunkedMap):
        return [col, _i32(t, row0)]
    zero = _i32(t, t.c(0))
    chunk = t.op("ck", f"arith.divui {col}, {_i32(t, t.c(TMA_BLOCK_K))} : i32")
    return [zero, zero, chunk, _i32(t, t.bin("divui", row0, 8))]


def _coords_text(first: int, n: int) -> str:
    """``{$first, ..}`` of ``n`` operands (a box's coordinates)."""
    return "{" + ", ".join(f"${first + q}" for q in range(n)) + "}"


def tma_smem_bytes(block_m: int, b_rows: int, stages: int) -> int:
    """Workgroup bytes of a TMA tile: the ring plus two mbarriers per stage."""
    return stages * (block_m + b_rows) * TMA_BLOCK_K * 2 + 16 * stages


def _asm_ops(t: _Text, text: str, operands: list[tuple[str, str]], memory: bool = False) -> None:
    """Side-effecting inline PTX on ``operands`` (:func:`etc.tiles._text.asm_line`;
    ``memory``: an arrive that releases the reads before it)."""
    t.emit(_text.asm_line(text, operands, memory))


def mbarrier_inval(t: _Text, bars: Iterable[str]) -> None:
    """Invalidate the mbarriers at shared addresses ``bars`` (i32, taken one
    at a time): PTX lets their words serve anything else, such as another
    tile's ring, only after this (without it, projections with different
    stage counts once gave wrong results)."""
    for bar in bars:
        _asm_ops(t, "mbarrier.inval.shared::cta.b64 [$0];", [(bar, "i32")])


def _i32(t: _Text, v: str) -> str:
    return t.op("w", f"arith.index_cast {v} : index to i32")


MBAR_POLLS = _text.MBAR_POLLS


def _mbar_wait(t: _Text, bar: str, parity: str) -> None:
    """Wait until the mbarrier at shared address ``bar`` (i32) completes the
    phase of ``parity`` (i32), or trap after ``MBAR_POLLS`` polls."""
    _asm_ops(t, _text.MBAR_WAIT, [(bar, "i32"), (parity, "i32")])


def _try_refill(t: _Text, nx: str, kt_n: int, stages: int, bar, issue, cur: str = "%kt") -> str:
    """Thread 0 at the end of k-tile ``cur`` (``refill="test"``): loads
    k-tile ``nx`` (of ``kt_n``) if its stage is free (every warp has released
    the k-tile ``nx - stages`` that held it: a test of the empty barrier, or a
    wait when k-tile ``cur + 1``'s own load is the one missing); returns the
    next k-tile to load."""
    # The stage's last k-tile was released in this k-tile's step at the latest.
    due = t.op("due", f"arith.cmpi ule, {nx}, {t.add(cur, stages - 1)} : index")
    left = t.op("left", f"arith.cmpi ult, {nx}, {t.c(kt_n)} : index")
    can = t.op("can", f"arith.andi {due}, {left} : i1")
    out = t.fresh("nx")
    t.emit(f"{out} = scf.if {can} -> (index) {{")
    indent = t.indent
    t.indent += "  "
    stage = t.bin("remui", nx, stages)
    parity = _i32(
        t,
        t.bin(
            "remui", t.bin("divui", t.op("o", f"arith.subi {nx}, {t.c(stages)} : index"), stages), 2
        ),
    )
    urgent = t.op("urg", f"arith.cmpi ule, {nx}, {t.add(cur, 1)} : index")
    free = t.fresh("free")
    t.emit(f"{free} = scf.if {urgent} -> (i1) {{")
    t.indent += "  "
    _mbar_wait(t, bar(1, stage), parity)
    t.emit(f"scf.yield {t.op('tr', 'arith.constant true')} : i1")
    t.indent = indent + "  "
    t.emit("} else {")
    t.indent += "  "
    done = t.op(
        "tw",
        'llvm.inline_asm has_side_effects asm_dialect = att "{ .reg .pred p; '
        'mbarrier.test_wait.parity.shared::cta.b64 p, [$1], $2; selp.b32 $0, 1, 0, p; }", '
        f'"=r,r,r" {bar(1, stage)}, {parity} : (i32, i32) -> i32',
    )
    ok = t.op("ok", f"arith.cmpi ne, {done}, {_i32(t, t.c(0))} : i32")
    t.emit(f"scf.yield {ok} : i1")
    t.indent = indent + "  "
    t.emit("}")
    t.emit(f"scf.if {free} {{")
    t.indent += "  "
    issue(nx, stage)
    t.indent = indent + "  "
    t.emit("}")
    after = t.op("nx", f"arith.select {free}, {t.add(nx, 1)}, {nx} : index")
    t.emit(f"scf.yield {after} : index")
    t.indent = indent
    t.emit("} else {")
    t.emit(f"  scf.yield {nx} : index")
    t.emit("}")
    return out


@dataclass
class _TmaRing:
    """One TMA tile's ring in the function being emitted: its globals, the
    stages' bases and sizes, and its barrier addresses and loads."""

    globals_: list[str]
    base_a: str
    base_b: str
    a_bytes: int
    b_bytes: int
    is0: str
    bar: Callable[[int, str | int], str]
    issue: Callable[..., None]
    #: The body's thread coordinates (``body=True``): thread, warpgroup, warp
    #: in it, lane, lane 0.
    lanes: tuple[str, str, str, str, str] | None = None


def ring_stage_type(stages: int, rows: int) -> str:
    """The type of a TMA ring's ``A`` or ``B`` stages (:func:`_tma_ring`'s
    ``@<tile>__smem_a`` and ``@<tile>__smem_b``): ``stages`` boxes of
    ``rows`` x 64 bf16 in shared memory."""
    return f"memref<{stages}x{rows}x{TMA_BLOCK_K}xbf16, #gpu.address_space<workgroup>>"


def ring_b_base(t: _Text, name: str, stages: int, b_rows: int) -> str:
    """The shared address (an index) of tile ``name``'s ring ``B`` stages."""
    b_t = ring_stage_type(stages, b_rows)
    ring = t.op("sb", f"memref.get_global @{name}__smem_b : {b_t}")
    return t.op("b", f"memref.extract_aligned_pointer_as_index {ring} : {b_t} -> index")


def _tma_ring(
    t: _Text, name: str, block_m: int, b_rows: int, stages: int, a_loads: list[TmaLoad],
    b_loads: list[TmaLoad], k_offset: str | None, body: bool = False,
    rotate: tuple[str, int] | None = None, a_tx: bool = True, b_evict_first: bool = False,
) -> _TmaRing:  # fmt: skip
    """The ring of :func:`_body_tma` (and of its prefetch, :func:`tma_prefetch_ring`):
    ``stages`` stages of ``a_loads`` and ``b_loads`` boxes, a full and an
    empty mbarrier each. ``issue(kt, stage, which="ab", expect=True)``: thread
    0 loads k-tile ``kt``'s boxes of ``which`` into ``stage``, first expecting
    the whole stage's bytes on its full barrier when ``expect``. ``rotate =
    (r, k_tiles)``: loop step ``kt`` loads k-tile ``(kt + r) mod k_tiles``.
    ``a_tx=False``: the ``A`` stage does not come through TMA (a gather's
    copies arrive on the full barrier themselves), so it is not expected.
    ``b_evict_first``: the ``B`` boxes (weights, read once) carry an L2
    evict-first policy (``.L2::cache_hint``)."""
    bk = TMA_BLOCK_K
    a_t, b_t = ring_stage_type(stages, block_m), ring_stage_type(stages, b_rows)
    bar_t = f"memref<{2 * stages}xi64, #gpu.address_space<workgroup>>"
    globals_ = [
        f'memref.global "private" @{name}__smem_a : {a_t} {{alignment = 1024 : i64}}',
        f'memref.global "private" @{name}__smem_b : {b_t} {{alignment = 1024 : i64}}',
        f'memref.global "private" @{name}__mbar : {bar_t} {{alignment = 8 : i64}}',
    ]
    bases = []
    for key, glob, ty in (("sa", "smem_a", a_t), ("sb", "smem_b", b_t), ("sbar", "mbar", bar_t)):
        ref = t.op(key, f"memref.get_global @{name}__{glob} : {ty}")
        bases.append(t.op("b", f"memref.extract_aligned_pointer_as_index {ref} : {ty} -> index"))
    base_a, base_b, base_bar = bases
    if body:  # the wgmma descriptors' constants
        for line in (
            "%c_desc_mask = arith.constant 262143 : i64",
            "%c_desc_shift = arith.constant 4 : i64",
            f"%c_desc_hi = arith.constant {_desc_hi(bk)} : i64",
            "%c_one_i32 = arith.constant 1 : i32",
        ):
            t.emit(line)
    tid = t.op("tid", "gpu.thread_id x")
    lanes = None
    if body:
        group = t.bin("divui", tid, 128)
        warp = t.bin("remui", t.bin("divui", tid, 32), 4)
        lane = t.bin("remui", tid, 32)
    is0 = t.op("is0", f"arith.cmpi eq, {tid}, {t.c(0)} : index")
    if body:
        lane0 = t.op("lane0", f"arith.cmpi eq, {lane}, {t.c(0)} : index")
        lanes = (tid, group, warp, lane, lane0)
    a_bytes, b_bytes = block_m * bk * 2, b_rows * bk * 2
    tx = t.op("tx", f"arith.constant {(a_bytes if a_tx else 0) + b_bytes} : i32")
    if any(len(load) > 3 for load in a_loads + b_loads):  # count the boxes loaded
        zero = t.op("tx", "arith.constant 0 : i32")
        tx = zero
        for _, _, rows, *cond in a_loads + b_loads:
            size = t.op("txr", f"arith.constant {rows * bk * 2} : i32")
            if cond:
                size = t.op("txr", f"arith.select {cond[0]}, {size}, {zero} : i32")
            tx = t.op("tx", f"arith.addi {tx}, {size} : i32")

    def bar(kind: int, stage: str | int) -> str:
        """The shared address (i32) of stage's full (0) or empty (1) mbarrier."""
        at = (
            t.add(base_bar, 8 * (kind * stages + stage))
            if isinstance(stage, int)
            else t.add(base_bar, t.mul(t.add(stage, kind * stages), 8))
        )
        return _i32(t, at)

    def issue(
        kt: str | int, stage: str | int, which: str = "ab", expect: bool = True,
        b_shift: str | None = None,
    ) -> None:  # fmt: skip
        """Thread 0: TMA k-tile ``kt`` into ``stage`` (the ``B`` boxes
        ``b_shift`` rows further on, an index value, when given)."""
        full = bar(0, stage)
        if expect:
            _asm_ops(
                t,
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
                [(full, "i32"), (tx, "i32")],
            )
        col = _k_column(t, kt, k_offset, rotate)
        for part, base, per_stage, loads in (
            ("a", base_a, a_bytes, a_loads), ("b", base_b, b_bytes, b_loads)
        ):  # fmt: skip
            if part not in which:
                continue
            policy = None
            if part == "b" and b_evict_first:
                policy = t.op("pol", _text.l2_policy("evict_first"))
            st = t.mul(stage, per_stage) if isinstance(stage, str) else t.c(stage * per_stage)
            off = 0
            for tmap, row0, rows, *cond in loads:
                if part == "b" and b_shift is not None:
                    row0 = t.add(row0, b_shift)
                dst = _i32(t, t.add(t.add(base, st), off * bk * 2))
                if cond:
                    t.emit(f"scf.if {cond[0]} {{")
                    t.indent += "  "
                coords = _box_coords(t, tmap, col, row0)
                n = len(coords)
                hint, hint_op, hint_arg = _text.cache_hint(policy, 3 + n)
                _asm_ops(
                    t,
                    f"cp.async.bulk.tensor.{n}d.shared::cluster.global.tile.mbarrier::complete_tx"
                    f"::bytes{hint} [$0], [$1, {_coords_text(2, n)}], [${2 + n}]{hint_op};",
                    [(dst, "i32"), (tmap, "i64"), *((c, "i32") for c in coords), (full, "i32")]
                    + hint_arg,
                )
                if cond:
                    t.end()
                off += rows

    return _TmaRing(globals_, base_a, base_b, a_bytes, b_bytes, is0, bar, issue, lanes)


def _k_column(t: _Text, kt: str | int, k_offset: str | None, rotate: tuple[str, int] | None) -> str:
    """The k coordinate (i32) of a TMA box of loop step ``kt``: k-tile ``kt``,
    or ``(kt + r) mod k_tiles`` with ``rotate = (r, k_tiles)``, past ``k_offset``."""
    if rotate is not None:
        kt = t.bin("remui", t.add(rotate[0], kt), rotate[1])
    col = t.c(kt * TMA_BLOCK_K) if isinstance(kt, int) else t.mul(kt, TMA_BLOCK_K)
    return _i32(t, col if k_offset is None else t.add(col, k_offset))


def _init_ring_barriers(
    t: _Text, ring: _TmaRing, stages: int, warps: int | str, full_arrivals: int = 1
) -> None:
    """Thread 0 (inside its ``scf.if``): one full (``full_arrivals``: thread
    0's, plus one per thread of a gather) and one empty (an arrival per warp
    that runs the k loop; ``warps`` may be an i32 value) mbarrier per stage."""
    for s in range(stages):
        _asm_ops(
            t, f"mbarrier.init.shared::cta.b64 [$0], {full_arrivals};", [(ring.bar(0, s), "i32")]
        )
        if isinstance(warps, int):
            _asm_ops(t, f"mbarrier.init.shared::cta.b64 [$0], {warps};", [(ring.bar(1, s), "i32")])
        else:
            _asm_ops(
                t,
                "mbarrier.init.shared::cta.b64 [$0], $1;",
                [(ring.bar(1, s), "i32"), (warps, "i32")],
            )
    _asm(t, "fence.mbarrier_init.release.cluster;")


def tma_prefetch_ring(
    t: _Text, *, name: str, k: int, block_m: int, b_rows: int, block_size: int, stages: int,
    a_loads: list[TmaLoad], b_loads: list[TmaLoad], k_offset: str | None = None,
    rotate: str | None = None, b_evict_first: bool = False,
) -> None:  # fmt: skip
    """The prefetch half of ``_body_tma(weights_prefetched=True)``, for a
    prefetch function (before the instance's waits): thread 0 initialises
    the ring's barriers, expects each of the first stages' whole bytes and
    loads their ``b_loads`` (weights: no task writes them). ``a_loads`` only
    count the expected bytes (their conditions); the body loads them.
    ``rotate``: the body's (the same k-tiles first)."""
    kt_n = k // TMA_BLOCK_K
    ring = _tma_ring(
        t, name, block_m, b_rows, stages, a_loads, b_loads, k_offset,
        rotate=None if rotate is None else (rotate, kt_n), b_evict_first=b_evict_first,
    )  # fmt: skip
    # The previous tile used this memory through the generic proxy, and its
    # barriers were invalidated before the instance's closing barrier.
    _asm(t, "fence.proxy.async.shared::cta;")
    t.emit("gpu.barrier")
    t.emit(f"scf.if {ring.is0} {{")
    t.indent += "  "
    _init_ring_barriers(t, ring, stages, block_size // 32)
    for s in range(min(stages, kt_n)):
        ring.issue(s, s, which="b")
    t.end()
    t.emit("gpu.barrier")


@dataclass(frozen=True)
class TmaGather:
    """A TMA tile's ``A`` operand gathered row by row instead of one TMA box:
    ``row(t, r)`` gives block row ``r``'s source row (an index into the
    buffer at ``base``, an i64 address, ``row_bytes`` apart) and whether the
    row exists (``i1``; a missing row is zero-filled and read from nowhere)."""

    base: str
    row_bytes: int
    row: Callable[[_Text, str], tuple[str, str]]
    #: The source's tensor map (i64 address; boxes of one row of ``TMA_BLOCK_K``
    #: values): each row comes by its own TMA copy instead of ``cp.async``
    #: (:func:`_gather_rows_tma`).
    tma_map: str | None = None


#: 16-byte chunks a thread of a gathering TMA tile copies per k-tile: a warp
#: takes its 16 accumulator rows of 8 chunks (128 bytes of ``k``).
_GATHER_CHUNKS = 4


def _a_stage(t: _Text, ring: _TmaRing, stage: str | int) -> str:
    """The shared address (index) of ``ring``'s ``A`` stage ``stage``."""
    per_stage = ring.a_bytes
    return t.add(
        ring.base_a, t.mul(stage, per_stage) if isinstance(stage, str) else stage * per_stage
    )


def _gather_setup(
    t: _Text, gather: TmaGather, ring: _TmaRing, tid: str, k_offset: str | None,
    rotate: tuple[str, int] | None,
) -> Callable[[str | int, str | int], None]:  # fmt: skip
    """Each thread's part of a gathered ``A`` stage, computed once: warp
    ``w`` copies block rows ``[16w, 16w + 16)`` (the rows its warpgroup's
    wgmma gives it accumulators for, so it may refill them once its own
    wgmma is done), lane ``l`` chunk ``l % 8`` of rows ``16w + l // 8 + 4u``
    (``u < 4``), into the 128-byte swizzle the TMA boxes use (chunk ``c`` of
    row ``r`` at ``c ^ (r % 8)``). Returns ``issue(kt, stage)``: the
    thread's ``cp.async`` copies of k-tile ``kt`` into ``ring``'s ``A``
    stage ``stage``, then an arrival on its full barrier when they land."""
    warp = t.bin("divui", tid, 32)
    lane = t.bin("remui", tid, 32)
    quad = t.bin("divui", lane, 8)
    chunk = t.bin("remui", lane, 8)
    chunk_bytes = t.op("g", f"arith.index_cast {t.mul(chunk, 16)} : index to i64")
    base = t.op("g", f"arith.addi {gather.base}, {chunk_bytes} : i64")
    row_bytes = t.op("g", f"arith.constant {gather.row_bytes} : i64")
    zero, full = t.op("g", "arith.constant 0 : i32"), t.op("g", "arith.constant 16 : i32")
    parts = []  # (source address, destination offset, bytes) per chunk
    for u in range(_GATHER_CHUNKS):
        row = t.add(t.add(t.mul(warp, 16), quad), 4 * u)
        src_row, ok = gather.row(t, row)
        src_row = t.op("g", f"arith.index_cast {src_row} : index to i64")
        src = t.op("g", f"arith.muli {src_row}, {row_bytes} : i64")
        src = t.op("g", f"arith.addi {base}, {src} : i64")
        swizzled = t.op("g", f"arith.xori {chunk}, {t.bin('remui', t.add(quad, 4 * u), 8)} : index")
        dst = t.add(t.mul(row, 128), t.mul(swizzled, 16))
        parts.append((src, dst, t.op("g", f"arith.select {ok}, {full}, {zero} : i32")))

    def issue(kt: str | int, stage: str | int) -> None:
        col = _k_column(t, kt, k_offset, rotate)  # i32, in elements
        col = t.op("g", f"arith.extui {col} : i32 to i64")
        col = t.op("g", f"arith.addi {col}, {col} : i64")  # bytes
        at = _a_stage(t, ring, stage)
        for src, dst, size in parts:
            _asm_ops(
                t,
                "cp.async.cg.shared.global [$0], [$1], 16, $2;",
                [
                    (_i32(t, t.add(at, dst)), "i32"),
                    (t.op("g", f"arith.addi {src}, {col} : i64"), "i64"),
                    (size, "i32"),
                ],
            )
        _asm_ops(
            t, "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [$0];", [(ring.bar(0, stage), "i32")]
        )

    return issue


def _gather_rows_tma(
    t: _Text, gather: TmaGather, ring: _TmaRing, tid: str, k_offset: str | None,
    rotate: tuple[str, int] | None,
) -> Callable[[str | int, str | int], None]:  # fmt: skip
    """:func:`_gather_setup` by TMA: lane ``l < 16`` of warp ``w`` owns block
    row ``16w + l`` and copies its ``TMA_BLOCK_K`` values of each k-tile
    with one one-row box of ``gather.tma_map``. The 128-byte swizzle follows
    the shared address (the stage is 1024-byte aligned), so a row box lands
    where that row of a whole-block box would. Lane 0 arrives on the
    stage's full barrier expecting the bytes of the warp's rows that exist
    (one arrival per warp); missing rows are not copied."""
    warp = t.bin("divui", tid, 32)
    lane = t.bin("remui", tid, 32)
    low = t.op("low", f"arith.cmpi ult, {lane}, {t.c(16)} : index")
    row = t.add(t.mul(warp, 16), t.bin("remui", lane, 16))
    src_row, ok = gather.row(t, row)
    mine = t.op("mine", f"arith.andi {low}, {ok} : i1")
    lane0 = t.op("lane0", f"arith.cmpi eq, {lane}, {t.c(0)} : index")
    flag = t.op("g", f"arith.extui {mine} : i1 to i32")
    ballot = t.fresh("ballot")
    t.emit(
        f'{ballot} = llvm.inline_asm has_side_effects asm_dialect = att "{{ .reg .pred p; '
        f'setp.ne.u32 p, $1, 0; vote.sync.ballot.b32 $0, p, 0xffffffff; }}", "=r,r" {flag} '
        ": (i32) -> i32"
    )
    count = t.op("g", f"llvm.intr.ctpop({ballot}) : (i32) -> i32")
    row_bytes = TMA_BLOCK_K * 2  # one row of a k-tile
    tx = t.op("g", f"arith.muli {count}, {t.op('g', f'arith.constant {row_bytes} : i32')} : i32")
    src = _i32(t, src_row)
    dst_row = t.mul(row, row_bytes)

    def issue(kt: str | int, stage: str | int) -> None:
        full = ring.bar(0, stage)
        t.emit(f"scf.if {lane0} {{")
        t.indent += "  "
        _asm_ops(
            t,
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
            [(full, "i32"), (tx, "i32")],
        )
        t.end()
        col = _k_column(t, kt, k_offset, rotate)
        at = _a_stage(t, ring, stage)
        t.emit(f"scf.if {mine} {{")
        t.indent += "  "
        _asm_ops(
            t,
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            " [$0], [$1, {$2, $3}], [$4];",
            [(_i32(t, t.add(at, dst_row)), "i32"), (gather.tma_map, "i64"), (col, "i32"),
             (src, "i32"), (full, "i32")],
        )  # fmt: skip
        t.end()

    return issue


def warp_uniform(t: _Text, flag: str) -> str:
    """``flag`` (i1) as lane 0 of the warp holds it. A branch on it is then
    warp-uniform to ptxas (CUTLASS broadcasts its warpgroup index the same
    way): a wgmma under a branch ptxas cannot prove uniform makes it
    serialise every wgmma of the kernel."""
    wide = t.op("u", f"arith.extui {flag} : i1 to i32")
    lane_0 = t.op("u", "arith.constant 0 : i32")
    width = t.op("u", "arith.constant 32 : i32")
    shuffled = t.fresh("u")
    t.emit(f"{shuffled}:2 = gpu.shuffle idx {wide}, {lane_0}, {width} : i32")
    return t.op("u", f"arith.trunci {shuffled}#0 : i32 to i1")


def _body_tma(
    t: _Text,
    *,
    name: str,
    k: int,
    block_m: int,
    b_rows: int,
    block_size: int,
    stages: int,
    a_loads: list[TmaLoad],
    b_loads: list[TmaLoad],
    r0: str,
    epilogue: Callable[[_Text, list[list[list[str]]], list[str], str, str], None],
    stage_output: bool = True,
    split_n: bool = False,
    k_offset: str | None = None,
    weights_prefetched: bool = False,
    rotate: str | None = None,
    gather: TmaGather | None = None,
    second_busy: str | None = None,
    refill: str = "wait",
    passes: int = 1,
    b_step: int = 0,
    pass_var: str = "%pass",
    stage_cols: int | None = None,
    stage_split: int = 1,
    b_evict_first: bool = False,
) -> list[str]:
    """The TMA + mbarrier pipeline feeding ``wgmma`` (sm_90a).

    Thread 0 is the producer: it loads k-tile ``kt`` (64 values of ``k``) of
    every ``a_loads``/``b_loads`` box into stage ``kt % stages`` with
    ``cp.async.bulk.tensor`` (the TMA unit swizzles by 128 bytes, which is the
    layout the wgmma descriptors address), counting bytes on the stage's
    *full* mbarrier. Every warp waits on *full*, its warpgroup issues the
    k-tile's wgmma and leaves it running (``wait_group 1``), so the previous
    k-tile's wgmma is done: each warp then arrives on that stage's *empty*
    mbarrier, and thread 0 refills it once all warps have. No CTA barrier in
    the loop; the tensor cores always have the next k-tile queued.

    ``stage_output``: the epilogue's bf16 block goes through the (by then
    idle) ``A`` ring and leaves in coalesced 16-byte row stores (see
    ``_staged_store``) instead of 4-byte stores from the accumulators.

    ``split_n``: the warpgroups share one 64-row ``A`` block and each takes
    its own ``b_rows / warpgroups`` rows of ``B`` (a 64-row tile: half the
    rows of an expert's ragged last block wasted on average, not a whole
    128-row block's worth); the epilogue gets the warpgroup as ``wn_i``.
    ``k_offset`` (an index value): the first column of ``k`` the loads read
    (a split-K part of a longer reduction).

    A load may carry a fourth element, an ``i1`` value: the box is loaded
    only where it holds (rows past a batch's end are skipped, not
    zero-filled), and the stage's expected bytes count only the boxes
    loaded. The ring rows of a skipped box keep stale values, so their
    accumulator rows are garbage that the epilogue must not store.

    ``weights_prefetched``: the tile's prefetch function (:func:`tma_prefetch_ring`,
    before the instance's waits) initialised the barriers, expected the first
    stages' bytes and loaded their ``b_loads``; the body loads only their
    ``a_loads``.

    ``rotate`` (an index value, e.g. the tile's column block ``j``): the
    loop starts at k-tile ``rotate mod (k / 64)`` and wraps around, so the
    tiles of a stage do not all read the same activation boxes at once (the
    sum's order changes with ``rotate``, deterministically).

    ``gather`` (no ``a_loads``): every thread copies its part of each ``A``
    stage with ``cp.async`` (:func:`_gather_setup`: rows of a table, e.g. a
    MoE expert's tokens, with no permuted copy in memory) and arrives on the
    stage's full barrier when its copies land (``.noinc``: the barrier counts
    one arrival per thread besides thread 0's); a warp refills its own rows
    once its warpgroup's wgmma has read them, and the warps fence the
    generic proxy's writes before their wgmma reads them.

    ``second_busy`` (an ``i1`` value; two warpgroups of their own rows, no
    ``split_n``, no gather): whether the second warpgroup runs the k loop.
    When not, its loop takes no k-tile (its accumulators stay zero: rows
    the epilogue must not store) and the empty barriers wait for the first
    warpgroup's warps alone: half the tensor-core work. The loop's bound is
    broadcast from lane 0 (:func:`warp_uniform`).

    ``refill``: how thread 0 refills a stage once every warp has released
    it. ``"wait"``: right after its own warp's release of k-tile ``kt - 1``,
    it waits for the others' and loads k-tile ``kt - 1 + stages`` there,
    its warp (and so its warpgroup's next wgmma) held meanwhile. ``"test"``:
    it only tests the stage's empty barrier (``mbarrier.test_wait``), loads
    if it is free and otherwise tries again next k-tile (two tries a k-tile,
    the next k-tile to load carried by the loop); it waits only when the
    next k-tile's own load would otherwise not have been issued.

    ``passes``: the k loop and the epilogue run ``passes`` times (an
    ``scf.for`` over ``pass_var``), each pass's ``B`` boxes ``b_step`` rows
    further on (the next columns of a wider block; ``A`` the same), through
    one ring: its k-tiles are counted over all passes, so the next pass's
    first loads go out during this pass's last k-tiles and its epilogue, as
    a persistent GEMM's producer runs ahead into its next tile (refilled
    when free: ``refill="test"``). The
    epilogue (which computes its columns from ``pass_var``) then stages
    its block of ``stage_cols`` columns (``b_rows`` unless given) through a
    buffer of its own, ``@<name>__stage``, not the ring: ``stage_cols /
    stage_split`` columns at a time (a smaller buffer; a barrier pair more
    per part). Not with a gather, an idle second warpgroup, prefetched
    weights or an epilogue prologue."""
    if refill not in REFILLS:
        raise GraphError(f"tile '{name}': refill must be 'wait' or 'test', got {refill!r}")
    if refill == "test" and (gather is not None or second_busy is not None):
        raise GraphError(
            f"tile '{name}': refill='test' takes no gathered A operand or idle warpgroup"
        )
    groups = block_size // 128
    if second_busy is not None and (groups != 2 or split_n or gather is not None):
        raise GraphError(
            f"tile '{name}': an idle second warpgroup needs two warpgroups of their own rows "
            "(block_size=256, no split_n, no gather)"
        )
    if gather is not None and (split_n or a_loads or weights_prefetched):
        raise GraphError(
            f"tile '{name}': a gathered A operand takes no A boxes, split_n or prefetched "
            "weights (each warp refills the rows only its own wgmma reads)"
        )
    if block_size % 128 or block_m != (64 if split_n else 64 * groups):
        raise GraphError(
            f"tile '{name}': wgmma needs warpgroups of 128 threads, each 64 rows "
            f"({'shared by all, split_n' if split_n else 'of its own'}): "
            f"block_m={block_m} with block_size={block_size}"
        )
    wg_rows = b_rows // groups if split_n else b_rows
    if b_rows % (8 * groups if split_n else 8) or not 8 <= wg_rows <= 256:
        raise GraphError(
            f"tile '{name}': wgmma needs block_n in 8..256, a multiple of 8"
            + (f", per warpgroup (b_rows={b_rows} over {groups})" if split_n else "")
        )
    if k % TMA_BLOCK_K:
        raise GraphError(f"tile '{name}': k={k} must be a multiple of {TMA_BLOCK_K} for TMA")
    if stages < 2:
        raise GraphError(f"tile '{name}': stages={stages} must be at least 2")
    if passes < 1 or (
        passes > 1
        and (
            gather is not None or second_busy is not None or weights_prefetched
            or getattr(epilogue, "prologue", None) is not None
        )
    ):  # fmt: skip
        raise GraphError(
            f"tile '{name}': passes={passes} must be positive; several passes through one "
            "ring take no gather, idle warpgroup, prefetched weights or epilogue prologue"
        )
    if passes > 1 and refill != "test":
        # A wait in the refill makes ptxas serialize the k loop's wgmma for
        # some of these tiles (warning C7520), so passes refill by test only.
        raise GraphError(
            f"tile '{name}': several passes through one ring refill a stage when it is "
            f"free (refill='test'), not refill={refill!r}"
        )
    if stage_split < 1 or (stage_split > 1 and (passes == 1 or split_n)):
        raise GraphError(
            f"tile '{name}': stage_split={stage_split} stages a pass's block in parts: "
            "several passes, no split_n"
        )
    bk, kt_n, warps = TMA_BLOCK_K, k // TMA_BLOCK_K, block_size // 32
    rotation = None if rotate is None else (rotate, k // TMA_BLOCK_K)
    ring = _tma_ring(
        t, name, block_m, b_rows, stages, a_loads, b_loads, k_offset, body=True,
        rotate=rotation, a_tx=gather is None, b_evict_first=b_evict_first,
    )  # fmt: skip
    globals_, base_a, base_b = ring.globals_, ring.base_a, ring.base_b
    is0, bar, issue = ring.is0, ring.bar, ring.issue
    a_bytes, b_bytes = ring.a_bytes, ring.b_bytes
    assert ring.lanes is not None
    tid, group, warp, lane, lane0 = ring.lanes
    if stage_cols is None:
        stage_cols = b_rows

    def issue_at(g: str | int, stage: str | int, which: str = "ab", expect: bool = True) -> None:
        """Thread 0: step ``g`` of the passes' k-tiles into ``stage``."""
        if passes == 1:
            issue(g, stage, which=which, expect=expect)
            return
        if isinstance(g, int):
            p, kt = divmod(g, kt_n)
            shift = t.c(p * b_step) if p else None
        else:
            kt = t.bin("remui", g, kt_n)
            shift = t.mul(t.bin("divui", g, kt_n), b_step)
        issue(kt, stage, which=which, expect=expect, b_shift=shift)

    # -- prologue: the buffers may hold another tile's generic writes (tiles
    # share shared memory) and the previous call's barriers are still live
    # until every thread is here. With the weights prefetched, the prefetch
    # function did this, initialised the barriers and loaded the weights.
    if not weights_prefetched:
        _asm(t, "fence.proxy.async.shared::cta;")
        t.emit("gpu.barrier")
    t.emit(f"scf.if {is0} {{")
    outer = t.indent
    t.indent += "  "
    if not weights_prefetched:
        arrivals: int | str = warps
        if second_busy is not None:
            arrivals = t.op(
                "arr",
                f"arith.select {second_busy}, {_i32(t, t.c(warps))}, "
                f"{_i32(t, t.c(warps // 2))} : i32",
            )
        gathered = 0 if gather is None else warps if gather.tma_map else block_size
        _init_ring_barriers(t, ring, stages, arrivals, 1 + gathered)
    # Other CTAs wrote the activations through the generic proxy.
    _asm(t, "fence.proxy.async.global;")
    for s in range(min(stages, passes * kt_n)):
        if weights_prefetched:
            issue(s, s, which="a", expect=False)
        else:
            issue_at(s, s, which="b" if gather is not None else "ab")
    t.indent = outer
    t.emit("}")
    t.emit("gpu.barrier")
    gather_issue = None
    if gather is not None:  # the barriers exist now: every thread's first stages
        setup = _gather_rows_tma if gather.tma_map else _gather_setup
        gather_issue = setup(t, gather, ring, tid, k_offset, rotation)
        for s in range(min(stages, kt_n)):
            gather_issue(s, s)
    if split_n:
        base_b = t.add(base_b, t.mul(group, wg_rows * bk * 2))
    else:
        base_a = t.add(base_a, t.mul(group, 64 * bk * 2))
    nacc = wg_rows // 2
    trip: int | str = kt_n
    if second_busy is not None:  # no k-tiles for an idle warpgroup: zero accumulators
        first = t.op("first", f"arith.cmpi eq, {group}, {t.c(0)} : index")
        runs = warp_uniform(t, t.op("runs", f"arith.ori {first}, {second_busy} : i1"))
        trip = t.op("trip", f"arith.select {runs}, {t.c(kt_n)}, {t.c(0)} : index")
    place = None
    prologue = getattr(epilogue, "prologue", None)
    if prologue is not None:
        # The epilogue's loads that do not depend on the product (a folded
        # norm's row sums, the residual) go out now: the k loop covers them.
        place = _wgmma_place(t, group, warp, lane, r0, split_n)
        prologue(t, *place)
    lazy = refill == "test"
    multi = passes > 1  # (then refill="test": the passes carry the next k-tile to load)
    total = passes * kt_n
    if multi:
        # Hoisted out of the passes: the epilogue's places.
        place = _wgmma_place(t, group, warp, lane, r0, split_n)
        t.emit(
            f"{t.fresh('pnx')} = scf.for {pass_var} = {t.c(0)} to {t.c(passes)} step {t.c(1)} "
            f"iter_args(%pnx = {t.c(min(stages, total))}) -> (index) {{"
        )
        t.indent += "  "
    lo = t.indent  # the k loop's level
    first_nx = "%pnx" if multi else t.c(min(stages, kt_n))
    res, types = t.acc_loop("%kt", trip, nacc, (("%nx", first_nx),) if lazy else ())
    t.indent = lo + "  "
    # The step's place in the ring: k-tile %kt of this pass, counted over all passes.
    g = t.add(t.mul(pass_var, kt_n), "%kt") if multi else "%kt"
    stage = t.bin("remui", g, stages)
    parity = _i32(t, t.bin("remui", t.bin("divui", g, stages), 2))
    _mbar_wait(t, bar(0, stage), parity)
    if gather is not None and not gather.tma_map:  # other threads' cp.async wrote the stage
        _asm(t, "fence.proxy.async.shared::cta;")
    a_stage = t.add(base_a, t.mul(stage, a_bytes))
    b_stage = t.add(base_b, t.mul(stage, b_bytes))
    _asm(t, "wgmma.fence.sync.aligned;")
    acc = [f"%acc_{q}" for q in range(nacc)]
    for ks in range(bk // 16):
        da = _descriptor(t, t.add(a_stage, 32 * ks))
        db = _descriptor(t, t.add(b_stage, 32 * ks))
        acc = _wgmma(t, acc, da, db, wg_rows)
    acc = _wgmma_wait(t, acc, pending=1)
    # The previous k-tile's wgmma is done: release its stage, and refill it
    # (a pass's last k-tile's stage goes back after the pass).
    has_prev = t.op("prev", f"arith.cmpi uge, %kt, {t.c(1)} : index")
    t.emit(f"scf.if {has_prev} {{")
    t.indent = lo + "    "
    prev = t.op("p", f"arith.subi {g}, {t.c(1)} : index")
    pstage = _release_stage(t, prev, stages, bar, lane0)
    nxt = t.add(prev, stages)
    more = t.op("more", f"arith.cmpi ult, {nxt}, {t.c(total)} : index")
    if gather_issue is not None:  # this warp's rows of the stage: its wgmma read them
        t.emit(f"scf.if {more} {{")
        t.indent = lo + "      "
        gather_issue(nxt, pstage)
        t.indent = lo + "    "
        t.emit("}")
    if not lazy:  # (one pass)
        go = t.op("refill", f"arith.andi {is0}, {more} : i1")
        t.emit(f"scf.if {go} {{")
        t.indent = lo + "      "
        _mbar_wait(t, bar(1, pstage), _i32(t, t.bin("remui", t.bin("divui", prev, stages), 2)))
        issue(nxt, pstage, which="b" if gather is not None else "ab")
        t.indent = lo + "    "
        t.emit("}")
    t.indent = lo + "  "
    t.emit("}")
    carried = []
    if lazy:
        nx = t.fresh("nx")
        t.emit(f"{nx} = scf.if {is0} -> (index) {{")
        t.indent = lo + "    "
        step = "%nx"
        for _ in range(2):
            step = _try_refill(t, step, total, stages, bar, issue_at, cur=g)
        t.emit(f"scf.yield {step} : index")
        t.indent = lo + "  "
        t.emit("} else {")
        t.emit("  scf.yield %nx : index")
        t.emit("}")
        carried = [nx]
    t.emit(f"scf.yield {', '.join([*acc, *carried])} : {types}")
    t.indent = lo
    t.emit("}")
    final = _wgmma_wait(t, [f"{res}#{q}" for q in range(nacc)], commit=False)

    # Once every thread is past its last wait (the first barrier after the
    # loop, or after the passes), thread 0 invalidates the barriers.
    def invalidate() -> None:
        t.emit(f"scf.if {is0} {{")
        t.indent += "  "
        mbarrier_inval(t, (bar(kind, s) for s in range(stages) for kind in (0, 1)))
        t.end()

    if multi:
        # The pass's last k-tile: its stage goes back too, so that the next
        # pass's loads run on into it while this pass's epilogue stores.
        _release_stage(t, t.add(t.mul(pass_var, kt_n), kt_n - 1), stages, bar, lane0)
    else:
        t.after_join = invalidate
    if stage_output:
        # The block goes through the idle A ring, or with passes (whose next
        # loads fill the ring meanwhile) through a buffer of its own.
        ring_start, ring_bytes, split = ring.base_a, stages * a_bytes, 1
        if multi:
            split = stage_split
            ring_start, ring_bytes = _staging_buffer(
                t, globals_, name, block_m, stage_cols // split
            )

        def staging(t, values, cols, out, r1, n_limit, **kw) -> bool:
            per = len(values[0]) // split  # fragments (8 columns each) a part
            for part in range(split):
                done = _staged_store(
                    t, [values[0][part * per : (part + 1) * per]],
                    cols[part * per : (part + 1) * per], out, r1, n_limit, ring=ring_start,
                    ring_bytes=ring_bytes, block_m=block_m, block_size=block_size, tid=tid,
                    group=group, warp=warp, lane=lane, r0=r0, split_n=split_n, **kw,
                )  # fmt: skip
                if not done:  # does not fit: the first part, before anything was emitted
                    assert part == 0
                    return False
            return True

        t.staging = staging
    if multi:
        assert place is not None
        _wgmma_epilogue(t, final, wg_rows, epilogue, place)
        t.staging = None
        t.emit(f"scf.yield {res}#{nacc} : index")
        t.end()
        t.emit("gpu.barrier")
        invalidate()
        return globals_
    rows, wn_i, col_lane = _wgmma_place(t, group, warp, lane, r0, split_n)
    # The prologue's loads are keyed by its rows' names: the epilogue takes them.
    _wgmma_epilogue(t, final, wg_rows, epilogue, (place[0] if place else rows, wn_i, col_lane))
    t.staging = None
    if t.after_join is not None:  # no epilogue barrier: one of its own
        t.emit("gpu.barrier")
        t.joined()
    return globals_


def _release_stage(t: _Text, kt: str, stages: int, bar, lane0: str) -> str:
    """Each warp gives k-tile ``kt``'s stage back (its lane 0 arrives on the
    stage's empty barrier); returns the stage."""
    stage = t.bin("remui", kt, stages)
    t.emit(f"scf.if {lane0} {{")
    t.indent += "  "
    _asm_ops(t, "mbarrier.arrive.shared::cta.b64 _, [$0];", [(bar(1, stage), "i32")])
    t.end()
    return stage


def _staging_buffer(
    t: _Text, globals_: list[str], name: str, block_m: int, cols: int
) -> tuple[str, int]:
    """A workgroup buffer of its own for a staged ``block_m x cols`` bf16
    block (declared into ``globals_``): its address and size."""
    ty = f"memref<{block_m}x{cols}xbf16, #gpu.address_space<workgroup>>"
    globals_.append(f'memref.global "private" @{name}__stage : {ty} {{alignment = 1024 : i64}}')
    ref = t.op("st", f"memref.get_global @{name}__stage : {ty}")
    at = t.op("b", f"memref.extract_aligned_pointer_as_index {ref} : {ty} -> index")
    return at, block_m * cols * 2


#: A staged store's destination: ``(memref, its type)``, or a callable
#: ``store(t, vec, local_row, col)`` that emits one 16-byte store of
#: ``vec`` (``vector<8xbf16>``, ``vector<8xf16>`` for half pairs) for the
#: block's ``local_row`` (rows of a peer's buffer, a chunk of a 3-D buffer,
#: an L2 reduction).
StagedOut = tuple[str, str] | Callable[[_Text, str, str, str], None]


def tma_prefetch_l2(
    t: _Text, loads: list[TmaLoad], k_tiles: int, k_offset: str | None,
    rotate: tuple[str, int] | None = None, first: int = 0,
) -> None:  # fmt: skip
    """Thread 0 asks the L2 for ``loads``' boxes of the loop's k-tiles
    ``first .. k_tiles - 1`` (``cp.async.bulk.prefetch.tensor``): no shared
    memory, no barrier, so it may run before a tile's waits (a prefetch
    function). ``rotate = (r, k_tiles_in_all)``: the loop's first k-tiles
    start at ``r`` (:func:`_body_tma`'s ``rotate``)."""
    tid = t.op("tid", "gpu.thread_id x")
    t.emit(f"scf.if {t.op('is0', f'arith.cmpi eq, {tid}, {t.c(0)} : index')} {{")
    t.indent += "  "
    for kt in range(first, k_tiles):
        col = _k_column(t, kt, k_offset, rotate)
        for tmap, row0, _rows, *cond in loads:
            if cond:
                t.emit(f"scf.if {cond[0]} {{")
                t.indent += "  "
            coords = _box_coords(t, tmap, col, row0)
            n = len(coords)
            _asm_ops(
                t,
                f"cp.async.bulk.prefetch.tensor.{n}d.L2.global.tile [$0, {_coords_text(1, n)}];",
                [(tmap, "i64"), *((c, "i32") for c in coords)],
            )
            if cond:
                t.end()
    t.end()


def _staged_store(
    t: _Text, values, cols_at: list[str], out: StagedOut, r1: str, n_limit: str | None,
    *, ring: str,
    ring_bytes: int, block_m: int, block_size: int, tid: str, group: str, warp: str,
    lane: str, r0: str, split_n: bool = False, pair: Callable[..., str] | None = None,
    elem: str = "bf16",
) -> bool:  # fmt: skip
    """Store a TMA tile's bf16 block (``values[0][f]``: the wgmma fragment of
    columns ``8f..8f+7``, at ``cols_at[f]``) through shared memory: every thread writes its pairs
    to the block's row-major copy in the ``A`` ring (16-byte chunk ``c`` of row
    ``r`` at ``c ^ (r % 8)``: conflict-free both ways), then each thread moves
    whole 16-byte chunks to rows ``< r1`` (and columns ``< n_limit``, pair by pair
    at a ragged end or when rows are not 16-byte aligned). Returns False
    (nothing emitted) when the block does not fit or has under 64 columns.
    ``split_n``: the warpgroups hold column slices of the same rows. A
    callable ``out`` (see ``StagedOut``) stores whole chunks of rows ``< r1``
    (no ``n_limit``). ``pair(t, c, h)`` makes a fragment's 2-element vector
    of element type ``elem`` (:func:`bf16_pair` unless given)."""
    pair = pair or bf16_pair
    wg_cols = 8 * len(values[0])  # one warpgroup's columns
    cols = wg_cols * (block_size // 128 if split_n else 1)
    cpr = cols // 8  # 16-byte chunks per row
    if wg_cols % 64 or block_m * cols * 2 > ring_bytes or (block_m * cpr) % block_size:
        return False
    if callable(out) and n_limit is not None:
        return False
    mem, mtype = (None, None) if callable(out) else out
    row_bytes = cols * 2
    # Every warpgroup's wgmma has read its last stage before the ring is reused.
    t.emit("gpu.barrier")
    t.joined()
    grp = t.bin("divui", lane, 4)
    tig = t.bin("remui", lane, 4)
    if split_n:  # local row, h = 0
        lrow = t.add(t.mul(warp, 16), grp)
        chunk0 = t.mul(group, wg_cols // 8)  # a multiple of 8
    else:
        lrow = t.add(t.add(t.mul(group, 64), t.mul(warp, 16)), grp)
    for h in range(2):
        row_at = t.add(ring, t.mul(t.add(lrow, 8 * h), row_bytes))
        for f, c in enumerate(values[0]):
            chunk = t.bin("xori", grp, f)  # (f ^ (row % 8)); row % 8 = lane / 4
            if split_n:
                chunk = t.add(chunk0, chunk)
            at = t.add(t.add(row_at, t.mul(chunk, 16)), t.mul(tig, 4))
            word = t.op("w", f"vector.bitcast {pair(t, c, h)} : vector<2x{elem}> to vector<1xi32>")
            word = t.op("w", f"vector.extract {word}[0] : i32 from vector<1xi32>")
            _asm_ops(t, "st.shared.b32 [$0], $1;", [(_i32(t, at), "i32"), (word, "i32")])
    t.emit("gpu.barrier")
    col0 = t.op("col0", f"arith.subi {cols_at[0]}, {t.mul(tig, 2)} : index")  # the block's
    if split_n:
        col0 = t.op("col0", f"arith.subi {col0}, {t.mul(group, wg_cols)} : index")
    aligned = None
    if n_limit is not None:
        rem = t.bin("remui", n_limit, 8)
        aligned = t.op("al", f"arith.cmpi eq, {rem}, {t.c(0)} : index")
    # A loop, not unrolled: in a fused kernel every tile shares one register budget.
    iv = t.fresh("it")
    t.emit(f"scf.for {iv} = {t.c(0)} to {t.c(block_m * cpr // block_size)} step {t.c(1)} {{")
    loop_indent = t.indent
    t.indent += "  "
    v = t.add(tid, t.mul(iv, block_size))
    lr = t.bin("divui", v, cpr)
    ch = t.bin("remui", v, cpr)
    at = t.add(
        t.add(ring, t.mul(lr, row_bytes)), t.mul(t.bin("xori", ch, t.bin("andi", lr, 7)), 16)
    )
    ty = "!llvm.struct<(i32, i32, i32, i32)>"
    got = t.op(
        "ld",
        'llvm.inline_asm has_side_effects asm_dialect = att "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", '
        f'"=r,=r,=r,=r,r" {_i32(t, at)} : (i32) -> {ty}',
    )
    words = [t.op("x", f"llvm.extractvalue {got}[{q}] : {ty}") for q in range(4)]
    vec = t.op("v", f"vector.from_elements {', '.join(words)} : vector<4xi32>")
    vec = t.op("v", f"vector.bitcast {vec} : vector<4xi32> to vector<8x{elem}>")
    grow = t.add(r0, lr)
    gcol = t.add(col0, t.mul(ch, 8))
    ok = t.op("ok", f"arith.cmpi ult, {grow}, {r1} : index")
    store16 = (
        f"  vector.store {vec}, {mem}[{grow}, {gcol}] {{alignment = 16 : i64}} : {mtype}, "
        "vector<8xbf16>"
    )
    if callable(out):
        t.emit(f"scf.if {ok} {{")
        inner = t.indent
        t.indent += "  "
        out(t, vec, lr, gcol)
        t.indent = inner
        t.emit("}")
    elif n_limit is None:
        t.emit(f"scf.if {ok} {{")
        t.emit(store16)
        t.emit("}")
    else:
        end = t.add(gcol, 8)
        whole = t.op("ok", f"arith.cmpi ule, {end}, {n_limit} : index")
        whole = t.op("ok", f"arith.andi {whole}, {aligned} : i1")
        full = t.op("ok", f"arith.andi {ok}, {whole} : i1")
        t.emit(f"scf.if {full} {{")
        t.emit(store16)
        t.emit("} else {")
        outer = t.indent
        t.indent += "  "
        for p in range(4):  # a ragged or unaligned end: bf16 pairs
            pcol = t.add(gcol, 2 * p)
            okp = t.op("ok", f"arith.cmpi ult, {pcol}, {n_limit} : index")
            okp = t.op("ok", f"arith.andi {ok}, {okp} : i1")
            one = t.op("p", f"vector.from_elements {words[p]} : vector<1xi32>")
            pair = t.op("p", f"vector.bitcast {one} : vector<1xi32> to vector<2xbf16>")
            t.emit(f"scf.if {okp} {{")
            t.emit(
                f"  vector.store {pair}, {mem}[{grow}, {pcol}] {{alignment = 4 : i64}} : "
                f"{mtype}, vector<2xbf16>"
            )
            t.emit("}")
        t.indent = outer
        t.emit("}")
    t.indent = loop_indent
    t.emit("}")
    return True


def _words(t: _Text, frag: str, tiles: int = 4) -> list[str]:
    """The i32 registers of an ``ldmatrix`` result of ``tiles`` 8x8
    matrices (``vector<tiles x 2 x bf16>``, bf16 pairs)."""
    out = []
    ftype = _FRAG if tiles == 4 else f"vector<{tiles}x2xbf16>"
    for q in range(tiles):
        p = t.op("p", f"vector.extract {frag}[{q}] : vector<2xbf16> from {ftype}")
        w = t.op("w", f"vector.bitcast {p} : vector<2xbf16> to vector<1xi32>")
        out.append(t.op("r", f"vector.extract {w}[0] : i32 from vector<1xi32>"))
    return out


def _half_pair(t: _Text, c: list[str], h: int, elem: str) -> str:
    """Accumulators ``c[2h], c[2h+1]`` (f32, adjacent columns) as a ``vector<2x{elem}>``."""
    v = t.op("v", f"vector.from_elements {c[2 * h]}, {c[2 * h + 1]} : vector<2xf32>")
    return t.op("h", f"arith.truncf {v} : vector<2xf32> to vector<2x{elem}>")


def bf16_pair(t: _Text, c: list[str], h: int) -> str:
    """Accumulators ``c[2h], c[2h+1]`` as a ``vector<2xbf16>``."""
    return _half_pair(t, c, h, "bf16")


def f16_pair(t: _Text, c: list[str], h: int) -> str:
    """Accumulators ``c[2h], c[2h+1]`` as a ``vector<2xf16>``."""
    return _half_pair(t, c, h, "f16")


def _store_pairs(
    t: _Text,
    values: list[list[list[str]]],
    rows: list[str],
    cols: list[str],
    out: tuple[str, str],
    r1: str,
    n_limit: str | None,
    f32: bool = False,
) -> None:
    """Store ``values[m][f]`` (4 f32) as bf16 pairs (float32 pairs with
    ``f32``) at rows ``rows[2m]`` (c0, c1) and ``rows[2m+1]`` (c2, c3),
    column ``cols[f]``, where ``row < r1`` (and ``col < n_limit``)."""
    if not f32 and t.staging is not None and t.staging(t, values, cols, out, r1, n_limit):
        return
    mem, mtype = out
    oks = [t.op("ok", f"arith.cmpi ult, {row}, {r1} : index") for row in rows]
    for m, per in enumerate(values):
        for f, c in enumerate(per):
            okc = None
            if n_limit is not None:
                okc = t.op("okc", f"arith.cmpi ult, {cols[f]}, {n_limit} : index")
            for h in range(2):
                ok = oks[2 * m + h]
                if okc is not None:
                    ok = t.op("ok", f"arith.andi {ok}, {okc} : i1")
                if f32:
                    hv = t.op(
                        "v", f"vector.from_elements {c[2 * h]}, {c[2 * h + 1]} : vector<2xf32>"
                    )
                else:
                    hv = bf16_pair(t, c, h)
                vt, align = ("vector<2xf32>", 8) if f32 else ("vector<2xbf16>", 4)
                t.emit(f"scf.if {ok} {{")
                t.emit(
                    f"  vector.store {hv}, {mem}[{rows[2 * m + h]}, {cols[f]}] "
                    f"{{alignment = {align} : i64}} : {mtype}, {vt}"
                )
                t.emit("}")


#: A split-K workspace: (parts x rows) x columns of float32 products.
PART_TYPE = "memref<?x?xf32>"
#: Split-K counters: one i32 per output block (``cnt`` rows laid end to end).
COUNT_TYPE = "memref<?x?xi32>"
#: Parts of a split-K sum whose loads are issued together: each group
#: costs one L2 round trip (the sum used to take one per part).
SUM_GROUP = 8


def meet_parts(
    t: _Text, acc, rows: list[str], cols: list[str], r1: str, m_rows: str, parts: int,
    part: str, slot: Callable[[_Text], str], flag: str,
) -> list:  # fmt: skip
    """The split-K meeting of tile part ``part`` (an index value) of
    ``parts``, as an epilogue step, through a row-major workspace: stores
    the part's float32 accumulators at rows ``part*M + row`` of ``%P``,
    counts the part (:func:`_arrive`) and in the last part to arrive returns
    the parts' sum in part order (:func:`sum_parts`)."""
    shift = t.op("shift", f"arith.muli {part}, {m_rows} : index")
    mine = [t.add(r, shift) for r in rows]
    _store_pairs(t, acc, mine, cols, ("%P", PART_TYPE), t.add(r1, shift), None, f32=True)
    _arrive(t, parts, slot, flag)
    return sum_parts(t, acc, rows, cols, r1, m_rows, parts)


def _arrive(t: _Text, parts: int, slot: Callable[[_Text], str], flag: str) -> None:
    """After the part's stores: counts it on ``%cnt``'s word ``slot(t)``
    (acquire-release, GPU scope, after a CTA barrier:
    :func:`etc.tiles._mma.open_last_arrival`, whose flag is the workgroup
    global ``flag``) and opens ``scf.if`` for the last of ``parts`` (the
    caller closes it)."""
    is0, cnt_at = _counter_word(t, slot)
    _mma.open_last_arrival(t, flag, is0, cnt_at, parts, t.c(0))


def _counter_word(t: _Text, slot: Callable[[_Text], str]) -> tuple[str, str]:
    """After the part's stores, a CTA barrier (its stores are issued, so the
    count's release covers them); returns thread 0's predicate and the byte
    address (i64) of ``%cnt``'s word ``slot(t)``."""
    t.emit("gpu.barrier")
    t.joined()
    tid = t.op("tid", "gpu.thread_id x")
    is0 = t.op("is0", f"arith.cmpi eq, {tid}, {t.c(0)} : index")
    at = slot(t)
    base = t.op("cb", f"memref.extract_aligned_pointer_as_index %cnt : {COUNT_TYPE} -> index")
    return is0, t.op("ca", f"arith.index_cast {t.add(base, t.mul(at, 4))} : index to i64")


def sum_parts(
    t: _Text, acc, rows: list[str], cols: list[str], r1: str, m_rows: str, parts: int
) -> list:
    """``sum(P[s*M + row, col] for s in 0..parts-1)`` for every accumulator
    of ``acc`` (float32, in part order; rows past ``r1`` read row ``r1 - 1``).
    The loads of :data:`SUM_GROUP` parts are issued before their adds, which
    keep part order: the same bits as adding part after part."""
    last_row = t.op("lr", f"arith.subi {r1}, {t.c(1)} : index")
    ld = t.op("ld", f"memref.dim %P, {t.c(1)} : {PART_TYPE}")
    base = t.op("pb", f"memref.extract_aligned_pointer_as_index %P : {PART_TYPE} -> index")
    row_at = [t.bin("minui", r, last_row) for r in rows]
    pair_t = "!llvm.struct<(f32, f32)>"

    def load_part(part: int) -> list[str]:
        """Part ``part``'s values, in the flat fragment order of ``sums``."""
        shift = t.op("sh", f"arith.muli {t.c(part)}, {m_rows} : index")
        values = []
        for m, per in enumerate(acc):
            for f in range(len(per)):
                for h in range(2):
                    row = t.add(row_at[2 * m + h], shift)
                    elem = t.add(t.op("e", f"arith.muli {row}, {ld} : index"), cols[f])
                    at = t.op("a", f"arith.index_cast {t.add(base, t.mul(elem, 4))} : index to i64")
                    got = t.op(
                        "ld",
                        'llvm.inline_asm has_side_effects asm_dialect = att "ld.global.cg.v2.f32 '
                        f'{{$0, $1}}, [$2];", "=f,=f,l" {at} : (i64) -> {pair_t}',
                    )
                    values += [
                        t.op("pv", f"llvm.extractvalue {got}[{e}] : {pair_t}") for e in range(2)
                    ]
        return values

    # The flat accumulators in fragment order (per fragment: h=0: c0, c1; h=1: c2, c3).
    sums = ["%fzero"] * sum(4 * len(per) for per in acc)
    for first in range(0, parts, SUM_GROUP):
        group = [load_part(part) for part in range(first, min(first + SUM_GROUP, parts))]
        for values in group:  # the adds after all of the group's loads, in part order
            sums = [
                t.op("ps", f"arith.addf {a}, {v} : f32") for a, v in zip(sums, values, strict=True)
            ]
    total = iter(sums)
    return [[[next(total) for _ in range(4)] for _ in per] for per in acc]


#: A dense tile's split-K workspace: each part's accumulators in fragment
#: order (:func:`meet_fragments`).
FRAGMENT_PARTS_TYPE = "memref<?xf32>"
#: Fragments (4 floats, 8 columns) of one other part the last part loads
#: at a time (fewer when more parts), two such chunks in flight next to its
#: own accumulators (8 made a 128 x 256 tile spill 24 bytes, ptxas -v).
MEET_FRAGMENTS = 4


def meet_fragments(
    t: _Text, acc, parts: int, part: str, block: Callable[[_Text], str], flag: str,
    block_size: int, part_block: Callable[[_Text], str] | None = None,
    p_type: str = FRAGMENT_PARTS_TYPE, live: str | None = None,
) -> list:  # fmt: skip
    """The split-K meeting of a dense tile's part ``part`` (an index value)
    of ``parts``, through a workspace in fragment order: thread ``tid``'s
    fragment ``f`` (4 floats) of part ``s`` of output block ``b`` is the
    16-byte vector ``((b * parts + s) * F + f) * block_size + tid`` of
    ``%P`` (``F`` fragments a thread), so a warp stores and loads 512
    contiguous bytes at a time, and no row or column is clipped. Counts
    the part on ``%cnt``'s word ``block(t)`` (:func:`_arrive`); the last
    part adds the parts in part order, its own from its registers: the
    same bits whichever part is last. Returns the sums in ``acc``'s
    structure, inside the last part's ``scf.if`` (the caller closes it).

    ``part_block``: the block's index in ``%P`` when it is not its counter's
    word (the decoder's projections share ``%P`` but not their counter
    rows); ``p_type``: ``%P``'s type, any float32 memref read as one flat
    array (16-byte stores by address when it is not 1-D); ``live`` (an
    ``i1``, with such a ``p_type``): whether this thread's fragments hold
    rows to keep: a thread without stores and loads nothing (its sums, which
    the caller must not store, hold its own products alone), so a block of
    a few rows moves only their warps' bytes."""
    meeting = _FragmentMeeting(t, acc, parts, part, part_block or block, block_size, p_type, live)
    _arrive(t, parts, block, flag)
    sums = meeting.sums(range(len(meeting.frags)))
    it = iter(sums)
    return [[next(it) for _ in per] for per in acc]


def check_meet_share(
    name: str, share: int, parts: int, units: int, needs: tuple[str, bool]
) -> None:
    """Raises GraphError naming tile ``name`` unless ``share`` is 1 or a
    power of two up to ``parts`` (> 1) dividing a thread's ``units``
    fragment units, and the tile's own condition ``needs = (what, holds)``
    holds (:func:`share_fragments`)."""
    what, holds = needs
    if share != 1 and (
        not holds or parts < 2 or share not in (2, 4, 8) or units % share or share > parts
    ):
        raise GraphError(
            f"tile '{name}': meet_share={share!r} needs {what}, k_splits > 1 and a power of "
            f"two up to k_splits={parts} dividing the {units} fragments of a thread"
        )


def share_fragments(
    t: _Text, acc, parts: int, part: str, block: Callable[[_Text], str], flag: str,
    block_size: int, share: int, store: Callable[[_Text, list, list[int]], None], *,
    per_n: int = 1, part_block: Callable[[_Text], str] | None = None,
    p_type: str = FRAGMENT_PARTS_TYPE, live: str | None = None,
) -> None:  # fmt: skip
    """:func:`meet_fragments` with the sums shared by the block's last
    ``share`` parts to arrive: arrival ``parts - share + q`` adds the parts
    (in part order: the same bits) of the ``q``-th of ``share`` equal runs
    of each thread's fragment units and stores them with ``store(t, sums,
    units)``: ``sums`` in ``acc``'s structure holding only those units'
    fragments (gate, then up with ``per_n=2``, whose unit ``u`` is the pair
    of fragments ``u`` and ``u + F/2``), ``units`` their indices. The last
    part to arrive loads a ``share``-th of what :func:`meet_fragments` would
    (one L2 round trip instead of several when ``share`` is the fragment
    count); the other sharers wait for it, spinning on the count.

    Sharers spin, so the block's parts must all be able to run at once: the
    tile declares it (:attr:`etc.DeviceFunction.meets`), and the static
    schedule (lists only) deals a block's parts to different CTAs, each
    list in global order (``docs/scheduling.md``, "Parts that wait for each
    other"). The count: the last part resets it to zero with a release
    store; sharer ``r`` (its count's value before it added 1) spins until
    the word is at most ``r`` again, which only that reset makes it (the
    block's next use waits for this instance), then acquires the parts."""
    units = len(acc[0]) // per_n
    if share < 1 or units % share or share > parts or any(len(per) != len(acc[0]) for per in acc):
        raise GraphError(
            f"share_fragments: share={share} must divide the {units} fragment units of a "
            f"thread and be at most the {parts} parts"
        )
    meeting = _FragmentMeeting(t, acc, parts, part, part_block or block, block_size, p_type, live)
    is0, cnt_at = _counter_word(t, block)
    seen = _mma.count_arrival(t, flag, is0, cnt_at, parts, t.c(0), release_reset=True)
    first = t.op("fs", f"arith.constant {parts - share} : i32")
    sharer = t.op("sharer", f"arith.cmpi uge, {seen}, {first} : i32")
    t.emit(f"scf.if {sharer} {{")
    t.indent += "  "
    waits = t.op(
        "waits", f"arith.cmpi ne, {seen}, {t.op('pl', f'arith.constant {parts - 1} : i32')} : i32"
    )
    t.emit(f"scf.if {t.op('spin', f'arith.andi {is0}, {waits} : i1')} {{")
    t.indent += "  "
    _asm_ops(t, _text.SPIN_UNTIL_AT_MOST, [(cnt_at, "i64"), (seen, "i32")])
    t.end()
    t.emit("gpu.barrier")
    meeting.operands()  # once, for every sharer's branch
    q = t.op("q", f"arith.subi {seen}, {first} : i32")
    q = t.op("q", f"arith.index_cast {q} : i32 to index")
    run = units // share
    for k in range(share):
        mine = t.op("mine", f"arith.cmpi eq, {q}, {t.c(k)} : index")
        t.emit(f"scf.if {mine} {{")
        t.indent += "  "
        owned = list(range(k * run, (k + 1) * run))
        fs = owned + [u + units for u in owned] if per_n == 2 else owned
        per = len(acc[0])
        # Flat indices of the owned fragments in every row group m.
        sums = iter(meeting.sums([m * per + f for m in range(len(acc)) for f in fs]))
        store(t, [[next(sums) for _ in fs] for _ in acc], owned)
        t.end()
    t.end()


#: Every thread of both CTAs of a cluster passes it: what either wrote
#: before (its shared memory included) is seen by the other after.
CLUSTER_SYNC = "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"


def pair_fragments(
    t: _Text, acc, part: str, buffer: str, block_size: int, live: str | None = None
) -> list:
    """The first round of a split-K meeting on thread-block clusters of 2
    (:attr:`etc.DeviceFunction.cluster`): parts ``2g`` and ``2g + 1`` of a
    block run at once on the two CTAs of one cluster (the static lists put
    them there), and ``part`` (an index value) is this CTA's. After a CTA
    barrier (every warpgroup done with its ring), the odd part stores its
    fragments into its own shared memory at ``buffer`` (an index: the
    shared address of an idle buffer of ``16 * block_size`` bytes a
    fragment, the tile's ring), thread ``tid``'s fragment ``f`` at byte
    ``(f * block_size + tid) * 16``; both pass a cluster barrier; the even
    part loads them from its partner's buffer over distributed shared memory
    (``mapa`` + ``ld.shared::cluster``) and adds them after its own; both
    pass a second cluster barrier (the odd part's buffer is read, so its
    ring may refill), and the even part opens ``scf.if`` (the caller
    closes it) in which the pair's part-order sums stand in ``acc``'s
    structure: ``0 + p[2g] + p[2g + 1]``, bit for bit what the L2 meeting
    of :func:`meet_fragments` adds for these two parts.

    ``live`` (an ``i1``): whether this thread's fragments hold rows to keep;
    a thread without stores and loads nothing (its sums hold its own
    products alone, which the caller must not store). The pair passes two
    cluster barriers in every thread, so the caller runs this in uniform
    control flow, the same in both CTAs."""
    frags = [q for per in acc for q in per]
    t.emit("gpu.barrier")  # every warpgroup's wgmma is done with the ring
    t.joined()
    tid = t.op("tid", "gpu.thread_id x")
    odd = t.op("odd", f"arith.cmpi ne, {t.bin('remui', part, 2)}, {t.c(0)} : index")
    on = "" if live is None else t.op("lv", f"arith.extui {live} : i1 to i32")
    decl = "" if live is None else ".reg .pred p; setp.ne.b32 p, $5, 0; "
    guard = decl + "@p " if decl else ""
    live_op = [(on, "i32")] if on else []
    mine = _i32(t, t.add(buffer, t.mul(tid, 16)))
    stride = 16 * block_size
    t.emit(f"scf.if {odd} {{")
    t.indent += "  "
    for f, c in enumerate(frags):
        _asm_ops(
            t, f"{{{guard}st.shared.v4.f32 [$0+{f * stride}], {{$1, $2, $3, $4}};}}",
            [(mine, "i32"), *[(v, "f32") for v in c], *live_op], memory=True,
        )  # fmt: skip
    t.end()
    _asm(t, CLUSTER_SYNC, memory=True)
    rank = t.op(
        "rank",
        'llvm.inline_asm has_side_effects asm_dialect = att "mov.u32 $0, %cluster_ctarank;", '
        '"=r" : () -> i32',
    )
    peer = t.op("peer", f"arith.xori {rank}, {t.op('one', 'arith.constant 1 : i32')} : i32")
    theirs = t.op(
        "rb",
        'llvm.inline_asm asm_dialect = att "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r" '
        f"{mine}, {peer} : (i32, i32) -> i32",
    )
    quad_t = "!llvm.struct<(f32, f32, f32, f32)>"
    zeros = "".join(f"mov.f32 ${e}, 0f00000000; " for e in range(4))
    # Only the even part's live threads load (the odd part's sums are dropped).
    even = t.op("even", f"arith.xori {odd}, {t.op('true', 'arith.constant true')} : i1")
    reads = even if live is None else t.op("rd", f"arith.andi {even}, {live} : i1")
    reads = t.op("rd", f"arith.extui {reads} : i1 to i32")
    sums = []
    for f, c in enumerate(frags):
        text = (
            ".reg .pred p; setp.ne.b32 p, $5, 0; "
            f"{zeros}@p ld.shared::cluster.v4.f32 {{$0, $1, $2, $3}}, [$4+{f * stride}];"
        )
        got = t.op(
            "ld",
            f'llvm.inline_asm has_side_effects asm_dialect = att "{{{text}}}", '
            f'"=f,=f,=f,=f,r,r" {theirs}, {reads} : (i32, i32) -> {quad_t}',
        )
        # Part order: the even part's (this CTA's, where it is used) first.
        sums.append(
            [
                t.op(
                    "ps",
                    f"arith.addf {t.op('ps', f'arith.addf %fzero, {own} : f32')}, "
                    f"{t.op('pv', f'llvm.extractvalue {got}[{e}] : {quad_t}')} : f32",
                )
                for e, own in enumerate(c)
            ]
        )
    _asm(t, CLUSTER_SYNC, memory=True)
    # The odd part's ring took generic stores; its next TMA loads (the async
    # proxy) must come after them.
    _asm(t, "fence.proxy.async.shared::cta;")
    t.emit(f"scf.if {even} {{")
    t.indent += "  "
    total = iter(sums)
    return [[next(total) for _ in per] for per in acc]


class _FragmentMeeting:
    """A part's fragments stored into its slot of ``%P`` (in the
    constructor), and the part-order sums of any of them once every part
    has stored (:meth:`sums`), the other parts' loaded in double-buffered
    chunks (:data:`MEET_FRAGMENTS`)."""

    def __init__(
        self, t: _Text, acc, parts: int, part: str, part_block: Callable[[_Text], str],
        block_size: int, p_type: str, live: str | None,
    ) -> None:  # fmt: skip
        if live is not None and p_type == FRAGMENT_PARTS_TYPE:
            raise GraphError("meet_fragments: live needs a p_type other than the 1-D workspace")
        self.t, self.parts, self.part = t, parts, part
        self.frags = frags = [q for per in acc for q in per]
        base = t.op("pb", f"memref.extract_aligned_pointer_as_index %P : {p_type} -> index")
        blk = part_block(t)
        tid = t.op("tid", "gpu.thread_id x")

        def element(q: int | str, f: int) -> str:
            """The first float of this thread's fragment ``f`` of part ``q``."""
            bq = t.add(t.mul(blk, parts), q)
            return t.mul(t.add(t.mul(t.add(t.mul(bq, len(frags)), f), block_size), tid), 4)

        v4 = "vector<4xf32>"
        # A predicate on ``live`` for the inline PTX below (operand $5).
        self.on = on = "" if live is None else t.op("lv", f"arith.extui {live} : i1 to i32")
        self.decl = decl = "" if live is None else ".reg .pred p; setp.ne.b32 p, $5, 0; "
        guard = decl + "@p " if decl else ""
        for f, c in enumerate(frags):
            if p_type != FRAGMENT_PARTS_TYPE:
                at = t.op(
                    "a",
                    f"arith.index_cast {t.add(base, t.mul(element(part, f), 4))} : index to i64",
                )
                ops = [(at, "i64"), *[(v, "f32") for v in c]] + ([(on, "i32")] if on else [])
                _asm_ops(t, f"{{{guard}st.global.v4.f32 [$0], {{$1, $2, $3, $4}};}}", ops,
                         memory=True)  # fmt: skip
                continue
            vec = t.op("v", f"vector.from_elements {', '.join(c)} : {v4}")
            t.emit(
                f"vector.store {vec}, %P[{element(part, f)}] {{alignment = 16 : i64}} : "
                f"{FRAGMENT_PARTS_TYPE}, {v4}"
            )
        self.element, self.base, self.block_size = element, base, block_size
        self._operands: tuple[list[str], list[str], list[str]] | None = None

    def operands(self) -> tuple[list[str], list[str], list[str]]:
        """The other parts' addresses and the part-order selects (emitted at
        the first call, which must dominate every :meth:`sums`)."""
        if self._operands is None:
            t, parts, part = self.t, self.parts, self.part
            # The other parts, k-th: k + (k >= part); one address each, a
            # fragment's an immediate offset from it.
            others = []
            for k in range(parts - 1):
                after = t.op("af", f"arith.cmpi uge, {t.c(k)}, {part} : index")
                q = t.add(t.c(k), t.op("q", f"arith.select {after}, {t.c(1)}, {t.c(0)} : index"))
                at = t.add(self.base, t.mul(self.element(q, 0), 4))
                others.append(t.op("a", f"arith.index_cast {at} : index to i64"))
            before = [t.op("lt", f"arith.cmpi ult, {t.c(q)}, {part} : index") for q in range(parts)]
            mine = [t.op("eq", f"arith.cmpi eq, {t.c(q)}, {part} : index") for q in range(parts)]
            self._operands = others, before, mine
        return self._operands

    def sums(self, indices: Iterable[int]) -> list[list[str]]:
        """The part-order sums (4 floats each) of the fragments ``indices``
        (flat), this part's own from its registers, after the count."""
        t, parts, frags = self.t, self.parts, self.frags
        indices = list(indices)
        others, before, mine = self.operands()
        size = max(1, MEET_FRAGMENTS // (parts - 1))
        chunks = [indices[f0 : f0 + size] for f0 in range(0, len(indices), size)]

        # With ``live`` each load is predicated, its registers zeroed first (a
        # predicated-off load leaves them as they were).
        quad_t = "!llvm.struct<(f32, f32, f32, f32)>"
        zeros = "".join(f"mov.f32 ${e}, 0f00000000; " for e in range(4))
        on, decl = self.on, self.decl
        cons, live_arg, types = (
            ("=f,=f,=f,=f,l,r", f", {on}", "i64, i32") if on else ("=f,=f,=f,=f,l", "", "i64")
        )

        def load_text(f: int) -> str:
            text = f"ld.global.cg.v4.f32 {{$0, $1, $2, $3}}, [$4+{f * self.block_size * 16}];"
            return f"{{{decl}{zeros}@p {text}}}" if on else text

        def load(chunk: list[int]) -> dict:
            return {
                (k, f): t.op(
                    "ld",
                    f'llvm.inline_asm has_side_effects asm_dialect = att "{load_text(f)}", '
                    f'"{cons}" {at}{live_arg} : ({types}) -> {quad_t}',
                )
                for k, at in enumerate(others)
                for f in chunk
            }

        # Double-buffered: a chunk's loads go out before the previous chunk's
        # adds wait for theirs (each wait is an L2 round trip).
        sums, ahead = [], load(chunks[0])
        for c, chunk in enumerate(chunks):
            loaded, ahead = ahead, load(chunks[c + 1]) if c + 1 < len(chunks) else {}
            for f in chunk:
                got = {
                    k: [
                        t.op("pv", f"llvm.extractvalue {loaded[k, f]}[{e}] : {quad_t}")
                        for e in range(4)
                    ]
                    for k in range(parts - 1)
                }
                total = ["%fzero"] * 4
                for q in range(parts):  # part q: its own (q == part), else other q or q - 1
                    for e in range(4):
                        v = frags[f][e]
                        if q > 0:
                            v = t.op("pv", f"arith.select {mine[q]}, {v}, {got[q - 1][e]} : f32")
                        if q < parts - 1:
                            v = t.op("pv", f"arith.select {before[q]}, {got[q][e]}, {v} : f32")
                        total[e] = t.op("ps", f"arith.addf {total[e]}, {v} : f32")
                sums.append(total)
        return sums


def _finish(
    t: _Text, name: str, signature: str, globals_: list[str], comment: str, reference, block_size
) -> DeviceFunction:
    source = t.source(name, signature, globals_, comment)
    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


@checked_arguments
def gemm(
    block_m: int = 128,
    block_n: int = 128,
    k: int = 2048,
    *,
    name: str = "gemm_tc",
    block_size: int = 256,
    warps: tuple[int, int] | None = None,
    stages: int = 3,
    smem_limit: int = SMEM_LIMIT,
    core: str = "mma",
    inflight: int = 0,
    block_k: int = BLOCK_K,
    copies_after_mma: bool = False,
    stage_output: bool = True,
    out_dtype: str = "bf16",
    k_splits: int = 1,
    refill: str = "wait",
    meet_share: int = 1,
) -> DeviceFunction:
    """Dense tile ``(i, j)``: ``C[i*BM:, j*BN:] = bf16(A @ B^T)`` (fp32 accumulation).
    ``core="wgmma"`` needs ``target="sm_90a"``; ``inflight`` (0 or 1) is the
    number of k-tiles' wgmma left running while the next is issued (see
    ``_body_wgmma``), ``block_k`` (wgmma: 32 or 64) the k-tile width.
    ``core="tma"`` (sm_90a): TMA loads (``_body_tma``; takes the maps of ``A``
    and ``B`` as two more buffers, which ``Graph.task`` declares when given
    ``(A, B, C)``), 64-wide k-tiles; ``stage_output`` stores the block through
    shared memory in 16-byte rows; ``out_dtype="f32"`` stores ``C`` in float32
    (``memref<?x?xf32>``, e.g. router logits). ``k_splits=S`` (``core="tma"``):
    tile ``(i, j, s)`` multiplies the ``s``-th of ``S`` equal parts of ``k``
    (multiples of 64). With float32 out it stores them into rows ``s*M +
    ...`` of ``C`` (``S*M x N``), for a consumer that adds them. With bf16
    out the parts meet in the tile (split-K for grids under a wave, e.g.
    ``M = 1024``): each stores its float32 product in its slot of the
    workspace ``P`` (``memref<?xf32>``, ``BM * BN`` floats per part and
    output block: :func:`meet_fragments`), counts itself on ``cnt``
    (``memref<?x?xi32>``, one word per output block, ``i * ceil(N/BN) + j``
    of its rows laid end to end, zero before the first launch and after
    every one), and the last of the block's parts adds them in part order
    (its own from registers) and stores ``C``: buffers ``(A, B, C, P,
    cnt)``, the same bits whichever part comes last. :func:`add_gemm_task`
    declares the workspace. ``refill`` (``core="tma"``): how the ring's
    stages are refilled (:func:`_body_tma`; "test" measured within noise of
    "wait" on an H200, ``bench/RESULTS.md``, GEMM tiles). ``meet_share``
    (bf16 out, ``k_splits > 1``): the block's last ``meet_share`` parts each
    add and store a ``meet_share``-th of the block (:func:`share_fragments`;
    the tile then :attr:`etc.DeviceFunction.meets`: static lists only).

    ``A: memref<?xKxbf16>`` (M rows), ``B: memref<?xKxbf16>`` (N rows),
    ``C: memref<?x?xbf16>`` (M x N, N even). Grid ``(ceil(M/BM),
    ceil(N/BN))``; rows and columns past ``M``/``N`` are clipped."""
    if k_splits != 1 and core != "tma":
        raise GraphError(f"tile '{name}': k_splits={k_splits} needs core='tma'")
    if core == "tma":
        return _dense_tma(
            block_m, block_n, k, name, block_size, stages, smem_limit, stage_output, out_dtype,
            k_splits, refill, meet_share,
        )  # fmt: skip
    if meet_share != 1:
        raise GraphError(f"tile '{name}': meet_share={meet_share!r} needs core='tma'")
    if out_dtype != "bf16":
        raise GraphError(f"tile '{name}': out_dtype={out_dtype!r} needs core='tma'")
    wm, wn = plan(name, block_m, block_n, k, block_size, warps, stages, 1, smem_limit, block_k)
    ab, ct = _mma.dense_types(k)
    t = _Text()
    m_rows, n_rows, r0, r1, n0 = _dense_prologue(t, ab, block_m, block_n)
    alast = t.op("alast", f"arith.subi {r1}, {t.c(1)} : index")
    blast = t.op("blast", f"arith.subi {n_rows}, {t.c(1)} : index")
    cw = block_n // wn

    def a_src(row: str) -> Source:
        return "%A", ab, "", t.bin("minui", t.add(r0, row), alast)

    def b_src(row: str) -> Source:
        return "%B", ab, "", t.bin("minui", t.add(n0, row), blast)

    def b_pairs(wn_i: str) -> list[str]:
        base = t.mul(wn_i, cw)
        return [t.add(base, 16 * p) for p in range(cw // 16)]

    def epilogue(t: _Text, acc, rows, wn_i, col_lane) -> None:
        wcol = t.add(t.add(n0, t.mul(wn_i, cw)), col_lane)
        cols = [t.add(wcol, 8 * f) for f in range(len(acc[0]))]
        _store_pairs(t, acc, rows, cols, ("%C", ct), r1, n_rows)

    globals_ = _body(
        t, name=name, k=k, block_m=block_m, b_rows=block_n, block_size=block_size, wm=wm,
        wn=wn, stages=stages, a_src=a_src, b_src=b_src, b_pairs=b_pairs, r0=r0,
        epilogue=epilogue, core=core, inflight=inflight, block_k=block_k,
        copies_after_mma=copies_after_mma,
    )  # fmt: skip
    t.close()
    fn = _finish(
        t, name, _mma.dense_signature(ab, ct), globals_,
        f"{name}: C = A @ B^T, bf16, {block_m}x{block_n}x{BLOCK_K} blocks, {stages} stages, "
        f"{wm}x{wn} warps", _mma.dense_reference(block_m, block_n), block_size,
    )  # fmt: skip
    fn.gemm_blocks = (block_m, block_n, 1)
    return fn


def plan_tma(
    name: str, block_m: int, b_rows: int, k: int, block_size: int, stages: int, smem_limit: int,
    staged: int = 0,
) -> None:  # fmt: skip
    """Check a TMA tile's configuration (the body checks the wgmma shape);
    ``staged``: bytes of an output staging buffer besides the ring."""
    for key, value in (("block_m", block_m), ("k", k), ("stages", stages)):
        _positive(name, key, value)
    _positive(name, "block_size", block_size)
    need = tma_smem_bytes(block_m, b_rows, stages) + staged
    if need > smem_limit:
        raise GraphError(
            f"tile '{name}': {stages} stages of {block_m}x{TMA_BLOCK_K} + {b_rows}x{TMA_BLOCK_K} "
            + (f"bf16 and a {staged}-byte staging buffer " if staged else "bf16 ")
            + f"need {need} bytes of shared memory, over the limit of {smem_limit}"
        )


def _map_pointer(t: _Text, arg: str) -> str:
    """The address (i64) of a tensor map argument ``memref<16xi64>``."""
    return _address(t, arg, MAP_TYPE)


def weight_map(t: _Text, arg: str, chunk: int) -> str:
    """:func:`_map_pointer` of a weight's map, a :class:`ChunkedMap` when the
    weight is chunked."""
    p = _map_pointer(t, arg)
    return ChunkedMap(p) if chunk else p


def check_tma_chunk(name: str, core: str, chunk: int, k: int, rows: int) -> int:
    """A TMA tile's ``weight_chunk``: 0, or ``TMA_BLOCK_K`` (a box's k
    columns are one chunk) with the tile on the tma core."""
    _mma.check_weight_chunk(name, chunk, k, rows)
    if chunk and (core != "tma" or chunk != TMA_BLOCK_K):
        raise GraphError(
            f"tile '{name}': weight_chunk={chunk} needs core='tma' and chunks of "
            f"{TMA_BLOCK_K} (one TMA box's k), got core={core!r}"
        )
    return chunk


def _address(t: _Text, arg: str, ty: str) -> str:
    """The address (i64) of buffer ``arg`` of memref type ``ty``."""
    p = t.op("ptr", f"memref.extract_aligned_pointer_as_index {arg} : {ty} -> index")
    return t.op("ptr", f"arith.index_cast {p} : index to i64")


MAP_TYPE = "memref<16xi64>"


@checked_arguments
def finish_tma(
    t: _Text, name: str, signature: str, globals_: list[str], comment: str, reference,
    block_size: int, buffers: int, maps: list[tuple],
) -> DeviceFunction:  # fmt: skip
    """A TMA tile: ``signature`` (``buffers`` buffers after the coordinates)
    gets one trailing ``%<arg>_map`` buffer per ``(arg, source buffer, box
    rows[, chunk])`` of ``maps``; the reference ignores them (and may be
    called without them)."""
    signature += "".join(f", %{arg}_map: {MAP_TYPE}" for arg, *_ in maps)
    n = len(maps)
    fn = _finish(t, name, signature, globals_, comment, reference, block_size)
    total = len(fn.params)
    fn.reference = lambda *a: reference(*(a[:-n] if len(a) == total else a))
    # A fourth entry: the source's chunk (ChunkedMap loads), when not 0.
    fn.tensor_maps = {
        buffers + q: (src, (rows, TMA_BLOCK_K), *(c for c in chunk if c))
        for q, (_, src, rows, *chunk) in enumerate(maps)
    }
    return fn


def _dense_prologue(
    t: _Text, ab: str, block_m: int, block_n: int
) -> tuple[str, str, str, str, str]:
    """Dense tile ``(i, j)``: opens ``scf.if`` (the block has rows and columns);
    returns ``(M, N, r0, r1, n0)``: ``A``'s and ``B``'s rows, the first and
    past-last rows (clipped to ``M``), the first column."""
    m_rows = t.op("M", f"memref.dim %A, {t.c(0)} : {ab}")
    n_rows = t.op("N", f"memref.dim %B, {t.c(0)} : {ab}")
    r0 = t.mul("%i", block_m)
    r1 = t.bin("minui", t.add(r0, block_m), m_rows)
    n0 = t.mul("%j", block_n)
    valid = _mma.dense_valid(t, r0, n0, m_rows, n_rows)
    t.emit(f"scf.if {valid} {{")
    t.indent += "  "
    return m_rows, n_rows, r0, r1, n0


def _dense_tma(
    block_m: int,
    block_n: int,
    k: int,
    name: str,
    block_size: int,
    stages: int,
    smem_limit: int,
    stage_output: bool,
    out_dtype: str = "bf16",
    k_splits: int = 1,
    refill: str = "wait",
    meet_share: int = 1,
) -> DeviceFunction:
    """:func:`gemm` with ``core="tma"``: buffers ``(A, B, C, A_map, B_map)``."""
    _positive(name, "k_splits", k_splits)
    check_meet_share(name, meet_share, k_splits, block_n // 8, ("bf16 out", out_dtype == "bf16"))
    if k_splits > 1 and k % (k_splits * TMA_BLOCK_K):
        raise GraphError(
            f"tile '{name}': k={k} does not split into {k_splits} parts of a multiple of "
            f"{TMA_BLOCK_K}"
        )
    part = k // k_splits
    plan_tma(name, block_m, block_n, part, block_size, stages, smem_limit)
    if out_dtype not in ("bf16", "f32"):
        raise GraphError(f"tile '{name}': out_dtype must be 'bf16' or 'f32', got {out_dtype!r}")
    out_f32 = out_dtype == "f32"
    meet = k_splits > 1 and not out_f32
    ab, ct = _mma.dense_types(k, out_dtype)
    t = _Text()
    m_rows, n_rows, r0, r1, n0 = _dense_prologue(t, ab, block_m, block_n)
    k_offset, shift = None, None
    if k_splits > 1:  # part s: columns s*part of k (rows s*M of C when partials go out)
        k_offset = t.mul("%s", part)
        if not meet:
            shift = t.op("x", f"arith.muli %s, {m_rows} : index")
    flag, flag_global = _mma.last_arrival_flag(name)
    globals_ = [flag_global] if meet else []

    def block(t: _Text) -> str:  # block (i, j): i * ceil(N / BN) + j
        blocks_n = t.bin("divui", t.add(n_rows, block_n - 1), block_n)
        return t.add(t.op("cr", f"arith.muli %i, {blocks_n} : index"), "%j")

    def epilogue(t: _Text, acc, rows, wn_i, col_lane) -> None:
        cols = [t.add(t.add(n0, col_lane), 8 * f) for f in range(len(acc[0]))]
        end = r1
        if shift is not None:
            rows, end = [t.add(r, shift) for r in rows], t.add(r1, shift)
        if meet and meet_share > 1:

            def store(t: _Text, sums, units: list[int]) -> None:
                # Pairs from the registers: the staged store moves whole blocks.
                staging, t.staging = t.staging, None
                mine = [cols[f] for f in units]
                _store_pairs(t, sums, rows, mine, ("%C", ct), end, n_rows, f32=out_f32)
                t.staging = staging

            share_fragments(t, acc, k_splits, "%s", block, flag, block_size, meet_share, store)
            return
        if meet:
            acc = meet_fragments(t, acc, k_splits, "%s", block, flag, block_size)
        _store_pairs(t, acc, rows, cols, ("%C", ct), end, n_rows, f32=out_f32)
        if meet:
            t.end()

    globals_ += _body_tma(
        t, name=name, k=part, block_m=block_m, b_rows=block_n, block_size=block_size,
        stages=stages, a_loads=[(_map_pointer(t, "%A_map"), r0, block_m)],
        b_loads=[(_map_pointer(t, "%B_map"), n0, block_n)], r0=r0, epilogue=epilogue,
        stage_output=stage_output and not out_f32, k_offset=k_offset, refill=refill,
    )  # fmt: skip
    t.close()
    signature = _mma.dense_signature(ab, ct)
    reference = _mma.dense_reference(block_m, block_n, out_f32)
    buffers = 3
    if k_splits > 1:
        signature = signature.replace("%j: index, ", "%j: index, %s: index, ", 1)
        reference = _split_reference(block_m, block_n, part)
    if meet:
        signature += f", %P: {FRAGMENT_PARTS_TYPE}, %cnt: {COUNT_TYPE}"
        reference, buffers = _meet_reference(block_m, block_n, part, k_splits), 5
    fn = finish_tma(
        t, name, signature, globals_,
        f"{name}: C = A @ B^T, bf16, {block_m}x{block_n}x{TMA_BLOCK_K} blocks, {stages} stages, "
        f"TMA + wgmma{f', {k_splits} parts of k' if k_splits > 1 else ''}"
        + ((f" shared by the last {meet_share}" if meet_share > 1 else " meeting in the last")
           if meet else ""), reference,
        block_size, buffers, [("A", 0, block_m), ("B", 1, block_n)],
    )  # fmt: skip
    if not out_f32:
        fn.gemm_blocks = (block_m, block_n, k_splits)
    fn.meets = k_splits if meet and meet_share > 1 else 0
    return fn


def add_gemm_task(g: Any, tile: DeviceFunction, A: Any, B: Any, C: Any) -> Any:
    """Add ``tile`` (a dense :func:`gemm` tile with bf16 out) to graph ``g`` as the task ``C = A @ B^T`` over its whole grid. A
    tile whose parts of ``k`` meet gets its workspace ``<C>_parts`` (float32,
    ``parts * M x N``) and block counters ``<C>_count`` (i32) declared here:
    pass them to the launch, the counters zeroed once (every launch leaves
    them zero). Returns the task."""
    blocks = getattr(tile, "gemm_blocks", None)
    if blocks is None:
        raise GraphError(
            f"add_gemm_task: tile '{tile.name}' is not a dense gemm() tile with bf16 out"
        )
    block_m, block_n, parts = blocks
    m, n = A.shape[0], B.shape[0]
    grid, args = ((m + block_m - 1) // block_m, (n + block_n - 1) // block_n), (A, B, C)
    if parts > 1:
        blocks = grid[0] * grid[1]
        P = g.tensor(f"{C.name}_parts", (blocks * (parts * block_m * block_n),), "f32")
        cnt = g.tensor(f"{C.name}_count", (1, blocks), "i32")
        grid, args = (*grid, parts), (*args, P, cnt)
    return g.task(tile, grid=grid, args=args)


def _split_reference(block_m: int, block_n: int, part: int) -> Callable[..., None]:
    """Tile ``(i, j, s)`` of a split-K ``gemm``: ``C[s*M + rows, cols]`` (float32)."""

    def reference(i: int, j: int, s: int, A, B, C) -> None:
        m = A.shape[0]
        r0, r1 = i * block_m, min((i + 1) * block_m, m)
        cs, ks = slice(j * block_n, (j + 1) * block_n), slice(s * part, (s + 1) * part)
        C[s * m + r0 : s * m + r1, cs] = _mma.bf16_matmul(A[r0:r1, ks], B[cs, ks])

    return reference


def _meet_reference(block_m: int, block_n: int, part: int, parts: int) -> Callable[..., None]:
    """Tile ``(i, j, s)`` of a split-K ``gemm`` whose parts meet: the part
    into its slot of ``P`` (row-major here: the workspace's layout is the
    kernel's own), the count on ``cnt``, and in the last part the sum (part
    order) into ``C`` as bf16."""

    def reference(i: int, j: int, s: int, A, B, C, P, cnt) -> None:
        m, n = A.shape[0], B.shape[0]
        rs, cs = (
            slice(i * block_m, min((i + 1) * block_m, m)),
            slice(j * block_n, (j + 1) * block_n),
        )
        if rs.start >= m or cs.start >= n:
            return
        blk = i * (-(-n // block_n)) + j
        slots = P.reshape(-1, parts, block_m, block_n)[blk]
        ks = slice(s * part, (s + 1) * part)
        y = _mma.bf16_matmul(A[rs, ks], B[cs, ks])
        slots[s, : y.shape[0], : y.shape[1]] = y
        flat = cnt.reshape(-1)
        flat[blk] += 1
        if flat[blk] != parts:
            return
        flat[blk] = 0
        total = np.zeros(y.shape, np.float32)
        for q in range(parts):
            total = total + slots[q, : y.shape[0], : y.shape[1]]
        C[rs, cs] = _mma.f32_to_bf16(total)

    return reference


def _core_text(core: str, wm: int, wn: int) -> str:
    return {"tma": "TMA + wgmma", "wgmma": "wgmma"}.get(core, f"{wm}x{wn} warps")


def _moe_finish(
    t: _Text, name: str, signature: str, globals_: list[str], comment: str, reference,
    block_size: int, core: str, buffers: int, maps: list[tuple],
) -> DeviceFunction:  # fmt: skip
    """A MoE tile of ``buffers`` buffers; with ``core="tma"`` it also takes
    ``maps`` (:func:`finish_tma`'s) after them."""
    if core != "tma":
        return _finish(t, name, signature, globals_, comment, reference, block_size)
    return finish_tma(t, name, signature, globals_, comment, reference, block_size, buffers, maps)


def _split_groups(name: str, core: str, split_n: bool, block_size: int) -> int:
    """Warpgroups sharing the columns of a ``split_n`` tile (1 without)."""
    if not split_n:
        return 1
    if core != "tma":
        raise GraphError(f"tile '{name}': split_n needs core='tma'")
    return max(1, block_size // 128)


def _sub_columns(name: str, core: str, block_n: int, sub_n: int | None) -> int:
    """Columns per pipeline pass of a MoE tile (``block_n`` unless ``sub_n``)."""
    if sub_n is None or sub_n == block_n:
        return block_n
    if core != "tma":
        raise GraphError(f"tile '{name}': sub_n needs core='tma'")
    if not isinstance(sub_n, int) or sub_n <= 0 or block_n % sub_n:
        raise GraphError(f"tile '{name}': sub_n={sub_n!r} must divide block_n={block_n}")
    return sub_n


def _sub_loop(t: _Text, n0: str, block_n: int, sub: int) -> str:
    """Open ``scf.for`` over a tile's passes of ``sub`` columns (none when
    ``sub == block_n``); returns the pass's first column."""
    if sub == block_n:
        return n0
    iv = t.fresh("pass")
    t.emit(f"scf.for {iv} = {t.c(0)} to {t.c(block_n // sub)} step {t.c(1)} {{")
    t.indent += "  "
    return t.add(n0, t.mul(iv, sub))


def _token_rows(
    t: _Text, r0: str, r1: str, alast: str, topk: int, hidden: int, xt: str, tma: bool = False
) -> TmaGather:
    """The gather of a gate/up tile's rows ``[r0, r1)`` from the tokens: row
    ``r`` is token ``perm[r] // topk`` of ``%X`` (rows past ``r1`` missing);
    ``tma``: by one-row boxes of ``%X_map``."""

    def row(t: _Text, r: str) -> tuple[str, str]:
        at = t.add(r0, r)
        ok = t.op("ok", f"arith.cmpi ult, {at}, {r1} : index")
        return t.bin("divui", _slot(t, at, alast), topk), ok

    tma_map = _map_pointer(t, "%X_map") if tma else None
    return TmaGather(_address(t, "%X", xt), 2 * hidden, row, tma_map)


def _slot(t: _Text, row: str, alast: str) -> str:
    """``perm[row]`` (row clamped to ``alast``): the slot ``token * K + k``
    of a permuted row, as an index."""
    slot = t.op("slot", f"memref.load %perm[{t.bin('minui', row, alast)}] : memref<?xi32>")
    return t.op("slot", f"arith.index_cast {slot} : i32 to index")


def _add_rows_f32(
    t: _Text, values, rows: list[str], cols: list[str], r1: str, alast: str, topk: int,
    hidden: int,
) -> None:  # fmt: skip
    """Add the fragments ``values[m][f]`` (c0, c1 in row ``rows[2m]``, c2, c3
    in ``rows[2m + 1]``, columns ``cols[f]`` and the next), each times its
    row's routing weight, into ``Out32[perm[row] // topk]`` (float32 L2
    reductions, 8 bytes each) for rows ``< r1``."""
    base = _address(t, "%Out32", f"memref<?x{hidden}xf32>")
    toks, weights = _row_weights(t, rows, alast, topk)
    for m, per in enumerate(values):
        for h in range(2):
            row, tok, w = rows[2 * m + h], toks[2 * m + h], weights[2 * m + h]
            t.emit(f"scf.if {t.op('ok', f'arith.cmpi ult, {row}, {r1} : index')} {{")
            t.indent += "  "
            row_at = t.mul(tok, hidden)
            for f, c in enumerate(per):
                at = t.op(
                    "at", f"arith.index_cast {t.mul(t.add(row_at, cols[f]), 4)} : index to i64"
                )
                at = t.op("at", f"arith.addi {base}, {at} : i64")
                a, b = (t.op("sw", f"arith.mulf {c[2 * h + q]}, {w} : f32") for q in range(2))
                _asm_ops(
                    t,
                    "red.global.add.v2.f32 [$0], {$1, $2};",
                    [(at, "i64"), (a, "f32"), (b, "f32")],
                )
            t.end()


def _row_weights(t: _Text, rows: list[str], alast: str, topk: int) -> tuple[list[str], list[str]]:
    """For each permuted row (clamped to ``alast``): its token ``perm[row] //
    topk`` and its routing weight ``topk_w[token, perm[row] % topk]``."""
    toks, weights = [], []
    for row in rows:
        slot = _slot(t, row, alast)
        tok = t.bin("divui", slot, topk)
        toks.append(tok)
        weights.append(
            t.op(
                "rw",
                f"memref.load %topk_w[{tok}, {t.bin('remui', slot, topk)}] : memref<?x{topk}xf32>",
            )
        )
    return toks, weights


def _add_rows_f16(
    t: _Text, values, rows: list[str], cols: list[str], r0: str, r1: str, alast: str,
    topk: int, hidden: int,
) -> None:  # fmt: skip
    """Add the fragments ``values[m][f]`` (as :func:`_add_rows_f32`), each
    times its row's routing weight and rounded to half precision, into
    ``Out16[perm[row] // topk]`` for rows ``< r1``: through the staged
    block, 16-byte ``red.global.add.noftz.v4.f16x2`` of whole 8-column
    chunks (as many L2 reductions as a bf16 sum: ``bench/RESULTS.md`` item
    84), else 4-byte ones from the accumulators. (A table of the rows' tokens
    in the free weight ring, one ``perm`` load per row instead of per chunk,
    measured no faster: ``bench/RESULTS.md`` item 92.)"""
    base = _address(t, "%Out16", f"memref<?x{hidden}xf16>")
    toks, weights = _row_weights(t, rows, alast, topk)
    scaled = [
        [
            [t.op("sw", f"arith.mulf {c[q]}, {weights[2 * m + q // 2]} : f32") for q in range(4)]
            for c in per
        ]
        for m, per in enumerate(values)
    ]

    def at(tok: str, col: str) -> str:
        off = t.op(
            "at", f"arith.index_cast {t.mul(t.add(t.mul(tok, hidden), col), 2)} : index to i64"
        )
        return t.op("at", f"arith.addi {base}, {off} : i64")

    def red16(t: _Text, vec: str, local_row: str, col: str) -> None:
        tok = t.bin("divui", _slot(t, t.add(r0, local_row), alast), topk)
        words = t.op("w", f"vector.bitcast {vec} : vector<8xf16> to vector<4xi32>")
        words = [
            t.op("w", f"vector.extract {words}[{q}] : i32 from vector<4xi32>") for q in range(4)
        ]
        _asm_ops(
            t,
            "red.global.add.noftz.v4.f16x2 [$0], {$1, $2, $3, $4};",
            [(at(tok, col), "i64")] + [(w, "i32") for w in words],
        )

    if t.staging is not None and t.staging(
        t, scaled, cols, red16, r1, None, pair=f16_pair, elem="f16"
    ):
        return
    for m, per in enumerate(scaled):
        for h in range(2):
            row = rows[2 * m + h]
            t.emit(f"scf.if {t.op('ok', f'arith.cmpi ult, {row}, {r1} : index')} {{")
            t.indent += "  "
            for f, c in enumerate(per):
                word = t.op(
                    "w", f"vector.bitcast {f16_pair(t, c, h)} : vector<2xf16> to vector<1xi32>"
                )
                word = t.op("w", f"vector.extract {word}[0] : i32 from vector<1xi32>")
                _asm_ops(
                    t,
                    "red.global.add.noftz.f16x2 [$0], $1;",
                    [(at(toks[2 * m + h], cols[f]), "i64"), (word, "i32")],
                )
            t.end()


def _moe_prologue(t: _Text, indptr: str, it: str, block_m: int, block_n: int):
    """Decode tile ``i`` of expert ``e``; opens ``scf.if valid``; returns
    ``(r0, r1, n0, nmb)``: the block's rows, its first column and the
    expert's row blocks."""
    vals, local, cnt = _mma.moe_decode(t, indptr, it, t.add("%e", 1))
    nmb = t.bin("divui", t.add(cnt, block_m - 1), block_m)
    nb = t.op("nb", f"arith.divui {local}, {nmb} : index")
    mb = t.op("mb", f"arith.remui {local}, {nmb} : index")
    r0 = t.add(t.mul(mb, block_m), vals["ro0"])
    r1 = t.bin("minui", t.add(r0, block_m), vals["ro1"])
    n0 = t.mul(nb, block_n)
    return r0, r1, n0, nmb


#: The options of :func:`moe_gate_up` and :func:`moe_down`, with their defaults:
#: ``block_size`` threads; ``warps`` (``(WM, WN)``, the mma core's warp grid,
#: planned when None); ``stages`` of the ring; ``smem_limit`` bytes of it;
#: ``core`` ("mma", "wgmma" or "tma"); ``block_k`` and ``inflight`` (the
#: wgmma core's k-tile and k-tiles in flight); ``stage_output`` (the TMA
#: epilogue through shared memory); ``split_n`` and ``sub_n`` (TMA only);
#: ``short_blocks`` (TMA, 128-row blocks of two warpgroups, no ``split_n``
#: or gather): an expert's only row block, when it has at most 64 rows, runs
#: its k loop on the first warpgroup alone (half the wgmma work; the rows
#: of few-token experts); ``weight_chunk`` (TMA only: 0, or 64, the weights
#: in ``etc.tiles.gemm.chunk_weights``' layout, read through a 4-D map);
#: ``sub_ring`` (with ``sub_n``): the passes share one ring, so the next
#: pass's first k-tiles load during this pass's last ones and its epilogue
#: (``_body_tma(passes=...)``; ``refill="test"``, no gather or ``short_blocks``).
MOE_OPTIONS: dict[str, Any] = dict(
    block_size=256, warps=None, stages=3, smem_limit=SMEM_LIMIT, core="mma", block_k=BLOCK_K,
    inflight=0, stage_output=True, split_n=False, sub_n=None, short_blocks=False,
    weight_chunk=0, refill="wait", gather_tma=False, sub_ring=False,
)  # fmt: skip


@checked_arguments
def moe_gate_up(
    block_m: int,
    block_n: int,
    hidden: int,
    inter: int,
    *,
    experts: int | None = 128,
    name: str = "moe_gate_up_tc",
    gather_topk: int | None = None,
    **options: Any,
) -> DeviceFunction:
    """MoE gate/up tile ``(i, e)``: ``Hb[r, n] = bf16(silu(g) * u)``, ``g = Xp[r] @
    Wgu[e, n]^T``, ``u = Xp[r] @ Wgu[e, inter + n]^T`` for ``n in [nb*BN,
    nb*BN + BN)``. Buffers as :func:`etc.tiles.gemm.moe_gate_up`;
    ``options``: :data:`MOE_OPTIONS`.
    ``split_n`` (``core="tma"``, ``block_m=64``): each warpgroup takes
    ``BN / warpgroups`` of the columns (its gate and up rows loaded next to
    each other) of the same 64 rows. ``sub_n`` (``core="tma"``): the tile
    runs its pipeline once per ``sub_n`` columns of its ``BN`` (one wgmma
    pass holds at most 128 gate/up columns), so one instance, with one
    round of waits and table lookups, covers several passes.
    ``refill`` (``core="tma"``): how thread 0 refills a ring stage,
    :func:`gemm`'s option (``"test"``: without holding its warpgroup).
    ``gather_topk=K`` (``core="tma"``, not ``split_n``): row ``r`` is read
    from the tokens, ``X[perm[r] // K]``, by every thread's ``cp.async``
    (:class:`TmaGather`) instead of from a permuted copy ``Xp``; buffers
    ``(X, Wgu, row_off, gu_indptr, perm, Hb)``. ``gather_tma``: each row by
    a one-row TMA box of ``X`` instead (a map of ``X`` before ``Wgu``'s)."""
    o = _mma.tile_options(name, options, MOE_OPTIONS)
    o |= {"gather_topk": gather_topk, "combine_topk": None, "combine_dtype": "f32"}
    return _moe_tile("gate_up", block_m, block_n, hidden, inter, experts, name, o)


@checked_arguments
def moe_down(
    block_m: int,
    block_n: int,
    hidden: int,
    inter: int,
    *,
    experts: int | None = 128,
    name: str = "moe_down_tc",
    combine_topk: int | None = None,
    combine_dtype: str = "f32",
    **options: Any,
) -> DeviceFunction:
    """MoE down tile ``(i, e)``: ``Yp[r, n] = bf16(Hb[r] @ Wd[e, n]^T)`` for ``n in
    [nb*BN, nb*BN + BN)`` of ``hidden``. Buffers as :func:`etc.tiles.gemm.moe_down`;
    ``options``: :data:`MOE_OPTIONS` (``split_n`` and ``sub_n``, at most 256,
    as in :func:`moe_gate_up`).
    ``combine_topk=K`` (``core="tma"``, not ``split_n``): the tile also does
    the combine's sum. Row ``r`` (slot ``s = perm[r]``) times
    ``topk_w[s // K, s % K]`` is added into the float32 ``Out32[s // K]``
    straight from the accumulators (``red.global.add.v2.f32``, L2
    reductions; ``Out32`` must be zero before the first tile). Buffers
    ``(Hb, Wd, row_off, dn_indptr, perm, topk_w, Out32)``. The order of a
    token's K adds varies between launches, so the float32 sums may differ
    in their last bits. ``combine_dtype="f16"``: the sums are half precision
    instead (``Out16``, ``memref<?xHxf16>``): each weighted row is rounded to
    f16 and added in 16-byte chunks of the staged block
    (``red.global.add.noftz.v4.f16x2``, a quarter of the float32 version's
    reductions); they overflow to infinity past 65504."""
    o = _mma.tile_options(name, options, MOE_OPTIONS)
    if combine_dtype not in _mma.SUMS or (combine_dtype != "f32" and combine_topk is None):
        raise GraphError(
            f"tile '{name}': combine_dtype must be 'f32' or 'f16' (with combine_topk), "
            f"got {combine_dtype!r}"
        )
    o |= {"gather_topk": None, "combine_topk": combine_topk, "combine_dtype": combine_dtype}
    return _moe_tile("down", block_m, block_n, hidden, inter, experts, name, o)


def _moe_tile(
    kind: str, block_m: int, block_n: int, hidden: int, inter: int, experts: int | None,
    name: str, o: dict,
) -> DeviceFunction:  # fmt: skip
    """:func:`moe_gate_up` (``kind="gate_up"``: ``k = hidden``, a gate and an
    up weight row per output column, the SwiGLU epilogue) or :func:`moe_down`
    (``k = inter``, the plain store); ``o``: their options."""
    gate = kind == "gate_up"
    k, n, n_key, per_n = (hidden, inter, "inter", 2) if gate else (inter, hidden, "hidden", 1)
    core, stages, block_size, split_n = o["core"], o["stages"], o["block_size"], o["split_n"]
    _positive(name, n_key, n)
    topk, ctopk = o["gather_topk"], o["combine_topk"]
    for key, value in (("gather_topk", topk), ("combine_topk", ctopk)):
        if value is not None and (core != "tma" or split_n or not is_int(value, 1)):
            raise GraphError(
                f"tile '{name}': {key}={value!r} needs core='tma' without split_n and a "
                "positive top-k"
            )
    groups = _split_groups(name, core, split_n, block_size)
    sub = _sub_columns(name, core, block_n, o["sub_n"])
    if o["refill"] != "wait" and core != "tma":
        raise GraphError(f"tile '{name}': refill={o['refill']!r} needs core='tma'")
    if o["gather_tma"] and topk is None:
        raise GraphError(
            f"tile '{name}': gather_tma copies gathered rows (gather_topk) by TMA; "
            "this tile gathers none"
        )
    ring_passes = block_n // sub if o["sub_ring"] else 1  # one pass: the plain tile
    if ring_passes > 1 and (topk is not None or o["short_blocks"]):
        raise GraphError(
            f"tile '{name}': sub_ring runs the sub_n passes through one ring: no "
            "gather_topk or short_blocks"
        )
    short = o["short_blocks"]
    if short and (
        core != "tma" or split_n or topk is not None or block_m != 128 or block_size != 256
    ):
        raise GraphError(
            f"tile '{name}': short_blocks needs core='tma', block_m=128 over two warpgroups "
            f"(block_size=256), no split_n and no gather; got core={core!r}, block_m={block_m}, "
            f"block_size={block_size}, split_n={split_n}"
        )
    stage_split = 1
    if core == "tma":
        staged = 0
        if ring_passes > 1 and o["stage_output"]:
            # The staging buffer: the pass's block, or as few parts of it (of
            # at least 64 columns) as fit beside the ring.
            ring_bytes = tma_smem_bytes(block_m, per_n * sub, stages)
            while (
                ring_bytes + block_m * sub * 2 // stage_split > o["smem_limit"]
                and sub // (2 * stage_split) >= 64 and not split_n
            ):  # fmt: skip
                stage_split *= 2
            staged = block_m * sub * 2 // stage_split
        plan_tma(name, block_m, per_n * sub, k, block_size, stages, o["smem_limit"], staged)
        wm, wn = 1, groups
    else:
        wm, wn = plan(
            name, block_m, block_n, k, block_size, o["warps"], stages, per_n, o["smem_limit"],
            o["block_k"],
        )  # fmt: skip
    _check_divisible(name, block_n, n, n_key)
    chunk = check_tma_chunk(name, core, o["weight_chunk"], k, per_n * n)
    ed, it = _experts(name, experts)
    # The activations, the weights and the output: types, then argument names.
    if gate:
        at, wt, ot = _mma.gate_up_types(hidden, inter, ed)
        (a, w, out), indptr = ("Xp", "Wgu", "Hb"), "%gu_indptr"
    else:
        at, wt, ot = _mma.down_types(hidden, inter, ed)
        sums = _mma.SUMS[o["combine_dtype"]][0]
        (a, w, out), indptr = ("Hb", "Wd", sums if ctopk else "Yp"), "%dn_indptr"
    t = _Text()
    r0, r1, n0, row_blocks = _moe_prologue(t, indptr, it, block_m, block_n)
    pass_var = t.fresh("pass")
    n_first = n0  # the first pass's columns (the ring's B boxes step on from there)
    if ring_passes == 1:
        n0 = _sub_loop(t, n0, block_n, sub)
    alast = t.op("alast", f"arith.subi {r1}, {t.c(1)} : index")
    cw = sub // wn
    up_off = t.c(inter - block_n) if gate else None

    def a_src(row: str) -> Source:
        return f"%{a}", at, "", t.bin("minui", t.add(r0, row), alast)

    def b_src(row: str) -> Source:
        if not gate:
            return f"%{w}", wt, "%e, ", t.add(n0, row)
        # smem rows [0, BN) gate n0 + row, [BN, 2BN) up inter + n0 + row - BN.
        is_up = t.op("isup", f"arith.cmpi uge, {row}, {t.c(block_n)} : index")
        off = t.op("off", f"arith.select {is_up}, {up_off}, {t.c(0)} : index")
        return f"%{w}", wt, "%e, ", t.add(t.add(n0, row), off)

    def b_pairs(wn_i: str) -> list[str]:
        base = t.mul(wn_i, cw)
        pairs = [t.add(base, 16 * p) for p in range(cw // 16)]
        return pairs + ([t.add(base, block_n + 16 * p) for p in range(cw // 16)] if gate else [])

    def epilogue(t: _Text, acc, rows, wn_i, col_lane) -> None:
        nf = len(acc[0]) // per_n
        n_pass = t.add(n_first, t.mul(pass_var, sub)) if ring_passes > 1 else n0
        wcol = t.add(t.add(n_pass, t.mul(wn_i, cw)), col_lane)
        cols = [t.add(wcol, 8 * f) for f in range(nf)]
        values = _mma.swiglu(t, acc, nf) if gate else acc
        if ctopk is None:
            _store_pairs(t, values, rows, cols, (f"%{out}", ot), r1, None)
        elif out == "Out16":
            _add_rows_f16(t, values, rows, cols, r0, r1, alast, ctopk, hidden)
        else:
            _add_rows_f32(t, values, rows, cols, r1, alast, ctopk, hidden)

    if core == "tma":
        gather = None
        if gate:
            wrow = t.mul("%e", 2 * inter)  # Wgu viewed as (E * 2I) x hidden
            w_map = weight_map(t, "%Wgu_map", chunk)
            if topk is None:
                a_loads = [(_map_pointer(t, "%Xp_map"), r0, block_m)]
            else:
                a_loads = []
                gather = _token_rows(t, r0, r1, alast, topk, hidden, at, tma=o["gather_tma"])
            # Per warpgroup slice (one slice unless split_n): its gate rows, then its up rows.
            b_loads = []
            for g in range(wn):
                b_loads += [
                    (w_map, t.add(t.add(wrow, n0), g * cw), cw),
                    (w_map, t.add(t.add(t.add(wrow, n0), g * cw), inter), cw),
                ]
        else:
            a_loads = [(_map_pointer(t, "%Hb_map"), r0, block_m)]
            b_loads = [(weight_map(t, "%Wd_map", chunk), t.add(t.mul("%e", hidden), n0), sub)]
        second_busy = None
        if short:
            # Rows past the first warpgroup's 64, or other row blocks of the
            # expert: those run in step on neighbouring CTAs and share each
            # weight box through L2; a block that finishes early drifts out of
            # step and the weights are read again (+5 % at T = 4096 on an H200).
            rows = t.bin("subi", r1, r0)
            more = t.op("busy", f"arith.cmpi ugt, {rows}, {t.c(64)} : index")
            shared = t.op("busy", f"arith.cmpi ugt, {row_blocks}, {t.c(1)} : index")
            second_busy = t.op("busy", f"arith.ori {more}, {shared} : i1")
        globals_ = _body_tma(
            t, name=name, k=k, block_m=block_m, b_rows=per_n * sub, block_size=block_size,
            stages=stages, a_loads=a_loads, b_loads=b_loads, r0=r0, epilogue=epilogue,
            stage_output=o["stage_output"], split_n=split_n, gather=gather,
            second_busy=second_busy, refill=o["refill"], passes=ring_passes, b_step=sub,
            pass_var=pass_var, stage_cols=sub, stage_split=stage_split,
        )  # fmt: skip
        if sub != block_n and ring_passes == 1:
            t.end()
    else:
        globals_ = _body(
            t, name=name, k=k, block_m=block_m, b_rows=per_n * block_n, block_size=block_size,
            wm=wm, wn=wn, stages=stages, a_src=a_src, b_src=b_src, b_pairs=b_pairs, r0=r0,
            epilogue=epilogue, core=core, block_k=o["block_k"], inflight=o["inflight"],
        )  # fmt: skip
    t.close()
    gathered = topk is not None
    combined = ctopk is not None
    if gate:
        signature = _mma.gate_up_signature(at, wt, ot, it, gather=gathered)
        rows = f"X[perm / {topk}]" if gathered else "Xp"
        what = f"{name}: Hb = silu({rows} @ Wg^T) * ({rows} @ Wu^T)"
        reference = _mma.gate_up_reference(block_m, block_n, inter, gather_topk=topk, chunk=chunk)
    else:
        cdt = o["combine_dtype"]
        signature = _mma.down_signature(at, wt, ot, it, combine_topk=ctopk, sums_dtype=cdt)
        what = f"{name}: " + (
            f"{out}[perm / K] += w * (Hb @ Wd[e]^T)" if combined else "Yp = Hb @ Wd[e]^T"
        )
        reference = _mma.down_reference(block_m, block_n, combine_topk=ctopk, chunk=chunk)
    # TMA maps after the buffers: the activation's and the weight's.
    if not gathered:
        maps = [(a, 0, block_m)]
    else:  # X's one-row boxes (gather_tma), or no map: cp.async reads the rows
        maps = [("X", 0, 1)] if o["gather_tma"] else []
    maps.append((w, 1, cw if gate else sub, chunk))
    return _moe_finish(
        t, name, signature, globals_,
        f"{what}, expert e, {block_m}x{block_n} blocks, {stages} stages, {_core_text(core, wm, wn)}"
        + (", rows gathered" if gathered else "")
        + (", short blocks on one warpgroup" if short else ""),
        reference, block_size, core, 6 if gathered else 7 if combined else 5, maps,
    )  # fmt: skip

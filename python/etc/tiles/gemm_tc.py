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

from collections.abc import Callable

from ..device import DeviceFunction
from ..errors import GraphError
from . import _mma
from ._mma import check_divisible as _check_divisible
from ._mma import experts_dim as _experts
from ._mma import positive as _positive

__all__ = ["gemm", "moe_gate_up", "moe_down", "plan", "smem_bytes"]

BLOCK_K = 32
SMEM_LIMIT = 48 * 1024

_FRAG = "vector<4x2xbf16>"


def smem_bytes(block_m: int, b_rows: int, stages: int) -> int:
    """Workgroup bytes of a tile: ``stages`` k-tiles of 32 bf16 for ``A`` and ``B``."""
    return stages * (block_m + b_rows) * BLOCK_K * 2


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
        if (rows * BLOCK_K // 8) % block_size:
            raise GraphError(
                f"tile '{name}': {key}={rows}: {rows} rows x 4 16-byte chunks do not "
                f"split evenly over {block_size} threads"
            )
    need = smem_bytes(block_m, b_rows, stages)
    if need > smem_limit:
        raise GraphError(
            f"tile '{name}': {stages} stages of {block_m}x{BLOCK_K} + {b_rows}x{BLOCK_K} "
            f"bf16 need {need} bytes of shared memory, over the limit of {smem_limit}"
        )
    return wm, wn


class _Text(_mma.Text):
    """An MLIR text buffer with fresh SSA names and hoisted index constants."""

    def __init__(self) -> None:
        super().__init__()
        self.consts: set[int] = set()

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
) -> list[str]:
    """The cp.async / ldmatrix / mma.sync main loop and the epilogue call.

    ``a_src(row)``/``b_src(row)``: where block row ``row`` (an index value,
    ``row < BM`` resp. ``< BR``) of ``A``/``B`` comes from (clamped by the
    caller). ``b_pairs(wn)``: the first smem row of each 16-row weight pair
    of warp column ``wn`` (in fragment order). ``epilogue(t, acc[mf][f][4],
    rows, wn, col_lane)`` with ``rows[2*mf + h]`` the output row of half
    ``h`` (unclamped). Returns the workgroup globals."""
    kt_n = k // BLOCK_K
    mf = block_m // (16 * wm)
    a_t = f"memref<{stages}x{block_m}x{BLOCK_K}xbf16, #gpu.address_space<workgroup>>"
    b_t = f"memref<{stages}x{b_rows}x{BLOCK_K}xbf16, #gpu.address_space<workgroup>>"
    globals_ = [
        f'memref.global "private" @{name}__smem_a : {a_t} {{alignment = 128 : i64}}',
        f'memref.global "private" @{name}__smem_b : {b_t} {{alignment = 128 : i64}}',
    ]
    sa = t.op("sa", f"memref.get_global @{name}__smem_a : {a_t}")
    sb = t.op("sb", f"memref.get_global @{name}__smem_b : {b_t}")
    tid = t.op("tid", "gpu.thread_id x")
    warp = t.bin("divui", tid, 32)
    lane = t.bin("remui", tid, 32)
    wm_i = t.bin("remui", warp, wm) if wm > 1 else t.c(0)
    wn_i = t.bin("divui", warp, wm) if wm > 1 else warp
    # -- copies: thread tid moves chunk tid % 4 of rows tid/4 + j*(threads/4).
    quad = t.bin("remui", tid, 4)
    crow = t.bin("divui", tid, 4)
    key = t.bin("andi", t.bin("divui", tid, 8), 3)
    scol = t.mul(t.bin("xori", quad, key), 8)  # swizzled smem column
    gcol = t.mul(quad, 8)  # global column within the k-tile
    step = block_size // 4
    copies = []  # (smem, smem type, smem row, source)
    for smem, st, rows, src in ((sa, a_t, block_m, a_src), (sb, b_t, b_rows, b_src)):
        for j in range(rows // step):
            r = t.add(crow, j * step)
            copies.append((smem, st, r, src(r)))

    def issue(kt: str | int, stage: str | int) -> None:
        """cp.async k-tile ``kt`` of A and B into ``stage``."""
        if isinstance(kt, int):
            k0 = t.c(kt * BLOCK_K)
        else:
            k0 = t.mul(kt, BLOCK_K)
        col = t.add(k0, gcol)
        st_i = t.c(stage) if isinstance(stage, int) else stage
        for smem, st, r, (mem, mt, prefix, grow) in copies:
            t.op(
                "cp",
                f"nvgpu.device_async_copy {mem}[{prefix}{grow}, {col}], "
                f"{smem}[{st_i}, {r}, {scol}], 8 {{bypassL1}} : {mt} to {st}",
            )

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
    types = ", ".join(["f32"] * nacc)
    inits = ", ".join(f"%acc_{q} = %fzero" for q in range(nacc))
    res = t.fresh("accs")
    t.emit(
        f"{res}:{nacc} = scf.for %kt = {t.c(0)} to {t.c(kt_n)} step {t.c(1)} "
        f"iter_args({inits}) -> ({types}) {{"
    )
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


def _words(t: _Text, frag: str) -> list[str]:
    """The four i32 registers of an ``ldmatrix.x4`` result (bf16 pairs)."""
    out = []
    for q in range(4):
        p = t.op("p", f"vector.extract {frag}[{q}] : vector<2xbf16> from {_FRAG}")
        w = t.op("w", f"vector.bitcast {p} : vector<2xbf16> to vector<1xi32>")
        out.append(t.op("r", f"vector.extract {w}[0] : i32 from vector<1xi32>"))
    return out


def _store_pairs(
    t: _Text,
    values: list[list[list[str]]],
    rows: list[str],
    cols: list[str],
    out: tuple[str, str],
    r1: str,
    n_limit: str | None,
) -> None:
    """Store ``values[m][f]`` (4 f32) as bf16 pairs at rows ``rows[2m]``
    (c0, c1) and ``rows[2m+1]`` (c2, c3), column ``cols[f]``, where
    ``row < r1`` (and ``col < n_limit``)."""
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
                v = t.op("v", f"vector.from_elements {c[2 * h]}, {c[2 * h + 1]} : vector<2xf32>")
                hv = t.op("h", f"arith.truncf {v} : vector<2xf32> to vector<2xbf16>")
                t.emit(f"scf.if {ok} {{")
                t.emit(
                    f"  vector.store {hv}, {mem}[{rows[2 * m + h]}, {cols[f]}] "
                    f"{{alignment = 4 : i64}} : {mtype}, vector<2xbf16>"
                )
                t.emit("}")


def _finish(
    t: _Text, name: str, signature: str, globals_: list[str], comment: str, reference, block_size
) -> DeviceFunction:
    source = t.source(name, signature, globals_, comment)
    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


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
) -> DeviceFunction:
    """Dense tile ``(i, j)``: ``C[i*BM:, j*BN:] = bf16(A @ B^T)`` (fp32 accumulation).

    ``A: memref<?xKxbf16>`` (M rows), ``B: memref<?xKxbf16>`` (N rows),
    ``C: memref<?x?xbf16>`` (M x N, N even). Grid ``(ceil(M/BM),
    ceil(N/BN))``; rows and columns past ``M``/``N`` are clipped."""
    wm, wn = plan(name, block_m, block_n, k, block_size, warps, stages, 1, smem_limit)
    ab, ct = _mma.dense_types(k)
    t = _Text()
    m_rows = t.op("M", f"memref.dim %A, {t.c(0)} : {ab}")
    n_rows = t.op("N", f"memref.dim %B, {t.c(0)} : {ab}")
    r0 = t.mul("%i", block_m)
    r1 = t.bin("minui", t.add(r0, block_m), m_rows)
    n0 = t.mul("%j", block_n)
    valid = _mma.dense_valid(t, r0, n0, m_rows, n_rows)
    t.emit(f"scf.if {valid} {{")
    t.indent += "  "
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
        epilogue=epilogue,
    )  # fmt: skip
    t.close()
    return _finish(
        t, name, _mma.dense_signature(ab, ct), globals_,
        f"{name}: C = A @ B^T, bf16, {block_m}x{block_n}x{BLOCK_K} blocks, {stages} stages, "
        f"{wm}x{wn} warps", _mma.dense_reference(block_m, block_n), block_size,
    )  # fmt: skip


def _moe_prologue(t: _Text, indptr: str, it: str, block_m: int, block_n: int):
    """Decode tile ``i`` of expert ``e``; opens ``scf.if valid``; returns ``(r0, r1, n0)``."""
    vals, local, cnt = _mma.moe_decode(t, indptr, it, t.add("%e", 1))
    nmb = t.bin("divui", t.add(cnt, block_m - 1), block_m)
    nb = t.op("nb", f"arith.divui {local}, {nmb} : index")
    mb = t.op("mb", f"arith.remui {local}, {nmb} : index")
    r0 = t.add(t.mul(mb, block_m), vals["ro0"])
    r1 = t.bin("minui", t.add(r0, block_m), vals["ro1"])
    n0 = t.mul(nb, block_n)
    return r0, r1, n0


def moe_gate_up(
    block_m: int,
    block_n: int,
    hidden: int,
    inter: int,
    *,
    experts: int | None = 128,
    name: str = "moe_gate_up_tc",
    block_size: int = 256,
    warps: tuple[int, int] | None = None,
    stages: int = 3,
    smem_limit: int = SMEM_LIMIT,
) -> DeviceFunction:
    """MoE gate/up tile ``(i, e)``: ``Hb[r, n] = bf16(silu(g) * u)``, ``g = Xp[r] @
    Wgu[e, n]^T``, ``u = Xp[r] @ Wgu[e, inter + n]^T`` for ``n in [nb*BN,
    nb*BN + BN)``. Buffers as :func:`etc.tiles.gemm.moe_gate_up`."""
    _positive(name, "inter", inter)
    wm, wn = plan(name, block_m, block_n, hidden, block_size, warps, stages, 2, smem_limit)
    _check_divisible(name, block_n, inter, "inter")
    ed, it = _experts(name, experts)
    xt, wt, ht = _mma.gate_up_types(hidden, inter, ed)
    t = _Text()
    r0, r1, n0 = _moe_prologue(t, "%gu_indptr", it, block_m, block_n)
    alast = t.op("alast", f"arith.subi {r1}, {t.c(1)} : index")
    cw = block_n // wn
    up_off = t.c(inter - block_n)

    def a_src(row: str) -> Source:
        return "%Xp", xt, "", t.bin("minui", t.add(r0, row), alast)

    def b_src(row: str) -> Source:
        # smem rows [0, BN) gate n0 + row, [BN, 2BN) up inter + n0 + row - BN.
        is_up = t.op("isup", f"arith.cmpi uge, {row}, {t.c(block_n)} : index")
        off = t.op("off", f"arith.select {is_up}, {up_off}, {t.c(0)} : index")
        return "%Wgu", wt, "%e, ", t.add(t.add(n0, row), off)

    def b_pairs(wn_i: str) -> list[str]:
        base = t.mul(wn_i, cw)
        gate = [t.add(base, 16 * p) for p in range(cw // 16)]
        return gate + [t.add(base, block_n + 16 * p) for p in range(cw // 16)]

    def epilogue(t: _Text, acc, rows, wn_i, col_lane) -> None:
        nf = len(acc[0]) // 2
        wcol = t.add(t.add(n0, t.mul(wn_i, cw)), col_lane)
        cols = [t.add(wcol, 8 * f) for f in range(nf)]
        _store_pairs(t, _mma.swiglu(t, acc, nf), rows, cols, ("%Hb", ht), r1, None)

    globals_ = _body(
        t, name=name, k=hidden, block_m=block_m, b_rows=2 * block_n, block_size=block_size,
        wm=wm, wn=wn, stages=stages, a_src=a_src, b_src=b_src, b_pairs=b_pairs, r0=r0,
        epilogue=epilogue,
    )  # fmt: skip
    t.close()
    return _finish(
        t, name, _mma.gate_up_signature(xt, wt, ht, it), globals_,
        f"{name}: Hb = silu(Xp @ Wg^T) * (Xp @ Wu^T), expert e, {block_m}x{block_n} blocks, "
        f"{stages} stages, {wm}x{wn} warps", _mma.gate_up_reference(block_m, block_n, inter),
        block_size,
    )  # fmt: skip


def moe_down(
    block_m: int,
    block_n: int,
    hidden: int,
    inter: int,
    *,
    experts: int | None = 128,
    name: str = "moe_down_tc",
    block_size: int = 256,
    warps: tuple[int, int] | None = None,
    stages: int = 3,
    smem_limit: int = SMEM_LIMIT,
) -> DeviceFunction:
    """MoE down tile ``(i, e)``: ``Yp[r, n] = bf16(Hb[r] @ Wd[e, n]^T)`` for ``n in
    [nb*BN, nb*BN + BN)`` of ``hidden``. Buffers as :func:`etc.tiles.gemm.moe_down`."""
    _positive(name, "hidden", hidden)
    wm, wn = plan(name, block_m, block_n, inter, block_size, warps, stages, 1, smem_limit)
    _check_divisible(name, block_n, hidden, "hidden")
    ed, it = _experts(name, experts)
    ht, wt, yt = _mma.down_types(hidden, inter, ed)
    t = _Text()
    r0, r1, n0 = _moe_prologue(t, "%dn_indptr", it, block_m, block_n)
    alast = t.op("alast", f"arith.subi {r1}, {t.c(1)} : index")
    cw = block_n // wn

    def a_src(row: str) -> Source:
        return "%Hb", ht, "", t.bin("minui", t.add(r0, row), alast)

    def b_src(row: str) -> Source:
        return "%Wd", wt, "%e, ", t.add(n0, row)

    def b_pairs(wn_i: str) -> list[str]:
        base = t.mul(wn_i, cw)
        return [t.add(base, 16 * p) for p in range(cw // 16)]

    def epilogue(t: _Text, acc, rows, wn_i, col_lane) -> None:
        wcol = t.add(t.add(n0, t.mul(wn_i, cw)), col_lane)
        cols = [t.add(wcol, 8 * f) for f in range(len(acc[0]))]
        _store_pairs(t, acc, rows, cols, ("%Yp", yt), r1, None)

    globals_ = _body(
        t, name=name, k=inter, block_m=block_m, b_rows=block_n, block_size=block_size, wm=wm,
        wn=wn, stages=stages, a_src=a_src, b_src=b_src, b_pairs=b_pairs, r0=r0,
        epilogue=epilogue,
    )  # fmt: skip
    t.close()
    return _finish(
        t, name, _mma.down_signature(ht, wt, yt, it), globals_,
        f"{name}: Yp = Hb @ Wd[e]^T, expert e, {block_m}x{block_n} blocks, {stages} stages, "
        f"{wm}x{wn} warps", _mma.down_reference(block_m, block_n), block_size,
    )  # fmt: skip

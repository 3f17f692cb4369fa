"""Tiles for tensor-parallel GEMMs fused with their collectives (graphs that span ranks).

Every buffer is row-major bf16; ``R`` ranks split ``S`` rows into ``R`` chunks of
``S / R`` rows (rank ``r`` owns chunk ``r``). A peer table (``memref<?xi64>``, see
:meth:`etc.Graph.peer_table`) holds every rank's address of a buffer; tiles write
peers' buffers through it with plain stores (peer access), and the graph's ranked
events then tell the owner that the data has landed.

* :func:`gemm_to_peer` (GEMM + Reduce-Scatter): coords ``(d, i, j)``, args ``(rank, A,
  B, staging_peers)``: the partial product ``A[d*S/R + i*BM :, :] @ B[j*BN :, :]^T`` of
  the rows rank ``d`` owns goes to rank ``d``'s ``staging[rank, i*BM :, j*BN :]``
  (``staging``: ``(R, S/R, N)``, one slot per source rank).
* :func:`gemm_reduce_own` (GEMM + Reduce-Scatter, the reduction fused): coords ``(i,
  j)``, args ``(rank, A, B, staging, out)``: this rank's own rows of the product plus
  the peers' partials from ``staging``, into ``out`` (then :func:`gemm_to_peer` runs
  with ``skip_own`` and no :func:`reduce_slots` is needed).
* :func:`reduce_slots`: coords ``(i, j)``, args ``(staging, out)``:
  ``out[i*BM :, j*BN :] = bf16(sum over slots of staging[:, i*BM :, j*BN :])`` (fp32 sum,
  slots in rank order).
* :func:`copy_to_peers` (All-Gather): coords ``(d, t, p)``, args ``(rank, A,
  full_peers)``: part ``p`` of rows ``[t*CB, (t+1)*CB)`` of this rank's ``A``
  (``S/R`` rows) goes to the same rows after ``rank*S/R`` of rank ``d``'s
  ``full`` (``S`` rows).
* :func:`gemm_chunk` (the GEMM after the All-Gather): coords ``(s, i, j)``, args ``(A, B,
  C)``: ``C[s*S/R + i*BM :, j*BN :] = bf16(A[same rows] @ B[j*BN :]^T)``, ``A``: ``(S, K)``,
  ``R = dim(A, 0) / rows_per_rank`` given as ``S/R`` through the chunk coordinate.

Shapes must divide evenly: ``S/R`` by the row block, ``N`` by ``BN``, ``K`` by 32 (the
GEMM tiles are :mod:`etc.tiles.gemm_tc`'s main loop with another prologue/epilogue).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..dtypes import bf16_to_f32, f32_to_bf16
from . import _mma
from .gemm_tc import (
    SMEM_LIMIT,
    Source,
    _body,
    _body_tma,
    _finish,
    _map_pointer,
    _Text,
    bf16_pair,
    finish_tma,
    plan,
    plan_tma,
)

__all__ = ["gemm_to_peer", "gemm_reduce_own", "reduce_slots", "copy_to_peers", "gemm_chunk"]


def _gemm_prologue(t: _Text, k: int, block_m: int, block_n: int, row0: str):
    """Loads of block rows from ``%A`` (from ``row0``) and ``%B`` (from ``%j * BN``)."""
    ab = f"memref<?x{k}xbf16>"
    n0 = t.mul("%j", block_n)

    def a_src(row: str) -> Source:
        return "%A", ab, "", t.add(row0, row)

    def b_src(row: str) -> Source:
        return "%B", ab, "", t.add(n0, row)

    return ab, n0, a_src, b_src


def _plan(name, block_m, block_n, k, block_size, warps, stages, smem_limit, block_k, core):
    """The warp grid; ``core="tma"`` checks the TMA configuration instead (one warp column)."""
    if core == "tma":
        plan_tma(name, block_m, block_n, k, block_size, stages, smem_limit)
        return 1, 1
    return plan(name, block_m, block_n, k, block_size, warps, stages, 1, smem_limit, block_k)


def _gemm_body(
    t, name, k, block_m, block_n, block_size, wm, wn, stages, a_src, b_src, r0, n0, epilogue,
    core, inflight, block_k,
) -> list[str]:  # fmt: skip
    """The GEMM main loop on ``%A`` rows from ``r0`` and ``%B`` rows from ``n0``:
    ``etc.tiles.gemm_tc``'s cp.async ring or, for ``core="tma"``, its TMA pipeline
    (``%A_map`` / ``%B_map``)."""
    if core == "tma":
        return _body_tma(
            t, name=name, k=k, block_m=block_m, b_rows=block_n, block_size=block_size,
            stages=stages, a_loads=[(_map_pointer(t, "%A_map"), r0, block_m)],
            b_loads=[(_map_pointer(t, "%B_map"), n0, block_n)], r0=r0, epilogue=epilogue,
        )  # fmt: skip
    return _body(
        t, name=name, k=k, block_m=block_m, b_rows=block_n, block_size=block_size, wm=wm,
        wn=wn, stages=stages, a_src=a_src, b_src=b_src, b_pairs=_pairs(t, block_n, wn), r0=r0,
        epilogue=epilogue, core=core, inflight=inflight, block_k=block_k,
    )  # fmt: skip


def _gemm_finish(
    t, name, signature, globals_, comment, reference, block_size, core, block_m, block_n,
    a_index: int = 0, buffers: int | None = None,
) -> DeviceFunction:  # fmt: skip
    """The tile; with ``core="tma"`` it takes the maps of ``A`` and ``B`` (arguments
    ``a_index`` and ``a_index + 1`` after the coordinates; ``buffers`` arguments
    in all, ``a_index + 3`` unless given) as two more trailing arguments."""
    if core != "tma":
        return _finish(t, name, signature, globals_, comment, reference, block_size)
    maps = [("A", a_index, block_m), ("B", a_index + 1, block_n)]
    buffers = a_index + 3 if buffers is None else buffers
    return finish_tma(t, name, signature, globals_, comment, reference, block_size, buffers, maps)


def _staged(t: _Text, acc, cols: list[str], store, r0: str, block_m: int) -> bool:
    """A TMA tile's block through shared memory into 16-byte ``store`` calls
    (``gemm_tc._staged_store``); False when the tile has no staging (other
    cores) or the block does not fit it."""
    if t.staging is None:
        return False
    return t.staging(t, acc, cols, store, t.add(r0, block_m), None)


def _pairs(t: _Text, block_n: int, wn: int) -> Callable[[str], list[str]]:
    cw = block_n // wn

    def b_pairs(wn_i: str) -> list[str]:
        base = t.mul(wn_i, cw)
        return [t.add(base, 16 * p) for p in range(cw // 16)]

    return b_pairs


def _cols(t: _Text, n0: str, block_n: int, wn: int, wn_i: str, col_lane: str, nf: int):
    wcol = t.add(t.add(n0, t.mul(wn_i, block_n // wn)), col_lane)
    return [t.add(wcol, 8 * f) for f in range(nf)]


@checked_arguments
def gemm_to_peer(
    block_m: int = 128,
    block_n: int = 128,
    k: int = 2048,
    *,
    name: str = "gemm_to_peer",
    block_size: int = 256,
    warps: tuple[int, int] | None = None,
    stages: int = 3,
    smem_limit: int = SMEM_LIMIT,
    core: str = "mma",
    inflight: int = 0,
    block_k: int = 32,
    skip_own: bool = False,
    coords: str = "dij",
) -> DeviceFunction:
    """GEMM + Reduce-Scatter producer tile (see the module docstring).
    ``skip_own``: the instances of this rank's own rows (``d == rank``) do
    nothing (:func:`gemm_reduce_own` computes them, adding the peers'
    partials in its epilogue). ``coords``: the order of the coordinates
    ``d``, ``i``, ``j`` in the signature (the task grid's order)."""
    leading = _coords(name, coords, "dij")
    wm, wn = _plan(name, block_m, block_n, k, block_size, warps, stages, smem_limit, block_k, core)
    t = _Text()
    if skip_own:
        peer = t.op("peer", "arith.cmpi ne, %d, %rank : index")
        t.emit(f"scf.if {peer} {{")
        t.indent += "  "
    ab = f"memref<?x{k}xbf16>"
    m_rows = t.op("M", f"memref.dim %A, {t.c(0)} : {ab}")
    n_cols = t.op("N", f"memref.dim %B, {t.c(0)} : {ab}")
    ranks = t.op("R", f"memref.dim %peers, {t.c(0)} : memref<?xi64>")
    rpr = t.bin("divui", m_rows, ranks)  # rows per rank
    local0 = t.mul("%i", block_m)
    r0 = t.add(t.op("x", f"arith.muli %d, {rpr} : index"), local0)
    _, n0, a_src, b_src = _gemm_prologue(t, k, block_m, block_n, r0)
    raw = t.op("praw", "memref.load %peers[%d] : memref<?xi64>")
    # Rank d's staging slot of this rank: (rank * rpr) rows of N columns in.
    slot = t.op("x", f"arith.muli %rank, {rpr} : index")

    def peer_store(t: _Text, vec: str, lrow: str, col: str) -> None:
        """16 bytes of block row ``lrow`` to rank d's slot (staged epilogue)."""
        base = t.op("pbase", f"llvm.inttoptr {raw} : i64 to !llvm.ptr")
        srow = t.add(t.add(slot, local0), lrow)
        elem = t.add(t.op("x", f"arith.muli {srow}, {n_cols} : index"), col)
        e64 = t.op("e64", f"arith.index_cast {elem} : index to i64")
        ptr = t.op("p", f"llvm.getelementptr {base}[{e64}] : (!llvm.ptr, i64) -> !llvm.ptr, bf16")
        t.emit(f"llvm.store {vec}, {ptr} {{alignment = 16 : i64}} : vector<8xbf16>, !llvm.ptr")

    def epilogue(t: _Text, acc, rows, wn_i, col_lane) -> None:
        cols = _cols(t, n0, block_n, wn, wn_i, col_lane, len(acc[0]))
        # TMA tiles: the block through shared memory, 16-byte row stores to the
        # peer (whole lines over NVLink instead of 4-byte pieces).
        if _staged(t, acc, cols, peer_store, r0, block_m):
            return
        base = t.op("pbase", f"llvm.inttoptr {raw} : i64 to !llvm.ptr")
        for m, per in enumerate(acc):
            for h in range(2):
                # rows[] are global rows r0 + offset; rank d's slot row is local.
                local = t.op("x", f"arith.subi {rows[2 * m + h]}, {r0} : index")
                srow = t.add(t.add(slot, local0), local)
                line = t.op("x", f"arith.muli {srow}, {n_cols} : index")
                for f, c in enumerate(per):
                    elem = t.add(line, cols[f])
                    e64 = t.op("e64", f"arith.index_cast {elem} : index to i64")
                    ptr = t.op(
                        "p",
                        f"llvm.getelementptr {base}[{e64}] : (!llvm.ptr, i64) -> !llvm.ptr, bf16",
                    )
                    hv = bf16_pair(t, c, h)
                    t.emit(
                        f"llvm.store {hv}, {ptr} {{alignment = 4 : i64}} : vector<2xbf16>, !llvm.ptr"
                    )

    globals_ = _gemm_body(
        t, name, k, block_m, block_n, block_size, wm, wn, stages, a_src, b_src, r0, n0,
        epilogue, core, inflight, block_k,
    )  # fmt: skip
    if skip_own:
        t.end()
    signature = leading + f"%rank: index, %A: {ab}, %B: {ab}, %peers: memref<?xi64>"

    def reference(*args) -> None:
        at = dict(zip(coords, args[:3], strict=True))
        d, i, j = at["d"], at["i"], at["j"]
        rank, A, B, peers = args[3:]
        if skip_own and d == rank:
            return
        ranks_n = len(peers)
        rows = A.shape[0] // ranks_n
        rs = slice(d * rows + i * block_m, d * rows + (i + 1) * block_m)
        cs = slice(j * block_n, (j + 1) * block_n)
        out = f32_to_bf16(_mma.bf16_matmul(A[rs], B[cs]))
        peers[d][rank, i * block_m : (i + 1) * block_m, cs] = out

    return _gemm_finish(
        t, name, signature, globals_,
        f"{name}: partial A @ B^T of rank d's rows to rank d's staging slot, "
        f"{block_m}x{block_n} blocks, {stages} stages, {wm}x{wn} warps",
        reference, block_size, core, block_m, block_n, a_index=1,
    )  # fmt: skip


@checked_arguments
def gemm_reduce_own(
    block_m: int = 128,
    block_n: int = 128,
    k: int = 2048,
    *,
    name: str = "gemm_reduce_own",
    block_size: int = 256,
    warps: tuple[int, int] | None = None,
    stages: int = 3,
    smem_limit: int = SMEM_LIMIT,
    core: str = "mma",
    inflight: int = 0,
    block_k: int = 32,
) -> DeviceFunction:
    """GEMM + Reduce-Scatter, this rank's own rows with the reduction in the
    epilogue: coords ``(i, j)``, args ``(rank, A, B, staging, out)``.
    ``out[i*BM :, j*BN :] = bf16(sum over ranks s of P_s)`` where ``P_rank =
    bf16(A[rank*S/R + i*BM :] @ B[j*BN :]^T)`` (this tile's block) and ``P_s
    = staging[s, i*BM :, j*BN :]`` for the others (their partials, written by
    their :func:`gemm_to_peer` tiles): fp32 sum from zero in rank order,
    the same values and order as :func:`reduce_slots`, so the result is the
    same bit for bit. The task waits for the peers' partials before it
    starts; run it after the peer tiles (``gemm_to_peer(skip_own=True)``)."""
    wm, wn = _plan(name, block_m, block_n, k, block_size, warps, stages, smem_limit, block_k, core)
    t = _Text()
    ab, st, ot = f"memref<?x{k}xbf16>", "memref<?x?x?xbf16>", "memref<?x?xbf16>"
    slots = t.op("R", f"memref.dim %staging, {t.c(0)} : {st}")
    rpr = t.op("rpr", f"memref.dim %staging, {t.c(1)} : {st}")
    local0 = t.mul("%i", block_m)
    r0 = t.add(t.op("x", f"arith.muli %rank, {rpr} : index"), local0)
    _, n0, a_src, b_src = _gemm_prologue(t, k, block_m, block_n, r0)

    def reduce_store(t: _Text, own: str, lrow: str, col: str, width: int) -> None:
        """out[local0 + lrow, col:col+width] = bf16(sum of the slots, own at rank)."""
        vt, ft = f"vector<{width}xbf16>", f"vector<{width}xf32>"
        row = t.add(local0, lrow)
        mine = t.op("own", f"arith.extf {own} : {vt} to {ft}")
        zero = t.op("z", f"arith.constant dense<0.0> : {ft}")
        s_iv, acc = t.fresh("s"), t.fresh("acc")
        total = t.fresh("sum")
        t.emit(
            f"{total} = scf.for {s_iv} = {t.c(0)} to {slots} step {t.c(1)} "
            f"iter_args({acc} = {zero}) -> ({ft}) {{"
        )
        outer = t.indent
        t.indent += "  "
        is_own = t.op("me", f"arith.cmpi eq, {s_iv}, %rank : index")
        part = t.fresh("part")
        t.emit(f"{part} = scf.if {is_own} -> ({ft}) {{")
        t.emit(f"  scf.yield {mine} : {ft}")
        t.emit("} else {")
        t.indent += "  "
        x = t.op("x", f"vector.load %staging[{s_iv}, {row}, {col}] : {st}, {vt}")
        xf = t.op("xf", f"arith.extf {x} : {vt} to {ft}")
        t.emit(f"scf.yield {xf} : {ft}")
        t.indent = outer + "  "
        t.emit("}")
        added = t.op("a", f"arith.addf {acc}, {part} : {ft}")
        t.emit(f"scf.yield {added} : {ft}")
        t.indent = outer
        t.emit("}")
        y = t.op("y", f"arith.truncf {total} : {ft} to {vt}")
        t.emit(f"vector.store {y}, %out[{row}, {col}] : {ot}, {vt}")

    def staged_store(t: _Text, vec: str, lrow: str, col: str) -> None:
        reduce_store(t, vec, lrow, col, 8)

    def epilogue(t: _Text, acc, rows, wn_i, col_lane) -> None:
        cols = _cols(t, n0, block_n, wn, wn_i, col_lane, len(acc[0]))
        if _staged(t, acc, cols, staged_store, r0, block_m):
            return
        for m, per in enumerate(acc):
            for h in range(2):
                local = t.op("x", f"arith.subi {rows[2 * m + h]}, {r0} : index")
                for f, c in enumerate(per):
                    reduce_store(t, bf16_pair(t, c, h), local, cols[f], 2)

    globals_ = _gemm_body(
        t, name, k, block_m, block_n, block_size, wm, wn, stages, a_src, b_src, r0, n0,
        epilogue, core, inflight, block_k,
    )  # fmt: skip
    signature = (
        f"%i: index, %j: index, %rank: index, %A: {ab}, %B: {ab}, %staging: {st}, %out: {ot}"
    )

    def reference(i: int, j: int, rank: int, A, B, staging, out) -> None:
        rows = staging.shape[1]
        rs = slice(rank * rows + i * block_m, rank * rows + (i + 1) * block_m)
        ls = slice(i * block_m, (i + 1) * block_m)
        cs = slice(j * block_n, (j + 1) * block_n)
        own = f32_to_bf16(_mma.bf16_matmul(A[rs], B[cs]))
        total = np.zeros((block_m, block_n), dtype=np.float32)
        for s in range(staging.shape[0]):
            total += bf16_to_f32(own if s == rank else staging[s, ls, cs])
        out[ls, cs] = f32_to_bf16(total)

    return _gemm_finish(
        t, name, signature, globals_,
        f"{name}: this rank's rows of A @ B^T plus the peers' partials, {block_m}x{block_n} "
        f"blocks, {stages} stages, {wm}x{wn} warps",
        reference, block_size, core, block_m, block_n, a_index=1, buffers=5,
    )  # fmt: skip


@checked_arguments
def gemm_chunk(
    block_m: int = 128,
    block_n: int = 128,
    k: int = 2048,
    *,
    name: str = "gemm_chunk",
    block_size: int = 256,
    warps: tuple[int, int] | None = None,
    stages: int = 3,
    smem_limit: int = SMEM_LIMIT,
    core: str = "mma",
    inflight: int = 0,
    block_k: int = 32,
    chunks: str = "all",
    coords: str | None = None,
) -> DeviceFunction:
    """All-Gather + GEMM consumer tile (see the module docstring). The rows per chunk
    are ``dim(A, 0) / dim(C_chunks)``: ``C`` is ``memref<?x?x?xbf16>`` viewed as
    ``(R, S/R, N)`` (the output ``(S, N)`` reshaped), so the tile learns ``S/R``.

    ``chunks``: ``"all"`` (coords ``(s, i, j)``, args ``(A, B, C)``, ``A`` the
    gathered rows); ``"peers"`` (coords ``(s, i, j)``, args ``(rank, A, B,
    C)``: chunk ``s == rank`` does nothing); ``"own"`` (coords ``(i, j)``,
    args ``(rank, A, B, C)``, ``A`` this rank's own ``S/R`` rows: chunk
    ``rank`` straight from them, with no wait for a copy). ``coords``: the
    order of those coordinates in the signature (the task grid's order;
    ``"sji"``: a chunk's row blocks are the innermost)."""
    if chunks not in ("all", "peers", "own"):
        raise ValueError(f"{name}: chunks must be 'all', 'peers' or 'own', got {chunks!r}")
    letters = "ij" if chunks == "own" else "sij"
    coords = coords or letters
    leading = _coords(name, coords, letters)
    wm, wn = _plan(name, block_m, block_n, k, block_size, warps, stages, smem_limit, block_k, core)
    t = _Text()
    if chunks == "peers":
        peer = t.op("peer", "arith.cmpi ne, %s, %rank : index")
        t.emit(f"scf.if {peer} {{")
        t.indent += "  "
    ct = "memref<?x?x?xbf16>"
    chunk = "%rank" if chunks == "own" else "%s"  # C's chunk
    rpr = t.op("rpr", f"memref.dim %C, {t.c(1)} : {ct}")
    local0 = t.mul("%i", block_m)
    # The A rows: the gathered buffer's chunk s, or (own) this rank's rows.
    r0 = local0 if chunks == "own" else t.add(t.op("x", f"arith.muli %s, {rpr} : index"), local0)
    ab, n0, a_src, b_src = _gemm_prologue(t, k, block_m, block_n, r0)

    def chunk_store(t: _Text, vec: str, lrow: str, col: str) -> None:
        row = t.add(local0, lrow)
        t.emit(
            f"vector.store {vec}, %C[{chunk}, {row}, {col}] {{alignment = 16 : i64}} : {ct}, "
            "vector<8xbf16>"
        )

    def epilogue(t: _Text, acc, rows, wn_i, col_lane) -> None:
        cols = _cols(t, n0, block_n, wn, wn_i, col_lane, len(acc[0]))
        if _staged(t, acc, cols, chunk_store, r0, block_m):
            return
        for m, per in enumerate(acc):
            for h in range(2):
                local = t.op("x", f"arith.subi {rows[2 * m + h]}, {r0} : index")
                lrow = t.add(local0, local)
                for f, c in enumerate(per):
                    hv = bf16_pair(t, c, h)
                    t.emit(
                        f"vector.store {hv}, %C[{chunk}, {lrow}, {cols[f]}] "
                        f"{{alignment = 4 : i64}} : {ct}, vector<2xbf16>"
                    )

    globals_ = _gemm_body(
        t, name, k, block_m, block_n, block_size, wm, wn, stages, a_src, b_src, r0, n0,
        epilogue, core, inflight, block_k,
    )  # fmt: skip
    if chunks == "peers":
        t.end()
    buffers = f"%A: {ab}, %B: {ab}, %C: {ct}"
    signature = (
        leading
        + {
            "all": buffers,
            "peers": f"%rank: index, {buffers}",
            "own": f"%rank: index, {buffers}",
        }[chunks]
    )

    def block(s: int, i: int, j: int, a_row0: int, A, B, C) -> None:
        rs = slice(a_row0 + i * block_m, a_row0 + (i + 1) * block_m)
        cs = slice(j * block_n, (j + 1) * block_n)
        C[s, i * block_m : (i + 1) * block_m, cs] = f32_to_bf16(_mma.bf16_matmul(A[rs], B[cs]))

    def reference(*args) -> None:
        at = dict(zip(coords, args, strict=False))
        rest = args[len(coords) :]
        i, j = at["i"], at["j"]
        if chunks == "all":
            s, (A, B, C) = at["s"], rest
        elif chunks == "peers":
            s, (rank, A, B, C) = at["s"], rest
            if s == rank:
                return
        else:
            s, A, B, C = rest  # own: chunk `rank`, A holds only its rows
            block(s, i, j, 0, A, B, C)
            return
        block(s, i, j, s * C.shape[1], A, B, C)

    return _gemm_finish(
        t, name, signature, globals_,
        f"{name}: C = A @ B^T for chunk s of the gathered rows ({chunks}), {block_m}x{block_n} "
        f"blocks, {stages} stages, {wm}x{wn} warps",
        reference, block_size, core, block_m, block_n,
        a_index=0 if chunks == "all" else 1, buffers=3 if chunks == "all" else 4,
    )  # fmt: skip


def _coords(name: str, coords: str, letters: str) -> str:
    """The signature's leading coordinates in the order ``coords`` (a
    permutation of ``letters``)."""
    if sorted(coords) != sorted(letters):
        raise ValueError(
            f"{name}: coords={coords!r} must order the letters {', '.join(sorted(letters))}"
        )
    return "".join(f"%{c}: index, " for c in coords)


def _vector_places(unroll: int, block_size: int, per_row: int) -> tuple[str, set[int]]:
    """MLIR for the ``unroll`` 16-byte vectors a thread handles in one iteration
    (``%it0``: the iteration's first vector): vector ``u`` is the thread's
    ``(it * unroll + u)``-th, at row ``%row{u}`` and column ``%col{u}`` of
    its block (``per_row`` vectors a row), consecutive threads on
    consecutive vectors. Also the index constants (``%c{v}_``) it uses."""
    text = "".join(
        f"""    %v{u}_0 = arith.addi %it0, %c{u * block_size}_ : index
    %v{u} = arith.addi %v{u}_0, %tid : index
    %row{u} = arith.divui %v{u}, %c{per_row}_ : index
    %cv{u} = arith.remui %v{u}, %c{per_row}_ : index
    %col{u} = arith.muli %cv{u}, %c8_ : index
"""
        for u in range(unroll)
    )
    return text, {per_row, 8, unroll * block_size} | {u * block_size for u in range(unroll)}


def _in_flight(name: str, unroll: int, vectors: int) -> int:
    """The loads a thread keeps in flight: the largest divisor of its ``vectors``
    (16-byte vectors per thread) up to ``unroll``."""
    if not isinstance(unroll, int) or isinstance(unroll, bool) or unroll < 1:
        raise ValueError(f"{name}: unroll must be a positive int, got {unroll!r}")
    return max(u for u in range(1, min(unroll, vectors) + 1) if vectors % u == 0)


@checked_arguments
def reduce_slots(
    block_m: int = 128,
    block_n: int = 128,
    *,
    name: str = "reduce_slots",
    block_size: int = 256,
    unroll: int = 1,
) -> DeviceFunction:
    """Reduce-Scatter consumer tile (see the module docstring): 16-byte vectors,
    fp32 sums over the staging slots, one bf16 store per vector. ``unroll``:
    vectors a thread sums at once, at most (its loads of a slot all in flight
    together)."""
    if block_n % 8 or (block_m * block_n) % (8 * block_size):
        raise ValueError(
            f"{name}: a {block_m}x{block_n} block must split into 8-element vectors "
            f"for {block_size} threads"
        )
    st, ot = "memref<?x?x?xbf16>", "memref<?x?xbf16>"
    per_row = block_n // 8
    unroll = _in_flight(name, unroll, block_m * block_n // (8 * block_size))
    iters = block_m * block_n // (8 * block_size * unroll)
    u_range = range(unroll)
    places, place_consts = _vector_places(unroll, block_size, per_row)
    places += "".join(
        f"    %gr{u} = arith.addi %r0, %row{u} : index\n"
        f"    %gc{u} = arith.addi %n0, %col{u} : index\n"
        for u in u_range
    )
    vec_f32 = ", ".join("vector<8xf32>" for _ in u_range)
    loads = "".join(
        f"      %x{u} = vector.load %staging[%s, %gr{u}, %gc{u}] : {st}, vector<8xbf16>\n"
        for u in u_range
    ) + "".join(
        f"      %xf{u} = arith.extf %x{u} : vector<8xbf16> to vector<8xf32>\n"
        f"      %a{u} = arith.addf %acc{u}, %xf{u} : vector<8xf32>\n"
        for u in u_range
    )
    stores = "".join(
        f"    %y{u} = arith.truncf %sum#{u} : vector<8xf32> to vector<8xbf16>\n"
        f"    vector.store %y{u}, %out[%gr{u}, %gc{u}] : {ot}, vector<8xbf16>\n"
        for u in u_range
    )
    source = f"""// {name}: out = bf16(sum over slots of staging), {block_m}x{block_n} blocks
func.func @{name}(%i: index, %j: index, %staging: {st}, %out: {ot}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant dense<0.0> : vector<8xf32>
  %slots = memref.dim %staging, %c0 : {st}
  %tid = gpu.thread_id x
  %r0 = arith.muli %i, %c{block_m}_ : index
  %n0 = arith.muli %j, %c{block_n}_ : index
  scf.for %it = %c0 to %c{iters}_ step %c1 {{
    %it0 = arith.muli %it, %c{unroll * block_size}_ : index
{places}    %sum:{unroll} = scf.for %s = %c0 to %slots step %c1 iter_args({", ".join(f"%acc{u} = %zero" for u in u_range)}) -> ({vec_f32}) {{
{loads}      scf.yield {", ".join(f"%a{u}" for u in u_range)} : {vec_f32}
    }}
{stores}  }}
  return
}}
"""
    consts = sorted({block_m, block_n, iters, block_size} | place_consts)
    decl = "".join(f"  %c{v}_ = arith.constant {v} : index\n" for v in consts)
    source = source.replace(
        "  %c0 = arith.constant 0 : index\n", "  %c0 = arith.constant 0 : index\n" + decl, 1
    )

    def reference(i: int, j: int, staging, out) -> None:
        rs = slice(i * block_m, (i + 1) * block_m)
        cs = slice(j * block_n, (j + 1) * block_n)
        total = np.zeros((block_m, block_n), dtype=np.float32)
        for s in range(staging.shape[0]):
            total += bf16_to_f32(staging[s, rs, cs])
        out[rs, cs] = f32_to_bf16(total)

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


@checked_arguments
def copy_to_peers(
    chunk_rows: int = 128,
    hidden: int = 4096,
    *,
    parts: int = 1,
    name: str = "copy_to_peers",
    block_size: int = 256,
    skip_own: bool = False,
    unroll: int = 1,
) -> DeviceFunction:
    """All-Gather producer tile (see the module docstring): 16-byte loads of this
    rank's rows, 16-byte stores into rank ``d``'s gathered buffer. Coordinates
    ``(d, t, p)``: part ``p`` of ``parts`` of row block ``t`` (``chunk_rows`` rows
    each), so that a block's copy is spread over ``parts`` CTAs (one CTA moves
    only ~10 GB/s). ``skip_own``: the copies to this rank (``d == rank``) do
    nothing (its GEMM reads its own rows: ``gemm_chunk(chunks="own")``).
    ``unroll``: 16-byte vectors each thread loads before it stores any (at
    most; the largest divisor of its share). One load in flight per thread
    leaves the copy bound by the local read's latency (a CTA moves ~10
    GB/s); the stores to the peer are posted."""
    if parts < 1 or chunk_rows % parts:
        raise ValueError(f"{name}: parts={parts} must divide chunk_rows={chunk_rows}")
    part_rows = chunk_rows // parts
    if hidden % 8 or (part_rows * hidden) % (8 * block_size):
        raise ValueError(
            f"{name}: {part_rows} rows of {hidden} must split into 8-element vectors "
            f"for {block_size} threads"
        )
    at = f"memref<?x{hidden}xbf16>"
    per_row = hidden // 8
    unroll = _in_flight(name, unroll, part_rows * hidden // (8 * block_size))
    iters = part_rows * hidden // (8 * block_size * unroll)
    places, place_consts = _vector_places(unroll, block_size, per_row)
    consts = sorted({chunk_rows, part_rows, hidden, iters, block_size} | place_consts)
    loads = "".join(
        f"""    %lr{u} = arith.addi %l0, %row{u} : index
    %x{u} = vector.load %A[%lr{u}, %col{u}] : {at}, vector<8xbf16>
"""
        for u in range(unroll)
    )
    stores = "".join(
        f"""    %gr{u} = arith.addi %g0, %row{u} : index
    %line{u} = arith.muli %gr{u}, %c{hidden}_ : index
    %elem{u} = arith.addi %line{u}, %col{u} : index
    %e64_{u} = arith.index_cast %elem{u} : index to i64
    %dst{u} = llvm.getelementptr %base[%e64_{u}] : (!llvm.ptr, i64) -> !llvm.ptr, bf16
    llvm.store %x{u}, %dst{u} {{alignment = 16 : i64}} : vector<8xbf16>, !llvm.ptr
"""
        for u in range(unroll)
    )
    decl = "".join(f"  %c{v}_ = arith.constant {v} : index\n" for v in consts)
    source = f"""// {name}: rows of this rank's A to every rank's gathered buffer, {chunk_rows} rows a tile
func.func @{name}(%d: index, %t: index, %p: index, %rank: index, %A: {at}, %peers: memref<?xi64>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
{decl}  %rpr = memref.dim %A, %c0 : {at}
  %tid = gpu.thread_id x
  %raw = memref.load %peers[%d] : memref<?xi64>
  %base = llvm.inttoptr %raw : i64 to !llvm.ptr
  %lt = arith.muli %t, %c{chunk_rows}_ : index
  %lp = arith.muli %p, %c{part_rows}_ : index
  %l0 = arith.addi %lt, %lp : index
  %g00 = arith.muli %rank, %rpr : index
  %g0 = arith.addi %g00, %l0 : index
  %todo = {"arith.cmpi ne, %d, %rank : index" if skip_own else "arith.constant true"}
  scf.if %todo {{
  scf.for %it = %c0 to %c{iters}_ step %c1 {{
    %it0 = arith.muli %it, %c{unroll * block_size}_ : index
{places}{loads}{stores}  }}
  }}
  return
}}
"""

    def reference(d: int, t: int, p: int, rank: int, A, peers) -> None:
        if skip_own and d == rank:
            return
        rows, r0 = A.shape[0], t * chunk_rows + p * part_rows
        peers[d][rank * rows + r0 : rank * rows + r0 + part_rows] = A[r0 : r0 + part_rows]

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)

"""Pieces shared by the bf16 ``mma.sync`` GEMM tiles (:mod:`etc.tiles.gemm`,
:mod:`etc.tiles.gemm_tc`): the MLIR text buffer, the mma op, the SwiGLU
epilogue, the MoE tile decoding, buffer types and the numpy references."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import bf16_to_f32, f32_to_bf16
from ..errors import GraphError
from . import _text

MMA_ATTRS = (
    "{layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, "
    "multiplicandAPtxType = #nvvm.mma_type<bf16>, multiplicandBPtxType = #nvvm.mma_type<bf16>, "
    "shape = #nvvm.shape<m = 16, n = 8, k = 16>}"
)
STRUCT = "!llvm.struct<(f32, f32, f32, f32)>"


def positive(name: str, key: str, value: object) -> int:
    """``value``, after :func:`_text.positive` checked it."""
    _text.positive(name, **{key: value})
    return value


def check_divisible(name: str, block_n: int, n_total: int, what: str) -> None:
    if n_total % block_n:
        raise GraphError(f"tile '{name}': {what}={n_total} is not divisible by block_n={block_n}")


# -- the chunked weight layout ------------------------------------------------
#
# ``weight_chunk=C`` tiles read ``W[..., N, K]`` stored as 8-row groups whose
# ``K`` columns come in chunks of ``C`` elements, each chunk holding the
# group's 8 rows one after another (``8 * C`` contiguous elements). A k step
# of a warp's 8-row mma fragment then reads one contiguous piece (1 KB for
# C = 64) instead of 8 pieces a row (``2K`` bytes) apart, and every group
# keeps its element range: an 8-aligned row range (an expert, a column
# block) is the same contiguous block in both layouts.


def check_weight_chunk(name: str, chunk: int, k: int, rows: int) -> int:
    """``chunk`` (0: nn.Linear rows), after checking that it splits the
    weights' ``k`` into whole 16-byte vectors and ``rows`` into 8-row groups."""
    _text.non_negative(name, weight_chunk=chunk)
    if chunk and (chunk % 8 or k % chunk or rows % 8):
        raise GraphError(
            f"tile '{name}': weight_chunk={chunk} needs a multiple of 8 dividing k={k} "
            f"and weight rows in groups of 8 (rows={rows})"
        )
    return chunk


def _regroup(w: Any, chunk: int, to_chunks: bool) -> Any:
    *lead, n, k = w.shape
    if n % 8 or chunk <= 0 or chunk % 8 or k % chunk:
        raise ValueError(
            f"weight_chunk={chunk} needs weights (..., N, K) with N % 8 == 0 and K a multiple "
            f"of the chunk, itself a multiple of 8; got shape {tuple(w.shape)}"
        )
    if to_chunks:
        return w.reshape(*lead, n // 8, 8, k // chunk, chunk).swapaxes(-3, -2).reshape(w.shape)
    return w.reshape(*lead, n // 8, k // chunk, 8, chunk).swapaxes(-3, -2).reshape(w.shape)


def chunk_weights(w: Any, chunk: int) -> Any:
    """``w[..., N, K]`` (numpy array or torch tensor, nn.Linear rows) in the
    layout that tiles with ``weight_chunk=chunk`` read (a copy)."""
    return _regroup(w, chunk, True)


def unchunk_weights(w: Any, chunk: int) -> Any:
    """The inverse of :func:`chunk_weights`: nn.Linear rows again."""
    return _regroup(w, chunk, False)


def weight_rows(w: np.ndarray, rows: slice, chunk: int) -> np.ndarray:
    """Rows ``rows`` (8-aligned) of one weight matrix ``w[N, K]`` stored in
    the ``weight_chunk=chunk`` layout, as nn.Linear rows."""
    return unchunk_weights(w[rows], chunk) if chunk else w[rows]


def experts_dim(name: str, experts: int | None) -> tuple[str, str]:
    """The expert dimension of the weights and the type of the i32 tables."""
    if experts is None:
        return "?", "memref<?xi32>"
    positive(name, "experts", experts)
    return str(experts), f"memref<{experts + 1}xi32>"


class Text:
    """An MLIR text buffer with fresh SSA names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.n = 0
        self.indent = "  "

    def fresh(self, base: str) -> str:
        # "_" before the count: ``%c32`` & co. are the tiles' own constants.
        self.n += 1
        return f"%{base}_{self.n}"

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)

    def op(self, base: str, rhs: str) -> str:
        name = self.fresh(base)
        self.emit(f"{name} = {rhs}")
        return name

    def end(self) -> None:
        """Close the innermost open region (one ``}``, one indent level out)."""
        self.indent = self.indent[:-2]
        self.emit("}")

    def close(self) -> None:
        """Close the tile's outer ``scf.if``."""
        self.indent = "  "
        self.emit("}")


def mma(t: Text, a: list[str], b: list[str], c: list[str]) -> list[str]:
    """One ``m16n8k16`` mma: A (4 i32), B (2 i32), C (4 f32); returns D (4 f32)."""
    d = t.op(
        "d",
        f"nvvm.mma.sync A[{a[0]}, {a[1]}, {a[2]}, {a[3]}] B[{b[0]}, {b[1]}] "
        f"C[{c[0]}, {c[1]}, {c[2]}, {c[3]}] {MMA_ATTRS} : "
        f"(i32, i32, f32) -> {STRUCT}",
    )
    return [t.op("c", f"llvm.extractvalue {d}[{q}] : {STRUCT}") for q in range(4)]


def bf16_round(t: Text, v: str) -> str:
    """``f32(bf16(v))``: the rounding of a bf16 tensor between two ops."""
    h = t.op("rb", f"arith.truncf {v} : f32 to bf16")
    return t.op("rb", f"arith.extf {h} : bf16 to f32")


def silu(t: Text, g: str) -> str:
    """``g / (1 + exp(-g))`` of f32 ``g`` (the function needs ``%fone``)."""
    ng = t.op("ng", f"arith.negf {g} : f32")
    ex = t.op("ex", f"math.exp {ng} : f32")
    den = t.op("den", f"arith.addf {ex}, %fone : f32")
    return t.op("silu", f"arith.divf {g}, {den} : f32")


def swiglu(
    t: Text, acc: list[list[list[str]]], nf: int, *, hf_rounding: bool = False
) -> list[list[list[str]]]:
    """``silu(gate) * up`` of accumulators ``acc[m][f]`` (gate) and
    ``acc[m][nf + f]`` (up), f32. ``hf_rounding``: ``bf16(silu(bf16(gate)))
    * bf16(up)`` as Hugging Face's bf16 model computes it (the product left
    in f32 for the store to round)."""

    def rnd(v: str) -> str:
        return bf16_round(t, v) if hf_rounding else v

    h = []
    for m in range(len(acc)):
        per = []
        for f in range(nf):
            vals = []
            for q in range(4):
                g, u = rnd(acc[m][f][q]), rnd(acc[m][nf + f][q])
                vals.append(t.op("hv", f"arith.mulf {rnd(silu(t, g))}, {u} : f32"))
            per.append(vals)
        h.append(per)
    return h


def dense_valid(t: Text, r0: str, n0: str, m_rows: str, n_rows: str) -> str:
    """``r0 < M and n0 < N``: the dense tile has work."""
    valid = t.op("valid", f"arith.cmpi ult, {r0}, {m_rows} : index")
    nvalid = t.op("valid", f"arith.cmpi ult, {n0}, {n_rows} : index")
    return t.op("valid", f"arith.andi {valid}, {nvalid} : i1")


def moe_decode(t: Text, indptr: str, it: str, e1: str) -> tuple[dict[str, str], str, str]:
    """Load the tables of expert ``e`` (``e1 = e + 1``), open ``scf.if valid``
    (``i`` in ``[indptr[e], indptr[e+1])``, rows not empty); returns the
    table values ``ip0, ip1, ro0, ro1``, ``local = i - ip0`` and ``cnt``."""
    vals = {}
    for key, mem, at in (
        ("ip0", indptr, "%e"),
        ("ip1", indptr, e1),
        ("ro0", "%row_off", "%e"),
        ("ro1", "%row_off", e1),
    ):
        raw = t.op(key, f"memref.load {mem}[{at}] : {it}")
        vals[key] = t.op(key, f"arith.index_cast {raw} : i32 to index")
    lo = t.op("valid", f"arith.cmpi sge, %i, {vals['ip0']} : index")
    hi = t.op("valid", f"arith.cmpi slt, %i, {vals['ip1']} : index")
    nonempty = t.op("valid", f"arith.cmpi slt, {vals['ro0']}, {vals['ro1']} : index")
    valid = t.op("valid", f"arith.andi {lo}, {hi} : i1")
    valid = t.op("valid", f"arith.andi {valid}, {nonempty} : i1")
    t.emit(f"scf.if {valid} {{")
    t.indent += "  "
    local = t.op("local", f"arith.subi %i, {vals['ip0']} : index")
    cnt = t.op("cnt", f"arith.subi {vals['ro1']}, {vals['ro0']} : index")
    return vals, local, cnt


def tile_options(name: str, given: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``given`` keyword options over ``defaults``; an unknown key is an error
    naming the tile and the options it takes."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise GraphError(
            f"tile '{name}': unknown option(s) {', '.join(unknown)}; it takes {', '.join(defaults)}"
        )
    return {**defaults, **given}


# -- buffer types and signatures ----------------------------------------------


def dense_types(k: int, out: str = "bf16") -> tuple[str, str]:
    """``(A and B, C)``."""
    return f"memref<?x{k}xbf16>", f"memref<?x?x{out}>"


def dense_signature(ab: str, ct: str) -> str:
    return f"%i: index, %j: index, %A: {ab}, %B: {ab}, %C: {ct}"


def gate_up_types(hidden: int, inter: int, ed: str) -> tuple[str, str, str]:
    """``(Xp, Wgu, Hb)``."""
    return (
        f"memref<?x{hidden}xbf16>",
        f"memref<{ed}x{2 * inter}x{hidden}xbf16>",
        f"memref<?x{inter}xbf16>",
    )


def gate_up_signature(xt: str, wt: str, ht: str, it: str, gather: bool = False) -> str:
    """``(Xp, Wgu, row_off, gu_indptr, Hb)``, or with ``gather`` the tokens
    and their slots: ``(X, Wgu, row_off, gu_indptr, perm, Hb)``."""
    if gather:
        return (
            f"%i: index, %e: index, %X: {xt}, %Wgu: {wt}, %row_off: {it}, %gu_indptr: {it}, "
            f"%perm: memref<?xi32>, %Hb: {ht}"
        )
    return (
        f"%i: index, %e: index, %Xp: {xt}, %Wgu: {wt}, %row_off: {it}, %gu_indptr: {it}, %Hb: {ht}"
    )


def down_types(hidden: int, inter: int, ed: str) -> tuple[str, str, str]:
    """``(Hb, Wd, Yp)``."""
    return (
        f"memref<?x{inter}xbf16>",
        f"memref<{ed}x{hidden}x{inter}xbf16>",
        f"memref<?x{hidden}xbf16>",
    )


#: The sums an atomic combine adds into, by element type: (argument name,
#: what it holds).
SUMS = {"f32": ("Out32", "float32"), "f16": ("Out16", "half-precision")}


def down_signature(
    ht: str, wt: str, yt: str, it: str, combine_topk: int | None = None, sums_dtype: str = "f32"
) -> str:
    """``(Hb, Wd, row_off, dn_indptr, Yp)``, or with ``combine_topk=K`` the
    slots, their weights and the tokens' sums: ``(Hb, Wd, row_off,
    dn_indptr, perm, topk_w, Out32)`` (``Out16`` for ``sums_dtype="f16"``)."""
    head = f"%i: index, %e: index, %Hb: {ht}, %Wd: {wt}, %row_off: {it}, %dn_indptr: {it}, "
    if combine_topk is None:
        return head + f"%Yp: {yt}"
    sums = yt.replace("xbf16>", f"x{sums_dtype}>")
    name = SUMS[sums_dtype][0]
    return head + f"%perm: memref<?xi32>, %topk_w: memref<?x{combine_topk}xf32>, %{name}: {sums}"


# -- numpy references -----------------------------------------------------------


def bf16_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b.T`` of bf16 bit arrays, in float32."""
    return bf16_to_f32(a) @ bf16_to_f32(b).T


def moe_block(
    i: int, e: int, row_off: np.ndarray, indptr: np.ndarray, block_m: int, block_n: int
) -> tuple[slice, slice] | None:
    """The rows and output columns of MoE tile ``(i, e)``, or None (no work)."""
    ip0, ip1 = int(indptr[e]), int(indptr[e + 1])
    ro0, ro1 = int(row_off[e]), int(row_off[e + 1])
    if not ip0 <= i < ip1 or ro1 <= ro0:
        return None
    local = i - ip0
    nmb = -(-(ro1 - ro0) // block_m)
    nb, mb = divmod(local, nmb)
    r0 = ro0 + mb * block_m
    return slice(r0, min(r0 + block_m, ro1)), slice(nb * block_n, (nb + 1) * block_n)


def dense_reference(block_m: int, block_n: int, out_f32: bool = False) -> Callable[..., None]:
    def reference(i: int, j: int, A: np.ndarray, B: np.ndarray, C: np.ndarray) -> None:
        rs, cs = slice(i * block_m, (i + 1) * block_m), slice(j * block_n, (j + 1) * block_n)
        y = bf16_matmul(A[rs], B[cs])
        C[rs, cs] = y if out_f32 else f32_to_bf16(y)

    return reference


def gate_up_reference(
    block_m: int, block_n: int, inter: int, gather_topk: int | None = None, chunk: int = 0
) -> Callable[..., None]:
    """The gate/up tile's reference; with ``gather_topk=K`` it takes the
    gathering tile's buffers ``(X, Wgu, row_off, gu_indptr, perm, Hb)`` and
    reads row ``r`` as ``X[perm[r] // K]``. ``chunk``: the weights'
    ``weight_chunk`` layout (0: nn.Linear rows)."""

    def reference(i: int, e: int, Xp, Wgu, row_off, gu_indptr, *rest) -> None:
        block = moe_block(i, e, row_off, gu_indptr, block_m, block_n)
        if block is None:
            return
        rs, cs = block
        if gather_topk is None:
            (Hb,) = rest
            a = Xp[rs]
        else:
            perm, Hb = rest
            a = Xp[perm[rs] // gather_topk]
        Hb[rs, cs] = f32_to_bf16(swiglu_rows(a, Wgu[e], cs, inter, chunk))

    return reference


def down_reference(
    block_m: int, block_n: int, combine_topk: int | None = None, chunk: int = 0
) -> Callable[..., None]:
    """The down tile's reference; with ``combine_topk=K`` it takes ``(Hb, Wd,
    row_off, dn_indptr, perm, topk_w, Out32)`` (or ``Out16``) and adds each
    weighted row into its token's sum (:func:`add_weighted_rows`)."""

    def reference(i: int, e: int, Hb, Wd, row_off, dn_indptr, *rest) -> None:
        block = moe_block(i, e, row_off, dn_indptr, block_m, block_n)
        if block is None:
            return
        rs, cs = block
        y = bf16_matmul(Hb[rs], weight_rows(Wd[e], cs, chunk))
        if combine_topk is None:
            (Yp,) = rest
            Yp[rs, cs] = f32_to_bf16(y)
        else:
            add_weighted_rows(y, rs, cs, combine_topk, *rest)

    return reference


def swiglu_rows(a: np.ndarray, w: np.ndarray, cs: slice, inter: int, chunk: int = 0) -> np.ndarray:
    """``silu(a @ Wg^T) * (a @ Wu^T)`` in float32 for the columns ``cs`` of
    one expert's ``w`` (gate rows, then the up rows ``inter`` further;
    ``chunk``: its ``weight_chunk`` layout)."""
    g = bf16_matmul(a, weight_rows(w, cs, chunk))
    u = bf16_matmul(a, weight_rows(w, slice(cs.start + inter, cs.stop + inter), chunk))
    with np.errstate(over="ignore"):
        return (g / (np.float32(1) + np.exp(-g)) * u).astype(np.float32)


def slot_reference(
    kind: str, block_n: int, inter: int, slots: int, logit_parts: int = 0, chunk: int = 0,
    fuse_down: bool = False, combine: bool = False,
) -> Callable[..., None]:  # fmt: skip
    """The reference of a slot tile ``(s, j)`` (``moe_gate_up`` / ``moe_down``
    with ``slots=K``): token row ``s // K`` (gate/up) or row ``s`` (down),
    expert ``topk_ids[s // K, s % K]`` (with ``logit_parts``: choice ``s %
    K`` of the top-k of the token's router logits, in that many parts),
    output row ``s``; ``fuse_down``: then ``Out32[s // K] += w * Hb[s, cs]
    @ Wd[e][:, cs]^T`` with the choice's weight ``w``; ``combine`` (down):
    then counts the tile on ``count[s // K, j]`` and, the token's K-th,
    resets it and writes ``Out[s // K, cs]``, the combine's weighted sum of
    the token's K rows."""

    def reference(s: int, j: int, A, table, W, out, *extra) -> None:
        token, kth = divmod(s, slots)
        row = token if kind == "gate_up" else s
        if row >= A.shape[0]:
            return
        weight = None
        if logit_parts:
            from .moe import _summed_logits, topk_from_logits

            logits = _summed_logits(table, logit_parts, token, token + 1, A.shape[0])
            ids, ws = topk_from_logits(logits, slots)
            e, weight = int(ids[0, kth]), ws[0, kth]
        else:
            e = int(table[token, kth])
        a = A[row : row + 1]
        cs = slice(j * block_n, (j + 1) * block_n)
        if kind == "gate_up":
            y = swiglu_rows(a, W[e], cs, inter, chunk)
        else:
            y = bf16_matmul(a, weight_rows(W[e], cs, chunk))
        out[s : s + 1, cs] = f32_to_bf16(y.astype(np.float32))
        if fuse_down:
            Wd, sums = extra
            part = bf16_matmul(out[s : s + 1, cs], Wd[e][:, cs])[0]
            sums[token] += (np.float32(weight) * part).astype(np.float32)
        if combine:
            topk_w, count, Out = extra
            count[token, j] += 1
            if count[token, j] == slots:
                count[token, j] = 0
                rows = out[token * slots : (token + 1) * slots, cs]
                acc = np.zeros(rows.shape[1], np.float32)
                for k in range(slots):  # the combine task's sum, in k order
                    acc += topk_w[token, k] * bf16_to_f32(rows[k])
                Out[token, cs] = f32_to_bf16(acc)

    return reference


def add_weighted_rows(
    y: np.ndarray, rs: slice, cs: slice, topk: int, perm: np.ndarray, topk_w: np.ndarray,
    sums: np.ndarray,
) -> None:  # fmt: skip
    """``sums[perm[r] // topk, cs] += w * y[r]`` (in ``sums``' type, float32
    or float16, each product rounded to it first) for the permuted rows
    ``rs`` of a down block, ``w`` the row's routing weight. The rows of one
    expert are distinct tokens, so the block adds at once."""
    slots = perm[rs].astype(np.int64)
    w = topk_w.reshape(-1)[slots][:, None]
    sums[slots // topk, cs] += (w * y).astype(sums.dtype)


#: The workgroup word that carries thread 0's count to the CTA in
#: :func:`open_last_arrival`.
LAST_FLAG_TYPE = "memref<1xi32, #gpu.address_space<workgroup>>"


def last_arrival_flag(name: str) -> tuple[str, str]:
    """Tile ``name``'s :func:`open_last_arrival` flag: its symbol and the
    ``memref.global`` that declares it (one of the tile's globals)."""
    flag = f"@{name}__last"
    return flag, f'memref.global "private" {flag} : {LAST_FLAG_TYPE} {{alignment = 4 : i64}}'


def count_arrival(
    t: Text, flag: str, is0: str, counter_at: str, arrivals: int, c0: str = "%c0",
    release_reset: bool = False,
) -> str:  # fmt: skip
    """:func:`open_last_arrival`'s count without its region: thread 0 adds 1
    (``atom.acq_rel.gpu``) and, the ``arrivals``-th, resets the word to zero
    at once (``release_reset``: with a release store, so that a tile that
    waits for the reset acquires every part); returns the count before this
    tile's add (an i32, every thread's over ``flag`` and a barrier)."""

    def reset(old: str) -> None:
        want = t.op("want", f"arith.constant {arrivals - 1} : i32")
        t.emit(f"  scf.if {t.op('last', f'arith.cmpi eq, {old}, {want} : i32')} {{")
        order = "release" if release_reset else "relaxed"
        t.emit(
            f'    llvm.inline_asm has_side_effects asm_dialect = att "st.{order}.gpu.global.u32 '
            f'[$0], 0;", "l" {counter_at} : (i64) -> ()'
        )
        t.emit("  }")

    return _count(t, flag, is0, counter_at, c0, reset)


def _count(
    t: Text,
    flag: str,
    is0: str,
    counter_at: str,
    c0: str,
    then: Callable[[str], None] | None = None,
) -> str:
    """Thread 0's ``atom.acq_rel.gpu`` add of 1 to the counter at
    ``counter_at``, its old value into ``flag`` (and ``then(old)`` in thread
    0), a CTA barrier; returns every thread's copy of the old value."""
    flag_t = LAST_FLAG_TYPE
    ref = t.op("flag", f"memref.get_global {flag} : {flag_t}")
    t.emit(f"scf.if {is0} {{")
    old = t.op(
        "old",
        '  llvm.inline_asm has_side_effects asm_dialect = att "atom.acq_rel.gpu.global.add.u32 '
        f'$0, [$1], 1;", "=r,l" {counter_at} : (i64) -> i32',
    )
    t.emit(f"  memref.store {old}, {ref}[{c0}] : {flag_t}")
    if then is not None:
        then(old)
    t.emit("}")
    t.emit("gpu.barrier")
    return t.op("seen", f"memref.load {ref}[{c0}] : {flag_t}")


def open_last_arrival(
    t: Text, flag: str, is0: str, counter_at: str, arrivals: int, c0: str = "%c0"
) -> None:
    """After a CTA barrier (the caller's: the tile's stores are done),
    thread 0 counts the tile on the i32 counter at byte address
    ``counter_at`` (an i64) with ``atom.acq_rel.gpu``: the release covers
    the CTA's stores, the acquire the other tiles'. Opens ``scf.if`` for the
    tile whose count is the ``arrivals``-th (the caller closes it), where
    thread 0 first resets the counter to zero for the next launch. ``flag``:
    a workgroup ``memref<1xi32>`` global that carries thread 0's count to
    the CTA (over a second barrier; :func:`last_arrival_flag`)."""
    seen = _count(t, flag, is0, counter_at, c0)
    want = t.op("want", f"arith.constant {arrivals - 1} : i32")
    last = t.op("last", f"arith.cmpi eq, {seen}, {want} : i32")
    t.emit(f"scf.if {last} {{")
    t.indent += "  "
    t.emit(f"scf.if {is0} {{")
    t.emit(
        '  llvm.inline_asm has_side_effects asm_dialect = att "st.relaxed.gpu.global.u32 '
        f'[$0], 0;", "l" {counter_at} : (i64) -> ()'
    )
    t.emit("}")

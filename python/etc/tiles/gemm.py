"""bf16 tensor-core GEMM tiles (``mma.sync.m16n8k16``, fp32 accumulation).

Three tile factories, all ``C = A @ B^T`` with ``A`` row-major ``(M, K)`` and
the weight ``B`` row-major ``(N, K)`` (PyTorch's ``nn.Linear`` layout):

* :func:`gemm` (dense): coords ``(i, j)``, args ``(A: memref<?xKxbf16>,
  B: memref<?xKxbf16>, C: memref<?x?xbf16>)``; tile ``(i, j)`` writes
  ``C[i*BM:(i+1)*BM, j*BN:(j+1)*BN]`` clipped to ``M = dim(A, 0)`` and
  ``N = dim(B, 0)`` (``N`` must be even: outputs are stored in pairs).
* :func:`moe_gate_up`: coords ``(i, e)``, args ``(Xp, Wgu, row_off,
  gu_indptr, Hb)``: the fused gate/up projection of expert ``e`` with the
  SwiGLU epilogue ``Hb = bf16(silu(Xp @ Wg^T) * (Xp @ Wu^T))``.
* :func:`moe_down`: coords ``(i, e)``, args ``(Hb, Wd, row_off, dn_indptr,
  Yp)``: ``Yp = bf16(Hb @ Wd[e]^T)``.

The MoE tiles follow ``/tmp/notes/moe_spec.md`` (ETC issue 6): tile ``i`` of
expert ``e`` is ``local = i - indptr[e]``, ``nmb = ceil(cnt / BM)`` row
blocks, ``nb = local // nmb``, ``mb = local % nmb``; rows ``row_off[e] +
mb*BM ..`` clipped to ``row_off[e+1]``, output columns ``nb*BN .. +BN``. An
instance outside ``[indptr[e], indptr[e+1])`` does nothing.

Algorithm (no shared memory, except the split-K reduction): the CTA's
``block_size / 32`` warps form a ``WM x WN x WK`` grid; warp ``(wm, wn,
wk)`` computes ``MF`` 16-row by ``NF`` 8-column mma fragments of the block
over the ``wk``-th of ``WK`` slices of ``K``. Fragments are loaded straight
from global memory with 16-byte loads: the reduction over ``k`` does not
depend on its order, so within every 32-wide chunk of ``k`` the logical
``k`` slots of the ``m16n8k16`` fragments are permuted identically in ``A``
and ``B`` such that lane ``(g = lane/4, t = lane%4)`` reads the 8
contiguous elements ``[32c + 8t, 32c + 8t + 8)`` of its rows: one
``ld.global.v4`` gives the lane its share of two mma k-steps of one ``A``
row (rows ``g`` and ``g+8`` of a fragment) or one ``B`` row (``n = g``).
The k loop is unrolled ``unroll`` chunks deep with all loads of an
iteration issued before its mmas, so each thread has ``unroll * (2*MF +
NF)`` 16-byte loads in flight (weights are streamed, which is what decode
with a few rows per expert needs); with ``MF > 1`` every weight fragment is
reused for ``MF`` row fragments from registers. Rows past the block's end
are clamped to its last row for loading and not stored. With ``WK > 1``
the warps of slices ``1..WK-1`` leave their accumulators in a workgroup
buffer ``@<name>__partials`` and the slice-0 warps add them before the
epilogue (two CTA barriers, reached by all threads).

bf16 buffers need 16-byte aligned base addresses and ``K % (32 * WK *
unroll) == 0``. Rows are token slots; ``row_off``/``indptr`` are i32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..dtypes import bf16_to_f32, f32_to_bf16
from ..errors import GraphError
from . import _mma, _text
from ._mma import Text as _Text
from ._mma import check_divisible as _check_moe
from ._mma import chunk_weights, unchunk_weights
from ._mma import experts_dim as _experts
from ._mma import positive as _positive

__all__ = [
    "LAYER_EPILOGUES",
    "chunk_weights",
    "fold_norm",
    "gemm",
    "layer_gemm",
    "layer_gemm_reference",
    "moe_gate_up",
    "moe_down",
    "plan_prefetch",
    "plan_stages",
    "plan_warps",
    "unchunk_weights",
]


#: Shared memory one sm_90 CTA can have, less the kernel's own (the compiler's limit).
MAX_SHARED_BYTES = 226 * 1024


def plan_warps(
    name: str,
    block_m: int,
    block_n: int,
    k: int,
    block_size: int,
    warps: tuple[int, int, int] | None = None,
    unroll: int | None = None,
    b_per_n: int = 1,
) -> tuple[int, int, int, int]:
    """``(WM, WN, WK, unroll)`` for a ``block_m x block_n`` block over ``k``.

    By default warps go to columns first (``WN = gcd(warps, block_n/8)``),
    then rows, the rest split ``k``; ``unroll`` keeps about 16 16-byte loads
    per thread in flight. ``b_per_n`` is the number of weight fragments per
    output fragment (2 for gate/up)."""
    for key, value in (("block_m", block_m), ("block_n", block_n), ("k", k)):
        _positive(name, key, value)
    _positive(name, "block_size", block_size)
    if block_size % 32:
        raise GraphError(f"tile '{name}': block_size={block_size} is not a multiple of 32")
    if block_m % 16:
        raise GraphError(f"tile '{name}': block_m={block_m} must be a multiple of 16")
    if block_n % 8:
        raise GraphError(f"tile '{name}': block_n={block_n} must be a multiple of 8")
    if k % 32:
        raise GraphError(f"tile '{name}': k={k} must be a multiple of 32")
    nw = block_size // 32
    if warps is None:
        wn = math.gcd(nw, block_n // 8)
        wm = math.gcd(nw // wn, block_m // 16)
        wk = nw // (wn * wm)
    else:
        if len(warps) != 3:
            raise GraphError(f"tile '{name}': warps must be (WM, WN, WK), got {warps!r}")
        wm, wn, wk = (_positive(name, "warps", w) for w in warps)
        if wm * wn * wk != nw:
            raise GraphError(
                f"tile '{name}': warps {warps} do not multiply to block_size/32 = {nw}"
            )
    if block_m % (16 * wm) or block_n % (8 * wn):
        raise GraphError(
            f"tile '{name}': a {block_m}x{block_n} block does not split over "
            f"{wm}x{wn} warps into 16x8 fragments"
        )
    if k % (32 * wk):
        raise GraphError(f"tile '{name}': k={k} does not split into {wk} slices of 32")
    chunks = k // (32 * wk)
    if unroll is None:
        loads = 2 * (block_m // (16 * wm)) + b_per_n * (block_n // (8 * wn))
        unroll = max(1, min(4, 16 // loads))
        while chunks % unroll:
            unroll -= 1
    else:
        _positive(name, "unroll", unroll)
        if chunks % unroll:
            raise GraphError(
                f"tile '{name}': k={k} over {wk} warp slices is {chunks} chunks of 32, "
                f"not divisible by unroll={unroll}"
            )
    return wm, wn, wk, unroll


def plan_prefetch(
    name: str,
    block_m: int,
    k: int,
    wk: int,
    unroll: int,
    prefetch: int | None = None,
) -> int:
    """Groups of ``unroll`` chunks loaded ahead of the mmas (register
    pipelining depth).
    An explicit value must leave at least one loop iteration. Default 0:
    ptxas re-schedules the unrolled loop and sinks register loads next to
    their mmas anyway (see ``stages`` for a pipeline it cannot undo)."""
    iters = k // (32 * wk * unroll)
    if prefetch is None:
        return 0
    _text.non_negative(name, prefetch=prefetch)
    if prefetch >= iters:
        raise GraphError(
            f"tile '{name}': prefetch={prefetch} needs more than {prefetch} k iterations, "
            f"the loop has {iters} (k={k}, {wk} warp slices, unroll={unroll})"
        )
    return prefetch


def plan_stages(
    name: str,
    k: int,
    wk: int,
    unroll: int,
    nb: int,
    block_size: int,
    stages: int | None = None,
    prefetch: int = 0,
) -> int:
    """Slots of the per-thread ``cp.async`` weight ring (0: weights are
    loaded into registers). ``stages - 1`` groups of ``unroll`` chunks are in
    flight; the ring takes ``stages * unroll * nb * block_size * 16`` bytes
    of workgroup memory (``nb``: 16-byte slots per thread and chunk). The
    kernel needs its largest tile's workgroup memory; past 47 KiB that is
    dynamic shared memory, which may leave fewer CTAs per SM. At most
    226 KiB, what an sm_90 CTA can have. Default 0."""
    if stages is None:
        return 0
    _text.non_negative(name, stages=stages)
    if stages and prefetch:
        raise GraphError(f"tile '{name}': give prefetch (registers) or stages (cp.async), not both")
    iters = k // (32 * wk * unroll)
    if stages - 1 > iters:
        raise GraphError(
            f"tile '{name}': stages={stages} keeps {stages - 1} groups in flight, "
            f"the k loop has {iters} (k={k}, {wk} warp slices, unroll={unroll})"
        )
    ring = stages * unroll * nb * block_size * 16
    if wk > 1:  # the split-K partials share the workgroup memory
        ring += (wk - 1) * (block_size // 32 // wk) * 4 * nb * 32 * 4
    if ring > MAX_SHARED_BYTES:
        raise GraphError(
            f"tile '{name}': a cp.async ring of {stages} x {unroll} x {nb} 16-byte slots "
            f"per thread (with the split-K partials) is {ring} bytes of workgroup memory "
            f"(> {MAX_SHARED_BYTES}, what an sm_90 CTA can have)"
        )
    return stages


def _body(
    t: _Text,
    *,
    name: str,
    k: int,
    block_size: int,
    wm: int,
    wn: int,
    wk: int,
    unroll: int,
    prefetch: int,
    stages: int,
    mf: int,
    nf: int,
    a: tuple[str, str],
    b_rows: Callable[[int, str], tuple[str, str, str]],
    nb: int,
    r0: str,
    r1: str,
    epilogue: Callable[[_Text, list[list[list[str]]], list[str], str], None],
    a_norm: tuple[str, str, str, float] | None = None,
    a_ring: bool = False,
    rotate: str | None = None,
    a_ahead: int = 0,
    norm_sums: tuple[str, str, str] | None = None,
    part: str = "all",
    early: int = 0,
    partials: int = 0,
    weight_chunk: int = 0,
    bulk_ring: bool = False,
    l2_evict_first: bool | Literal["body"] = False,
) -> list[str]:
    """The warp-MMA main loop and epilogue call, emitted into ``t``.

    ``l2_evict_first`` (with ``stages``, not ``bulk_ring``): the weight
    ring's ``cp.async`` copies carry an L2 evict-first policy, so weights
    read once a step do not push out of the L2 what is read again (the
    kernel's code, activations, counters); ``"body"``: not the ring fill's
    (``part="fill"``) copies.

    ``bulk_ring`` (with ``stages`` and ``weight_chunk=32``): lane 0 of each
    warp fills the warp's ring slots with one ``cp.async.bulk`` per weight
    fragment and stage (``unroll`` chunks of 512 bytes, contiguous in the
    chunked layout and landing in lane order: the same 16 bytes per lane as
    the per-thread copies), counted on a per-warp mbarrier per stage that
    every lane waits on; the mbarriers are initialised where the ring's
    first copies are issued and invalidated after the last wait.

    ``weight_chunk=C``: the weights are stored in 8-row groups of ``C``-wide
    k chunks (:func:`chunk_weights`), so a fragment's 8 lane groups read one
    contiguous piece per chunk; each load's address is remapped, nothing
    else changes.

    ``part`` (with ``stages``): ``"fill"`` emits only the copies of the
    weight ring's first ``early`` groups (at most ``stages - 1``; a prefetch
    function's body, run by the same threads before the instance waits),
    ``"body"`` everything else (the ring already holds those groups),
    ``"all"`` both.
    ``partials``: at least this many floats in the split-K buffer (bodies
    of one function that share it declare one size).

    ``norm_sums = (sums, sums type, slot)`` (with ``a_norm``): each row's
    sum of squares is read from ``sums[slot, row]`` (written by the tasks
    that produced ``A``) instead of computed by a prologue, so the tile
    needs no extra barrier or pass over ``A``.

    ``a_ring`` (with ``stages``) streams the A vectors through the
    ``cp.async`` ring with the weights instead of loading them into
    registers after each ring wait, so the loop no longer pays one L2
    round trip per iteration.

    ``a_ahead`` (with ``stages``, at most ``stages - 1``) loads the A
    vectors that many chunk groups ahead into registers, before the ring
    wait of the group that precedes them.

    ``rotate`` (an index value, e.g. the tile's column block) starts each
    tile's k loop at chunk group ``rotate mod groups`` and wraps around, so
    the tiles of a stage, which all multiply the same activations, do not
    read the same part of them at the same time.

    ``a_norm = (gamma, gamma type, gamma row, eps)`` RMS-normalises the A
    rows on the fly, as Hugging Face's ``LlamaRMSNorm`` does: a prologue
    computes ``rsqrt(mean(a**2) + eps)`` per row of the block into workgroup
    memory, then every A vector is replaced by ``bf16(gamma * bf16(a * r))``
    before its mma (``gamma[row, k]``, the same ``k`` as the vector).

    ``a = (memref, type)``; ``b_rows(f, grp)`` gives ``(memref, type,
    index prefix)`` of weight fragment ``f`` (``nb`` of them per warp) for
    lane group ``grp`` (the row without ``k``). ``r0``/``r1``: the block's
    row range (``r1 > r0``). ``epilogue(t, acc[mf][f][4], rows, col_lane)``.
    Returns the lines of the workgroup globals it needs."""
    globals_: list[str] = []
    t.emit(f"// {name}: {wm}x{wn}x{wk} warps (rows x cols x k slices), {mf}x{nf} fragments")
    t.emit(f"// per warp, k unrolled {unroll} chunks of 32, {prefetch} groups prefetched")
    tid = t.op("tid", "gpu.thread_id x")
    warp = t.op("warp", f"arith.divui {tid}, %c32 : index")
    lane = t.op("lane", f"arith.remui {tid}, %c32 : index")
    grp = t.op("grp", f"arith.divui {lane}, %c4 : index")
    tig = t.op("tig", f"arith.remui {lane}, %c4 : index")
    wm_i = t.op("wm", f"arith.remui {warp}, %c{wm}_ : index") if wm > 1 else "%c0"
    wq = t.op("wq", f"arith.divui {warp}, %c{wm}_ : index") if wm > 1 else warp
    wk_i = t.op("wk", f"arith.divui {wq}, %c{wn}_ : index") if wn > 1 else wq
    # Rows: fragment row g and g+8 (unclamped for the stores, clamped for loads).
    last = t.op("last", f"arith.subi {r1}, %c1 : index")
    wrow = t.op("wrow", f"arith.muli {wm_i}, %c{16 * mf}_ : index")
    rbase = t.op("rbase", f"arith.addi {r0}, {wrow} : index")
    rbase = t.op("rbase", f"arith.addi {rbase}, {grp} : index")
    rows: list[str] = []  # 2*mf store rows: (g, g+8) per fragment
    lrows: list[str] = []
    for m in range(mf):
        for half in (0, 8):
            off = 16 * m + half
            r = t.op("row", f"arith.addi {rbase}, %c{off}_ : index") if off else rbase
            rows.append(r)
            lrows.append(t.op("lrow", f"arith.minui {r}, {last} : index"))
    rms: list[str] = []

    def norm_prologue() -> None:
        if norm_sums is not None:
            sums, sums_type, slot = norm_sums
            t.emit(f"%fk_{k} = arith.constant {float(k):.1f} : f32")
            t.emit(f"%feps = arith.constant {float(np.float32(a_norm[3])):.9e} : f32")
            for r in lrows:
                total = _load_sum(t, sums, sums_type, slot, r)
                rms.append(t.op("rms", f"arith.divf {total}, %fk_{k} : f32"))
            return
        globals_.append(
            _norm_prologue(t, name, a, k, a_norm[3], block_size, wm * mf * 16, r0, last, lane, warp)
        )
        smem = f"memref<{wm * mf * 16}xf32, #gpu.address_space<workgroup>>"
        buf = t.op("rmsbuf", f"memref.get_global @{name}__rms : {smem}")
        for r in lrows:
            at = t.op("rr", f"arith.subi {r}, {r0} : index")
            rms.append(t.op("rms", f"memref.load {buf}[{at}] : {smem}"))

    # With a weight ring the statistics wait until its first groups are in
    # flight (stream_loop): their HBM latency then covers the prologue's.
    if a_norm is not None and not stages:
        norm_prologue()
    # Weight rows: lane group g reads row g of each 8-column fragment.
    brefs = [b_rows(f, grp) for f in range(nb)]
    # Chunked weights: row r's group start and r % 8's place in a chunk.
    chunked = []
    for _, _, prefix in brefs if weight_chunk else []:
        *lead, r = (x.strip() for x in prefix.split(","))
        g = t.op("bg", f"arith.remui {r}, %c8 : index")
        rg = t.op("bg", f"arith.subi {r}, {g} : index")
        chunked.append((lead, rg, t.op("bg", f"arith.muli {g}, %c{weight_chunk}_ : index")))
    kslice = k // wk
    kl = t.op("kl", f"arith.muli {tig}, %c8 : index")
    if wk > 1:
        ks = t.op("ks", f"arith.muli {wk_i}, %c{kslice}_ : index")
        kl = t.op("kl", f"arith.addi {kl}, {ks} : index")
    nacc = mf * nb * 4
    a_mem, a_type = a
    a_row_bytes = 2 * k
    step = 32 * unroll
    rot = None
    if rotate is not None:
        rot = t.op("rot", f"arith.remui {rotate}, %c{kslice // step}_ : index")
        rot = t.op("rot", f"arith.muli {rot}, %c{step}_ : index")

    def kat(off: str | int) -> str:
        """This thread's k for the chunk group at (logical) offset ``off``."""
        value = off if isinstance(off, str) else f"%c{off}_"
        if rot is None:
            return kl if off == 0 else t.op("k", f"arith.addi {kl}, {value} : index")
        x = t.op("k", f"arith.addi {rot}, {value} : index")
        x = t.op("k", f"arith.remui {x}, %c{kslice}_ : index")
        return t.op("k", f"arith.addi {kl}, {x} : index")

    vtype = "vector<8xbf16>"
    b_attr = "{alignment = 16 : i64}"

    def chunk_base(ku: str) -> str:
        """Element offset of k ``ku`` from its 8-row group's start, less the
        row's place in the chunk: ``(ku / C) * 8C + ku % C``, i.e. ``ku +
        (ku / C) * 7C``."""
        c = t.op("bk", f"arith.divui {ku}, %c{weight_chunk}_ : index")
        c = t.op("bk", f"arith.muli {c}, %c{7 * weight_chunk}_ : index")
        return t.op("bk", f"arith.addi {ku}, {c} : index")

    def b_load(f: int, ku: str, base: str | None) -> str:
        mem, mtype, prefix = brefs[f]
        if not weight_chunk:
            return t.op("vb", f"vector.load {mem}[{prefix}, {ku}] {b_attr} : {mtype}, {vtype}")
        lead, rg, goff = chunked[f]
        at = t.op("bk", f"arith.addi {base}, {goff} : index")
        row = t.op("bk", f"arith.divui {at}, %c{k}_ : index")
        row = t.op("bk", f"arith.addi {rg}, {row} : index")
        col = t.op("bk", f"arith.remui {at}, %c{k}_ : index")
        idx = ", ".join([*lead, row, col])
        return t.op("vb", f"vector.load {mem}[{idx}] {b_attr} : {mtype}, {vtype}")

    def normed(vecs: list[str], ku: str) -> list[str]:
        """The A vectors of chunk ``ku``, RMS-normalised when the tile fuses the norm."""
        if a_norm is None:
            return vecs
        return [_normalise(t, v, rms[i], a_norm, ku) for i, v in enumerate(vecs)]

    def loads(kbase: str, with_b: bool = True) -> tuple[list[list[str]], list[list[str]]]:
        """One group: ``unroll`` chunks of A rows and weight fragments."""
        raw_a, raw_b = [], []
        for u in range(unroll):
            ku = t.op("k", f"arith.addi {kbase}, %c{32 * u}_ : index") if u else kbase
            row_vecs = [
                t.op(
                    "va",
                    f"vector.load {a_mem}[{r}, {ku}] {{alignment = 16 : i64}} : {a_type}, {vtype}",
                )
                for r in lrows
            ]
            raw_a.append(normed(row_vecs, ku))
            base = chunk_base(ku) if with_b and weight_chunk else None
            raw_b.append([b_load(f, ku, base) for f in range(nb if with_b else 0)])
        return raw_a, raw_b

    def mmas(raw_a: list[list[str]], raw_b: list[list[str]], acc: list) -> list:
        words_a: list[list[list[str]]] = []  # [u][row][4 words]
        words_b: list[list[list[str]]] = []  # [u][frag][4 words]
        for u in range(unroll):
            for raws, out in ((raw_a[u], words_a), (raw_b[u], words_b)):
                per = []
                for v in raws:
                    w = t.op("w", f"vector.bitcast {v} : {vtype} to vector<4xi32>")
                    per.append(
                        [
                            t.op("x", f"vector.extract {w}[{q}] : i32 from vector<4xi32>")
                            for q in range(4)
                        ]
                    )
                out.append(per)
        acc = [[list(c) for c in per] for per in acc]
        for u in range(unroll):
            for j in range(2):
                for m in range(mf):
                    ra, rb = words_a[u][2 * m], words_a[u][2 * m + 1]
                    for f in range(nb):
                        wb = words_b[u][f]
                        acc[m][f] = _mma.mma(
                            t,
                            [ra[2 * j], rb[2 * j], ra[2 * j + 1], rb[2 * j + 1]],
                            [wb[2 * j], wb[2 * j + 1]],
                            acc[m][f],
                        )
        return acc

    def flat_group(raw_a: list[list[str]], raw_b: list[list[str]]) -> list[str]:
        return [v for u in range(unroll) for v in raw_a[u] + raw_b[u]]

    def unflat_group(vals: list[str]) -> tuple[list[list[str]], list[list[str]]]:
        per = len(lrows) + nb
        us = [vals[u * per : (u + 1) * per] for u in range(unroll)]
        return [x[: len(lrows)] for x in us], [x[len(lrows) :] for x in us]

    def shaped(names: list[str]) -> list:
        return [
            [names[(m * nb + f) * 4 : (m * nb + f) * 4 + 4] for f in range(nb)] for m in range(mf)
        ]

    def register_loop() -> list:
        # Prologue (prefetch > 0): the first ``prefetch`` groups are loaded
        # before the loop; iteration kk loads group kk and multiplies the oldest
        # carried one (register double buffering), the epilogue the last ones.
        carried: list[list[str]] = []
        for p in range(prefetch):
            kp = kat(step * p)
            carried.append(flat_group(*loads(kp)))
        per_group = unroll * (len(lrows) + nb)
        ncarry = prefetch * per_group
        inits = [f"%acc_{q} = %fzero" for q in range(nacc)]
        inits += [f"%pf_{q} = {v}" for q, v in enumerate(x for grp in carried for x in grp)]
        types = ", ".join(["f32"] * nacc + [vtype] * ncarry)
        res = t.fresh("accs")
        t.emit(
            f"{res}:{nacc + ncarry} = scf.for %kk = %c{step * prefetch}_ to %c{kslice}_ "
            f"step %c{step}_ iter_args({', '.join(inits)}) -> ({types}) {{"
        )
        outer = t.indent
        t.indent += "  "
        kbase = kat("%kk")
        group = flat_group(*loads(kbase))
        acc = shaped([f"%acc_{q}" for q in range(nacc)])
        if prefetch:
            cur = unflat_group([f"%pf_{q}" for q in range(per_group)])
            acc = mmas(*cur, acc)
            rest = [f"%pf_{q}" for q in range(per_group, ncarry)] + group
        else:
            acc = mmas(*unflat_group(group), acc)
            rest = []
        flat = [x for m in acc for f in m for x in f] + rest
        t.emit(f"scf.yield {', '.join(flat)} : {types}")
        t.indent = outer
        t.emit("}")
        acc = shaped([f"{res}#{q}" for q in range(nacc)])
        for p in range(prefetch):
            vals = [f"{res}#{nacc + p * per_group + q}" for q in range(per_group)]
            acc = mmas(*unflat_group(vals), acc)
        return acc

    def stream_loop() -> list:
        # Weights through a per-thread cp.async ring in workgroup memory:
        # ``stages`` slots of ``unroll`` chunks; ``stages - 1`` groups are in
        # flight while the oldest one is multiplied. Every thread reads back
        # only the 16-byte slots it copied itself (no CTA barrier).
        na = len(lrows) if a_ring else 0
        per = nb + na  # slots per chunk: the weight fragments, then the A rows
        nslot = stages * unroll * per
        smem = f"memref<{nslot * block_size * 4}xi32, #gpu.address_space<workgroup>>"
        globals_.append(f'memref.global "private" @{name}__ring : {smem} {{alignment = 16 : i64}}')
        ring = t.op("ring", f"memref.get_global @{name}__ring : {smem}")
        sb = t.op("sb", f"memref.extract_aligned_pointer_as_index {ring} : {smem} -> index")
        toff = t.op("sb", f"arith.muli {tid}, %c16_ : index")
        sb = t.op("sb", f"arith.addi {sb}, {toff} : index")
        relt = t.op("re", f"arith.muli {tid}, %c4 : index")
        # Byte address of each weight fragment's row (k = 0).
        rowp = []
        for f, (mem, mtype, prefix) in enumerate(brefs):
            dims = [int(d) if d.isdigit() else None for d in mtype[7:-1].split("x")[:-1]]
            idx = [x.strip() for x in prefix.split(",")]
            if weight_chunk:  # the group's first row, then the row's place in a chunk
                idx[-1] = chunked[f][1]
            lin = idx[0]
            for d, x in zip(dims[1 : len(idx)], idx[1:], strict=True):
                lin = t.op("lin", f"arith.muli {lin}, %c{d}_ : index")
                lin = t.op("lin", f"arith.addi {lin}, {x} : index")
            lin = t.op("lin", f"arith.muli {lin}, %c{2 * dims[-1]}_ : index")
            if weight_chunk:
                goff = t.op("lin", f"arith.muli {chunked[f][2]}, %c2 : index")
                lin = t.op("lin", f"arith.addi {lin}, {goff} : index")
            base = t.op("gb", f"memref.extract_aligned_pointer_as_index {mem} : {mtype} -> index")
            rowp.append(t.op("gb", f"arith.addi {base}, {lin} : index"))
        if a_ring:
            abase = t.op(
                "ab", f"memref.extract_aligned_pointer_as_index {a_mem} : {a_type} -> index"
            )
            for r in lrows:
                lin = t.op("lin", f"arith.muli {r}, %c{a_row_bytes}_ : index")
                rowp.append(t.op("ab", f"arith.addi {abase}, {lin} : index"))
        iters = kslice // step
        pre = stages - 1
        if bulk_ring:
            bulk = _BulkRing(
                t, name, globals_, ring, smem, warp, lane, stages, nb, unroll, block_size // 32
            )

        def slot(stage: str, u: int, f: int, what: str) -> str:
            """Slot (stage, u, f): byte offset from ``sb`` or i32 index of the ring."""
            if bulk_ring:
                return bulk.slot(stage, u, f)
            q = t.op("q", f"arith.muli {stage}, %c{unroll * per}_ : index")
            q = t.op("q", f"arith.addi {q}, %c{u * per + f}_ : index") if u * per + f else q
            if what == "bytes":
                q = t.op("q", f"arith.muli {q}, %c{block_size * 16}_ : index")
                return t.op("q", f"arith.addi {sb}, {q} : index")
            q = t.op("q", f"arith.muli {q}, %c{block_size * 4}_ : index")
            return t.op("q", f"arith.addi {q}, {relt} : index")

        def issue(k: str, stage: str) -> None:
            if bulk_ring:  # lane 0's k and rows start its warp's pieces
                src = t.op("src", f"arith.muli {chunk_base(k)}, %c2 : index")
                bulk.issue([t.op("src", f"arith.addi {p}, {src} : index") for p in rowp], stage)
                return
            hinted = l2_evict_first is True or (l2_evict_first == "body" and part != "fill")
            policy = t.op("pol", _text.l2_policy("evict_first")) if hinted else None
            for u in range(unroll):
                kb = t.op("kb", f"arith.muli {k}, %c2 : index")
                if u:
                    kb = t.op("kb", f"arith.addi {kb}, %c{64 * u}_ : index")
                kw = kb  # the weights' byte offset (the A rows of a_ring: kb)
                if weight_chunk:
                    ku = t.op("k", f"arith.addi {k}, %c{32 * u}_ : index") if u else k
                    kw = t.op("kb", f"arith.muli {chunk_base(ku)}, %c2 : index")
                for f in range(per):
                    src = t.op("src", f"arith.addi {rowp[f]}, {kw if f < nb else kb} : index")
                    src = t.op("src", f"arith.index_cast {src} : index to i64")
                    if policy is not None and f < nb:  # a weight fragment, not an A row
                        dst = t.op(
                            "dst", f"arith.index_cast {slot(stage, u, f, 'bytes')} : index to i32"
                        )
                        t.emit(
                            _text.asm_line(
                                "cp.async.cg.shared.global.L2::cache_hint [$0], [$1], 16, $2;",
                                [(dst, "i32"), (src, "i64"), (policy, "i64")],
                            )
                        )
                        continue
                    src = t.op("src", f"llvm.inttoptr {src} : i64 to !llvm.ptr<1>")
                    dst = t.op(
                        "dst", f"arith.index_cast {slot(stage, u, f, 'bytes')} : index to i64"
                    )
                    dst = t.op("dst", f"llvm.inttoptr {dst} : i64 to !llvm.ptr<3>")
                    t.emit(
                        f"nvvm.cp.async.shared.global {dst}, {src}, 16, cache = cg : "
                        "!llvm.ptr<3>, !llvm.ptr<1>"
                    )
            t.emit("nvvm.cp.async.commit.group")

        def compute(k: str, stage: str, acc: list, raw_a: list | None = None) -> list:
            def slots(u: int, first: int, count: int) -> list[str]:
                out = []
                for f in range(first, first + count):
                    v = t.op(
                        "sv",
                        f"vector.load {ring}[{slot(stage, u, f, 'index')}] "
                        f"{{alignment = 16 : i64}} : {smem}, vector<4xi32>",
                    )
                    out.append(t.op("sv", f"vector.bitcast {v} : vector<4xi32> to {vtype}"))
                return out

            if raw_a is not None:
                pass  # loaded ahead (a_ahead)
            elif a_ring:
                raw_a = []
                for u in range(unroll):
                    vecs = slots(u, nb, na)
                    offset = u and a_norm is not None  # normed reads gamma at k + 32u
                    ku = t.op("k", f"arith.addi {k}, %c{32 * u}_ : index") if offset else k
                    raw_a.append(normed(vecs, ku))
            else:
                raw_a = loads(k, with_b=False)[0]
            return mmas(raw_a, [slots(u, 0, nb) for u in range(unroll)], acc)

        # a_ahead: the A vectors of group it + a_ahead are loaded in
        # iteration it (before its ring wait) and carried in registers.
        per_a = unroll * len(lrows)

        def load_a(k: str) -> list[str]:
            return [v for vecs in loads(k, with_b=False)[0] for v in vecs]

        def unflat_a(vals: list[str]) -> list[list[str]]:
            return [vals[u * len(lrows) : (u + 1) * len(lrows)] for u in range(unroll)]

        # The fill issues groups [0, early), the body the rest of the first pre.
        first, last = (early, pre) if part == "body" else (0, early if part == "fill" else pre)
        if bulk_ring and part != "body":  # the first copies of the instance are issued here
            bulk.init()
        for p in range(first, last):
            kp = kat(step * p)
            issue(kp, f"%c{p}_" if p else "%c0")
        if part == "fill":
            return []
        if a_norm is not None:
            norm_prologue()
        ahead = [load_a(kat(step * p)) for p in range(a_ahead)]
        ncarry = a_ahead * per_a
        inits = [f"%acc_{q} = %fzero" for q in range(nacc)]
        inits += [f"%pa_{q} = {v}" for q, v in enumerate(v for g in ahead for v in g)]
        types = ", ".join(["f32"] * nacc + [vtype] * ncarry)
        res = t.fresh("accs")
        t.emit(
            f"{res}:{nacc + ncarry} = scf.for %kk = %c0 to %c{step * (iters - pre)}_ "
            f"step %c{step}_ iter_args({', '.join(inits)}) -> ({types}) {{"
        )
        outer = t.indent
        t.indent += "  "
        it = t.op("it", f"arith.divui %kk, %c{step}_ : index")
        nxt = t.op("st", f"arith.addi {it}, %c{pre}_ : index")
        nxt = t.op("st", f"arith.remui {nxt}, %c{stages}_ : index")
        kbase = kat("%kk")
        knext = kat(t.op("k", f"arith.addi %kk, %c{step * pre}_ : index"))
        issue(knext, nxt)
        carried = [f"%pa_{q}" for q in range(ncarry)]
        if a_ahead:
            carried += load_a(kat(t.op("k", f"arith.addi %kk, %c{step * a_ahead}_ : index")))
        cur = t.op("st", f"arith.remui {it}, %c{stages}_ : index")
        if bulk_ring:
            use = t.op("use", f"arith.divui {it}, %c{stages}_ : index")
            bulk.wait(cur, t.op("use", f"arith.remui {use}, %c2 : index"))
        else:
            t.emit(f"nvvm.cp.async.wait.group {pre}")
        acc = compute(
            kbase, cur, shaped([f"%acc_{q}" for q in range(nacc)]),
            unflat_a(carried[:per_a]) if a_ahead else None,
        )  # fmt: skip
        flat = [x for m in acc for f in m for x in f] + carried[per_a:]
        t.emit(f"scf.yield {', '.join(flat)} : {types}")
        t.indent = outer
        t.emit("}")
        acc = shaped([f"{res}#{q}" for q in range(nacc)])
        for q in range(pre):
            i = iters - pre + q
            if bulk_ring:
                bulk.wait(f"%c{i % stages}_" if i % stages else "%c0", f"%c{(i // stages) % 2}_")
            else:
                t.emit(f"nvvm.cp.async.wait.group {pre - 1 - q}")
            k = kat(step * i)
            raw_a = None
            if q < a_ahead:
                raw_a = unflat_a([f"{res}#{nacc + q * per_a + v}" for v in range(per_a)])
            acc = compute(k, f"%c{i % stages}_" if i % stages else "%c0", acc, raw_a)
        if bulk_ring:
            bulk.inval()
        return acc

    acc = stream_loop() if stages else register_loop()
    if part == "fill":
        return []  # the body's function declares the ring
    outer = t.indent
    col_lane = t.op("cl", f"arith.muli {tig}, %c2 : index")
    if wk == 1:
        epilogue(t, acc, rows, col_lane)
        return globals_
    # Split-K: slices 1..WK-1 leave their accumulators in workgroup memory.
    slots = (wk - 1) * wm * wn
    smem = f"memref<{max(slots * nacc * 32, partials)}xf32, #gpu.address_space<workgroup>>"
    globals_.append(f'memref.global "private" @{name}__partials : {smem} {{alignment = 16 : i64}}')
    part = t.op("part", f"memref.get_global @{name}__partials : {smem}")
    wmn = t.op("wmn", f"arith.remui {warp}, %c{wm * wn}_ : index")
    # The previous call's slice-0 warps may still be reading.
    t.emit("gpu.barrier")
    is0 = t.op("is0", f"arith.cmpi eq, {wk_i}, %c0 : index")
    not0 = t.op("not0", f"arith.cmpi ne, {wk_i}, %c0 : index")
    t.emit(f"scf.if {not0} {{")
    t.indent += "  "
    slot = t.op("slot", f"arith.subi {wk_i}, %c1 : index")
    slot = t.op("slot", f"arith.muli {slot}, %c{wm * wn}_ : index")
    slot = t.op("slot", f"arith.addi {slot}, {wmn} : index")
    base = t.op("pb", f"arith.muli {slot}, %c{nacc * 32}_ : index")
    base = t.op("pb", f"arith.addi {base}, {lane} : index")
    for q, v in enumerate(x for m in acc for f in m for x in f):
        at = t.op("pa", f"arith.addi {base}, %c{q * 32}_ : index") if q else base
        t.emit(f"memref.store {v}, {part}[{at}] : {smem}")
    t.indent = outer
    t.emit("}")
    t.emit("gpu.barrier")
    t.emit(f"scf.if {is0} {{")
    t.indent += "  "
    total = [x for m in acc for f in m for x in f]
    for s in range(1, wk):
        base = t.op("pb", f"arith.addi {wmn}, %c{(s - 1) * wm * wn}_ : index")
        base = t.op("pb", f"arith.muli {base}, %c{nacc * 32}_ : index")
        base = t.op("pb", f"arith.addi {base}, {lane} : index")
        for q in range(nacc):
            at = t.op("pa", f"arith.addi {base}, %c{q * 32}_ : index") if q else base
            v = t.op("pv", f"memref.load {part}[{at}] : {smem}")
            total[q] = t.op("sum", f"arith.addf {total[q]}, {v} : f32")
    acc = [[[total[(m * nb + f) * 4 + q] for q in range(4)] for f in range(nb)] for m in range(mf)]
    epilogue(t, acc, rows, col_lane)
    t.indent = outer
    t.emit("}")
    return globals_


def _norm_prologue(
    t: _Text,
    name: str,
    a: tuple[str, str],
    k: int,
    eps: float,
    block_size: int,
    rows: int,
    r0: str,
    last: str,
    lane: str,
    warp: str,
) -> str:
    """Per-row ``rsqrt(mean(a**2) + eps)`` of the block's ``rows`` A rows
    (clamped to the last valid row) into ``@<name>__rms``: warp w takes rows
    w, w + warps, ..., its lanes 8 elements at a time, then a shuffle sum.
    Returns the global's declaration. Only the mean of squares is stored;
    ``_normalise`` adds eps (``%feps``, defined here with ``%fk_<k>``)."""
    a_mem, a_type = a
    t.emit(f"%feps = arith.constant {float(np.float32(eps)):.9e} : f32")
    t.emit(f"%fk_{k} = arith.constant {float(k):.1f} : f32")
    warps = block_size // 32
    smem = f"memref<{rows}xf32, #gpu.address_space<workgroup>>"
    buf = t.op("rmsbuf", f"memref.get_global @{name}__rms : {smem}")
    t.emit("gpu.barrier")  # the previous instance may still read the buffer
    width = t.op("w32", "arith.constant 32 : i32")
    for j in range((rows + warps - 1) // warps):
        local = t.op("nr", f"arith.addi {warp}, %c{j * warps}_ : index") if j else warp
        inside = t.op("nr", f"arith.cmpi ult, {local}, %c{rows}_ : index")
        t.emit(f"scf.if {inside} {{")
        outer = t.indent
        t.indent += "  "
        row = t.op("nr", f"arith.addi {r0}, {local} : index")
        row = t.op("nr", f"arith.minui {row}, {last} : index")
        # Every load of the row issued before the first add: one L2 round trip.
        k0 = t.op("nk", f"arith.muli {lane}, %c8 : index")
        parts = []
        for kk in range(0, k, 256):
            at = t.op("nk", f"arith.addi {k0}, %c{kk}_ : index") if kk else k0
            load = (
                f"vector.load {a_mem}[{row}, {at}] {{alignment = 16 : i64}} : {a_type}, "
                "vector<8xbf16>"
            )
            if kk + 256 <= k:
                parts.append(t.op("nv", load))
                continue
            # A ragged last step: lanes past k add zeros.
            ok = t.op("nk", f"arith.cmpi ult, {at}, %c{k}_ : index")
            v = t.fresh("nv")
            t.emit(f"{v} = scf.if {ok} -> (vector<8xbf16>) {{")
            t.emit(f"  %{v[1:]}l = {load}")
            t.emit(f"  scf.yield %{v[1:]}l : vector<8xbf16>")
            t.emit("} else {")
            t.emit("  %" + v[1:] + "z = arith.constant dense<0.0> : vector<8xbf16>")
            t.emit(f"  scf.yield %{v[1:]}z : vector<8xbf16>")
            t.emit("}")
            parts.append(v)
        total = "%fzero"
        for v in parts:
            f = t.op("nv", "arith.extf " + v + " : vector<8xbf16> to vector<8xf32>")
            sq = t.op("nv", f"arith.mulf {f}, {f} : vector<8xf32>")
            part = t.op("nv", f"vector.reduction <add>, {sq} : vector<8xf32> into f32")
            total = t.op("nv", f"arith.addf {total}, {part} : f32")
        for off in (16, 8, 4, 2, 1):
            o = t.op("no", f"arith.constant {off} : i32")
            sh = t.fresh("nsh")
            t.emit(f"{sh}, %{sh[1:]}ok = gpu.shuffle xor {total}, {o}, {width} : f32")
            total = t.op("nt", f"arith.addf {total}, {sh} : f32")
        first = t.op("nl", f"arith.cmpi eq, {lane}, %c0 : index")
        t.emit(f"scf.if {first} {{")
        mean = t.op("nm", f"arith.divf {total}, %fk_{k} : f32")
        t.emit(f"  memref.store {mean}, {buf}[{local}] : {smem}")
        t.emit("}")
        t.indent = outer
        t.emit("}")
    t.emit("gpu.barrier")
    return f'memref.global "private" @{name}__rms : {smem} {{alignment = 16 : i64}}'


def _normalise(t: _Text, v: str, mean_sq: str, a_norm: tuple[str, str, str, float], k: str) -> str:
    """``bf16(gamma[row, k:k+8] * bf16(v * rsqrt(mean_sq + eps)))``."""
    gamma, gamma_type, grow, eps = a_norm
    r = t.op("nr", f"arith.addf {mean_sq}, %feps : f32")
    r = t.op("nr", f"math.rsqrt {r} : f32")
    rv = t.op("nr", f"vector.broadcast {r} : f32 to vector<8xf32>")
    x = t.op("nx", f"arith.extf {v} : vector<8xbf16> to vector<8xf32>")
    x = t.op("nx", f"arith.mulf {x}, {rv} : vector<8xf32>")
    x = t.op("nx", f"arith.truncf {x} : vector<8xf32> to vector<8xbf16>")
    x = t.op("nx", f"arith.extf {x} : vector<8xbf16> to vector<8xf32>")
    g = t.op(
        "ng",
        f"vector.load {gamma}[{grow}, {k}] {{alignment = 16 : i64}} : {gamma_type}, vector<8xbf16>",
    )
    g = t.op("ng", f"arith.extf {g} : vector<8xbf16> to vector<8xf32>")
    x = t.op("nx", f"arith.mulf {g}, {x} : vector<8xf32>")
    return t.op("nx", f"arith.truncf {x} : vector<8xf32> to vector<8xbf16>")


class _BulkRing:
    """:func:`_body`'s ``bulk_ring``: the ring's slots regrouped per warp
    (warp ``w`` owns ``stages * nb * unroll`` slots of 512 bytes, in that
    order, lane ``l`` at ``16 l`` of each), filled by lane 0's
    ``cp.async.bulk`` copies and counted on one mbarrier per warp and stage."""

    def __init__(
        self, t: _Text, name: str, globals_: list[str], ring: str, smem: str, warp: str,
        lane: str, stages: int, nb: int, unroll: int, warps: int,
    ) -> None:  # fmt: skip
        from .gemm_tc import _asm_ops, _i32, _mbar_wait

        self.t, self.stages, self.nb, self.unroll = t, stages, nb, unroll
        self.asm, self.mbar_wait = _asm_ops, _mbar_wait
        self._i32 = lambda v: _i32(t, v)
        per_warp = stages * nb * unroll  # slots of 512 bytes
        bar_t = f"memref<{stages * warps}xi64, #gpu.address_space<workgroup>>"
        globals_.append(f'memref.global "private" @{name}__bars : {bar_t} {{alignment = 8 : i64}}')
        bars = t.op("bars", f"memref.get_global @{name}__bars : {bar_t}")
        base = t.op("bars", f"memref.extract_aligned_pointer_as_index {bars} : {bar_t} -> index")
        self.bars = t.op(
            "bars",
            f"arith.addi {base}, {t.op('bw', f'arith.muli {warp}, %c{8 * stages}_ : index')} : index",
        )
        rbase = t.op("wr", f"memref.extract_aligned_pointer_as_index {ring} : {smem} -> index")
        woff = t.op("wr", f"arith.muli {warp}, %c{per_warp * 512}_ : index")
        self.wring = t.op("wr", f"arith.addi {rbase}, {woff} : index")
        # i32 index of this lane's 16 bytes in its warp's first slot
        windex = t.op("wi", f"arith.muli {warp}, %c{per_warp * 128}_ : index")
        self.lindex = t.op(
            "wi", f"arith.addi {windex}, {t.op('li', f'arith.muli {lane}, %c4 : index')} : index"
        )
        self.is_l0 = t.op("l0", f"arith.cmpi eq, {lane}, %c0 : index")

    def _bar(self, stage: str) -> str:
        t = self.t
        return self._i32(
            t.op(
                "bar",
                f"arith.addi {self.bars}, {t.op('bo', f'arith.muli {stage}, %c8 : index')} : index",
            )
        )

    def _first(self, stage: str, f: int) -> str:
        """Slot number of (stage, f, u = 0) in the warp's slots."""
        t = self.t
        q = t.op("bq", f"arith.muli {stage}, %c{self.nb}_ : index")
        q = t.op("bq", f"arith.addi {q}, %c{f}_ : index") if f else q
        return t.op("bq", f"arith.muli {q}, %c{self.unroll}_ : index")

    def slot(self, stage: str, u: int, f: int) -> str:
        """The i32 index of this lane's 16 bytes of slot (stage, u, f)."""
        t = self.t
        q = self._first(stage, f)
        q = t.op("bq", f"arith.addi {q}, %c{u}_ : index") if u else q
        q = t.op("bq", f"arith.muli {q}, %c128_ : index")
        return t.op("bq", f"arith.addi {q}, {self.lindex} : index")

    def _lane0(self, body) -> None:
        t = self.t
        t.emit(f"scf.if {self.is_l0} {{")
        t.indent += "  "
        body()
        t.end()

    def _each_bar(self, text: str) -> None:
        """``text`` (``[$0]``: the mbarrier) on every stage's mbarrier."""
        for s in range(self.stages):
            self.asm(self.t, text, [(self._bar(f"%c{s}_" if s else "%c0"), "i32")])

    def init(self) -> None:
        """Lane 0 initialises the warp's mbarriers; the warp then syncs."""

        def body() -> None:
            self._each_bar("mbarrier.init.shared::cta.b64 [$0], 1;")
            self.asm(self.t, "fence.mbarrier_init.release.cluster;", [])

        self._lane0(body)
        self.asm(self.t, "bar.warp.sync -1;", [])

    def issue(self, sources: list[str], stage: str) -> None:
        """Lane 0 copies fragment ``f``'s ``unroll`` chunks from byte address
        ``sources[f]`` into slots (stage, f, 0..), once every lane has read
        what the stage held (the warp syncs first)."""
        t = self.t
        self.asm(t, "bar.warp.sync -1;", [])

        def body() -> None:
            bar = self._bar(stage)
            size = self.unroll * 512
            tx = t.op("tx", f"arith.constant {self.nb * size} : i32")
            nbytes = t.op("tx", f"arith.constant {size} : i32")
            self.asm(t, "fence.proxy.async.shared::cta;", [])
            self.asm(
                t,
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
                [(bar, "i32"), (tx, "i32")],
            )
            for f, src in enumerate(sources[: self.nb]):
                off = t.op("bd", f"arith.muli {self._first(stage, f)}, %c512_ : index")
                dst = self._i32(t.op("bd", f"arith.addi {self.wring}, {off} : index"))
                src64 = t.op("bs", f"arith.index_cast {src} : index to i64")
                self.asm(
                    t,
                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                    "[$0], [$1], $2, [$3];",
                    [(dst, "i32"), (src64, "i64"), (nbytes, "i32"), (bar, "i32")],
                )

        self._lane0(body)

    def wait(self, stage: str, parity: str) -> None:
        """Every lane waits for the stage's copies (``parity``: index 0 or 1)."""
        self.mbar_wait(self.t, self._bar(stage), self._i32(parity))

    def inval(self) -> None:
        """After the last wait: lane 0 invalidates the warp's mbarriers."""
        self.asm(self.t, "bar.warp.sync -1;", [])
        self._lane0(lambda: self._each_bar("mbarrier.inval.shared::cta.b64 [$0];"))


def _constants(t: _Text) -> str:
    """Every ``%c<n>_`` the body uses, plus the fixed ones."""
    used = sorted({int(w[2:-1]) for line in t.lines for w in _words(line) if _is_const(w)})
    lines = [
        "  %c0 = arith.constant 0 : index",
        "  %c1 = arith.constant 1 : index",
        "  %c2 = arith.constant 2 : index",
        "  %c4 = arith.constant 4 : index",
        "  %c8 = arith.constant 8 : index",
        "  %c32 = arith.constant 32 : index",
        "  %fzero = arith.constant 0.0 : f32",
        "  %fone = arith.constant 1.0 : f32",
    ]
    lines += [f"  %c{v}_ = arith.constant {v} : index" for v in used]
    return "\n".join(lines)


def _words(line: str) -> list[str]:
    return line.replace(",", " ").replace("[", " ").replace("]", " ").replace(")", " ").split()


def _is_const(word: str) -> bool:
    return word.startswith("%c") and word.endswith("_") and word[2:-1].isdigit()


def _store_pairs(
    t: _Text,
    values: list[list[list[str]]],
    rows: list[str],
    cols: list[str],
    out: tuple[str, str],
    r1: str,
    n_limit: str | None,
) -> None:
    """Store fragment pairs ``values[m][f]`` (4 f32) as bf16 pairs of ``out``
    at rows ``rows[2m]`` (c0, c1) and ``rows[2m+1]`` (c2, c3), column
    ``cols[f]``, guarded by ``row < r1`` (and ``col < n_limit``)."""
    mem, mtype = out
    for m, per in enumerate(values):
        for f, c in enumerate(per):
            for h in range(2):
                row = rows[2 * m + h]
                ok = t.op("ok", f"arith.cmpi ult, {row}, {r1} : index")
                if n_limit is not None:
                    okc = t.op("ok", f"arith.cmpi ult, {cols[f]}, {n_limit} : index")
                    ok = t.op("ok", f"arith.andi {ok}, {okc} : i1")
                v = t.op("v", f"vector.from_elements {c[2 * h]}, {c[2 * h + 1]} : vector<2xf32>")
                hv = t.op("h", f"arith.truncf {v} : vector<2xf32> to vector<2xbf16>")
                t.emit(f"scf.if {ok} {{")
                t.emit(
                    f"  vector.store {hv}, {mem}[{row}, {cols[f]}] {{alignment = 4 : i64}} : "
                    f"{mtype}, vector<2xbf16>"
                )
                t.emit("}")


def _col(t: _Text, wcol: str, f: int, col_lane: str) -> str:
    """Output column of this lane's pair in the warp's fragment ``f``."""
    c = t.op("col", f"arith.addi {wcol}, %c{8 * f}_ : index") if f else wcol
    return t.op("col", f"arith.addi {c}, {col_lane} : index")


def _warp_cols(t: _Text, n0: str, wm: int, wn: int, nf: int) -> str:
    """The first output column of this warp: ``n0 + wn * nf * 8``."""
    if wn == 1:
        return n0
    tid = t.op("tid", "gpu.thread_id x")
    warp = t.op("warp", f"arith.divui {tid}, %c32 : index")
    wq = t.op("wq", f"arith.divui {warp}, %c{wm}_ : index") if wm > 1 else warp
    wn_i = t.op("wn", f"arith.remui {wq}, %c{wn}_ : index")
    off = t.op("wcol", f"arith.muli {wn_i}, %c{8 * nf}_ : index")
    return t.op("wcol", f"arith.addi {n0}, {off} : index")


def _source(name: str, signature: str, t: _Text, globals_: list[str], comment: str) -> str:
    body = "\n".join(t.lines)
    head = "\n".join(globals_)
    return (
        f"// {comment}\n"
        + (head + "\n" if head else "")
        + f"func.func @{name}({signature}) {{\n{_constants(t)}\n{body}\n  return\n}}\n"
    )


@checked_arguments
def gemm(
    block_m: int,
    block_n: int,
    k: int,
    *,
    name: str = "gemm",
    block_size: int = 256,
    warps: tuple[int, int, int] | None = None,
    unroll: int | None = None,
    prefetch: int | None = None,
    stages: int | None = None,
) -> DeviceFunction:
    """Dense tile ``(i, j)``: ``C[i*BM:, j*BN:] = bf16(A @ B^T)`` (fp32 accumulation).

    ``A: memref<?xKxbf16>`` (M rows), ``B: memref<?xKxbf16>`` (N rows),
    ``C: memref<?x?xbf16>`` (M x N, N even). Grid ``(ceil(M/BM),
    ceil(N/BN))``; rows and columns past ``M``/``N`` are clipped. See the
    module docstring for the warp-MMA algorithm; ``warps = (WM, WN, WK)``
    and ``unroll`` override the defaults of :func:`plan_warps`."""
    wm, wn, wk, unroll = plan_warps(name, block_m, block_n, k, block_size, warps, unroll)
    prefetch = plan_prefetch(name, block_m, k, wk, unroll, prefetch)
    stages = plan_stages(name, k, wk, unroll, block_n // (8 * wn), block_size, stages, prefetch)
    mf, nf = block_m // (16 * wm), block_n // (8 * wn)
    ab, ct = _mma.dense_types(k)
    t = _Text()
    m_rows = t.op("M", f"memref.dim %A, %c0 : {ab}")
    n_rows = t.op("N", f"memref.dim %B, %c0 : {ab}")
    r0 = t.op("r0", f"arith.muli %i, %c{block_m}_ : index")
    rend = t.op("rend", f"arith.addi {r0}, %c{block_m}_ : index")
    r1 = t.op("r1", f"arith.minui {rend}, {m_rows} : index")
    n0 = t.op("n0", f"arith.muli %j, %c{block_n}_ : index")
    valid = _mma.dense_valid(t, r0, n0, m_rows, n_rows)
    nlast = t.op("nlast", f"arith.subi {n_rows}, %c1 : index")
    t.emit(f"scf.if {valid} {{")
    t.indent += "  "
    wcol = _warp_cols(t, n0, wm, wn, nf)

    def b_rows(f: int, grp: str) -> tuple[str, str, str]:
        r = t.op("brow", f"arith.addi {wcol}, %c{8 * f}_ : index") if f else wcol
        r = t.op("brow", f"arith.addi {r}, {grp} : index")
        r = t.op("brow", f"arith.minui {r}, {nlast} : index")
        return "%B", ab, r

    def epilogue(t: _Text, acc, rows, col_lane) -> None:
        cols = [_col(t, wcol, f, col_lane) for f in range(nf)]
        _store_pairs(t, acc, rows, cols, ("%C", ct), r1, n_rows)

    globals_ = _body(
        t, name=name, k=k, block_size=block_size, wm=wm, wn=wn, wk=wk, unroll=unroll, prefetch=prefetch, stages=stages,
        mf=mf, nf=nf, a=("%A", ab), b_rows=b_rows, nb=nf, r0=r0, r1=r1, epilogue=epilogue,
    )  # fmt: skip
    t.close()
    source = _source(
        name, _mma.dense_signature(ab, ct), t, globals_,
        f"{name}: C = A @ B^T, bf16, {block_m}x{block_n} blocks",
    )  # fmt: skip
    reference = _mma.dense_reference(block_m, block_n)
    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def _moe_prologue(
    t: _Text, indptr: str, it: str, block_m: int, block_n: int
) -> tuple[str, str, str]:
    """Decode tile ``i`` of expert ``e``; opens ``scf.if valid`` and returns
    ``(r0, r1, n0)``."""
    e1 = t.op("e1", "arith.addi %e, %c1 : index")
    vals, local, cnt = _mma.moe_decode(t, indptr, it, e1)
    nmb = t.op("nmb", f"arith.addi {cnt}, %c{block_m - 1}_ : index")
    nmb = t.op("nmb", f"arith.divui {nmb}, %c{block_m}_ : index")
    nb = t.op("nb", f"arith.divui {local}, {nmb} : index")
    mb = t.op("mb", f"arith.remui {local}, {nmb} : index")
    r0 = t.op("r0", f"arith.muli {mb}, %c{block_m}_ : index")
    r0 = t.op("r0", f"arith.addi {r0}, {vals['ro0']} : index")
    rend = t.op("rend", f"arith.addi {r0}, %c{block_m}_ : index")
    r1 = t.op("r1", f"arith.minui {rend}, {vals['ro1']} : index")
    n0 = t.op("n0", f"arith.muli {nb}, %c{block_n}_ : index")
    return r0, r1, n0


def _ring_early(name: str, stages: int | None, prefetch_ring: bool | int) -> int:
    """Ring groups a ``prefetch_ring`` tile's prefetch function fills (0: none)."""
    if not prefetch_ring:
        return 0
    if not stages:
        raise GraphError(f"tile '{name}': prefetch_ring fills the weight ring early: give stages")
    early = stages - 1 if prefetch_ring is True else int(prefetch_ring)
    if not 0 < early < stages:
        raise GraphError(
            f"tile '{name}': prefetch_ring={prefetch_ring} groups: the ring has room for "
            f"1..{stages - 1} ahead (stages={stages})"
        )
    return early


def _moe_source(
    name: str, signature: str, what: str, tile: Callable, body: dict, early: int,
    after: Callable[[_Text], None] | None = None,
) -> str:  # fmt: skip
    """An expert tile's MLIR: ``tile(t)`` opens its rows and columns and
    returns ``_body``'s row-dependent arguments (``after(t)``, when given,
    follows the body inside the same region); with ``early``, also
    ``@<name>__prefetch`` filling the ring's first groups (same
    thread-to-slot mapping as the body)."""
    t = _Text()
    globals_ = _body(t, **body, **tile(t), part="body" if early else "all")
    if after is not None:
        after(t)
    t.close()
    source = _source(name, signature, t, globals_, what)
    if early:
        tp = _Text()
        _body(tp, **body, **tile(tp), part="fill")
        tp.close()
        source += _source(
            f"{name}__prefetch", signature, tp, [], f"{name}: the weight ring's first groups"
        )
    return source


def _moe_loop_options(name: str, stages: int, rotate_k: bool, a_ahead: int, by: str = "%i") -> dict:
    """``_body``'s ``rotate`` and ``a_ahead`` for an expert tile: ``rotate_k``
    starts tile ``i``'s k loop at chunk group ``i mod groups`` (the tiles of
    one expert read the same activation rows: as :func:`layer_gemm`'s
    ``rotate_k``, they then stop reading the same lines at once); ``by``
    names the tile index (a slot tile's column block ``%j``)."""
    _check_a_ahead(name, a_ahead, stages)
    return {"rotate": by if rotate_k else None, "a_ahead": a_ahead}


def _check_bulk_ring(
    name: str, bulk_ring: bool, stages: int, chunk: int, a_ring: bool = False
) -> bool:
    """``bulk_ring``: the ring of ``stages`` filled by one bulk copy per warp
    and fragment, which the 32-wide chunked layout lays out in lane order."""
    if bulk_ring and (not stages or chunk != 32 or a_ring):
        raise GraphError(
            f"tile '{name}': bulk_ring copies a warp's fragment as one piece: it needs a ring "
            f"(stages), weight_chunk=32 and no a_ring (stages={stages}, weight_chunk={chunk}, "
            f"a_ring={a_ring})"
        )
    return bool(bulk_ring)


def _check_a_ahead(name: str, a_ahead: int, stages: int | None, a_ring: bool = False) -> None:
    """``a_ahead`` loads A that many ring groups ahead: it needs a ring of
    more stages and A outside the ring."""
    _text.non_negative(name, a_ahead=a_ahead)
    if a_ahead and (a_ring or not stages or a_ahead > stages - 1):
        raise GraphError(
            f"tile '{name}': a_ahead={a_ahead} needs stages > a_ahead and no a_ring "
            f"(stages={stages}, a_ring={a_ring})"
        )


#: The options of :func:`moe_gate_up` and :func:`moe_down`, with their defaults
#: (:func:`layer_gemm`'s of the same names): ``block_size`` threads, ``warps``
#: (``(row, column, k-slice)`` warps, planned when None), ``unroll``,
#: ``prefetch``, ``stages``, ``rotate_k`` (rotating by the tile index ``i``),
#: ``a_ahead``, ``prefetch_ring``, ``slots``, ``slot_logits``,
#: ``prefetch_weights`` (:func:`moe_gate_up`), ``weight_chunk`` (the
#: weights in :func:`chunk_weights`' layout; 0: nn.Linear rows) and
#: ``bulk_ring`` (the ring filled by one ``cp.async.bulk`` per warp and
#: fragment: needs ``stages`` and ``weight_chunk=32``).
MOE_OPTIONS: dict[str, Any] = dict(
    block_size=256, warps=None, unroll=None, prefetch=None, stages=None, rotate_k=False,
    a_ahead=0, prefetch_ring=False, slots=None, slot_logits=0, prefetch_weights=False,
    weight_chunk=0, bulk_ring=False, fuse_down=False,
)  # fmt: skip


@checked_arguments
def moe_gate_up(
    block_m: int,
    block_n: int,
    hidden: int,
    inter: int,
    *,
    experts: int | None = 128,
    name: str = "moe_gate_up",
    **options: Any,
) -> DeviceFunction:
    """MoE gate/up tile ``(i, e)``: ``Hb[r, n] = bf16(silu(g) * u)``.

    ``g = Xp[r] @ Wgu[e, n]^T``, ``u = Xp[r] @ Wgu[e, inter + n]^T`` for the
    rows ``r`` and columns ``n in [nb*BN, nb*BN + BN)`` of the tile (module
    docstring); ``silu(g) = g / (1 + exp(-g))`` in fp32. Buffers: ``Xp:
    memref<?xHxbf16>``, ``Wgu: memref<?x(2I)xHxbf16>``, ``row_off,
    gu_indptr: memref<?xi32>``, ``Hb: memref<?xIxbf16>``. Each warp holds
    the gate and the up fragment of the same columns, so the epilogue is
    local to the thread (``2 * NF`` weight fragments per warp).

    ``options``: :data:`MOE_OPTIONS`. Under the static schedule a triggered
    task's prefetch (``prefetch_ring``) runs once the instance has found its
    expert and before it waits for the expert's rows, so the weights stream
    while the rows are still being written.

    ``slots=K`` makes it a *slot* tile ``(s, j)`` for a static grid of
    ``T*K`` slots (one token's K routed experts each) by column blocks, with
    no routing tables: slot ``s`` reads token row ``X[s // K]``, expert
    ``topk_ids[s // K, s % K]``, and writes ``Hb[s]``; buffers ``(X,
    topk_ids: memref<?xKxi32>, Wgu, Hb)``. Every slot streams its own
    expert's weights, so it suits one token (T = 1: eight distinct experts)
    and wastes bandwidth on tokens that share experts. A slot tile's
    prefetch function (``prefetch_ring``, or ``prefetch_weights``: thread 0
    asks the L2 for the tile's whole weight block, one
    ``cp.async.bulk.prefetch.L2``) reads ``topk_ids``, so the graph must run
    it after the waits that guard the table (``Graph.task(prefetch_after=
    ...)``). ``slot_logits=S`` (with ``slots``): the tile picks its expert itself
    from the router logits ``L: memref<?xExf32>`` (in ``S`` parts, part
    ``p`` in rows ``p*T``) in place of ``topk_ids``: every warp runs the
    top-k tile's selection (:func:`etc.tiles.moe.router_topk`, same ties)
    and takes choice ``s % K``, so it waits for the logits, not the top-k.

    ``fuse_down=True`` (with ``slot_logits``) appends the down projection of
    the tile's own columns: after its ``Hb[s, cs]`` stores and a CTA
    barrier, the tile adds ``w * (Hb[s, cs] @ Wd[e][:, cs]^T)`` into the
    float32 sums ``Out32[s // K]`` (``w`` the choice's renormalised softmax
    weight, computed as the top-k tile computes ``topk_w``), four rows per
    thread and one ``red.global.add.v4.f32`` each. Buffers ``(X, L, Wgu,
    Hb, Wd: memref<Ex H x I xbf16>, Out32: memref<?xHxf32>)``. No down tile
    then waits for a whole slot: the layer streams each tile's gate/up rows
    and its slice of the down weights back to back. ``Out32`` must be zero
    before the first add (a ``zero`` task) and a ``cast`` task rounds it to
    bf16 (``MoEConfig(fuse_down=True)``); the add order varies between
    launches, so the sums may differ in their last float32 bits."""
    o = _mma.tile_options(name, options, MOE_OPTIONS)
    return _moe_tile("gate_up", block_m, block_n, hidden, inter, experts, name, o)


@checked_arguments
def moe_down(
    block_m: int,
    block_n: int,
    hidden: int,
    inter: int,
    *,
    experts: int | None = 128,
    name: str = "moe_down",
    **options: Any,
) -> DeviceFunction:
    """MoE down tile ``(i, e)``: ``Yp[r, n] = bf16(Hb[r] @ Wd[e, n]^T)``.

    Columns ``n in [nb*BN, nb*BN + BN)`` of ``hidden``, reduction over
    ``inter``. Buffers: ``Hb: memref<?xIxbf16>``, ``Wd: memref<?xHxIxbf16>``,
    ``row_off, dn_indptr: memref<?xi32>``, ``Yp: memref<?xHxbf16>``.
    ``options``: :data:`MOE_OPTIONS`, as :func:`moe_gate_up`'s; with
    ``slots=K`` the tile ``(s, j)`` reads ``Hb[s]`` and expert
    ``topk_ids[s // K, s % K]`` and writes ``Yp[s]``: buffers ``(Hb,
    topk_ids, Wd, Yp)``."""
    o = _mma.tile_options(name, options, MOE_OPTIONS)
    return _moe_tile("down", block_m, block_n, hidden, inter, experts, name, o)


def _moe_tile(
    kind: str, block_m: int, block_n: int, hidden: int, inter: int, experts: int | None,
    name: str, options: dict,
) -> DeviceFunction:  # fmt: skip
    """:func:`moe_gate_up` (``kind="gate_up"``: ``k = hidden``, two weight
    fragments per output fragment, the SwiGLU epilogue) or :func:`moe_down`
    (``k = inter``, the plain store)."""
    gate = kind == "gate_up"
    k, n, n_key = (hidden, inter, "inter") if gate else (inter, hidden, "hidden")
    per_n = 2 if gate else 1
    block_size, stages = options["block_size"], options["stages"]
    _positive(name, n_key, n)
    wm, wn, wk, unroll = plan_warps(
        name, block_m, block_n, k, block_size, options["warps"], options["unroll"], b_per_n=per_n
    )
    prefetch = plan_prefetch(name, block_m, k, wk, unroll, options["prefetch"])
    stages = plan_stages(
        name, k, wk, unroll, per_n * (block_n // (8 * wn)), block_size, stages, prefetch
    )
    _check_moe(name, block_n, n, n_key)
    chunk = _mma.check_weight_chunk(name, options["weight_chunk"], k, per_n * n)
    bulk_ring = _check_bulk_ring(name, options["bulk_ring"], stages, chunk)
    early = _ring_early(name, stages, options["prefetch_ring"])
    ed, it = _experts(name, experts)
    mf, nf = block_m // (16 * wm), block_n // (8 * wn)
    slots = options["slots"]
    if options["prefetch_weights"] and slots is None:
        raise GraphError(
            f"tile '{name}': prefetch_weights is the slot tiles' L2 prefetch (slots=K); "
            "a tile of the routing tables prefetches its ring (prefetch_ring)"
        )
    if slots is not None:
        return _moe_slot_tile(
            kind, block_m, block_n, hidden, inter, ed, name, options, slots,
            dict(wm=wm, wn=wn, wk=wk, unroll=unroll, prefetch=prefetch, stages=stages, mf=mf,
                 nf=nf, early=early, weight_chunk=chunk, bulk_ring=bulk_ring),
        )  # fmt: skip
    if gate:
        at, wt, ot = _mma.gate_up_types(hidden, inter, ed)
        a, w, out, indptr = ("%Xp", at), "%Wgu", ("%Hb", ot), "%gu_indptr"
        signature = _mma.gate_up_signature(at, wt, ot, it)
        what = f"{name}: Hb = silu(Xp @ Wg^T) * (Xp @ Wu^T), expert e, {block_m}x{block_n} blocks"
        reference = _mma.gate_up_reference(block_m, block_n, inter, chunk=chunk)
    else:
        at, wt, ot = _mma.down_types(hidden, inter, ed)
        a, w, out, indptr = ("%Hb", at), "%Wd", ("%Yp", ot), "%dn_indptr"
        signature = _mma.down_signature(at, wt, ot, it)
        what = f"{name}: Yp = Hb @ Wd[e]^T, expert e, {block_m}x{block_n} blocks"
        reference = _mma.down_reference(block_m, block_n, chunk=chunk)

    def tile(t: _Text) -> dict:
        r0, r1, n0 = _moe_prologue(t, indptr, it, block_m, block_n)
        wcol = _warp_cols(t, n0, wm, wn, nf)

        b_rows, epilogue = _expert_rows_and_store(t, wcol, nf, inter, (w, wt), out, gate, r1)
        return dict(b_rows=b_rows, r0=r0, r1=r1, epilogue=epilogue)

    body = dict(
        name=name, k=k, block_size=block_size, wm=wm, wn=wn, wk=wk, unroll=unroll, prefetch=prefetch, stages=stages,
        mf=mf, nf=nf, a=a, nb=per_n * nf, early=early, weight_chunk=chunk, bulk_ring=bulk_ring,
        **_moe_loop_options(name, stages, options["rotate_k"], options["a_ahead"]),
    )  # fmt: skip
    source = _moe_source(name, signature, what, tile, body, early)
    fn = DeviceFunction.from_mlir(source, name, reference, block_size=block_size)
    fn.prefetch_fills_shared = bool(early)
    return fn


def _expert_rows_and_store(
    t: _Text, wcol: str, nf: int, inter: int, weights: tuple[str, str], out, gate: bool,
    r1: str, shift: str | None = None,
) -> tuple[Callable, Callable]:  # fmt: skip
    """``_body``'s ``b_rows`` (expert ``%e``'s weight rows; fragments
    ``nf..`` of gate/up are the up rows, ``inter`` further) and epilogue
    (SwiGLU for gate/up, then the stores of rows below ``r1``, moved by
    ``shift`` rows when given) of an expert tile."""
    w, wt = weights

    def b_rows(f: int, grp: str) -> tuple[str, str, str]:
        off = 8 * (f % nf) + (inter if f >= nf else 0)
        r = t.op("brow", f"arith.addi {wcol}, %c{off}_ : index") if off else wcol
        r = t.op("brow", f"arith.addi {r}, {grp} : index")
        return w, wt, f"%e, {r}"

    def epilogue(t: _Text, acc, rows, col_lane) -> None:
        cols = [_col(t, wcol, f, col_lane) for f in range(nf)]
        values = _mma.swiglu(t, acc, nf) if gate else acc
        if shift is not None:
            rows = [t.op("orow", f"arith.addi {r}, {shift} : index") for r in rows]
        _store_pairs(t, values, rows, cols, out, r1, None)

    return b_rows, epilogue


def _moe_slot_tile(
    kind: str, block_m: int, block_n: int, hidden: int, inter: int, ed: str, name: str,
    options: dict, slots: int, plan: dict,
) -> DeviceFunction:  # fmt: skip
    """:func:`moe_gate_up` / :func:`moe_down` with ``slots=K``: tile ``(s, j)``
    of slot ``s``, its expert read from ``topk_ids`` after the waits."""
    _positive(name, "slots", slots)
    _text.non_negative(name, slot_logits=options["slot_logits"])
    from_logits = options["slot_logits"]
    gate = kind == "gate_up"
    if from_logits and (not gate or ed == "?"):
        raise GraphError(
            f"tile '{name}': slot_logits picks the expert of a gate/up slot tile and needs "
            "the expert count (experts=)"
        )
    early, l2 = plan["early"], options["prefetch_weights"]
    if (early or l2) and from_logits:
        raise GraphError(
            f"tile '{name}': slot_logits picks the expert after the waits, in the body; a "
            "prefetch (prefetch_ring, prefetch_weights) would have to repeat the top-k"
        )
    if early and l2:
        raise GraphError(f"tile '{name}': give prefetch_ring or prefetch_weights, not both")
    fused = bool(options["fuse_down"])
    if fused and not (gate and from_logits and not plan["weight_chunk"]):
        raise GraphError(
            f"tile '{name}': fuse_down appends the down projection to a gate/up slot tile that "
            "picks its expert from the logits (slot_logits) and reads nn.Linear rows "
            "(weight_chunk=0)"
        )
    k, n = (hidden, inter) if gate else (inter, hidden)
    per_n = 2 if gate else 1
    wm, wn, nf = plan["wm"], plan["wn"], plan["nf"]
    ids_t = f"memref<?x{ed}xf32>" if from_logits else f"memref<?x{slots}xi32>"
    table = "%L" if from_logits else "%topk_ids"
    if gate:
        at, wt, ot = _mma.gate_up_types(hidden, inter, ed)
        a, w, out = ("%X", at), "%Wgu", ("%Hb", ot)
        signature = f"%s: index, %j: index, %X: {at}, {table}: {ids_t}, %Wgu: {wt}, %Hb: {ot}"
        what = f"{name}: Hb[s] = silu(X[s/K] @ Wg[e]^T) * (X[s/K] @ Wu[e]^T), slot s"
        if fused:
            dwt, sums_t = _mma.down_types(hidden, inter, ed)[1], f"memref<?x{hidden}xf32>"
            signature += f", %Wd: {dwt}, %Out32: {sums_t}"
            what += "; Out32[s/K] += w * Hb[s, cs] @ Wd[e][:, cs]^T"
    else:
        at, wt, ot = _mma.down_types(hidden, inter, ed)
        a, w, out = ("%Hb", at), "%Wd", ("%Yp", ot)
        signature = f"%s: index, %j: index, %Hb: {at}, %topk_ids: {ids_t}, %Wd: {wt}, %Yp: {ot}"
        what = f"{name}: Yp[s] = Hb[s] @ Wd[e]^T, slot s"

    def tile(t: _Text) -> dict:
        token = t.op("tok", f"arith.divui %s, %c{slots}_ : index")
        r0 = token if gate else "%s"
        rows = t.op("arows", f"memref.dim {a[0]}, %c0 : {at}")
        valid = t.op("valid", f"arith.cmpi ult, {r0}, {rows} : index")
        t.emit(f"scf.if {valid} {{")
        t.indent += "  "
        kth = t.op("kth", f"arith.remui %s, %c{slots}_ : index")
        if from_logits:
            raw, weight = _slot_expert(t, token, kth, rows, int(ed), slots, from_logits, ids_t)
            fused_at.update(token=token, weight=weight)
        else:
            raw = t.op("eid", f"memref.load %topk_ids[{token}, {kth}] : {ids_t}")
        t.emit(f"%e = arith.index_cast {raw} : i32 to index")
        r1 = t.op("r1", f"arith.addi {r0}, %c1 : index")
        # The block's one A row is r0; its output row is the slot's.
        shift = t.op("shift", f"arith.subi %s, {r0} : index")
        s1 = t.op("s1", "arith.addi %s, %c1 : index")
        n0 = t.op("n0", f"arith.muli %j, %c{block_n}_ : index")
        wcol = _warp_cols(t, n0, wm, wn, nf)
        fused_at["n0"] = n0

        b_rows, epilogue = _expert_rows_and_store(
            t, wcol, nf, inter, (w, wt), out, gate, s1, shift=shift
        )

        return dict(b_rows=b_rows, r0=r0, r1=r1, epilogue=epilogue)

    fused_at: dict[str, str] = {}

    def after(t: _Text) -> None:
        _fused_down_slice(t, fused_at, block_n, hidden, inter, ed, options["block_size"], ot)

    body = dict(
        name=name, k=k, block_size=options["block_size"], wm=wm, wn=wn, wk=plan["wk"],
        unroll=plan["unroll"], prefetch=plan["prefetch"], stages=plan["stages"], mf=plan["mf"],
        nf=nf, a=a, nb=per_n * nf, early=early, weight_chunk=plan["weight_chunk"],
        bulk_ring=plan["bulk_ring"],
        **_moe_loop_options(name, plan["stages"], options["rotate_k"], options["a_ahead"], "%j"),
    )  # fmt: skip
    source = _moe_source(name, signature, what, tile, body, early, after if fused else None)
    if l2:
        source += _slot_weight_prefetch(name, signature, wt, w, block_n, n, k, per_n, slots)
    reference = _mma.slot_reference(
        kind, block_n, inter, slots, from_logits, chunk=plan["weight_chunk"], fuse_down=fused
    )
    fn = DeviceFunction.from_mlir(source, name, reference, block_size=options["block_size"])
    fn.prefetch_fills_shared = bool(early)
    return fn


#: Rows of the down weights a thread of a ``fuse_down`` tile adds per
#: ``red.global.add.v4.f32`` (consecutive rows of one token's sums).
FUSED_ROWS = 4


def _fused_down_slice(
    t: _Text, at: dict[str, str], block_n: int, hidden: int, inter: int, ed: str,
    block_size: int, hb_t: str,
) -> None:  # fmt: skip
    """A ``fuse_down`` slot tile's down projection of its own columns ``cs
    = [n0, n0 + block_n)``: ``Out32[token, n] += w * Hb[s, cs] .
    Wd[e, n, cs]`` for every row ``n`` of ``hidden``. Thread ``tid`` takes
    rows ``4*tid + 4*block_size*b .. +3`` (all their 16-byte loads of a
    step issued before the sums), then one ``red.global.add.v4.f32``."""
    from .gemm_tc import _address, _asm_ops

    wd_t, sums_t = _mma.down_types(hidden, inter, ed)[1], f"memref<?x{hidden}xf32>"
    n0, token, weight = at["n0"], at["token"], at["weight"]
    # The epilogue's Hb stores are visible to the whole CTA after a barrier.
    t.emit("gpu.barrier")
    tid = t.op("ftid", "gpu.thread_id x")
    hv = []
    for q in range(block_n // 8):
        col = t.op("fcol", f"arith.addi {n0}, %c{8 * q}_ : index") if q else n0
        h = t.op(
            "fh", f"vector.load %Hb[%s, {col}] {{alignment = 16 : i64}} : {hb_t}, vector<8xbf16>"
        )
        hv.append((col, t.op("fhf", f"arith.extf {h} : vector<8xbf16> to vector<8xf32>")))
    first = t.op("frow", f"arith.muli {tid}, %c{FUSED_ROWS}_ : index")
    step = FUSED_ROWS * block_size
    base = _address(t, "%Out32", sums_t)
    tok_at = t.op("ftok", f"arith.muli {token}, %c{hidden}_ : index")
    zero = t.op("fz", "arith.constant dense<0.0> : vector<8xf32>")
    b = t.fresh("fb")
    t.emit(f"scf.for {b} = {first} to %c{hidden}_ step %c{step}_ {{")
    t.indent += "  "
    rows = [b] + [t.op("fr", f"arith.addi {b}, %c{r}_ : index") for r in range(1, FUSED_ROWS)]
    loaded = [
        [t.op("fw", f"vector.load %Wd[%e, {row}, {col}] {{alignment = 16 : i64}} : {wd_t}, vector<8xbf16>")
         for col, _ in hv]
        for row in rows
    ]  # fmt: skip
    sums = []
    for per_row in loaded:
        acc = zero
        for w, (_, hf) in zip(per_row, hv, strict=True):
            wf = t.op("fwf", f"arith.extf {w} : vector<8xbf16> to vector<8xf32>")
            acc = t.op("facc", f"vector.fma {wf}, {hf}, {acc} : vector<8xf32>")
        total = t.op("fsum", f"vector.reduction <add>, {acc} : vector<8xf32> into f32")
        sums.append(t.op("fws", f"arith.mulf {total}, {weight} : f32"))
    off = t.op("foff", f"arith.addi {tok_at}, {b} : index")
    off = t.op("foff", f"arith.muli {off}, %c4_ : index")
    off = t.op("fat", f"arith.index_cast {off} : index to i64")
    addr = t.op("fat", f"arith.addi {base}, {off} : i64")
    _asm_ops(
        t,
        "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};",
        [(addr, "i64"), *((v, "f32") for v in sums)],
    )
    t.end()


def _slot_weight_prefetch(
    name: str, signature: str, wt: str, w: str, block_n: int, n: int, k: int, per_n: int,
    slots: int,
) -> str:  # fmt: skip
    """``@<name>__prefetch`` of a slot tile: thread 0 asks the L2 for the
    tile's weight rows of expert ``topk_ids[s // K, s % K]`` (clamped to
    the experts: an L2 prefetch must not leave the weights), one block per
    gate/up half."""
    consts = ["  %c1 = arith.constant 1 : index", f"  %cK = arith.constant {slots} : index"]
    row = [
        "    %tok = arith.divui %s, %cK : index",
        "    %kth = arith.remui %s, %cK : index",
        f"    %eid = memref.load %topk_ids[%tok, %kth] : memref<?x{slots}xi32>",
        "    %e0 = arith.index_cast %eid : i32 to index",
        f"    %ne = memref.dim {w}, %c0 : {wt}",
        "    %elast = arith.subi %ne, %c1 : index",
        "    %e = arith.minui %e0, %elast : index",
        f"    %base = memref.extract_aligned_pointer_as_index {w} : {wt} -> index",
        "    %lrow = arith.muli %e, %rows : index",
        "    %n0 = arith.muli %j, %bn : index",
        "    %row = arith.addi %lrow, %n0 : index",
    ]
    return _l2_prefetch_function(name, signature, consts, row, block_n, n, k, per_n)


def _slot_expert(
    t: _Text, token: str, kth: str, tokens: str, experts: int, topk: int, splits: int, lt: str
) -> tuple[str, str]:
    """Choice ``kth`` (i32) of the top-``topk`` of token ``token``'s router
    logits ``%L`` (``splits`` parts of ``tokens`` rows each) and its
    renormalised softmax weight (f32): every warp runs
    :func:`etc.tiles.moe.router_topk`'s selection, then reads lane ``kth``'s."""
    from .moe import _topk_select

    ind = t.indent
    t.emit(f"%t = arith.addi {token}, %c0 : index")
    t.emit("%lane = gpu.lane_id")
    t.emit(f"%cE = arith.constant {experts} : index")
    t.emit(f"%cEm1 = arith.constant {experts - 1} : index")
    t.emit("%ninf = arith.constant 0xFF800000 : f32")
    t.emit("%c32_i32 = arith.constant 32 : i32")
    for line in _text.shuffle_constants("").split("\n"):
        t.emit(line)
    for p in range(1, splits):
        t.emit(f"%tS{p} = arith.muli {tokens}, %c{p}_ : index")
    ops, consts, pick_id, pick_p, total = _topk_select(experts, topk, splits, lt, ind)
    for line in consts.split("\n"):
        t.emit(line.strip())
    t.lines.extend(ops.split("\n"))
    k32 = t.op("k32", f"arith.index_cast {kth} : index to i32")
    raw = t.fresh("eid")
    t.emit(f"{raw}, %{raw[1:]}ok = gpu.shuffle idx {pick_id}, {k32}, %c32_i32 : i32")
    # Lane k's weight as the top-k tile stores it in topk_w (the same ops).
    mine = t.op("wmine", f"arith.divf {pick_p}, {total} : f32")
    weight = t.fresh("wk")
    t.emit(f"{weight}, %{weight[1:]}ok = gpu.shuffle idx {mine}, {k32}, %c32_i32 : f32")
    return raw, weight


#: Epilogues of :func:`layer_gemm`.
LAYER_EPILOGUES = ("store", "residual", "swiglu")
#: ``layer_gemm`` main loops: per-thread loads / cp.async ring ("sync"), a
#: bulk-copy ring filled before the waits ("bulk", :mod:`etc.tiles.gemm_bulk`),
#: TMA + wgmma with split-K ("tma", :mod:`etc.tiles.gemm_layer_tma`), or whole
#: weight lines through a per-thread ring on CUDA cores or, for 8-16 rows,
#: mma.sync ("gemv", :mod:`etc.tiles.gemv_layer`).
LAYER_CORES = ("sync", "bulk", "tma", "gemv")
#: What each ``layer_gemm`` epilogue computes (the comment of its source).
LAYER_WHAT = {"store": "C = A @ W[l]^T", "residual": "C += A @ W[l]^T", "swiglu": "C = swiglu"}


def _layer_signature(
    at: str, wt: str, ct: str, *, columns_first: bool, stacked: bool, before_w: str = "",
    after_c: str = "",
) -> str:  # fmt: skip
    """The arguments of a :func:`layer_gemm` tile: its coordinates (``%l``
    first over stacked layers; ``%j`` before ``%i`` with ``columns_first``),
    ``%A``, the buffers ``before_w`` names, ``%W``, ``%C``, those ``after_c``
    names."""
    ij = "%j: index, %i: index" if columns_first else "%i: index, %j: index"
    coords = f"%l: index, {ij}" if stacked else ij
    return f"{coords}, %A: {at}{before_w}, %W: {wt}, %C: {ct}{after_c}"


def _residual_loads(
    t: _Text, rows: list[str], cols: list[str], out, r1: str
) -> dict[tuple[int, int, int], str]:
    """``C[row, col]`` (a ``vector<2xf32>``) of every pair this thread stores,
    by (row pair ``m``, fragment ``f``, half ``h``); rows past the block are
    clamped."""
    last = t.op("rlast", f"arith.subi {r1}, %c1 : index")
    return {
        (m, f, h): _residual_pair(t, out, rows[2 * m + h], col, last)
        for m in range(len(rows) // 2)
        for f, col in enumerate(cols)
        for h in range(2)
    }


def _residual_pair(t: _Text, out, row: str, col: str, last: str) -> str:
    """``C[min(row, last), col .. col + 1]`` as a ``vector<2xf32>``."""
    mem, mtype = out
    row = t.op("rr", f"arith.minui {row}, {last} : index")
    old = t.op(
        "old",
        f"vector.load {mem}[{row}, {col}] {{alignment = 4 : i64}} : {mtype}, vector<2xbf16>",
    )
    return t.op("old", f"arith.extf {old} : vector<2xbf16> to vector<2xf32>")


def _add_residual(
    t: _Text, acc: list[list[list[str]]], rows: list[str], cols: list[str], out, r1: str,
    olds: dict | None = None,
) -> list[list[list[str]]]:  # fmt: skip
    """``f32(bf16(acc)) + f32(C[row, col])`` for every pair this thread stores
    (the residual is read before the store that overwrites it; rows past the
    block are clamped for the read and not stored). ``olds``: the residual
    already loaded (:func:`_residual_loads`)."""
    last = None if olds else t.op("rlast", f"arith.subi {r1}, %c1 : index")
    res = []
    for m, per in enumerate(acc):
        per_out = []
        for f, c in enumerate(per):
            vals = list(c)
            for h in range(2):
                if olds:
                    old = olds[m, f, h]
                else:  # each pair's load next to its add
                    old = _residual_pair(t, out, rows[2 * m + h], cols[f], last)
                for q in range(2):
                    o = t.op("o", f"vector.extract {old}[{q}] : f32 from vector<2xf32>")
                    a = _mma.bf16_round(t, c[2 * h + q])
                    vals[2 * h + q] = t.op("res", f"arith.addf {a}, {o} : f32")
            per_out.append(vals)
        res.append(per_out)
    return res


def _refuse(name: str, core: str, given: dict[str, bool]) -> None:
    """Raises GraphError naming the options in ``given`` that are set."""
    on = [key for key, value in given.items() if value]
    if on:
        raise GraphError(f"tile '{name}': {', '.join(on)} do not apply to core={core!r}")


@checked_arguments
def layer_gemm(
    block_m: int,
    block_n: int,
    n: int,
    k: int,
    *,
    layers: int | None,
    epilogue: str = "store",
    name: str | None = None,
    block_size: int = 256,
    warps: tuple[int, int, int] | None = None,
    unroll: int | None = None,
    prefetch: int | None = None,
    stages: int | None = None,
    columns_first: bool = False,
    prefetch_weights: bool = False,
    rmsnorm: tuple[int, int, float] | None = None,
    a_ring: bool = False,
    a_ahead: int = 0,
    rotate_k: bool = False,
    core: str = "sync",
    kc: int | None = None,
    norm_sums: bool = False,
    sums_out: tuple[int, int] | None = None,
    row_scale: tuple[int, int, float] | None = None,
    prefetch_ring: bool | int | str = False,
    row_paths: tuple[int, ...] | None = None,
    k_splits: int = 1,
    counter_row: int = 0,
    a_box: int = 64,
    weight_chunk: int = 0,
    bulk_ring: bool = False,
    epilogue_ahead: bool = False,
    meeting: str = "rows",
    meet_share: int = 1,
    refill: str = "wait",
    l2_evict_first: bool | Literal["body"] = False,
    short_path: bool = True,
    whole_lines: bool = False,
    stamps: bool = False,
    argmax_key: bool = False,
) -> DeviceFunction:
    """A projection of a decoder layer: tile ``(l, i, j)`` computes rows
    ``[i*BM, (i+1)*BM)`` and columns ``[j*BN, (j+1)*BN)`` of ``A @ W[l]^T``.

    Buffers: ``A: memref<?xKxbf16>`` (activations), ``W:
    memref<LxN'xKxbf16>`` (every layer's weight, ``nn.Linear`` layout),
    ``C: memref<?xNxbf16>``. With ``layers=None`` the tile is ``(i, j)``
    over one weight ``W: memref<N'xKxbf16>`` (the LM head). ``epilogue``:

    * ``"store"``: ``C = bf16(acc)`` (``N' = N``);
    * ``"residual"``: ``C = bf16(bf16(acc) + C)``, the residual stream
      updated in place (``N' = N``);
    * ``"swiglu"``: ``W[l]`` holds the gate rows ``[0, N)`` then the up rows
      ``[N, 2N)`` (``N' = 2N``): ``C = bf16(bf16(silu(bf16(g))) *
      bf16(u))``.

    ``prefetch_weights`` adds ``@<name>__prefetch`` (see
    :class:`etc.DeviceFunction`): thread 0 asks for the tile's weight rows
    (one contiguous block, two for swiglu) with ``cp.async.bulk.prefetch.L2``
    before the instance waits for its activations, so the weights stream
    into L2 while the previous stage finishes.

    ``rmsnorm = (stride, offset, eps)`` fuses the RMSNorm that precedes the
    projection: the tile takes ``G: memref<?xKxbf16>`` (stacked norm weights)
    after ``A`` and multiplies ``bf16(G[stride*l + offset] * bf16(A *
    rsqrt(mean(A**2) + eps)))`` instead of ``A`` (Hugging Face's rounding),
    each tile computing the statistics of its own rows.

    ``a_ring`` (needs ``stages``) copies the activations through the
    ``cp.async`` ring with the weights: each loop iteration then waits on
    the ring alone instead of also on an L2 load of its A vectors.

    ``a_ahead`` (needs ``stages``) loads the activations that many k
    iterations ahead into registers, so no iteration waits on an L2 load.

    ``rotate_k`` starts column block ``j``'s k loop at its ``j``-th chunk
    group (modulo the groups) so the tiles of a stage spread their reads of
    the shared activations over the L2 instead of all reading the same
    lines at once.

    ``columns_first`` makes the tile ``(l, j, i)``: over a grid ordered
    that way the row blocks of one column block are consecutive instances,
    which consecutive CTAs run together, so a batch of several row blocks
    reads each weight block from HBM once and from L2 after that.

    ``norm_sums`` (with ``rmsnorm``): the RMSNorm's statistics come from
    ``S: memref<?x?xi64>`` (after ``G``, fixed point:
    :data:`etc.tiles._text.SUM_BITS`): ``S[stride*l + offset, row]`` holds
    the row's sum of squares, added up by the tasks that wrote ``A``; the
    tile reads one value per row instead of a pass over ``A``.

    ``sums_out = (stride, offset)`` (``residual`` epilogue): the tile adds
    each row's sum of squares of the bf16 values it stores to ``S[stride*l +
    offset, row]`` (``S: memref<?x?xi64>`` after ``C``, fixed-point atomic
    adds, so their order does not change the sum): what a
    following ``norm_sums`` tile reads.

    ``row_scale = (stride, offset, eps)``: the RMSNorm of ``A`` folded into
    the projection. ``W`` holds the norm's weight multiplied into its
    columns (:func:`fold_norm`), and the tile scales row ``r`` of ``A @
    W^T`` by ``rsqrt(S[stride*l + offset, r] / K + eps)`` before its
    epilogue (``S: memref<?x?xi64>`` after ``A``: the rows' sums of squares,
    added up by the tasks that wrote ``A``, see ``sums_out``). The k loop is
    the plain one: no statistics prologue, no per-vector rescaling.

    ``prefetch_ring`` (needs ``stages``) adds ``@<name>__prefetch``: every
    thread issues its ``cp.async`` copies of the weight ring's first
    ``stages - 1`` groups (an int: that many, at most ``stages - 1``) before
    the instance waits for its activations, and the body starts with them in
    flight (one HBM latency per stage off the critical path). Sets
    :attr:`etc.DeviceFunction.prefetch_fills_shared`.

    ``row_paths`` (multiples of 16, ascending, the last ``block_m``): the
    tile branches at run time to the smallest of these row counts that
    holds its block's rows (``min(M - i*BM, BM)``), each path a loop with
    every warp on all its rows (one warp row: each weight fragment read
    once and reused for every row). One artifact then serves a batch of 1
    with 16-row fragments and a batch of 64 with one 64-row block instead
    of four 16-row ones that each stream the weights. The paths share the
    weight ring. Not with ``rmsnorm`` or ``a_ring``.

    ``weight_chunk=C`` (sync core; the tma core with ``C = 64``): ``W`` in
    :func:`chunk_weights`' layout (8-row groups of ``C``-wide k chunks):
    each k step of a warp's 8-row fragment reads one contiguous piece (the
    tma core reads it through a 4-D map, the same boxes in shared memory).
    ``bulk_ring`` (sync core, with ``stages`` and ``weight_chunk=32``):
    lane 0 of each warp fills the ring with one ``cp.async.bulk`` per
    fragment and stage instead of every thread's 16-byte copies.

    ``core="bulk"`` streams the weights with ``cp.async.bulk`` through a
    shared-memory ring whose first ``stages`` chunks of ``kc`` values of
    ``k`` the tile's prefetch function issues before the instance waits
    (:mod:`etc.tiles.gemm_bulk`). It takes ``stages``, ``kc``, ``rotate_k``
    and ``columns_first`` only.

    ``core="gemv"`` (``block_m=1``) streams one row's product on CUDA cores:
    whole 128-byte weight lines through a per-thread ``cp.async`` ring,
    narrow blocks splitting ``k`` over the warps
    (:mod:`etc.tiles.gemv_layer`); with ``block_m`` 8 or 16, the same
    stream into ``mma.sync`` with the weights as the ``A`` operand
    (``short_path``: a 16-row tile of at most 8 rows takes an 8-row loop;
    ``whole_lines``: each warp's weight copies read whole 128-byte lines).
    It takes ``stages``, ``columns_first``, ``row_scale``, ``sums_out``,
    ``prefetch_ring``, ``short_path`` and ``whole_lines`` only, and
    ``argmax_key`` (``store``; over 8 to 64 rows, ``block_n`` dividing 32
    or a multiple of it: the LM head's greedy argmax folded into its
    epilogue, one i64 key a row in ``K: memref<?xi64>`` after ``C``;
    :func:`etc.tiles.llama.argmax_take` reads it).

    ``core="tma"`` loads 64-row blocks of ``A`` and the weights with TMA into
    a ``wgmma`` pipeline (:mod:`etc.tiles.gemm_layer_tma`); ``block_m`` must
    be 64. ``k_splits=S`` splits each block's ``k`` loop over ``S``
    instances, whose float32 partial products meet in a workspace; the last
    to finish adds them in part order and runs the epilogue;
    ``prefetch_ring`` asks the L2 for the first stages' weight boxes (an
    int: that many k-tiles) before the waits; ``a_box`` rows per activation
    box (boxes past ``M`` skipped); ``epilogue_ahead`` issues the epilogue's
    row sums and residual loads before the k loop. It takes ``stages``,
    ``columns_first``, ``row_scale``, ``sums_out``, ``k_splits``,
    ``counter_row``, ``prefetch_ring``, ``a_box``, ``epilogue_ahead``,
    ``meeting`` (how the split-K parts meet), ``meet_share`` (how many of
    them add the parts: :func:`etc.tiles.gemm_layer_tma.layer_gemm_tma`) and
    ``refill`` (how thread 0 refills the ring: :func:`etc.tiles.gemm_tc.gemm`'s
    option), ``l2_evict_first`` (its weight boxes' TMA copies, the ring
    prefetch's too, carry the L2 evict-first hint) and ``stamps`` (a
    measuring aid: thread 0's clock at points of each instance, in a last
    buffer) only.

    ``l2_evict_first`` (the sync core with ``stages``, or the tma core): the
    weight copies carry an L2 evict-first policy, so weights read once do
    not push out of the L2 what is read again, nor the lines the kernel
    wrote (which would then be written back to the HBM; in the decoder's
    large kernel 261 → 48 MB a step with its KV cache marked too,
    ``bench/RESULTS.md`` item 205). ``"body"`` (the sync core):
    the tile's own copies only, not its ``@<name>__prefetch``'s (a kernel
    that inlines the prefetch before its waits keeps its code, and ptxas
    its register allocation, as without the hint).

    The rounding follows Hugging Face's bf16 Llama, so the model matches
    ``LlamaForCausalLM`` closely. Algorithm and the ``warps``, ``unroll``,
    ``prefetch``, ``stages`` options: see the module docstring and
    :func:`gemm`."""
    name = name or f"layer_gemm_{epilogue}"
    if epilogue not in LAYER_EPILOGUES:
        raise GraphError(
            f"tile '{name}': epilogue {epilogue!r} is not one of {', '.join(LAYER_EPILOGUES)}"
        )
    if layers is not None:
        _positive(name, "layers", layers)
    _positive(name, "n", n)
    if core not in LAYER_CORES:
        raise GraphError(f"tile '{name}': core {core!r} is not one of {', '.join(LAYER_CORES)}")
    if norm_sums and rmsnorm is None:
        raise GraphError(f"tile '{name}': norm_sums reads the statistics of rmsnorm: give rmsnorm")
    if sums_out is not None and (epilogue != "residual" or layers is None):
        raise GraphError(f"tile '{name}': sums_out needs the residual epilogue over stacked layers")
    if not (isinstance(l2_evict_first, bool) or l2_evict_first == "body"):
        raise GraphError(
            f"tile '{name}': l2_evict_first must be a bool or 'body', got {l2_evict_first!r}"
        )
    if l2_evict_first == "body" and core == "tma":
        raise GraphError(
            f"tile '{name}': l2_evict_first='body' (the ring fill's copies unmarked) is the "
            "sync core's; the tma core takes a bool"
        )
    # The options of the sync core, which the other cores do not take.
    sync_only = {
        "warps": warps is not None,
        "unroll": unroll is not None,
        "prefetch": prefetch is not None,
        "prefetch_weights": prefetch_weights,
        "rmsnorm": rmsnorm is not None,
        "a_ring": a_ring,
        "a_ahead": bool(a_ahead),
        "norm_sums": norm_sums,
        "row_paths": row_paths is not None,
        "weight_chunk": bool(weight_chunk),
        "bulk_ring": bulk_ring,
        "l2_evict_first": l2_evict_first,
    }
    if core == "tma":
        from .gemm_layer_tma import layer_gemm_tma

        shared_with_tma = ("weight_chunk", "l2_evict_first")
        tma_refused = {key: v for key, v in sync_only.items() if key not in shared_with_tma}
        _refuse(name, core, {**tma_refused, "kc": kc is not None})
        return layer_gemm_tma(
            block_m, block_n, n, k, layers=layers, epilogue=epilogue, name=name,
            block_size=block_size, stages=stages, columns_first=columns_first,
            row_scale=row_scale, sums_out=sums_out, k_splits=k_splits, counter_row=counter_row,
            prefetch=prefetch_ring, a_box=a_box, rotate_k=rotate_k, weight_chunk=weight_chunk,
            epilogue_ahead=epilogue_ahead, meeting=meeting, meet_share=meet_share,
            refill=refill, l2_evict_first=l2_evict_first, stamps=stamps,
        )  # fmt: skip
    if stamps:
        raise GraphError(f"tile '{name}': stamps need core='tma'")
    if k_splits != 1 or a_box != 64 or meeting != "rows" or meet_share != 1 or refill != "wait":
        raise GraphError(
            f"tile '{name}': k_splits={k_splits}, a_box={a_box}, meeting={meeting!r}, "
            f"meet_share={meet_share} and refill={refill!r} need core='tma'"
        )
    if epilogue_ahead:
        raise GraphError(f"tile '{name}': epilogue_ahead needs core='tma'")
    if argmax_key and core != "gemv":
        raise GraphError(f"tile '{name}': argmax_key needs core='gemv'")
    if (not short_path or whole_lines) and core != "gemv":
        raise GraphError(f"tile '{name}': short_path and whole_lines apply to core='gemv' only")
    if core == "gemv":
        from .gemv_layer import layer_gemv

        _refuse(name, core, {**sync_only, "kc": kc is not None, "rotate_k": rotate_k})
        return layer_gemv(
            block_n, n, k, layers=layers, epilogue=epilogue, name=name, block_size=block_size,
            stages=stages, columns_first=columns_first, row_scale=row_scale, sums_out=sums_out,
            prefetch_ring=prefetch_ring, block_m=block_m, short_path=short_path,
            whole_lines=whole_lines, argmax_key=argmax_key,
        )  # fmt: skip
    if core == "bulk":
        _refuse(name, core, {**sync_only, "sums_out": sums_out is not None,
                             "row_scale": row_scale is not None, "prefetch_ring": prefetch_ring})  # fmt: skip
        return _layer_gemm_bulk(
            name, block_m, block_n, n, k, layers=layers, epilogue=epilogue,
            block_size=block_size, stages=stages, kc=kc, columns_first=columns_first,
            rotate_k=rotate_k,
        )  # fmt: skip
    if kc is not None:
        raise GraphError(f"tile '{name}': kc applies to core='bulk' only")
    per_n = 2 if epilogue == "swiglu" else 1
    paths = _plan_row_paths(name, block_m, row_paths)
    if len(paths) > 1:
        if rmsnorm is not None or a_ring:
            raise GraphError(f"tile '{name}': row_paths do not combine with rmsnorm or a_ring")
        if warps is None:
            wn = math.gcd(block_size // 32, block_n // 8)
            warps = (1, wn, block_size // 32 // wn)
        elif warps[0] != 1:
            raise GraphError(
                f"tile '{name}': row_paths put every warp on all rows: warps {warps} must "
                "have WM = 1"
            )
        if unroll is None:  # the largest path's (the fewest), so one ring serves all
            unroll = plan_warps(name, block_m, block_n, k, block_size, warps, None, per_n)[3]
    wm, wn, wk, unroll = plan_warps(
        name, paths[0], block_n, k, block_size, warps, unroll, b_per_n=per_n
    )
    prefetch = plan_prefetch(name, block_m, k, wk, unroll, prefetch)
    nf = block_n // (8 * wn)
    mf = paths[0] // (16 * wm)
    ring_slots = per_n * nf + (2 * mf if a_ring else 0)
    stages = plan_stages(name, k, wk, unroll, ring_slots, block_size, stages, prefetch)
    if a_ring and not stages:
        raise GraphError(f"tile '{name}': a_ring streams A through the cp.async ring: give stages")
    if prefetch_ring and (not stages or a_ring or prefetch_weights):
        raise GraphError(
            f"tile '{name}': prefetch_ring fills the weight ring early: it needs stages and "
            f"neither a_ring nor prefetch_weights (stages={stages}, a_ring={a_ring}, "
            f"prefetch_weights={prefetch_weights})"
        )
    early = _ring_early(name, stages, prefetch_ring)
    chunk = _mma.check_weight_chunk(name, weight_chunk, k, per_n * n)
    bulk_ring = _check_bulk_ring(name, bulk_ring, stages, chunk, a_ring)
    if l2_evict_first and (not stages or bulk_ring):
        raise GraphError(
            f"tile '{name}': l2_evict_first marks the weight ring's cp.async copies: it needs "
            f"stages and not bulk_ring (stages={stages}, bulk_ring={bulk_ring})"
        )
    if row_scale is not None and rmsnorm is not None:
        raise GraphError(f"tile '{name}': give rmsnorm or row_scale (a folded norm), not both")
    _check_a_ahead(name, a_ahead, stages, a_ring)
    _check_moe(name, block_n, n, "n")
    at, wt, ct = _layer_types(layers, per_n, n, k)
    t = _Text()
    r0, r1, n0, valid, _ = _layer_block(t, at, block_m, block_n, n)
    t.emit(f"scf.if {valid} {{")
    t.indent += "  "
    wcol = _warp_cols(t, n0, wm, wn, nf)
    b_rows = _weight_rows(t, wcol, nf, n, wt, layers is not None)
    st = _text.SUMS_TYPE

    def layer_row(stride: int, offset: int) -> str:
        return _layer_slot(t, layers is not None, stride, offset)

    sums = ("%S", st, layer_row(*sums_out)) if sums_out is not None else None
    store = _layer_store(epilogue, wcol, nf, ct, r1, sums)
    if row_scale is not None:
        stride, offset, eps = row_scale
        store = _scaled_rows(store, ("%R", st, layer_row(stride, offset)), k, eps, r1)
    a_norm = norm_in = None
    if rmsnorm is not None:
        stride, offset, eps = rmsnorm
        grow = layer_row(stride, offset)
        a_norm = ("%G", at, grow, eps)
        norm_in = ("%S", st, grow) if norm_sums else None
    body = dict(
        name=name, k=k, block_size=block_size, wm=wm, wn=wn, wk=wk, unroll=unroll, prefetch=prefetch,
        stages=stages, mf=mf, nf=nf, a=("%A", at), b_rows=b_rows, nb=per_n * nf, r0=r0, r1=r1,
        epilogue=store, a_norm=a_norm, a_ring=a_ring, rotate="%j" if rotate_k else None,
        a_ahead=a_ahead, norm_sums=norm_in, part="body" if prefetch_ring else "all", early=early,
        partials=(wk - 1) * wn * (block_m // 16) * per_n * nf * 4 * 32, weight_chunk=chunk,
        bulk_ring=bulk_ring, l2_evict_first=l2_evict_first,
    )  # fmt: skip
    globals_ = _row_path_bodies(t, body, paths, r0, r1)
    t.close()
    gamma = f", %R: {st}" if row_scale is not None else ""
    gamma += f", %G: {at}" if rmsnorm is not None else ""
    gamma += f", %S: {st}" if norm_sums else ""
    signature = _layer_signature(
        at, wt, ct, columns_first=columns_first, stacked=layers is not None, before_w=gamma,
        after_c=f", %S: {st}" if sums_out is not None else "",
    )  # fmt: skip
    source = _source(
        name,
        signature,
        t,
        globals_,
        f"{name}: {LAYER_WHAT[epilogue]}, bf16, {block_m}x{block_n} blocks",
    )
    if prefetch_weights:
        source += _weight_prefetch(name, signature, wt, block_n, n, k, per_n, layers is not None)
    if prefetch_ring:
        # The same thread-to-slot mapping as the body, so each thread's
        # copies are the ones its own first ring waits cover.
        tp = _Text()
        _, _, n0p, valid_p, _ = _layer_block(tp, at, block_m, block_n, n)
        tp.emit(f"scf.if {valid_p} {{")
        tp.indent += "  "
        wcol_p = _warp_cols(tp, n0p, wm, wn, nf)
        body["b_rows"] = _weight_rows(tp, wcol_p, nf, n, wt, layers is not None)
        _body(tp, **{**body, "part": "fill"})
        tp.close()
        source += _source(
            f"{name}__prefetch", signature, tp, [], f"{name}: the weight ring's first groups"
        )
    reference = layer_gemm_reference(
        block_m, block_n, n, epilogue, stacked=layers is not None, columns_first=columns_first,
        rmsnorm=rmsnorm, norm_sums=norm_sums, sums_out=sums_out, row_scale=row_scale, k=k,
        weight_chunk=chunk,
    )  # fmt: skip
    fn = DeviceFunction.from_mlir(source, name, reference, block_size=block_size)
    fn.prefetch_fills_shared = bool(prefetch_ring)
    return fn


def _plan_row_paths(name: str, block_m: int, row_paths: tuple[int, ...] | None) -> tuple[int, ...]:
    """The row counts of :func:`layer_gemm`'s run-time paths (``(block_m,)``: one)."""
    if row_paths is None:
        return (block_m,)
    paths = tuple(row_paths)
    if (
        not paths
        or any(not isinstance(p, int) or p <= 0 or p % 16 for p in paths)
        or list(paths) != sorted(set(paths))
        or paths[-1] != block_m
    ):
        raise GraphError(
            f"tile '{name}': row_paths={row_paths!r} must be ascending multiples of 16 "
            f"ending at block_m={block_m}"
        )
    return paths


def _row_path_bodies(t: _Text, body: dict, paths: tuple[int, ...], r0: str, r1: str) -> list[str]:
    """:func:`_body` once per row path, the smallest that holds ``r1 - r0``
    rows chosen at run time (nested ``scf.if``); the globals declared once."""
    if len(paths) == 1:
        return _body(t, **body)
    rows = t.op("nrows", f"arith.subi {r1}, {r0} : index")
    globals_: list[str] = []
    closes = 0
    for q, m in enumerate(paths):
        if q < len(paths) - 1:
            fits = t.op("fits", f"arith.cmpi ule, {rows}, %c{m}_ : index")
            t.emit(f"scf.if {fits} {{")
            t.indent += "  "
        t.emit(f"// {m}-row path")
        for line in _body(t, **{**body, "mf": m // 16}):
            if line not in globals_:
                globals_.append(line)
        if q < len(paths) - 1:
            t.indent = t.indent[:-2]
            t.emit("} else {")
            t.indent += "  "
            closes += 1
    for _ in range(closes):
        t.end()
    return globals_


def _weight_rows(
    t: _Text, wcol: str, nf: int, n: int, wt: str, stacked: bool
) -> Callable[[int, str], tuple[str, str, str]]:
    """``b_rows`` of :func:`_body` for :func:`layer_gemm`'s ``W``: fragment
    ``f`` of this warp (the up rows ``n`` further for ``f >= nf``)."""

    def b_rows(f: int, grp: str) -> tuple[str, str, str]:
        off = 8 * (f % nf) + (n if f >= nf else 0)
        r = t.op("brow", f"arith.addi {wcol}, %c{off}_ : index") if off else wcol
        r = t.op("brow", f"arith.addi {r}, {grp} : index")
        return "%W", wt, f"%l, {r}" if stacked else r

    return b_rows


def _scaled_rows(
    store: Callable[..., None], sums: tuple[str, str, str], k: int, eps: float, r1: str
) -> Callable[..., None]:
    """``store`` after multiplying each row's accumulators by ``rsqrt(sums[slot,
    row] / k + eps)`` (a folded RMSNorm; rows past ``r1`` read ``r1 - 1``'s).
    Its ``prologue(t, rows, col_lane)`` loads the scales (and what
    ``store``'s prologue loads) ahead."""
    mem, mtype, slot = sums
    ready: dict[tuple[str, ...], list[str]] = {}

    def scales(t: _Text, rows: list[str]) -> list[str]:
        last = t.op("last", f"arith.subi {r1}, %c1 : index")
        fk = t.op("fk", f"arith.constant {float(k):.1f} : f32")
        feps = t.op("feps", f"arith.constant {float(np.float32(eps)):.9e} : f32")
        out = []
        for row in rows:
            r = t.op("sr", f"arith.minui {row}, {last} : index")
            total = _load_sum(t, mem, mtype, slot, r)
            ms = t.op("ms", f"arith.divf {total}, {fk} : f32")
            ms = t.op("ms", f"arith.addf {ms}, {feps} : f32")
            out.append(t.op("rs", f"math.rsqrt {ms} : f32"))
        return out

    def prologue(t: _Text, rows, col_lane) -> None:
        ready[tuple(rows)] = scales(t, rows)
        store.prologue(t, rows, col_lane)

    def scaled(t: _Text, acc, rows, col_lane, frags: list[int] | None = None) -> None:
        # A sharer's fragments (``frags``) leave the scales for the others.
        scale = (ready.pop if frags is None else ready.get)(tuple(rows), None) or scales(t, rows)
        out = [
            [
                [t.op("sc", f"arith.mulf {c[q]}, {scale[2 * m + q // 2]} : f32") for q in range(4)]
                for c in per
            ]
            for m, per in enumerate(acc)
        ]
        store(t, out, rows, col_lane, **({} if frags is None else {"frags": frags}))

    scaled.prologue = prologue
    return scaled


def fold_norm(weight: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``bf16(W * gamma)`` over the last axis (bf16 bits as uint16): the
    weight a ``layer_gemm(row_scale=...)`` tile takes for a projection that
    follows an RMSNorm with weight ``gamma`` (``gamma`` broadcasts against
    ``W``: ``(K,)`` or ``(L, 1, K)`` for stacked layers)."""
    return f32_to_bf16(bf16_to_f32(weight) * bf16_to_f32(gamma))


def _layer_block(t: _Text, at: str, block_m: int, block_n: int, n: int) -> tuple[str, ...]:
    """Tile ``(i, j)`` of :func:`layer_gemm`: its rows ``[r0, r1)`` (clipped to
    ``A``'s), first column ``n0``, whether it has rows (i1), and ``A``'s rows."""
    m_rows = t.op("M", f"memref.dim %A, %c0 : {at}")
    r0 = t.op("r0", f"arith.muli %i, %c{block_m}_ : index")
    rend = t.op("rend", f"arith.addi {r0}, %c{block_m}_ : index")
    r1 = t.op("r1", f"arith.minui {rend}, {m_rows} : index")
    n0 = t.op("n0", f"arith.muli %j, %c{block_n}_ : index")
    return r0, r1, n0, _mma.dense_valid(t, r0, n0, m_rows, f"%c{n}_"), m_rows


def _layer_slot(t: _Text, stacked: bool, stride: int, offset: int) -> str:
    """``stride * l + offset`` (an index value): a row of a sums buffer or
    of the stacked norm weights."""
    row = t.op("grow", f"arith.constant {offset} : index")
    if stacked and stride:
        lrow = t.op("grow", f"arith.muli %l, %c{stride}_ : index")
        row = t.op("grow", f"arith.addi {lrow}, {row} : index")
    return row


def _row_scale_reference(
    row_scale: tuple[int, int, float] | None, R, layer: int, rs: slice, k: int
) -> np.ndarray | np.float32:
    """The folded norm's ``rsqrt(S[stride*l + offset, rows] / k + eps)`` as a
    column (1 without ``row_scale``)."""
    if row_scale is None:
        return np.float32(1)
    stride, offset, eps = row_scale
    mean = _text.unfixed_reference(R[stride * layer + offset, rs]) / np.float32(k)
    return (1.0 / np.sqrt(mean + np.float32(eps))).astype(np.float32)[:, None]


def _layer_types(layers: int | None, per_n: int, n: int, k: int) -> tuple[str, str, str]:
    """The types of :func:`layer_gemm`'s ``A``, ``W`` and ``C``."""
    stacked = f"{layers}x" if layers is not None else ""
    return (
        f"memref<?x{k}xbf16>",
        f"memref<{stacked}{per_n * n}x{k}xbf16>",
        f"memref<?x{n}xbf16>",
    )


def _layer_store(
    epilogue: str, wcol: str, nf: int, ct: str, r1: str, sums: tuple[str, str, str] | None = None
) -> Callable[..., None]:
    """The epilogue of :func:`layer_gemm` on ``acc[m][f]`` (mma fragments).
    ``sums = (memref, type, slot)``: also add each row's sum of squares of
    the stored bf16 values to ``memref[slot, row]`` (atomically). Its
    ``prologue(t, rows, col_lane)`` loads the residual ahead (a main loop
    that calls it before its k loop hides that round trip)."""
    olds: dict[tuple[str, ...], dict] = {}

    def cols_of(t: _Text, col_lane: str) -> list[str]:
        return [_col(t, wcol, f, col_lane) for f in range(nf)]

    def prologue(t: _Text, rows, col_lane) -> None:
        if epilogue == "residual":
            olds[tuple(rows)] = _residual_loads(t, rows, cols_of(t, col_lane), ("%C", ct), r1)

    def store(t: _Text, acc, rows, col_lane, frags: list[int] | None = None) -> None:
        """``frags``: ``acc`` holds only these fragments of the thread (gate,
        then up), as a split-K meeting's sharer stores them; the residual
        loaded ahead stays for the other sharers' branches."""
        if frags is None:
            cols, old = cols_of(t, col_lane), olds.pop(tuple(rows), None)
        else:
            cols = [_col(t, wcol, f, col_lane) for f in frags]
            ahead = olds.get(tuple(rows))
            old = ahead and {
                (m, i, h): ahead[m, f, h]
                for m in range(len(acc))
                for i, f in enumerate(frags)
                for h in range(2)
            }
        if epilogue == "swiglu":
            acc = _mma.swiglu(t, acc, len(cols), hf_rounding=True)
        elif epilogue == "residual":
            acc = _add_residual(t, acc, rows, cols, ("%C", ct), r1, old)
        _store_pairs(t, acc, rows, cols, ("%C", ct), r1, None)
        if sums is not None:
            _add_sums_of_squares(t, acc, rows, r1, sums)

    store.prologue = prologue
    return store


def _load_sum(t: _Text, mem: str, mtype: str, slot: str, row: str) -> str:
    """``sums[slot, row]`` (fixed point, :data:`etc.tiles._text.SUM_BITS`) as an f32."""
    fixed = t.op("ss", f"memref.load {mem}[{slot}, {row}] : {mtype}")
    ops, total = _text.from_fixed(fixed, t.fresh("uf")[1:], "")
    for line in ops.split("\n"):
        t.emit(line)
    return total


def _add_sums_of_squares(
    t: _Text, acc: list[list[list[str]]], rows: list[str], r1: str, sums: tuple[str, str, str]
) -> None:
    """``sums[slot, row] += sum(f32(bf16(v))**2)`` over this warp's values of
    each of its rows: the 4 lanes of a row group add with shuffles, the
    first of them adds atomically (rows ``< r1`` only), in fixed point
    (:data:`etc.tiles._text.SUM_BITS`: the order of the adds does not
    change the sum)."""
    width = t.op("w32", "arith.constant 32 : i32")
    tig = t.op("tig", "gpu.lane_id")
    tig = t.op("tig", f"arith.remui {tig}, %c4 : index")
    first = t.op("first", f"arith.cmpi eq, {tig}, %c0 : index")
    for m, per in enumerate(acc):
        for h in range(2):
            total = "%fzero"
            for c in per:
                for q in (2 * h, 2 * h + 1):
                    v = _mma.bf16_round(t, c[q])
                    total = t.op("sq", f"math.fma {v}, {v}, {total} : f32")
            for off in (1, 2):
                o = t.op("so", f"arith.constant {off} : i32")
                sh = t.fresh("ssh")
                t.emit(f"{sh}, %{sh[1:]}ok = gpu.shuffle xor {total}, {o}, {width} : f32")
                total = t.op("sq", f"arith.addf {total}, {sh} : f32")
            row = rows[2 * m + h]
            ok = t.op("ok", f"arith.cmpi ult, {row}, {r1} : index")
            ok = t.op("ok", f"arith.andi {ok}, {first} : i1")
            t.emit(f"scf.if {ok} {{")
            t.indent += "  "
            add_fixed_sum(t, total, sums, row)
            t.end()


def add_fixed_sum(t: _Text, total: str, sums: tuple[str, str, str], row: str) -> None:
    """``sums[slot, row] += fixed(total)`` (f32 ``total``; ``sums = (memref,
    type, slot)``), atomically in fixed point
    (:data:`etc.tiles._text.SUM_BITS`: the order of the adds does not
    change the sum)."""
    mem, mtype, slot = sums
    ops, fixed = _text.to_fixed(total, t.fresh("fx")[1:], "")
    for line in ops.split("\n"):
        t.emit(line)
    t.emit(
        f"%{t.fresh('old')[1:]} = memref.atomic_rmw addi {fixed}, {mem}[{slot}, {row}] : "
        f"(i64, {mtype}) -> i64"
    )


def _layer_gemm_bulk(
    name: str, block_m: int, block_n: int, n: int, k: int, *, layers: int | None, epilogue: str,
    block_size: int, stages: int | None, kc: int | None, columns_first: bool, rotate_k: bool,
) -> DeviceFunction:  # fmt: skip
    """:func:`layer_gemm` with ``core="bulk"`` (see :mod:`etc.tiles.gemm_bulk`)."""
    from . import gemm_bulk, gemm_tc

    per_n = 2 if epilogue == "swiglu" else 1
    _positive(name, "block_n", block_n)
    if block_n % 8:
        raise GraphError(f"tile '{name}': block_n={block_n} must be a multiple of 8")
    _text.check_block(name, block_size)
    plan = gemm_bulk.plan_bulk(name, per_n * block_n, block_m, k, block_size, kc, stages)
    _check_moe(name, block_n, n, "n")
    at, wt, ct = _layer_types(layers, per_n, n, k)

    def segments(t: _Text) -> list[tuple[str, int]]:
        first = t.op("wr", f"arith.muli %j, %c{block_n}_ : index")
        if layers is not None:
            lrow = t.op("wr", f"arith.muli %l, %c{per_n * n}_ : index")
            first = t.op("wr", f"arith.addi {lrow}, {first} : index")
        runs = [(first, block_n)]
        if per_n == 2:
            runs.append((t.op("wr", f"arith.addi {first}, %c{n}_ : index"), block_n))
        return runs

    def w_base(t: _Text) -> str:
        return t.op("wb", f"memref.extract_aligned_pointer_as_index %W : {wt} -> index")

    rotate = "%j" if rotate_k else None
    t = gemm_tc._Text()
    r0, r1, n0, valid, _ = _layer_block(t, at, block_m, block_n, n)
    t.emit(f"scf.if {valid} {{")
    t.indent += "  "
    globals_ = gemm_bulk.body(
        t, name=name, plan=plan, segments=segments, w_base=w_base, a=("%A", at), r0=r0, r1=r1,
        rotate=rotate, epilogue=_layer_store(epilogue, n0, block_n // 8, ct, r1),
    )  # fmt: skip
    t.close()
    signature = _layer_signature(
        at, wt, ct, columns_first=columns_first, stacked=layers is not None
    )
    comment = (
        f"{name}: {LAYER_WHAT[epilogue]}, bf16, {block_m}x{block_n} blocks, bulk ring of "
        f"{plan.stages} x {plan.kc}"
    )
    source = _source(name, signature, t, globals_, comment)
    tp = gemm_tc._Text()
    gemm_bulk.prefetch(
        tp, name=name, plan=plan, segments=segments, w_base=w_base,
        valid=lambda t: _layer_block(t, at, block_m, block_n, n)[3], rotate=rotate,
    )  # fmt: skip
    source += _source(f"{name}__prefetch", signature, tp, [], f"{name}: the first weight chunks")
    reference = layer_gemm_reference(
        block_m, block_n, n, epilogue, stacked=layers is not None, columns_first=columns_first
    )
    fn = DeviceFunction.from_mlir(source, name, reference, block_size=block_size)
    fn.prefetch_fills_shared = True
    return fn


def _l2_prefetch_function(
    name: str,
    signature: str,
    consts: list[str],
    row: list[str],
    block_n: int,
    n: int,
    k: int,
    per_n: int,
) -> str:
    """``@<name>__prefetch``: thread 0 asks the L2 for ``block_n`` weight rows
    of ``k`` bf16 from row ``%row`` (which ``row``, run in thread 0's branch,
    defines from ``%base``, ``%bn``, ``%rows``), and for the up rows ``n``
    further with ``per_n = 2``: one ``cp.async.bulk.prefetch.L2`` each."""
    lines = [
        f"func.func @{name}__prefetch({signature}) {{",
        "  %c0 = arith.constant 0 : index",
        f"  %bn = arith.constant {block_n} : index",
        f"  %rows = arith.constant {per_n * n} : index",
        f"  %row_bytes = arith.constant {2 * k} : index",
        f"  %size = arith.constant {block_n * k * 2} : i32",
        *consts,
        "  %tid = gpu.thread_id x",
        "  %first = arith.cmpi eq, %tid, %c0 : index",
        "  scf.if %first {",
        *row,
    ]
    for half in range(per_n):
        r = "%row"
        if half:
            lines.append(f"    %row{half} = arith.addi %row, %c{n}_n : index")
            r = f"%row{half}"
        lines += [
            f"    %off{half} = arith.muli {r}, %row_bytes : index",
            f"    %addr{half} = arith.addi %base, %off{half} : index",
            f"    %p{half} = arith.index_cast %addr{half} : index to i64",
            "    llvm.inline_asm has_side_effects asm_dialect = att "
            f'"cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r" %p{half}, %size : '
            "(i64, i32) -> ()",
        ]
    lines += ["  }", "  return", "}"]
    if per_n > 1:
        lines.insert(2, f"  %c{n}_n = arith.constant {n} : index")
    return "\n".join(lines) + "\n"


def _weight_prefetch(
    name: str, signature: str, wt: str, block_n: int, n: int, k: int, per_n: int, stacked: bool
) -> str:
    """``@<name>__prefetch``: L2 prefetches of the tile's weight rows."""
    row = [
        f"    %base = memref.extract_aligned_pointer_as_index %W : {wt} -> index",
        "    %n0 = arith.muli %j, %bn : index",
    ]
    if stacked:
        row += [
            "    %lrow = arith.muli %l, %rows : index",
            "    %row = arith.addi %lrow, %n0 : index",
        ]
    else:
        row += ["    %row = arith.addi %n0, %c0 : index"]
    return _l2_prefetch_function(name, signature, [], row, block_n, n, k, per_n)


def layer_gemm_reference(
    block_m: int,
    block_n: int,
    n: int,
    epilogue: str,
    *,
    stacked: bool = True,
    columns_first: bool = False,
    rmsnorm: tuple[int, int, float] | None = None,
    norm_sums: bool = False,
    sums_out: tuple[int, int] | None = None,
    row_scale: tuple[int, int, float] | None = None,
    k: int | None = None,
    weight_chunk: int = 0,
) -> Callable[..., None]:
    """The numpy reference of :func:`layer_gemm` (same rounding; ``W`` in
    the ``weight_chunk`` layout when given)."""

    def rnd(x: np.ndarray) -> np.ndarray:
        return bf16_to_f32(f32_to_bf16(x.astype(np.float32)))

    def normed(A: np.ndarray, G: np.ndarray | None, S, layer: int, rs: slice) -> np.ndarray:
        if rmsnorm is None:
            return A
        stride, offset, eps = rmsnorm
        a = bf16_to_f32(A)
        if norm_sums:
            total = _text.unfixed_reference(S[stride * layer + offset, rs])
            mean = (total / np.float32(a.shape[1]))[:, None]
        else:
            mean = (a * a).mean(axis=1, keepdims=True)
        r = (1.0 / np.sqrt(mean + np.float32(eps))).astype(np.float32)
        gamma = bf16_to_f32(G[stride * layer + offset])
        return f32_to_bf16(gamma[None, :] * rnd(a * r))

    def split(rest: tuple):
        rest = list(rest)
        R = rest.pop(0) if row_scale is not None else None
        G = rest.pop(0) if rmsnorm is not None else None
        S_in = rest.pop(0) if norm_sums else None
        W, C = rest.pop(0), rest.pop(0)
        S_out = rest.pop(0) if sums_out is not None else None
        return R, G, S_in, W, C, S_out

    def layered(l: int, a: int, b: int, A, *rest) -> None:  # noqa: E741
        R, G, S_in, W, C, S_out = split(rest)
        apply(a, b, A, R, G, S_in, l, W[l], C, S_out)

    def single(a: int, b: int, A, *rest) -> None:
        R, G, S_in, W, C, S_out = split(rest)
        apply(a, b, A, R, G, S_in, 0, W, C, S_out)

    def apply(a: int, b: int, A, R, G, S_in, layer: int, W, C, S_out) -> None:
        i, j = (b, a) if columns_first else (a, b)
        rs = slice(i * block_m, min((i + 1) * block_m, A.shape[0]))
        cs = slice(j * block_n, min((j + 1) * block_n, n))
        rows = normed(A[rs], G, S_in, layer, rs)
        acc = _mma.bf16_matmul(rows, _mma.weight_rows(W, cs, weight_chunk))
        up = None
        if epilogue == "swiglu":
            up_rows = slice(cs.start + n, cs.stop + n)
            up = _mma.bf16_matmul(rows, _mma.weight_rows(W, up_rows, weight_chunk))
        finish_layer_reference(
            epilogue,
            acc,
            up,
            _row_scale_reference(row_scale, R, layer, rs, k),
            C,
            rs,
            cs,
            S_out,
            sums_out,
            layer,
        )

    return layered if stacked else single


def finish_layer_reference(
    epilogue: str, acc: np.ndarray, up: np.ndarray | None, r, C: np.ndarray, rs: slice,
    cs: slice, S_out: np.ndarray | None, sums_out: tuple[int, int] | None, layer: int,
) -> None:  # fmt: skip
    """The numpy epilogue of a :func:`layer_gemm` block: ``acc`` (and the up
    rows' ``up`` for swiglu) are the float32 products of rows ``rs`` and
    columns ``cs``, ``r`` the rows' folded-norm scale (or 1)."""

    def rnd(x: np.ndarray) -> np.ndarray:
        return bf16_to_f32(f32_to_bf16(x.astype(np.float32)))

    acc = acc * r
    if epilogue == "residual":
        acc = rnd(acc) + bf16_to_f32(C[rs, cs])
    elif epilogue == "swiglu":
        g, u = rnd(acc), rnd(up * r)
        with np.errstate(over="ignore"):
            acc = rnd(g / (np.float32(1) + np.exp(-g))) * u
    C[rs, cs] = f32_to_bf16(acc.astype(np.float32))
    if S_out is not None:
        stride, offset = sums_out
        stored = bf16_to_f32(C[rs, cs])
        # Fixed-point parts of 8 columns (a warp adds one part of its
        # fragments: the same sum to within a few 2**-SUM_BITS).
        parts = (stored * stored).reshape(stored.shape[0], -1, 8).sum(axis=2, dtype=np.float32)
        S_out[stride * layer + offset, rs] += _text.fixed_reference(parts).sum(axis=1)

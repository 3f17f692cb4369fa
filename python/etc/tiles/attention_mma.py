"""Decode attention on the tensor cores (ETC issue 7): :func:`attention_mma`.

The tile of :func:`etc.tiles.llama.attention` (same arguments, outputs and
numpy reference) with its arithmetic on ``mma.sync.m16n8k16`` (bf16, fp32
accumulation) instead of per-lane dot products. Why: in
``bench/decode_attention.py`` the per-lane online-softmax tile streams
K and V at 3.0-3.3 TB/s with one query head per kv head and at half that
with Llama's four; its instructions, not its loads, bound it.

Each warp owns blocks of 16 cached positions of the split (blocks
``warp * NB .. warp * NB + NB - 1`` of every CTA step) and keeps, for the
query head ``g = lane / 4`` (``g < G``), a running max, sum and output:

* **Scores** ``S = Q K^T``: the ``G`` query heads are the rows of the A
  operand (rows ``G..15`` zero), 8 positions the columns, ``D`` the
  reduction. The reduction dims are permuted (the same way for Q and K) so
  that a lane's B fragments for all ``D / 16`` k-steps are the ``D / 4``
  consecutive dims ``t4 * D/4 ..`` of one K row (``t4 = lane % 4``): two
  16-byte loads per row at D=64.
* **Softmax** on the accumulators: a lane holds 4 scores of its head per
  16 positions; the block max is two shuffles (the 4 lanes of a head).
* **Output** ``O = P V``: the scores' accumulators are the A fragments of
  ``P`` as they stand (positions in order), V rows the B operand with the
  output dims permuted so that a lane reads ``D / 8`` consecutive dims of 4
  V rows (16-byte loads at D=64); the permutation is undone when the
  output is written. ``P`` is rounded to bf16 for the mma (as
  FlashAttention does); the sum uses the fp32 values.

Position ``L`` (the split's last, if it holds it) is warp 0's first: its
score, from ``qkv`` with per-lane arithmetic before the loop, and its value
start warp 0's running state; it is never read from the cache (split 0
writes it there before its loop, which reads only rows below ``L``). The
warps merge through workgroup memory (``4 * warps * G * (D + 2)`` bytes)
as in :func:`~etc.tiles.llama.attention_online`.
"""

from __future__ import annotations

import math
import textwrap

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..errors import GraphError
from . import _paged, _text
from ._mma import mma
from .gemm_tc import (
    MAP_TYPE,
    _asm,
    _asm_ops,
    _i32,
    _mbar_wait,
    _Text,
    bf16_pair,
    mbarrier_inval,
)
from .llama import (
    _WG,
    EMPTY_MAX,
    _check_attention,
    _check_fused_combine,
    _f32,
    _fused_combine,
    _fused_combine_global,
    _fused_combine_reference,
    _split_lines,
    _split_reference,
    _warp_merge,
)

__all__ = ["attention_mma", "PIPELINES", "RELEASES", "STAMPS"]

#: ``attention_mma(pipeline=...)`` modes.
PIPELINES = ("none", "registers", "smem", "tma")
#: ``attention_mma(release=...)`` modes of the TMA ring.
RELEASES = ("math", "read", "read_early")
#: ``attention_mma(stamps=True)``: what each of an instance's stamp words
#: holds (thread 0's ``%clock64``, then ``%globaltimer`` in ns).
STAMPS = (
    "entry",  # the function's first instruction (after the instance's waits)
    "setup",  # the score of position L computed: the query and key roped
    "step0_full",  # loop step 0: its ring stage awaited (with pipeline="tma")
    "step0_data",  # loop step 0: its K and V read from the ring (or loaded)
    "step0_end",  # loop step 0: its arithmetic issued, its stage refilled
    "loop_end",  # after warp 0's last loop step
    "warps_done",  # the barrier after every warp's loop and position L
    "end",  # the partials (or the output) written
    "entry_ns",
    "end_ns",
    "prefetch_ns",  # the prefetch function's entry (before the waits; with prefetch)
    "prefetch_end_ns",  # ... and its end, the ring's first steps issued
)


class _T(_Text):
    """The GEMM tiles' MLIR text buffer (fresh names, hoisted index
    constants ``%c<v>_``) with index and f32 binary ops; the function's
    parts are cut from one buffer (one name counter, one constant set)."""

    def idx(self, op: str, a: str, b: str) -> str:
        return self.op("x", f"arith.{op} {a}, {b} : index")

    def f(self, op: str, a: str, b: str) -> str:
        return self.op("f", f"arith.{op} {a}, {b} : f32")

    #: (sequence, kv head) items per instance (``attention_mma(items=...)``).
    items = 1
    #: The ring's copies are L2 evict-first (``attention_mma(kv_evict_first=...)``).
    kv_evict_first = False
    #: A paged cache's kv heads (``attention_mma(page_size=...)``), else 0.
    page_kv = 0
    #: TMA boxes a ring step's K (and V) takes: pages smaller than the step.
    page_boxes = 1

    def paged_row(self, pos: str, g: str) -> str:
        """The 2-D row of position ``pos`` of ``(%l, %b, g)`` in a paged cache."""
        lines, row = _paged.row(self.fresh("pg")[1:], pos, g, self.page_kv)
        for line in lines:
            self.emit(line)
        return row

    def part(self, indent: str) -> str:
        """The lines emitted since the last part; later ones get ``indent``."""
        text = "\n".join(self.lines)
        self.lines = []
        self.indent = indent
        return text


def _words(t: _T, vec: str, n: int) -> list[str]:
    """The ``n / 2`` i32 words of a ``vector<nxbf16>``."""
    w = t.op("w", f"vector.bitcast {vec} : vector<{n}xbf16> to vector<{n // 2}xi32>")
    return [
        t.op("w", f"vector.extract {w}[{i}] : i32 from vector<{n // 2}xi32>") for i in range(n // 2)
    ]


def _pack(t: _T, lo: str, hi: str) -> str:
    """An i32 of two f32 values rounded to bf16 (``lo`` in the low half)."""
    v = t.op("p", f"vector.bitcast {bf16_pair(t, [lo, hi], 0)} : vector<2xbf16> to vector<1xi32>")
    return t.op("p", f"vector.extract {v}[0] : i32 from vector<1xi32>")


def _halves(t: _T, lo_word: str, hi_word: str, high: int) -> str:
    """The i32 of the low (``high=0``) or high bf16 halves of two words:
    ``lo_word``'s in bits 0-15, ``hi_word``'s in bits 16-31."""
    if high:
        a = t.op("h", f"arith.shrui {lo_word}, %c16_i32 : i32")
        b = t.op("h", f"arith.andi {hi_word}, %hi16_i32 : i32")
    else:
        a = t.op("h", f"arith.andi {lo_word}, %lo16_i32 : i32")
        b = t.op("h", f"arith.shli {hi_word}, %c16_i32 : i32")
    return t.op("h", f"arith.ori {a}, {b} : i32")


def _stamp(
    t: _T, word: int, timer: str = "clock64", cond: str = "%stamp_t0", after: str = "",
    kv: str = "%gkv",
) -> None:  # fmt: skip
    """Thread 0 (where ``cond``) writes ``%<timer>`` to word ``word`` of the
    item's stamps (kv head ``kv``); ``after`` (an f32): not before that value
    is ready (the clock is read under a predicate computed from it, so ptxas
    cannot read it sooner)."""
    if after:
        text = (
            "{ .reg .pred p; setp.eq.f32 p, $1, 0f12345678; @p mov.u64 $0, 0; "
            f"@!p mov.u64 $0, %{timer}; }}"
        )
        v = t.op(
            "tm",
            f'llvm.inline_asm has_side_effects asm_dialect = att "{text}", "=l,f" {after} '
            ": (f32) -> i64",
        )
    else:
        v = t.op("tm", _text.read_timer(timer))
    t.emit(f"scf.if {cond} {{")
    t.emit(
        f"  memref.store {v}, %stamps[%l, %b, {kv}, %s, {t.c(word)}] : "
        f"memref<?x?x?x?x{len(STAMPS)}xi64>"
    )
    t.emit("}")


def _shfl_xor(t: _T, v: str, offset: int, ty: str = "f32") -> str:
    name = t.fresh("s")
    t.emit(f"{name}:2 = gpu.shuffle xor {v}, %c{offset}_i32, %c32_i32 : {ty}")
    return f"{name}#0"


@checked_arguments
def attention_mma(
    chunk: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    layers: int,
    *,
    blocks: int = 2,
    name: str = "attention",
    block_size: int = 256,
    spread: bool = False,
    pipeline: str = "none",
    stages: int = 3,
    prefetch: bool = False,
    direct: bool = False,
    release: str = "math",
    stamps: bool = False,
    items: int = 1,
    kv_evict_first: bool = False,
    combine: bool = False,
    merge_unroll: int = 1,
    lengths: bool = False,
    page_size: int = 0,
) -> DeviceFunction:
    """Tile ``(l, b, g, s)`` of :func:`etc.tiles.llama.attention` on the
    tensor cores (see the module docstring). ``blocks``: 16-position blocks
    per warp and loop step (all their K and V loads are issued together).
    ``G = heads / kv_heads`` at most 8; ``head_dim`` a multiple of 32.

    ``pipeline``: step ``i`` issues the loads of step ``i + 1`` before its
    own arithmetic (the first step's before the loop), so a step no longer
    waits a whole round trip to the cache; the last step loads a clamped,
    unused block. ``"registers"``: the loop carries the next step's K and V
    vectors (one step's vectors more in registers). ``"smem"``: each lane
    ``cp.async``-copies them into its own slots of a two-stage workgroup
    buffer (``@<name>__kv``, ``2 * 8 * NB * block_size * 16`` bytes at
    D=64; lane-private, so no barriers; consecutive lanes' slots adjacent,
    so no bank conflicts) and reads the current stage back just before the
    mma work. ``"tma"``: thread 0 copies each step's K and V rows (two boxes
    of ``step`` rows) with TMA into a ring of ``stages`` workgroup stages
    (``@<name>__ring``, 128-byte swizzled rows; ``stages`` mbarriers count
    the bytes in, ``stages`` more the warps out), ``stages`` steps ahead of
    the warps, which read their vectors from the ring: no per-lane address
    arithmetic or copy per vector, and up to ``stages`` steps in flight. The
    tile then takes the caches' TMA maps as two more arguments (declared by
    ``Graph.task``); ``head_dim`` 64 (a 128-byte row). ``"none"``: each step
    loads its own vectors first.

    ``prefetch`` (with ``"tma"``) adds ``@<name>__prefetch``, which starts the
    ring (its first ``stages`` steps) before the instance waits for the QKV
    projection: the cached rows below ``L`` are written by no task of the
    launch, so they load while the waits and the query's RoPE run.

    ``release`` (with ``"tma"``): when a warp gives its stage back.
    ``"math"``: after the step's arithmetic, and thread 0 then refills the
    previous step's stage, so while a step computes no load is in flight
    with 2 stages. ``"read"``: as soon as its vectors are in registers
    (the warp synchronised first, so every lane's read is done), and thread
    0 refills the current step's stage after its arithmetic: one more step
    in flight for the same shared memory. ``"read_early"``: thread 0
    refills it before its arithmetic (waiting for every warp's reads).

    ``direct`` adds an ``attn: memref<?x(heads*D)xbf16>`` argument (after
    ``mpart``): when the grid has one split per (sequence, kv head), the
    instance writes its heads' attention output there, ``bf16(o / l)``,
    instead of the partials, and no combine is needed.

    ``stamps`` (a measuring aid, off in every kernel) adds a
    ``stamps: memref<?x?x?x?x12xi64>`` argument (after ``attn``/``mpart``),
    indexed like the grid ``(l, b, g, s)``: thread 0 writes its
    ``%clock64`` at :data:`STAMPS`' points and the ``%globaltimer`` at entry and
    end, so a trace can say where an instance's time goes (with ``items``,
    each item's stamps at its kv head; the prefetch's at the first item's).

    ``items`` (with ``"tma"``): one instance attends ``items`` kv heads of
    its sequence and split, ``g * items ..``, one after the other (the grid's
    ``g`` runs to ``kv_heads / items``). The ring runs on across them: while
    an item merges its warps, its successor's first steps are loading, and
    the CTA pays no wait, call or ring start between them.

    ``combine`` adds ``count: memref<LAYERSx?xKVxi32>`` and ``attn`` (after
    ``mpart``; zero the counts before the launch): after writing its
    partials, each instance counts itself for its (layer, sequence, kv
    head) with an acquire-release atomic, and the one that completes the
    count (the grid's split count, the partials' dimension 2) merges the
    splits of its ``G`` heads into ``attn``, the splits shared among the
    lanes of each 8-dim item, so no combine stage is needed. With
    ``direct``, a grid of one split writes the output and counts nothing.

    ``kv_evict_first`` (with ``"tma"``): the ring's K and V boxes carry an
    L2 evict-first policy (``.L2::cache_hint``): a step reads each cached
    row once, so it need not push out of the L2 what the kernel wrote and
    reads again (which would then be written back to the HBM).

    ``lengths``: sequences at their own positions (a ragged batch), as
    :func:`etc.tiles.llama.attention`'s option: ``lens: memref<?xi32>``
    after the stamps (before the maps).

    ``page_size``: a paged cache, as :func:`etc.tiles.llama.attention`'s
    option (the block table after the stamps, before ``lens``). With
    ``"tma"`` each box of the ring lies in one page: a page smaller than the
    step takes a box a page (``page_size`` at least 8, a swizzle atom), and
    ``chunk`` is a multiple of the step."""
    warps = _check_attention(
        name, block_size, chunk, heads, kv_heads, head_dim, layers, blocks=blocks
    )
    NH, KV, D, G, NB = heads, kv_heads, head_dim, heads // kv_heads, blocks
    if G > 8:
        raise GraphError(
            f"tile '{name}': {G} query heads per kv head; at most 8 (the rows of one mma)"
        )
    if D % 32 or D > 256:
        raise GraphError(
            f"tile '{name}': head_dim={D} must be a multiple of 32 up to 256 "
            "(a lane reads D/4 dims of a K row, D/8 of a V row)"
        )
    if pipeline not in PIPELINES:
        raise GraphError(
            f"tile '{name}': pipeline {pipeline!r} is not one of {', '.join(PIPELINES)}"
        )
    if pipeline == "smem" and D < 64:
        raise GraphError(
            f"tile '{name}': pipeline='smem' copies 16-byte vectors: head_dim={D} must be >= 64"
        )
    step = warps * 16 * NB  # positions per CTA loop step
    if pipeline == "tma":
        if D != 64 or step > 256:
            raise GraphError(
                f"tile '{name}': pipeline='tma' copies 128-byte rows in boxes of at most 256: "
                f"needs head_dim=64 and a step of at most 256 positions "
                f"(head_dim={D}, step={step})"
            )
        if not isinstance(stages, int) or isinstance(stages, bool) or stages < 2:
            raise GraphError(f"tile '{name}': stages={stages!r} must be an int >= 2")
    if prefetch and pipeline != "tma":
        raise GraphError(f"tile '{name}': prefetch starts the TMA ring: needs pipeline='tma'")
    if release not in RELEASES:
        raise GraphError(f"tile '{name}': release {release!r} is not one of {', '.join(RELEASES)}")
    if not isinstance(items, int) or isinstance(items, bool) or items < 1:
        raise GraphError(f"tile '{name}': items={items!r} must be an int >= 1")
    if items > 1 and not (pipeline == "tma" and prefetch):
        raise GraphError(
            f"tile '{name}': items={items} runs one TMA ring across kv heads, started in the "
            "prefetch function: needs pipeline='tma' and prefetch=True"
        )
    if kv_heads % items:
        raise GraphError(
            f"tile '{name}': items={items} does not divide kv_heads={kv_heads} "
            "(an instance takes whole groups of kv heads)"
        )
    if combine and items > 1:
        raise GraphError(
            f"tile '{name}': combine counts one kv head an instance: needs items=1, got {items}"
        )
    if combine:
        _check_fused_combine(name, G, D, block_size, merge_unroll)
    if not isinstance(kv_evict_first, bool):
        raise GraphError(f"tile '{name}': kv_evict_first must be a bool, got {kv_evict_first!r}")
    if kv_evict_first and pipeline != "tma":
        raise GraphError(
            f"tile '{name}': kv_evict_first marks the TMA ring's copies: needs pipeline='tma'"
        )
    if release != "math" and pipeline != "tma":
        raise GraphError(
            f"tile '{name}': release={release!r} gives back TMA ring stages: needs pipeline='tma'"
        )
    # A TMA box is whole 128-byte swizzle atoms (8 rows), in one page.
    _paged.check_page_size(name, page_size, 8 if pipeline == "tma" else 1)
    if page_size and pipeline == "tma" and chunk % step:
        raise GraphError(
            f"tile '{name}': a paged cache's TMA boxes start at whole steps of the split: "
            f"chunk={chunk} must be a multiple of the step of {step} positions"
        )
    align = min(step, chunk)
    if spread and chunk % align:
        raise GraphError(
            f"tile '{name}': spread splits are whole loop steps of {align} rows: "
            f"chunk={chunk} must be a multiple of {align}"
        )
    DK, DV, KS, NT = D // 4, D // 8, D // 16, D // 8  # K dims/lane, V dims/lane, k-steps, n-tiles
    Q = (NH + 2 * KV) * D
    qkv_t, rope_t = f"memref<?x{Q}xbf16>", f"memref<?x{D}xf32>"
    c_t = f"memref<{layers}x?x{KV}x?x{D}xbf16>"
    op_t, mp_t = f"memref<?x{NH}x?x{D}xf32>", f"memref<?x{NH}x?x2xf32>"
    a_t = f"memref<?x{NH * D}xbf16>"
    cnt_t = f"memref<{layers}x?x{KV}xi32>"
    o_t = f"memref<{warps * G * D}xf32, {_WG}>"
    m_t = f"memref<{warps * G * 2}xf32, {_WG}>"
    kvec = min(DK, 8)  # bf16 per K load
    vvec = min(DV, 8)

    def rope_rows(t: _T) -> list[tuple[str, str]]:
        """Per chunk of the lane's ``kvec`` dims ``dK0 ..``: the RoPE table's
        cosines and sines at position L (the query's and the key's alike)."""
        rows = []
        for ch in range(DK // kvec):
            dh = t.idx("addi", "%dh0", t.c(ch * kvec))
            ds = t.idx("addi", dh, t.c(D // 2))
            rows.append(
                tuple(
                    t.op(
                        "q",
                        f"vector.load %rope[%L, {d}] {{alignment = 16 : i64}} : {rope_t}, vector<{kvec}xf32>",
                    )
                    for d in (dh, ds)
                )
            )
        return rows

    def raw(t: _T, col: str) -> list[str]:
        """The bf16 chunks of dims ``dK0 ..`` of the vector at ``qkv[b, col ..]``."""
        return [
            t.op(
                "q",
                f"vector.load %qkv[%b, {t.idx('addi', col, t.idx('addi', '%dK0', t.c(ch * kvec)))}] "
                f"{{alignment = 16 : i64}} : {qkv_t}, vector<{kvec}xbf16>",
            )
            for ch in range(DK // kvec)
        ]

    def roped(t: _T, chunks: list[str], rows: list[tuple[str, str]]) -> list[str]:
        """``chunks`` (from :func:`raw`) after RoPE at position L, rounded to
        bf16; the partner dims (``+- D/2``) come from lane ``t4 xor 2``."""
        vals = []
        for chunk, (cs, sn) in zip(chunks, rows, strict=True):
            words = _words(t, chunk, kvec)
            pw = [_shfl_xor(t, w, 2, "i32") for w in words]
            pv = t.op("q", f"vector.from_elements {', '.join(pw)} : vector<{kvec // 2}xi32>")
            pb = t.op("q", f"vector.bitcast {pv} : vector<{kvec // 2}xi32> to vector<{kvec}xbf16>")
            x = t.op("q", f"arith.extf {chunk} : vector<{kvec}xbf16> to vector<{kvec}xf32>")
            xp = t.op("q", f"arith.extf {pb} : vector<{kvec}xbf16> to vector<{kvec}xf32>")
            xc = t.op("q", f"arith.mulf {x}, {cs} : vector<{kvec}xf32>")
            xs = t.op("q", f"arith.mulf {xp}, {sn} : vector<{kvec}xf32>")
            lo = t.op("q", f"arith.subf {xc}, {xs} : vector<{kvec}xf32>")
            hi = t.op("q", f"arith.addf {xc}, {xs} : vector<{kvec}xf32>")
            rot = t.op("q", f"arith.select %lo_half, {lo}, {hi} : vector<{kvec}xf32>")
            vals.append(
                t.op("q", f"arith.truncf {rot} : vector<{kvec}xf32> to vector<{kvec}xbf16>")
            )
        return vals

    # -- setup: the roped query of head g as A fragments -----------------------
    t = _T()
    t.items = items
    t.kv_evict_first = kv_evict_first
    t.page_kv = KV if page_size else 0
    t.page_boxes = max(1, step // page_size) if page_size else 1
    box = step // t.page_boxes  # the TMA box's rows
    pre_items = ""  # with items: the ring's values and start, before the item loop
    if stamps:
        _stamp(t, STAMPS.index("entry_ns"), "globaltimer")
        _stamp(t, STAMPS.index("entry"))
    # Every load of the setup goes out before any arithmetic on them (the
    # query, position L's key and value, the RoPE rows shared by the query
    # and the key): one round trip to the L2 instead of a chain of them.
    q_raw, k_raw, rows = raw(t, "%qcol"), raw(t, "%kcol0"), rope_rows(t)
    # The lane's V dims (t2 + e) * DV + u, u < NT = DV: DV contiguous per e.
    v_dim0 = [t.idx("muli", t.idx("addi", "%t2", t.c(e)), t.c(DV)) for e in range(2)]
    v_new = []
    for e in range(2):
        col = t.idx("addi", "%vcol0", v_dim0[e])
        v_new.append(
            t.op(
                "n",
                f"vector.load %qkv[%b, {col}] {{alignment = {min(2 * DV, 16)} : i64}} : {qkv_t}, vector<{DV}xbf16>",
            )
        )
    q_bf = roped(t, q_raw, rows)
    q_words = [w for v in q_bf for w in _words(t, v, kvec)]
    q_words = [t.op("q", f"arith.select %gvalid, {w}, %i0 : i32") for w in q_words]
    # k-step s uses the lane's dims 4s..4s+3: words 2s (k = 2t4, 2t4+1) and 2s+1 (k + 8).
    qa = [[q_words[2 * s], "%i0", q_words[2 * s + 1], "%i0"] for s in range(KS)]
    # Position L's key (roped), its score and its value come before the loop,
    # so their round trips overlap the ring's instead of following it.
    k_bf = roped(t, k_raw, rows)
    part = "%fzero"
    for qv, kv in zip(q_bf, k_bf, strict=True):
        prod = t.op(
            "n",
            f"arith.mulf {t.op('n', f'arith.extf {qv} : vector<{kvec}xbf16> to vector<{kvec}xf32>')}, {t.op('n', f'arith.extf {kv} : vector<{kvec}xbf16> to vector<{kvec}xf32>')} : vector<{kvec}xf32>",
        )
        part = t.f(
            "addf", part, t.op("n", f"vector.reduction <add>, {prod} : vector<{kvec}xf32> into f32")
        )
    for off in (1, 2):
        part = t.f("addf", part, _shfl_xor(t, part, off))
    s_new = t.f("mulf", part, "%scale")
    if stamps:
        _stamp(t, STAMPS.index("setup"), after=s_new)
    # Split 0: the new k (roped) and v into the caches (lanes of head 0), now:
    # the loop reads rows below L only, and nothing of position L stays live
    # across it (registers: the large kernel's tile spilled under its cap).
    t.emit("scf.if %wr {")
    for ch, kv in enumerate(k_bf):
        d = t.idx("addi", "%dK0", t.c(ch * kvec))
        t.emit(
            f"  vector.store {kv}, %kc[%l, %b, %gkv, %L, {d}] {{alignment = 16 : i64}} : {c_t}, vector<{kvec}xbf16>"
        )
    for vv, d in zip(v_new, v_dim0, strict=True):
        t.emit(
            f"  vector.store {vv}, %vc[%l, %b, %gkv, %L, {d}] {{alignment = {min(2 * DV, 16)} : i64}} : {c_t}, vector<{DV}xbf16>"
        )
    t.emit("}")
    # Position L is warp 0's first: its state starts from it (m = its score,
    # l = 1 on one lane of the head, o = its value) instead of folding it in
    # after the loop.
    fone = t.op("n", "arith.constant 1.0 : f32")
    m_init = t.op("n", f"arith.select %foldL, {s_new}, %empty : f32")
    own = t.op("n", "arith.andi %foldL, %is_t0 : i1")
    l_init = t.op("n", f"arith.select {own}, {fone}, %fzero : f32")
    o_init = {}
    for u in range(NT):
        for e in range(2):
            vb = t.op("n", f"vector.extract {v_new[e]}[{u}] : bf16 from vector<{DV}xbf16>")
            vf = t.op("n", f"arith.extf {vb} : bf16 to f32")
            o_init[u, e] = t.op("n", f"arith.select %foldL, {vf}, %fzero : f32")
    setup = t.part("    ")

    # -- the loop step ------------------------------------------------------------
    def load_step(t: _T, wbase: str) -> list[str]:
        """The K and V vectors of the step whose warp block starts at
        ``wbase`` (positions past the cache clamped to ``p0``), in order:
        per block, K rows (j = 0, 1) x chunks, then V rows (0, 1, 8, 9) x
        chunks."""
        vecs = []

        def row(cache: str, r: str, d0: str, width: int, count: int) -> None:
            """``count`` vectors of ``width`` dims from ``d0`` of cache row
            ``r`` of the split (clamped to ``p0`` past the cache)."""
            ok = t.op("ok", f"arith.cmpi ult, {r}, %ncache : index")
            pos = t.op("pos", f"arith.select {ok}, {t.idx('addi', '%p0', r)}, %p0 : index")
            for ch in range(count):
                d = t.idx("addi", d0, t.c(ch * width))
                vecs.append(
                    t.op(
                        "kv",
                        f"vector.load {cache}[%l, %b, %gkv, {pos}, {d}] {{alignment = 16 : i64}} : {c_t}, vector<{width}xbf16>",
                    )
                )

        for bb in range(NB):
            first = t.idx("addi", wbase, t.c(16 * bb))
            for j in range(2):
                r = t.idx("addi", first, t.c(8 * j) if j else "%c0")
                row("%kc", t.idx("addi", r, "%qg"), "%dK0", kvec, DK // kvec)
            for e in (0, 1, 8, 9):
                r = t.idx("addi", t.idx("addi", first, "%t2"), t.c(e) if e else "%c0")
                row("%vc", r, "%dV0", vvec, DV // vvec)
        return vecs

    nk, nv = 2 * (DK // kvec), 4 * (DV // vvec)  # K and V vectors per block
    kv_types = [f"vector<{kvec}xbf16>"] * nk + [f"vector<{vvec}xbf16>"] * nv
    NV = NB * (nk + nv)  # vectors per lane and step
    kv_t = f"memref<{2 * NV * block_size * 4}xi32, {_WG}>"

    def stage_step(t: _T, wbase: str, stage: str) -> None:
        """cp.async of the step at ``wbase`` into ``stage`` of this lane's
        slots (vector ``v`` at 16-byte slot ``stage * NV * BS + v * BS +
        tid``), one commit group. The same rows as :func:`load_step`."""
        v = 0
        stage_off = t.idx("muli", stage, t.c(NV * block_size * 16))
        dst0 = t.idx("addi", "%kvaddr", stage_off)

        def copy(cache_ptr: str, r: str, d0: str, count: int) -> None:
            nonlocal v
            ok = t.op("ok", f"arith.cmpi ult, {r}, %ncache : index")
            pos = t.op("pos", f"arith.select {ok}, {t.idx('addi', '%p0', r)}, %p0 : index")
            cache_row = t.paged_row(pos, "%gkv") if t.page_kv else t.idx("addi", "%rows0", pos)
            row = t.idx("muli", cache_row, t.c(2 * D))
            for ch in range(count):
                d = t.idx("muli", t.idx("addi", d0, t.c(ch * 8)), t.c(2))
                src = t.idx("addi", t.idx("addi", cache_ptr, row), d)
                sp = t.op("a", f"arith.index_cast {src} : index to i64")
                sg = t.op("a", f"llvm.inttoptr {sp} : i64 to !llvm.ptr<1>")
                dst = t.idx("addi", dst0, t.c(v * block_size * 16))
                dp = t.op("a", f"arith.index_cast {dst} : index to i64")
                ds = t.op("a", f"llvm.inttoptr {dp} : i64 to !llvm.ptr<3>")
                t.emit(
                    f"nvvm.cp.async.shared.global {ds}, {sg}, 16, cache = cg : !llvm.ptr<3>, !llvm.ptr<1>"
                )
                v += 1

        for bb in range(NB):
            first = t.idx("addi", wbase, t.c(16 * bb))
            for j in range(2):
                r = t.idx("addi", first, t.c(8 * j) if j else "%c0")
                copy("%kptr", t.idx("addi", r, "%qg"), "%dK0", DK // 8)
            for e in (0, 1, 8, 9):
                r = t.idx("addi", t.idx("addi", first, "%t2"), t.c(e) if e else "%c0")
                copy("%vptr", r, "%dV0", DV // 8)
        t.emit("nvvm.cp.async.commit.group")

    def read_stage(t: _T, stage: str) -> list[str]:
        """This lane's vectors of ``stage``, in :func:`load_step`'s order."""
        base = t.idx("addi", t.idx("muli", stage, t.c(NV * block_size)), "%tid")
        vecs = []
        for v in range(NV):
            slot = t.idx("muli", t.idx("addi", base, t.c(v * block_size)), t.c(4))
            w = t.op(
                "r", f"vector.load %kvbuf[{slot}] {{alignment = 16 : i64}} : {kv_t}, vector<4xi32>"
            )
            vecs.append(t.op("r", f"vector.bitcast {w} : vector<4xi32> to vector<8xbf16>"))
        return vecs

    if pipeline == "registers":
        first_vecs = load_step(t, "%wstart")
        setup += "\n" + t.part("    ")
        carried = [f"%kv{i}" for i in range(NV)]
        next_vecs = load_step(t, t.idx("addi", "%wbase", "%cStep"))
        vecs = carried
    elif pipeline == "smem":
        # Byte addresses: this lane's first slot, and each cache's (l, b, gkv) rows.
        t.emit(f"%kvbuf = memref.get_global @{name}__kv : {kv_t}")
        kvp = t.op("a", f"memref.extract_aligned_pointer_as_index %kvbuf : {kv_t} -> index")
        t.emit(f"%kvaddr = arith.addi {kvp}, {t.idx('muli', '%tid', t.c(16))} : index")
        t.emit(f"%rows0 = arith.addi {_cache_rows0(t, c_t)}, %c0 : index")
        t.emit(f"%kptr = memref.extract_aligned_pointer_as_index %kc : {c_t} -> index")
        t.emit(f"%vptr = memref.extract_aligned_pointer_as_index %vc : {c_t} -> index")
        stage_step(t, "%wstart", "%c0")
        setup += "\n" + t.part("    ")
        nxt = t.idx("subi", "%c1", "%par")
        stage_step(t, t.idx("addi", "%wbase", "%cStep"), nxt)
        t.emit("nvvm.cp.async.wait.group 1")
        vecs = read_stage(t, "%par")
    elif pipeline == "tma":
        if prefetch:
            # The prefetch function (before the waits) starts the ring: the
            # cache rows below L are written by no task of the launch.
            kv0 = "%gkv0" if items > 1 else "%gkv"
            if stamps:
                _stamp(t, STAMPS.index("prefetch_ns"), "globaltimer", kv=kv0)
            _tma_values(t, name, stages, step, D, c_t)
            _tma_start(t, stages, step, D, warps)
            if stamps:
                _stamp(t, STAMPS.index("prefetch_end_ns"), "globaltimer", kv=kv0)
            prefetch_text = t.part("    ")
        _tma_values(t, name, stages, step, D, c_t)
        if not prefetch:
            _tma_start(t, stages, step, D, warps)
        if items > 1:
            pre_items = t.part("  ")
        else:
            setup += "\n" + t.part("    ")
        if stamps:
            first = t.op("st0", "arith.cmpi eq, %base, %c0 : index")
            first = t.op("st0", f"arith.andi %stamp_t0, {first} : i1")
        after_wait = (lambda: _stamp(t, STAMPS.index("step0_full"), cond=first)) if stamps else None
        vecs = _tma_read(t, step, D, NB, DK, DV, _ring_type(stages, step, D), after_wait)
        if release != "math":
            _tma_release(t, after_reads=True)
        if release == "read_early":
            _tma_refill(t, step, D, current=True)
    else:
        vecs = load_step(t, "%wbase")
    if stamps:
        if pipeline != "tma":
            first = t.op("st0", "arith.cmpi eq, %base, %c0 : index")
            first = t.op("st0", f"arith.andi %stamp_t0, {first} : i1")
        _stamp(t, STAMPS.index("step0_data"), cond=first)
    state_o = [[f"%o{u}_{q}" for q in range(2)] for u in range(NT)]  # rows g+8: padding
    kw, vrows, blk = {}, {}, {}
    for bb in range(NB):
        blk[bb] = t.idx("addi", "%wbase", t.c(16 * bb))
        block = vecs[bb * (nk + nv) : (bb + 1) * (nk + nv)]
        for j in range(2):
            kw[bb, j] = [
                w
                for v in block[j * (DK // kvec) : (j + 1) * (DK // kvec)]
                for w in _words(t, v, kvec)
            ]
        for k, e in enumerate((0, 1, 8, 9)):
            vrows[bb, e] = block[nk + k * (DV // vvec) : nk + (k + 1) * (DV // vvec)]
    scores = {}
    for bb in range(NB):
        for j in range(2):
            acc = ["%fzero"] * 2
            for s in range(KS):
                b = [kw[bb, j][2 * s], kw[bb, j][2 * s + 1]]
                acc = mma(t, qa[s], b, [*acc, "%fzero", "%fzero"])[:2]
            for e in range(2):
                r = t.idx("addi", t.idx("addi", blk[bb], t.c(8 * j + e)), "%t2")
                ok = t.op("ok", f"arith.cmpi ult, {r}, %ncache : index")
                sc = t.f("mulf", acc[e], "%scale")
                scores[bb, j, e] = (t.op("sc", f"arith.select {ok}, {sc}, %empty : f32"), ok)
    mx = "%rm"
    local = None
    for sc, _ in scores.values():
        local = sc if local is None else t.f("maximumf", local, sc)
    for off in (1, 2):
        local = t.f("maximumf", local, _shfl_xor(t, local, off))
    m_new = t.f("maximumf", mx, local)
    corr = t.op("e", f"math.exp {t.f('subf', '%rm', m_new)} : f32")
    lsum = t.f("mulf", "%rl", corr)
    probs = {}
    for key, (sc, ok) in scores.items():
        ex = t.op("e", f"math.exp {t.f('subf', sc, m_new)} : f32")
        probs[key] = t.op("e", f"arith.select {ok}, {ex}, %fzero : f32")
        lsum = t.f("addf", lsum, probs[key])
    out = [[t.f("mulf", state_o[u][q], corr) for q in range(2)] for u in range(NT)]
    for bb in range(NB):
        pa = [
            _pack(t, probs[bb, 0, 0], probs[bb, 0, 1]),
            "%i0",
            _pack(t, probs[bb, 1, 0], probs[bb, 1, 1]),
            "%i0",
        ]
        # V rows 2t4, 2t4+1 (k = 2t4, 2t4+1) and 2t4+8, 2t4+9; dims dV0 + u of n-tile u:
        # the bf16 halves of word u / 2 of two rows, paired (one prmt each).
        words = {e: [w for v in vrows[bb, e] for w in _words(t, v, vvec)] for e in (0, 1, 8, 9)}
        for u in range(NT):
            b0 = _halves(t, words[0][u // 2], words[1][u // 2], u % 2)
            b1 = _halves(t, words[8][u // 2], words[9][u // 2], u % 2)
            out[u] = mma(t, pa, [b0, b1], [*out[u], "%fzero", "%fzero"])[:2]
    if pipeline == "tma" and release == "math":
        _tma_release(t)
        # Thread 0 refills after its warp's arithmetic: refilling before it
        # (as soon as the step's data is in) was 1-3 % slower on an H200.
        _tma_refill(t, step, D)
    elif release == "read":
        _tma_refill(t, step, D, current=True)
    if stamps:
        _stamp(t, STAMPS.index("step0_end"), cond=first)
    step_lines = t.part("  ")
    yields = [m_new, lsum] + [v for u in range(NT) for v in out[u]]
    inits = [f"%rm = {m_init}", f"%rl = {l_init}"] + [
        f"{state_o[u][q]} = {o_init[u, q]}" for u in range(NT) for q in range(2)
    ]
    types = ", ".join(["f32"] * (2 + 2 * NT) + (kv_types * NB if pipeline == "registers" else []))
    carries = 0
    if pipeline == "registers":
        yields += next_vecs
        inits += [f"{c} = {v}" for c, v in zip(carried, first_vecs, strict=True)]
        carries = NV
    elif pipeline == "smem":
        yields.append(nxt)
        inits.append("%par = %c0")
        types += ", index"
        carries = 1

    # -- after the loop: the warp's output to workgroup memory --
    if stamps:
        _stamp(t, STAMPS.index("loop_end"))
    m2, l2 = "%st#0", "%st#1"
    for off in (1, 2):
        l2 = t.f("addf", l2, _shfl_xor(t, l2, off))
    o_final = {
        (u, e): (f"%st#{2 + 2 * u + e}", t.idx("addi", v_dim0[e], t.c(u)))
        for u in range(NT)
        for e in range(2)
    }
    t.emit("// A previous call on this CTA may still be reading the workgroup buffers.")
    t.emit("gpu.barrier")
    if stamps:
        _stamp(t, STAMPS.index("warps_done"))
    if pipeline == "tma" and items == 1:
        # Every ring wait is over: invalidate the barriers (with items, after the last).
        _tma_inval(t, stages, "%tid")
    t.emit("scf.if %gvalid {")
    wbase = t.idx("addi", "%wo", t.idx("muli", "%qg", t.c(D)))
    for v, dim in o_final.values():
        t.emit(f"  memref.store {v}, %obuf[{t.idx('addi', wbase, dim)}] : {o_t}")
    t.emit("  scf.if %is_t0 {")
    mi = t.idx("addi", "%wm", t.idx("muli", "%qg", "%c2"))
    t.emit(f"    memref.store {m2}, %mbuf[{mi}] : {m_t}")
    t.emit(f"    memref.store {l2}, %mbuf[{t.idx('addi', mi, '%c1')}] : {m_t}")
    t.emit("  }")
    t.emit("}")
    t.emit("gpu.barrier")
    tail = t.part("  ")
    if stamps:
        _stamp(t, STAMPS.index("end"))
        _stamp(t, STAMPS.index("end_ns"), "globaltimer")
    stamp_end = t.part("  ")
    if items > 1:
        t.emit("%tid_end = gpu.thread_id x")
        _tma_inval(t, stages, "%tid_end")
        inval = t.part("  ")

    maps = f", %kc_map: {MAP_TYPE}, %vc_map: {MAP_TYPE}" if pipeline == "tma" else ""
    for v in (G, G - 1, DK, DV, D // 2, G * D, G * 2, 16 * NB, D, NH * D, (NH + KV) * D, items):
        t.c(v)  # the constants the function's text below names
    constants = "\n".join(f"  %c{v}_ = arith.constant {v} : index" for v in sorted(t.consts))
    args = (
        f"%l: index, %b: index, {'%gi' if items > 1 else '%gkv'}: index, %s: index, "
        f"%L: index, %qkv: {qkv_t}, "
        f"%rope: {rope_t}, %kc: {c_t}, %vc: {c_t}, %op: {op_t}, %mp: {mp_t}"
        f"{f', %cnt: {cnt_t}' if combine else ''}"
        f"{f', %attn: {a_t}' if direct or combine else ''}"
        f"{f', %stamps: memref<?x?x?x?x{len(STAMPS)}xi64>' if stamps else ''}{maps}"
    )
    item_lines = f"""\
  %qh0 = arith.muli %gkv, %c{G}_ : index
  %qh = arith.addi %qh0, %gq : index
  %qcol = arith.muli %qh, %c{D}_ : index
  %kvcol = arith.muli %gkv, %c{D}_ : index
  %kcol0 = arith.addi %kvcol, %c{NH * D}_ : index
  %vcol0 = arith.addi %kvcol, %c{(NH + KV) * D}_ : index"""
    consts = f"""\
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %c32 = arith.constant 32 : index
  %cChunk = arith.constant {chunk} : index
  %cStep = arith.constant {step} : index
  %c1_i32 = arith.constant 1 : i32
  %c2_i32 = arith.constant 2 : i32
  %c32_i32 = arith.constant 32 : i32
  %i0 = arith.constant 0 : i32
  %c16_i32 = arith.constant 16 : i32
  %lo16_i32 = arith.constant 65535 : i32
  %hi16_i32 = arith.constant -65536 : i32
{constants}
  %fzero = arith.constant 0.0 : f32
  %empty = arith.constant {_f32(EMPTY_MAX)} : f32
  %scale = arith.constant {_f32(1.0 / math.sqrt(D))} : f32"""
    # The lane's values from %tid (with items, recomputed in each item).
    lanes = f"""\
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %qg = arith.divui %lane, %c4 : index
  %t4 = arith.remui %lane, %c4 : index
  %t2 = arith.muli %t4, %c2 : index
  %is_t0 = arith.cmpi eq, %t4, %c0 : index
  %gvalid = arith.cmpi ult, %qg, %c{G}_ : index
  %gq = arith.minui %qg, %c{G - 1}_ : index
  %dK0 = arith.muli %t4, %c{DK}_ : index
  %dV0 = arith.muli %qg, %c{DV}_ : index
  %dh0 = arith.remui %dK0, %c{D // 2}_ : index
  %lo_half = arith.cmpi ult, %dK0, %c{D // 2}_ : index
  %wo = arith.muli %warp, %c{G * D}_ : index
  %wm = arith.muli %warp, %c{G * 2}_ : index
  %wstart = arith.muli %warp, %c{16 * NB}_ : index"""
    split = f"""\
  %obuf = memref.get_global @{name}__o : {o_t}
  %mbuf = memref.get_global @{name}__m : {m_t}
  %first_split = arith.cmpi eq, %s, %c0 : index
{_split_lines(spread, align, op_t, bounded=False)}
{"  %gkv0 = arith.muli %gi, %c" + str(items) + "_ : index" if items > 1 else item_lines}
  %pend = arith.addi %p0, %n : index
  %endsL = arith.cmpi eq, %pend, %Lp1 : index
  %nonempty = arith.cmpi ugt, %n, %c0 : index
  %hasL = arith.andi %endsL, %nonempty : i1
  %nm1 = arith.subi %n, %c1 : index
  %ncache = arith.select %hasL, %nm1, %n : index"""
    # The lane's flags that also need the split's positions.
    flags = f"""\
  %is_w0 = arith.cmpi eq, %warp, %c0 : index
  %foldL = arith.andi %hasL, %is_w0 : i1
  %g0 = arith.cmpi eq, %qg, %c0 : index
  %w0g0 = arith.andi %is_w0, %g0 : i1
  %wr = arith.andi %first_split, %w0g0 : i1
{"  %stamp_t0 = arith.cmpi eq, %tid, %c0 : index" if stamps else ""}
"""
    header = f"{consts}\n  %tid = gpu.thread_id x\n{lanes}\n{split}\n{flags}"
    item_start = item_end = ""
    body_header = header
    if items > 1:
        # Each item reads the thread index afresh (an opaque read the compiler
        # cannot hoist), so the setup's lane values are recomputed per item
        # instead of living across the loop: hoisted, they took the tile from
        # 168 to 208 registers and spilled under the 2-CTA cap.
        body_header = f"{consts}\n{split}\n"
        tid = (
            '  %tid_i32 = llvm.inline_asm has_side_effects asm_dialect = att "mov.u32 $0, %tid.x;", '
            '"=r" : () -> i32\n  %tid = arith.index_cast %tid_i32 : i32 to index'
        )
        item_start = (
            f"{pre_items}\n"
            f"  scf.for %item = %c0 to %c{items}_ step %c1 {{\n"
            "  %gkv = arith.addi %gkv0, %item : index\n"
            f"{tid}\n{lanes}\n{flags}{item_lines}\n"
        )
        item_end = f"\n  }}\n{inval}"
    fused = ""
    if combine:
        count = _fused_combine(
            name, G, D, KV, block_size, layers, "%gkv", "%nsplit", NH, merge_unroll
        )
        # With direct, one split wrote the output itself and counts nothing.
        fused = (
            f"  %fc_many = arith.cmpi ne, %nsplit, %c1 : index\n  scf.if %fc_many {{\n"
            f"{textwrap.indent(count, '  ')}\n  }}\n"
            if direct
            else count + "\n"
        )
    source = f"""\
// {name}: decode attention split on mma.sync, {NH} heads / {KV} kv heads of {D}, chunk {chunk}, {layers} layers, one CTA of {block_size}.
memref.global "private" @{name}__o : {o_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__m : {m_t} {{alignment = 16 : i64}}
{f'memref.global "private" @{name}__kv : {kv_t} {{alignment = 16 : i64}}' if pipeline == "smem" else ""}
{_tma_globals(name, stages, step, D) if pipeline == "tma" else ""}
{_fused_combine_global(name) if combine else ""}
func.func @{name}({args}) {{
{body_header}{item_start}{setup}
  %st:{2 + 2 * NT + carries} = scf.for %base = %c0 to %ncache step %cStep iter_args({", ".join(inits)}) -> ({types}) {{
    %wbase = arith.addi %base, %wstart : index
{step_lines}
    scf.yield {", ".join(yields)} : {types}
  }}
{"  nvvm.cp.async.wait.group 0  // the last step's copies, before other tiles reuse the buffer" if pipeline == "smem" else ""}
{tail}
{_warp_merge(warps, G, D, o_t, m_t, op_t, mp_t, a_t if direct else None)}
{stamp_end}{fused}{item_end}
  return
}}
"""
    if prefetch:
        source += f"func.func @{name}__prefetch({args}) {{\n{header}{prefetch_text}\n  return\n}}\n"
    reference = _split_reference(name, chunk, spread, align, NH, KV, D, bounded=False)
    if combine:
        split = reference

        def reference(l, b, g, s, L, qkv, rope, kc, vc, op, mp, cnt, attn):  # noqa: E741
            split(l, b, g, s, L, qkv, rope, kc, vc, op, mp, attn if direct else None)
            if not (direct and op.shape[2] == 1):  # one split wrote the output itself
                _fused_combine_reference(l, b, g, op, mp, cnt, attn, G, D)

    if items > 1:
        one = reference

        def reference(l, b, g, s, *rest):  # noqa: E741
            for item in range(items):
                one(l, b, g * items + item, s, *rest)

    # 4 coordinates, the buffers (the maps are not read)
    nargs = 11 + combine + (direct or combine)
    read = reference

    def reference(*args, n=nargs):  # the stamps, positions and maps are not read
        return read(*args[:n])

    # The table, then the positions, after the stamps (before the maps).
    source, reference = _paged.paged_and_ragged(
        source, name, reference, nargs + stamps, page_size, lengths, c_t
    )
    fn = DeviceFunction.from_mlir(source, name, reference, block_size=block_size)
    if pipeline != "tma":
        return fn
    nargs += stamps + bool(page_size) + lengths
    # Arguments after the coordinates: L, qkv, rope, kc (3), vc (4), op, mp,
    # [attn,] then the maps.
    first_map = nargs - 4
    fn.tensor_maps = {first_map: (3, (box, D)), first_map + 1: (4, (box, D))}
    fn.prefetch_fills_shared = prefetch
    return fn


def _tma_globals(name: str, stages: int, step: int, D: int) -> str:
    """The TMA ring (per stage: ``step`` K rows, then ``step`` V rows) and its
    mbarriers (``stages`` full, then ``stages`` empty)."""
    return (
        f'memref.global "private" @{name}__ring : {_ring_type(stages, step, D)} '
        "{alignment = 1024 : i64}\n"
        f'memref.global "private" @{name}__kvbar : {_bar_type(stages)} {{alignment = 8 : i64}}'
    )


def _ring_type(stages: int, step: int, D: int) -> str:
    return f"memref<{stages * _stage_elems(step, D)}xbf16, {_WG}>"


def _bar_type(stages: int) -> str:
    return f"memref<{2 * stages}xi64, {_WG}>"


def _stage_elems(step: int, D: int) -> int:
    """bf16 values of one ring stage: ``step`` K rows, then ``step`` V rows."""
    return 2 * step * D


def _tma_values(t: _T, name: str, stages: int, step: int, D: int, c_t: str) -> None:
    """The ring's addresses, the split's first cache row, the steps' count:
    ``%ring``, ``%ringaddr``, ``%nsteps`` and the ``%tma_*`` values. With
    ``t.items``: the first item's row, ``%nsteps`` of all items (the ring's
    steps), ``%nsteps_item`` of one, ``%nsteps_k<k>`` of ``k`` and
    ``%tma_skip``, the rows from one item's last step to the next one's first."""
    ring_t = _ring_type(stages, step, D)
    t.emit(f"%tma_stages = arith.constant {stages} : index")
    bar_t = _bar_type(stages)
    t.emit(f"%ring = memref.get_global @{name}__ring : {ring_t}")
    t.emit(f"%ringaddr = memref.extract_aligned_pointer_as_index %ring : {ring_t} -> index")
    bars = t.op("a", f"memref.get_global @{name}__kvbar : {bar_t}")
    t.emit(f"%tma_bars = memref.extract_aligned_pointer_as_index {bars} : {bar_t} -> index")
    gkv = "%gkv0" if t.items > 1 else "%gkv"
    t.emit(f"%tma_row0 = arith.addi {_cache_rows0(t, c_t, gkv)}, %p0 : index")
    steps = t.idx("divui", t.idx("addi", "%ncache", t.c(step - 1)), t.c(step))
    if t.items > 1:
        # Every item of the instance has the same positions (one sequence, one split).
        t.emit(f"%nsteps_item = arith.addi {steps}, %c0 : index")
        t.emit(f"%nsteps = arith.muli %nsteps_item, {t.c(t.items)} : index")
        # Rows from one item's end to the next one's start: S - nsteps_item * step.
        rows_s = t.op("a", f"memref.dim %kc, {t.c(3)} : {c_t}")
        used = t.idx("muli", "%nsteps_item", t.c(step))
        t.emit(f"%tma_skip = arith.subi {rows_s}, {used} : index")
        for k in range(1, t.items):
            t.emit(f"%nsteps_k{k} = arith.muli %nsteps_item, {t.c(k)} : index")
    else:
        t.emit(f"%nsteps = arith.addi {steps}, %c0 : index")
    for key, arg in (("k", "%kc_map"), ("v", "%vc_map")):
        p = t.op("map", f"memref.extract_aligned_pointer_as_index {arg} : {MAP_TYPE} -> index")
        t.emit(f"%tma_{key}map = arith.index_cast {p} : index to i64")
    t.emit(f"%tma_tx = arith.constant {2 * _stage_elems(step, D)} : i32")


def _tma_start(t: _T, stages: int, step: int, D: int, warps: int) -> None:
    """Thread 0 initialises the mbarriers and issues the first ``stages``
    steps (after :func:`_tma_values`)."""
    is0 = t.op("is0", "arith.cmpi eq, %tid, %c0 : index")
    # Other tiles used this shared memory through the generic proxy, and the
    # previous call's barriers are live until every thread is here.
    _asm(t, "fence.proxy.async.shared::cta;")
    t.emit("gpu.barrier")
    t.emit(f"scf.if {is0} {{")
    t.indent += "  "
    for q in range(stages):
        _asm_ops(t, "mbarrier.init.shared::cta.b64 [$0], 1;", [(_bar(t, 0, q), "i32")])
        # One arrival per warp.
        _asm_ops(t, f"mbarrier.init.shared::cta.b64 [$0], {warps};", [(_bar(t, 1, q), "i32")])
    _asm(t, "fence.mbarrier_init.release.cluster;")
    # No fence.proxy.async.global: the ring reads cache rows below L only,
    # which no task of this launch writes (split 0 writes row L through the
    # generic proxy, read by no TMA); earlier launches' writes are ordered by
    # the kernel boundary.
    for q in range(stages):
        more = t.op("more", f"arith.cmpi ult, {t.c(q)}, %nsteps : index")
        t.emit(f"scf.if {more} {{")
        t.indent += "  "
        _tma_issue(t, t.c(q), q, step, D)
        t.end()
    t.end()
    t.emit("gpu.barrier")


def _tma_inval(t: _T, stages: int, tid: str) -> None:
    """Thread 0 (``tid`` the thread index) invalidates the ring's mbarriers:
    every ring wait is over."""
    t.emit(f"scf.if {t.op('is0', f'arith.cmpi eq, {tid}, %c0 : index')} {{")
    mbarrier_inval(t, (_bar(t, kind, q) for q in range(stages) for kind in (0, 1)))
    t.emit("}")


def _cache_rows0(t: _T, c_t: str, gkv: str = "%gkv") -> str:
    """The cache row (of ``D`` values) of position 0 of ``(%l, %b, gkv)``:
    ``((l * B + b) * KV + gkv) * S`` for a cache ``memref<LxBxKVxSxDxbf16>``."""
    kv = int(c_t.split("x")[2])
    nb = t.op("a", f"memref.dim %kc, %c1 : {c_t}")
    ns = t.op("a", f"memref.dim %kc, {t.c(3)} : {c_t}")
    lbg = t.idx("addi", t.idx("muli", t.idx("addi", t.idx("muli", "%l", nb), "%b"), t.c(kv)), gkv)
    return t.idx("muli", lbg, ns)


def _bar(t: _T, kind: int, stage: str | int) -> str:
    """The shared address (i32) of ``stage``'s full (0) or empty (1) mbarrier."""
    if isinstance(stage, int):
        stage = t.c(stage)
    at = t.idx("addi", stage, t.idx("muli", t.c(kind), "%tma_stages")) if kind else stage
    return _i32(t, t.idx("addi", "%tma_bars", t.idx("muli", at, t.c(8))))


def _tma_issue(t: _T, step_index: str, stage: str | int, step: int, D: int) -> None:
    """Thread 0: TMA step ``step_index``'s K and V boxes into ``stage``
    (with ``t.items``, the ring's step: each item's rows ``%tma_skip``
    further than its predecessor's end)."""
    full = _bar(t, 0, stage)
    _asm_ops(
        t,
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
        [(full, "i32"), ("%tma_tx", "i32")],
    )
    if t.page_kv:  # a box a page (or one of several in a page)
        rows = [_i32(t, row) for row in _tma_paged_rows(t, step_index, step)]
    else:
        rows = t.idx("muli", step_index, t.c(step))
        # Past each item's steps, the next kv head's rows (compares, not a
        # division: thread 0 issues this inside the loop).
        for k in range(1, t.items):
            past = t.op("past", f"arith.cmpi uge, {step_index}, %nsteps_k{k} : index")
            skip = t.op("skip", f"arith.select {past}, %tma_skip, %c0 : index")
            rows = t.idx("addi", rows, skip)
        rows = [_i32(t, t.idx("addi", "%tma_row0", rows))]
    box_bytes = step // len(rows) * D * 2
    stage_bytes = 2 * _stage_elems(step, D)
    base = (
        t.idx("addi", "%ringaddr", t.c(stage * stage_bytes))
        if isinstance(stage, int)
        else t.idx("addi", "%ringaddr", t.idx("muli", stage, t.c(stage_bytes)))
    )
    zero = t.op("w", "arith.constant 0 : i32")
    policy = t.op("pol", _text.l2_policy("evict_first")) if t.kv_evict_first else None
    hint, hint_op, hint_arg = _text.cache_hint(policy, 5)
    for half, tmap in ((0, "%tma_kmap"), (1, "%tma_vmap")):
        # Boxes of a page land one after the other: whole 8-row swizzle atoms
        # (1024 bytes), so the stage's layout is one box's.
        for j, row in enumerate(rows):
            offset = half * step * D * 2 + j * box_bytes
            dst = _i32(t, t.idx("addi", base, t.c(offset)) if offset else base)
            _asm_ops(
                t,
                "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                f"{hint} [$0], [$1, {{$2, $3}}], [$4]{hint_op};",
                [(dst, "i32"), (tmap, "i64"), (zero, "i32"), (row, "i32"), (full, "i32"),
                 *hint_arg],
            )  # fmt: skip


def _tma_paged_rows(t: _T, step_index: str, step: int) -> list[str]:
    """The cache rows of ring step ``step_index``'s boxes in a paged cache
    (``t.page_boxes`` of ``step / t.page_boxes`` positions): its item's kv
    head (with ``t.items``) and its first position, ``p0`` plus the item's
    steps before it, each box's looked up in the block table (a box lies
    in one page: the page size and the split's start are whole boxes)."""
    within, g = step_index, "%gkv0" if t.items > 1 else "%gkv"
    for k in range(1, t.items):  # the last item whose steps have begun
        past = t.op("past", f"arith.cmpi uge, {step_index}, %nsteps_k{k} : index")
        later = t.idx("subi", step_index, f"%nsteps_k{k}")
        within = t.op("within", f"arith.select {past}, {later}, {within} : index")
        g = t.op("gk", f"arith.select {past}, {t.idx('addi', '%gkv0', t.c(k))}, {g} : index")
    pos = t.idx("addi", "%p0", t.idx("muli", within, t.c(step)))
    box = step // t.page_boxes
    return [
        t.paged_row(t.idx("addi", pos, t.c(j * box)) if j else pos, g) for j in range(t.page_boxes)
    ]


def _tma_read(
    t: _T, step: int, D: int, NB: int, DK: int, DV: int, ring_t: str, after_wait=None
) -> list[str]:
    """The loop step's index, its stage awaited (then ``after_wait()``, if
    given); this lane's K and V vectors read from the ring in ``load_step``'s order. A row ``r`` of a stage's K
    (or V) box holds its 16-byte chunk ``c`` at chunk ``c ^ (r % 8)`` (the
    128-byte swizzle)."""
    stages_c = "%tma_stages"
    if t.items > 1:  # the ring's step: the item's steps follow its predecessors'
        local = t.idx("divui", "%base", t.c(step))
        t.emit(f"%tma_i = arith.addi {t.idx('muli', '%item', '%nsteps_item')}, {local} : index")
    else:
        t.emit(f"%tma_i = arith.divui %base, {t.c(step)} : index")
    t.emit(f"%tma_stage = arith.remui %tma_i, {stages_c} : index")
    par = t.idx("remui", t.idx("divui", "%tma_i", stages_c), t.c(2))
    _mbar_wait(t, _bar(t, 0, "%tma_stage"), _i32(t, par))
    if after_wait is not None:
        after_wait()
    stage_base = t.idx("muli", "%tma_stage", t.c(_stage_elems(step, D)))  # in bf16 values

    def vec(half: int, r: str, chunk: str) -> str:
        sw = t.idx("xori", chunk, t.idx("andi", r, t.c(7)))
        at = t.idx("addi", t.idx("muli", r, t.c(D)), t.idx("muli", sw, t.c(8)))
        at = t.idx("addi", t.idx("addi", stage_base, t.c(half * step * D)), at)
        return t.op("kv", f"vector.load %ring[{at}] : {ring_t}, vector<8xbf16>")

    vecs = []
    for bb in range(NB):
        first = t.idx("addi", "%wstart", t.c(16 * bb))
        for j in range(2):
            r = t.idx("addi", t.idx("addi", first, t.c(8 * j)), "%qg")
            for ch in range(DK // 8):
                vecs.append(vec(0, r, t.idx("addi", t.idx("divui", "%dK0", t.c(8)), t.c(ch))))
        for e in (0, 1, 8, 9):
            r = t.idx("addi", t.idx("addi", first, "%t2"), t.c(e))
            for ch in range(DV // 8):
                vecs.append(vec(1, r, t.idx("addi", t.idx("divui", "%dV0", t.c(8)), t.c(ch))))
    return vecs


def _tma_release(t: _T, after_reads: bool = False) -> None:
    """Each warp's lane 0 marks the step's stage read: after the step's
    arithmetic, or (``after_reads``) once the warp's ring reads are in
    registers: ``bar.warp.sync`` orders every lane's reads before lane 0's
    arrive (a release), and the memory clobbers keep the compiler from
    sinking the reads past them."""
    if after_reads:
        _asm(t, "bar.warp.sync -1;", memory=True)
    lane0 = t.op("l0", "arith.cmpi eq, %lane, %c0 : index")
    t.emit(f"scf.if {lane0} {{")
    t.indent += "  "
    arrive = "mbarrier.arrive.shared::cta.b64 _, [$0];"
    _asm_ops(t, arrive, [(_bar(t, 1, "%tma_stage"), "i32")], memory=after_reads)
    t.end()


def _tma_refill(t: _T, step: int, D: int, current: bool = False) -> None:
    """Thread 0: the previous step's stage (its warps are done with it, or
    nearly) gets the step ``%tma_stages`` later; ``current``: this step's
    stage (its warps release it after their reads)."""
    has_prev = None if current else t.op("prev", "arith.cmpi uge, %tma_i, %c1 : index")
    prev = "%tma_i" if current else t.idx("subi", "%tma_i", "%c1")
    nxt = t.idx("addi", prev, "%tma_stages")
    go = t.op("more", f"arith.cmpi ult, {nxt}, %nsteps : index")
    is0 = t.op("is0", "arith.cmpi eq, %tid, %c0 : index")
    if has_prev is not None:
        go = t.op("go", f"arith.andi {has_prev}, {go} : i1")
    go = t.op("go", f"arith.andi {go}, {is0} : i1")
    t.emit(f"scf.if {go} {{")
    t.indent += "  "
    pstage = t.idx("remui", prev, "%tma_stages")
    ppar = t.idx("remui", t.idx("divui", prev, "%tma_stages"), t.c(2))
    _mbar_wait(t, _bar(t, 1, pstage), _i32(t, ppar))
    _tma_issue(t, nxt, pstage, step, D)
    t.end()

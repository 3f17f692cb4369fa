"""Tile-configuration sweep of the Llama-3.2-1B decode megakernel (issue 7).

    python bench/decode_sweep.py --build DIR                  # CPU: one artifact per variant
    python bench/decode_sweep.py --artifacts DIR --out OUT    # GPU: check, then time

Each variant is a :class:`etc.models.llama.LlamaConfig` change (tile sizes
and options) and/or ``etc.compile`` options (COMPILE_KEYS: schedule, push
and pop modes) over :func:`etc.models.llama.compile_options`; the variants
of earlier sweeps are in the git history and their rows in
``bench/results/decode-sweep-*.json``. On the GPU: random weights, B in
BATCHES, context 1024; each variant's greedy tokens are compared with the PyTorch
step's (agreement is printed: bf16 noise flips near-ties), then the step is
timed (median of REPS x CALLS back-to-back launches after a warm-up), with
the copy bandwidth of the same run for the floor.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import timed, two_step_main  # noqa: E402
from etc.models import llama as M  # noqa: E402

BASE = M.LLAMA_3_2_1B


def _large(*changes: tuple[str, object]) -> dict:
    """The default buckets with ``changes`` in the large-batch kernel."""
    buckets = M.LLAMA_3_2_1B.batch_buckets
    return dict(batch_buckets=(*buckets[:-1], (None, (*M.LARGE_BATCH, *changes))))


def _one(*changes: tuple[str, object]) -> dict:
    """The default buckets with ``changes`` in the B=1 kernel (the phased
    one of every context, :data:`~etc.models.llama.SINGLE_SEQUENCE`, as
    before the forty-second session split it by L)."""
    (bound, _), *rest = M.LLAMA_3_2_1B.batch_buckets
    return dict(batch_buckets=((bound, (*M.SINGLE_SEQUENCE, *changes)), *rest))


def _proj(*settings: tuple[str, str, object]) -> dict:
    """``projection_options`` from ``(projection, key, value)`` settings."""
    options: dict[str, list] = {}
    for projection, key, value in settings:
        options.setdefault(projection, []).append((key, value))
    return {"projection_options": tuple((p, tuple(o)) for p, o in options.items())}


def _tma_stages(stages: int, projections: tuple[str, ...] = M._PROJECTIONS[:4]) -> tuple:
    """``projection_options`` giving ``projections`` ``stages`` TMA stages."""
    return tuple((p, (("stages", stages),)) for p in projections)


#: The B = 2..16 kernel's attention before session 39 (item 174): the phased
#: tile, inlined, over the uncapped tiers of item 172.
_MID_PHASED = (
    ("attn_tile", "phased"), ("attn_unroll", 4), ("attn_pipeline", "none"),
    ("attn_tma_release", "math"), ("outline", False),
)  # fmt: skip
_PHASED_TIERS = ((4, 128), (8, 256), (11, 384), (16, 256))


def _long(*changes: tuple[str, object]) -> dict:
    """The default buckets with ``changes`` in B = 1's long-context kernel
    (past :data:`~etc.models.llama.SINGLE_SEQUENCE_CONTEXT`)."""
    (bound, _), *rest = M.LLAMA_3_2_1B.batch_buckets
    long = (*M.SINGLE_SEQUENCE_LONG, *changes)
    by_context = ((M.SINGLE_SEQUENCE_CONTEXT, ()), (None, long))
    return dict(
        batch_buckets=((bound, (*M.SINGLE_SEQUENCE, ("context_buckets", by_context))), *rest)
    )


def _mid(*changes: tuple[str, object]) -> dict:
    """The default buckets with ``changes`` in the B=2..16 kernels (B = 2..8
    and 9..16 since session 45)."""
    one, *mid, large = M.LLAMA_3_2_1B.batch_buckets
    return dict(batch_buckets=(one, *((b, (*c, *changes)) for b, c in mid), large))


VARIANTS = {
    # The default after session 13 (the large-batch kernel on the tma core;
    # the session's variants and their rows: ``results/decode-sweep-tma-*``).
    "default": {},
    # Session 13, item 53: more parts for qkv and o_proj; 16-column gate/up
    # blocks. Item 54: the weight boxes into L2 before the waits: none, or
    # 8 / 16 k-tiles instead of the ring's 4.
    "splits_888": {"k_splits": (("qkv_proj", 8), ("o_proj", 8), ("down_proj", 8))},
    "gu16": _large(("bn_gu", 16)),
    "tma_nopf": {"tma_prefetch": False},
    "tma_pf8": {"tma_prefetch": 8},
    "tma_pf16": {"tma_prefetch": 16},
    # Item 55: wider blocks with more parts, so each 64-row activation block
    # read from L2 feeds more weight rows.
    "gu64_s2": {
        "k_splits": (*M.LLAMA_3_2_1B.k_splits, ("gate_up_proj", 2)),
        **_large(("bn_gu", 64)),
    },
    "wide128": {
        "k_splits": (("qkv_proj", 8), ("o_proj", 8), ("down_proj", 16)),
        **_large(("bn_qkv", 128), ("bn_o", 128), ("bn_down", 128)),
    },
    "wide128_gu64_s2": {
        "k_splits": (("qkv_proj", 8), ("o_proj", 8), ("down_proj", 16), ("gate_up_proj", 2)),
        **_large(("bn_qkv", 128), ("bn_o", 128), ("bn_down", 128), ("bn_gu", 64)),
    },
    # Session 14: one CTA per SM (255 registers a thread instead of 128), so
    # the large kernel's attention holds more K/V vectors without spilling:
    # two 16-position blocks per warp and step, and/or the next step's
    # vectors carried in registers (both slower at 128 registers, items 47).
    "occ1": {"min_ctas_per_sm": 1},
    "occ1_unroll2": {"min_ctas_per_sm": 1, **_large(("attn_unroll", 2))},
    "occ1_pipe": {"min_ctas_per_sm": 1, **_large(("attn_pipeline", "registers"))},
    "occ1_unroll2_pipe": {
        "min_ctas_per_sm": 1,
        **_large(("attn_unroll", 2), ("attn_pipeline", "registers")),
    },
    # Session 14 (item 62): no split-K workspace, to attribute the B=64
    # kernel's DRAM writes.
    "nosplit": {"k_splits": (("qkv_proj", 1), ("o_proj", 1), ("down_proj", 1))},
    # Session 16: LM head rings of 6 stages (item 64); fewer gate/up ring
    # groups before its waits (item 65). (Its deeper rings for single
    # projections, st_*, no longer fit the shared memory of the kernels'
    # two CTAs an SM: removed in session 54, as were the other variants
    # that stopped building; test/unit/test_bench_variants.py keeps the rest
    # building.)
    "lm32_s6": _one(("bn_lm", 32), *_proj(("lm_head", "stages", 6)).items()),
    "lm16_s6": _one(("bn_lm", 16), *_proj(("lm_head", "stages", 6)).items()),
    "gu_pf1": _proj(("gate_up_proj", "prefetch_ring", 1)),
    "gu_pf2": _proj(("gate_up_proj", "prefetch_ring", 2)),
    "gu_pf0": _proj(("gate_up_proj", "prefetch_ring", False)),
    "gu_pf1_s3": _proj(("gate_up_proj", "prefetch_ring", 1), ("gate_up_proj", "stages", 3)),
    # The large kernel's attention (item 68): per-lane loads (the default
    # before), TMA with 3 ring stages (the default has 2).
    "attn_lanes": _large(("attn_pipeline", "none")),
    "attn_tma3": _large(("attn_pipeline", "tma"), ("attn_tma_stages", 3)),
    # Shorter spans for the TMA-fed tile (more, shorter instances; item 69).
    "chunk2048": {"attn_chunk": 2048},
    "chunk1024": {"attn_chunk": 1024},
    # The TMA ring started before the attention's waits (item 70).
    "attn_pf": {"attn_tma_prefetch": True},
    "attn_pf3": {"attn_tma_prefetch": True, **_large(("attn_tma_stages", 3))},
    # Not yet timed: the B = 2..16 kernel on the TMA-fed tensor-core
    # attention (its spans of 256 positions: two loop steps).
    "mid_mma_tma": _mid(("attn_tile", "mma"), ("attn_unroll", 1), ("attn_pipeline", "tma")),
    # Session 17: deeper TMA rings in the large-batch kernel (its GEMM tiles
    # at 64 KiB for 4 stages; the LM head's 96 KiB sets the kernel's size).
    "tma6_qo": _large(("projection_options", _tma_stages(6, ("qkv_proj", "o_proj")))),
    # Session 63: qkv's and o_proj's parts (8 k-tiles of 16 KB) with 6 or 7
    # of them loaded before the waits, now that every tile is a called
    # function (session 17's deeper rings lost through other tiles' spills).
    "tma7_qo": _large(("projection_options", _tma_stages(7, ("qkv_proj", "o_proj")))),
    "tma6_q": _large(("projection_options", _tma_stages(6, ("qkv_proj",)))),
    "tma6_o": _large(("projection_options", _tma_stages(6, ("o_proj",)))),
    "tma6_d": _large(("projection_options", _tma_stages(6, ("down_proj",)))),
    "tma3_d": _large(("projection_options", _tma_stages(3, ("down_proj",)))),
    "tma3": _large(("projection_options", _tma_stages(3))),
    "tma2": _large(("projection_options", _tma_stages(2))),
    "tma3_gd": _large(("projection_options", _tma_stages(3, ("gate_up_proj", "down_proj")))),
    "tma3_qo": _large(("projection_options", _tma_stages(3, ("qkv_proj", "o_proj")))),
    # Session 17: the tma tiles' first weight stages loaded into the ring
    # before the waits (session 13's item 52, withdrawn then for wrong
    # results that the missing mbarrier.inval explains).
    "tma_pfs": {"tma_prefetch": "shared"},
    # Session 17: shared regions, each CTA's next ring prefetched ahead across
    # regions (B <= 16 kernels; the large one keeps one region).
    "sr_od": {"shared_regions": (("o_proj", 1), ("down", 1))},
    "sr_gu": {"shared_regions": (("gate_up", 1),)},
    "sr_o": {"shared_regions": (("o_proj", 1),)},
    "sr_d": {"shared_regions": (("down", 1),)},
    # Session 18: the tma tiles' k loops rotated by column block, so a
    # stage's tiles do not read the same activation boxes at once.
    "rot": {"tma_rotate_k": True},
    # Session 18: with the split-K sum's loads issued together, fewer
    # parts (down in 4, qkv and o_proj in 2), and the TMA attention on 3
    # stages (4.0 against 3.7 TB/s alone, bench/decode_attention.py).
    "down_s4": {"k_splits": (("qkv_proj", 4), ("o_proj", 4), ("down_proj", 4))},
    "splits_224": {"k_splits": (("qkv_proj", 2), ("o_proj", 2), ("down_proj", 4))},
    "attn3": _large(("attn_tma_stages", 3)),
    # Session 18: whole waves on 132 CTAs. qkv in 96-column blocks (128
    # instances at B <= 64 instead of 192: 1.45 waves); gate/up in 64-column
    # blocks (128, one wave); down in 128-column blocks of 16 or 8 parts
    # (256 or 128 instances, each reading half the activations per weight).
    "qkv96": _large(("bn_qkv", 96)),
    "gu64": _large(("bn_gu", 64)),
    "down128_s16": {
        "k_splits": (("qkv_proj", 4), ("o_proj", 4), ("down_proj", 16)),
        **_large(("bn_down", 128)),
    },
    "down128_s8": _large(("bn_down", 128)),
    # Session 18: the attention's split counts over L + 1 positions, as before
    # (two splits at L = 4096; the default now splits the L cached ones).
    "old_default": {"attn_cached_splits": False},
    # Session 18: the combine after a single split (before attn_direct).
    "no_direct": {"attn_direct": False},
    # Session 18: 3 attention stages without the ring's start before the
    # waits (item 75: with it, the stages around the attention slowed).
    "attn3_nopf": _large(("attn_tma_stages", 3), ("attn_tma_prefetch", False)),
    "attn2_nopf": _large(("attn_tma_prefetch", False)),
    # Session 29: the TMA-fed attention's warps give each ring stage back
    # once read, and thread 0 refills it after ("read") or before
    # ("read_early") its arithmetic: one step more in flight.
    "attn_read": _large(("attn_tma_release", "read")),
    "attn_read_early": _large(("attn_tma_release", "read_early")),
    "attn_read3": _large(("attn_tma_release", "read"), ("attn_tma_stages", 3)),
    # Session 29, B = 1: LM head blocks of 32 columns (a shorter last round).
    "lm32_b1": _one(("bn_lm", 32)),
    # Session 29: the tma tiles' epilogue loads (row sums, residual) before
    # their k loops, off the split-K meeting's path; and with item 116.
    "tma_ahead": {"tma_epilogue_ahead": True},
    "ahead_read_early": {"tma_epilogue_ahead": True, **_large(("attn_tma_release", "read_early"))},
    # ... the session's starting defaults (item 122 timed "auto_ahead", the
    # attention's release chosen by span, against it: commit 2ffabfd).
    "math_plain": {"attn_tma_release": "math", "tma_epilogue_ahead": False},
    # Session 30: every tile a called function (``etc.compile(outline=True)``),
    # so ptxas allocates each tile's registers apart; and with the variants
    # that lost to other tiles' spills in the one inlined kernel (items 75,
    # 116, 119, and the argmax in parts at large batches).
    "outline": {"outline": True},
    "outline_attn3": {"outline": True, **_large(("attn_tma_stages", 3))},
    "outline_read_early": {"outline": True, **_large(("attn_tma_release", "read_early"))},
    "outline_argparts": {"outline": True, **_large(("argmax_whole", False))},
    # ... the large-batch kernel outlined with the attention's read_early
    # (item 123's best), and on top of it the large-kernel options that lost
    # before to other tiles' spills.
    "ol_re": _large(("outline", True), ("attn_tma_release", "read_early")),
    "ol_attn_re": _large(("outline", ("attention",)), ("attn_tma_release", "read_early")),
    "ol_read": _large(("outline", True), ("attn_tma_release", "read")),
    "ol_re_a3": _large(
        ("outline", True), ("attn_tma_release", "read_early"), ("attn_tma_stages", 3)
    ),
    "ol_re_gu64": _large(("outline", True), ("attn_tma_release", "read_early"), ("bn_gu", 64)),
    "ol_re_rot": _large(
        ("outline", True), ("attn_tma_release", "read_early"), ("tma_rotate_k", True)
    ),
    # ... and in the B = 1 kernel only some tiles called: the attention, or
    # the LM head and its argmax.
    "ol1_attn": _one(("outline", ("attention",))),
    "ol1_lm": _one(("outline", ("lm_head", "argmax", "argmax_merge"))),
    # ... and the same in the B = 2..16 kernel.
    "ol_mid_lm": _mid(("outline", ("lm_head", "argmax", "argmax_merge"))),
}
# Session 30: the B = 1 kernel (whose LM head and argmax are called) with one
# more task called.
_LM = ("lm_head", "argmax", "argmax_merge")
for _task in ("embed", "qkv", "combine", "o_proj", "gate_up", "down"):
    VARIANTS[f"ol1_{_task}"] = _one(("outline", (*_LM, _task)))
# Session 31: tasks dealt at run time (deal="pool"): the LM head (B = 1 and
# the other kernels), the large-batch attention, and some B = 1 layer stages.
VARIANTS["pool1_lm"] = _one(("pool", ("lm_head",)))
VARIANTS["pool1_lm_gu"] = _one(("pool", ("lm_head", "gate_up", "down")))
VARIANTS["pool1_lm_attn"] = _one(("pool", ("lm_head", "attention")))
VARIANTS["pool_mid_lm"] = _mid(("pool", ("lm_head",)))
# ... and the default buckets under the dynamic schedule (its kernel's own
# shared-memory words moved after the tiles' buffers: before and after).
VARIANTS["dyn"] = {"schedule": "dynamic"}
# ... and the B = 1 kernel with every tile called, alone and with its LM head pooled
# (a called tile's code cannot change with the kernel's loop around it).
VARIANTS["ol1_all"] = _one(("outline", True))
VARIANTS["pool1_lm_ol"] = _one(("outline", True), ("pool", ("lm_head",)))
VARIANTS["pool_lm"] = _large(("pool", ("lm_head",)))
VARIANTS["pool_attn"] = _large(("pool", ("attention",)))
VARIANTS["pool_attn_lm"] = _large(("pool", ("attention", "lm_head")))
VARIANTS["pool_all"] = _large(  # (a pooled down cannot share its sums, item 153)
    ("pool", ("attention", "lm_head", "qkv", "o_proj", "gate_up", "down")), ("tma_meet_share", ())
)
# Session 25, item 100 (all slower than their baselines): the layer projections' weights
# chunked: two sync-core kernels (B = 1 and the default B = 2-16 one for
# every larger batch) with chunks of 32, 64 or 128, timed at B = 1 and 8;
# and the default three kernels with chunks of 64 (the large-batch kernel's
# TMA tiles read them through 4-D maps), at every B.
_SYNC_ONLY = {"batch_buckets": M.LLAMA_3_2_1B.batch_buckets[:1] + ((None, ()),)}
VARIANTS["sync_only"] = _SYNC_ONLY
VARIANTS["sync_only_ch32"] = {**_SYNC_ONLY, "weight_chunk": 32}
VARIANTS["sync_only_ch64"] = {**_SYNC_ONLY, "weight_chunk": 64}
VARIANTS["sync_only_ch128"] = {**_SYNC_ONLY, "weight_chunk": 128}
VARIANTS["default_ch64"] = {"weight_chunk": 64}
# Session 33: the B = 64 trace (item 126) has o_proj on 128 instances for
# 264 CTAs (32 column blocks x 4 parts) and down's last part 5 us behind the
# others: more, narrower blocks for o_proj (256 instances, by columns or by
# parts) and down in 32-column blocks of 4 parts (256 instances, no 8-part
# meeting).
_KS = {"qkv_proj": 4, "o_proj": 4, "down_proj": 8}  # the defaults before this session
VARIANTS["sm_o32"] = _large(("bn_o", 32))
VARIANTS["sm_o8p"] = {"k_splits": tuple({**_KS, "o_proj": 8}.items())}
VARIANTS["sm_d32s4"] = {
    "k_splits": tuple({**_KS, "down_proj": 4}.items()),
    **_large(("bn_down", 32)),
}
VARIANTS["sm_o32_d32s4"] = {
    "k_splits": tuple({**_KS, "down_proj": 4}.items()),
    **_large(("bn_o", 32), ("bn_down", 32)),
}
# ... and gate/up at B = 64 (256 instances of 32 k-tiles streaming at ~2.8 TB/s):
# wider blocks in parts, so each activation box read from L2 feeds more weights.
VARIANTS["sm_gu32s2"] = {"k_splits": tuple({**_KS, "gate_up_proj": 2}.items())}
VARIANTS["sm_gu64s2"] = {
    "k_splits": tuple({**_KS, "gate_up_proj": 2}.items()),
    **_large(("bn_gu", 64)),
}
VARIANTS["sm_gu64s4"] = {
    "k_splits": tuple({**_KS, "gate_up_proj": 4}.items()),
    **_large(("bn_gu", 64)),
}
# Session 34: the split projections' parts meeting in fragment order (16-byte
# accesses, the last part's own products from its registers; item 147), and
# with it o_proj or qkv in 8 parts (256 / 384 instances).
_KS34 = dict(M.LLAMA_3_2_1B.k_splits)
VARIANTS["frag"] = {"tma_meeting": "fragments"}  # the default since (item 147)
# (down's sums shared since session 35 need the fragment meeting: none shared here)
VARIANTS["rows"] = {"tma_meeting": "rows", **_large(("tma_meet_share", ()))}
# ... and qkv or o_proj in 128-column blocks of 8 parts (each activation box
# read from L2 feeding twice the weights; 192 / 128 instances).
VARIANTS["q128s8"] = {
    "k_splits": tuple({**_KS34, "qkv_proj": 8}.items()),
    **_large(("bn_qkv", 128)),
}
VARIANTS["o128s8"] = {
    "k_splits": tuple({**_KS34, "o_proj": 8}.items()),
    **_large(("bn_o", 128)),
}
VARIANTS["frag_o8"] = {
    "tma_meeting": "fragments",
    "k_splits": tuple({**_KS34, "o_proj": 8}.items()),
}
VARIANTS["frag_q8"] = {
    "tma_meeting": "fragments",
    "k_splits": tuple({**_KS34, "qkv_proj": 8}.items()),
}
# ... and the B = 1 kernel's attention asking the L2 for its split's cached K
# and V rows before its waits (attn_prefetch_kv="l2"; item 150).
VARIANTS["attn_l2kv1"] = _one(("attn_prefetch_kv", "l2"))
# ... with the B = 1 kernel's attention called (its own registers), without
# and with the L2 prefetch: is item 150's loss the inlined kernel's spills?
VARIANTS["ol1_lm_attn"] = _one(("outline", ("lm_head", "argmax", "argmax_merge", "attention")))
VARIANTS["ol1_lm_attn_l2kv"] = _one(
    ("outline", ("lm_head", "argmax", "argmax_merge", "attention")), ("attn_prefetch_kv", "l2")
)
# Session 35: the large kernel's split-K meetings shared by each block's
# last parts to arrive (``tma_meet_share``): each adds a share of the block,
# so the last part's loads (down: 7 parts x 4 fragments a thread) shrink.
_SHARE = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
VARIANTS["share2"] = _large(("tma_meet_share", tuple((p, 2) for p in _SHARE)))
VARIANTS["share4"] = _large(
    ("tma_meet_share", tuple((p, 4) for p in _SHARE[:2]) + (("gate_up_proj", 2), ("down_proj", 4)))
)
VARIANTS["share4_down"] = _large(("tma_meet_share", (("down_proj", 4),)))
VARIANTS["share2_down"] = _large(("tma_meet_share", (("down_proj", 2),)))
VARIANTS["share4_down_o2"] = _large(("tma_meet_share", (("down_proj", 4), ("o_proj", 2))))
VARIANTS["share4_down_gu2"] = _large(("tma_meet_share", (("down_proj", 4), ("gate_up_proj", 2))))
# ... and the split projections' later weight boxes asked into L2 with their
# ring's first stages (prefetch "shared_l2"): the refills after the wait hit L2.
_L2REST = (("prefetch_ring", "shared_l2"),)
VARIANTS["l2rest_qo"] = _large(("projection_options", (("qkv_proj", _L2REST), ("o_proj", _L2REST))))
VARIANTS["l2rest_qod"] = _large(
    ("projection_options", tuple((p, _L2REST) for p in ("qkv_proj", "o_proj", "down_proj")))
)
VARIANTS["l2rest_d"] = _large(("projection_options", (("down_proj", _L2REST),)))
# Session 36: the large kernel's argmax in parts again (its tiles are called
# now, so the part tiles no longer make the attention spill, the +90 µs that
# made it take the whole-row argmax), and LM head blocks dealt in about two
# whole rounds of 264 CTAs (1002 blocks of 128 are 3.8 rounds; the widths must
# divide 128256: 501 of 256 are 1.9, 668 of 192 are 2.5).
VARIANTS["argparts"] = _large(("argmax_whole", False))
VARIANTS["lm256"] = _large(("bn_lm", 256), ("projection_options", (("lm_head", (("stages", 2),)),)))
VARIANTS["lm192"] = _large(("bn_lm", 192), ("projection_options", (("lm_head", (("stages", 3),)),)))


def _refill_test(*projections: str) -> dict:
    """The large kernel with ``projections`` refilling each ring stage once it
    tests free (``refill="test"``) instead of thread 0 waiting for it."""
    return _large(("projection_options", tuple((p, (("refill", "test"),)) for p in projections)))


# Session 37 (item 168): item 166's model took the projections 10 % shorter
# with a producer that holds no consumer; the nearest the tiles have is
# refill="test" (thread 0 goes on while a stage is still being read).
VARIANTS["rf_all"] = _refill_test("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
VARIANTS["rf_gd"] = _refill_test("gate_up_proj", "down_proj")
VARIANTS["rf_qo"] = _refill_test("qkv_proj", "o_proj")
# Session 38: the attention's split count by batch (attn_small_spans, the
# default: one round of 264 CTAs at L = 1024 up to 11 sequences) against the
# spans of 256 before it (320 instances at B = 8, L = 1024: two rounds).
# (Since session 39, item 174, the default's B = 2..16 kernel is mid_mma_cap1,
# and these names keep their session-38/39 meanings against that default.)
VARIANTS["spans256"] = {**_mid(*_MID_PHASED), "attn_small_spans": ()}
# Session 39, item 174: the B = 2..16 kernel on the large kernel's attention
# (tensor cores, cache rows by TMA, its own registers: called), which
# streams a span ~2x faster than the phased tile (items 171-172): with the
# phased tile's tiers (mid_mma), spans of 256 (mid_mma_s256), the split
# count capped so that the instances fill about one (cap1, the default
# since) or two (cap2) rounds of the 264 CTAs at any context (past the cap
# the spans grow with L). mid_phased: the default before.
VARIANTS["mid_phased"] = {**_mid(*_MID_PHASED), "attn_small_spans": _PHASED_TIERS}
VARIANTS["mid_mma"] = {"attn_small_spans": _PHASED_TIERS}
VARIANTS["mid_mma_s256"] = {"attn_small_spans": ()}
VARIANTS["mid_mma_cap1"] = {
    "attn_small_spans": ((2, 128, 16), (4, 128, 8), (8, 256, 4), (11, 384, 3), (16, 256, 2)),
}
VARIANTS["mid_mma_cap2"] = {
    "attn_small_spans": ((2, 128, 32), (4, 128, 16), (8, 256, 8), (11, 384, 6), (16, 256, 4)),
}
# ... a third ring stage (the prefetch before the waits then holds 384
# positions: all of a 256-position span and more of the longer ones), and
# spans of 512 up to B = 8 (128 instances at L = 1024, each one's start
# paid half as often).
VARIANTS["mid_attn3"] = _mid(("attn_tma_stages", 3))
# ... without the ring started before the waits, and inlined instead of
# called: in a trace (item 176) the attention instances of the CTAs that
# had just run a qkv instance start 2-6 µs after it, the others 0.5 µs
# after the stage.
VARIANTS["mid_nopf"] = _mid(("attn_tma_prefetch", False))
# Session 39, item 178: a code change, not a setting: "default" built
# before and "kvearly" after the tensor-core tile loads position L's key,
# score and value before its loop instead of after it (same configuration).
VARIANTS["kvearly"] = {}
# ... and "vstore" after it also writes the cache row of position L from
# those values instead of loading them again (item 179: no measurable change).
VARIANTS["vstore"] = {}
VARIANTS["mid_inline"] = _mid(("outline", False))
VARIANTS["mid_b8_512"] = {
    "attn_small_spans": ((2, 128, 16), (4, 128, 8), (8, 512, 4), (11, 384, 3), (16, 256, 2)),
}
# Session 40: the tensor-core attention's own time, stamped inside each
# instance (``LlamaConfig.attn_stamps``; ``bench/decode_trace.py`` prints
# the phases): the B = 2..16 kernel and the large-batch one, each alone.
# (The top-level flag gives the inputs, ``llama.torch_inputs``, the tensor.)
VARIANTS["stamps_mid"] = {"attn_stamps": True, "batch_buckets": ((None, ()),)}
VARIANTS["stamps_large"] = {"attn_stamps": True, "batch_buckets": ((None, M.LARGE_BATCH),)}
# Session 40: a code change, not a setting: "default" built before and
# "loadsfirst" after the tensor-core tile issues its setup's loads (query,
# position L's key and value, the RoPE rows) before any arithmetic on them.
VARIANTS["loadsfirst"] = {}
# ... and "nofence" after the attention's ring start also drops its
# fence.proxy.async.global (the ring reads no row this launch writes).
VARIANTS["nofence"] = {}
# ... each CTA loading its next queue entry ahead, skipping the waits its
# last completed one covers, or both (item 181: between two attention
# instances on a CTA, the entry's load and the satisfied wait's poll were
# ~1.2 and ~0.7-1.4 µs).
VARIANTS["lists_ahead"] = {"queue_ahead": True}
VARIANTS["lists_memo"] = {"wait_memo": True}
VARIANTS["lists_both"] = {"queue_ahead": True, "wait_memo": True}
# ... the memo in the B = 2..16 kernel alone (item 182: -0.5..-1 % at B = 8).
VARIANTS["mid_memo"] = _mid(("wait_memo", True))
VARIANTS["stamps_large_lists"] = {**VARIANTS["stamps_large"], **VARIANTS["lists_both"]}
# Session 41: the large-batch kernel alone, its tensor-core attention
# instances attending 2 or 4 kv heads each on one TMA ring (attn_items):
# at B = 64 a CTA ran two instances a layer with ~3 µs between them.
VARIANTS["large"] = {"batch_buckets": ((None, M.LARGE_BATCH),)}
for _items in (2, 4):
    VARIANTS[f"large_items{_items}"] = {
        "batch_buckets": ((None, (*M.LARGE_BATCH, ("attn_items", _items))),)
    }
VARIANTS["stamps_large_items2"] = {"attn_stamps": True, **VARIANTS["large_items2"]}
# ... a code change, not a setting: "large_items2_hoisted" built before each
# item read the thread index afresh (its lane values then lived across the
# item loop: 208 registers uncapped against 168 with one item).
VARIANTS["large_items2_hoisted"] = VARIANTS["large_items2"]
# ... a code change: "lfirst" built after the tensor-core attention starts
# warp 0's state from position L (its cache row written before the loop)
# instead of folding it in after: nothing of position L lives across the
# loop (the large kernel's tile: 168 registers uncapped, 40 bytes spilled
# under the 2-CTA cap, before; 128 and none after).
VARIANTS["lfirst"] = {}
# ... with the tensor-core tile leaner, B = 1 on it: no B = 1 kernel (the
# B = 2..16 kernel runs it), or the B = 1 kernel with the tensor-core
# attention called as the B = 2..16 kernel's (its other tiles inlined).
VARIANTS["one_mid"] = {"batch_buckets": M.LLAMA_3_2_1B.batch_buckets[1:]}
VARIANTS["one_mma"] = _one(
    ("attn_tile", "mma"), ("attn_unroll", 1), ("attn_pipeline", "auto"),
    ("attn_tma_release", "read_early"), ("outline", ("attention", "lm_head", "argmax", "argmax_merge")),
)  # fmt: skip
# ... with B = 1's splits of at least 128 positions, the tile's loop step
# (an artifact-wide field; 64-position spans round up to 128 on this tile).
VARIANTS["one_mma128"] = {**VARIANTS["one_mma"], "attn_single_span": 128}
# Session 42: the B = 1 kernel split by context (the default since: the
# phased attention up to L = 1280, the tensor-core one past it) against the
# phased B = 1 kernel at every context, the default before.
VARIANTS["one_phased"] = _one()
# ... and its long-context kernel (the tensor-core attention called, the
# other tiles inlined, as the B = 2..16 kernel's) with that kernel's wait
# memo: it took the B = 2..16 kernel 0.7-1.8 % (item 183), the inlined
# phased B = 1 kernel +3.5-5 % (SMALL_BATCH's first three: its evict-first
# hints too; its gemv rows mode came in session 45).
VARIANTS["one_long_memo"] = _long(*M.SMALL_BATCH[:3])
# ... the B = 1 kernel's combine in instances of 4 or 2 heads (8: 4
# instances a layer at B = 1, each merging 17 splits of 8 heads).
VARIANTS["one_cg4"] = _one(("combine_group", 4))
VARIANTS["one_cg2"] = _one(("combine_group", 2))
# ... and the B = 2..16 kernel's (32 instances a layer at B = 8).
VARIANTS["mid_cg4"] = _mid(("combine_group", 4))
# ... the sync-core projections' weight copies (the B = 1 and B = 2..16
# kernels, the LM head too) marked L2 evict-first: read once a step, they
# otherwise push the kernel's code and activations out of the L2 (each
# layer streams 121 MB through 50 MB; an argmax part over 16 KB of logits
# takes 7.4 µs at B = 1, as long as code fetched from the HBM would).
VARIANTS["evict_first"] = {"gemm_options": (*M._GEMM_OPTIONS, ("l2_evict_first", True))}


def _without(changes: tuple, key: str) -> tuple:
    """``changes`` without ``key``, in nested context buckets too."""
    out = []
    for k, v in changes:
        if k == key:
            continue
        if k == "context_buckets":
            v = tuple((bound, _without(c, key)) for bound, c in v)
        out.append((k, v))
    return tuple(out)


# ... adopted in the B = 2..16 kernel and B = 1's long-context one (item
# 197); "no_evict" is the default without it.
# ... and in the large-batch kernel, whose TMA weight boxes (read once up
# to B = 64) take the same hint: built in the forty-second session, not
# yet measured.
VARIANTS["large_evict"] = _large(("weights_evict_first", True))
# The attention's TMA ring copies (the KV cache, read once a step) marked
# evict-first too (``attn_kv_evict_first``, forty-third session): in the
# large kernel alone, with its weights', and in the B = 2..16 kernel.
VARIANTS["large_kv_evict"] = _large(("attn_kv_evict_first", True))
VARIANTS["large_both_evict"] = _large(("weights_evict_first", True), ("attn_kv_evict_first", True))
VARIANTS["mid_kv_evict"] = _mid(("attn_kv_evict_first", True))
# Why the short B = 1 kernel was 2 % slower with its weights evict-first
# (item 197): the LM head's weights alone (525 MB, the largest stream), or
# the layers' alone (``projection_options``' ``l2_evict_first``).
_LAYER_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
VARIANTS["one_ef_all"] = _one(("weights_evict_first", True))
VARIANTS["one_ef_lm"] = _one(_proj(("lm_head", "l2_evict_first", True)).popitem())
VARIANTS["one_ef_layers"] = _one(
    _proj(*((p, "l2_evict_first", True) for p in _LAYER_PROJECTIONS)).popitem()
)
# With the large kernel's both streams evict-first (item 200): the KV ring
# evict-first in B = 1's long kernel too (measured with the B = 2..16
# kernel's, which SMALL_BATCH has had since).
_KV_EF = ("attn_kv_evict_first", True)
VARIANTS["kv_evict_all"] = _long(_KV_EF)
# Item 201's trace: with the LM head's copies evict-first the LM head,
# final norm and argmax ran faster but the layers slower; the kernel inlines
# the LM head's ring fill before its waits, and ptxas then spilled one more
# word. "body": the tiles' own copies marked, not their ring fills'.
_ALL_PROJECTIONS = (*_LAYER_PROJECTIONS, "lm_head")


def _body_only(projections: tuple[str, ...]) -> tuple:
    return _proj(*((p, "l2_evict_first", "body") for p in projections)).popitem()


VARIANTS["one_ef_lm_body"] = _one(_body_only(("lm_head",)))
VARIANTS["one_ef_body"] = _one(_body_only(_ALL_PROJECTIONS))
VARIANTS["long_ef_body"] = _long(_body_only(_ALL_PROJECTIONS))
VARIANTS["mid_ef_body"] = _mid(_body_only(_ALL_PROJECTIONS))
VARIANTS["no_evict"] = {
    "batch_buckets": tuple(
        (bound, _without(changes, "weights_evict_first"))
        for bound, changes in M.LLAMA_3_2_1B.batch_buckets
    )
}
# Session 44: B = 1's projections on CUDA cores (``gemm_core="gemv"``: one
# row a tile, whole weight lines through a per-thread ring; the MoE's GEMV
# tiles streamed 7-8 % faster than the mma.sync ones, MoE item 103), all five
# or the layers' only, with deeper rings, with the weights evict-first.
# They ran against the sync default (item 207); SINGLE_SEQUENCE has taken
# the gemv core with 8 slots since, so at this commit they build it or a
# step from it (its tiles always called, no L2 hint: item 208), and
# `one_sync` builds the old default.
VARIANTS["one_sync"] = _one(("gemm_core", "sync"), ("gemm_options", M._GEMM_OPTIONS))
_GEMV_LAYERS = ("core_overrides", tuple((p, "gemv") for p in _LAYER_PROJECTIONS))
VARIANTS["one_gemv"] = _one(("gemm_core", "gemv"))
VARIANTS["one_gemv_layers"] = _one(_GEMV_LAYERS)
# Inlined, the gemv kernel spilled 112 bytes (the sync default 12); with the
# projections called, none (they are always called since).
_PROJECTION_TASKS = ("qkv", "o_proj", "gate_up", "down")
_OL_GEMV = ("outline", (*_PROJECTION_TASKS, "lm_head", "argmax", "argmax_merge"))
VARIANTS["one_gemv_ol"] = _one(("gemm_core", "gemv"), _OL_GEMV)
VARIANTS["one_gemv_s6"] = _one(("gemm_core", "gemv"), _OL_GEMV, ("gemm_options", (("stages", 6),)))
VARIANTS["one_gemv_s8"] = _one(("gemm_core", "gemv"), _OL_GEMV, ("gemm_options", (("stages", 8),)))
VARIANTS["one_gemv_ef"] = _one(("gemm_core", "gemv"), _OL_GEMV, ("weights_evict_first", True))
VARIANTS["long_gemv"] = _long(
    ("gemm_core", "gemv"),
    ("outline", (*_PROJECTION_TASKS, *dict(M.SINGLE_SEQUENCE_LONG)["outline"])),
)
# Session 45: the B = 2..16 kernel's projections on the gemv core, 16 (or
# 8) rows a tile on mma.sync with the weights as A (gemv_layer's rows mode;
# its warps take 16 weight rows, so o_proj's and down's blocks are 16 wide).
# Measured at ba9dbff, when one kernel ran B = 2..16 (item 210); since that
# kernel is split in two on these tiles, _mid applies them to both.
_GEMV_ROWS = (("gemm_core", "gemv"), ("bn_o", 16), ("bn_down", 16))
VARIANTS["mid_gemv16"] = _mid(*_GEMV_ROWS, ("gemv_block", 16), ("gemm_options", (("stages", 4),)))
VARIANTS["mid_gemv16_s6"] = _mid(
    *_GEMV_ROWS, ("gemv_block", 16), ("gemm_options", (("stages", 6),))
)
VARIANTS["mid_gemv16_gu16"] = _mid(
    *_GEMV_ROWS, ("gemv_block", 16), ("bn_gu", 16), ("gemm_options", (("stages", 4),))
)
VARIANTS["mid_gemv8"] = _mid(*_GEMV_ROWS, ("gemv_block", 8), ("gemm_options", (("stages", 4),)))


def _split_mid(small: tuple, large: tuple) -> dict:
    """The B = 2..16 kernel split in two: :data:`~etc.models.llama.SMALL_BATCH`
    with ``small``'s changes at B = 2..8, ``large``'s at B = 9..16 (the
    default's layout since session 45, whose B = 2..8 kernel was
    ``split_rows``'s)."""
    one, *_, big = M.LLAMA_3_2_1B.batch_buckets
    mid = M.SMALL_BATCH
    return dict(batch_buckets=(one, (8, (*mid, *small)), (16, (*mid, *large)), big))


# 8 rows a tile at B = 2..8 (16 at B = 9..16): item 210's best of each.
_ROWS8 = (*_GEMV_ROWS, ("gemv_block", 8), ("gemm_options", (("stages", 4),)))
_ROWS16 = (*_GEMV_ROWS, ("gemv_block", 16), ("gemm_options", (("stages", 4),)))
VARIANTS["split_rows"] = _split_mid(_ROWS8, _ROWS16)
VARIANTS["split_rows_gu16"] = _split_mid((*_ROWS8, ("bn_gu", 16)), _ROWS16)
VARIANTS["split_rows_s3"] = _split_mid((*_ROWS8, ("gemm_options", (("stages", 3),))), _ROWS16)
VARIANTS["split_rows_d6"] = _split_mid(
    (*_ROWS8, ("projection_options", (("down_proj", (("stages", 6),)),))), _ROWS16
)
VARIANTS["split_rows_qkv32"] = _split_mid((*_ROWS8, ("bn_qkv", 32)), _ROWS16)


# The B = 2..8 kernel's down stage (item 210: its 128 16-column instances
# take 8.3 µs, the stage 11.6): deeper rings for down with fewer slots
# issued before its waits, and the queues dealt by SM (item 135).
def _few(*changes: tuple[str, object]) -> dict:
    """The default buckets with ``changes`` in the B = 2..8 kernel."""
    one, (bound, few), *rest = M.LLAMA_3_2_1B.batch_buckets
    return dict(batch_buckets=(one, (bound, (*few, *changes)), *rest))


_DOWN = "down_proj"
VARIANTS["few_d6p1"] = _few(
    ("projection_options", ((_DOWN, (("stages", 6), ("prefetch_ring", 1))),))
)
VARIANTS["few_d8p2"] = _few(
    ("projection_options", ((_DOWN, (("stages", 8), ("prefetch_ring", 2))),))
)
VARIANTS["few_spread"] = _few(("sm_deal", "spread"))
VARIANTS["few_p2"] = _few(("prefetch_ring", 2))
VARIANTS["mid_spread"] = _mid(("sm_deal", "spread"))
# The B = 2..16 kernels before the rows mode became their default (item 211):
# the mma.sync core in both.
VARIANTS["mid_sync"] = _mid(
    ("gemm_core", "sync"), ("gemv_block", 1), ("bn_o", 8), ("bn_down", 8),
    ("gemm_options", M._GEMM_OPTIONS),
)  # fmt: skip


# Session 46: weights asked into L2 while B = 1's attention and combine run
# (item 42's task, off since then: the projections of that day were not
# bound by the HBM, and the prefetches slowed the attention's own reads; on
# the gemv core gate/up streams its 67 MB at 4.1 TB/s, item 207, so what it
# finds in L2 should now shorten it). ``gu<e>``: e eighths of every 8 rows.
def _l2pf(*regions: tuple[str, int, int], ctas: int = 64) -> tuple:
    return (("l2_prefetch", regions), ("l2_prefetch_ctas", ctas))


_WO, _WGU = ("wo", 8, 0), ("wgu", 2, 0)
VARIANTS["one_pf_o"] = _one(*_l2pf(_WO))
VARIANTS["one_pf_o_gu2"] = _one(*_l2pf(_WO, _WGU))
VARIANTS["one_pf_o_gu4"] = _one(*_l2pf(_WO, ("wgu", 4, 0)))
VARIANTS["one_pf_o_gu4_c128"] = _one(*_l2pf(_WO, ("wgu", 4, 0), ctas=128))
VARIANTS["one_pf_gu4"] = _one(*_l2pf(("wgu", 4, 0)))
VARIANTS["one_pf_o_gu6"] = _one(*_l2pf(_WO, ("wgu", 6, 0)))
VARIANTS["long_pf_o_gu4"] = _long(*_l2pf(_WO, ("wgu", 4, 0)))
# ... the B = 1 kernel's combine in its attention (item 22's fuse_combine,
# off since the seventh session, when the combine was one instance per
# sequence): the last split of each (layer, kv head) to count merges them.
# The B = 1 kernel alone (its counters are a tensor the other kernels lack),
# against the same kernel without.
# (One kernel: the phased tile then needs spans that do not grow with L.)
VARIANTS["one_only"] = {**dict(M.SINGLE_SEQUENCE), "batch_buckets": (), "attn_small_spans": ()}
VARIANTS["one_only_fuse"] = {**VARIANTS["one_only"], "fuse_combine": True}
# ... deeper rings on B = 1's gemv core (item 207: 4 / 6 / 8 slots got
# steadily faster): the ring's first slots load before each tile's waits,
# so a CTA waiting through the attention holds more of its next weights.
VARIANTS["one_s10"] = _one(("gemm_options", (("stages", 10),)))
VARIANTS["one_s12"] = _one(("gemm_options", (("stages", 12),)))
VARIANTS["one_gu12"] = _one(("projection_options", (("gate_up_proj", (("stages", 12),)),)))
# ... and the B = 2..16 kernels' combine in their tensor-core attention
# (attention_mma(combine=True), new): the stage's 1.6-2.0 µs a layer at B = 8
# (item 217) and its gaps.
VARIANTS["mid_fuse"] = _mid(("fuse_combine", True))
# ... and in B = 1's long-context kernel (the same tile, 17 splits).
VARIANTS["long_fuse"] = _long(("fuse_combine", True))
# ... down's ring one or two stages deeper at B = 2..8 (its 128 instances
# leave half the CTAs idle and stream ~2.8 TB/s, bound by each CTA's copies
# in flight; session 45's 6 and 8 stages also moved slots before the waits).
VARIANTS["few_d5"] = _few(("projection_options", ((_DOWN, (("stages", 5),)),)))
VARIANTS["few_d6"] = _few(("projection_options", ((_DOWN, (("stages", 6),)),)))


# ... the B = 9..16 kernel's tiles up to B = 32 (the gemv core's 16-row
# tiles, two row blocks re-reading each weight block, likely from L2; the
# tensor-core attention, one split per sequence and kv head as the large
# kernel's): the large kernel's TMA + wgmma projections take ~57 µs a layer
# at B = 64 against cuBLAS's 43 (item 206).
def _above16(*kernels: tuple[int | None, tuple]) -> dict:
    """The default buckets up to B = 16, then ``kernels`` ``(largest B,
    changes)``, then the large kernel unless the last of them is unbounded."""
    *small, large = M.LLAMA_3_2_1B.batch_buckets
    return dict(batch_buckets=(*small, *kernels, *((large,) if kernels[-1][0] else ())))


def _upto32(*changes: tuple[str, object]) -> dict:
    return _above16((32, (*M.SMALL_BATCH, *changes)))


VARIANTS["rows32"] = _upto32()
# ... B = 2..8's LM head (item 222's trace at B = 8: 137-143 µs for 525 MB,
# 3.7-3.8 TB/s, against B = 1's one-row tiles' 120 µs): 32- or 128-column
# blocks, or the mma.sync core.
VARIANTS["few_lm32"] = _few(("bn_lm", 32))
VARIANTS["few_lm128"] = _few(("bn_lm", 128))
VARIANTS["few_lm_sync"] = _few(("core_overrides", (("lm_head", "sync"),)))
# ... B = 2..16's gemv tiles with whole-line weight copies (session 47: the
# rows mode's copies read half lines, and it streams ~8 % slower than the
# one-row mode's whole lines, item 226).
VARIANTS["mid_lines"] = _mid(("gemv_whole_lines", True))  # the default since (item 227)
VARIANTS["mid_halves"] = _mid(("gemv_whole_lines", False))
VARIANTS["few_lm64"] = _few(("bn_lm", 64))
VARIANTS["mid_s5"] = _mid(("gemm_options", (("stages", 5),)))
VARIANTS["mid_s3"] = _mid(("gemm_options", (("stages", 3),)))
# B = 1's phased attention with its cached K and V rows copied into shared
# memory by the prefetch function, before the instance waits for the QKV
# projection (1 % faster at B = 1 in the seventh session's kernel; not tried
# since the projections moved to the gemv core and the combine into the
# attention), or by the body before its first step.
VARIANTS["one_pfkv"] = _one(("attn_prefetch_kv", True))
VARIANTS["one_stagekv"] = _one(("attn_stage_kv", True))


def _b1(*changes: tuple[str, object]) -> dict:
    """The default buckets with ``changes`` in both of B = 1's kernels."""
    (bound, one), *rest = M.LLAMA_3_2_1B.batch_buckets
    return dict(batch_buckets=((bound, (*one, *changes)), *rest))


# B = 1's o_proj in 16- or 32-column blocks (session 46's B = 1 trace: the
# o_proj instance that ends last runs on the CTA whose attention instance
# merged the splits, so its weights load only after the merge; 128 blocks
# are dealt to exactly the 128 CTAs after the attention's 136, which hold
# no attention instance and fill their rings while it runs).
VARIANTS["b1_o16"] = _b1(("bn_o", 16))
VARIANTS["b1_o32"] = _b1(("bn_o", 32))


def _short(*changes: tuple[str, object]) -> dict:
    """The default buckets with ``changes`` in B = 1's phased kernel (up to
    :data:`~etc.models.llama.SINGLE_SEQUENCE_CONTEXT`)."""
    (bound, one), *rest = M.LLAMA_3_2_1B.batch_buckets
    one = dict(one)
    (short, first), *longer = one["context_buckets"]
    one["context_buckets"] = ((short, (*first, *changes)), *longer)
    return dict(batch_buckets=((bound, tuple(one.items())), *rest))


# ... its phased tile sized to its 64-position splits (attn_phased_span: the
# K and V copies of a split take 16 KB of shared memory instead of 128, and
# two CTAs an SM still fit), then those copies issued before the waits
# (attn_prefetch_kv) or at the instance's start (attn_stage_kv): items
# 230-231's 149 KB cost the second CTA of each SM.
VARIANTS["b1_span64"] = _short(("attn_phased_span", 64))
VARIANTS["b1_span64_pfkv"] = _short(("attn_phased_span", 64), ("attn_prefetch_kv", True))
VARIANTS["b1_span64_stagekv"] = _short(("attn_phased_span", 64), ("attn_stage_kv", True))
# Each merge lane's splits loaded 1 (as before), 2 (the default) or 4 at a time
# (session 47's B = 1 trace: the merging split ends 2.8 µs after its group's
# previous one, and B = 1's 8 lanes an item walk 17 splits in 3 round trips).
VARIANTS["merge1"] = {"attn_merge_unroll": 1}  # the default again (item 234)
VARIANTS["merge2"] = {"attn_merge_unroll": 2}
VARIANTS["merge4"] = {"attn_merge_unroll": 4}
# B = 1's kernels before the session's two changes (items 231-232).
VARIANTS["before47_b1"] = _b1(
    ("bn_o", 8),
    ("context_buckets", ((M.SINGLE_SEQUENCE_CONTEXT, ()), (None, M.SINGLE_SEQUENCE_LONG))),
)
# The default before session 46's two changes (B = 1's combine fused, spans
# of 512 at B = 5..8), at L <= 1087 (its B = 1 kernel serves every context).
VARIANTS["before46"] = {
    **_one(("fuse_combine", False)),
    "attn_small_spans": ((2, 128, 16), (4, 128, 8), (8, 256, 4), (11, 384, 3), (16, 256, 2)),
}
# Session 48: B = 1's short kernel (up to L = 1087) alone, as the whole
# artifact's one kernel (so the top-level attn_stamps gives the inputs the
# phased tile's tensor), without and with the attention's clock stamps
# (``bench/decode_trace.py`` prints the splits' phases and the merge's).
_B1_ALONE = {
    **{k: v for k, v in M.SINGLE_SEQUENCE if k != "outline"},  # (a compile key here)
    "batch_buckets": (
        (
            1,
            (
                ("outline", dict(M.SINGLE_SEQUENCE)["outline"]),
                (
                    "context_buckets",
                    ((M.SINGLE_SEQUENCE_CONTEXT, M.SINGLE_SEQUENCE_SHORT), (None, ())),
                ),
            ),
        ),
        (None, ()),  # (B > 1: the same tiles, never run here)
    ),
    "attn_small_spans": (),  # (B = 2..16's spans: no kernel here runs them)
}
VARIANTS["b1_alone"] = _B1_ALONE
VARIANTS["stamps_b1"] = {**_B1_ALONE, "attn_stamps": True}
# Session 48: a code change, not a setting: "default", "b1_alone" and
# "stamps_b1" built before and "rope", "b1_rope" and "stamps_b1_rope" after
# the phased tile ropes 8 dims a thread (16-byte loads, one round trip)
# instead of one dim a thread in a loop of two (two round trips).
VARIANTS["rope"] = {}
VARIANTS["b1_rope"] = _B1_ALONE
VARIANTS["stamps_b1_rope"] = VARIANTS["stamps_b1"]
# ... and B = 1's merge loading 2 or 3 of a lane's splits at once (3: all 17
# of a lane's in one round trip), stamped and timed.
_B1_ALONE_BY_L = dict(_B1_ALONE["batch_buckets"][0][1])["context_buckets"]


def _b1_alone_short(*changes: tuple[str, object]) -> dict:
    """:data:`_B1_ALONE` with ``changes`` in its short kernel."""
    (short, first), longer = _B1_ALONE_BY_L
    one = (
        ("outline", dict(M.SINGLE_SEQUENCE)["outline"]),
        ("context_buckets", ((short, (*first, *changes)), longer)),
    )
    return {**_B1_ALONE, "batch_buckets": ((1, one), (None, ()))}


VARIANTS["stamps_b1_m2"] = {**_b1_alone_short(("attn_merge_unroll", 2)), "attn_stamps": True}
VARIANTS["stamps_b1_m3"] = {**_b1_alone_short(("attn_merge_unroll", 3)), "attn_stamps": True}


# ... and B = 1 up to L = 1151 in 9 splits of 128 positions instead of 17 of
# 64 (a split two loop steps, its K and V 32 KB; the merge one round trip
# with 2 of a lane's splits a load), stamped and timed.
def _b1_splits9(*changes: tuple[str, object], stamps: bool = False, span: int = 128) -> dict:
    (bound, one), *rest = M.LLAMA_3_2_1B.batch_buckets
    one = dict(one)
    _, *longer = one["context_buckets"]
    short = (("attn_phased_span", 128), ("attn_prefetch_kv", True), *changes)
    one["context_buckets"] = ((9 * 128 - 1, short), *longer)
    change = dict(attn_single_span=span, attn_single_splits=9)
    if stamps:  # the short kernel alone, as _B1_ALONE
        one["context_buckets"] = ((9 * 128 - 1, short), (None, ()))
        return {**_B1_ALONE, **change, "attn_stamps": True,
                "batch_buckets": ((1, tuple((k, v) for k, v in one.items()
                                           if k in ("outline", "context_buckets"))),
                                  (None, ()))}  # fmt: skip
    return {**change, "batch_buckets": ((bound, tuple(one.items())), *rest)}


VARIANTS["b1_s9"] = _b1_splits9()
VARIANTS["b1_s9_m2"] = _b1_splits9(("attn_merge_unroll", 2))
VARIANTS["stamps_b1_s9"] = _b1_splits9(stamps=True)
VARIANTS["stamps_b1_s9_m2"] = _b1_splits9(("attn_merge_unroll", 2), stamps=True)
# ... with the attention's 72 instances a layer taking the deal's 136
# positions (deal_slots), so every other stage lands on the CTAs it has with
# 17 splits (9 splits moved qkv's and made it ~1 µs longer, item 237).
_SLOTS = ("deal_slots", (("attention", 136),))
VARIANTS["b1_s9_slots"] = _b1_splits9(_SLOTS)
VARIANTS["b1_s9_m2_slots"] = _b1_splits9(("attn_merge_unroll", 2), _SLOTS)
VARIANTS["stamps_b1_s9_slots"] = _b1_splits9(_SLOTS, stamps=True)
# ... with spans of at least 64 (9 splits of 64 up to L = 575, as the
# default's, then of 128), not 128.
VARIANTS["b1_s9x64_slots"] = _b1_splits9(_SLOTS, span=64)
# (Session 48's attn_warm, the attention's prefetch asking the L2 for a line
# of each buffer its body touches after the waits, left the stamps unchanged
# and was removed: bench/RESULTS.md item 240.)
# ... and B = 1's attention steps 2-4 as one pass of each warp (attn_one_pass:
# two barriers fewer, every warp in the softmax), stamped and timed.
VARIANTS["b1_one_pass"] = _short(("attn_one_pass", True))
VARIANTS["stamps_b1_one_pass"] = {
    **_b1_alone_short(("attn_one_pass", True)),
    "attn_stamps": True,
}
VARIANTS["b1_m2"] = _short(("attn_merge_unroll", 2))
VARIANTS["b1_m3"] = _short(("attn_merge_unroll", 3))
# Session 49: B = 17..32 on the gemv core's rows mode in 32-row tiles, which
# read each weight byte once for all 32 rows (item 225's rows32 read it once
# per 16-row block): the B = 9..16 kernel's settings (g32), or the large
# kernel's (its tensor-core attention, whole-row argmax, every tile called)
# with the B = 9..16 kernel's projections (g32l); and every B >= 17 so
# (B = 33..64: two 32-row blocks; g64l: one 64-row block, which spills).
_GEMV_ROWS_32 = (
    ("gemm_core", "gemv"), ("gemv_block", 32), ("gemv_whole_lines", True),
    ("bn_qkv", 16), ("bn_o", 16), ("bn_gu", 32), ("bn_down", 16), ("bn_lm", 64),
    ("gemm_options", (("stages", 4),)), ("weights_evict_first", False),
)  # fmt: skip
_LARGE_GEMV_32 = (*M.LARGE_BATCH, *_GEMV_ROWS_32)
VARIANTS["g32"] = _upto32(("gemv_block", 32))
VARIANTS["g32l"] = _above16((32, _LARGE_GEMV_32))
VARIANTS["g32_all"] = _above16((None, (*M.SMALL_BATCH, ("gemv_block", 32))))
VARIANTS["g32l_all"] = _above16((None, _LARGE_GEMV_32))
# ... with the next chunk's activations loaded half a chunk ahead (a code
# change: g32l's first build loaded each half chunk's just before its mmas),
# and with 32-column qkv, o_proj and down blocks and 128-column LM head
# blocks (each block reads all of the batch's activations from L2: at 32 rows
# 1-2x the bytes of its weights with 16-column blocks).
VARIANTS["g32l_ahead"] = VARIANTS["g32l"]
VARIANTS["g32l_wide"] = _above16(
    (32, (*_LARGE_GEMV_32, ("bn_qkv", 32), ("bn_o", 32), ("bn_down", 32), ("bn_lm", 128)))
)


# ... and (session 49's trace at B = 32, L = 1024, layer 8: qkv 6.9 µs on
# 32-row gemv tiles against 10.7 on the tma core, o_proj 6.9 against 9.0,
# but down 20.4 against 16.5 and the LM head ~30 µs slower) only qkv and
# o_proj on the gemv core, 32 rows up to B = 32 (hyb32), and 64 past it
# (hyb; hyb64: 64 rows from B = 17).
def _hybrid(rows: int, projections: tuple[str, ...] = ("qkv_proj", "o_proj")) -> tuple:
    """The large kernel with ``projections`` on ``rows``-row gemv tiles in
    16-column blocks."""
    blocks = {"qkv_proj": "bn_qkv", "o_proj": "bn_o"}
    return (*M.LARGE_BATCH, ("core_overrides", tuple((p, "gemv") for p in projections)),
            ("gemv_block", rows), ("gemv_whole_lines", True),
            *((blocks[p], 16) for p in projections))  # fmt: skip


VARIANTS["hyb32"] = _above16((32, _hybrid(32)))
VARIANTS["hyb"] = _above16((32, _hybrid(32)), (None, _hybrid(64)))
VARIANTS["hyb64"] = _above16((None, _hybrid(64)))
VARIANTS["g64l"] = _above16((32, _LARGE_GEMV_32), (None, (*_LARGE_GEMV_32, ("gemv_block", 64))))


# Session 50: item 239's nine splits of up to 128 positions (the deal kept)
# only where they won, L = 576..1151, in a B = 1 kernel of their own
# (attn_single_tiers: the split count by context, so the long kernel keeps
# its 17 splits past L = 1151 and L <= 575 its 64-position ones). Item
# 239 predicts L = 768 -0.8 %, L = 1024 -1.2 %, L = 512 and 2048 even.
# Session 52 measured -1.0 % at L = 1024 and +0.3 % at 768: b1_tiers900
# starts the nine splits at L = 900 instead of 576.
def _b1_tiers(*changes: tuple[str, object], start: int = 576) -> dict:
    (bound, one), *rest = M.LLAMA_3_2_1B.batch_buckets
    one = dict(one)
    (_, short), longer = one["context_buckets"]
    mid = (("attn_phased_span", 128), ("attn_prefetch_kv", True), _SLOTS, *changes)
    one["context_buckets"] = ((start - 1, short), (9 * 128 - 1, mid), longer)
    return {
        "attn_single_tiers": ((start - 1, 64, 17), (9 * 128 - 1, 128, 9)),
        "batch_buckets": ((bound, tuple(one.items())), *rest),
    }


VARIANTS["b1_tiers"] = _b1_tiers()
VARIANTS["b1_tiers900"] = _b1_tiers(start=900)
# ... and B = 1's greedy argmax folded into its LM head (argmax_fused,
# sixty-first session): each warp's largest logit as an i64 key into one
# atomic maximum, one thread reading the token after the last LM head
# instance. Predicted: the 7.8 us between the LM head's end and the token
# falls to ~2, the LM head's instances each ~0.1-0.2 us longer (~7.6 per
# CTA, ~1 us on the path): -4..-5 us a step (-0.5..-0.6 %).
VARIANTS["b1_argmax_key"] = _b1(("argmax_fused", True))
# ... and the same in the B = 2..16 kernels (16 argmax parts and their merge
# today), whose LM head tiles fold 8 or 16 rows' keys: each warp's lanes
# hold one row's logits, so one atomic a warp and row. Predicted: the same
# ~5 us off the tail as at B = 1, less the 4 atomics a warp adds at B = 8
# (-0.3..-0.5 % of a ~1 ms step).
VARIANTS["mid_argmax_key"] = _mid(("argmax_fused", True))


def _b1_also(variant: dict, *changes: tuple[str, object]) -> dict:
    """``variant`` with ``changes`` added to its B = 1 bucket (all its kernels)."""
    (bound, one), *rest = variant.get("batch_buckets", M.LLAMA_3_2_1B.batch_buckets)
    return {**variant, "batch_buckets": ((bound, (*one, *changes)), *rest)}


# ... folded in B = 1's phased kernels only (the tensor-core kernel past L =
# 1087 spills 36 bytes more with it and lost 20 us on an H100, item 272).
def _b1_short_key(variant: dict) -> dict:
    (bound, one), *rest = variant.get("batch_buckets", M.LLAMA_3_2_1B.batch_buckets)
    one = dict(one)
    *phased, (last, longer) = one["context_buckets"]
    keyed = [(b, (*c, ("argmax_fused", True))) for b, c in phased]
    one["context_buckets"] = (*keyed, (last, longer))
    return {**variant, "batch_buckets": ((bound, tuple(one.items())), *rest)}


VARIANTS["b1s_argmax_key"] = _b1_short_key({})  # the default since (item 275)
VARIANTS["b1_tiers900s_key"] = _b1_short_key(VARIANTS["b1_tiers900"])
VARIANTS["b1_tiers900_key"] = _b1_also(VARIANTS["b1_tiers900"], ("argmax_fused", True))


# Session 62: the default before the fold went into B = 1's phased kernel
# (M.SINGLE_SEQUENCE_SHORT), to time the two in one call (built from
# today's default, so only that kernel's fold is taken out).
def _b1_unkeyed() -> dict:
    (bound, one), *rest = M.LLAMA_3_2_1B.batch_buckets
    one = dict(one)
    one["context_buckets"] = tuple(
        (b, tuple(c for c in changes if c[0] != "argmax_fused"))
        for b, changes in one["context_buckets"]
    )
    return {"batch_buckets": ((bound, tuple(one.items())), *rest)}


VARIANTS["before62"] = _b1_unkeyed()


# ... and the embedding tile called instead of inlined in the B = 1..16
# kernels (the large one calls every tile): ptxas, no device, finds the
# main function's spills (stores/loads, bytes) fall from 44/52 to 28/28 in
# B = 1's tensor-core kernel, 32/40 to 24/32 at B = 2..8 and 56/68 to 20/28
# at B = 9..16 (the phased B = 1 kernel spills none either way). With it,
# the fold no longer spills more in B = 1's tensor-core kernel (44/52, 80/88
# inlined) or at B = 2..8 (16/20, 72/96 inlined), so `emb_key` folds there
# too (at B = 9..16 still 68/80: not there). Predicted: `emb` −0..−3 µs a
# kernel whose spills fall; `emb_key` another −7..−10 µs at B = 1 past L =
# 1087 (the phased kernel's gain, item 275) and −5..−12 at B = 2..8 (item
# 272's B = 8).
def _embed_called(*, fold_long: bool = False, fold_few: bool = False) -> dict:
    (b1, one), (b8, few), (b16, mid), large = M.LLAMA_3_2_1B.batch_buckets
    one = dict(one)
    one["outline"] = (*one["outline"], "embed")
    *phased, (last, longer) = one["context_buckets"]
    longer = dict(longer)
    longer["outline"] = (*longer["outline"], "embed")
    if fold_long:
        longer["argmax_fused"] = True
    one["context_buckets"] = (*phased, (last, tuple(longer.items())))
    called = ("outline", (*M.LLAMA_3_2_1B.outline, "embed"))
    few = (*few, called, *((("argmax_fused", True),) if fold_few else ()))
    return {"batch_buckets": ((b1, tuple(one.items())), (b8, few), (b16, (*mid, called)), large)}


VARIANTS["emb"] = _embed_called()
VARIANTS["emb_key"] = _embed_called(fold_long=True, fold_few=True)
# (Measured, item 278: emb -2.0..-2.6 % at B = 2..8, even at B = 1 and 9..16;
# the fold then -1.0 % in B = 1's tensor-core kernel, even at B = 2..8. So
# the B = 2..8 kernel's called embedding and B = 1's tensor-core kernel's
# fold with it are the default since; `emb` and `emb_key` built from the
# default now add only what was not adopted.)


def _before_emb() -> dict:
    """The default before item 278 (the fold in B = 1's phased kernel only,
    the embedding inlined), to time it in the same call."""
    (b1, one), (b8, few), mid, large = M.LLAMA_3_2_1B.batch_buckets
    one = dict(one)
    *phased, (last, longer) = one["context_buckets"]
    longer = tuple(
        ("outline", ("attention", "lm_head", "argmax", "argmax_merge"))
        if k == "outline"
        else (k, v)
        for k, v in longer
        if k != "argmax_fused"
    )
    one["context_buckets"] = (*phased, (last, longer))
    few = tuple(c for c in few if c[0] != "outline")
    return {"batch_buckets": ((b1, tuple(one.items())), (b8, few), mid, large)}


VARIANTS["before_emb"] = _before_emb()
# ... and, since the called embedding paid in the B = 2..8 kernel with no
# spills to speak of (ncu: 1.1 % fewer instructions, 3 % fewer long-scoreboard
# stalls an issue, the same DRAM bytes; item 278), the LM head and argmax
# called there too (B = 1's: -1.3 %, thirtieth session), and the embedding
# alone or with them in the B = 9..16 kernel. Predicted: within +-1 % each
# (the outline choice moves ptxas's allocation of the inlined stages).
_CALLED_LM = ("attention", "embed", "lm_head", "argmax", "argmax_merge")


def _mid_only(*changes: tuple[str, object]) -> dict:
    """The default buckets with ``changes`` in the B = 9..16 kernel."""
    one, few, (bound, mid), *rest = M.LLAMA_3_2_1B.batch_buckets
    return dict(batch_buckets=(one, few, (bound, (*mid, *changes)), *rest))


VARIANTS["few_lm"] = _few(("outline", _CALLED_LM))
VARIANTS["mid_emb"] = _mid_only(("outline", ("attention", "embed")))
VARIANTS["mid_lm"] = _mid_only(("outline", _CALLED_LM))
# ... and `twin`, the default built again under another name: a control for
# how far two artifacts of one kernel drift in one call (item 281: within
# 0.1 % over four passes; item 280's 1 % in two passes was the passes' spread).
VARIANTS["twin"] = {}
# ... and B = 1's phased kernel calling its attention or its final norm
# (its projections and LM head are called already; the attention called was
# +1.8 % in the thirtieth session's kernel, before the phased tile's spans
# and prefetch). Predicted: within +-1 % each, as item 280's. Measured
# (item 282): the attention +2.5 % at L = 512, +5.0 % at 1024; the norm even.
_B1_CALLED = dict(M.SINGLE_SEQUENCE)["outline"]
VARIANTS["b1_call_attention"] = _short(("outline", (*_B1_CALLED, "attention")))
VARIANTS["b1_call_final_norm"] = _short(("outline", (*_B1_CALLED, "final_norm")))
# ... and the default with the tma core's projection parts stamped
# (gemm_stamps: where a B = 32 part's ~5.8 µs for 64 KB of weights goes, and
# the meeting's ~1.2 µs more in a block's last part; bench/decode_trace.py).
VARIANTS["stamps_large"] = {"gemm_stamps": True}
# ... and a ragged batch's kernels (each sequence at its own position; the
# sweep runs every sequence at L): what reading the positions costs.
VARIANTS["ragged"] = {"ragged": True}
# ... and over a paged cache (LlamaConfig.page_size; fifty-first session):
# pages of 128 (one TMA box a ring step) and of 16 (vLLM's default block;
# eight boxes a step, a table lookup a row in the phased tile). The PyTorch
# step runs on the contiguous cache, which is then dealt to random pages.
VARIANTS["paged128"] = {"page_size": 128}
# ... and a ragged batch with its attention dealt at run time (pool): at
# random positions the splits of short sequences end early, and a static
# list would leave their CTAs idle while the long ones' run.
VARIANTS["ragged_pool"] = {"ragged": True, "pool": ("attention",)}
VARIANTS["paged16"] = {"page_size": 16}
# ... and the large kernel's split-K parts meeting in pairs on thread-block
# clusters of 2 (tma_meeting="cluster", fifty-third session, written without
# a device): bench/meeting_proto.cu's model put the four projection stages at
# 57.2 µs a layer against 67.6 through the L2 (item 258), so B = 32-64 should
# gain up to ~10 µs a layer (~5-8 % of a step) if the model holds. Down's
# shared sums (tma_meet_share) do not combine with it; "unshared" is its
# baseline without them.
VARIANTS["cluster"] = _large(("tma_meeting", "cluster"), ("tma_meet_share", ()))
VARIANTS["unshared"] = _large(("tma_meet_share", ()))
# ... the cluster meeting's parts stamped (bench/decode_trace.py), against
# stamps_large: where a pair's time goes if the sweep says it does not gain.
VARIANTS["stamps_cluster"] = {"gemm_stamps": True, **VARIANTS["cluster"]}
# Session 60: B = 1's gate/up ring with fewer of its 7 first chunks issued
# before the wait. In the B = 1 traces (items 64 and 207) gate/up starts
# 1.6 µs after o_proj ends where the other stages start 0.5 µs after their
# producer: the poll that ends its wait queues behind the 12.6 MB its
# prefetch function has just asked for. Fewer chunks early should shorten
# that gap (up to -1.1 µs a layer, -2 % of the step) and slow the ring's ramp.
for _n in (2, 4):
    VARIANTS[f"b1_gu_pf{_n}"] = _b1(
        ("projection_options", (("gate_up_proj", (("prefetch_ring", _n),)),))
    )


# Session 63: B = 1 from L = 1088 to 1151 (lead 1 of docs/decoder.md). The
# nine-split phased tier (b1_tiers900) beat the tensor-core kernel by 2-3 %
# at L = 1100 on three H100 calls, but it is a sixth kernel. Alternatives:
# the tensor-core kernel itself in 9 splits of up to 128 positions there
# (one whole 128-position loop step each instead of 17 half-empty ones),
# with or without the deal slots that keep the later stages' CTAs where 136
# attention instances put them; and the phased tier from 1088 only.
# Predicted: long9 -1..-2 % at L = 1100 and 1150 (the half-empty steps
# gone, the merge of 9 splits instead of 17), even at 1024 (same kernels).
def _long_now(*changes: tuple[str, object]) -> dict:
    """Today's default buckets with ``changes`` in B = 1's last context bucket."""
    (bound, one), *rest = M.LLAMA_3_2_1B.batch_buckets
    one = dict(one)
    *shorter, (last, longer) = one["context_buckets"]
    one["context_buckets"] = (*shorter, (last, (*longer, *changes)))
    return {"batch_buckets": ((bound, tuple(one.items())), *rest)}


_TIER9 = {"attn_single_tiers": ((M.SINGLE_SEQUENCE_CONTEXT, 64, 17), (9 * 128 - 1, 128, 9))}
VARIANTS["long9"] = _TIER9
VARIANTS["long9s"] = {**_TIER9, **_long_now(_SLOTS)}
VARIANTS["tier1088"] = _b1_short_key(_b1_tiers(start=M.SINGLE_SEQUENCE_CONTEXT + 1))
# ... and item 286's long9 lost 3.8 % with half the attention instances,
# which says a B = 1 split streams its K and V at a per-CTA rate: more
# splits, not fewer. Past L = 1087 the counts grow with L (spans of 64) up
# to 25 or 33 instead of 17: at L = 4096 splits of 164 or 125 positions (two
# or one 128-position loop step) instead of 241 (two). Predicted: -1..-2 %
# at L = 2048 and 4096 with 33 (the attention ~2-3 us a layer shorter),
# even at L = 1024 (same counts; the constant in every kernel's split
# expression changes, hence the B = 8 controls).
VARIANTS["splits25"] = {"attn_single_splits": 25}
VARIANTS["splits33"] = {"attn_single_splits": 33}
# Session 63: only o_proj on the gemv core at B = 17..32 (hyb32_o). Item 247's
# trace had hyb32's o_proj 3 us a layer shorter, qkv 1.4 shorter, but the
# attention +1.0 and gate/up +1.4 longer; its ncu (item 248) found qkv's
# gemv blocks reading 24 MB of activations from L2 where the tma boxes read
# 6 MB. o_proj's 16-column gemv blocks read 16 MB, and the attention runs
# before them. Predicted: -2..-2.5 us a layer, -2 % at B = 24-32, L = 1024.
VARIANTS["hyb32_o"] = _above16((32, _hybrid(32, ("o_proj",))))


# Session 65: B = 1's splits meeting on thread-block clusters (attn_cluster,
# bench/cluster_merge_proto.cu). Up to L = 1087 exactly 8 splits of up to
# 192 positions (128 at L = 1024: two loop steps), the deal kept as with 17
# (item 239's slots); b1_s8 hands the partials over through the L2 as today
# (count, last merges), b1_c8 pushes them into rank 0's shared memory on a
# cluster of 8. Item 239 had 9 splits of 128 with slots at -1.3..-1.6 % (L =
# 1024). Predicted: b1_s8 -1..-1.5 %, b1_c8 a further -1.5..-2.5 % (the
# atomic's ~0.74 us and the merge's first L2 round trip, ~1.1, gone a layer).
_EIGHT_SHORT = (("attn_phased_span", 192), ("attn_prefetch_kv", True), ("argmax_fused", True),
                _SLOTS)  # fmt: skip
_EIGHT_TIERS = {"attn_single_tiers": ((M.SINGLE_SEQUENCE_CONTEXT, 0, 8),)}


def _b1_eight(*changes: tuple[str, object]) -> dict:
    (bound, one), *rest = M.LLAMA_3_2_1B.batch_buckets
    one = dict(one)
    _, *longer = one["context_buckets"]
    one["context_buckets"] = ((M.SINGLE_SEQUENCE_CONTEXT, (*_EIGHT_SHORT, *changes)), *longer)
    return {**_EIGHT_TIERS, "batch_buckets": ((bound, tuple(one.items())), *rest)}


VARIANTS["b1_s8"] = _b1_eight()
VARIANTS["b1_c8"] = _b1_eight(("attn_cluster", 8))


# ... and both stamped, B = 1's short kernel alone (as stamps_b1).
def _b1_eight_stamped(*changes: tuple[str, object]) -> dict:
    short = (*_EIGHT_SHORT, *changes)
    one = (
        ("outline", dict(M.SINGLE_SEQUENCE)["outline"]),
        ("context_buckets", ((M.SINGLE_SEQUENCE_CONTEXT, short), (None, ()))),
    )
    return {
        **_B1_ALONE,
        **_EIGHT_TIERS,
        "attn_stamps": True,
        "batch_buckets": ((1, one), (None, ())),
    }


VARIANTS["stamps_b1_s8"] = _b1_eight_stamped()
VARIANTS["stamps_b1_c8"] = _b1_eight_stamped(("attn_cluster", 8))
#: ``DECODE_SWEEP_VARIANTS=default,tma_all`` times only those (built ones).
if os.environ.get("DECODE_SWEEP_VARIANTS"):
    VARIANTS = {k: VARIANTS[k] for k in os.environ["DECODE_SWEEP_VARIANTS"].split(",")}
COMPILE_KEYS = ("schedule", "early_push", "min_ctas_per_sm", "pop_ahead", "outline")
BATCHES = (1, 8, 32, 64)
#: ``DECODE_SWEEP_BATCHES=16,32,64`` times only those.
if os.environ.get("DECODE_SWEEP_BATCHES"):
    BATCHES = tuple(int(b) for b in os.environ["DECODE_SWEEP_BATCHES"].split(","))
L = 1024
#: ``DECODE_SWEEP_CONTEXT=4096`` times that context instead.
if os.environ.get("DECODE_SWEEP_CONTEXT"):
    L = int(os.environ["DECODE_SWEEP_CONTEXT"])
CALLS = 10
#: ``DECODE_SWEEP_RAGGED=random``: ragged variants (``LlamaConfig.ragged``)
#: run at random positions up to L instead of every sequence at L.
RAGGED = os.environ.get("DECODE_SWEEP_RAGGED", "")


def config(name: str) -> M.LlamaConfig:
    change = {k: v for k, v in VARIANTS[name].items() if k not in COMPILE_KEYS}
    return dataclasses.replace(BASE, **change)


def build(out: Path) -> None:
    for name, change in VARIANTS.items():
        cfg = config(name)
        options = {k: v for k, v in change.items() if k in COMPILE_KEYS and k != "schedule"}
        # Every bucket of the configuration (etc.runtime.load picks by B).
        M.compile_decoder(cfg, change.get("schedule", "static"), **options).save(out / name)
        print("built", name, flush=True)


def run(artifacts: Path, out: Path | None, reps: int) -> None:
    import numpy as np
    import torch

    import etc.runtime
    from bench.splitk import copy_bandwidth

    copy_bps = copy_bandwidth(torch, reps)
    weights = M.random_weights_torch(BASE)
    rows = []
    for B in BATCHES:
        # A ragged variant's positions: every sequence at L, or with
        # DECODE_SWEEP_RAGGED=random uniform in 0..L (one at L), the same for
        # every variant of this B; its floor reads only their cache rows.
        lengths = np.full(B, L)
        if RAGGED == "random":
            lengths = np.random.default_rng(B).integers(0, L + 1, B)
            lengths[0] = L
        for name in VARIANTS:
            ragged = config(name).ragged
            cached = int(lengths.sum()) if ragged else B * L
            floor = (M.weight_bytes(BASE) + M.kv_bytes(BASE, 1, cached)) / copy_bps * 1e6
            contiguous = dataclasses.replace(config(name), page_size=0)
            bufs = M.torch_inputs(
                contiguous, weights, B, L, L + 1, lengths=lengths if ragged else None
            )
            with torch.no_grad():
                want = M.torch_decode_step(contiguous, bufs, L).clone()
            logits = bufs["logits"].float()
            kernel = etc.runtime.load(artifacts / name)
            syms = {"B": B, "L": L, "S": L + 1}
            page = config(name).page_size
            if page:  # the same caches dealt to random pages
                table = M.page_table(B, -(-(L + 1) // page))
                for k in ("k_cache", "v_cache"):
                    bufs[k] = M.to_pages(bufs[k], table, page)
                bufs["block_table"] = torch.from_numpy(table).cuda()
                syms.update(pages=table.size, max_pages=table.shape[1])
            kernel.launch(bufs, syms)
            kernel.check()
            agree = float((bufs["next_tokens"].long() == want).float().mean())
            # How far the logits are from PyTorch's (a flipped token of a
            # near-tie leaves this at bf16's noise, ~1e-2).
            err = float((bufs["logits"].float() - logits).norm() / logits.norm())
            us = timed(
                torch, lambda i, k=kernel, b=bufs, s=syms: k.launch(b, s, sync=False), CALLS, reps
            )
            row = {"variant": name, "B": B, "us": us, "floor_us": floor, "agree": agree}
            rows.append({**row, "logit_err": err})
            print(
                f"B={B:3d} {name:20s} {us:8.1f} us  floor {floor:7.1f} "
                f"({100 * floor / us:4.1f}%)  tokens agree {agree:.2f}  logits err {err:.1e}",
                flush=True,
            )
            del bufs
            torch.cuda.empty_cache()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode_sweep.json").write_text(
            json.dumps({"copy_TBps": copy_bps / 1e12, "rows": rows}, indent=1)
        )


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=7)


if __name__ == "__main__":
    raise SystemExit(main())

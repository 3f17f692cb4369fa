"""Qwen3-30B-A3B MoE layer (H=2048, I=768, E=128, top-8) on the GPU: ETC's
one-launch megakernel against PyTorch.

Two steps, because the GPU machine has no compiler:

    python bench/moe.py --build DIR [--trace]                    # CPU: compile every artifact
    python bench/moe.py --artifacts DIR --out OUTDIR [--trace]   # GPU: check, then time

``--trace`` also builds traced fused artifacts and, on the GPU, prints where
the time goes per task and T (``bench/moe_trace.py``).

Method: bf16 weights (random, fan-in scaled) and T in {1, 16, 128, 1024,
4096} tokens with uniform random routing; COPIES fresh random X per T, the
calls rotating over them. Every variant is checked against a float32 torch
reference (max|out - ref| / max|ref| <= 1e-2) before it is timed. Times are
medians of REPS repetitions of CALLS back-to-back calls between two CUDA
events, after a warm-up round. Baselines in the same process: the device
copy bandwidth (2 GiB copy) and bf16 matmul rate (8192^3 torch.matmul) give
the floor max(active weight bytes / copy BW, FLOPs / matmul rate), active
weights being the experts the routing actually touches plus the router;
PyTorch eager expert loop (router, then per expert index_select / matmul /
index_add, the usual Hugging Face loop, which syncs the host for the
counts); ``torch._grouped_mm`` (sort by expert, group offsets by
searchsorted on the GPU, two grouped GEMMs, no host sync) eager and
replayed from a CUDA graph (its output checked too). ETC: the fused graph under the
static and the dynamic schedule (one cooperative launch each), and the
unfused path (every task its own one-task graph, eight launches back to back;
the triggered GEMMs on a trigger event of wait count 0, static schedule).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import gpu_timed, timed  # noqa: E402
from etc.dtypes import torch_dtype  # noqa: E402
from etc.models import moe as M  # noqa: E402

SIZES = (1, 16, 128, 1024, 4096)
COPIES = 4
TOLERANCE = 1e-2
# Tile configurations built and timed; the best per T is reported.
# dec_pf_gu32, tma128wtc and pre64 are etc.models.moe.PRESETS["decode"],
# ["prefill"] and ["mid"] (decode: bm16cp, the best variant of `bench/gemm.py
# --sweep`, with the decoder's 4-stage x unroll-2 ring, rotated k loops,
# 32-column gate/up tiles and the rings filled by the tiles' prefetch; prefill:
# TMA tiles and the router on the TMA tile; mid: the same on 64-row split_n
# tiles); dec_rot42 is the decode preset before session 12; tc64 and tc128 are
# the cp.async + ldmatrix (mma.sync) tiles and wg128 the wgmma tiles of
# earlier prefill presets.
_SMEM = 48 * 1024 - 64


def _tc(block_m: int, bn_gu: int, bn_dn: int, options: tuple, **more) -> dict:
    """A `gemm_tc` tile configuration: both GEMMs with the same ``options``."""
    return dict(
        gemm="tc", block_m=block_m, block_n_gu=bn_gu, block_n_dn=bn_dn,
        gate_up_options=options, down_options=options, **more,
    )  # fmt: skip


def _tile_options(stages: int, core: str | None = None, smem: int = 220 << 10) -> tuple:
    core_opts = (("core", core),) if core else ()
    wide = (("block_k", 64),) if core == "wgmma" else ()
    return (("smem_limit", smem), ("stages", stages), *core_opts, *wide)


# The decode preset until 2026-11-30: 3 (gate/up) and 5 (down) stages, no rotation.
_BM16CP = dict(
    block_m=16, block_n_gu=16, block_n_dn=64, gate_up_options=(("stages", 3), ("unroll", 1)),
    down_options=(("warps", (1, 4, 2)), ("stages", 5), ("unroll", 1)),
)  # fmt: skip


# The decode preset of sessions 9-11: 16-column gate/up tiles, no prefetch.
_DEC_ROT42 = dict(
    block_m=16, block_n_gu=16, block_n_dn=64,
    gate_up_options=(("stages", 4), ("unroll", 2), ("rotate_k", True)),
    down_options=(("warps", (1, 4, 2)), ("stages", 4), ("unroll", 2), ("rotate_k", True)),
)  # fmt: skip


def _decode_ring(gate_up: tuple, down: tuple, **more) -> dict:
    """bm16cp with these ring options and ``rotate_k``."""
    rot = (("rotate_k", True),)
    return {
        **_BM16CP, "gate_up_options": (*gate_up, *rot),
        "down_options": (("warps", (1, 4, 2)), *down, *rot), **more,
    }  # fmt: skip


_SPLIT = (("smem_limit", 220 << 10), ("stages", 5), ("core", "tma"), ("split_n", True))
_TMA4 = (("smem_limit", 220 << 10), ("stages", 4), ("core", "tma"))
_TMA3 = (("smem_limit", 220 << 10), ("stages", 3), ("core", "tma"))

# The single preset as items 95-98 measured it (its down tiles without the
# ring prefetch that item 99 added).
_SINGLE0 = {
    **M.SLOT_MMA_PRESETS["single"],
    "down_options": M.SLOT_MMA_PRESETS["few"]["down_options"],
}
CONFIGS = {
    "bm16cp": _BM16CP,
    # cp.async + ldmatrix (mma.sync) tiles in 48 KiB of static shared memory.
    "tc64": _tc(64, 64, 128, _tile_options(3, smem=_SMEM)),
    "tc128": _tc(128, 64, 128, _tile_options(2, smem=_SMEM)),
    # The prefill preset before TMA: wgmma tiles (sm_90a), 2 warpgroups x
    # 64 rows, 64-wide k-tiles, 3 stages in dynamic shared memory.
    "wg128": _tc(128, 64, 128, _tile_options(3, "wgmma", 200 << 10)),
    # TMA + mbarrier pipelines feeding wgmma (bench/gemm_tma.py): 128-row
    # blocks, 4 stages; wide (gate/up 128 and down 256 columns) and narrow.
    "tma128w": _tc(128, 128, 256, _tile_options(4, "tma")),
    # tma128w with 32-expert router blocks: at T >= 1024 the 2-expert router
    # re-reads X 64 times (its logits took 520 of 1535 µs at T=4096).
    "tma128wr": _tc(128, 128, 256, _tile_options(4, "tma"), router_experts=32),
    # tma128w with the router on the TMA tile too (128 tokens x 128 experts
    # per CTA, float32 logits).
    "tma128wtc": M.PREFILL_YP,
    # The router's TMA tile on 32-expert blocks: 4 CTAs per 128 tokens (one
    # CTA took 17.5 us at T <= 128 and left 100 SMs idle at T = 4096).
    "tma128wtc32": {**M.PREFILL_YP, "router_experts": 32},
    # The prefill preset with the gate/up tiles gathering their rows from X
    # (no Xp, no permute: 134 MB written and read again at T = 4096).
    "pre_gather": {**M.PREFILL_YP, "gather": True},
    # The prefill preset with the down tiles adding their weighted rows into
    # the float32 sums Out32 (L2 reductions after a zero task; a cast task
    # instead of the combine, no Yp).
    "pre_atomic": {**M.PREFILL_YP, "combine": "atomic"},
    # ... into half-precision sums Out16 (16-byte reductions of the staged
    # block); _cast: the cast on 32 tokens a CTA, 8 chunks in flight a thread
    # (4 tokens a CTA, one chunk at a time, took 24 us at T = 4096).
    "pre_atomic16": {**M.PREFILL_YP, "combine": "atomic", "combine_dtype": "f16"},
    "pre_atomic16_cast": {
        **M.PREFILL_YP, "combine": "atomic", "combine_dtype": "f16", "combine_block": 32,
        "combine_unroll": 8,
    },
    # TMA tiles for few tokens: narrow column blocks (gate/up 16, down 64) so
    # 8 active experts give hundreds of tiles, 8 stages of weights in flight.
    "tma16": _tc(128, 16, 64, _tile_options(8, "tma")),
    "tma128": _tc(128, 64, 128, _tile_options(4, "tma")),
    # The decode preset with wider gate/up blocks. With 8 active experts
    # (T = 1) 16 columns give 384 tiles: 2.9 waves on 132 CTAs, 1.45 on 264.
    # 24 columns give 256 tiles and 32 give 192, so the last wave is full.
    "bm16cp_gu24": {**_BM16CP, "block_n_gu": 24},
    "bm16cp_gu32": {**_BM16CP, "block_n_gu": 32},
    # The decode preset with k loops rotated per tile (the tiles of one expert
    # stop reading the same activation lines at once: the decoder's rotate_k),
    # as is, with the decoder's 4 stages x unroll 2, and with 24-column gate/up.
    "dec_rot": _decode_ring((("stages", 3), ("unroll", 1)), (("stages", 5), ("unroll", 1))),
    "dec_rot42": _DEC_ROT42,
    # The prefill preset with more loads in flight in the memory-bound tiles
    # (combine 2 token chunks per thread, permute 16 row chunks).
    "pre_mem": {**M.PREFILL_YP, "combine_unroll": 2, "permute_unroll": 16},
    # ... and a 6-stage router ring, and 32-token top-k blocks (128 instances
    # at T = 4096 instead of 512).
    "pre_front": {
        **M.PREFILL_YP,
        "combine_unroll": 2,
        "permute_unroll": 16,
        "router_stages": 6,
        "topk_block": 32,
    },  # fmt: skip
    "dec_rot_gu24": _decode_ring(
        (("stages", 3), ("unroll", 1)), (("stages", 5), ("unroll", 1)), block_n_gu=24
    ),
    # The decode preset with its weight rings filled by the tiles' prefetch
    # functions, which a triggered instance calls once it knows its expert,
    # before it waits for the expert's rows (gate/up: the permute; down: the
    # expert's gate/up tiles). And with 32-column gate/up tiles: one wave of
    # 192 instances on 264 CTAs, each CTA's down weights then in flight early.
    "dec_pf": {
        **_DEC_ROT42,
        "gate_up_options": (*_DEC_ROT42["gate_up_options"], ("prefetch_ring", True)),
        "down_options": (*_DEC_ROT42["down_options"], ("prefetch_ring", True)),
    },
    "dec_pf_gu32": M.PRESETS["decode"],
    # The decode preset with the fused route tile (one hop from the logits to
    # the expert GEMMs instead of four: clear, top-k, plan, permute); T <= 128.
    "dec_route": {**M.PRESETS["decode"], "route": "fused", "route_max_tokens": 128},
    # The decode preset with 12 down stages of one k group (unroll 1): the
    # prefetch fills 11 of the tile's 12 groups (92 % of its weights) before
    # the instance waits for its expert's gate/up tiles; and with 6 gate/up
    # stages (5 groups in flight while the permute runs).
    # The decode preset with other column widths: 24 or 48 gate/up columns
    # (256 or 128 instances at T = 1), 128 down columns (128 instances).
    "dec_gu24": {**M.PRESETS["decode"], "block_n_gu": 24},
    # 24 gate/up columns with a one-chunk, 3-stage ring: 256 instances at
    # T = 1 that all fit at two CTAs per SM (dec_gu24's 8 k-slice warps'
    # ring took 192 KiB: one CTA per SM; RESULTS item 58).
    "dec_gu24_u1s3": {
        **M.PRESETS["decode"],
        "block_n_gu": 24,
        "gate_up_options": (("stages", 3), ("unroll", 1), ("rotate_k", True), ("prefetch_ring", True)),
    },
    "dec_gu48": {**M.PRESETS["decode"], "block_n_gu": 48},
    "dec_dn128": {**M.PRESETS["decode"], "block_n_dn": 128},
    "dec_dn12": {
        **M.PRESETS["decode"],
        "down_options": (
            ("warps", (1, 4, 2)), ("stages", 12), ("unroll", 1), ("rotate_k", True),
            ("prefetch_ring", True),
        ),
    },
    "dec_dn12_gu6": {
        **M.PRESETS["decode"],
        "gate_up_options": (
            ("stages", 6), ("unroll", 2), ("rotate_k", True), ("prefetch_ring", True),
        ),
        "down_options": (
            ("warps", (1, 4, 2)), ("stages", 12), ("unroll", 1), ("rotate_k", True),
            ("prefetch_ring", True),
        ),
    },
    # 64-row TMA tiles, the two warpgroups splitting the columns (split_n):
    # an expert's ragged last block wastes 32 rows on average instead of 64.
    # 5 stages of 64 x 64 + 256 x 64.
    "pre64": M.PRESETS["mid"],
    # The prefill and mid presets with the router's k loop in one part (the
    # presets before run 8 of session 12; they now split it in 4: one CTA
    # took 17 µs per 128 tokens, 32 k-tiles in a row).
    "pre_rs1": {**M.PREFILL_YP, "router_splits": 1},
    "mid_rs1": {**M.PRESETS["mid"], "router_splits": 1},
    # Prefill tiles with several pipeline passes per instance (sub_n): one
    # round of waits and table lookups per 256 (x2: 384) gate/up and 512
    # (x2: 1024) down columns instead of per 128 and 256.
    "pre_sub2": {
        **M.PREFILL_YP, "block_n_gu": 256, "block_n_dn": 512,
        "gate_up_options": (*_TMA4, ("sub_n", 128)), "down_options": (*_TMA4, ("sub_n", 256)),
    },
    "pre_sub3": {
        **M.PREFILL_YP, "block_n_gu": 384, "block_n_dn": 1024,
        "gate_up_options": (*_TMA4, ("sub_n", 128)), "down_options": (*_TMA4, ("sub_n", 256)),
    },
    "pre_sub2f": {
        **M.PREFILL_YP, "block_n_gu": 256, "block_n_dn": 512, "topk_block": 32,
        "gate_up_options": (*_TMA4, ("sub_n", 128)), "down_options": (*_TMA4, ("sub_n", 256)),
    },
    # Two CTAs per SM (with min_ctas_per_sm=2): 128 x 128 blocks (64
    # accumulators a thread fit 128 registers) and 3 stages of 32 KiB, so
    # one CTA's waits and table lookups between instances overlap the other's
    # wgmma; the router's ring 3 stages too.
    "pre128x2": {
        **M.PREFILL_YP, "block_n_gu": 64, "block_n_dn": 128, "router_stages": 3,
        "gate_up_options": _TMA3, "down_options": _TMA3,
    },
    # The same with 64-row split_n tiles (2 stages of 40 KiB).
    "pre64x2": {
        **M.PREFILL_YP, "block_m": 64, "router_stages": 3,
        "gate_up_options": (*_TMA3[:1], ("stages", 2), ("core", "tma"), ("split_n", True)),
        "down_options": (*_TMA3[:1], ("stages", 2), ("core", "tma"), ("split_n", True)),
    },
    # The presets with their GEMM tiles dealt by ticket (MoEConfig.gemm_deal):
    # each slot of a CTA's static list runs the next unclaimed tile.
    "dec_tk": {**M.PRESETS["decode"], "gemm_deal": "ticket"},
    "pre_tk": {**M.PREFILL_YP, "gemm_deal": "ticket"},
    "mid_tk": {**M.PRESETS["mid"], "gemm_deal": "ticket"},
    "mid_list": {**M.PRESETS["mid"], "gemm_deal": "list"},
    # The prefill preset whose experts with one row block of at most 64 rows
    # run it on one warpgroup (short_blocks); and with 32-token top-k blocks
    # (128 top-k CTAs at T = 4096 instead of 512).
    "pre_short": {
        **M.PREFILL_YP,
        "gate_up_options": (*M.PREFILL_YP["gate_up_options"], ("short_blocks", True)),
        "down_options": (*M.PREFILL_YP["down_options"], ("short_blocks", True)),
    },
    "pre_tb32": {**M.PREFILL_YP, "topk_block": 32},
    # 96-column gate/up blocks (192 weight rows): 8 column blocks per row
    # block instead of 6 (the dense 128 x 192 tile ran 565 TFLOP/s at M =
    # 4096 where 128 x 256 ran 512: whole waves).
    "pre_gu96": {**M.PREFILL_YP, "block_n_gu": 96},
    # ... and short blocks dealt by ticket: a CTA freed early by a short
    # block takes the next unclaimed tile instead of running ahead of its
    # neighbours in its list (which read the same weights through L2).
    "pre64_front": {
        **M.PREFILL_YP, "block_m": 64, "gate_up_options": _SPLIT,
        "down_options": _SPLIT, "combine_unroll": 2, "permute_unroll": 16,
        "router_stages": 6, "topk_block": 32,
    },
    # One token: static slot grids, no routing tables (MoEConfig.route="slots").
    "single": M.PRESETS["single"],
    # ... on the mma.sync slot tiles (the single and few presets before item 103).
    "single_mma": M.SLOT_MMA_PRESETS["single"],
    "few_mma": M.SLOT_MMA_PRESETS["few"],
    "single_gu24": {**_SINGLE0, "block_n_gu": 24},
    "single_dn128": {**_SINGLE0, "block_n_dn": 128},
    "single_sl": {**_SINGLE0, "slot_logits": True},
    "single_sl_re1": {**_SINGLE0, "slot_logits": True, "router_experts": 1},
    # ... with deeper weight rings (bytes in flight per CTA) or narrower gate/up tiles.
    "single_sl_s6": {**_SINGLE0, "slot_logits": True,
                     "gate_up_options": (("stages", 6), ("unroll", 2), ("rotate_k", True))},
    "single_sl_s8": {**_SINGLE0, "slot_logits": True,
                     "gate_up_options": (("stages", 8), ("unroll", 2), ("rotate_k", True))},
    "single_sl_dn6": {**_SINGLE0, "slot_logits": True,
                      "down_options": (("warps", (1, 4, 2)), ("stages", 6), ("unroll", 2),
                                       ("rotate_k", True))},
    "single_sl_gu16": {**_SINGLE0, "slot_logits": True, "block_n_gu": 16},
    "single_ids": {**_SINGLE0, "slot_logits": False},
    "few": M.PRESETS["few"],
    # ... with more k per ring stage (fewer k-loop iterations, each one a
    # ring wait and a CTA barrier).
    "single_u4": {**_SINGLE0,
                  "gate_up_options": (("stages", 4), ("unroll", 4), ("rotate_k", True))},
    "single_u4s3": {**_SINGLE0,
                    "gate_up_options": (("stages", 3), ("unroll", 4), ("rotate_k", True))},
    "single_u4d": {**_SINGLE0,
                   "gate_up_options": (("stages", 4), ("unroll", 4), ("rotate_k", True)),
                   "down_options": (("warps", (1, 4, 2)), ("stages", 3), ("unroll", 4),
                                    ("rotate_k", True))},
    "single_u8s2": {**_SINGLE0,
                    "gate_up_options": (("stages", 2), ("unroll", 8), ("rotate_k", True))},
    # ... three CTAs per SM (80 registers), with 16-column gate/up tiles (384
    # instances) and 32-column down tiles (512) so every SM streams more.
    # ... the down tiles' weights asked of the L2 (or their ring filled) once
    # the top-k is done, before they wait for their slot's gate/up rows.
    # (single_dnring, measured so, is now the single preset; single_noring was it before.)
    "single_noring": _SINGLE0,
    "single_dnl2": {**_SINGLE0, "down_options": (
        *M.SLOT_MMA_PRESETS["few"]["down_options"], ("prefetch_weights", True))},
    "few_dnl2": {**M.SLOT_MMA_PRESETS["few"], "down_options": (
        *M.SLOT_MMA_PRESETS["few"]["down_options"], ("prefetch_weights", True))},
    # Each gate/up tile also projects its own columns down and adds them
    # into Out32 (MoEConfig.fuse_down): no down task, no wait for a whole slot.
    "single_fd": {**M.SLOT_MMA_PRESETS["single"], "fuse_down": True, "combine": "atomic"},
    "single_fd_gu24": {**M.SLOT_MMA_PRESETS["single"], "fuse_down": True, "combine": "atomic",
                       "block_n_gu": 24},
    "single_fd_gu16": {**M.SLOT_MMA_PRESETS["single"], "fuse_down": True, "combine": "atomic",
                       "block_n_gu": 16},
    # ... and the single preset whose k loops all start at chunk 0 (no rotate_k).
    "single_norot": {
        **M.SLOT_MMA_PRESETS["single"],
        "gate_up_options": (("stages", 4), ("unroll", 2)),
        "down_options": (("warps", (1, 4, 2)), ("stages", 4), ("unroll", 2),
                         ("prefetch_ring", True)),
    },
    # The slot tiles on CUDA cores, whole 128-byte lines per warp copy
    # (MoEConfig(gemm="gemv"), etc.tiles.gemv).
    "single_gemv": {**M.PRESETS["single"], "gemm": "gemv",
                    "gate_up_options": (("stages", 4),),
                    "down_options": (("stages", 4), ("prefetch_ring", True))},
    "single_gemv_s8": {**M.PRESETS["single"], "gemm": "gemv",
                       "gate_up_options": (("stages", 8),),
                       "down_options": (("stages", 8), ("prefetch_ring", True))},
    "few_gemv": {**M.PRESETS["few"], "gemm": "gemv", "gate_up_options": (("stages", 4),),
                 "down_options": (("stages", 4), ("prefetch_ring", True))},
    **{
        f"{_k}_gemv_s{_gu}_{_dn}": {
            **M.PRESETS[_k], "gemm": "gemv", "gate_up_options": (("stages", _gu),),
            "down_options": (("stages", _dn), ("prefetch_ring", True)),
        }
        for _k in ("single", "few") for _gu, _dn in ((8, 8), (10, 8), (12, 8), (12, 12))
    },
    # ... with narrower gate/up blocks (whole warps idle): 256 or 384 gate/up
    # tiles at T = 1 instead of 192 on 264 CTAs; and narrower down blocks.
    "single_gemv_gu24": {**M.PRESETS["single"], "block_n_gu": 24},
    "single_gemv_gu16": {**M.PRESETS["single"], "block_n_gu": 16},
    "single_gemv_gu24_dn32": {**M.PRESETS["single"], "block_n_gu": 24, "block_n_dn": 32},
    # ... with the combine in the down tiles (combine="last": the last of a
    # token's slot tiles of a column block sums them; no combine task).
    "single_last": {**M.PRESETS["single"], "combine": "last"},
    "single_gu24_last": {**M.PRESETS["single"], "block_n_gu": 24, "combine": "last"},
    "few_last": {**M.PRESETS["few"], "combine": "last"},
    "few_gu24_last": {**M.PRESETS["few"], "block_n_gu": 24, "combine": "last"},
    # ... with one expert per logits CTA (128 router instances at T = 1).
    "single_re1": {**M.PRESETS["single"], "router_experts": 1},
    "few_re1": {**M.PRESETS["few"], "router_experts": 1},
    "single_m3": _SINGLE0,
    "single_gu16_m3": {**_SINGLE0, "block_n_gu": 16},
    "single_gu16_dn32_m3": {**_SINGLE0, "block_n_gu": 16, "block_n_dn": 32},
}  # fmt: skip
CONFIGS["pre_short_tk"] = {**CONFIGS["pre_short"], "gemm_deal": "ticket"}


def _chunked(config: dict, chunk: int) -> dict:
    """``config`` with both expert weights in the chunked layout
    (``weight_chunk``: a k step of an 8-row fragment reads one contiguous
    piece instead of 8 rows 4 KB apart; bench/weight_stream.cu)."""
    return {
        **config,
        "gate_up_options": (*config["gate_up_options"], ("weight_chunk", chunk)),
        "down_options": (*config["down_options"], ("weight_chunk", chunk)),
    }


# (C = 32: a warp's 16-byte copies of one k chunk are 512 contiguous bytes.)
# (single_ch32 & co. are the mma.sync slot tiles' variants, measured before item 103.)
for _key in ("single", "few", "dec_pf_gu32"):
    _base = CONFIGS[f"{_key}_mma" if _key in ("single", "few") else _key]
    for _chunk in (32, 64, 128):
        CONFIGS[f"{_key}_ch{_chunk}"] = _chunked(_base, _chunk)
CONFIGS["single_norot_ch32"] = _chunked(CONFIGS["single_norot"], 32)
# ... and with the ring filled by one bulk copy per warp and fragment (C = 32).
# A triggered task may run its prefetch twice (Graph refuses bulk copies
# there): the table-driven decode preset's bulk rings are filled in the body.
for _key in ("single", "few", "dec_pf_gu32"):
    _config = _chunked(CONFIGS[f"{_key}_mma" if _key in ("single", "few") else _key], 32)
    for _side in ("gate_up_options", "down_options"):
        _kept = [o for o in _config[_side] if _key != "dec_pf_gu32" or o[0] != "prefetch_ring"]
        _config[_side] = (*_kept, ("bulk_ring", True))
    CONFIGS[f"{_key}_ch32b"] = _config
# The TMA presets, and with chunks of 64 (4-D maps: the same boxes).
for _key in ("mid", "prefill"):
    CONFIGS[_key] = dict(M.PRESETS[_key])
    CONFIGS[f"{_key}_ch64"] = _chunked(CONFIGS[_key], 64)
    # Session 30: the preset's tiles called, not inlined (etc.compile(outline=True)):
    # ptxas -v gives the kernel 202 registers instead of 255 (prefill) and
    # 127 instead of 221 (mid), each tile allocated apart.
    CONFIGS[f"{_key}_ol"] = dict(M.PRESETS[_key])
# Session 35: the preset of T > 2048 (top-k blocks of 32, the bulk permute).
CONFIGS["prefill_large"] = dict(M.PRESETS["prefill_large"])
# ... with 64- or 16-token top-k blocks (64 or 256 CTAs at T = 4096).
CONFIGS["pl_tb64"] = {**M.PRESETS["prefill_large"], "topk_block": 64}
CONFIGS["pl_tb16"] = {**M.PRESETS["prefill_large"], "topk_block": 16}
# The prefill preset through session 32 (Yp and a combine task; item 140).
CONFIGS["prefill_yp"] = dict(M.PREFILL_YP)
# Session 33: thread 0 refilling a ring stage only once it is free
# (gemm_tc's refill="test", item 111 of the GEMM tiles: +2.5 % at 4096 x
# 1536 x 2048), in the gate/up tiles, the down tiles, or both.
_REFILL = (("refill", "test"),)
CONFIGS["pre_refill"] = {
    **M.PREFILL_YP,
    "gate_up_options": (*M.PREFILL_YP["gate_up_options"], *_REFILL),
    "down_options": (*M.PREFILL_YP["down_options"], *_REFILL),
}
CONFIGS["pre_refill_gu"] = {
    **CONFIGS["pre_refill"],
    "down_options": M.PREFILL_YP["down_options"],
}
CONFIGS["pre_refill_dn"] = {
    **CONFIGS["pre_refill"],
    "gate_up_options": M.PREFILL_YP["gate_up_options"],
}
# ... and with item 92's half-precision sums in the down tiles (no combine task).
CONFIGS["pre_a16c_refill"] = {
    **CONFIGS["pre_atomic16_cast"],
    "gate_up_options": CONFIGS["pre_refill"]["gate_up_options"],
    "down_options": CONFIGS["pre_refill"]["down_options"],
}
# ... with 16 / 32 of a permute thread's 16-byte loads in flight instead of 8.
CONFIGS["pre_a16c_refill_pu16"] = {**CONFIGS["pre_a16c_refill"], "permute_unroll": 16}
CONFIGS["pre_a16c_refill_pu32"] = {**CONFIGS["pre_a16c_refill"], "permute_unroll": 32}
# ... with the permute's rows moved by bulk copies through 32 / 48 shared slots.
CONFIGS["pre_a16c_refill_bp32"] = {**CONFIGS["pre_a16c_refill"], "permute_slots": 32}
CONFIGS["pre_a16c_refill_bp48"] = {**CONFIGS["pre_a16c_refill"], "permute_slots": 48}
CONFIGS["pre_bp32"] = {**M.PREFILL_YP, "permute_slots": 32}
# ... with no permuted copy: the gate/up tiles gather their rows from X by
# one-row TMA boxes (gather_tma; item 81 gathered them by cp.async).
_GT = (("gather_tma", True),)
CONFIGS["pre_gt"] = {
    **M.PREFILL_YP,
    "gather": True,
    "gate_up_options": (*M.PREFILL_YP["gate_up_options"], *_GT),
}
# (refill="test" takes no gathered A operand: the gate/up tiles keep "wait".)
CONFIGS["pre_a16c_refill_gt"] = {
    **CONFIGS["pre_a16c_refill"],
    "gather": True,
    "gate_up_options": CONFIGS["pre_gt"]["gate_up_options"],
}
# The adopted prefill preset with 32-token top-k blocks, the bulk permute, or both.
CONFIGS["pre16_tb32"] = {**M.PRESETS["prefill"], "topk_block": 32}
CONFIGS["pre16_bp48"] = {**M.PRESETS["prefill"], "permute_slots": 48}
CONFIGS["pre16_tb32_bp48"] = {**M.PRESETS["prefill"], "topk_block": 32, "permute_slots": 48}
# Session 36: prefill_large before it took the down ring (item 159); the
# prefill preset, which keeps its 256-column down tiles, with the ring.
_NORING = {"block_n_dn": 256, "down_options": M.PRESETS["prefill"]["down_options"]}
CONFIGS["pl_noring"] = {**M.PRESETS["prefill_large"], **_NORING}
CONFIGS["pre_noring"] = dict(M.PRESETS["prefill"])
CONFIGS["pre_ring"] = {
    **M.PRESETS["prefill"], "block_n_dn": 512,
    "down_options": M.PRESETS["prefill_large"]["down_options"],
}  # fmt: skip
# Each instance's column passes through one TMA ring (sub_ring), on the ringless
# prefill_large as measured: gate/up blocks of 256 columns in 2 passes of 128,
# down blocks of 512 in 2 passes of 256 (the model's _DOWN_RING: 4 stages and a
# staging buffer, down's in halves, under 226 KiB; pl_ring_dn is prefill_large now).
_PL = CONFIGS["pl_noring"]
_GU_RING = (("sub_n", 128), ("sub_ring", True), ("smem_limit", 226 << 10))
_RING_GU = {"block_n_gu": 256, "gate_up_options": (*_PL["gate_up_options"], *_GU_RING)}
_RING_DN = {"block_n_dn": 512, "down_options": (*_PL["down_options"], *M._DOWN_RING)}
CONFIGS["pl_ring"] = {**_PL, **_RING_GU, **_RING_DN}
CONFIGS["pl_ring_gu"] = {**_PL, **_RING_GU}
CONFIGS["pl_ring_dn"] = {**_PL, **_RING_DN}
# ... its down tiles 1024 wide in four passes of 256.
CONFIGS["pl_dn1024"] = {**M.PRESETS["prefill_large"], "block_n_dn": 1024}
# The permute dealt over the first 32 / 64 CTAs only (four / two experts each,
# in expert order), so the other CTAs start the first experts' gate/up tiles
# early; with the GEMM tiles dealt by ticket, which lets the CTAs that did not
# permute take more of them (item 164).
CONFIGS["pl_pc32"] = {**M.PRESETS["prefill_large"], "permute_ctas": 32}
CONFIGS["pl_pc64"] = {**M.PRESETS["prefill_large"], "permute_ctas": 64}
CONFIGS["pl_pc32_tk"] = {**CONFIGS["pl_pc32"], "gemm_deal": "ticket"}
# Session 37: a top-k warp selecting its tokens 2 or 4 at a time (item 163's
# trace: 10 µs a top-k instance of 32 tokens, four after one another a warp);
# and prefill's 8-token top-k blocks as 32-token ones so unrolled.
CONFIGS["pl_tku2"] = {**M.PRESETS["prefill_large"], "topk_unroll": 2}
CONFIGS["pl_tku4"] = {**M.PRESETS["prefill_large"], "topk_unroll": 4}
CONFIGS["pre_tb32u4"] = {**M.PRESETS["prefill"], "topk_block": 32, "topk_unroll": 4}
# ... with the top-k tile called (its registers its own: inlined, the unrolled
# top-k took the kernel's spills from 28 to 132-144 bytes), and the plain one so.
for _key in ("prefill_large", "pl_tku2", "pl_tku4", "prefill"):
    CONFIGS[f"{_key}_olt"] = CONFIGS[_key]
#: Extra etc.compile options of a configuration's fused kernels.
COMPILE_OPTIONS = {"mid_ol": {"outline": True}, "prefill_ol": {"outline": True}}
for _key in ("prefill_large_olt", "pl_tku2_olt", "pl_tku4_olt", "prefill_olt"):
    COMPILE_OPTIONS[_key] = {"outline": ("topk",)}
# The presets' own called tiles (M.PRESET_OUTLINE: prefill_large's top-k since
# item 165); "pl_inlined" is prefill_large before, every tile inlined.
for _key, _tasks in M.PRESET_OUTLINE.items():
    COMPILE_OPTIONS.setdefault(_key, {"outline": _tasks})
CONFIGS["pl_inlined"] = CONFIGS["prefill_large"]
# ... with its plan and permute called too (the kernel's last 12 bytes of
# spills gone; plan alone: 4).
for _key, _tasks in (("pl_olt3", ("topk", "plan", "permute")), ("pl_olt2", ("topk", "plan"))):
    CONFIGS[_key] = CONFIGS["prefill_large"]
    COMPILE_OPTIONS[_key] = {"outline": _tasks}
for _key in ("prefill_large", "pl_ring", "pl_ring_gu", "pl_ring_dn"):  # the same, tiles called
    CONFIGS[f"{_key}_ol"] = CONFIGS[_key]
    COMPILE_OPTIONS[f"{_key}_ol"] = {"outline": True}
# The presets as one bucketed artifact (etc.models.moe.compile_moe: a kernel
# per range of T); its buffers are the prefill member's (4 logits rows a token).
# AUTOS: those artifacts by name, with their weight_chunk.
AUTO = "auto"
_FAMILY_PREFILL = M.preset_family()[-1][2]  # the auto kernels' buffers: the family's
CONFIGS[AUTO] = {
    **M.PRESETS["prefill"],
    "logits_parts": _FAMILY_PREFILL.logits_parts,
    "extra_buffers": _FAMILY_PREFILL.extra_buffers,
}
CONFIGS["auto_ch64"] = _chunked(CONFIGS[AUTO], 64)
AUTOS = {AUTO: 0, "auto_ch64": 64}
#: More etc.compile options of the auto artifacts: BENCH_MOE_AUTO_OPTIONS, a
#: JSON object (build only; '{"check_counts": false}' for an A/B of that check).
AUTO_OPTIONS = json.loads(os.environ.get("BENCH_MOE_AUTO_OPTIONS", "{}"))
# BENCH_MOE_CONFIGS=a,b (build and run) limits the run to those configurations,
# BENCH_MOE_SIZES=1,16 to those token counts.
if os.environ.get("BENCH_MOE_CONFIGS"):
    CONFIGS = {k: CONFIGS[k] for k in os.environ["BENCH_MOE_CONFIGS"].split(",")}
# BENCH_MOE_LEAN=1 (build and run): only the fused static kernels and the
# _grouped_mm baselines, for A/B timings of the kernels in one device call.
LEAN = os.environ.get("BENCH_MOE_LEAN") == "1"
if os.environ.get("BENCH_MOE_SIZES"):
    SIZES = tuple(int(t) for t in os.environ["BENCH_MOE_SIZES"].split(","))
TARGETS = {
    k: M.PRESET_TARGETS["prefill"]
    for k in (
        "wg128",
        "tma128w",
        "tma128wr",
        "tma128wtc",
        "tma128wtc32",
        "pre_gather",
        "pre_atomic",
        "pre_atomic16",
        "pre_atomic16_cast",
        "tma16",
        "tma128",
        "pre_mem",
        "pre_front",
        "pre64",
        "pre64_front",
        "pre_sub2",
        "pre_sub3",
        "pre_sub2f",
        "pre128x2",
        "pre64x2",
        "pre_rs1",
        "mid_rs1",
        "pre_tk",
        "mid_tk",
        "mid_list",
        "pre_short",
        "pre_tb32",
        "pre_gu96",
        "pre_short_tk",
        "mid",
        "prefill",
        "mid_ch64",
        "prefill_ch64",
        "mid_ol",
        "prefill_ol",
        "pre_refill",
        "pre_refill_gu",
        "pre_refill_dn",
        "pre_a16c_refill",
        "pre_a16c_refill_pu16",
        "pre_a16c_refill_pu32",
        "pre_a16c_refill_bp32",
        "pre_a16c_refill_bp48",
        "pre_bp32",
        "pre_gt",
        "pre_a16c_refill_gt",
        "prefill_yp",
        "pre16_tb32",
        "pre16_bp48",
        "pre16_tb32_bp48",
        "prefill_large",
        "pl_tb64",
        "pl_tb16",
        "pl_ring",
        "pl_ring_gu",
        "pl_ring_dn",
        "pre_noring",
        "pre_ring",
        "pl_noring",
        "pl_dn1024",
        "pl_pc32",
        "pl_pc64",
        "pl_pc32_tk",
        "prefill_large_ol",
        "pl_ring_ol",
        "pl_ring_gu_ol",
        "pl_ring_dn_ol",
        "pl_tku2",
        "pl_tku4",
        "pre_tb32u4",
        "prefill_large_olt",
        "pl_tku2_olt",
        "pl_tku4_olt",
        "prefill_olt",
        "pl_inlined",
        "pl_olt3",
        "pl_olt2",
    )
    if k in CONFIGS
}
# torch._grouped_mm replayed from a CUDA graph, as the issue measured it (µs).
ISSUE_GROUPED_GRAPH_US = {1: 120, 16: 375, 128: 543, 1024: 814, 4096: 1890}


# Fused kernels also built with `min_ctas_per_sm=2`: all tiles are inlined
# into one kernel, which otherwise takes its hungriest tile's registers (255)
# and runs one CTA per SM, where the GEMM tiles alone run 2-3.
OCCUPANCY = {
    "bm16cp": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "bm16cp_gu24": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "bm16cp_gu32": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_rot": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_rot42": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_rot_gu24": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "tc64": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "wg128": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_pf": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_pf_gu32": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_route": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_gu24_u1s3": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_dn12": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_gu24": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_gu48": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_dn128": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_dn12_gu6": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "dec_tk": M.PRESET_MIN_CTAS_PER_SM["decode"],
    "single": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_gu24": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_dn128": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_sl": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_sl_re1": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_sl_s6": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_sl_s8": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_sl_dn6": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_sl_gu16": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_ids": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_u4": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_u4s3": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_u4d": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_u8s2": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_m3": 3,
    "single_fd": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_norot": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_mma": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_gemv_gu24": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_gemv_gu16": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_gemv_gu24_dn32": M.PRESET_MIN_CTAS_PER_SM["single"],
    "few_mma": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_gemv": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_gemv_s8": M.PRESET_MIN_CTAS_PER_SM["single"],
    "few_gemv": M.PRESET_MIN_CTAS_PER_SM["single"],
    **{
        f"{_k}_gemv_s{_gu}_{_dn}": M.PRESET_MIN_CTAS_PER_SM["single"]
        for _k in ("single", "few")
        for _gu, _dn in ((8, 8), (10, 8), (12, 8), (12, 12))
    },
    "single_norot_ch32": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_fd_gu24": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_fd_gu16": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_dnl2": M.PRESET_MIN_CTAS_PER_SM["single"],
    "single_noring": M.PRESET_MIN_CTAS_PER_SM["single"],
    "few_dnl2": M.PRESET_MIN_CTAS_PER_SM["single"],
    "few": M.PRESET_MIN_CTAS_PER_SM["few"],
    **{
        k: M.PRESET_MIN_CTAS_PER_SM["single"]
        for k in ("single_last", "single_gu24_last", "single_re1", "few_re1")
    },
    **{k: M.PRESET_MIN_CTAS_PER_SM["few"] for k in ("few_last", "few_gu24_last")},
    "single_gu16_m3": 3,
    "single_gu16_dn32_m3": 3,
    **{
        f"{k}_ch{c}": M.PRESET_MIN_CTAS_PER_SM["single"]
        for k in ("single", "few", "dec_pf_gu32")
        for c in ("32", "64", "128", "32b")
    },
    "pre128x2": 2,
    "pre64x2": 2,
    "mid_ol": 2,
}


# The dynamic kernel also built claiming one queue position at a time, and
# only when the CTA is free ("one"): with tiles of 10-20 µs, a CTA that holds
# up to 8 claimed instances (the default) serialises them while others idle.
ONE_CLAIM = {"max_pop_chunk": 1, "pop_ahead": False}


def moe_config(key: str):
    from etc.models.moe import MoEConfig

    return MoEConfig(**CONFIGS[key.removesuffix("_occ").removesuffix("_one")])


def build(out: Path) -> None:
    import etc
    from etc.models import moe as M

    for key in CONFIGS:
        cfg = moe_config(key)
        target = TARGETS.get(key, "sm_90")
        if key in AUTOS:  # its kernels are compile_moe's; no unfused or one-claim variants
            for schedule in ("static",) if LEAN else ("static", "dynamic"):
                artifact = M.compile_moe(
                    schedule=schedule, weight_chunk=AUTOS[key], compile_options=AUTO_OPTIONS
                )
                artifact.save(out / f"fused_{key}_{schedule}")
                print("built", f"fused_{key}_{schedule}")
            continue
        for schedule in ("static",) if LEAN else ("static", "dynamic"):
            g = M.build_moe_graph(cfg, name=f"moe_{key}")
            extra = COMPILE_OPTIONS.get(key, {})
            art = etc.compile(g, schedule=schedule, target=target, **extra)
            art.save(out / f"fused_{key}_{schedule}")
            print("built", f"fused_{key}_{schedule}")
            if key in OCCUPANCY:
                art = etc.compile(
                    g, schedule=schedule, target=target, min_ctas_per_sm=OCCUPANCY[key], **extra
                )
                art.save(out / f"fused_{key}_occ_{schedule}")
                print("built", f"fused_{key}_occ_{schedule}")
        if LEAN:
            continue
        art = etc.compile(g, schedule="dynamic", target=target, **ONE_CLAIM)
        art.save(out / f"fused_{key}_one_dynamic")
        print("built", f"fused_{key}_one_dynamic")
        for task, g in M.build_unfused_graphs(cfg, prefix=f"moe_{key}"):
            art = etc.compile(g, schedule="static", target=target)
            art.save(out / f"unfused_{key}_{task}")
            print("built", f"unfused_{key}_{task}")


def copy_bandwidth(torch, reps: int) -> float:
    from bench.splitk import copy_bandwidth as splitk_copy_bandwidth

    return splitk_copy_bandwidth(torch, reps)


def matmul_rate(torch, reps: int) -> float:
    """bf16 FLOP/s of a large square torch.matmul."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        torch.matmul(a, b)
    us = timed(torch, lambda i: torch.matmul(a, b), 8, reps)
    return 2 * n**3 / (us * 1e-6)


def graphed_outputs(torch, fn, calls: int):
    """One CUDA graph replaying ``fn(i)`` for every i, after a warm-up on a
    side stream; returns (graph, [the captured calls' outputs])."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [fn(i) for i in range(calls)]
    return graph, outs


def router_torch(torch, x, wr, K: int):
    logits = x.float() @ wr.float().t()
    probs = torch.softmax(logits, dim=1)
    w, ids = torch.topk(probs, K, dim=1)
    return ids, w / w.sum(1, keepdim=True)


def torch_expert_loop(torch, cfg, W):
    """The Hugging Face style loop: per active expert index_select / matmul / index_add."""
    F = torch.nn.functional
    II, E, K = cfg.inter, cfg.experts, cfg.topk

    def fn(x):
        ids, w = router_torch(torch, x, W["Wr"], K)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        flat = ids.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=E).tolist()  # host sync
        start = 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            rows = order[start : start + c]
            start += c
            tok = rows // K
            xe = x.index_select(0, tok)
            gu = xe @ W["Wgu"][e].t()
            h = F.silu(gu[:, :II]) * gu[:, II:]
            y = h @ W["Wd"][e].t()
            out.index_add_(0, tok, y.float() * w.reshape(-1)[rows, None])
        return out.to(torch.bfloat16)

    return fn


def torch_grouped(torch, cfg, W):
    """Sort by expert, two ``torch._grouped_mm`` calls, combine; no host sync,
    and only GPU ops, so a CUDA graph can capture it: the group ends are
    ``searchsorted(sorted ids, 1..E)`` (``bincount`` reads its maximum back to
    the host, which a capture refuses)."""
    F = torch.nn.functional
    II, E, K = cfg.inter, cfg.experts, cfg.topk
    gmm = getattr(torch, "_grouped_mm", None)
    if gmm is None:
        return None
    wgu_t, wd_t = W["Wgu"].transpose(1, 2), W["Wd"].transpose(1, 2)
    ends = torch.arange(1, E + 1, device=W["Wr"].device)  # made before any capture

    def fn(x):
        ids, w = router_torch(torch, x, W["Wr"], K)
        sorted_ids, order = torch.sort(ids.reshape(-1))
        offs = torch.searchsorted(sorted_ids, ends).to(torch.int32)
        tok = order // K
        xp = x.index_select(0, tok)
        gu = gmm(xp, wgu_t, offs=offs)
        h = F.silu(gu[:, :II]) * gu[:, II:]
        y = gmm(h, wd_t, offs=offs)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        scale = w.reshape(-1).index_select(0, order).unsqueeze(1)
        out.index_add_(0, tok, y.float() * scale)
        return out.to(torch.bfloat16)

    return fn


def bench_size(torch, artifacts: Path, T: int, W: dict, rates: dict, reps: int) -> dict:
    import etc.runtime
    from etc.models import moe as M

    cfg0 = moe_config(next(iter(CONFIGS)))
    calls = 16 if T <= 128 else 4
    xs = [M.random_tokens_torch(cfg0, T, seed=100 * T + c) for c in range(COPIES)]
    refs = [M.reference_moe_torch(x, W["Wr"], W["Wgu"], W["Wd"], cfg0.topk) for x in xs]
    active = int(torch.unique(refs[0][1]).numel())
    weight_bytes = active * 3 * cfg0.hidden * cfg0.inter * 2 + W["Wr"].numel() * 2
    flops = cfg0.flops(T)
    floor_us = max(weight_bytes / rates["copy_Bps"], flops / rates["matmul_flops"]) * 1e6
    row: dict = {
        "T": T,
        "active_experts": active,
        "active_weight_bytes": weight_bytes,
        "flops": flops,
        "floor_us": floor_us,
        "variants": {},
        "rel_err": {},
    }

    def record(name: str, us: float) -> None:
        row["variants"][name] = us
        print(f"T={T:5d} {name:40s} {us:10.2f} us  ({floor_us / us:6.1%} of floor)")

    def check(name: str, out, c: int) -> bool:
        ref = refs[c][0]
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        row["rel_err"][name] = err
        if err > TOLERANCE:
            print(f"T={T:5d} {name}: WRONG (rel err {err:.3g}); not timed")
            return False
        return True

    loop = None if LEAN else torch_expert_loop(torch, cfg0, W)
    if loop is not None and check("torch expert loop", loop(xs[0]), 0):
        record(
            "torch expert loop, eager", timed(torch, lambda i: loop(xs[i % COPIES]), calls, reps)
        )
    grouped = torch_grouped(torch, cfg0, W)
    if grouped is None:
        print("torch._grouped_mm is missing in this torch: grouped-GEMM baseline skipped")
        row["grouped_mm"] = "missing"
    else:
        try:
            ok = check("torch._grouped_mm", grouped(xs[0]), 0)
        except Exception as exc:  # noqa: BLE001 - report any torch failure and go on
            print(f"torch._grouped_mm failed ({type(exc).__name__}: {exc}); skipped")
            row["grouped_mm"] = f"failed: {exc}"
            ok = False
        if ok:
            fn = lambda i: grouped(xs[i % COPIES])  # noqa: E731
            record("torch._grouped_mm, eager", timed(torch, fn, calls, reps))
            try:
                graph, outs = graphed_outputs(torch, fn, calls)
                graph.replay()
                torch.cuda.synchronize()
                name = "torch._grouped_mm, CUDA graph"
                if all(check(name, outs[c], c) for c in range(min(calls, COPIES))):
                    replay = timed(torch, lambda i: graph.replay(), 1, reps) / calls
                    record(name, replay)
                    issue = ISSUE_GROUPED_GRAPH_US.get(T)
                    if issue is not None:
                        row["grouped_mm_graph_issue_us"] = issue
                        print(
                            f"T={T:5d} {'  (the issue measured)':40s} {issue:10.2f} us  "
                            f"(ours / issue = {replay / issue:.2f})"
                        )
                del graph, outs
            except Exception as exc:  # noqa: BLE001
                print(f"torch._grouped_mm under a CUDA graph failed: {exc}")
                row["grouped_mm_graph"] = f"failed: {exc}"

    for key in CONFIGS:
        cfg = moe_config(key)
        if cfg.max_tokens is not None and T > cfg.max_tokens:
            print(f"T={T:5d} ETC {key}: its route tile takes at most {cfg.max_tokens} tokens")
            continue
        shapes = M.tensor_shapes(cfg, T)
        laid_out = M.kernel_weights(cfg, W)  # the layout (and names) the configuration's tiles read
        scratch = {
            n: torch.zeros(s, dtype=torch_dtype(d), device="cuda")
            for n, (s, d) in shapes.items()
            if n not in ("X", *laid_out)
        }
        bufs = [{**scratch, **laid_out, "X": x} for x in xs]
        schedules = ("static",) if LEAN else ("static", "dynamic")
        variants = [(key, s) for s in schedules]
        if key in OCCUPANCY:
            variants += [(f"{key}_occ", s) for s in schedules]
        if not LEAN and key not in AUTOS:
            variants.append((f"{key}_one", "dynamic"))
        for variant, schedule in variants:
            name = f"ETC fused {variant} {schedule}"
            kernel = etc.runtime.load(artifacts / f"fused_{variant}_{schedule}")

            def launch(i, kernel=kernel, bufs=bufs):
                kernel.launch(bufs[i % COPIES], {"T": T}, sync=False)

            good = True
            for c in range(COPIES):
                launch(c)
                kernel.check()
                good = good and check(name, bufs[c]["Out"], c)
            if good:
                record(f"{name}, eager", timed(torch, launch, calls, reps))
                record(f"{name}, GPU time", gpu_timed(torch, launch, calls, reps))
        if LEAN or key in AUTOS:
            continue
        kernels = [etc.runtime.load(artifacts / f"unfused_{key}_{t}") for t in M.unfused_tasks(cfg)]
        names = [{p.name for p in k.manifest.inputs} for k in kernels]

        def unfused(i, bufs=bufs, kernels=kernels, names=names):
            b = bufs[i % COPIES]
            for k, ns in zip(kernels, names, strict=True):
                k.launch({n: b[n] for n in ns}, {"T": T}, sync=False)

        name = f"ETC unfused {key} static"
        unfused(0)
        torch.cuda.synchronize()
        if check(name, bufs[0]["Out"], 0):
            record(f"{name}, eager", timed(torch, unfused, calls, reps))
            record(f"{name}, GPU time", gpu_timed(torch, unfused, calls, reps))

    etc_best = [v for k, v in row["variants"].items() if k.startswith("ETC fused")]
    if etc_best:
        row["etc_fused_best_us"] = min(etc_best)
        row["etc_fraction_of_floor"] = floor_us / min(etc_best)
    return row


def run(artifacts: Path, out: Path | None, reps: int) -> dict:
    import torch

    from etc.models import moe as M

    torch.manual_seed(0)
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "method": __doc__.split("Method: ")[1].strip(),
        "configs": CONFIGS,
        "rows": [],
    }
    rates = {"copy_Bps": copy_bandwidth(torch, reps), "matmul_flops": matmul_rate(torch, reps)}
    results["copy_bandwidth_TBps"] = rates["copy_Bps"] / 1e12
    results["matmul_TFLOPs"] = rates["matmul_flops"] / 1e12
    print(
        f"copy bandwidth {rates['copy_Bps'] / 1e12:.3f} TB/s, "
        f"bf16 matmul {rates['matmul_flops'] / 1e12:.1f} TFLOP/s"
    )
    W = M.random_weights_torch(moe_config(next(iter(CONFIGS))), seed=0)
    for T in SIZES:
        results["rows"].append(bench_size(torch, artifacts, T, W, rates, reps))
        if out:  # keep what is measured so far
            _write(out, results)
    results["copy_bandwidth_TBps_end"] = copy_bandwidth(torch, reps) / 1e12
    if out:
        _write(out, results)
    return results


def _write(out: Path, results: dict) -> None:
    path = out if out.suffix == ".json" else out / "moe.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path, help="compile the artifacts into this directory")
    p.add_argument("--artifacts", type=Path, help="run with the artifacts in this directory")
    p.add_argument("--out", type=Path, help="write the results as JSON (a file or a directory)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument(
        "--trace", action="store_true", help="also the per-task timelines (bench/moe_trace.py)"
    )
    args = p.parse_args(argv)
    if not (args.build or args.artifacts):
        p.error("give --build DIR and/or --artifacts DIR")
    from bench import moe_trace

    start = time.perf_counter()
    if args.build:
        build(args.build)
        if args.trace:
            moe_trace.build(args.build)
        print(f"built in {time.perf_counter() - start:.0f} s")
    if args.artifacts:
        start = time.perf_counter()
        run(args.artifacts, args.out, args.reps)
        print(f"benchmark ran in {time.perf_counter() - start:.0f} s")
        if args.trace:
            out_dir = None
            if args.out is not None:
                out_dir = args.out.parent if args.out.suffix == ".json" else args.out
            moe_trace.run(args.artifacts, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Graphs the GPU tests and the scheduling benchmark run. Pure Python: the
CPU machine compiles them (make_artifacts.py), the GPU machine rebuilds them
to compute the expected results with the simulator."""

from __future__ import annotations

import dataclasses

import numpy as np

import etc
from etc.tiles import rowsum, synthetic

#: (schedule, early push) of every artifact variant, by directory suffix.
SCHEDULES = {
    "static": ("static", True),
    "dynamic": ("dynamic", True),
    "dynamic_late": ("dynamic", False),
}
BLOCK = 256


def _moe_small():
    from etc.models.moe import MoEConfig

    # Two column blocks per GEMM; 4-token router blocks in 2-expert chunks.
    return MoEConfig(
        hidden=128, inter=64, experts=8, topk=2, block_m=16, block_n_gu=32, block_n_dn=64,
        router_block=4, router_experts=4, topk_block=4, combine_block=3,
    )  # fmt: skip


#: The MoE layer at small sizes (triggers, wait-count tables, both schedules).
MOE_SMALL = _moe_small()


def _moe_small_ring():
    from dataclasses import replace

    # The decode preset's cp.async weight ring, with rotated k loops (several
    # k groups, so rotation moves the start) and A loaded a group ahead; the
    # permute and combine with 3 pairs per thread per step (a clamped tail).
    ring = (("stages", 3), ("unroll", 1), ("rotate_k", True))
    return replace(
        MOE_SMALL, hidden=512, inter=256, gate_up_options=ring,
        down_options=(*ring, ("a_ahead", 1)), permute_unroll=3, combine_unroll=3,
    )  # fmt: skip


#: MOE_SMALL on the weight-ring tiles of the decode preset.
MOE_SMALL_RING = _moe_small_ring()
#: ... as static slot grids without routing tables (``route="slots"``), the
#: experts read from ``topk_ids`` or picked from the logits by the tiles.
MOE_SMALL_SLOTS = dataclasses.replace(MOE_SMALL_RING, route="slots")
MOE_SMALL_SLOTS_LOGITS = dataclasses.replace(MOE_SMALL_SLOTS, slot_logits=True)
#: ... with the down tiles' weights asked of the L2 after the top-k's wait,
#: and with both tiles' rings filled there (``Graph.task(prefetch_after=1)``).
MOE_SMALL_SLOTS_L2 = dataclasses.replace(
    MOE_SMALL_SLOTS_LOGITS,
    down_options=(*MOE_SMALL_SLOTS.down_options, ("prefetch_weights", True)),
)
#: ... with each gate/up tile adding its own columns' down projection into
#: Out32 (``MoEConfig.fuse_down``: no down task).
MOE_SMALL_SLOTS_FUSED = dataclasses.replace(
    MOE_SMALL_SLOTS_LOGITS, fuse_down=True, combine="atomic"
)
#: ... on the CUDA-core GEMV slot tiles (``gemm="gemv"``), the experts
#: picked from the logits, the down tiles' rings filled before their waits.
MOE_SMALL_SLOTS_GEMV = dataclasses.replace(
    MOE_SMALL_SLOTS_LOGITS,
    gemm="gemv",
    gate_up_options=(("stages", 4),),
    down_options=(("stages", 4), ("prefetch_ring", True)),
)
#: ... with the combine in the down tiles (``combine="last"``).
MOE_SMALL_SLOTS_GEMV_LAST = dataclasses.replace(MOE_SMALL_SLOTS_GEMV, combine="last")
MOE_SMALL_SLOTS_GEMV_CHUNK = dataclasses.replace(
    MOE_SMALL_SLOTS_GEMV, slot_logits=False
).with_weight_chunk(32)
MOE_SMALL_SLOTS_RING = dataclasses.replace(
    MOE_SMALL_SLOTS,
    gate_up_options=(*MOE_SMALL_SLOTS.gate_up_options, ("prefetch_ring", True)),
    down_options=(*MOE_SMALL_SLOTS.down_options, ("prefetch_ring", True)),
)


def _moe_small_tma():
    from etc.models.moe import MoEConfig

    # TMA GEMM tiles (sm_90a): 128-row blocks, 2 stages over 4 (gate/up) and 3
    # (down) k-tiles, so stages are refilled; experts past 128 rows take two
    # blocks. The router's logits on the TMA tile too (float32 out), in two
    # 8-expert blocks per 128 tokens, on a 3-stage ring, its k loop in two
    # parts (partial logits the top-k adds).
    tma = (("core", "tma"), ("stages", 2), ("smem_limit", 220 << 10))
    return MoEConfig(
        hidden=256, inter=192, experts=16, topk=2, block_m=128, block_n_gu=64, block_n_dn=64,
        router_block=128, router_experts=8, topk_block=4, combine_block=3, gemm="tc",
        gate_up_options=tma, down_options=tma, router="tc", router_stages=3, router_splits=2,
    )  # fmt: skip


#: The same layer on the TMA + wgmma GEMM tiles (compile for sm_90a).
MOE_SMALL_TMA = _moe_small_tma()


def _moe_small_split():
    from dataclasses import replace

    # 64-row TMA tiles whose two warpgroups split the columns (split_n): each
    # takes 32 gate/up and 64 down columns of the same rows.
    tma = (("core", "tma"), ("stages", 2), ("smem_limit", 220 << 10), ("split_n", True))
    return replace(
        MOE_SMALL_TMA, block_m=64, block_n_dn=128, gate_up_options=tma, down_options=tma,
        router_splits=1,
    )  # fmt: skip


#: MOE_SMALL_TMA on 64-row split_n tiles (sm_90a).
MOE_SMALL_SPLIT = _moe_small_split()


def _moe_small_sub():
    from dataclasses import replace

    # One instance per 192 gate/up columns (3 passes of 64) and 256 down
    # columns (2 passes of 128): the pipeline restarts inside an instance.
    tma = (("core", "tma"), ("stages", 2), ("smem_limit", 220 << 10))
    return replace(
        MOE_SMALL_TMA, block_n_gu=192, block_n_dn=256,
        gate_up_options=(*tma, ("sub_n", 64)), down_options=(*tma, ("sub_n", 128)),
    )  # fmt: skip


#: MOE_SMALL_TMA with several pipeline passes per tile (sub_n, sm_90a).
MOE_SMALL_SUB = _moe_small_sub()


def _moe_small_ring_prefetch():
    from dataclasses import replace

    # The weight ring's first groups filled by the tiles' prefetch functions,
    # which a triggered task calls once it knows its expert (before the wait).
    return replace(
        MOE_SMALL_RING,
        gate_up_options=(*MOE_SMALL_RING.gate_up_options, ("prefetch_ring", True)),
        down_options=(*MOE_SMALL_RING.down_options, ("prefetch_ring", 1)),
    )


#: MOE_SMALL_RING with prefetch_ring tiles.
MOE_SMALL_RING_PREFETCH = _moe_small_ring_prefetch()


def _moe_small_route():
    from dataclasses import replace

    # The fused route: one route CTA after the logits (no clear, top-k or
    # plan), on the decode preset's prefetched weight ring; bounded T (the
    # tests launch up to 300 tokens). And the same on the TMA tiles with the
    # router's logits in two parts (sm_90a).
    return (
        replace(MOE_SMALL_RING_PREFETCH, route="fused", route_max_tokens=320),
        replace(MOE_SMALL_TMA, route="fused", route_max_tokens=320),
    )


#: MOE_SMALL_RING_PREFETCH and MOE_SMALL_TMA with the fused route tile.
MOE_SMALL_ROUTE, MOE_SMALL_ROUTE_TMA = _moe_small_route()


def _moe_small_gather():
    from dataclasses import replace

    # The TMA tiles with the gate/up tiles gathering their rows from X (no
    # Xp, no permute), with the split route and with the fused one.
    return replace(MOE_SMALL_TMA, gather=True), replace(MOE_SMALL_ROUTE_TMA, gather=True)


#: MOE_SMALL_TMA and MOE_SMALL_ROUTE_TMA with gathering gate/up tiles (sm_90a).
MOE_SMALL_GATHER, MOE_SMALL_ROUTE_GATHER = _moe_small_gather()


def _moe_small_session33():
    from dataclasses import replace

    # MOE_SMALL_GATHER with each row by a one-row TMA box (gather_tma);
    # MOE_SMALL_TMA with both tiles refilling a stage once it is free
    # (refill="test") and with the permute by bulk copies through 8 slots.
    gather = replace(
        MOE_SMALL_GATHER,
        gate_up_options=(*MOE_SMALL_GATHER.gate_up_options, ("gather_tma", True)),
    )
    refill = replace(
        MOE_SMALL_TMA,
        gate_up_options=(*MOE_SMALL_TMA.gate_up_options, ("refill", "test")),
        down_options=(*MOE_SMALL_TMA.down_options, ("refill", "test")),
    )
    return gather, refill, replace(MOE_SMALL_TMA, permute_slots=8)


#: Gathered rows by TMA boxes, rings refilled when free, the bulk permute (sm_90a).
MOE_SMALL_GATHER_TMA, MOE_SMALL_TMA_REFILL, MOE_SMALL_BULK_PERMUTE = _moe_small_session33()


def _moe_small_atomic():
    from dataclasses import replace

    # The TMA tiles with the down tiles adding their weighted rows into Out
    # (bf16 L2 reductions after a zero task; no Yp, no combine), with the
    # split route and with the fused one.
    return (
        replace(MOE_SMALL_TMA, combine="atomic"),
        replace(MOE_SMALL_ROUTE_TMA, combine="atomic", zero_block=5),
    )


#: MOE_SMALL_TMA and MOE_SMALL_ROUTE_TMA with the atomic combine (sm_90a).
MOE_SMALL_ATOMIC, MOE_SMALL_ROUTE_ATOMIC = _moe_small_atomic()


def _moe_small_atomic16():
    from dataclasses import replace

    # The same with half-precision sums: 16-byte reductions of the staged
    # block, the cast 3 chunks a thread per step (5 tokens a CTA: clamped
    # ends); with the fused route on 32-column down blocks, which are not
    # staged, so their 4-byte reductions come from the accumulators.
    return (
        replace(MOE_SMALL_ATOMIC, combine_dtype="f16", combine_block=5, combine_unroll=3),
        replace(MOE_SMALL_ROUTE_ATOMIC, combine_dtype="f16", block_n_dn=32),
    )


#: MOE_SMALL_ATOMIC and MOE_SMALL_ROUTE_ATOMIC adding into f16 sums (sm_90a).
MOE_SMALL_ATOMIC16, MOE_SMALL_ROUTE_ATOMIC16 = _moe_small_atomic16()
#: ``etc.models.moe.build_moe_graph`` options by artifact variant: ``_unguarded``
#: has gate/up tiles that look up their expert (and prefetch its weights)
#: without waiting for the routing tables.
#: MOE_SMALL and MOE_SMALL_TMA with the GEMM tiles dealt by ticket
#: (``MoEConfig.gemm_deal``; the static schedule draws each slot's tile).
MOE_SMALL_TICKET = dataclasses.replace(MOE_SMALL, gemm_deal="ticket")
MOE_SMALL_TMA_TICKET = dataclasses.replace(MOE_SMALL_TMA, gemm_deal="ticket")
#: MOE_SMALL_TMA whose experts with one row block of at most 64 rows run it
#: on one warpgroup (``short_blocks``): at 300 uniform tokens every expert
#: has one such block; one expert's 130 tokens take two blocks (both
#: warpgroups) while the other experts' few rows take the short path.
MOE_SMALL_TMA_SHORT = dataclasses.replace(
    MOE_SMALL_TMA,
    gate_up_options=(*MOE_SMALL_TMA.gate_up_options, ("short_blocks", True)),
    down_options=(*MOE_SMALL_TMA.down_options, ("short_blocks", True)),
)


def _moe_small_ring():
    # Several column passes of one instance through one TMA ring (sub_ring):
    # gate/up blocks of 192 columns in 3 passes of 64 (2 stages over 4
    # k-tiles a pass), down blocks of 256 in 2 passes of 128 with 4 stages
    # over 3 k-tiles (the prologue's loads reach into the second pass);
    # refilled when free and staged through a buffer of their own (down's
    # in two 64-column parts, which is all that fits beside its ring under
    # a 150 KiB limit), or (the second) with the down block stored directly.
    gu_ring = (("sub_n", 64), ("sub_ring", True))
    dn_ring = (("sub_n", 128), ("sub_ring", True), ("stages", 4))
    test = dataclasses.replace(
        MOE_SMALL_TMA, block_n_gu=192, block_n_dn=256,
        gate_up_options=(*MOE_SMALL_TMA.gate_up_options, *gu_ring, ("refill", "test")),
        down_options=(
            *MOE_SMALL_TMA.down_options, *dn_ring, ("refill", "test"), ("smem_limit", 150 << 10),
        ),
    )  # fmt: skip
    direct = dataclasses.replace(
        test,
        down_options=(
            *MOE_SMALL_TMA.down_options, *dn_ring, ("refill", "test"), ("stage_output", False),
        ),
    )  # fmt: skip
    return test, direct


#: MOE_SMALL_TMA with each instance's column passes through one ring (sm_90a).
MOE_SMALL_TMA_RING, MOE_SMALL_TMA_RING_DIRECT = _moe_small_ring()


def _moe_small_topk():
    import dataclasses

    # 32-token top-k blocks (4 tokens a warp) selected 3 at a time: a warp's
    # second group has one token, and T = 130 and 300 end inside a block.
    return dataclasses.replace(MOE_SMALL_TMA, topk_block=32, topk_unroll=3)


#: MOE_SMALL_TMA whose top-k warps select several tokens at a time (sm_90a).
MOE_SMALL_TMA_TOPK = _moe_small_topk()


def _chunked(cfg, gate_up: int = 64, down: int = 32):
    """``cfg`` with its expert weights in the chunked layout
    (``weight_chunk``: 64-wide k chunks for gate/up, 32 for down)."""
    return cfg.with_weight_chunk(gate_up, down)


#: Chunked weights through the register loop (MOE_SMALL), the ring and its
#: fill before the waits (MOE_SMALL_RING_PREFETCH) and the slot tiles' rings
#: (MOE_SMALL_SLOTS_RING).
MOE_SMALL_CHUNK = _chunked(MOE_SMALL)
MOE_SMALL_RINGPF_CHUNK = _chunked(MOE_SMALL_RING_PREFETCH)
MOE_SMALL_SLOTS_CHUNK = _chunked(MOE_SMALL_SLOTS_RING)
#: ... and the TMA tiles' weights through 4-D maps (chunks of 64).
MOE_SMALL_TMA_CHUNK = _chunked(MOE_SMALL_TMA, 64, 64)
#: ... and the slot rings filled by one bulk copy per warp and fragment.
MOE_SMALL_SLOTS_BULK = dataclasses.replace(
    _chunked(MOE_SMALL_SLOTS_RING, 32, 32),
    gate_up_options=(*_chunked(MOE_SMALL_SLOTS_RING, 32, 32).gate_up_options, ("bulk_ring", True)),
    down_options=(*_chunked(MOE_SMALL_SLOTS_RING, 32, 32).down_options, ("bulk_ring", True)),
)

MOE_GRAPH_OPTIONS = {"_route_unguarded": {"gate_up_waits_tables": False}}
#: Sizes at which every MoE preset's tiles work (``compile_moe``'s GPU test).
MOE_FAMILY_SIZES = {"hidden": 512, "inter": 512, "experts": 16, "topk": 2}


def diamond() -> etc.Graph:
    """top -> (left, right) -> bottom; bottom waits on two events."""
    g = etc.Graph("diamond")
    n = g.symbol("n")
    blocks = (n + BLOCK - 1) // BLOCK
    X = g.tensor("X", (n,), "f32")
    T = g.tensor("T", (n,), "f32")
    L = g.tensor("L", (n,), "f32")
    R = g.tensor("R", (n,), "f32")
    Z = g.tensor("Z", (n,), "f32")
    top = g.event((blocks,), wait_count=1, name="top_done")
    left = g.event((blocks,), wait_count=1, name="left_done")
    right = g.event((blocks,), wait_count=1, name="right_done")
    g.task(
        synthetic.lincomb([2.0], 1.0, name="top"),
        grid=(blocks,),
        args=(X, T),
        out_edges={top: "i->i"},
    )
    g.task(
        synthetic.lincomb([3.0], name="left"),
        grid=(blocks,),
        args=(T, L),
        in_edges={top: "i->i"},
        out_edges={left: "i->i"},
    )
    g.task(
        synthetic.lincomb([-1.0], 5.0, name="right"),
        grid=(blocks,),
        args=(T, R),
        in_edges={top: "i->i"},
        out_edges={right: "i->i"},
    )
    g.task(
        synthetic.lincomb([1.0, 1.0, 0.5], name="bottom"),
        grid=(blocks,),
        args=(L, R, X, Z),
        in_edges=[(left, "i->i"), (right, "i->i")],
    )
    return g


def wide_fan_in(k_split: int = 64) -> etc.Graph:
    """Split-K with 64 producers per event coordinate."""
    g = etc.Graph("fanin")
    n = g.symbol("n")
    K = 64 * k_split
    A = g.tensor("A", (n, K), "f32")
    B = g.tensor("B", (n, k_split), "f32")
    C = g.tensor("C", (n,), "f32")
    E = g.event((n,), wait_count=k_split, name="E")
    g.task(
        rowsum.partial_sum(1, k_split, K), grid=(n, k_split), args=(A, B), out_edges={E: "ij->i"}
    )
    g.task(rowsum.final_sum(1, k_split), grid=(n,), args=(B, C), in_edges={E: "i->i"})
    return g


def skewed(
    iterations: int = 2000, heavy_every: int = 16, heavy_factor: int = 10, deal: str = "list"
) -> etc.Graph:
    """Stage one spins, every `heavy_every`-th tile `heavy_factor` times
    longer (dealt by `deal` under the static schedule); stage two (light)
    consumes each tile's result."""
    g = etc.Graph("skewed")
    t = g.symbol("t")
    P = g.tensor("P", (t,), "f32")
    Q = g.tensor("Q", (t,), "f32")
    done = g.event((t,), wait_count=1, name="done")
    g.task(
        synthetic.spin(iterations, heavy_every, heavy_factor, name="heavy"),
        grid=(t,),
        args=(P,),
        out_edges={done: "i->i"},
        deal=deal,
    )
    g.task(
        synthetic.lincomb([1.0], 1.0, span=1, name="light"),
        grid=(t,),
        args=(P, Q),
        in_edges={done: "i->i"},
    )
    return g


def splitk_pooled(per_row: bool, K: int = 256, k_split: int = 4) -> etc.Graph:
    """The split-K row sums with the partial sums dealt at run time
    (``deal="pool"``): one pool of every instance, or (``per_row``) a pool
    per row, each row a phase of both tasks."""
    from etc.tiles import rowsum

    g = etc.Graph("splitk")
    n = g.symbol("n")
    A = g.tensor("A", (n, K), "f32")
    B = g.tensor("B", (n, k_split), "f32")
    C = g.tensor("C", (n,), "f32")
    E = g.event((n,), wait_count=k_split, name="E")
    g.task(
        rowsum.partial_sum(1, k_split, K),
        grid=(n, k_split),
        args=(A, B),
        out_edges={E: "ij->i"},
        deal="pool",
        phase="ij->i" if per_row else 0,
    )
    g.task(
        rowsum.final_sum(1, k_split),
        grid=(n,),
        args=(B, C),
        in_edges={E: "i->i"},
        phase="i->i" if per_row else 0,
    )
    return g


def skewed_pooled() -> etc.Graph:
    """:func:`skewed` with its heavy stage dealt at run time."""
    return skewed(deal="pool")


def empty_tasks() -> etc.Graph:
    """Independent empty tasks: the cost of handing out a task."""
    g = etc.Graph("empty_tasks")
    t = g.symbol("t")
    g.task(synthetic.empty(1), grid=(t,))
    return g


def chain(length: int = 64) -> etc.Graph:
    """`length` one-instance tasks, each waiting on the previous one: the
    latency of a notify on one CTA releasing a wait on another."""
    g = etc.Graph("chain")
    events = [g.event((1,), wait_count=1, name=f"link{k}") for k in range(length - 1)]
    for k in range(length):
        ins = {events[k - 1]: "i->i"} if k else None
        outs = {events[k]: "i->i"} if k < length - 1 else None
        g.task(synthetic.empty(1, name=f"hop{k}"), grid=(1,), in_edges=ins, out_edges=outs)
    return g


def greedy(vocab: int = 128256) -> etc.Graph:
    """The decoder's argmax tile alone over a Llama-3 vocabulary."""
    from etc.tiles import llama

    g = etc.Graph("greedy")
    b = g.symbol("b")
    logits = g.tensor("logits", (b, vocab), "bf16")
    out = g.tensor("out", (b,), "i32")
    g.task(llama.argmax(vocab), grid=(b,), args=(logits, out), name="argmax")
    return g


def greedy_parts(vocab: int = 128256, parts: int = 16) -> etc.Graph:
    """The decoder's argmax in ``parts`` instances per row and their merge."""
    from etc.tiles import llama

    g = etc.Graph("greedy_parts")
    b = g.symbol("b")
    logits = g.tensor("logits", (b, vocab), "bf16")
    val = g.tensor("val", (b, parts), "f32")
    idx = g.tensor("idx", (b, parts), "i32")
    out = g.tensor("out", (b,), "i32")
    done = g.event((1,), wait_count=b * parts, name="parts_done")
    g.task(
        llama.argmax(vocab, parts=parts), grid=(b, parts), args=(logits, val, idx),
        out_edges={done: "bp->0"}, name="argmax",
    )  # fmt: skip
    g.task(
        llama.argmax_merge(vocab, parts), grid=(b,), args=(val, idx, out),
        in_edges={done: "b->0"}, name="argmax_merge",
    )  # fmt: skip
    return g


#: The dense TMA tile whose parts of k meet in the tile, by artifact:
#: (block_m, block_n, k, parts).
GEMM_MEETS = {
    "gemm_meet": (128, 64, 512, 4),
    "gemm_meet3": (128, 192, 768, 3),
    "gemm_meet2": (128, 256, 768, 2),
}
#: The same tiles with the sums shared by the last parts to arrive
#: (``meet_share``; static schedule only): artifact -> (plain twin, share).
GEMM_MEET_SHARES = {"gemm_meet_share": ("gemm_meet", 4), "gemm_meet2_share": ("gemm_meet2", 2)}


def gemm_meet(name: str = "gemm_meet") -> etc.Graph:
    """``C = A @ B^T`` (bf16) by the dense TMA tile whose ``GEMM_MEETS[name]``
    parts of k meet in the tile, 2 stages (sm_90a): ``examples/gemm.py``'s
    graph (``GEMM_MEET_SHARES``: its twin's, the sums shared)."""
    from examples.gemm import build

    name, share = GEMM_MEET_SHARES.get(name, (name, 1))
    bm, bn, k, parts = GEMM_MEETS[name]
    return build(k, bm, bn, stages=2, k_splits=parts, meet_share=share)


GRAPHS = {
    "greedy": greedy,
    "greedy_parts": greedy_parts,
    "diamond": diamond,
    "fanin": wide_fan_in,
    "skewed": skewed,
    "skewed_pooled": skewed_pooled,
    "empty": empty_tasks,
    "chain": chain,
}


def tensor_parallel_small():
    """GEMM + Reduce-Scatter / All-Gather + GEMM at test sizes (64x64 blocks)."""
    from etc.models import collective

    return collective.CollectiveConfig(k=128, block_m=64, block_n=64, stages=2, block_size=128)


_TMA = {"core": "tma", "smem_limit": 64 << 10}
#: Tensor-parallel graph variants besides the defaults, by artifact name:
#: (layer, CollectiveConfig changes). The reduction in the own rows' GEMM
#: epilogue; the destination outermost with one load in flight per reduce
#: thread; every chunk from the gathered buffer; the own chunk first in
#: row-block order; and both layers on TMA tiles (sm_90a: staged epilogues,
#: the fused reduction's grouped loads).
TENSOR_PARALLEL_VARIANTS = {
    "gemm_rs_fused": ("gemm_rs", {"fused_reduce": True}),
    "gemm_rs_rij": ("gemm_rs", {"gemm_order": "rij", "loads_in_flight": 1}),
    "ag_gemm_gathered": ("ag_gemm", {"own_first": False}),
    "ag_gemm_rij": ("ag_gemm", {"gemm_order": "rij"}),
    "gemm_rs_tma": ("gemm_rs", _TMA),
    "gemm_rs_fused_tma": ("gemm_rs", {**_TMA, "fused_reduce": True}),
    "ag_gemm_tma": ("ag_gemm", _TMA),
}


def tensor_parallel_variant(name: str):
    """(layer, config, etc.compile options) of a variant (or of a layer's defaults)."""
    from dataclasses import replace

    layer, changes = TENSOR_PARALLEL_VARIANTS.get(name, (name, {}))
    options = {"target": "sm_90a"} if changes.get("core") == "tma" else {}
    return layer, replace(tensor_parallel_small(), **changes), options


_POOLED = ("attention", "qkv", "o_proj", "gate_up", "down", "lm_head")


def llama_tiny_variants() -> dict:
    """Artifact-name prefix -> tiny decoder configuration for the GPU tests:
    the default tiles; the fused norms with activations through the
    ``cp.async`` ring (``layer_gemm(rmsnorm=..., a_ring=True)``); the
    attention's K and V staged in shared memory, activations loaded ahead
    and the next instance's weights prefetched (``attn_stage_kv``,
    ``a_ahead``, ``prefetch_next``); the bulk-copy GEMM core
    (``layer_gemm(core="bulk")``); the attention's K/V copies issued before
    its waits (``attn_prefetch_kv``); the fused norms reading the sums of
    squares that the residual epilogues add up (``norm_sums``); the
    attention's last split merging the splits (``fuse_combine``); the norm
    stages and no early weight ring (``fold_norms`` and ``prefetch_ring``
    off: the defaults fold the norms and fill the ring before the waits);
    64-row GEMM blocks branching to 16-, 32- or 64-row loops (``row_paths``);
    short attention splits for batches of 1 and 2 (``attn_small_batch``),
    and spans by batch (``attn_small_spans``);
    the attention's values staged in shared memory (``attn_stage_v``); the
    online-softmax attention on the CUDA cores and on the tensor cores
    (``attn_tile``), with long and short spans; a kernel per batch range
    (``batch_buckets``); the B=1 split tier (``attn_single_span``); weights
    prefetched into L2 during the attention (``l2_prefetch``, both modes);
    the combine shared out by heads and splits (``combine_group``); the
    projections on TMA + wgmma with split-K (``gemm_core="tma"``,
    ``k_splits``), alone and in the large-batch kernel of three, with their
    k loops rotated by column block (``tma_rotate_k``); the attention,
    projections and LM head dealt at run time (``pool``); the B = 1 kernel's
    attention in fewer splits holding the deal's slots (``deal_slots``) and
    in one pass of each warp (``attn_one_pass``); the gemv core's rows mode
    in 32- and 64-row tiles, alone, as a batch bucket, and for qkv and
    o_proj beside the tma core (``gemv_block``, ``core_overrides``)."""
    import dataclasses

    from etc.models import llama

    fused = dataclasses.replace(
        llama.TINY,
        fuse_norms=True,
        fold_norms=False,
        prefetch_ring=False,
        gemm_options=(*llama.TINY.gemm_options, ("a_ring", True)),
    )
    staged = dataclasses.replace(
        llama.TINY,
        attn_stage_kv=True,
        prefetch_weights=True,
        prefetch_ring=False,
        prefetch_next=True,
        gemm_options=(*llama.TINY.gemm_options, ("a_ahead", 1)),
    )
    bulk = dataclasses.replace(llama.TINY, gemm_core="bulk", fold_norms=False)
    attn_pf = dataclasses.replace(llama.TINY, attn_prefetch_kv=True)
    sums = dataclasses.replace(llama.TINY, fuse_norms=True, norm_sums=True, fold_norms=False)
    fused_combine = dataclasses.replace(llama.TINY, fuse_combine=True)
    # ... and the combine of a whole row per instance (combine_group=0).
    unfolded = dataclasses.replace(
        llama.TINY, fold_norms=False, prefetch_ring=False, combine_group=0
    )
    row_paths = dataclasses.replace(llama.TINY, block_m=64, row_paths=(16, 32, 64))
    small_spans = dataclasses.replace(
        llama.TINY, attn_small_batch=2, attn_small_span=3, attn_small_spans=()
    )
    # Spans by batch over the cached positions (attn_small_spans) in a chunk
    # of two loop steps, so position L either rides in the split that
    # reaches it or (a span of the whole chunk) takes the next one alone.
    small_tiers = dataclasses.replace(
        llama.TINY, attn_chunk=16, attn_small_batch=4, attn_small_span=8,
        attn_small_spans=((2, 3), (3, 12)), attn_single_span=0,
    )  # fmt: skip
    stage_v = dataclasses.replace(llama.TINY, attn_stage_v=True)
    online = dataclasses.replace(llama.TINY, attn_tile="online")
    online_spans = dataclasses.replace(
        llama.TINY, attn_tile="online", attn_unroll=1, attn_small_batch=2, attn_small_span=3,
        attn_small_spans=((2, 3),),
    )  # fmt: skip
    mma = dataclasses.replace(llama.TINY, attn_tile="mma", attn_unroll=2)
    gemv_rows = dict(gemm_core="gemv", bn_qkv=32, bn_o=32, bn_down=16)
    # One 16-position block per warp and step: 128-position steps, 512-position
    # spans, so L=200 takes two loop steps.
    mma_spans = dataclasses.replace(
        llama.TINY,
        attn_tile="mma",
        attn_unroll=1,
        attn_chunk=512,
        attn_small_batch=2,
        attn_small_span=3,
        attn_small_spans=((2, 3),),
    )
    # Three kernels in one artifact, as the default's: B=1 (attention loop
    # steps of two row groups, the LM head and argmax called), B=2..16, and B
    # >= 17 with the large-batch tiles (32-row GEMM blocks, 64-column gate/up,
    # the tensor-core attention, every tile called).
    buckets = dataclasses.replace(
        llama.TINY,
        batch_buckets=(llama.LLAMA_3_2_1B.batch_buckets[0], (16, ()), (None, llama.LARGE_BATCH)),
    )
    # The B = 1 kernel split by context as the default's: the phased
    # attention up to L = 8, past it the tensor-core one fed by TMA (64-dim
    # heads), read_early and called; beside it the B >= 2 kernel.
    by_context = (("context_buckets", ((8, ()), (None, llama.SINGLE_SEQUENCE_LONG))),)
    context = dataclasses.replace(
        llama.TINY, head_dim=64, heads=4, kv_heads=2, combine_group=4,
        batch_buckets=((1, (*llama.SINGLE_SEQUENCE, *by_context)), (None, ())),
    )  # fmt: skip
    # ... as the default's B = 1 kernel up to L = 39: 5 splits of at most 8
    # positions in a phased tile sized to them (the artifact's spans are 64),
    # the gemv core, the combine fused, K and V copied before the waits.
    context_span = dataclasses.replace(
        llama.TINY, attn_chunk=64, attn_small_batch=2, attn_small_span=64, attn_small_spans=(),
        attn_single_span=8, attn_single_splits=5,
        batch_buckets=(
            (1, (*llama.SINGLE_SEQUENCE, ("context_buckets", (
                (39, (("attn_phased_span", 8), ("attn_prefetch_kv", True))), (None, ()))))),
            (None, ()),
        ),
    )  # fmt: skip
    # ... in at most 3 splits of at least 8 positions (up to L = 47: 3 of 16)
    # whose instances take 10 positions of the static deal each layer
    # (deal_slots), so the stages after them land where 5 splits put them.
    context_slots = dataclasses.replace(
        context_span, attn_single_splits=3,
        batch_buckets=(
            (1, (*llama.SINGLE_SEQUENCE, ("deal_slots", (("attention", 10),)),
                 ("context_buckets", (
                     (47, (("attn_phased_span", 16), ("attn_prefetch_kv", True))), (None, ()))))),
            (None, ()),
        ),
    )  # fmt: skip
    # ... split by context three ways, B = 1's split count tiered by L
    # (attn_single_tiers): up to L = 15 at most 5 splits of at least 8 in a
    # tile of 8, L = 16..47 at most 3 of at least 16 in a tile of 16 whose
    # instances take 10 deal positions, past it the artifact's 5 of 8.
    context_tiers = dataclasses.replace(
        context_span, attn_single_tiers=((15, 8, 5), (47, 16, 3)),
        batch_buckets=(
            (1, (*llama.SINGLE_SEQUENCE, ("context_buckets", (
                (15, (("attn_phased_span", 8), ("attn_prefetch_kv", True))),
                (47, (("attn_phased_span", 16), ("attn_prefetch_kv", True),
                      ("deal_slots", (("attention", 10),)))),
                (None, ()))))),
            (None, ()),
        ),
    )  # fmt: skip
    # ... exactly 4 splits of up to 16 positions up to L = 39 (a tier of span
    # 0), each kv head's meeting on a thread-block cluster of 4: the others
    # push their partials into rank 0's shared memory (attn_cluster; the
    # dynamic schedule's kernel meets through the L2), the 8 instances of a
    # layer taking 10 deal positions (as the 1B variant's 64 take 136).
    context_cluster = dataclasses.replace(
        context_span, attn_single_tiers=((39, 0, 4),),
        batch_buckets=(
            (1, (*llama.SINGLE_SEQUENCE, ("context_buckets", (
                (39, (("attn_phased_span", 16), ("attn_prefetch_kv", True),
                      ("attn_cluster", 4), ("deal_slots", (("attention", 10),)))),
                (None, ()))))),
            (None, ()),
        ),
    )  # fmt: skip
    # ... its attention's steps 2-4 as one pass of each warp (attn_one_pass).
    context_one_pass = dataclasses.replace(
        context_span,
        batch_buckets=(
            (1, (*llama.SINGLE_SEQUENCE, ("context_buckets", (
                (39, (("attn_phased_span", 8), ("attn_prefetch_kv", True),
                      ("attn_one_pass", True))),
                (None, ()))))),
            (None, ()),
        ),
    )  # fmt: skip
    # One pass over splits of several loop steps: 64-dim heads, loop steps
    # of 32 positions, spans of 64 (B = 1 at L = 200: 4 splits of 2 steps),
    # the merge fused, with and without K and V in shared memory.
    one_pass = dataclasses.replace(
        llama.TINY, head_dim=64, heads=4, kv_heads=2, combine_group=4, attn_chunk=64,
        attn_unroll=1, attn_one_pass=True, fuse_combine=True,
        batch_buckets=((1, (("context_buckets", ((39, (("attn_stage_kv", True),)), (None, ()))),)),
                       (None, ())),
    )  # fmt: skip
    # The B=1 split tier: spans of 3 (rounded up to the tile's 8), at most 5
    # splits, never fewer than spans of 8 give.
    single = dataclasses.replace(
        llama.TINY,
        attn_small_batch=2,
        attn_small_span=8,
        attn_small_spans=(),
        attn_single_span=3,
        attn_single_splits=5,
    )
    # ... with the combine in the attention (the last split to count merges
    # the spread splits: their count is the grid's, not ceil((L + 1) / chunk)),
    # on the sync core and, as B = 1's kernel, the gemv core.
    single_fused = dataclasses.replace(single, fuse_combine=True)
    # ... each merge lane loading its splits two at a time (5 splits on the
    # tiny tile's lanes: a second load past the splits, empty).
    single_fused_merge2 = dataclasses.replace(single_fused, attn_merge_unroll=2)
    single_fused_gemv = dataclasses.replace(
        single_fused, gemm_core="gemv", gemm_options=(("stages", 8),)
    )
    # Weights asked into L2 during the attention: bulk prefetches (one region
    # of the next layer, evict-last) and line prefetches.
    prefetch = dataclasses.replace(
        llama.TINY,
        l2_prefetch=(("wo", 8, 0), ("wgu", 3, 0), ("wqkv", 8, 1)),
        l2_prefetch_ctas=3,
        l2_prefetch_evict_last=True,
    )
    prefetch_lines = dataclasses.replace(
        llama.TINY, l2_prefetch=(("wo", 8, 0), ("wd", 5, 0)), l2_prefetch_mode="lines"
    )
    # The combine in instances of 2 heads, the splits shared among 32 lanes
    # per item (5 splits at B=1: lanes without a split merge empty states).
    combine_group = dataclasses.replace(single, combine_group=2)
    # Every projection on TMA + wgmma (64-row blocks), split-K with the
    # partials' meeting for qkv, o_proj and down; and the same in the
    # large-batch kernel of three buckets (B >= 17).
    tma_changes = (
        ("gemm_core", "tma"), ("bn_qkv", 32), ("bn_o", 16), ("bn_gu", 32), ("bn_down", 32),
    )  # fmt: skip
    tma_splits = (("qkv_proj", 2), ("o_proj", 2), ("down_proj", 4))
    # 16-row activation boxes: B=3 loads one, B=17 two, B=70 all four and one.
    tma = dataclasses.replace(llama.TINY, **dict(tma_changes), k_splits=tma_splits, tma_a_box=16)
    tma_gemv_rows = dict(
        core_overrides=(("qkv_proj", "gemv"), ("o_proj", "gemv")), gemv_whole_lines=True,
        bn_qkv=32, bn_o=32,
    )  # fmt: skip
    tma_buckets = dataclasses.replace(
        buckets,
        k_splits=tma_splits,
        batch_buckets=(*buckets.batch_buckets[:-1], (None, (*llama.LARGE_BATCH, *tma_changes))),
    )
    # The TMA-fed attention needs 64-wide heads.
    tma_heads = dict(attn_pipeline="tma", head_dim=64, heads=4, kv_heads=2, combine_group=4)
    capped = dataclasses.replace(
        mma_spans,
        attn_tma_release="read_early",
        attn_tma_prefetch=True,
        outline=("attention",),
        attn_small_batch=4,
        attn_small_spans=((2, 8, 3), (4, 8, 2)),
        **tma_heads,
    )
    return {
        "llama_tiny": llama.TINY,
        "llama_tiny_fused_aring": fused,
        "llama_tiny_staged": staged,
        "llama_tiny_bulk": bulk,
        "llama_tiny_attn_pf": attn_pf,
        # ... or only asked into L2 there (no shared memory).
        "llama_tiny_attn_l2pf": dataclasses.replace(llama.TINY, attn_prefetch_kv="l2"),
        "llama_tiny_norm_sums": sums,
        "llama_tiny_fused_combine": fused_combine,
        "llama_tiny_unfolded": unfolded,
        "llama_tiny_row_paths": row_paths,
        "llama_tiny_small_spans": small_spans,
        "llama_tiny_small_tiers": small_tiers,
        "llama_tiny_stage_v": stage_v,
        "llama_tiny_online": online,
        "llama_tiny_online_spans": online_spans,
        "llama_tiny_mma": mma,
        "llama_tiny_mma_spans": mma_spans,
        # ... with the next step's K/V loaded during this step (attn_pipeline),
        # carried in registers or staged in shared memory (head_dim 64).
        "llama_tiny_mma_pipeline": dataclasses.replace(mma_spans, attn_pipeline="registers"),
        "llama_tiny_mma_staged": dataclasses.replace(
            mma_spans, attn_pipeline="smem", head_dim=64, heads=4, kv_heads=2, combine_group=4
        ),
        # ... or copied into a shared-memory ring by TMA (head_dim 64).
        "llama_tiny_mma_tma": dataclasses.replace(mma_spans, **tma_heads),
        "llama_tiny_mma_tma_pf": dataclasses.replace(
            mma_spans, attn_tma_prefetch=True, **tma_heads
        ),
        "llama_tiny_mma_tma3": dataclasses.replace(mma_spans, attn_tma_stages=3, **tma_heads),
        # ... its warps giving each stage back once read (thread 0 refilling
        # it after, or before, its own arithmetic).
        "llama_tiny_mma_tma_read": dataclasses.replace(
            mma_spans, attn_tma_release="read", **tma_heads
        ),
        "llama_tiny_mma_tma_read_early": dataclasses.replace(
            mma_spans, attn_tma_release="read_early", attn_tma_prefetch=True, **tma_heads
        ),
        # ... its ring's K and V copies marked L2 evict-first (a cache hint:
        # the same results; not yet run on a GPU when added).
        "llama_tiny_mma_tma_kv_evict_first": dataclasses.replace(
            mma_spans,
            attn_tma_release="read_early",
            attn_tma_prefetch=True,
            attn_kv_evict_first=True,
            **tma_heads,
        ),  # fmt: skip
        # ... called, as the default B = 2..16 kernel's, with the split
        # counts capped: past 3 or 2 splits the spans grow with L, past the
        # chunk of 512 positions at L = 1600.
        "llama_tiny_mma_tma_capped": capped,
        # ... with the combine in the attention (the last split to count
        # merges; one split writes the output directly and counts nothing),
        # called and TMA-fed as the B = 2..16 kernels, and inlined on the
        # per-lane loads.
        "llama_tiny_mma_tma_capped_fused": dataclasses.replace(capped, fuse_combine=True),
        "llama_tiny_mma_fused": dataclasses.replace(mma_spans, fuse_combine=True),
        "llama_tiny_mma_tma_capped_lists": dataclasses.replace(
            capped, queue_ahead=True, wait_memo=True
        ),
        # ... each instance attending both kv heads of its sequence on one
        # ring (attn_items), inlined with the ring prefetched, and called.
        "llama_tiny_mma_tma_items": dataclasses.replace(
            mma_spans, attn_items=2, attn_tma_prefetch=True, **tma_heads
        ),
        "llama_tiny_mma_tma_capped_items": dataclasses.replace(capped, attn_items=2),
        # The projections on CUDA cores, one row a tile (gemm_core="gemv",
        # tiles always called: inlined next to each other they went wrong,
        # bench/RESULTS.md item 208); with deeper rings, the weights
        # evict-first and the LM head and argmax called too; and as the
        # default artifact runs it, in the B = 1 kernel only.
        "llama_tiny_gemv": dataclasses.replace(llama.TINY, gemm_core="gemv"),
        "llama_tiny_gemv_called": dataclasses.replace(
            llama.TINY,
            gemm_core="gemv",
            outline=("qkv", "o_proj", "gate_up", "down", "lm_head"),
            weights_evict_first=True,
            gemm_options=(("stages", 8),),
            projection_options=(("down_proj", (("prefetch_ring", 1),)),),
        ),  # fmt: skip
        "llama_tiny_gemv_buckets": dataclasses.replace(
            llama.TINY, batch_buckets=((1, (("gemm_core", "gemv"),)), (None, ()))
        ),
        # ... with o_proj's and half of gate/up's weights asked into L2 while
        # the attention runs (the prefetch task beside called gemv tiles).
        "llama_tiny_gemv_prefetch": dataclasses.replace(
            llama.TINY,
            gemm_core="gemv",
            gemm_options=(("stages", 8),),
            l2_prefetch=(("wo", 8, 0), ("wgu", 4, 0)),
            l2_prefetch_ctas=3,
        ),
        # ... 16 or 8 rows a tile on mma.sync (the weights as A; 16 weight
        # rows a warp, so blocks of 32 columns where k = 256 leaves 4 k
        # slices), 16 rows without the 8-row path (a B = 3 tile on the
        # 16-row loop), and as the default's B <= 16 kernels run them.
        "llama_tiny_gemv16": dataclasses.replace(llama.TINY, **gemv_rows, gemv_block=16),
        "llama_tiny_gemv16_full": dataclasses.replace(
            llama.TINY, **gemv_rows, gemv_block=16, gemv_short_path=False
        ),
        "llama_tiny_gemv8": dataclasses.replace(llama.TINY, **gemv_rows, gemv_block=8),
        # ... its LM head in 128-column blocks: 8 warps of 16 weight rows, one
        # k slice each (as the default's B = 2..8 kernel).
        "llama_tiny_gemv8_lm128": dataclasses.replace(
            llama.TINY, **gemv_rows, gemv_block=8, bn_lm=128
        ),
        # ... with each warp's weight copies reading whole lines, the lanes
        # sharing them through the ring (gemv_whole_lines), on both paths of
        # the 16-row tile.
        "llama_tiny_gemv8_lines": dataclasses.replace(
            llama.TINY, **gemv_rows, gemv_block=8, bn_lm=128, gemv_whole_lines=True
        ),
        "llama_tiny_gemv16_lines": dataclasses.replace(
            llama.TINY, **gemv_rows, gemv_block=16, gemv_whole_lines=True
        ),
        # 32 and 64 rows a tile (each half chunk's activations loaded before
        # its mmas, the epilogue's inputs after the loop), and B >= 17 on
        # 32-row tiles beside the 16-row and one-row kernels.
        "llama_tiny_gemv32_lines": dataclasses.replace(
            llama.TINY, **gemv_rows, gemv_block=32, gemv_whole_lines=True
        ),
        "llama_tiny_gemv64_lines": dataclasses.replace(
            llama.TINY, **gemv_rows, gemv_block=64, gemv_whole_lines=True
        ),
        "llama_tiny_gemv32_buckets": dataclasses.replace(
            llama.TINY,
            batch_buckets=(
                (1, (("gemm_core", "gemv"),)),
                (16, (*gemv_rows.items(), ("gemv_block", 16), ("gemv_whole_lines", True))),
                (None, (*gemv_rows.items(), ("gemv_block", 32), ("gemv_whole_lines", True))),
            ),
        ),
        "llama_tiny_gemv_rows_buckets": dataclasses.replace(
            llama.TINY,
            batch_buckets=(
                (1, (("gemm_core", "gemv"),)),
                (8, (*gemv_rows.items(), ("gemv_block", 8))),
                (16, (*gemv_rows.items(), ("gemv_block", 16), ("gemv_short_path", False))),
                (None, ()),
            ),
        ),
        # o_proj and down in a shared region of their own: each CTA runs the
        # next instance's ring prefetch ahead across regions; and with the
        # TMA-fed attention in a third region (its mbarrier ring prefetched
        # ahead while the CTA waits for, or runs, the QKV projection).
        "llama_tiny_regions": dataclasses.replace(
            llama.TINY, shared_regions=(("o_proj", 1), ("down", 1))
        ),
        "llama_tiny_regions_tma_pf": dataclasses.replace(
            mma_spans,
            attn_tma_prefetch=True,
            shared_regions=(("o_proj", 1), ("down", 1), ("attention", 2)),
            **tma_heads,
        ),
        # Projections with different TMA stage counts: their rings and
        # barriers overlay differently (wrong tokens before the tiles
        # invalidated their mbarriers, bench/RESULTS.md item 72).
        "llama_tiny_tma_mixed": dataclasses.replace(
            tma,
            projection_options=(
                ("qkv_proj", (("stages", 3),)),
                ("down_proj", (("stages", 2),)),
                ("gate_up_proj", (("stages", 6),)),
            ),
        ),
        # The tma tiles load their first weight stages into the ring before
        # the waits by default (session 13's NaNs at B = 70 and 130 came from
        # the missing mbarrier.inval); these ask the L2 for them instead.
        "llama_tiny_tma_l2pf": dataclasses.replace(tma, tma_prefetch=True),
        "llama_tiny_tma_buckets_l2pf": dataclasses.replace(tma_buckets, tma_prefetch=True),
        # Each column block's k loop starts at its own k-tile (tma_rotate_k),
        # with the weights loaded into the ring and asked into L2 before the
        # waits: the prefetches must load the rotated loop's first k-tiles.
        "llama_tiny_tma_rotate": dataclasses.replace(tma, tma_rotate_k=True),
        # ... their epilogues' row sums and residual loaded before the k loop.
        "llama_tiny_tma_ahead": dataclasses.replace(tma, tma_epilogue_ahead=True),
        "llama_tiny_tma_rotate_l2pf": dataclasses.replace(
            tma, tma_rotate_k=True, tma_prefetch=True
        ),
        "llama_tiny_buckets": buckets,
        # Ragged batches (each sequence at its own position, LlamaConfig.ragged):
        # the phased, online (spread splits) and TMA-fed tensor-core tiles (its
        # ring started before the waits), three kernels in one artifact, and
        # the B = 1 kernel with K and V copied before the waits.
        "llama_tiny_ragged": dataclasses.replace(llama.TINY, ragged=True),
        "llama_tiny_online_ragged": dataclasses.replace(online_spans, ragged=True),
        "llama_tiny_mma_tma_ragged": dataclasses.replace(
            mma_spans, attn_tma_prefetch=True, ragged=True, **tma_heads
        ),
        "llama_tiny_buckets_ragged": dataclasses.replace(buckets, ragged=True),
        "llama_tiny_context_span_ragged": dataclasses.replace(context_span, ragged=True),
        # A paged cache (LlamaConfig.page_size, pages dealt at random): pages
        # of 8 positions (shorter than a split) under the phased tile, its K
        # and V copied or asked into L2 before the waits, the online tile and
        # the tensor-core tile's register and shared-memory pipelines; under
        # its TMA ring pages of 128 (a box a step), with two kv heads an
        # instance, and of 16 (8 boxes a step) with a ragged batch; three
        # kernels in one artifact, ragged.
        "llama_tiny_paged": dataclasses.replace(llama.TINY, page_size=8),
        "llama_tiny_context_span_paged": dataclasses.replace(context_span, page_size=8),
        "llama_tiny_attn_l2pf_paged": dataclasses.replace(
            llama.TINY, attn_prefetch_kv="l2", page_size=8
        ),
        "llama_tiny_online_paged": dataclasses.replace(online_spans, page_size=8),
        "llama_tiny_mma_pipeline_paged": dataclasses.replace(
            mma_spans, attn_pipeline="registers", page_size=8
        ),
        "llama_tiny_mma_staged_paged": dataclasses.replace(
            mma_spans,
            attn_pipeline="smem",
            head_dim=64,
            heads=4,
            kv_heads=2,
            combine_group=4,
            page_size=8,
        ),  # fmt: skip
        "llama_tiny_mma_tma_items_paged": dataclasses.replace(
            mma_spans, attn_items=2, attn_tma_prefetch=True, page_size=128, **tma_heads
        ),
        "llama_tiny_mma_tma_paged_ragged": dataclasses.replace(
            mma_spans, attn_tma_prefetch=True, ragged=True, page_size=16, **tma_heads
        ),
        "llama_tiny_buckets_paged_ragged": dataclasses.replace(buckets, ragged=True, page_size=8),
        "llama_tiny_context_buckets": context,
        "llama_tiny_context_span": context_span,
        "llama_tiny_context_slots": context_slots,
        "llama_tiny_context_tiers": context_tiers,
        "llama_tiny_context_cluster": context_cluster,
        "llama_tiny_context_one_pass": context_one_pass,
        "llama_tiny_one_pass": one_pass,
        # The sync-core weight copies marked L2 evict-first (a cache hint:
        # the same results).
        "llama_tiny_evict_first": dataclasses.replace(llama.TINY, weights_evict_first=True),
        # ... and the tma core's weight boxes (not yet run on a GPU when added).
        "llama_tiny_tma_evict_first": dataclasses.replace(tma, weights_evict_first=True),
        # ... and its projections' parts stamped (gemm_stamps, a measuring
        # aid: the same arithmetic).
        "llama_tiny_tma_gemm_stamps": dataclasses.replace(tma, gemm_stamps=True),
        # Tasks dealt at run time (deal="pool"): every layer's attention and
        # projections, the LM head; and the same in the kernels of three.
        "llama_tiny_pool": dataclasses.replace(llama.TINY, pool=_POOLED),
        "llama_tiny_tma_buckets_pool": _unshared(tma_buckets, pool=_POOLED),
        "llama_tiny_single": single,
        "llama_tiny_single_fused": single_fused,
        "llama_tiny_single_fused_merge2": single_fused_merge2,
        "llama_tiny_single_fused_gemv": single_fused_gemv,
        "llama_tiny_prefetch": prefetch,
        "llama_tiny_prefetch_lines": prefetch_lines,
        "llama_tiny_combine_group": combine_group,
        "llama_tiny_tma": tma,
        # ... with qkv and o_proj on the gemv core's rows mode, 32 or 64 rows
        # a tile, beside the tma core's 64-row blocks (B = 70: three 32-row
        # qkv blocks feed two 64-row gate/up blocks).
        "llama_tiny_tma_gemv32": dataclasses.replace(tma, **tma_gemv_rows, gemv_block=32),
        "llama_tiny_tma_gemv64": dataclasses.replace(tma, **tma_gemv_rows, gemv_block=64),
        "llama_tiny_tma_buckets": tma_buckets,
        # The split projections' parts meeting by rows and columns instead of
        # in fragment order (B = 70: two 64-row blocks, the last partial).
        "llama_tiny_tma_rows": dataclasses.replace(tma, tma_meeting="rows"),
        # ... their sums shared by each block's last 2 parts to arrive
        # (static kernels; compile_decoder drops it for the dynamic ones).
        "llama_tiny_tma_share": dataclasses.replace(tma, tma_meet_share=_TINY_SHARES),
        "llama_tiny_tma_buckets_share": dataclasses.replace(
            tma_buckets, tma_meet_share=_TINY_SHARES
        ),
        "llama_tiny_tma_buckets_rows": _unshared(tma_buckets, tma_meeting="rows"),
        # ... meeting in pairs on thread-block clusters of 2 (static kernels:
        # a clustered launch; compile_decoder gives the dynamic ones fragments).
        "llama_tiny_tma_cluster": dataclasses.replace(tma, tma_meeting="cluster"),
        # Every kernel's CTAs take their lists by SM (LARGE_BATCH's does above).
        "llama_tiny_sm_slices": dataclasses.replace(llama.TINY, sm_slices=True),
        # Each CTA loads its next queue entry ahead and skips waits its last
        # completed one covers (static schedule; the dynamic twin ignores them):
        # inlined, and in the called, capped tensor-core kernel.
        "llama_tiny_lists": dataclasses.replace(llama.TINY, queue_ahead=True, wait_memo=True),
        # The layer projections' weights chunked (weight_chunk), also under
        # the L2 prefetch of weight eighths.
        "llama_tiny_chunk": dataclasses.replace(llama.TINY, weight_chunk=64),
        "llama_tiny_chunk_prefetch": dataclasses.replace(prefetch, weight_chunk=32),
        # ... and every projection on the tma core (4-D maps, chunks of 64).
        "llama_tiny_tma_chunk": dataclasses.replace(tma, weight_chunk=64),
        # ... and the layer projections' rings filled by bulk copies (chunks of 32).
        "llama_tiny_bulk_chunk": dataclasses.replace(
            llama.TINY,
            weight_chunk=32,
            projection_options=tuple(
                (p, (("bulk_ring", True),))
                for p in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
            ),
        ),  # fmt: skip
    }


def _unshared(cfg, **changes):
    """``cfg`` with ``changes`` and its last bucket's (``LARGE_BATCH``'s)
    shared down sums dropped: the rows meeting and pooled tasks refuse them."""
    *rest, (bound, last) = cfg.batch_buckets
    buckets = (*rest, (bound, (*last, ("tma_meet_share", ()))))
    return dataclasses.replace(cfg, batch_buckets=buckets, **changes)


#: ``tma_meet_share`` of the tiny TMA decoders (32-column qkv and down
#: blocks: two fragments a thread).
_TINY_SHARES = (("qkv_proj", 2), ("down_proj", 2))


def llama_1b_large_variants() -> dict:
    """Llama-3.2-1B's large-batch kernel alone (``LARGE_BATCH``), with the
    projections on different TMA stage counts (qkv 3, down 6, the others 4),
    and with the weights asked into L2 before the waits instead of loaded
    into the rings (``tma_prefetch=True``), and with the attention's ring
    stages given back at other points (``attn_tma_release``), and with the
    epilogues' loads issued before the k loops (``tma_epilogue_ahead``),
    and with the tiles inlined into the kernel instead of called
    (``outline``), and with qkv's and gate/up's sums shared by their last
    parts like down's (``tma_meet_share``): the same arithmetic, so
    bit-identical logits."""
    from etc.models import llama

    large = llama.LLAMA_3_2_1B.bucket_configs()[-1][1]
    stages = (("qkv_proj", (("stages", 3),)), ("down_proj", (("stages", 6),)))
    return {
        "llama_1b_large": large,
        "llama_1b_large_mixed": dataclasses.replace(large, projection_options=stages),
        "llama_1b_large_l2pf": dataclasses.replace(large, tma_prefetch=True),
        "llama_1b_large_read": dataclasses.replace(large, attn_tma_release="read"),
        "llama_1b_large_math": dataclasses.replace(large, attn_tma_release="math"),
        "llama_1b_large_inlined": dataclasses.replace(large, outline=False),
        "llama_1b_large_attn_outlined": dataclasses.replace(large, outline=("attention",)),
        "llama_1b_large_plain": dataclasses.replace(large, tma_epilogue_ahead=False),
        # qkv's and gate/up's sums also shared by their blocks' last parts
        # (no row sums of squares there: the same sums in the same order).
        "llama_1b_large_share_nosums": dataclasses.replace(
            large, tma_meet_share=(("qkv_proj", 4), ("gate_up_proj", 2), ("down_proj", 2))
        ),
    }


def llama_1b_large_close() -> dict:
    """The large-batch kernel with other split projections' sums shared by
    each block's last parts (``tma_meet_share``), or none of them: the same
    sums in the same order, but o_proj's and down's row sums of squares go
    out per sharer's fragments, so the next norms may round their
    fixed-point totals differently and the bf16 step drifts as any bf16
    rounding change makes it: close logits, not bit-equal ones."""
    from etc.models import llama

    large = llama.LLAMA_3_2_1B.bucket_configs()[-1][1]
    shares = (("qkv_proj", 4), ("o_proj", 4), ("gate_up_proj", 2), ("down_proj", 4))
    return {
        "llama_1b_large_share": dataclasses.replace(large, tma_meet_share=shares),
        # ... and no projection's shared (the kernel before session 35),
        # with the parts meeting in fragment order or by rows and columns.
        "llama_1b_large_unshared": dataclasses.replace(large, tma_meet_share=()),
        "llama_1b_large_rows": dataclasses.replace(large, tma_meeting="rows", tma_meet_share=()),
        # ... and meeting in pairs on thread-block clusters of 2 first (pair
        # sums: another order of the same parts).
        "llama_1b_large_cluster": dataclasses.replace(
            large, tma_meeting="cluster", tma_meet_share=()
        ),
    }


# -- a data-dependent trigger over a table the test hands in ----------------------------------
#
# ``plan`` copies ``given`` (E + 1 entries) into ``indptr`` and ``counts``
# into each coordinate's wait count (its range's size, plus the gather, when
# right: trigger_table_counts); ``gather`` e
# fires coordinate e; tile ``(i, c)`` writes ``out[i] = 1000 (c + 1) + i -
# indptr[c]``; ``sink`` e sums its range. A good table gives every instance of
# the grid below indptr[C] its range; a bad one must stop the launch with
# TriggerRangeError, and a count too low with WaitCountError
# (test/gpu/test_schedules_gpu.py).

_TRIGGER_PLAN = """
func.func @plan(%i: index, %given: memref<?xi32>, %counts: memref<?xi32>, %indptr: memref<?xi32>, %wait: memref<?xi32>) {
  %c0 = arith.constant 0 : index
  %tid = gpu.thread_id x
  %threads = gpu.block_dim x
  %n = memref.dim %given, %c0 : memref<?xi32>
  %coords = memref.dim %counts, %c0 : memref<?xi32>
  scf.for %j = %tid to %n step %threads {
    %v = memref.load %given[%j] : memref<?xi32>
    memref.store %v, %indptr[%j] : memref<?xi32>
  }
  scf.for %j = %tid to %coords step %threads {
    %w = memref.load %counts[%j] : memref<?xi32>
    memref.store %w, %wait[%j] : memref<?xi32>
  }
  return
}
"""
_TRIGGER_TILE = """
func.func @tile(%i: index, %c: index, %indptr: memref<?xi32>, %out: memref<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %tid = gpu.thread_id x
  %first = arith.cmpi eq, %tid, %c0 : index
  scf.if %first {
    %begin = memref.load %indptr[%c] : memref<?xi32>
    %i32 = arith.index_cast %i : index to i32
    %c32 = arith.index_cast %c : index to i32
    %k = arith.constant 1000 : i32
    %one = arith.constant 1 : i32
    %cp1 = arith.addi %c32, %one : i32
    %tag = arith.muli %cp1, %k : i32
    %offset = arith.subi %i32, %begin : i32
    %value = arith.addi %tag, %offset : i32
    memref.store %value, %out[%i] : memref<?xi32>
  }
  return
}
"""
_TRIGGER_SINK = """
func.func @sink(%e: index, %indptr: memref<?xi32>, %out: memref<?xi32>, %total: memref<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0 : i32
  %tid = gpu.thread_id x
  %first = arith.cmpi eq, %tid, %c0 : index
  scf.if %first {
    %e1 = arith.addi %e, %c1 : index
    %lo32 = memref.load %indptr[%e] : memref<?xi32>
    %hi32 = memref.load %indptr[%e1] : memref<?xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %sum = scf.for %j = %lo to %hi step %c1 iter_args(%acc = %zero) -> (i32) {
      %v = memref.load %out[%j] : memref<?xi32>
      %next = arith.addi %acc, %v : i32
      scf.yield %next : i32
    }
    memref.store %sum, %total[%e] : memref<?xi32>
  }
  return
}
"""


def _trigger_plan_ref(i, given, counts, indptr, wait) -> None:  # noqa: ANN001
    indptr[:] = given
    wait[:] = counts


def trigger_table_counts(table) -> np.ndarray:  # noqa: ANN001
    """The wait counts of ``done`` that ``table`` needs: each range's size,
    plus the gather's notification (0 where the range is bad)."""
    return (np.maximum(np.diff(np.asarray(table)), 0) + 1).astype(np.int32)


def trigger_tile_ref(i: int, c: int, indptr: np.ndarray, out: np.ndarray) -> None:
    """Tile ``(i, c)`` of the trigger graphs (here and ``test_triggers.py``)."""
    assert indptr[c] <= i < indptr[c + 1], (i, c)
    out[i] = 1000 * (c + 1) + (i - indptr[c])


def trigger_sink_ref(e: int, indptr: np.ndarray, out: np.ndarray, total: np.ndarray) -> None:
    """Sink ``e`` of the trigger graphs: the sum of its range's tiles."""
    total[e] = out[indptr[e] : indptr[e + 1]].sum()


def trigger_table_graph(*, guard: bool = True) -> etc.Graph:
    """The trigger test graph over a table the launch hands in (``given``,
    ``E + 1`` entries) and the wait counts of ``done`` (``counts``, ``E``:
    ``trigger_table_counts(given)`` or a wrong one); the tile's grid is
    ``tiles``. ``guard``: the tiles wait for the plan (the table is final at
    their in-edges)."""
    from etc.device import DeviceFunction

    def fn(source: str, name: str, reference) -> DeviceFunction:  # noqa: ANN001
        return DeviceFunction.from_mlir(source, name, reference, block_size=BLOCK)

    g = etc.Graph("trigger_table")
    E, tiles = g.symbol("E"), g.symbol("tiles")
    given = g.tensor("given", (E + 1,), "i32")
    counts = g.tensor("counts", (E,), "i32")
    indptr = g.tensor("indptr", (E + 1,), "i32")
    wait = g.tensor("wait", (E,), "i32")
    out = g.tensor("out", (tiles,), "i32")
    total = g.tensor("total", (E,), "i32")
    planned = g.event((1,), wait_count=1, name="planned")
    ready = g.event((E,), wait_count=1, name="ready")
    done = g.event((E,), wait_count=wait, name="done")
    g.task(fn(_TRIGGER_PLAN, "plan", _trigger_plan_ref), grid=(1,), args=(given, counts, indptr, wait),
           out_edges={planned: "i->0"})  # fmt: skip
    g.task(synthetic.empty(name="gather", block_size=BLOCK), grid=(E,),
           in_edges={planned: "e->0"}, out_edges=[(ready, "e->e"), (done, "e->e")])  # fmt: skip
    g.task(fn(_TRIGGER_TILE, "tile", trigger_tile_ref), grid=(tiles,), args=(indptr, out),
           in_edges={planned: "ic->0"} if guard else None, out_edges={done: "ic->c"},
           triggered_by=(ready, indptr))  # fmt: skip
    g.task(fn(_TRIGGER_SINK, "sink", trigger_sink_ref), grid=(E,), args=(indptr, out, total),
           in_edges=[(planned, "e->0"), (done, "e->e")])  # fmt: skip
    return g


#: The trigger table graphs by artifact name prefix (``<name>_<schedule>``).
TRIGGER_TABLE_GRAPHS = {
    "trigger_table": lambda: trigger_table_graph(guard=True),
    "trigger_table_unguarded": lambda: trigger_table_graph(guard=False),
}

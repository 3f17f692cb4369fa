"""The MoE layer (data-dependent triggers and wait-count tables) on the GPU at
small sizes: every schedule gives the float32 reference's answer and the same
routing tables as the simulator, for token counts that fill no tile evenly
and for skewed routings. Artifacts: ``python test/gpu/make_artifacts.py DIR``
(``moe_small_*``); ``ETC_ARTIFACTS=DIR``."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import etc
import etc.runtime
from etc.dtypes import bf16_to_f32
from etc.models import moe as M

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphs as G  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("ETC_ARTIFACTS"), reason="ETC_ARTIFACTS is not set"),
]


@pytest.mark.parametrize(
    "tiles",
    [
        "", "_tma", "_ring", "_ringpf", "_split", "_sub", "_route", "_route_tma",
        "_route_unguarded", "_gather", "_route_gather", "_atomic", "_route_atomic",
        "_atomic16", "_route_atomic16", "_ticket", "_tma_ticket", "_tma_short", "_slots",
        "_slots_logits", "_slots_l2", "_slots_ring", "_chunk", "_ringpf_chunk", "_slots_chunk",
        "_tma_chunk", "_slots_bulk_chunk", "_slots_fused", "_slots_gemv",
        "_slots_gemv_chunk", "_slots_gemv_last", "_gather_tma", "_tma_refill", "_bulk_permute",
    ],
)  # fmt: skip
@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
@pytest.mark.parametrize("routing", ["uniform", "one-expert", "few-experts"])
def test_moe_matches_reference_and_simulator(tiles: str, schedule: str, routing: str) -> None:
    cfg = {
        "": G.MOE_SMALL,
        "_tma": G.MOE_SMALL_TMA,
        "_ring": G.MOE_SMALL_RING,
        "_ringpf": G.MOE_SMALL_RING_PREFETCH,
        "_split": G.MOE_SMALL_SPLIT,
        "_sub": G.MOE_SMALL_SUB,
        "_route": G.MOE_SMALL_ROUTE,
        "_route_tma": G.MOE_SMALL_ROUTE_TMA,
        "_route_unguarded": G.MOE_SMALL_ROUTE,
        "_gather": G.MOE_SMALL_GATHER,
        "_route_gather": G.MOE_SMALL_ROUTE_GATHER,
        "_atomic": G.MOE_SMALL_ATOMIC,
        "_route_atomic": G.MOE_SMALL_ROUTE_ATOMIC,
        "_atomic16": G.MOE_SMALL_ATOMIC16,
        "_route_atomic16": G.MOE_SMALL_ROUTE_ATOMIC16,
        "_ticket": G.MOE_SMALL_TICKET,
        "_tma_ticket": G.MOE_SMALL_TMA_TICKET,
        "_tma_short": G.MOE_SMALL_TMA_SHORT,
        "_slots": G.MOE_SMALL_SLOTS,
        "_slots_logits": G.MOE_SMALL_SLOTS_LOGITS,
        "_slots_l2": G.MOE_SMALL_SLOTS_L2,
        "_slots_ring": G.MOE_SMALL_SLOTS_RING,
        "_chunk": G.MOE_SMALL_CHUNK,
        "_ringpf_chunk": G.MOE_SMALL_RINGPF_CHUNK,
        "_slots_chunk": G.MOE_SMALL_SLOTS_CHUNK,
        "_tma_chunk": G.MOE_SMALL_TMA_CHUNK,
        "_slots_bulk_chunk": G.MOE_SMALL_SLOTS_BULK,
        "_slots_fused": G.MOE_SMALL_SLOTS_FUSED,
        "_slots_gemv": G.MOE_SMALL_SLOTS_GEMV,
        "_slots_gemv_chunk": G.MOE_SMALL_SLOTS_GEMV_CHUNK,
        "_slots_gemv_last": G.MOE_SMALL_SLOTS_GEMV_LAST,
        "_gather_tma": G.MOE_SMALL_GATHER_TMA,
        "_tma_refill": G.MOE_SMALL_TMA_REFILL,
        "_bulk_permute": G.MOE_SMALL_BULK_PERMUTE,
    }[tiles]
    name = f"moe_small{tiles}"
    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"{name}_{schedule}")
    graph = M.build_moe_graph(cfg, name=name, **G.MOE_GRAPH_OPTIONS.get(tiles, {}))
    weights = M.random_weights(cfg, seed=3, routing=routing)
    # One kernel object for every T, launched back to back: the kernel
    # resets its counters, queue and retired count itself.
    for T in (1, 7, 33, 300):
        x = M.random_tokens(cfg, T, seed=T, routing=routing)
        arrays = M.numpy_inputs(cfg, x, weights)
        simulated = etc.simulate(graph, arrays, {"T": T})
        kernel.launch(arrays, {"T": T})
        ref = M.reference_moe(x, weights["Wr"], weights["Wgu"], weights["Wd"], cfg.topk)
        assert M.rel_err(arrays["Out"], ref) <= 1e-2, (T, routing)
        # Counts and tile tables are deterministic (the row order inside an
        # expert is not): the GPU's equal the simulator's. Slot grids have
        # no tables; their expert rows are in slot order, as the simulator's.
        if cfg.route == "slots":
            np.testing.assert_array_equal(arrays["topk_ids"], simulated["topk_ids"])
            assert M.rel_err(arrays["Hb"], simulated["Hb"]) <= 1e-2, (T, routing)
            if cfg.fuse_down:  # the sums of Hb's rows, as close as Hb's own
                assert M.rel_err(arrays["Out32"], simulated["Out32"]) <= 1e-2, (T, routing)
            if cfg.combine == "last":  # every block combined once, its counter back to 0
                assert M.rel_err(arrays["Out"], simulated["Out"]) <= 1e-2, (T, routing)
                assert not arrays["Ycount"].any(), (T, routing)
            continue
        for table in ("row_off", "gu_indptr", "dn_indptr", "h_wait", "dn_total"):
            np.testing.assert_array_equal(arrays[table], simulated[table], err_msg=table)
        np.testing.assert_array_equal(
            np.sort(arrays["topk_ids"], 1), np.sort(simulated["topk_ids"], 1)
        )


@pytest.mark.parametrize(
    "tiles",
    [
        "", "_ringpf", "_tma", "_route", "_route_tma", "_route_unguarded", "_gather", "_atomic",
        "_tma_ticket",
    ],
)  # fmt: skip
@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
def test_launch_over_stale_tables(tiles: str, schedule: str) -> None:
    # Launched over the previous routing's tables (each launch a new routing
    # of the same T), a triggered tile must still find its expert and
    # prefetch its weights; `_route_unguarded`'s gate/up tiles do not wait for
    # the tables, so they guess from the old ones and must prefetch again.
    cfg = {
        "": G.MOE_SMALL,
        "_ringpf": G.MOE_SMALL_RING_PREFETCH,
        "_tma": G.MOE_SMALL_TMA,
        "_route": G.MOE_SMALL_ROUTE,
        "_route_tma": G.MOE_SMALL_ROUTE_TMA,
        "_route_unguarded": G.MOE_SMALL_ROUTE,
        "_gather": G.MOE_SMALL_GATHER,
        "_atomic": G.MOE_SMALL_ATOMIC,
        "_tma_ticket": G.MOE_SMALL_TMA_TICKET,
    }[tiles]
    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"moe_small{tiles}_{schedule}")
    for T in (7, 33):
        arrays = None
        for seed, routing in enumerate(("uniform", "one-expert", "few-experts", "uniform")):
            weights = M.random_weights(cfg, seed=seed, routing=routing)
            x = M.random_tokens(cfg, T, seed=100 + seed, routing=routing)
            fresh = M.numpy_inputs(cfg, x, weights)
            if arrays is None:
                arrays = fresh
            else:  # new inputs over the last launch's tables and intermediates
                for name in ("X", "Wr", "Wgu", "Wd"):
                    arrays[name][...] = fresh[name]
            kernel.launch(arrays, {"T": T})
            ref = M.reference_moe(x, weights["Wr"], weights["Wgu"], weights["Wd"], cfg.topk)
            assert M.rel_err(arrays["Out"], ref) <= 1e-2, (T, seed, routing)


#: (T, routing) of the tests that launch a layer variant next to the plain TMA layer.
PAIRED_CASES = ((1, "uniform"), (130, "one-expert"), (300, "uniform"))


def _paired(variant: str, route: str, schedule: str, cfg: M.MoEConfig, plain: M.MoEConfig):
    """Yields ``(T, routing, x, weights, a, b)`` for each of PAIRED_CASES
    after launching the ``variant`` kernel (``cfg``) on ``a`` and the plain
    TMA layer's (``plain``) on ``b``, both from fresh inputs (float32 sums
    filled with NaN first)."""
    arts = Path(os.environ["ETC_ARTIFACTS"])
    kernel = etc.runtime.load(arts / f"moe_small{route}_{variant}_{schedule}")
    plain_kernel = etc.runtime.load(arts / f"moe_small{route}_tma_{schedule}")
    for T, routing in PAIRED_CASES:
        weights = M.random_weights(cfg, seed=5, routing=routing)
        x = M.random_tokens(cfg, T, seed=T, routing=routing)
        a, b = M.numpy_inputs(cfg, x, weights), M.numpy_inputs(plain, x, weights)
        for sums in ("Out32", "Out16"):
            if sums in a:
                a[sums][...] = np.nan  # the zero task must clear the sums
        kernel.launch(a, {"T": T})
        plain_kernel.launch(b, {"T": T})
        yield T, routing, x, weights, a, b


@pytest.mark.parametrize("route", ["", "_route"])
@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
def test_gathered_rows_give_the_permuted_copy_s_bits(route: str, schedule: str) -> None:
    # A row's products do not depend on where in its block it sits, so the
    # gate/up tiles that gather X through perm give the layer's output bit
    # for bit as the ones that read the permuted copy Xp (and each its own
    # tables, whose row order inside an expert the atomics choose).
    cfg = G.MOE_SMALL_ROUTE_GATHER if route else G.MOE_SMALL_GATHER
    plain = replace(cfg, gather=False)
    for T, routing, _, _, a, b in _paired("gather", route, schedule, cfg, plain):
        assert "Xp" not in a and "Xp" in b
        np.testing.assert_array_equal(a["Out"], b["Out"], err_msg=f"T={T} {routing}")


@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
def test_session33_variants_give_the_plain_layer_s_bits(schedule: str) -> None:
    # Rows gathered by one-row TMA boxes land in the swizzle a whole block's
    # box gives, rings refilled when free and the bulk permute move the same
    # bytes: each layer's output is the plain TMA layer's, bit for bit.
    for variant, cfg in (
        ("gather_tma", G.MOE_SMALL_GATHER_TMA),
        ("tma_refill", G.MOE_SMALL_TMA_REFILL),
        ("bulk_permute", G.MOE_SMALL_BULK_PERMUTE),
    ):
        for T, routing, _, _, a, b in _paired(variant, "", schedule, cfg, G.MOE_SMALL_TMA):
            np.testing.assert_array_equal(a["Out"], b["Out"], err_msg=f"{variant} T={T} {routing}")


@pytest.mark.parametrize("variant", ["atomic", "atomic16"])
@pytest.mark.parametrize("route", ["", "_route"])
@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
def test_atomic_combine_matches_the_combine_task(variant: str, route: str, schedule: str) -> None:
    # The down tiles that add their weighted rows into float32 (or f16) sums
    # (L2 reductions) against the same layer with Yp and the combine task,
    # over sums that held NaN (the zero task clears them): as close to the
    # float32 reference (the rows are not rounded to bf16 before the sum),
    # and the simulator's answer alike.
    cfg = {
        ("atomic", ""): G.MOE_SMALL_ATOMIC, ("atomic", "_route"): G.MOE_SMALL_ROUTE_ATOMIC,
        ("atomic16", ""): G.MOE_SMALL_ATOMIC16, ("atomic16", "_route"): G.MOE_SMALL_ROUTE_ATOMIC16,
    }[variant, route]  # fmt: skip
    graph = M.build_moe_graph(cfg, name=f"moe_small{route}_{variant}")
    plain = replace(cfg, combine="task", combine_dtype="f32")
    for T, routing, x, weights, a, b in _paired(variant, route, schedule, cfg, plain):
        ref = M.reference_moe(x, weights["Wr"], weights["Wgu"], weights["Wd"], cfg.topk)
        simulated = etc.simulate(graph, M.numpy_inputs(cfg, x, weights), {"T": T})
        assert np.isfinite(bf16_to_f32(a["Out"])).all(), (T, routing)
        assert M.rel_err(a["Out"], ref) <= M.rel_err(b["Out"], ref) + 2**-9, (T, routing)
        assert M.rel_err(a["Out"], simulated["Out"]) <= 1e-2, (T, routing)


@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
def test_ticket_dealt_tiles_give_the_listed_tiles_bits(schedule: str) -> None:
    # Dealing the GEMM tiles by ticket changes which CTA runs a tile, not
    # what the tile computes: the output equals the listed layer's bit for
    # bit (the dynamic schedule ignores the deal).
    plain = replace(G.MOE_SMALL_TMA_TICKET, gemm_deal="list")
    for T, routing, _, _, a, b in _paired(
        "tma_ticket", "", schedule, G.MOE_SMALL_TMA_TICKET, plain
    ):
        np.testing.assert_array_equal(a["Out"], b["Out"], err_msg=f"T={T} {routing}")


@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
def test_short_blocks_give_the_plain_tiles_bits(schedule: str) -> None:
    # An expert's only block, of at most 64 rows, on one warpgroup (the
    # second skips the k loop) computes each row as the plain tile does: the
    # output equals the plain TMA layer's bit for bit, at T = 300 (every
    # expert short), 130 on one expert (its two blocks on both warpgroups,
    # the others short) and 1.
    plain = G.MOE_SMALL_TMA
    for T, routing, _, _, a, b in _paired("tma_short", "", schedule, G.MOE_SMALL_TMA_SHORT, plain):
        np.testing.assert_array_equal(a["Out"], b["Out"], err_msg=f"T={T} {routing}")


@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
def test_unrolled_topk_gives_the_plain_layer_s_bits(schedule: str) -> None:
    # Top-k warps that select 3 of their 4 tokens at a time make the same
    # choices and count them by the same atomics (only the slots' order
    # inside an expert may differ), so the output is the plain layer's bit
    # for bit, the choices equal and each expert's positions 0 .. count - 1.
    for T, routing, _, _, a, b in _paired(
        "tma_topk", "", schedule, G.MOE_SMALL_TMA_TOPK, G.MOE_SMALL_TMA
    ):
        np.testing.assert_array_equal(a["Out"], b["Out"], err_msg=f"T={T} {routing}")
        np.testing.assert_array_equal(a["topk_ids"][:T], b["topk_ids"][:T])
        np.testing.assert_array_equal(np.sort(a["pos"][:T].ravel()), np.sort(b["pos"][:T].ravel()))


@pytest.mark.parametrize("schedule", list(G.SCHEDULES))
def test_ring_passes_give_the_plain_tiles_bits(schedule: str) -> None:
    # Wider blocks whose column passes share one TMA ring (the next pass's
    # k-tiles load during this one's epilogue) compute each output as the
    # plain 64-column tiles do: the layer's output is the plain TMA layer's
    # bit for bit, the blocks staged (down's in two parts) or stored directly.
    for variant, cfg in (
        ("tma_ring", G.MOE_SMALL_TMA_RING),
        ("tma_ring_direct", G.MOE_SMALL_TMA_RING_DIRECT),
    ):
        for T, routing, _, _, a, b in _paired(variant, "", schedule, cfg, G.MOE_SMALL_TMA):
            np.testing.assert_array_equal(a["Out"], b["Out"], err_msg=f"{variant} T={T} {routing}")


@pytest.mark.parametrize("chunk", [0, 64])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_one_artifact_runs_each_preset_by_token_count(schedule: str, chunk: int) -> None:
    # compile_moe: the single, decode, mid and prefill presets in one
    # artifact; each launch runs the kernel of T's range on the same buffers
    # (the single and decode kernels leave the logits' spare rows alone), back
    # to back. With chunk=64 every kernel reads the expert weights chunked.
    tag = f"_ch{chunk}" if chunk else ""
    kernel = etc.runtime.load(
        Path(os.environ["ETC_ARTIFACTS"]) / f"moe_small_family{tag}_{schedule}"
    )
    family = M.preset_family(weight_chunk=chunk, **G.MOE_FAMILY_SIZES)
    assert kernel.bounds == [bound for bound, _, _ in family]
    cfg = family[-1][2]
    for T, routing in ((1, "uniform"), (4, "one-expert"), (5, "uniform"), (8, "uniform"),
                       (9, "few-experts"), (896, "one-expert"), (897, "uniform"),
                       (300, "few-experts"), (2, "few-experts")):  # fmt: skip
        weights = M.random_weights(cfg, seed=T, routing=routing)
        x = M.random_tokens(cfg, T, seed=T, routing=routing)
        arrays = M.numpy_inputs(cfg, x, weights)
        kernel.launch(arrays, {"T": T})
        ref = M.reference_moe(x, weights["Wr"], weights["Wgu"], weights["Wd"], cfg.topk)
        assert M.rel_err(arrays["Out"], ref) <= 1e-2, (T, routing)

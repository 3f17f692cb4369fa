"""The bulk-copy decode GEMM core (``layer_gemm(core="bulk")``,
``etc.tiles.gemm_bulk``): ring planning and its errors, the prefetch that
issues weights before the waits, PTX that ptxas accepts for every epilogue
and block height, the decoder built on it (simulated against the numpy
model, compiled under both schedules), and ``prefetch_next`` refusing it."""

from __future__ import annotations

import dataclasses
import re

import pytest
from gemm_helpers import compile_tile, needs_bindings, needs_ptxas, ptxas_info
from unit_helpers import check_decoder_step

import etc
from etc.models import llama as M
from etc.tiles import gemm_bulk
from etc.tiles.gemm import layer_gemm

pytestmark = needs_bindings


def test_plan_defaults_fill_the_budget():
    # qkv of Llama-3.2-1B: 16 weight rows, 16 activation rows, k = 2048.
    plan = gemm_bulk.plan_bulk("qkv", 16, 16, 2048, 256)
    assert plan.kc == 256  # 16 rows x 256 x 2 bytes = 8 KiB of weights per slot
    assert plan.pitch == 264  # 16 bytes of padding: 8 ldmatrix rows, 8 bank groups
    assert plan.stages == 5 and plan.smem_bytes <= gemm_bulk.DEFAULT_SMEM
    # Never more slots than chunks.
    small = gemm_bulk.plan_bulk("o", 8, 16, 256, 256)
    assert small.chunks == 1 and small.stages == 1
    # Partials: the 7 other warps' fragments.
    assert plan.partial_bytes == 7 * 1 * 2 * 4 * 32 * 4


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(rows=12), "weight rows in 8s"),
        (dict(block_m=8), "block_m in 16, 32"),
        (dict(k=2040), "does not split into 8 warp slices"),
        (dict(kc=96), "kc=96 must divide"),
        (dict(kc=4096), "kc=4096 must divide"),
        (dict(stages=0), "stages=0 must be a positive int"),
        (dict(rows=512, kc=2048, stages=1), "need .* bytes of shared memory"),
    ],
)
def test_plan_errors_name_the_tile(kwargs, words):
    args = dict(rows=16, block_m=16, k=2048, block_size=256) | kwargs
    with pytest.raises(etc.GraphError, match=f"tile 'p': .*{words}"):
        gemm_bulk.plan_bulk("p", **args)


def test_layer_gemm_bulk_refuses_the_sync_options():
    with pytest.raises(etc.GraphError, match="tile 'p': unroll, a_ring do not apply"):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", core="bulk", unroll=1, a_ring=True)
    with pytest.raises(etc.GraphError, match="tile 'p': kc applies to core='bulk' only"):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", kc=128)
    with pytest.raises(
        etc.GraphError, match="tile 'p': core 'wgmma' is not one of sync, bulk, tma"
    ):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", core="wgmma")


def _bulk_tile(epilogue, block_m, block_n, n=128, k=1024, **opts):
    return layer_gemm(
        block_m, block_n, n, k, layers=2, epilogue=epilogue, core="bulk", columns_first=True,
        **opts,
    )  # fmt: skip


def test_prefetch_issues_the_first_slots_of_weights_only():
    tile = _bulk_tile("swiglu", 16, 16, kc=128, stages=3)
    assert tile.prefetch == f"{tile.name}__prefetch" and tile.prefetch_fills_shared
    prefetch = tile.source[tile.source.index(f"func.func @{tile.prefetch}") :]
    body = tile.source[: tile.source.index(f"func.func @{tile.prefetch}")]
    # The prefetch initialises the slots' barriers; the body invalidates them.
    assert prefetch.count("mbarrier.init") == body.count("mbarrier.inval") == 3
    copy = "cp.async.bulk.shared::cluster.global"
    # Prefetch: 3 slots x 2 runs of weight rows (gate, up); no activations.
    assert prefetch.count(copy) == 3 * 2
    assert prefetch.count("mbarrier.init") == 3 and "memref.dim %A" in prefetch
    assert prefetch.count("mbarrier.expect_tx") == 3
    # Body: activations of the 3 prefetched slots, then one refill (gate, up, A).
    assert body.count(copy) == 3 + 3 and "mbarrier.init" not in body
    assert body.count("mbarrier.arrive.expect_tx") == 3 + 1


@needs_ptxas
@pytest.mark.parametrize(
    "epilogue, block_m, block_n",
    [("store", 16, 16), ("swiglu", 16, 16), ("residual", 16, 8), ("store", 32, 24)],
)
def test_bulk_tiles_compile(epilogue, block_m, block_n, tmp_path):
    n, k = 96, 1024
    per = 2 if epilogue == "swiglu" else 1
    tile = _bulk_tile(epilogue, block_m, block_n, n=n, k=k, rotate_k=True)
    art = compile_tile(
        tile,
        [("A", ("m", k), "bf16"), ("W", (2, per * n, k), "bf16"), ("C", ("m", n), "bf16")],
        (2, n // block_n, "m"),
    )
    assert art.cubin is not None
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in art.ptx
    assert "ldmatrix.sync.aligned" in art.ptx and "mma.sync.aligned.m16n8k16" in art.ptx
    # The ring, its barriers and the warps' partials.
    plan = gemm_bulk.plan_bulk("t", per * block_n, block_m, k, 256)
    spills, smem = ptxas_info(art.ptx, tmp_path)
    assert not any(spills)
    assert max([*smem, art.manifest.get("dynamic_shared_memory", 0)]) >= plan.smem_bytes


def _bulk_config(**change):
    return dataclasses.replace(M.TINY, gemm_core="bulk", **{"fold_norms": False, **change})


@pytest.mark.parametrize("block_m", [16, 32])
def test_decoder_on_the_bulk_core_matches_the_numpy_model(block_m):
    """Same tiles' references as the sync core: B = 17 spans row blocks
    (two of 16 rows or one of 32), the last one partial."""
    check_decoder_step(_bulk_config(block_m=block_m, bn_o=8, bn_down=8), B=17, L=5)


@needs_ptxas
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_decoder_on_the_bulk_core_compiles(schedule):
    cfg = _bulk_config()
    art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg, schedule))
    assert art.cubin is not None
    # Five projections, each a prefetch with its own mbarrier ring.
    assert len(set(re.findall(r"(\w+)__bulk_ring", art.ptx))) <= 5
    assert art.ptx.count("mbarrier.init.shared::cta.b64") >= 5


def test_prefetch_next_refuses_tiles_whose_prefetch_fills_shared_memory():
    cfg = _bulk_config()
    with pytest.raises(etc.CompileError, match="prefetch_next: task 'qkv' .* fills shared memory"):
        etc.compile(M.build_decoder_graph(cfg), schedule="static", prefetch_next=True)


def test_config_refuses_bulk_with_the_sync_only_options():
    with pytest.raises(etc.GraphError, match="fuse_norms needs the sync core for qkv_proj"):
        _bulk_config(fuse_norms=True)
    with pytest.raises(
        etc.GraphError, match="gemm_core must be one of sync, bulk, tma, gemv, got 'x'"
    ):
        dataclasses.replace(M.TINY, gemm_core="x")
    with pytest.raises(etc.GraphError, match="core_overrides names 'down', not one of"):
        dataclasses.replace(M.TINY, core_overrides=(("down", "bulk"),))
    with pytest.raises(
        etc.GraphError, match=r"core_overrides\['o_proj'\] must be one of sync, bulk, tma, gemv"
    ):
        dataclasses.replace(M.TINY, core_overrides=(("o_proj", "wgmma"),))


def test_core_overrides_pick_one_projection():
    cfg = dataclasses.replace(
        M.TINY, core_overrides=(("down_proj", "bulk"),), fuse_norms=True, fold_norms=False
    )
    g = M.build_decoder_graph(cfg)
    bulk = {t.name for t in g.tasks if "bulk ring of" in t.function.source}
    assert bulk == {"down"}


def test_projection_options_change_one_projection():
    """projection_options: one projection's sync-core options; the others keep
    gemm_options and prefetch_ring."""
    base = {t.name: t.function.source for t in M.build_decoder_graph(M.TINY).tasks}
    options = (("down_proj", (("stages", 3), ("prefetch_ring", False))),)
    cfg = dataclasses.replace(M.TINY, projection_options=options)
    changed = {t.name: t.function.source for t in M.build_decoder_graph(cfg).tasks}
    assert {n for n in base if base[n] != changed[n]} == {"down"}
    assert "@down_proj__prefetch" in base["down"]
    assert "@down_proj__prefetch" not in changed["down"]
    with pytest.raises(etc.GraphError, match="projection_options names 'down', not one of"):
        dataclasses.replace(M.TINY, projection_options=(("down", (("stages", 3),)),))
    with pytest.raises(
        etc.GraphError, match=r"projection_options\['o_proj'\] names 'warps', not one of stages"
    ):
        dataclasses.replace(M.TINY, projection_options=(("o_proj", (("warps", (1, 1, 8)),)),))
    with pytest.raises(etc.GraphError, match="projection_options must be a tuple of"):
        dataclasses.replace(M.TINY, projection_options={"o_proj": {"stages": 3}})
    with pytest.raises(etc.GraphError, match=r"projection_options\['o_proj'\] must be a tuple"):
        dataclasses.replace(M.TINY, projection_options=(("o_proj", ("stages", 3)),))
    # A value the tile refuses is named by the tile.
    with pytest.raises(etc.GraphError, match="tile 'o_proj'"):
        M.build_decoder_graph(
            dataclasses.replace(M.TINY, projection_options=(("o_proj", (("stages", 40),)),))
        )

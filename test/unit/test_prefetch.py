"""The L2 prefetch tile (etc.tiles.prefetch) and the decoder's prefetch task
(LlamaConfig.l2_prefetch): errors, where the task sits in the graph, no
effect on results in the simulator, and PTX that ptxas accepts."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from gemm_helpers import compile_tile, needs_bindings, needs_ptxas

import etc
from etc.dtypes import bf16_to_f32
from etc.models import llama as M
from etc.tiles.prefetch import Region, l2_prefetch

pytestmark = needs_bindings
CFG = dataclasses.replace(
    M.TINY, l2_prefetch=(("wo", 8, 0), ("wgu", 3, 0), ("wqkv", 8, 1)), l2_prefetch_ctas=3
)


@pytest.mark.parametrize(
    "regions, kwargs, message",
    [
        ((), {}, "give at least one region"),
        ((Region(12, 64),), {}, "region 0 has 12 rows, not a multiple of 8"),
        ((Region(8, 64), Region(8, 12)), {}, "region 1 has 12 columns"),
        ((Region(8, 64, eighths=9),), {}, "region 0 eighths=9 is not in 1..8"),
        ((Region(8, 64, layer_offset=2),), {}, "region 0 layer_offset=2 is not in 0..1"),
        (((8, 64),), {}, "region 0 is \\(8, 64\\), not an etc.tiles.prefetch.Region"),
        ((Region(8, 64),), {"instances": 0}, "instances must be a positive int"),
        ((Region(8, 64),), {"mode": "tma"}, "mode 'tma' is not one of bulk, lines"),
        (
            (Region(8, 32),),
            {"mode": "lines"},
            "region 0 has 32 columns, not a multiple of 64 \\(mode 'lines'\\)",
        ),
    ],
)
def test_prefetch_tile_errors_name_the_region(regions, kwargs, message):
    args = {"instances": 2, **kwargs}
    instances = args.pop("instances")
    with pytest.raises(etc.GraphError, match=f"tile 'l2_prefetch': {message}"):
        l2_prefetch(regions, instances, layers=2, **args)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"l2_prefetch": (("wk", 8, 0),)}, "l2_prefetch names 'wk'"),
        ({"l2_prefetch": (("wo", 0, 0),)}, "l2_prefetch\\['wo'\\] eighths=0"),
        ({"l2_prefetch": (("wo", 8, 2),)}, "layer_offset=2 is not in 0..1"),
        ({"l2_prefetch": (("wo", 8),)}, "is not \\(weight, eighths, layer_offset\\)"),
        ({"l2_prefetch_ctas": 0}, "l2_prefetch_ctas must be an int >= 1"),
        ({"l2_prefetch_mode": "tma"}, "l2_prefetch_mode 'tma' is not one of bulk, lines"),
    ],
)
def test_config_errors_name_the_prefetch_field(change, message):
    with pytest.raises(etc.GraphError, match=message):
        dataclasses.replace(M.TINY, **change)


def test_prefetch_task_waits_for_the_qkv_projection_and_notifies_nothing():
    g = M.build_decoder_graph(CFG)
    names = [t.name for t in g.tasks]
    assert "l2_prefetch" in names and "l2_prefetch" not in [
        t.name for t in M.build_decoder_graph(M.TINY).tasks
    ]
    task = g.tasks[names.index("l2_prefetch")]
    qkv = g.tasks[names.index("qkv")]
    assert names.index("attention") < names.index("l2_prefetch") < names.index("o_proj")
    assert [e.event.name for e in task.in_edges] == ["qkv_done"]
    assert [e.event.name for e in qkv.out_edges] == ["qkv_done"]
    assert not task.out_edges
    assert tuple(task.grid) == (CFG.layers, CFG.l2_prefetch_ctas)
    assert [a.name for a in task.args] == ["wo", "wgu_folded", "wqkv_folded"]


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_prefetching_decoder_matches_the_numpy_model(schedule):
    weights = M.random_weights(CFG, seed=5)
    B, L, S = 3, 5, 8
    tokens = np.random.default_rng(7).integers(0, CFG.vocab, B).astype(np.int32)
    arrays = M.numpy_inputs(CFG, weights, tokens, L, S)
    ref = M.reference_step(CFG, arrays, L)
    out = etc.simulate(
        M.build_decoder_graph(CFG), arrays, {"B": B, "L": L, "S": S}, schedule=schedule, num_ctas=4
    )
    got = bf16_to_f32(out["logits"])
    assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
    np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])


@needs_ptxas
@pytest.mark.parametrize("evict_last", [False, True])
def test_prefetch_tile_compiles_one_bulk_prefetch_per_region(evict_last):
    regions = (Region(64, 256), Region(32, 128, eighths=3, layer_offset=1, evict_last=evict_last))
    tile = l2_prefetch(regions, 5, layers=3, block_size=128)
    art = compile_tile(tile, [("A", (3, 64, 256), "bf16"), ("B", (3, 32, 128), "bf16")], (3, 5))
    ptx = art.ptx
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == 2
    assert ptx.count("L2::cache_hint") == int(evict_last)
    assert ptx.count("createpolicy.fractional.L2::evict_last") == int(evict_last)
    # The sizes: a whole run of 8 rows of 256 bf16 (4096 bytes) and 3 rows of 128 (768).
    sizes = set(re.findall(r"mov\.b32\s+%r\d+, (\d+);", ptx))
    assert {"4096", "768"} <= sizes, sizes


@needs_ptxas
@pytest.mark.parametrize("evict_last", [False, True])
def test_prefetch_tile_in_lines_compiles_one_prefetch_per_region(evict_last):
    regions = (Region(64, 256, evict_last=evict_last), Region(32, 128, eighths=3))
    tile = l2_prefetch(regions, 5, layers=3, block_size=128, mode="lines")
    art = compile_tile(tile, [("A", (3, 64, 256), "bf16"), ("B", (3, 32, 128), "bf16")], (3, 5))
    assert art.ptx.count("prefetch.global.L2") == 2
    assert art.ptx.count("prefetch.global.L2::evict_last") == int(evict_last)
    assert "cp.async.bulk" not in art.ptx


@needs_ptxas
def test_llama_with_prefetch_compiles():
    cfg = dataclasses.replace(
        M.LLAMA_3_2_1B, l2_prefetch=(("wo", 8, 0), ("wgu", 4, 0)), batch_buckets=()
    )
    art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg, "static"))
    assert art.cubin is not None
    assert art.ptx.count("cp.async.bulk.prefetch.L2.global") >= 2

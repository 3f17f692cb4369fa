"""The decoder projections on the gemv core (``layer_gemm(core="gemv")``,
``etc.tiles.gemv_layer``), one row a tile on CUDA cores and 8 or 16 on
``mma.sync``: every weight byte of a block copied exactly once over the
CTA's threads (each thread's copies traced through the generated MLIR, with
and without the ring prefetch), the options it refuses, PTX that ptxas
accepts for every epilogue, and the decoder on it in the simulator and
compiled under both schedules."""

from __future__ import annotations

import collections
import dataclasses
import re

import pytest
from gemm_helpers import compile_tile, needs_bindings, needs_ptxas, sm90a_ptxas
from mlir_addresses import Evaluator, copy_sources, functions
from unit_helpers import check_decoder_step

import etc
from etc.models import llama as M
from etc.tiles.gemm import layer_gemm

pytestmark = needs_bindings

W_BASE = 1 << 40


def _tile(epilogue: str, block_n: int, n: int, k: int, block_m: int = 1, **options):
    return layer_gemm(
        block_m, block_n, n, k, layers=3, epilogue=epilogue, core="gemv", columns_first=True,
        name=f"g_{epilogue}", **options,
    )  # fmt: skip


def _copied(tile, l: int, j: int, part: str, rows: int = 1 << 20) -> collections.Counter:  # noqa: E741
    """Byte offsets (from W's base) of every 16-byte copy of tile (l, j, 0)
    over its threads, ``rows`` rows in ``A``: the body alone, or the
    prefetch then the body."""
    bodies = functions(tile.source)
    names = [tile.name] if part == "body" else [tile.prefetch, tile.name]
    got: collections.Counter = collections.Counter()
    for tid in range(tile.block_size):
        for name in names:
            coords = {"%l": l, "%j": j, "%i": 0, "tid": tid}
            ev = Evaluator(bodies[name], coords, {"%W": W_BASE}, dim=lambda m, a: rows)
            got.update(a - W_BASE for a in copy_sources(bodies[name], ev) if a >= W_BASE)
    return got


def _block_bytes(rows: list[int], k: int, layer: int, rows_per_layer: int) -> collections.Counter:
    return collections.Counter(
        ((layer * rows_per_layer + r) * k + c) * 2 for r in rows for c in range(0, k, 8)
    )


@pytest.mark.parametrize(
    "epilogue, block_n, n, k, stages, block_m",
    [
        ("store", 16, 3072, 2048, 4, 1),  # qkv: 2 row groups x 4 k slices
        ("residual", 8, 2048, 8192, 8, 1),  # down: 1 row group x 8 k slices, a deep ring
        ("residual", 8, 2048, 2048, 4, 1),  # o_proj
        ("swiglu", 32, 8192, 2048, 4, 1),  # gate/up: gate rows then up rows n further
        # mma.sync, 16 weight rows a warp: 1 row group x 8 k slices; 4 x 2
        ("store", 16, 3072, 2048, 4, 16),
        ("residual", 16, 2048, 8192, 6, 16),
        ("swiglu", 8, 8192, 2048, 4, 16),  # a warp's rows: 8 gate, then 8 up
        ("swiglu", 32, 8192, 2048, 4, 8),
    ],
)
def test_each_weight_byte_of_the_block_is_copied_once(epilogue, block_n, n, k, stages, block_m):
    per_n = 2 if epilogue == "swiglu" else 1
    rows = list(range(block_n * 2, block_n * 3))
    if per_n == 2:
        rows += [n + r for r in rows]
    want = _block_bytes(rows, k, 1, per_n * n)
    plain = _tile(epilogue, block_n, n, k, block_m, stages=stages)
    assert plain.prefetch is None
    assert _copied(plain, 1, 2, "body") == want
    if block_m == 16:  # a tile of at most 8 rows takes the 8-row path
        assert "scf.if" in plain.source and _copied(plain, 1, 2, "body", rows=5) == want
    early = _tile(epilogue, block_n, n, k, block_m, stages=stages, prefetch_ring=True)
    assert early.prefetch == f"{early.name}__prefetch" and early.prefetch_fills_shared
    assert _copied(early, 1, 2, "fill") == want


def test_weights_evict_first_marks_nothing_on_the_gemv_core():
    """The model's flag composes with the core (as on the bulk core): its
    gemv projections carry no L2 hint, which layer_gemm refuses by name."""
    cfg = dataclasses.replace(M.TINY, gemm_core="gemv", weights_evict_first=True)
    for task in M.build_decoder_graph(cfg).tasks:
        assert "cache_hint" not in task.function.source, task.name
    with pytest.raises(
        etc.GraphError, match="tile 'g': l2_evict_first do not apply to core='gemv'"
    ):
        layer_gemm(1, 8, 2048, 2048, layers=2, core="gemv", name="g", l2_evict_first=True)


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(block_m=4), "1 row a tile .* or 8 or 16 .*: block_m=4"),
        (dict(block_m=16), "multiple of 16 rows .16 per warp on mma.sync."),
        (
            dict(block_m=16, block_n=48, block_size=384, sums_out=(2, 1)),
            "block_n=48 must divide 32 or be a",
        ),
        (dict(unroll=2), "unroll do not apply to core='gemv'"),
        (dict(rotate_k=True), "rotate_k do not apply to core='gemv'"),
        (dict(weight_chunk=32), "weight_chunk do not apply to core='gemv'"),
        (dict(l2_evict_first="body"), "l2_evict_first do not apply to core='gemv'"),
        (dict(block_n=12), "multiple of 8 rows"),
        (dict(block_n=24), "warp groups dividing 8"),
        (dict(k=1000), "k=1000 must be a multiple of 512"),
        (dict(stages=1), "stages=1: the ring needs at least 2"),
        (dict(prefetch_ring=4, stages=4), r"prefetch_ring=4: True or 1\.\.3 chunks"),
        (dict(k_splits=2), "need core='tma'"),
    ],
)
def test_refusals_name_the_tile_and_the_option(options, words):
    args = dict(block_m=1, block_n=8, n=2048, k=2048) | options
    shape = [args.pop(key) for key in ("block_m", "block_n", "n", "k")]
    with pytest.raises(etc.GraphError, match=f"tile 'g': .*{words}"):
        layer_gemm(*shape, layers=2, epilogue="residual", core="gemv", name="g", **args)


@needs_ptxas
@pytest.mark.parametrize(
    "epilogue, block_n, k, extra",
    [
        ("store", 16, 2048, dict(row_scale=(2, 0, 1e-5))),
        ("residual", 8, 8192, dict(sums_out=(2, 2))),
        ("swiglu", 32, 2048, dict(row_scale=(2, 1, 1e-5))),
        ("store", 16, 2048, dict(row_scale=(2, 0, 1e-5), block_m=16)),
        ("residual", 16, 8192, dict(sums_out=(2, 2), block_m=16)),
        ("swiglu", 32, 2048, dict(row_scale=(2, 1, 1e-5), block_m=16)),
        ("residual", 16, 2048, dict(sums_out=(2, 1), block_m=8)),
    ],
)
def test_ptx_assembles_without_spills(epilogue, block_n, k, extra, tmp_path):
    n = 2048 if epilogue == "residual" else 4096
    per_n = 2 if epilogue == "swiglu" else 1
    tile = _tile(epilogue, block_n, n, k, stages=4, prefetch_ring=True, **extra)
    tensors = [("A", ("m", k), "bf16")]
    if "row_scale" in extra:
        tensors.append(("R", (8, "m"), "i64"))
    tensors += [("W", (3, per_n * n, k), "bf16"), ("C", ("m", n), "bf16")]
    if "sums_out" in extra:
        tensors.append(("S", (8, "m"), "i64"))
    art = compile_tile(tile, tensors, (3, n // block_n, "m"))
    # The kernel calls the tile (DeviceFunction.called): its own properties.
    assert tile.called and f".func {tile.name}(" in art.ptx
    report = sm90a_ptxas(art.ptx, tmp_path)
    own = re.search(rf"Function properties for {tile.name}\n\s*(.*)", report)
    assert own and "0 bytes spill stores, 0 bytes spill loads" in own.group(1), report


#: The tiny decoder with 16 rows a gemv tile: 16 weight rows a warp, so
#: 32-column qkv and o_proj blocks (k = 256 leaves 4 k slices of a chunk).
TINY_ROWS = dataclasses.replace(
    M.TINY, gemm_core="gemv", gemv_block=16, bn_qkv=32, bn_o=32, bn_down=16
)


def test_decoder_on_the_gemv_core_matches_the_numpy_model():
    """One row a tile, so B = 3 is three row blocks of every projection;
    16 rows, B = 17 is two."""
    cfg = dataclasses.replace(M.TINY, gemm_core="gemv")
    assert cfg.gemm_block("qkv_proj") == cfg.gemm_block("embed") == 1
    for B, L in ((1, 0), (3, 9)):
        check_decoder_step(cfg, B, L)
    assert TINY_ROWS.gemm_block("qkv_proj") == TINY_ROWS.gemm_block("embed") == 16
    for B, L in ((1, 0), (3, 9), (17, 4)):
        check_decoder_step(TINY_ROWS, B, L)
    with pytest.raises(etc.GraphError, match="LlamaConfig: gemv_block must be one of 1, 8, 16"):
        dataclasses.replace(M.TINY, gemv_block=4)


@needs_ptxas
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_decoder_on_the_gemv_core_compiles(schedule):
    cfg = dataclasses.replace(M.TINY, gemm_core="gemv")
    art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg, schedule))
    assert art.cubin is not None
    # No tensor-core instruction left: the sync core's tiles are mma.sync ones.
    assert "mma.sync" not in art.ptx
    sync = etc.compile(M.build_decoder_graph(M.TINY), **M.compile_options(M.TINY, schedule))
    assert "mma.sync" in sync.ptx
    # 16 rows a tile: mma.sync again, the weights as the A operand.
    rows = etc.compile(M.build_decoder_graph(TINY_ROWS), **M.compile_options(TINY_ROWS, schedule))
    assert rows.cubin is not None and "mma.sync" in rows.ptx

"""The decoder projections on the gemv core (``layer_gemm(core="gemv")``,
``etc.tiles.gemv_layer``), one row a tile on CUDA cores and 8 or 16 on
``mma.sync``: every weight byte of a block copied exactly once over the
CTA's threads (each thread's copies traced through the generated MLIR, with
and without the ring prefetch), the options it refuses, PTX that ptxas
accepts for every epilogue, the decoder on it in the simulator and
compiled under both schedules, and the greedy argmax folded into the LM
head's epilogue (``argmax_key``)."""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np
import pytest
from gemm_helpers import compile_tile, needs_bindings, needs_ptxas, rand_bf16, sm90a_ptxas
from mlir_addresses import Evaluator, copy_pairs, copy_sources, functions, weight_loads
from unit_helpers import check_decoder_step

import etc
from etc.dtypes import bf16_to_f32
from etc.models import llama as M
from etc.tiles import llama as T
from etc.tiles.gemm import layer_gemm
from etc.tiles.gemv_layer import argmax_key_reference, argmax_keys

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
        ("residual", 16, 2048, 8192, 4, 32),  # 32 rows: the same ring
        ("swiglu", 32, 8192, 2048, 4, 32),
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


@pytest.mark.parametrize(
    "epilogue, block_n, n, k, stages, block_m, rows",
    [
        ("residual", 16, 2048, 8192, 4, 8, 8),  # down: 1 row group x 8 k slices
        ("swiglu", 32, 8192, 2048, 4, 8, 5),  # gate/up: 4 row groups x 2 slices
        ("store", 128, 4096, 2048, 3, 16, 16),  # LM head: 8 row groups, all of k
        ("store", 128, 4096, 2048, 3, 16, 7),  # the 16-row tile's 8-row path
        ("residual", 16, 2048, 8192, 4, 32, 20),  # 32 rows, 4 8-row blocks
        ("swiglu", 32, 8192, 2048, 4, 32, 32),
    ],
)
def test_whole_line_copies_feed_each_lane_what_its_own_slots_held(
    epilogue, block_n, n, k, stages, block_m, rows
):
    """``whole_lines``: the ring's copies traced through the MLIR for every
    thread. Each warp copy reads 4 whole 128-byte lines; the 8 lanes of a
    quarter warp touch each 16-byte bank group once (copies and reads);
    and, chunk by chunk, the ring word each lane reads for its fragment
    ``f`` holds the bytes the per-lane ring's slot ``f`` held: the two
    tiles feed ``mma.sync`` the same weights."""
    made = {
        lines: _tile(epilogue, block_n, n, k, block_m, stages=stages, whole_lines=lines)
        for lines in (False, True)
    }
    assert "bar.warp.sync" in made[True].source and "bar.warp.sync" not in made[False].source
    traced = {}
    for lines, tile in made.items():
        body = functions(tile.source)[tile.name]
        ring = re.search(r"(%ring_\d+) = memref.get_global @\w+__ring", body).group(1)
        for tid in range(tile.block_size):
            coords = {"%l": 1, "%j": 2, "%i": 0, "tid": tid}
            ev = Evaluator(body, coords, {"%W": W_BASE}, dim=lambda m, a: rows)
            copies = [(d, s - W_BASE) for d, s in copy_pairs(body, ev) if s >= W_BASE]
            reads = [4 * w for w in weight_loads(body, ev, ring, (1 << 30,))]
            traced[lines, tid] = copies, reads
    chunks = len(traced[False, 0][0]) // 4
    slices = 8 * 16 // ((2 if epilogue == "swiglu" else 1) * block_n)  # warps per row group
    assert chunks == k // 64 // slices
    held = {}  # chunk -> ring byte -> weight byte, over the whole-line tile's threads
    for tid in range(256):
        copies, reads = traced[True, tid]
        assert len(copies) == len(reads) == 4 * chunks
        for c in range(chunks):
            held.setdefault(c, {}).update(copies[4 * c : 4 * c + 4])
    for warp in range(8):
        lanes = range(32 * warp, 32 * warp + 32)
        for copy in range(4 * chunks):
            sources = [traced[True, tid][0][copy][1] for tid in lanes]
            lines = collections.Counter(s // 128 for s in sources)
            assert len(lines) == 4 and set(lines.values()) == {8}, (warp, copy)
            for quarter in range(4):
                for side in (0, 1):  # copies' destinations, then reads
                    at = [traced[True, tid][side][copy] for tid in lanes[8 * quarter :][:8]]
                    at = [a[0] if side == 0 else a for a in at]
                    assert len({a // 16 % 8 for a in at}) == 8, (warp, copy, quarter, side)
    for tid in range(256):
        copies, _ = traced[False, tid]
        _, reads = traced[True, tid]
        for c in range(chunks):
            for f in range(4):
                assert held[c][reads[4 * c + f]] == copies[4 * c + f][1], (tid, c, f)


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
        (dict(block_m=4), "1 row a tile .* or 8, 16, 32 or 64 .*: block_m=4"),
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
        (dict(whole_lines=True), "whole_lines applies to block_m 8 to 64"),
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
        ("residual", 16, 8192, dict(sums_out=(2, 2), block_m=8, whole_lines=True)),
        ("swiglu", 32, 2048, dict(row_scale=(2, 1, 1e-5), block_m=16, whole_lines=True)),
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


@needs_ptxas
@pytest.mark.parametrize(
    "epilogue, block_n, n, k, extra",
    [
        ("store", 16, 3072, 2048, dict(row_scale=(2, 0, 1e-5))),  # qkv
        ("residual", 16, 2048, 2048, dict(sums_out=(2, 1))),  # o_proj
        ("swiglu", 32, 8192, 2048, dict(row_scale=(2, 1, 1e-5))),  # gate/up
        ("residual", 16, 2048, 8192, dict(sums_out=(2, 2))),  # down
        ("store", 64, 4096, 2048, dict(row_scale=(2, 1, 1e-5))),  # the LM head's blocks
    ],
)
def test_32_row_tiles_fit_two_ctas_an_sm_without_spills(epilogue, block_n, n, k, extra, tmp_path):
    """The Llama-3.2-1B projections in 32-row tiles, compiled as the
    decoder's kernels are (two CTAs an SM: 128 registers a thread): no
    spills. (Loading the next chunk's activations ahead, as 8 and 16 rows
    do, and the epilogue's inputs before the loop spilled 100-212 bytes.)"""
    per_n = 2 if epilogue == "swiglu" else 1
    tile = _tile(epilogue, block_n, n, k, 32, stages=4, prefetch_ring=True, whole_lines=True,
                 **extra)  # fmt: skip
    g = etc.Graph(f"g_{tile.name}")
    m = g.symbol("m")
    tensors = [g.tensor("A", (m, k), "bf16")]
    if "row_scale" in extra:
        tensors.append(g.tensor("R", (8, m), "i64"))
    tensors += [g.tensor("W", (3, per_n * n, k), "bf16"), g.tensor("C", (m, n), "bf16")]
    if "sums_out" in extra:
        tensors.append(g.tensor("S", (8, m), "i64"))
    g.task(tile, grid=(3, n // block_n, (m + 31) // 32), args=tuple(tensors))
    art = etc.compile(g, schedule="static", min_ctas_per_sm=2)
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
    rows32 = dataclasses.replace(TINY_ROWS, gemv_block=32, gemv_whole_lines=True)
    assert rows32.row_blocks(33) == 2
    for B, L in ((17, 4), (33, 2)):
        check_decoder_step(rows32, B, L)
    # qkv and o_proj in 32-row gemv tiles, the rest in the tma core's 64-row
    # blocks: at B = 70 three row blocks of qkv feed the attention, two of
    # down feed the next layer's qkv.
    mixed = dataclasses.replace(
        M.TINY, gemm_core="tma", bn_qkv=32, bn_o=32, bn_gu=32, bn_down=32, tma_a_box=16,
        k_splits=(("down_proj", 4),), core_overrides=(("qkv_proj", "gemv"), ("o_proj", "gemv")),
        gemv_block=32, gemv_whole_lines=True,
    )  # fmt: skip
    assert [mixed.row_blocks(70, p) for p in ("qkv_proj", "gate_up_proj")] == [3, 2]
    for B, L in ((3, 4), (70, 2)):
        check_decoder_step(mixed, B, L)
    with pytest.raises(etc.GraphError, match="LlamaConfig: gemv_block must be one of 1, 8, 16, 32"):
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
    # ... their weight copies whole lines, shared among a warp's lanes.
    lines = dataclasses.replace(TINY_ROWS, gemv_whole_lines=True)
    art = etc.compile(M.build_decoder_graph(lines), **M.compile_options(lines, schedule))
    assert art.cubin is not None and "bar.warp.sync" in art.ptx and "bar.warp.sync" not in rows.ptx


# -- the argmax folded into the LM head's epilogue ------------------------------------


def first_largest(row: np.ndarray) -> int:
    """torch.argmax's answer ignoring NaNs: the first index of the largest
    value (-0 equal to +0)."""
    values = [float(v) for v in row]
    best = max(v for v in values if v == v)
    return next(i for i, v in enumerate(values) if v == best)


def _special_rows(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    """f32 rows with what orders badly as raw bits: ties, signed zeros,
    -inf, NaNs, all-negative rows."""
    v = rng.standard_normal((rows, width)).astype(np.float32) * np.float32(4.0)
    v[0, [3, 40, width - 1]] = 50.0  # ties: the first wins
    v[1] = -np.abs(v[1]) - 1.0  # every logit negative
    v[1, 17] = -0.5
    v[2] = 0.0
    v[2, 5] = -0.0  # -0 before +0: equal, the lower index wins
    v[2, :5] = -1.0
    v[3] = -np.inf
    v[4, ::3] = np.nan  # NaNs ignored
    v[4, 7] = 90.0
    v[5, 0] = np.nan
    return v


def test_argmax_keys_order_as_the_first_largest_logit():
    rng = np.random.default_rng(3)
    v = _special_rows(rng, 7, 96)
    for first in (0, 1 << 16):
        keys = argmax_keys(v, first).view(np.uint64)
        tokens = argmax_key_reference(keys.max(axis=1).view(np.int64))
        assert tokens.tolist() == [first + first_largest(r) for r in v]
    assert argmax_keys(v, 0)[2, 5] == argmax_keys(v, 0)[2, 6] + 1  # -0 keyed as +0
    assert (argmax_keys(v[4:5, ::3], 0) == 0).all()  # NaN: no key
    assert argmax_key_reference(np.zeros(1, np.int64)).tolist() == [0]


@pytest.mark.parametrize("columns_first, block_m, block_n", [(False, 1, 64), (True, 1, 64),
                                                            (True, 8, 128), (False, 16, 16)])  # fmt: skip
def test_lm_head_tiles_leave_the_rows_first_largest_key_in_any_order(
    columns_first, block_m, block_n
):
    """The tile's numpy model: its logits as the plain store tile's, and the
    atomic maxima of its blocks' keys (run here in a shuffled order) name
    the first largest logit of each row; argmax_take reads the token and
    zeroes the key for the next step."""
    rng = np.random.default_rng(9)
    M_, n, k, bn = 3 if block_m == 1 else 19, 512, 512, block_n
    tile = layer_gemm(
        block_m, bn, n, k, layers=None, epilogue="store", core="gemv", name="lm",
        columns_first=columns_first, argmax_key=True,
    )  # fmt: skip
    assert tile.params[-1] == "memref<?xi64>"
    A, W = rand_bf16(rng, M_, k), rand_bf16(rng, n, k)
    W[[11, 300]] = W[200]  # equal rows: tied logits across blocks
    C, keys = np.zeros((M_, n), np.uint16), np.zeros(M_, np.int64)
    blocks = [(i, j) for i in range(-(-M_ // block_m)) for j in range(n // bn)]
    for i, j in rng.permutation(blocks).tolist():
        tile.reference(*((j, i) if columns_first else (i, j)), A, W, C, keys)
    plain = np.zeros_like(C)
    store = layer_gemm(block_m, bn, n, k, layers=None, epilogue="store", core="gemv", name="lm")
    for i, j in blocks:
        store.reference(i, j, A, W, plain)
    np.testing.assert_array_equal(C, plain)
    out = np.full(M_, -1, np.int32)
    take = T.argmax_take()
    for b in range(M_):
        take.reference(b, keys, out)
    assert out.tolist() == [first_largest(bf16_to_f32(r)) for r in C]
    assert (keys == 0).all()


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(epilogue="residual"), "needs epilogue='store' .got 'residual'."),
        (
            dict(block_m=16, block_n=48, block_size=384),
            "over 16 rows, block_n dividing 32 .*got 48",
        ),
        (dict(core="sync"), "argmax_key needs core='gemv'"),
    ],
)
def test_argmax_key_refusals_name_the_tile(options, words):
    args = dict(block_m=1, block_n=64, epilogue="store", core="gemv") | options
    with pytest.raises(etc.GraphError, match=f"tile 'lm': .*{words}"):
        layer_gemm(args.pop("block_m"), args.pop("block_n"), 768, 512, layers=None, name="lm",
                   argmax_key=True, **args)  # fmt: skip


@needs_ptxas
@pytest.mark.parametrize("block_m, block_n, outputs", [(1, 64, 1), (8, 128, 4)])
def test_argmax_key_epilogue_assembles_with_one_atomic_maximum_a_warp(
    block_m, block_n, outputs, tmp_path
):
    """The LM head's blocks (B = 1's 64 columns, B = 2..8's 8 rows by 128 of
    k = 2048, the norm folded): for each of a thread's ``outputs`` the keys'
    butterfly over the row's lanes and a relaxed atomic maximum, no fence,
    no spills."""

    def tile_ptx(fold: bool):
        tile = layer_gemm(
            block_m, block_n, 4096, 2048, layers=None, epilogue="store", core="gemv", name="lm",
            stages=8 if block_m == 1 else 4, prefetch_ring=True, row_scale=(0, 2, 1e-5),
            argmax_key=fold,
        )  # fmt: skip
        tensors = [("A", ("m", 2048), "bf16"), ("R", (3, "m"), "i64"),
                   ("W", (4096, 2048), "bf16"), ("C", ("m", 4096), "bf16")]  # fmt: skip
        grid = ("m", 4096 // block_n)
        art = compile_tile(tile, tensors + [("K", ("m",), "i64")] * fold, grid)
        body = art.ptx[art.ptx.index(f".func {tile.name}(") :]
        return tile, art, body[: body.index("\n}")]

    tile, art, body = tile_ptx(True)
    plain = tile_ptx(False)[2]
    assert body.count("atom.max.u64") == outputs and "fence" not in body
    assert "atom" not in plain
    # The keys' butterflies: 5 steps of two words each, beside the sums'.
    shuffles = body.count("shfl.sync.bfly.b32") - plain.count("shfl.sync.bfly.b32")
    assert shuffles == 10 * outputs
    report = sm90a_ptxas(art.ptx, tmp_path)
    own = re.search(rf"Function properties for {tile.name}\n\s*(.*)", report)
    assert own and "0 bytes spill stores, 0 bytes spill loads" in own.group(1), report


def test_decoder_with_the_argmax_folded_matches_the_numpy_model():
    cfg = dataclasses.replace(M.TINY, gemm_core="gemv", argmax_fused=True)
    graph = M.build_decoder_graph(cfg)
    assert [t.name for t in graph.tasks][-2:] == ["lm_head", "argmax"]
    for B, L in ((1, 0), (3, 9)):
        check_decoder_step(cfg, B, L)
    rows = dataclasses.replace(TINY_ROWS, argmax_fused=True)  # 16 rows a tile
    for B, L in ((3, 9), (17, 4)):
        check_decoder_step(rows, B, L)
    # Two steps over the same buffers: each leaves the keys at 0.
    weights = M.random_weights(cfg, seed=4)
    arrays = M.numpy_inputs(cfg, weights, np.array([5, 9], np.int32), 6, 9)
    for L in (6, 7):
        ref = M.reference_step(cfg, arrays, L)
        arrays = etc.simulate(graph, arrays, {"B": 2, "L": L, "S": 9}, num_ctas=3)
        np.testing.assert_array_equal(arrays["next_tokens"], ref["next_tokens"])
        assert (arrays["argmax_key"] == 0).all()
        arrays["tokens"] = arrays["next_tokens"].copy()
    # The keys are declared kept zero (the runtime zeroes them after a failed
    # launch), so the simulator refuses a step that starts with one set.
    kept = {t.name for t in graph.tensors if t.kept_zero}
    assert "argmax_key" in kept and kept <= M.KEPT_ZERO
    arrays["argmax_key"][1] = 7
    with pytest.raises(etc.ShapeError, match="tensor 'argmax_key' is kept zero .* at \\(1,\\)"):
        etc.simulate(graph, arrays, {"B": 2, "L": 7, "S": 9})


def test_folded_argmax_buffers_and_refusals():
    """Every kernel of an artifact declares argmax_key once one kernel folds
    its argmax; the fold needs the LM head in one-row gemv tiles."""
    one = (("gemm_core", "gemv"), ("argmax_fused", True))
    cfg = dataclasses.replace(M.TINY, batch_buckets=((1, one), (None, ())))
    kernels = [k for _, _, k in cfg.kernel_configs()]
    assert [k.argmax_fused for k in kernels] == [True, False]
    assert all(k.key_buffer for k in kernels)
    assert "argmax_key" not in M.tensor_shapes(M.TINY, 1, 4, 8)
    shapes = [M.tensor_shapes(k, 1, 4, 8) for k in kernels]
    assert shapes[0] == shapes[1] and shapes[0]["argmax_key"] == ((1,), "i64")
    with pytest.raises(etc.GraphError, match="LlamaConfig: argmax_fused folds .* core 'sync'"):
        dataclasses.replace(M.TINY, argmax_fused=True)
    with pytest.raises(etc.GraphError, match="argmax_keys=False leaves it out"):
        dataclasses.replace(M.TINY, gemm_core="gemv", argmax_fused=True, argmax_keys=False)
    with pytest.raises(etc.GraphError, match="batch bucket B <= 1 changes argmax_keys"):
        dataclasses.replace(M.TINY, batch_buckets=((1, (("argmax_keys", True),)), (None, ())))


@needs_ptxas
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_decoder_with_the_argmax_folded_compiles(schedule):
    cfg = dataclasses.replace(M.TINY, gemm_core="gemv", argmax_fused=True)
    art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg, schedule))
    assert art.cubin is not None
    assert "atom.max.u64" in art.ptx and "exch.b64" in art.ptx

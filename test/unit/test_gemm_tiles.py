"""bf16 tensor-core GEMM tiles (etc.tiles.gemm): references against numpy,
configuration errors, the fragment layout, and PTX that ptxas accepts."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gemm_helpers import (
    DENSE,
    MOE_DN,
    MOE_GU,
    E,
    H,
    I,
    check_config_error,
    check_gemm_reference,
    check_gemm_simulated,
    check_moe_references,
    compile_tile,
    needs_bindings,
    needs_ptxas,
    ptxas_info,
)
from mlir_addresses import Evaluator, copy_sources, functions, weight_loads

import etc
from etc.tiles import gemm as G

# -- references ---------------------------------------------------------------


@pytest.mark.parametrize("M", [1, 16, 37])
def test_gemm_reference(M):
    check_gemm_reference(G.gemm(16, 32, 64), M, 16, 32, 64, 96)


def test_gemm_simulated_graph():
    check_gemm_simulated("dense", G.gemm(16, 32, 64), 16, 32, 64, 20, 64)


@pytest.mark.parametrize("block_m", [16, 64])
@pytest.mark.parametrize("weight_chunk", [0, 32])
def test_moe_references(block_m, weight_chunk):
    check_moe_references(G, block_m, [3, 0, 70, 16], bn_gu=32, bn_dn=64, weight_chunk=weight_chunk)


# -- the chunked weight layout --------------------------------------------------


def test_chunked_weights_keep_groups_and_put_chunks_together():
    rng = np.random.default_rng(1)
    w = rng.integers(0, 1 << 16, (3, 24, 128), dtype=np.uint16)
    for chunk in (8, 64, 128):
        c = G.chunk_weights(w, chunk)
        assert c.shape == w.shape and c.dtype == w.dtype
        np.testing.assert_array_equal(G.unchunk_weights(c, chunk), w)
        flat = c.reshape(3, 3, 8 * 128)  # (expert, 8-row group, its elements)
        for e, g, k in ((0, 0, 0), (2, 1, 128 - chunk), (1, 2, chunk if chunk < 128 else 0)):
            # Chunk k // chunk of a group: its 8 rows' elements, one row after another.
            piece = flat[e, g, 8 * k : 8 * (k + chunk)]
            np.testing.assert_array_equal(piece, w[e, 8 * g : 8 * g + 8, k : k + chunk].ravel())
        # An 8-aligned row range is the same block of memory in both layouts.
        assert sorted(c[1, 8:16].ravel()) == sorted(w[1, 8:16].ravel())
    with pytest.raises(ValueError, match=r"N % 8 == 0.*\(2, 12, 64\)"):
        G.chunk_weights(np.zeros((2, 12, 64), np.uint16), 32)
    with pytest.raises(ValueError, match="weight_chunk=24"):
        G.chunk_weights(np.zeros((16, 64), np.uint16), 24)


@pytest.mark.parametrize(
    "make, words",
    [
        (
            lambda: G.moe_gate_up(16, 32, 256, 128, weight_chunk=12),
            ["'moe_gate_up'", "weight_chunk=12"],
        ),
        (lambda: G.moe_down(16, 64, 256, 128, weight_chunk=48), ["'moe_down'", "k=128"]),
        (lambda: G.moe_down(16, 64, 256, 128, weight_chunk=-8), ["'moe_down'", "weight_chunk"]),
    ],
)
def test_weight_chunk_errors_name_the_tile(make, words):
    check_config_error(make, words)


# -- the fragment layout --------------------------------------------------------


def emulate_warp_mma(a, b):
    """``a @ b.T`` (a: 16 x 32, b: 8 x 32) computed the way the tiles do it:
    lane (g, t) loads 8 contiguous k of rows g, g+8 of A and row g of B,
    packs them into the m16n8k16 registers as the generated code does (A
    regs: words 2j and 2j+1 of rows g and g+8; B regs: words 2j, 2j+1), and
    the mma follows the PTX ISA fragment layout for k step j in {0, 1}."""
    d = np.zeros((16, 8))
    for j in range(2):
        A = np.zeros((16, 16))
        B = np.zeros((16, 8))  # B[k, n]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            ra, rb, wb = (
                a[g, 8 * t : 8 * t + 8],
                a[g + 8, 8 * t : 8 * t + 8],
                b[g, 8 * t : 8 * t + 8],
            )

            def word(v, w):
                return v[2 * w : 2 * w + 2]

            # PTX: a0,a1 (row g, k 2t..2t+1), a2,a3 (row g+8), a4,a5 (row g,
            # k 2t+8..), a6,a7 (row g+8, k 2t+8..); b0,b1 (k 2t..), b2,b3 (k 2t+8..).
            regs_a = [word(ra, 2 * j), word(rb, 2 * j), word(ra, 2 * j + 1), word(rb, 2 * j + 1)]
            A[g, 2 * t : 2 * t + 2] = regs_a[0]
            A[g + 8, 2 * t : 2 * t + 2] = regs_a[1]
            A[g, 2 * t + 8 : 2 * t + 10] = regs_a[2]
            A[g + 8, 2 * t + 8 : 2 * t + 10] = regs_a[3]
            B[2 * t : 2 * t + 2, g] = word(wb, 2 * j)
            B[2 * t + 8 : 2 * t + 10, g] = word(wb, 2 * j + 1)
        d += A @ B
    return d


def test_permuted_fragments_compute_the_product():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 32)), rng.standard_normal((8, 32))
    assert np.allclose(emulate_warp_mma(a, b), a @ b.T)


# -- configuration errors ---------------------------------------------------------


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: G.gemm(8, 32, 64), ["'gemm'", "block_m"]),
        (lambda: G.gemm(16, 12, 64), ["'gemm'", "block_n"]),
        (lambda: G.gemm(16, 32, 48), ["'gemm'", "k=48"]),
        (lambda: G.gemm(16, 32, 64, block_size=100), ["'gemm'", "block_size"]),
        (lambda: G.gemm(16, 32, 64, warps=(1, 2, 2)), ["'gemm'", "warps"]),
        (lambda: G.gemm(16, 32, 64, unroll=3), ["'gemm'", "unroll"]),
        (lambda: G.gemm(0, 32, 64), ["'gemm'", "positive"]),
        (lambda: G.moe_gate_up(16, 48, 256, 128), ["'moe_gate_up'", "inter=128"]),
        (lambda: G.moe_down(16, 96, 256, 128), ["'moe_down'", "hidden=256"]),
        (lambda: G.moe_down(16, 32, 256, 128, experts=0), ["'moe_down'", "experts"]),
        (lambda: G.moe_gate_up(16, 32, 2048, 768, name="gu", unroll=5), ["'gu'", "unroll"]),
    ],
)
def test_config_errors_name_the_tile(make, words):
    check_config_error(make, words)


def test_default_warp_plans():
    # decode: gate/up 16x32 splits k over 2 warp slices; prefill reuses weights.
    assert G.plan_warps("t", 16, 32, 2048, 256, b_per_n=2) == (1, 4, 2, 4)
    assert G.plan_warps("t", 16, 64, 768, 256) == (1, 8, 1, 4)
    assert G.plan_warps("t", 64, 64, 2048, 256, b_per_n=2) == (1, 8, 1, 1)


# -- compilation ----------------------------------------------------------------------


def check_ptx(artifact, mmas):
    ptx = artifact.ptx
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") >= mmas
    assert "ld.global.v4" in ptx
    assert artifact.cubin is not None


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n", [(16, 64), (64, 64)])
def test_gemm_compiles(block_m, block_n, tmp_path):
    tile = G.gemm(block_m, block_n, 256)
    art = compile_tile(tile, DENSE, ("m", "n"))
    check_ptx(art, 4)
    assert set(ptxas_info(art.ptx, tmp_path)[0]) == {0}


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n", [(16, 32), (64, 64)])
def test_moe_gate_up_compiles(block_m, block_n, tmp_path):
    # Triggered in the MoE graph; a plain rank-2 grid (i, e) compiles the same body.
    tile = G.moe_gate_up(block_m, block_n, H, I, experts=E)
    art = compile_tile(tile, MOE_GU, ("m", E))
    check_ptx(art, 4)
    assert set(ptxas_info(art.ptx, tmp_path)[0]) == {0}
    if block_m == 16:  # split-K over 2 warp slices: a workgroup buffer named after the tile
        assert "moe_gate_up__partials" in tile.source


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n", [(16, 64), (64, 64), (16, 32)])
def test_moe_down_compiles(block_m, block_n, tmp_path):
    tile = G.moe_down(block_m, block_n, H, I, experts=E)
    art = compile_tile(tile, MOE_DN, ("m", E))
    check_ptx(art, 4)
    assert set(ptxas_info(art.ptx, tmp_path)[0]) == {0}


# -- pipelining options ------------------------------------------------------------


def test_pipeline_option_errors():
    with pytest.raises(etc.GraphError, match="prefetch"):
        G.moe_down(16, 64, 256, 128, unroll=4, prefetch=1)  # one k iteration
    with pytest.raises(etc.GraphError, match="not both"):
        G.moe_down(16, 64, 256, 128, unroll=1, prefetch=1, stages=2)
    # Past 47 KiB the ring is dynamic shared memory; past what a CTA can have, an error.
    assert G.moe_gate_up(16, 16, 2048, 768, warps=(1, 1, 8), unroll=1, stages=4)
    with pytest.raises(etc.GraphError, match="what an sm_90 CTA can have"):
        G.plan_stages("t", 8192, 1, 1, 16, 256, stages=4)
    assert G.plan_prefetch("t", 16, 2048, 2, 4) == 0
    assert G.plan_stages("t", 2048, 4, 1, 2, 256) == 0


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize(
    "kw",
    [
        {"unroll": 1, "prefetch": 1},
        {"unroll": 1, "stages": 3},
        {"unroll": 1, "prefetch": 1, "weight_chunk": 32},
        {"unroll": 1, "stages": 3, "weight_chunk": 64, "rotate_k": True, "prefetch_ring": True},
        {"unroll": 2, "stages": 2, "weight_chunk": 32, "block_size": 64, "warps": (1, 2, 1)},
        {"unroll": 1, "stages": 3, "weight_chunk": 32, "bulk_ring": True, "prefetch_ring": True},
    ],
)
def test_moe_pipelined_compiles(kw):
    gu = G.moe_gate_up(16, 16, H, I, experts=E, **kw)
    art = compile_tile(gu, MOE_GU, ("m", E))
    check_ptx(art, 4)
    dn = G.moe_down(16, 32, H, I, experts=E, **kw)
    art = compile_tile(dn, MOE_DN, ("m", E))
    check_ptx(art, 4)
    if kw.get("bulk_ring"):  # one bulk copy per warp and fragment, counted on mbarriers
        assert "cp.async.bulk.shared::cluster.global" in art.ptx and "moe_down__bars" in dn.source
    elif "stages" in kw:
        assert "cp.async.cg.shared.global" in art.ptx and "moe_down__ring" in dn.source


# -- chunked weights: the generated addresses ------------------------------------

W_BASE = 1 << 40  # the weights' base address in the evaluated chains


def _chunked_offset(byte: int, k: int, chunk: int) -> int:
    """Where the row layout's byte ``byte`` of a ``(..., N, K)`` bf16 weight
    lies in the ``weight_chunk=chunk`` layout."""
    x, rest = divmod(byte, 2)
    row, col = divmod(x, k)
    group, r8 = divmod(row, 8)
    at = group * 8 * k + (col // chunk) * 8 * chunk + r8 * chunk + col % chunk
    return 2 * at + rest


def _weight_addresses(tile, func, weight, coords, expert, block_size, dims=None):
    """Every weight address ``func`` of ``tile`` reads, thread by thread, in
    program order: ``cp.async`` sources (offsets from the base), or with
    ``dims`` the element offsets of its ``vector.load``s."""
    body = functions(tile.source)[func]
    out = []
    for tid in range(block_size):
        ev = Evaluator(body, {**coords, "tid": tid}, {weight: W_BASE}, load=lambda m, i: expert)
        if dims is None:
            out += [a - W_BASE for a in copy_sources(body, ev) if a >= W_BASE]
        else:
            out += weight_loads(body, ev, weight, dims)
    return out


def _compare_chunked(plain, chunked, weight, cases, k, chunk, dims):
    """Over every function of the tiles and every ``(coords, expert)`` case:
    the chunked tile reads, in order, the plain tile's addresses moved to
    the chunked layout. Returns how many addresses were compared."""
    checked = 0
    for func in functions(plain.source):
        for coords, expert in cases:
            a = _weight_addresses(plain, func, weight, coords, expert, 256, dims)
            b = _weight_addresses(chunked, func, weight, coords, expert, 256, dims)
            assert len(a) == len(b)  # (a ring the prefetch fills leaves the body none)
            if dims is None:
                assert b == [_chunked_offset(x, k, chunk) for x in a]
            else:  # element offsets
                assert b == [_chunked_offset(2 * x, k, chunk) // 2 for x in a]
            checked += len(a)
    return checked


@pytest.mark.parametrize(
    "kind, options, chunk",
    [
        ("gate_up", dict(stages=3, unroll=1, rotate_k=True), 64),
        ("gate_up", dict(stages=2, unroll=2, warps=(1, 2, 4)), 32),
        ("down", dict(stages=3, unroll=1, prefetch_ring=True), 32),
        ("down", dict(stages=2, unroll=2, rotate_k=True), 128),
        ("gate_up", dict(unroll=1), 64),  # the register loop: vector.load
        ("down", dict(unroll=1, prefetch=1), 32),
    ],
)
def test_chunked_tiles_read_the_row_layout_s_elements_where_they_moved(kind, options, chunk):
    """The slot tiles with ``weight_chunk`` copy, thread by thread and in
    the same order, exactly the bytes the row-layout tile copies, each at
    its place in the chunked layout (the generated MLIR's address chains
    evaluated on the CPU: ring copies, the ring's fill in the prefetch
    function, and the register loop's loads)."""
    make = G.moe_gate_up if kind == "gate_up" else G.moe_down
    k, n = (256, 2 * 128) if kind == "gate_up" else (128, 256)
    rows_per_expert = n
    plain = make(16, 32, 256, 128, experts=E, slots=2, **options)
    chunked = make(16, 32, 256, 128, experts=E, slots=2, weight_chunk=chunk, **options)
    weight = "%Wgu" if kind == "gate_up" else "%Wd"
    dims = None if options.get("stages") else (E, rows_per_expert, k)
    cases = [({"%s": 0, "%j": 0}, 0), ({"%s": 3, "%j": 1}, 2), ({"%s": 5, "%j": 3}, 1)]
    assert _compare_chunked(plain, chunked, weight, cases, k, chunk, dims)


@pytest.mark.parametrize(
    "kind, block_n", [("gate_up", 32), ("down", 64), ("gate_up", 24), ("down", 48)]
)
@pytest.mark.parametrize("chunk", [0, 32, 64, 128])
def test_gemv_slot_tiles_copy_whole_lines_of_their_rows(kind, block_n, chunk):
    """``etc.tiles.gemv``'s slot tiles, their MLIR's address chains
    evaluated on the CPU: thread ``tid`` copies, chunk after chunk, the
    16-byte piece ``tid % 8`` of its two rows (gate and up row ``tid // 8``
    of the block, or the down block's two halves), and with chunked
    weights each such piece where it moved; every warp copy is 4 rows x
    128 contiguous row-layout bytes, and together the threads copy the
    block's rows once each (the prefetch function's ring fill included)."""
    from etc.tiles import gemv

    make = gemv.moe_gate_up if kind == "gate_up" else gemv.moe_down
    inter = 96 if block_n == 24 else 128
    hidden = 256 if kind == "gate_up" else 192
    k, rows_per_expert = (hidden, 2 * inter) if kind == "gate_up" else (inter, hidden)
    options = dict(stages=3) if kind == "gate_up" else dict(stages=2, prefetch_ring=True)
    tile = make(16, block_n, hidden, inter, experts=E, slots=2, weight_chunk=chunk, **options)
    weight = "%Wgu" if kind == "gate_up" else "%Wd"
    expert, j = 2, 1
    copies = {}
    for func in functions(tile.source):  # the body (and the down tile's ring fill)
        for tid in range(256):
            copies.setdefault(tid, [])
            copies[tid] += _weight_addresses_of(tile, func, weight, j, expert, tid)
    n0 = j * block_n
    second = inter if kind == "gate_up" else block_n // 2
    active = 8 * (block_n if kind == "gate_up" else block_n // 2)
    seen = []
    if active < 256:  # whole warps past the block's rows skip the copies (and sums)
        assert f"%c{active}_ : index\n" in tile.source and "scf.if %busy" in tile.source
    for tid, got in copies.items():
        if tid >= active:  # (the evaluator does not follow the scf.if)
            continue
        rows = [expert * rows_per_expert + n0 + tid // 8 + h * second for h in (0, 1)]
        want = [
            2 * (row * k + 64 * c + 8 * (tid % 8)) for c in range(k // 64) for row in rows
        ]  # the row layout's bytes, chunk by chunk
        if chunk:
            want = [_chunked_offset(x, k, chunk) for x in want]
        assert sorted(got) == sorted(want), tid
        seen += want
    assert len(seen) == len(set(seen)) == 2 * (block_n if kind == "down" else 2 * block_n) * k // 16


def _weight_addresses_of(tile, func, weight, j, expert, tid):
    body = functions(tile.source)[func]
    ev = Evaluator(body, {"%s": 1, "%j": j, "tid": tid}, {weight: W_BASE}, load=lambda m, i: expert)
    return [a - W_BASE for a in copy_sources(body, ev) if a >= W_BASE]


def test_the_address_evaluator_sees_the_row_layout():
    """The evaluator itself: the row-layout slot tile's copies are its
    weight block's rows, 16 bytes each, every one once (so the comparison
    above compares real addresses)."""
    tile = G.moe_down(16, 32, 256, 128, experts=E, slots=2, stages=2, unroll=1)
    a = _weight_addresses(tile, tile.name, "%Wd", {"%s": 1, "%j": 2}, 3, 256)
    k = 128
    first = 2 * (3 * 256 * k + 2 * 32 * k)  # expert 3, column block 2
    assert sorted(a) == list(range(first, first + 2 * 32 * k, 16))


@pytest.mark.parametrize(
    "epilogue, options, chunk",
    [
        ("swiglu", dict(stages=3, unroll=1, prefetch_ring=True, rotate_k=True), 64),
        ("residual", dict(stages=2, unroll=2), 32),
        ("store", dict(unroll=1), 64),  # the register loop
    ],
)
def test_chunked_layer_gemm_reads_the_row_layout_s_elements_where_they_moved(
    epilogue, options, chunk
):
    """:func:`layer_gemm` (the decoder's projections) as the slot tiles above."""
    n, k, layers = 64, 256, 3
    per = 2 if epilogue == "swiglu" else 1
    plain = G.layer_gemm(16, 16, n, k, layers=layers, epilogue=epilogue, **options)
    chunked = G.layer_gemm(
        16, 16, n, k, layers=layers, epilogue=epilogue, weight_chunk=chunk, **options
    )
    dims = None if options.get("stages") else (layers, per * n, k)
    cases = [({"%l": 0, "%i": 0, "%j": 0}, 0), ({"%l": 2, "%i": 1, "%j": 3}, 0)]
    assert _compare_chunked(plain, chunked, "%W", cases, k, chunk, dims)


@pytest.mark.parametrize(
    "kind, options",
    [
        ("gate_up", dict(stages=3, unroll=2, rotate_k=True)),
        ("down", dict(stages=3, unroll=1, prefetch_ring=True)),
    ],
)
def test_bulk_ring_copies_each_warp_s_pieces_in_lane_order(kind, options):
    """``bulk_ring``: lane 0 of each warp copies, per fragment and stage,
    the ``unroll`` 512-byte pieces whose 16-byte parts the per-thread ring's
    32 lanes copy, in the same order (the address chains evaluated on the
    CPU, the ring's fill in the prefetch function included)."""
    from mlir_addresses import tma_copies

    make = G.moe_gate_up if kind == "gate_up" else G.moe_down
    opts = dict(experts=E, slots=2, weight_chunk=32, **options)
    lanes = make(16, 32, 512, 256, **opts)  # k = 512 or 256: several loop iterations
    bulk = make(16, 32, 512, 256, bulk_ring=True, **opts)
    weight = "%Wgu" if kind == "gate_up" else "%Wd"
    unroll = options["unroll"]
    coords = {"%s": 3, "%j": 1}
    checked = 0
    for func in functions(lanes.source):
        body_l, body_b = functions(lanes.source)[func], functions(bulk.source)[func]
        for warp in range(8):
            per_lane = []
            for lane in range(32):
                ev = Evaluator(
                    body_l,
                    {**coords, "tid": 32 * warp + lane},
                    {weight: W_BASE},
                    load=lambda m, i: 2,
                )
                per_lane.append([a for a in copy_sources(body_l, ev) if a >= W_BASE])
            ev = Evaluator(
                body_b, {**coords, "tid": 32 * warp}, {weight: W_BASE}, load=lambda m, i: 2
            )
            copies = [ops for _, ops in tma_copies(body_b, ev, tensor=False)]
            assert all(size == unroll * 512 for _, _, size, _ in copies)
            nf = int(re.search(r"\d+x(\d+) fragments", lanes.source).group(1))
            nb = nf * (2 if kind == "gate_up" else 1)  # weight fragments per warp
            assert len(copies) == len(per_lane[0]) // unroll  # one per (issue, fragment)
            issues = len(copies) // nb
            for i in range(issues):
                for f in range(nb):
                    src = copies[i * nb + f][1]
                    for u in range(unroll):
                        for lane in range(32):
                            assert (
                                per_lane[lane][(i * unroll + u) * nb + f]
                                == src + u * 512 + 16 * lane
                            )
                            checked += 1
    assert checked
    if "prefetch_ring" not in options:  # copies and reads in one function: match them
        body = functions(bulk.source)[bulk.name]
        ring = re.search(r"(%\w+) = memref.get_global @\w+__ring", body).group(1)
        size = int(re.search(r"__ring : memref<(\d+)xi32", bulk.source).group(1))
        for warp in (0, 5):
            ev = Evaluator(
                body, {**coords, "tid": 32 * warp}, {weight: W_BASE}, load=lambda m, i: 2
            )
            dsts = [ops[0] for _, ops in tma_copies(body, ev, tensor=False)]
            for lane in (0, 7, 31):
                ev = Evaluator(
                    body, {**coords, "tid": 32 * warp + lane}, {weight: W_BASE}, load=lambda m, i: 2
                )
                reads = weight_loads(body, ev, ring, (size,))
                assert len(reads) == len(dsts) * unroll
                for j, dst in enumerate(dsts):  # the j-th stage read is the j-th copied
                    i, f = divmod(j, nb)
                    for u in range(unroll):
                        assert 4 * reads[(i * unroll + u) * nb + f] == dst + u * 512 + 16 * lane
    with pytest.raises(etc.GraphError, match="bulk_ring copies a warp's fragment as one piece"):
        make(
            16,
            32,
            256,
            128,
            experts=E,
            slots=2,
            stages=3,
            unroll=1,
            weight_chunk=64,
            bulk_ring=True,
        )


def test_evict_first_marks_every_weight_copy_of_the_ring_and_its_prefetch():
    """``l2_evict_first``: each of the ring's ``cp.async`` weight copies (in
    the body and in the prefetch function that fills the first groups)
    carries the evict-first policy instead of going out unmarked; a tile
    without the ring or on the bulk core refuses it (the tma core's weight
    boxes take it: ``test_gemm_layer_tma``)."""
    options = dict(layers=3, epilogue="swiglu", stages=3, unroll=2, prefetch_ring=True)
    plain = G.layer_gemm(16, 16, 64, 1024, **options)
    marked = G.layer_gemm(16, 16, 64, 1024, l2_evict_first=True, **options)
    assert list(functions(marked.source)) == ["layer_gemm_swiglu", "layer_gemm_swiglu__prefetch"]
    for func, text in functions(plain.source).items():
        copies = text.count("nvvm.cp.async.shared.global")
        other = functions(marked.source)[func]
        assert copies > 0 and other.count("L2::cache_hint [$0], [$1], 16, $2") == copies, func
        assert "nvvm.cp.async.shared.global" not in other
        assert "createpolicy.fractional.L2::evict_first" in other
    with pytest.raises(etc.GraphError, match="l2_evict_first marks the weight ring's cp.async"):
        G.layer_gemm(16, 16, 64, 256, layers=3, unroll=1, l2_evict_first=True)
    with pytest.raises(etc.GraphError, match="l2_evict_first"):
        G.layer_gemm(16, 16, 64, 256, layers=3, core="bulk", l2_evict_first=True)
    # "body": the tile's own copies marked, its prefetch function's text
    # exactly the plain tile's (a kernel inlining it keeps its code).
    body = functions(G.layer_gemm(16, 16, 64, 1024, l2_evict_first="body", **options).source)
    assert (
        body["layer_gemm_swiglu__prefetch"]
        == functions(plain.source)["layer_gemm_swiglu__prefetch"]
    )
    assert body["layer_gemm_swiglu"] == functions(marked.source)["layer_gemm_swiglu"]
    with pytest.raises(etc.GraphError, match="l2_evict_first must be a bool or 'body', got 1"):
        G.layer_gemm(16, 16, 64, 1024, l2_evict_first=1, **options)
    with pytest.raises(etc.GraphError, match="l2_evict_first='body' .* the tma core takes a bool"):
        G.layer_gemm(64, 64, 2048, 2048, layers=2, core="tma", stages=4, l2_evict_first="body")

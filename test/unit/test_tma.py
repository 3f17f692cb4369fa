"""TMA tensor maps end to end without a GPU: ``Graph.tensor_map`` and its checks,
the manifest field, launch binding (maps are never passed), the runtime's map
geometry and cache, the simulator, and the TMA GEMM tiles (references, PTX that
ptxas assembles for sm_90a)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gemm_helpers import (
    DENSE,
    MOE_DN,
    MOE_DN_COMBINE,
    MOE_DN_COMBINE16,
    MOE_GU,
    MOE_GU_GATHER,
    E,
    H,
    I,
    check_gemm_simulated,
    compile_tile,
    have_bindings,
    moe_tables,
    needs_bindings,
    needs_ptxas,
    rand_bf16,
    rel_err,
    sm90a_ptxas,
)
from test_runtime import splitk_manifest, write_artifact

import etc
from etc.dtypes import bf16_to_f32
from etc.errors import GraphError, LaunchError, ShapeError
from etc.runtime import args, manifest, tensormap
from etc.tiles import collective as CT
from etc.tiles import gemm_tc as G

SMEM = 220 << 10


def dense_tma(bm=128, bn=64, k=128, **kw):
    return G.gemm(bm, bn, k, core="tma", block_size=2 * bm, smem_limit=SMEM, **kw)


# -- the graph ------------------------------------------------------------------------


def graph_ab(k=128):
    g = etc.Graph("g")
    m, n = g.symbol("m"), g.symbol("n")
    A, B = g.tensor("A", (m, k), "bf16"), g.tensor("B", (n, k), "bf16")
    C = g.tensor("C", (m, n), "bf16")
    return g, A, B, C


def test_tensor_map_declares_an_i64_table_once():
    g, A, _, _ = graph_ab()
    t = g.tensor_map(A, (128, 64))
    assert (t.name, t.shape, t.dtype.name, t.map_of, t.map_box) == (
        "A_tma128x64",
        (16,),
        "i64",
        A,
        (128, 64),
    )
    assert g.tensor_map(A, (128, 64)) is t
    assert g.tensor_map(A, (64, 64)) is not t


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda g, A, C: g.tensor_map(A, (128, 32)), ["cols=32", "needs 64"]),
        (lambda g, A, C: g.tensor_map(A, (0, 64)), ["rows=0", "1..256"]),
        (lambda g, A, C: g.tensor_map(A, (300, 64)), ["rows=300"]),
        (lambda g, A, C: g.tensor_map(A, 64), ["(rows, cols)"]),
        (lambda g, A, C: g.tensor_map(g.tensor("v", (8,), "bf16"), (8, 64)), ["rank 1"]),
        (lambda g, A, C: g.tensor_map(g.tensor("o", (4, 12), "bf16"), (4, 64)), ["24 bytes"]),
        (lambda g, A, C: g.tensor_map(g.tensor_map(A, (8, 64)), (8, 8)), ["derived table"]),
        (lambda g, A, C: g.tensor_map(etc.Graph("h").tensor("x", (8, 64), "bf16"), (8, 64)), ["not a tensor of graph"]),
    ],
)  # fmt: skip
def test_tensor_map_errors_name_the_culprit(make, words):
    g, A, _, C = graph_ab()
    with pytest.raises(GraphError) as err:
        make(g, A, C)
    for word in words:
        assert word in str(err.value)


def test_task_appends_and_checks_maps():
    tile = dense_tma()
    assert tile.tensor_maps == {3: (0, (128, 64)), 4: (1, (64, 64))}
    g, A, B, C = graph_ab()
    task = g.task(tile, grid=(1, 1), args=(A, B, C))
    assert [a.name for a in task.args] == ["A", "B", "C", "A_tma128x64", "B_tma64x64"]
    # Explicit maps must be the right source and box.
    g.task(tile, grid=(1, 1), args=(A, B, C, g.tensor_map(A, (128, 64)), g.tensor_map(B, (64, 64))))
    with pytest.raises(GraphError, match=r"must be graph.tensor_map\(A, box=\(128, 64\)\)"):
        g.task(
            tile, grid=(1, 1), args=(A, B, C, g.tensor_map(B, (128, 64)), g.tensor_map(B, (64, 64)))
        )
    plain16 = g.tensor("T16", (16,), "i64")
    with pytest.raises(GraphError, match="got tensor 'T16'$"):
        g.task(tile, grid=(1, 1), args=(A, B, C, plain16, g.tensor_map(B, (64, 64))))
    # A map where a tile reads no map.
    plain = etc.DeviceFunction.from_mlir(
        "func.func @table(%i: index, %t: memref<16xi64>) { return }", "table"
    )
    with pytest.raises(GraphError, match="does not read buffer #0 through TMA"):
        g.task(plain, grid=(1,), args=(g.tensor_map(A, (64, 64)),))


@needs_bindings
def test_compiled_manifest_records_maps(tmp_path: Path):
    g, A, B, C = graph_ab()
    g.task(dense_tma(), grid=(2, 3), args=(A, B, C))
    etc.compile(g, target="sm_90a").save(tmp_path / "art")
    m = manifest.load_manifest(tmp_path / "art")
    assert m.tensor("A_tma128x64").tensor_map == ("A", (128, 64), 0)
    assert m.tensor("B_tma64x64").tensor_map == ("B", (64, 64), 0)
    assert [t.name for t in m.inputs] == ["A", "B", "C"]


# -- manifest and launch binding ----------------------------------------------------------


def mapped_manifest() -> dict:
    data = splitk_manifest()
    data["tensors"][0]["dtype"] = "bf16"
    data["tensors"].append(
        {
            "name": "A_map",
            "shape": [16],
            "dtype": "i64",
            "tensor_map": {"source": "A", "box": [64, 64]},
        }
    )
    data["params"].insert(4, {"kind": "tensor", "name": "A_map", "rank": 1})
    return data


def test_manifest_tensor_map_round_trip(tmp_path: Path):
    m = manifest.load_manifest(write_artifact(tmp_path, mapped_manifest()))
    assert m.tensor("A_map").tensor_map == ("A", (64, 64), 0)
    assert [t.name for t in m.inputs] == ["A", "B", "C"]
    shapes = args.bound_shapes(m, {"n": 3})
    given = {"A": np.zeros((3, 256), np.uint16), "B": np.zeros((3, 4), np.float32)}
    given["C"] = np.zeros(3, np.float32)
    assert [b.name for b in args.bind_tensors(m, shapes, given)] == ["A", "B", "C"]
    with pytest.raises(LaunchError, match="'A_map' is a TMA tensor map; the runtime encodes it"):
        args.bind_tensors(m, shapes, {**given, "A_map": np.zeros(16, np.int64)})
    assert args.FastBinder(m, shapes, 0).count == 3


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.update(tensor_map={"source": "Z", "box": [64, 64]}), "source 'Z' is not a buffer"),
        (lambda t: t.update(tensor_map={"source": "C", "box": [64, 64]}), "source 'C' is not a buffer of rank >= 2"),
        (lambda t: t.update(tensor_map={"source": "A", "box": [64]}), "expected [rows, cols]"),
        (lambda t: t.update(shape=[8]), "i64 of shape (16,)"),
        (lambda t: t.update(kept_zero=True), "a tensor map is encoded by the runtime, not kept zero"),
    ],
)  # fmt: skip
def test_manifest_bad_tensor_map(tmp_path: Path, edit, message):
    data = mapped_manifest()
    edit(data["tensors"][-1])
    with pytest.raises(LaunchError) as err:
        manifest.load_manifest(write_artifact(tmp_path, data))
    assert message in str(err.value)


def test_map_geometry():
    dims, strides, box = tensormap.map_geometry("t", (4, 300, 128), "bf16", (128, 64))
    assert (dims, strides, box) == ([128, 1200], [256], [64, 128])
    assert tensormap.map_geometry("t", (0, 128), "bf16", (128, 64)) is None
    with pytest.raises(ShapeError, match="t: rows of 12 bf16 are 24 bytes"):
        tensormap.map_geometry("t", (4, 12), "bf16", (4, 64))
    with pytest.raises(ShapeError, match="do not support dtype i64"):
        tensormap.map_geometry("t", (4, 16), "i64", (4, 16))
    with pytest.raises(ShapeError, match="16-byte aligned address"):
        tensormap.encode("t", 0x1008, (4, 64), "bf16", (4, 64))
    assert tensormap.encode("t", 0x1008, (0, 64), "bf16", (4, 64)) == bytes(128)


class FakeBuffer:
    freed: list[int] = []
    next_ptr = 0x10000

    def __init__(self, nbytes):
        self.ptr = FakeBuffer.next_ptr
        FakeBuffer.next_ptr += 0x100

    def release(self):
        FakeBuffer.freed.append(self.ptr)


def test_map_cache_reuses_and_evicts(tmp_path: Path, monkeypatch):
    m = manifest.load_manifest(write_artifact(tmp_path, mapped_manifest()))
    encoded = []
    monkeypatch.setattr(tensormap, "encode", lambda *a: encoded.append(a) or bytes(128))
    monkeypatch.setattr(tensormap.driver, "DeviceBuffer", FakeBuffer)
    monkeypatch.setattr(tensormap.driver, "htod", lambda *a: None)
    monkeypatch.setattr(tensormap.driver, "synchronize", lambda *a: None)
    monkeypatch.setattr(tensormap.driver, "check", lambda *a: None)
    monkeypatch.setattr(tensormap.driver, "cu", type("cu", (), {"cuCtxSynchronize": lambda: 0}))
    monkeypatch.setattr(tensormap, "MAX_MAPS", 2)
    maps = tensormap.TensorMaps(m)
    shapes = {"A": (3, 256)}
    first = maps.pointers({"A": 0x1000}, shapes, 0)
    assert maps.pointers({"A": 0x1000}, shapes, 0) == first and len(encoded) == 1
    assert encoded[0][1:] == (0x1000, (3, 256), "bf16", (64, 64), 0)
    second = maps.pointers({"A": 0x2000}, shapes, 0)
    assert second != first and maps.generation == 0
    maps.pointers({"A": 0x3000}, shapes, 0)  # evicts the oldest (0x1000's)
    assert maps.generation == 1 and FakeBuffer.freed[-1] == first["A_map"]
    assert len(encoded) == 3


# -- the simulator and the tiles ----------------------------------------------------------------


def test_simulated_dense_tma_tile_and_map_inputs_refused():
    check_gemm_simulated("dense_tma", dense_tma(), 128, 64, 128, 200, 130)
    g, A, B, C = graph_ab()
    g.task(dense_tma(), grid=(2, 3), args=(A, B, C))
    with pytest.raises(ShapeError, match="'A_tma128x64' is a TMA tensor map"):
        etc.simulate(g, {"A_tma128x64": np.zeros(16, np.int64)}, {"m": 1, "n": 1})


def test_moe_tma_references():
    """The TMA MoE tiles compute what the cp.async ones do (their references)."""
    rng = np.random.default_rng(3)
    counts = [3, 0, 170, 64]
    rows = sum(counts)
    Xp = rand_bf16(rng, rows, H)
    Wgu = rand_bf16(rng, E, 2 * I, H, scale=0.1)
    gu = G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM)
    assert gu.tensor_maps == {5: (0, (128, 64)), 6: (1, (64, 64))}
    row_off, indptr = moe_tables(counts, 128, I // 64)
    Hb = np.zeros((rows, I), np.uint16)
    for e in range(E):
        for i in range(int(indptr[-1])):
            gu.reference(i, e, Xp, Wgu, row_off, indptr, Hb, None, None)
    x = bf16_to_f32(Xp)
    for e in range(E):
        r = slice(row_off[e], row_off[e + 1])
        if r.start == r.stop:
            continue
        w = bf16_to_f32(Wgu[e])
        g, u = x[r] @ w[:I].T, x[r] @ w[I:].T
        assert rel_err(bf16_to_f32(Hb[r]), g / (1 + np.exp(-g)) * u) <= 1e-2


def test_gathered_gate_up_tile():
    """gather_topk=K: the gate/up tile reads row r as X[perm[r] // K] through
    every thread's cp.async (no A box, one map: the weights'); its reference
    equals the Xp tile's on the permuted copy."""
    rng = np.random.default_rng(4)
    counts, K = [3, 0, 170, 64], 2
    rows = sum(counts)
    X = rand_bf16(rng, (rows + K - 1) // K, H)
    perm = rng.permutation(rows).astype(np.int32)
    Wgu = rand_bf16(rng, E, 2 * I, H, scale=0.1)
    gu = G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, gather_topk=K)
    copied = G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM)
    assert gu.tensor_maps == {6: (1, (64, 64))}
    assert gu.params[2:8] == copied.params[2:6] + ("memref<?xi32>",) + copied.params[6:7]
    row_off, indptr = moe_tables(counts, 128, I // 64)
    got, want = np.zeros((rows, I), np.uint16), np.zeros((rows, I), np.uint16)
    for e in range(E):
        for i in range(int(indptr[-1])):
            gu.reference(i, e, X, Wgu, row_off, indptr, perm, got, None)
            copied.reference(i, e, X[perm // K], Wgu, row_off, indptr, want)
    np.testing.assert_array_equal(got, want)
    # 3 stages over 4 k-tiles: 3 in the prologue, one refill; 4 copies of 16
    # bytes per thread each, one arrival per thread, and the weights' 2 boxes.
    src = gu.source
    assert src.count("cp.async.cg.shared.global") == 4 * 4
    assert src.count("cp.async.mbarrier.arrive.noinc") == 4
    assert src.count("cp.async.bulk.tensor") == 2 * 4
    assert "mbarrier.init.shared::cta.b64 [$0], 257;" in src
    for kw, words in (
        (dict(split_n=True, block_m=64), "needs core='tma' without split_n"),
        (dict(core="mma", smem_limit=48 << 10, stages=2), "needs core='tma'"),
        (dict(gather_topk=0), "positive top-k"),
        (dict(gather_topk=True), "gather_topk must be an int or None, got True"),
    ):
        args = dict(core="tma", smem_limit=SMEM, gather_topk=K) | kw
        bm = args.pop("block_m", 128)
        with pytest.raises(GraphError, match=words):
            G.moe_gate_up(bm, 64, H, I, experts=E, **args)


def test_gate_up_tile_gathers_rows_by_tma():
    """gather_topk=K with gather_tma: each row of A comes by a one-row TMA box
    of a map of X (declared before the weights'), issued by lanes 0-15 of
    the warp owning the row; lane 0 expects the warp's existing rows' bytes
    (one arrival per warp: 8 + thread 0's), no cp.async and no proxy fence
    in the k loop. The reference is the cp.async gather's."""
    K = 2
    tma = G.moe_gate_up(
        128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, gather_topk=K, gather_tma=True
    )
    plain = G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, gather_topk=K)
    assert tma.tensor_maps == {6: (0, (1, 64)), 7: (1, (64, 64))}
    assert tma.params[:6] == plain.params[:6]
    src = tma.source
    assert "cp.async.cg.shared.global" not in src and "arrive.noinc" not in src
    assert src.count("vote.sync.ballot.b32") == 1
    # 3 stages over 4 k-tiles: 3 prologue issues and one refill, each a row box
    # per lane and the weights' 2 boxes by thread 0.
    assert src.count("cp.async.bulk.tensor.2d") == 4 + 2 * 4
    assert "mbarrier.init.shared::cta.b64 [$0], 9;" in src
    assert (
        src.count("fence.proxy.async.shared::cta;")
        == plain.source.count("fence.proxy.async.shared::cta;") - 1
    )
    with pytest.raises(GraphError, match="gather_tma copies gathered rows .* gathers none"):
        G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, gather_tma=True)


def test_split_and_sub_tiles_loads_and_errors():
    """split_n: a 64-row block whose warpgroups take column halves (each its
    gate rows next to its up rows, wgmma n = b_rows / 2); sub_n: several
    pipeline passes per tile (one TMA box per pass's columns)."""
    gu = G.moe_gate_up(64, 128, H, I, experts=E, core="tma", smem_limit=SMEM, split_n=True)
    assert gu.tensor_maps == {5: (0, (64, 64)), 6: (1, (64, 64))}
    # A and four B boxes (gate, up per warpgroup), in the 3 prologue issues and the refill.
    assert "m64n128k16" in gu.source and gu.source.count("cp.async.bulk.tensor") == 5 * 4
    dn = G.moe_down(128, 256, H, I, experts=E, core="tma", smem_limit=SMEM, sub_n=128)
    assert dn.tensor_maps == {5: (0, (128, 64)), 6: (1, (128, 64))}
    assert "m64n128k16" in dn.source and "scf.for %pass_" in dn.source
    with pytest.raises(GraphError, match="shared by all, split_n"):
        G.moe_down(128, 128, H, I, experts=E, core="tma", smem_limit=SMEM, split_n=True)
    with pytest.raises(GraphError, match="split_n needs core='tma'"):
        G.moe_down(64, 128, H, I, experts=E, split_n=True)
    with pytest.raises(GraphError, match="sub_n=96 must divide block_n=256"):
        G.moe_down(128, 256, H, I, experts=E, core="tma", smem_limit=SMEM, sub_n=96)
    with pytest.raises(GraphError, match="sub_n needs core='tma'"):
        G.moe_down(128, 256, H, I, experts=E, sub_n=128)
    with pytest.raises(GraphError, match=r"per warpgroup \(b_rows=8 over 2\)"):
        G.moe_down(64, 8, H, I, experts=E, core="tma", smem_limit=SMEM, split_n=True)


def test_ring_passes_share_one_ring_and_errors():
    """sub_ring: a tile's sub_n passes run through one ring. Its barriers are
    set up and its first stages loaded once, before the passes (with plain
    sub_n, inside each); the k-tiles are counted over the passes, each pass's
    weight boxes sub_n rows further on; the block is staged through a buffer
    of its own, in parts when only a part fits beside the ring. One pass is
    the plain tile; a gather or short blocks are refused, naming the tile."""

    def lines(tile, *keys):
        src = tile.source.splitlines()
        return [next(i for i, line in enumerate(src) if key in line) for key in keys]

    kw = dict(experts=E, core="tma", smem_limit=SMEM, sub_n=128, refill="test")
    plain, ring = G.moe_down(128, 256, H, I, **kw), G.moe_down(128, 256, H, I, sub_ring=True, **kw)
    init, passes, k_loop = lines(plain, "mbarrier.init", "scf.for %pass_", "scf.for %kt")
    assert passes < init < k_loop
    init, passes, k_loop = lines(ring, "mbarrier.init", "scf.for %pass_", "scf.for %kt")
    assert init < passes < k_loop
    assert "@moe_down_tc__stage : memref<128x128xbf16" in ring.source
    assert "@moe_down_tc__stage" not in plain.source
    # The loads step on sub_n (128) weight rows a pass; the references agree.
    assert "arith.muli" in ring.source and "%c128_" in ring.source
    assert ring.reference is not None
    halves = G.moe_down(
        128, 256, H, I, experts=E, core="tma", smem_limit=150 << 10, stages=4, sub_n=128,
        sub_ring=True, refill="test",
    )  # fmt: skip
    assert "@moe_down_tc__stage : memref<128x64xbf16" in halves.source
    assert halves.source.count("ld.shared.v4.b32") == 2 * ring.source.count("ld.shared.v4.b32")
    one = G.moe_down(128, 128, H, I, **kw, sub_ring=True)
    assert one.source == G.moe_down(128, 128, H, I, **kw).source
    with pytest.raises(GraphError, match="moe_gate_up_tc.*sub_ring .* no gather_topk"):
        G.moe_gate_up(
            128, 128, H, I, experts=E, core="tma", smem_limit=SMEM, gather_topk=2, sub_n=64,
            sub_ring=True,
        )  # fmt: skip
    with pytest.raises(GraphError, match="moe_down_tc.*sub_ring .* or short_blocks"):
        G.moe_down(128, 256, H, I, sub_ring=True, short_blocks=True, **kw)
    # A wait in the refill made ptxas serialize some such tiles' wgmma (C7520).
    with pytest.raises(GraphError, match="moe_down_tc.*refill='test'\\), not refill='wait'"):
        G.moe_down(128, 256, H, I, **{**kw, "refill": "wait"}, sub_ring=True)
    with pytest.raises(GraphError, match="a 16384-byte staging buffer need"):
        G.moe_down(
            128, 256, H, I, experts=E, core="tma", smem_limit=130 << 10, stages=4, sub_n=128,
            sub_ring=True,
        )  # fmt: skip


def test_short_blocks_tiles_loads_and_errors():
    """short_blocks: an expert's only row block, when it has at most 64 rows,
    runs its k loop on the first warpgroup alone. The flag is broadcast from
    lane 0 (a branch ptxas sees as warp-uniform), the second warpgroup yields
    zero accumulators, and the empty barriers count the warps that run the
    loop. Loads and references are the plain tile's; bad combinations name
    the tile."""
    for make in (G.moe_gate_up, G.moe_down):
        plain = make(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, stages=2)
        short = make(
            128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, stages=2, short_blocks=True
        )
        assert short.tensor_maps == plain.tensor_maps and short.params == plain.params
        src = short.source
        assert src.count("cp.async.bulk.tensor") == plain.source.count("cp.async.bulk.tensor")
        assert src.count("wgmma.mma_async") == plain.source.count("wgmma.mma_async")
        # rows > 64 or more than one row block: the second warpgroup runs.
        assert src.count("arith.cmpi ugt") == plain.source.count("arith.cmpi ugt") + 2
        assert "gpu.shuffle idx" in src and "gpu.shuffle idx" not in plain.source
        assert "mbarrier.init.shared::cta.b64 [$0], $1;" in src
        assert "mbarrier.init.shared::cta.b64 [$0], 8;" in plain.source
        assert "short blocks on one warpgroup" in src and "short blocks" not in plain.source
    for kw, words in (
        (dict(split_n=True, block_m=64), "short_blocks needs core='tma', block_m=128"),
        (dict(block_m=64), "short_blocks needs"),
        (dict(core="mma", smem_limit=48 << 10, stages=2), "got core='mma'"),
        (dict(gather_topk=2), "no gather"),
    ):
        args = dict(core="tma", smem_limit=SMEM, short_blocks=True) | kw
        bm = args.pop("block_m", 128)
        with pytest.raises(GraphError, match=words):
            G.moe_gate_up(bm, 64, H, I, experts=E, **args)


def test_moe_tiles_refill_option():
    """refill="test" in the MoE TMA tiles (gemm_tc.MOE_OPTIONS): thread 0
    tests a stage's empty barrier instead of waiting on it; the loads,
    buffers and maps are the plain tile's. The mma core, which has no
    mbarrier ring, refuses it by name, as does an unknown mode."""
    test_wait = "mbarrier.test_wait.parity.shared::cta.b64"
    for make in (G.moe_gate_up, G.moe_down):
        plain = make(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, stages=2)
        lazy = make(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, stages=2, refill="test")
        assert lazy.tensor_maps == plain.tensor_maps and lazy.params == plain.params
        assert test_wait in lazy.source and test_wait not in plain.source
        assert lazy.source.count("wgmma.mma_async") == plain.source.count("wgmma.mma_async")
    with pytest.raises(GraphError, match="tile 'moe_gate_up_tc': refill='test' needs core='tma'"):
        G.moe_gate_up(128, 64, H, I, experts=E, smem_limit=48 << 10, stages=2, refill="test")
    with pytest.raises(GraphError, match="refill must be 'wait' or 'test', got 'later'"):
        G.moe_down(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, refill="later")


def test_split_k_router_tile_and_topk_add_the_parts():
    """gemm(k_splits=S): tile (i, j, s) writes the partial product of k part
    s into rows s*M of C; router_topk(splits=S) adds the parts in order."""
    from etc.tiles import moe as MT

    rng = np.random.default_rng(7)
    m, e, k, parts = 130, 16, 256, 4
    A, B = rand_bf16(rng, m, k), rand_bf16(rng, e, k)
    tile = G.gemm(128, e, k, core="tma", smem_limit=SMEM, out_dtype="f32", k_splits=parts)
    assert tile.params[:3] == ("index", "index", "index")
    C = np.zeros((parts * m, e), np.float32)
    for i in range(2):
        for s in range(parts):
            tile.reference(i, 0, s, A, B, C)
    full = bf16_to_f32(A) @ bf16_to_f32(B).T
    np.testing.assert_allclose(C.reshape(parts, m, e).sum(0), full, rtol=1e-4, atol=1e-4)
    topk = MT.router_topk(128, 8, e, 2, splits=parts)
    assert topk.source.count("memref.load %L[") == parts
    ids, tw = np.zeros((m, 2), np.int32), np.zeros((m, 2), np.float32)
    counts, pos = np.zeros(e, np.int32), np.zeros((m, 2), np.int32)
    for j in range(16):
        topk.reference(0, j, C, ids, tw, counts, pos)
    want_ids, _ = MT.topk_from_logits(C.reshape(parts, m, e).sum(0)[:128], 2)
    np.testing.assert_array_equal(ids[:128], want_ids)
    with pytest.raises(GraphError, match="k_splits=2 needs core='tma'"):
        G.gemm(128, 64, 256, core="wgmma", k_splits=2)
    with pytest.raises(GraphError, match="k=256 does not split into 3 parts"):
        G.gemm(128, 64, 256, core="tma", smem_limit=SMEM, out_dtype="f32", k_splits=3)


def split_meet_graph(bm: int, bn: int, k: int, parts: int):
    """``C = A @ B^T`` by a dense TMA tile whose ``parts`` parts of k meet in
    the tile (its workspace ``C_parts`` and counters ``C_count``)."""
    g, A, B, C = graph_ab(k)
    tile = dense_tma(bm, bn, k, stages=4, k_splits=parts)
    task = G.add_gemm_task(g, tile, A, B, C)
    assert [t.name for t in task.args[3:5]] == ["C_parts", "C_count"]
    return g, tile


@pytest.mark.parametrize("parts", [2, 4])
def test_split_k_parts_meet_in_the_dense_tile(parts):
    """gemm(k_splits=S) with bf16 out: the last part of each block adds the
    parts in part order into C, whichever part comes last; the counters
    return to zero, so a second launch gives the same bits."""
    rng = np.random.default_rng(parts)
    m, n, k = 200, 200, 256  # ragged rows (128 + 72) and columns (3 x 64 + 8)
    g, tile = split_meet_graph(128, 64, k, parts)
    a, b = rand_bf16(rng, m, k), rand_bf16(rng, n, k)
    cnt = np.zeros((1, 2 * 4), np.int32)
    first = etc.simulate(g, {"A": a, "B": b, "C_count": cnt}, {"m": m, "n": n})
    assert not first["C_count"].any()
    want = bf16_to_f32(a) @ bf16_to_f32(b).T
    assert rel_err(bf16_to_f32(first["C"]), want) <= 1e-2
    again = etc.simulate(g, {"A": a, "B": b, "C_count": first["C_count"]}, {"m": m, "n": n})
    np.testing.assert_array_equal(again["C"], first["C"])
    # The parts in reverse order: another part is last, the sum is the same.
    C, P = np.zeros((m, n), np.uint16), np.zeros(8 * parts * 128 * 64, np.float32)
    counts = np.zeros((1, 8), np.int32)
    for i in range(2):
        for j in range(4):
            for s in reversed(range(parts)):
                tile.reference(i, j, s, a, b, C, P, counts)
    np.testing.assert_array_equal(C, first["C"])
    assert not counts.any()


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize(
    "bn, k, parts", [(192, 2048, 2), (256, 768, 2), (256, 768, 3), (128, 2048, 4)]
)
def test_split_k_meeting_tiles_compile_without_spills(bn, k, parts, tmp_path):
    g, _ = split_meet_graph(128, bn, k, parts)
    ptx = etc.compile(g, target="sm_90a", schedule="static").ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16" in ptx
    assert "atom.acq_rel.gpu.global.add.u32" in ptx  # the parts' meeting
    assert "ld.global.cg.v4.f32" in ptx  # the last part sums the others, past L1
    assert "st.global.v4.b32" in ptx  # its part, 16 bytes a thread
    assert "ld.shared.v4.b32" in ptx  # C staged through shared memory
    info = sm90a_ptxas(ptx, tmp_path)
    assert "0 bytes spill stores" in info and "serialized" not in info, info


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("refill", ["wait", "test"])
def test_dense_tile_refills(refill, tmp_path):
    """refill="test" (dense tile): thread 0 tests a stage's
    empty barrier and tries again a k-tile later; "wait" holds its warp."""
    g, A, B, C = graph_ab(2048)
    G.add_gemm_task(g, dense_tma(128, 192, 2048, stages=4, refill=refill), A, B, C)
    ptx = etc.compile(g, target="sm_90a", schedule="static").ptx
    assert ("mbarrier.test_wait.parity.shared::cta.b64" in ptx) == (refill == "test")
    info = sm90a_ptxas(ptx, tmp_path)
    assert "0 bytes spill stores" in info and "serialized" not in info, info
    with pytest.raises(GraphError, match="refill must be 'wait' or 'test', got 'later'"):
        dense_tma(refill="later")


@pytest.mark.parametrize("flags", [[], ["--k-splits", "2", "--schedule", "dynamic"]])
def test_gemm_example_simulates(flags):
    script = Path(__file__).resolve().parents[2] / "examples" / "gemm.py"
    done = subprocess.run(
        [sys.executable, str(script), "--simulate", "--shapes", "1x64,200x300", "-K", "256", *flags],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2/2 cases match numpy on the simulator" in done.stdout


@needs_bindings
@needs_ptxas
def test_gemm_example_emits_ptx_that_ptxas_accepts(tmp_path):
    script = Path(__file__).resolve().parents[2] / "examples" / "gemm.py"
    ptx = tmp_path / "gemm.ptx"
    done = subprocess.run(
        [sys.executable, str(script), "--emit-ptx", str(ptx), "--k-splits", "2"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "0 bytes spill stores" in sm90a_ptxas(ptx.read_text(), tmp_path)
    wrong = subprocess.run(
        [sys.executable, str(script), "--simulate", "--target", "sm_90"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert wrong.returncode != 0 and "needs --target sm_90a" in wrong.stderr
    for bad, words in (
        (["--k-splits", "2", "--meet-share", "4"], "meet_share=4 needs bf16 out"),
        (
            ["--k-splits", "2", "--meet-share", "2", "--schedule", "dynamic"],
            "needs --schedule static",
        ),
        (["-K", "250"], "k=250 must be a multiple of 64"),
    ):  # a configuration the tile cannot take: the error, no traceback
        done = subprocess.run(
            [sys.executable, str(script), "--simulate", *bad], capture_output=True, text=True
        )
        assert done.returncode != 0 and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_split_k_meeting_needs_whole_parts_and_a_dense_tile():
    with pytest.raises(GraphError, match="k=768 does not split into 5 parts"):
        dense_tma(128, 128, 768, k_splits=5)
    g, A, B, C = graph_ab()
    partials = dense_tma(out_dtype="f32", k_splits=2)  # parts out, for a consumer
    with pytest.raises(GraphError, match="tile 'gemm_tc' is not a dense gemm"):
        G.add_gemm_task(g, partials, A, B, C)
    # A tile for another k: the task's signature check names the tensor.
    with pytest.raises(
        GraphError, match="tensor 'A' of type memref<\\?x128xbf16>.*memref<\\?x256xbf16>"
    ):
        G.add_gemm_task(g, dense_tma(k=256, k_splits=2), A, B, C)


def test_add_gemm_task_takes_the_mma_tile_too():
    g, A, B, C = graph_ab()
    task = G.add_gemm_task(g, G.gemm(64, 64, 128), A, B, C)
    assert len(task.grid) == 2  # no parts: no workspace
    rng = np.random.default_rng(3)
    a, b = rand_bf16(rng, 70, 128), rand_bf16(rng, 90, 128)
    out = etc.simulate(g, {"A": a, "B": b}, {"m": 70, "n": 90})
    assert rel_err(bf16_to_f32(out["C"]), bf16_to_f32(a) @ bf16_to_f32(b).T) <= 1e-2


def test_tma_configuration_errors():
    with pytest.raises(GraphError, match="k=96 must be a multiple of 64"):
        dense_tma(k=96)
    with pytest.raises(GraphError, match="over the limit of 49152"):
        G.gemm(128, 128, 256, core="tma", stages=4)
    with pytest.raises(GraphError, match="warpgroups of 128 threads"):
        G.gemm(128, 128, 256, core="tma", block_size=128, smem_limit=SMEM)
    with pytest.raises(GraphError, match="block_n in 8..256"):
        G.gemm(128, 512, 256, core="tma", smem_limit=1 << 20)


@needs_bindings
@needs_ptxas
def test_half_sums_without_staging_add_pairs(tmp_path):
    # 32-column down blocks are not staged (under 64 columns): the f16 sums
    # take each accumulator pair as a 4-byte reduction instead.
    tile = G.moe_down(
        128, 32, H, I, experts=E, core="tma", smem_limit=SMEM, combine_topk=2, combine_dtype="f16"
    )
    ptx = compile_tile(tile, MOE_DN_COMBINE16, ("m", E), target="sm_90a").ptx
    assert "red.global.add.noftz.f16x2 " in ptx and "red.global.add.noftz.v4" not in ptx
    assert "ld.shared.v4.b32" not in ptx
    info = sm90a_ptxas(ptx, tmp_path)
    assert "0 bytes spill stores" in info and "serialized" not in info, info


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize(
    "make, tensors, grid, n",
    [
        (lambda: dense_tma(128, 256, 256, stages=4), DENSE, ("m", "n"), 256),
        (lambda: G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM), MOE_GU, ("m", E), 128),
        (lambda: G.moe_down(128, 128, H, I, experts=E, core="tma", smem_limit=SMEM), MOE_DN, ("m", E), 128),
        (lambda: G.moe_gate_up(64, 128, H, I, experts=E, core="tma", smem_limit=SMEM, split_n=True), MOE_GU, ("m", E), 128),
        (lambda: G.moe_down(128, 256, H, I, experts=E, core="tma", smem_limit=SMEM, sub_n=128), MOE_DN, ("m", E), 128),
        (lambda: CT.gemm_chunk(128, 128, 256, core="tma", smem_limit=SMEM), None, None, 128),
        (lambda: G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, gather_topk=2), MOE_GU_GATHER, ("m", E), 128),
        (lambda: G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, gather_topk=2, gather_tma=True), MOE_GU_GATHER, ("m", E), 128),
        (lambda: G.moe_down(128, 128, H, I, experts=E, core="tma", smem_limit=SMEM, combine_topk=2), MOE_DN_COMBINE, ("m", E), 128),
        (lambda: G.moe_down(128, 128, H, I, experts=E, core="tma", smem_limit=SMEM, combine_topk=2, combine_dtype="f16"), MOE_DN_COMBINE16, ("m", E), 128),
        (lambda: G.moe_gate_up(128, 64, H, I, experts=E, core="tma", smem_limit=SMEM, short_blocks=True), MOE_GU, ("m", E), 128),
        (lambda: G.moe_down(128, 128, H, I, experts=E, core="tma", smem_limit=SMEM, short_blocks=True), MOE_DN, ("m", E), 128),
        (lambda: G.moe_down(128, 256, H, I, experts=E, core="tma", smem_limit=SMEM, sub_n=128, sub_ring=True, refill="test"), MOE_DN, ("m", E), 128),
        (lambda: G.moe_down(128, 256, H, I, experts=E, core="tma", smem_limit=150 << 10, stages=4, sub_n=128, sub_ring=True, refill="test"), MOE_DN, ("m", E), 128),
        (lambda: G.moe_gate_up(128, 128, H, I, experts=E, core="tma", smem_limit=SMEM, sub_n=64, sub_ring=True, refill="test"), MOE_GU, ("m", E), 128),
    ],
)  # fmt: skip
def test_tma_tiles_compile(make, tensors, grid, n, tmp_path):
    tile = make()
    if tensors is None:  # the All-Gather + GEMM consumer tile: a graph of its own
        g = etc.Graph("chunk")
        s = g.symbol("s")
        A, B = g.tensor("A", (s, 256), "bf16"), g.tensor("B", (256, 256), "bf16")
        C = g.tensor("C", (2, s, 256), "bf16")
        g.task(tile, grid=(2, 1, 2), args=(A, B, C))
        art = etc.compile(g, target="sm_90a")
    else:
        art = compile_tile(tile, tensors, grid, target="sm_90a")
    ptx = art.ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.try_wait.parity.shared::cta.b64" in ptx
    # A wait that never completes traps after MBAR_POLLS polls instead of hanging.
    assert f"setp.lt.u32 p, n, {G.MBAR_POLLS}" in ptx and "trap;" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16" in ptx
    # Every TMA tile stores its block through shared memory in 16-byte rows
    # (the collective tile into its chunk of C), but the float32 combining
    # down tile, which adds its pairs into the sums instead of storing; the
    # half one adds the staged rows' 16-byte chunks.
    combining = tensors is MOE_DN_COMBINE
    half = tensors is MOE_DN_COMBINE16
    assert ("ld.shared.v4.b32" in ptx) != combining
    assert ("red.global.add.v2.f32" in ptx) == combining
    assert ("red.global.add.noftz.v4.f16x2" in ptx) == half
    assert "red.global.add.noftz.f16x2 " not in ptx  # only where the block cannot be staged
    maps = [t for t in art.manifest["tensors"] if "tensor_map" in t]
    gathered = tensors is MOE_GU_GATHER  # its rows come by cp.async, or by one-row boxes
    by_tma = gathered and "vote.sync.ballot" in ptx
    assert [t["tensor_map"]["box"][1] for t in maps] == [64] * (1 if gathered != by_tma else 2)
    if by_tma:  # X's one-row boxes, then the weights'
        assert maps[0]["tensor_map"]["box"][0] == 1
    assert ("cp.async.mbarrier.arrive.noinc.shared::cta.b64" in ptx) == (gathered and not by_tma)
    info = sm90a_ptxas(ptx, tmp_path)
    assert "0 bytes spill stores" in info
    assert "serialized" not in info, info
    assert art.cubin is not None


def test_tensor_parallel_tma_tiles_store_16_bytes():
    """The TMA collective tiles stage their block: 16-byte stores to the
    peer's slot (gemm_to_peer) and to the chunk of C (gemm_chunk); the
    mma.sync ones keep their 4-byte pair stores."""
    peer = CT.gemm_to_peer(128, 256, 512, core="tma", stages=4, smem_limit=SMEM).source
    assert "llvm.store %v_" in peer and "{alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr" in peer
    assert "{alignment = 4 : i64} : vector<2xbf16>, !llvm.ptr" not in peer
    chunk = CT.gemm_chunk(128, 256, 512, core="tma", stages=4, smem_limit=SMEM).source
    assert "{alignment = 16 : i64} : memref<?x?x?xbf16>, vector<8xbf16>" in chunk
    mma = CT.gemm_to_peer(128, 128, 512).source
    assert "{alignment = 4 : i64} : vector<2xbf16>, !llvm.ptr" in mma
    own_chunk = CT.gemm_chunk(128, 256, 512, core="tma", stages=4, smem_limit=SMEM, chunks="own")
    assert own_chunk.tensor_maps == {4: (1, (128, 64)), 5: (2, (256, 64))}
    assert own_chunk.params[:3] == ("index", "index", "index")  # (i, j, rank)
    with pytest.raises(ValueError, match="chunks must be 'all', 'peers' or 'own'"):
        CT.gemm_chunk(chunks="mine")
    # The own rows' tile adds the peers' 16-byte slot chunks to its staged block.
    own = CT.gemm_reduce_own(128, 256, 512, core="tma", stages=4, smem_limit=SMEM)
    assert own.tensor_maps == {5: (1, (128, 64)), 6: (2, (256, 64))}
    assert "vector.load %staging[" in own.source and ": memref<?x?x?xbf16>, vector<8xbf16>" in (
        own.source
    )
    assert "vector.store %y_" in own.source and "memref<?x?xbf16>, vector<8xbf16>" in own.source


def test_tensor_parallel_tma_tile_signature():
    tile = CT.gemm_to_peer(128, 256, 512, core="tma", smem_limit=SMEM)
    # Arguments after (d, i, j): rank, A, B, peers, then the maps of A and B.
    assert tile.tensor_maps == {4: (1, (128, 64)), 5: (2, (256, 64))}
    assert tile.params[-2:] == ("memref<16xi64>", "memref<16xi64>")


def test_moe_layer_with_tma_router_simulates():
    """router='tc' (the TMA tile, float32 logits) and TMA expert tiles, against
    the float32 reference; the router's constraints are checked."""
    import dataclasses

    from etc.models import moe as M

    tma = (("core", "tma"), ("stages", 2), ("smem_limit", SMEM))
    cfg = M.MoEConfig(
        hidden=256, inter=192, experts=8, topk=2, block_m=128, block_n_gu=64, block_n_dn=64,
        router_block=128, router_experts=8, topk_block=4, combine_block=3, gemm="tc",
        gate_up_options=tma, down_options=tma, router="tc",
    )  # fmt: skip
    g = M.build_moe_graph(cfg, name="moe_tc_router")
    assert next(t for t in g.tasks if t.name == "logits").function.name == "moe_logits_tc"
    w = M.random_weights(cfg, seed=5)
    # router_splits: the logits' k loop in 4 parts (grid (blocks, E/EC, 4)).
    parts = dataclasses.replace(cfg, router_splits=4)
    g4 = M.build_moe_graph(parts, name="moe_tc_router_parts")
    assert next(t for t in g4.tasks if t.name == "logits").grid[2] == 4
    for T in (3, 200):
        x = M.random_tokens(cfg, T, seed=T)
        ref = M.reference_moe(x, w["Wr"], w["Wgu"], w["Wd"], cfg.topk)
        for c, graph in ((cfg, g), (parts, g4)):
            out = etc.simulate(graph, M.numpy_inputs(c, x, w), {"T": T})
            assert M.rel_err(out["Out"], ref) <= 1e-2
    # Expert blocks: two TMA router CTAs per 128 tokens.
    split = dataclasses.replace(cfg, experts=16, router_experts=8)
    g = M.build_moe_graph(split, name="moe_tc_router_split")
    assert next(t for t in g.tasks if t.name == "logits").grid[1] == 2
    w = M.random_weights(split, seed=6)
    x = M.random_tokens(split, 150, seed=1)
    out = etc.simulate(g, M.numpy_inputs(split, x, w), {"T": 150})
    ref = M.reference_moe(x, w["Wr"], w["Wgu"], w["Wd"], split.topk)
    assert M.rel_err(out["Out"], ref) <= 1e-2
    with pytest.raises(GraphError, match="router='tc' needs router_block = block_size / 2"):
        dataclasses.replace(cfg, router_block=32)
    with pytest.raises(GraphError, match="router_experts a multiple of 8"):
        dataclasses.replace(cfg, router_experts=4)
    with pytest.raises(GraphError, match="router must be 'simt' or 'tc'"):
        dataclasses.replace(cfg, router="cuda")


@needs_ptxas
def test_moe_example_prefill_preset(tmp_path):
    """`examples/moe.py --preset prefill` (TMA tiles and router): checked in the
    simulator, and its PTX assembles for sm_90a."""
    import sys

    script = Path(__file__).resolve().parents[2] / "examples" / "moe.py"
    small = ["--preset", "prefill", "--hidden", "256", "--inter", "256", "--experts", "8"]
    small += ["--topk", "2"]
    done = subprocess.run(
        [sys.executable, str(script), "--simulate", *small, "--tokens", "1,130"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2/2 cases match numpy" in done.stdout
    gathered = subprocess.run(
        [sys.executable, str(script), "--simulate", *small, "--tokens", "130", "--gather"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert gathered.returncode == 0 and "1/1 cases match numpy" in gathered.stdout, gathered
    atomic = subprocess.run(
        [sys.executable, str(script), "--simulate", *small, "--tokens", "130", "--combine", "atomic"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert atomic.returncode == 0 and "1/1 cases match numpy" in atomic.stdout, atomic
    half = subprocess.run(
        [sys.executable, str(script), "--simulate", *small, "--tokens", "130", "--combine", "atomic",
         "--combine-dtype", "f16"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert half.returncode == 0 and "1/1 cases match numpy" in half.stdout, half
    # --preset auto keeps each preset's own tiles: per-layer flags are refused.
    auto = subprocess.run(
        [sys.executable, str(script), "--simulate", "--preset", "auto", "--tokens", "3",
         "--combine", "atomic", "--gather"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert auto.returncode == 2, auto
    assert "--gather, --combine apply to one --preset, not to --preset auto" in auto.stderr
    # Refused with the culprit named (not a traceback) where the down tile is not TMA.
    refused = subprocess.run(
        [sys.executable, str(script), "--simulate", "--hidden", "64", "--inter", "32",
         "--experts", "8", "--topk", "2", "--tokens", "3", "--combine", "atomic"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 2 and "combine='atomic' needs the TMA down tile" in refused.stderr
    assert "Traceback" not in refused.stderr
    if not have_bindings():
        return
    ptx = tmp_path / "moe.ptx"
    done = subprocess.run(
        [sys.executable, str(script), *small, "--emit-ptx", str(ptx)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "cp.async.bulk.tensor.2d" in ptx.read_text()
    sm90a_ptxas(ptx.read_text(), tmp_path)


@needs_bindings
def test_cli_info_names_the_maps(tmp_path, capsys):
    from etc import cli

    g, A, B, C = graph_ab()
    g.task(dense_tma(), grid=(2, 3), args=(A, B, C))
    etc.compile(g, target="sm_90a", cubin=False).save(tmp_path / "art")
    assert cli.main(["info", str(tmp_path / "art")]) == 0
    out = capsys.readouterr().out
    assert "tensor A_tma128x64: TMA map of 'A', box (128, 64) (encoded at launch)" in out


@needs_bindings
@needs_ptxas
def test_prefill_moe_kernel_keeps_wgmma_pipelined(tmp_path):
    """ptxas serialises every wgmma of a kernel when one sits in a branch it
    cannot prove warpgroup-uniform (a 4x slower prefill MoE layer on the H200,
    bench/RESULTS.md): the whole prefill preset's kernel must not hit that."""
    from etc.models import moe as M

    art = etc.compile(M.build_moe_graph(M.preset("prefill"), name="moe_prefill"), target="sm_90a")
    info = sm90a_ptxas(art.ptx, tmp_path)
    assert "wgmma.mma_async" in art.ptx
    assert "serialized" not in info, info


# -- chunked weights through 4-D maps (Graph.tensor_map(chunk=64)) ---------------


def _box_through_map(flat: np.ndarray, dims, strides, box, coords) -> np.ndarray:
    """The elements a TMA box copy at ``coords`` (innermost first) writes to
    shared memory, in order, computed from the map's geometry over ``flat``
    (one element per array entry)."""
    size = 2  # bf16
    steps = [1] + [s // size for s in strides]
    out = []
    for idx in np.ndindex(*reversed(box)):  # the outermost dimension first
        at = [c + i for c, i in zip(coords, reversed(idx), strict=True)]
        assert all(a < d for a, d in zip(at, dims, strict=True))
        out.append(flat[sum(a * s for a, s in zip(at, steps, strict=True))])
    return np.array(out)


def test_chunked_map_boxes_land_as_the_row_layout_s_boxes():
    """The 4-D view of a chunked weight: its box at ``(0, 0, k/64, row/8)``
    holds, in shared-memory order, exactly the row layout's 2-D box at
    ``(k, row)`` (rows of 64 values one after another), for every k-tile and
    several 8-aligned rows."""
    from etc.tiles.gemm import chunk_weights

    w = np.arange(2 * 48 * 256, dtype=np.int64).reshape(2, 48, 256)  # distinct values
    chunked = chunk_weights(w, 64).reshape(-1)
    plain = w.reshape(-1, 256)
    dims2, strides2, box2 = tensormap.map_geometry("t", w.shape, "bf16", (16, 64))
    dims, strides, box = tensormap.map_geometry("t", w.shape, "bf16", (16, 64), chunk=64)
    assert (dims, strides, box) == ([64, 8, 4, 12], [128, 1024, 4096], [64, 8, 1, 2])
    for k in (0, 64, 192):
        for row in (0, 8, 40, 80):
            want = _box_through_map(plain.reshape(-1), dims2, strides2, box2, (k, row))
            np.testing.assert_array_equal(want, plain[row : row + 16, k : k + 64].reshape(-1))
            got = _box_through_map(chunked, dims, strides, box, (0, 0, k // 64, row // 8))
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ShapeError, match="8-row groups of whole chunks"):
        tensormap.map_geometry("t", (12, 256), "bf16", (8, 64), chunk=64)


@needs_bindings
def test_chunked_maps_in_the_graph_and_the_manifest(tmp_path):
    g = etc.Graph("chunked")
    w = g.tensor("W", (4, 256, 128), "bf16")
    m = g.tensor_map(w, (64, 64), chunk=64)
    assert (m.name, m.map_chunk) == ("W_tma64x64_c64", 64)
    assert g.tensor_map(w, (64, 64), chunk=64) is m and g.tensor_map(w, (64, 64)) is not m
    with pytest.raises(GraphError, match="chunk=32 needs chunks of the box's 64 columns"):
        g.tensor_map(w, (64, 64), chunk=32)
    with pytest.raises(GraphError, match=r"box rows\s+in 8-row groups \(rows=12\)"):
        g.tensor_map(w, (12, 64), chunk=64)
    # A format-6 manifest with the chunk reads back; a chunk that is not the box's is refused.
    data = mapped_manifest()
    data["format"] = "etc-artifact/6"
    data["tensors"][-1]["tensor_map"]["chunk"] = data["tensors"][-1]["tensor_map"]["box"][1]
    spec = manifest.load_manifest(write_artifact(tmp_path / "a", data)).tensors[-1]
    assert spec.tensor_map[2] == spec.tensor_map[1][1]
    data["tensors"][-1]["tensor_map"]["chunk"] = 16
    with pytest.raises(LaunchError, match="tensor_map.chunk"):
        manifest.load_manifest(write_artifact(tmp_path / "b", data))


def _table_load(memref: str, index: list[int]) -> int:
    """Routing tables of 100 rows and 4 tiles per expert (the MoE tiles' decode)."""
    if "indptr" in memref:
        return 4 * index[0]
    if "row_off" in memref:
        return 100 * index[0]
    raise KeyError(memref)


def _tma_copies(tile, func, coords, bases):
    from mlir_addresses import Evaluator, functions, tma_copies

    body = functions(tile.source)[func]
    return tma_copies(body, Evaluator(body, {**coords, "tid": 0}, bases, load=_table_load))


def _check_chunked_copies(plain, chunked, weight_base):
    """Copy by copy, the chunked tile's weight boxes are the plain tile's at
    ``(0, 0, k / 64, row / 8)`` through a 4-D map; every other copy is the same."""
    assert len(plain) == len(chunked) and plain
    weights = 0
    for (op_a, a), (op_b, b) in zip(plain, chunked, strict=True):
        prefetch = "prefetch" in op_a
        where = 0 if prefetch else 1  # the map operand
        if a[where] != weight_base:
            assert (op_b, b) == (op_a, a)
            continue
        weights += 1
        assert op_b == op_a.replace(".2d.", ".4d.")
        col, row = a[where + 1 : where + 3]
        assert col % 64 == 0 and row % 8 == 0
        assert b[: where + 1] == a[: where + 1] and b[where + 5 :] == a[where + 3 :]
        assert b[where + 1 : where + 5] == [0, 0, col // 64, row // 8]
    assert weights


@needs_bindings
@pytest.mark.parametrize("kind", ["gate_up", "down"])
def test_chunked_moe_tma_tiles_copy_the_same_boxes_through_4d_maps(kind):
    make = G.moe_gate_up if kind == "gate_up" else G.moe_down
    options = dict(experts=E, core="tma", stages=3, smem_limit=220 << 10)
    block_n = 128 if kind == "gate_up" else 256
    plain = make(128, block_n, 512, 256, **options)
    chunked = make(128, block_n, 512, 256, weight_chunk=64, **options)
    w = "%Wgu_map" if kind == "gate_up" else "%Wd_map"
    a = "%Xp_map" if kind == "gate_up" else "%Hb_map"
    bases = {w: 1 << 50, a: 1 << 51}
    assert chunked.tensor_maps[6] == (1, (plain.tensor_maps[6][1]), 64)
    for coords in ({"%i": 5, "%e": 1}, {"%i": 9, "%e": 2}):
        _check_chunked_copies(
            _tma_copies(plain, plain.name, coords, bases),
            _tma_copies(chunked, chunked.name, coords, bases),
            1 << 50,
        )
    with pytest.raises(GraphError, match="weight_chunk=32 needs core='tma' and chunks of 64"):
        make(128, block_n, 512, 256, weight_chunk=32, **options)
    with pytest.raises(GraphError, match="needs core='tma'"):
        make(64, 64, 512, 256, experts=E, weight_chunk=64)


@needs_bindings
@pytest.mark.parametrize(
    "options",
    [
        dict(k_splits=2, prefetch_ring=True, rotate_k=True),
        dict(prefetch_ring="shared", epilogue="swiglu"),
    ],
)
def test_chunked_layer_tma_tiles_copy_the_same_boxes_through_4d_maps(options):
    from etc.tiles.gemm import layer_gemm

    options = {"epilogue": "store", **options}
    kw = dict(layers=2, core="tma", stages=3, **options)
    plain = layer_gemm(64, 64, 128, 512, **kw)
    chunked = layer_gemm(64, 64, 128, 512, weight_chunk=64, **kw)
    bases = {"%W_map": 1 << 50, "%A_map": 1 << 51}
    coords = {"%l": 1, "%i": 0, "%j": 1, "%ks": 1}
    for func in (plain.name, f"{plain.name}__prefetch"):
        _check_chunked_copies(
            _tma_copies(plain, func, coords, bases),
            _tma_copies(chunked, func, coords, bases),
            1 << 50,
        )


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("bn, k, parts, share", [(192, 2048, 2, 2), (128, 2048, 4, 4)])
def test_split_k_sums_shared_by_the_last_parts(bn, k, parts, share, tmp_path):
    """meet_share: the block's last parts to arrive each add and store a
    share of it (the spin on the count, the reset a release store), the
    task declares parts that wait for each other, which the manifest
    carries and refuses outside the static schedule; the simulated product
    is the plain meeting's bit for bit (the same sums in the same order)."""
    import json

    from etc.runtime.manifest import load_manifest

    g, A, B, C = graph_ab(k)
    tile = dense_tma(128, bn, k, stages=4, k_splits=parts, meet_share=share)
    assert tile.meets == parts
    G.add_gemm_task(g, tile, A, B, C)
    art = etc.compile(g, target="sm_90a", schedule="static")
    assert art.manifest["tasks"][0]["meets"] == parts
    assert "LAB_SPIN" in art.ptx and "st.release.gpu.global.u32" in art.ptx
    info = sm90a_ptxas(art.ptx, tmp_path)
    assert "0 bytes spill stores" in info and "serialized" not in info, info
    with pytest.raises(etc.CompileError, match="only the static schedule"):
        etc.compile(g, target="sm_90a", schedule="dynamic", cubin=False)
    art.save(tmp_path / "art")
    path = tmp_path / "art" / "manifest.json"
    data = json.loads(path.read_text())
    data["schedule"] = "dynamic"
    path.write_text(json.dumps(data))
    with pytest.raises(etc.LaunchError, match=r"tasks\[0\]\.meets: .*static schedule"):
        load_manifest(tmp_path / "art")
    rng = np.random.default_rng(1)
    a, b = rand_bf16(rng, 200, k), rand_bf16(rng, 300, k)
    plain, _ = split_meet_graph(128, bn, k, parts)
    syms = {"m": 200, "n": 300}
    np.testing.assert_array_equal(
        etc.simulate(g, {"A": a, "B": b}, syms)["C"],
        etc.simulate(plain, {"A": a, "B": b}, syms)["C"],
    )


def test_split_k_sharing_errors_name_the_tile():
    with pytest.raises(GraphError, match="meet_share=2 needs bf16 out, k_splits > 1"):
        dense_tma(128, 128, 768, k_splits=2, meet_share=2, out_dtype="f32")
    with pytest.raises(GraphError, match="power of two up to k_splits=2"):
        dense_tma(128, 128, 768, k_splits=2, meet_share=4)
    with pytest.raises(GraphError, match="meet_share=2 needs core='tma'"):
        G.gemm(128, 128, 768, core="wgmma", meet_share=2)

"""The TMA + wgmma decode projections with split-K (``layer_gemm(core="tma")``,
``etc.tiles.gemm_layer_tma``): references against the sync tiles' for every
epilogue, the split-K meeting (counters back to zero, the same bits whatever
part finishes last), configuration errors naming the tile, PTX that ptxas
assembles for sm_90a, and the decoder on this core (simulated against the
numpy model, compiled with a kernel per batch range)."""

from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np
import pytest
from gemm_helpers import needs_bindings, needs_ptxas, sm90a_ptxas

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.models import llama as M
from etc.runtime import manifest
from etc.tiles.gemm import layer_gemm

pytestmark = needs_bindings

L, K, N = 2, 256, 128


def _rand(rng, *shape):
    return f32_to_bf16((rng.standard_normal(shape) * 0.1).astype(np.float32))


def _case(epilogue, parts, rng, m=40):
    """A tile's buffers: row_scale for store/swiglu, sums_out for residual."""
    per = 2 if epilogue == "swiglu" else 1
    sums = (rng.integers(1, 50, (5, m)) << 28).astype(np.int64)
    bufs = {
        "A": _rand(rng, m, K),
        "R": sums,
        "W": _rand(rng, L, per * N, K),
        "C": _rand(rng, m, N),
        "P": np.full((parts * m, per * N), np.nan, np.float32),
        "cnt": np.zeros((2, 64), np.int32),
    }
    kw = (
        dict(sums_out=(2, 1)) if epilogue == "residual" else dict(row_scale=(2, 0, 1e-5))
    )  # fmt: skip
    names = ["A", "R", "W", "C"] if "row_scale" in kw else ["A", "W", "C", "R"]
    return bufs, kw, names + (["P", "cnt"] if parts > 1 else [])


def _tile(epilogue, parts, bn=32, **kw):
    return layer_gemm(
        64, bn, N, K, layers=L, epilogue=epilogue, name=f"t_{epilogue}", core="tma",
        k_splits=parts, columns_first=True, counter_row=1, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("stages", [3, 4, 6])
def test_the_ring_barriers_are_invalidated_after_the_loop(stages):
    """Tiles of different shapes overlay their rings and barriers in shared
    memory; PTX allows another use of an mbarrier's words only after
    mbarrier.inval. Without it, projections with different stage counts in
    one kernel gave wrong tokens on an H200 (bench/RESULTS.md, item 72)."""
    source = _tile("store", 2, stages=stages).source
    body = source.split("func.func @t_store__prefetch(")[0]
    assert body.count("mbarrier.init") == body.count("mbarrier.inval") == 2 * stages
    assert body.index("wgmma.wait_group.sync.aligned 0") < body.index("mbarrier.inval")


def _tma_columns(source: str, function: str) -> list[str]:
    """The k operands of ``function``'s TMA copies (weight and activation
    boxes and L2 prefetches), in emission order."""
    body = source.split(f"func.func @{function}(")[1].split("func.func @")[0]
    return re.findall(
        r"cp\.async\.bulk\.(?:prefetch\.)?tensor[^\"]*\", \"[^\"]*\" \S+, (%\S+),", body
    )


@pytest.mark.parametrize("prefetch", [False, True, "shared"])
def test_rotate_k_starts_each_column_block_at_its_own_k_tile(prefetch):
    """rotate_k: column block j's loop (and its prefetch, which must load
    the same first k-tiles) starts at k-tile j mod (part / 64): the copies'
    k coordinates go through a remainder by the part's k-tiles."""
    plain = _tile("store", 2, prefetch_ring=prefetch).source
    rotated = _tile("store", 2, prefetch_ring=prefetch, rotate_k=True).source
    assert "arith.remui %j, %c2_" not in plain
    names = ["t_store"] + (["t_store__prefetch"] if prefetch else [])
    for name in names:
        body = rotated.split(f"func.func @{name}(")[1].split("func.func @")[0]
        # K = 256 in 2 parts: 2 k-tiles of 64 a part.
        assert "arith.remui %j, %c2_" in body, name
        assert len(_tma_columns(rotated, name)) == len(_tma_columns(plain, name)) > 0


def _run(tile, bufs, names, order, m=40, bn=32):
    """Run the tile's reference over every block, parts in ``order``."""
    for l, j in itertools.product(range(L), range(N // bn)):  # noqa: E741
        for i in range((m + 63) // 64):
            for s in order:
                coords = (l, j, i, s) if len(order) > 1 else (l, j, i)
                tile.reference(*coords, *[bufs[n] for n in names])


@pytest.mark.parametrize(
    "epilogue, parts", [("store", 1), ("store", 4), ("residual", 2), ("swiglu", 1), ("swiglu", 2)]
)
def test_reference_matches_the_sync_tile(epilogue, parts):
    rng = np.random.default_rng(1)
    bufs, kw, names = _case(epilogue, parts, rng)
    want = {k: v.copy() for k, v in bufs.items()}
    sync = layer_gemm(16, 32, N, K, layers=L, epilogue=epilogue, name="s", columns_first=True, **kw)
    for l, j, i in itertools.product(range(L), range(N // 32), range(3)):  # noqa: E741
        sync.reference(l, j, i, *[want[n] for n in names[:4]])
    _run(_tile(epilogue, parts, **kw), bufs, names, range(parts))
    # Sums of the parts round like the whole product to within one bf16 ulp.
    got, ref = bf16_to_f32(bufs["C"]), bf16_to_f32(want["C"])
    np.testing.assert_allclose(got, ref, rtol=8e-3, atol=1e-3)
    assert np.mean(got == ref) > 0.95
    if epilogue == "residual":  # fixed-point sums of squares, 2**28 per unit
        np.testing.assert_allclose(bufs["R"], want["R"], rtol=1e-5)
    assert not bufs["cnt"].any()  # every block's counter back to zero


def test_split_sum_does_not_depend_on_which_part_finishes_last():
    rng = np.random.default_rng(2)
    results = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        bufs, kw, names = _case("residual", 4, np.random.default_rng(3))
        _run(_tile("residual", 4, **kw), bufs, names, order)
        results.append(bufs["C"].copy())
    assert rng is not None
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_split_partial_block_counts_only_its_rows():
    # 70 rows: two 64-row blocks, the second of 6 rows.
    rng = np.random.default_rng(4)
    bufs, kw, names = _case("store", 2, rng, m=70)
    _run(_tile("store", 2, **kw), bufs, names, range(2), m=70)
    assert not bufs["cnt"].any()
    assert np.isnan(bufs["P"]).sum() == 0  # both parts of every row were written


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(block_m=32), "takes blocks of 64 rows"),
        (dict(k_splits=3), "k=256 does not split into 3 parts"),
        (dict(block_n=12), "block_n=12 must divide n=128"),
        (dict(unroll=2, warps=(1, 2, 4)), "warps, unroll do not apply to core='tma'"),
        (dict(counter_row=-1), "counter_row must be an int >= 0"),
        (dict(stages=40), "need .* bytes of shared memory"),
        (
            dict(core="sync", k_splits=2),
            "k_splits=2, a_box=64, meeting='rows', meet_share=1 and refill='wait' need",
        ),
        (dict(core="sync", refill="test"), "refill='test' need core='tma'"),
        (dict(refill="when"), "refill must be 'wait' or 'test', got 'when'"),
        (dict(k_splits=2, meet_share=2), "meet_share=2 needs meeting='fragments'"),
        (dict(k_splits=2, meeting="fragments", meet_share=3), "a power of two up to k_splits=2"),
        (dict(k_splits=1, meeting="fragments", meet_share=2), "meet_share=2 needs .*k_splits > 1"),
        (dict(k_splits=4, meeting="fragments", meet_share=4), "dividing the 2 fragments"),
        (
            dict(meeting="tree"),
            r"meeting must be one of \('rows', 'fragments', 'cluster'\), got 'tree'",
        ),
        (dict(k_splits=1, meeting="cluster"), "meets parts in pairs.*k_splits=1, stages=4"),
        (dict(k_splits=2, meeting="cluster", stages=1), "an even k_splits and stages >= 2"),
        (dict(a_box=24), "a_box=24 must be 16, 32 or 64"),
        (dict(prefetch_ring=0), "prefetch must be a bool, an int >= 1, .shared. or .shared_l2."),
    ],
)
def test_configuration_errors_name_the_tile(kwargs, words):
    args = dict(block_m=64, block_n=32, core="tma") | kwargs
    bm, bn = args.pop("block_m"), args.pop("block_n")
    with pytest.raises(etc.GraphError, match=f"tile 'p': .*{words}"):
        layer_gemm(bm, bn, N, K, layers=L, epilogue="store", name="p", **args)


def _task(g, m, tile, epilogue, parts, names, bn=32, **task):
    per = 2 if epilogue == "swiglu" else 1
    shapes = {
        "A": ((m, K), "bf16"), "R": ((5, m), "i64"), "W": ((L, per * N, K), "bf16"),
        "C": ((m, N), "bf16"), "P": ((parts * m, per * N), "f32"), "cnt": ((2, 64), "i32"),
    }  # fmt: skip
    args = tuple(g.tensor(n, *shapes[n]) for n in names)
    grid = (L, N // bn, (m + 63) // 64) + ((parts,) if parts > 1 else ())
    return g.task(tile, grid=grid, args=args, **task)


def _compile(tile, epilogue, parts, names, bn=32, schedule="static"):
    g = etc.Graph("g")
    _task(g, g.symbol("m"), tile, epilogue, parts, names, bn)
    return etc.compile(g, schedule=schedule, target="sm_90a")


def test_prefetch_asks_the_l2_for_the_first_weight_boxes():
    tile = _tile("store", 2, row_scale=(2, 0, 1e-5), prefetch_ring=True, a_box=16)
    assert tile.prefetch == "t_store__prefetch" and not tile.prefetch_fills_shared
    body, prefetch = tile.source.split("func.func @t_store__prefetch")
    # One L2 prefetch per warpgroup's weight box and k-tile of the part
    # (k = 128: two k-tiles); no shared memory, no barrier, no activations.
    assert prefetch.count("cp.async.bulk.prefetch.tensor.2d.L2") == 2 * 2
    for word in ("mbarrier", "cp.async.bulk.tensor", "gpu.barrier", "%A_map"):
        assert word not in prefetch.split("{", 1)[1].split("return")[0].replace("%A_map:", "")
    # The body still fills its whole ring: four 16-row activation boxes
    # (the last three guarded by M) and the weight boxes for both k-tiles.
    head = body.split("scf.for %kt")[0]
    assert head.count("mbarrier.init") == 8 and head.count("cp.async.bulk.tensor") == 2 * (4 + 2)
    assert head.count("scf.if %inb") == 2 * 3
    one = _tile("store", 1, row_scale=(2, 0, 1e-5), prefetch_ring=3)
    assert one.source.split("__prefetch")[1].count("prefetch.tensor") == 3 * 2


def test_shared_prefetch_loads_the_first_weight_stages_into_the_ring():
    """prefetch_ring="shared": the prefetch function initialises the ring's
    barriers, expects each first stage's whole bytes (activations included,
    counted by the same boxes' guards) and loads only its weight boxes; the
    body, after the wait, loads the activation boxes without expecting
    again and initialises nothing."""
    tile = _tile("store", 2, row_scale=(2, 0, 1e-5), prefetch_ring="shared", a_box=16)
    assert tile.prefetch == "t_store__prefetch" and tile.prefetch_fills_shared
    body, prefetch = tile.source.split("func.func @t_store__prefetch")
    # k = 128 per part: two k-tiles, so two of the four stages are loaded.
    assert prefetch.count("mbarrier.init") == 8
    assert prefetch.count("mbarrier.arrive.expect_tx") == 2
    assert prefetch.count("cp.async.bulk.tensor") == 2 * 2  # two warpgroups' weight boxes
    assert "%A_map, " not in prefetch.split("{", 1)[1]  # no activation box
    assert prefetch.count("arith.select %inb") == 3  # the guards count the bytes
    head = body.split("scf.for %kt")[0]
    assert "mbarrier.init" not in head and "expect_tx" not in head
    assert head.count("cp.async.bulk.tensor") == 2 * 4  # the activation boxes, 16 rows each
    assert body.count("mbarrier.inval") == 8
    with pytest.raises(etc.GraphError, match="prefetch must be a bool, an int >= 1, 'shared'"):
        _tile("store", 2, prefetch_ring="ring")


def test_shared_l2_prefetch_also_asks_the_l2_for_the_rest_of_the_part():
    """prefetch_ring="shared_l2": the ring's first stages as "shared" does,
    and the part's later k-tiles' weight boxes asked into L2 (K = 256 in
    one part on 2 stages: k-tiles 2 and 3, each warpgroup's box)."""
    shared = _tile("store", 1, stages=2, prefetch_ring="shared").source
    both = _tile("store", 1, stages=2, prefetch_ring="shared_l2")
    assert both.prefetch_fills_shared
    head = both.source.split("func.func @t_store__prefetch")[1]
    assert head.count("cp.async.bulk.prefetch.tensor") == 2 * 2
    assert "prefetch.tensor" not in shared.split("func.func @t_store__prefetch")[1]
    assert head.count("cp.async.bulk.tensor") == shared.split("func.func @t_store__prefetch")[
        1
    ].count("cp.async.bulk.tensor")
    # A part no longer than the ring: nothing more to ask for.
    short = _tile("store", 2, prefetch_ring="shared_l2").source
    assert "prefetch.tensor" not in short.split("func.func @t_store__prefetch")[1]


@needs_ptxas
@pytest.mark.parametrize(
    "epilogue, parts, extra",
    [
        ("store", 4, {}),
        ("residual", 2, dict(prefetch_ring=True, a_box=16)),
        ("swiglu", 1, dict(prefetch_ring=True, a_box=32)),
        ("residual", 2, dict(prefetch_ring="shared", a_box=16)),
        ("swiglu", 1, dict(prefetch_ring="shared")),
        ("swiglu", 2, dict(prefetch_ring="shared", rotate_k=True)),
        ("store", 4, dict(prefetch_ring=True, rotate_k=True)),
        ("store", 4, dict(meeting="fragments")),
        ("residual", 4, dict(prefetch_ring="shared", meeting="fragments", epilogue_ahead=True)),
        ("swiglu", 2, dict(prefetch_ring="shared", rotate_k=True, meeting="fragments")),
        ("residual", 1, dict(prefetch_ring="shared", stages=3, refill="test")),
    ],
)
def test_tiles_assemble_for_sm_90a(epilogue, parts, extra, tmp_path):
    _, kw, names = _case(epilogue, parts, np.random.default_rng(0))
    art = _compile(_tile(epilogue, parts, **kw, **extra), epilogue, parts, names)
    assert art.cubin is not None
    ptx = art.ptx
    assert "cp.async.bulk.tensor.2d" in ptx and "wgmma.mma_async" in ptx
    if parts > 1:
        assert "atom.acq_rel.gpu.global.add.u32" in ptx and "st.relaxed.gpu.global.u32" in ptx
        if extra.get("meeting") == "fragments":  # 16-byte parts, none by row
            assert "st.global.v4.f32" in ptx and "ld.global.cg.v4.f32" in ptx
            assert "ld.global.cg.v2.f32" not in ptx
        else:
            assert "ld.global.cg.v2.f32" in ptx
    art.save(tmp_path / "art")
    maps = [t.name for t in manifest.load_manifest(tmp_path / "art").tensors if t.tensor_map]
    assert maps == [f"A_tma{extra.get('a_box', 64)}x64", "W_tma16x64"]
    # refill="test": thread 0 tests a stage's empty barrier and goes on.
    assert ("mbarrier.test_wait" in ptx) == (extra.get("refill") == "test")
    report = sm90a_ptxas(ptx, tmp_path)
    assert not any(int(x) for x in re.findall(r"(\d+) bytes spill", report))


@pytest.mark.parametrize("epilogue, parts", [("residual", 4), ("swiglu", 2), ("store", 2)])
def test_cluster_meeting_adds_the_pair_sums(epilogue, parts):
    """meeting="cluster": the reference adds each pair's sum p[2g] + p[2g+1]
    in pair order (the GPU's pairs meet in shared memory, then the pairs'
    even parts in the workspace): with 2 parts the fragments meeting's bits,
    with more the same values within rounding; counters back at zero; the
    tile runs each pair on one cluster of 2."""
    outs = {}
    for meeting in ("fragments", "cluster"):
        bufs, kw, names = _case(epilogue, parts, np.random.default_rng(5))
        tile = _tile(epilogue, parts, meeting=meeting, **kw)
        assert (tile.cluster, tile.meets) == ((2 if meeting == "cluster" else 0), 0)
        _run(tile, bufs, names, range(parts)[::-1])
        assert not bufs["cnt"].any()
        outs[meeting] = bf16_to_f32(bufs["C"])
    if parts == 2:
        np.testing.assert_array_equal(outs["cluster"], outs["fragments"])
    else:
        np.testing.assert_allclose(outs["cluster"], outs["fragments"], rtol=8e-3, atol=1e-3)


def test_cluster_meeting_sums_in_pair_order():
    """Parts whose products are 2**27, 1, -2**27, 1 (in float32 2**27 + 1
    and -2**27 + 1 round away the 1): part order gives 1 a layer, pair
    order (2**27 + 1) + (-2**27 + 1) gives 0."""
    got = {}
    for meeting in ("fragments", "cluster"):
        bufs, kw, names = _case("residual", 4, np.random.default_rng(7))
        bufs["A"][:] = 0
        bufs["W"][:] = 0
        bufs["C"][:] = 0
        part = K // 4
        for s, v in enumerate((2.0**27, 1.0, -(2.0**27), 1.0)):
            bufs["A"][:, s * part] = f32_to_bf16(np.float32(1.0))
            bufs["W"][:, :, s * part] = f32_to_bf16(np.float32(v))
        _run(_tile("residual", 4, meeting=meeting, **kw), bufs, names, range(4))
        got[meeting] = bf16_to_f32(bufs["C"])
    # Each of the L layers adds its sum to C (the residual).
    assert (got["fragments"] == L).all() and (got["cluster"] == 0).all()


@needs_ptxas
@pytest.mark.parametrize(
    "epilogue, parts, bn", [("residual", 2, 32), ("swiglu", 2, 64), ("store", 4, 64)]
)
def test_cluster_meeting_assembles_and_hands_over_in_shared_memory(epilogue, parts, bn, tmp_path):
    """The pair's odd part stores its fragments into its ring, both pass
    two cluster barriers, the even part reads them over distributed shared
    memory (mapa + ld.shared::cluster), and only with more than 2 parts
    does a workspace meeting (its counter) follow; the artifact is the
    clustered format, its task clustered in 2, and ptxas keeps it all in
    registers."""
    _, kw, names = _case(epilogue, parts, np.random.default_rng(0))
    tile = _tile(epilogue, parts, bn=bn, meeting="cluster", prefetch_ring="shared", **kw)
    art = _compile(tile, epilogue, parts, names, bn)
    assert art.manifest["format"] == "etc-artifact/7"
    assert art.manifest["tasks"][0]["cluster"] == 2
    ptx = art.ptx
    frags = 64 * (2 if epilogue == "swiglu" else 1) * bn // 256 // 4
    assert ptx.count("barrier.cluster.arrive.release.aligned") == 2
    assert ptx.count("st.shared.v4.f32") == ptx.count("ld.shared::cluster.v4.f32") == frags
    assert "mapa.shared::cluster.u32" in ptx and "%cluster_ctarank" in ptx
    # The pairs' even parts load each other's sums from the workspace.
    assert ("ld.global.cg.v4.f32" in ptx) == (parts > 2)
    report = sm90a_ptxas(ptx, tmp_path)
    assert not any(int(x) for x in re.findall(r"(\d+) bytes spill", report)), report
    with pytest.raises(etc.CompileError, match="only the static schedule"):
        _compile(tile, epilogue, parts, names, bn, schedule="dynamic")


@needs_ptxas
@pytest.mark.parametrize(
    "epilogue, parts, share, bn",
    [("residual", 4, 4, 64), ("swiglu", 2, 2, 32), ("store", 4, 2, 32), ("residual", 2, 2, 32)],
)
def test_shared_meeting_splits_the_sums_among_the_last_parts(epilogue, parts, share, bn, tmp_path):
    """meet_share: the block's last ``share`` parts to arrive each sum a
    run of every thread's fragments (one branch per sharer, together the
    plain meeting's loads), the earlier ones after spinning on the count
    until the last part resets it (a release store); the task declares
    parts that wait for each other, and ptxas keeps it all in registers."""
    _, kw, names = _case(epilogue, parts, np.random.default_rng(0))
    extra = dict(meeting="fragments", prefetch_ring="shared", epilogue_ahead=True, bn=bn, **kw)
    plain, shared = (
        _tile(epilogue, parts, **extra),
        _tile(epilogue, parts, meet_share=share, **extra),
    )
    assert (plain.meets, shared.meets) == (0, parts)
    loads = "ld.global.cg.v4.f32"
    assert shared.source.count(loads) == plain.source.count(loads) > 0
    assert shared.source.count("%mine") == 2 * share  # defined, then branched on
    assert "SPIN" in shared.source and "SPIN" not in plain.source
    art = _compile(shared, epilogue, parts, names, bn)
    assert art.manifest["tasks"][0]["meets"] == parts
    ptx = art.ptx
    assert "ld.acquire.gpu.global.u32" in ptx and "st.release.gpu.global.u32" in ptx
    report = sm90a_ptxas(ptx, tmp_path)
    assert not any(int(x) for x in re.findall(r"(\d+) bytes spill", report)), report
    with pytest.raises(etc.CompileError, match="only the static schedule"):
        _compile(shared, epilogue, parts, names, bn, schedule="dynamic")
    # Only a listed task of exactly the parts, no phase on them, runs it.
    g = etc.Graph("g")
    m = g.symbol("m")
    with pytest.raises(etc.GraphError, match="parts that wait for each other"):
        _task(g, m, shared, epilogue, parts, names, bn, deal="pool")


@pytest.mark.parametrize("epilogue", ["store", "residual"])
def test_epilogue_ahead_loads_row_sums_and_residual_before_the_k_loop(epilogue, tmp_path):
    """epilogue_ahead: the row sums (row_scale) or the residual (and only
    what the epilogue would load) are read before the k loop, in every part,
    and not again after the meeting; the tile still assembles without
    spills."""
    _, kw, names = _case(epilogue, 2, np.random.default_rng(0))
    plain = _tile(epilogue, 2, **kw).source
    ahead = _tile(epilogue, 2, **kw, epilogue_ahead=True).source
    loaded = "memref.load %R[" if epilogue == "store" else "vector.load %C["
    for src in (plain, ahead):
        assert src.count(loaded) == 2 if epilogue == "store" else src.count(loaded) == 2 * 2
    head, loop = ahead.split("scf.for %kt")
    assert loaded not in loop and loaded in head
    assert loaded not in plain.split("scf.for %kt")[0]
    art = _compile(_tile(epilogue, 2, **kw, epilogue_ahead=True), epilogue, 2, names)
    report = sm90a_ptxas(art.ptx, tmp_path)
    assert not any(int(x) for x in re.findall(r"(\d+) bytes spill", report))
    with pytest.raises(
        etc.GraphError, match="tile 'layer_gemm_store': epilogue_ahead needs core='tma'"
    ):
        layer_gemm(16, 16, 64, 256, layers=2, epilogue_ahead=True)


# -- the decoder -------------------------------------------------------------------

TMA = dict(gemm_core="tma", bn_qkv=32, bn_o=16, bn_gu=32, bn_down=32)
SPLITS = (("qkv_proj", 2), ("o_proj", 2), ("down_proj", 4))


def test_decoder_on_the_tma_core_matches_the_numpy_model():
    """B = 70: two 64-row blocks, the last partial; every projection split
    but gate_up; the embedding in down's 4 x 8 blocks."""
    cfg = dataclasses.replace(M.TINY, **TMA, k_splits=SPLITS)
    g = M.build_decoder_graph(cfg)
    assert {t.name: t.grid[-1] for t in g.tasks if t.name in ("qkv", "o_proj", "down")} == {
        "qkv": 2,
        "o_proj": 2,
        "down": 4,
    }
    weights = M.random_weights(cfg, seed=5)
    B, L_ = 70, 5
    tokens = (np.arange(B, dtype=np.int32) * 11) % cfg.vocab
    arrays = M.numpy_inputs(cfg, weights, tokens, L_, L_ + 3)
    # The widest split; whole 64-row blocks (tma_meeting="fragments").
    assert arrays["split_parts"].shape == (4 * 128, cfg.qkv_width)
    ref = M.reference_step(cfg, arrays, L_)
    out = etc.simulate(g, arrays, {"B": B, "L": L_, "S": L_ + 3}, num_ctas=7)
    got = bf16_to_f32(out["logits"])
    assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
    np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
    assert not out["split_count"].any()


def test_decoder_with_parts_meeting_on_clusters_matches_the_numpy_model():
    """tma_meeting="cluster": the even splits (qkv and o_proj in 2, down in
    4) meet in pairs on clusters of 2, gate_up (unsplit) not at all; the
    static artifact launches in clusters, the dynamic one meets in
    fragments. Simulated on 8 CTAs (whole clusters), the step is the numpy
    model's and the fragments meeting's within rounding, its tokens
    the same, its counters back at zero."""
    cfg = dataclasses.replace(M.TINY, **TMA, k_splits=SPLITS, tma_meeting="cluster")
    assert [cfg.meeting(p) for p in ("qkv_proj", "o_proj", "down_proj")] == ["cluster"] * 3
    odd = dataclasses.replace(cfg, k_splits=(("qkv_proj", 1), ("down_proj", 2)))
    assert odd.meeting("qkv_proj") == "fragments"
    g = M.build_decoder_graph(cfg)
    clustered = {t.name: t.function.cluster for t in g.tasks if t.function.cluster}
    assert clustered == {"qkv": 2, "o_proj": 2, "down": 2}
    weights = M.random_weights(cfg, seed=5)
    B, L_ = 70, 5
    tokens = (np.arange(B, dtype=np.int32) * 11) % cfg.vocab
    arrays = M.numpy_inputs(cfg, weights, tokens, L_, L_ + 3)
    ref = M.reference_step(cfg, arrays, L_)
    syms = {"B": B, "L": L_, "S": L_ + 3}
    out = etc.simulate(g, arrays, syms, num_ctas=8)
    plain = dataclasses.replace(cfg, tma_meeting="fragments")
    frag = etc.simulate(
        M.build_decoder_graph(plain), M.numpy_inputs(plain, weights, tokens, L_, L_ + 3), syms,
        num_ctas=8,
    )  # fmt: skip
    for other in (ref["logits"], bf16_to_f32(frag["logits"])):
        got = bf16_to_f32(out["logits"])
        assert np.linalg.norm(got - other) / np.linalg.norm(other) < 1e-2
    np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
    assert not out["split_count"].any()
    static = M.compile_decoder(cfg, "static", cubin=False)
    assert static.manifest["format"] == "etc-artifact/7"
    dynamic = M.compile_decoder(cfg, "dynamic", cubin=False)
    assert not any(t.get("cluster") for t in dynamic.manifest["tasks"])


def test_decoder_on_the_tma_core_with_chunked_weights_gives_the_row_layout_s_step():
    """The same decoder with its layer weights chunked (4-D maps): the
    logits, tokens and caches are the row layout's bit for bit."""
    plain = dataclasses.replace(M.TINY, **TMA, k_splits=SPLITS)
    cfg = dataclasses.replace(plain, weight_chunk=64)
    chunked = [t for t in M.build_decoder_graph(cfg).tensors if t.map_chunk]
    assert {t.map_of.name for t in chunked} == {
        "wqkv_folded_c64",
        "wo_c64",
        "wgu_folded_c64",
        "wd_c64",
    }
    _same_step(cfg, plain)


def _same_step(cfg, plain, B=70, L_=5):
    """Simulates ``cfg``'s and ``plain``'s decoders on the same weights and
    tokens; asserts their logits, tokens and caches are equal bit for bit
    and returns ``cfg``'s outputs."""
    weights = M.random_weights(cfg, seed=5)
    tokens = (np.arange(B, dtype=np.int32) * 11) % cfg.vocab
    syms = {"B": B, "L": L_, "S": L_ + 3}
    out, want = (
        etc.simulate(
            M.build_decoder_graph(c),
            M.numpy_inputs(c, weights, tokens, L_, L_ + 3),
            syms,
            num_ctas=7,
        )  # fmt: skip
        for c in (cfg, plain)
    )
    for key in ("logits", "next_tokens", "k_cache", "v_cache"):
        np.testing.assert_array_equal(out[key], want[key])
    return out


def test_decoder_with_parts_meeting_in_fragment_order_gives_the_same_step():
    """tma_meeting="fragments" (the default): the workspace holds whole
    64-row blocks per part (B = 70: 4 parts x 2 blocks), the step is the
    rows meeting's bit for bit and every counter is back at zero."""
    cfg = dataclasses.replace(M.TINY, **TMA, k_splits=SPLITS)
    plain = dataclasses.replace(cfg, tma_meeting="rows")
    assert cfg.tma_meeting == "fragments"
    out = _same_step(cfg, plain)
    assert out["split_parts"].shape == (4 * 128, cfg.qkv_width)
    assert not out["split_count"].any()


@needs_ptxas
def test_decoder_with_a_tma_large_batch_kernel_compiles(tmp_path):
    """Three kernels, one set of tensors: the workspace is declared by all,
    used by the large-batch kernel only; the artifact targets sm_90a."""
    cfg = dataclasses.replace(
        M.TINY,
        k_splits=SPLITS,
        batch_buckets=((1, ()), (16, ()), (None, (*M.LARGE_BATCH, *TMA.items()))),
    )
    assert cfg.uses_tma and M.compile_options(cfg)["target"] == "sm_90a"
    M.compile_decoder(cfg, "static").save(tmp_path)
    for b in range(3):
        names = {t.name for t in manifest.load_manifest(tmp_path / f"bucket{b}").tensors}
        assert {"split_parts", "split_count"} <= names
    assert "wgmma.mma_async" in (tmp_path / "bucket2" / "kernel.ptx").read_text()
    assert "wgmma.mma_async" not in (tmp_path / "bucket0" / "kernel.ptx").read_text()


def test_shared_meetings_run_in_the_static_kernels_only():
    """tma_meet_share: the static kernels' split projections share their
    sums (the spin on the count is in the PTX, the manifest names the
    parts), the dynamic kernels meet in the last part as before; the
    simulated step is the plain meeting's bit for bit (the same sums)."""
    cfg = dataclasses.replace(
        M.TINY, **TMA, k_splits=SPLITS, tma_meet_share=(("qkv_proj", 2), ("down_proj", 2))
    )
    arts = {s: M.compile_decoder(cfg, s, cubin=False) for s in ("static", "dynamic")}
    # At most a projection's parts share (qkv in 2: both); none unsplit.
    assert (
        cfg.meet_share("qkv_proj"),
        dataclasses.replace(cfg, tma_meet_share=(("qkv_proj", 8),)).meet_share("qkv_proj"),
    ) == (2, 2)
    assert (
        dataclasses.replace(cfg, tma_meet_share=(("gate_up_proj", 2),)).meet_share("gate_up_proj")
        == 1
    )
    meets = {t["name"]: t.get("meets", 0) for t in arts["static"].manifest["tasks"]}
    assert {k: meets[k] for k in ("qkv", "o_proj", "down")} == {"qkv": 2, "o_proj": 0, "down": 4}
    assert "LAB_SPIN" in arts["static"].ptx and "LAB_SPIN" not in arts["dynamic"].ptx
    assert not any(t.get("meets") for t in arts["dynamic"].manifest["tasks"])
    _same_step(cfg, dataclasses.replace(cfg, tma_meet_share=()))


def test_the_dynamic_decoder_asks_the_l2_for_its_weights():
    """tma_prefetch="shared" (the default) loads the weight stages into the
    rings before the waits under the static schedule; compile_decoder gives
    the dynamic schedule the L2 prefetch (measured faster there)."""
    cfg = dataclasses.replace(
        M.TINY, k_splits=SPLITS, batch_buckets=((1, ()), (None, (*M.LARGE_BATCH, *TMA.items())))
    )
    assert cfg.tma_prefetch == "shared"
    ptx = {
        s: M.compile_decoder(cfg, s, cubin=False).artifacts[-1].ptx for s in ("static", "dynamic")
    }
    assert "prefetch.tensor.2d.L2" not in ptx["static"]
    assert "prefetch.tensor.2d.L2" in ptx["dynamic"]


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(k_splits=(("lm_head", 2),)), "k_splits names 'lm_head'"),
        (dict(k_splits=(("down_proj", 3),)), r"k_splits\['down_proj'\]=3: k=512"),
        (dict(k_splits=(("o_proj", 0),)), r"k_splits\['o_proj'\] must be an int in 1..64"),
        (dict(gemm_core="tma", k_splits=(("down_proj", 8),)), "bn_down=16 / 8 parts"),
        (dict(gemm_core="tma", fuse_norms=True, fold_norms=False), "fuse_norms needs the sync"),
        (dict(gemm_core="wgmma"), "gemm_core must be one of sync, bulk, tma, gemv"),
        (dict(tma_meeting="tree"), r"tma_meeting must be one of \(.*'cluster'\), got 'tree'"),
        (
            dict(tma_meeting="cluster", sm_slices=True),
            r"tma_meeting=.cluster. puts .* \(sm_slices\)",
        ),
        (dict(tma_meet_share=(("lm_head", 2),)), "tma_meet_share names 'lm_head'"),
        (dict(tma_meet_share=("down_proj",)), r"takes \(projection, share\) pairs"),
        (dict(tma_meet_share=(("down_proj", 3),)), r"tma_meet_share\['down_proj'\]=3 must be 1, 2"),
        (
            dict(**TMA, k_splits=SPLITS, tma_meet_share=(("down_proj", 2),), pool=("down",)),
            "task 'down''s parts wait for each other, which a pooled task",
        ),
        (
            dict(**TMA, k_splits=SPLITS, tma_meeting="rows", tma_meet_share=(("qkv_proj", 2),)),
            "needs tma_meeting='fragments'",
        ),
        (
            dict(projection_options=(("down_proj", (("refill", "test"),)),)),
            r"projection_options\['down_proj'\] refill='test': .* tma core only \(core 'sync'\)",
        ),
        (
            dict(**TMA, projection_options=(("o_proj", (("refill", "soon"),)),)),
            r"projection_options\['o_proj'\] refill='soon': 'wait' or 'test'",
        ),
    ],
)
def test_config_errors(change, words):
    with pytest.raises(etc.GraphError, match=words):
        dataclasses.replace(M.TINY, **change)


def _tma_copies(source: str) -> dict[str, dict[str, list[bool]]]:
    """Per function, per tensor-map operand: whether each of its
    ``cp.async.bulk.tensor`` copies carries an L2 cache hint."""
    out: dict[str, dict[str, list[bool]]] = {}
    func = None
    for line in source.splitlines():
        if m := re.match(r"\s*func\.func @(\w+)", line):
            func = m.group(1)
        if "cp.async.bulk.tensor" in line and func is not None:
            tmap = re.search(r'"r,l,[rl,]*" %\w+, (%\w+)', line).group(1)
            out.setdefault(func, {}).setdefault(tmap, []).append("L2::cache_hint" in line)
    return out


def test_evict_first_marks_the_weight_boxes_only():
    """``l2_evict_first`` on the tma core: every weight box's TMA copy, in
    the body and in the ring prefetch, carries the evict-first hint (with
    its policy operand); the activation boxes and the copy count do not
    change."""
    opts = dict(layers=2, epilogue="store", core="tma", stages=4, prefetch_ring="shared", name="t")
    plain = _tma_copies(layer_gemm(64, 64, 2048, 2048, **opts).source)
    marked_fn = layer_gemm(64, 64, 2048, 2048, l2_evict_first=True, **opts)
    marked = _tma_copies(marked_fn.source)
    assert set(plain) == set(marked) == {"t", "t__prefetch"}
    body = sorted(marked["t"].values(), key=all)  # the A boxes, then the weight boxes
    assert sorted(map(len, body)) == sorted(map(len, plain["t"].values()))
    assert len(body) == 2 and not any(body[0]) and all(body[1])
    assert [all(v) for v in marked["t__prefetch"].values()] == [True]  # weights only
    assert not any(any(v) for copies in plain.values() for v in copies.values())
    assert marked_fn.source.count("createpolicy.fractional.L2::evict_first") >= 2

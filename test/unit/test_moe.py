"""The MoE layer (etc.models.moe, etc.tiles.moe): tile references, plan
invariants, the tiles chained by hand against reference_moe, the whole
graph in the simulator (needs Graph.task(triggered_by=...)), and PTX of the
router/plan/permute/combine tiles (needs the bindings and ptxas)."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import replace

import numpy as np
import pytest
from gemm_helpers import ptxas_info

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.models import moe as M
from etc.tiles import gemm as G
from etc.tiles import moe as T_

# Logits in 4 expert chunks (EC=2: 4 warps per expert), top-k in halves of a router block.
SMALL = M.MoEConfig(
    hidden=64, inter=32, experts=8, topk=2, block_m=16, block_n_gu=32, block_n_dn=64,
    router_block=4, router_experts=2, topk_block=2, combine_block=3,
)  # fmt: skip
# Two column blocks in each GEMM (NT = ND = 2); logits in 2 chunks, one top-k per block.
WIDE = M.MoEConfig(
    hidden=128, inter=64, experts=8, topk=2, block_m=16, block_n_gu=32, block_n_dn=64,
    router_block=4, router_experts=4, topk_block=4, combine_block=3,
)  # fmt: skip


def have_bindings() -> bool:
    try:
        return importlib.util.find_spec("etc._mlir_libs._etcDialects") is not None
    except ImportError:
        return False


needs_bindings = pytest.mark.skipif(not have_bindings(), reason="the MLIR bindings are not built")
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
#: The routes that build routing tables (the TMA tiles' options need them).
TABLE_ROUTES = tuple(r for r in M.ROUTES if r != "slots")
needs_trigger = pytest.mark.skipif(
    not M.has_trigger_api(), reason="etc.Graph.task has no triggered_by yet"
)


def placeholder_gemm(cfg: M.MoEConfig) -> tuple[etc.DeviceFunction, etc.DeviceFunction]:
    """numpy-only gate_up/down tiles of the spec's signatures (no GPU body)."""
    H, II, E = cfg.hidden, cfg.inter, cfg.experts
    it = f"memref<{E + 1}xi32>"
    sigs = {
        "ph_gate_up": (
            f"memref<?x{H}xbf16>, memref<{E}x{2 * II}x{H}xbf16>, {it}, {it}, memref<?x{II}xbf16>",
            M.gate_up_reference(cfg.block_m, cfg.block_n_gu, H, II),
        ),
        "ph_down": (
            f"memref<?x{II}xbf16>, memref<{E}x{H}x{II}xbf16>, {it}, {it}, memref<?x{H}xbf16>",
            M.down_reference(cfg.block_m, cfg.block_n_dn, H, II),
        ),
    }
    out = []
    for name, (types, ref) in sigs.items():
        params = ", ".join(f"%a{k}: {t}" for k, t in enumerate(types.split(", ")))
        src = f"func.func @{name}(%i: index, %e: index, {params}) {{\n  return\n}}\n"
        out.append(etc.DeviceFunction.from_mlir(src, name, ref, block_size=cfg.block_size))
    return out[0], out[1]


def gemm_tiles(cfg: M.MoEConfig):
    try:
        from etc.tiles import gemm
    except ImportError:
        return placeholder_gemm(cfg)
    return M._gemm_tiles(cfg, gemm)


def case(cfg: M.MoEConfig, T: int, routing: str = "uniform", seed: int = 0):
    cfg = cfg.with_routing(routing)
    w = M.random_weights(cfg, seed, routing)
    x = M.random_tokens(cfg, T, seed, routing)
    ref = M.reference_moe(x, w["Wr"], w["Wgu"], w["Wd"], cfg.topk)
    return cfg, x, w, ref


# ----------------------------------------------------------------------------
# tile references
# ----------------------------------------------------------------------------
def test_router_reference_ties_and_weights():
    H, E, K = 16, 8, 3
    rng = np.random.default_rng(1)
    wr = rng.standard_normal((E, H), np.float32)
    wr[5] = wr[2]  # experts 2 and 5 always tie: 2 must come first
    wr[7] = wr[2]
    x = f32_to_bf16(rng.standard_normal((20, H), np.float32))
    wr16 = f32_to_bf16(wr)
    ids, w = T_.router_reference_rows(x, wr16, K)
    logits = bf16_to_f32(x) @ bf16_to_f32(wr16).T
    for t in range(20):
        order = sorted(range(E), key=lambda e: (-logits[t, e], e))[:K]
        assert list(ids[t]) == order
        p = np.exp(logits[t] - logits[t].max())
        p /= p.sum()
        np.testing.assert_allclose(w[t], p[order] / p[order].sum(), rtol=1e-5)
        for a, b in ((2, 5), (2, 7), (5, 7)):
            if a in ids[t] and b in ids[t]:
                assert list(ids[t]).index(a) < list(ids[t]).index(b)
    np.testing.assert_allclose(w.sum(1), 1, rtol=1e-6)


def test_router_tile_references_partial_block():
    cfg = SMALL
    E, K, H = cfg.experts, cfg.topk, cfg.hidden
    w = M.random_weights(cfg, 3)
    x = M.random_tokens(cfg, 10, 3)
    logits_fn = T_.router_logits(4, 2, E, H)
    topk_fn = T_.router_topk(4, 2, E, K)
    logits = np.full((10, E), np.nan, np.float32)
    ids = np.full((10, K), -1, np.int32)
    tw = np.zeros((10, K), np.float32)
    counts, pos = np.zeros(E, np.int32), np.full((10, K), -1, np.int32)
    for i in range(3):  # blocks of 4, the last has 2 tokens
        for j in range(E // 2):
            logits_fn.reference(i, j, x, w["Wr"], logits)
    np.testing.assert_allclose(logits, bf16_to_f32(x) @ bf16_to_f32(w["Wr"]).T, rtol=1e-5)
    for i in reversed(range(3)):  # any order: the positions follow the atomics
        for j in range(2):  # top-k halves of 2 tokens; (2, 1) is past T
            topk_fn.reference(i, j, logits, ids, tw, counts, pos)
    want_ids, want_w = T_.router_reference_rows(x, w["Wr"], K)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(tw, want_w, rtol=1e-5)
    # Each expert's slots hold the positions 0 .. count - 1 once each.
    np.testing.assert_array_equal(counts, np.bincount(ids.ravel(), minlength=E))
    for e in range(E):
        assert sorted(pos[ids == e]) == list(range(counts[e]))


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("T,routing", [(1, "uniform"), (13, "one-expert"), (20, "few-experts")])
def test_route_tile_does_topk_and_plan(splits, T, routing):
    # One route instance = clear + top-k + plan: the same choices, weights
    # and tables, and the same (stable) row order as the reference plan.
    cfg = SMALL.with_routing(routing)
    E, K, BM = cfg.experts, cfg.topk, cfg.block_m
    w = M.random_weights(cfg, 5, routing)
    x = M.random_tokens(cfg, T, 5, routing)
    logits = (bf16_to_f32(x) @ bf16_to_f32(w["Wr"]).T).astype(np.float32)
    parts = np.stack([logits / splits] * splits).reshape(splits * T, E)  # sums to the logits
    out = {
        "ids": np.full((T, K), -1, np.int32), "tw": np.zeros((T, K), np.float32),
        "counts": np.full(E, -1, np.int32), "row_off": np.zeros(E + 1, np.int32),
        "gu": np.zeros(E + 1, np.int32), "dn": np.zeros(E + 1, np.int32),
        "hw": np.zeros(E, np.int32), "dt": np.zeros(1, np.int32),
        "perm": np.full(T * K, -1, np.int32), "inv": np.full(T * K, -1, np.int32),
    }  # fmt: skip
    T_.route(E, K, BM, 2, 3, splits=splits).reference(0, parts, *out.values())
    want_ids, want_w = T_.topk_from_logits(parts.reshape(splits, T, E).sum(0), K)
    np.testing.assert_array_equal(out["ids"], want_ids)
    np.testing.assert_allclose(out["tw"], want_w, rtol=1e-6)
    tables = T_.plan_tables(want_ids, BM, 2, 3, E)
    for key, name in (
        ("row_off", "row_off"), ("gu", "gu_indptr"), ("dn", "dn_indptr"), ("hw", "h_wait"),
        ("dt", "dn_total"), ("perm", "perm"), ("inv", "inv"),
    ):  # fmt: skip
        np.testing.assert_array_equal(out[key], tables[name], err_msg=key)
    np.testing.assert_array_equal(out["counts"], np.bincount(want_ids.ravel(), minlength=E))


def test_triggered_grid_bound_is_tight_and_valid():
    """The triggered grids are floor((T*K + (BM-1)*min(E, T*K)) / BM) row
    blocks, written without min: exactly the worst routing's."""
    for cfg in (M.MoEConfig(), M.MoEConfig(block_m=16), SMALL, M.MoEConfig(topk=1)):
        g = etc.Graph("bounds")
        T = g.symbol("T")
        gu, dn = M._bounds(cfg, T)
        E, K, BM = cfg.experts, cfg.topk, cfg.block_m
        for t in [*range(0, 600), 1024, 4096, 10**6]:
            assert gu.evaluate({"T": t}) == cfg.gu_tiles(t)
            assert dn.evaluate({"T": t}) == cfg.dn_tiles(t)
            # The worst routing: min(E, T*K) experts with a row each, the
            # other rows in full blocks (sum_e ceil(c_e/BM) = A + sum_e
            # floor((c_e - 1)/BM) <= A + (T*K - A)//BM, largest at the largest A).
            n = t * K
            a = min(E, n)
            assert cfg.row_blocks(t) == a + (n - a) // BM, (t, cfg)
    assert M.MoEConfig().row_blocks(1) == 8
    assert M.MoEConfig(block_m=16).row_blocks(16) == 128


@pytest.mark.parametrize("T", [1, 5, 40, 300])  # 300: two plan instances (K = 8)
@pytest.mark.parametrize("skew", ["uniform", "one", "few"])
def test_plan_invariants(T, skew):
    cfg = WIDE
    E, K, BM = cfg.experts, cfg.topk, cfg.block_m
    rng = np.random.default_rng(T)
    if skew == "uniform":
        ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
    elif skew == "one":
        ids = np.stack([[0, *rng.permutation(np.arange(1, E))[: K - 1]] for _ in range(T)])
    else:
        ids = np.stack([rng.permutation(3)[:K] for _ in range(T)])
    ids = ids.astype(np.int32)
    fn = T_.plan(BM, cfg.n_gu, cfg.n_dn, E, K)
    names = ("row_off", "gu_indptr", "dn_indptr", "h_wait", "dn_total", "perm", "inv")
    shapes = M.tensor_shapes(cfg, T)
    arrays = {n: np.full(shapes[n][0], -7, np.int32) for n in names}
    # What the top-k atomics leave: counts, and positions in an arbitrary order.
    counts = np.bincount(ids.ravel(), minlength=E).astype(np.int32)
    pos, seen = np.empty(T * K, np.int32), np.zeros(E, np.int32)
    for s_ in rng.permutation(T * K):
        pos[s_], seen[ids.ravel()[s_]] = seen[ids.ravel()[s_]], seen[ids.ravel()[s_]] + 1
    pos = pos.reshape(T, K)
    assert T_.plan_grid(T, K) == -(-T * K // T_.PLAN_SLOTS)
    for i in reversed(range(T_.plan_grid(T, K))):
        fn.reference(i, ids, pos, counts, *(arrays[n] for n in names))
    row_off, gu, dn = arrays["row_off"], arrays["gu_indptr"], arrays["dn_indptr"]
    perm, inv = arrays["perm"], arrays["inv"]
    np.testing.assert_array_equal(np.diff(row_off), counts)
    assert row_off[0] == 0 and row_off[E] == T * K
    blocks = -(-counts // BM)
    np.testing.assert_array_equal(np.diff(gu), blocks * cfg.n_gu)
    np.testing.assert_array_equal(np.diff(dn), blocks * cfg.n_dn)
    np.testing.assert_array_equal(arrays["h_wait"], blocks * cfg.n_gu + 1)
    assert arrays["dn_total"][0] == dn[E]
    assert sorted(perm) == list(range(T * K))
    np.testing.assert_array_equal(inv[perm], np.arange(T * K))
    for e in range(E):  # rows grouped by expert, in expert order
        assert (ids.ravel()[perm[row_off[e] : row_off[e + 1]]] == e).all()
    assert gu[E] <= cfg.gu_tiles(T) and dn[E] <= cfg.dn_tiles(T)


def test_permute_and_combine_references():
    cfg = SMALL
    T, K, H, E = 5, cfg.topk, cfg.hidden, cfg.experts
    rng = np.random.default_rng(0)
    x = f32_to_bf16(rng.standard_normal((T, H), np.float32))
    ids = np.array([[0, 3], [3, 1], [0, 1], [7, 0], [3, 7]], np.int32)
    tables = T_.plan_tables(ids, cfg.block_m, cfg.n_gu, cfg.n_dn, E)
    xp = np.zeros((T * K, H), np.uint16)
    fn = T_.permute(E, K, H)
    for e in range(E):
        fn.reference(e, x, tables["row_off"], tables["perm"], xp)
    np.testing.assert_array_equal(xp, x[tables["perm"] // K])
    # combine: Yp rows are the token's rows scaled by 1 + k.
    yp = f32_to_bf16(bf16_to_f32(xp) * (1 + tables["perm"] % K)[:, None])
    tw = rng.random((T, K), np.float32)
    out = np.zeros((T, H), np.uint16)
    comb = T_.combine(2, K, H)
    for i in range(3):
        comb.reference(i, tw, tables["inv"], yp, out)
    want = sum(tw[:, k : k + 1] * bf16_to_f32(x) * (1 + k) for k in range(K))
    np.testing.assert_allclose(bf16_to_f32(out), want, rtol=1e-2, atol=1e-2)


def test_bulk_permute_tile():
    """permute(slots=S): the same rows as the 16-byte-load tile, moved whole
    by bulk copies through S shared slots (one thread and mbarrier each,
    invalidated at the end, every store awaited and fenced before the
    notification); bad slot counts name the tile or the field."""
    E, K, H = 8, 2, 64
    bulk, plain = T_.permute(E, K, H, slots=4), T_.permute(E, K, H)
    assert bulk.params == plain.params
    rng = np.random.default_rng(1)
    x = f32_to_bf16(rng.standard_normal((5, H), np.float32))
    ids = np.array([[0, 3], [3, 1], [0, 1], [7, 0], [3, 7]], np.int32)
    tables = T_.plan_tables(ids, 16, 1, 1, E)
    got, want = np.zeros((10, H), np.uint16), np.zeros((10, H), np.uint16)
    for e in range(E):
        bulk.reference(e, x, tables["row_off"], tables["perm"], got)
        plain.reference(e, x, tables["row_off"], tables["perm"], want)
    np.testing.assert_array_equal(got, want)
    src = bulk.source
    for needed in (
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
        "cp.async.bulk.global.shared::cta.bulk_group",
        "cp.async.bulk.wait_group.read 0;",
        "cp.async.bulk.wait_group 0;",
        "fence.proxy.async.global;",
        "mbarrier.inval.shared::cta.b64",
        "memref<128xi32, #gpu.address_space<workgroup>>",  # 4 slots of 128 bytes
    ):
        assert needed in src, needed
    with pytest.raises(etc.GraphError, match="tile 'moe_permute': slots=300 must be an int from 1"):
        T_.permute(E, K, H, slots=300)
    with pytest.raises(etc.GraphError, match="exceed the .* bytes of shared memory"):
        T_.permute(E, K, 2048, slots=64)
    with pytest.raises(etc.GraphError, match="permute_slots must be an int from 0 to"):
        M.MoEConfig(permute_slots=-1)
    with pytest.raises(etc.GraphError, match="permute_slots must be an int, got True"):
        M.MoEConfig(permute_slots=True)
    with pytest.raises(etc.GraphError, match="permute_slots=8 shapes the permute task, which"):
        M.preset(
            "prefill", gather=True, permute_slots=8, gate_up_options=M.PREFILL_YP["gate_up_options"]
        )
    with pytest.raises(etc.GraphError, match="gather=True refills the gate/up rings by waiting"):
        M.preset("prefill", gather=True)


def test_tile_configuration_errors():
    with pytest.raises(etc.GraphError, match="multiple of 8"):
        T_.permute(8, 2, 60)
    with pytest.raises(etc.GraphError, match="topk"):
        T_.router_topk(4, 4, 4, 5)
    with pytest.raises(etc.GraphError, match="topk=33 exceeds 32"):
        T_.router_topk(4, 4, 64, 33)
    from etc.tiles import gemm as G

    with pytest.raises(etc.GraphError, match="tile 'moe_gate_up': a_ahead=3 needs stages > a"):
        G.moe_gate_up(16, 32, 512, 256, experts=8, stages=3, unroll=1, a_ahead=3)
    with pytest.raises(etc.GraphError, match="tile 'moe_down': a_ahead=1 needs stages"):
        G.moe_down(16, 64, 512, 256, experts=8, a_ahead=1)
    with pytest.raises(etc.GraphError, match="multiple of EC"):
        T_.router_logits(4, 3, 8, 64)
    with pytest.raises(etc.GraphError, match="divide the 8 warps"):
        T_.router_logits(4, 3, 12, 64)
    with pytest.raises(etc.GraphError, match="topk_block"):
        M.MoEConfig(router_block=12, topk_block=8)
    with pytest.raises(etc.GraphError, match="block_n_gu"):
        M.MoEConfig(inter=100, block_n_gu=64)
    with pytest.raises(etc.GraphError, match="router_splits=2 needs router='tc'"):
        M.MoEConfig(router_splits=2)
    with pytest.raises(
        etc.GraphError, match="route must be one of 'split', 'fused', 'slots', got 'one'"
    ):
        M.MoEConfig(route="one")
    with pytest.raises(etc.GraphError, match="tile 'moe_route': topk=33 exceeds 32"):
        T_.route(64, 33, 16, 1, 1)
    with pytest.raises(etc.GraphError, match="max_tokens=8192 x topk=8 choices need 525312 bytes"):
        T_.route(128, 8, 16, 1, 1, max_tokens=8192)
    if M.has_trigger_api():
        big = M.MoEConfig(route="fused", route_max_tokens=8192)
        with pytest.raises(etc.GraphError, match="use the split route"):
            M.build_moe_graph(big, placeholder_gemm(big))

    for key in (
        "permute_unroll",
        "combine_unroll",
        "router_stages",
        "router_splits",
        "route_max_tokens",
    ):
        with pytest.raises(etc.GraphError, match=f"{key} must be a positive int, got 0"):
            M.MoEConfig(**{key: 0})
    with pytest.raises(etc.GraphError, match="unroll must be"):
        T_.combine(2, 2, 64, unroll=0)
    with pytest.raises(etc.GraphError, match="prefetch_ring fills the weight ring early: give"):
        G.moe_gate_up(16, 32, 512, 256, experts=8, prefetch_ring=True)
    with pytest.raises(etc.GraphError, match=r"prefetch_ring=4 groups: the ring has room for 1..3"):
        G.moe_down(16, 64, 512, 256, experts=8, stages=4, unroll=1, prefetch_ring=4)
    # A misspelt option (a MoEConfig's gate_up_options, say) names the tile and the options.
    from etc.tiles import gemm_tc as GT

    with pytest.raises(etc.GraphError, match=r"tile 'moe_gate_up': unknown option\(s\) stage; it"):
        G.moe_gate_up(16, 32, 512, 256, experts=8, stage=3)
    with pytest.raises(etc.GraphError, match=r"'moe_down_tc': unknown option\(s\) cores, split"):
        GT.moe_down(128, 64, 512, 256, experts=8, cores="tma", split=True)
    cfg = replace(SMALL, gate_up_options=(("stage", 2),))
    with pytest.raises(etc.GraphError, match=r"unknown option\(s\) stage; it takes block_size"):
        M._gemm_tiles(cfg, None)


def test_ring_prefetch_tiles():
    """prefetch_ring: @<name>__prefetch fills the ring's first groups (same
    rows and columns as the body, which starts with them in flight)."""
    from etc.tiles import gemm as G

    gu = G.moe_gate_up(16, 32, 512, 256, experts=8, stages=4, unroll=1, prefetch_ring=True)
    dn = G.moe_down(16, 64, 512, 256, experts=8, stages=3, unroll=1, prefetch_ring=1)
    plain = G.moe_down(16, 64, 512, 256, experts=8, stages=3, unroll=1)
    assert gu.prefetch == "moe_gate_up__prefetch" and gu.prefetch_fills_shared
    assert dn.prefetch == "moe_down__prefetch" and plain.prefetch is None
    commits = "nvvm.cp.async.commit.group"
    body, prefetch = dn.source.split("func.func @moe_down__prefetch")
    # The prefetch commits the ring's first group; the body one group fewer.
    assert prefetch.count(commits) == 1
    assert body.count(commits) == plain.source.count(commits) - 1
    assert gu.source.split("func.func @moe_gate_up__prefetch")[1].count(commits) == 3


# ----------------------------------------------------------------------------
# the tiles chained by hand (no scheduler)
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [SMALL, WIDE], ids=["small", "wide"])
@pytest.mark.parametrize("T", [1, 7, 16, 33])
@pytest.mark.parametrize("routing", M.ROUTINGS)
def test_tile_references_match_reference_moe(cfg, T, routing):
    cfg, x, w, ref = case(cfg, T, routing)
    a = M.run_tile_references(cfg, M.numpy_inputs(cfg, x, w))
    assert M.rel_err(a["Out"], ref) <= 1e-2
    counts = np.diff(a["row_off"])
    if routing == "one-expert":
        assert counts[0] == T
    if routing == "few-experts":
        assert (counts[2 * cfg.topk :] == 0).all()


def test_gemm_tiles_agree_with_placeholders():
    cfg, x, w, _ = case(WIDE, 16)
    real = M.run_tile_references(cfg, M.numpy_inputs(cfg, x, w), gemm_tiles(cfg))
    ph = M.run_tile_references(cfg, M.numpy_inputs(cfg, x, w), placeholder_gemm(cfg))
    np.testing.assert_array_equal(real["Out"], ph["Out"])


def test_skewed_routings_route_as_named():
    cfg = M.MoEConfig()
    for routing, check in (
        ("one-expert", lambda ids: (ids == 0).any(axis=1).all()),
        ("few-experts", lambda ids: (ids < 2 * cfg.topk).all()),
    ):
        w = M.random_weights(cfg, 0, routing, router_only=True)
        x = M.random_tokens(cfg, 64, 0, routing)
        ids, _ = T_.router_reference_rows(x, w["Wr"], cfg.topk)
        assert check(ids), routing
    assert M.MoEConfig().with_routing("top1").topk == 1


# ----------------------------------------------------------------------------
# the graph in the simulator (data-dependent triggers)
# ----------------------------------------------------------------------------
@needs_trigger
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize(
    "T,routing",
    [(1, "uniform"), (7, "uniform"), (16, "uniform"), (13, "one-expert"), (16, "few-experts")]
    + [(9, "top1"), (33, "uniform")],
)
def test_graph_in_simulator(schedule, T, routing):
    cfg, x, w, ref = case(SMALL, T, routing)
    g = M.build_moe_graph(cfg, gemm_tiles(cfg))
    out = etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": T}, schedule=schedule, seed=T)
    assert M.rel_err(out["Out"], ref) <= 1e-2
    hand = M.run_tile_references(cfg, M.numpy_inputs(cfg, x, w), gemm_tiles(cfg))
    np.testing.assert_array_equal(out["Out"], hand["Out"])


@needs_trigger
@pytest.mark.parametrize("num_ctas", [1, 3, 8])
@pytest.mark.parametrize("T,routing", [(7, "uniform"), (33, "uniform"), (13, "one-expert")])
def test_ticket_dealt_gemm_tiles_in_simulator(num_ctas, T, routing):
    # gemm_deal="ticket": each static slot of the GEMM tasks runs the next
    # unclaimed tile; the layer's output is the listed layer's, bit for bit.
    cfg, x, w, _ = case(SMALL, T, routing)
    ticket = replace(cfg, gemm_deal="ticket")
    g = M.build_moe_graph(ticket, gemm_tiles(ticket))
    assert [t.deal for t in g.tasks if t.trigger] == ["ticket", "ticket"]
    assert g.to_mlir().count("ticketed") == 2
    out = etc.simulate(g, M.numpy_inputs(ticket, x, w), {"T": T}, num_ctas=num_ctas)
    listed = etc.simulate(
        M.build_moe_graph(cfg, gemm_tiles(cfg)), M.numpy_inputs(cfg, x, w), {"T": T},
        num_ctas=num_ctas,
    )  # fmt: skip
    np.testing.assert_array_equal(out["Out"], listed["Out"])
    with pytest.raises(etc.GraphError, match="gemm_deal must be one of"):
        replace(cfg, gemm_deal="steal")


@needs_trigger
@pytest.mark.parametrize("route", ["split", "fused"])
def test_gemm_tasks_have_guarded_tables(route):
    # The plan (or the fused route) writes gu_indptr and dn_indptr, then
    # notifies `planned` from its every instance; the GEMM tasks wait for it,
    # so their trigger tables are final at their in-edges (the static
    # schedule keeps them in registers). Without the gate/up tiles' in-edge
    # only the down task's table is guarded.
    cfg = replace(SMALL, route=route, route_max_tokens=40)
    g = M.build_moe_graph(cfg, gemm_tiles(cfg))
    guarded = {t.name: g.guarded_indptr(t) for t in g.tasks if t.trigger}
    assert guarded == {"gate_up": True, "down": True}
    g = M.build_moe_graph(cfg, gemm_tiles(cfg), gate_up_waits_tables=False)
    guarded = {t.name: g.guarded_indptr(t) for t in g.tasks if t.trigger}
    assert guarded == {"gate_up": False, "down": True}
    assert g.to_mlir().count("guarded_indptr") == 1


FUSED = replace(SMALL, route="fused", route_max_tokens=40)


@needs_trigger
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize(
    "cfg,T,routing",
    [(FUSED, 1, "uniform"), (FUSED, 33, "uniform"), (FUSED, 13, "one-expert")]
    + [(FUSED, 16, "few-experts"), (FUSED, 9, "top1")]
    + [(replace(WIDE, route="fused"), 20, "uniform")],
)
def test_fused_route_graph_in_simulator(schedule, cfg, T, routing):
    # logits -> route -> permute: the split graph's answer, bit for bit, and
    # the same tables; T is bounded by the route tile's workgroup copies.
    fused, x, w, ref = case(cfg, T, routing)
    split, *_ = case(replace(cfg, route="split"), T, routing)
    g = M.build_moe_graph(fused, gemm_tiles(fused))
    assert "clear" not in {t.name for t in g.tasks} and g.symbols[0].max == fused.route_max_tokens
    out = etc.simulate(g, M.numpy_inputs(fused, x, w), {"T": T}, schedule=schedule, seed=T)
    assert M.rel_err(out["Out"], ref) <= 1e-2
    hand = M.run_tile_references(split, M.numpy_inputs(split, x, w), gemm_tiles(split))
    np.testing.assert_array_equal(out["Out"], hand["Out"])
    for table in ("row_off", "gu_indptr", "h_wait", "perm", "inv", "topk_ids"):
        np.testing.assert_array_equal(out[table], hand[table], err_msg=table)


@needs_trigger
def test_fused_route_refuses_more_tokens_than_its_bound():
    cfg, x, w, _ = case(FUSED, 41)
    g = M.build_moe_graph(cfg, placeholder_gemm(cfg))
    with pytest.raises(etc.ShapeError, match="symbol 'T' = 41 is above 40"):
        etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": 41})
    assert "pos" not in M.tensor_shapes(cfg, 41)


@needs_trigger
def test_graph_in_simulator_wide_placeholders():
    cfg, x, w, ref = case(WIDE, 20, "few-experts")
    g = M.build_moe_graph(cfg, placeholder_gemm(cfg))
    out = etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": 20})
    assert M.rel_err(out["Out"], ref) <= 1e-2


@needs_trigger
@pytest.mark.parametrize("route", M.ROUTES)
def test_unfused_graphs_in_simulator(route):
    cfg, x, w, ref = case(replace(SMALL, route=route), 7)
    assert M.rel_err(run_unfused(cfg, x, w, gemm_tiles(cfg))["Out"], ref) <= 1e-2


def run_unfused(cfg: M.MoEConfig, x, w, gemm=None) -> dict:
    """The unfused graphs of ``cfg`` (their tasks in :func:`M.unfused_tasks`
    order) simulated one after another over one set of arrays."""
    T = x.shape[0]
    arrays = M.numpy_inputs(cfg, x, w)
    graphs = M.build_unfused_graphs(cfg, gemm)
    assert tuple(task for task, _ in graphs) == M.unfused_tasks(cfg)
    for _, g in graphs:
        names = {t.name for t in g.tensors}
        out = etc.simulate(g, {k: v for k, v in arrays.items() if k in names}, {"T": T})
        arrays.update({k: out[k] for k in names})
    return arrays


def test_graph_needs_trigger_api_or_builds():
    if M.has_trigger_api():
        g = M.build_moe_graph(SMALL, placeholder_gemm(SMALL))
        assert tuple(t.name for t in g.topological_tasks()) == M.UNFUSED_TASKS
    else:
        with pytest.raises(etc.GraphError, match="triggered_by"):
            M.build_moe_graph(SMALL, placeholder_gemm(SMALL))


# ----------------------------------------------------------------------------
# PTX of the non-GEMM tiles
# ----------------------------------------------------------------------------
@needs_bindings
@needs_ptxas
@pytest.mark.parametrize(
    "cfg",
    [
        SMALL,
        M.MoEConfig(),
        M.MoEConfig(permute_unroll=3, combine_unroll=2),
        M.MoEConfig(route="fused"),
        M.MoEConfig(permute_slots=32),
        M.MoEConfig(router_block=128, topk_block=32, topk_unroll=4),
        M.MoEConfig(topk_block=8, topk_unroll=3),
    ],
    ids=[
        "small",
        "qwen3",
        "qwen3-unrolled",
        "qwen3-fused-route",
        "qwen3-bulk-permute",
        "qwen3-topk-unrolled",
        "qwen3-topk-unroll-past-block",
    ],  # fmt: skip
)
def test_small_tiles_compile(cfg):
    # Every non-GEMM task of the unfused path: its own graph, compiled to a cubin.
    compiled = []
    for task, g in M.build_unfused_graphs(cfg, placeholder_gemm(cfg)):
        if task in ("gate_up", "down"):
            continue
        artifact = etc.compile(g, schedule="static")
        assert artifact.cubin is not None, task
        compiled.append(task)
    assert compiled == [t for t in M.unfused_tasks(cfg) if t not in ("gate_up", "down")]


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_triggered_layer_compiles_with_its_tiles_called(schedule):
    # outline=True on the whole small layer: data-dependent triggers, the
    # triggered tiles' prefetches and ticket deals go through calls too.
    g = M.build_moe_graph(SMALL, gemm_tiles(SMALL))
    artifact = etc.compile(g, schedule=schedule, outline=True)
    assert artifact.cubin is not None
    called = {
        line.split()[1].rstrip(",") for line in artifact.ptx.splitlines() if "call.uni" in line
    }
    assert {t.function.name for t in g.tasks} <= called


@needs_bindings
def test_topk_and_plan_tiles_have_no_extra_barriers():
    # The top-k tile keeps its logits in registers (no workgroup memory, no
    # barrier); the plan's scan needs exactly two barriers.
    topk = T_.router_topk(32, 8, 128, 8).source
    assert "gpu.barrier" not in topk and "memref.global" not in topk
    assert topk.count("memref.atomic_rmw addi") == 1  # lane k < K: choice k
    assert T_.plan(128, 6, 8, 128, 8).source.count("gpu.barrier") == 2


@needs_bindings
def test_unrolled_topk_issues_every_token_s_loads_then_its_atomics():
    # unroll=4: a warp's four tokens' logit loads come before the first
    # selection's shuffle, and their four atomics before the first pos store.
    src = T_.router_topk(32, 32, 128, 8, splits=2, unroll=4).source
    loop = src[src.index("scf.for %r") :]
    loads = [loop.index(f"%L[%tc_u{u},") for u in range(4)]
    assert max(loads) < loop.index("gpu.shuffle")
    atomics = [loop.index(f"%counts[%emine_u{u}]") for u in range(4)]
    assert loop.count("memref.atomic_rmw addi") == 4
    assert max(atomics) < loop.index("memref.store %pmine_u0")
    # The same selection as the plain tile's, once a token.
    plain = T_.router_topk(32, 32, 128, 8, splits=2).source
    assert loop.count("gpu.shuffle xor") == 4 * plain.count("gpu.shuffle xor")
    with pytest.raises(etc.GraphError, match="unroll"):
        T_.router_topk(32, 32, 128, 8, unroll=0)
    with pytest.raises(etc.GraphError, match="topk_unroll"):
        M.MoEConfig(topk_unroll=0)


def test_presets_are_the_measured_configurations() -> None:
    decode, prefill = M.preset("decode"), M.preset("prefill")
    assert (decode.gemm, decode.block_m, decode.block_n_gu, decode.block_n_dn) == (
        "reg",
        16,
        32,
        64,
    )
    assert dict(decode.gate_up_options) == {
        "stages": 4, "unroll": 2, "rotate_k": True, "prefetch_ring": True
    }  # fmt: skip
    assert dict(decode.down_options)["rotate_k"] is True
    assert dict(decode.down_options)["prefetch_ring"] is True
    assert (prefill.gemm, prefill.block_m, prefill.router) == ("tc", 128, "tc")
    assert prefill.router_splits == 4
    assert dict(prefill.gate_up_options)["core"] == "tma"
    # Item 140: refilled rings and the down tiles' half-precision sums (no Yp).
    assert dict(prefill.gate_up_options)["refill"] == dict(prefill.down_options)["refill"] == "test"
    assert (prefill.combine, prefill.combine_dtype, prefill.combine_block) == ("atomic", "f16", 32)
    assert "Yp" not in M.tensor_shapes(prefill, 8) and "Out16" in M.tensor_shapes(prefill, 8)
    old = M.MoEConfig(**M.PREFILL_YP)
    assert (old.combine, dict(old.down_options).get("refill")) == ("task", None)
    # Session 36: past T = 2048 the down tiles' 512 columns in two passes
    # through one ring; a hidden size 512 does not divide halves the block
    # (one pass: the plain tile).
    large = M.preset("prefill_large")
    down = dict(large.down_options)
    assert (large.block_n_dn, down["sub_n"], down["sub_ring"]) == (512, 256, True)
    assert down["smem_limit"] == 226 << 10 and prefill.block_n_dn == 256
    assert (large.topk_block, large.permute_slots) == (32, 48)
    narrow = M.preset("prefill_large", hidden=768)
    assert (narrow.block_n_dn, dict(narrow.down_options)["sub_n"]) == (256, 256)
    assert M.preset("prefill_large", hidden=768, block_n_dn=128).block_n_dn == 128
    mid = M.preset("mid")
    assert (mid.block_m, dict(mid.gate_up_options)["split_n"]) == (64, True)
    single, few = M.preset("single"), M.preset("few")
    assert (single.route, single.slot_logits, few.route, few.slot_logits) == (
        "slots", True, "slots", False
    )  # fmt: skip
    # The slot tiles are the GEMV tiles (item 103): 12 gate/up ring slots, no
    # prefetch before their waits (no expert then); the down tiles fill 7 of 8.
    assert single.gemm == few.gemm == "gemv"
    assert dict(single.gate_up_options) == dict(few.gate_up_options) == {"stages": 12}
    assert dict(single.down_options) == {"stages": 8, "prefetch_ring": True}
    mma = M.SLOT_MMA_PRESETS["single"]
    assert dict(mma["gate_up_options"]) == {"stages": 4, "unroll": 2, "rotate_k": True}
    assert M.PRESET_TARGETS == {
        "single": "sm_90", "few": "sm_90", "decode": "sm_90", "prefill": "sm_90a", "mid": "sm_90a",
        "prefill_large": "sm_90a",
    }  # fmt: skip
    assert M.PRESET_MIN_CTAS_PER_SM == {
        "single": 2, "few": 2, "decode": 2, "prefill": 0, "mid": 0, "prefill_large": 0,
    }  # fmt: skip
    assert M.preset("decode", hidden=64, inter=32, experts=8, topk=2).hidden == 64
    with pytest.raises(
        etc.GraphError, match="MoE preset 'fast' is unknown; choose one of decode, single, few"
    ):
        M.preset("fast")
    # These raised a TypeError, a ValueError and passed (T = -1, an unknown routing).
    with pytest.raises(
        etc.GraphError, match="MoE preset 'decode': 'hiden' is not a MoEConfig field"
    ):
        M.preset("decode", hiden=64)
    with pytest.raises(etc.GraphError, match=r"bucket \(5,\) is not \(largest T or None, preset"):
        M.preset_family(((5,), (None, "decode")))
    with pytest.raises(etc.GraphError, match="weight_chunk must be an int >= 0, got 'x'"):
        M.preset_family(weight_chunk="x")
    cfg = M.preset("decode")
    with pytest.raises(etc.GraphError, match="random_tokens: T must be an int >= 0, got -1"):
        M.random_tokens(cfg, -1)
    with pytest.raises(etc.GraphError, match="routing 'zipf' is not one of uniform"):
        M.random_tokens(cfg, 4, routing="zipf")


@needs_trigger
def test_example_fused_route_runs_and_refuses_large_t():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "moe.py"
    small = ["--simulate", "--hidden", "64", "--inter", "32", "--experts", "8", "--topk", "2"]
    cmd = [sys.executable, str(script), *small, "--route", "fused", "--route-max-tokens", "8"]
    done = subprocess.run([*cmd, "--tokens", "1,8"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "2/2 cases match numpy" in done.stdout
    done = subprocess.run([*cmd, "--tokens", "9"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "symbol 'T' = 9 is above 8" in done.stderr and "Traceback" not in done.stderr


@needs_trigger
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_gate_up_without_the_tables_edge(schedule):
    # gate_up_waits_tables=False: the gate/up tiles' only wait is their
    # trigger (count 1); the result is unchanged, and only down and combine
    # keep the in-edge on `planned`.
    cfg, x, w, ref = case(FUSED, 9)
    g = M.build_moe_graph(cfg, gemm_tiles(cfg), gate_up_waits_tables=False)
    tasks = {t.name: t for t in g.tasks}
    assert not tasks["gate_up"].in_edges and tasks["down"].in_edges
    out = etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": 9}, schedule=schedule, seed=3)
    assert M.rel_err(out["Out"], ref) <= 1e-2


# A small layer on the TMA tiles (sm_90a) whose gate/up tiles gather their
# rows from X (MoEConfig.gather): two 128-row blocks for a large expert.
_TMA = (("core", "tma"), ("stages", 2), ("smem_limit", 220 << 10))
TMA_SMALL = M.MoEConfig(
    hidden=256, inter=192, experts=16, topk=2, block_m=128, block_n_gu=64, block_n_dn=64,
    router_block=8, router_experts=4, topk_block=4, combine_block=3, gemm="tc",
    gate_up_options=_TMA, down_options=_TMA,
)  # fmt: skip


@needs_trigger
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("route", TABLE_ROUTES)
@pytest.mark.parametrize("T,routing", [(1, "uniform"), (150, "one-expert"), (41, "top1")])
def test_gathering_gate_up_in_simulator(schedule, route, T, routing):
    # No Xp and no permute (a release task per expert): the same tables and
    # the permuted-copy graph's output bit for bit, under the same schedule.
    base = replace(TMA_SMALL, route=route, route_max_tokens=160)
    cfg, x, w, ref = case(replace(base, gather=True), T, routing)
    copy, *_ = case(base, T, routing)
    g = M.build_moe_graph(cfg)
    names = [t.name for t in g.topological_tasks()]
    assert "release" in names and "permute" not in names
    assert "Xp" not in M.tensor_shapes(cfg, T) and "Xp" not in {t.name for t in g.tensors}
    out = etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": T}, schedule=schedule, seed=T)
    want = etc.simulate(
        M.build_moe_graph(copy), M.numpy_inputs(copy, x, w), {"T": T}, schedule=schedule, seed=T
    )
    assert M.rel_err(out["Out"], ref) <= 1e-2
    for name in ("Out", "Hb", "perm", "row_off", "gu_indptr"):
        np.testing.assert_array_equal(out[name], want[name], err_msg=name)
    hand = M.run_tile_references(cfg, M.numpy_inputs(cfg, x, w))
    assert M.rel_err(hand["Out"], ref) <= 1e-2


@needs_trigger
def test_gathering_unfused_graphs_and_errors():
    cfg, x, w, ref = case(replace(TMA_SMALL, gather=True), 9)
    assert "permute" not in M.unfused_tasks(cfg) and "permute" in M.unfused_tasks(TMA_SMALL)
    assert M.rel_err(run_unfused(cfg, x, w)["Out"], ref) <= 1e-2
    for bad in (
        dict(gemm="reg", gate_up_options=()),
        dict(gate_up_options=(*_TMA, ("split_n", True))),
        dict(gate_up_options=(("stages", 2),)),
    ):
        with pytest.raises(etc.GraphError, match="gather=True needs the TMA gate/up tile"):
            replace(TMA_SMALL, gather=True, **bad)
    with pytest.raises(etc.GraphError, match="gather must be a bool"):
        replace(TMA_SMALL, gather=1)


# The same small TMA layer with the down tiles adding their weighted rows into
# float32 or half sums (MoEConfig(combine="atomic")): a zero task first, no
# Yp, and a cast task instead of the combine.
@needs_trigger
@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("route", TABLE_ROUTES)
@pytest.mark.parametrize("T,routing", [(1, "uniform"), (150, "one-expert"), (41, "top1")])
def test_atomic_combine_in_simulator(dtype, schedule, route, T, routing):
    base = replace(TMA_SMALL, route=route, route_max_tokens=160)
    atomic = replace(base, combine="atomic", combine_dtype=dtype, zero_block=7)
    cfg, x, w, ref = case(atomic, T, routing)
    sums = {"f32": "Out32", "f16": "Out16"}[dtype]
    g = M.build_moe_graph(cfg)
    names = [t.name for t in g.topological_tasks()]
    assert names[0] == "zero" and names[-2:] == ["down", "cast"]
    assert "combine" not in names and "Yp" not in {t.name for t in g.tensors}
    assert "Yp" not in M.tensor_shapes(cfg, T) and M.tensor_shapes(cfg, T)[sums] == (
        (T, cfg.hidden),
        dtype,
    )
    # The routing's last task waits for the zero task; every down tile follows it.
    last = {t.name: t for t in g.tasks}["route" if route == "fused" else "plan"]
    assert "zeroed" in {e.event.name for e in last.in_edges}
    arrays = M.numpy_inputs(cfg, x, w)
    assert arrays[sums].dtype == {"f32": np.float32, "f16": np.float16}[dtype]
    arrays[sums][...] = np.nan  # the zero task must clear it
    out = etc.simulate(g, arrays, {"T": T}, schedule=schedule, seed=T)
    assert M.rel_err(out["Out"], ref) <= 1e-2
    copy, *_ = case(base, T, routing)
    want = etc.simulate(
        M.build_moe_graph(copy), M.numpy_inputs(copy, x, w), {"T": T}, schedule=schedule, seed=T
    )
    # Summed from rows rounded to float32 or f16 (11 bits), the output is no
    # further from the reference than the combine task's (which rounds each
    # row to bf16, 8 bits, first).
    assert M.rel_err(out["Out"], ref) <= M.rel_err(want["Out"], ref) + 2**-9
    hand = M.run_tile_references(cfg, M.numpy_inputs(cfg, x, w))
    assert M.rel_err(hand["Out"], ref) <= 1e-2


def test_atomic_add_reference_adds_weighted_rows():
    from etc.tiles._mma import add_weighted_rows

    out32 = np.ones((2, 4), np.float32)
    perm, w = np.array([2, 1]), np.array([[0.5, 0.25], [2.0, 4.0]], np.float32)
    y = np.arange(8, dtype=np.float32).reshape(2, 4)
    # Row 0 is slot 2 (token 1, weight 2), row 1 slot 1 (token 0, weight 0.25).
    add_weighted_rows(y, slice(0, 2), slice(0, 4), 2, perm, w, out32)
    np.testing.assert_array_equal(out32[1], 1 + 2 * y[0])
    np.testing.assert_array_equal(out32[0], 1 + 0.25 * y[1])
    add_weighted_rows(y[:1, :2], slice(0, 1), slice(1, 3), 2, perm, w, out32)
    np.testing.assert_array_equal(out32[1], [1, 3 + 0, 5 + 2, 7])


@needs_trigger
def test_atomic_combine_unfused_graphs_and_errors():
    cfg, x, w, ref = case(replace(TMA_SMALL, combine="atomic"), 9)
    assert M.unfused_tasks(cfg)[0] == "zero" and M.unfused_tasks(cfg)[-1] == "cast"
    assert M.rel_err(run_unfused(cfg, x, w)["Out"], ref) <= 1e-2
    for bad in (
        dict(gemm="reg", down_options=()),
        dict(down_options=(*_TMA, ("split_n", True))),
        dict(down_options=(("stages", 2),)),
    ):
        with pytest.raises(etc.GraphError, match="combine='atomic' needs the TMA down tile"):
            replace(TMA_SMALL, combine="atomic", **bad)
    with pytest.raises(etc.GraphError, match="combine must be one of 'task', 'atomic'"):
        replace(TMA_SMALL, combine="fast")
    with pytest.raises(etc.GraphError, match="zero_block must be a positive int"):
        replace(TMA_SMALL, zero_block=0)
    from etc.tiles import gemm_tc

    with pytest.raises(etc.GraphError, match="tile 'moe_down_tc': combine_topk=0 needs"):
        gemm_tc.moe_down(128, 64, 256, 192, experts=16, core="tma", stages=2, combine_topk=0)
    with pytest.raises(etc.GraphError, match="combine_topk=2 needs core='tma'"):
        gemm_tc.moe_down(128, 64, 256, 192, experts=16, stages=2, combine_topk=2)
    with pytest.raises(etc.GraphError, match="combine_dtype must be 'f32' or 'f16'.*'bf16'"):
        gemm_tc.moe_down(
            128, 64, 256, 192, experts=16, core="tma", combine_topk=2, combine_dtype="bf16"
        )
    with pytest.raises(etc.GraphError, match="combine_dtype must be .*with combine_topk"):
        gemm_tc.moe_down(128, 64, 256, 192, experts=16, core="tma", combine_dtype="f16")
    with pytest.raises(etc.GraphError, match="combine_dtype must be one of 'f32', 'f16'"):
        replace(TMA_SMALL, combine="atomic", combine_dtype="bf16")
    with pytest.raises(etc.GraphError, match="combine_dtype='f16' .* needs combine='atomic'"):
        replace(TMA_SMALL, combine_dtype="f16")
    with pytest.raises(etc.GraphError, match="tile 'moe_zero': dtype must be one of"):
        T_.zero_rows(4, 256, dtype="bf16")


# The presets at sizes every one of their tiles takes (decode's rings need k >= 512).
FAMILY_SIZES = dict(hidden=512, inter=512, experts=16, topk=2)


def test_preset_family_shares_one_set_of_buffers():
    """compile_moe's configurations: each bucket's preset, all declaring the
    largest router split's logits rows, so one set of buffers serves every
    kernel; the few preset's top-k then counts T from topk_ids."""
    family = M.preset_family(**FAMILY_SIZES)
    assert [(bound, name) for bound, name, _ in family] == list(M.PRESET_BUCKETS)
    shapes = [M.tensor_shapes(cfg, 37) for _, _, cfg in family]
    assert all(s == shapes[0] for s in shapes) and shapes[0]["logits"] == ((4 * 37, 16), "f32")
    few = next(cfg for _, name, cfg in family if name == "few")
    assert (few.router_splits, few.logits_parts, few.logit_rows) == (1, 4, 4)
    # The slot kernel's gate/up tiles sum the parts the router writes (1),
    # not the buffer's rows per token (4).
    single = next(cfg for _, name, cfg in family if name == "single")
    gate_up, _ = M._gemm_tiles(single, None)
    assert "%tS1" not in gate_up.source and "gpu.shuffle idx" in gate_up.source
    tiles = M._small_tiles(few)
    assert "memref.dim %ids" in tiles["topk"].source
    assert "memref.dim %ids" not in M._small_tiles(M.preset("few", **FAMILY_SIZES))["topk"].source
    # single's 24-column gate/up blocks do not divide inter=512: 16 there.
    assert single.block_n_gu == 16 and M.preset("single").block_n_gu == 24
    with pytest.raises(etc.GraphError, match="logits_parts=2 must be 0 or an int of at least"):
        M.preset("prefill", logits_parts=2)
    with pytest.raises(etc.GraphError, match="no buckets"):
        M.preset_family(())
    # The prefill kernel adds into Out16 where the others write Yp: each
    # declares the other's, unused, so that one set of buffers serves all.
    extra = {name: cfg.extra_buffers for _, name, cfg in family}
    assert extra == {
        "single": ("Out16",), "few": ("Out16",), "mid": ("Out16",), "prefill": ("Yp",),
        "prefill_large": ("Yp",),
    }  # fmt: skip
    assert {"Yp", "Out16"} <= set(shapes[0])
    with pytest.raises(etc.GraphError, match="extra_buffers must be a tuple of Xp, Yp, Out32"):
        M.MoEConfig(extra_buffers=("Zp",))


@needs_trigger
@pytest.mark.parametrize("routing, tokens", [("uniform", "1,4,9,900"), ("one-expert", "2,5,7,130")])
def test_example_auto_preset_simulates_each_bucket(routing, tokens):
    """``examples/moe.py --preset auto --simulate``: each T runs its bucket's
    graph (single up to 2 tokens, few to 8, mid to 896, prefill above),
    all on the
    same buffers, against the float32 reference."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "moe.py"
    sizes = [f"--{k}={v}" for k, v in FAMILY_SIZES.items()]
    cmd = [sys.executable, str(script), "--simulate", "--preset", "auto", *sizes]
    done = subprocess.run(
        [*cmd, "--routing", routing, "--tokens", tokens], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    n = len(tokens.split(","))
    assert f"{n}/{n} cases match numpy on the simulator" in done.stdout


@needs_bindings
@needs_ptxas
def test_compile_moe_is_one_artifact_with_each_preset_s_target(tmp_path):
    """One artifact, a kernel per range of T: each preset's graph compiled
    for its own target and CTAs per SM (compile_buckets' per-graph options);
    ptxas assembles every kernel."""
    import json
    import subprocess

    art = M.compile_moe(**FAMILY_SIZES)
    assert art.symbol == "T" and art.bounds == [2, 8, 896, 2048, None]
    assert [a.kernel_name for a in art.artifacts] == [
        "moe_single", "moe_few", "moe_mid", "moe_prefill", "moe_prefill_large"
    ]  # fmt: skip
    for a, (_, name, _) in zip(art.artifacts, M.preset_family(**FAMILY_SIZES), strict=True):
        target = M.PRESET_TARGETS[name]
        assert f".target {target}\n" in a.ptx
        assert (".minnctapersm 2" in a.ptx) == (M.PRESET_MIN_CTAS_PER_SM[name] == 2)
        # The preset's called tiles (prefill_large's top-k), the rest inlined;
        # the table-count checks at the exit are called too.
        called = {line.split()[1].rstrip(",") for line in a.ptx.splitlines() if "call.uni" in line}
        tiles = {c for c in called if not c.startswith("__etc_check_counts_")}
        assert tiles == {"moe_topk"} if name in M.PRESET_OUTLINE else not tiles, (name, called)
        ptx = tmp_path / f"{name}.ptx"
        ptx.write_text(a.ptx)
        subprocess.run(
            ["ptxas", f"-arch={target}", str(ptx), "-o", str(tmp_path / "k.cubin")], check=True
        )
    art.save(tmp_path / "moe")
    table = json.loads((tmp_path / "moe" / "buckets.json").read_text())
    assert [b["max"] for b in table["buckets"]] == [2, 8, 896, 2048, None]
    assert table["symbol"] == "T"


@needs_bindings
def test_compile_moe_keeps_the_slot_presets_static():
    """``schedule="dynamic"`` is for the table-driven presets: the slot
    presets' kernels stay static unless ``slot_schedule`` says otherwise."""
    two = ((2, "single"), (None, "mid"))
    art = M.compile_moe(two, schedule="dynamic", **FAMILY_SIZES)
    assert [a.manifest["schedule"] for a in art.artifacts] == ["static", "dynamic"]
    art = M.compile_moe(two, schedule="dynamic", slot_schedule="dynamic", **FAMILY_SIZES)
    assert [a.manifest["schedule"] for a in art.artifacts] == ["dynamic", "dynamic"]


# ----------------------------------------------------------------------------
# slot grids (route="slots"): no tables, a static (slot, column block) grid
# ----------------------------------------------------------------------------
SLOTS_SMALL = replace(
    SMALL, hidden=256, inter=64, route="slots", block_n_gu=32, block_n_dn=64,
    gate_up_options=(("stages", 3), ("unroll", 1), ("rotate_k", True)),
    down_options=(("stages", 2), ("unroll", 1)),
)  # fmt: skip


@needs_bindings
@needs_trigger
@pytest.mark.parametrize("slot_logits", [False, True])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("T,routing", [(1, "uniform"), (5, "one-expert"), (13, "top1")])
def test_slot_route_in_simulator(slot_logits, schedule, T, routing):
    """The slot graph has no tables, triggers or permute, and its output is
    the table-driven graph's bit for bit (each row's products and the
    combine's k order are the same); the tile references chained agree."""
    cfg, x, w, ref = case(replace(SLOTS_SMALL, slot_logits=slot_logits), T, routing)
    g = M.build_moe_graph(cfg)
    names = [t.name for t in g.topological_tasks()]
    assert names == ["logits", "topk", "gate_up", "down", "combine"] == list(M.unfused_tasks(cfg))
    gate_up = {t.name: t for t in g.tasks}["gate_up"]
    waited = {e.event.name for e in gate_up.in_edges}
    assert waited == ({"scored"} if slot_logits else {"routed"})
    out = etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": T}, schedule=schedule, seed=T)
    assert M.rel_err(out["Out"], ref) <= 1e-2
    tables = replace(cfg, route="split", slot_logits=False)
    want = etc.simulate(
        M.build_moe_graph(tables), M.numpy_inputs(tables, x, w), {"T": T}, schedule=schedule
    )
    np.testing.assert_array_equal(out["Out"], want["Out"])
    np.testing.assert_array_equal(out["topk_ids"], want["topk_ids"])
    hand = M.run_tile_references(cfg, M.numpy_inputs(cfg, x, w))
    np.testing.assert_array_equal(hand["Out"], out["Out"])
    assert M.rel_err(run_unfused(cfg, x, w)["Out"], ref) <= 1e-2


@needs_bindings
def test_slot_tiles_and_their_errors():
    from etc.tiles import gemm

    gate_up = gemm.moe_gate_up(16, 32, 256, 64, experts=8, slots=2, stages=3, unroll=1)
    assert "%topk_ids: memref<?x2xi32>" in gate_up.source and "__prefetch" not in gate_up.source
    picked = gemm.moe_gate_up(
        16, 32, 256, 64, experts=8, slots=2, stages=3, unroll=1, slot_logits=2
    )
    assert "%L: memref<?x8xf32>" in picked.source and "gpu.shuffle idx" in picked.source
    assert "%tS1" in picked.source  # two parts: the second at row T
    down = gemm.moe_down(16, 64, 256, 64, experts=8, slots=2)
    assert "%Hb: memref<?x64xbf16>, %topk_ids" in down.source
    with pytest.raises(etc.GraphError, match="slot_logits picks the expert of a gate/up slot"):
        gemm.moe_down(16, 64, 256, 64, slots=2, slot_logits=1)
    with pytest.raises(etc.GraphError, match="needs the expert count"):
        gemm.moe_gate_up(16, 32, 256, 64, experts=None, slots=2, slot_logits=1)
    with pytest.raises(etc.GraphError, match="slots must be a positive"):
        gemm.moe_gate_up(16, 32, 256, 64, slots=0)
    # The top-k without tables and the combine over slot-ordered rows.
    bare = T_.router_topk(32, 8, 128, 8, counts=False).source
    assert "%counts" not in bare and "atomic_rmw" not in bare
    direct = T_.combine(4, 8, 2048, direct=True).source
    assert "%inv" not in direct and "%tw: memref<?x8xf32>, %Yp" in direct
    for bad, match in (
        (dict(route="slots", gemm="tc", gate_up_options=_TMA, down_options=_TMA),
         "route='slots' needs gemm='reg'"),
        (dict(route="slots", combine="atomic", gemm="tc", gate_up_options=_TMA,
              down_options=_TMA), "route='slots' needs gemm='reg'"),
        (dict(slot_logits=True), "slot_logits picks the slot tiles' experts; it needs route"),
        (dict(route="slots", slot_logits=1), "slot_logits must be a bool, got 1"),
    ):  # fmt: skip
        with pytest.raises(etc.GraphError, match=match):
            replace(SMALL, **bad)


#: SLOTS_SMALL whose gate/up tiles add their own columns' down projection.
SLOTS_FUSED = replace(SLOTS_SMALL, slot_logits=True, fuse_down=True, combine="atomic")


@needs_bindings
@needs_trigger
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("T,routing", [(1, "uniform"), (5, "one-expert"), (13, "top1")])
def test_fused_down_slots_in_simulator(schedule, T, routing):
    """``fuse_down``: no down task; the cast waits for every gate/up tile
    (and the top-k, whose ids it leaves complete); the output is within
    float32 rounding of the slot graph with down tiles (no bf16 rounding of
    each expert's row), and the tile references chained give it exactly."""
    cfg, x, w, ref = case(SLOTS_FUSED, T, routing)
    g = M.build_moe_graph(cfg)
    names = [t.name for t in g.topological_tasks()]
    assert names == ["zero", "logits", "topk", "gate_up", "cast"] == list(M.unfused_tasks(cfg))
    tasks = {t.name: t for t in g.tasks}
    assert [e.event.name for e in tasks["gate_up"].in_edges] == ["zeroed", "scored"]
    assert {e.event.name for e in tasks["cast"].in_edges} == {"routed", "summed"}
    assert "Yp" not in {t.name for t in g.tensors}
    out = etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": T}, schedule=schedule, seed=T)
    assert M.rel_err(out["Out"], ref) <= 1e-2
    plain = replace(cfg, fuse_down=False, combine="task")
    want = etc.simulate(M.build_moe_graph(plain), M.numpy_inputs(plain, x, w), {"T": T})
    np.testing.assert_array_equal(out["topk_ids"], want["topk_ids"])
    np.testing.assert_array_equal(out["Hb"], want["Hb"])
    assert M.rel_err(out["Out"], want["Out"]) <= 1e-2
    hand = M.run_tile_references(cfg, M.numpy_inputs(cfg, x, w))
    np.testing.assert_array_equal(hand["Out"], out["Out"])
    assert M.rel_err(run_unfused(cfg, x, w)["Out"], ref) <= 1e-2


#: SLOTS_SMALL on the CUDA-core GEMV slot tiles (etc.tiles.gemv).
SLOTS_GEMV = replace(
    SLOTS_SMALL, gemm="gemv", inter=128,
    gate_up_options=(("stages", 4),), down_options=(("stages", 2), ("prefetch_ring", True)),
)  # fmt: skip


@needs_bindings
@needs_trigger
@pytest.mark.parametrize("slot_logits, narrow", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("T,routing", [(1, "uniform"), (5, "one-expert"), (13, "top1")])
def test_gemv_slot_tiles_in_simulator(slot_logits, narrow, T, routing):
    """``gemm="gemv"``: the slot graph on etc.tiles.gemv's tiles, whose
    references are the mma slot tiles' (the same bf16 rows): the output is
    the reg tiles' bit for bit; the down tiles fill their ring before their
    slot's rows (a prefetch after the top-k's wait)."""
    sizes = dict(block_n_gu=16, block_n_dn=32) if narrow else {}  # (whole warps idle)
    cfg, x, w, ref = case(replace(SLOTS_GEMV, slot_logits=slot_logits, **sizes), T, routing)
    g = M.build_moe_graph(cfg)
    down = {t.name: t for t in g.tasks}["down"]
    assert [e.event.name for e in down.in_edges] == ["routed", "h_ready"]
    assert down.prefetch_after == 1 and down.function.prefetch == "moe_down_gemv__prefetch"
    out = etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": T}, schedule="static", seed=T)
    assert M.rel_err(out["Out"], ref) <= 1e-2
    reg = replace(cfg, gemm="reg", gate_up_options=(("stages", 3), ("unroll", 1)),
                  down_options=(("stages", 2), ("unroll", 1)))  # fmt: skip
    want = etc.simulate(M.build_moe_graph(reg), M.numpy_inputs(reg, x, w), {"T": T})
    np.testing.assert_array_equal(out["Out"], want["Out"])
    np.testing.assert_array_equal(run_unfused(cfg, x, w)["Out"], out["Out"])


@needs_bindings
@needs_trigger
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("slot_logits", [False, True])
@pytest.mark.parametrize("T,routing", [(1, "uniform"), (5, "one-expert"), (13, "top1")])
def test_last_combine_in_simulator(schedule, slot_logits, T, routing):
    """``combine="last"``: no combine task; the last of a token's slot down
    tiles of each column block writes the combine's sum (Out bit for bit the
    combine task's), and every counter is back at zero after each launch."""
    cfg, x, w, ref = case(replace(SLOTS_GEMV, slot_logits=slot_logits, combine="last"), T, routing)
    g = M.build_moe_graph(cfg)
    tasks = {t.name: t for t in g.tasks}
    assert "combine" not in tasks and not tasks["down"].out_edges
    assert [e.event.name for e in tasks["down"].in_edges] == ["routed", "h_ready"]
    arrays = M.numpy_inputs(cfg, x, w)
    for launch in range(2):  # the same counters serve the next launch
        out = etc.simulate(g, arrays, {"T": T}, schedule=schedule, seed=launch)
        assert not out["Ycount"].any()
        arrays["Ycount"] = out["Ycount"]
    assert M.rel_err(out["Out"], ref) <= 1e-2
    task = replace(cfg, combine="task")
    want = etc.simulate(M.build_moe_graph(task), M.numpy_inputs(task, x, w), {"T": T})
    np.testing.assert_array_equal(out["Out"], want["Out"])
    assert M.unfused_tasks(cfg) == ("logits", "topk", "gate_up", "down")
    np.testing.assert_array_equal(run_unfused(cfg, x, w)["Out"], out["Out"])


@needs_bindings
def test_last_combine_tile_and_its_errors():
    from etc.tiles import gemv

    dn = gemv.moe_down(16, 64, 256, 128, experts=8, slots=2, combine_topk=2)
    src = dn.source
    assert "%topk_w: memref<?x2xf32>, %Ycount: memref<?x32xi32>, %Out: memref<?x256xbf16>" in src
    # One count per tile, released and acquired at GPU scope; the K rows'
    # loads bypass L1 and come before the first add.
    assert src.count("atom.acq_rel.gpu.global.add.u32") == 1
    assert src.count("st.relaxed.gpu.global.u32") == 1
    assert src.count("ld.global.cg.v4.u32") == 2 and src.count("vector.fma %wk") == 2
    for kind, kw, match in (
        (gemv.moe_gate_up, dict(combine_topk=2), "it takes the down tile"),
        (gemv.moe_down, dict(combine_topk=3), "combine_topk = slots \\(2\\)"),
        (gemv.moe_down, dict(combine_topk=-1), "combine_topk"),
    ):
        with pytest.raises(etc.GraphError, match=match):
            kind(16, 32, 256, 128, experts=8, slots=2, **kw)
    for bad, match in (
        (dict(combine="last"), "combine='last' sums a token's rows in the slot GEMV"),
        (dict(route="slots", combine="last"), "combine='last' sums"),
    ):
        with pytest.raises(etc.GraphError, match=match):
            replace(SMALL, **bad)
    with pytest.raises(etc.GraphError, match="combine='last' sums"):
        replace(SLOTS_SMALL, combine="last")  # the mma.sync slot tiles
    with pytest.raises(etc.GraphError, match="slot_logits=True, combine='atomic'"):
        replace(SLOTS_GEMV, gemm="reg", fuse_down=True, slot_logits=True, combine="last")


@needs_bindings
@needs_ptxas
def test_last_combine_kernel_assembles(tmp_path):
    """The single preset with ``combine="last"`` at Qwen3's sizes: ptxas
    takes it at two CTAs per SM without spills."""
    cfg = M.preset("single")
    assert cfg.combine == "last"
    art = etc.compile(M.build_moe_graph(cfg), schedule="static", min_ctas_per_sm=2)
    task = etc.compile(M.build_moe_graph(replace(cfg, combine="task")), schedule="static")
    count = "atom.acq_rel.gpu.global.add.u32"  # the tile's, besides the kernel's own
    assert art.ptx.count(count) == task.ptx.count(count) + 1
    spills, _ = ptxas_info(art.ptx, tmp_path)
    assert spills == [0, 0]


@needs_bindings
def test_gemv_slot_tiles_and_their_errors():
    from etc.tiles import gemv

    gu = gemv.moe_gate_up(16, 32, 256, 128, experts=8, slots=2, stages=4)
    src = gu.source
    # A warp copies 4 rows x 128 bytes: 8 lanes per row, two rows a thread.
    assert src.count("nvvm.cp.async.shared.global") == 3 * 2 + 2  # prologue + loop
    assert "gpu.shuffle xor" in src and "math.exp" in src and "__prefetch" not in src
    dn = gemv.moe_down(16, 64, 256, 128, experts=8, slots=2, stages=2, prefetch_ring=True)
    assert dn.prefetch == "moe_down_gemv__prefetch" and dn.prefetch_fills_shared
    # 2 k chunks: a deeper ring is cut to 3 slots (2 chunks in flight).
    deep = gemv.moe_down(16, 64, 256, 128, experts=8, slots=2, stages=8).source
    assert "nvvm.cp.async.wait.group 2" in deep and "wait.group 7" not in deep
    # Chunked weights: each k step's piece from its 8-row group's chunk.
    chunked = gemv.moe_gate_up(16, 32, 256, 128, experts=8, slots=2, weight_chunk=32)
    assert "%Wgu: memref<8x256x256xbf16>" in chunked.source and "arith.remui" in chunked.source
    for kw, match in (
        (dict(slots=None), "slot tiles: give slots=K"),
        (dict(slots=2, experts=None), "need the expert count"),
        (dict(slots=2, prefetch_ring=True), "prefetch_ring fills a down tile's ring"),
        (dict(slots=2, warps=(1, 4, 2)), "unknown option"),
    ):
        with pytest.raises(etc.GraphError, match=match):
            gemv.moe_gate_up(16, 32, 256, 128, **{"experts": 8, **kw})
    with pytest.raises(etc.GraphError, match="takes block_n a multiple of 4 up to 32"):
        gemv.moe_gate_up(16, 64, 256, 128, experts=8, slots=2)
    with pytest.raises(etc.GraphError, match="takes block_n a multiple of 8 up to 64"):
        gemv.moe_down(16, 36, 256, 128, experts=8, slots=2)
    # A narrower block: whole warps past its rows copy and add nothing.
    narrow = gemv.moe_gate_up(16, 16, 256, 128, experts=8, slots=2).source
    assert "arith.cmpi ult, %tid_" in narrow and "%c128_" in narrow
    with pytest.raises(etc.GraphError, match="slot_logits picks the expert of a gate/up"):
        gemv.moe_down(16, 64, 256, 128, experts=8, slots=2, slot_logits=1)
    for bad, match in (
        (dict(gemm="gemv"), "gemm='gemv' is the slot tiles' CUDA-core GEMV"),
        (dict(gemm="simd"), "gemm must be 'reg', 'tc' or 'gemv'"),
    ):
        with pytest.raises(etc.GraphError, match=match):
            replace(SMALL, **bad)


@needs_bindings
@needs_ptxas
def test_fused_down_kernel_assembles(tmp_path):
    """The single preset with ``fuse_down`` at Qwen3's sizes: ptxas takes its
    vector reductions (sm_90) at two CTAs per SM without spills."""
    cfg = M.MoEConfig(**{**M.SLOT_MMA_PRESETS["single"], "fuse_down": True, "combine": "atomic"})
    art = etc.compile(M.build_moe_graph(cfg), schedule="static", min_ctas_per_sm=2)
    assert art.ptx.count("red.global.add.v4.f32") == 1
    spills, _ = ptxas_info(art.ptx, tmp_path)
    assert spills == [0, 0]


@needs_bindings
def test_fused_down_tile_and_its_errors():
    from etc.tiles import gemm

    fused = gemm.moe_gate_up(
        16, 32, 256, 64, experts=8, slots=2, stages=3, unroll=1, slot_logits=1, fuse_down=True
    )
    src = fused.source
    assert "%Wd: memref<8x256x64xbf16>, %Out32: memref<?x256xf32>" in src
    assert src.count("red.global.add.v4.f32") == 1 and "gpu.barrier" in src
    # Each thread's four rows: 4 x (32 / 8) 16-byte loads of Wd before the sums.
    assert src.count("vector.load %Wd[%e") == 16
    for kw, match in (
        (dict(slot_logits=0), "fuse_down appends the down projection"),
        (dict(slot_logits=1, weight_chunk=32), "weight_chunk=0"),
    ):
        with pytest.raises(etc.GraphError, match=match):
            gemm.moe_gate_up(16, 32, 256, 64, experts=8, slots=2, fuse_down=True, **kw)
    with pytest.raises(etc.GraphError, match="fuse_down appends"):
        gemm.moe_down(16, 64, 256, 64, experts=8, slots=2, fuse_down=True)
    for bad, match in (
        (dict(fuse_down=True, combine="atomic"), "fuse_down adds the slot gate/up"),
        (dict(fuse_down=True), "it needs route='slots', slot_logits=True, combine='atomic'"),
        (dict(slot_logits=False, fuse_down=True), "slot_logits=True"),
        (dict(fuse_down=1), "fuse_down must be a bool, got 1"),
        (dict(combine="atomic"), "route='slots' needs gemm='reg' or 'gemv', combine 'task' or"),
    ):  # fmt: skip
        base = SMALL if "combine" in bad and len(bad) == 2 else SLOTS_SMALL
        with pytest.raises(etc.GraphError, match=match):
            replace(base, **bad)


@needs_bindings
@needs_trigger
def test_slot_prefetches_run_after_the_top_k():
    """A slot tile's prefetch reads topk_ids: the graph places it after the
    top-k's wait (``prefetch_after=1``), and the down tiles wait for the
    top-k first. The single preset's down tiles fill their ring there."""
    ring = replace(SLOTS_SMALL, down_options=(*SLOTS_SMALL.down_options, ("prefetch_ring", True)))
    g = M.build_moe_graph(ring)
    down = {t.name: t for t in g.tasks}["down"]
    assert [e.event.name for e in down.in_edges] == ["routed", "h_ready"]
    assert down.prefetch_after == 1 and down.function.prefetch_fills_shared
    assert "prefetch_after = 1 : i64" in g.to_mlir()
    cfg, x, w, ref = case(ring, 3)
    out = etc.simulate(g, M.numpy_inputs(cfg, x, w), {"T": 3})
    assert M.rel_err(out["Out"], ref) <= 1e-2
    l2 = replace(SLOTS_SMALL, down_options=(*SLOTS_SMALL.down_options, ("prefetch_weights", True)))
    gate_up, down_tile = M._gemm_tiles(l2, None)
    assert gate_up.prefetch is None and "cp.async.bulk.prefetch.L2" in down_tile.source
    assert "arith.minui %e0, %elast" in down_tile.source  # the expert clamped to the weights
    plain = {t.name: t for t in M.build_moe_graph(SLOTS_SMALL).tasks}["down"]
    assert [e.event.name for e in plain.in_edges] == ["h_ready"] and plain.prefetch_after == 0
    single = M.preset("single")
    assert dict(single.down_options)["prefetch_ring"] is True
    from etc.tiles import gemm

    with pytest.raises(etc.GraphError, match="a prefetch \\(prefetch_ring, prefetch_weights\\)"):
        gemm.moe_gate_up(16, 32, 256, 64, slots=2, slot_logits=1, unroll=1, stages=3,
                         prefetch_ring=True)  # fmt: skip
    with pytest.raises(etc.GraphError, match="give prefetch_ring or prefetch_weights, not both"):
        gemm.moe_down(16, 64, 256, 64, slots=2, stages=2, unroll=1, prefetch_ring=True,
                      prefetch_weights=True)  # fmt: skip
    with pytest.raises(etc.GraphError, match="prefetch_weights is the slot tiles' L2 prefetch"):
        gemm.moe_down(16, 64, 256, 64, prefetch_weights=True)


@needs_trigger
@pytest.mark.parametrize(
    "flags",
    [
        ["--preset", "single"], ["--preset", "few"], ["--route", "slots", "--slot-logits"],
        ["--preset", "single", "--weight-chunk", "32"],
    ],
)  # fmt: skip
def test_example_slot_grids_simulate(flags):
    """``examples/moe.py`` with the slot presets (their route kept: only the
    flags given change a preset) and with ``--route slots``."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "moe.py"
    sizes = [f"--{k}={v}" for k, v in FAMILY_SIZES.items()]
    done = subprocess.run(
        [sys.executable, str(script), "--simulate", *sizes, *flags, "--tokens", "1,3"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2/2 cases match numpy on the simulator" in done.stdout


# ----------------------------------------------------------------------------
# chunked expert weights (the tiles' weight_chunk option)
# ----------------------------------------------------------------------------
def _chunked(cfg, gate_up=64, down=32):
    return cfg.with_weight_chunk(gate_up, down)


@needs_bindings
@needs_trigger
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("route", ["slots", "split"])
def test_chunked_weights_give_the_row_layout_s_bits(schedule, route):
    """The kernel inputs hold the weights chunked (``kernel_weights``), the
    tiles' references read them so, and the layer's output is the row
    layout's bit for bit; the reference layer takes nn.Linear rows."""
    plain = replace(SLOTS_SMALL, route=route)
    cfg = _chunked(plain)
    assert M.weight_chunks(cfg) == {"Wgu": 64, "Wd": 32}
    assert M.weight_chunks(plain) == {"Wgu": 0, "Wd": 0}
    for T in (1, 6):
        _, x, w, ref = case(cfg, T, "uniform", seed=T)
        arrays = M.numpy_inputs(cfg, x, w)
        assert (cfg.weight_name("Wgu"), cfg.weight_name("Wd")) == ("Wgu_c64", "Wd_c32")
        assert "Wgu" not in arrays and "Wd" not in arrays
        np.testing.assert_array_equal(arrays["Wgu_c64"], G.chunk_weights(w["Wgu"], 64))
        np.testing.assert_array_equal(arrays["Wd_c32"], G.chunk_weights(w["Wd"], 32))
        np.testing.assert_array_equal(arrays["Wr"], w["Wr"])
        out = etc.simulate(M.build_moe_graph(cfg), arrays, {"T": T}, schedule=schedule, seed=T)
        want = etc.simulate(
            M.build_moe_graph(plain), M.numpy_inputs(plain, x, w), {"T": T}, schedule=schedule
        )
        np.testing.assert_array_equal(out["Out"], want["Out"])
        assert M.rel_err(out["Out"], ref) <= 1e-2
        np.testing.assert_array_equal(M.run_tile_references(cfg, arrays)["Out"], out["Out"])
    # nn.Linear weights under the plain names are refused, not read as chunked.
    with pytest.raises(etc.EtcError, match="has no tensor 'Wgu'"):
        etc.simulate(M.build_moe_graph(cfg), M.numpy_inputs(plain, x, w), {"T": 6})


def test_one_artifact_refuses_mixed_weight_layouts(monkeypatch):
    """The kernels of ``compile_moe`` share one set of weights: a chunked
    decode preset next to a row-layout one is refused, naming them; with
    ``weight_chunk=64`` every preset, the TMA ones too, reads chunks."""
    monkeypatch.setitem(M.PRESETS, "decode_ch", _chunked(M.preset("decode")).__dict__)
    with pytest.raises(etc.GraphError, match=r"different layouts.*'decode_ch': \{'Wgu': 64"):
        M.preset_family(((5, "decode_ch"), (None, "decode")))
    assert len(M.preset_family(((5, "decode_ch"), (None, "decode_ch")))) == 2
    family = M.preset_family(weight_chunk=64, **FAMILY_SIZES)
    assert all(M.weight_chunks(cfg) == {"Wgu": 64, "Wd": 64} for _, _, cfg in family)
    # The TMA tiles read one box's k (64) per chunk, no other width.
    with pytest.raises(etc.GraphError, match="weight_chunk=32 needs core='tma' and chunks of 64"):
        M.preset_family(weight_chunk=32, **FAMILY_SIZES)
        M.build_moe_graph(M.preset_family(weight_chunk=32, **FAMILY_SIZES)[-1][2])


@needs_bindings
@needs_trigger
@pytest.mark.parametrize("T", [1, 4, 7, 40])
def test_chunked_preset_family_gives_the_row_family_s_bits(T):
    """Every kernel of the one artifact with chunked weights (the slot,
    table-driven and TMA tiles) gives the row-layout kernel's output bit for
    bit in the simulator, from the same nn.Linear weights."""
    rows = {name: cfg for _, name, cfg in M.preset_family(**FAMILY_SIZES)}
    for bound, name, cfg in M.preset_family(weight_chunk=64, **FAMILY_SIZES):
        if bound is not None and T > bound or name.startswith("prefill") and T < 900:
            continue
        _, x, w, ref = case(cfg, T, "uniform", seed=T)
        out = etc.simulate(M.build_moe_graph(cfg), M.numpy_inputs(cfg, x, w), {"T": T})
        plain = rows[name]
        want = etc.simulate(M.build_moe_graph(plain), M.numpy_inputs(plain, x, w), {"T": T})
        np.testing.assert_array_equal(out["Out"], want["Out"])
        assert M.rel_err(out["Out"], ref) <= 1e-2
        break

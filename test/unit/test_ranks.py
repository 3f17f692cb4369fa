"""Graphs that span ranks (GPUs): the graph API's rules, edge maps that name the
rank, the multi-rank simulator (both schedules, 1-8 ranks, deadlocks and wrong
wait counts), the manifest and launch-time checks, and the compiled kernels of
the GEMM + Reduce-Scatter and All-Gather + GEMM graphs (needs the bindings and
ptxas for the last ones)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from unit_helpers import make_fn

import etc
from etc import DeadlockError, GraphError, ShapeError
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.edgemap import parse_edge_map
from etc.models import collective as C
from etc.runtime.checks import check_bound_graph
from etc.runtime.manifest import parse_manifest

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
SMALL = C.CollectiveConfig(k=64, block_m=32, block_n=32, stages=2, block_size=128)
I64, F32 = "memref<?xi64>", "memref<?xf32>"


def _send(d: int, i: int, rank: int, out) -> None:
    out[d] = out[d]  # no data: the events are what is tested


def ring_graph(count: int | None = None, deal: str = "list") -> etc.Graph:
    """Each rank notifies every rank's coordinate i of a ranked event; each
    rank's sink waits for all of them on its own copy (wait count: ranks).
    ``deal``: how each rank's static schedule deals the sinks."""
    g = etc.Graph("ring")
    rank, ranks = g.ranks()
    n = g.symbol("n")
    out = g.tensor("out", (n,), "f32")
    e = g.event((ranks, n), wait_count=ranks if count is None else count, name="e", ranked=True)
    send = make_fn("send", "index", "index", "index", F32)
    sink = make_fn("sink", "index", F32, reference=lambda i, o: o.__setitem__(i, o[i] + 1))
    g.task(send, grid=(ranks, n), args=(rank, out), out_edges={e: "di->d,i"})
    g.task(sink, grid=(n,), args=(out,), in_edges={e: "i->rank,i"}, deal=deal)
    return g


def test_edge_maps_name_the_rank() -> None:
    m = parse_edge_map("di->d,rank,i")
    assert m.results == (("dim", 0), ("rank", 0), ("dim", 1)) and m.uses_rank
    assert m.apply((3, 5), rank=2) == (3, 2, 5)
    assert m.to_mlir() == "(d, i)[rank] -> (d, rank, i)"
    a = parse_edge_map("(s, i)[r] -> (r, s)")
    assert a.results == (("rank", 0), ("dim", 0)) and a.apply((1, 9), rank=4) == (4, 1)
    assert not parse_edge_map("ij->i").uses_rank
    with pytest.raises(GraphError, match="may use one symbol"):
        parse_edge_map("(i)[a, b] -> (a)")


def test_graph_rules_name_the_culprit() -> None:
    g = etc.Graph("rules")
    n = g.symbol("n")
    out = g.tensor("out", (n,), "f32")
    with pytest.raises(GraphError, match="call graph.ranks"):
        g.event((n,), 1, ranked=True)
    with pytest.raises(GraphError, match="does not span ranks"):
        g.peer_table(out)
    fn = make_fn("f", "index", F32)
    e = g.event((n,), 1, name="local")
    with pytest.raises(GraphError, match="names the rank"):
        g.task(fn, grid=(n,), args=(out,), out_edges={e: "i->rank"})
    rank, ranks = g.ranks()
    with pytest.raises(GraphError, match="already declared its ranks"):
        g.ranks()
    with pytest.raises(GraphError, match="dimension 0 of a ranked event must be"):
        g.event((n, ranks), 1, ranked=True)
    table = g.tensor("counts", (ranks, n), "i32")
    with pytest.raises(GraphError, match="cannot read its wait counts"):
        g.event((ranks, n), table, ranked=True)
    r = g.event((ranks, n), ranks, name="r", ranked=True)
    with pytest.raises(GraphError, match="must address dimension 0 of the ranked event"):
        g.task(fn, grid=(n,), args=(out,), in_edges={r: "i->0,i"})
    with pytest.raises(GraphError, match="symbol 'rank' \\(an index\\)"):
        g.task(make_fn("h", "index", F32, F32), grid=(n,), args=(rank, out))
    peers = g.peer_table(out)
    assert peers.name == "out_peers" and peers.shape == (ranks,) and peers.peers_of is out


def test_mlir_carries_ranked_events_and_rank_operands() -> None:
    text = ring_graph().to_mlir()
    assert "count %ranks ranked" in text
    assert "rank(%rank) args(%out : memref<?xf32>) ins(%e[(i)[rank] -> (rank, i)]" in text
    assert "args(%rank, %out : index, memref<?xf32>)" in text


def test_validate_checks_ranked_fan_in_against_all_ranks() -> None:
    ring_graph().validate()
    with pytest.raises(GraphError, match="differs from its fan-in ranks from all ranks"):
        ring_graph(count=1).validate()


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
def test_ring_in_the_simulator(schedule: str, ranks: int) -> None:
    outs = etc.simulate_ranks(ring_graph(), [{}] * ranks, {"n": 5}, schedule=schedule, seed=ranks)
    assert [o["out"].tolist() for o in outs] == [[1.0] * 5] * ranks


@pytest.mark.parametrize("deal", ["ticket", "pool"])
@pytest.mark.parametrize("ranks", [1, 3])
def test_each_rank_draws_from_its_own_counters(deal: str, ranks: int) -> None:
    """Tickets and pools are per rank: every rank's sinks each run once (the
    sink adds 1), and the drawn counters are local, not system-scope."""
    for ctas in (1, 2, 4):
        outs = etc.simulate_ranks(
            ring_graph(deal=deal), [{}] * ranks, {"n": 5}, schedule="static", num_ctas=ctas
        )
        assert [o["out"].tolist() for o in outs] == [[1.0] * 5] * ranks
    art = etc.compile(ring_graph(deal=deal), schedule="static", cubin=False)
    events = {e["name"]: e for e in art.manifest["events"]}
    counter = f"{'ticket' if deal == 'ticket' else 'pool'}.sink"
    assert counter in events and not events[counter].get("ranked")
    assert "atom.relaxed.gpu.global.add.u32" in art.ptx


def test_simulate_refuses_mixups() -> None:
    with pytest.raises(etc.EtcError, match="simulate_ranks"):
        etc.simulate(ring_graph(), {}, {"n": 2})
    with pytest.raises(etc.EtcError, match="does not span ranks"):
        etc.simulate_ranks(etc.Graph("x"), [{}], {})
    with pytest.raises(ShapeError, match="bound per rank"):
        etc.simulate_ranks(ring_graph(), [{}, {}], {"n": 2, "rank": 0})


def _too_high() -> etc.Graph:
    """The ring with a symbolic count one too high: only the run can tell."""
    g = etc.Graph("ring_high")
    rank, ranks = g.ranks()
    n = g.symbol("n")
    out = g.tensor("out", (n,), "f32")
    e = g.event((ranks, n), wait_count=ranks + n - n + 1, name="e", ranked=True)
    g.task(
        make_fn("s", "index", "index", F32), grid=(ranks, n), args=(out,), out_edges={e: "di->d,i"}
    )
    g.task(make_fn("k", "index", F32), grid=(n,), args=(out,), in_edges={e: "i->rank,i"})
    return g


def test_wrong_count_is_reported_before_running() -> None:
    with pytest.raises(GraphError, match="differs from its fan-in"):
        _too_high().validate()


def test_rank_dependent_fan_in_is_checked_per_rank() -> None:
    # Rank r notifies only coordinate (d, r): a map that names the rank, so
    # the count (1) can only be checked with the ranks bound.
    g = etc.Graph("gather")
    rank, ranks = g.ranks()
    out = g.tensor("out", (ranks,), "f32")
    e = g.event((ranks, ranks), wait_count=2, name="e", ranked=True)
    g.task(make_fn("s", "index", F32), grid=(ranks,), args=(out,), out_edges={e: "d->d,rank"})
    g.task(make_fn("k", "index", F32), grid=(ranks,), args=(out,), in_edges={e: "s->rank,s"})
    assert any("depends on the rank" in note for note in g.validate())
    with pytest.raises(GraphError, match=r"rank 0: coordinate \(0, 0\) receives 1"):
        etc.simulate_ranks(g, [{}, {}], {})


def test_miscount_is_reported_per_rank() -> None:
    # Every rank notifies coordinate (0, 0): rank 0's copy gets 2, rank 1's none.
    g = etc.Graph("lost")
    rank, ranks = g.ranks()
    out = g.tensor("out", (ranks,), "f32")
    e = g.event((ranks, 1), wait_count=1, name="e", ranked=True)
    g.task(make_fn("s", "index", F32), grid=(1,), args=(out,), out_edges={e: "i->0,i"})
    g.task(make_fn("k", "index", F32), grid=(1,), args=(out,), in_edges={e: "i->rank,i"})
    with pytest.raises(GraphError, match=r"rank 0: coordinate \(0, 0\) receives 2"):
        etc.simulate_ranks(g, [{}, {}], {})


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_deadlock_names_the_stuck_rank(schedule: str) -> None:
    # A data-dependent (table) count one too high on rank 1 only: rank 1's
    # sink never starts, so neither does its reply to rank 0.
    g = etc.Graph("stuck")
    rank, ranks = g.ranks()
    out = g.tensor("out", (ranks,), "f32")
    table = g.tensor("table", (1,), "i32")
    local = g.event((1,), wait_count=table, name="local")
    e = g.event((ranks, 1), wait_count=ranks, name="e", ranked=True)
    g.task(make_fn("a", "index", F32), grid=(1,), args=(out,), out_edges={local: "i->i"})
    g.task(
        make_fn("s", "index", "index", F32), grid=(ranks, 1), args=(out,),
        in_edges={local: "di->i"}, out_edges={e: "di->d,i"},
    )  # fmt: skip
    g.task(make_fn("k", "index", F32), grid=(1,), args=(out,), in_edges={e: "i->rank,i"})
    ok = np.array([1], np.int32)
    outs = etc.simulate_ranks(g, [{"table": ok}, {"table": ok}], {}, schedule=schedule)
    assert len(outs) == 2
    high = np.array([2], np.int32)
    with pytest.raises(DeadlockError, match="rank 1"):
        etc.simulate_ranks(g, [{"table": ok}, {"table": high}], {}, schedule=schedule)


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize(
    "op",
    [
        "gemm_rs", "gemm_rs_fused", "gemm_rs_rij", "gemm_rs_fused_rij", "ag_gemm",
        "ag_gemm_parts", "ag_gemm_gathered", "ag_gemm_one_load", "ag_gemm_gathered_rji",
        "ag_gemm_jir",
    ],
)  # fmt: skip
def test_collective_graphs_match_numpy(op: str, ranks: int, schedule: str) -> None:
    rng = np.random.default_rng(ranks)
    rows, n, k = 64, 96, SMALL.k

    def vals(*shape: int) -> np.ndarray:
        return bf16_to_f32(f32_to_bf16(rng.standard_normal(shape).astype(np.float32) * 0.1))

    if op.startswith("gemm_rs"):  # _fused: the reduction in the own rows' epilogue
        g = C.gemm_reduce_scatter(
            {
                "gemm_rs": SMALL,
                "gemm_rs_fused": dataclasses.replace(SMALL, fused_reduce=True),
                "gemm_rs_rij": dataclasses.replace(SMALL, gemm_order="rij", loads_in_flight=1),
                "gemm_rs_fused_rij": dataclasses.replace(
                    SMALL, fused_reduce=True, gemm_order="rij"
                ),
            }[op]
        )
        xs = [vals(ranks * rows, k) for _ in range(ranks)]
        ws = [vals(n, k) for _ in range(ranks)]
        inputs = [{"X": x, "W": w} for x, w in zip(xs, ws, strict=True)]
        want = C.reference_gemm_reduce_scatter(xs, ws)
        name = "out"
    else:  # ag_gemm_parts: each row block's copy in two tiles; _own: own chunk first
        cfg = {
            "ag_gemm": SMALL,
            "ag_gemm_parts": dataclasses.replace(SMALL, copy_parts=2),
            "ag_gemm_gathered": dataclasses.replace(SMALL, own_first=False, copy_parts=2),
            "ag_gemm_one_load": dataclasses.replace(SMALL, loads_in_flight=1),
            "ag_gemm_gathered_rji": dataclasses.replace(SMALL, own_first=False, gemm_order="rji"),
            "ag_gemm_jir": dataclasses.replace(SMALL, gemm_order="jir"),
        }[op]
        g = C.allgather_gemm(cfg)
        as_ = [vals(rows, k) for _ in range(ranks)]
        ws = [vals(n, k) for _ in range(ranks)]
        inputs = [{"A": a, "W": w} for a, w in zip(as_, ws, strict=True)]
        want = C.reference_allgather_gemm(as_, ws)
        name = "C"
    outs = etc.simulate_ranks(g, inputs, {"rows": rows, "N": n}, schedule=schedule, seed=3)
    for r in range(ranks):
        got = bf16_to_f32(outs[r][name]).reshape(want[r].shape)
        assert np.abs(got - want[r]).max() <= 1e-2 * np.abs(want[r]).max(), (op, r)


def test_manifest_and_launch_checks_of_a_ranked_artifact(tmp_path) -> None:
    pytest.importorskip("etc._mlir_libs")
    etc.compile(C.gemm_reduce_scatter(SMALL), schedule="dynamic").save(tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["ranks"] == {"rank": "rank", "count": "ranks"}
    assert [p["kind"] for p in m["params"]][-1] == "peers"
    assert m["events"][0] == {
        "name": "rs", "shape": ["ranks", "rows//32", "N//32"], "wait_count": "ranks",
        "ranked": True,
    }  # fmt: skip
    # Both tasks are ready at start: the reduce waits on the ranked event after the pop.
    assert [t["ready_at_start"] for t in m["tasks"]] == [True, True]
    parsed = parse_manifest(json.loads(json.dumps(m)), tmp_path)
    assert parsed.ranks == ("rank", "ranks") and parsed.events[0].ranked
    check_bound_graph(parsed, {"ranks": 4, "rank": 3, "rows": 64, "N": 64})
    with pytest.raises(etc.LaunchError, match="rank 4 is outside 0..3"):
        check_bound_graph(parsed, {"ranks": 4, "rank": 4, "rows": 64, "N": 64})
    broken = json.loads(json.dumps(m))
    broken["params"] = [p for p in broken["params"] if p["kind"] != "peers"]
    with pytest.raises(etc.LaunchError, match="exactly one 'peers' param"):
        parse_manifest(broken, tmp_path)
    wrong = json.loads(json.dumps(m))
    wrong["events"][0]["wait_count"] = 1
    with pytest.raises(etc.LaunchError, match="receives 2 notifications but its wait count is 1"):
        check_bound_graph(
            parse_manifest(wrong, tmp_path), {"ranks": 2, "rank": 0, "rows": 32, "N": 32}
        )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("k", 0, "k must be a positive int, got 0"),
        ("block_m", True, "block_m must be an int, got True"),
        ("core", "cuda", "core must be one of mma, wgmma, tma, got 'cuda'"),
        ("inflight", 2, "inflight must be 0 or 1, got 2"),
        ("fused_reduce", 1, "fused_reduce must be a bool, got 1"),
        ("own_first", "yes", "own_first must be a bool, got 'yes'"),
        ("warps", (2,), r"warps must be None or a pair of positive ints, got \(2,\)"),
    ],
)
def test_collective_config_names_the_bad_field(field: str, value, message: str) -> None:
    with pytest.raises(GraphError, match=f"CollectiveConfig: {message}"):
        C.CollectiveConfig(**{field: value})


def test_fused_reduce_matches_the_reduce_tiles_bit_for_bit() -> None:
    # Same partials, same fp32 order (zero, then the slots in rank order).
    rng = np.random.default_rng(5)
    rows, n, k, ranks = 64, 96, SMALL.k, 2
    xs = [f32_to_bf16(rng.standard_normal((ranks * rows, k)).astype(np.float32)) for _ in "ab"]
    ws = [f32_to_bf16(rng.standard_normal((n, k)).astype(np.float32) * 0.1) for _ in "ab"]
    inputs = [{"X": bf16_to_f32(x), "W": bf16_to_f32(w)} for x, w in zip(xs, ws, strict=True)]
    outs = {}
    for fused in (False, True):
        g = C.gemm_reduce_scatter(dataclasses.replace(SMALL, fused_reduce=fused))
        got = etc.simulate_ranks(g, inputs, {"rows": rows, "N": n}, schedule="static")
        outs[fused] = [o["out"] for o in got]
        assert ("gemm_own" in [t.name for t in g.tasks]) == fused
    for a, b in zip(outs[False], outs[True], strict=True):
        np.testing.assert_array_equal(a, b)


@needs_ptxas
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize(
    "build",
    [
        C.gemm_reduce_scatter,
        C.allgather_gemm,
        lambda cfg: C.gemm_reduce_scatter(dataclasses.replace(cfg, fused_reduce=True)),
        lambda cfg: C.allgather_gemm(dataclasses.replace(cfg, own_first=False)),
        lambda cfg: C.allgather_gemm(dataclasses.replace(cfg, loads_in_flight=1)),
        lambda cfg: C.gemm_reduce_scatter(dataclasses.replace(cfg, gemm_order="rij")),
        lambda cfg: C.allgather_gemm(dataclasses.replace(cfg, gemm_order="rij")),
    ],
    ids=[
        "gemm_rs",
        "ag_gemm",
        "gemm_rs_fused",
        "ag_gemm_gathered",
        "ag_gemm_one_load",
        "gemm_rs_rij",
        "ag_gemm_rij",
    ],  # fmt: skip
)
def test_collective_kernels_assemble(build, schedule: str) -> None:
    pytest.importorskip("etc._mlir_libs")
    cfg = C.CollectiveConfig(k=256, stages=3 if schedule == "static" else 2)
    artifact = etc.compile(build(cfg), schedule=schedule)
    assert artifact.cubin, "ptxas assembled the PTX"
    ptx = artifact.ptx
    assert "red.release.sys.global.add.u32" in ptx and "ld.acquire.sys.global.u32" in ptx
    # Peer stores of the tiles: through generic pointers loaded from the table.
    assert "st.b32" in ptx or "st.v4" in ptx or "st.global" in ptx


@pytest.mark.parametrize("tile", ["copy", "reduce"])
def test_loads_in_flight_are_checked_and_stay_ahead_of_the_stores(tile: str) -> None:
    from etc.tiles.collective import copy_to_peers, reduce_slots

    def build(unroll):  # 8 vectors per thread
        if tile == "copy":
            return copy_to_peers(32, 256, block_size=128, unroll=unroll)
        return reduce_slots(32, 256, block_size=128, unroll=unroll)

    with pytest.raises(ValueError, match="unroll must be a positive int, got 0"):
        build(0)
    with pytest.raises(GraphError, match="loads_in_flight must be a positive int"):
        C.CollectiveConfig(loads_in_flight=0)
    for unroll, kept in ((4, 4), (3, 2), (64, 8)):  # the largest divisor of 8 up to unroll
        body = build(unroll).source
        body = body[body.index("scf.for") :]
        assert body.count("vector.load") == kept, unroll
        # Every load of an iteration comes before its first store.
        assert body.rindex("vector.load") < body.index("store")


def test_collective_config_checks_the_new_options() -> None:
    for bad in ("jid", "rijr"):
        with pytest.raises(
            GraphError, match=f"gemm_order must order the letters r, i and j.*{bad!r}"
        ):
            C.CollectiveConfig(gemm_order=bad)
    with pytest.raises(GraphError, match="gemm_order must be a str or None, got 3"):
        C.CollectiveConfig(gemm_order=3)
    from etc.tiles.collective import gemm_chunk, gemm_to_peer

    with pytest.raises(ValueError, match="coords='dji2' must order the letters d, i, j"):
        gemm_to_peer(coords="dji2")
    with pytest.raises(ValueError, match="coords='sij' must order the letters i, j"):
        gemm_chunk(chunks="own", coords="sij")
    # The grid follows the order: the rank coordinate innermost for GEMM + RS by
    # default (C.GEMM_ORDER), and the signature's coordinates with it.
    g = C.gemm_reduce_scatter(SMALL)
    gemm = next(t for t in g.tasks if t.name == "gemm")
    assert C.GEMM_ORDER["gemm_rs"] == "ijr" and len(gemm.grid) == 3
    assert gemm.function.source.index("%i: index, %j: index, %d: index") > 0
    g = C.gemm_reduce_scatter(dataclasses.replace(SMALL, fused_reduce=True))
    gemm = next(t for t in g.tasks if t.name == "gemm")
    assert gemm.function.source.index("%d: index, %i: index, %j: index") > 0
    g = C.allgather_gemm(dataclasses.replace(SMALL, gemm_order="jri"))
    gemm = next(t for t in g.tasks if t.name == "gemm")
    assert gemm.function.source.index("%j: index, %s: index, %i: index") > 0


def test_launchers_refuse_bad_arguments_before_touching_a_gpu() -> None:
    from etc.runtime import ProcessRank, RankGroup

    with pytest.raises(etc.LaunchError, match="devices must be distinct"):
        RankGroup("unused", devices=[0, 0])
    with pytest.raises(etc.LaunchError, match="rank must be an int in 0..1"):
        ProcessRank("unused", 2, 2, lambda b: [b, b])
    with pytest.raises(etc.LaunchError, match="ranks must be an int >= 1"):
        ProcessRank("unused", 0, 0, lambda b: [b])
    with pytest.raises(etc.LaunchError, match="all_gather must be callable"):
        ProcessRank("unused", 0, 2, None)


def _lonely_graph() -> etc.Graph:
    """The senders notify coordinates 0 and 1 of every rank; the sink waits on 0 only."""
    g = etc.Graph("lonely")
    rank, ranks = g.ranks()
    out = g.tensor("out", (ranks,), "f32")
    e = g.event((ranks, 2), wait_count=ranks, name="e", ranked=True)
    g.task(
        make_fn("s", "index", "index", F32), grid=(ranks, 2), args=(out,), out_edges={e: "di->d,i"}
    )
    g.task(make_fn("k", "index", F32), grid=(1,), args=(out,), in_edges={e: "i->rank,i"})
    return g


def test_launch_refuses_ranked_coordinates_nobody_waits_on(tmp_path) -> None:
    pytest.importorskip("etc._mlir_libs")
    etc.compile(_lonely_graph()).save(tmp_path)
    m = parse_manifest(json.loads((tmp_path / "manifest.json").read_text()), tmp_path)
    with pytest.raises(
        etc.LaunchError, match=r"coordinate \(1, 1\) is notified but no task of rank 1"
    ):
        check_bound_graph(m, {"ranks": 2, "rank": 1})


def test_simulator_refuses_ranked_coordinates_nobody_waits_on() -> None:
    with pytest.raises(GraphError, match=r"coordinate \(0, 1\) is notified but no task of rank 0"):
        etc.simulate_ranks(_lonely_graph(), [{}, {}], {})


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True
    )


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("ranks", ["2", "4", "8"])
@pytest.mark.parametrize(
    "script, flags",
    [
        ("gemm_reduce_scatter.py", ()),
        ("gemm_reduce_scatter.py", ("--fused-reduce",)),
        ("allgather_gemm.py", ()),
        ("allgather_gemm.py", ("--gathered", "--gemm-order", "rij")),
    ],
)
def test_multi_gpu_examples_match_numpy_on_the_simulator(script, flags, ranks, schedule) -> None:
    done = _example(script, "--simulate", "--ranks", ranks, "--schedule", schedule, *flags)
    assert done.returncode == 0, done.stderr
    assert f"{ranks}/{ranks} ranks match numpy on the simulator ({schedule} schedule" in (
        done.stdout
    )


def test_multi_gpu_examples_name_a_flag_of_the_other_layer() -> None:
    done = _example("allgather_gemm.py", "--simulate", "--fused-reduce")
    assert done.returncode == 2 and "--fused-reduce does not apply to this layer" in done.stderr
    done = _example("gemm_reduce_scatter.py", "--simulate", "--gemm-order", "rrj")
    assert done.returncode == 2 and "gemm_order must order the letters r, i and j" in done.stderr
    assert "Traceback" not in done.stderr


@needs_ptxas
@pytest.mark.parametrize("script", ["gemm_reduce_scatter.py", "allgather_gemm.py"])
def test_multi_gpu_examples_emit_ptx_that_ptxas_accepts(script, tmp_path) -> None:
    pytest.importorskip("etc._mlir_libs")
    ptx = tmp_path / "k.ptx"
    done = _example(script, "--emit-ptx", str(ptx), "--schedule", "dynamic")
    assert done.returncode == 0, done.stderr
    asm = subprocess.run(
        ["ptxas", "-arch=sm_90", str(ptx), "-o", str(tmp_path / "k.cubin")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert asm.returncode == 0, asm.stderr

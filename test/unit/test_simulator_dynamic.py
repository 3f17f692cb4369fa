"""The simulator's dynamic schedule: the GPU's ready queue, interleaved step by step.

Every correct graph must give numpy's answer under every seed (interleaving)
and both push modes, with exactly one push per instance that has in-edges;
wrong wait counts must fail the way the GPU does (or louder).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from unit_helpers import make_fn, no_output, several_events_graph, table_graph  # noqa: F401

import etc
from etc import DeadlockError, EtcError, GraphError, LaunchError

# Every test: nothing may print or warn.
pytestmark = pytest.mark.usefixtures("no_output")

SEEDS = range(50)
EARLY_PUSH = [True, False]
F64 = "memref<?xf64>"


def run_dynamic(
    g: etc.Graph,
    inputs: dict[str, Any],
    symbols: dict[str, int],
    early_push: bool,
    seed: int,
    num_ctas: int | None = None,
) -> dict[str, np.ndarray]:
    """One dynamic run; checks that each instance with in-edges was pushed once."""
    stats: dict[str, int] = {}
    out = etc.simulate(
        g,
        inputs,
        symbols,
        schedule="dynamic",
        num_ctas=num_ctas if num_ctas is not None else 1 + seed % 5,
        seed=seed,
        early_push=early_push,
        stats=stats,
    )
    assert stats["pushes"] == stats["instances"] - stats["ready_at_start"], stats
    return out


# ---------------------------------------------------------------------------
# Graphs
# ---------------------------------------------------------------------------
def diamond_graph() -> etc.Graph:
    """src -> (lhs, rhs) -> join; join has two in-edges (its ready counter)."""
    g = etc.Graph("diamond")
    n = g.symbol("n")
    X, T, L, R, Y = (g.tensor(t, (n,), "f64") for t in ("X", "T", "L", "R", "Y"))
    top_l, top_r, left, right = (
        g.event((n,), wait_count=1, name=name) for name in ("top_l", "top_r", "left", "right")
    )

    def src(i, X, T):
        T[i] = X[i] + 1

    def scale(factor: float):
        def ref(i, T, out):
            out[i] = T[i] * factor

        return ref

    def join(i, L, R, Y):
        Y[i] = L[i] * R[i]

    # Inserted bottom-up: numbering must reorder them.
    g.task(
        make_fn("join", "index", F64, F64, F64, reference=join),
        grid=(n,),
        args=(L, R, Y),
        in_edges={left: "i->i", right: "i->i"},
    )
    for name, ev_in, ev_out, out, factor in (
        ("lhs", top_l, left, L, 2.0),
        ("rhs", top_r, right, R, 3.0),
    ):
        g.task(
            make_fn(name, "index", F64, F64, reference=scale(factor)),
            grid=(n,),
            args=(T, out),
            in_edges={ev_in: "i->i"},
            out_edges={ev_out: "i->i"},
        )
    g.task(
        make_fn("src", "index", F64, F64, reference=src),
        grid=(n,),
        args=(X, T),
        out_edges={top_l: "i->i", top_r: "i->i"},
    )
    return g


def fan_in_graph(width: int = 64) -> etc.Graph:
    """``width`` squares notify one coordinate; a single reduce waits on all."""
    g = etc.Graph("fan_in")
    X = g.tensor("X", (width,), "i64")
    total = g.tensor("total", (), "i64")
    done = g.event((), wait_count=width, name="done")

    def square(i, X):
        X[i] = X[i] * X[i]

    def reduce(X, total):
        total[()] = X.sum()

    g.task(
        make_fn("square", "index", f"memref<{width}xi64>", reference=square),
        grid=(width,),
        args=(X,),
        out_edges={done: "i->"},
    )
    g.task(
        make_fn("reduce", f"memref<{width}xi64>", "memref<i64>", reference=reduce),
        grid=(),
        args=(X, total),
        in_edges={done: "->"},
    )
    return g


def constant_map_graph() -> etc.Graph:
    """In-maps with constants: "(i, j) -> (i, 0)" (one producer column releases
    a whole consumer row) and "i -> 2" (one coordinate releases every
    instance), the latter next to a second in-edge (the ready-counter path)."""
    g = etc.Graph("consts")
    n = g.symbol("n")
    A = g.tensor("A", (n, 2), "i64")
    B = g.tensor("B", (n, 3), "i64")
    V = g.tensor("V", (4,), "i64")
    W = g.tensor("W", (n,), "i64")
    cols = g.event((n, 2), wait_count=1, name="cols")
    vec = g.event((4,), wait_count=1, name="vec")
    rows = g.event((n,), wait_count=3, name="rows")

    def fill_a(i, j, A):
        A[i, j] = 10 * i + j + 1

    def spread(i, j, A, B):
        B[i, j] = A[i, 0] * (j + 1)

    def fill_v(k, V):
        V[k] = 1000 * (k + 1)

    def gather(i, B, V, W):
        W[i] = B[i].sum() + V[2]

    i64 = "memref<?xi64>"
    g.task(
        make_fn("fill_a", "index", "index", "memref<?x2xi64>", reference=fill_a),
        grid=(n, 2),
        args=(A,),
        out_edges={cols: "ij->ij"},
    )
    g.task(
        make_fn("spread", "index", "index", "memref<?x2xi64>", "memref<?x3xi64>", reference=spread),
        grid=(n, 3),
        args=(A, B),
        in_edges={cols: "(i, j) -> (i, 0)"},
        out_edges={rows: "ij->i"},
    )
    g.task(
        make_fn("fill_v", "index", "memref<4xi64>", reference=fill_v),
        grid=(4,),
        args=(V,),
        out_edges={vec: "k->k"},
    )
    g.task(
        make_fn("gather", "index", "memref<?x3xi64>", "memref<4xi64>", i64, reference=gather),
        grid=(n,),
        args=(B, V, W),
        in_edges={rows: "i->i", vec: "i->2"},
    )
    return g


def partial_graph() -> etc.Graph:
    """p (grid m) notifies coordinates 0..m-1 of E (shape n); c (grid n) waits
    on E with the wait counts of table ``counts``."""
    g = etc.Graph("partial")
    n, m = g.symbol("n"), g.symbol("m")
    counts = g.tensor("counts", (n,), "i32")
    X = g.tensor("X", (n,), "i64")
    Y = g.tensor("Y", (n,), "i64")
    E = g.event((n,), wait_count=counts, name="E")

    def p(i, X):
        X[i] = i + 1

    def c(i, X, Y):
        Y[i] = X[i] * 2

    g.task(
        make_fn("p", "index", "memref<?xi64>", reference=p),
        grid=(m,),
        args=(X,),
        out_edges={E: "i->i"},
    )
    g.task(
        make_fn("c", "index", "memref<?xi64>", "memref<?xi64>", reference=c),
        grid=(n,),
        args=(X, Y),
        in_edges={E: "i->i"},
    )
    return g


# ---------------------------------------------------------------------------
# Correct graphs: numpy's answer under every interleaving
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_diamond(early_push: bool) -> None:
    g = diamond_graph()
    x = np.arange(9, dtype=np.float64)
    for seed in SEEDS:
        out = run_dynamic(g, {"X": x}, {"n": 9}, early_push, seed)
        np.testing.assert_array_equal(out["Y"], (x + 1) * 2 * (x + 1) * 3)


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_wide_fan_in(early_push: bool) -> None:
    g = fan_in_graph(64)
    x = np.arange(64)
    for seed in SEEDS:
        out = run_dynamic(g, {"X": x}, {}, early_push, seed)
        assert int(out["total"]) == int((x * x).sum())


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_task_waiting_on_several_events(early_push: bool) -> None:
    g = several_events_graph()
    i = np.arange(4)
    expected = sum(3 * ((k + 1) * 100 + i * 10) + 3 for k in range(3))
    for seed in SEEDS:
        out = run_dynamic(g, {}, {"n": 4}, early_push, seed)
        np.testing.assert_array_equal(out["Y"], expected)


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_constants_in_in_maps(early_push: bool) -> None:
    g = constant_map_graph()
    n = 5
    a0 = 10 * np.arange(n) + 1
    expected = a0 * (1 + 2 + 3) + 3000
    for seed in SEEDS:
        out = run_dynamic(g, {}, {"n": n}, early_push, seed)
        np.testing.assert_array_equal(out["W"], expected)


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_table_wait_counts(early_push: bool) -> None:
    g = table_graph()
    counts = np.full(3, 4, dtype=np.int32)
    for seed in SEEDS:
        out = run_dynamic(g, {"counts": counts}, {"experts": 3, "per": 4}, early_push, seed)
        np.testing.assert_array_equal(out["out"], np.full(3, 1 + 2 + 3 + 4))


@pytest.mark.parametrize("num_ctas", [1, 8])
def test_termination_with_more_ctas_than_work_and_empty_grids(num_ctas: int) -> None:
    g = diamond_graph()
    for n in (0, 1):
        stats: dict[str, int] = {}
        x = np.arange(n, dtype=np.float64)
        out = etc.simulate(g, {"X": x}, {"n": n}, "dynamic", num_ctas, stats=stats)
        np.testing.assert_array_equal(out["Y"], (x + 1) * 2 * (x + 1) * 3)
        assert stats["instances"] == 4 * n and stats["ready_at_start"] == n
        assert stats["pushes"] == 3 * n


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_seeds_pick_interleavings(early_push: bool) -> None:
    log: list[tuple[str, int]] = []
    g = etc.Graph("order")
    n = g.symbol("n")
    E = g.event((n,), wait_count=2, name="E")
    g.task(
        make_fn("p", "index", "index", reference=lambda i, j: log.append(("p", i))),
        grid=(n, 2),
        out_edges={E: "ij->i"},
    )
    g.task(
        make_fn("c", "index", reference=lambda i: log.append(("c", i))),
        grid=(n,),
        in_edges={E: "i->i"},
    )
    orders = []
    for seed in (*range(10), 0):
        log.clear()
        run_dynamic(g, {}, {"n": 6}, early_push, seed, num_ctas=4)
        for k, (kind, i) in enumerate(log):
            if kind == "c":
                assert log[:k].count(("p", i)) == 2
        orders.append(tuple(log))
    assert orders[0] == orders[-1]  # a seed is one interleaving
    assert len(set(orders)) > 5


# ---------------------------------------------------------------------------
# Wrong wait counts fail as on the GPU (or louder)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_table_wait_count_one_too_high_deadlocks_on_a_queue_position(early_push: bool) -> None:
    g = table_graph()
    counts = np.array([4, 5, 4], dtype=np.int32)  # expert 1 waits for a 5th token
    for seed in range(10):
        with pytest.raises(DeadlockError) as info:
            run_dynamic(g, {"counts": counts}, {"experts": 3, "per": 4}, early_push, seed)
        err = info.value
        # 12 ready-at-start adds, then emit 0 and 2 pushed; nobody fills position 14.
        assert "no task became ready for queue position 14 of 15" in str(err)
        what = "notifications"  # a table count pushes on completion
        assert (
            f"task 'emit' instance (1,) was never pushed: event 'expert_ready' at (1,) got "
            f"4 producer {what}, wait count 5" in str(err)
        )
        assert (err.event, err.coordinate, err.task, err.instance) == (
            "expert_ready",
            (1,),
            "emit",
            (1,),
        )
        assert (err.counter, err.wait_count) == (4, 5)


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_table_wait_count_one_too_low_is_a_graph_error(early_push: bool) -> None:
    # On the GPU emit(1) is pushed after 3 of its 4 producers and may read a
    # partial sum, which the launch's end reports (WaitCountError); the
    # simulator stops at the 4th notification.
    g = table_graph()
    counts = np.array([4, 3, 4], dtype=np.int32)
    what = "notification"  # a table count pushes on completion, early push or not
    for seed in range(10):
        with pytest.raises(
            GraphError,
            match=rf"{what} 4 of event 'expert_ready' at \(1,\) comes after the coordinate "
            r"reached its wait count 3 .* the wait count is too low",
        ) as info:
            run_dynamic(g, {"counts": counts}, {"experts": 3, "per": 4}, early_push, seed)
        # The GPU's error for a table count, with the attributes it names.
        err = info.value
        assert isinstance(err, etc.WaitCountError)
        assert (err.event, err.coordinate, err.table, err.counter, err.wait_count) == (
            "expert_ready", (1,), "counts", 4, 3
        )  # fmt: skip


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_zero_wait_count_is_never_released(early_push: bool) -> None:
    """Coordinates 2..4 have no producer and wait count 0. The static schedule
    runs their consumers at once; the dynamic one never pushes them (no
    notification makes a counter equal 0), on the GPU as here."""
    g = partial_graph()
    inputs = {"counts": np.array([1, 1, 0, 0, 0], dtype=np.int32)}
    symbols = {"n": 5, "m": 2}
    out = etc.simulate(g, inputs, symbols, schedule="static")
    np.testing.assert_array_equal(out["Y"], [2, 4, 0, 0, 0])
    for seed in range(10):
        with pytest.raises(DeadlockError) as info:
            run_dynamic(g, inputs, symbols, early_push, seed)
        # Positions: p(0), p(1), then c(0), c(1) pushed; c(2) never is.
        assert "no task became ready for queue position 4 of 7" in str(info.value)
        assert "a wait count of 0 never releases consumers" in str(info.value)
        assert (info.value.task, info.value.instance, info.value.wait_count) == ("c", (2,), 0)


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_zero_wait_count_with_notifications_is_never_released(early_push: bool) -> None:
    # Expert 1's four producers take its counter past 0 without equalling it.
    g = table_graph()
    counts = np.array([4, 0, 4], dtype=np.int32)
    with pytest.raises(DeadlockError, match="no task became ready for queue position 14 of 15"):
        run_dynamic(g, {"counts": counts}, {"experts": 3, "per": 4}, early_push, seed=0)


def rewriting_graph(writer: int) -> etc.Graph:
    """p(writer) raises the wait count of E from 1 to 2 while p runs."""
    g = etc.Graph("rewrite")
    T = g.tensor("T", (), "i32")
    E = g.event((), wait_count=T, name="E")

    def p(i, T):
        if i == writer:
            T[()] = 2

    g.task(
        make_fn("p", "index", "memref<i32>", reference=p),
        grid=(2,),
        args=(T,),
        out_edges={E: "i->"},
    )
    g.task(make_fn("c", "memref<i32>"), grid=(), args=(T,), in_edges={E: "->"})
    return g


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_pushing_an_instance_twice_is_a_queue_overflow(early_push: bool) -> None:
    # The count completes at 1, then again at 2 once the table says 2 (a
    # table count pushes on completion in both modes).
    g = rewriting_graph(writer=1)
    with pytest.raises(
        LaunchError, match=r"ready-queue overflow: task 'c' instance \(\) is pushed a second time"
    ):
        run_dynamic(g, {"T": np.array(1, np.int32)}, {}, early_push, seed=0, num_ctas=1)


def test_table_count_is_read_at_completion_not_at_dispatch() -> None:
    # p raises E's table count from 1 to 2 in its body: with early push the
    # count would be read at p's dispatch (1); a table count is only trusted
    # once the producer ran, so c is never pushed (1 notification < 2).
    g = etc.Graph("stuck")
    T = g.tensor("T", (), "i32")
    E = g.event((), wait_count=T, name="E")

    def p(T):
        T[()] = 2

    g.task(make_fn("p", "memref<i32>", reference=p), grid=(), args=(T,), out_edges={E: "->"})
    g.task(make_fn("c", "memref<i32>"), grid=(), args=(T,), in_edges={E: "->"})
    with pytest.raises(DeadlockError) as info:
        run_dynamic(g, {"T": np.array(1, np.int32)}, {}, True, seed=0, num_ctas=2)
    assert (
        "task 'c' instance () was never pushed: event 'E' at () got 1 producer notifications, "
        "wait count 2" in str(info.value)
    )


def test_deadlock_on_an_event_wait_names_the_wait() -> None:
    # A triggered task waits for its other in-edges after its pop: F's table
    # says 2 but only one notification comes, so the tile waits forever.
    g = etc.Graph("stuck")
    n = g.symbol("n")
    W = g.tensor("W", (n,), "i32")
    indptr = g.tensor("indptr", (n + 1,), "i32")
    F = g.event((n,), wait_count=W, name="F")
    R = g.event((n,), wait_count=1, name="R")

    def p(i, W, indptr):
        W[0], indptr[1] = 2, 1

    g.task(
        make_fn("p", "index", "memref<?xi32>", "memref<?xi32>", reference=p),
        grid=(1,),
        args=(W, indptr),
        out_edges=[(F, "i->0"), (R, "i->0")],
    )
    g.task(
        make_fn("t", "index", "index"), grid=(1,), in_edges={F: "ic->0"}, triggered_by=(R, indptr)
    )
    with pytest.raises(DeadlockError) as info:
        run_dynamic(g, {}, {"n": 1}, True, seed=0, num_ctas=2)
    assert "task 't' instance (0,) waits forever on event 'F'" in str(info.value)
    assert "counter 1 < wait count 2" in str(info.value)
    assert (info.value.counter, info.value.wait_count) == (1, 2)


def test_non_projection_in_map_is_rejected() -> None:
    g = etc.Graph("diag")
    E = g.event((2, 2), wait_count=1, name="E")
    g.task(make_fn("p", "index", "index"), grid=(2, 2), out_edges={E: "ij->ij"})
    g.task(make_fn("c", "index"), grid=(2,), in_edges={E: "i->ii"})
    etc.simulate(g, {}, {}, schedule="static")
    with pytest.raises(GraphError, match=r"in-edge #0 map 'i->ii' is not a projection"):
        etc.simulate(g, {}, {}, schedule="dynamic")


def test_early_push_must_be_a_bool() -> None:
    with pytest.raises(EtcError, match="early_push must be a bool"):
        etc.simulate(fan_in_graph(4), {}, {}, schedule="dynamic", early_push=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(("num_ctas", "chunk"), [(1, 8), (2, 8), (3, 5), (5, 3), (16, 1)])
def test_claims_come_in_the_kernels_chunks(num_ctas: int, chunk: int) -> None:
    # 64 ready-at-start instances: min(max(64 // (4 * CTAs), 1), 8) per claim.
    g = fan_in_graph(64)
    x = np.arange(64)
    stats: dict[str, int] = {}
    out = etc.simulate(g, {"X": x}, {}, "dynamic", num_ctas, seed=1, stats=stats)
    assert int(out["total"]) == int((x * x).sum())
    assert stats["chunk"] == chunk


@pytest.mark.parametrize("early_push", EARLY_PUSH)
def test_deadlock_position_with_chunked_claims(early_push: bool) -> None:
    g = table_graph()
    counts = np.array([16, 17, 16], dtype=np.int32)
    symbols = {"experts": 3, "per": 16}
    for seed in range(5):
        stats: dict[str, int] = {}
        with pytest.raises(DeadlockError, match="queue position 50 of 51"):
            etc.simulate(
                g, {"counts": counts}, symbols, "dynamic", 2, seed, early_push, stats=stats
            )
        assert stats["chunk"] == 6 and stats["pushes"] == 2

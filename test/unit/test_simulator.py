"""The CPU reference executor: numerics, counter semantics, schedules, deadlocks."""

from __future__ import annotations

import numpy as np
import pytest
from unit_helpers import (  # noqa: F401
    make_fn,
    no_output,
    several_events_graph,
    splitk_graph,
    table_graph,
)

import etc
from etc import DeadlockError, EtcError, GraphError, ShapeError

# Every test: nothing may print or warn.
pytestmark = pytest.mark.usefixtures("no_output")

SCHEDULES = ["static", "dynamic"]


# ---------------------------------------------------------------------------
# Split-K row sum (Figure 3)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("n", [1, 3, 7, 64])
def test_splitk_matches_numpy(n, schedule):
    g = splitk_graph(R=8, S=4, K=256)
    rng = np.random.default_rng(n)
    A = rng.standard_normal((n, 256)).astype(np.float32)
    for num_ctas in (1, 3, 8):
        out = etc.simulate(g, {"A": A}, {"n": n}, schedule=schedule, num_ctas=num_ctas, seed=n)
        np.testing.assert_allclose(out["C"], A.sum(axis=1), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(out["B"], A.reshape(n, 4, 64).sum(axis=2), rtol=1e-5, atol=1e-4)


def test_splitk_odd_configuration():
    g = splitk_graph(R=3, S=2, K=200)  # n not a multiple of R, chunk not of 128
    A = np.arange(7 * 200, dtype=np.float32).reshape(7, 200) / 1000
    out = etc.simulate(g, {"A": A}, {"n": 7}, schedule="dynamic", seed=3)
    np.testing.assert_allclose(out["C"], A.sum(axis=1), rtol=1e-5)


def test_inputs_are_copied_and_missing_tensors_zeroed():
    g = splitk_graph()
    A = np.ones((5, 256), dtype=np.float32)
    out = etc.simulate(g, {"A": A}, {"n": 5})
    assert out["A"] is not A and np.all(A == 1)
    assert set(out) == {"A", "B", "C"}
    assert out["B"].dtype == np.float32 and out["B"].shape == (5, 4)
    np.testing.assert_array_equal(out["C"], np.full(5, 256, dtype=np.float32))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_kept_zero_tensors_are_checked_at_both_ends(schedule):
    """A kept-zero tensor must be zero before the run (else ShapeError
    naming it and the first nonzero place) and after it (else GraphError:
    a tile does not reset it). Here the partials B are declared kept zero
    but hold the partial sums at the end."""
    g = splitk_graph(kept_zero_b=True)
    A = np.ones((5, 256), dtype=np.float32)
    with pytest.raises(GraphError, match="left kept-zero tensor 'B' with 20 nonzero values"):
        etc.simulate(g, {"A": A}, {"n": 5}, schedule=schedule)
    B = np.zeros((5, 4), np.float32)
    B[2, 1] = 3
    with pytest.raises(ShapeError, match=r"tensor 'B' is kept zero .* the first 3.0 at \(2, 1\)"):
        etc.simulate(g, {"A": A, "B": B}, {"n": 5}, schedule=schedule)
    # Undeclared, the same run is fine.
    etc.simulate(splitk_graph(), {"A": A, "B": B}, {"n": 5}, schedule=schedule)


def test_kept_zero_must_be_a_bool():
    with pytest.raises(GraphError, match="tensor 'X': kept_zero must be a bool, got 1"):
        etc.Graph("g").tensor("X", (4,), "i32", kept_zero=1)


def test_static_queues_round_robin_over_topological_order():
    g = splitk_graph(R=1, S=4, K=256)
    queues = etc.static_queues(g, {"n": 3}, num_ctas=4)
    # 12 partial_sum instances (task 0), then 3 final_sum instances (task 1).
    flat = [(0, i) for i in range(12)] + [(1, i) for i in range(3)]
    assert queues == [flat[c::4] for c in range(4)]


# ---------------------------------------------------------------------------
# Graph shapes
# ---------------------------------------------------------------------------
def copy_fn(name: str, scale: float):
    """Y[i] = X[i] * scale."""

    def ref(i, X, Y):
        Y[i] = X[i] * scale

    return make_fn(name, "index", "memref<?xf64>", "memref<?xf64>", reference=ref)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_diamond(schedule):
    g = etc.Graph("diamond")
    n = g.symbol("n")
    X, L, R, Y = (g.tensor(t, (n,), "f64") for t in ("X", "L", "R", "Y"))
    top_l = g.event((n,), wait_count=1, name="top_l")
    top_r = g.event((n,), wait_count=1, name="top_r")
    left = g.event((n,), wait_count=1, name="left")
    right = g.event((n,), wait_count=1, name="right")

    def src(i, X, T):
        T[i] = X[i] + 1

    def join(i, L, R, Y):
        Y[i] = L[i] * R[i]

    T = g.tensor("T", (n,), "f64")
    f64 = "memref<?xf64>"
    # Inserted bottom-up so that the numbering must reorder them.
    g.task(
        make_fn("join", "index", f64, f64, f64, reference=join),
        grid=(n,),
        args=(L, R, Y),
        in_edges={left: "i->i", right: "i->i"},
    )
    g.task(
        copy_fn("lhs", 2.0),
        grid=(n,),
        args=(T, L),
        in_edges={top_l: "i->i"},
        out_edges={left: "i->i"},
    )
    g.task(
        copy_fn("rhs", 3.0),
        grid=(n,),
        args=(T, R),
        in_edges={top_r: "i->i"},
        out_edges={right: "i->i"},
    )
    g.task(
        make_fn("src", "index", f64, f64, reference=src),
        grid=(n,),
        args=(X, T),
        out_edges={top_l: "i->i", top_r: "i->i"},
    )
    assert [t.name for t in g.topological_tasks()] == ["src", "lhs", "rhs", "join"]
    x = np.arange(9, dtype=np.float64)
    out = etc.simulate(g, {"X": x}, {"n": 9}, schedule=schedule, num_ctas=2)
    np.testing.assert_array_equal(out["Y"], (x + 1) * 2 * (x + 1) * 3)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_wide_fan_in(schedule):
    g = etc.Graph("fan_in")
    X = g.tensor("X", (64,), "i64")
    total = g.tensor("total", (), "i64")
    done = g.event((), wait_count=64, name="done")

    def square(i, X):
        X[i] = X[i] * X[i]

    def reduce(X, total):
        total[()] = X.sum()

    g.task(
        make_fn("square", "index", "memref<64xi64>", reference=square),
        grid=(64,),
        args=(X,),
        out_edges={done: "i->"},
    )
    g.task(
        make_fn("reduce", "memref<64xi64>", "memref<i64>", reference=reduce),
        grid=(),
        args=(X, total),
        in_edges={done: "->"},
    )
    x = np.arange(64)
    out = etc.simulate(g, {"X": x}, {}, schedule=schedule, num_ctas=5)
    assert int(out["total"]) == int((x * x).sum())


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_task_waiting_on_several_events(schedule):
    g = several_events_graph()
    out = etc.simulate(g, {}, {"n": 4}, schedule=schedule, num_ctas=3, seed=7)
    i = np.arange(4)
    expected = sum(3 * ((k + 1) * 100 + i * 10) + 3 for k in range(3))
    np.testing.assert_array_equal(out["Y"], expected)


def test_permuted_and_constant_maps():
    g = etc.Graph("perm")
    M = g.tensor("M", (2, 3), "i32")
    Y = g.tensor("Y", (3, 2), "i32")
    E = g.event((3, 2), wait_count=1, name="E")

    def produce(i, j, M):
        M[i, j] = 10 * i + j

    def consume(a, b, M, Y):
        Y[a, b] = M[b, a]

    g.task(
        make_fn("produce", "index", "index", "memref<2x3xi32>", reference=produce),
        grid=(2, 3),
        args=(M,),
        out_edges={E: "ij->ji"},
    )
    g.task(
        make_fn(
            "consume", "index", "index", "memref<2x3xi32>", "memref<3x2xi32>", reference=consume
        ),
        grid=(3, 2),
        args=(M, Y),
        in_edges={E: "(a, b) -> (a, b)"},
    )
    for schedule in SCHEDULES:
        out = etc.simulate(g, {}, {}, schedule=schedule, num_ctas=1)
        np.testing.assert_array_equal(
            out["Y"], (10 * np.arange(2)[None, :] + np.arange(3)[:, None])
        )


def order_recording_graph(log: list):
    g = etc.Graph("order")
    n = g.symbol("n")
    E = g.event((n,), wait_count=2, name="E")

    def p(i, j):
        log.append(("p", i, j))

    def c(i):
        log.append(("c", i))

    g.task(make_fn("p", "index", "index", reference=p), grid=(n, 2), out_edges={E: "ij->i"})
    g.task(make_fn("c", "index", reference=c), grid=(n,), in_edges={E: "i->i"})
    return g


def test_dynamic_order_is_seeded_and_respects_dependencies():
    orders = []
    for seed in (0, 1, 0):
        log: list = []
        etc.simulate(order_recording_graph(log), {}, {"n": 6}, schedule="dynamic", seed=seed)
        for entry in log:
            if entry[0] == "c":
                i = entry[1]
                pos = log.index(entry)
                assert ("p", i, 0) in log[:pos] and ("p", i, 1) in log[:pos]
        orders.append(log)
    assert orders[0] == orders[2] and orders[0] != orders[1]


def test_static_order_follows_the_queues():
    log: list = []
    etc.simulate(order_recording_graph(log), {}, {"n": 2}, schedule="static", num_ctas=2)
    # Queues: CTA0 = p(0,0), p(1,0), c(0); CTA1 = p(0,1), p(1,1), c(1); round-robin.
    assert log == [("p", 0, 0), ("p", 0, 1), ("p", 1, 0), ("p", 1, 1), ("c", 0), ("c", 1)]


# ---------------------------------------------------------------------------
# Data-dependent wait counts and deadlocks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_data_dependent_wait_counts(schedule):
    g = table_graph()
    out = etc.simulate(
        g, {"counts": np.full(3, 4, dtype=np.int32)}, {"experts": 3, "per": 4}, schedule=schedule
    )
    np.testing.assert_array_equal(out["out"], np.full(3, 1 + 2 + 3 + 4))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_wait_count_one_too_high_deadlocks(schedule):
    g = table_graph()
    counts = np.array([4, 5, 4], dtype=np.int32)  # expert 1 waits for a 5th token
    with pytest.raises(DeadlockError) as info:
        etc.simulate(g, {"counts": counts}, {"experts": 3, "per": 4}, schedule=schedule)
    err = info.value
    assert err.event == "expert_ready"
    assert err.coordinate == (1,)
    assert err.task == "emit" and err.instance == (1,)
    assert (err.counter, err.wait_count) == (4, 5)
    if schedule == "dynamic":
        # As on the GPU: emit(1) is never pushed, so a CTA waits on its queue
        # slot (test_simulator_dynamic.py covers the details).
        assert "no task became ready for queue position 14 of 15" in str(err)
        return
    assert "event(s) 'expert_ready'" in str(err)
    assert (
        "task 'emit' instance (1,) waits on event 'expert_ready' at (1,): counter 4 < "
        "wait count 5" in str(err)
    )


def test_table_wait_count_one_too_low_is_reported_after_a_static_run():
    # emit(1) passes its wait after 3 of its 4 producers (and may read a
    # partial sum); as the GPU's last CTA does, the run's end finds the 4th.
    g = table_graph()
    counts = np.array([4, 3, 4], dtype=np.int32)
    with pytest.raises(etc.WaitCountError) as info:
        etc.simulate(g, {"counts": counts}, {"experts": 3, "per": 4}, schedule="static")
    err = info.value
    assert (err.event, err.coordinate, err.table, err.counter, err.wait_count) == (
        "expert_ready", (1,), "counts", 4, 3
    )  # fmt: skip
    assert str(err).startswith("moe_like: event 'expert_ready' at (1,) was notified 4 times")
    assert isinstance(err, etc.LaunchError)


def test_constant_wait_count_one_too_high_is_a_graph_error():
    g = etc.Graph("g")
    E = g.event((2,), wait_count=3, name="E")
    g.task(make_fn("p", "index", "index"), grid=(2, 2), out_edges={E: "ij->i"})
    g.task(make_fn("c", "index"), grid=(2,), in_edges={E: "i->i"})
    with pytest.raises(GraphError, match=r"event 'E': wait count 3 differs from its fan-in 2"):
        etc.simulate(g, {}, {})


def test_unknown_fan_in_deadlock_is_caught_at_run_time():
    # n vs m: the fan-in is unknown before launch; with m < n coordinates
    # m..n-1 are never notified.
    g = etc.Graph("g")
    n, m = g.symbol("n"), g.symbol("m")
    E = g.event((n,), wait_count=1, name="E")
    g.task(make_fn("p", "index"), grid=(m,), out_edges={E: "i->i"})
    g.task(make_fn("c", "index"), grid=(n,), in_edges={E: "i->i"})
    etc.simulate(g, {}, {"n": 3, "m": 3})
    with pytest.raises(DeadlockError, match="event 'E'") as info:
        etc.simulate(g, {}, {"n": 3, "m": 2})
    assert info.value.coordinate == (2,)


def test_out_of_range_coordinate_names_task_event_and_map():
    g = etc.Graph("g")
    n, m = g.symbol("n"), g.symbol("m")
    E = g.event((n,), wait_count=1, name="E")
    g.task(make_fn("p", "index"), grid=(m,), out_edges={E: "i->i"})
    g.task(make_fn("c", "index"), grid=(n,), in_edges={E: "i->i"})
    with pytest.raises(
        GraphError,
        match=r"task 'p' instance \(3,\): out-edge map 'i->i' "
        r"addresses coordinate \(3,\) outside event 'E'",
    ):
        etc.simulate(g, {}, {"n": 3, "m": 4})


# ---------------------------------------------------------------------------
# Bindings and options
# ---------------------------------------------------------------------------
def test_symbol_bindings_are_checked():
    g = splitk_graph()
    with pytest.raises(ShapeError, match="no value given for symbol 'n'"):
        etc.simulate(g, {}, {})
    with pytest.raises(ShapeError, match="symbol 'n' must be >= 0, got -1"):
        etc.simulate(g, {}, {"n": -1})
    with pytest.raises(ShapeError, match="symbol 'n' must be an int"):
        etc.simulate(g, {}, {"n": 2.5})
    with pytest.raises(ShapeError, match="graph 'splitk' has no symbol 'm'"):
        etc.simulate(g, {}, {"n": 2, "m": 3})
    n = g.symbols[0]
    assert etc.simulate(g, {}, {n: 2})["C"].shape == (2,)
    n.max = 2  # as Graph.symbol("n", max=2) declares it
    with pytest.raises(ShapeError, match="symbol 'n' = 3 is above 2, the largest its tiles take"):
        etc.simulate(g, {}, {"n": 3})
    n.max = None
    assert etc.simulate(g, {}, {"n": np.int64(0)})["C"].shape == (0,)


def test_tensor_bindings_are_checked():
    g = splitk_graph()
    with pytest.raises(
        ShapeError,
        match=r"tensor 'A': expected shape \(3, 256\) \(declared "
        r"\(n, 256\)\), got \(3, 255\)",
    ):
        etc.simulate(g, {"A": np.zeros((3, 255), np.float32)}, {"n": 3})
    with pytest.raises(ShapeError, match="graph 'splitk' has no tensor 'Z'"):
        etc.simulate(g, {"Z": np.zeros(3)}, {"n": 3})
    with pytest.raises(ShapeError, match="tensor 'A': expected f32 data, got complex128"):
        etc.simulate(g, {"A": np.zeros((3, 256), np.complex128)}, {"n": 3})
    out = etc.simulate(g, {g.tensors[0]: np.ones((3, 256))}, {"n": 3})  # f64 -> f32
    assert out["A"].dtype == np.float32


def test_negative_derived_extent_is_a_shape_error():
    g = etc.Graph("g")
    n = g.symbol("n")
    g.tensor("X", (n - 2,), "f32")
    with pytest.raises(ShapeError, match=r"tensor 'X': dimension 0 \(n - 2\) evaluates to -1"):
        etc.simulate(g, {}, {"n": 1})


def test_bf16_tensors_hold_bits():
    g = etc.Graph("g")
    X = g.tensor("X", (3,), "bf16")

    def double(i, X):
        X[i] = etc.f32_to_bf16(etc.bf16_to_f32(X[i]) * 2)

    g.task(make_fn("double", "index", "memref<3xbf16>", reference=double), grid=(3,), args=(X,))
    out = etc.simulate(g, {"X": np.array([1.0, -2.5, 3.0], np.float32)}, {})
    assert out["X"].dtype == np.uint16
    np.testing.assert_array_equal(etc.bf16_to_f32(out["X"]), [2.0, -5.0, 6.0])


def test_options_are_checked():
    g = splitk_graph()
    with pytest.raises(EtcError, match="unknown schedule 'fifo'"):
        etc.simulate(g, {}, {"n": 1}, schedule="fifo")
    with pytest.raises(EtcError, match="num_ctas must be a positive int"):
        etc.simulate(g, {}, {"n": 1}, num_ctas=0)
    # These passed (a seed the static run never reads) or raised AttributeError.
    for run in (
        lambda: etc.simulate(3, {}, {}),
        lambda: etc.simulate_ranks(3, [{}], {}),
        lambda: etc.static_queues(3, {}, 2),
    ):
        with pytest.raises(EtcError, match=": expected an etc.Graph, got int"):
            run()
    with pytest.raises(EtcError, match="seed must be an int >= 0, got 'x'"):
        etc.simulate(g, {}, {"n": 1}, seed="x")
    with pytest.raises(ShapeError, match="inputs must map tensor names to arrays, got list"):
        etc.simulate(g, [np.zeros((1, 256), np.float32)], {"n": 1})
    with pytest.raises(EtcError, match="inputs must be a list of each rank's tensors, got int"):
        etc.simulate_ranks(g, 2, {"n": 1})


def test_missing_reference_names_the_task():
    g = etc.Graph("g")
    fn = etc.DeviceFunction.from_mlir("func.func @f(%i: index) {\n  return\n}", "f")
    g.task(fn, grid=(2,), name="nobody")
    with pytest.raises(EtcError, match="task 'nobody': device function 'f' has no numpy reference"):
        etc.simulate(g, {}, {})


def test_reference_failure_names_the_instance():
    g = etc.Graph("g")

    def boom(i):
        if i == 1:
            raise ValueError("bad tile")

    g.task(make_fn("f", "index", reference=boom), grid=(2,), name="t")
    with pytest.raises(
        EtcError,
        match=r"task 't' instance \(1,\): the reference of device "
        r"function 'f' raised ValueError: bad tile",
    ):
        etc.simulate(g, {}, {})


def _table_race_graph(guarded: bool) -> etc.Graph:
    """`plan` writes the wait-count table of `done`; `sink` waits on `done`,
    after `planned` when guarded (the MoE combine's shape)."""
    g = etc.Graph("table_race")
    counts = g.tensor("counts", (1,), "i32")
    out = g.tensor("out", (1,), "f32")
    planned = g.event((1,), wait_count=1, name="planned")
    done = g.event((1,), wait_count=counts, name="done")

    def plan_ref(i, counts):
        counts[0] = 2

    g.task(
        make_fn("plan", "index", "memref<1xi32>", reference=plan_ref), grid=(1,), args=(counts,),
        out_edges={planned: "i->0"},
    )  # fmt: skip
    g.task(
        make_fn("work", "index", "memref<1xf32>", reference=lambda i, o: o.__setitem__(0, o[0] + 1)),
        grid=(2,), args=(out,), in_edges={planned: "i->0"}, out_edges={done: "i->0"},
    )  # fmt: skip
    ins = [(planned, "i->0"), (done, "i->0")] if guarded else [(done, "i->0")]
    g.task(make_fn("sink", "index", "memref<1xf32>"), grid=(1,), args=(out,), in_edges=ins)
    return g


def test_wait_on_a_table_before_it_is_written_is_a_race():
    # Static schedule: the sink's CTA reaches its wait at once and reads the
    # table before `plan` writes it (the GPU ran the MoE combine early so).
    with pytest.raises(GraphError, match="read from tensor 'counts', which later became 2"):
        etc.simulate(_table_race_graph(False), {}, {}, schedule="static", num_ctas=8)
    for schedule in ("static", "dynamic"):
        out = etc.simulate(_table_race_graph(True), {}, {}, schedule=schedule, num_ctas=8)
        assert out["out"][0] == 2
    # Dynamic: the sink is pushed when `done` completes, with the table final.
    out = etc.simulate(_table_race_graph(False), {}, {}, schedule="dynamic", num_ctas=8)
    assert out["out"][0] == 2

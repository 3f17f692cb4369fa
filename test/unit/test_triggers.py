"""Data-dependent triggers (``triggered_by``): graph rules, both simulated
schedules, the manifest, and the compiled kernels' structure.

The graph is the MoE pattern in miniature: ``plan`` turns per-expert tile
counts into ``indptr`` and a wait-count table, ``gather`` (one per expert)
fires the trigger, tile ``(i, c)`` of expert ``c`` notifies ``done[c]``
(a table count: its tiles + the gather), and ``sink`` reads each expert's
tiles once ``done`` completes.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from unit_helpers import make_fn

import etc
from etc import GraphError, LaunchError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from graphs import trigger_sink_ref, trigger_tile_ref  # noqa: E402

I32 = "memref<?xi32>"


def _plan_ref(i: int, counts: np.ndarray, indptr: np.ndarray, wait: np.ndarray) -> None:
    indptr[0] = 0
    indptr[1:] = np.cumsum(counts)
    wait[:] = counts + 1


def _given_plan_ref(i: int, given: np.ndarray, indptr: np.ndarray, wait: np.ndarray) -> None:
    indptr[:] = given
    wait[:] = np.maximum(np.diff(given), 0) + 1


def trigger_graph(
    bound_slack: int = 3, *, guard: bool = True, ticket: bool = False, given: bool = False
) -> etc.Graph:
    """``guard``: the tiles wait for ``planned`` (the plan wrote ``indptr``);
    ``ticket``: the tiles are dealt by ticket; ``given``: the plan copies
    the table from the input ``counts`` (E + 1 entries) instead of summing
    counts, so a test can hand the kernel any table."""
    g = etc.Graph("trig")
    E, tiles = g.symbol("E"), g.symbol("tiles")
    counts = g.tensor("counts", (E + 1,) if given else (E,), "i32")
    indptr = g.tensor("indptr", (E + 1,), "i32")
    wait = g.tensor("wait", (E,), "i32")
    out = g.tensor("out", (tiles + bound_slack,), "i32")
    total = g.tensor("total", (E,), "i32")
    planned = g.event((1,), wait_count=1, name="planned")
    ready = g.event((E,), wait_count=1, name="ready")
    done = g.event((E,), wait_count=wait, name="done")
    g.task(
        make_fn("plan", "index", I32, I32, I32, reference=_given_plan_ref if given else _plan_ref),
        grid=(1,),
        args=(counts, indptr, wait),
        out_edges={planned: "i->0"},
    )
    g.task(
        make_fn("gather", "index", reference=lambda e: None),
        grid=(E,),
        in_edges={planned: "e->0"},
        out_edges=[(ready, "e->e"), (done, "e->e")],
    )
    g.task(
        make_fn("tile", "index", "index", I32, I32, reference=trigger_tile_ref),
        grid=(tiles + bound_slack,),
        args=(indptr, out),
        in_edges={planned: "ic->0"} if guard else None,
        out_edges={done: "ic->c"},
        triggered_by=(ready, indptr),
        deal="ticket" if ticket else "list",
    )
    g.task(
        make_fn("sink", "index", I32, I32, I32, reference=trigger_sink_ref),
        grid=(E,),
        args=(indptr, out, total),
        in_edges={done: "e->e"},
    )
    return g


def expected(counts: np.ndarray, slack: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros(int(counts.sum()) + slack, np.int32)
    start = 0
    for c, n in enumerate(counts):
        out[start : start + n] = 1000 * (c + 1) + np.arange(n)
        start += n
    total = np.array(
        [out[s : s + n].sum() for s, n in zip(np.cumsum(counts) - counts, counts, strict=True)],
        np.int32,
    )
    return out, total


COUNTS = [
    np.array([2, 0, 3, 1], np.int32),
    np.array([0, 0, 0, 5], np.int32),  # most coordinates empty, last full
    np.array([4, 0, 0, 0], np.int32),  # last coordinate empty
    np.array([1], np.int32),
    np.array([0, 7, 0, 2, 0, 0, 1, 3], np.int32),
]


@pytest.mark.parametrize("counts", COUNTS, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize(
    "schedule, early_push", [("static", True), ("dynamic", True), ("dynamic", False)]
)
def test_simulated_schedules_run_exactly_the_triggered_ranges(
    counts: np.ndarray, schedule: str, early_push: bool
) -> None:
    g = trigger_graph()
    want_out, want_total = expected(counts, 3)
    for seed in range(6):
        stats: dict[str, int] = {}
        got = etc.simulate(
            g,
            {"counts": counts},
            {"E": len(counts), "tiles": int(counts.sum())},
            schedule=schedule,
            early_push=early_push,
            seed=seed,
            num_ctas=1 + seed % 4,
            stats=stats,
        )
        np.testing.assert_array_equal(got["out"], want_out)  # the slack stays 0
        np.testing.assert_array_equal(got["total"], want_total)
        if schedule == "dynamic":
            # Every instance that runs was pushed once; the slack never was.
            assert stats["pushes"] == int(counts.sum()) + 2 * len(counts), stats


#: (schedule, early push, guarded table): every path that checks a table.
CHECKED_MODES = [
    ("static", True, True), ("static", True, False), ("dynamic", True, True),
    ("dynamic", False, True),
]  # fmt: skip
BAD_TABLES = [
    # (table, the task's grid, the range reported, the message)
    ([0, 3, 1, 5], 5, 1, r"decreases at coordinate 1: indptr\[1\] = 3 > indptr\[2\] = 1"),
    ([0, 2, 2, 9], 7, 2, r"ends coordinate 2's range at indptr\[3\] = 9, past the task's grid of "
     r"7 instances: instances 7..8 would never run"),
    # Ranges wholly past the grid: no instance of the grid lies in them.
    ([0, 5, 5, 7], 5, 2, r"ends coordinate 2's range at indptr\[3\] = 7, past the task's grid of 5"),
    ([2, 3, 4, 5], 5, 0, r"starts at indptr\[0\] = 2, not 0"),
]  # fmt: skip


@pytest.mark.parametrize("table, bound, c, message", BAD_TABLES, ids=lambda v: str(v)[:12])
@pytest.mark.parametrize("schedule, early_push, guard", CHECKED_MODES)
def test_a_table_outside_the_grid_is_reported_not_run(
    table: list[int], bound: int, c: int, message: str, schedule: str, early_push: bool,
    guard: bool,
) -> None:  # fmt: skip
    # The static schedule checks the whole table once it is final, the
    # dynamic one each range before pushing it: a bad table stops the run
    # naming the task, the table and the entries, instead of running an
    # instance outside its range or never running those past the bound.
    g = trigger_graph(0, guard=guard, given=True)
    for seed in range(4):
        with pytest.raises(etc.TriggerRangeError, match=message) as info:
            etc.simulate(
                g, {"counts": np.array(table, np.int32)}, {"E": len(table) - 1, "tiles": bound},
                schedule=schedule, early_push=early_push, seed=seed, num_ctas=1 + seed % 3,
            )  # fmt: skip
        err = info.value
        assert (err.task, err.table, err.bound) == ("tile", "indptr", bound)
        assert (err.coordinate, err.begin, err.end) == (c, table[c], table[c + 1])
        assert str(err).startswith("trig: task 'tile': trigger table 'indptr'")
        assert isinstance(err, etc.LaunchError)


def test_an_instance_outside_its_counted_range_is_named() -> None:
    # Dynamic: of [0, 3, 6, 2, 8] only range 2 fails its push check; range 3
    # pushes 2..7, and a popped instance counts its coordinate over the whole
    # table (instance 2 counts 1, whose range [3, 6) does not hold it).
    # Whichever comes first is reported.
    g = trigger_graph(0, given=True)
    given = np.array([0, 3, 6, 2, 8], np.int32)
    seen = set()
    for seed in range(40):
        with pytest.raises(etc.TriggerRangeError) as info:
            etc.simulate(
                g, {"counts": given}, {"E": 4, "tiles": 8}, schedule="dynamic", seed=seed,
                num_ctas=1 + seed % 3,
            )  # fmt: skip
        err = info.value
        if err.instance is None:
            assert (err.coordinate, err.begin, err.end) == (2, 6, 2)
        else:
            assert not err.begin <= err.instance < err.end
            assert (err.begin, err.end) == (
                int(given[err.coordinate]),
                int(given[err.coordinate + 1]),
            )
        if err.instance == 2:
            assert str(err).endswith(
                "is not nondecreasing: instance 2 counted coordinate 1, whose range is [3, 6)"
            )
        seen.add(err.instance is None)
    assert seen == {True, False}


@pytest.mark.parametrize("schedule, early_push, guard", CHECKED_MODES)
def test_random_tables_run_exactly_when_they_partition_the_grid(
    schedule: str, early_push: bool, guard: bool
) -> None:
    # Random tables, half of them bent: a table runs (every instance below
    # indptr[C] once, in its range) exactly when it starts at 0, never
    # decreases and ends inside the grid; any other stops with
    # TriggerRangeError, never a deadlock, an overflow or a wrong result.
    g = trigger_graph(0, guard=guard, given=True)
    rng = np.random.default_rng(7)
    verdicts = set()
    for case in range(60):
        E, bound = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        table = np.concatenate([[0], np.cumsum(rng.integers(0, 4, E))]).astype(np.int32)
        if case % 2:
            table[rng.integers(0, E + 1)] += int(rng.integers(-3, 4))
        good = table[0] == 0 and bool(np.all(np.diff(table) >= 0)) and table[-1] <= bound
        symbols = {"E": E, "tiles": bound}
        run = dict(schedule=schedule, early_push=early_push, seed=case, num_ctas=1 + case % 3)
        if good:
            got = etc.simulate(g, {"counts": table}, symbols, **run)
            want, _ = expected(np.diff(table), bound - int(table[-1]))
            np.testing.assert_array_equal(got["out"], want)
        else:
            with pytest.raises(etc.TriggerRangeError):
                etc.simulate(g, {"counts": table}, symbols, **run)
        verdicts.add(good)
    assert verdicts == {True, False}


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "unguarded"])
def test_static_trigger_waits_for_its_own_coordinate(guard: bool) -> None:
    # Under the static schedule a tile of coordinate 0 starts once ready[0]
    # completed, before gather 1 ran; an instance past indptr[C] waits for
    # the whole event (as the GPU lowering: convert-etensor-to-gpu), unless
    # the in-edges made the table final: then it has nothing to wait for.
    from etc.simulator import _bind_inputs, _Machine, bind_symbols

    g = trigger_graph(bound_slack=1, guard=guard)
    env = bind_symbols(g, {"E": 2, "tiles": 2})
    m = _Machine(g, _bind_inputs(g, {"counts": np.array([1, 1], np.int32)}, env), env)
    number = {t.name: n for n, t in enumerate(m.order)}
    m.run(number["plan"], 0)
    m.run(number["gather"], 0)
    assert m.blocker(number["tile"], 0) is None
    assert m.blocker(number["tile"], 1)[:2] == ("ready", (1,))
    unused = m.blocker(number["tile"], 2)  # the unused bound
    assert unused is None if guard else unused[:2] == ("ready", (1,))
    m.run(number["gather"], 1)
    assert m.blocker(number["tile"], 1) is None and m.blocker(number["tile"], 2) is None
    got = etc.simulate(g, {"counts": np.array([1, 1], np.int32)}, {"E": 2, "tiles": 2})
    np.testing.assert_array_equal(got["out"], [1000, 2000, 0])


def test_indptr_changed_after_firing_is_reported() -> None:
    # The tile rewrites indptr: instances pushed for the old ranges now lie
    # past indptr[C] or map to other coordinates.
    g = trigger_graph(bound_slack=0)
    tile = next(t for t in g.tasks if t.name == "tile")

    def clobber(i: int, c: int, indptr: np.ndarray, out: np.ndarray) -> None:
        indptr[-1] = 0

    tile.function.reference = clobber  # type: ignore[misc]
    with pytest.raises(GraphError, match="indptr table 'indptr' changed after its trigger fired"):
        etc.simulate(
            g,
            {"counts": np.array([1, 2], np.int32)},
            {"E": 2, "tiles": 3},
            schedule="dynamic",
        )


# -- graph rules -------------------------------------------------------------
def _base() -> tuple[etc.Graph, Any, Any, Any]:
    g = etc.Graph("bad")
    n = g.symbol("n")
    ready = g.event((n,), wait_count=1, name="ready")
    indptr = g.tensor("indptr", (n + 1,), "i32")
    g.task(make_fn("fire", "index"), grid=(n,), out_edges={ready: "e->e"})
    return g, n, ready, indptr


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(triggered_by="ready"), "must be an \\(event, indptr tensor\\) pair"),
        (dict(grid=("n", 2)), "needs a 1-D grid"),
        (dict(fn=("index",)), "a triggered task's coordinates \\(i, c\\)"),
        (dict(indptr_dtype="f32"), "must be a 1-D integer tensor"),
        (dict(indptr_len=0), "shorter than the n \\+ 1 entries"),
        (dict(in_edge="ic->c"), "uses the trigger coordinate"),
    ],
)
def test_trigger_mistakes_name_the_task(kwargs: dict[str, Any], message: str) -> None:
    g, n, ready, indptr = _base()
    if "indptr_dtype" in kwargs:
        indptr = g.tensor("indptr_f", (n + 1,), kwargs["indptr_dtype"])
    if "indptr_len" in kwargs:
        indptr = g.tensor("indptr_short", (n,), "i32")
    grid = (n, 2) if "grid" in kwargs else (4 * n,)
    fn = make_fn("t", *kwargs.get("fn", ("index", "index")))
    trig = kwargs.get("triggered_by", (ready, indptr))
    other = g.event((1,), wait_count=1, name="other")
    g.task(make_fn("o", "index"), grid=(1,), out_edges={other: "i->0"})
    in_edges = {other: kwargs["in_edge"]} if "in_edge" in kwargs else None
    if "in_edge" in kwargs:
        in_edges = {ready: kwargs["in_edge"]}
    with pytest.raises(GraphError, match=f"task 't': .*{message}"):
        g.task(fn, grid=grid, in_edges=in_edges, triggered_by=trig)


def test_triggered_producer_needs_a_table_count() -> None:
    g, n, ready, indptr = _base()
    done = g.event((n,), wait_count=2, name="done")
    g.task(
        make_fn("t", "index", "index"),
        grid=(4 * n,),
        out_edges={done: "ic->c"},
        triggered_by=(ready, indptr),
    )
    g.task(make_fn("s", "index"), grid=(n,), in_edges={done: "e->e"})
    with pytest.raises(GraphError, match="event 'done' is notified by task 't'.*must be a table"):
        g.validate()


def test_trigger_counts_as_a_consumer_and_is_drawn() -> None:
    g = trigger_graph()
    g.validate()  # 'ready' is only a trigger: still "awaited"
    dot = g.to_dot()
    assert "style=dashed" in dot and "triggers [indptr[c], ...)" in dot
    mlir = g.to_mlir()
    assert "triggered_by(%ready, %indptr : !etensor.event<?>, memref<?xi32>)" in mlir
    assert "outs(%done[(i, c) -> (c)] : !etensor.event<?>)" in mlir


# -- compiled ----------------------------------------------------------------
_bindings = pytest.importorskip  # alias: the compile tests need the bindings


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_compiles_and_records_the_trigger(schedule: str, tmp_path: Any) -> None:
    _bindings("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    art = etc.compile(trigger_graph(), schedule=schedule)
    assert "bar.red.popc.u32" in art.ptx
    assert ("red.relaxed.gpu.global.add.u64" in art.ptx) == (schedule == "dynamic")
    art.save(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    tile = next(t for t in manifest["tasks"] if t["name"] == "tile")
    assert tile["trigger"] == {"event": "ready", "indptr": "indptr"}
    names = [e["name"] for e in manifest["events"]]
    assert ("fired.tile" in names) == (schedule == "dynamic")
    from etc.runtime.manifest import load_manifest

    loaded = load_manifest(tmp_path)
    spec = next(t for t in loaded.tasks if t.name == "tile")
    assert spec.trigger == (names.index("ready"), "indptr")
    # The kernel's bad-trigger record (state 4: the range's coordinate, begin
    # and end, the instance or -1) becomes the simulator's error.
    from etc.runtime.kernel import status_error

    # state, event, task, counter, wait count, instance, CTA, coordinate
    words = np.array([4, 0, spec.index, 3, 1, -1, 5, 1], np.int32)
    err = status_error(loaded, {"E": 3, "tiles": 5}, words, 100)
    assert isinstance(err, etc.TriggerRangeError)
    assert (err.task, err.coordinate, err.begin, err.end, err.bound) == ("tile", 1, 3, 1, 8)
    assert err.instance is None and str(err).startswith(
        "trig: task 'tile': trigger table 'indptr' decreases at coordinate 1"
    )
    words[3:6] = (0, 9, -1)
    assert "past the task's grid of 8 instances" in str(
        status_error(loaded, {"E": 3, "tiles": 5}, words, 100)
    )
    words[3:6] = (3, 6, 2)
    err = status_error(loaded, {"E": 3, "tiles": 5}, words, 100)
    assert err.instance == 2 and str(err).endswith(
        "instance 2 counted coordinate 1, whose range is [3, 6)"
    )
    # State 5: a table-counted coordinate notified more than its count.
    done = names.index("done")
    words = np.array([5, done, -1, 4, 3, -1, 0, 2], np.int32)
    err = status_error(loaded, {"E": 3, "tiles": 5}, words, 100)
    assert isinstance(err, etc.WaitCountError)
    assert (err.event, err.coordinate, err.table, err.counter, err.wait_count) == (
        "done", (2,), "wait", 4, 3
    )  # fmt: skip
    # A corrupted trigger is rejected before anything is launched.
    tile["trigger"] = {"event": "ready", "indptr": "missing"}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LaunchError, match="trigger.indptr"):
        load_manifest(tmp_path)


def test_triggered_prefetch_may_only_fill_shared_memory_with_cp_async() -> None:
    # A triggered instance may run its prefetch for a guessed coordinate and
    # again for the one found; only cp.async copies are drained in between.
    from etc.tiles import gemm as G

    g, n, ready, indptr = _base()
    bulk = G.layer_gemm(16, 64, 256, 256, layers=None, core="bulk", stages=2, kc=128)
    assert bulk.prefetch_fills_shared
    with pytest.raises(GraphError, match="task 't': tile '.*' has a prefetch that fills shared"):
        g.task(bulk, grid=(4 * n,), triggered_by=(ready, indptr), name="t")
    ring = G.moe_down(16, 64, 256, 128, experts=4, stages=3, unroll=1, prefetch_ring=True)
    etc.Graph._check_triggered_prefetch(ring, "task 'u'")  # cp.async only: accepted


def _guarded(g: etc.Graph) -> dict[str, bool]:
    return {t.name: g.guarded_indptr(t) for t in g.tasks}


def test_guarded_indptr_is_proven_from_the_edges() -> None:
    # The plan writes indptr and notifies planned (count 1) from its one
    # instance; the tiles wait for planned, and the sink, which also takes
    # the table, runs after them. Without the in-edge nothing orders the
    # plan's writes before a tile.
    g = trigger_graph()
    assert _guarded(g) == {"plan": False, "gather": False, "tile": True, "sink": False}
    assert "guarded_indptr" in g.to_mlir()
    g = trigger_graph(guard=False)
    assert not g.guarded_indptr(g.tasks[2])
    assert "guarded_indptr" not in g.to_mlir()


def _writer_graph(plan_grid: int, count: int, plan_map: str, extra_writer: bool) -> etc.Graph:
    g = etc.Graph("guard")
    E, tiles = g.symbol("E"), g.symbol("tiles")
    indptr = g.tensor("indptr", (E + 1,), "i32")
    planned = g.event((2,), wait_count=count, name="planned")
    ready = g.event((E,), wait_count=1, name="ready")
    g.task(
        make_fn("plan", "index", I32), grid=(plan_grid,), args=(indptr,),
        out_edges={planned: plan_map},
    )  # fmt: skip
    if extra_writer:  # takes the table, notifies nothing the tiles wait for
        g.task(make_fn("scan", "index", I32), grid=(1,), args=(indptr,))
    g.task(make_fn("gather", "index"), grid=(E,), out_edges={ready: "e->e"})
    g.task(
        make_fn("tile", "index", "index", I32), grid=(tiles,), args=(indptr,),
        in_edges={planned: "ic->0"}, triggered_by=(ready, indptr),
    )  # fmt: skip
    return g


@pytest.mark.parametrize(
    "plan_grid, count, plan_map, extra_writer, guarded",
    [
        (4, 4, "i->0", False, True),  # every plan instance counted
        (4, 3, "i->0", False, False),  # planned[0] may complete before the 4th
        (4, 4, "i->1", False, False),  # the tiles wait on planned[0]
        (2, 2, "i->i", False, False),  # a map that may reach 0: not counted
        (4, 4, "i->0", True, False),  # a writer the in-edges do not wait for
    ],
)
def test_guarded_indptr_needs_every_writer_counted(
    plan_grid: int, count: int, plan_map: str, extra_writer: bool, guarded: bool
) -> None:
    g = _writer_graph(plan_grid, count, plan_map, extra_writer)
    assert _guarded(g)["tile"] is guarded


def test_indptr_no_task_writes_is_guarded() -> None:
    g = etc.Graph("input_table")
    E, tiles = g.symbol("E"), g.symbol("tiles")
    indptr = g.tensor("indptr", (E + 1,), "i32")
    ready = g.event((E,), wait_count=1, name="ready")
    g.task(make_fn("gather", "index"), grid=(E,), out_edges={ready: "e->e"})
    g.task(
        make_fn("tile", "index", "index", I32), grid=(tiles,), args=(indptr,),
        triggered_by=(ready, indptr),
    )  # fmt: skip
    assert _guarded(g) == {"gather": False, "tile": True}


@pytest.mark.parametrize("num_ctas", [1, 2, 3, 5])
def test_ticket_deal_runs_every_instance_once(num_ctas: int) -> None:
    # deal="ticket": each of the tile task's static slots runs the next
    # unclaimed instance; every real instance runs once (the tile asserts
    # its range and writes its own slot) and the slack runs none.
    g = trigger_graph(ticket=True)
    assert "ticketed" in g.to_mlir()
    for counts in COUNTS:
        want_out, want_total = expected(counts, 3)
        got = etc.simulate(
            g, {"counts": counts}, {"E": len(counts), "tiles": int(counts.sum())},
            num_ctas=num_ctas,
        )  # fmt: skip
        np.testing.assert_array_equal(got["out"], want_out)
        np.testing.assert_array_equal(got["total"], want_total)


def test_ticket_deal_compiles_with_its_counter() -> None:
    art = etc.compile(trigger_graph(ticket=True), schedule="static", cubin=False)
    events = {e["name"]: e for e in art.manifest["events"]}
    assert events["ticket.tile"] == {
        "name": "ticket.tile", "shape": [1], "wait_count": 1, "implicit": True
    }  # fmt: skip
    assert "atom.relaxed.gpu.global.add.u32" in art.ptx
    dynamic = etc.compile(trigger_graph(ticket=True), schedule="dynamic", cubin=False)
    assert "ticket.tile" not in {e["name"] for e in dynamic.manifest["events"]}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"deal": "steal"}, "deal must be one of 'list', 'ticket'"),
        ({"deal": "ticket", "phase": "ij->i"}, "deal='ticket' hands out instances"),
    ],
)
def test_ticket_deal_mistakes_name_the_task(kwargs: dict[str, Any], message: str) -> None:
    g = etc.Graph("bad_deal")
    with pytest.raises(GraphError, match=message) as err:
        g.task(make_fn("t", "index", "index"), grid=(2, 3), name="tiles", **kwargs)
    assert "task 'tiles'" in str(err.value)

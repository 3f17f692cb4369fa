"""Both schedules on the GPU give the simulator's (and numpy's) answer: split-K,
a diamond whose sink waits on two events, a 64-way fan-in and a skewed graph;
a broken dynamic graph stops with a DeadlockError and the process goes on; a
data-dependent trigger runs good tables and stops at bad ones with a
TriggerRangeError, a wait count read from a table too low is a
WaitCountError, and the kernel runs again afterwards.
Artifacts: ``python test/gpu/make_artifacts.py DIR``; ``ETC_ARTIFACTS=DIR``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
import etc.runtime
from etc.errors import DeadlockError, TriggerRangeError, WaitCountError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphs import GRAPHS, SCHEDULES, TRIGGER_TABLE_GRAPHS, trigger_table_counts  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("ETC_ARTIFACTS"), reason="ETC_ARTIFACTS is not set"),
]


def load(name: str) -> etc.runtime.Kernel:
    return etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / name)


def poisoned_arrays(graph: etc.Graph, inputs, symbols) -> dict[str, np.ndarray]:
    """Every tensor of ``graph``: ``inputs``, the rest NaN (f32) or zero."""
    arrays = {}
    for t in graph.tensors:
        shape = tuple(d if isinstance(d, int) else d.evaluate(symbols) for d in t.shape)
        arrays[t.name] = (
            np.full(shape, np.nan, t.dtype.numpy)
            if t.dtype.name == "f32"
            else (np.zeros(shape, t.dtype.numpy))
        )
    arrays.update({k: v.copy() for k, v in inputs.items()})
    return arrays


def run_against_simulator(graph: etc.Graph, kernel, inputs, symbols, outputs, **tol):
    expected = etc.simulate(graph, inputs, symbols)
    arrays = poisoned_arrays(graph, inputs, symbols)
    kernel.launch(arrays, symbols)
    for name in outputs:
        np.testing.assert_allclose(arrays[name], expected[name], **tol)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("n", [1, 7, 300, 5000])
def test_diamond(schedule: str, n: int) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    run_against_simulator(
        GRAPHS["diamond"](),
        load(f"diamond_{schedule}"),
        {"X": x},
        {"n": n},
        ["Z"],
        rtol=1e-6,
        atol=1e-5,
    )


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("n", [1, 33, 700])
def test_wide_fan_in(schedule: str, n: int) -> None:
    a = np.random.default_rng(n).standard_normal((n, 64 * 64)).astype(np.float32)
    run_against_simulator(
        GRAPHS["fanin"](),
        load(f"fanin_{schedule}"),
        {"A": a},
        {"n": n},
        ["C"],
        rtol=1e-5,
        atol=1e-3,
    )


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_skewed(schedule: str) -> None:
    run_against_simulator(
        GRAPHS["skewed"](), load(f"skewed_{schedule}"), {}, {"t": 3000}, ["Q"], rtol=0, atol=0
    )


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_skewed_pooled(schedule: str) -> None:
    run_against_simulator(
        GRAPHS["skewed_pooled"](),
        load(f"skewed_pooled_{schedule}"),
        {},
        {"t": 3000},
        ["Q"],
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_chain_and_empty(schedule: str) -> None:
    load(f"chain_{schedule}").launch({}, {})
    kernel = load(f"empty_{schedule}")
    for t in (1, 5, 100_000):
        kernel.launch({}, {"t": t})


@pytest.mark.parametrize("schedule", ["dynamic", "dynamic_late"])
@pytest.mark.parametrize("n", [0, 1, 7, 64, 1000])
def test_splitk_dynamic(schedule: str, n: int) -> None:
    a = np.random.default_rng(n).standard_normal((n, 256)).astype(np.float32)
    t = {"A": a, "B": np.full((n, 4), np.nan, np.float32), "C": np.full(n, np.nan, np.float32)}
    kernel = load(f"splitk_{schedule}")
    for _ in range(3):  # the kernel resets its queue and counters itself
        kernel.launch(t, {"n": n})
        np.testing.assert_allclose(t["C"], a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("schedule", ["dynamic", "dynamic_late"])
def test_dynamic_deadlock_then_recovery(schedule: str) -> None:
    broken, good = load(f"broken_{schedule}"), load(f"splitk_{schedule}")
    n = 9
    a = np.random.default_rng(0).standard_normal((n, 256)).astype(np.float32)
    t = {"A": a, "B": np.zeros((n, 4), np.float32), "C": np.zeros(n, np.float32)}
    with pytest.raises(DeadlockError) as info:
        broken.launch({**t, "T": np.full(n, 5, np.int32)}, {"n": n}, max_polls=100_000)
    assert "watchdog expired" in str(info.value)
    # The same broken kernel with counts that do arrive, then another kernel.
    broken.launch({**t, "T": np.full(n, 4, np.int32)}, {"n": n})
    np.testing.assert_allclose(t["C"], a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)
    t["C"][:] = np.nan
    good.launch(t, {"n": n})
    np.testing.assert_allclose(t["C"], a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_trace(schedule: str, tmp_path: Path) -> None:
    """A traced launch records every instance once, on real SMs, in order."""
    kernel = load(f"splitk_traced_{schedule}")
    n = 1000
    a = np.random.default_rng(0).standard_normal((n, 256)).astype(np.float32)
    t = {"A": a, "B": np.zeros((n, 4), np.float32), "C": np.zeros(n, np.float32)}
    kernel.launch(t, {"n": n})
    np.testing.assert_allclose(t["C"], a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)
    trace = kernel.trace()
    events = trace.events()
    assert trace.dropped == 0 and len(events) == n * 4 + n
    seen = {(e["task"], e["instance"]) for e in events}
    assert len(seen) == len(events)
    assert all(e["end_ns"] >= e["start_ns"] for e in events)
    assert 1 < len({e["sm"] for e in events}) <= 256
    # Every final_sum of row i starts after the 4 partial sums of row i ended.
    ends = {}
    for e in events:
        if e["task"] == "partial_sum":
            row = e["instance"][0]
            ends[row] = max(ends.get(row, 0), e["end_ns"])
    for e in events:
        if e["task"] == "final_sum":
            assert e["start_ns"] >= ends[e["instance"][0]]
    doc = trace.to_chrome(tmp_path / "t.json")
    assert len([x for x in doc["traceEvents"] if x["ph"] == "X"]) == len(events)
    out = os.environ.get("OUT")
    if out:
        trace.to_chrome(Path(out) / f"trace_splitk_{schedule}.json")
        try:
            trace.to_png(Path(out) / f"trace_splitk_{schedule}.png")
        except etc.EtcError:
            pass  # no matplotlib on this machine


@pytest.mark.parametrize("kind", ["pool", "poolrow"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("n", [1, 300, 5000])
def test_pooled_partial_sums(kind: str, schedule: str, n: int) -> None:
    """Partial sums dealt at run time (one pool, or a pool per row): every
    instance runs once, whatever CTA draws it; relaunches reuse the
    counters the kernel's exit reset zeroed."""
    kernel = load(f"splitk_{kind}_{schedule}")
    for seed in range(2):
        a = np.random.default_rng([n, seed]).standard_normal((n, 256)).astype(np.float32)
        t = {"A": a, "B": np.full((n, 4), np.nan, np.float32), "C": np.full(n, np.nan, np.float32)}
        kernel.launch(t, {"n": n})
        np.testing.assert_allclose(
            t["B"], a.astype(np.float64).reshape(n, 4, 64).sum(2), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(t["C"], a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("n", [1, 300, 5000])
def test_outlined_tiles(schedule: str, n: int) -> None:
    """Tiles called instead of inlined (``outline=True``) give the same sums."""
    kernel = load(f"splitk_outlined_{schedule}")
    a = np.random.default_rng(n).standard_normal((n, 256)).astype(np.float32)
    t = {"A": a, "B": np.full((n, 4), np.nan, np.float32), "C": np.full(n, np.nan, np.float32)}
    kernel.launch(t, {"n": n})
    np.testing.assert_allclose(
        t["B"], a.astype(np.float64).reshape(n, 4, 64).sum(2), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(t["C"], a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


GOOD_TABLES = [[0, 2, 2, 5, 6], [0, 0, 0, 0, 0], [0, 9, 9, 9, 9], [0, 1, 3, 6, 9]]
#: (table, the range reported): the grid holds 9 instances; one bad range each,
#: so either schedule reports that one.
BAD_TABLES = [
    ([0, 2, 1, 5, 6], 1),  # decreases
    ([0, 2, 2, 5, 12], 3),  # its last range straddles the grid's end
    ([0, 2, 9, 9, 11], 3),  # a range wholly past it
    ([1, 2, 2, 5, 6], 0),  # does not start at 0
]


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("name", list(TRIGGER_TABLE_GRAPHS))
def test_trigger_tables_outside_the_grid_stop_the_launch(name: str, schedule: str) -> None:
    graph, kernel = TRIGGER_TABLE_GRAPHS[name](), load(f"{name}_{schedule}")
    symbols = {"E": 4, "tiles": 9}

    def tables(table: list[int]) -> dict[str, np.ndarray]:
        return {"given": np.array(table, np.int32), "counts": trigger_table_counts(table)}

    good = tables(GOOD_TABLES[0])
    for table, c in BAD_TABLES:
        arrays = poisoned_arrays(graph, tables(table), symbols)
        with pytest.raises(TriggerRangeError) as info:
            kernel.launch(arrays, symbols, max_polls=1_000_000)
        err = info.value
        assert (err.task, err.table, err.bound) == ("tile", "indptr", 9), str(err)
        assert (err.coordinate, err.begin, err.end) == (c, table[c], table[c + 1]), str(err)
        # The counters were reset: the next launch runs.
        run_against_simulator(graph, kernel, good, symbols, ["out", "total"])
    for table in GOOD_TABLES:
        run_against_simulator(graph, kernel, tables(table), symbols, ["out", "total"])
    # A count one too low: sink 2 is released after 3 of range 2's 4
    # notifications; the launch's end names the coordinate.
    low = tables(GOOD_TABLES[0])
    low["counts"][2] -= 1
    with pytest.raises(WaitCountError) as info:
        kernel.launch(poisoned_arrays(graph, low, symbols), symbols, max_polls=1_000_000)
    err = info.value
    assert (err.event, err.coordinate, err.table, err.counter, err.wait_count) == (
        "done",
        (2,),
        "wait",
        4,
        3,
    ), str(err)
    run_against_simulator(graph, kernel, good, symbols, ["out", "total"])

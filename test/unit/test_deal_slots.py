"""Graph.task(deal_slots=n): each phase's instances of a task take at least n
positions of the static lists' round-robin deal (``docs/scheduling.md``,
"Deal slots"), so the tasks after it land on the same CTAs whatever its
instance count; every CTA's list still in global order."""

from __future__ import annotations

import numpy as np
import pytest
from unit_helpers import (
    assert_manifest_task_field_refused,
    assert_static_manifest_field,
    assert_task_option_refused,
    make_fn,
)

import etc
from etc.runtime.queue import INSTANCE_BITS, build_static_queue, decode, global_order


def _copy(i, a, b):
    b[i] = a[i] * 2.0


def _use(i, b, c):
    c[i] = b[i] + 1.0


def two_stage(slots: int | None) -> etc.Graph:
    """b = 2a over n instances taking ``slots`` deal positions, then c = b + 1,
    instance i waiting for copy i."""
    g = etc.Graph("slotted")
    n = g.symbol("n")
    a, b, c = (g.tensor(x, (n,), etc.f32) for x in "abc")
    done = g.event((n,), wait_count=1, name="done")
    vec = "memref<?xf32>"
    g.task(
        make_fn("copy", "index", vec, vec, reference=_copy),
        (n,),
        [a, b],
        out_edges={done: "i->i"},
        deal_slots=slots,
    )
    g.task(make_fn("use", "index", vec, vec, reference=_use), (n,), [b, c], in_edges={done: "i->i"})
    return g


@pytest.mark.parametrize("grid", [1, 3, 4, 7])
def test_later_tasks_land_where_the_slots_say_whatever_the_count(grid: int) -> None:
    # Two phases: task 0 has 2 then 4 instances (3 and 1 empty slots after).
    phases = [np.array([0, 0, 1, 1, 1, 1]), np.array([0, 0, 0, 1, 1, 1]), 1]
    counts = [6, 6, 2]
    lists = decode(build_static_queue(counts, grid, phases, slots=[5, 0, 0]))
    order = global_order(counts, phases).tolist()
    # Positions with the gaps: phase 0 task 0 at 0-1 (then 3 empty), task 1 at
    # 5-7; phase 1 task 0 at 8-11 (then 1 empty), task 1 at 13-15, task 2 at 16-17.
    want = [0, 1, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17]
    cta_of = {e: p % grid for e, p in zip(order, want, strict=True)}
    position = {e: p for p, e in enumerate(order)}
    for c, entries in enumerate(lists):
        keys = [task << INSTANCE_BITS | i for task, i in entries]
        assert all(cta_of[k] == c for k in keys)
        assert [position[k] for k in keys] == sorted(position[k] for k in keys)  # global order
    assert sorted(e for q in lists for e in q) == sorted(
        (t, i) for t, n in enumerate(counts) for i in range(n)
    )
    # Slots no larger than a run's count change nothing.
    assert np.array_equal(
        build_static_queue(counts, grid, phases, slots=[2, 1, 0]),
        build_static_queue(counts, grid, phases),
    )
    # With a CTA limit beside them: the limited task keeps its own CTAs.
    both = decode(build_static_queue(counts, grid, phases, limits=[0, 0, 1], slots=[5, 0, 0]))
    assert {c for c, q in enumerate(both) for task, _ in q if task == 2} == {0}


@pytest.mark.parametrize("n", [1, 3, 6])
def test_slotted_graph_runs_the_same_and_its_manifest_says_so(n: int, tmp_path) -> None:
    a = np.arange(n, dtype=np.float32)
    for slots in (None, 5):
        out = etc.simulate(two_stage(slots), {"a": a}, {"n": n}, num_ctas=4)
        np.testing.assert_array_equal(out["c"], 2 * a + 1)
    # The use instances start at position 5 (CTA 1) unless copy has more.
    start = max(n, 5)
    queues = etc.static_queues(two_stage(5), {"n": n}, 4)
    for c, q in enumerate(queues):
        assert [i for task, i in q if task == 1] == [i for i in range(n) if (start + i) % 4 == c]
    assert_static_manifest_field(lambda: two_stage(5), "deal_slots", 5, tmp_path / "static")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"deal_slots": 0}, "deal_slots must be None or an int >= 1, got 0"),
        ({"deal_slots": True}, "deal_slots must be None or an int >= 1, got True"),
        ({"deal_slots": 8, "deal": "pool"}, r"deal_slots=8 pads .* needs deal='list'.*'pool'"),
    ],
)
def test_slot_mistakes_name_the_task(kwargs: dict, message: str) -> None:
    assert_task_option_refused(kwargs, message)


def test_slots_and_a_deal_by_sm_are_refused_together() -> None:
    with pytest.raises(etc.CompileError, match=r"task 'copy' has deal_slots.*sm_deal"):
        etc.compile(two_stage(5), schedule="static", cubin=False, sm_deal="spread")


def test_a_manifest_with_bad_slots_names_the_field(tmp_path) -> None:
    art = etc.compile(two_stage(5), schedule="static", cubin=False)
    assert_manifest_task_field_refused(art, tmp_path / "static", "deal_slots")

"""Graph.task(ctas=n): the static lists deal a task's instances over the first
n CTAs only (``docs/scheduling.md``, "Fewer CTAs for a task"), every CTA's list
still in global order."""

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

WIDTH = 10


def _copy(i, a, b):
    b[i] = a[i] * 2.0


def _use(i, b, c):
    c[i] = b[i] + 1.0


def two_stage(ctas: int | None) -> etc.Graph:
    """b = 2a over WIDTH instances on at most ``ctas`` CTAs, then c = b + 1,
    instance i waiting for copy i."""
    g = etc.Graph("two_stage")
    a, b, c = (g.tensor(n, (WIDTH,), etc.f32) for n in "abc")
    done = g.event((WIDTH,), wait_count=1, name="done")
    vec = f"memref<{WIDTH}xf32>"
    g.task(
        make_fn("copy", "index", vec, vec, reference=_copy),
        (WIDTH,),
        [a, b],
        out_edges={done: "i->i"},
        ctas=ctas,
    )
    g.task(
        make_fn("use", "index", vec, vec, reference=_use), (WIDTH,), [b, c], in_edges={done: "i->i"}
    )
    return g


@pytest.mark.parametrize("grid", [1, 3, 4, 7])
@pytest.mark.parametrize("limit", [1, 2, 5])
def test_a_limited_task_goes_to_the_first_ctas_in_global_order(grid: int, limit: int) -> None:
    counts = [5, 9, 4]
    lists = decode(build_static_queue(counts, grid, limits=[0, limit, 0]))
    order = {e: p for p, e in enumerate(global_order(counts).tolist())}
    users = {c for c, entries in enumerate(lists) for task, _ in entries if task == 1}
    assert users == set(range(min(limit, grid)))
    # Task 1's instances round-robin over those CTAs; the others by position.
    for c, entries in enumerate(lists):
        mine = [i for task, i in entries if task == 1]
        assert mine == list(range(c, 9, min(limit, grid))) if c < min(limit, grid) else not mine
        positions = [order[task << INSTANCE_BITS | i] for task, i in entries]
        assert positions == sorted(positions)  # each list in global order
    dealt = sorted(e for entries in lists for e in entries)
    assert dealt == sorted((t, i) for t, n in enumerate(counts) for i in range(n))
    # No limit at all: the round-robin queue, unchanged.
    assert np.array_equal(
        build_static_queue(counts, grid, limits=[0, 0, 0]), build_static_queue(counts, grid)
    )


@pytest.mark.parametrize("num_ctas", [1, 2, 5])
def test_limited_graph_runs_the_same_and_its_manifest_says_so(num_ctas: int, tmp_path) -> None:
    a = np.arange(WIDTH, dtype=np.float32)
    for ctas in (None, 2):
        out = etc.simulate(two_stage(ctas), {"a": a}, num_ctas=num_ctas)
        np.testing.assert_array_equal(out["c"], 2 * a + 1)
    queues = etc.static_queues(two_stage(2), {}, num_ctas)
    assert {c for c, q in enumerate(queues) for task, _ in q if task == 0} == set(
        range(min(2, num_ctas))
    )
    assert_static_manifest_field(lambda: two_stage(2), "ctas", 2, tmp_path / "static")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ctas": 0}, "ctas must be None or an int >= 1, got 0"),
        ({"ctas": True}, "ctas must be None or an int >= 1, got True"),
        ({"ctas": 2, "deal": "pool"}, r"ctas=2 limits .* needs deal='list'.*deal='pool'"),
    ],
)
def test_limit_mistakes_name_the_task(kwargs: dict, message: str) -> None:
    assert_task_option_refused(kwargs, message)


def test_a_limit_on_parts_that_wait_for_each_other_is_refused() -> None:
    fn = make_fn("meet", "index", "index")
    fn.meets = 3  # the parts of a block must run on different CTAs at once
    g = etc.Graph("bad_limit")
    with pytest.raises(etc.GraphError, match=r"task 'parts': ctas=2 .*deal='list', 3 such parts"):
        g.task(fn, grid=(4, 3), name="parts", ctas=2)


def test_a_manifest_with_a_bad_limit_names_the_field(tmp_path) -> None:
    art = etc.compile(two_stage(2), schedule="static", cubin=False)
    assert_manifest_task_field_refused(art, tmp_path / "static", "ctas")


def test_moe_permute_on_fewer_ctas_gives_the_same_layer() -> None:
    from dataclasses import replace

    from etc.models import moe as M

    cfg = M.MoEConfig(
        hidden=64, inter=32, experts=8, topk=2, block_m=16, block_n_gu=32, block_n_dn=64,
        router_block=4, router_experts=2, topk_block=2, combine_block=3,
    )  # fmt: skip
    x = M.random_tokens(cfg, 5, seed=1)
    weights = M.random_weights(cfg, seed=2)
    outs = []
    for ctas in (0, 2):
        c = replace(cfg, permute_ctas=ctas)
        graph = M.build_moe_graph(c)
        outs.append(etc.simulate(graph, M.numpy_inputs(c, x, weights), {"T": 5}, num_ctas=6)["Out"])
        if ctas:
            tasks = [t.name for t in graph.topological_tasks()]
            queues = etc.static_queues(graph, {"T": 5}, 6)
            permute = tasks.index("permute")
            assert {c for c, q in enumerate(queues) for task, _ in q if task == permute} == {0, 1}
    np.testing.assert_array_equal(outs[0], outs[1])
    with pytest.raises(etc.GraphError, match="permute_ctas must be an int >= 0, got -1"):
        M.MoEConfig(permute_ctas=-1)

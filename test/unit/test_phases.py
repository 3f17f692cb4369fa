"""Layered graphs: shifted (loop-carried) out-edges and static-schedule phases.

A recurrence over layers (`start -> step(l, j) -> gather(l) -> step(l + 1, j)`)
is a cycle between tasks but not between instances: the shifted out-edge
`(l) -> (l + 1)` feeds the next layer, and `phase` runs the static schedule
layer by layer."""

from __future__ import annotations

import numpy as np
import pytest
from unit_helpers import make_fn

import etc
from etc.edgemap import parse_edge_map
from etc.runtime.checks import check_phase_order
from etc.runtime.manifest import Manifest, load_manifest
from etc.runtime.queue import build_static_queue, decode, global_order, instance_phases

LAYERS, WIDTH = 3, 4


def _start(i, x):
    x[0] = 1.0


def _step(layer, j, x, y):
    y[layer, j] = x[layer] + j


def _gather(layer, x, y):
    x[layer + 1] = y[layer].sum()


def layered(phases=True, layers=LAYERS) -> etc.Graph:
    """x[l+1] = sum_j (x[l] + j), layer by layer."""
    g = etc.Graph("layered")
    x = g.tensor("x", (layers + 1,), etc.f32)
    y = g.tensor("y", (layers, WIDTH), etc.f32)
    ready = g.event((layers + 1,), wait_count=1, name="ready")
    stepped = g.event((layers,), wait_count=WIDTH, name="stepped")
    vec = f"memref<{layers + 1}xf32>"
    mat = f"memref<{layers}x{WIDTH}xf32>"
    g.task(make_fn("start", "index", vec, reference=_start), (1,), [x], out_edges={ready: "i->0"})
    g.task(
        make_fn("step", "index", "index", vec, mat, reference=_step),
        (layers, WIDTH),
        [x, y],
        in_edges={ready: "lj->l"},
        out_edges={stepped: "lj->l"},
        phase="lj->l" if phases else 0,
    )
    g.task(
        make_fn("gather", "index", vec, mat, reference=_gather),
        (layers,),
        [x, y],
        in_edges={stepped: "l->l"},
        out_edges={ready: "(l) -> (l + 1)"},
        phase="l->l" if phases else 0,
    )
    return g


def expected(layers=LAYERS) -> np.ndarray:
    x = [1.0]
    for _ in range(layers):
        x.append(sum(x[-1] + j for j in range(WIDTH)))
    return np.array(x, np.float32)


def test_shifted_map_parses_and_prints():
    m = parse_edge_map("(l, i) -> (l + 1, i)")
    assert m.shifted and m.offsets == (1, 0)
    assert m.apply((2, 5)) == (3, 5)
    assert m.to_mlir() == "(l, i) -> (l + 1, i)"
    assert not parse_edge_map("li->l").shifted


def test_loop_carried_edge_does_not_order_tasks():
    g = layered()
    assert [t.name for t in g.topological_tasks()] == ["start", "step", "gather"]
    assert "(l) -> (l + 1)" in g.to_mlir()


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("num_ctas", [1, 2, 5])
def test_layered_graph_simulates(schedule, num_ctas):
    out = etc.simulate(layered(), {}, schedule=schedule, num_ctas=num_ctas)
    np.testing.assert_array_equal(out["x"], expected())


def test_static_order_follows_phases():
    queues = etc.static_queues(layered(), {}, 1)
    names = [("start", "step", "gather")[t] for t, _ in queues[0]]
    assert names == ["start"] + (["step"] * WIDTH + ["gather"]) * LAYERS


def test_without_phases_the_static_schedule_deadlocks():
    with pytest.raises(etc.DeadlockError):
        etc.simulate(layered(phases=False), {}, schedule="static", num_ctas=1)


def test_in_edges_may_not_shift():
    g = etc.Graph("g")
    e = g.event((4,), wait_count=1)
    with pytest.raises(etc.GraphError, match="only out-edges may"):
        g.task(make_fn("f", "index"), (3,), [], in_edges={e: "(l) -> (l + 1)"})


def test_shift_past_the_event_is_refused():
    g = etc.Graph("g")
    e = g.event((3,), wait_count=1)
    with pytest.raises(etc.GraphError, match="shifted by 1 past event dimension 0"):
        g.task(make_fn("f", "index"), (3,), [], out_edges={e: "(l) -> (l + 1)"})


@pytest.mark.parametrize("bad", ["lj->j,l", "lj->rank", "(l, j) -> (l + 1)", "l->l", -1, "x"])
def test_bad_phases_name_the_task(bad):
    g = etc.Graph("g")
    with pytest.raises(etc.GraphError, match="task 'f'.*phase"):
        g.task(make_fn("f", "index", "index"), (3, 2), [], phase=bad)


def test_global_order_sorts_by_phase_then_task():
    phases = [0, instance_phases(("dim", 0), (3, 2)), instance_phases(("dim", 0), (3,))]
    entries = global_order([1, 6, 3], phases)
    pairs = [(int(e >> 48), int(e & ((1 << 48) - 1))) for e in entries]
    assert pairs == [(0, 0), (1, 0), (1, 1), (2, 0), (1, 2), (1, 3), (2, 1), (1, 4), (1, 5), (2, 2)]
    queue = build_static_queue([1, 6, 3], 2, phases)
    assert [p for cta in decode(queue) for p in cta] == sorted(pairs, key=pairs.index)[0::2] + (
        pairs[1::2]
    )


def _manifest(g: etc.Graph, directory) -> Manifest:
    etc.compile(g, schedule="static", cubin=False).save(directory)
    return load_manifest(directory)


def test_phase_order_check_names_the_culprit(tmp_path):
    m = _manifest(layered(), tmp_path)
    check_phase_order(m, {})  # the layered order is valid
    # Swapping a phase so that gather(l) runs before the step(l) it waits on.
    import dataclasses

    tasks = tuple(
        dataclasses.replace(t, phase=("const", 0)) if t.name == "gather" else t for t in m.tasks
    )
    with pytest.raises(etc.LaunchError, match="event 'stepped' coordinate \\(1,\\)"):
        check_phase_order(dataclasses.replace(m, tasks=tasks), {})


def test_static_tensor_passes_for_a_dynamic_parameter():
    """A tile written for memref<?x4xf32> takes a memref<8x4xf32> tensor (the
    kernel casts it); a size that differs is still refused, naming both."""
    g = etc.Graph("g")
    a = g.tensor("a", (8, 4), etc.f32)
    b = g.tensor("b", (8, 5), etc.f32)
    g.task(make_fn("f", "index", "memref<?x4xf32>"), (1,), [a])
    with pytest.raises(etc.GraphError, match="tensor 'b' of type memref<8x5xf32>, but device"):
        g.task(make_fn("h", "index", "memref<?x4xf32>"), (1,), [b])


def test_prefetch_function_is_named_on_the_task():
    source = (
        "func.func @t(%i: index, %a: memref<?xf32>) {\n  return\n}\n"
        "func.func @t__prefetch(%i: index, %a: memref<?xf32>) {\n  return\n}\n"
    )
    fn = etc.DeviceFunction.from_mlir(source, "t")
    assert fn.prefetch == "t__prefetch"
    assert make_fn("u", "index").prefetch is None
    g = etc.Graph("g")
    a = g.tensor("a", (4,), etc.f32)
    g.task(fn, (4,), [a])
    assert "prefetch = @t__prefetch" in g.to_mlir()


def test_etc_info_shows_phases(tmp_path, capsys):
    from etc.cli import main

    etc.compile(layered(), cubin=False).save(tmp_path)
    assert main(["info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step: grid ('3', '4'), phase: grid dimension 0" in out
    assert "task 0 start: grid ('1',)\n" in out


def test_static_compile_refuses_loop_carried_edges_without_phases():
    with pytest.raises(
        etc.CompileError, match="task 'gather' feeds event 'ready' through the loop"
    ):
        etc.compile(layered(phases=False), schedule="static", cubin=False)
    etc.compile(layered(phases=False), schedule="dynamic", cubin=False)  # pushes need no order

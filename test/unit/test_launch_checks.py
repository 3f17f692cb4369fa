"""Launch-time checks with the symbols bound: map bounds and count
conservation that the compiler could not prove symbolically."""

from __future__ import annotations

import pytest
from unit_helpers import make_fn

import etc
from etc.errors import LaunchError
from etc.runtime.checks import check_bound_graph
from etc.runtime.manifest import load_manifest

pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")


def two_symbol_graph() -> etc.Graph:
    """The event has m coordinates, the producer n instances: right only
    when n == m, which no compile-time check can know."""
    g = etc.Graph("ragged")
    n, m = g.symbol("n"), g.symbol("m")
    e = g.event((m,), wait_count=1, name="E")
    g.task(make_fn("produce", "index"), grid=(n,), out_edges={e: "i->i"})
    g.task(make_fn("consume", "index"), grid=(m,), in_edges={e: "i->i"})
    return g


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    artifact = etc.compile(two_symbol_graph())
    return load_manifest(artifact.save(tmp_path_factory.mktemp("ragged")))


def test_consistent_shapes_pass(manifest):
    check_bound_graph(manifest, {"n": 5, "m": 5})
    check_bound_graph(manifest, {"n": 0, "m": 0})


def test_missing_notifications_are_caught(manifest):
    with pytest.raises(LaunchError) as info:
        check_bound_graph(manifest, {"n": 3, "m": 5})
    message = str(info.value)
    assert "event 'E' coordinate (3,) receives 0 notifications but its wait count is 1" in message
    assert "n=3, m=5" in message and "2 coordinate(s) disagree" in message


def test_out_of_bounds_map_is_caught(manifest):
    with pytest.raises(LaunchError) as info:
        check_bound_graph(manifest, {"n": 6, "m": 5})
    message = str(info.value)
    assert "task 'produce' out-edge to event 'E' with map (d0)" in message
    assert "reaches coordinate (5,) outside the event's shape (5,)" in message


def test_fan_in_of_a_projection_is_counted(tmp_path):
    g = etc.Graph("proj")
    n, k = g.symbol("n"), g.symbol("k")
    e = g.event((n,), wait_count=k, name="E")
    g.task(make_fn("part", "index", "index"), grid=(n, k), out_edges={e: "ij->i"})
    g.task(make_fn("total", "index"), grid=(n,), in_edges={e: "i->i"})
    m = load_manifest(etc.compile(g).save(tmp_path))
    check_bound_graph(m, {"n": 7, "k": 3})
    assert m.tasks[0].out_edges == ((0, (("dim", 0),)),)

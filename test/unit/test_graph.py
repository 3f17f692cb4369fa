"""The graph API contract: construction, checks that name the culprit, MLIR text."""

from __future__ import annotations

import subprocess
import sys

import pytest
from unit_helpers import REPO, make_fn, no_output, splitk_graph  # noqa: F401

import etc
from etc import GraphError

# Every test: nothing may print or warn.
pytestmark = pytest.mark.usefixtures("no_output")

F32_2D = "memref<?x4xf32>"
F32_1D = "memref<?xf32>"


def base_graph() -> tuple[etc.Graph, dict]:
    g = etc.Graph("g")
    n = g.symbol("n")
    env = {
        "n": n,
        "A": g.tensor("A", (n, 4), "f32"),
        "B": g.tensor("B", (n,), "f32"),
        "E": g.event((n,), wait_count=4, name="E"),
        "producer": make_fn("producer", "index", "index", F32_2D),
        "consumer": make_fn("consumer", "index", F32_1D),
    }
    return g, env


def raises(match: str):
    return pytest.raises(GraphError, match=match)


# ---------------------------------------------------------------------------
# Local checks at g.task() / g.event() time
# ---------------------------------------------------------------------------
def test_map_dims_must_match_grid_rank():
    g, v = base_graph()
    with raises(
        r"task 'final_sum': in-edge map 'ij->i' on event 'E' has 2 dims but the grid "
        r"\(n,\) has rank 1"
    ):
        g.task(
            v["consumer"],
            grid=(v["n"],),
            args=(v["B"],),
            in_edges={v["E"]: "ij->i"},
            name="final_sum",
        )


def test_map_results_must_match_event_rank():
    g, v = base_graph()
    with raises(
        r"task 'consumer': in-edge map 'i->ii' on event 'E' has 2 results but the "
        r"event has rank 1"
    ):
        g.task(v["consumer"], grid=(v["n"],), args=(v["B"],), in_edges={v["E"]: "i->ii"})


def test_out_edge_map_named_too():
    g, v = base_graph()
    with raises(
        r"task 'p': out-edge map '\(d0\) -> \(d0\)' on event 'E' has 1 dims but "
        r"the grid \(n, 4\) has rank 2"
    ):
        g.task(
            v["producer"],
            grid=(v["n"], 4),
            args=(v["A"],),
            out_edges={v["E"]: "(d0) -> (d0)"},
            name="p",
        )


def test_constant_result_inside_static_dims():
    g, v = base_graph()
    E2 = g.event((3, v["n"]), wait_count=1, name="E2")
    with raises(
        r"task 'consumer': in-edge map 'i->3i' on event 'E2' addresses coordinate "
        r"3 outside event dimension 0 \(extent 3\)"
    ):
        g.task(v["consumer"], grid=(v["n"],), args=(v["B"],), in_edges={E2: "i->3i"})


def test_grid_dimension_longer_than_event_dimension():
    g, v = base_graph()
    with raises(
        r"task 'consumer': in-edge map 'i->i' on event 'E' sends grid dimension 0 "
        r"\(extent n \+ 1\) past event dimension 0 \(extent n\)"
    ):
        g.task(v["consumer"], grid=(v["n"] + 1,), args=(v["B"],), in_edges={v["E"]: "i->i"})


def test_unknown_letter_in_map():
    g, v = base_graph()
    with raises(
        r"task 'consumer': in-edge on event 'E': edge map 'i->k': result 'k' is "
        r"not a grid dimension"
    ):
        g.task(v["consumer"], grid=(v["n"],), args=(v["B"],), in_edges={v["E"]: "i->k"})


def test_unsupported_affine_result():
    g, v = base_graph()
    with raises(
        r"task 'consumer': in-edge on event 'E': edge map .*d0 floordiv 2.* not "
        r"supported"
    ):
        g.task(
            v["consumer"],
            grid=(v["n"],),
            args=(v["B"],),
            in_edges={v["E"]: "(d0) -> (d0 floordiv 2)"},
        )


def test_arity_mismatch_names_function_and_grid():
    g, v = base_graph()
    with raises(
        r"task 'consumer': device function 'consumer' takes 2 arguments, but a "
        r"rank-2 grid \(n, 4\) and 1 buffers pass 3"
    ):
        g.task(v["consumer"], grid=(v["n"], 4), args=(v["B"],))


def test_coordinate_parameter_must_be_index():
    g, v = base_graph()
    fn = make_fn("weird", F32_1D, F32_1D)
    with raises(
        r"task 'weird': argument #0 of device function 'weird' is grid "
        r"coordinate 0 and must be index"
    ):
        g.task(fn, grid=(v["n"],), args=(v["B"],))


def test_buffer_type_mismatch():
    g, v = base_graph()
    with raises(
        r"task 'consumer': buffer #0 is tensor 'A' of type memref<\?x4xf32>, but "
        r"device function 'consumer' expects memref<\?xf32>"
    ):
        g.task(v["consumer"], grid=(v["n"],), args=(v["A"],))


def test_args_must_be_tensors_of_this_graph():
    g, v = base_graph()
    other = etc.Graph("other")
    T = other.tensor("T", (4,), "f32")
    with raises(r"task 'consumer': tensor 'T' belongs to graph 'other', not to 'g'"):
        g.task(v["consumer"], grid=(4,), args=(T,))
    with raises(r"task 'consumer': argument #0 .* is not a Tensor"):
        g.task(v["consumer"], grid=(4,), args=("B",))
    # Not sequences at all: these raised a bare TypeError.
    for bad in (None, 3, "B"):
        with raises(
            rf"task 'consumer': args must be a sequence of tensors and symbols, got {bad!r}"
        ):
            g.task(v["consumer"], grid=(4,), args=bad)
    for bad in (3, "ij->i"):
        with raises(rf"task 'consumer': in_edges must map events to edge maps .*, got {bad!r}"):
            g.task(v["consumer"], grid=(4,), args=(v["B"],), in_edges=bad)


def test_symbol_max_is_checked_and_goes_to_the_manifest():
    g = etc.Graph("g")
    n = g.symbol("n", max=16)
    assert n.max == 16 and g.symbol("m").max is None
    for bad in (-1, 2.5, True):
        with pytest.raises(etc.GraphError, match="symbol 'k': max must be None or an int >= 0"):
            g.symbol("k", max=bad)
    from etc.compiler import _manifest_symbol_max

    assert _manifest_symbol_max(g) == {"symbol_max": {"n": 16}}
    assert _manifest_symbol_max(etc.Graph("h")) == {}


def test_requirements_are_checked_and_go_to_the_manifest():
    """Graph.require: an expression of the symbols that must be >= 0 at
    launch; the simulator refuses symbols that break it, naming the message
    and the values, and the manifest carries it for the runtime."""
    g = etc.Graph("g")
    n, m = g.symbol("n"), g.symbol("m")
    g.require(m - n - 1, "n must be below m")
    g.require(3, "always")
    with pytest.raises(etc.GraphError, match=r"graph 'g': never \(never: -1 < 0\)"):
        g.require(-1, "never")
    with pytest.raises(etc.GraphError, match="message must be a non-empty string"):
        g.require(n, "")
    with pytest.raises(etc.GraphError, match="symbol 'k' belongs to graph 'h'"):
        g.require(etc.Graph("h").symbol("k"), "k")
    assert [(str(s), msg) for s, msg in g.requirements] == [("-n + m - 1", "n must be below m")]
    from etc.simulator import bind_symbols

    assert bind_symbols(g, {"n": 2, "m": 3}) == {"n": 2, "m": 3}
    with pytest.raises(etc.ShapeError, match=r"below m \(-n \+ m - 1 = -1 < 0 for n=3, m=3\)"):
        bind_symbols(g, {"n": 3, "m": 3})


def test_events_and_symbols_of_another_graph():
    g, v = base_graph()
    other = etc.Graph("other")
    k = other.symbol("k")
    E = other.event((4,), wait_count=1, name="F")
    with raises(r"task 'consumer': event 'F' belongs to graph 'other', not to 'g'"):
        g.task(v["consumer"], grid=(4,), args=(v["B"],), in_edges={E: "i->i"})
    with raises(r"task 'consumer': grid: symbol 'k' belongs to graph 'other', not to 'g'"):
        g.task(v["consumer"], grid=(k,), args=(v["B"],))
    with raises(r"tensor 'X': symbol 'k' belongs to graph 'other'"):
        g.tensor("X", (k * 2,), "f32")
    with raises(r"event 'G': wait count: symbol 'k' belongs to graph 'other'"):
        g.event((4,), wait_count=k, name="G")
    _, twin_env = base_graph()  # the same name: the message must not read "graph 'g', not to 'g'"
    with raises(r"task 'consumer': tensor 'B' belongs to another graph also named 'g'$"):
        g.task(v["consumer"], grid=(4,), args=(twin_env["B"],))


def test_duplicate_names():
    g, v = base_graph()
    with raises(r"symbol 'A': graph 'g' already has a tensor named 'A'"):
        g.symbol("A")
    with raises(r"tensor 'n': graph 'g' already has a symbol named 'n'"):
        g.tensor("n", (4,), "f32")
    with raises(r"event 'E' is already declared in graph 'g'"):
        g.event((4,), wait_count=1, name="E")
    g.task(v["consumer"], grid=(v["n"],), args=(v["B"],), in_edges={v["E"]: "i->i"}, name="t")
    with raises(r"task 't' is already declared in graph 'g'"):
        g.task(v["consumer"], grid=(v["n"],), args=(v["B"],), name="t")
    # Reusing a function without a name gets a unique default name.
    t1 = g.task(v["consumer"], grid=(v["n"],), args=(v["B"],), in_edges={v["E"]: "i->i"})
    t2 = g.task(v["consumer"], grid=(v["n"],), args=(v["B"],), in_edges={v["E"]: "i->i"})
    assert (t1.name, t2.name) == ("consumer", "consumer_1")


def test_conflicting_function_sources():
    g, v = base_graph()
    g.task(v["consumer"], grid=(v["n"],), args=(v["B"],), in_edges={v["E"]: "i->i"})
    clone = etc.DeviceFunction.from_mlir(
        "func.func @consumer(%i: index, %b: memref<?xf32>) {\n  %c = arith.constant 0 : index\n"
        "  return\n}",
        "consumer",
    )
    with raises(
        r"task 'c2': device function 'consumer' defines '@consumer', which device "
        r"function 'consumer' already defines with a different source"
    ):
        g.task(clone, grid=(v["n"],), args=(v["B"],), name="c2")


def test_wait_count_forms_are_checked():
    g, v = base_graph()
    with raises(r"event 'W': wait count must be non-negative, got -1"):
        g.event((4,), wait_count=-1, name="W")
    with raises(r"event 'W': wait count tensor 'B' must hold integers, got f32"):
        g.event((v["n"],), wait_count=v["B"], name="W")
    T = g.tensor("T", (v["n"], 2), "i32")
    with raises(r"event 'W': wait count tensor 'T' has rank 2 but the event has rank 1"):
        g.event((v["n"],), wait_count=T, name="W")
    with raises(
        r"event 'W': wait count tensor 'T' of shape \(n, 2\) does not match the "
        r"event shape \(n, 3\) in dimension 1"
    ):
        g.event((v["n"], 3), wait_count=T, name="W")
    with raises(r"event 'W': wait count: 1.5 is not a size"):
        g.event((4,), wait_count=1.5, name="W")


def test_grid_checks():
    g, v = base_graph()
    with raises(r"task 'consumer': grid dimension 0 is empty, so the task can never run"):
        g.task(v["consumer"], grid=(0,), args=(v["B"],))
    with raises(r"task 'consumer': grid: dimension 0 is negative \(-2\)"):
        g.task(v["consumer"], grid=(-2,), args=(v["B"],))
    with raises(r"task 'x': expected an etc.DeviceFunction, got str"):
        g.task("consumer", grid=(4,), name="x")


def test_bad_names_and_types():
    with raises(r"graph name 'my graph' must be an identifier"):
        etc.Graph("my graph")
    g = etc.Graph("g")
    with raises(r"unknown element type 'f33'"):
        g.tensor("A", (4,), "f33")
    with raises(r"symbol name '' must be a non-empty string"):
        g.symbol("")
    with raises(r"symbol name 'a-b' must be an identifier"):
        g.symbol("a-b")
    with raises(r"block_size must be a multiple of 32"):
        etc.Graph("g", block_size=100)


# ---------------------------------------------------------------------------
# Whole-graph rules (validate)
# ---------------------------------------------------------------------------
def test_cycle_names_the_tasks():
    g = etc.Graph("loop")
    n = g.symbol("n")
    B = g.tensor("B", (n,), "f32")
    fn = make_fn("f", "index", F32_1D)
    E1 = g.event((n,), wait_count=1, name="E1")
    E2 = g.event((n,), wait_count=1, name="E2")
    g.task(fn, grid=(n,), args=(B,), name="first", in_edges={E1: "i->i"}, out_edges={E2: "i->i"})
    g.task(fn, grid=(n,), args=(B,), name="second", in_edges={E2: "i->i"}, out_edges={E1: "i->i"})
    with raises(
        r"tasks 'second' -> 'first' -> 'second' form a dependency cycle \(through "
        r"events 'E1', 'E2'\)"
    ):
        g.validate()
    with raises("dependency cycle"):
        g.to_mlir()
    with raises("dependency cycle"):
        g.topological_tasks()


def test_self_loop_is_a_cycle():
    g = etc.Graph("self")
    fn = make_fn("f", "index")
    E = g.event((4,), wait_count=1, name="E")
    g.task(fn, grid=(4,), in_edges={E: "i->i"}, out_edges={E: "i->i"}, name="me")
    with raises(r"tasks 'me' -> 'me' form a dependency cycle \(through event 'E'\)"):
        g.validate()


def test_event_usage_rules():
    g, v = base_graph()
    with raises(r"event 'E' is neither notified nor awaited"):
        g.validate()
    g.task(
        v["consumer"], grid=(v["n"],), args=(v["B"],), in_edges={v["E"]: "i->i"}, name="final_sum"
    )
    with raises(r"event 'E' is awaited \(by task 'final_sum'\) but never notified"):
        g.validate()

    g2, v2 = base_graph()
    g2.task(
        v2["producer"],
        grid=(v2["n"], 4),
        args=(v2["A"],),
        out_edges={v2["E"]: "ij->i"},
        name="partial_sum",
    )
    with raises(r"event 'E' is notified \(by task 'partial_sum'\) but never awaited"):
        g2.validate()


def test_constant_wait_count_vs_fan_in():
    g = etc.Graph("g")
    n = g.symbol("n")
    A = g.tensor("A", (n, 4), "f32")
    B = g.tensor("B", (n,), "f32")
    E = g.event((n,), wait_count=5, name="E")
    g.task(
        make_fn("p", "index", "index", F32_2D),
        grid=(n, 4),
        args=(A,),
        out_edges={E: "ij->i"},
        name="partial_sum",
    )
    g.task(make_fn("c", "index", F32_1D), grid=(n,), args=(B,), in_edges={E: "i->i"})
    with raises(
        r"event 'E': wait count 5 differs from its fan-in 4 \(notified by task "
        r"'partial_sum' through 'ij->i'\)"
    ):
        g.validate()


def test_symbolic_wait_count_vs_fan_in():
    def build(count_of):
        g = etc.Graph("g")
        n, k = g.symbol("n"), g.symbol("k")
        B = g.tensor("B", (n,), "f32")
        E = g.event((n,), wait_count=count_of(n, k), name="E")
        g.task(
            make_fn("p", "index", "index", "index", F32_1D),
            grid=(k, n, 2 * k),
            args=(B,),
            out_edges={E: "ijl->j"},
        )
        g.task(make_fn("c", "index", F32_1D), grid=(n,), args=(B,), in_edges={E: "i->i"})
        return g

    assert build(lambda n, k: k * k * 2).validate() == []
    assert build(lambda n, k: 2 * k**2).validate() == []
    with raises(r"event 'E': wait count 2\*k differs from its fan-in 2\*k\*\*2"):
        build(lambda n, k: 2 * k).validate()


def test_fan_in_of_several_producers_adds_up():
    g = etc.Graph("g")
    n = g.symbol("n")
    B = g.tensor("B", (n,), "f32")
    E = g.event((n,), wait_count=n + 3, name="E")
    g.task(make_fn("p1", "index", "index", F32_1D), grid=(n, 3), args=(B,), out_edges={E: "ij->i"})
    g.task(make_fn("p2", "index", "index", F32_1D), grid=(n, n), args=(B,), out_edges={E: "ij->j"})
    g.task(make_fn("c", "index", F32_1D), grid=(n,), args=(B,), in_edges={E: "i->i"})
    assert g.validate() == []


def test_irregular_static_fan_in_is_enumerated():
    g = etc.Graph("g")
    E = g.event((4,), wait_count=1, name="E")
    g.task(make_fn("p", "index"), grid=(2,), out_edges={E: "i->i"})  # coords 2, 3 never
    g.task(make_fn("c", "index"), grid=(2,), in_edges={E: "i->i"})
    with raises(
        r"event 'E': coordinate \(2,\) receives 0 notifications but its wait count "
        r"is 1"
    ):
        g.validate()


def test_unknown_fan_in_is_a_note_not_an_error():
    g = etc.Graph("g")
    n, m = g.symbol("n"), g.symbol("m")
    E = g.event((n,), wait_count=1, name="E")
    g.task(make_fn("p", "index"), grid=(m,), out_edges={E: "i->i"})
    g.task(make_fn("c", "index"), grid=(n,), in_edges={E: "i->i"})
    notes = g.validate()
    assert len(notes) == 1 and "event 'E'" in notes[0] and "not checked" in notes[0]


def test_data_dependent_counts_are_not_checked():
    g = etc.Graph("g")
    n = g.symbol("n")
    T = g.tensor("T", (n,), "i32")
    E = g.event((n,), wait_count=T, name="E")
    g.task(make_fn("p", "index"), grid=(n,), out_edges={E: "i->i"})
    g.task(make_fn("c", "index"), grid=(n,), in_edges={E: "i->i"})
    assert g.validate() == []


# ---------------------------------------------------------------------------
# Task numbering
# ---------------------------------------------------------------------------
def test_topological_order_is_kahn_with_lowest_index_first():
    g = etc.Graph("g")
    E = g.event((), wait_count=1, name="E")
    F = g.event((), wait_count=1, name="F")
    fn = make_fn("f", "index")
    g.task(fn, grid=(1,), name="C", in_edges={E: "i->"}, out_edges={F: "i->"})  # 0
    g.task(fn, grid=(1,), name="A", out_edges={E: "i->"})  # 1
    g.task(fn, grid=(1,), name="B")  # 2, independent
    g.task(fn, grid=(1,), name="D", in_edges={F: "i->"})  # 3
    # Ready {A, B} -> A; then ready {C, B} -> C (index 0); then {B, D} -> B; D.
    assert [t.name for t in g.topological_tasks()] == ["A", "C", "B", "D"]


def test_independent_tasks_keep_insertion_order():
    g = etc.Graph("g")
    fn = make_fn("f", "index")
    for name in "zyx":
        g.task(fn, grid=(2,), name=name)
    assert [t.name for t in g.topological_tasks()] == ["z", "y", "x"]


# ---------------------------------------------------------------------------
# Edge maps
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, n_dims, results",
    [
        ("ij->i", 2, (("dim", 0),)),
        ("ij->ji", 2, (("dim", 1), ("dim", 0))),
        ("ij->", 2, ()),
        ("ij->i0", 2, (("dim", 0), ("const", 0))),
        ("ij -> i, 12", 2, (("dim", 0), ("const", 12))),
        ("->", 0, ()),
        ("(d0, d1) -> (d1)", 2, (("dim", 1),)),
        ("affine_map<(i, j) -> (j, 3)>", 2, (("dim", 1), ("const", 3))),
    ],
)
def test_edge_map_forms(spec, n_dims, results):
    from etc.edgemap import parse_edge_map

    parsed = parse_edge_map(spec)
    assert (parsed.n_dims, parsed.results) == (n_dims, results)


def test_edge_map_from_an_affine_map_object():
    from etc.edgemap import parse_edge_map

    class FakeAffineMap:  # duck-types mlir.ir.AffineMap
        n_dims, n_symbols, results = 2, 0, ["d0"]

        def __str__(self):
            return "(d0, d1) -> (d0)"

    parsed = parse_edge_map(FakeAffineMap())
    assert (parsed.n_dims, parsed.results) == (2, (("dim", 0),))
    assert parsed.to_mlir() == "(d0, d1) -> (d0)"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("iji->i", "grid dimension 'i' is repeated"),
        ("i-j", "must have the form"),
        ("i->-1", "must be a grid dimension letter, a non-negative integer or 'rank'"),
        ("(d0)[s0, s1] -> (d0)", "may use one symbol"),
        (42, "must be a string like 'ij->i'"),
    ],
)
def test_bad_edge_maps(spec, message):
    from etc.edgemap import parse_edge_map

    with pytest.raises(GraphError, match=message):
        parse_edge_map(spec)


# ---------------------------------------------------------------------------
# MLIR text
# ---------------------------------------------------------------------------
SPLITK_FUNCS = REPO / "test" / "unit" / "splitk_funcs.mlir"


def figure3_graph() -> etc.Graph:
    text = SPLITK_FUNCS.read_text()
    partial = etc.DeviceFunction.from_mlir(text, "partial_sum")
    final = etc.DeviceFunction.from_mlir(text, "final_sum")
    g = etc.Graph("splitk")
    n = g.symbol("n")
    A = g.tensor("A", (n, 256), "f32")
    B = g.tensor("B", (n, 4), "f32")
    C = g.tensor("C", (n,), "f32")
    E = g.event((n,), wait_count=4, name="E")
    g.task(partial, grid=(n, 4), args=(A, B), out_edges={E: "ij->i"})
    g.task(final, grid=(n,), args=(B, C), in_edges={E: "i->i"})
    return g


def test_figure3_text_exactly():
    text = figure3_graph().to_mlir()
    graph = text[text.index("etensor.graph") :]
    assert graph == (
        "etensor.graph @splitk(%n: index, %A: memref<?x256xf32>, %B: memref<?x4xf32>, "
        "%C: memref<?xf32>) attributes {etensor.block_size = 256 : i64} {\n"
        '  %E = etensor.event(%n) count 4 {name = "E"} : !etensor.event<?>\n'
        "  etensor.task @partial_sum grid [%n, 4] args(%A, %B : memref<?x256xf32>, "
        "memref<?x4xf32>) outs(%E[(i, j) -> (i)] : !etensor.event<?>) "
        '{name = "partial_sum"}\n'
        "  etensor.task @final_sum grid [%n] args(%B, %C : memref<?x4xf32>, memref<?xf32>) "
        'ins(%E[(i) -> (i)] : !etensor.event<?>) {name = "final_sum"}\n'
        "}\n"
    )
    # Both functions come from one source text: emitted once.
    assert text.count("func.func @partial_sum") == 1


def test_figure3_verifies_and_schedules(etc_opt):
    result = etc_opt(
        figure3_graph().to_mlir(), "--etensor-verify-graph", "--etensor-static-schedule"
    )
    assert result.returncode == 0, result.stderr
    assert "etensor.dispatch 0 grid" in result.stdout
    assert 'attributes {name = "partial_sum"}' in result.stdout


def test_rowsum_tiles_graph_verifies(etc_opt):
    result = etc_opt(splitk_graph().to_mlir(), "--etensor-verify-graph")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def every_form_graph() -> etc.Graph:
    g = etc.Graph("forms")
    n = g.symbol("n")
    odd = g.symbol("size")
    blocks = (n + 7) // 8
    A = g.tensor("A", (n, 4), "bf16")
    T = g.tensor("T", (blocks,), "i32")
    S = g.tensor("S", (), "f32")
    X = g.tensor("x y", (odd * n, 3), "u8")
    E0 = g.event((), wait_count=blocks * 2, name='rank "0"')
    E1 = g.event((blocks,), wait_count=T, name="E1")
    E2 = g.event((2, n), wait_count=1)
    g.task(
        make_fn("a", "index", "index", "memref<?x4xbf16>"),
        grid=(blocks, 2),
        args=(A,),
        out_edges={E0: "ij->", E1: "ij->i"},
    )
    g.task(
        make_fn("b", "index", "memref<?xi32>"),
        grid=(n,),
        args=(T,),
        out_edges=[(E2, "i->0,i"), (E2, "i->1i")],
    )
    g.task(
        make_fn("c", "memref<f32>", "memref<?x3xi8>"),
        grid=(),
        args=(S, X),
        in_edges=[(E0, "->"), (E1, "->0"), (E2, "->11")],
    )
    return g


def test_every_form_emits_and_verifies(etc_opt):
    g = every_form_graph()
    text = g.to_mlir()
    assert "%arg5: memref<?x3xi8>" in text  # 'x y' is no SSA identifier
    assert "count from %T : memref<?xi32>" in text
    assert "arith.floordivsi" in text
    assert "etensor.event() count %" in text
    assert "!etensor.event<>" in text and "!etensor.event<2x?>" in text
    assert 'name = "rank \\220\\22"' in text
    assert "grid []" in text
    result = etc_opt(text, "--etensor-verify-graph", "--etensor-static-schedule")
    assert result.returncode == 0, result.stderr


def test_block_size_attribute():
    fn128 = make_fn("f", "index", block_size=128)
    fn128b = make_fn("h", "index", block_size=128)
    g = etc.Graph("g")
    E = g.event((2,), wait_count=1)
    g.task(fn128, grid=(2,), out_edges={E: "i->i"})
    g.task(fn128b, grid=(2,), in_edges={E: "i->i"})
    assert g.block_size == 128
    assert "etensor.block_size = 128 : i64" in g.to_mlir()
    g2 = etc.Graph("g2", block_size=64)
    g2.task(make_fn("k", "index", block_size=64), grid=(2,))
    assert g2.block_size == 64
    assert "etensor.block_size = 64 : i64" in g2.to_mlir()


def test_symbolic_wait_count_emits_arith(etc_opt):
    g = etc.Graph("g")
    n, k = g.symbol("n"), g.symbol("k")
    E = g.event((n,), wait_count=k * 4, name="E")
    g.task(make_fn("p", "index", "index"), grid=(n, k * 4), out_edges={E: "ij->i"})
    g.task(make_fn("c", "index"), grid=(n,), in_edges={E: "i->i"})
    text = g.to_mlir()
    assert "arith.muli %k, %c4 : index" in text
    result = etc_opt(text, "--etensor-verify-graph")
    assert result.returncode == 0, result.stderr


def test_wrong_symbolic_count_is_rejected_by_both(etc_opt):
    """The Python check and etensor-verify-graph agree on a symbolic mismatch."""

    def build(count):
        g = etc.Graph("g")
        n, k = g.symbol("n"), g.symbol("k")
        E = g.event((n,), wait_count=count(k), name="E")
        g.task(make_fn("p", "index", "index"), grid=(n, k * 4), out_edges={E: "ij->i"})
        g.task(make_fn("c", "index"), grid=(n,), in_edges={E: "i->i"})
        return g

    with raises(r"event 'E': wait count 3\*k differs from its fan-in 4\*k"):
        build(lambda k: k * 3).validate()
    good = build(lambda k: k * 4).to_mlir()
    assert "count %v0 " in good
    result = etc_opt(good.replace("count %v0 ", "count %k "), "--etensor-verify-graph")
    assert result.returncode != 0 and "differs from its fan-in" in result.stderr


def test_import_does_not_load_compiled_modules():
    code = (
        "import sys, etc, etc.graph, etc.simulator, etc.tiles\n"
        "bad = [m for m in sys.modules if m.startswith(('etc._mlir_libs', 'etc.ir', "
        "'etc.compiler', 'etc.dialects', 'etc.passmanager', 'etc.runtime', 'cuda'))]\n"
        "assert not bad, bad\n"
        "assert etc.__version__ == '0.1.0' and callable(etc.compile)\n"
    )
    env_path = str(REPO / "python")
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {env_path!r})\n" + code],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_function_named_like_the_graph_is_rejected():
    from etc.tiles import synthetic

    g = etc.Graph("empty")
    with pytest.raises(etc.GraphError, match="defines '@empty', the name of graph 'empty'"):
        g.task(synthetic.empty(1), grid=(4,))


def test_tiles_of_one_graph_share_the_cta_size():
    from etc.tiles import synthetic

    g = etc.Graph("mixed")
    g.task(synthetic.empty(1, name="wide"), grid=(4,))
    with pytest.raises(
        etc.GraphError, match="written for 128 threads per CTA but graph 'mixed' runs 256"
    ):
        g.task(synthetic.empty(1, name="narrow", block_size=128), grid=(4,))
    small = etc.Graph("small", block_size=64)
    with pytest.raises(
        etc.GraphError, match="written for 256 threads per CTA but graph 'small' runs 64"
    ):
        small.task(synthetic.empty(1), grid=(4,))

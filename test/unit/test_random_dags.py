"""Random DAGs: simulated results equal a direct numpy computation.

Each random task ``t`` writes ``X_t[q] = base_t[q] + sum over its in-edges of
the producer values that notify the coordinate ``q`` waits on``. Its numpy
reference reads those producer values at run time, so if an instance ever
started before all its producers finished, it would read zeros and the
result would differ from the direct, vectorised computation done here in
dependency order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from unit_helpers import make_fn

import etc

# Extents are drawn from this pool by index; equal indices mean equal extents.
POOL = ["n", 1, 2, 3, "n+1"]


def extent(index: int, n):
    value = POOL[index]
    if value == "n":
        return n
    if value == "n+1":
        return n + 1
    return value


@dataclass
class EdgeSpec:
    producer: int
    out_results: list[int]  # event dim r <- producer grid dim out_results[r]
    in_results: list[tuple[str, int]]  # event dim r <- consumer dim or constant
    count_mode: str  # "value" (int / symbolic) or "table"
    text_form: str  # "einsum" or "affine"


@dataclass
class DagSpec:
    n: int
    grids: list[list[int]]  # pool indices per task
    edges: dict[int, list[EdgeSpec]] = field(default_factory=dict)  # consumer -> edges
    insertion: list[int] = field(default_factory=list)
    num_ctas: int = 1
    seed: int = 0


@st.composite
def dag_specs(draw) -> DagSpec:
    num_tasks = draw(st.integers(1, 5))
    spec = DagSpec(
        n=draw(st.integers(0, 4)),
        grids=[
            draw(st.lists(st.integers(0, len(POOL) - 1), min_size=0, max_size=3))
            for _ in range(num_tasks)
        ],
        num_ctas=draw(st.integers(1, 6)),
        seed=draw(st.integers(0, 2**16)),
    )
    for t in range(1, num_tasks):
        producers = draw(st.lists(st.integers(0, t - 1), unique=True, max_size=3))
        edges = []
        for p in producers:
            kept: list[int] = []
            in_results: list[tuple[str, int]] = []
            for d, pool_index in enumerate(spec.grids[p]):
                matches = [q for q, qi in enumerate(spec.grids[t]) if qi == pool_index]
                options = [("dim", q) for q in matches]
                if isinstance(POOL[pool_index], int):
                    options += [("const", c) for c in range(POOL[pool_index])]
                if options and draw(st.booleans()):
                    kept.append(d)
                    in_results.append(draw(st.sampled_from(options)))
            order = draw(st.permutations(range(len(kept))))
            edges.append(
                EdgeSpec(
                    producer=p,
                    out_results=[kept[k] for k in order],
                    in_results=[in_results[k] for k in order],
                    count_mode=draw(st.sampled_from(["value", "value", "table"])),
                    text_form=draw(st.sampled_from(["einsum", "affine"])),
                )
            )
        spec.edges[t] = edges
    spec.insertion = draw(st.permutations(range(num_tasks)))
    return spec


def map_text(n_dims: int, results: list[tuple[str, int]], form: str) -> str:
    if form == "affine":
        names = [f"d{k}" for k in range(n_dims)]
        items = [names[v] if kind == "dim" else str(v) for kind, v in results]
        return f"({', '.join(names)}) -> ({', '.join(items)})"
    letters = "ijk"[:n_dims]
    items = [letters[v] if kind == "dim" else str(v) for kind, v in results]
    return f"{letters}->{','.join(items)}"


def build(spec: DagSpec):
    """The graph, its symbol values and table inputs."""
    g = etc.Graph("rand")
    n = g.symbol("n")
    shapes = [tuple(extent(i, n) for i in grid) for grid in spec.grids]
    X = [g.tensor(f"X{t}", shape, "i64") for t, shape in enumerate(shapes)]
    inputs: dict[str, np.ndarray] = {}
    events: dict[tuple[int, int], etc.Event] = {}
    for t, edges in spec.edges.items():
        for k, e in enumerate(edges):
            p_grid = shapes[e.producer]
            shape = tuple(p_grid[d] for d in e.out_results)
            fan_in = 1
            for d, size in enumerate(p_grid):
                if d not in e.out_results:
                    fan_in = fan_in * size
            name = f"E{e.producer}_{t}_{k}"
            if e.count_mode == "table":
                table = g.tensor(f"T_{name}", shape, "i32")
                concrete = tuple(etc.symbolic.evaluate(s, {"n": spec.n}) for s in shape)
                inputs[table.name] = np.full(
                    concrete, etc.symbolic.evaluate(fan_in, {"n": spec.n}), np.int32
                )
                count = table
            else:
                count = fan_in
            events[(t, k)] = g.event(shape, wait_count=count, name=name)

    for t in spec.insertion:
        rank = len(shapes[t])
        edges = spec.edges.get(t, [])
        buffers = [X[e.producer] for e in edges] + [X[t]]
        ref = make_reference(t, rank, edges)
        fn = make_fn(f"t{t}", *["index"] * rank, *[b.mlir_type for b in buffers], reference=ref)
        g.task(
            fn,
            grid=shapes[t],
            args=buffers,
            in_edges=[
                (events[(t, k)], map_text(rank, e.in_results, e.text_form))
                for k, e in enumerate(edges)
            ],
            out_edges=[
                (
                    events[(c, k)],
                    map_text(len(shapes[t]), [("dim", d) for d in e.out_results], e.text_form),
                )
                for c, cedges in spec.edges.items()
                for k, e in enumerate(cedges)
                if e.producer == t
            ],
        )
    return g, inputs


def base_value(t: int, shape: tuple[int, ...]) -> np.ndarray:
    return (t + 1) * 1000 + 1 + np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)


def make_reference(t: int, rank: int, edges: list[EdgeSpec]):
    def reference(*args):
        coords, producers, out = args[:rank], args[rank:-1], args[-1]
        value = int(base_value(t, out.shape)[coords])
        for e, Xp in zip(edges, producers, strict=True):
            waited = tuple(coords[v] if kind == "dim" else v for kind, v in e.in_results)
            for point in itertools.product(*(range(s) for s in Xp.shape)):
                if tuple(point[d] for d in e.out_results) == waited:
                    value += int(Xp[point])
        out[coords] = value

    return reference


def direct(spec: DagSpec) -> list[np.ndarray]:
    """Vectorised numpy: project, transpose and gather each producer result."""
    shapes = [tuple(extent(i, spec.n) for i in grid) for grid in spec.grids]
    X: list[np.ndarray] = []
    for t, shape in enumerate(shapes):
        value = base_value(t, shape)
        for e in spec.edges.get(t, []):
            Xp = X[e.producer]
            dropped = tuple(d for d in range(Xp.ndim) if d not in e.out_results)
            reduced = Xp.sum(axis=dropped) if dropped else Xp
            kept_sorted = sorted(e.out_results)
            per_event = reduced.transpose([kept_sorted.index(d) for d in e.out_results])
            grid_index = np.indices(shape) if shape else np.zeros((0,), dtype=np.int64)
            index = tuple(
                grid_index[v] if kind == "dim" else np.full(shape, v, dtype=np.int64)
                for kind, v in e.in_results
            )
            value = value + per_event[index]
        X.append(value)
    return X


def zero_wait_consumer(spec: DagSpec) -> bool:
    """Whether some instance waits on a coordinate whose wait count is 0.

    Counts here are fan-ins, which are 0 when a dropped producer dimension
    has extent 0. The static schedule runs such an instance at once; the
    dynamic one never pushes it (no notification makes its counter equal 0),
    on the GPU as in the simulator.
    """
    for t, edges in spec.edges.items():
        if not all(extent(i, spec.n) for i in spec.grids[t]):
            continue  # no instances
        for e in edges:
            dropped = [
                extent(i, spec.n)
                for d, i in enumerate(spec.grids[e.producer])
                if d not in e.out_results
            ]
            if not all(dropped):
                return True
    return False


def non_projection(spec: DagSpec) -> bool:
    """Whether an in-map repeats a grid dimension, which the dynamic schedule
    rejects (it enumerates a coordinate's consumers from the map)."""
    for edges in spec.edges.values():
        for e in edges:
            dims = [v for kind, v in e.in_results if kind == "dim"]
            if len(set(dims)) != len(dims):
                return True
    return False


# The dynamic interleavings tried per graph: both push modes, three seeds each.
DYNAMIC_RUNS = [(early_push, k) for early_push in (True, False) for k in range(3)]


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(dag_specs())
def test_random_dags_match_numpy(spec: DagSpec):
    """Static and dynamic schedules (both push modes, several seeds) give numpy's answer."""
    g, inputs = build(spec)
    expected = direct(spec)
    order = [t.name for t in g.topological_tasks()]
    for t, edges in spec.edges.items():
        for e in edges:
            assert order.index(f"t{e.producer}") < order.index(f"t{t}")
    symbols = {"n": spec.n}
    if non_projection(spec):
        event("dynamic: in-map not a projection")
    elif zero_wait_consumer(spec):
        event("dynamic: a wait count of 0")
    else:
        event("dynamic: compared with numpy")
    runs = [("static", True, spec.seed)] + [
        ("dynamic", early_push, spec.seed + k) for early_push, k in DYNAMIC_RUNS
    ]
    for schedule, early_push, seed in runs:
        label = f"{schedule}, early_push={early_push}, seed={seed}"
        if schedule == "dynamic" and non_projection(spec):
            with pytest.raises(etc.GraphError, match="is not a projection"):
                etc.simulate(g, inputs, symbols, schedule, spec.num_ctas, seed)
            continue
        if schedule == "dynamic" and zero_wait_consumer(spec):
            with pytest.raises(etc.DeadlockError, match="no task became ready for queue position"):
                etc.simulate(
                    g, inputs, symbols, schedule, spec.num_ctas, seed, early_push=early_push
                )
            continue
        stats: dict[str, int] = {}
        out = etc.simulate(
            g, inputs, symbols, schedule, spec.num_ctas, seed, early_push=early_push, stats=stats
        )
        for t, value in enumerate(expected):
            np.testing.assert_array_equal(out[f"X{t}"], value, err_msg=f"X{t} ({label})")
        if schedule == "dynamic":
            # Every instance with in-edges is pushed exactly once.
            assert stats["pushes"] == stats["instances"] - stats["ready_at_start"], label


@pytest.fixture(scope="module")
def etc_opt_path():
    from unit_helpers import find_etc_opt

    tool = find_etc_opt()
    if tool is None:
        pytest.skip("etc-opt not found")
    return tool


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(dag_specs())
def test_random_dags_pass_etensor_verify_graph(etc_opt_path, spec: DagSpec):
    """The C++ verifier accepts what the Python checks accept (and the text parses)."""
    import subprocess

    g, _ = build(spec)
    # Known compiler limitation: etensor-verify-graph compares semi-affine
    # counts structurally, so n*n + n and n*(n + 1) look different to it.
    assume(
        all(not isinstance(e.wait_count, etc.SymExpr) or e.wait_count.degree <= 1 for e in g.events)
    )
    result = subprocess.run(
        [etc_opt_path, "-", "--etensor-verify-graph", "--etensor-static-schedule"],
        input=g.to_mlir(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr

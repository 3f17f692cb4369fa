"""deal="pool": the static schedule deals a task's instances at run time,
phase by phase (``docs/scheduling.md``, "Run-time deal").

Each CTA whose list held instances of a phase gets one entry in their place;
the entry draws the phase's instances from a counter until none is left. The
layered graph's step tile *accumulates* into its output, so an instance run
twice (or never) changes the result."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from unit_helpers import make_fn

import etc
from etc.runtime.manifest import load_manifest
from etc.runtime.queue import (
    INSTANCE_BITS,
    build_static_queue,
    decode,
    global_order,
    instance_phases,
    pool_entries,
)

LAYERS, WIDTH = 3, 5


def _start(i, x, y):
    x[0] = 1.0


def _step(layer, j, x, y):
    y[layer, j] += x[layer] + j  # accumulates: each instance must run exactly once


def _gather(layer, x, y):
    x[layer + 1] = y[layer].sum()


def layered_pool(width: int = WIDTH) -> etc.Graph:
    """x[l+1] = sum_j (x[l] + j), the step of each layer dealt from a pool."""
    g = etc.Graph("layered_pool")
    x = g.tensor("x", (LAYERS + 1,), etc.f32)
    y = g.tensor("y", (LAYERS, width), etc.f32)
    ready = g.event((LAYERS + 1,), wait_count=1, name="ready")
    stepped = g.event((LAYERS,), wait_count=width, name="stepped")
    types = ("index", f"memref<{LAYERS + 1}xf32>", f"memref<{LAYERS}x{width}xf32>")
    g.task(make_fn("start", *types, reference=_start), (1,), [x, y], out_edges={ready: "i->0"})
    g.task(
        make_fn("step", "index", *types, reference=_step),
        (LAYERS, width),
        [x, y],
        in_edges={ready: "lj->l"},
        out_edges={stepped: "lj->l"},
        phase="lj->l",
        deal="pool",
    )
    g.task(
        make_fn("gather", *types, reference=_gather),
        (LAYERS,),
        [x, y],
        in_edges={stepped: "l->l"},
        out_edges={ready: "(l) -> (l + 1)"},
        phase="l->l",
    )
    return g


def expected(width: int = WIDTH) -> np.ndarray:
    x = [1.0]
    for _ in range(LAYERS):
        x.append(sum(x[-1] + j for j in range(width)))
    return np.array(x, np.float32)


def _pairs(entries: np.ndarray) -> list[tuple[int, int]]:
    return [(int(e >> INSTANCE_BITS), int(e & ((1 << INSTANCE_BITS) - 1))) for e in entries]


@pytest.mark.parametrize("grid", [1, 2, 3, 7, 20])
def test_pool_entries_take_each_phase_s_first_place_per_cta(grid: int) -> None:
    counts = [1, LAYERS * WIDTH, LAYERS]
    phases = [
        0,
        instance_phases(("dim", 0), (LAYERS, WIDTH)),
        instance_phases(("dim", 0), (LAYERS,)),
    ]
    pooled = [False, True, False]
    lists = decode(build_static_queue(counts, grid, phases))
    pools = decode(build_static_queue(counts, grid, phases, pooled))
    assert len(lists) == len(pools) == grid
    for listed, drawn in zip(lists, pools, strict=True):
        # Other tasks' entries are untouched; a pooled layer's instances in a
        # CTA's list become one entry (task 1, layer) where the first was.
        want: list[tuple[int, int]] = []
        for task, instance in listed:
            entry = (task, instance // WIDTH) if task == 1 else (task, instance)
            if task != 1 or entry not in want:
                want.append(entry)
        assert drawn == want
    # Every layer has an entry in min(grid, WIDTH) CTAs.
    for layer in range(LAYERS):
        holders = sum((1, layer) in cta for cta in pools)
        assert holders == min(grid, WIDTH)


def test_pool_entries_of_a_task_without_phases_form_one_pool() -> None:
    entries = global_order([2, 7])
    kept, ctas = pool_entries(entries, 3, None, [False, True])
    assert _pairs(kept) == [(0, 0), (0, 1), (1, 0), (1, 0), (1, 0)]
    assert ctas.tolist() == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("num_ctas", [1, 2, 3, 5, 16])
def test_pooled_layers_run_every_instance_once(schedule: str, num_ctas: int) -> None:
    g = layered_pool()
    assert "pooled, pool_dim = 0 : i64" in g.to_mlir()
    out = etc.simulate(g, {}, schedule=schedule, num_ctas=num_ctas)
    np.testing.assert_array_equal(out["x"], expected())


def _partial(i, j, a, b):
    b[i, j] += a[i, j * 4 : (j + 1) * 4].sum()


def _final(i, b, c):
    c[i] = b[i].sum()


def one_pool() -> etc.Graph:
    """Row sums in two stages; the partial sums are one pool (no phases)."""
    g = etc.Graph("one_pool")
    n = g.symbol("n")
    a = g.tensor("a", (n, 16), etc.f32)
    b = g.tensor("b", (n, 4), etc.f32)
    c = g.tensor("c", (n,), etc.f32)
    e = g.event((n,), wait_count=4, name="e")
    g.task(
        make_fn("partial", "index", "index", "memref<?x16xf32>", "memref<?x4xf32>", reference=_partial),
        (n, 4),
        [a, b],
        out_edges={e: "ij->i"},
        deal="pool",
    )  # fmt: skip
    g.task(
        make_fn("final", "index", "memref<?x4xf32>", "memref<?xf32>", reference=_final),
        (n,),
        [b, c],
        in_edges={e: "i->i"},
    )
    return g


@pytest.mark.parametrize("num_ctas", [1, 4, 9])
@pytest.mark.parametrize("n", [1, 6, 25])
def test_one_pool_without_phases(num_ctas: int, n: int) -> None:
    a = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
    out = etc.simulate(one_pool(), {"a": a}, {"n": n}, num_ctas=num_ctas)
    np.testing.assert_allclose(out["c"], a.sum(1), rtol=1e-5, atol=1e-5)
    # One pool entry per CTA that the lists gave any instance.
    queues = etc.static_queues(one_pool(), {"n": n}, num_ctas)
    assert sum(entry == (0, 0) for q in queues for entry in q) == min(num_ctas, 4 * n)


def test_pooled_task_compiles_with_its_counters(tmp_path) -> None:
    art = etc.compile(layered_pool(), schedule="static", cubin=shutil.which("ptxas") is not None)
    events = {e["name"]: e for e in art.manifest["events"]}
    assert events["pool.step"] == {
        "name": "pool.step", "shape": [LAYERS], "wait_count": 1, "implicit": True
    }  # fmt: skip
    tasks = {t["name"]: t for t in art.manifest["tasks"]}
    assert tasks["step"]["deal"] == "pool" and "deal" not in tasks["gather"]
    # The draw and the draw ahead: two atomic adds on the pool's counter.
    assert art.ptx.count("atom.relaxed.gpu.global.add.u32") == 2
    if shutil.which("ptxas"):
        assert art.cubin  # ptxas assembled the loop
    art.save(tmp_path / "static")
    assert load_manifest(tmp_path / "static").tasks[1].pooled
    dynamic = etc.compile(layered_pool(), schedule="dynamic", cubin=False)
    assert "pool.step" not in {e["name"] for e in dynamic.manifest["events"]}
    assert all("deal" not in t for t in dynamic.manifest["tasks"])


def test_one_pool_compiles_with_one_counter() -> None:
    art = etc.compile(one_pool(), schedule="static", cubin=False)
    events = {e["name"]: e for e in art.manifest["events"]}
    assert events["pool.partial"]["shape"] == [1]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"shared_region": 1}, "deal='pool' runs a CTA's instances in a loop"),
        ({"deal": "steal"}, "deal must be one of 'list', 'ticket', 'pool'"),
    ],
)
def test_pool_mistakes_name_the_task(kwargs: dict, message: str) -> None:
    g = etc.Graph("bad_pool")
    with pytest.raises(etc.GraphError, match=message) as err:
        g.task(
            make_fn("t", "index", "index"),
            grid=(2, 3),
            name="tiles",
            **{"deal": "pool", **kwargs},
        )
    assert "task 'tiles'" in str(err.value)


def test_pooled_trigger_is_refused() -> None:
    g = etc.Graph("bad_pool")
    n = g.symbol("n")
    indptr = g.tensor("indptr", (n + 1,), "i32")
    ready = g.event((n,), wait_count=1, name="ready")
    with pytest.raises(etc.GraphError, match="task 'tile': deal='pool'"):
        g.task(
            make_fn("tile", "index", "index", "memref<?xi32>"),
            grid=(n,),
            args=(indptr,),
            triggered_by=(ready, indptr),
            deal="pool",
            name="tile",
        )


def test_a_manifest_with_a_bad_deal_names_the_field(tmp_path) -> None:
    import json

    etc.compile(layered_pool(), schedule="static", cubin=False).save(tmp_path)
    path = tmp_path / "manifest.json"
    data = json.loads(path.read_text())
    data["tasks"][1]["deal"] = "ticket"
    path.write_text(json.dumps(data))
    with pytest.raises(etc.LaunchError, match=r"tasks\[1\]\.deal.*'ticket'"):
        load_manifest(tmp_path)


@pytest.mark.parametrize("deal", ["ticket", "pool"])
def test_the_split_k_example_deals_its_partial_sums(deal: str, tmp_path) -> None:
    """``examples/splitk_rowsum.py --deal``: the simulator matches numpy, and
    the emitted PTX draws from the counter (ptxas assembles it)."""
    from examples import splitk_rowsum

    assert splitk_rowsum.main(["--simulate", "--deal", deal, "--sizes", "1,9,40"]) == 0
    ptx = tmp_path / "k.ptx"
    assert splitk_rowsum.main(["--deal", deal, "--emit-ptx", str(ptx)]) == 0
    assert "atom.relaxed.gpu.global.add.u32" in ptx.read_text()
    if shutil.which("ptxas"):
        import subprocess

        done = subprocess.run(
            ["ptxas", "-arch=sm_90", str(ptx), "-o", str(tmp_path / "k.cubin")],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr


def test_empty_pools_leave_no_entries() -> None:
    # A pooled task with no instances (or a phase dimension of extent 0)
    # gets no entry; the other tasks are dealt as before.
    assert decode(build_static_queue([0, 3], 2, None, [True, False])) == [
        [(1, 0), (1, 2)],
        [(1, 1)],
    ]
    phases = [instance_phases(("dim", 0), (0, 4)), 0]
    assert decode(build_static_queue([0, 2], 3, phases, [True, False])) == [
        [(1, 0)],
        [(1, 1)],
        [],
    ]
    out = etc.simulate(one_pool(), {"a": np.zeros((0, 16), np.float32)}, {"n": 0}, num_ctas=3)
    assert out["c"].shape == (0,)

"""Thread-block clusters (``etc.DeviceFunction.cluster``): a tile's groups of
instances run on one cluster's CTAs (``etc.runtime.queue.cluster_ctas``), the
kernel launches in clusters, and the simulator runs a group together
(``docs/scheduling.md``, "Parts on one cluster")."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from unit_helpers import make_fn

import etc
from etc.runtime import driver
from etc.runtime.kernel import Kernel
from etc.runtime.manifest import load_manifest
from etc.runtime.queue import (
    INSTANCE_BITS,
    INSTANCE_MASK,
    build_static_queue,
    cluster_ctas,
    decode,
    global_order,
)

PARTS = 4


def _positions(counts, phases=None) -> dict[tuple[int, int], int]:
    order = global_order(counts, phases).tolist()
    return {(e >> INSTANCE_BITS, e & INSTANCE_MASK): p for p, e in enumerate(order)}


def _assert_clustered(lists, task: int, size: int, count: int, position) -> None:
    """Every group of ``size`` instances of ``task`` on one cluster's CTAs in
    rank order, each instance once, every list in global order."""
    where = {}
    for cta, entries in enumerate(lists):
        assert [position[e] for e in entries] == sorted(position[e] for e in entries)
        for t, i in entries:
            if t == task:
                where[i] = cta
    assert sorted(where) == list(range(count))
    for i, cta in where.items():
        assert cta % size == i % size
        assert cta - cta % size == where[i - i % size] - where[i - i % size] % size


@pytest.mark.parametrize("grid", [2, 4, 6, 264])
@pytest.mark.parametrize("size", [2, 4])
def test_groups_go_to_one_cluster_in_rank_order(grid: int, size: int) -> None:
    if grid % size:
        pytest.skip("not whole clusters")
    counts = [3, 8 * size, 5, 2 * size]
    lists = decode(build_static_queue(counts, grid, clusters=[0, size, 0, size]))
    for task in (1, 3):
        _assert_clustered(lists, task, size, counts[task], _positions(counts))


def test_other_deals_keep_their_tasks_and_move_only_the_groups() -> None:
    counts, grid = [7, 16, 9], 6
    sm = np.arange(grid) // 2
    for kwargs in (
        {"sm_of_cta": sm},
        {"slots": [8, 0, 0]},
        {"limits": [0, 0, 3]},
    ):
        plain = decode(build_static_queue(counts, grid, **kwargs))
        lists = decode(build_static_queue(counts, grid, clusters=[0, 2, 0], **kwargs))
        _assert_clustered(lists, 1, 2, 16, _positions(counts))
        strip = [[[e for e in q if e[0] != 1] for q in both] for both in (plain, lists)]
        assert strip[0] == strip[1], kwargs


def test_cluster_deal_mistakes_are_refused() -> None:
    entries = global_order([4])
    with pytest.raises(ValueError, match="grid of 5 CTAs is not whole clusters of 2"):
        cluster_ctas(entries, np.arange(4) % 5, [2], 5)
    with pytest.raises(ValueError, match="task 0: 5 instances are not whole groups of 2"):
        cluster_ctas(global_order([5]), np.arange(5) % 4, [2], 4)
    # A phase along the parts splits a group across the global order.
    phases = [np.array([0, 1, 0, 1])]
    with pytest.raises(ValueError, match="not consecutive in the global order"):
        build_static_queue([4], 4, phases, clusters=[2])


def _meet(parts, b, ks, x, y):
    # Parts (b, 2g) and (b, 2g + 1) of one cluster: their sum lands once.
    y[b, ks] = x[b, ks] + (1.0 if ks % 2 else 0.0)


def clustered_graph(size: int = 2, blocks: int = 3, **task) -> etc.Graph:
    g = etc.Graph("clustered")
    x = g.tensor("x", (blocks, PARTS), etc.f32)
    y = g.tensor("y", (blocks, PARTS), etc.f32)
    z = g.tensor("z", (blocks,), etc.f32)
    done = g.event((blocks,), wait_count=PARTS, name="done")
    ty = f"memref<{blocks}x{PARTS}xf32>"
    fn = make_fn(
        "parts", "index", "index", ty, ty, reference=lambda b, s, x, y: _meet(None, b, s, x, y)
    )
    fn.cluster = size
    g.task(fn, grid=(blocks, PARTS), args=[x, y], out_edges={done: "ij->i"}, name="parts", **task)

    def total(b, y, z):
        z[b] = y[b].sum()

    g.task(
        make_fn("total", "index", ty, f"memref<{blocks}xf32>", reference=total),
        grid=(blocks,),
        args=[y, z],
        in_edges={done: "i->i"},
        name="total",
    )
    return g


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"deal": "pool"}, "deal='pool'"),
        ({"phase": "ij->j"}, "its phase is that dimension"),
    ],
)
def test_a_clustered_task_needs_listed_groups_along_its_last_dimension(kwargs, message) -> None:
    with pytest.raises(
        etc.GraphError, match=rf"task 'parts': .*one thread-block cluster.*{message}"
    ):
        clustered_graph(**kwargs)


def test_the_last_dimension_must_be_whole_clusters() -> None:
    with pytest.raises(etc.GraphError, match="its last grid dimension is 4"):
        clustered_graph(size=8)


@pytest.mark.parametrize("size", [3, 16, -2, True, "2", 2.0])
def test_a_cluster_size_other_than_2_4_or_8_is_named(size) -> None:
    with pytest.raises(etc.GraphError, match=rf"tile 'parts' has cluster={size!r}; expected 0"):
        clustered_graph(size=size)


@pytest.mark.parametrize("meets", [-1, True, "4"])
def test_a_meeting_count_that_is_not_a_count_is_named(meets) -> None:
    fn = make_fn("parts", "index", "index", "memref<?xf32>")
    fn.meets = meets
    g = etc.Graph("meets")
    with pytest.raises(etc.GraphError, match=rf"tile 'parts' has meets={meets!r}; expected"):
        g.task(fn, grid=(2, 4), args=[g.tensor("x", (8,), "f32")])


def test_the_manifest_says_the_cluster_and_a_newer_format(tmp_path) -> None:
    art = etc.compile(clustered_graph(), schedule="static", cubin=False)
    assert art.manifest["format"] == "etc-artifact/7"
    assert [t.get("cluster") for t in art.manifest["tasks"]] == [2, None]
    art.save(tmp_path / "a")
    m = load_manifest(tmp_path / "a")
    assert ([t.cluster for t in m.tasks], m.cluster) == ([2, 0], 2)
    plain = etc.compile(clustered_graph(size=0), schedule="static", cubin=False)
    assert plain.manifest["format"] != "etc-artifact/7"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schedule": "dynamic"}, "only the static schedule's lists"),
        ({"schedule": "static", "sm_slices": True}, "without sm_slices"),
    ],
)
def test_clusters_need_lists_dealt_by_cta(options, message) -> None:
    with pytest.raises(etc.CompileError, match=rf"task 'parts' .*{message}"):
        etc.compile(clustered_graph(), cubin=False, **options)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["tasks"][0].update(cluster=3), r"tasks\[0\]\.cluster: .*got 3"),
        (lambda d: d["tasks"][0].update(meets=4), r"tasks\[0\]\.cluster: .*without meets"),
        (lambda d: d.update(schedule="dynamic"), r"cluster: clusters need the static"),
        (lambda d: d["tasks"][1].update(cluster=4), r"tasks\[1\]\.cluster: one launch has one"),
    ],
)
def test_a_bad_cluster_in_a_manifest_names_the_field(tmp_path, edit, message) -> None:
    art = etc.compile(clustered_graph(), schedule="static", cubin=False)
    art.save(tmp_path)
    doc = json.loads((tmp_path / "manifest.json").read_text())
    edit(doc)
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(etc.LaunchError, match=message):
        load_manifest(tmp_path)


def test_the_simulator_runs_a_group_on_its_cluster() -> None:
    g = clustered_graph()
    x = np.arange(3 * PARTS, dtype=np.float32).reshape(3, PARTS)
    for ctas in (2, 4, 6):
        out = etc.simulate(g, {"x": x}, num_ctas=ctas)
        np.testing.assert_array_equal(out["z"], x.sum(axis=1) + PARTS // 2)
        tasks = [t.name for t in g.topological_tasks()]
        parts = tasks.index("parts")
        where = {
            i: c for c, q in enumerate(etc.static_queues(g, {}, ctas)) for t, i in q if t == parts
        }
        assert all(where[i] % 2 == i % 2 and where[i] // 2 == where[i - 1] // 2 for i in (1, 5, 9))
    with pytest.raises(etc.EtcError, match="num_ctas=3 is not whole thread-block clusters of 2"):
        etc.simulate(g, {"x": x}, num_ctas=3)


def test_launch_grids_are_whole_clusters() -> None:
    k = SimpleNamespace(cluster=2, num_ctas=264)
    grids = [Kernel._whole_clusters(k, n) for n in (0, 1, 2, 3, 263, 264, 1000)]
    assert grids == [2, 2, 2, 4, 264, 264, 264]
    plain = SimpleNamespace(cluster=1, num_ctas=264)
    assert [Kernel._whole_clusters(plain, n) for n in (0, 3, 1000)] == [1, 3, 264]


@pytest.mark.skipif(driver.cu is None, reason="cuda-bindings not installed")
def test_the_cluster_launch_config_holds_the_cluster_and_cooperation() -> None:
    cu = driver.cu
    config = driver.cluster_launch_config(264, 256, 1024, 2)
    assert (config.gridDimX, config.blockDimX, config.sharedMemBytes) == (264, 256, 1024)
    assert config.numAttrs == 2
    ids = cu.CUlaunchAttributeID
    shape, together = config.attrs
    assert shape.id == ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (shape.value.clusterDim.x, shape.value.clusterDim.y) == (2, 1)
    assert together.id == ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE and together.value.cooperative
    assert driver.cluster_launch_config(264, 256, 0, 2, cooperative=False).numAttrs == 1


def _bare_kernel(tmp_path, **attrs) -> Kernel:
    """A Kernel of the clustered graph's static manifest, built without a
    GPU: only what planning and launching read."""
    art = etc.compile(clustered_graph(blocks=5), schedule="static", cubin=False)
    art.save(tmp_path)
    kernel = Kernel.__new__(Kernel)
    kernel.manifest = load_manifest(tmp_path)
    kernel.cluster, kernel.num_ctas = 2, 8
    kernel._sm_deal, kernel._sm_of_cta = None, None
    kernel._cluster_cooperative = True
    kernel.device = SimpleNamespace(sm_count=4)
    kernel.function = "fn"
    kernel._symbol_names, kernel._plans = kernel.manifest.symbols, {}
    for key, value in attrs.items():
        setattr(kernel, key, value)
    return kernel


def test_the_runtime_deals_groups_to_clusters(tmp_path) -> None:
    kernel = _bare_kernel(tmp_path)
    counts = [5 * PARTS, 5]
    lists = decode(kernel._static_queue(counts, 8, None, [False, False]))
    _assert_clustered(lists, 0, 2, 5 * PARTS, _positions(counts))
    # Dealt by SM too (the default of kernels that record where CTAs ran).
    kernel._sm_deal, kernel._sm_of_cta = "spread", np.arange(8) % 4
    lists = decode(kernel._static_queue(counts, 8, None, [False, False]))
    _assert_clustered(lists, 0, 2, 5 * PARTS, _positions(counts))


@pytest.mark.skipif(driver.cu is None, reason="cuda-bindings not installed")
def test_a_refused_cooperative_cluster_launch_goes_again_plain(tmp_path, monkeypatch) -> None:
    """The driver answers a cooperative cluster launch with
    CUDA_ERROR_NOT_SUPPORTED: the kernel launches again without
    cooperation, and from then on launches so; other errors come back."""
    from etc.runtime import kernel as K

    cu = driver.cu
    seen = []

    def launch(config, fn, params, extra):
        cooperative = config.numAttrs == 2
        seen.append(cooperative)
        refused = cu.CUresult.CUDA_ERROR_NOT_SUPPORTED
        return (refused if cooperative else cu.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(K._cu, "cuLaunchKernelEx", launch)
    kernel = _bare_kernel(tmp_path)
    plan = SimpleNamespace(grid=8, cluster_config=None, pack=SimpleNamespace(address=0))
    assert kernel._launch_clusters(plan, 0) == cu.CUresult.CUDA_SUCCESS
    assert kernel._launch_clusters(plan, 0) == cu.CUresult.CUDA_SUCCESS
    assert seen == [True, False, False] and not kernel._cluster_cooperative
    assert plan.cluster_config[0].attrs[0].value.clusterDim.x == 2


@pytest.mark.parametrize(
    ("tensors", "symbols", "message"),
    [
        ([1, 2], {}, "tensors must map names to values, got list"),
        ({}, [5], "symbols must map names to values, got list"),
    ],
)
def test_a_launch_names_arguments_that_are_not_mappings(tmp_path, tensors, symbols, message):
    # A list of symbol values of the right length reached list.__getitem__("n").
    kernel = _bare_kernel(tmp_path)
    with pytest.raises(etc.LaunchError, match=message):
        kernel.launch(tensors, symbols)

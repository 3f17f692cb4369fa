"""The GPU fuzz graphs (test/gpu/fuzz_graphs.py) on the CPU: well formed,
deterministic, every schedule of the simulator gives numpy's answer, and they
compile under both schedules (when the bindings are built)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import etc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from fuzz_graphs import (  # noqa: E402
    deal_variants,
    deals_alone,
    direct,
    draw_deals,
    draw_specs,
    random_graph,
)

# Seeds with their launch sizes: n = 1, partial and full blocks (kept small for speed).
CASES = [(0, 1), (1, 255), (2, 256), (3, 300), (4, 513)]


@pytest.mark.parametrize(("seed", "n"), CASES)
def test_fuzz_graph_matches_numpy(seed: int, n: int) -> None:
    g, symbols, inputs = random_graph(seed, n=n)
    assert symbols == {"n": n} and inputs["X"].shape == (n,)
    assert g.name == f"fuzz{seed}" and 3 <= len(g.tasks) <= 10
    names = [t.function.name for t in g.tasks]
    assert len(set(names)) == len(names) and g.name not in names
    assert all(e.map.text == "i->i" for t in g.tasks for e in (*t.in_edges, *t.out_edges))
    if seed % 2 == 0:
        assert max(len(t.in_edges) for t in g.tasks) >= 2
    again, _, same = random_graph(seed, n=n)
    assert again.to_mlir() == g.to_mlir()
    np.testing.assert_array_equal(same["X"], inputs["X"])

    expected = direct(seed, inputs)
    # The static schedule over several CTA counts: its lists, tickets and
    # pools (the drawn deals) interleave differently with each.
    runs = [("static", True, 0, ctas) for ctas in (1, 3, 4)] + [
        ("dynamic", early, k, 4) for early in (True, False) for k in (0, 1)
    ]
    for schedule, early_push, k, ctas in runs:
        out = etc.simulate(
            g, inputs, symbols, schedule, num_ctas=ctas, seed=k, early_push=early_push
        )
        for name, value in expected.items():
            np.testing.assert_array_equal(
                out[name],
                value,
                err_msg=f"{name}: {schedule}, {ctas} CTAs, early_push={early_push}, seed={k}",
            )


def test_fuzz_graphs_vary() -> None:
    """Over 20 seeds: both grid kinds, shared and per-edge events, fan-in."""
    specs = [s for seed in range(20) for s in draw_specs(seed)[1]]
    assert {s.per_element for s in specs} == {True, False}
    groups = [
        [q for r, q in zip(s.reads, s.groups, strict=True) if r >= 0].count(q)
        for s in specs
        for q in set(s.groups)
    ]
    assert 1 in groups and max(groups) >= 2
    assert max(len(s.reads) for s in specs) == 3
    deals = [d for seed in range(20) for d in draw_deals(seed, len(draw_specs(seed)[1]))]
    assert set(deals) == set(etc.graph.DEALS)


def test_fuzz_graph_compiles() -> None:
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    g, _, _ = random_graph(0)
    for schedule in ("static", "dynamic"):
        artifact = etc.compile(g, schedule=schedule, cubin=False)
        assert f".visible .entry {g.name}(" in artifact.ptx
        assert sorted(t["name"] for t in artifact.manifest["tasks"]) == sorted(
            t.name for t in g.tasks
        )


def test_deals_override_and_deal_variants() -> None:
    """random_graph(deals=...) replaces the named tasks' drawn deals only, and
    deal_variants drop and keep each non-list deal in turn."""
    from fuzz_case import parse_deals

    drawn = draw_deals(5, len(draw_specs(5)[1]))
    dealt = [k for k, d in enumerate(drawn) if d != "list"]
    assert dealt, "seed 5 draws tickets or pools"
    g, _, _ = random_graph(5, n=40, deals={dealt[0]: "list"})
    deals = {t.function.name: t.deal for t in g.tasks}
    assert deals[f"t{dealt[0]}"] == "list"
    assert all(deals[f"t{k}"] == drawn[k] for k in range(len(drawn)) if k != dealt[0])
    assert parse_deals("1=list,5=pool") == {1: "list", 5: "pool"} and parse_deals("") == {}
    v = deal_variants(5)
    assert v["drawn"] == {} and v["lists"] == dict.fromkeys(dealt, "list")
    for k in dealt:
        assert v[f"no_t{k}"] == {k: "list"}
        assert set(v[f"only_t{k}"]) == set(dealt) - {k}


@pytest.mark.parametrize(
    "seed, deals",
    [(5, {}), (6, {}), (5, {1: "list", 5: "list"}), (6, {0: "list", 1: "list", 3: "list", 5: "list", 7: "list"}), (29, {})],
)  # fmt: skip
def test_drawing_kernels_take_non_aligned_barriers(seed: int, deals: dict[int, str]) -> None:
    """A kernel that draws (a pool or a ticket) carries thread 0's draws
    ahead in its loop, and LLVM restructures that loop (it peels an
    unwaited pool's) so that lane 0 and the other lanes of a warp reach
    different copies of one CTA barrier. PTX leaves that undefined for the
    aligned forms: seed 5's pooled kernel hung on an H100, and seeds 5 and 6
    with one ticket alone (the other deals lists) stopped at an illegal
    instruction (compute-sanitizer: divergent threads at a `BAR.RED`). Such
    kernels take `barrier.sync` and `barrier.red` for the scheduler's
    barriers (lincomb tiles have none of their own); seed 29 (lists only)
    keeps the aligned forms."""
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    g, _, _ = random_graph(seed, deals=deals)
    draws = any(t.deal != "list" for t in g.tasks)
    assert draws == (seed != 29)
    ptx = etc.compile(g, schedule="static", cubin=False).ptx
    lines = [line.strip() for line in ptx.splitlines()]
    aligned = [line for line in lines if line.startswith("bar.sync")]
    non_aligned = [line for line in lines if line.startswith("barrier.sync")]
    assert (len(non_aligned) > 0 and not aligned) if draws else (aligned and not non_aligned)
    assert ("barrier.red.or.pred" in ptx) == draws and ("bar.red.or.pred" in ptx) != draws


#: Every ticket or pool alone (the other deals lists) of the first ten seeds:
#: the GPU suite's test_fuzz_deal_alone kernels.
ALONE = [(seed, name) for seed in range(10) for name in deals_alone(seed)]


@pytest.mark.parametrize(("seed", "name"), ALONE)
def test_each_deal_alone_simulates_and_draws_with_non_aligned_barriers(seed: int, name: str):
    """A deal alone once split an aligned barrier that no drawn mix did: the
    simulator gives numpy's values under it at 1 and 3 CTAs, and its static
    kernel joins the CTA only through `barrier.sync`/`barrier.red` (the
    fuzz tiles have no barriers of their own)."""
    g, symbols, inputs = random_graph(seed, n=300, deals=deals_alone(seed)[name])
    assert sum(t.deal != "list" for t in g.tasks) == 1
    expected = direct(seed, inputs)
    for ctas in (1, 3):
        out = etc.simulate(g, inputs, symbols, "static", num_ctas=ctas)
        for out_name, value in expected.items():
            np.testing.assert_array_equal(out[out_name], value, err_msg=f"{out_name}, {ctas} CTAs")
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    ptx = etc.compile(g, schedule="static", cubin=False).ptx
    lines = [line.strip() for line in ptx.splitlines()]
    assert any(line.startswith("barrier.sync") for line in lines) and "barrier.red." in ptx
    assert not any(line.startswith("bar.sync") for line in lines) and "bar.red." not in ptx

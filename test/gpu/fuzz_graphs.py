"""Random layered DAGs of ``lincomb`` tasks with real device code, for fuzzing
both schedules on the GPU. Pure Python: the CPU machine compiles them
(make_fuzz_artifacts.py), the GPU machine rebuilds them for expected values.

Graph ``seed``: a symbol ``n``, an input ``X`` (n,) f32 and 3-10 tasks ``t<k>``,
each writing its own ``Y<k>`` (n,) f32 from 1-3 earlier tensors. A task runs
over ``(blocks,)`` (256 elements per instance) or ``(n,)`` (one element per
instance); it reads only ``X`` and outputs of tasks on the same grid, so every
edge is ``i->i``. A consumer's producers are split into groups, one event per
group with the group's size as its wait count: one event per edge, one shared
event, or a mix. Even seeds always have a task waiting on two or more events.
Each task's static deal (lists, tickets or a pool) is drawn from its own
stream (:func:`draw_deals`), so the specs of a seed did not change with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import etc
from etc.tiles import synthetic

BLOCK = 256
N_MAX = 5000
#: Launch sizes for a second run of an artifact: block boundaries and extremes.
OTHER_NS = (1, 255, 256, 257, 1000, 4097, 5000)


@dataclass
class TaskSpec:
    """Task ``t<k>``: its grid kind, the tensors it reads and its wiring."""

    per_element: bool  # grid (n,) with span 1, else (blocks,) with span 256
    reads: list[int]  # -1 is X, else the producing task
    coefs: list[float]
    bias: float
    groups: list[int]  # per read: its event group (ignored for X)


def _draw(rng: np.random.Generator) -> list[TaskSpec]:
    layout = rng.choice(["mixed", "blocks", "elements"], p=[0.5, 0.3, 0.2])
    specs: list[TaskSpec] = []
    for k in range(int(rng.integers(3, 11))):
        per_element = bool(rng.integers(2)) if layout == "mixed" else layout == "elements"
        same = [j for j in range(k) if specs[j].per_element == per_element]
        pool = [-1, *same]
        weights = np.array([0.5] + [1.0] * len(same))
        count = int(rng.integers(1, min(3, len(pool)) + 1))
        reads = [int(r) for r in rng.choice(pool, count, replace=False, p=weights / weights.sum())]
        coefs = [
            float(np.round(rng.uniform(0.2, 1.2) * rng.choice([-1, 1]) / count, 3)) for _ in reads
        ]
        wiring = rng.choice(["per_edge", "shared", "mixed"])
        groups = [
            {"per_edge": j, "shared": 0, "mixed": int(rng.integers(2))}[wiring]
            for j in range(count)
        ]
        specs.append(
            TaskSpec(per_element, reads, coefs, float(np.round(rng.uniform(-2, 2), 2)), groups)
        )
    return specs


def _events_waited(spec: TaskSpec) -> int:
    return len({g for r, g in zip(spec.reads, spec.groups, strict=True) if r >= 0})


def draw_specs(seed: int) -> tuple[int, list[TaskSpec], list[int]]:
    """``seed``'s drawn n, task specs and task insertion order."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, N_MAX + 1))
    while True:
        specs = _draw(rng)
        if seed % 2 or any(_events_waited(s) >= 2 for s in specs):
            break
    return n, specs, [int(k) for k in rng.permutation(len(specs))]


def draw_deals(seed: int, count: int) -> list[str]:
    """How the static schedule deals each of ``seed``'s ``count`` tasks."""
    rng = np.random.default_rng([seed, 31])
    return [str(d) for d in rng.choice(etc.graph.DEALS, count, p=[0.5, 0.25, 0.25])]


def deal_variants(seed: int) -> dict[str, dict[int, str]]:
    """Deal overrides (``random_graph(deals=...)``) by variant name: ``drawn``
    (none), ``lists`` (every ticket and pool a list), and for each task ``k``
    drawn a ticket or pool, ``only_t<k>`` (it alone kept) and ``no_t<k>`` (it
    alone a list). A deal alone once split a barrier that the drawn mix did
    not (fuzz 5 and 6 with one ticket alone, docs/design.md)."""
    _, specs, _ = draw_specs(seed)
    drawn = draw_deals(seed, len(specs))
    dealt = [k for k, d in enumerate(drawn) if d != "list"]
    out: dict[str, dict[int, str]] = {"drawn": {}, "lists": dict.fromkeys(dealt, "list")}
    for k in dealt:
        out[f"no_t{k}"] = {k: "list"}
        out[f"only_t{k}"] = {j: "list" for j in dealt if j != k}
    return out


def deals_alone(seed: int) -> dict[str, dict[int, str]]:
    """``deal_variants``' ``only_t<k>`` where ``seed`` draws two or more
    tickets or pools (with one, it is the drawn graph): the GPU suite's
    ``test_fuzz_deal_alone`` kernels."""
    alone = {k: v for k, v in deal_variants(seed).items() if k.startswith("only_")}
    return alone if len(alone) > 1 else {}


def random_graph(
    seed: int, n: int | None = None, deals: dict[int, str] | None = None
) -> tuple[etc.Graph, dict[str, int], dict]:
    """Graph ``fuzz<seed>``, its symbols and inputs; ``n`` overrides the drawn
    size (the graph does not depend on it, the input values do) and ``deals``
    the drawn deals of the tasks it names (``{k: deal}`` for task ``t<k>``)."""
    drawn, specs, order = draw_specs(seed)
    n = drawn if n is None else n
    g = etc.Graph(f"fuzz{seed}")
    sym = g.symbol("n")
    blocks = (sym + BLOCK - 1) // BLOCK
    X = g.tensor("X", (sym,), "f32")
    Y = [g.tensor(f"Y{k}", (sym,), "f32") for k in range(len(specs))]
    grids = [(sym,) if s.per_element else (blocks,) for s in specs]
    ins: dict[int, list] = {k: [] for k in range(len(specs))}
    outs: dict[int, list] = {k: [] for k in range(len(specs))}
    for k, s in enumerate(specs):
        for group in sorted(set(s.groups)):
            producers = [r for r, q in zip(s.reads, s.groups, strict=True) if q == group and r >= 0]
            if not producers:
                continue
            e = g.event(grids[k], wait_count=len(producers), name=f"e{k}_{group}")
            ins[k].append((e, "i->i"))
            for p in producers:
                outs[p].append((e, "i->i"))
    drawn_deals = draw_deals(seed, len(specs))
    for k in order:
        s = specs[k]
        fn = synthetic.lincomb(
            s.coefs, s.bias, span=1 if s.per_element else None, name=f"t{k}", block_size=BLOCK
        )
        args = [X if r < 0 else Y[r] for r in s.reads] + [Y[k]]
        g.task(
            fn,
            grid=grids[k],
            args=args,
            in_edges=ins[k] or None,
            out_edges=outs[k] or None,
            deal=(deals or {}).get(k, drawn_deals[k]),
        )
    x = np.random.default_rng([seed, n]).standard_normal(n).astype(np.float32)
    return g, {"n": n}, {"X": x}


def direct(seed: int, inputs: dict) -> dict[str, np.ndarray]:
    """Every ``Y<k>`` computed with whole-array numpy, in task order (the same
    float32 operations, in the same order, as lincomb's reference)."""
    _, specs, _ = draw_specs(seed)
    x = inputs["X"]
    Y: list[np.ndarray] = []
    for s in specs:
        value = np.full(len(x), np.float32(s.bias), np.float32)
        for r, c in zip(s.reads, s.coefs, strict=True):
            value = value + np.float32(c) * (x if r < 0 else Y[r])
        Y.append(value)
    return {f"Y{k}": y for k, y in enumerate(Y)}


def other_n(seed: int, n: int) -> int:
    """A launch size other than ``n``, for a second run of the same artifact."""
    other = OTHER_NS[seed % len(OTHER_NS)]
    return other if other != n else n % N_MAX + 1

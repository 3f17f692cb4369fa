"""Helpers shared by the unit tests (imported by name: test/unit is on sys.path)."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import etc
from etc.tiles import final_sum, partial_sum

REPO = Path(__file__).resolve().parents[2]


def _executable(path: str | Path | None) -> str | None:
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return str(path)
    return None


def find_etc_opt() -> str | None:
    """etc-opt from $ETC_OPT, then PATH, then the repository's build dir."""
    return (
        _executable(os.environ.get("ETC_OPT"))
        or _executable(shutil.which("etc-opt"))
        or _executable(REPO / "build" / "bin" / "etc-opt")
    )


def ptx_from_module(text: str) -> str:
    """The PTX held by the first ``assembly = "..."`` of a gpu.binary."""
    match = re.search(r'assembly = "((?:[^"\\]|\\.)*)"', text)
    assert match, "no assembly in the pipeline output"
    # MLIR escapes non-printable bytes and quotes as \XX, a backslash as \\.
    return re.sub(
        r"\\(\\|[0-9A-Fa-f]{2})",
        lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1), 16)),
        match.group(1),
    )


def make_fn(
    name: str, *types: str, reference: Callable[..., Any] | None = None, **kwargs: Any
) -> etc.DeviceFunction:
    """A device function with an empty body and the given parameter types."""
    sig = ", ".join(f"%a{k}: {t}" for k, t in enumerate(types))
    return etc.DeviceFunction.from_mlir(
        f"func.func @{name}({sig}) {{\n  return\n}}\n",
        name,
        reference if reference is not None else (lambda *a: None),
        **kwargs,
    )


def splitk_graph(R: int = 8, S: int = 4, K: int = 256, kept_zero_b: bool = False) -> etc.Graph:
    """The paper's Figure 3 with the rowsum tiles: C[r] = sum(A[r, :]);
    ``kept_zero_b``: the partials declared kept zero, which they are not."""
    g = etc.Graph("splitk")
    n = g.symbol("n")
    m = (n + R - 1) // R  # row blocks
    A = g.tensor("A", (n, K), "f32")
    B = g.tensor("B", (n, S), "f32", kept_zero=kept_zero_b)
    C = g.tensor("C", (n,), "f32")
    E = g.event((m,), wait_count=S, name="E")
    g.task(partial_sum(R, S, K), grid=(m, S), args=(A, B), out_edges={E: "ij->i"})
    g.task(final_sum(R, S), grid=(m,), args=(B, C), in_edges={E: "i->i"})
    return g


@pytest.fixture
def no_output(capsys: pytest.CaptureFixture[str]):
    """Nothing may print or warn (modules make it autouse by importing it and
    naming it in ``pytestmark``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def table_graph() -> etc.Graph:
    """Instance (e, k) adds to expert e; expert e's wait count is read from ``counts``."""
    g = etc.Graph("moe_like")
    experts, per = g.symbol("experts"), g.symbol("per")
    counts = g.tensor("counts", (experts,), "i32")
    acc = g.tensor("acc", (experts,), "i64")
    out = g.tensor("out", (experts,), "i64")
    ready = g.event((experts,), wait_count=counts, name="expert_ready")

    def add(e, k, acc):
        acc[e] += k + 1

    def emit(e, acc, out):
        out[e] = acc[e]

    g.task(
        make_fn("add", "index", "index", "memref<?xi64>", reference=add),
        grid=(experts, per),
        args=(acc,),
        out_edges={ready: "ek->e"},
    )
    g.task(
        make_fn("emit", "index", "memref<?xi64>", "memref<?xi64>", reference=emit),
        grid=(experts,),
        args=(acc, out),
        in_edges={ready: "e->e"},
    )
    return g


def several_events_graph() -> etc.Graph:
    """Three fill tasks (grid (n, 3), 3 notifications per coordinate) feed a
    combine task through three in-edges."""
    g = etc.Graph("multi")
    n = g.symbol("n")
    P = [g.tensor(f"P{k}", (n, 3), "f64") for k in range(3)]
    Y = g.tensor("Y", (n,), "f64")
    events = []
    for k in range(3):
        e = g.event((n,), wait_count=3, name=f"E{k}")
        events.append(e)

        def fill(i, j, out, k=k):
            out[i, j] = (k + 1) * 100 + i * 10 + j

        g.task(
            make_fn(f"fill{k}", "index", "index", "memref<?x3xf64>", reference=fill),
            grid=(n, 3),
            args=(P[k],),
            out_edges={e: "ij->i"},
        )

    def combine(i, P0, P1, P2, Y):
        Y[i] = P0[i].sum() + P1[i].sum() + P2[i].sum()

    g.task(
        make_fn("combine", "index", *["memref<?x3xf64>"] * 3, "memref<?xf64>", reference=combine),
        grid=(n,),
        args=(*P, Y),
        in_edges={e: "i->i" for e in events},
    )
    return g


def two_symbols(width: int = 4, m_max: int | None = None) -> etc.Graph:
    """Row sums over the rows of two symbols, ``n`` and ``m`` (at most
    ``m_max``): a graph to bucket by either."""
    g = etc.Graph("two")
    for s in (g.symbol("n"), g.symbol("m", max=m_max)):
        x, y = g.tensor(f"x{s.name}", (s, width), "f32"), g.tensor(f"y{s.name}", (s,), "f32")
        g.task(final_sum(1, width, name=f"sum_{s.name}"), grid=(s,), args=(x, y))
    return g


def bucketed_rowsum(tmp_path: Path) -> Path:
    """Saves, in ``tmp_path``, the row sum ``y = x.sum(1)`` compiled once for
    ``n <= 4`` and once for more (``etc.compile_buckets``)."""

    def graph(bound: int | None) -> etc.Graph:
        g = etc.Graph("bucketed")
        n = g.symbol("n", max=bound)
        x, y = g.tensor("x", (n, 4), "f32"), g.tensor("y", (n,), "f32")
        g.task(final_sum(1, 4), grid=(n,), args=(x, y))
        return g

    etc.compile_buckets("n", [(4, graph(4)), (None, graph(None))], cubin=False).save(tmp_path)
    return tmp_path


def check_decoder_step(cfg, B: int, L: int, seed: int = 5) -> None:
    """One simulated step of ``cfg``'s decoder graph (tokens ``11 * b``)
    against ``etc.models.llama.reference_step``: logits within 1e-2, the
    same greedy tokens."""
    import numpy as np

    from etc.dtypes import bf16_to_f32
    from etc.models import llama as M

    g = M.build_decoder_graph(cfg)
    weights = M.random_weights(cfg, seed=seed)
    tokens = np.arange(B, dtype=np.int32) * 11
    arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 3)
    ref = M.reference_step(cfg, arrays, L)
    out = etc.simulate(g, arrays, {"B": B, "L": L, "S": L + 3}, num_ctas=5)
    got = bf16_to_f32(out["logits"])
    assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
    np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])


def assert_task_option_refused(kwargs: dict, message: str) -> None:
    """``Graph.task(..., **kwargs)`` on a 4-instance task named 'tiles'
    raises a GraphError matching ``message`` that names the task."""
    g = etc.Graph("bad_option")
    with pytest.raises(etc.GraphError, match=message) as err:
        g.task(make_fn("t", "index"), grid=(4,), name="tiles", **kwargs)
    assert "task 'tiles'" in str(err.value)


def assert_static_manifest_field(graph, field: str, value: int, path: Path) -> None:
    """``graph()`` (a fresh graph whose first task sets ``field`` to
    ``value``, its second not) compiled static: the manifest holds ``field``
    for the first task only, and it loads back (0 where unset); compiled
    dynamic, no task carries it."""
    from etc.runtime.manifest import load_manifest

    art = etc.compile(graph(), schedule="static", cubin=False)
    assert [t.get(field) for t in art.manifest["tasks"]] == [value, None]
    art.save(path)
    assert [getattr(t, field) for t in load_manifest(path).tasks] == [value, 0]
    dynamic = etc.compile(graph(), schedule="dynamic", cubin=False)
    assert all(field not in t for t in dynamic.manifest["tasks"])


def assert_manifest_task_field_refused(art: etc.Artifact, path: Path, field: str) -> None:
    """``art`` saved at ``path`` with its first task's ``field`` set to -1
    fails to load with a LaunchError naming ``tasks[0].<field>``."""
    import json

    from etc.runtime.manifest import load_manifest

    art.save(path)
    doc = json.loads((path / "manifest.json").read_text())
    doc["tasks"][0][field] = -1
    (path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(etc.LaunchError, match=rf"tasks\[0\]\.{field}.*got -1"):
        load_manifest(path)

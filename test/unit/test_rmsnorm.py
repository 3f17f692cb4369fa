"""RMSNorm tiles and the symbolic-batch example (the paper's Figure 4): numpy
references, the example in the simulator, its compile-once bookkeeping and PTX
that ptxas accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import etc
from etc.tiles import rmsnorm

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from examples import symbolic_batch  # noqa: E402

# (hidden, splits): one load per thread; several loads per thread; a chunk
# narrower than the CTA; a split that is not a multiple of 4 (scalar P reads).
CONFIGS = [(2048, 2), (4096, 2), (256, 8), (96, 3)]


def rmsnorm64(X: np.ndarray, W: np.ndarray, eps: float) -> np.ndarray:
    x = X.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * W


@pytest.mark.parametrize("H, S", CONFIGS)
def test_references_compute_rmsnorm(H, S):
    b, eps = 5, 1e-5
    rng = np.random.default_rng(1)
    X = rng.standard_normal((b, H)).astype(np.float32)
    W = rng.standard_normal(H).astype(np.float32)
    P = np.zeros((b, S), np.float32)
    Y = np.zeros((b, H), np.float32)
    ss, sc = rmsnorm.sum_squares(H, S), rmsnorm.scale(H, S, eps)
    for i in range(b):
        for j in range(S):
            ss.reference(i, j, X, P)
    chunks = X.astype(np.float64).reshape(b, S, H // S)
    np.testing.assert_allclose(P, (chunks**2).sum(axis=2), rtol=1e-5)
    for i in range(b):
        for j in range(S):
            sc.reference(i, j, X, W, P, Y)
    np.testing.assert_allclose(Y, rmsnorm64(X, W, eps), rtol=1e-4, atol=1e-6)


def test_signatures_and_shared_memory():
    ss, sc = rmsnorm.sum_squares(2048, 8), rmsnorm.scale(2048, 8)
    assert ss.params == ("index", "index", "memref<?x2048xf32>", "memref<?x8xf32>")
    assert sc.params == (
        "index",
        "index",
        "memref<?x2048xf32>",
        "memref<2048xf32>",
        "memref<?x8xf32>",
        "memref<?x2048xf32>",
    )
    assert ss.block_size == sc.block_size == 256
    # One workgroup slot per warp, in a global named after the tile (so two
    # instantiations under different names do not share it).
    assert re.search(
        r'memref\.global "private" @sum_squares__warp_sums : '
        r"memref<8xf32, #gpu.address_space<workgroup>>",
        ss.source,
    )
    assert "@ss2__warp_sums" in rmsnorm.sum_squares(2048, 8, name="ss2").source
    assert "memref<4xf32, #gpu.address_space<workgroup>>" in (
        rmsnorm.sum_squares(2048, 8, block_size=128).source
    )
    # A barrier guards the shared slots against the CTA's previous call.
    body = ss.source[ss.source.index("memref.get_global") :]
    assert body.index("gpu.barrier") < body.index("memref.store")


def test_tiles_use_only_allowed_dialects():
    allowed = {"func", "arith", "scf", "memref", "vector", "gpu", "math"}
    op = re.compile(r"^\s*(?:%[\w, %]+=\s*)?([a-z_]+)\.[a-z_.]+")
    for fn in (rmsnorm.sum_squares(2048, 8), rmsnorm.scale(2048, 8), rmsnorm.scale(96, 3)):
        dialects = {m.group(1) for line in fn.source.splitlines() if (m := op.match(line))}
        assert dialects and dialects <= allowed, dialects - allowed
        assert "memref.alloca" not in fn.source  # cannot lower in workgroup memory


def test_bad_configurations():
    with pytest.raises(etc.GraphError, match="hidden=100 is not divisible by splits=3"):
        rmsnorm.sum_squares(100, 3)
    with pytest.raises(etc.GraphError, match="must be a multiple of 4"):
        rmsnorm.scale(24, 4)
    with pytest.raises(etc.GraphError, match="splits must be a positive int"):
        rmsnorm.scale(2048, 0)
    with pytest.raises(etc.GraphError, match="eps must be a float"):
        rmsnorm.scale(2048, 2, eps=-1.0)


def test_example_graph_is_symbolic_in_the_batch():
    g = symbolic_batch.build(hidden=256, splits=2)
    assert [s.name for s in g.symbols] == ["b"]
    assert g.events[0].wait_count == 2
    assert [str(d) for d in g.events[0].shape] == ["b"]
    assert all(str(t.grid[0]) == "b" for t in g.tasks)


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_example_in_the_simulator(schedule, capsys):
    argv = ["--simulate", "--hidden", "256", "--batches", "1,3,64", "--schedule", schedule]
    assert symbolic_batch.main(argv) == 0
    out = capsys.readouterr().out
    assert "3/3 batch sizes match numpy on the simulator" in out


class _SimulatedKernel:
    """Stands in for a loaded GPU kernel: launches run the simulator."""

    def __init__(self, graph: etc.Graph, manifest: dict[str, Any]) -> None:
        self.graph = graph
        self.manifest = SimpleNamespace(symbols=tuple(manifest["symbols"]))
        self.function = 1234
        self.launches: list[dict[str, int]] = []

    def launch(self, tensors: dict[str, np.ndarray], symbols: dict[str, int]) -> None:
        self.launches.append(dict(symbols))
        out = etc.simulate(self.graph, {"X": tensors["X"], "W": tensors["W"]}, symbols)
        for name, value in out.items():
            tensors[name][...] = value


def test_example_compiles_once_for_every_batch(monkeypatch, capsys):
    """The GPU path with the launch replaced by the simulator: one compilation
    (counted) serves every batch size through one kernel object."""
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    from etc.compiler import Artifact

    kernels: list[_SimulatedKernel] = []
    graph = symbolic_batch.build(hidden=256, splits=2)

    def fake_load(self: Artifact, directory: Any = None, **options: Any) -> _SimulatedKernel:
        assert options == {"timeout": 120.0}  # the example's --timeout default
        kernels.append(_SimulatedKernel(graph, self.manifest))
        return kernels[-1]

    monkeypatch.setattr(Artifact, "load", fake_load)
    assert symbolic_batch.main(["--hidden", "256", "--batches", "1,2,7"]) == 0
    out = capsys.readouterr().out
    assert len(kernels) == 1 and [s["b"] for s in kernels[0].launches] == [1, 2, 7]
    assert "symbols ['b']" in out
    assert "compilations: 1 (expected 1)" in out
    assert "served all 3 batch sizes: True" in out


def test_emit_ptx_that_ptxas_accepts(tmp_path, capsys):
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not found")
    ptx = tmp_path / "rmsnorm.ptx"
    assert symbolic_batch.main(["--emit-ptx", str(ptx)]) == 0
    text = ptx.read_text()
    assert ".visible .entry rmsnorm(" in text
    # The per-warp sums live in the kernel's shared buffer (tiles' buffers
    # overlay: 8 warps x 4 bytes); loads and stores stay 16 bytes.
    assert re.search(r"\.shared \.align \d+ \.b8 __etc_workgroup\[32\]", text)
    for instr in ("shfl.sync.bfly", "st.shared", "ld.shared", "bar.sync", "ld.global.v4"):
        assert instr in text, instr
    assert "st.global.v4" in text and "rsqrt.approx.f32" in text
    done = subprocess.run(
        [ptxas, "-arch=sm_90", str(ptx), "-o", str(tmp_path / "rmsnorm.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr

"""Row-sum tiles: numpy references, MLIR that parses, PTX that ptxas accepts."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from unit_helpers import ptx_from_module, splitk_graph

import etc
from etc.tiles import final_sum, partial_sum

# (rows per task, k split, K): vector loads in both tiles; a chunk that is not a
# multiple of 128 columns; a k split that is not a multiple of 4 (scalar final).
CONFIGS = [(8, 4, 256), (3, 2, 200), (1, 3, 12), (64, 8, 4096)]


@pytest.mark.parametrize("R, S, K", CONFIGS)
def test_references_compute_row_sums(R, S, K):
    n = 2 * R + 1  # a partial last row block
    A = np.random.default_rng(0).standard_normal((n, K)).astype(np.float32)
    B = np.zeros((n, S), np.float32)
    C = np.zeros(n, np.float32)
    ps, fs = partial_sum(R, S, K), final_sum(R, S)
    blocks = -(-n // R)
    for i in range(blocks):
        for j in range(S):
            ps.reference(i, j, A, B)
    for i in range(blocks):
        fs.reference(i, B, C)
    np.testing.assert_allclose(C, A.sum(axis=1), rtol=1e-4, atol=1e-4)


def test_signatures():
    ps, fs = partial_sum(8, 4, 256), final_sum(8, 4)
    assert ps.params == ("index", "index", "memref<?x256xf32>", "memref<?x4xf32>")
    assert fs.params == ("index", "memref<?x4xf32>", "memref<?xf32>")
    assert ps.block_size == fs.block_size == 256
    assert partial_sum(8, 4, 256, name="ps2").name == "ps2"


def test_bad_configurations():
    with pytest.raises(etc.GraphError, match="K=250 is not divisible by k_split=4"):
        partial_sum(8, 4, 250)
    with pytest.raises(etc.GraphError, match="must be a multiple of 4"):
        partial_sum(8, 4, 8)
    with pytest.raises(etc.GraphError, match="rows_per_task must be a positive int"):
        final_sum(0, 4)


def test_tiles_use_only_allowed_dialects():
    allowed = {"func", "arith", "scf", "memref", "vector", "gpu", "math"}
    op = re.compile(r"^\s*(?:%[\w, %]+=\s*)?([a-z_]+)\.[a-z_.]+")
    for fn in (partial_sum(8, 4, 256), final_sum(8, 4), final_sum(8, 3)):
        dialects = {m.group(1) for line in fn.source.splitlines() if (m := op.match(line))}
        assert dialects and dialects <= allowed, dialects - allowed
        assert not re.search(r"vector<\d+x\d+x", fn.source)  # vectors stay 1-D


@pytest.mark.parametrize("R, S, K", CONFIGS)
def test_graph_parses_and_verifies(etc_opt, R, S, K):
    result = etc_opt(splitk_graph(R, S, K).to_mlir(), "--etensor-verify-graph")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("R, S, K", CONFIGS[:3])
def test_pipeline_produces_ptx_that_ptxas_accepts(etc_opt, tmp_path, R, S, K):
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not found")
    result = etc_opt(splitk_graph(R, S, K).to_mlir(), "--etc-static-to-ptx")
    assert result.returncode == 0, result.stderr
    ptx = ptx_from_module(result.stdout)
    assert ".target sm_90" in ptx
    # 16-byte loads survived lowering (partial_sum always, final_sum when S % 4 == 0).
    assert "ld.global.v4" in ptx
    assert "shfl.sync.bfly" in ptx
    (tmp_path / "k.ptx").write_text(ptx)
    done = subprocess.run(
        [ptxas, "-arch=sm_90", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr

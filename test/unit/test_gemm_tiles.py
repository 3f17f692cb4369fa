"""bf16 tensor-core GEMM tiles (etc.tiles.gemm): references against numpy,
configuration errors, the fragment layout, and PTX that ptxas accepts."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import numpy as np
import pytest

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.tiles import gemm as G

H, I, E = 256, 128, 4  # noqa: E741  small MoE shapes (real: H=2048, I=768, E=128)


def have_bindings() -> bool:
    try:
        return importlib.util.find_spec("etc._mlir_libs._etcDialects") is not None
    except ImportError:  # built but not loadable
        return False


needs_bindings = pytest.mark.skipif(not have_bindings(), reason="the MLIR bindings are not built")
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")


def rand_bf16(rng, *shape, scale=1.0):
    return f32_to_bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(scale))


def rel_err(got, want):
    return float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))


def moe_tables(counts, block_m, tiles_per_block):
    row_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    tiles = [-(-c // block_m) * tiles_per_block for c in counts]
    indptr = np.concatenate([[0], np.cumsum(tiles)]).astype(np.int32)
    return row_off, indptr


# -- references ---------------------------------------------------------------


@pytest.mark.parametrize("M", [1, 16, 37])
def test_gemm_reference(M):
    rng = np.random.default_rng(M)
    bm, bn, k, n = 16, 32, 64, 96
    tile = G.gemm(bm, bn, k)
    A, B = rand_bf16(rng, M, k), rand_bf16(rng, n, k)
    C = np.zeros((M, n), np.uint16)
    for i in range(-(-M // bm)):
        for j in range(n // bn):
            tile.reference(i, j, A, B, C)
    want = bf16_to_f32(A) @ bf16_to_f32(B).T
    assert rel_err(bf16_to_f32(C), want) <= 1e-2


def test_gemm_simulated_graph():
    rng = np.random.default_rng(1)
    k = 64
    g = etc.Graph("dense")
    m, n = g.symbol("m"), g.symbol("n")
    A, B = g.tensor("A", (m, k), "bf16"), g.tensor("B", (n, k), "bf16")
    C = g.tensor("C", (m, n), "bf16")
    g.task(G.gemm(16, 32, k), grid=((m + 15) // 16, (n + 31) // 32), args=(A, B, C))
    a, b = rand_bf16(rng, 20, k), rand_bf16(rng, 64, k)
    out = etc.simulate(g, {"A": a, "B": b}, {"m": 20, "n": 64})
    want = bf16_to_f32(a) @ bf16_to_f32(b).T
    assert rel_err(bf16_to_f32(out["C"]), want) <= 1e-2


@pytest.mark.parametrize("block_m", [16, 64])
def test_moe_references(block_m):
    rng = np.random.default_rng(block_m)
    counts = [3, 0, 70, 16]
    bn_gu, bn_dn = 32, 64
    rows = sum(counts)
    Xp = rand_bf16(rng, rows, H)
    Wgu = rand_bf16(rng, E, 2 * I, H, scale=0.1)
    Wd = rand_bf16(rng, E, H, I, scale=0.1)
    row_off, gu_indptr = moe_tables(counts, block_m, I // bn_gu)
    _, dn_indptr = moe_tables(counts, block_m, H // bn_dn)
    gate_up = G.moe_gate_up(block_m, bn_gu, H, I, experts=E)
    down = G.moe_down(block_m, bn_dn, H, I, experts=E)
    Hb = np.zeros((rows, I), np.uint16)
    Yp = np.zeros((rows, H), np.uint16)
    for e in range(E):
        # Instances outside [indptr[e], indptr[e+1]) do nothing.
        for i in range(int(gu_indptr[-1]) + 2):
            gate_up.reference(i, e, Xp, Wgu, row_off, gu_indptr, Hb)
    for e in range(E):
        for i in range(int(dn_indptr[-1]) + 2):
            down.reference(i, e, Hb, Wd, row_off, dn_indptr, Yp)
    x = bf16_to_f32(Xp)
    want_h = np.zeros((rows, I), np.float32)
    want_y = np.zeros((rows, H), np.float32)
    for e in range(E):
        r = slice(row_off[e], row_off[e + 1])
        w = bf16_to_f32(Wgu[e])
        g, u = x[r] @ w[:I].T, x[r] @ w[I:].T
        want_h[r] = g / (1 + np.exp(-g)) * u
        want_y[r] = bf16_to_f32(Hb[r]) @ bf16_to_f32(Wd[e]).T
    assert rel_err(bf16_to_f32(Hb), want_h) <= 1e-2
    assert rel_err(bf16_to_f32(Yp), want_y) <= 1e-2


# -- the fragment layout --------------------------------------------------------


def emulate_warp_mma(a, b):
    """``a @ b.T`` (a: 16 x 32, b: 8 x 32) computed the way the tiles do it:
    lane (g, t) loads 8 contiguous k of rows g, g+8 of A and row g of B,
    packs them into the m16n8k16 registers as the generated code does (A
    regs: words 2j and 2j+1 of rows g and g+8; B regs: words 2j, 2j+1), and
    the mma follows the PTX ISA fragment layout for k step j in {0, 1}."""
    d = np.zeros((16, 8))
    for j in range(2):
        A = np.zeros((16, 16))
        B = np.zeros((16, 8))  # B[k, n]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            ra, rb, wb = (
                a[g, 8 * t : 8 * t + 8],
                a[g + 8, 8 * t : 8 * t + 8],
                b[g, 8 * t : 8 * t + 8],
            )

            def word(v, w):
                return v[2 * w : 2 * w + 2]

            # PTX: a0,a1 (row g, k 2t..2t+1), a2,a3 (row g+8), a4,a5 (row g,
            # k 2t+8..), a6,a7 (row g+8, k 2t+8..); b0,b1 (k 2t..), b2,b3 (k 2t+8..).
            regs_a = [word(ra, 2 * j), word(rb, 2 * j), word(ra, 2 * j + 1), word(rb, 2 * j + 1)]
            A[g, 2 * t : 2 * t + 2] = regs_a[0]
            A[g + 8, 2 * t : 2 * t + 2] = regs_a[1]
            A[g, 2 * t + 8 : 2 * t + 10] = regs_a[2]
            A[g + 8, 2 * t + 8 : 2 * t + 10] = regs_a[3]
            B[2 * t : 2 * t + 2, g] = word(wb, 2 * j)
            B[2 * t + 8 : 2 * t + 10, g] = word(wb, 2 * j + 1)
        d += A @ B
    return d


def test_permuted_fragments_compute_the_product():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((16, 32)), rng.standard_normal((8, 32))
    assert np.allclose(emulate_warp_mma(a, b), a @ b.T)


# -- configuration errors ---------------------------------------------------------


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: G.gemm(8, 32, 64), ["'gemm'", "block_m"]),
        (lambda: G.gemm(16, 12, 64), ["'gemm'", "block_n"]),
        (lambda: G.gemm(16, 32, 48), ["'gemm'", "k=48"]),
        (lambda: G.gemm(16, 32, 64, block_size=100), ["'gemm'", "block_size"]),
        (lambda: G.gemm(16, 32, 64, warps=(1, 2, 2)), ["'gemm'", "warps"]),
        (lambda: G.gemm(16, 32, 64, unroll=3), ["'gemm'", "unroll"]),
        (lambda: G.gemm(0, 32, 64), ["'gemm'", "positive"]),
        (lambda: G.moe_gate_up(16, 48, 256, 128), ["'moe_gate_up'", "inter=128"]),
        (lambda: G.moe_down(16, 96, 256, 128), ["'moe_down'", "hidden=256"]),
        (lambda: G.moe_down(16, 32, 256, 128, experts=0), ["'moe_down'", "experts"]),
        (lambda: G.moe_gate_up(16, 32, 2048, 768, name="gu", unroll=5), ["'gu'", "unroll"]),
    ],
)
def test_config_errors_name_the_tile(make, words):
    with pytest.raises(etc.GraphError) as err:
        make()
    for word in words:
        assert word in str(err.value)


def test_default_warp_plans():
    # decode: gate/up 16x32 splits k over 2 warp slices; prefill reuses weights.
    assert G.plan_warps("t", 16, 32, 2048, 256, b_per_n=2) == (1, 4, 2, 4)
    assert G.plan_warps("t", 16, 64, 768, 256) == (1, 8, 1, 4)
    assert G.plan_warps("t", 64, 64, 2048, 256, b_per_n=2) == (1, 8, 1, 1)


# -- compilation ----------------------------------------------------------------------


def compile_tile(tile, tensors, grid):
    g = etc.Graph(f"g_{tile.name}")
    m = g.symbol("m")
    n = g.symbol("n")

    def dim(d):
        return {"m": m, "n": n}.get(d, d)

    ts = [g.tensor(name, tuple(dim(d) for d in shape), dt) for name, shape, dt in tensors]
    g.task(tile, grid=tuple(dim(d) for d in grid), args=tuple(ts))
    return etc.compile(g, schedule="static")


def check_ptx(artifact, mmas):
    ptx = artifact.ptx
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") >= mmas
    assert "ld.global.v4" in ptx
    assert artifact.cubin is not None


def ptxas_spills(ptx, tmp_path):
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    done = subprocess.run(
        ["ptxas", "-arch=sm_90", "-O3", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        check=True,
    )
    return [int(x) for x in re.findall(r"(\d+) bytes spill", done.stderr)]


MOE_GU = [
    ("Xp", ("m", H), "bf16"),
    ("Wgu", (E, 2 * I, H), "bf16"),
    ("row_off", (E + 1,), "i32"),
    ("gu_indptr", (E + 1,), "i32"),
    ("Hb", ("m", I), "bf16"),
]
MOE_DN = [
    ("Hb", ("m", I), "bf16"),
    ("Wd", (E, H, I), "bf16"),
    ("row_off", (E + 1,), "i32"),
    ("dn_indptr", (E + 1,), "i32"),
    ("Yp", ("m", H), "bf16"),
]


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n", [(16, 64), (64, 64)])
def test_gemm_compiles(block_m, block_n, tmp_path):
    k = 256
    tile = G.gemm(block_m, block_n, k)
    tensors = [("A", ("m", k), "bf16"), ("B", ("n", k), "bf16"), ("C", ("m", "n"), "bf16")]
    art = compile_tile(tile, tensors, ("m", "n"))
    check_ptx(art, 4)
    assert set(ptxas_spills(art.ptx, tmp_path)) == {0}


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n", [(16, 32), (64, 64)])
def test_moe_gate_up_compiles(block_m, block_n, tmp_path):
    # Triggered in the MoE graph; a plain rank-2 grid (i, e) compiles the same body.
    tile = G.moe_gate_up(block_m, block_n, H, I, experts=E)
    art = compile_tile(tile, MOE_GU, ("m", E))
    check_ptx(art, 4)
    assert set(ptxas_spills(art.ptx, tmp_path)) == {0}
    if block_m == 16:  # split-K over 2 warp slices: a workgroup buffer named after the tile
        assert "moe_gate_up__partials" in tile.source


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n", [(16, 64), (64, 64), (16, 32)])
def test_moe_down_compiles(block_m, block_n, tmp_path):
    tile = G.moe_down(block_m, block_n, H, I, experts=E)
    art = compile_tile(tile, MOE_DN, ("m", E))
    check_ptx(art, 4)
    assert set(ptxas_spills(art.ptx, tmp_path)) == {0}


# -- pipelining options ------------------------------------------------------------


def test_pipeline_option_errors():
    with pytest.raises(etc.GraphError, match="prefetch"):
        G.moe_down(16, 64, 256, 128, unroll=4, prefetch=1)  # one k iteration
    with pytest.raises(etc.GraphError, match="not both"):
        G.moe_down(16, 64, 256, 128, unroll=1, prefetch=1, stages=2)
    with pytest.raises(etc.GraphError, match="48 KiB"):
        G.moe_gate_up(16, 16, 2048, 768, warps=(1, 1, 8), unroll=1, stages=4)
    assert G.plan_prefetch("t", 16, 2048, 2, 4) == 0
    assert G.plan_stages("t", 2048, 4, 1, 2, 256) == 0


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("kw", [{"unroll": 1, "prefetch": 1}, {"unroll": 1, "stages": 3}])
def test_moe_pipelined_compiles(kw):
    gu = G.moe_gate_up(16, 16, H, I, experts=E, **kw)
    art = compile_tile(gu, MOE_GU, ("m", E))
    check_ptx(art, 4)
    dn = G.moe_down(16, 32, H, I, experts=E, **kw)
    art = compile_tile(dn, MOE_DN, ("m", E))
    check_ptx(art, 4)
    if "stages" in kw:
        assert "cp.async.cg.shared.global" in art.ptx and "moe_down__ring" in dn.source

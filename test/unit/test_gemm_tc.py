"""Pipelined bf16 GEMM tiles (etc.tiles.gemm_tc): references against numpy,
configuration errors, the shared-memory / ldmatrix / mma layout (emulated
lane by lane), and PTX that ptxas accepts without spills."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import numpy as np
import pytest

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.tiles import gemm_tc as G

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


@pytest.mark.parametrize("M", [1, 64, 200])
def test_gemm_reference(M):
    rng = np.random.default_rng(M)
    bm, bn, k, n = 64, 64, 96, 192
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
    g = etc.Graph("dense_tc")
    m, n = g.symbol("m"), g.symbol("n")
    A, B = g.tensor("A", (m, k), "bf16"), g.tensor("B", (n, k), "bf16")
    C = g.tensor("C", (m, n), "bf16")
    g.task(G.gemm(64, 64, k), grid=((m + 63) // 64, (n + 63) // 64), args=(A, B, C))
    a, b = rand_bf16(rng, 100, k), rand_bf16(rng, 128, k)
    out = etc.simulate(g, {"A": a, "B": b}, {"m": 100, "n": 128})
    want = bf16_to_f32(a) @ bf16_to_f32(b).T
    assert rel_err(bf16_to_f32(out["C"]), want) <= 1e-2


@pytest.mark.parametrize("block_m", [64, 128])
def test_moe_references(block_m):
    rng = np.random.default_rng(block_m)
    counts = [3, 0, 170, 64]
    bn_gu, bn_dn = 64, 128
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


# -- the layout, emulated ---------------------------------------------------------


def emulate_block(a, b, wm, wn, block_size=256):
    """``a @ b.T`` (a: BM x K, b: BR x K) computed the way the tile does it,
    with the index formulas of ``_body``: cp.async chunk ``tid % 4`` of row
    ``tid / 4 + j * block_size / 4`` to swizzled column ``((tid % 4) ^
    ((tid / 8) & 3)) * 8``; ldmatrix.x4 lane addresses (A: row lane % 16,
    chunk 2ks + lane / 16; B: row lane % 8 + 8 (lane / 16), chunk 2ks +
    (lane / 8) % 2; both at chunk ^ ((lane >> 1) & 3)); registers per the PTX
    ldmatrix and m16n8k16 fragment layouts."""
    bm, k = a.shape
    br = b.shape[0]
    mf, nf = bm // (16 * wm), br // (8 * wn)
    out = np.zeros((bm, br))
    for k0 in range(0, k, 32):
        smem = {}
        for src, rows, key in ((a, bm, "a"), (b, br, "b")):
            buf = np.full((rows, 32), np.nan)
            for tid in range(block_size):
                for j in range(rows * 4 // block_size):
                    r = tid // 4 + j * block_size // 4
                    assert ((r >> 1) & 3) == ((tid // 8) & 3)
                    col = ((tid % 4) ^ ((tid // 8) & 3)) * 8
                    buf[r, col : col + 8] = src[r, k0 + (tid % 4) * 8 : k0 + (tid % 4) * 8 + 8]
            assert not np.isnan(buf).any()  # every chunk written exactly once
            smem[key] = buf

        def ldmatrix_x4(buf, addr):
            # lane l gets, from matrix q (rows at lanes 8q..8q+7), row l/4, cols 2(l%4)..+1
            mats = [
                np.stack([buf[r, c : c + 8] for r, c in addr[8 * q : 8 * q + 8]]) for q in range(4)
            ]
            return [
                [m[lane // 4, 2 * (lane % 4) : 2 * (lane % 4) + 2] for m in mats]
                for lane in range(32)
            ]

        for warp in range(block_size // 32):
            wm_i, wn_i = warp % wm, warp // wm
            for ks in range(2):
                fa, fb = [], []
                for m in range(mf):
                    addr = []
                    for lane in range(32):
                        r = wm_i * 16 * mf + 16 * m + lane % 16
                        assert ((r >> 1) & 3) == ((lane >> 1) & 3)
                        c = ((2 * ks + lane // 16) ^ ((lane >> 1) & 3)) * 8
                        addr.append((r, c))
                    fa.append(ldmatrix_x4(smem["a"], addr))
                for p in range(nf // 2):
                    addr = []
                    for lane in range(32):
                        r = wn_i * 8 * nf + 16 * p + lane % 8 + 8 * (lane // 16)
                        assert ((r >> 1) & 3) == ((lane >> 1) & 3)
                        c = ((2 * ks + (lane // 8) % 2) ^ ((lane >> 1) & 3)) * 8
                        addr.append((r, c))
                    regs = ldmatrix_x4(smem["b"], addr)
                    fb.append([[x[0], x[1]] for x in regs])
                    fb.append([[x[2], x[3]] for x in regs])
                # m16n8k16 (PTX ISA): lane (g, t): a regs (g, 2t) (g+8, 2t) (g, 2t+8)
                # (g+8, 2t+8); b regs (k 2t, n g) (k 2t+8, n g); c (g, 2t) (g+8, 2t).
                for m in range(mf):
                    A = np.zeros((16, 16))
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        ra = fa[m][lane]
                        A[g, 2 * t : 2 * t + 2] = ra[0]
                        A[g + 8, 2 * t : 2 * t + 2] = ra[1]
                        A[g, 2 * t + 8 : 2 * t + 10] = ra[2]
                        A[g + 8, 2 * t + 8 : 2 * t + 10] = ra[3]
                    for f in range(nf):
                        B = np.zeros((16, 8))
                        for lane in range(32):
                            g, t = lane // 4, lane % 4
                            B[2 * t : 2 * t + 2, g] = fb[f][lane][0]
                            B[2 * t + 8 : 2 * t + 10, g] = fb[f][lane][1]
                        r0 = wm_i * 16 * mf + 16 * m
                        c0 = wn_i * 8 * nf + 8 * f
                        out[r0 : r0 + 16, c0 : c0 + 8] += A @ B
    return out


@pytest.mark.parametrize("bm, br, warps", [(64, 64, (2, 4)), (128, 128, (2, 4)), (64, 128, (4, 2))])
def test_emulated_layout_computes_the_product(bm, br, warps):
    rng = np.random.default_rng(bm + br)
    a, b = rng.standard_normal((bm, 64)), rng.standard_normal((br, 64))
    assert np.allclose(emulate_block(a, b, *warps), a @ b.T)


def test_swizzle_is_conflict_free():
    # The 8 row addresses of one ldmatrix 8x8 matrix (8 consecutive rows of
    # 64 bytes, same logical chunk) fall in 8 distinct 16-byte bank groups.
    for base in range(0, 128, 8):
        for chunk in range(4):
            groups = {
                ((r * 64 + (chunk ^ ((r >> 1) & 3)) * 16) % 128) // 16
                for r in range(base, base + 8)
            }
            assert len(groups) == 8


# -- configuration errors ---------------------------------------------------------


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: G.gemm(8, 128, 64), ["'gemm_tc'", "block_m"]),
        (lambda: G.gemm(128, 24, 64), ["'gemm_tc'", "block_n"]),
        (lambda: G.gemm(128, 128, 48), ["'gemm_tc'", "k=48"]),
        (lambda: G.gemm(128, 128, 64, block_size=100), ["'gemm_tc'", "block_size"]),
        (lambda: G.gemm(128, 128, 64, warps=(2, 2)), ["'gemm_tc'", "warps"]),
        (lambda: G.gemm(128, 128, 64, stages=1), ["'gemm_tc'", "stages"]),
        (lambda: G.gemm(128, 128, 64, stages=4), ["'gemm_tc'", "shared memory"]),
        (lambda: G.gemm(32, 128, 64), ["'gemm_tc'", "block_m=32"]),
        (lambda: G.gemm(0, 128, 64), ["'gemm_tc'", "positive"]),
        (lambda: G.moe_gate_up(128, 96, 256, 192), ["'moe_gate_up_tc'", "block_n"]),
        (lambda: G.moe_gate_up(64, 64, 256, 96), ["'moe_gate_up_tc'", "inter=96"]),
        (lambda: G.moe_down(64, 128, 320, 128), ["'moe_down_tc'", "hidden=320"]),
        (lambda: G.moe_down(64, 128, 256, 128, experts=0), ["'moe_down_tc'", "experts"]),
        (lambda: G.moe_gate_up(128, 128, 256, 128, name="gu"), ["'gu'", "shared memory"]),
    ],
)
def test_config_errors_name_the_tile(make, words):
    with pytest.raises(etc.GraphError) as err:
        make()
    for word in words:
        assert word in str(err.value)


def test_smem_budget():
    assert G.smem_bytes(128, 128, 3) == 48 * 1024
    assert G.plan("t", 128, 128, 2048, 256, None, 3) == (2, 4)
    # Two tiles of one graph share the 48 KiB: smaller configurations fit.
    assert G.smem_bytes(64, 64, 2) + G.smem_bytes(64, 128, 2) <= 48 * 1024


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


def check_ptx(artifact):
    ptx = artifact.ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "cp.async.cg.shared.global" in ptx
    assert "cp.async.wait_group" in ptx
    assert artifact.cubin is not None


def ptxas_info(ptx, tmp_path):
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    done = subprocess.run(
        ["ptxas", "-arch=sm_90", "-O3", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
        check=True,
    )
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill", done.stderr)]
    smem = [int(x) for x in re.findall(r"(\d+) bytes smem", done.stderr)]
    return spills, smem


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
@pytest.mark.parametrize("block_m, block_n, stages", [(128, 128, 3), (64, 128, 4), (64, 64, 2)])
def test_gemm_compiles(block_m, block_n, stages, tmp_path):
    k = 256
    tile = G.gemm(block_m, block_n, k, stages=stages)
    assert "gemm_tc__smem_a" in tile.source and "gemm_tc__smem_b" in tile.source
    tensors = [("A", ("m", k), "bf16"), ("B", ("n", k), "bf16"), ("C", ("m", "n"), "bf16")]
    art = compile_tile(tile, tensors, ("m", "n"))
    check_ptx(art)
    spills, smem = ptxas_info(art.ptx, tmp_path)
    assert set(spills) == {0}
    assert max(smem) == G.smem_bytes(block_m, block_n, stages)


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n", [(128, 64), (64, 64)])
def test_moe_gate_up_compiles(block_m, block_n, tmp_path):
    # Triggered in the MoE graph; a plain rank-2 grid (i, e) compiles the same body.
    tile = G.moe_gate_up(block_m, block_n, H, I, experts=E)
    art = compile_tile(tile, MOE_GU, ("m", E))
    check_ptx(art)
    spills, _ = ptxas_info(art.ptx, tmp_path)
    assert set(spills) == {0}


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n", [(128, 128), (64, 128)])
def test_moe_down_compiles(block_m, block_n, tmp_path):
    tile = G.moe_down(block_m, block_n, H, I, experts=E)
    art = compile_tile(tile, MOE_DN, ("m", E))
    check_ptx(art)
    spills, _ = ptxas_info(art.ptx, tmp_path)
    assert set(spills) == {0}

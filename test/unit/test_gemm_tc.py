"""Pipelined bf16 GEMM tiles (etc.tiles.gemm_tc): references against numpy,
configuration errors, the shared-memory / ldmatrix / mma layout (emulated
lane by lane), and PTX that ptxas accepts without spills."""

from __future__ import annotations

import numpy as np
import pytest
from gemm_helpers import (
    DENSE,
    MOE_DN,
    MOE_GU,
    E,
    H,
    I,
    check_config_error,
    check_gemm_reference,
    check_gemm_simulated,
    check_moe_references,
    compile_tile,
    needs_bindings,
    needs_ptxas,
    ptxas_info,
)

import etc
from etc.tiles import gemm_tc as G

# -- references ---------------------------------------------------------------


@pytest.mark.parametrize("M", [1, 64, 200])
def test_gemm_reference(M):
    check_gemm_reference(G.gemm(64, 64, 96), M, 64, 64, 96, 192)


def test_gemm_simulated_graph():
    check_gemm_simulated("dense_tc", G.gemm(64, 64, 64), 64, 64, 64, 100, 128)


@pytest.mark.parametrize("block_m", [64, 128])
def test_moe_references(block_m):
    check_moe_references(G, block_m, [3, 0, 170, 64], bn_gu=64, bn_dn=128)


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
    check_config_error(make, words)


def test_smem_budget():
    assert G.smem_bytes(128, 128, 3) == 48 * 1024
    assert G.plan("t", 128, 128, 2048, 256, None, 3) == (2, 4)
    # Two tiles of one graph share the 48 KiB: smaller configurations fit.
    assert G.smem_bytes(64, 64, 2) + G.smem_bytes(64, 128, 2) <= 48 * 1024


# -- compilation ----------------------------------------------------------------------


def check_ptx(artifact):
    ptx = artifact.ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "cp.async.cg.shared.global" in ptx
    assert "cp.async.wait_group" in ptx
    assert artifact.cubin is not None


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_m, block_n, stages", [(128, 128, 3), (64, 128, 4), (64, 64, 2)])
def test_gemm_compiles(block_m, block_n, stages, tmp_path):
    tile = G.gemm(block_m, block_n, 256, stages=stages)
    assert "gemm_tc__smem_a" in tile.source and "gemm_tc__smem_b" in tile.source
    art = compile_tile(tile, DENSE, ("m", "n"))
    check_ptx(art)
    spills, smem = ptxas_info(art.ptx, tmp_path)
    assert set(spills) == {0}
    need = G.smem_bytes(block_m, block_n, stages)
    if need <= 47 * 1024:
        assert max(smem) == need and "dynamic_shared_memory" not in art.manifest
    else:  # past the static limit (less the kernel's own words): dynamic
        assert max(smem, default=0) < 1024
        assert art.manifest["dynamic_shared_memory"] == need


@needs_bindings
@needs_ptxas
@pytest.mark.parametrize("block_k, stages, inflight", [(32, 3, 0), (64, 3, 0), (64, 4, 1)])
def test_wgmma_core_compiles(block_k, stages, inflight):
    tile = G.gemm(
        128, 128, 256, stages=stages, core="wgmma", inflight=inflight, block_k=block_k,
        smem_limit=200 << 10,
    )  # fmt: skip
    art = compile_tile(tile, DENSE, ("m", "n"), target="sm_90a")
    ptx = art.ptx
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in ptx
    # block_k / 16 per k-tile (LLVM may unroll the k loop).
    assert ptx.count("wgmma.mma_async") % (block_k // 16) == 0
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.wait_group.sync.aligned" in ptx
    assert ".extern .shared .align 1024 .b8 __etc_workgroup[]" in ptx
    assert art.manifest["dynamic_shared_memory"] == G.smem_bytes(128, 128, stages, block_k)
    assert art.cubin is not None


def test_wgmma_configuration_errors():
    with pytest.raises(etc.GraphError, match="warpgroups of 128 threads"):
        G.gemm(64, 128, 256, core="wgmma", block_size=256)
    with pytest.raises(etc.GraphError, match="block_k=48 must be 32 or 64"):
        G.gemm(128, 128, 480, core="wgmma", block_k=48, smem_limit=1 << 20)
    with pytest.raises(etc.GraphError, match="inflight=1 needs stages >= 3"):
        G.gemm(128, 128, 256, core="wgmma", stages=2, inflight=1)


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


def test_meet_fragments_skips_idle_threads_only_in_an_addressed_workspace():
    """``live`` predicates 16-byte stores and loads by address; the dense
    tile's 1-D workspace, stored through ``vector.store``, refuses it."""
    with pytest.raises(etc.GraphError, match="live needs a p_type other than the 1-D workspace"):
        G.meet_fragments(G._Text(), [[["%a"] * 4]], 2, "%s", lambda t: "%b", "@f", 256, live="%x")

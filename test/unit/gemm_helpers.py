"""Helpers shared by the GEMM tile tests (test_gemm_tiles.py, test_gemm_tc.py);
imported by name: test/unit is on sys.path."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import numpy as np
import pytest

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16

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


def check_gemm_reference(tile, M, bm, bn, k, n):
    """The dense tile's reference over a full grid equals ``A @ B^T``."""
    rng = np.random.default_rng(M)
    A, B = rand_bf16(rng, M, k), rand_bf16(rng, n, k)
    C = np.zeros((M, n), np.uint16)
    for i in range(-(-M // bm)):
        for j in range(n // bn):
            tile.reference(i, j, A, B, C)
    want = bf16_to_f32(A) @ bf16_to_f32(B).T
    assert rel_err(bf16_to_f32(C), want) <= 1e-2


def check_gemm_simulated(name, tile, bm, bn, k, a_rows, b_rows):
    """A one-task graph of the dense tile in the simulator."""
    rng = np.random.default_rng(1)
    g = etc.Graph(name)
    m, n = g.symbol("m"), g.symbol("n")
    A, B = g.tensor("A", (m, k), "bf16"), g.tensor("B", (n, k), "bf16")
    C = g.tensor("C", (m, n), "bf16")
    g.task(tile, grid=((m + bm - 1) // bm, (n + bn - 1) // bn), args=(A, B, C))
    a, b = rand_bf16(rng, a_rows, k), rand_bf16(rng, b_rows, k)
    out = etc.simulate(g, {"A": a, "B": b}, {"m": a_rows, "n": b_rows})
    want = bf16_to_f32(a) @ bf16_to_f32(b).T
    assert rel_err(bf16_to_f32(out["C"]), want) <= 1e-2


def check_moe_references(G, block_m, counts, bn_gu, bn_dn, weight_chunk=0):
    """``G.moe_gate_up`` / ``G.moe_down`` references over every instance
    (and some past the end) against the per-expert SwiGLU MLP; with
    ``weight_chunk`` the tiles take their weights in that layout."""
    rng = np.random.default_rng(block_m)
    rows = sum(counts)
    Xp = rand_bf16(rng, rows, H)
    Wgu = rand_bf16(rng, E, 2 * I, H, scale=0.1)
    Wd = rand_bf16(rng, E, H, I, scale=0.1)
    row_off, gu_indptr = moe_tables(counts, block_m, I // bn_gu)
    _, dn_indptr = moe_tables(counts, block_m, H // bn_dn)
    options = {"weight_chunk": weight_chunk} if weight_chunk else {}
    gate_up = G.moe_gate_up(block_m, bn_gu, H, I, experts=E, **options)
    down = G.moe_down(block_m, bn_dn, H, I, experts=E, **options)
    Wgu_k, Wd_k = (G.chunk_weights(w, weight_chunk) if weight_chunk else w for w in (Wgu, Wd))
    Hb = np.zeros((rows, I), np.uint16)
    Yp = np.zeros((rows, H), np.uint16)
    for e in range(E):
        # Instances outside [indptr[e], indptr[e+1]) do nothing.
        for i in range(int(gu_indptr[-1]) + 2):
            gate_up.reference(i, e, Xp, Wgu_k, row_off, gu_indptr, Hb)
    for e in range(E):
        for i in range(int(dn_indptr[-1]) + 2):
            down.reference(i, e, Hb, Wd_k, row_off, dn_indptr, Yp)
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


def check_config_error(make, words):
    """``make()`` raises a GraphError whose message holds every word."""
    with pytest.raises(etc.GraphError) as err:
        make()
    for word in words:
        assert word in str(err.value)


# -- compilation ----------------------------------------------------------------------


def compile_tile(tile, tensors, grid, target="sm_90"):
    g = etc.Graph(f"g_{tile.name}")
    m = g.symbol("m")
    n = g.symbol("n")

    def dim(d):
        return {"m": m, "n": n}.get(d, d)

    ts = [g.tensor(name, tuple(dim(d) for d in shape), dt) for name, shape, dt in tensors]
    g.task(tile, grid=tuple(dim(d) for d in grid), args=tuple(ts))
    return etc.compile(g, schedule="static", target=target)


def sm90a_ptxas(ptx: str, tmp_path) -> str:
    """``ptxas -arch=sm_90a -v``'s report of ``ptx`` (raises if it fails)."""
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    done = subprocess.run(
        ["ptxas", "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stderr


def ptxas_info(ptx, tmp_path):
    """(spill byte counts, smem byte counts) that ``ptxas -v`` reports."""
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


DENSE = [("A", ("m", 256), "bf16"), ("B", ("n", 256), "bf16"), ("C", ("m", "n"), "bf16")]
MOE_GU = [
    ("Xp", ("m", H), "bf16"),
    ("Wgu", (E, 2 * I, H), "bf16"),
    ("row_off", (E + 1,), "i32"),
    ("gu_indptr", (E + 1,), "i32"),
    ("Hb", ("m", I), "bf16"),
]
#: The gate/up tile that gathers its rows from the tokens (``gather_topk``).
MOE_GU_GATHER = [
    ("X", ("m", H), "bf16"),
    ("Wgu", (E, 2 * I, H), "bf16"),
    ("row_off", (E + 1,), "i32"),
    ("gu_indptr", (E + 1,), "i32"),
    ("perm", ("n",), "i32"),
    ("Hb", ("n", I), "bf16"),
]
MOE_DN = [
    ("Hb", ("m", I), "bf16"),
    ("Wd", (E, H, I), "bf16"),
    ("row_off", (E + 1,), "i32"),
    ("dn_indptr", (E + 1,), "i32"),
    ("Yp", ("m", H), "bf16"),
]
#: The down tile that adds its weighted rows into the tokens' float32 sums (``combine_topk=2``).
MOE_DN_COMBINE = [
    ("Hb", ("m", I), "bf16"),
    ("Wd", (E, H, I), "bf16"),
    ("row_off", (E + 1,), "i32"),
    ("dn_indptr", (E + 1,), "i32"),
    ("perm", ("m",), "i32"),
    ("topk_w", ("n", 2), "f32"),
    ("Out32", ("n", H), "f32"),
]
#: The same tile adding into half-precision sums (``combine_dtype="f16"``).
MOE_DN_COMBINE16 = MOE_DN_COMBINE[:-1] + [("Out16", ("n", H), "f16")]

"""Llama decoder tiles (etc.tiles.llama): references against float64 numpy
formulas, one-task graphs in the simulator, configuration errors, and PTX at
the Llama-3.2-1B sizes that ptxas accepts without spills."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gemm_helpers import check_config_error, needs_bindings, needs_ptxas, ptxas_info, rel_err

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.tiles import llama as T
from etc.tiles.attention_mma import attention_mma

# Tiny sizes: hidden, heads, kv heads, head dim, layers.
H, NH, KV, D, LAYERS = 128, 4, 2, 32, 2
G = NH // KV
Q = (NH + 2 * KV) * D
CHUNK = 16


def rand_bf16(rng, *shape, scale=1.0):
    return f32_to_bf16(rng.standard_normal(shape) * scale)


def f64(bits):
    return bf16_to_f32(bits).astype(np.float64)


def round_bf16(x):
    return bf16_to_f32(f32_to_bf16(np.asarray(x, np.float64)))


# -- embed ------------------------------------------------------------------------------


@pytest.mark.parametrize(("bm", "bn"), [(16, 32), (5, 48), (64, 128)])
def test_embed_reference(bm, bn):
    rng = np.random.default_rng(bm)
    B, vocab = 37, 50
    E = rand_bf16(rng, vocab, H)
    tok = rng.integers(0, vocab, B).astype(np.int32)
    h = np.zeros((B, H), np.uint16)
    tile = T.embed(bm, bn, H)
    for i in range(-(-B // bm) + 1):  # one row block past the end does nothing
        for j in range(-(-H // bn)):
            tile.reference(i, j, tok, E, h)
    np.testing.assert_array_equal(h, np.stack([E[t] for t in tok]))


def test_embed_simulated():
    rng = np.random.default_rng(0)
    g = etc.Graph("embed_graph")
    b, v = g.symbol("b"), g.symbol("v")
    tok = g.tensor("tokens", (b,), "i32")
    E = g.tensor("E", (v, H), "bf16")
    h = g.tensor("h", (b, H), "bf16")
    g.task(T.embed(8, 64, H), grid=((b + 7) // 8, H // 64), args=(tok, E, h))
    e = rand_bf16(rng, 30, H)
    t = rng.integers(0, 30, 11).astype(np.int32)
    out = etc.simulate(g, {"tokens": t, "E": e}, {"b": 11, "v": 30})
    np.testing.assert_array_equal(out["h"], e[t])


@pytest.mark.parametrize(("bm", "bn", "rows"), [(64, 64, 40), (16, 32, 16), (64, 128, 3)])
def test_embed_sums_dealt_over_the_tiles(bm, bn, rows):
    # Tile j's warps take rows j * 8 + w (+ col_tiles * 8 per round): every row's
    # sum of squares is written once, whichever tiles run, and the other slots zeroed.
    from etc.tiles import _text

    rng = np.random.default_rng(rows)
    E = rand_bf16(rng, 30, H)
    tok = rng.integers(0, 30, rows).astype(np.int32)
    h = np.zeros((rows, H), np.uint16)
    S = np.full((3, rows), 7, np.int64)
    tile = T.embed(bm, bn, H, sums=True)
    assert "arith.cmpi ult, %j, %s_tiles" in tile.source
    for i in range(-(-rows // bm)):
        for j in range(-(-H // bn)):
            tile.reference(i, j, tok, E, h, S)
    x = bf16_to_f32(E[tok])
    np.testing.assert_array_equal(
        S[0], _text.fixed_reference((x * x).sum(axis=1, dtype=np.float32))
    )
    np.testing.assert_array_equal(S[1:], 0)


# -- rmsnorm ----------------------------------------------------------------------------


def rmsnorm64(h, gamma, eps):
    x = f64(h)
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return f64(gamma) * round_bf16(x * r)


def test_rmsnorm_reference():
    rng = np.random.default_rng(1)
    B, eps = 6, 1e-5
    h = rand_bf16(rng, B, H, scale=3.0)
    gamma = rand_bf16(rng, 2 * LAYERS + 1, H)
    x = np.zeros((B, H), np.uint16)
    tile = T.rmsnorm(H, 2, 1, eps)
    for layer in range(LAYERS):
        for b in range(B):
            tile.reference(layer, b, h, gamma, x)
        want = rmsnorm64(h, gamma[2 * layer + 1], eps)
        np.testing.assert_allclose(bf16_to_f32(x), want, rtol=2**-7, atol=1e-6)


def test_rmsnorm_simulated():
    rng = np.random.default_rng(2)
    g = etc.Graph("rms")
    b, ng = g.symbol("b"), g.symbol("ng")
    h = g.tensor("h", (b, H), "bf16")
    gm = g.tensor("gamma", (ng, H), "bf16")
    x = g.tensor("x", (b, H), "bf16")
    g.task(T.rmsnorm(H, 1, 0, 1e-6), grid=(1, b), args=(h, gm, x))
    hv, gv = rand_bf16(rng, 5, H), rand_bf16(rng, 3, H)
    out = etc.simulate(g, {"h": hv, "gamma": gv}, {"b": 5, "ng": 3})
    np.testing.assert_allclose(
        bf16_to_f32(out["x"]), rmsnorm64(hv, gv[0], 1e-6), rtol=2**-7, atol=1e-6
    )


# -- attention --------------------------------------------------------------------------


def rope64(x_bits, cs):
    """RoPE in float64 of bf16 bits (..., D), rounded to bf16 values."""
    x = f64(x_bits)
    half = x.shape[-1] // 2
    c, s = cs[:half].astype(np.float64), cs[half:].astype(np.float64)
    lo, hi = x[..., :half], x[..., half:]
    return round_bf16(np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=-1))


def attention64(qkv, rope, kc, vc, layer, L):
    """Full softmax attention (float64) of the new token over L+1 positions:
    (attn (B, NH*D), k_new (B, KV, D), v_new (B, KV, D))."""
    B = qkv.shape[0]
    cs = rope[L]
    attn = np.zeros((B, NH * D))
    k_new = np.zeros((B, KV, D))
    v_new = np.zeros((B, KV, D))
    for b in range(B):
        for g in range(KV):
            k_new[b, g] = rope64(qkv[b, NH * D + g * D : NH * D + (g + 1) * D], cs)
            v_new[b, g] = f64(qkv[b, (NH + KV) * D + g * D : (NH + KV) * D + (g + 1) * D])
            keys = np.concatenate([f64(kc[layer, b, g, :L]), k_new[b, g][None]])
            vals = np.concatenate([f64(vc[layer, b, g, :L]), v_new[b, g][None]])
            for t in range(G):
                h = g * G + t
                q = rope64(qkv[b, h * D : (h + 1) * D], cs)
                sc = keys @ q / np.sqrt(D)
                p = np.exp(sc - sc.max())
                attn[b, h * D : (h + 1) * D] = p @ vals / p.sum()
    return attn, k_new, v_new


def attention_inputs(rng, B, L, cap):
    qkv = rand_bf16(rng, B, Q)
    rope = T.rope_table(cap, D)
    kc = rand_bf16(rng, LAYERS, B, KV, cap, D)
    vc = rand_bf16(rng, LAYERS, B, KV, cap, D)
    return qkv, rope, kc, vc


@pytest.mark.parametrize("L", [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK + 5])
def test_attention_reference(L):
    rng = np.random.default_rng(L)
    B, cap, layer = 3, 3 * CHUNK + 9, 1
    qkv, rope, kc, vc = attention_inputs(rng, B, L, cap)
    kc0, vc0 = kc.copy(), vc.copy()
    splits = L // CHUNK + 1
    opart = np.full((B, NH, splits + 1, D), np.nan, np.float32)
    mpart = np.full((B, NH, splits + 1, 2), np.nan, np.float32)
    attn = np.zeros((B, NH * D), np.uint16)
    tile = T.attention(CHUNK, NH, KV, D, LAYERS)
    combine = T.attention_combine(NH, D)
    # Splits in reverse so that split 0's cache write comes last: no split may
    # read position L from the cache.
    for s in reversed(range(splits + 1)):  # split `splits` is empty
        for b in range(B):
            for g in range(KV):
                tile.reference(layer, b, g, s, L, qkv, rope, kc, vc, opart, mpart)
    assert np.all(opart[:, :, splits] == 0) and np.all(mpart[:, :, splits, 1] == 0)
    assert np.all(mpart[:, :, splits, 0] <= -1e29)
    for b in range(B):
        combine.reference(layer, b, opart, mpart, attn)  # the empty split adds nothing
    want, k_new, v_new = attention64(qkv, rope, kc0, vc0, layer, L)
    assert rel_err(bf16_to_f32(attn), want) <= 1e-2
    # Split 0 wrote the new k (roped) and v at position L, and nothing else.
    np.testing.assert_allclose(bf16_to_f32(kc[layer, :, :, L]), k_new, rtol=2**-7, atol=1e-6)
    np.testing.assert_array_equal(bf16_to_f32(vc[layer, :, :, L]), v_new)
    for new, old in ((kc, kc0), (vc, vc0)):
        new[layer, :, :, L] = old[layer, :, :, L]
        np.testing.assert_array_equal(new, old)


def test_attention_split_statistics():
    """One split's (m, sum, o) are those of its positions alone."""
    rng = np.random.default_rng(7)
    L, layer, s, b, g = 2 * CHUNK + 3, 0, 1, 1, 1
    qkv, rope, kc, vc = attention_inputs(rng, 2, L, L + 1)
    opart = np.zeros((2, NH, 3, D), np.float32)
    mpart = np.zeros((2, NH, 3, 2), np.float32)
    T.attention(CHUNK, NH, KV, D, LAYERS).reference(
        layer, b, g, s, L, qkv, rope, kc, vc, opart, mpart
    )
    keys = f64(kc[layer, b, g, CHUNK : 2 * CHUNK])
    vals = f64(vc[layer, b, g, CHUNK : 2 * CHUNK])
    for t in range(G):
        h = g * G + t
        q = rope64(qkv[b, h * D : (h + 1) * D], rope[L])
        sc = keys @ q / np.sqrt(D)
        e = np.exp(sc - sc.max())
        np.testing.assert_allclose(mpart[b, h, s], [sc.max(), e.sum()], rtol=1e-5)
        np.testing.assert_allclose(opart[b, h, s], e @ vals, rtol=1e-4, atol=1e-4)


def attention_graph(chunk):
    """Attention then combine, joined by an event per (layer, batch row)."""
    g = etc.Graph("decode_attention")
    b, L, cap = g.symbol("b"), g.symbol("L"), g.symbol("cap")
    splits = (L + chunk) // chunk
    qkv = g.tensor("qkv", (b, Q), "bf16")
    rope = g.tensor("rope", (cap, D), "f32")
    kc = g.tensor("kc", (LAYERS, b, KV, cap, D), "bf16")
    vc = g.tensor("vc", (LAYERS, b, KV, cap, D), "bf16")
    opart = g.tensor("opart", (b, NH, splits, D), "f32")
    mpart = g.tensor("mpart", (b, NH, splits, 2), "f32")
    attn = g.tensor("attn", (b, NH * D), "bf16")
    done = g.event((LAYERS, b), wait_count=splits * KV, name="splits_done")
    g.task(
        T.attention(chunk, NH, KV, D, LAYERS),
        grid=(LAYERS, b, KV, splits),
        args=(L, qkv, rope, kc, vc, opart, mpart),
        out_edges={done: "lbgs->lb"},
    )
    g.task(
        T.attention_combine(NH, D),
        grid=(LAYERS, b),
        args=(opart, mpart, attn),
        in_edges={done: "lb->lb"},
    )
    return g


@pytest.mark.parametrize("L", [0, 2 * CHUNK + 1])
def test_attention_simulated(L):
    rng = np.random.default_rng(100 + L)
    B, cap = 2, 2 * CHUNK + 4
    qkv, rope, kc, vc = attention_inputs(rng, B, L, cap)
    out = etc.simulate(
        attention_graph(CHUNK),
        {"qkv": qkv, "rope": rope, "kc": kc, "vc": vc},
        {"b": B, "L": L, "cap": cap},
        schedule="dynamic",
    )
    want, k_new, _ = attention64(qkv, rope, kc, vc, LAYERS - 1, L)
    # Every layer sees the same inputs here, so the last one stands for all.
    assert rel_err(bf16_to_f32(out["attn"]), want) <= 1e-2
    np.testing.assert_allclose(
        bf16_to_f32(out["kc"][LAYERS - 1, :, :, L]), k_new, rtol=2**-7, atol=1e-6
    )


def test_rope_table_and_rope():
    table = T.rope_table(5, 8, theta=10000.0)
    assert table.shape == (5, 8) and table.dtype == np.float32
    np.testing.assert_array_equal(table, round_bf16(table))
    np.testing.assert_allclose(table[3, 1], np.cos(3 * 10000.0 ** (-2 / 8)), rtol=2**-8)
    np.testing.assert_allclose(table[3, 5], np.sin(3 * 10000.0 ** (-2 / 8)), rtol=2**-8)
    x = f32_to_bf16(np.arange(1, 9, dtype=np.float32))
    np.testing.assert_allclose(bf16_to_f32(T.rope_bf16(x, table[3])), rope64(x, table[3]))


# -- attention_combine ------------------------------------------------------------------


def random_partials(rng, B, S):
    """Split outputs and (max, sum) pairs of B rows, NH heads and S splits."""
    opart = rng.standard_normal((B, NH, S, D)).astype(np.float32)
    mpart = np.stack(
        [rng.standard_normal((B, NH, S)) * 4, rng.uniform(0.5, 20, (B, NH, S))], axis=-1
    ).astype(np.float32)
    return opart, mpart


def test_attention_combine_reference():
    rng = np.random.default_rng(3)
    B, S = 3, 5
    opart, mpart = random_partials(rng, B, S)
    attn = np.zeros((B, NH * D), np.uint16)
    tile = T.attention_combine(NH, D)
    for b in range(B):
        tile.reference(1, b, opart, mpart, attn)
    m, z = mpart[..., 0].astype(np.float64), mpart[..., 1].astype(np.float64)
    w = np.exp(m - m.max(axis=2, keepdims=True))
    want = (w[..., None] * opart).sum(axis=2) / (w * z).sum(axis=2)[..., None]
    np.testing.assert_allclose(bf16_to_f32(attn), want.reshape(B, -1), rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("group", [1, 2, NH])
def test_grouped_combine_reference_merges_its_heads_only(group):
    rng = np.random.default_rng(5)
    B, S = 2, 7
    opart, mpart = random_partials(rng, B, S)
    whole, grouped = (np.zeros((B, NH * D), np.uint16) for _ in range(2))
    full, tile = T.attention_combine(NH, D), T.attention_combine(NH, D, group=group)
    assert tile.params[:3] == ("index", "index", "index")
    for b in range(B):
        full.reference(0, b, opart, mpart, whole)
        tile.reference(0, b, 0, opart, mpart, grouped)
    # Instance g=0 writes its heads only.
    np.testing.assert_array_equal(grouped[:, : group * D], whole[:, : group * D])
    assert not grouped[:, group * D :].any()
    for b in range(B):
        for g in range(NH // group):
            tile.reference(0, b, g, opart, mpart, grouped)
    np.testing.assert_array_equal(grouped, whole)


def test_grouped_combine_errors_name_the_tile():
    with pytest.raises(
        etc.GraphError, match="tile 'attention_combine': group=3 does not divide heads=8"
    ):
        T.attention_combine(8, 64, group=3)
    with pytest.raises(etc.GraphError, match="are 64 items of 8 dims, more than block_size=32"):
        T.attention_combine(8, 64, group=8, block_size=32)


def test_attention_combine_simulated():
    rng = np.random.default_rng(4)
    g = etc.Graph("combine")
    b, ns = g.symbol("b"), g.symbol("ns")
    op = g.tensor("opart", (b, NH, ns, D), "f32")
    mp = g.tensor("mpart", (b, NH, ns, 2), "f32")
    at = g.tensor("attn", (b, NH * D), "bf16")
    g.task(T.attention_combine(NH, D), grid=(1, b), args=(op, mp, at))
    o = rng.standard_normal((2, NH, 1, D)).astype(np.float32)
    m = np.stack([np.zeros((2, NH, 1)), np.full((2, NH, 1), 2.0)], axis=-1).astype(np.float32)
    out = etc.simulate(g, {"opart": o, "mpart": m}, {"b": 2, "ns": 1})
    want = (o[:, :, 0] / 2).reshape(2, -1)
    np.testing.assert_array_equal(bf16_to_f32(out["attn"]), round_bf16(want))


# -- argmax -----------------------------------------------------------------------------


def first_max(row):
    values = [float(v) for v in f64(row)]
    best = max(values)
    return values.index(best)


def test_argmax_reference():
    rng = np.random.default_rng(5)
    B, V = 6, 1000
    logits = rand_bf16(rng, B, V, scale=3.0)
    logits[1, [7, 300, 999]] = f32_to_bf16(np.float32(100.0))  # ties: the first wins
    logits[2, -1] = f32_to_bf16(np.float32(100.0))
    logits[3] = f32_to_bf16(np.float32(-np.inf))  # all -inf: index 0
    logits[4] = f32_to_bf16(np.float32(-5.0))
    out = np.full(B, -1, np.int32)
    tile = T.argmax(V)
    for b in range(B):
        tile.reference(b, logits, out)
    assert out.tolist() == [first_max(r) for r in logits]
    assert out[1:5].tolist() == [7, V - 1, 0, 0]


@pytest.mark.parametrize("parts", [1, 3, 7, 32])
def test_argmax_parts_then_merge_take_the_first_largest(parts):
    """Parts of ceil(V / parts) rounded up to 8 (the last ones short or
    empty), each part's first largest, then the merge: the row's first
    largest, ties across parts to the lower index."""
    rng = np.random.default_rng(8)
    B, V = 6, 1000
    logits = rand_bf16(rng, B, V, scale=3.0)
    logits[1, [7, 300, 999]] = f32_to_bf16(np.float32(100.0))
    logits[2, -1] = f32_to_bf16(np.float32(100.0))
    logits[3] = f32_to_bf16(np.float32(-np.inf))
    logits[4] = f32_to_bf16(np.float32(-5.0))
    part, merge = T.argmax(V, parts=parts), T.argmax_merge(V, parts)
    assert part.params[:2] == ("index", "index")
    val, idx = np.zeros((B, parts), np.float32), np.zeros((B, parts), np.int32)
    out = np.full(B, -1, np.int32)
    for b in range(B):
        for p in range(parts):
            part.reference(b, p, logits, val, idx)
        merge.reference(b, val, idx, out)
    assert out.tolist() == [first_max(r) for r in logits]
    assert out[1:5].tolist() == [7, V - 1, 0, 0]


def test_argmax_parts_errors_name_the_tile():
    with pytest.raises(etc.GraphError, match="tile 'argmax': parts=33 must be an int in 1..32"):
        T.argmax(1024, parts=33)
    with pytest.raises(etc.GraphError, match="tile 'argmax_merge': parts=0 must be"):
        T.argmax_merge(1024, 0)


def test_argmax_simulated():
    rng = np.random.default_rng(6)
    V = 256
    g = etc.Graph("greedy")
    b = g.symbol("b")
    lg = g.tensor("logits", (b, V), "bf16")
    out = g.tensor("out", (b,), "i32")
    g.task(T.argmax(V), grid=(b,), args=(lg, out))
    logits = rand_bf16(rng, 4, V)
    got = etc.simulate(g, {"logits": logits}, {"b": 4})
    assert got["out"].tolist() == [first_max(r) for r in logits]


# -- configuration errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: T.embed(16, 36, 128), ["'embed'", "block_n=36"]),
        (lambda: T.embed(0, 32, 128), ["'embed'", "block_m"]),
        (lambda: T.embed(16, 32, 100), ["'embed'", "hidden=100"]),
        (lambda: T.rmsnorm(100), ["'rmsnorm'", "hidden=100"]),
        (lambda: T.rmsnorm(128, -1), ["'rmsnorm'", "gamma_stride"]),
        (lambda: T.rmsnorm(128, eps=2.0), ["'rmsnorm'", "eps"]),
        (lambda: T.rmsnorm(128, block_size=100), ["'rmsnorm'", "block_size=100"]),
        (lambda: T.attention(16, 6, 4, 32, 2), ["'attention'", "kv_heads=4"]),
        (lambda: T.attention(16, 4, 2, 36, 2), ["'attention'", "head_dim=36"]),
        (lambda: T.attention(16, 4, 2, 24, 2), ["'attention'", "head_dim=24"]),
        (lambda: T.attention(4096, 32, 8, 64, 2), ["'attention'", "chunk=4096"]),
        (lambda: T.attention(16, 4, 2, 32, 0), ["'attention'", "layers"]),
        (lambda: T.attention(16, 4, 2, 32, 2, name="a1", unroll=0), ["'a1'", "unroll"]),
        (lambda: T.attention_online(16, 4, 2, 8, 2), ["'attention'", "head_dim=8"]),
        (lambda: T.attention_online(16, 6, 4, 32, 2), ["'attention'", "kv_heads=4"]),
        (lambda: T.attention_online(384, 4, 2, 32, 2, spread=True), ["'attention'", "chunk=384"]),
        (lambda: T.attention_combine(4, 12), ["'attention_combine'", "head_dim=12"]),
        (lambda: T.argmax(1001), ["'argmax'", "vocab=1001"]),
        (lambda: T.argmax(1000, block_size=2048), ["'argmax'", "block_size=2048"]),
    ],
)
def test_config_errors_name_the_tile(make, words):
    check_config_error(make, words)


# -- compilation at the Llama-3.2-1B sizes ---------------------------------------------

L_H, L_NH, L_KV, L_D, L_LAYERS, L_V = 2048, 32, 8, 64, 16, 128256
L_Q = (L_NH + 2 * L_KV) * L_D


def compile_graph(tile, tensors, grid, symbols, tmp_path):
    """A one-task graph of ``tile`` compiled for sm_90 and checked by ptxas:
    ``tensors`` are (name, shape, dtype) with shapes over the symbols (a name
    that is a symbol passes the symbol); returns (ptx, spills, smem)."""
    g = etc.Graph(f"g_{tile.name}")
    env = {s: g.symbol(s) for s in symbols}

    def dim(d):
        return eval(d, {}, env) if isinstance(d, str) else d  # noqa: S307 - test shapes

    args = [
        env[n] if n in env else g.tensor(n, tuple(dim(d) for d in shape), dt)
        for n, shape, dt in tensors
    ]
    g.task(tile, grid=tuple(dim(d) for d in grid), args=tuple(args))
    art = etc.compile(g, schedule="static", target="sm_90")
    spills, smem = ptxas_info(art.ptx, tmp_path)
    return art.ptx, spills, smem


def compile_attention(tile, chunk, tmp_path, splits=None):
    """``compile_graph`` of an attention tile over the Llama-3.2-1B shapes
    (``splits``, or splits of ``chunk``); a tile with the fused combine also
    takes the counts and the output."""
    splits = splits or f"(L + {chunk}) // {chunk}"
    cache = (L_LAYERS, "b", L_KV, "cap", L_D)
    combine = [("cnt", (L_LAYERS, "b", L_KV), "i32"), ("attn", ("b", L_NH * L_D), "bf16")]
    return compile_graph(
        tile,
        [
            ("L", (), None),
            ("qkv", ("b", L_Q), "bf16"),
            ("rope", ("cap", L_D), "f32"),
            ("kc", cache, "bf16"),
            ("vc", cache, "bf16"),
            ("opart", ("b", L_NH, splits, L_D), "f32"),
            ("mpart", ("b", L_NH, splits, 2), "f32"),
            *(combine if "%cnt" in tile.source else []),
        ],
        (L_LAYERS, "b", L_KV, splits),
        ("b", "L", "cap"),
        tmp_path,
    )


@needs_ptxas
@needs_bindings
def test_embed_compiles(tmp_path):
    tile = T.embed(16, 256, L_H)
    _, spills, _ = compile_graph(
        tile,
        [("tokens", ("b",), "i32"), ("E", ("v", L_H), "bf16"), ("h", ("b", L_H), "bf16")],
        ("(b + 15) // 16", L_H // 256),
        ("b", "v"),
        tmp_path,
    )
    assert set(spills) == {0}


@needs_ptxas
@needs_bindings
@pytest.mark.parametrize("group, unroll", [(1, 1), (4, 1), (4, 2)])
def test_grouped_combine_compiles_with_shuffles(group, unroll, tmp_path):
    tile = T.attention_combine(L_NH, L_D, group=group, merge_unroll=unroll)
    # A lane's splits loaded unroll at a time: every load before any fold.
    loop = tile.source.split("scf.for")[1].split("scf.yield")[0]
    assert loop.count("vector.load %op") == unroll
    assert loop.index("vector.load %op") < loop.index("math.exp")
    assert loop.rindex("vector.load %op") < loop.index("math.exp")
    ptx, spills, _ = compile_graph(
        tile,
        [
            ("opart", ("b", L_NH, "ns", L_D), "f32"),
            ("mpart", ("b", L_NH, "ns", 2), "f32"),
            ("attn", ("b", L_NH * L_D), "bf16"),
        ],
        (L_LAYERS, "b", L_NH // group),
        ("b", "ns"),
        tmp_path,
    )
    assert set(spills) == {0}
    # lanes = 256 / (group * 8 items): a butterfly of log2(lanes) rounds of 10 shuffles.
    lanes = min(32, 256 // (group * L_D // 8))
    assert ptx.count("shfl.sync.bfly") == 10 * (lanes.bit_length() - 1)
    with pytest.raises(etc.GraphError, match="merge_unroll must be a positive int, got 0"):
        T.attention_combine(L_NH, L_D, group=group, merge_unroll=0)


@needs_ptxas
@needs_bindings
def test_rmsnorm_compiles(tmp_path):
    tile = T.rmsnorm(L_H, 2, 1)
    _, spills, _ = compile_graph(
        tile,
        [("h", ("b", L_H), "bf16"), ("gamma", ("n", L_H), "bf16"), ("x", ("b", L_H), "bf16")],
        (L_LAYERS, "b"),
        ("b", "n"),
        tmp_path,
    )
    assert set(spills) == {0}


@needs_ptxas
@needs_bindings
@pytest.mark.parametrize(("chunk", "unroll"), [(256, 4), (512, 2)])
def test_attention_compiles(chunk, unroll, tmp_path):
    tile = T.attention(chunk, L_NH, L_KV, L_D, L_LAYERS, unroll=unroll)
    ptx, spills, smem = compile_attention(tile, chunk, tmp_path)
    assert set(spills) == {0}
    G4 = L_NH // L_KV
    assert max(smem) >= 4 * ((G4 + 2) * L_D + G4 * chunk + 8 * G4 * L_D)
    # K and V rows: `unroll` 16-byte loads each per loop iteration.
    assert len(re.findall(r"ld\.global(?:\.nc)?\.v4\.b32", ptx)) >= 2 * unroll


@needs_ptxas
@needs_bindings
def test_clustered_attention_pushes_its_partials_to_rank_0(tmp_path):
    """attention(cluster=8): rank 0 makes an mbarrier for the other seven
    splits' bytes and every split arrives on the cluster barrier, waits on it
    after the scores, then pushes its (max, sum) pairs and partial outputs
    with st.async (rank 0 stores its own); rank 0 waits for the bytes at
    cluster scope, merges from shared memory and gives the mbarrier up. No
    count and no partials in global memory; ptxas assembles it without
    spills. A cluster without the fused combine, or of 3, is refused."""
    C, chunk = 8, 192

    def compiled(cluster):
        (tmp_path / str(cluster)).mkdir()
        tile = T.attention(chunk, L_NH, L_KV, L_D, L_LAYERS, unroll=2, combine=True, spread=True,
                           stage_kv=True, prefetch_kv=True, cluster=cluster)  # fmt: skip
        assert tile.cluster == cluster
        return compile_attention(tile, chunk, tmp_path / str(cluster), splits=C)

    ptx, spills, _ = compiled(C)
    counted, _, _ = compiled(0)
    assert set(spills) == {0}
    G = L_NH // L_KV
    tx = (C - 1) * (G * L_D + 2 * G) * 4  # the others' outputs and (max, sum) pairs
    bytes_reg = re.search(rf"mov\.b32 \s*(%r\d+), {tx};", ptx)
    assert bytes_reg and "expect_tx.shared::cta.b64 _, [%r" in ptx
    assert re.search(rf"expect_tx\.shared::cta\.b64 _, \[%r\d+\], {bytes_reg[1]};", ptx)
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32") == 1
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32") == 1
    for op in (
        "barrier.cluster.arrive.release.aligned",
        "barrier.cluster.wait.acquire.aligned",
        "mbarrier.try_wait.parity.acquire.cluster",
        "mbarrier.inval",
        "mapa.shared::cluster",
    ):
        assert op in ptx, op  # fmt: skip
    # The count's atomic is gone (the scheduler's own remain).
    assert ptx.count("atom.acq_rel.gpu") == counted.count("atom.acq_rel.gpu") - 1
    assert "st.async" not in counted and "barrier.cluster" not in counted
    with pytest.raises(etc.GraphError, match="cluster=8 merges a group's splits on a thread-block"):
        T.attention(chunk, L_NH, L_KV, L_D, L_LAYERS, cluster=C)
    with pytest.raises(etc.GraphError, match="cluster=3 merges"):
        T.attention(chunk, L_NH, L_KV, L_D, L_LAYERS, combine=True, cluster=3)


@needs_ptxas
@needs_bindings
def test_attention_combine_compiles(tmp_path):
    tile = T.attention_combine(L_NH, L_D)
    _, spills, _ = compile_graph(
        tile,
        [
            ("opart", ("b", L_NH, "ns", L_D), "f32"),
            ("mpart", ("b", L_NH, "ns", 2), "f32"),
            ("attn", ("b", L_NH * L_D), "bf16"),
        ],
        (L_LAYERS, "b"),
        ("b", "ns"),
        tmp_path,
    )
    assert set(spills) == {0}


@needs_ptxas
@needs_bindings
def test_argmax_compiles(tmp_path):
    tile = T.argmax(L_V)
    _, spills, _ = compile_graph(
        tile,
        [("logits", ("b", L_V), "bf16"), ("out", ("b",), "i32")],
        ("b",),
        ("b",),
        tmp_path,
    )
    assert set(spills) == {0}


def test_pipelined_mma_attention_carries_the_next_step():
    """attention_mma(pipeline=True): the loop's iter_args add one step's K
    and V vectors (2 K rows x 2 and 4 V rows x 1 16-byte vectors per block at D=64), loaded once
    before the loop and once per step; the default has neither."""
    from etc.tiles.attention_mma import attention_mma

    plain = attention_mma(512, 32, 8, 64, 16, blocks=1, spread=True)
    piped = attention_mma(512, 32, 8, 64, 16, blocks=1, spread=True, pipeline="registers")
    assert plain.source.count("vector.load %kc") == 4 and piped.source.count("vector.load %kc") == 8
    assert "%st:18 = scf.for" in plain.source and "%st:26 = scf.for" in piped.source
    assert plain.reference is not None and piped.reference is not None
    staged = attention_mma(512, 32, 8, 64, 16, blocks=1, spread=True, pipeline="smem")
    # The first step's 8 copies before the loop, the next step's 8 in it;
    # the loop carries the stage parity.
    assert staged.source.count("nvvm.cp.async.shared.global") == 16
    assert "%st:19 = scf.for" in staged.source and "memref<16384xi32," in staged.source
    assert staged.source.count("nvvm.cp.async.wait.group") == 2
    with pytest.raises(etc.GraphError, match="pipeline 'regs' is not one of none, registers, smem"):
        attention_mma(512, 32, 8, 64, 16, pipeline="regs")
    with pytest.raises(etc.GraphError, match="head_dim=32 must be >= 64"):
        attention_mma(512, 8, 2, 32, 2, pipeline="smem")


@needs_ptxas
@needs_bindings
def test_argmax_parts_and_merge_compile(tmp_path):
    P = 16
    _, spills, _ = compile_graph(
        T.argmax(L_V, parts=P),
        [("logits", ("b", L_V), "bf16"), ("val", ("b", P), "f32"), ("idx", ("b", P), "i32")],
        ("b", P),
        ("b",),
        tmp_path,
    )
    assert set(spills) == {0}
    ptx, spills, _ = compile_graph(
        T.argmax_merge(L_V, P),
        [("val", ("b", P), "f32"), ("idx", ("b", P), "i32"), ("out", ("b",), "i32")],
        ("b",),
        ("b",),
        tmp_path,
    )
    assert set(spills) == {0} and ptx.count("shfl.sync.bfly") == 10


def test_attention_prefetch_kv_moves_the_cache_copies_before_the_waits():
    from etc.tiles.llama import attention

    staged = attention(8, 8, 2, 32, 2, stage_kv=True)
    early = attention(8, 8, 2, 32, 2, stage_kv=True, prefetch_kv=True)
    assert staged.prefetch is None and not staged.prefetch_fills_shared
    assert early.prefetch == "attention__prefetch" and early.prefetch_fills_shared
    body, prefetch = early.source.split("func.func @attention__prefetch")
    copies = staged.source.count("nvvm.cp.async.shared.global")
    assert copies > 0 and prefetch.count("nvvm.cp.async.shared.global") == copies
    assert "nvvm.cp.async.shared.global" not in body
    assert body.count("nvvm.cp.async.wait.group") == 2  # the body still waits for them
    with pytest.raises(etc.GraphError, match="prefetch_kv issues the stage_kv copies"):
        attention(8, 8, 2, 32, 2, prefetch_kv=True)


def test_attention_l2_prefetch_asks_for_each_cached_row_before_the_waits():
    """prefetch_kv="l2": the prefetch function asks the L2 for the split's K
    and V rows (one lane per row, R row loads a thread each), no shared
    memory; the body is the plain tile's, loading from the caches."""
    from etc.tiles.llama import attention

    plain = attention(64, 8, 2, 64, 2, unroll=2)
    early = attention(64, 8, 2, 64, 2, unroll=2, prefetch_kv="l2")
    assert early.prefetch == "attention__prefetch" and not early.prefetch_fills_shared
    body, prefetch = early.source.split("func.func @attention__prefetch")
    # 8 warps x 4 rows a load (64-dim rows, 8 lanes each): 64 rows in 2 loads, for K and V.
    assert prefetch.count("prefetch.global.L2") == 4 and "prefetch.global.L2" not in body
    assert "cp.async" not in early.source and "__kv" not in early.source
    loads = "vector.load %kc["
    assert body.count(loads) == plain.source.count(loads) > 0
    for bad, words in (
        (dict(prefetch_kv="l1"), "prefetch_kv must be a bool or 'l2', got 'l1'"),
        (dict(prefetch_kv="l2", stage_v=True), "prefetch_kv='l2' .* takes no stage_kv or stage_v"),
    ):
        with pytest.raises(etc.GraphError, match=words):
            attention(64, 8, 2, 64, 2, unroll=2, **bad)


@needs_ptxas
def test_attention_prefetch_kv_compiles(tmp_path):
    import dataclasses

    from etc.models import llama as M

    for prefetch in (True, "l2"):
        cfg = dataclasses.replace(M.TINY, attn_prefetch_kv=prefetch)
        for schedule in ("static", "dynamic"):
            art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg, schedule))
            assert art.cubin is not None
            assert ("prefetch.global.L2" in art.ptx) == (prefetch == "l2")
    with pytest.raises(etc.GraphError, match="attn_prefetch_kv must be a bool or 'l2'"):
        dataclasses.replace(M.TINY, attn_prefetch_kv="L2")
    with pytest.raises(etc.GraphError, match="attn_prefetch_kv fills shared memory"):
        dataclasses.replace(
            M.TINY,
            attn_prefetch_kv=True,
            prefetch_weights=True,
            prefetch_next=True,
            prefetch_ring=False,
        )


@pytest.mark.parametrize("spread", [False, True])
def test_attention_online_shares_the_reference(spread):
    """The online tile is a drop-in for ``attention``: the same numpy split."""
    rng = np.random.default_rng(11)
    L, B, cap = 3 * CHUNK + 5, 2, 4 * CHUNK
    chunk = 2 * CHUNK
    splits = (L + chunk) // chunk + 1
    qkv, rope, kc, vc = attention_inputs(rng, B, L, cap)
    tiles = [
        T.attention(chunk, NH, KV, D, LAYERS, spread=spread, unroll=1, block_size=64),
        T.attention_online(chunk, NH, KV, D, LAYERS, spread=spread, unroll=1, block_size=64),
    ]
    outs = []
    for tile in tiles:
        kc1, vc1 = kc.copy(), vc.copy()
        opart = np.zeros((B, NH, splits, D), np.float32)
        mpart = np.zeros((B, NH, splits, 2), np.float32)
        for s in reversed(range(splits)):
            for b in range(B):
                for g in range(KV):
                    tile.reference(1, b, g, s, L, qkv, rope, kc1, vc1, opart, mpart)
        outs.append((opart, mpart, kc1, vc1))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)


@needs_ptxas
@needs_bindings
@pytest.mark.parametrize(("spread", "unroll"), [(False, 4), (True, 2)])
def test_attention_online_compiles(spread, unroll, tmp_path):
    chunk = 512

    def build(make):
        tile = make(chunk, L_NH, L_KV, L_D, L_LAYERS, unroll=unroll, spread=spread)
        return compile_attention(tile, chunk, tmp_path)

    ptx, spills, smem = build(T.attention_online)
    assert set(spills) == {0}
    G4 = L_NH // L_KV
    assert max(smem) == 4 * 8 * G4 * (L_D + 2)
    # K and V rows of a step issued together: 2 * unroll 16-byte loads in the loop.
    assert len(re.findall(r"ld\.global(?:\.nc)?\.v4\.b32", ptx)) >= 2 * unroll

    # Two barriers (the join before the warps' partials, and before their
    # merge) where the phased tile has five.
    def barriers(text):
        return len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", text))

    assert barriers(build(T.attention)[0]) - barriers(ptx) == 3


@needs_ptxas
@needs_bindings
@pytest.mark.parametrize("blocks", [1, 2])
def test_attention_mma_compiles(blocks, tmp_path):
    """Scores and values on mma.sync: per 16 positions, D/16 mma for each of
    the two 8-position score tiles and D/8 for the output."""
    chunk = 512
    ptx, spills, smem = compile_attention(
        attention_mma(chunk, L_NH, L_KV, L_D, L_LAYERS, blocks=blocks, spread=True), chunk, tmp_path
    )
    assert set(spills) == {0}
    assert max(smem) == 4 * 8 * (L_NH // L_KV) * (L_D + 2)
    per_block = 2 * (L_D // 16) + L_D // 8
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16", ptx)) == blocks * per_block


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: attention_mma(512, 36, 4, 64, 2), ["'attention'", "9 query heads"]),
        (lambda: attention_mma(512, 8, 2, 48, 2), ["'attention'", "head_dim=48"]),
        (lambda: attention_mma(384, 8, 2, 64, 2, spread=True), ["'attention'", "chunk=384"]),
        (lambda: attention_mma(512, 8, 2, 64, 2, blocks=0), ["'attention'", "blocks"]),
    ],
)
def test_attention_mma_config_errors_name_the_tile(make, words):
    check_config_error(make, words)


def test_attention_mma_shares_the_reference():
    """A drop-in for ``attention``: the same numpy split (its own loop step)."""
    tile = attention_mma(64, NH, KV, D, LAYERS, blocks=1, block_size=128, spread=True)
    ref = T.attention(64, NH, KV, D, LAYERS, unroll=1, block_size=256, spread=True)
    rng = np.random.default_rng(5)
    L, B = 40, 2
    qkv, rope, kc, vc = attention_inputs(rng, B, L, L + 1)
    outs = []
    for t in (tile, ref):  # both step 64 positions: the same splits
        kc1, vc1 = kc.copy(), vc.copy()
        opart = np.zeros((B, NH, 2, D), np.float32)
        mpart = np.zeros((B, NH, 2, 2), np.float32)
        for s in (1, 0):
            for b in range(B):
                for g in range(KV):
                    t.reference(0, b, g, s, L, qkv, rope, kc1, vc1, opart, mpart)
        outs.append((opart, mpart, kc1, vc1))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)

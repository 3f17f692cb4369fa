"""The whole-decoder graph (etc.models.llama): the tiny configuration in the
simulator against the numpy model, the graph's layered structure, the
projection tiles (layer_gemm) against float64, and the Llama-3.2-1B graph
through the compiler to PTX that ptxas accepts."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from gemm_helpers import compile_tile, needs_bindings, needs_ptxas, rand_bf16
from unit_helpers import check_decoder_step

import etc
from etc.dtypes import bf16_to_f32, f32_to_bf16
from etc.models import llama as M
from etc.tiles import llama as T
from etc.tiles._text import unfixed_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from graphs import llama_tiny_variants  # noqa: E402

pytestmark = needs_bindings
CFG = M.TINY
#: Llama-3.2-1B as one kernel on the B = 1 kernel's phased attention, which
#: holds a span, so its tiers are uncapped (the spans before item 174); its
#: combine a stage, so that it can be the base of buckets whose kernels take
#: the tensor-core tile.
PHASED_1B = dataclasses.replace(
    M.LLAMA_3_2_1B, batch_buckets=(), **{**dict(M.SINGLE_SEQUENCE), "fuse_combine": False},
    attn_small_spans=((4, 128), (8, 256), (11, 384), (16, 256)),
)  # fmt: skip
#: The tiny decoder's B = 1 kernel as the default's, up to L = 39 on 5 splits
#: of at most 8 positions in a phased tile sized to them (the artifact's
#: spans are 64), K and V copied before the waits.
TINY_SHORT = dataclasses.replace(
    M.TINY, attn_chunk=64, attn_small_batch=2, attn_small_span=64, attn_small_spans=(),
    attn_single_span=8, attn_single_splits=5,
    batch_buckets=(
        (1, (*M.SINGLE_SEQUENCE,
             ("context_buckets",
              ((39, (("attn_phased_span", 8), ("attn_prefetch_kv", True))), (None, ()))))),
        (None, ()),
    ),
)  # fmt: skip
#: ... split by context three ways, B = 1's split count tiered by L
#: (``attn_single_tiers``; the GPU tests' variant, ``test/gpu/graphs.py``).
TINY_TIERS = llama_tiny_variants()["llama_tiny_context_tiers"]


@pytest.fixture(scope="module")
def graph():
    return M.build_decoder_graph(CFG)


@pytest.fixture(scope="module")
def weights():
    return M.random_weights(CFG, seed=2)


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("B, L", [(1, 0), (3, 7), (17, 8), (2, 20)])
def test_simulated_step_matches_the_numpy_model(graph, weights, schedule, B, L):
    S = L + 3
    tokens = np.random.default_rng(B * 100 + L).integers(0, CFG.vocab, B).astype(np.int32)
    arrays = M.numpy_inputs(CFG, weights, tokens, L, S)
    ref = M.reference_step(CFG, arrays, L)
    out = etc.simulate(graph, arrays, {"B": B, "L": L, "S": S}, schedule=schedule, num_ctas=5)
    got = bf16_to_f32(out["logits"])
    assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
    np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
    # The step writes position L of every layer's cache and nothing else.
    for cache in ("k_cache", "v_cache"):
        np.testing.assert_array_equal(out[cache][:, :, :, :L], arrays[cache][:, :, :, :L])
        written = bf16_to_f32(out[cache][:, :, :, L])
        want = bf16_to_f32(ref[cache][:, :, :, L])
        np.testing.assert_allclose(written, want, rtol=2e-2, atol=2e-2)
        assert np.abs(written).max() > 0
        np.testing.assert_array_equal(out[cache][:, :, :, L + 1 :], 0)


def test_greedy_decoding_in_the_simulator_follows_the_numpy_model(graph, weights):
    """Four greedy steps (tokens fed back, the cache growing), B = 2."""
    B, S = 2, 6
    tokens = np.array([3, 900], np.int32)
    arrays = M.numpy_inputs(CFG, weights, tokens, 0, S)
    ref_arrays = {k: v.copy() for k, v in arrays.items()}
    for L in range(4):
        ref = M.reference_step(CFG, ref_arrays, L)
        out = etc.simulate(graph, arrays, {"B": B, "L": L, "S": S})
        np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
        for k in ("k_cache", "v_cache"):
            arrays[k], ref_arrays[k] = out[k], ref[k]
        arrays["tokens"] = ref_arrays["tokens"] = out["next_tokens"].copy()


def test_one_task_per_stage_with_layer_phases(graph):
    names = [t.name for t in graph.tasks]
    assert names == [
        "embed", "qkv", "attention", "combine", "o_proj", "gate_up", "down", "final_norm",
        "lm_head", "argmax", "argmax_merge",
    ]  # fmt: skip
    argmax = next(t for t in graph.tasks if t.name == "argmax")
    assert len(argmax.grid) == 2 and argmax.grid[1] == CFG.argmax_parts == 16
    whole = M.build_decoder_graph(dataclasses.replace(CFG, argmax_parts=0))
    assert [t.name for t in whole.tasks][-1] == "argmax"
    with pytest.raises(etc.GraphError, match="argmax_parts must be an int in 0..32, got 33"):
        dataclasses.replace(CFG, argmax_parts=33)
    layered = [t for t in graph.tasks if t.phase == ("dim", 0)]
    assert len(layered) == 6 and all(t.grid[0] == CFG.layers for t in layered)
    unfolded = M.build_decoder_graph(dataclasses.replace(CFG, fold_norms=False))
    assert [t.name for t in unfolded.tasks][1:3] == ["norm1", "qkv"]
    down = next(t for t in graph.tasks if t.name == "down")
    assert down.out_edges[0].map.offsets == (1,)
    # The static order runs layer by layer: the phase never decreases, and
    # every layer's instances come before the next layer's.
    env = {"B": 2, "L": 5, "S": 8}
    order = graph.topological_tasks()
    queue = etc.static_queues(graph, env, 1)[0]
    grids = [tuple(d if isinstance(d, int) else d.evaluate(env) for d in t.grid) for t in order]
    phases = [
        np.unravel_index(i, grids[n])[order[n].phase[1]]
        if order[n].phase[0] == "dim"
        else order[n].phase[1]
        for n, i in queue
    ]
    assert phases == sorted(phases) and (phases[0], phases[-1]) == (0, CFG.layers)
    assert len(queue) == sum(int(np.prod(g)) for g in grids)


def test_one_artifact_serves_every_shape(graph):
    """B, L and S are symbols: no shape is baked into the graph."""
    assert [s.name for s in graph.symbols] == ["B", "L", "S"]


def test_config_errors_name_the_field():
    with pytest.raises(etc.GraphError, match="heads=30 is not a multiple of kv_heads=8"):
        M.LlamaConfig(heads=30)
    with pytest.raises(etc.GraphError, match="bn_gu=48 does not divide 8192"):
        M.LlamaConfig(bn_gu=48)
    with pytest.raises(etc.GraphError, match="outline must be a bool or a tuple of task names"):
        M.LlamaConfig(outline=("attn",))
    with pytest.raises(etc.GraphError, match="outline must be a bool or a tuple of task names"):
        M.LlamaConfig(outline="attention")


def test_hf_state_dict_names_and_shapes():
    w = M.random_weights(CFG, seed=0)
    sd = M.hf_state_dict(CFG, w)
    H, NH, KV, D = CFG.hidden, CFG.heads, CFG.kv_heads, CFG.head_dim
    assert sd["model.layers.1.self_attn.k_proj.weight"].shape == (KV * D, H)
    assert sd["model.layers.0.mlp.up_proj.weight"].shape == (CFG.inter, H)
    np.testing.assert_array_equal(sd["model.norm.weight"], w["norms"][2 * CFG.layers])
    np.testing.assert_array_equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"])
    assert sd["model.layers.1.self_attn.q_proj.weight"].shape == (NH * D, H)


def test_rope_table_matches_llama3_scaling():
    cfg = M.LLAMA_3_2_1B
    f = M.inv_freq(cfg)
    base = 1.0 / (cfg.rope_theta ** (np.arange(0, 64, 2) / 64))
    # High frequencies unchanged, low ones divided by the factor (32).
    np.testing.assert_allclose(f[0], base[0], rtol=1e-6)
    np.testing.assert_allclose(f[-1], base[-1] / 32, rtol=1e-5)
    table = M.rope_table(cfg, 5)
    np.testing.assert_allclose(table[3, :32], np.cos(3 * f), atol=4e-3)
    np.testing.assert_allclose(table[3, 32:], np.sin(3 * f), atol=4e-3)


# -- layer_gemm --------------------------------------------------------------------


def _silu(x):
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("epilogue", ["store", "residual", "swiglu"])
@pytest.mark.parametrize("columns_first, weight_chunk", [(False, 0), (True, 0), (False, 64)])
def test_layer_gemm_reference_against_float64(epilogue, columns_first, weight_chunk):
    from etc.tiles.gemm import chunk_weights, layer_gemm

    rng = np.random.default_rng(1)
    n, k, layers, rows, bm, bn = 64, 256, 3, 20, 16, 16
    per = 2 if epilogue == "swiglu" else 1
    tile = layer_gemm(
        bm, bn, n, k, layers=layers, epilogue=epilogue, columns_first=columns_first,
        weight_chunk=weight_chunk,
    )  # fmt: skip
    A, W = rand_bf16(rng, rows, k), rand_bf16(rng, layers, per * n, k, scale=0.1)
    W_in = chunk_weights(W, weight_chunk) if weight_chunk else W  # the layout the tile reads
    C = rand_bf16(rng, rows, n)
    C0 = C.copy()
    for i in range(2):
        for j in range(n // bn):
            tile.reference(2, *((j, i) if columns_first else (i, j)), A, W_in, C)
    a, w = bf16_to_f32(A).astype(np.float64), bf16_to_f32(W[2]).astype(np.float64)
    if epilogue == "swiglu":
        want = _silu(a @ w[:n].T) * (a @ w[n:].T)
    else:
        want = a @ w.T + (bf16_to_f32(C0) if epilogue == "residual" else 0)
    got = bf16_to_f32(C)
    assert np.abs(got - want).max() / np.abs(want).max() < 2e-2


def test_layer_gemm_single_weight_is_two_dimensional():
    from etc.tiles.gemm import layer_gemm

    tile = layer_gemm(16, 64, 128, 256, layers=None, name="head")
    assert tile.params == ("index", "index", "memref<?x256xbf16>", "memref<128x256xbf16>",
                           "memref<?x128xbf16>")  # fmt: skip


def test_layer_gemm_errors_name_the_tile():
    from etc.tiles.gemm import layer_gemm

    with pytest.raises(etc.GraphError, match="tile 'p': epilogue 'gelu' is not one of"):
        layer_gemm(16, 16, 64, 256, layers=2, epilogue="gelu", name="p")
    with pytest.raises(etc.GraphError, match="tile 'p'.*does not divide|tile 'p'.*n"):
        layer_gemm(16, 24, 64, 256, layers=2, name="p")
    with pytest.raises(etc.GraphError, match="tile 'p': weight_chunk=96 needs a multiple of 8 "):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", weight_chunk=96)
    with pytest.raises(etc.GraphError, match="tile 'p': weight_chunk=32 needs core='tma' and"):
        layer_gemm(64, 64, 64, 256, layers=2, name="p", core="tma", weight_chunk=32)
    with pytest.raises(etc.GraphError, match="tile 'p'.*weight_chunk"):
        layer_gemm(16, 64, 64, 256, layers=2, name="p", core="bulk", weight_chunk=64)


@needs_ptxas
@pytest.mark.parametrize("epilogue", ["store", "residual", "swiglu"])
@pytest.mark.parametrize("weight_chunk", [0, 64])
def test_layer_gemm_with_prefetch_compiles(epilogue, weight_chunk, tmp_path):
    from etc.tiles.gemm import layer_gemm

    n, k = 128, 512
    per = 2 if epilogue == "swiglu" else 1
    tile = layer_gemm(
        16, 16, n, k, layers=2, epilogue=epilogue, prefetch_weights=True, stages=3, unroll=1,
        weight_chunk=weight_chunk,
    )  # fmt: skip
    assert tile.prefetch == f"{tile.name}__prefetch"
    art = compile_tile(
        tile,
        [("A", ("m", k), "bf16"), ("W", (2, per * n, k), "bf16"), ("C", ("m", n), "bf16")],
        (2, "m", n // 16),
    )
    assert art.ptx.count("cp.async.bulk.prefetch.L2.global") == per
    assert "mma.sync.aligned.m16n8k16" in art.ptx


def test_layer_gemm_streaming_option_errors_name_the_tile():
    from etc.tiles.gemm import layer_gemm

    with pytest.raises(etc.GraphError, match="tile 'p': a_ring .* give stages"):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", a_ring=True)
    with pytest.raises(etc.GraphError, match="tile 'p': a_ahead=3 needs stages > a_ahead"):
        layer_gemm(16, 16, 64, 512, layers=2, name="p", stages=3, unroll=1, a_ahead=3)
    with pytest.raises(etc.GraphError, match="tile 'p': a_ahead=1 needs .*a_ring=True"):
        layer_gemm(16, 16, 64, 512, layers=2, name="p", stages=3, unroll=1, a_ahead=1, a_ring=True)
    with pytest.raises(etc.GraphError, match="tile 'p': a_ahead must be an int >= 0"):
        layer_gemm(16, 16, 64, 512, layers=2, name="p", stages=3, unroll=1, a_ahead=-1)


@needs_ptxas
@pytest.mark.parametrize(
    "options",
    [
        dict(stages=3, unroll=1, a_ring=True),
        dict(stages=4, unroll=2, a_ahead=1, rotate_k=True),
        dict(stages=5, unroll=1, a_ahead=2, rotate_k=True, rmsnorm=(2, 1, 1e-5)),
    ],
    ids=["a_ring", "ahead_rotated", "ahead_normed"],
)
def test_layer_gemm_streaming_options_compile(options):
    from etc.tiles.gemm import layer_gemm

    n, k = 64, 1024

    def build(**opts):
        tile = layer_gemm(16, 16, n, k, layers=2, epilogue="swiglu", **opts)
        # The k loop starts at the column block's chunk group (256 k per warp slice).
        groups = 256 // (32 * opts["unroll"])
        assert (f"arith.remui %j, %c{groups}_" in tile.source) == bool(opts.get("rotate_k"))
        tensors = [("A", ("m", k), "bf16")]
        if "rmsnorm" in opts:
            tensors.append(("G", (5, k), "bf16"))
        tensors += [("W", (2, 2 * n, k), "bf16"), ("C", ("m", n), "bf16")]
        art = compile_tile(tile, tensors, (2, "m", n // 16))
        assert art.cubin is not None and "mma.sync.aligned.m16n8k16" in art.ptx
        # Copies in the ring's fill and the loop body (before LLVM unrolls anything).
        return tile.source.count("nvvm.cp.async.shared.global")

    copies = build(**options), build(**{key: options[key] for key in ("stages", "unroll")})
    # A thread copies its 2 weight fragments (gate, up) per chunk, and its 2 A rows with a_ring.
    assert copies[0] == (2 if options.get("a_ring") else 1) * copies[1], copies


@needs_ptxas
def test_prefetch_next_calls_the_next_instances_weight_prefetch():
    """The tiny decoder's GEMM tiles have L2 weight prefetches; with
    prefetch_next the static kernel also calls them for the CTA's next queue
    entry, so more prefetch instructions; the dynamic kernel cannot."""
    cfg = dataclasses.replace(CFG, prefetch_weights=True, prefetch_next=True, prefetch_ring=False)
    g = M.build_decoder_graph(cfg)
    counts = {}
    for key, options in {
        "own": M.compile_options(dataclasses.replace(cfg, prefetch_next=False)),
        "next": M.compile_options(cfg),
        "dynamic": M.compile_options(cfg, "dynamic"),
    }.items():
        counts[key] = etc.compile(g, **options).ptx.count("cp.async.bulk.prefetch.L2")
    assert counts["next"] > counts["own"] == counts["dynamic"] > 0, counts
    with pytest.raises(etc.GraphError, match="prefetch_next needs prefetch_weights"):
        dataclasses.replace(CFG, prefetch_next=True)


@needs_ptxas
def test_llama_3_2_1b_compiles_to_ptx_ptxas_accepts():
    """The whole model, one kernel; ptxas runs inside etc.compile (cubin)."""
    cfg = dataclasses.replace(M.LLAMA_3_2_1B)
    for schedule in ("static", "dynamic"):
        art = etc.compile(M.build_decoder_graph(cfg), schedule=schedule, min_ctas_per_sm=2)
        assert art.cubin
        assert art.manifest["symbols"] == ["B", "L", "S"]


def test_weights_in_bf16_match_the_reference_rounding():
    w = M.random_weights(CFG, seed=0)
    assert w["wqkv"].dtype == np.uint16 and w["wqkv"].shape == (2, CFG.qkv_width, CFG.hidden)
    std = bf16_to_f32(w["wd"]).std()
    assert 0.5 * 0.02 / np.sqrt(2 * CFG.layers) < std < 2 * 0.02 / np.sqrt(2 * CFG.layers)
    assert f32_to_bf16(np.float32(1.0)) == 0x3F80


@pytest.mark.parametrize(
    "schedule, flags",
    [
        ("static", []),
        ("dynamic", ["--weight-chunk", "64"]),
        ("static", ["--ragged", "--batch", "2"]),
        ("dynamic", ["--page-size", "4", "--ragged", "--batch", "2"]),
    ],
)
def test_example_decodes_in_the_simulator(schedule, flags):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "llama_decode.py"
    done = subprocess.run(
        [sys.executable, str(script), "--simulate", "--schedule", schedule, "--steps", "6", *flags],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # L = 0..8 crosses TINY's 8-token attention chunk: the partials grow (one
    # step more for the ragged batch's second sequence, joining a step late).
    steps = 10 if "--ragged" in flags else 9
    assert done.stdout.count("ok   L=") == steps and "FAIL" not in done.stdout


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_serving_example_batches_a_request_stream(schedule):
    """examples/llama_serve.py: requests join and leave a batch over a
    paged cache (B = 1's kernel and the others', from one configuration);
    every step matches the numpy model and every page comes back."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "llama_serve.py"
    done = subprocess.run(
        [sys.executable, str(script), "--simulate", "--schedule", schedule, "--max-batch", "3"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "served 10 requests" in done.stdout and "FAIL" not in done.stdout
    sizes = {
        int(line.split("B=")[1].split()[0]) for line in done.stdout.splitlines() if "B=" in line
    }
    assert 1 in sizes and max(sizes) == 3  # both kernels, the batch at its cap


@needs_ptxas
def test_serving_example_emits_every_kernel_s_ptx(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "llama_serve.py"
    done = subprocess.run(
        [sys.executable, str(script), "--tiny", "--emit-ptx", str(tmp_path / "k.ptx")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in tmp_path.glob("k.*.ptx"))
    assert files == ["k.B1_L0-1087.ptx", "k.B1_L1088+.ptx", "k.B2+.ptx"]
    for name in files:
        asm = subprocess.run(
            ["ptxas", "-arch=sm_90", str(tmp_path / name), "-o", str(tmp_path / "k.cubin")],
            capture_output=True,
            text=True,
        )
        assert asm.returncode == 0, asm.stderr


def test_example_refuses_a_page_size_naming_it():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "llama_decode.py"
    done = subprocess.run(
        [sys.executable, str(script), "--simulate", "--page-size", "6"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "page_size=6 must be a power of two" in done.stderr


def _planning_kernel(directory, monkeypatch):
    """A Kernel for planning only: the driver's allocations are faked."""
    from etc.runtime import driver
    from etc.runtime import kernel as K
    from etc.runtime.manifest import load_manifest
    from etc.runtime.tensormap import TensorMaps

    freed = []
    monkeypatch.setattr(driver, "alloc", lambda n: 0x1000 + n)
    monkeypatch.setattr(driver, "free", lambda ptr: freed.append(ptr))
    monkeypatch.setattr(driver, "htod", lambda *a, **k: None)
    monkeypatch.setattr(driver, "synchronize", lambda stream: None)
    k = object.__new__(K.Kernel)
    k.manifest = load_manifest(directory)
    k.num_ctas, k._peers, k._num_ranks = 8, None, 0
    k.device = types.SimpleNamespace(sm_count=4)  # 8 CTAs: 2 on each of 4 SMs
    k._sm_of_cta, k._sm_deal = None, "spread"
    k._plans, k._shapes, k._scratch, k._staging = {}, {}, {}, {}
    k._param_tensors = [p.name for p in k.manifest.params if p.kind == "tensor"]
    k._maps = TensorMaps(k.manifest)
    k._ensure_context = lambda: None
    return k, freed


def test_decode_steps_share_the_static_queues(tmp_path, monkeypatch):
    """A decode loop changes L every step: steps whose shapes agree (same
    attention splits, same capacity S) reuse one plan's queues and checks and
    differ only in the symbol words; plans and shapes are bounded."""
    from etc.runtime import kernel as K

    etc.compile(M.build_decoder_graph(CFG), cubin=False).save(tmp_path)
    k, freed = _planning_kernel(tmp_path, monkeypatch)
    first = k._plan({"B": 2, "L": 1, "S": 40}, None)
    second = k._plan({"B": 2, "L": 6, "S": 40}, None)  # chunk 8: one split for L+1 <= 8
    assert second.queue_buffer is first.queue_buffer and len(k._shapes) == 1
    slot = second.pack.slot("symbol", "L")
    assert (int(first.pack.values[slot]), int(second.pack.values[slot])) == (1, 6)
    changed = np.flatnonzero(first.pack.values != second.pack.values).tolist()
    assert changed == [slot]
    third = k._plan({"B": 2, "L": 8, "S": 40}, None)  # two splits: another shape
    assert third.queue_buffer is not first.queue_buffer and len(k._shapes) == 2
    monkeypatch.setattr(K, "MAX_SHAPES", 2)
    k._plan({"B": 3, "L": 1, "S": 40}, None)  # evicts the oldest shape and its plans
    assert len(k._shapes) == 2 and first.queue_buffer.ptr == 0 and freed
    assert all(p.shape_key != first.shape_key for p in k._plans.values())
    k.clear_cache()  # frees the fake buffers while the driver is still faked
    assert not k._plans and not k._shapes


def test_queues_dealt_by_a_given_placement(tmp_path, monkeypatch):
    """Kernel.deal_by_sm: full-grid queues deal each task's last partial round
    by SM (no CTA of a 6-instance stage beside an idle one on 4 SMs of 2);
    bad placements are refused naming the graph."""
    from etc.runtime import queue as Q

    etc.compile(M.build_decoder_graph(CFG), cubin=False).save(tmp_path)
    k, _ = _planning_kernel(tmp_path, monkeypatch)
    syms = {"B": 2, "L": 1, "S": 40}
    plain = Q.decode(k._plan(syms, None).queue)
    sm_of = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    k.deal_by_sm("pairs", sm_of)
    dealt = Q.decode(k._plan(syms, None).queue)
    assert sorted(map(sorted, plain)) != sorted(map(sorted, dealt))
    assert sorted(e for es in plain for e in es) == sorted(e for es in dealt for e in es)
    for task in range(len(k.manifest.tasks)):
        per_sm = np.bincount(
            [sm_of[c] for c, es in enumerate(dealt) for t, _ in es if t == task], minlength=4
        )
        n = int(per_sm.sum())
        if n % 8 and n % 8 % 2 == 0:  # an even remainder: whole SMs only
            assert all(x % 2 == 0 for x in per_sm - 2 * (n // 8)), (task, per_sm)
    with pytest.raises(etc.LaunchError, match="3 SM ids for 8 co-resident CTAs"):
        k.deal_by_sm("spread", [0, 1, 2])
    # An SM past the device's and a name dealt lists for no SM, or raised ValueError.
    for bad in ([0, 1, 2, 3, 0, 1, 2, 99], ["a"] * 8):
        with pytest.raises(etc.LaunchError, match="placement must hold SM ids in 0.."):
            k.deal_by_sm("spread", bad)
    with pytest.raises(etc.LaunchError, match="how='random'"):
        k.deal_by_sm("random", sm_of)
    with pytest.raises(etc.LaunchError, match="compiled without sm_deal"):
        k.deal_by_sm("spread")
    k.deal_by_sm(None)
    assert Q.decode(k._plan(syms, None).queue) == plain
    k.clear_cache()


def test_the_artifact_says_how_to_deal_by_sm(tmp_path):
    """etc.compile(sm_deal=...) lands in the manifest, which sets the runtime's
    default; compile_decoder passes LlamaConfig.sm_deal to static kernels only
    (LARGE_BATCH's and SMALL_BATCH's kernels deal by SM, B = 1's does not)."""
    from etc.runtime.manifest import load_manifest

    assert ("sm_deal", "spread") in M.LARGE_BATCH and ("sm_deal", "spread") in M.SMALL_BATCH
    assert M.LLAMA_3_2_1B.kernel_for(1, 0).sm_deal is None
    cfg = dataclasses.replace(CFG, sm_deal="pairs")
    static = M.compile_decoder(cfg, "static", cubin=False)
    assert static.manifest["sm_deal"] == "pairs"
    static.save(tmp_path / "s")
    assert load_manifest(tmp_path / "s").sm_deal == "pairs"
    assert "sm_deal" not in M.compile_decoder(cfg, "dynamic", cubin=False).manifest
    assert "sm_deal" not in M.compile_decoder(CFG, "static", cubin=False).manifest
    with pytest.raises(etc.CompileError, match="sm_deal must be 'spread', 'pairs' or None"):
        etc.compile(M.build_decoder_graph(CFG), sm_deal="random")
    with pytest.raises(etc.CompileError, match="sm_deal must be"):
        etc.compile(M.build_decoder_graph(CFG), schedule="dynamic", sm_deal="spread")


def test_queues_dealt_again_by_the_recorded_placement(tmp_path, monkeypatch):
    """A static kernel compiled with sm_deal records each CTA's SM in its
    queue's last words; after
    the first synchronised full-grid launch the runtime reads them and deals
    the cached queues again, in their buffers (the records stay after them).
    Records that do not place 2 CTAs on each of the 4 SMs change nothing."""
    import ctypes

    from etc.runtime import driver
    from etc.runtime import queue as Q

    art = etc.compile(M.build_decoder_graph(CFG), cubin=False, sm_deal="spread")
    assert "%smid" in art.ptx
    assert "%smid" not in etc.compile(M.build_decoder_graph(CFG), cubin=False).ptx
    art.save(tmp_path)
    k, _ = _planning_kernel(tmp_path, monkeypatch)
    k._scratch = {}
    plan = k._plan({"B": 2, "L": 1, "S": 40}, None)
    plain = plan.queue.copy()
    assert (plain[-8:] == 0).all() and Q.decode(plain[:-8]) == Q.decode(plain)
    uploads = []
    monkeypatch.setattr(driver, "htod", lambda ptr, src, n: uploads.append(n))
    for record, learned in (([0] * 8, False), ([3, 0, 1, 2, 0, 1, 2, 3], True)):
        words = np.array(record, dtype=np.int64)

        def dtoh(dst, src, n, words=words):
            ctypes.memmove(dst, words.ctypes.data, n)

        monkeypatch.setattr(driver, "dtoh", dtoh)
        k._learn_placement(plan)
        assert (k._sm_of_cta is not None) == learned
    counts, _, phases, pooled = plan.deal_inputs
    want = Q.build_static_queue(counts, 8, phases, pooled, [3, 0, 1, 2, 0, 1, 2, 3], "spread")
    assert plan.queue[: len(want)].tolist() == want.tolist() and uploads == [want.nbytes]
    assert Q.decode(plan.queue) != Q.decode(plain)
    k.clear_cache()


def test_sm_slices_kernels_deal_by_their_own_sms(tmp_path, monkeypatch):
    """A kernel compiled with sm_slices: full-grid queues end in the by-SM
    word (4 SMs of 2 CTAs), list k * 4 + s dealt for SM s, and the counters
    hold a word per SM after the done counter; round-robin on request."""
    from etc.runtime import queue as Q

    art = etc.compile(M.build_decoder_graph(CFG), cubin=False, sm_slices=True)
    assert art.manifest["sm_slices"] is True and "%nsmid" in art.ptx
    art.save(tmp_path)
    k, _ = _planning_kernel(tmp_path, monkeypatch)
    syms = {"B": 2, "L": 1, "S": 40}
    plan = k._plan(syms, None)
    assert plan.queue[-1] == 4 << 8 | 2
    size = plan.pack.values[plan.pack.slot("counters", None) + 3]
    assert int(size) == plan.counters + 1 + 4
    dealt = Q.decode(plan.queue[:-1])
    on_sm = np.arange(8) % 4
    for task in range(len(k.manifest.tasks)):
        n = sum(t == task for es in dealt for t, _ in es)
        per_sm = np.bincount(
            [on_sm[c] for c, es in enumerate(dealt) for t, _ in es if t == task], minlength=4
        )
        if n % 8 > 4 and n % 8 % 2 == 0:  # more than the SMs: whole SMs
            assert all(x % 2 == 0 for x in per_sm - 2 * (n // 8)), (task, per_sm)
    with pytest.raises(etc.LaunchError, match="give deal_by_sm no placement"):
        k.deal_by_sm("spread", on_sm)
    k.deal_by_sm(None)
    assert k._plan(syms, None).queue[-1] == 0
    k.clear_cache()
    with pytest.raises(etc.CompileError, match="sm_slices needs the static schedule"):
        etc.compile(M.build_decoder_graph(CFG), schedule="dynamic", sm_slices=True)


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_fused_norms_match_the_numpy_model(weights, schedule):
    """fuse_norms: the RMSNorms inside the following GEMMs (no norm tasks),
    the same answer as the separate stages."""
    cfg = dataclasses.replace(CFG, fuse_norms=True, fold_norms=False)
    g = M.build_decoder_graph(cfg)
    assert not {"norm1", "norm2", "final_norm"} & {t.name for t in g.tasks}
    for B, L in ((1, 0), (17, 9)):
        tokens = np.arange(B, dtype=np.int32) * 7
        arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2)
        ref = M.reference_step(cfg, arrays, L)
        out = etc.simulate(g, arrays, {"B": B, "L": L, "S": L + 2}, schedule=schedule)
        got = bf16_to_f32(out["logits"])
        assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
        np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])


def test_layer_gemm_rmsnorm_reference_against_float64():
    from etc.tiles.gemm import layer_gemm

    rng = np.random.default_rng(3)
    n, k, rows, eps = 32, 256, 5, 1e-5
    tile = layer_gemm(16, 16, n, k, layers=2, rmsnorm=(2, 1, eps))
    assert tile.params[3:5] == ("memref<?x256xbf16>", "memref<?x256xbf16>")
    A, G = rand_bf16(rng, rows, k, scale=3.0), rand_bf16(rng, 5, k)
    W, C = rand_bf16(rng, 2, n, k, scale=0.1), np.zeros((rows, n), np.uint16)
    for j in range(n // 16):
        tile.reference(1, 0, j, A, G, W, C)
    a = bf16_to_f32(A).astype(np.float64)
    x = a / np.sqrt((a * a).mean(axis=1, keepdims=True) + eps) * bf16_to_f32(G[3])
    want = x @ bf16_to_f32(W[1]).astype(np.float64).T
    assert np.abs(bf16_to_f32(C) - want).max() / np.abs(want).max() < 2e-2


@needs_ptxas
def test_layer_gemm_rmsnorm_compiles(tmp_path):
    from etc.tiles.gemm import layer_gemm

    k = 512
    tile = layer_gemm(16, 16, 64, k, layers=2, rmsnorm=(2, 0, 1e-5), stages=3, unroll=1)
    art = compile_tile(
        tile,
        [("A", ("m", k), "bf16"), ("G", (4, k), "bf16"), ("W", (2, 64, k), "bf16"),
         ("C", ("m", 64), "bf16")],
        (2, "m", 4),
    )  # fmt: skip
    assert "rsqrt.approx" in art.ptx and "shfl.sync.bfly" in art.ptx


def test_hf_state_dict_round_trips():
    w = M.random_weights(CFG, seed=5)
    back = M.from_hf_state_dict(CFG, M.hf_state_dict(CFG, w))
    for name, value in w.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_from_hf_state_dict_names_what_is_wrong():
    w = M.random_weights(CFG, seed=5)
    sd = M.hf_state_dict(CFG, w)
    del sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(etc.GraphError, match="no 'model.layers.1.mlp.up_proj.weight'"):
        M.from_hf_state_dict(CFG, sd)
    sd = M.hf_state_dict(CFG, w)
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1
    with pytest.raises(etc.GraphError, match="lm_head.weight differs from the embedding"):
        M.from_hf_state_dict(CFG, sd)
    with pytest.raises(etc.GraphError, match="wqkv of shape"):
        M.from_hf_state_dict(
            dataclasses.replace(CFG, layers=1, kv_heads=4), M.hf_state_dict(CFG, w)
        )


def test_config_from_hf_reads_llama_3_2_1b():
    from types import SimpleNamespace

    hf = SimpleNamespace(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, intermediate_size=8192, vocab_size=128256, rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    )  # fmt: skip
    assert M.config_from_hf(hf) == M.LLAMA_3_2_1B
    # config.json read as a dict is the same configuration.
    assert M.config_from_hf(dict(vars(hf))) == M.LLAMA_3_2_1B
    # A missing size was an AttributeError.
    with pytest.raises(etc.GraphError, match="config has no 'intermediate_size'"):
        M.config_from_hf({k: v for k, v in vars(hf).items() if k != "intermediate_size"})
    hf.rope_scaling = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(etc.GraphError, match="RoPE scaling 'yarn' is not supported"):
        M.config_from_hf(hf)
    # 12 heads: the combine groups take a divisor (4), not the default 8.
    hf.rope_scaling, hf.num_attention_heads, hf.num_key_value_heads = None, 12, 4
    assert M.config_from_hf(hf).combine_group == 4


@pytest.mark.parametrize("group", [0, 2, 8])
def test_combine_groups_shape_the_combine_stage(weights, group):
    cfg = dataclasses.replace(CFG, combine_group=group)
    g = M.build_decoder_graph(cfg)
    combine = next(t for t in g.tasks if t.name == "combine")
    per_row = CFG.heads // group if group else 1
    assert len(combine.grid) == (3 if group else 2)
    assert combine.out_edges[0].event.wait_count.evaluate({"B": 3}) == 3 * per_row
    B, L, S = 3, 9, 12
    tokens = np.arange(B, dtype=np.int32) * 7
    arrays = M.numpy_inputs(cfg, weights, tokens, L, S)
    ref = M.reference_step(cfg, arrays, L)
    out = etc.simulate(g, arrays, {"B": B, "L": L, "S": S}, schedule="dynamic", num_ctas=3)
    np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
    with pytest.raises(etc.GraphError, match="combine_group=3 must be 0 or a divisor of heads=8"):
        dataclasses.replace(CFG, combine_group=3)


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_norm_sums_match_the_numpy_model(weights, schedule):
    """norm_sums: embed, o_proj and down add every row's sum of squares to
    sumsq, the fused norms read it; the same answer as the norm stages."""
    cfg = dataclasses.replace(CFG, fuse_norms=True, norm_sums=True, fold_norms=False)
    g = M.build_decoder_graph(cfg)
    assert "sumsq" in {t.name for t in g.tensors}
    for B, L in ((1, 0), (17, 9)):
        tokens = np.arange(B, dtype=np.int32) * 5
        arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2)
        arrays["sumsq"][...] = 7 << 28  # stale sums from an earlier step: embed resets them
        ref = M.reference_step(cfg, arrays, L)
        out = etc.simulate(g, arrays, {"B": B, "L": L, "S": L + 2}, schedule=schedule)
        got = bf16_to_f32(out["logits"])
        assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
        np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
        # The final slot holds the last residual stream's sums of squares.
        h = bf16_to_f32(out["h"])
        # (In fixed point: integer adds, the same whatever their order.)
        assert out["sumsq"].dtype == np.int64
        got_sums = unfixed_reference(out["sumsq"][-1])
        np.testing.assert_allclose(got_sums, (h * h).sum(axis=1), rtol=1e-5)


def test_norm_sums_tiles_and_their_errors():
    from etc.tiles.gemm import layer_gemm

    with pytest.raises(etc.GraphError, match="tile 'p': norm_sums reads .* give rmsnorm"):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", norm_sums=True)
    with pytest.raises(etc.GraphError, match="tile 'p': sums_out needs the residual epilogue"):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", sums_out=(2, 1))
    with pytest.raises(etc.GraphError, match="norm_sums feeds the fused norms"):
        dataclasses.replace(CFG, norm_sums=True, fold_norms=False)
    consumer = layer_gemm(16, 16, 64, 256, layers=2, name="c", rmsnorm=(2, 0, 1e-5),
                          norm_sums=True, stages=3, unroll=1)  # fmt: skip
    assert consumer.params[3:6] == ("memref<?x256xbf16>", "memref<?x256xbf16>", "memref<?x?xi64>")
    # No statistics prologue: no workgroup buffer, no pass over A.
    assert "__rms" not in consumer.source
    producer = layer_gemm(16, 16, 64, 256, layers=2, name="r", epilogue="residual",
                          sums_out=(2, 1))  # fmt: skip
    assert producer.params[-1] == "memref<?x?xi64>"
    # Fixed-point integer adds (order-independent), rows g and g + 8.
    assert producer.source.count("memref.atomic_rmw addi") == 2
    assert "addf" not in producer.source.split("atomic_rmw")[1][:10]


@needs_ptxas
@pytest.mark.parametrize("fold", [False, True])
def test_norm_sums_decoder_compiles_with_integer_atomics(fold):
    cfg = dataclasses.replace(CFG, fuse_norms=not fold, norm_sums=not fold, fold_norms=fold)
    art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg))
    assert art.cubin is not None
    assert "add.u64" in art.ptx or "add.s64" in art.ptx
    assert "atom.global.add.f32" not in art.ptx and "red.global.add.f32" not in art.ptx


@pytest.mark.parametrize("tile", ["phased", "mma"])
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_fused_combine_matches_the_numpy_model(weights, schedule, tile):
    """fuse_combine: the last split of each (sequence, kv head) merges the
    splits; embed zeroes the split counters, so stale ones do no harm. On
    the tensor-core tile with direct attention, a grid of one split writes
    the output and counts nothing."""
    cfg = dataclasses.replace(CFG, fuse_combine=True)
    if tile == "mma":
        cfg = dataclasses.replace(cfg, attn_tile="mma", attn_unroll=1)
    g = M.build_decoder_graph(cfg)
    assert "combine" not in {t.name for t in g.tasks}
    for B, L in ((1, 0), (17, 20)):
        tokens = np.arange(B, dtype=np.int32) * 3
        arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2)
        arrays["attn_count"][...] = 5  # left over from an aborted step
        ref = M.reference_step(cfg, arrays, L)
        out = etc.simulate(g, arrays, {"B": B, "L": L, "S": L + 2}, schedule=schedule, num_ctas=5)
        got = bf16_to_f32(out["logits"])
        assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
        np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
        # Every (layer, sequence, kv head) counted each of its splits once.
        splits = cfg.splits(L, B)
        counted = 0 if splits == 1 and cfg.direct_attention else splits
        np.testing.assert_array_equal(out["attn_count"], counted)


def test_split_counters_are_the_artifact_s():
    """B = 1's phased kernel and the B = 2..16 ones fuse their combine, B = 1's
    long-context and the large-batch kernels do not, but every kernel of
    the artifact declares the counters (one set of buffers); a configuration
    that fuses nowhere declares none, and counters refused under a fusing
    kernel are named."""
    cfg = M.LLAMA_3_2_1B
    kernels = cfg.kernel_configs()
    assert [k.fuse_combine for _, _, k in kernels] == [True, False, True, True, False]
    for _, _, k in kernels:
        assert "attn_count" in {t.name for t in M.build_decoder_graph(k).tensors}
    assert not dataclasses.replace(cfg, batch_buckets=()).split_counters
    with pytest.raises(etc.GraphError, match="attn_counters=False leaves it out"):
        dataclasses.replace(PHASED_1B, fuse_combine=True, attn_counters=False)


def test_fused_combine_counts_the_grid_s_splits():
    """The last split to count is the one whose count reaches the grid's
    split count, the partials' dimension 2: B = 1's spread splits (17 of
    ~64 positions at L = 1024) are not ceil((L + 1) / chunk) (3 with the
    phased chunk of 512, so the third split to finish merged three splits:
    wrong tokens on an H200, forty-sixth session); and the merge shares the
    splits among the lanes of each 8-dim item."""
    tile = T.attention(512, 32, 8, 64, 16, combine=True, spread=True)
    fused = tile.source[tile.source.index("%fc_c2 = arith.constant 2") :]
    assert "%fc_splits = memref.dim %op, %fc_c2" in fused
    assert "gpu.shuffle xor" in fused and "divui %L" not in fused
    with pytest.raises(etc.GraphError, match="combine merges 8 heads of 64 as 64 items"):
        T.attention(8, 8, 1, 64, 1, combine=True, block_size=32)
    from etc.tiles.attention_mma import attention_mma

    with pytest.raises(etc.GraphError, match="combine counts one kv head an instance: .*got 2"):
        attention_mma(512, 32, 8, 64, 16, pipeline="tma", prefetch=True, items=2, combine=True)
    with pytest.raises(etc.GraphError, match="attn_counters must be a bool or None, got 1"):
        M.LlamaConfig(attn_counters=1)


@needs_ptxas
def test_fused_combine_compiles_for_llama_3_2_1b():
    cfg = dataclasses.replace(PHASED_1B, fuse_combine=True)
    art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg))
    assert art.cubin is not None
    assert "atom.acq_rel.gpu.global.add.u32" in art.ptx


def _check_step(
    cfg, g, weights, B: int, L: int, schedule: str, stride: int, num_ctas: int = 5
) -> dict:
    """One simulated step of ``g`` on ``num_ctas`` CTAs against
    ``reference_step`` (tokens ``stride * b``): logits within 1e-2, the same
    greedy tokens. Returns the simulator's outputs."""
    tokens = np.arange(B, dtype=np.int32) * stride
    arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2)
    ref = M.reference_step(cfg, arrays, L)
    out = etc.simulate(
        g, arrays, {"B": B, "L": L, "S": L + 2}, schedule=schedule, num_ctas=num_ctas
    )
    got = bf16_to_f32(out["logits"])
    assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
    np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
    return out


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_folded_norms_match_the_numpy_model(weights, schedule):
    """fold_norms: the layer norms' weights multiplied into wqkv and wgu,
    the rows scaled in the epilogues from the sums the residual writers
    add up; no norm stages in the layers, the same answer as the unfolded
    numpy model (which applies the norms before the products)."""
    cfg = CFG  # fold_norms is the default
    assert cfg.fold_norms
    g = M.build_decoder_graph(cfg)
    names = {t.name for t in g.tasks}
    assert not {"norm1", "norm2"} & names and "final_norm" in names
    plain = dataclasses.replace(CFG, fold_norms=False)
    for B, L in ((1, 0), (17, 9)):
        tokens = np.arange(B, dtype=np.int32) * 11
        arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2)
        # The graph's weights are the folded ones, the norms themselves kept.
        assert "wqkv" not in arrays and arrays["wqkv_folded"].shape == weights["wqkv"].shape
        assert not np.array_equal(arrays["wqkv_folded"], weights["wqkv"])
        np.testing.assert_array_equal(arrays["wo"], weights["wo"])
        arrays["sumsq"][...] = 3 << 28  # stale sums: embed resets them
        unfolded = M.reference_step(plain, M.numpy_inputs(plain, weights, tokens, L, L + 2), L)
        folded = M.reference_step(cfg, arrays, L)
        out = etc.simulate(g, arrays, {"B": B, "L": L, "S": L + 2}, schedule=schedule, num_ctas=5)
        got = bf16_to_f32(out["logits"])
        for ref in (folded, unfolded):
            assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
        np.testing.assert_array_equal(out["next_tokens"], unfolded["next_tokens"])


def test_layer_gemm_row_scale_reference_against_float64():
    from etc.tiles.gemm import fold_norm, layer_gemm

    rng = np.random.default_rng(4)
    n, k, rows, eps = 32, 256, 5, 1e-5
    tile = layer_gemm(16, 16, n, k, layers=2, row_scale=(2, 1, eps), epilogue="swiglu")
    assert tile.params[3:5] == ("memref<?x256xbf16>", "memref<?x?xi64>")
    A, G = rand_bf16(rng, rows, k, scale=3.0), rand_bf16(rng, 5, k)
    W, C = rand_bf16(rng, 2, 2 * n, k, scale=0.1), np.zeros((rows, n), np.uint16)
    a = bf16_to_f32(A).astype(np.float64)
    S = np.zeros((5, rows), np.int64)
    S[3] = np.round((a * a).sum(axis=1) * 2**28)  # fixed point (etc.tiles._text.SUM_BITS)
    for j in range(n // 16):
        tile.reference(1, 0, j, A, S, fold_norm(W, G[3]), C)
    x = a / np.sqrt((a * a).mean(axis=1, keepdims=True) + eps) * bf16_to_f32(G[3])
    gu = x @ bf16_to_f32(W[1]).astype(np.float64).T
    gate, up = gu[:, :n], gu[:, n:]
    want = gate / (1 + np.exp(-gate)) * up
    assert np.abs(bf16_to_f32(C) - want).max() / np.abs(want).max() < 3e-2


def test_row_scale_and_prefetch_ring_errors():
    from etc.tiles.gemm import layer_gemm

    with pytest.raises(etc.GraphError, match="tile 'p': give rmsnorm or row_scale"):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", rmsnorm=(2, 0, 1e-5),
                   row_scale=(2, 0, 1e-5))  # fmt: skip
    with pytest.raises(etc.GraphError, match="tile 'p': prefetch_ring .* needs stages"):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", prefetch_ring=True)
    with pytest.raises(etc.GraphError, match="row_scale, prefetch_ring do not apply"):
        layer_gemm(16, 16, 64, 256, layers=2, name="p", core="bulk", row_scale=(2, 0, 1e-5),
                   prefetch_ring=True)  # fmt: skip
    with pytest.raises(etc.GraphError, match="give fold_norms or fuse_norms"):
        dataclasses.replace(CFG, fold_norms=True, fuse_norms=True)
    with pytest.raises(etc.GraphError, match="give prefetch_ring .* or prefetch_weights"):
        dataclasses.replace(CFG, prefetch_ring=True, prefetch_weights=True)


def test_prefetch_ring_moves_the_first_copies_into_the_prefetch():
    """The prefetch issues the ring's first stages - 1 groups (every thread
    its own slots), the body only the rest: together the copies of the
    tile without the option."""
    from etc.tiles.gemm import layer_gemm

    def copies(text: str) -> tuple[int, int]:
        return text.count("nvvm.cp.async.shared.global"), text.count("cp.async.commit.group")

    plain = layer_gemm(16, 16, 64, 512, layers=2, name="p", stages=3, unroll=1)
    early = layer_gemm(16, 16, 64, 512, layers=2, name="p", stages=3, unroll=1, prefetch_ring=True)
    assert early.prefetch == "p__prefetch" and early.prefetch_fills_shared
    assert not plain.prefetch_fills_shared
    body, pre = early.source.split("func.func @p__prefetch")
    assert copies(pre) == (2, 2)  # stages - 1 groups of one weight fragment
    assert copies(body)[0] + copies(pre)[0] == copies(plain.source)[0]
    assert "memref.global" not in pre and body.count('memref.global "private" @p__ring') == 1
    assert "memref.get_global @p__ring" in pre
    one = layer_gemm(16, 16, 64, 512, layers=2, name="p", stages=3, unroll=1, prefetch_ring=1)
    body1, pre1 = one.source.split("func.func @p__prefetch")
    assert copies(pre1) == (1, 1) and copies(body1)[0] == copies(plain.source)[0] - 1
    with pytest.raises(etc.GraphError, match="prefetch_ring=3 groups: the ring has room for 1..2"):
        layer_gemm(16, 16, 64, 512, layers=2, name="p", stages=3, unroll=1, prefetch_ring=3)
    with pytest.raises(etc.CompileError, match="prefetch that fills shared memory"):
        cfg = dataclasses.replace(CFG, prefetch_ring=True)
        etc.compile(M.build_decoder_graph(cfg), schedule="static", prefetch_next=True)


@needs_ptxas
def test_folded_norms_and_ring_prefetch_compile_for_llama_3_2_1b():
    cfg = dataclasses.replace(M.LLAMA_3_2_1B, fold_norms=True, prefetch_ring=True)
    g = M.build_decoder_graph(cfg)
    for schedule in ("static", "dynamic"):
        art = etc.compile(g, **M.compile_options(cfg, schedule))
        assert art.cubin is not None and "rsqrt.approx" in art.ptx


def test_row_paths_branch_at_run_time_and_share_the_ring():
    """row_paths: one body per row count, the smallest that holds the
    block's rows chosen at run time; every warp on all rows (one warp row);
    one weight ring and one split-K buffer declared for all paths."""
    from etc.tiles.gemm import layer_gemm

    tile = layer_gemm(64, 16, 64, 512, layers=2, name="p", epilogue="swiglu", stages=3, unroll=1,
                      row_paths=(16, 32, 64), prefetch_ring=True)  # fmt: skip
    body = tile.source.split("func.func @p__prefetch")[0]
    assert [body.count(f"// {m}-row path") for m in (16, 32, 64)] == [1, 1, 1]
    assert body.count("arith.cmpi ule") == 2
    assert body.count('memref.global "private" @p__ring') == 1
    assert body.count('memref.global "private" @p__partials') == 1
    assert "1x2x4 warps" in body  # WM = 1 in every path
    with pytest.raises(etc.GraphError, match="row_paths=.* ending at block_m=64"):
        layer_gemm(64, 16, 64, 512, layers=2, name="p", row_paths=(16, 32))
    with pytest.raises(etc.GraphError, match="row_paths=.* multiples of 16"):
        layer_gemm(64, 16, 64, 512, layers=2, name="p", row_paths=(24, 64))
    with pytest.raises(etc.GraphError, match="warps .* must have WM = 1"):
        layer_gemm(64, 16, 64, 512, layers=2, name="p", row_paths=(16, 64), warps=(2, 2, 2))
    with pytest.raises(etc.GraphError, match="do not combine with rmsnorm or a_ring"):
        layer_gemm(64, 16, 64, 512, layers=2, name="p", row_paths=(16, 64), rmsnorm=(2, 0, 1e-5))


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_row_paths_decoder_matches_the_numpy_model(weights, schedule):
    """64-row GEMM blocks with 16/32/64-row paths: batches of 1, 17 and 40
    (one block each, three different paths on the GPU) give the numpy
    model's answer in the simulator."""
    cfg = dataclasses.replace(CFG, block_m=64, row_paths=(16, 32, 64))
    g = M.build_decoder_graph(cfg)
    for B, L in ((1, 0), (17, 9), (40, 3)):
        _check_step(cfg, g, weights, B, L, schedule, 13)


@needs_ptxas
def test_row_paths_tile_compiles(tmp_path):
    from etc.tiles.gemm import layer_gemm

    k = 512
    tile = layer_gemm(64, 16, 64, k, layers=2, epilogue="residual", stages=3, unroll=1,
                      row_paths=(16, 32, 64), prefetch_ring=True, sums_out=(2, 1))  # fmt: skip
    art = compile_tile(
        tile,
        [("A", ("m", k), "bf16"), ("W", (2, 64, k), "bf16"), ("C", ("m", 64), "bf16"),
         ("S", (4, "m"), "i64")],
        (2, "m", 4),
    )  # fmt: skip
    assert art.ptx.count("mma.sync.aligned.m16n8k16") >= 7  # 1 + 2 + 4 row fragments


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_small_batches_split_the_attention_finer(weights, schedule):
    """attn_small_batch: up to that batch the splits are about
    attn_small_span long, past it attn_chunk; every split count spreads the
    positions evenly; the same answer as the numpy model either way."""
    cfg = dataclasses.replace(CFG, attn_small_batch=2, attn_small_span=3, attn_small_spans=())
    g = M.build_decoder_graph(cfg)
    att = next(t for t in g.tasks if t.name == "attention")
    for B, L, splits in ((1, 0, 1), (2, 20, 7), (3, 20, 3), (17, 9, 2)):
        env = {"B": B, "L": L, "S": L + 2}
        assert etc.symbolic.evaluate(att.grid[3], env) == splits
        tokens = np.arange(B, dtype=np.int32) * 17
        arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2)
        assert arrays["opart"].shape[2] == splits
        ref = M.reference_step(cfg, arrays, L)
        out = etc.simulate(g, arrays, env, schedule=schedule, num_ctas=5)
        got = bf16_to_f32(out["logits"])
        assert np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]) < 1e-2
        np.testing.assert_array_equal(out["next_tokens"], ref["next_tokens"])
    with pytest.raises(
        etc.GraphError,
        match="attn_small_span=9 must be in 1..8 \\(the attention's buffers hold attn_chunk=8\\)",
    ):
        dataclasses.replace(CFG, attn_small_batch=2, attn_small_span=9, attn_small_spans=())


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_small_batch_span_tiers_match_the_numpy_model(weights, schedule):
    """attn_small_spans: up to each tier's batch ceil(L / span) splits of
    the cached positions (position L in the split that reaches it, one
    split at L = 0), past the last tier attn_small_span's ceil((L+1)/span);
    the same answer as the numpy model."""
    cfg = dataclasses.replace(
        CFG, attn_chunk=16, attn_small_batch=4, attn_small_span=8,
        attn_small_spans=((2, 3), (3, 12)), attn_single_span=0,
    )  # fmt: skip
    g = M.build_decoder_graph(cfg)
    att = next(t for t in g.tasks if t.name == "attention")
    cases = ((1, 20, 7), (2, 30, 10), (2, 0, 1), (3, 24, 2), (3, 32, 3), (4, 30, 4), (5, 30, 2))
    for B, L, splits in cases:
        env = {"B": B, "L": L, "S": L + 2}
        assert etc.symbolic.evaluate(att.grid[3], env) == splits == cfg.splits(L, B), (B, L)
    # Steps of 8 in a chunk of 16: B = 2 position L rides in the split of
    # [24, 31); B = 3, L = 24 spans of 16 (no room: [16, 25) reaches past L
    # anyway), L = 32 position L alone in the third split.
    for B, L in ((2, 30), (3, 24), (3, 32), (2, 0)):
        _check_step(cfg, g, weights, B, L, schedule, 35)
    for bad in (((3, 5), (2, 3)), ((2, 16),), ((2,),), [(2, 3)], ((0, 3),)):
        with pytest.raises(etc.GraphError, match="attn_small_spans=.* must be \\(batch, span\\)"):
            dataclasses.replace(
                CFG, attn_chunk=16, attn_small_batch=4, attn_small_span=8, attn_small_spans=bad
            )


def test_spread_attention_refuses_splits_longer_than_its_chunk():
    from etc.tiles.llama import attention

    tile = attention(8, 4, 2, 16, 1, spread=True, name="att")
    rng = np.random.default_rng(0)
    L, P = 20, 2  # 21 positions in 2 splits of 11, whole steps of 8: 16 > chunk 8
    qkv = f32_to_bf16(rng.standard_normal((1, 8 * 16)).astype(np.float32))
    rope = np.zeros((L + 1, 16), np.float32)
    kc = np.zeros((1, 1, 2, L + 1, 16), np.uint16)
    op, mp = np.zeros((1, 4, P, 16), np.float32), np.zeros((1, 4, P, 2), np.float32)
    with pytest.raises(etc.GraphError, match="tile 'att': 2 splits of L \\+ 1 = 21 .* chunk=8"):
        tile.reference(0, 0, 0, 0, L, qkv, rope, kc, kc.copy(), op, mp)


def test_spread_splits_are_whole_loop_steps():
    """Llama-3.2-1B's attention steps over 128 rows: the L = 1024 cached
    positions in 3 splits of 384 (not 342) or 4 of 256, position L in the
    split that reaches it (5 splits: the fifth is empty); the trailing
    splits of an over-split context are empty; a span of the whole chunk
    has no room for position L, which then takes the next split."""
    from etc.tiles.llama import _split_positions

    def spans(splits: int, L: int = 1024) -> list[tuple[int, int]]:
        return [_split_positions("a", 512, True, s, L, splits, 128) for s in range(splits)]

    assert spans(3) == [(0, 384), (384, 768), (768, 1025)]
    assert spans(4) == [(0, 256), (256, 512), (512, 768), (768, 1025)]
    assert spans(5) == [(0, 256), (256, 512), (512, 768), (768, 1025), (1025, 1025)]
    assert spans(4, L=200) == [(0, 128), (128, 201), (201, 201), (201, 201)]
    assert spans(3, L=0) == [(0, 1), (1, 1), (1, 1)]
    assert spans(5, L=2048)[3:] == [(1536, 2048), (2048, 2049)]
    assert (
        PHASED_1B.splits(1024, 16) == 4
        and PHASED_1B.splits(1024, 17) == 3
        and PHASED_1B.splits(0, 64) == 1
    )


@pytest.mark.parametrize("spread", [False, True])
def test_split_counts_cover_every_position_once(spread):
    """Over the counts the large-batch kernel gives the tensor-core tile
    (cached positions, the tile holding no span), and the bounded counts
    the phased tile gets, the splits' positions are [0, L + 1) exactly once,
    in order; only the unbounded ones pass the chunk (L a multiple of it,
    or spread splits rounded up to whole loop steps)."""
    from etc.tiles.llama import _split_positions

    chunk, step = 512, 128
    longest = 0
    for L in [0, 1, 127, 128, 511, 512, 513, 1023, 1024, 1025, 1536, 2047, 2048, 5000]:
        for bounded, count in ((True, (L + chunk) // chunk), (False, max(1, -(-L // chunk)))):
            spans = [
                _split_positions("a", chunk, spread, s, L, count, step, bounded)
                for s in range(count)
            ]
            covered = [p for p0, p1 in spans for p in range(p0, p1)]
            assert covered == list(range(L + 1)), (L, bounded, spans)
            longest_here = max(p1 - p0 for p0, p1 in spans)
            if bounded:
                assert longest_here <= chunk, (L, spans)
            longest = max(longest, longest_here)
    assert longest > chunk  # the unbounded counts do take longer splits


def test_folded_weights_have_their_own_names(weights):
    """A buffer of unfolded weights under the old name is refused at launch
    (unknown 'wqkv', missing 'wqkv_folded'), not used as if folded."""
    assert {"wqkv_folded", "wgu_folded"} <= set(M.tensor_shapes(CFG, 1, 0, 2))
    unfolded = dataclasses.replace(CFG, fold_norms=False)
    assert "wqkv" in M.tensor_shapes(unfolded, 1, 0, 2)
    once = M.graph_weights(CFG, weights)
    twice = M.graph_weights(CFG, once)  # folded weights are kept, not folded again
    assert twice.keys() == once.keys() and twice["wqkv_folded"] is once["wqkv_folded"]
    g = M.build_decoder_graph(CFG)
    arrays = M.numpy_inputs(unfolded, weights, np.zeros(1, np.int32), 0, 2)
    with pytest.raises(etc.EtcError, match="wqkv"):
        etc.simulate(g, arrays, {"B": 1, "L": 0, "S": 2})


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_row_paths_for_some_projections(weights, schedule):
    """row_path_projections: gate_up and down in 32-row blocks with 16/32-row
    paths, qkv, o_proj and the LM head in 16-row blocks; embed follows down
    (both notify layer_in). The grids and the event counts agree, and the
    answer is the numpy model's."""
    cfg = dataclasses.replace(
        CFG, row_paths=(16, 32), row_path_projections=("gate_up_proj", "down_proj")
    )
    assert [cfg.gemm_block(p) for p in ("qkv_proj", "gate_up_proj", "down_proj", "embed")] == [
        16, 32, 32, 32,
    ]  # fmt: skip
    g = M.build_decoder_graph(cfg)
    env = {"B": 40, "L": 3, "S": 5}
    grids = {t.name: [etc.symbolic.evaluate(d, env) for d in t.grid] for t in g.tasks}
    assert grids["qkv"][-1] == 3 and grids["gate_up"][-1] == 2 and grids["embed"][0] == 2
    for B, L in ((1, 0), (40, 3)):
        _check_step(cfg, g, weights, B, L, schedule, 19)
    with pytest.raises(etc.GraphError, match="row_path_projections names 'down'"):
        dataclasses.replace(CFG, row_paths=(16, 32), row_path_projections=("down",))


def test_config_from_json_changes():
    """bench/decode.py stores the fields an artifact was built with as JSON
    and rebuilds the configuration from them (lists back to tuples)."""
    import json

    changes = {"fold_norms": False, "gemm_options": (("stages", 5), ("unroll", 2))}
    back = M.LlamaConfig.from_changes(json.loads(json.dumps(changes)))
    assert back == dataclasses.replace(M.LLAMA_3_2_1B, **changes)
    with pytest.raises(etc.GraphError, match="LlamaConfig has no field 'stages'"):
        M.LlamaConfig.from_changes({"stages": 3})


def test_attention_stage_v_copies_only_the_values():
    """stage_v: one cp.async group (V) issued before the RoPE, waited for
    before the values' pass; K keeps the register loads; half the
    workgroup slots of stage_kv."""
    from etc.tiles.llama import attention

    both = attention(64, 8, 2, 64, 2, stage_kv=True, name="a")
    v_only = attention(64, 8, 2, 64, 2, stage_v=True, name="a")
    assert both.source.count("cp.async.commit.group") == 2
    assert v_only.source.count("cp.async.commit.group") == 1
    assert "cp.async.wait.group 1" not in v_only.source
    assert v_only.source.count("cp.async.wait.group 0") == 1
    assert (
        "%kb0 = vector.load %kc" in v_only.source and "%vb0 = vector.load %vc" not in v_only.source
    )
    size = [line for line in both.source.splitlines() if "@a__kv :" in line and "global" in line]
    half = [line for line in v_only.source.splitlines() if "@a__kv :" in line and "global" in line]
    assert "memref<4096xi32" in size[0] and "memref<2048xi32" in half[0]
    with pytest.raises(etc.GraphError, match="give stage_kv .* or stage_v, not both"):
        attention(64, 8, 2, 64, 2, stage_kv=True, stage_v=True)


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_stage_v_decoder_matches_the_numpy_model(weights, schedule):
    cfg = dataclasses.replace(CFG, attn_stage_v=True)
    g = M.build_decoder_graph(cfg)
    for B, L in ((1, 0), (3, 20)):
        _check_step(cfg, g, weights, B, L, schedule, 23)


@needs_ptxas
def test_stage_v_compiles_for_llama_3_2_1b():
    """One more cp.async group wait in the kernel: the attention's values."""

    def waits(cfg) -> int:
        art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg))
        assert art.cubin is not None
        return art.ptx.count("cp.async.wait_group \t0;")

    staged = waits(dataclasses.replace(PHASED_1B, attn_stage_v=True))
    assert staged == waits(PHASED_1B) + 1


def test_online_attention_config_conflicts_name_the_fields():
    with pytest.raises(
        etc.GraphError, match="attn_stage_kv, attn_stage_v apply to attn_tile='phased'"
    ):
        M.LlamaConfig(attn_tile="mma", attn_stage_kv=True, attn_stage_v=True, fuse_combine=True)
    with pytest.raises(
        etc.GraphError, match="fuse_combine applies to attn_tile='phased' or 'mma', not 'online'"
    ):
        M.LlamaConfig(attn_tile="online", attn_pipeline="none", fuse_combine=True)
    with pytest.raises(etc.GraphError, match="attn_tile 'flash' is not one of phased, online, mma"):
        M.LlamaConfig(attn_tile="flash")


@pytest.mark.parametrize(("tile", "unroll"), [("online", 1), ("online", 4), ("mma", 2)])
def test_online_attention_decoder_matches_the_numpy_model(weights, tile, unroll):
    """The simulator runs the tiles' references: the online tile's is the
    phased one's, so the decoder's output is the numpy model's either way."""
    cfg = dataclasses.replace(CFG, attn_tile=tile, attn_unroll=unroll)
    g = M.build_decoder_graph(cfg)
    for B, L in ((1, 0), (3, 20)):
        _check_step(cfg, g, weights, B, L, "dynamic", 29)


@pytest.mark.parametrize("spans", ["chunks", "spread"])
def test_mma_attention_splits_the_cached_positions(weights, spans):
    """The tensor-core tile holds no span, so past the small tier the splits
    cover the L cached positions and position L rides in the last one: at
    L = 16 with chunks of 8, two splits (one of 9 positions) instead of
    three; spread, B = 3 takes the two halves, position L in the second."""
    tiers = dict(attn_small_batch=2, attn_small_span=3, attn_small_spans=())
    tiers = tiers if spans == "spread" else {}
    cfg = dataclasses.replace(CFG, attn_tile="mma", attn_unroll=2, **tiers)
    assert cfg.cached_splits and cfg.attn_chunk == 8
    assert [cfg.splits(L, 3) for L in (0, 7, 8, 9, 16, 17)] == [1, 1, 1, 2, 2, 3]
    assert not dataclasses.replace(CFG, attn_tile="online").cached_splits
    g = M.build_decoder_graph(cfg)
    for B, L in ((3, 16), (4, 8), (3, 0)):
        _check_step(cfg, g, weights, B, L, "static", 31)


@needs_ptxas
def test_attention_stamps_are_a_graph_tensor_the_tile_writes():
    """attn_stamps: the tensor-core tile takes ``attn_stamps`` (layers, B,
    kv_heads, splits, 12) i64 after its outputs and thread 0 stores its
    clock at each of STAMPS' points; the step's answer is the same (the
    simulator's references leave the stamps zero); ptxas accepts it; a
    phased tile with stamps is refused by name."""
    from etc.tiles.attention_mma import STAMPS, attention_mma

    cfg = dataclasses.replace(
        CFG, attn_tile="mma", attn_unroll=1, attn_pipeline="tma", head_dim=64, heads=4,
        kv_heads=2, combine_group=4, attn_tma_prefetch=True, attn_stamps=True,
    )  # fmt: skip
    g = M.build_decoder_graph(cfg)
    (attention,) = [t for t in g.tasks if t.name == "attention"]
    # After the outputs, before the caches' TMA maps.
    assert [a.name for a in attention.args if hasattr(a, "name")][-3] == "attn_stamps"
    shapes = M.tensor_shapes(cfg, 3, 200, 202)
    assert shapes["attn_stamps"] == ((cfg.layers, 3, 2, cfg.splits(200, 3), 12), "i64")
    out = _check_step(cfg, g, M.random_weights(cfg, seed=3), 3, 200, "static", 29)
    assert not out["attn_stamps"].any()
    source = attention_mma(4096, 32, 8, 64, 16, blocks=1, pipeline="tma", stamps=True).source
    assert len(STAMPS) == 12
    assert source.count("%stamps[") == 10  # no prefetch function here
    assert source.count("%clock64") == 8 and source.count("%globaltimer") == 2
    fn = attention_mma(4096, 32, 8, 64, 16, blocks=1, pipeline="tma", prefetch=True, stamps=True)
    assert fn.source.count("%stamps[") == 12
    assert "cp.async.bulk.tensor" in etc.compile(g, schedule="static").ptx
    with pytest.raises(etc.GraphError, match="attn_stamps applies to attn_tile='mma' or 'phased'"):
        dataclasses.replace(CFG, attn_tile="online", attn_stamps=True)


@needs_ptxas
def test_phased_attention_stamps_time_the_phases_and_the_merge():
    """attn_stamps on the phased tile (fused merge, K and V copied before
    the waits): ``attn_stamps`` (layers, B, kv_heads, splits, 14) i64 after
    the merge's outputs; thread 0 stores its clock at each of PHASED_STAMPS'
    points in the body (none in the prefetch function), the count it saw
    after the merge's atomic; the step's answer is the same under both
    schedules; ptxas accepts the kernel."""
    from etc.tiles.llama import PHASED_STAMPS, attention

    cfg = dataclasses.replace(CFG, fuse_combine=True, attn_prefetch_kv=True, attn_stamps=True)
    g = M.build_decoder_graph(cfg)
    (task,) = [t for t in g.tasks if t.name == "attention"]
    assert [a.name for a in task.args if hasattr(a, "name")][-1] == "attn_stamps"
    shapes = M.tensor_shapes(cfg, 3, 20, 22)
    assert shapes["attn_stamps"] == ((cfg.layers, 3, cfg.kv_heads, cfg.splits(20, 3), 14), "i64")
    weights = M.random_weights(cfg, seed=4)
    for schedule in ("static", "dynamic"):
        out = _check_step(cfg, g, weights, 3, 20, schedule, 23)
        assert not out["attn_stamps"].any()
    fn = attention(64, 32, 8, 64, 16, combine=True, stage_kv=True, prefetch_kv=True, stamps=True)
    body, prefetch = fn.source.split("func.func @attention__prefetch(")
    assert len(PHASED_STAMPS) == 14 and body.count("%stamps[") == 14
    assert body.count("%clock64") == 11 and body.count("%globaltimer") == 2
    assert "%stamps[" not in prefetch and "%fc_done64" in body
    plain = attention(64, 32, 8, 64, 16, combine=True, stage_kv=True, prefetch_kv=True).source
    assert "stamps" not in plain and "%clock64" not in plain
    # On a cluster rank 0 merges: its count word is the cluster's size, as
    # the last split's is the splits' count, so bench/decode_trace.py's
    # table takes it for the merger.
    clustered = attention(64, 32, 8, 64, 16, combine=True, stage_kv=True, prefetch_kv=True,
                          stamps=True, cluster=4).source  # fmt: skip
    body = clustered.split("func.func @attention__prefetch(")[0]
    assert body.count("%stamps[") == 14 and body.count("%clock64") == 11
    lead = body.split("scf.if %cl_lead {")[-1]  # the merge's, after the prologue's
    assert "%cl_count64 = arith.constant 4 : i64" in lead and "%cl_count64, %stamps[" in lead
    assert "globaltimer" in etc.compile(g, schedule="static").ptx


@needs_ptxas
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_attention_items_run_kv_heads_on_one_ring(schedule):
    """attn_items=2: one tensor-core instance attends both kv heads of its
    sequence and split (the grid's kv dimension 1, ``attended`` counting
    instances), the same answer as the numpy model; the tile loops over its
    items with one ring start and one barrier invalidation, the ring's steps
    numbered across the items; ptxas accepts it; bad counts are refused by
    name."""
    from etc.tiles.attention_mma import attention_mma

    cfg = dataclasses.replace(
        CFG, attn_tile="mma", attn_unroll=1, attn_pipeline="tma", head_dim=64, heads=4,
        kv_heads=2, combine_group=4, attn_tma_prefetch=True, attn_items=2,
    )  # fmt: skip
    g = M.build_decoder_graph(cfg)
    (attention,) = [t for t in g.tasks if t.name == "attention"]
    assert str(attention.grid[2]) == "1"
    weights = M.random_weights(cfg, seed=3)
    for B, L in ((1, 0), (3, 200), (2, 300)):
        _check_step(cfg, g, weights, B, L, schedule, 29)
    fn = attention_mma(
        4096, 32, 8, 64, 16, blocks=1, pipeline="tma", stages=2, prefetch=True,
        release="read_early", direct=True, items=4,
    )  # fmt: skip
    body, pf = fn.source.split("func.func @attention__prefetch(")
    assert body.count("scf.for %item = %c0 to %c4_") == 1
    # The thread index read afresh in each item (its lane values not hoisted).
    assert body.count("gpu.thread_id") == 1 and body.count("mov.u32 $0, %tid.x;") == 1
    assert pf.count("mbarrier.init") == 4 and "mbarrier.init" not in body
    assert body.count("mbarrier.inval") == 4 and body.index("mbarrier.inval") > body.index(
        "scf.for %item"
    )
    # The ring's step: the item's loop steps follow its predecessors'.
    assert "arith.muli %item, %nsteps_item" in body and "%nsteps_item" in pf
    if schedule == "static":
        assert "cp.async.bulk.tensor" in etc.compile(g, schedule="static").ptx
    with pytest.raises(etc.GraphError, match="items=3 does not divide kv_heads=8"):
        attention_mma(4096, 32, 8, 64, 16, pipeline="tma", prefetch=True, items=3)
    with pytest.raises(etc.GraphError, match="items=2 runs one TMA ring .*prefetch=True"):
        attention_mma(4096, 32, 8, 64, 16, pipeline="none", items=2)
    with pytest.raises(etc.GraphError, match="items=2 runs one TMA ring .*prefetch=True"):
        attention_mma(4096, 32, 8, 64, 16, pipeline="tma", items=2)
    with pytest.raises(etc.GraphError, match="items=0 must be an int >= 1"):
        attention_mma(4096, 32, 8, 64, 16, pipeline="tma", items=0)
    with pytest.raises(etc.GraphError, match="attn_items=3 does not divide kv_heads=2"):
        dataclasses.replace(cfg, attn_items=3)
    with pytest.raises(etc.GraphError, match="attn_items=2 needs attn_tile='mma'"):
        dataclasses.replace(cfg, attn_tile="online", attn_pipeline="none")
    with pytest.raises(etc.GraphError, match="attn_items=2 needs .*attn_tma_prefetch"):
        dataclasses.replace(cfg, attn_tma_prefetch=False)


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_tma_fed_mma_attention_decoder_matches_the_numpy_model(schedule):
    """attn_pipeline="tma": the attention tile takes the caches' TMA maps
    (declared by the graph, zeros for the simulator's references) and its
    reference is the other tiles'; the graph's maps box a loop step's rows."""
    cfg = dataclasses.replace(
        CFG, attn_tile="mma", attn_unroll=1, attn_pipeline="tma", head_dim=64, heads=4,
        kv_heads=2, combine_group=4,
    )  # fmt: skip
    g = M.build_decoder_graph(cfg)
    maps = {t.name: t for t in g.tensors if t.map_of is not None}
    assert {(m.map_of.name, m.map_box) for m in maps.values()} >= {
        ("k_cache", (128, 64)), ("v_cache", (128, 64))
    }  # fmt: skip
    weights = M.random_weights(cfg, seed=3)
    for B, L in ((1, 0), (3, 200)):
        _check_step(cfg, g, weights, B, L, schedule, 29)
    from etc.tiles.attention_mma import attention_mma

    # Thread 0 issues a K and a V box for each of the first `stages` steps,
    # then one pair per loop step; the warps' loads come from the ring.
    for stages in (2, 3):
        source = attention_mma(4096, 32, 8, 64, 16, blocks=1, pipeline="tma", stages=stages).source
        assert source.count("cp.async.bulk.tensor.2d") == 2 * stages + 2
        assert source.count("mbarrier.init") == source.count("mbarrier.inval") == 2 * stages
        assert "vector.load %kc" not in source and source.count("vector.load %ring") == 8
    # prefetch: the ring starts in @attention__prefetch, before the waits.
    fn = attention_mma(4096, 32, 8, 64, 16, blocks=1, pipeline="tma", stages=2, prefetch=True)
    assert fn.prefetch == "attention__prefetch" and fn.prefetch_fills_shared
    body, pf = fn.source.split("func.func @attention__prefetch(")
    assert pf.count("mbarrier.init") == 4 and "mbarrier.init" not in body
    assert pf.count("cp.async.bulk.tensor.2d") == 4 and body.count("cp.async.bulk.tensor.2d") == 2
    assert "%qkv[" not in pf  # nothing the QKV projection writes
    with pytest.raises(etc.GraphError, match="prefetch starts the TMA ring: needs pipeline='tma'"):
        attention_mma(512, 8, 2, 64, 2, prefetch=True)
    with pytest.raises(etc.GraphError, match="attn_tma_prefetch must be a bool, got 1"):
        dataclasses.replace(cfg, attn_tma_prefetch=1)
    with pytest.raises(etc.GraphError, match="gemv_whole_lines must be a bool, got 1"):
        dataclasses.replace(M.TINY, gemv_whole_lines=1)
    with pytest.raises(etc.GraphError, match="tma_rotate_k must be a bool, got 'yes'"):
        dataclasses.replace(cfg, tma_rotate_k="yes")
    with pytest.raises(etc.GraphError, match="attn_tma_stages must be an int >= 2, got 1"):
        dataclasses.replace(cfg, attn_tma_stages=1)
    with pytest.raises(etc.GraphError, match="attn_pipeline applies to attn_tile='mma'"):
        dataclasses.replace(CFG, attn_pipeline="auto")
    with pytest.raises(etc.GraphError, match="pipeline='tma' .* needs head_dim=64"):
        attention_mma(512, 8, 2, 32, 2, pipeline="tma")
    with pytest.raises(etc.GraphError, match="stages=1 must be an int >= 2"):
        attention_mma(512, 8, 2, 64, 2, pipeline="tma", stages=1)


def test_projection_options_mark_one_projection_evict_first():
    """``projection_options``' ``l2_evict_first`` reaches that projection's
    tile only: ``"body"`` on the LM head marks its own copies and leaves its
    ring fill and every other tile as without it; a bad value is refused
    naming the tile."""
    opts = (("lm_head", (("l2_evict_first", "body"),)),)
    plain = {t.name: t.function.source for t in M.build_decoder_graph(CFG).tasks}
    marked = {
        t.name: t.function.source
        for t in M.build_decoder_graph(dataclasses.replace(CFG, projection_options=opts)).tasks
    }
    assert [n for n in plain if plain[n] != marked[n]] == ["lm_head"]
    body, fill = marked["lm_head"].split("func.func @lm_head__prefetch(")
    assert "L2::cache_hint" in body and "createpolicy" not in fill
    assert fill == plain["lm_head"].split("func.func @lm_head__prefetch(")[1]
    bad = dataclasses.replace(CFG, projection_options=(("o_proj", (("l2_evict_first", "yes"),)),))
    with pytest.raises(etc.GraphError, match="'o_proj': l2_evict_first must be a bool or 'body'"):
        M.build_decoder_graph(bad)


@needs_ptxas
def test_kv_evict_first_marks_every_ring_copy():
    """attention_mma(kv_evict_first=True): every K and V box's TMA copy,
    in the prefetch function and the loop, carries the evict-first hint with
    its policy operand; the copies' count does not change; ptxas takes the
    decoder's kernel; other pipelines refuse it by name."""
    from etc.tiles.attention_mma import attention_mma

    opts = dict(blocks=1, pipeline="tma", stages=2, prefetch=True, release="read_early")
    plain = attention_mma(4096, 32, 8, 64, 16, **opts).source
    marked = attention_mma(4096, 32, 8, 64, 16, kv_evict_first=True, **opts).source
    copies = [line for line in marked.splitlines() if "cp.async.bulk.tensor.2d" in line]
    assert len(copies) == plain.count("cp.async.bulk.tensor.2d") == 6
    assert all(".L2::cache_hint [$0], [$1, {$2, $3}], [$4], $5;" in c for c in copies)
    assert "cache_hint" not in plain and "createpolicy" not in plain
    assert marked.count("createpolicy.fractional.L2::evict_first") >= 2
    cfg = dataclasses.replace(
        CFG, attn_tile="mma", attn_unroll=1, attn_pipeline="tma", head_dim=64, heads=4,
        kv_heads=2, combine_group=4, attn_tma_prefetch=True, attn_kv_evict_first=True,
    )  # fmt: skip
    ptx = etc.compile(M.build_decoder_graph(cfg), schedule="static").ptx
    assert ptx.count("createpolicy.fractional.L2::evict_first") >= 2
    with pytest.raises(etc.GraphError, match="kv_evict_first marks the TMA ring's copies"):
        attention_mma(512, 8, 2, 64, 2, kv_evict_first=True)
    with pytest.raises(
        etc.GraphError, match="'attention': kv_evict_first must be a bool, got 'on'"
    ):
        attention_mma(4096, 32, 8, 64, 16, kv_evict_first="on", **opts)
    # No ring (the phased tile): nothing to mark.
    phased = dataclasses.replace(CFG, attn_kv_evict_first=True)
    graph = M.build_decoder_graph(phased)
    assert not any("cache_hint" in t.function.source for t in graph.tasks)
    with pytest.raises(etc.GraphError, match="attn_kv_evict_first must be a bool, got 1"):
        dataclasses.replace(cfg, attn_kv_evict_first=1)


def test_tma_attention_release_after_reads():
    """release="read": each warp gives its stage back between its ring reads
    and its first mma (a warp sync first), and thread 0 refills the same
    stage, after ("read") or before ("read_early") its arithmetic; the
    copies per step are those of the default; bad modes are refused."""
    from etc.tiles.attention_mma import attention_mma

    def step_body(release: str) -> str:
        src = attention_mma(4096, 32, 8, 64, 16, blocks=1, pipeline="tma", release=release).source
        return src[src.index("vector.load %ring") :]

    math_body = step_body("math")
    assert "bar.warp.sync" not in math_body
    assert math_body.index("mma.sync") < math_body.index("mbarrier.arrive.shared")
    for release in ("read", "read_early"):
        body = step_body(release)
        last_read = body.rindex("vector.load %ring")
        sync, arrive = body.index("bar.warp.sync"), body.index("mbarrier.arrive.shared")
        copy, first_mma = body.index("cp.async.bulk.tensor.2d"), body.index("mma.sync")
        assert last_read < sync < arrive < first_mma
        assert (copy < first_mma) == (release == "read_early")
        assert body.count("cp.async.bulk.tensor.2d") == math_body.count("cp.async.bulk.tensor.2d")
        # The refill's stage is the step's own (%tma_i), not the one before.
        assert "arith.subi %tma_i, %c1" not in body
    with pytest.raises(etc.GraphError, match="release 'soon' is not one of math, read, read_early"):
        attention_mma(512, 8, 2, 64, 2, pipeline="tma", release="soon")
    with pytest.raises(etc.GraphError, match="release='read' gives back TMA ring stages"):
        attention_mma(512, 8, 2, 64, 2, release="read")
    with pytest.raises(etc.GraphError, match="attn_tma_release"):
        dataclasses.replace(CFG, attn_tma_release="early")


def test_batch_buckets_change_only_the_tiles():
    """Each kernel differs by its bucket's fields alone and takes the same
    tensors; a bad bucket is refused, naming it."""
    buckets = M.LLAMA_3_2_1B.bucket_configs()
    assert [b for b, _ in buckets] == [1, 8, 16, None]
    one, few, mid, large = (c for _, c in buckets)
    assert all(c.batch_buckets == () for c in (one, few, mid, large))
    # B = 2..8 also calls its embedding (ptxas codes the rest tighter, item 278).
    assert few == dataclasses.replace(
        mid, max_batch=8, gemv_block=8, bn_lm=128, outline=("attention", "embed")
    )
    assert one.attn_unroll == 2
    assert (one.attn_tile, mid.attn_tile, mid.outline) == ("phased", "mma", ("attention",))
    # Every kernel shares the split counts (one set of buffers): B=1 spans of
    # attn_single_span, then attn_small_spans' tiers up to B=16 (spans of
    # 128 up to B=4, 512 up to 8, 384 up to 11, 256 up to 16, at most 16, 8,
    # 4, 3 and 2 splits), then attn_chunk. The tensor-core tile holds no
    # span: spans of the L cached positions, position L in the last (L =
    # 4096: one split, not two).
    assert [M.LLAMA_3_2_1B.splits(1024, b) for b in (1, 2, 8, 11, 16, 17)] == [17, 8, 2, 3, 2, 1]
    assert [M.LLAMA_3_2_1B.splits(8192, b) for b in (2, 3, 5, 9, 16, 17)] == [16, 8, 4, 3, 2, 2]
    assert [M.LLAMA_3_2_1B.splits(256, b) for b in (2, 3, 5, 9, 16)] == [2, 2, 1, 1, 1]
    assert [M.LLAMA_3_2_1B.splits(L, 64) for L in (0, 1, 4095, 4096, 4097, 8193)] == [
        1, 1, 1, 1, 2, 3
    ]  # fmt: skip
    for _, c in buckets:
        assert [c.splits(1024, b) for b in (1, 2, 16, 17)] == [17, 8, 2, 1]
    # The small kernels' own tiles hold a span (their counts are ceil((L+1)/span)
    # past B=16, which their batch bound never lets them run); over the batches
    # each kernel runs, all agree.
    for L in (0, 255, 256, 4095, 4096, 8192):
        for bound, c in buckets:
            for b in range(1, (bound or 64) + 1):
                assert c.splits(L, b) == M.LLAMA_3_2_1B.splits(L, b), (bound, L, b)
    # B = 1's phased kernel folds its argmax, so every kernel declares the keys.
    assert mid == dataclasses.replace(
        M.LLAMA_3_2_1B, batch_buckets=(), max_batch=16, attn_cached_splits=True,
        attn_counters=True, argmax_keys=True, **dict(M.SMALL_BATCH),
    )  # fmt: skip
    assert not mid.argmax_fused and mid.key_buffer
    assert mid.wait_memo and not one.wait_memo and not large.wait_memo
    # B = 1 one row a gemv tile, B = 2..8 8 rows, 9..16 16 rows (mma.sync,
    # never fewer than 9 rows: no 8-row path), then the tma core.
    cores = [c.core("down_proj") for c in (one, few, mid, large)]
    assert cores == ["gemv", "gemv", "gemv", "tma"]
    assert [c.gemm_block("down_proj") for c in (one, few, mid, large)] == [1, 8, 16, 64]
    assert not mid.gemv_short_path
    with pytest.raises(etc.GraphError, match="attn_cached_splits makes splits longer"):
        dataclasses.replace(PHASED_1B, attn_cached_splits=True)
    # The kernels know their batch ranges; the base's own graph is the
    # B = 2..16 kernel's, whose tensor-core tile takes any batch; a phased
    # base's own graph holds 512 positions, not 4096: the small batches.
    assert [c.kernel_max_batch for _, c in buckets] == [1, 8, 16, None]
    assert M.LLAMA_3_2_1B.kernel_max_batch is None
    phased_base = dataclasses.replace(PHASED_1B, batch_buckets=M.LLAMA_3_2_1B.batch_buckets)
    assert phased_base.kernel_max_batch == 16
    assert PHASED_1B.kernel_max_batch is None and PHASED_1B.splits(1024, 17) == 3
    assert (large.gemm_core, large.bn_gu, large.attn_tile) == ("tma", 64, "mma")
    # The large kernel's attention is fed by TMA where the heads have 64 dims.
    assert large.attention_pipeline == "tma" and one.attention_pipeline == "none"
    tiny_large = dataclasses.replace(CFG, batch_buckets=(), **dict(M.LARGE_BATCH))
    assert CFG.head_dim != 64 and tiny_large.attention_pipeline == "none"
    # ... and its KV ring evict-first there only (no ring, nothing to mark).
    assert large.attn_kv_evict_first and tiny_large.attn_kv_evict_first
    tasks = M.build_decoder_graph(tiny_large).tasks
    assert not any("cache_hint" in t.function.source for t in tasks if t.name == "attention")
    assert {p: large.k_split(p) for p in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")} == {
        "qkv_proj": 4,
        "o_proj": 4,
        "gate_up_proj": 2,
        "down_proj": 8,
    }
    assert mid.k_split("down_proj") == mid.k_split("gate_up_proj") == 1
    assert large.gemm_block("qkv_proj") == 64
    assert M.tensor_shapes(one, 4, 9, 10) == M.tensor_shapes(large, 4, 9, 10)
    assert M.TINY.bucket_configs() == [(None, M.TINY)]
    with pytest.raises(etc.GraphError, match="batch bucket B <= 4 changes \\['block_n'\\]"):
        M.LlamaConfig(batch_buckets=((4, (("block_n", 32),)), (None, ())))
    with pytest.raises(etc.GraphError, match="bounds must be increasing"):
        M.LlamaConfig(batch_buckets=((4, ()), (4, ()), (None, ())))
    with pytest.raises(etc.GraphError, match="bounds must be increasing .* got \\[4\\]"):
        M.LlamaConfig(batch_buckets=((4, ()),))
    with pytest.raises(etc.GraphError, match="bn_gu=48 does not divide .* the last batch bucket"):
        M.LlamaConfig(batch_buckets=((4, ()), (None, (("bn_gu", 48),))))


def test_context_buckets_split_the_one_sequence_kernel_by_l():
    """The default's B = 1 kernel is two: the phased attention up to
    L = 1087, the tensor-core one (TMA, called) past it; both take the same
    buffers. Changes that would give them other buffers are refused, naming
    the bucket."""
    cfg = M.LLAMA_3_2_1B
    kernels = cfg.kernel_configs()
    assert [(b, lb) for b, lb, _ in kernels] == [
        (1, 1087), (1, None), (8, None), (16, None), (None, None)
    ]  # fmt: skip
    short, long, few, mid, large = (k for *_, k in kernels)
    assert (short.attn_tile, long.attn_tile) == ("phased", "mma")
    assert long.attention_pipeline == "tma" and long.attn_tma_release == "read_early"
    assert "attention" in long.outline and "attention" not in short.outline
    assert all(k.context_buckets == () and k.max_batch == 1 for k in (short, long))
    # L2 evict-first weight copies asked for in the B = 2..16 and large
    # kernels (marking nothing in the B = 2..16 kernels' projections, on the
    # gemv core like B = 1's); their KV rings evict-first too.
    assert [k.gemm_core for k in (short, long, few, mid)] == ["gemv"] * 4
    hinted = [False, False, True, True, True]
    assert [k.weights_evict_first for k in (short, long, few, mid, large)] == hinted
    assert [k.attn_kv_evict_first for k in (short, long, few, mid, large)] == hinted
    # Set on the base it reaches every kernel (the large one's TMA weight
    # boxes too).
    on_all = dataclasses.replace(cfg, weights_evict_first=True)
    assert all(k.weights_evict_first for *_, k in on_all.kernel_configs())
    cases = ((1, 0), (1, 1087), (1, 1088), (2, 0), (8, 9), (9, 0), (17, 5))
    assert [cfg.kernel_for(B, L) for B, L in cases] == [
        short, short, long, few, few, mid, large
    ]  # fmt: skip
    for L in (0, 64, 1087, 1088, 4096, 8192):
        assert short.splits(L, 1) == long.splits(L, 1) == cfg.splits(L, 1), L
    # The bound: the last L whose 17 splits are at most 64 positions (one
    # loop step of the phased tile).
    assert short.attn_single_span * short.attn_single_splits == M.SINGLE_SEQUENCE_CONTEXT + 1
    assert cfg.splits(1087, 1) == 17 and -(-1088 // 17) == 64 and -(-1089 // 17) == 65
    assert M.tensor_shapes(short, 1, 1300, 1301) == M.tensor_shapes(long, 1, 1300, 1301)
    with pytest.raises(etc.GraphError, match="context bucket L <= 64 changes attn_single_span, "
                       "but the kernels share their buffers"):  # fmt: skip
        dataclasses.replace(CFG, context_buckets=((64, (("attn_single_span", 3),)), (None, ())))
    with pytest.raises(etc.GraphError, match="context_buckets' bounds must be increasing"):
        dataclasses.replace(CFG, context_buckets=((64, ()), (32, ()), (None, ())))
    with pytest.raises(etc.GraphError, match="the last context bucket changes \\['block_n'\\]"):
        dataclasses.replace(CFG, context_buckets=((64, ()), (None, (("block_n", 32),))))
    with pytest.raises(etc.GraphError, match="changes batch_buckets: split by B first"):
        dataclasses.replace(CFG, context_buckets=((64, (("batch_buckets", ()),)), (None, ())))
    with pytest.raises(etc.GraphError, match="context_buckets must be \\(\\(bound, changes\\)"):
        dataclasses.replace(CFG, context_buckets=(64, None))
    # Every context kernel keeps the configuration's split counts, whatever
    # its tile's own default: a phased kernel cannot take the tensor-core
    # tile's cached-position spans.
    phased_l = (("attn_tile", "phased"), ("attn_unroll", 4), ("attn_pipeline", "none"))
    with pytest.raises(etc.GraphError, match="attn_cached_splits makes splits longer .*"
                       "in the kernel of context bucket L <= 8"):  # fmt: skip
        dataclasses.replace(
            CFG, attn_tile="mma", attn_unroll=1, context_buckets=((8, phased_l), (None, ()))
        )
    by_tile = dataclasses.replace(
        CFG, context_buckets=((8, ()), (None, (("attn_tile", "mma"), ("attn_unroll", 1))))
    )
    (_, phased), (_, mma) = by_tile.context_configs()
    assert not mma.cached_splits and mma.attn_chunk == phased.attn_chunk == CFG.attn_chunk
    assert M.tensor_shapes(phased, 3, 50, 60) == M.tensor_shapes(mma, 3, 50, 60)
    # Inside a batch bucket: the error names both.
    inner = (("context_buckets", ((8, ()), (None, (("bn_gu", 48),)))),)
    with pytest.raises(
        etc.GraphError, match="bn_gu=48 .* the last context bucket.* batch bucket B <= 1"
    ):
        dataclasses.replace(CFG, batch_buckets=((1, inner), (None, ())))


def test_phased_span_sizes_the_short_one_sequence_kernel():
    """B = 1 up to L = 1087 runs 17 splits of at most 64 positions, so its
    phased tile's buffers hold 64 (not the artifact's 512): the cached K and
    V copies its prefetch function issues take 16 KB of shared memory.
    The kernel's graph bounds L there, so it cannot run a longer split; a
    span that some L up to the bound would outgrow is refused, naming it."""
    short, long = (k for b, lb, k in M.LLAMA_3_2_1B.kernel_configs() if b == 1)
    assert (short.max_context, long.max_context) == (M.SINGLE_SEQUENCE_CONTEXT, None)
    assert short.phased_tile_span == 64 and short.attn_prefetch_kv is True
    # Both fold their argmax into the LM head (no argmax parts to merge);
    # the tensor-core one calls its embedding, without which the fold
    # spilled its main function (item 278).
    assert short.argmax_fused and long.argmax_fused and short.key_buffer
    for kernel in (short, long):
        assert "argmax_merge" not in {t.name for t in M.build_decoder_graph(kernel).tasks}
    assert "embed" in long.outline and "embed" not in short.outline
    assert dataclasses.replace(short, attn_phased_span=0).phased_tile_span == 512
    graph = M.build_decoder_graph(short)
    assert {s.name: s.max for s in graph.symbols}["L"] == M.SINGLE_SEQUENCE_CONTEXT
    assert {s.name: s.max for s in M.build_decoder_graph(long).symbols}["L"] is None
    attention = next(t for t in graph.tasks if t.name == "attention").function
    # 2 phases x 2 row loads x 256 threads x 16 bytes (i32 words), in the
    # prefetch function's copies and the body's reads.
    assert "memref<4096xi32" in attention.source and attention.prefetch_fills_shared
    assert (
        "memref<32768xi32"
        in M.build_decoder_graph(dataclasses.replace(short, attn_phased_span=0))
        .tasks[[t.name for t in graph.tasks].index("attention")]
        .function.source
    )
    bucket = dict(dict(M.LLAMA_3_2_1B.batch_buckets)[1])
    (bound, changes), rest = bucket["context_buckets"]

    def one(changes, bound=bound):
        return dataclasses.replace(
            M.LLAMA_3_2_1B,
            batch_buckets=((1, (*M.SINGLE_SEQUENCE, ("context_buckets", ((bound, changes), rest)))),
                           *M.LLAMA_3_2_1B.batch_buckets[1:]),
        )  # fmt: skip

    with pytest.raises(etc.GraphError, match=r"attn_phased_span=32: at L = 32 the 1 splits of at "
                       r"most 32 positions do not hold the 33 positions \(L <= 1087\)"):  # fmt: skip
        one((("attn_phased_span", 32),))
    with pytest.raises(etc.GraphError, match="at L = 1088 the 17 splits"):
        one(changes, bound=1088)
    with pytest.raises(etc.GraphError, match="attn_phased_span=96 must be a multiple of the "
                       r"tile's loop step \(64 positions\)"):  # fmt: skip
        one((("attn_phased_span", 96),))
    with pytest.raises(etc.GraphError, match="attn_phased_span=64 sizes the phased attention of a "
                       "kernel of one sequence and bounded L.*max_context=None"):  # fmt: skip
        dataclasses.replace(short, max_context=None)
    with pytest.raises(etc.GraphError, match="attn_phased_span must be an int >= 0, got -1"):
        dataclasses.replace(short, attn_phased_span=-1)
    with pytest.raises(etc.GraphError, match="batch bucket B <= 1 changes"):
        dataclasses.replace(M.LLAMA_3_2_1B, batch_buckets=((1, (("max_context", 9),)), (None, ())))
    # A tile shorter than the span holds at most its own buffers.
    tiny = dataclasses.replace(M.TINY, batch_buckets=(M.LLAMA_3_2_1B.batch_buckets[0], (None, ())))
    assert tiny.kernel_for(1, 5).phased_tile_span == 8 == M.TINY.attn_chunk
    # In the simulator: the tiny decoder with B = 1's 8-position splits held
    # by an 8-position tile (its artifact-wide buffers hold 64), K and V
    # copied before the waits.
    for L in (39, 40):  # the bound, and past it (the other kernel)
        check_decoder_step(TINY_SHORT.kernel_for(1, L), 1, L)
    assert TINY_SHORT.kernel_for(1, 39).phased_tile_span == 8


@needs_ptxas
def test_compile_decoder_splits_a_batch_bucket_by_context(tmp_path):
    """A batch bucket with context buckets compiles to buckets within
    buckets; the launch picks by B, then by L."""
    by_context = (("context_buckets", ((8, ()), (None, M.SINGLE_SEQUENCE_LONG))),)
    cfg = dataclasses.replace(
        CFG, head_dim=64, heads=4, kv_heads=2, combine_group=4,
        batch_buckets=((1, (*M.SINGLE_SEQUENCE, *by_context)), (None, ())),
    )  # fmt: skip
    art = M.compile_decoder(cfg, "static")
    assert art.symbol == "B" and art.bounds == [1, None]
    assert art.artifacts[0].symbol == "L" and art.artifacts[0].bounds == [8, None]
    (w0, short), (w1, long), (w2, rest) = art.leaves()
    assert (w0, w1, w2) == ("B<=1, L<=8", "B<=1, L=9..", "B=2..")
    # Each kernel refuses a launch past its bounds on its own (L past 8 for
    # the short one; the runtime reads these maxima from the manifest).
    assert short.manifest["symbol_max"] == {"B": 1, "L": 8}
    assert long.manifest["symbol_max"] == {"B": 1} and "symbol_max" not in rest.manifest
    # The long-context kernel's attention: the tensor-core tile fed by TMA, called.
    assert "call.uni attention," in long.ptx and "cp.async.bulk.tensor" in long.ptx
    assert "call.uni attention," not in short.ptx and "cp.async.bulk.tensor" not in short.ptx
    # Both take B = 1's projections on the gemv core, called, with no L2 hint.
    for ptx in (short.ptx, long.ptx):
        assert "call.uni down_proj," in ptx and "L2::cache_hint" not in ptx
    assert all(a.cubin is not None for _, a in art.leaves())
    art.save(tmp_path)
    assert (tmp_path / "bucket0" / "buckets.json").exists()
    assert (tmp_path / "bucket0" / "bucket1" / "kernel.ptx").exists()


@needs_ptxas
def test_compile_decoder_gives_tiered_context_kernels_one_set_of_buffers():
    """The tiny decoder whose B = 1 split count is tiered by context
    compiles to three B = 1 kernels that take the same buffers (the
    partials sized by the tiered count), each bounded in L."""
    art = M.compile_decoder(TINY_TIERS, "static")
    assert art.artifacts[0].bounds == [15, 47, None]
    maxima = [a.manifest.get("symbol_max") for _, a in art.leaves()]
    assert maxima == [{"B": 1, "L": 15}, {"B": 1, "L": 47}, {"B": 1}, None]


@needs_ptxas
def test_compile_decoder_makes_one_kernel_per_batch_range(tmp_path):
    cfg = dataclasses.replace(CFG, batch_buckets=((2, ()), (None, M.LARGE_BATCH)))
    art = M.compile_decoder(cfg, "static")
    assert art.symbol == "B" and art.bounds == [2, None]
    assert all(a.cubin is not None for a in art.artifacts)
    assert art.artifacts[0].ptx != art.artifacts[1].ptx
    # LARGE_BATCH calls its tiles (outline=True); the other kernel inlines them.
    assert "call.uni attention," in art.artifacts[1].ptx
    assert "call.uni" not in art.artifacts[0].ptx
    art.save(tmp_path)
    assert (tmp_path / "buckets.json").exists()


def test_a_change_a_bucket_kernel_cannot_take_says_so():
    # The first kernel that cannot: B = 1's past L = 1087 (the tensor-core tile).
    with pytest.raises(
        etc.GraphError,
        match="attn_stage_v .*in the kernel of the last context bucket: .*"
        "in the kernel of batch bucket B <= 1: ",
    ):
        dataclasses.replace(
            PHASED_1B, attn_stage_v=True, batch_buckets=M.LLAMA_3_2_1B.batch_buckets
        )
    with pytest.raises(etc.GraphError, match="changes attn_counters, but the kernels share"):
        dataclasses.replace(PHASED_1B, batch_buckets=((1, (("attn_counters", False),)), (None, ())))
    with pytest.raises(etc.GraphError, match="in the kernel of the last batch bucket: .*"):
        dataclasses.replace(
            PHASED_1B, attn_stage_v=True, batch_buckets=M.LLAMA_3_2_1B.batch_buckets[1:]
        )
    with pytest.raises(etc.GraphError, match="fuse_combine counts one kv head .*attn_items=2"):
        dataclasses.replace(M.LLAMA_3_2_1B, fuse_combine=True, attn_items=2)


def test_single_span_is_checked():
    with pytest.raises(
        etc.GraphError, match="attn_single_span=600 must be in 0..512 .*attn_phased_chunk=512"
    ):
        M.LlamaConfig(attn_single_span=600)
    with pytest.raises(etc.GraphError, match="attn_phased_chunk must be an int >= 1, got 0"):
        M.LlamaConfig(attn_phased_chunk=0)


def test_the_split_counts_parse_as_manifest_sizes():
    """The runtime parses every size the compiler writes (a wait count is
    the split count times the kv heads), and reads the same value."""
    from etc.runtime.sizes import parse_size

    g = etc.Graph("sizes")
    B, L = g.symbol("B"), g.symbol("L")
    expr = M.LLAMA_3_2_1B.splits(L, B) * M.LLAMA_3_2_1B.kv_heads
    size = parse_size(str(expr), ["B", "L"])
    # Past B=16 the tensor-core kernel's spans of attn_chunk=4096 over the
    # cached positions (position L in the last).
    cases = [(1, 1024, 17), (2, 1024, 8), (8, 1024, 2), (16, 1024, 2), (17, 1024, 1), (64, 4096, 1)]
    cases += [(17, 0, 1), (64, 4097, 2), (64, 8192, 2), (64, 8193, 3)]
    # B=1: spans of 64 up to 17 splits, never fewer splits than spans of 256;
    # B=2 at most 16, B=8 at most 4 splits (of at least 512).
    cases += [(1, 0, 1), (1, 100, 2), (1, 4096, 17), (1, 8191, 32), (2, 8191, 16), (2, 0, 1)]
    cases += [(8, 4096, 4), (8, 200, 1), (11, 4096, 3)]
    for b, L, want in cases:
        assert size.evaluate({"B": b, "L": L}) == 8 * want, (b, L)
        assert M.LLAMA_3_2_1B.splits(L, b) == want


def test_single_sequence_split_tier_matches_the_numpy_model(weights):
    """B=1's own split count (up to 5 spans of 3, rounded up to the tile's
    loop step) and B=2's (spans of 8), through the simulator."""
    cfg = dataclasses.replace(
        CFG, attn_small_batch=2, attn_small_span=8, attn_small_spans=(), attn_single_span=3,
        attn_single_splits=5,
    )  # fmt: skip
    assert [cfg.splits(30, 1), cfg.splits(7, 1), cfg.splits(30, 2)] == [5, 3, 4]
    g = M.build_decoder_graph(cfg)
    for B, L in ((1, 30), (1, 7), (2, 30)):
        _check_step(cfg, g, weights, B, L, "static", 31)


def test_single_tiers_give_each_context_kernel_its_split_count():
    """attn_single_tiers: B = 1's split count by context, so each context
    bucket's kernel has its own (the long kernel keeps its count past a
    short tier's bound); the manifest's size expression reads the integer
    count; the kernels at and past each bound match the numpy model;
    mistakes are refused by name."""
    from etc.runtime.sizes import parse_size

    cfg = TINY_TIERS
    assert [cfg.splits(L, 1) for L in (0, 15, 16, 47, 48, 100)] == [1, 2, 2, 3, 5, 5]
    assert [TINY_SHORT.splits(L, 1) for L in (16, 47)] == [3, 5]
    g = etc.Graph("tiers")
    size = parse_size(str(cfg.splits(g.symbol("L"), g.symbol("B"))), ["B", "L"])
    for B in (1, 2, 3):
        for L in range(0, 130, 3):
            assert size.evaluate({"B": B, "L": L}) == cfg.splits(L, B), (B, L)
            assert cfg.splits(L, B) == TINY_SHORT.splits(L, B) or B == 1
    spans = [cfg.kernel_for(1, L).phased_tile_span for L in (15, 16, 47)]
    assert spans == [8, 16, 16] and cfg.kernel_for(1, 48).max_context is None
    assert dict(cfg.kernel_for(1, 16).deal_slots) == {"attention": 10}
    for L in (15, 16, 47, 48):  # both sides of each bound
        check_decoder_step(cfg.kernel_for(1, L), 1, L)
    # Llama-3.2-1B with the sweep's tiers: nine splits of up to 128 from L =
    # 576 to 1151 only.
    tiered = dataclasses.replace(
        M.LLAMA_3_2_1B, batch_buckets=(), attn_single_tiers=((575, 64, 17), (1151, 128, 9))
    )
    counts = [tiered.splits(L, 1) for L in (575, 576, 1024, 1151, 1152, 2048)]
    assert counts == [9, 5, 9, 9, 17, 17]
    for bad in (((15, 8),), ((15, 8, 0),), ((47, 8, 5), (15, 8, 5)), ((15, 65, 5),), [(1, 8, 2)]):
        with pytest.raises(etc.GraphError, match=r"attn_single_tiers=.* must be \(context, span, "
                           r"most\) triples .* spans in 0\.\.64"):  # fmt: skip
            dataclasses.replace(TINY_SHORT, attn_single_tiers=bad)
    with pytest.raises(etc.GraphError, match="attn_single_span=0 turns off"):
        dataclasses.replace(CFG, attn_single_tiers=((15, 8, 5),))
    with pytest.raises(etc.GraphError, match="context bucket L <= 15 changes attn_single_tiers, "
                       "but the kernels share their buffers"):  # fmt: skip
        dataclasses.replace(
            TINY_SHORT, batch_buckets=(),
            context_buckets=((15, (("attn_single_tiers", ((7, 8, 1),)),)), (None, ())),
        )  # fmt: skip
    # A tier whose splits outgrow its kernel's tile is refused, naming L.
    with pytest.raises(etc.GraphError, match=r"attn_phased_span=8: at L = 8 the 1 splits of at "
                       r"most 8 positions do not hold the 9 positions \(L <= 15\)"):  # fmt: skip
        dataclasses.replace(TINY_TIERS, attn_single_tiers=((47, 16, 3),))


def test_attn_cluster_meets_a_kv_heads_splits_on_one_cluster(tmp_path):
    """attn_cluster: B = 1's short kernel takes exactly 4 splits a kv head
    at every L (a tier of span 0) and runs each head's as one group of a
    thread-block cluster of 4, the others pushing their partials into rank
    0's shared memory; its static lists simulate to the numpy model's step;
    the dynamic schedule's kernel meets the same splits through the L2; a
    split count that is not the cluster's, or a kernel that is not one
    sequence's of bounded L, is refused by name."""
    cfg = llama_tiny_variants()["llama_tiny_context_cluster"]
    assert [cfg.splits(L, 1) for L in (0, 5, 39, 40, 100)] == [4, 4, 4, 5, 5]
    short = cfg.kernel_for(1, 39)
    assert short.attn_cluster == 4 and cfg.kernel_for(1, 40).attn_cluster == 0
    g = M.build_decoder_graph(short)
    attention = next(t for t in g.tasks if t.name == "attention")
    assert (
        attention.function.cluster == 4 and "st.async.shared::cluster" in attention.function.source
    )
    weights = M.random_weights(short, seed=3)
    for L, ctas in ((0, 8), (7, 4), (39, 12)):  # groups across the deal's CTAs
        _check_step(short, g, weights, 1, L, "static", 11, num_ctas=ctas)
    static = M.compile_decoder(cfg, "static", name="llama_tiny", cubin=False)
    dynamic = M.compile_decoder(cfg, "dynamic", name="llama_tiny", cubin=False)
    kernels = {s: a.leaves()[0][1] for s, a in (("static", static), ("dynamic", dynamic))}
    assert "barrier.cluster.wait" in kernels["static"].ptx
    assert "st.async" not in kernels["dynamic"].ptx and "atom.acq_rel.gpu" in kernels["dynamic"].ptx
    for bad, message in (
        (dict(attn_cluster=3), "attn_cluster=3: a thread-block cluster of 2, 4, 8 CTAs"),
        (dict(attn_cluster=8), "at L = 0 B = 1 takes 4 splits, not 8"),
        (dict(attn_cluster=4, max_batch=None), "of a kernel of one sequence and bounded L"),
        (dict(attn_cluster=4, attn_one_pass=True), "not attn_one_pass"),
    ):
        with pytest.raises(etc.GraphError, match=re.escape(message)):
            dataclasses.replace(short, **bad)


# -- ragged batches (LlamaConfig.ragged) ------------------------------------------------


def _alone(cfg, arrays, b: int, L: int) -> dict:
    """Sequence ``b`` of a ragged batch's ``arrays`` decoded alone at its
    position ``L`` (the unragged graph of ``cfg``, B = 1)."""
    plain = dataclasses.replace(cfg, ragged=False)
    S = arrays["rope"].shape[0]
    one = M.numpy_inputs(plain, M.random_weights(plain, seed=3), arrays["tokens"][b : b + 1], L, S)
    for k in ("k_cache", "v_cache"):
        one[k][...] = arrays[k][:, b : b + 1]
    return etc.simulate(M.build_decoder_graph(plain), one, {"B": 1, "L": L, "S": S})


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_ragged_batch_decodes_each_sequence_at_its_own_position(schedule):
    """LlamaConfig.ragged: each sequence at its own position (``lengths``),
    the graph's L the longest. The step matches the numpy model, each
    sequence's logits and cache are those of the sequence decoded alone at
    its position (bit for bit: its splits past its position are empty), and
    a batch at one position is the unragged graph's step bit for bit."""
    cfg = dataclasses.replace(CFG, ragged=True)
    g = M.build_decoder_graph(cfg)
    assert M.tensor_shapes(cfg, 3, 20, 23)["lengths"] == ((3,), "i32")
    weights = M.random_weights(cfg, seed=3)
    tokens = np.array([5, 77, 300], np.int32)
    lengths = [7, 0, 20]
    arrays = M.numpy_inputs(cfg, weights, tokens, 20, 23, lengths=lengths)
    out = etc.simulate(g, arrays, {"B": 3, "L": 20, "S": 23}, schedule=schedule)
    ref = M.reference_step(cfg, arrays, 20)
    np.testing.assert_array_equal(bf16_to_f32(out["logits"]), ref["logits"])
    for b, p in enumerate(lengths):
        alone = _alone(cfg, arrays, b, p)
        np.testing.assert_array_equal(out["logits"][b], alone["logits"][0])
        np.testing.assert_array_equal(out["k_cache"][:, b], alone["k_cache"][:, 0])
        # Only position p of the sequence's cache rows changed.
        changed = np.flatnonzero((out["v_cache"][:, b] != arrays["v_cache"][:, b]).any((0, 1, 3)))
        assert changed.tolist() == [p]
    plain = M.numpy_inputs(CFG, weights, tokens, 20, 23)
    uniform = M.numpy_inputs(cfg, weights, tokens, 20, 23)  # every sequence at L
    want = etc.simulate(M.build_decoder_graph(CFG), plain, {"B": 3, "L": 20, "S": 23})
    got = etc.simulate(g, uniform, {"B": 3, "L": 20, "S": 23})
    for key in ("logits", "k_cache", "v_cache"):
        np.testing.assert_array_equal(got[key], want[key])


@pytest.mark.parametrize(
    "variant",
    ["llama_tiny_online_ragged", "llama_tiny_mma_tma_ragged", "llama_tiny_buckets_ragged",
     "llama_tiny_context_span_ragged"],
)  # fmt: skip
def test_ragged_batch_on_every_attention_tile(variant):
    """The online tile's spread splits, the TMA-fed tensor-core tile (its
    ring started before the waits), three kernels in one artifact and the
    B = 1 kernel with K and V copied before the waits: each kernel's ragged
    step against the numpy model in the simulator, and its PTX through
    ptxas (the positions' buffer before the TMA maps)."""
    cfg = llama_tiny_variants()[variant]
    weights = M.random_weights(cfg, seed=4)
    for B, lb, kernel in cfg.kernel_configs():
        B, L = (1, 30) if B == 1 else (3, 40 if lb is None else lb)
        lengths = [L] if B == 1 else [L, 0, L // 2 + 1]
        tokens = np.arange(B, dtype=np.int32) * 7
        arrays = M.numpy_inputs(kernel, weights, tokens, L, L + 3, lengths=lengths)
        g = M.build_decoder_graph(kernel)
        out = etc.simulate(g, arrays, {"B": B, "L": L, "S": L + 3})
        ref = M.reference_step(kernel, arrays, L)
        np.testing.assert_array_equal(bf16_to_f32(out["logits"]), ref["logits"])
        attention = next(t for t in g.tasks if t.name == "attention").function
        assert attention.params[-1 - len(attention.tensor_maps)] == "memref<?xi32>"
        if attention.tensor_maps:  # the maps still read the caches (args 3 and 4)
            assert sorted(src for src, *_ in attention.tensor_maps.values()) == [3, 4]
    if variant == "llama_tiny_mma_tma_ragged":
        assert "@attention__prefetch" in attention.source
        for header in [ln for ln in attention.source.splitlines() if ln.startswith("func.func")]:
            assert "%lens: memref<?xi32>, %kc_map" in header, header


@needs_ptxas
def test_ragged_batch_compiles_for_every_attention_tile():
    for variant in ("llama_tiny_ragged", "llama_tiny_mma_tma_ragged", "llama_tiny_buckets_ragged",
                    "llama_tiny_context_span_ragged", "llama_tiny_online_ragged"):  # fmt: skip
        art = M.compile_decoder(llama_tiny_variants()[variant], "static")
        leaves = art.leaves() if hasattr(art, "leaves") else [("", art)]
        assert all(a.cubin is not None for _, a in leaves), variant


def test_ragged_positions_are_checked_and_clamped():
    """Positions past the graph's L are refused on the host, naming the
    sequence; in the kernel (and the simulator) such a position is taken as
    L, so no split outgrows its buffers."""
    cfg = dataclasses.replace(CFG, ragged=True)
    weights = M.random_weights(cfg, seed=3)
    tokens = np.array([5, 77], np.int32)
    with pytest.raises(etc.GraphError, match=r"lengths\[1\] = 21 is not in 0..L = 0..20"):
        M.numpy_inputs(cfg, weights, tokens, 20, 23, lengths=[3, 21])
    with pytest.raises(etc.GraphError, match="lengths: expected 2 integer positions"):
        M.check_lengths([3, 4, 5], 2, 20)
    with pytest.raises(etc.GraphError, match=r"lengths\[0\] = -1"):
        M.check_lengths(np.array([-1, 4]), 2, 20)
    with pytest.raises(etc.GraphError, match="lengths are a ragged batch's"):
        M.numpy_inputs(CFG, weights, tokens, 20, 23, lengths=[3, 4])
    with pytest.raises(etc.GraphError, match="context bucket L <= 8 changes ragged, but the "
                       "kernels share their buffers"):  # fmt: skip
        dataclasses.replace(CFG, context_buckets=((8, (("ragged", True),)), (None, ())))
    arrays = M.numpy_inputs(cfg, weights, tokens, 20, 23, lengths=[20, 4])
    past = {**arrays, "lengths": np.array([25, 4], np.int32)}  # written past the check
    g = M.build_decoder_graph(cfg)
    got = etc.simulate(g, past, {"B": 2, "L": 20, "S": 23})
    want = etc.simulate(g, arrays, {"B": 2, "L": 20, "S": 23})
    np.testing.assert_array_equal(got["logits"], want["logits"])
    source = next(t for t in g.tasks if t.name == "attention").function.source
    assert "%L = arith.minui %lens_i, %Lmax : index" in source


# -- paged caches (LlamaConfig.page_size) -------------------------------------------------

PAGED_VARIANTS = [name for name, cfg in llama_tiny_variants().items() if cfg.page_size]


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_paged_cache_decodes_as_the_contiguous_one(schedule):
    """LlamaConfig.page_size: the caches a pool of pages dealt at random
    through a block table. The step matches the numpy model and is the
    contiguous graph's step bit for bit (the same values moved to pages);
    it writes exactly one row of the pool a sequence and layer, in the page
    the table names for position L."""
    cfg = dataclasses.replace(CFG, page_size=8)
    shapes = M.tensor_shapes(cfg, 3, 20, 23)
    assert shapes["k_cache"] == ((CFG.layers, 9, CFG.kv_heads, 8, CFG.head_dim), "bf16")
    assert shapes["block_table"] == ((3, 3), "i32")
    weights = M.random_weights(cfg, seed=3)
    tokens = np.array([5, 77, 300], np.int32)
    arrays = M.numpy_inputs(cfg, weights, tokens, 20, 23)
    table = arrays["block_table"]
    assert sorted(table.reshape(-1).tolist()) == list(range(9))  # every page dealt once
    symbols = M.step_symbols(cfg, arrays, 20)
    assert symbols == {"B": 3, "L": 20, "S": 23, "pages": 9, "max_pages": 3}
    out = etc.simulate(M.build_decoder_graph(cfg), arrays, symbols, schedule=schedule)
    ref = M.reference_step(cfg, arrays, 20)
    np.testing.assert_array_equal(bf16_to_f32(out["logits"]), ref["logits"])
    plain = M.numpy_inputs(CFG, weights, tokens, 20, 23)
    want = etc.simulate(M.build_decoder_graph(CFG), plain, {"B": 3, "L": 20, "S": 23})
    np.testing.assert_array_equal(out["logits"], want["logits"])
    for key in ("k_cache", "v_cache"):
        np.testing.assert_array_equal(ref[key], out[key])
        view = M.from_pages(out[key], table)
        np.testing.assert_array_equal(view[:, :, :, :23], want[key])
        changed = np.argwhere((out[key] != arrays[key]).any(axis=(0, 2, 4)))
        assert sorted(map(tuple, changed.tolist())) == sorted(
            (int(table[b, 20 // 8]), 20 % 8) for b in range(3)
        )


@pytest.mark.parametrize("variant", PAGED_VARIANTS)
def test_paged_cache_on_every_attention_tile(variant):
    """Every attention tile over a paged cache (``test/gpu/graphs.py``'s
    paged variants): each kernel's step in the simulator is the contiguous
    kernel's bit for bit and near the numpy model's (which the 64-dim
    heads' contiguous kernels also miss by a bf16 rounding); no access of
    the tile indexes the cache by sequence any more, and the block table
    comes after the other buffers, before the positions and the TMA maps
    (which still read the caches)."""
    cfg = llama_tiny_variants()[variant]
    weights = M.random_weights(cfg, seed=4)
    for B, lb, kernel in cfg.kernel_configs():
        B, L = (1, 30) if B == 1 else (3, 40 if lb is None else lb)
        lengths = ([L] if B == 1 else [L, 0, L // 2 + 1]) if cfg.ragged else None
        tokens = np.arange(B, dtype=np.int32) * 7
        arrays = M.numpy_inputs(kernel, weights, tokens, L, L + 3, lengths=lengths)
        g = M.build_decoder_graph(kernel)
        out = etc.simulate(g, arrays, M.step_symbols(kernel, arrays, L))
        ref = M.reference_step(kernel, arrays, L)
        np.testing.assert_allclose(bf16_to_f32(out["logits"]), ref["logits"], atol=8e-3)
        contiguous = dataclasses.replace(kernel, page_size=0)
        plain = M.numpy_inputs(contiguous, weights, tokens, L, L + 3, lengths=lengths)
        want = etc.simulate(
            M.build_decoder_graph(contiguous), plain, M.step_symbols(contiguous, plain, L)
        )
        np.testing.assert_array_equal(out["logits"], want["logits"])
        for key in ("k_cache", "v_cache"):
            view = M.from_pages(out[key], arrays["block_table"])[:, :, :, : L + 3]
            np.testing.assert_array_equal(view, want[key])
        attention = next(t for t in g.tasks if t.name == "attention").function
        assert "%kc[%l, %b," not in attention.source and "%vc[%l, %b," not in attention.source
        extra = ["memref<?x?xi32>"] + ["memref<?xi32>"] * cfg.ragged
        maps = len(attention.tensor_maps)
        assert (
            list(attention.params[len(attention.params) - maps - len(extra) :][: len(extra)])
            == extra
        )
        if maps:
            assert sorted(src for src, *_ in attention.tensor_maps.values()) == [3, 4]


@needs_ptxas
def test_paged_cache_compiles_for_every_attention_tile():
    for variant in PAGED_VARIANTS:
        art = M.compile_decoder(llama_tiny_variants()[variant], "static")
        leaves = art.leaves() if hasattr(art, "leaves") else [("", art)]
        assert all(a.cubin is not None for _, a in leaves), variant


def test_paged_cache_shares_a_prefix_page():
    """Two sequences whose first page is one page of the pool (a common
    prefix, read by both) decode as with a copy each; the kernel's lookups
    are clamped, so table entries past a sequence's position are never
    read (here, garbage)."""
    cfg = dataclasses.replace(CFG, page_size=8)
    weights = M.random_weights(cfg, seed=3)
    tokens = np.array([5, 77], np.int32)
    arrays = M.numpy_inputs(cfg, weights, tokens, 12, 24)
    table = arrays["block_table"].copy()  # (2, 3) over 6 pages
    for key in ("k_cache", "v_cache"):  # sequence 1's first page holds sequence 0's
        arrays[key][:, table[1, 0]] = arrays[key][:, table[0, 0]]
    g = M.build_decoder_graph(cfg)
    want = etc.simulate(g, arrays, M.step_symbols(cfg, arrays, 12))
    shared = {**arrays, "block_table": table.copy()}
    shared["block_table"][1, 0] = table[0, 0]
    shared["block_table"][:, 2] = [-5, 1 << 30]  # past position 12's page: never read
    M.check_block_table(shared["block_table"][:, :2], 8, 6, [12, 12])
    got = etc.simulate(g, shared, M.step_symbols(cfg, shared, 12))
    np.testing.assert_array_equal(got["logits"], want["logits"])
    source = next(t for t in g.tasks if t.name == "attention").function.source
    # Every lookup's table column clamped to the page of the sequence's position.
    assert source.count("memref.load %pages") == source.count(", %pg_lastL : index")


def test_page_pool_deals_pages_as_sequences_grow():
    """PagePool: a sequence gets a page when a position reaches it, keeps
    its pages in position order, gives them back when it ends (another
    sequence takes them next), and a request the pool cannot meet raises,
    naming the sequence, and takes nothing. Its tables pass
    check_block_table."""
    pool = M.PagePool(pages=5, page_size=4)
    pool.reserve("a", 0)
    pool.reserve("b", 5)
    pool.reserve("a", 4)
    assert (pool.held("a"), pool.held("b"), pool.free) == ([0, 3], [1, 2], 1)
    pool.reserve("a", 7)  # still page 3's
    table = pool.table(["b", "a"], 3)
    assert table.tolist() == [[1, 2, -1], [0, 3, -1]]
    assert M.check_block_table(table, 4, 5, [5, 7]).tolist() == table.tolist()
    with pytest.raises(etc.GraphError, match="sequence 'b' at position 13 needs 2 more pages"):
        pool.reserve("b", 13)
    assert pool.held("b") == [1, 2] and pool.free == 1
    pool.release("a")
    pool.reserve("c", 11)
    assert pool.held("c") == [0, 3, 4] and pool.free == 0  # the freed pages first
    with pytest.raises(etc.GraphError, match="a sequence holds 3 pages; width=2"):
        pool.table(["c"], 2)
    with pytest.raises(etc.GraphError, match="PagePool: pages must be an int >= 1"):
        M.PagePool(0, 4)
    # A negative position passed; "3" and a list key raised TypeErrors; a str
    # of sequences was read as its characters.
    for position in (-1, "3"):
        with pytest.raises(etc.GraphError, match=f"position must be an int >= 0, got {position!r}"):
            pool.reserve("d", position)
    with pytest.raises(etc.GraphError, match=r"sequence \['d'\] is not hashable"):
        pool.reserve(["d"], 1)
    with pytest.raises(etc.GraphError, match="sequences must be a list, got 'ab'"):
        pool.table("ab", 4)
    with pytest.raises(etc.GraphError, match="width must be an int >= 0, got -1"):
        pool.table(["c"], -1)


def test_a_position_past_the_cache_is_refused_before_the_launch(tmp_path):
    """The step writes cache row L and reads RoPE row L: the simulator and
    the runtime (through the manifest) refuse L >= S, and with a paged cache
    a block table row too short for position L, naming what is wrong."""
    from etc.runtime.args import bind_symbols
    from etc.runtime.manifest import load_manifest

    arrays = M.numpy_inputs(CFG, M.random_weights(CFG), np.array([1, 2], np.int32), 5, 6)
    with pytest.raises(etc.ShapeError, match="position L must be below S, the rows of the RoPE"):
        etc.simulate(M.build_decoder_graph(CFG), arrays, {"B": 2, "L": 6, "S": 6})
    paged = dataclasses.replace(CFG, page_size=4)
    kernel = load_manifest(M.compile_decoder(paged).save(tmp_path / "paged"))
    symbols = {"B": 2, "L": 8, "S": 12, "pages": 4, "max_pages": 2}
    with pytest.raises(etc.ShapeError, match=r"below max_pages \* 4, the positions a block table"):
        bind_symbols(kernel, symbols)
    with pytest.raises(etc.ShapeError, match="position L must be below S"):
        bind_symbols(kernel, {**symbols, "max_pages": 3, "S": 8})
    assert bind_symbols(kernel, {**symbols, "max_pages": 3}) == tuple(
        {**symbols, "max_pages": 3}[s] for s in kernel.symbols
    )


def test_a_token_outside_the_vocabulary_never_reads_past_the_embedding():
    """A bad token (negative, or >= vocab) reads the embedding's last row in
    the kernel, the simulator and the numpy model alike; numpy_inputs and
    check_tokens refuse it on the host, naming it."""
    tokens = np.array([5, 77], np.int32)
    arrays = M.numpy_inputs(CFG, M.random_weights(CFG), tokens, 3, 6)
    g = M.build_decoder_graph(CFG)
    last = {**arrays, "tokens": np.array([5, CFG.vocab - 1], np.int32)}
    want = etc.simulate(g, last, {"B": 2, "L": 3, "S": 6})
    model = M.reference_step(CFG, last, 3)["logits"]
    for bad in (CFG.vocab, -1, 2**31 - 1):
        odd = {**arrays, "tokens": np.array([5, bad], np.int32)}
        got = etc.simulate(g, odd, {"B": 2, "L": 3, "S": 6})
        np.testing.assert_array_equal(got["logits"], want["logits"])
        np.testing.assert_array_equal(M.reference_step(CFG, odd, 3)["logits"], model)
    source = next(t for t in g.tasks if t.name == "embed").function.source
    assert "arith.minui %t_u, %vlast" in source
    with pytest.raises(
        etc.GraphError, match=rf"tokens\[1\] = -1 is not in the vocabulary 0..{CFG.vocab - 1}"
    ):
        M.numpy_inputs(CFG, M.random_weights(CFG), np.array([5, -1], np.int32), 3, 6)
    M.check_tokens([0, CFG.vocab - 1], CFG.vocab)
    # Fractions and a second dimension passed; a str raised numpy's UFuncTypeError.
    for bad in ([1.5], [[1]], "ab"):
        with pytest.raises(etc.GraphError, match="tokens must be one int per sequence"):
            M.check_tokens(bad, CFG.vocab)
    odd = {**arrays, "tokens": np.array([5, CFG.vocab], np.int32)}
    assert M.step_symbols(CFG, odd, 3) == {"B": 2, "L": 3, "S": 6}  # no check unless asked
    with pytest.raises(etc.GraphError, match=rf"tokens\[1\] = {CFG.vocab} is not in"):
        M.step_symbols(CFG, odd, 3, check=True)


def test_step_symbols_checks_a_ragged_paged_step_through_to_its_table():
    """step_symbols(check=True) reads the pool and table widths from the
    buffers and checks tokens, then lengths, then the block table."""
    cfg = dataclasses.replace(CFG, ragged=True, page_size=8)
    arrays = {
        "tokens": np.array([3, 4], np.int32),
        "lengths": np.array([9, 2], np.int32),
        "rope": np.zeros((17, 8), np.float32),
        "k_cache": np.zeros((CFG.layers, 4, 8, 2, 8), np.uint16),
        "block_table": np.array([[0, 1], [2, -1]], np.int32),
    }
    want = {"B": 2, "L": 9, "S": 17, "pages": 4, "max_pages": 2}
    assert M.step_symbols(cfg, arrays, 9, check=True) == want
    with pytest.raises(etc.GraphError, match="lengths"):
        M.step_symbols(cfg, {**arrays, "lengths": np.array([10, 2], np.int32)}, 9, check=True)
    bad_table = np.array([[0, 1], [1, -1]], np.int32)
    with pytest.raises(etc.GraphError, match="page 1, which sequence 0 writes"):
        M.step_symbols(cfg, {**arrays, "block_table": bad_table}, 9, check=True)
    assert M.step_symbols(cfg, {**arrays, "block_table": bad_table}, 9) == want  # unchecked


def test_block_tables_are_checked():
    """check_block_table names what is wrong with a table: its shape, a
    missing page, a page outside the pool, a page listed twice, a page
    written by one sequence and read by another. Bad page sizes are refused
    by the config and the tiles."""
    check = M.check_block_table
    good = np.array([[0, 1], [2, 3]], np.int32)
    assert check(good, 8, 4, [15, 9]).tolist() == good.tolist()
    with pytest.raises(etc.GraphError, match="expected an integer table of 3 rows"):
        check(good, 8, 4, [1, 2, 3])
    with pytest.raises(etc.GraphError, match="sequence 0 at position 16 needs 3 pages of 8"):
        check(good, 8, 4, [16, 1])
    with pytest.raises(etc.GraphError, match=r"block_table\[1, 1\] = 3 is not a page"):
        check(good, 8, 3, [0, 9])
    with pytest.raises(etc.GraphError, match="sequence 1 lists page 2 twice"):
        check(np.array([[0, 1], [2, 2]]), 8, 4, [0, 9])
    with pytest.raises(etc.GraphError, match="page 0, which sequence 1 writes"):
        check(np.array([[0, 1], [0, 3]]), 8, 4, [9, 3])
    assert check(np.array([[0, 1], [0, 3]]), 8, 4, [9, 9]).shape == (2, 2)  # a shared prefix
    with pytest.raises(etc.GraphError, match="page_size=12 must be a power of two"):
        dataclasses.replace(CFG, page_size=12)
    with pytest.raises(etc.GraphError, match="context bucket L <= 8 changes page_size, but the "
                       "kernels share their buffers"):  # fmt: skip
        dataclasses.replace(CFG, context_buckets=((8, (("page_size", 8),)), (None, ())))
    from etc.tiles.attention_mma import attention_mma

    with pytest.raises(etc.GraphError, match="page_size=4 is below 8 positions: a TMA box"):
        attention_mma(512, 4, 2, 64, 2, blocks=1, pipeline="tma", page_size=4)
    small = attention_mma(512, 4, 2, 64, 2, blocks=1, pipeline="tma", page_size=32)
    assert [box for _, box in small.tensor_maps.values()] == [(32, 64)] * 2  # 4 boxes a step
    whole = attention_mma(512, 4, 2, 64, 2, blocks=1, pipeline="tma", page_size=128)
    copies = [f.source.count("cp.async.bulk.tensor") for f in (small, whole)]
    assert copies[0] == 4 * copies[1] > 0
    with pytest.raises(etc.GraphError, match="chunk=192 must be a multiple of the step of 128"):
        attention_mma(192, 4, 2, 64, 2, blocks=1, pipeline="tma", page_size=128)
    with pytest.raises(etc.GraphError, match="page_size=3 must be a power of two"):
        T.attention(8, 8, 2, 32, 2, page_size=3)


# -- chunked layer weights (LlamaConfig.weight_chunk) ---------------------------------


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_chunked_layer_weights_give_the_row_layout_s_step(graph, weights, schedule):
    """The layer projections read their weights chunked (``wo_c64``, ...,
    made by graph_weights once): the step's logits and caches are the row
    layout's bit for bit, and the numpy model reads the chunked arrays."""
    from etc.tiles.gemm import chunk_weights

    cfg = dataclasses.replace(CFG, weight_chunk=64)
    names = set(M.tensor_shapes(cfg, 1, 0, 2))
    assert {"wqkv_folded_c64", "wo_c64", "wgu_folded_c64", "wd_c64", "embed"} <= names
    assert not names & {"wo", "wd", "wqkv_folded"}
    once = M.graph_weights(cfg, weights)
    assert M.graph_weights(cfg, once)["wo_c64"] is once["wo_c64"]  # converted once
    np.testing.assert_array_equal(once["wo_c64"], chunk_weights(weights["wo"], 64))
    B, L = 3, 5
    tokens = np.array([1, 500, 77], np.int32)
    arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2)
    out = etc.simulate(
        M.build_decoder_graph(cfg), arrays, {"B": B, "L": L, "S": L + 2}, schedule=schedule
    )
    plain = M.numpy_inputs(CFG, weights, tokens, L, L + 2)
    want = etc.simulate(graph, plain, {"B": B, "L": L, "S": L + 2}, schedule=schedule)
    for key in ("logits", "next_tokens", "k_cache", "v_cache"):
        np.testing.assert_array_equal(out[key], want[key])
    ref = M.reference_step(cfg, arrays, L)
    np.testing.assert_array_equal(
        ref["next_tokens"], M.reference_step(CFG, plain, L)["next_tokens"]
    )
    # Row-layout weights under the old names are refused, not read as chunked.
    with pytest.raises(etc.EtcError, match="has no tensor 'wqkv_folded'"):
        etc.simulate(M.build_decoder_graph(cfg), plain, {"B": B, "L": L, "S": L + 2})


def test_weight_chunk_errors_name_the_field():
    with pytest.raises(etc.GraphError, match=r"weight_chunk=48 must be a multiple of 8 dividing"):
        dataclasses.replace(CFG, weight_chunk=48)
    with pytest.raises(etc.GraphError, match=r"sync core.*o_proj \(bulk\)"):
        dataclasses.replace(
            CFG, weight_chunk=64, fold_norms=False, core_overrides=(("o_proj", "bulk"),)
        )
    with pytest.raises(etc.GraphError, match="changes weight_chunk, but the kernels share"):
        dataclasses.replace(CFG, batch_buckets=((1, (("weight_chunk", 64),)), (None, ())))
    # Llama-3.2-1B's large-batch kernel runs its projections on the tma
    # core, which reads chunks of 64 (one TMA box's k) only.
    with pytest.raises(etc.GraphError, match="in the kernel of the last batch bucket"):
        dataclasses.replace(M.LLAMA_3_2_1B, weight_chunk=32)
    assert dataclasses.replace(M.LLAMA_3_2_1B, weight_chunk=64).weight_chunk == 64


@needs_ptxas
def test_chunked_llama_3_2_1b_kernels_compile():
    """The B = 1 (sync core) and large-batch (tma core, 4-D maps) kernels."""
    cfg = dataclasses.replace(M.LLAMA_3_2_1B, weight_chunk=64)
    (_, one), *_, (_, large) = cfg.bucket_configs()
    for bucket in (one, large):
        art = etc.compile(M.build_decoder_graph(bucket), **M.compile_options(bucket))
        assert art.cubin is not None
    assert art.ptx.count("cp.async.bulk.tensor.4d") > 0


@needs_ptxas
def test_bulk_ring_decoder_matches_the_row_layout_and_compiles():
    """The layer projections' rings filled by bulk copies (chunks of 32):
    the simulated step is the row layout's, the kernel assembles, and the
    option is refused where it cannot apply."""
    projections = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    bulk = tuple((p, (("bulk_ring", True),)) for p in projections)
    cfg = dataclasses.replace(CFG, weight_chunk=32, projection_options=bulk)
    weights = M.random_weights(CFG, seed=2)
    tokens = np.array([5, 77], np.int32)
    syms = {"B": 2, "L": 3, "S": 5}
    out = etc.simulate(M.build_decoder_graph(cfg), M.numpy_inputs(cfg, weights, tokens, 3, 5), syms)
    want = etc.simulate(
        M.build_decoder_graph(CFG), M.numpy_inputs(CFG, weights, tokens, 3, 5), syms
    )
    np.testing.assert_array_equal(out["logits"], want["logits"])
    art = etc.compile(M.build_decoder_graph(cfg), **M.compile_options(cfg))
    assert art.cubin is not None and "cp.async.bulk.shared::cluster.global" in art.ptx
    with pytest.raises(etc.GraphError, match="bulk_ring needs a layer projection on the sync core"):
        dataclasses.replace(CFG, weight_chunk=64, projection_options=bulk)


def test_parts_that_wait_for_each_other_get_different_ctas(tmp_path, monkeypatch):
    """A decoder whose down projection shares its split-K sums (its 4 parts
    spin for each other): every block's parts land on different CTAs, also
    when the deal by SM would have put two on one (then round-robin), and
    a launch with fewer co-resident CTAs than parts is refused naming the
    task."""
    from etc.runtime import queue as Q

    cfg = dataclasses.replace(
        CFG, gemm_core="tma", bn_qkv=32, bn_o=16, bn_gu=32, bn_down=32,
        k_splits=(("qkv_proj", 2), ("o_proj", 2), ("down_proj", 4)),
        tma_meet_share=(("down_proj", 2),),
    )  # fmt: skip
    etc.compile(M.build_decoder_graph(cfg), cubin=False, target="sm_90a").save(tmp_path)
    k, _ = _planning_kernel(tmp_path, monkeypatch)
    down = next(t for t in k.manifest.tasks if t.name == "down")
    assert down.meets == 4
    syms = {"B": 70, "L": 3, "S": 9}
    for placement in (None, np.array([0, 0, 1, 1, 2, 2, 3, 3])):
        if placement is not None:
            k.deal_by_sm("spread", placement)
        per_cta = Q.decode(k._plan(syms, None).queue)
        blocks = [(i // 4, c) for c, es in enumerate(per_cta) for t, i in es if t == down.index]
        assert len(blocks) == len(set(blocks)) > 0  # no CTA holds two parts of one block
    k.clear_cache()
    k.num_ctas = 3
    with pytest.raises(
        etc.LaunchError, match="task 'down' has 4 split-K parts .* this launch has 3"
    ):
        k._plan(syms, None)


@needs_ptxas
def test_gemm_stamps_give_the_tma_projections_a_stamps_buffer(weights):
    """gemm_stamps: each layer projection on the tma core takes the
    ``gemm_stamps`` tensor (a row per projection, 1024 slots a 64-row
    block) and thread 0 stamps its clock there; the step is the one without
    stamps; the kernel passes ptxas; other cores and the LM head refuse."""
    from etc.tiles.gemm import layer_gemm
    from etc.tiles.gemm_layer_tma import STAMPS, STAMPS_TYPE

    tma = dict(
        gemm_core="tma", bn_qkv=32, bn_o=16, bn_gu=32, bn_down=32,
        k_splits=(("qkv_proj", 2), ("o_proj", 2), ("down_proj", 4)),
    )  # fmt: skip
    plain = dataclasses.replace(CFG, **tma)
    cfg = dataclasses.replace(plain, gemm_stamps=True)
    g = M.build_decoder_graph(cfg)
    shape = M.tensor_shapes(cfg, 70, 3, 9)["gemm_stamps"]
    assert shape == ((CFG.layers, 4, 2048, len(STAMPS)), "i64")
    stamped = {t.name for t in g.tasks if STAMPS_TYPE in t.function.source}
    assert stamped == {"qkv", "o_proj", "gate_up", "down"}
    for B in (3, 70):
        want = etc.simulate(
            M.build_decoder_graph(plain),
            M.numpy_inputs(plain, weights, np.arange(B, dtype=np.int32), 3, 9),
            {"B": B, "L": 3, "S": 9},
        )
        got = etc.simulate(
            g,
            M.numpy_inputs(cfg, weights, np.arange(B, dtype=np.int32), 3, 9),
            {"B": B, "L": 3, "S": 9},
        )
        np.testing.assert_array_equal(got["logits"], want["logits"])
    art = etc.compile(g, target="sm_90a")
    assert art.cubin is not None and "%globaltimer" in art.ptx and "%clock64" in art.ptx
    with pytest.raises(etc.GraphError, match="tile 'p': stamps need core='tma'"):
        layer_gemm(16, 32, 64, 64, layers=2, name="p", stamps=True)
    with pytest.raises(etc.GraphError, match="tile 'lm': stamps take a layer's tiles"):
        layer_gemm(64, 64, 128, 64, layers=None, name="lm", core="tma", stamps=True)
    with pytest.raises(etc.GraphError, match="gemm_stamps must be a bool"):
        dataclasses.replace(CFG, gemm_stamps=1)


@pytest.mark.parametrize("schedule", ["static", "dynamic"])
def test_capped_span_tiers_grow_the_spans_of_the_mma_attention(weights, schedule):
    """attn_small_spans' (batch, span, most) tiers: at most ``most`` splits,
    so past ``most * span`` cached positions the spans grow with L (the
    tensor-core tile holds any span); the same answer as the numpy model."""
    cfg = dataclasses.replace(
        CFG, attn_tile="mma", attn_unroll=1, attn_small_batch=4, attn_small_span=8,
        attn_small_spans=((2, 3, 2), (3, 4)), attn_single_span=0,
    )  # fmt: skip
    g = M.build_decoder_graph(cfg)
    att = next(t for t in g.tasks if t.name == "attention")
    cases = ((1, 3, 1), (1, 6, 2), (2, 30, 2), (2, 0, 1), (3, 30, 8), (4, 30, 4))
    for B, L, splits in cases:
        env = {"B": B, "L": L, "S": L + 2}
        assert etc.symbolic.evaluate(att.grid[3], env) == splits == cfg.splits(L, B), (B, L)
    for B, L in ((2, 30), (1, 17), (2, 5)):
        _check_step(cfg, g, weights, B, L, schedule, 35)
    # A tile that holds a span refuses a cap, naming the tier, unless it
    # never runs the tiers (the B = 1 kernel of a single-sequence tier).
    with pytest.raises(
        etc.GraphError,
        match=r"attn_small_spans=.* caps the split count \(\(2, 3, 2\): at most 2 splits\).* "
        "only attn_tile='mma' holds, not 'phased'",
    ):
        dataclasses.replace(cfg, attn_tile="phased", attn_unroll=4)
    one = dict(attn_tile="phased", attn_unroll=4, attn_single_span=3, max_batch=1)
    assert dataclasses.replace(cfg, **one).splits(30, 1) == 11  # spans of 3
    # ... whose tile need not hold the tiers' spans either.
    dataclasses.replace(cfg, **one, attn_small_spans=((2, 64, 2),))
    with pytest.raises(etc.GraphError, match="spans in 1..7 \\(the attention's buffers hold"):
        dataclasses.replace(cfg, **{**one, "max_batch": 2}, attn_small_spans=((2, 64),))
    with pytest.raises(
        etc.GraphError, match=r"or \(batch, span, most\) triples .* most at least 1"
    ):
        dataclasses.replace(cfg, attn_small_spans=((2, 3, 0),))


def test_deal_slots_keep_the_stages_after_the_attention_on_their_ctas(weights):
    """deal_slots=(("attention", n),): each layer's attention instances take
    n positions of the static deal, so o_proj's instances land on the same
    CTAs whatever the split count (L); the step's answer is the same;
    mistakes are refused by name."""
    cfg = dataclasses.replace(CFG, deal_slots=(("attention", 16),))
    g = M.build_decoder_graph(cfg)
    (attention,) = [t for t in g.tasks if t.name == "attention"]
    assert attention.deal_slots == 16
    names = [t.name for t in g.topological_tasks()]

    def o_proj_ctas(graph, L):
        queues = etc.static_queues(graph, {"B": 1, "L": L, "S": L + 2}, num_ctas=7)
        return {(c, i) for c, q in enumerate(queues) for task, i in q if names[task] == "o_proj"}

    # 2 and 12 instances a layer (1 and 6 splits of 2 kv heads), both under 16.
    assert o_proj_ctas(g, 3) == o_proj_ctas(g, 40)
    plain = M.build_decoder_graph(CFG)
    assert o_proj_ctas(plain, 3) != o_proj_ctas(plain, 40)
    _check_step(cfg, g, weights, 1, 40, "static", 19)
    for bad in ((("attention", 0),), (("nope", 4),), ("attention",)):
        with pytest.raises(etc.GraphError, match="deal_slots must be"):
            dataclasses.replace(CFG, deal_slots=bad)


@needs_ptxas
def test_one_pass_attention_has_two_barriers_fewer_and_compiles(weights):
    """attn_one_pass: steps 2-4 of the phased tile as one pass of each warp,
    two CTA barriers fewer, no scores in workgroup memory; a split of one
    loop step is straight-line code, a longer one a loop carrying the warp's
    max, sum and output; both kernels pass ptxas and the step matches the
    numpy model; other tiles refuse it."""
    from etc.tiles.llama import attention

    kw = dict(combine=True, stage_kv=True, prefetch_kv=True)
    plain = attention(64, 32, 8, 64, 16, **kw).source
    single = attention(64, 32, 8, 64, 16, one_pass=True, **kw).source
    looped = attention(256, 32, 8, 64, 16, one_pass=True, **kw).source  # 2 steps of 128
    assert single.count("gpu.barrier") == plain.count("gpu.barrier") - 2
    assert "%pbuf[" not in single and "%pbuf[" in plain and "@attention__ml" in single
    assert "iter_args(%m0 = %empty" not in single and "iter_args(%m0 = %empty" in looped
    for extra in ({}, {"attn_chunk": 64, "attn_unroll": 1, "head_dim": 64, "heads": 4,
                       "kv_heads": 2, "combine_group": 4}):  # fmt: skip
        cfg = dataclasses.replace(CFG, attn_one_pass=True, fuse_combine=True, **extra)
        g = M.build_decoder_graph(cfg)
        etc.compile(g, schedule="static")
        _check_step(cfg, g, M.random_weights(cfg, seed=6), 2, 20, "static", 17)
    with pytest.raises(etc.GraphError, match="attn_one_pass applies to attn_tile='phased'"):
        dataclasses.replace(CFG, attn_tile="mma", attn_one_pass=True)


def test_input_builders_refuse_missing_weights_and_positions_past_the_cache():
    """numpy_inputs and torch_inputs left a weight missing from ``weights``
    zeroed (a model of silent zeros), and numpy_inputs took L >= S."""
    w = M.random_weights(CFG)
    tokens = np.array([1, 2], np.int32)
    partial = {k: v for k, v in w.items() if k != "wo"}
    with pytest.raises(etc.GraphError, match="numpy_inputs: weights has no 'wo'; it holds 'embed'"):
        M.numpy_inputs(CFG, partial, tokens, 1, 8)
    with pytest.raises(etc.GraphError, match="weights has no 'wqkv' \\(nor 'wqkv_folded'\\)"):
        M.numpy_inputs(CFG, {k: v for k, v in w.items() if k != "wqkv"}, tokens, 1, 8)
    # Converted once (graph names), as torch_inputs' callers pass them: fine.
    M.numpy_inputs(CFG, M.graph_weights(CFG, w), tokens, 1, 8)
    with pytest.raises(etc.GraphError, match="position L=8 is past the cache's capacity S=8"):
        M.numpy_inputs(CFG, w, tokens, 8, 8)
    with pytest.raises(etc.GraphError, match="numpy_inputs: L must be an int >= 0, got -1"):
        M.numpy_inputs(CFG, w, tokens, -1, 8)

"""The whole decoder (``etc.models.llama``) on the GPU: the tiny configuration
against the CPU simulator (same tiles' references) for several batch sizes
and context lengths, one artifact for all of them, every schedule; the
cache it writes is the simulator's. Artifacts: ``python
test/gpu/make_artifacts.py DIR`` (``llama_tiny_*``); ``ETC_ARTIFACTS=DIR``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
import etc.runtime
from etc.dtypes import bf16_to_f32
from etc.models import llama as M

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphs import (  # noqa: E402
    SCHEDULES,
    llama_1b_large_close,
    llama_1b_large_variants,
    llama_tiny_variants,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("ETC_ARTIFACTS"), reason="ETC_ARTIFACTS is not set"),
]


def _to_torch(arrays):
    import torch

    out = {}
    for k, a in arrays.items():
        t = torch.from_numpy(a.view(np.int16) if a.dtype == np.uint16 else a.copy())
        out[k] = (t.view(torch.bfloat16) if a.dtype == np.uint16 else t).cuda()
    return out


def _numpy(t) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
    return t.cpu().numpy()


def _cache(cfg, arrays, cache: np.ndarray) -> np.ndarray:
    """``cache`` (of a step over ``arrays``) as ``(layers, B, KV, positions, D)``:
    a paged cache's view through the block table."""
    return M.from_pages(cache, arrays["block_table"]) if cfg.page_size else cache


def _against_simulator(kernel, graph, cfg, arrays, L: int):
    """The step over ``arrays`` in the simulator and on the GPU: the GPU's
    buffers, the simulator's arrays and the logits' relative error."""
    symbols = M.step_symbols(cfg, arrays, L)
    simulated = etc.simulate(graph, arrays, symbols)
    bufs = _to_torch(arrays)
    kernel.launch(bufs, symbols)
    kernel.check()
    got, want = bf16_to_f32(_numpy(bufs["logits"])), bf16_to_f32(simulated["logits"])
    return bufs, simulated, np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("variant", list(llama_tiny_variants()))
def test_decoder_matches_the_simulator(variant: str, schedule: str) -> None:
    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"{variant}_{schedule}")
    cfg = llama_tiny_variants()[variant]
    graph = M.build_decoder_graph(cfg, name="llama_tiny")
    weights = M.random_weights(cfg, seed=4)
    rng = np.random.default_rng(5)
    # B past one 16-row block; L across attention chunks (TINY's is 8).
    cases = [(1, 0, 4), (3, 7, 9), (17, 8, 20), (2, 30, 31)]
    if cfg.row_paths:  # a block past 32 rows: the last path
        cases.append((40, 5, 9))
    if cfg.uses_tma:  # two 64-row blocks, the second partial
        cases.append((70, 3, 9))
    if any(k.core("qkv_proj") == "gemv" and k.gemv_block >= 32 for *_, k in cfg.kernel_configs()):
        cases += [(32, 5, 9), (40, 6, 9), (70, 3, 9)]  # a block full, partial, two
    if cfg.tma_prefetch == "shared":  # session 13's failing sizes
        cases += [(130, 5, 9), (200, 9, 12)]
    if cfg.attn_tile != "phased":  # 200 cached rows: a long split, several loop steps
        cases += [(2, 200, 201), (3, 200, 201)]
    if cfg.attn_small_spans and cfg.attn_small_batch:  # position L riding, or alone
        cases += [(3, 24, 25), (3, 32, 33), (4, 30, 31)]
    if any(len(t) == 3 for t in cfg.attn_small_spans) and cfg.attn_small_batch:
        cases += [(2, 1600, 1601), (4, 700, 701), (3, 300, 301)]  # capped: spans grow
    for b, lb, _ in cfg.kernel_configs():  # both sides of a context bound
        if lb is not None:
            cases += [(b or 1, lb, lb + 1), (b or 1, lb + 1, lb + 2), (b or 1, 200, 201)]
    if cfg.cached_splits:  # L a whole span: one split of span + 1 positions
        cases.append((17, cfg.attn_large_span, cfg.attn_large_span + 1))
    for B, L, S in cases:
        tokens = rng.integers(0, cfg.vocab, B).astype(np.int32)
        arrays = M.numpy_inputs(cfg, weights, tokens, L, S, seed=B + L)
        bufs, simulated, err = _against_simulator(kernel, graph, cfg, arrays, L)
        assert err < 2e-2, (B, L, err)
        agree = np.mean(_numpy(bufs["next_tokens"]) == simulated["next_tokens"])
        assert agree >= 0.5, (B, L, agree)
        for cache in ("k_cache", "v_cache"):  # row L written, the rows before untouched
            out = _cache(cfg, arrays, _numpy(bufs[cache]))
            got, want = bf16_to_f32(out), bf16_to_f32(_cache(cfg, arrays, simulated[cache]))
            np.testing.assert_allclose(got[:, :, :, L], want[:, :, :, L], rtol=0.05, atol=0.05)
            before = _cache(cfg, arrays, arrays[cache])[:, :, :, :L]
            np.testing.assert_array_equal(out[:, :, :, :L], before)


@pytest.mark.parametrize(
    "variant",
    [
        "llama_tiny",
        "llama_tiny_tma",
        "llama_tiny_mma_tma",
        "llama_tiny_mma_tma_pf",
        "llama_tiny_mma_tma_read",
        "llama_tiny_mma_tma_read_early",
        "llama_tiny_mma_tma_kv_evict_first",
        "llama_tiny_tma_evict_first",
        "llama_tiny_mma_tma_items",
        "llama_tiny_mma_tma_capped_items",
        "llama_tiny_regions",
        "llama_tiny_regions_tma_pf",
        "llama_tiny_tma_mixed",
        "llama_tiny_tma_l2pf",
        "llama_tiny_tma_rotate",
        "llama_tiny_tma_ahead",
        "llama_tiny_pool",
        "llama_tiny_tma_buckets_pool",
        "llama_tiny_tma_buckets",
        "llama_tiny_tma_rows",
        "llama_tiny_tma_buckets_rows",
        "llama_tiny_tma_share",
        "llama_tiny_tma_buckets_share",
        "llama_tiny_tma_cluster",
        "llama_tiny_sm_slices",
        "llama_tiny_lists",
        "llama_tiny_gemv16",
        "llama_tiny_gemv32_lines",
    ],
)
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_decode_step_is_bit_reproducible(schedule: str, variant: str) -> None:
    """The same step over the same inputs, launched again and again, gives
    bit-identical logits: the norms' sums of squares are fixed-point
    integer atomics, whose order does not change the result, and split-K
    parts are added in part order whichever finishes last."""
    import torch

    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"{variant}_{schedule}")
    cfg = llama_tiny_variants()[variant]
    weights = M.random_weights(cfg, seed=4)
    # The TMA-fed attention over several loop steps of 128 positions.
    tma = variant.startswith("llama_tiny_mma_tma") or variant.endswith("tma_pf")
    B, L, S = (17, 300, 310) if tma else (17, 9, 12)
    tokens = np.random.default_rng(6).integers(0, cfg.vocab, B).astype(np.int32)
    bufs = _to_torch(M.numpy_inputs(cfg, weights, tokens, L, S, seed=3))
    runs = []
    for _ in range(6):
        kernel.launch(bufs, {"B": B, "L": L, "S": S})
        runs.append(bufs["logits"].clone())
    kernel.check()
    assert all(torch.equal(runs[0], r) for r in runs[1:])


def test_a_clustered_decoder_launches_in_whole_clusters() -> None:
    """The tiny TMA decoder whose split-K parts meet in pairs on clusters
    of 2: the kernel launches in clusters (its co-resident CTAs are whole
    clusters), a grid of one cluster gives the full grid's logits bit for
    bit (every pair still on one cluster), and an odd grid is refused
    naming the cluster."""
    import torch

    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / "llama_tiny_tma_cluster_static")
    assert kernel.cluster == 2 and kernel.num_ctas % 2 == 0
    cfg = llama_tiny_variants()["llama_tiny_tma_cluster"]
    weights = M.random_weights(cfg, seed=4)
    B, L, S = 70, 3, 9
    tokens = np.random.default_rng(6).integers(0, cfg.vocab, B).astype(np.int32)
    bufs = _to_torch(M.numpy_inputs(cfg, weights, tokens, L, S, seed=3))
    logits = {}
    for grid in (None, 2):
        kernel.launch(bufs, {"B": B, "L": L, "S": S}, grid=grid, sync=True)
        logits[grid] = bufs["logits"].clone()
    assert torch.equal(logits[None], logits[2])
    with pytest.raises(etc.LaunchError, match="grid 3 is not whole thread-block clusters of 2"):
        kernel.launch(bufs, {"B": B, "L": L, "S": S}, grid=3)


@pytest.mark.parametrize("graph", ["greedy", "greedy_parts"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_argmax_takes_the_first_largest_logit(schedule: str, graph: str) -> None:
    """The argmax tile over 128256 logits, whole rows and in 16 parts then
    merged: random rows, a maximum planted twice (the first wins, as
    torch.argmax; in two parts), at the last index, a row of equal values
    (index 0) and a run of maxima across a part boundary."""
    import torch

    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"{graph}_{schedule}")
    V = 128256
    gen = torch.Generator(device="cuda").manual_seed(9)
    logits = torch.randn((6, V), generator=gen, device="cuda").to(torch.bfloat16)
    logits[1, 70001] = logits[1, 123] = 9.0
    logits[2, V - 1] = 9.0
    logits[3] = 0.5
    logits[4, 5000:6000] = 9.0
    out = torch.full((6,), -1, dtype=torch.int32, device="cuda")
    bufs = {"logits": logits, "out": out}
    if graph == "greedy_parts":
        bufs["val"] = torch.zeros((6, 16), dtype=torch.float32, device="cuda")
        bufs["idx"] = torch.zeros((6, 16), dtype=torch.int32, device="cuda")
        logits[5, 8010:8030] = 9.5  # parts of 8016: the run starts in part 0
    kernel.launch(bufs, {"b": 6})
    kernel.check()
    want = torch.argmax(logits.float(), dim=1).to(torch.int32)
    assert out.tolist() == want.tolist()
    assert out.tolist()[1:5] == [123, V - 1, 0, 5000]
    if graph == "greedy_parts":
        assert out.tolist()[5] == 8010


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize(
    "variant", [name for name, cfg in llama_tiny_variants().items() if cfg.ragged]
)
def test_ragged_batch_matches_the_simulator(variant: str, schedule: str) -> None:
    """A ragged batch (``LlamaConfig.ragged``): each sequence at its own
    position, some at 0, one at the graph's L, against the simulator; each
    sequence's cache row written at its own position, the rows before it
    untouched."""
    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"{variant}_{schedule}")
    cfg = llama_tiny_variants()[variant]
    graph = M.build_decoder_graph(cfg, name="llama_tiny")
    weights = M.random_weights(cfg, seed=4)
    rng = np.random.default_rng(6)
    cases = [(3, 30), (17, 200), (2, 8), (1, 30)]
    for b, lb, _ in cfg.kernel_configs():  # both sides of a context bound
        if lb is not None:
            cases += [(b or 1, lb), (b or 1, lb + 1)]
    for B, L in cases:
        lengths = rng.integers(0, L + 1, B)
        lengths[0] = L  # the graph's L is the longest
        if B > 2:
            lengths[1] = 0
        rng.shuffle(lengths)
        tokens = rng.integers(0, cfg.vocab, B).astype(np.int32)
        arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2, seed=B + L, lengths=lengths)
        bufs, simulated, err = _against_simulator(kernel, graph, cfg, arrays, L)
        assert err < 2e-2, (B, L, lengths, err)
        for cache in ("k_cache", "v_cache"):
            out = _cache(cfg, arrays, _numpy(bufs[cache]))
            sim, before = (_cache(cfg, arrays, x[cache]) for x in (simulated, arrays))
            for b, p in enumerate(lengths):
                np.testing.assert_allclose(
                    bf16_to_f32(out[:, b, :, p]),
                    bf16_to_f32(sim[:, b, :, p]),
                    rtol=0.05,
                    atol=0.05,
                )
                np.testing.assert_array_equal(out[:, b, :, :p], before[:, b, :, :p])


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_a_token_outside_the_vocabulary_does_not_fault(schedule: str) -> None:
    """Tokens -1, vocab and 2**31 - 1 read the embedding's last row (as the
    simulator does): the launch completes, the context stays usable, and
    the logits are those of token vocab - 1."""
    import torch

    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"llama_tiny_{schedule}")
    cfg = llama_tiny_variants()["llama_tiny"]
    weights = M.random_weights(cfg, seed=4)
    arrays = M.numpy_inputs(cfg, weights, np.array([5, cfg.vocab - 1], np.int32), 7, 9)
    runs = []
    for last in (cfg.vocab - 1, -1, cfg.vocab, 2**31 - 1):
        bufs = _to_torch({**arrays, "tokens": np.array([5, last], np.int32)})
        kernel.launch(bufs, {"B": 2, "L": 7, "S": 9})
        kernel.check()
        runs.append(bufs["logits"].clone())
    assert all(torch.equal(runs[0], r) for r in runs[1:])


def test_gemm_stamps_mark_every_part_in_order() -> None:
    """The tiny tma decoder with ``gemm_stamps`` at B = 70 (two row
    blocks): every part of every layer projection stamped its entry, its k
    loop's end and its end in that order, and in each split block exactly
    one part (the last) stamped the meeting between them."""
    from etc.tiles.gemm_layer_tma import STAMPS

    name = "llama_tiny_tma_gemm_stamps"
    cfg = llama_tiny_variants()[name]
    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"{name}_static")
    B, L = 70, 3
    arrays = M.numpy_inputs(cfg, M.random_weights(cfg, seed=4), np.arange(B, dtype=np.int32), L, 9)
    bufs = _to_torch(arrays)
    kernel.launch(bufs, {"B": B, "L": L, "S": 9})
    kernel.check()
    stamps = _numpy(bufs["gemm_stamps"]).astype(np.int64)
    w = {word: i for i, word in enumerate(STAMPS)}
    widths = {"qkv_proj": cfg.qkv_width, "o_proj": cfg.hidden, "gate_up_proj": cfg.inter,
              "down_proj": cfg.hidden}  # fmt: skip
    bns = {"qkv_proj": cfg.bn_qkv, "o_proj": cfg.bn_o, "gate_up_proj": cfg.bn_gu,
           "down_proj": cfg.bn_down}  # fmt: skip
    for row, projection in enumerate(widths):
        parts, blocks = cfg.k_split(projection), widths[projection] // bns[projection] * 2
        x = stamps[:, row, : blocks * parts].reshape(cfg.layers, blocks, parts, len(STAMPS))
        assert (x[..., w["end"]] != 0).all(), projection
        assert (x[..., w["entry"]] <= x[..., w["loop_end"]]).all(), projection
        assert (x[..., w["loop_end"]] <= x[..., w["end"]]).all(), projection
        assert (x[..., w["entry_ns"]] <= x[..., w["end_ns"]]).all(), projection
        met = x[..., w["met"]] != 0
        assert (met.sum(-1) == (1 if parts > 1 else 0)).all(), projection
        xm = x[met]
        assert (
            (xm[:, w["loop_end"]] <= xm[:, w["met"]]) & (xm[:, w["met"]] <= xm[:, w["end"]])
        ).all()
        assert not stamps[:, row, blocks * parts :].any(), projection  # no slot past the grid


def test_tma_ring_layouts_and_prefetch_give_the_same_logits() -> None:
    """Llama-3.2-1B's large-batch kernel with qkv on 3 TMA stages and down on
    6 (the others 4) overlays its tiles' rings and mbarriers differently from
    the default (whose weights land in the rings during the waits,
    ``tma_prefetch="shared"``), and the L2 prefetch instead; the arithmetic
    is the same, so the logits must be bit-equal. Before the tiles invalidated their mbarriers
    (``mbarrier.inval``) the first gave wrong tokens (``bench/RESULTS.md``,
    item 72)."""
    import torch

    arts = Path(os.environ["ETC_ARTIFACTS"])
    cfg = llama_1b_large_variants()["llama_1b_large"]
    weights = M.random_weights_torch(cfg)
    for B, L in ((64, 1024), (17, 77), (32, 4096)):
        logits = {}
        for name, variant in llama_1b_large_variants().items():
            kernel = etc.runtime.load(arts / name)
            # A variant's own workspace shapes (tma_meeting="rows": B rows a part).
            bufs = M.torch_inputs(variant, weights, B, L, L + 1)
            kernel.launch(bufs, {"B": B, "L": L, "S": L + 1})
            kernel.check()
            logits[name] = bufs["logits"].clone()
            del bufs
        for name in list(llama_1b_large_variants())[1:]:
            assert torch.equal(logits["llama_1b_large"], logits[name]), (name, B, L)
        assert torch.isfinite(logits["llama_1b_large"].float()).all()


def test_shared_split_k_sums_give_the_plain_kernel_s_tokens() -> None:
    """Llama-3.2-1B's large-batch kernel (down's split-K sums shared by each
    block's last 2 parts to arrive, whose earlier sharer spins until the
    last arrives) against the same with every split projection's shared,
    with none (fragments or rows meeting): the same part-order sums, but
    the norms' fixed-point row sums gathered per sharer, so logits within
    bf16 drift of each other (qkv's and gate/up's sharing alone is
    bit-identical: ``test_tma_ring_layouts...``), the same tokens, and the
    same bits launch after launch."""
    import torch

    arts = Path(os.environ["ETC_ARTIFACTS"])
    cfg = llama_1b_large_variants()["llama_1b_large"]
    weights = M.random_weights_torch(cfg)
    for B, L in ((64, 1024), (17, 77), (32, 4096)):
        out = {}
        for name, variant in {"llama_1b_large": cfg, **llama_1b_large_close()}.items():
            kernel = etc.runtime.load(arts / name)
            bufs = M.torch_inputs(variant, weights, B, L, L + 1)
            runs = []
            for _ in range(3):
                kernel.launch(bufs, {"B": B, "L": L, "S": L + 1})
                runs.append((bufs["logits"].clone(), bufs["next_tokens"].clone()))
            kernel.check()
            assert all(torch.equal(runs[0][0], r[0]) for r in runs[1:]), (name, B, L)
            out[name] = runs[0]
            del bufs
        plain, tokens = out.pop("llama_1b_large")
        for name, (logits, other_tokens) in out.items():
            err = float((logits.float() - plain.float()).norm() / plain.float().norm())
            # (Measured 7.8e-3 at B = 64, L = 1024: bf16 drift over 16 layers.)
            assert err < 2e-2, (name, B, L, err)
            # A bf16 near-tie may flip with the norms' last bits: nearly all agree.
            assert float((tokens == other_tokens).float().mean()) >= 0.95, (name, B, L)

"""Graphs that span GPUs (ranked events, peer stores) on every GPU pair this
machine has: GEMM + Reduce-Scatter and All-Gather + GEMM against float32 numpy
and the multi-rank simulator, several shapes through one RankGroup, and a rank
that never launches reported by the rank barrier, then recovery. Artifacts:
``python test/gpu/make_artifacts.py DIR`` (``*_small_*``); ``ETC_ARTIFACTS=DIR``;
needs two GPUs with peer access."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
from etc.dtypes import bf16_to_f32
from etc.errors import DeadlockError, LaunchError

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from graphs import (  # noqa: E402
    SCHEDULES,
    TENSOR_PARALLEL_VARIANTS,
    tensor_parallel_small,
    tensor_parallel_variant,
)


def _gpus() -> int:
    try:
        from etc.runtime import driver
    except ImportError:
        return 0
    return driver.device_count()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("ETC_ARTIFACTS"), reason="ETC_ARTIFACTS is not set"),
    pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs"),
]

torch = pytest.importorskip("torch")
from examples._tensor_parallel import (  # noqa: E402
    ALLGATHER_GEMM,
    GEMM_REDUCE_SCATTER,
    per_rank_tensors,
)

EXAMPLES = {"gemm_rs": GEMM_REDUCE_SCATTER, "ag_gemm": ALLGATHER_GEMM}
RANKS = 2


def _group(op: str, schedule: str) -> etc.runtime.RankGroup:
    path = Path(os.environ["ETC_ARTIFACTS"]) / f"{op}_small_{schedule}"
    return etc.runtime.RankGroup(path, devices=range(RANKS))


def _outputs(tensors, name: str) -> list[np.ndarray]:
    return [t[name].float().cpu().numpy() for t in tensors]


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("op", [*EXAMPLES, *TENSOR_PARALLEL_VARIANTS])
def test_matches_reference_and_simulator(op: str, schedule: str) -> None:
    base, cfg, _ = tensor_parallel_variant(op)
    example = EXAMPLES[base]
    group = _group(op, schedule)
    graph = example.build(cfg)
    # One group for every shape, launched back to back: the kernels reset
    # their counters and keep the rank barrier's words.
    for rows, n in ((64, 64), (192, 128), (64, 320)):
        rng = np.random.default_rng(rows + n)
        inputs = example.inputs(rows, n, cfg.k, RANKS, rng)
        symbols = {"rows": rows, "N": n}
        tensors = per_rank_tensors(graph, inputs, symbols, example.peers)
        group.launch(tensors, symbols)
        simulated = etc.simulate_ranks(graph, inputs, symbols, schedule=schedule.split("_")[0])
        for r, (name, want) in enumerate(example.expect(inputs, rows, n)):
            got = _outputs(tensors, name)[r].reshape(want.shape)
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err <= 1e-2, (op, schedule, rows, n, r, err)
            sim = bf16_to_f32(simulated[r][name]).reshape(want.shape)
            assert np.abs(got - sim).max() <= 1e-2 * np.abs(want).max()


def test_rank_that_never_launches_is_reported_then_group_recovers() -> None:
    example = GEMM_REDUCE_SCATTER
    group = _group("gemm_rs", "static")
    cfg = tensor_parallel_small()
    graph = example.build(cfg)
    rows, n = 64, 64
    inputs = example.inputs(rows, n, cfg.k, RANKS, np.random.default_rng(0))
    symbols = {"rows": rows, "N": n}
    tensors = per_rank_tensors(graph, inputs, symbols, example.peers)
    group.launch(tensors, symbols)
    # Rank 0 alone: its kernel waits at the rank barrier for rank 1.
    k0 = group.kernels[0]
    with pytest.raises(DeadlockError, match="not every rank started"):
        k0.launch(tensors[0], {**symbols, "rank": 0, "ranks": RANKS}, max_polls=20_000)
    group.reset()
    for t in tensors:
        t["out"].zero_()
    group.launch(tensors, symbols)
    for r, (name, want) in enumerate(example.expect(inputs, rows, n)):
        got = _outputs(tensors, name)[r].reshape(want.shape)
        assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()


def test_group_rejects_rank_symbols_and_numpy() -> None:
    group = _group("gemm_rs", "static")
    with pytest.raises(LaunchError, match="bound by the RankGroup"):
        group.launch([{}, {}], {"rows": 64, "N": 64, "rank": 0})
    with pytest.raises(LaunchError, match="numpy array"):
        group.launch([{"X": np.zeros((128, 128), np.float32)}, {}], {"rows": 64, "N": 64})


def test_one_process_per_rank(tmp_path) -> None:
    """The serving-engine layout: each rank in its own process (ProcessRank,
    CUDA IPC), both layers, two shapes through one set of buffers."""
    import socket

    import process_ranks
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(
        process_ranks.run,
        args=(RANKS, port, os.environ["ETC_ARTIFACTS"], str(tmp_path)),
        nprocs=RANKS,
        join=True,
    )
    for r in range(RANKS):
        report = json.loads((tmp_path / f"{r}.json").read_text())
        assert len(report) == 4
        for case in report:
            assert case["rel_err"] <= 1e-2, (r, case)

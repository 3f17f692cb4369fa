"""The dense TMA GEMM tile whose parts of k meet in the tile (``gemm_meet*_<schedule>/``
from ``make_artifacts.py``, ``GEMM_MEETS`` in ``graphs.py``) on a GPU: results against a float64 product, the same
bits launch after launch, and the block counters back at zero after each."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from graphs import GEMM_MEET_SHARES, GEMM_MEETS

import etc.runtime
from etc.dtypes import bf16_to_f32, f32_to_bf16

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("ETC_ARTIFACTS"), reason="ETC_ARTIFACTS is not set"),
]


@pytest.mark.parametrize("name", list(GEMM_MEETS))
@pytest.mark.parametrize("schedule", ["static", "dynamic"])
@pytest.mark.parametrize("m, n", [(1, 64), (200, 200), (1024, 1536)])
def test_parts_meet_in_the_tile(name: str, schedule: str, m: int, n: int) -> None:
    _check_meeting(name, schedule, m, n)


@pytest.mark.parametrize("name", list(GEMM_MEET_SHARES))
@pytest.mark.parametrize("m, n", [(1, 64), (200, 200), (1024, 1536)])
def test_shared_sums_are_the_last_part_s_bits(name: str, m: int, n: int) -> None:
    """The last parts to arrive share the sums (``meet_share``; earlier
    sharers spin until the last arrives): the plain meeting's bits, launch
    after launch, the counters back at zero."""
    plain, _ = GEMM_MEET_SHARES[name]
    np.testing.assert_array_equal(
        _check_meeting(name, "static", m, n, GEMM_MEETS[plain]),
        _check_meeting(plain, "static", m, n),
    )


def _check_meeting(name: str, schedule: str, m: int, n: int, shape=None) -> np.ndarray:
    """Three launches of artifact ``name``: each within a bf16 rounding of a
    float64 product, all the same bits, the counters at zero after each;
    returns ``C``'s bits."""
    BM, BN, K, PARTS = shape or GEMM_MEETS[name]
    kernel = etc.runtime.load(Path(os.environ["ETC_ARTIFACTS"]) / f"{name}_{schedule}")
    rng = np.random.default_rng(m + n)
    a = f32_to_bf16(rng.standard_normal((m, K)).astype(np.float32))
    b = f32_to_bf16((rng.standard_normal((n, K)) * K**-0.5).astype(np.float32))
    blocks = -(-m // BM) * -(-n // BN)
    count = np.zeros((1, blocks), np.int32)
    want = bf16_to_f32(a).astype(np.float64) @ bf16_to_f32(b).astype(np.float64).T
    first = None
    for _ in range(3):
        t = {
            "A": a,
            "B": b,
            "C": np.full((m, n), 0x7FC0, np.uint16),  # NaN: every element must be written
            "C_parts": np.full(blocks * PARTS * BM * BN, np.nan, np.float32),
            "C_count": count,
        }
        kernel.launch(t, {"m": m, "n": n})
        got = bf16_to_f32(t["C"])
        assert np.isfinite(got).all()
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= 1e-2, err
        assert not t["C_count"].any(), "a block counter was left non-zero"
        count = t["C_count"]
        if first is None:
            first = t["C"].copy()
        np.testing.assert_array_equal(t["C"], first)
    return first

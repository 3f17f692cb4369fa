"""``bench/decode_trace.py``'s tables of the tma core's projection stamps
(``LlamaConfig.gemm_stamps``), on stamps made up with known phases."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import decode_trace  # noqa: E402
from etc.tiles.gemm_layer_tma import STAMPS  # noqa: E402


def _part(k_loop: int, store: int, meet: int = 0, ghz: float = 2.0) -> list[int]:
    """A part's stamp words: ``k_loop`` and ``store`` ns (``meet`` ns between
    them in a block's last part), at ``ghz`` clock cycles a ns."""
    entry, entry_ns = 1000, 500
    loop_end = entry + int(ghz * k_loop)
    met = loop_end + int(ghz * meet) if meet else 0
    end = (met or loop_end) + int(ghz * store)
    return [entry, loop_end, met, end, entry_ns, entry_ns + int((end - entry) / ghz)]


def test_gemm_stamp_table_splits_last_parts_from_the_others():
    stamps = np.zeros((2, 4, 1024, len(STAMPS)), np.int64)
    for layer in range(2):
        for block in range(3):  # o_proj (row 1): 4 parts a block, the last meets
            for part in range(4):
                last = part == 3
                words = _part(3000, 500 if last else 800, 700 if last else 0)
                stamps[layer, 1, block * 4 + part] = words
    text, data = decode_trace.gemm_stamp_table(stamps)
    assert "o_proj stamps: 24 instances, 6 last parts, clock 2.00 GHz" in text
    assert set(data) == {"o_proj"}  # rows that never ran are left out
    o = data["o_proj"]
    assert o["k loop (after the waits)"]["median_us"] == pytest.approx(3.0)
    assert o["part stored and counted"]["median_us"] == pytest.approx(0.8)
    assert o["last: counted, parts met"]["median_us"] == pytest.approx(0.7)
    assert o["last: epilogue"]["median_us"] == pytest.approx(0.5)
    assert o["whole instance"]["p90_us"] == pytest.approx(4.2)


def test_gemm_stamp_table_ignores_an_earlier_launchs_met():
    """Which part of a block is last changes between launches, and only the
    last stamps ``met``: a part that was last in an earlier launch keeps that
    launch's ``met`` (before its entry, or far after its end when that launch
    ran the slot on an SM whose clock reads ahead), and must count with the
    others, not as last."""
    stamps = np.zeros((1, 4, 1024, len(STAMPS)), np.int64)
    met = STAMPS.index("met")
    for block in range(4):  # down (row 3): 2 parts a block
        for part in range(2):
            last = part == block % 2
            words = _part(2000, 400 if last else 900, 600 if last else 0)
            if not last:  # an earlier launch's word: before, or far after
                words[met] = 10 if block < 2 else words[STAMPS.index("end")] + 10**7
            stamps[0, 3, block * 2 + part] = words
    text, data = decode_trace.gemm_stamp_table(stamps)
    assert "down stamps: 8 instances, 4 last parts" in text
    d = data["down"]
    assert d["last: counted, parts met"]["median_us"] == pytest.approx(0.6)
    assert d["last: epilogue"]["median_us"] == pytest.approx(0.4)
    assert d["part stored and counted"]["median_us"] == pytest.approx(0.9)

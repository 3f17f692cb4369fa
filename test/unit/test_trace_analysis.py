"""``bench/trace_analysis.py``'s views over small hand-made traces."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import trace_analysis  # noqa: E402
from etc.runtime.trace import Trace  # noqa: E402

# A decoder of 4 query heads, 2 kv heads of 8 dims and inter 32, 5 layers:
# qkv in 8 column blocks (q 0-3, k 4-5, v 6-7), attention (l, b, kv head,
# split), o_proj and down in 2 parts of k, gate/up in 4 blocks of 8 columns.
TASKS = ["embed", "qkv", "attention", "o_proj", "gate_up", "down"]
GRIDS = [(1,), (5, 8, 1, 1), (5, 1, 2, 1), (5, 1, 1, 2), (5, 4, 1, 1), (5, 1, 1, 2)]
BASE = 1_796_482_129_464_855_776  # a globaltimer reading: past a double's ns precision


def _record(task: str, coords: tuple[int, ...], cta: int, start: int, end: int) -> tuple:
    index = TASKS.index(task)
    linear = int(np.ravel_multi_index(coords, GRIDS[index]))
    return (BASE + start, BASE + end, (index << 48) | linear, (cta // 2 << 32) | cta)


def test_ranges_bounds_each_consumer_by_the_blocks_it_reads() -> None:
    recs = [_record("down", (layer, 0, 0, 0), 60 + layer, 0, 1) for layer in (0, 1, 3, 4)]
    # qkv: kv head 0's blocks (q 0-1, k 4, v 6) end at 1 us, kv head 1's at 5.
    recs += [
        _record("qkv", (2, j, 0, 0), j, 0, 1000 if j in (0, 1, 4, 6) else 5000) for j in range(8)
    ]
    # The attention starts 0.8 us after qkv's end; kv head 0 takes 2 us, 1 takes 1.
    recs += [_record("attention", (2, 0, 0, 0), 10, 5800, 7800)]
    recs += [_record("attention", (2, 0, 1, 0), 11, 5800, 6800)]
    # o_proj part 0 reads kv head 0 (the last to end): nothing to gain.
    recs += [_record("o_proj", (2, 0, 0, s), 40 + s, 8300, 8800) for s in (0, 1)]
    # gate/up blocks 0-1 (down part 0's k) end at 10 us, 2-3 at 12; down part
    # 0's CTA is busy until 11 us (an earlier instance), part 0 takes 3 us.
    recs += [
        _record("gate_up", (2, j, 0, 0), 20 + j, 0, 10000 if j < 2 else 12000) for j in range(4)
    ]
    recs += [_record("embed", (0,), 31, 9000, 11000)]
    recs += [_record("down", (2, 0, 0, 0), 31, 12500, 15500)]
    recs += [_record("down", (2, 0, 0, 1), 32, 12500, 13500)]
    flat = [len(recs)] + [w for r in recs for w in r]
    trace = Trace.decode(np.array(flat, dtype=np.uint64), "g", TASKS, GRIDS)
    lines = trace_analysis.ranges(trace, (4, 2, 8, 32))
    assert lines == [
        "attention <- qkv: stage ends earlier by 1.00 us (median of layers 2-2; 1.00..1.00), "
        "start delay 0.80 us",
        "o_proj <- attention: stage ends earlier by 0.00 us (median of layers 2-2; 0.00..0.00), "
        "start delay 0.50 us",
        "down <- gate_up: stage ends earlier by 1.00 us (median of layers 2-2; 1.00..1.00), "
        "start delay 0.50 us",
    ]

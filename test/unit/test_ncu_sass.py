"""``bench/ncu_sass.py``: Nsight Compute's per-SASS CSV split into functions
(at each unpredicated RET or EXIT) and summed per region."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import ncu_sass  # noqa: E402

HEADER = ["Address", "Source", ncu_sass.SAMPLES, "Instructions Executed", "stall_barrier",
          "stall_long_sb", "stall_long_sb (Not Issued)"]  # fmt: skip
ROWS = [
    ("0x0", "LDC R1, c[0x0][0x28]", 2, 10, 2, 0),
    ("0x10", "@P0 EXIT", 0, 10, 0, 0),  # predicated: the kernel goes on
    ("0x20", "BAR.SYNC.DEFER_BLOCKING 0x0", 5, 10, 5, 0),
    ("0x30", "EXIT", 1, 10, 1, 0),
    ("0x40", "HMMA.16816.F32.BF16 R4, R8, R12, R4", 3, 20, 0, 3),
    ("0x50", "LDGSTS.E.BYPASS.128 [R2], desc[UR4][R6.64]", 9, 20, 0, 9),
    ("0x60", "RET.REL.NODEC R20 0x0", 0, 20, 0, 0),
]


def _csv(path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "llama"])
        w.writerow(HEADER)
        for a, s, n, e, bar, lsb in ROWS:
            w.writerow([a, f"      {s}", n, e, bar, lsb, lsb])
    return path


def test_regions_split_at_unpredicated_returns(tmp_path):
    header, rows = ncu_sass.read(_csv(tmp_path / "k.csv"))
    parts = ncu_sass.regions(header, rows)
    assert [len(p) for p in parts] == [4, 3]


def test_summary_per_function_and_hot_instructions(tmp_path, capsys):
    path = _csv(tmp_path / "k.csv")
    assert ncu_sass.main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "20 samples, 2 regions"
    assert "40.0 % of the samples, 40 executed" in lines[1] and "barrier 100 %" in lines[1]
    assert "HMMAx1 LDGSTSx1" in lines[2] and "long_sb 100 %" in lines[2]
    assert ncu_sass.main([str(path), "--region", "1", "--top", "1"]) == 0
    hot = capsys.readouterr().out.splitlines()
    assert len(hot) == 1 and "LDGSTS" in hot[0] and "75.0 %" in hot[0]

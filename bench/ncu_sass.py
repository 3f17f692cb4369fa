"""Where a kernel's warps stall, by function and by instruction, from Nsight
Compute's per-SASS CSV (``ncu -i R.ncu-rep --page source --csv --print-source
sass``; e.g. ``bench/gpu_session49.sh sass8``).

    python bench/ncu_sass.py FILE.csv[.gz]              # one row per function
    python bench/ncu_sass.py FILE.csv[.gz] --region 4   # its hottest instructions

The CSV lists the kernel's SASS by address with no function names. A called
tile (``DeviceFunction.called``) is its own function, so the rows are split
after each unpredicated ``RET`` or ``EXIT``; each region is shown with the
instructions that identify it (tensor-core ``HMMA``, TMA copies, ``cp.async``,
``MUFU.EX2``, global atomics) and its top stall reasons.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
#: Opcodes that say what a region is.
MARKERS = ("HMMA", "UTMALDG", "LDGSTS", "MUFU", "ATOMG", "SYNCS")


def read(path: Path) -> tuple[list[str], list[list[str]]]:
    """The CSV's column names and instruction rows (its first line names the kernel)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    return rows[1], rows[2:]


def regions(header: list[str], rows: list[list[str]]) -> list[list[list[str]]]:
    """The rows split after each unpredicated RET or EXIT."""
    src = header.index("Source")
    out, cur = [], []
    for r in rows:
        cur.append(r)
        if re.match(r"(RET|EXIT)\b", r[src].strip()):
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def _opcode(source: str) -> str:
    words = source.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", type=Path)
    p.add_argument("--region", type=int, help="list this region's hottest instructions")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    header, rows = read(args.csv)
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def samples(r: list[str]) -> int:
        return int(r[col[SAMPLES]] or 0)

    def stalls(rs: list[list[str]], most: int) -> str:
        got = collections.Counter({h[6:]: sum(int(r[col[h]] or 0) for r in rs) for h in reasons})
        total = sum(got.values())
        if not total:
            return "no samples"
        return ", ".join(f"{h} {100 * v / total:.0f} %" for h, v in got.most_common(most))

    parts = regions(header, rows)
    total = sum(samples(r) for r in rows) or 1
    if args.region is None:
        print(f"{total} samples, {len(parts)} regions")
        for k, part in enumerate(parts):
            s = sum(samples(r) for r in part)
            ops = collections.Counter(_opcode(r[col["Source"]]) for r in part)
            marks = " ".join(f"{m}x{ops[m]}" for m in MARKERS if ops[m])
            executed = sum(int(r[col["Instructions Executed"]] or 0) for r in part)
            print(
                f"region {k:2d}: {len(part):5d} instructions, {100 * s / total:5.1f} % of the "
                f"samples, {executed} executed | {marks} | {stalls(part, 4)}"
            )
        return 0
    part = parts[args.region]
    s = sum(samples(r) for r in part) or 1
    hot = sorted(range(len(part)), key=lambda i: -samples(part[i]))[: args.top]
    for i in sorted(hot):
        r = part[i]
        print(
            f"{i:5d} {100 * samples(r) / s:5.1f} % {r[col['Instructions Executed']]:>10s}  "
            f"{r[col['Source']].strip()[:64]:64s} {stalls([r], 2)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

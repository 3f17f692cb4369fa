"""Per-SM load of one task in a Chrome trace of ``etc.runtime`` (``Trace.to_chrome``).

    python bench/trace_sm_load.py TRACE.json TASK

Prints how CTAs map to SMs (CTA c on SM f(c)), how many instances of TASK
each SM ran, and their median duration and last end by that count: whether
SMs with two instances of a stage end it later than SMs with one.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def main(path: str, task: str) -> None:
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    sm_of = {e["args"]["cta"]: e["tid"] for e in events}
    ctas = sorted(sm_of)
    print("CTA -> SM, first 12:", [(c, sm_of[c]) for c in ctas[:12]])
    print("CTA -> SM, 132..143:", [(c, sm_of[c]) for c in ctas[132:144]])
    mine = [e for e in events if e["name"] == task]
    per_sm = defaultdict(list)
    for e in mine:
        per_sm[e["tid"]].append(e)
    sms = {e["tid"] for e in events}
    by_count = defaultdict(list)
    for sm in sms:
        by_count[len(per_sm.get(sm, []))].append(sm)
    for n in sorted(by_count):
        evs = [e for sm in by_count[n] for e in per_sm.get(sm, [])]
        if not evs:
            print(f"{len(by_count[n])} SMs ran no {task}")
            continue
        durs = [e["dur"] for e in evs]
        ends = [e["ts"] + e["dur"] for e in evs]
        print(
            f"{len(by_count[n])} SMs ran {n} {task}: median {statistics.median(durs):.2f} us, "
            f"last end {max(ends):.1f} us, median end {statistics.median(ends):.1f} us"
        )


if __name__ == "__main__":
    main(*sys.argv[1:3])

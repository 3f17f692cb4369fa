"""Where a traced launch loses time between and across CTAs and SMs.

    python bench/trace_analysis.py TRACE.npz placement            # CTA -> SM, a layer's stages per SM
    python bench/trace_analysis.py TRACE.npz spread TASK          # TASK's ends per CTA and per SM
    python bench/trace_analysis.py TRACE.npz gaps                 # idle between a CTA's instances
    python bench/trace_analysis.py TRACE.npz parts TASK[,TASK]    # split-K: the last part vs the others
    python bench/trace_analysis.py TRACE.npz replay TASK[,TASK]   # each task dealt at run time instead
    python bench/trace_analysis.py TRACE.npz sm-speed TASK        # do an SM's instances run at its own pace?
    python bench/trace_analysis.py TRACE.npz ranges               # waits on the producer blocks read, not the stage

``TRACE.npz``: a :meth:`etc.runtime.trace.Trace.save` file (``bench/decode_trace.py
--out`` writes one per schedule and batch). ``--layer`` picks the layer of
the per-layer views (default 8). Times are µs after the first start of the
instances looked at.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from etc.models.llama import LLAMA_3_2_1B  # noqa: E402
from etc.runtime.trace import (  # noqa: E402
    Trace,
    cta_timelines,
    deal_replay,
    ends_by_place,
    gaps_by_pair,
)

STAGES = ("qkv", "attention", "combine", "o_proj", "gate_up", "down")


def _us(ns: int, t0: int) -> float:
    return (ns - t0) / 1e3


def _pct(values, qs) -> list[float]:
    return np.percentile(np.asarray(values, dtype=float), qs).round(1).tolist()


def placement(trace: Trace, layer: int) -> list[str]:
    """Which SM each CTA ran on, and how many of a layer's instances each SM
    ran per stage, with the SMs' last ends by that count."""
    events = trace.events()
    sm_of: dict[int, set] = collections.defaultdict(set)
    for e in events:
        sm_of[e["cta"]].add(e["sm"])
    moved = sum(len(s) > 1 for s in sm_of.values())
    first = {c: min(s) for c, s in sm_of.items()}
    per_sm = collections.Counter(first.values())
    out = [
        f"{len(sm_of)} CTAs, {moved} seen on more than one SM; CTAs per SM: "
        f"{dict(collections.Counter(per_sm.values()))}",
        f"SMs of CTAs 0..15: {[first[c] for c in range(min(16, len(first)))]}",
    ]
    for stage in STAGES:
        per_sm = ends_by_place(trace, stage, keep=lambda e: e["instance"][0] == layer)
        if not per_sm:
            continue
        ends: dict[int, list] = collections.defaultdict(list)
        for count, end in per_sm.values():
            ends[count].append(end)
        window = max(end for _, end in per_sm.values())
        detail = ", ".join(
            f"{n}/SM on {len(v)} SMs end median {np.median(v):.2f} max {max(v):.2f}"
            for n, v in sorted(ends.items())
        )
        total = sum(count for count, _ in per_sm.values())
        out.append(f"{stage:10s} {total:4d} instances, window {window:.2f}: {detail}")
    return out


def spread(trace: Trace, task: str) -> list[str]:
    """``task``'s instances per CTA and per SM, their durations, the ends by
    count, the slowest and fastest SMs, and how many run every 5 µs."""
    evs = [e for e in trace.events() if e["task"] == task]
    t0 = min(e["start_ns"] for e in evs)
    durs = [(e["end_ns"] - e["start_ns"]) / 1e3 for e in evs]
    out = [f"{task}: {len(evs)} instances, duration pct 5/50/95/100 {_pct(durs, [5, 50, 95, 100])}"]
    for key in ("cta", "sm"):
        last = ends_by_place(trace, task, key)
        by_count: dict[int, list] = collections.defaultdict(list)
        for count, end in last.values():
            by_count[count].append(end)
        for n, v in sorted(by_count.items()):
            out.append(
                f"  {key}s with {n}: {len(v)}, end pct 0/50/90/100 {_pct(v, [0, 50, 90, 100])}"
            )
        if key == "sm":
            show = sorted(
                ((s, n, round(end, 1)) for s, (n, end) in last.items()), key=lambda x: x[2]
            )
            out.append(f"  fastest SMs (sm, instances, end) {show[:6]}")
            out.append(f"  slowest SMs {show[-6:]}")
    end = max(_us(e["end_ns"], t0) for e in evs)
    active = [
        sum(1 for e in evs if _us(e["start_ns"], t0) <= x < _us(e["end_ns"], t0))
        for x in np.arange(0.0, end, 5.0)
    ]
    out.append(f"  running every 5 us: {active}")
    return out


def gaps(trace: Trace) -> list[str]:
    """Idle CTA time from an instance's end to the start of the CTA's next
    one (after its waits), by (task, next task)."""
    rows = sorted(gaps_by_pair(trace).items(), key=lambda kv: -sum(kv[1]))
    return [
        f"{a:>12s} -> {b:12s} {len(g):6d}  median {np.median(g):6.2f}  sum {sum(g):8.0f} us"
        for (a, b), g in rows
    ]


def parts(trace: Trace, tasks: str, layer: int) -> list[str]:
    """Per split-K task: within each output block (the instance's
    coordinates but the last), the last part to end against the others."""
    events = trace.events()
    out = []
    for task in tasks.split(","):
        evs = [e for e in events if e["task"] == task and e["instance"][0] == layer]
        blocks: dict[tuple, list] = collections.defaultdict(list)
        for e in evs:
            blocks[e["instance"][:-1]].append(e)
        if not evs:
            out.append(f"{task}: no instances in layer {layer}")
            continue
        if max(len(v) for v in blocks.values()) < 2:
            out.append(f"{task}: one part per output block (not split), nothing to compare")
            continue
        lag, last_d, other_d = [], [], []
        for v in blocks.values():
            if len(v) < 2:
                continue
            v.sort(key=lambda x: x["end_ns"])
            lag.append((v[-1]["end_ns"] - v[-2]["end_ns"]) / 1e3)
            last_d.append((v[-1]["end_ns"] - v[-1]["start_ns"]) / 1e3)
            other_d += [(x["end_ns"] - x["start_ns"]) / 1e3 for x in v[:-1]]
        out.append(
            f"{task}: {len(blocks)} blocks of {len(evs) // max(1, len(blocks))} parts; the last "
            f"ends {np.median(lag):.2f} us (median) after the one before; durations: last "
            f"{np.median(last_d):.2f}, others {np.median(other_d):.2f} (medians)"
        )
    return out


def replay(trace: Trace, tasks: str, layer: int) -> list[str]:
    """Per task (one layer's instances for the layer stages, STAGES): its
    recorded window against :func:`etc.runtime.trace.deal_replay`'s, as
    listed (each CTA's pace, whole instances), in halves and quarters that
    cost 1.5 µs more each (a ring restart's order)."""
    out = []
    for task in tasks.split(","):

        def keep(e, layered=task in STAGES):
            return not layered or e["instance"][0] == layer

        recorded, whole = deal_replay(trace, task, keep)
        halves = deal_replay(trace, task, keep, split=2, overhead_us=1.5)[1]
        quarters = deal_replay(trace, task, keep, split=4, overhead_us=1.5)[1]
        out.append(
            f"{task}: recorded {recorded:7.1f} us; dealt at run time {whole:7.1f}, "
            f"in halves {halves:7.1f}, in quarters {quarters:7.1f}"
        )
    return out


def sm_speed(trace: Trace, task: str) -> list[str]:
    """Whether ``task``'s instances run at a speed that belongs to their SM:
    each SM's mean instance duration over the even and over the odd layers,
    their correlation, and the fastest and slowest SMs."""
    per: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
    for e in trace.events():
        if e["task"] == task:
            per[e["instance"][0] % 2, e["sm"]].append((e["end_ns"] - e["start_ns"]) / 1e3)
    sms = sorted({sm for _, sm in per if (0, sm) in per and (1, sm) in per})
    if len(sms) < 3:
        return [f"{task}: too few SMs ran it in both even and odd layers"]
    even = np.array([np.mean(per[0, sm]) for sm in sms])
    odd = np.array([np.mean(per[1, sm]) for sm in sms])
    both = (even + odd) / 2
    order = np.argsort(both)
    return [
        f"{task}: {len(sms)} SMs; mean duration per SM, even vs odd layers: correlation "
        f"{np.corrcoef(even, odd)[0, 1]:.2f}",
        f"  per-SM mean pct 0/10/50/90/100 {_pct(both, [0, 10, 50, 90, 100])} us",
        f"  fastest {[(sms[i], round(float(both[i]), 1)) for i in order[:6]]}",
        f"  slowest {[(sms[i], round(float(both[i]), 1)) for i in order[-6:]]}",
    ]


def _needs(trace: Trace, dims: tuple[int, int, int, int]) -> dict[str, tuple[str, Callable]]:
    """For the large kernel's instances (``(l, j, i, s)`` projections with
    their column block first, attention ``(l, b, kv head, split)``), which
    producer blocks each consumer reads: attention the qkv column blocks of
    its query heads, key and value; o_proj part ``s`` the attention of the
    kv heads whose outputs are its slice of k; down part ``s`` the gate/up
    blocks of its slice of k. ``dims``: heads, kv heads, head dim, inter."""
    heads, kv_heads, hd, inter = dims
    grid = dict(zip(trace.task_names, trace.task_grids, strict=True))
    bn_qkv = (heads + 2 * kv_heads) * hd // grid["qkv"][1]
    o_slice = heads * hd // grid["o_proj"][-1]  # k columns of one o_proj part
    h_block = inter // grid["gate_up"][1]  # h columns of one gate/up block
    d_slice = inter // grid["down"][-1]
    q_per_kv = heads // kv_heads

    def qkv_blocks(c: int, width: int) -> set[int]:
        return set(range(c // bn_qkv, (c + width - 1) // bn_qkv + 1))

    def attention(inst):
        h = inst[2]
        return (
            qkv_blocks(h * q_per_kv * hd, q_per_kv * hd)
            | qkv_blocks((heads + h) * hd, hd)
            | qkv_blocks((heads + kv_heads + h) * hd, hd)
        )

    def o_proj(inst):
        s = inst[-1]
        first, last = s * o_slice // hd // q_per_kv, ((s + 1) * o_slice - 1) // hd // q_per_kv
        return set(range(first, last + 1))

    def down(inst):
        s = inst[-1]
        return set(range(s * d_slice // h_block, ((s + 1) * d_slice - 1) // h_block + 1))

    return {
        "attention": ("qkv", lambda e: e["instance"][1], attention),
        "o_proj": ("attention", lambda e: e["instance"][2], o_proj),
        "down": ("gate_up", lambda e: e["instance"][1], down),
    }


def ranges(trace: Trace, dims: tuple[int, int, int, int]) -> list[str]:
    """An upper bound on waits for the producer blocks a consumer reads
    instead of the whole producer stage (the large kernel's attention,
    o_proj and down). Per layer (2-13): each consumer instance starts when
    its blocks have ended (or its CTA's previous instance has), plus the
    stage's median measured delay from "could start" to start, never later
    than it did; the stage's end moves by as much as its latest instance.
    Durations are kept, so an instance that starts inside its producer's
    tail runs as fast as it did after it (hence a bound)."""
    events = trace.events()
    by_task: dict[str, list] = collections.defaultdict(list)
    for e in events:
        by_task[e["task"]].append(e)
    prev_end: dict[int, int] = {}  # id(event): the end of its CTA's previous instance
    for records in cta_timelines(events):
        for a, b in zip(records, records[1:], strict=False):
            prev_end[id(b)] = a["end_ns"]
    layers = sorted({e["instance"][0] for e in by_task["down"]})[2:-2]
    out = []
    for task, (producer, block, needs) in _needs(trace, dims).items():
        saved, delays = [], []
        for layer in layers:
            made = [e for e in by_task[producer] if e["instance"][0] == layer]
            used = [e for e in by_task[task] if e["instance"][0] == layer]
            whole = max(e["end_ns"] for e in made)
            ready: dict[int, int] = collections.defaultdict(int)
            for e in made:
                ready[block(e)] = max(ready[block(e)], e["end_ns"])
            free = [max(whole, prev_end.get(id(e), 0)) for e in used]
            # ints throughout: the stamps are ~1e18 ns, past a double's ns precision
            delay = round(
                float(np.median([e["start_ns"] - f for e, f in zip(used, free, strict=True)]))
            )
            end = 0
            for e in used:
                could = max(max(ready[b] for b in needs(e["instance"])), prev_end.get(id(e), 0))
                start = min(could + delay, e["start_ns"])
                end = max(end, start + e["end_ns"] - e["start_ns"])
            saved.append((max(e["end_ns"] for e in used) - end) / 1e3)
            delays.append(delay / 1e3)
        out.append(
            f"{task} <- {producer}: stage ends earlier by {np.median(saved):.2f} us (median of "
            f"layers {layers[0]}-{layers[-1]}; {min(saved):.2f}..{max(saved):.2f}), start delay "
            f"{np.median(delays):.2f} us"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument(
        "view", choices=("placement", "spread", "gaps", "parts", "replay", "sm-speed", "ranges")
    )
    p.add_argument("task", nargs="?", default="lm_head")
    p.add_argument("--layer", type=int, default=8)
    args = p.parse_args(argv)
    trace = Trace.load(args.trace)
    if args.view == "placement":
        lines = placement(trace, args.layer)
    elif args.view == "spread":
        lines = spread(trace, args.task)
    elif args.view == "gaps":
        lines = gaps(trace)
    elif args.view == "parts":
        lines = parts(trace, args.task, args.layer)
    elif args.view == "sm-speed":
        lines = sm_speed(trace, args.task)
    elif args.view == "ranges":
        c = LLAMA_3_2_1B
        lines = ranges(trace, (c.heads, c.kv_heads, c.head_dim, c.inter))
    else:
        lines = replay(trace, args.task, args.layer)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

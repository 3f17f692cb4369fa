"""Where a Llama-3.2-1B decode step's time goes: a traced launch per batch size.

    python bench/decode_trace.py --build DIR                  # CPU: traced artifacts
    python bench/decode_trace.py --artifacts DIR --out OUT    # GPU: tables, timelines

Per task (summed over layers): instances, median instance duration, busy
time summed over instances, and the CTA time idle before its instances
(``etc.runtime.trace.idle_before``). Per stage of a middle layer: the window from the
first instance's start to the last one's end (µs after the step's first
task started), and the gap from the previous stage's last end (the
dependency latency the graph's barriers cost). A trace record starts after
the instance's waits and ends after its closing barrier. Three launches,
the last traced; the static and dynamic schedules (``llama.compile_options``).
With ``LlamaConfig.attn_stamps`` (``decode_sweep`` variants ``stamps_*``),
also the attention instances' phases from their own clock stamps
(:func:`stamp_table`); with ``LlamaConfig.gemm_stamps`` (``stamps_large``),
the tma core's projection parts' (:func:`gemm_stamp_table`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from etc.models import llama as M  # noqa: E402
from etc.runtime.trace import idle_before  # noqa: E402
from etc.tiles.llama import PHASED_STAMPS  # noqa: E402

CFG = M.LLAMA_3_2_1B
#: Artifact name -> (configuration, schedule).
VARIANTS = {
    # The default artifact (a kernel per batch range: B=1, 2..16, 17..) and
    # its dynamic twin; each launch runs the kernel whose range holds B.
    "static": (CFG, "static"),
    "dynamic": (CFG, "dynamic"),
}
#: ``DECODE_TRACE_VARIANTS=default,tma_large`` traces those variants of
#: ``bench/decode_sweep.py`` (static schedule) instead.
if os.environ.get("DECODE_TRACE_VARIANTS"):
    from bench import decode_sweep

    VARIANTS = {
        name: (decode_sweep.config(name), "static")
        for name in os.environ["DECODE_TRACE_VARIANTS"].split(",")
    }
BATCHES = (1, 64)
if os.environ.get("DECODE_TRACE_BATCHES"):
    BATCHES = tuple(int(b) for b in os.environ["DECODE_TRACE_BATCHES"].split(","))
CONTEXTS = (1024,)
#: ``DECODE_TRACE_CONTEXT=4096`` (or ``1024,4096``) traces those contexts instead.
if os.environ.get("DECODE_TRACE_CONTEXT"):
    CONTEXTS = tuple(int(x) for x in os.environ["DECODE_TRACE_CONTEXT"].split(","))
STAGES = (
    "norm1",
    "qkv",
    "attention",
    "l2_prefetch",
    "combine",
    "o_proj",
    "norm2",
    "gate_up",
    "down",
)


def build(out: Path) -> None:
    for name, (cfg, schedule) in VARIANTS.items():
        M.compile_decoder(cfg, schedule, trace=True).save(out / name)


def tables(trace) -> tuple[str, dict]:
    events = trace.events()
    idle = idle_before(trace)
    t0 = min(e["start_ns"] for e in events)
    total = (max(e["end_ns"] for e in events) - t0) / 1e3
    per_task: dict[str, list] = {}
    for e in events:
        per_task.setdefault(e["task"], []).append(e)
    lines = [f"step {total:.1f} us (first start to last end)"]
    lines.append(f"{'task':12s} {'n':>6s} {'median us':>10s} {'busy us':>10s} {'idle before':>12s}")
    data: dict = {"step_us": total, "tasks": {}, "layer": {}}
    for name, evs in per_task.items():
        durs = [(e["end_ns"] - e["start_ns"]) / 1e3 for e in evs]
        data["tasks"][name] = {"n": len(evs), "median_us": statistics.median(durs)}
        data["tasks"][name]["busy_us"] = sum(durs)
        data["tasks"][name]["idle_before_us"] = idle.get(name, 0.0)
        lines.append(
            f"{name:12s} {len(evs):6d} {statistics.median(durs):10.2f} {sum(durs):10.1f} "
            f"{idle.get(name, 0.0):12.1f}"
        )
    layer = CFG.layers // 2
    prev_end = None
    lines.append(f"layer {layer}: {'stage':10s} {'start':>8s} {'end':>8s} {'gap':>7s}")
    for stage in STAGES:
        evs = [e for e in per_task.get(stage, []) if e["instance"][0] == layer]
        if not evs:
            continue
        start = (min(e["start_ns"] for e in evs) - t0) / 1e3
        end = (max(e["end_ns"] for e in evs) - t0) / 1e3
        gap = start - prev_end if prev_end is not None else 0.0
        data["layer"][stage] = {"start_us": start, "end_us": end, "gap_us": gap}
        lines.append(f"         {stage:10s} {start:8.1f} {end:8.1f} {gap:7.1f}")
        if stage != "l2_prefetch":  # beside the attention, not after it
            prev_end = end
    return "\n".join(lines), data


def stamp_table(stamps) -> tuple[str, dict]:
    """The phases of the attention instances from ``attn_stamps`` (layers, B,
    kv heads, splits, len(STAMPS)): median and 90th percentile over the instances, in
    µs (thread 0's clock, converted by each instance's own ratio of clock
    cycles to ``%globaltimer`` ns between its entry and end)."""

    from etc.tiles.attention_mma import STAMPS

    w, x, ghz = _stamped(stamps, STAMPS)
    phases = (
        ("query and key roped", "entry", "setup"),
        ("then step 0's stage in", "setup", "step0_full"),
        ("then its data read", "step0_full", "step0_data"),
        ("step 0's arithmetic", "step0_data", "step0_end"),
        ("the later steps", "step0_end", "loop_end"),
        ("warp 0 to every warp", "loop_end", "warps_done"),
        ("merge and partials", "warps_done", "end"),
        ("whole instance", "entry", "end"),
    )
    lines, data = _phase_table(f"attention stamps: {len(x)} instances", w, ghz, phases, x)
    data["instances"] = len(x)
    return "\n".join(lines), data


def gemm_stamp_table(stamps) -> tuple[str, dict]:
    """The phases of the tma core's projection instances from
    ``gemm_stamps`` (layers, projection, slots, len(STAMPS)), per projection:
    the k loop after the waits, then a part's store and count, or in a
    block's last part (which stamped ``met`` between its k loop's end and
    its end in this launch) the count and the other parts' loads, then its
    epilogue (µs, median and 90th percentile)."""
    import numpy as np

    from etc.tiles.gemm_layer_tma import STAMPS

    lines, data = [], {}
    for row, projection in enumerate(("qkv", "o_proj", "gate_up", "down")):
        if not np.asarray(stamps)[:, row, :, STAMPS.index("end")].any():
            continue  # not on the tma core, or not run
        w, x, ghz = _stamped(stamps[:, row], STAMPS)
        # Only a block's last part stamps ``met``, and which part is last
        # changes between launches: a ``met`` outside the part's own k loop
        # end and end is an earlier launch's, left in the buffer.
        met = x[:, w["met"]]
        is_last = (met >= x[:, w["loop_end"]]) & (met <= x[:, w["end"]])
        last = x[is_last]
        phases = (
            ("k loop (after the waits)", "entry", "loop_end"),
            ("part stored and counted", "loop_end", "end"),
            ("last: counted, parts met", "loop_end", "met"),
            ("last: epilogue", "met", "end"),
            ("whole instance", "entry", "end"),
        )

        def rows_of(label: str, x=x, last=last, is_last=is_last):
            if label.startswith("last"):
                return last
            return x[~is_last] if label.startswith("part") else x

        title = f"{projection} stamps: {len(x)} instances, {len(last)} last parts"
        block, data[projection] = _phase_table(title, w, ghz, phases, rows_of)
        lines += block
    return "\n".join(lines), data


def _stamped(stamps, names):
    """``(word index by name, the rows of the instances that ran, clock GHz)``
    of a stamps tensor whose last dimension holds ``names`` (``entry``,
    ``end``, ``entry_ns``, ``end_ns`` among them): the clock's rate is the
    median over instances of their cycles over their ``%globaltimer`` ns."""
    import numpy as np

    w = {name: i for i, name in enumerate(names)}
    x = np.asarray(stamps, dtype=np.int64).reshape(-1, len(names))
    x = x[x[:, w["end"]] != 0]  # instances that ran
    cycles = (x[:, w["end"]] - x[:, w["entry"]]).astype(np.float64)
    ns = (x[:, w["end_ns"]] - x[:, w["entry_ns"]]).astype(np.float64)
    return w, x, float(np.median(cycles[ns > 0] / ns[ns > 0]))


def _phase_table(title: str, w: dict, ghz: float, phases, rows_of) -> tuple[list[str], dict]:
    """Lines and data of ``phases`` ``(label, from word, to word)``: median
    and 90th percentile in µs over ``rows_of`` (the stamp rows, or a
    function of the label giving them) that stamped both words; phases
    without such rows are left out."""
    import numpy as np

    lines = [f"{title}, clock {ghz:.2f} GHz", f"  {'phase':26s} {'median us':>10s} {'p90 us':>8s}"]
    data: dict = {"clock_ghz": ghz}
    for label, a, b in phases:
        rows = rows_of(label) if callable(rows_of) else rows_of
        rows = rows[(rows[:, w[a]] != 0) & (rows[:, w[b]] != 0)]  # both points stamped
        if not len(rows):
            continue
        us = (rows[:, w[b]] - rows[:, w[a]]) / (ghz * 1e3)
        med, p90 = float(np.median(us)), float(np.percentile(us, 90))
        data[label] = {"median_us": med, "p90_us": p90}
        lines.append(f"  {label:26s} {med:10.2f} {p90:8.2f}")
    return lines, data


def phased_stamp_table(stamps) -> tuple[str, dict]:
    """The phases of the phased attention's splits from ``attn_stamps``
    (layers, B, kv heads, splits, len(PHASED_STAMPS)): median and 90th
    percentile in µs (clock cycles over each split's ratio to the
    ``%globaltimer``), the merge apart for the split that merged its group
    (count = splits), and per group (µs, medians): the spread of the splits'
    entries, the merging split's entry after the group's first, and its
    end after the group's previous last end."""
    import numpy as np

    from etc.tiles.llama import PHASED_STAMPS

    grid = np.asarray(stamps, dtype=np.int64)
    splits = grid.shape[3]
    w, x, ghz = _stamped(grid, PHASED_STAMPS)
    merged = x[:, w["count"]] == splits
    phases = (
        ("queries and k roped", "entry", "roped"),
        ("K copies awaited", "roped", "k_ready"),
        ("scores", "k_ready", "scored"),
        ("softmax", "scored", "softmaxed"),
        ("values", "softmaxed", "valued"),
        ("partials stored", "valued", "partials"),
        ("count's atomic", "partials", "counted"),
        ("close (others)", "counted", "end"),
        ("merge: loads and folds", "counted", "merge_loaded"),
        ("merge: lanes' shuffles", "merge_loaded", "merge_folded"),
        ("merge: store and close", "merge_folded", "end"),
        ("merge (merging split)", "counted", "end"),
        ("whole (others)", "entry", "end"),
        ("whole (merging split)", "entry", "end"),
    )

    def rows_of(label: str):
        if "merging" in label or label.startswith("merge:"):
            return x[merged]
        return x[~merged] if "others" in label else x

    lines, data = _phase_table(f"phased attention stamps: {len(x)} splits", w, ghz, phases, rows_of)
    data["instances"] = len(x)
    groups = grid.reshape(-1, splits, len(PHASED_STAMPS))
    spread, late_entry, late_end = [], [], []
    for grp in groups:
        if not (grp[:, w["end"]] != 0).all():
            continue
        m = grp[:, w["count"]] == splits
        if m.sum() != 1:
            continue
        entries, ends = grp[:, w["entry_ns"]], grp[:, w["end_ns"]]
        spread.append((entries.max() - entries.min()) / 1e3)
        late_entry.append((entries[m][0] - entries.min()) / 1e3)
        late_end.append((ends[m][0] - ends[~m].max()) / 1e3 if (~m).any() else 0.0)
    for label, vals in (
        ("group: entries' spread", spread),
        ("group: merger's entry late", late_entry),
        ("group: merger's end late", late_end),
    ):
        if vals:
            med = float(np.median(vals))
            data[label] = {"median_us": med}
            lines.append(f"  {label:26s} {med:10.2f}")
    return "\n".join(lines), data


def stamp_gaps(trace, stamps, items: int = 1) -> tuple[str, dict]:
    """What comes between an attention instance and the instance before it on
    its CTA (µs, medians; by the previous instance's task): the previous
    one's notify and the queue's step to the prefetch function, the prefetch
    (the ring's first steps issued), the waits, and the body's entry, from
    the trace's ns and the stamps' ``%globaltimer`` words. With ``items``
    kv heads per instance, its first item's stamps hold the prefetch and
    its last item's the body's end."""
    import numpy as np

    from etc.tiles.attention_mma import STAMPS

    w = {name: i for i, name in enumerate(STAMPS)}
    stamps = np.asarray(stamps, dtype=np.int64)
    events = trace.events()
    by_cta: dict[int, list] = {}
    for e in events:
        by_cta.setdefault(e["cta"], []).append(e)
    rows: dict[str, list] = {}
    for evs in by_cta.values():
        evs.sort(key=lambda e: e["start_ns"])
        for prev, e in zip(evs, evs[1:], strict=False):
            if e["task"] != "attention":
                continue
            x = stamps[_item(e["instance"], items, 0)]
            if not x[w["prefetch_ns"]]:
                continue
            pf, pf_end = int(x[w["prefetch_ns"]]), int(x[w["prefetch_end_ns"]])
            rows.setdefault(prev["task"], []).append(
                (pf - prev["end_ns"], pf_end - pf, e["start_ns"] - pf_end,
                 int(x[w["entry_ns"]]) - e["start_ns"])
            )  # fmt: skip
    # The instance's own end: its body's last stamp to the trace's end (the
    # closing barrier, the notify's release, the trace's clock read).
    last = items - 1
    tail = [
        e["end_ns"] - int(stamps[_item(e["instance"], items, last)][w["end_ns"]])
        for e in events
        if e["task"] == "attention" and stamps[_item(e["instance"], items, last)][w["end_ns"]]
    ]
    labels = ("notify, to prefetch", "prefetch", "waits", "to the body")
    lines = [f"  after {'task':10s} {'n':>5s} " + " ".join(f"{s:>20s}" for s in labels)]
    data = {}
    for task, r in sorted(rows.items()):
        med = np.median(np.asarray(r, dtype=np.float64), axis=0) / 1e3
        data[task] = dict(zip(labels, med.tolist(), strict=True), n=len(r))
        lines.append(f"  after {task:10s} {len(r):5d} " + " ".join(f"{v:20.2f}" for v in med))
    if tail:
        data["body_end_to_trace_end_us"] = float(np.median(tail)) / 1e3
        lines.append(f"  body's end to the trace's end (notify): {np.median(tail) / 1e3:.2f} us")
    return "\n".join(lines), data


def _item(instance, items: int, item: int) -> tuple:
    """The stamps' index of item ``item`` of attention instance ``(l, b, g, s)``."""
    l, b, g, s = instance  # noqa: E741
    return (l, b, g * items + item, s)


def run(artifacts: Path, out: Path | None, png: bool = False) -> None:
    import numpy as np
    import torch

    import etc.runtime

    weights = M.random_weights_torch(CFG)
    text, results = [], {}
    for schedule, (cfg, _) in VARIANTS.items():
        kernel = etc.runtime.load(artifacts / schedule)
        for L, B in ((ctx, b) for ctx in CONTEXTS for b in BATCHES):
            bufs = M.torch_inputs(cfg, weights, B, L, L + 1)
            syms = {"B": B, "L": L, "S": L + 1}
            for _ in range(3):
                kernel.launch(bufs, syms, sync=False)
            trace = kernel.trace()
            kernel.check()
            block, data = tables(trace)
            if "attn_stamps" in bufs:
                stamps = bufs["attn_stamps"].cpu().numpy()
                if out is not None:
                    out.mkdir(parents=True, exist_ok=True)
                    np.save(out / f"stamps_{schedule}_B{B}_L{L}.npy", stamps)
                if stamps.shape[-1] == len(PHASED_STAMPS):
                    text_s, data["attention_stamps"] = phased_stamp_table(stamps)
                else:
                    text_s, data["attention_stamps"] = stamp_table(stamps)
                    text_g, data["attention_gaps"] = stamp_gaps(
                        trace, stamps, cfg.kernel_for(B, L).attn_items
                    )
                    text_s += "\n" + text_g
                block += "\n" + text_s
            if "gemm_stamps" in bufs:
                stamps = bufs["gemm_stamps"].cpu().numpy()
                if out is not None:
                    out.mkdir(parents=True, exist_ok=True)
                    np.save(out / f"gemm_stamps_{schedule}_B{B}_L{L}.npy", stamps)
                text_s, data["gemm_stamps"] = gemm_stamp_table(stamps)
                block += "\n" + text_s
            key = f"{schedule}_B{B}" + (f"_L{L}" if len(CONTEXTS) > 1 else "")
            if out is not None:  # raw records, for per-SM and per-CTA analysis
                out.mkdir(parents=True, exist_ok=True)
                trace.save(out / f"trace_{key}.npz")
            title = f"== {schedule} B={B} L={L}"
            print(title + "\n" + block, flush=True)
            text.append(title + "\n" + block)
            results[key] = data
            if out is not None and png and B == 1:
                # to_png draws one rectangle per instance: minutes at B=64
                # (88 000 instances), which ran this script past its limit.
                out.mkdir(parents=True, exist_ok=True)
                trace.to_png(out / f"decode_trace_{schedule}_B{B}.png")
            del bufs
            torch.cuda.empty_cache()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode_trace.txt").write_text("\n\n".join(text) + "\n")
        (out / "decode_trace.json").write_text(json.dumps(results, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path)
    p.add_argument("--artifacts", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--png", action="store_true", help="draw the B=1 timelines (minutes)")
    args = p.parse_args(argv)
    if args.build:
        build(args.build)
    if args.artifacts:
        run(args.artifacts, args.out, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

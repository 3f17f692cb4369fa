"""Where the time goes in the fused MoE kernel: per-task timelines of traced
launches (``etc.compile(..., trace=True)``, ``kernel.trace()``).

    python bench/moe_trace.py --build DIR                    # CPU: traced artifacts
    python bench/moe_trace.py --artifacts DIR --out OUTDIR   # GPU: tables, Chrome traces

(``bench/moe.py --trace`` runs both steps next to the benchmark.) For every
T of ``bench/moe.py`` and every fused variant (tile configuration, with its
``OCCUPANCY`` if it has one, x
schedule): uniform random routing, three launches (the last one traced),
the output checked against the float32 torch reference, then a table per
task: instances that ran, median duration, first start and last end (µs
after the kernel's first task started; a trace record starts after the
instance's waits and ends after its closing barrier), and the summed busy
time. ``trace_<variant>_T<T>.json`` (Chrome / Perfetto format, one track
per SM) for T in CHROME_SIZES; every table in ``moe_trace.txt`` and
``moe_trace.json`` under OUTDIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.moe import (  # noqa: E402
    AUTO,
    CONFIGS,
    OCCUPANCY,
    ONE_CLAIM,
    SIZES,
    TARGETS,
    TOLERANCE,
    moe_config,
)
from etc.dtypes import torch_dtype  # noqa: E402
from etc.runtime.trace import idle_before  # noqa: E402

# "one": the dynamic schedule claiming one queue position at a time (bench/moe.py).
SCHEDULES = ("static", "dynamic", "one")
# BENCH_MOE_SCHEDULES=static limits the build and the run to those.
if os.environ.get("BENCH_MOE_SCHEDULES"):
    SCHEDULES = tuple(os.environ["BENCH_MOE_SCHEDULES"].split(","))
_OPTIONS = {"static": {}, "dynamic": {}, "one": ONE_CLAIM}
# Token counts with Chrome traces; BENCH_MOE_CHROME=1024,4096 picks others.
CHROME_SIZES = tuple(int(t) for t in os.environ.get("BENCH_MOE_CHROME", "1,128").split(","))
LAUNCHES = 3  # the last one is traced


def variants() -> list[tuple[str, str]]:
    """Every configuration but the bucketed one (trace its presets instead)."""
    return [(key, schedule) for key in CONFIGS if key != AUTO for schedule in SCHEDULES]


def artifact_name(key: str, schedule: str) -> str:
    return f"traced_{key}_{schedule}"


def build(out: Path) -> None:
    import etc
    from etc.models import moe as M

    for key, schedule in variants():
        g = M.build_moe_graph(moe_config(key), name=f"moe_{key}")
        # The configuration's occupancy (bench/moe.py's _occ variants) if it has one.
        occupancy = {"min_ctas_per_sm": OCCUPANCY[key]} if key in OCCUPANCY else {}
        art = etc.compile(
            g, schedule="static" if schedule == "static" else "dynamic", trace=True,
            target=TARGETS.get(key, "sm_90"), **_OPTIONS[schedule], **occupancy,
        )  # fmt: skip
        art.save(out / artifact_name(key, schedule))
        print("built", artifact_name(key, schedule))


def task_table(trace, split=None) -> dict:
    """Per task (graph order): instances, median / first start / last end /
    busy µs, times relative to the first record's start. ``split(event)``:
    a label suffix that divides a task's instances into rows (``""``: none)."""
    events = trace.events()
    if not events:
        return {"span_us": 0.0, "records": 0, "dropped": trace.dropped, "tasks": []}
    t0 = min(e["start_ns"] for e in events)

    def label_of(e: dict) -> str:
        return e["task"] + (split(e) if split else "")

    by_task: dict[str, list[dict]] = {}
    for e in events:
        by_task.setdefault(label_of(e), []).append(e)
    labels = []
    for name in trace.task_names:
        labels += sorted(lb for lb in by_task if lb.split("[")[0] == name) or [name]
    tasks = []
    for label in labels:
        es = by_task.get(label, [])
        durs = [(e["end_ns"] - e["start_ns"]) / 1e3 for e in es]
        tasks.append(
            {
                "task": label,
                "instances": len(es),
                "median_us": statistics.median(durs) if durs else 0.0,
                "first_start_us": min(e["start_ns"] - t0 for e in es) / 1e3 if es else None,
                "last_end_us": max(e["end_ns"] - t0 for e in es) / 1e3 if es else None,
                "busy_us": sum(durs),
            }
        )
    span = max(e["end_ns"] for e in events) - t0
    idle = idle_before(trace, label_of)
    for row in tasks:
        row["idle_before_us"] = idle.get(row["task"], 0.0)
    return {
        "span_us": span / 1e3,
        "records": len(events),
        "dropped": trace.dropped,
        "sms": len({e["sm"] for e in events}),
        "tasks": tasks,
        "idle_after_us": idle.get(None, 0.0),
    }


def format_table(title: str, table: dict) -> str:
    lines = [
        f"{title}: span {table['span_us']:.1f} us (first start -> last end), "
        f"{table['records']} instances on {table.get('sms', 0)} SMs"
        + (f", {table['dropped']} records dropped" if table["dropped"] else ""),
        f"  {'task':10s} {'inst':>6s} {'median us':>10s} {'first start':>12s} "
        f"{'last end':>10s} {'busy us':>10s} {'idle before':>12s}",
    ]
    for t in table["tasks"]:
        if not t["instances"]:
            lines.append(f"  {t['task']:10s} {0:6d}")
            continue
        lines.append(
            f"  {t['task']:10s} {t['instances']:6d} {t['median_us']:10.2f} "
            f"{t['first_start_us']:12.1f} {t['last_end_us']:10.1f} {t['busy_us']:10.1f} "
            f"{t.get('idle_before_us', 0.0):12.1f}"
        )
    lines.append(f"  idle after each CTA's last instance: {table.get('idle_after_us', 0.0):.1f} us")
    return "\n".join(lines)


def run(artifacts: Path, out: Path | None, sizes=SIZES) -> dict:
    import torch

    import etc.runtime
    from etc.models import moe as M

    start = time.perf_counter()
    cfg0 = moe_config(next(iter(CONFIGS)))
    W = M.random_weights_torch(cfg0, seed=0)
    kernels = {v: etc.runtime.load(artifacts / artifact_name(*v)) for v in variants()}
    results: dict = {"device": torch.cuda.get_device_name(), "rows": []}
    text: list[str] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for T in sizes:
        x = M.random_tokens_torch(cfg0, T, seed=7 * T + 1)
        ref = M.reference_moe_torch(x, W["Wr"], W["Wgu"], W["Wd"], cfg0.topk)[0]
        for key, schedule in variants():
            cfg = moe_config(key)
            if cfg.max_tokens is not None and T > cfg.max_tokens:
                continue  # its route tile's bound
            bufs = {
                n: torch.zeros(s, dtype=torch_dtype(d), device="cuda")
                for n, (s, d) in M.tensor_shapes(cfg, T).items()
                if n not in ("X", "Wr", "Wgu", "Wd")
            }
            bufs.update(W, X=x)
            kernel = kernels[(key, schedule)]
            for _ in range(LAUNCHES):
                kernel.launch(bufs, {"T": T}, sync=False)
            trace = kernel.trace()
            kernel.check()
            err = ((bufs["Out"].float() - ref).abs().max() / ref.abs().max()).item()
            table = task_table(trace)
            title = f"T={T} fused {key} {schedule}"
            if err > TOLERANCE:
                title += f" (WRONG: rel err {err:.3g})"
            block = format_table(title, table)
            print(block, flush=True)
            text.append(block)
            results["rows"].append(
                {"T": T, "config": key, "schedule": schedule, "rel_err": err, **table}
            )
            if out is not None and T in CHROME_SIZES:
                trace.to_chrome(out / f"trace_{key}_{schedule}_T{T}.json")
    print(f"traces ran in {time.perf_counter() - start:.0f} s")
    if out is not None:
        (out / "moe_trace.txt").write_text("\n\n".join(text) + "\n")
        (out / "moe_trace.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path, help="compile the traced artifacts into this directory")
    p.add_argument("--artifacts", type=Path, help="run with the artifacts in this directory")
    p.add_argument("--out", type=Path, help="directory for the tables and Chrome traces")
    p.add_argument("--tokens", default=",".join(map(str, SIZES)), help="values of T")
    args = p.parse_args(argv)
    if not (args.build or args.artifacts):
        p.error("give --build DIR and/or --artifacts DIR")
    if args.build:
        build(args.build)
    if args.artifacts:
        run(args.artifacts, args.out, tuple(int(t) for t in args.tokens.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

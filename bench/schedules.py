"""Static vs dynamic scheduling on the GPU (issue: dynamic scheduling).

    python bench/schedules.py --build DIR                 # CPU: compile
    python bench/schedules.py --artifacts DIR --out F.json  # GPU: check, time

Variants: static; dynamic with early push (consumers pushed when their last
producer is dispatched); dynamic pushing on completion. Workloads:
- split-K row sum (regular: dynamic should lose little), M=64 and 8192;
- skewed: stage one spins, every 16th tile 10x longer (irregular: the
  static round-robin puts all long tiles on the same CTAs);
- empty tasks: the per-task cost of handing out a task (pop vs static queue
  read), from the slope of time over tasks per CTA;
- chain: 64 one-instance tasks each waiting on the previous: the latency
  from a notify on one SM to the release of the wait on another.
Method: as bench/splitk.py, CUDA events around back-to-back launches, a sleep
kernel first so the host enqueues ahead (GPU time), medians of REPS, every
variant checked against numpy/float64 first.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "test" / "gpu"))

from graphs import GRAPHS, SCHEDULES  # noqa: E402

from bench.timing import gpu_timed, two_step_main  # noqa: E402

SPLITK = {64: (2, 4), 8192: (32, 4)}  # M -> (rows per task, K split), K = 8192
K = 8192


def build(out: Path) -> None:
    import etc
    from examples.splitk_rowsum import build as build_splitk

    for suffix, (schedule, early) in SCHEDULES.items():
        for M, (rows, split) in SPLITK.items():
            g = build_splitk(K=K, k_split=split, rows_per_task=rows)
            etc.compile(g, schedule=schedule, early_push=early).save(out / f"splitk{M}_{suffix}")
        for name in ("skewed", "empty", "chain"):
            etc.compile(GRAPHS[name](), schedule=schedule, early_push=early).save(
                out / f"{name}_{suffix}"
            )
        print("built", suffix)


def bench_splitk(torch, artifacts: Path, M: int, reps: int, record) -> None:
    """Every schedule on split-K at one M, checked against float64 first."""
    import etc.runtime

    copies = 64 if M == 64 else 2
    As = [torch.randn(M, K, device="cuda") for _ in range(copies)]
    refs = [a.double().sum(1) for a in As]
    C = torch.empty(M, device="cuda")
    B = torch.empty(M, SPLITK[M][1], device="cuda")
    for suffix in SCHEDULES:
        kernel = etc.runtime.load(artifacts / f"splitk{M}_{suffix}")

        def launch(i, kernel=kernel):
            kernel.launch({"A": As[i % copies], "B": B, "C": C}, {"n": M}, sync=False)

        for i in range(copies):
            launch(i)
            kernel.check()
            assert (C.double() - refs[i]).abs().max().item() < 1e-2, (M, suffix)
        record(f"splitk M={M}", suffix, gpu_timed(torch, launch, 8, reps))


def run(artifacts: Path, out: Path | None, reps: int) -> dict:
    import torch

    import etc.runtime

    results: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "method": __doc__.split("Method: ")[1].strip(),
        "rows": {},
    }
    rows = results["rows"]

    def record(workload: str, variant: str, us: float, extra: str = "") -> None:
        rows.setdefault(workload, {})[variant] = us
        print(f"{workload:14s} {variant:14s} {us:10.2f} us {extra}")

    for M in SPLITK:
        bench_splitk(torch, artifacts, M, reps, record)

    tiles = 4 * 1056
    P = torch.empty(tiles, device="cuda")
    Q = torch.empty(tiles, device="cuda")
    expect = torch.arange(tiles, device="cuda", dtype=torch.float32) + 2000 + 1
    for suffix in SCHEDULES:
        kernel = etc.runtime.load(artifacts / f"skewed_{suffix}")

        def launch(i, kernel=kernel):
            kernel.launch({"P": P, "Q": Q}, {"t": tiles}, sync=False)

        launch(0)
        kernel.check()
        assert torch.equal(Q, expect), suffix
        record("skewed", suffix, gpu_timed(torch, launch, 4, reps), f"({tiles} heavy tiles)")

    for suffix in SCHEDULES:
        kernel = etc.runtime.load(artifacts / f"empty_{suffix}")
        ctas = kernel.num_ctas
        times = {}
        for per_cta in (8, 64):
            t = per_cta * ctas
            times[per_cta] = gpu_timed(
                torch, lambda i, k=kernel, t=t: k.launch({}, {"t": t}, sync=False), 4, reps
            )
        per_task = (times[64] - times[8]) / (64 - 8)
        record("per-task cost", suffix, per_task, f"(slope over {ctas} CTAs: {times})")

    for suffix in SCHEDULES:
        kernel = etc.runtime.load(artifacts / f"chain_{suffix}")
        hops = len(kernel.manifest.tasks) - 1
        us = gpu_timed(torch, lambda i, k=kernel: k.launch({}, {}, sync=False), 4, reps)
        record("notify->wait", suffix, us / hops, f"(chain of {hops + 1} tasks: {us:.1f} us)")

    if out:
        out.write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=20)


if __name__ == "__main__":
    sys.exit(main())

"""Timing helpers shared by the benchmarks: CUDA events around back-to-back
calls, medians over repetitions; `torch` is passed in so that importing this
module needs no GPU."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def _events(torch):
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _median_us(torch, fn, calls: int, reps: int, before=None) -> float:
    start, end = _events(torch)
    samples = []
    for _ in range(reps):
        if before is not None:
            before()
        start.record()
        for i in range(calls):
            fn(i)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def timed(torch, fn, calls: int, reps: int) -> float:
    """Median µs per call of `fn(i)` for i in range(calls), back to back,
    after one warm-up round: what an eager caller sees."""
    for i in range(calls):
        fn(i)
    return _median_us(torch, fn, calls, reps)


def gpu_timed(torch, fn, calls: int, reps: int) -> float:
    """Median µs per call of the GPU work alone: a sleep kernel (~10 ms)
    holds the stream while the host enqueues the calls, hiding host cost."""
    for i in range(calls):
        fn(i)
    return _median_us(torch, fn, calls, reps, before=lambda: torch.cuda._sleep(20_000_000))


def host_timed(torch, fn, calls: int, rounds: int = 20) -> float:
    """Median host µs per call, enqueueing back to back (GPU work ignored)."""
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        samples.append((time.perf_counter() - start) * 1e6 / calls)
    torch.cuda.synchronize()
    return statistics.median(samples)


def two_step_main(
    description: str,
    build: Callable[[Path], None],
    run: Callable[[Path, Path | None, int], object],
    argv: list[str] | None,
    reps: int,
) -> int:
    """`--build DIR` on the compiler machine, `--artifacts DIR` on the GPU."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--build", type=Path, help="compile the artifacts into this directory")
    p.add_argument("--artifacts", type=Path, help="run with the artifacts in this directory")
    p.add_argument("--out", type=Path, help="write the results as JSON")
    p.add_argument("--reps", type=int, default=reps)
    args = p.parse_args(argv)
    if not (args.build or args.artifacts):
        p.error("give --build DIR and/or --artifacts DIR")
    if args.build:
        build(args.build)
    if args.artifacts:
        run(args.artifacts, args.out, args.reps)
    return 0

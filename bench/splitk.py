"""Split-K row sum (Figure 3) on the GPU: ETC's megakernel against PyTorch.

Two steps, because the GPU machine has no compiler:

    python bench/splitk.py --build DIR                 # CPU: compile every config
    python bench/splitk.py --artifacts DIR --out F.json  # GPU: check, then time

Method: A is fp32 [M, 8192] with fresh random values, rotated over enough
copies that the working set exceeds L2 at M=64 (64 copies, 128 MiB) as in
research/perf-baselines.md (W2). Every variant is checked against float64
before it is timed. Times are medians of REPS repetitions of CALLS
back-to-back calls between two CUDA events, divided by CALLS. Baselines run in
the same process: the device copy bandwidth (a 2 GiB copy), torch's two
kernels (`A.view(M,4,K/4).sum(2).sum(1)`) and `A.sum(1)`, eager and replayed
from one CUDA graph. ETC is launched eagerly from Python (no graph capture);
one launch is one cooperative launch of the persistent kernel (the kernel
resets its own counters). "GPU time" rows hide host overhead: a sleep kernel
holds the stream while the host enqueues the calls.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import gpu_timed, host_timed, timed, two_step_main  # noqa: E402

K = 8192
# (rows per task, K split) per M; the best is reported.
CONFIGS = {64: [(1, 4), (2, 4), (1, 8), (2, 8)], 8192: [(16, 4), (32, 4), (64, 4), (32, 8)]}


def config_name(rows: int, split: int) -> str:
    return f"splitk_K{K}_R{rows}_S{split}"


def build(out: Path) -> None:
    import etc
    from examples.splitk_rowsum import build as build_graph

    for configs in CONFIGS.values():
        for rows, split in configs:
            artifact = etc.compile(build_graph(K=K, k_split=split, rows_per_task=rows))
            artifact.save(out / config_name(rows, split))
            print("built", config_name(rows, split))


def graphed(torch, fn, calls: int):
    """One CUDA graph replaying `fn(i)` for every i; returns a callable."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    return graph


def copy_bandwidth(torch, reps: int) -> float:
    """Bytes/s of a 2 GiB device-to-device copy (read + write), eager and
    graphed, after a warm-up long enough for the clocks to settle; the best."""
    src = torch.empty(2**29, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(50):
        dst.copy_(src)
    eager = timed(torch, lambda i: dst.copy_(src), 8, reps)
    graph = graphed(torch, lambda i: dst.copy_(src), 8)
    replay = timed(torch, lambda i: graph.replay(), 1, reps) / 8
    return 2 * src.numel() * 4 / (min(eager, replay) * 1e-6)


def bench_size(torch, artifacts: Path, M: int, configs, copy_bw: float, reps: int) -> dict:
    """Checks then times every variant at one M; returns the result row."""
    import etc.runtime

    copies = 64 if M == 64 else 2
    calls = 64 if M == 64 else 8
    As = [torch.randn(M, K, device="cuda") for _ in range(copies)]
    refs = [a.double().sum(1) for a in As]
    C = torch.empty(M, device="cuda")
    floor_us = M * K * 4 / copy_bw * 1e6
    row: dict = {"M": M, "K": K, "floor_us": floor_us, "variants": {}}

    def record(name: str, us: float) -> None:
        row["variants"][name] = us
        print(f"M={M:5d} {name:32s} {us:9.2f} us  ({M * K * 4 / us / 1e6:.2f} TB/s)")

    def check(name: str, got, i: int) -> None:
        err = (got.double() - refs[i]).abs().max().item()
        if err > 1e-4 * (refs[i].abs().max().item() + 1):
            raise SystemExit(f"{name}: wrong result at M={M} (max error {err})")

    def two(i):
        return As[i % copies].view(M, 4, K // 4).sum(2).sum(1)

    def one(i):
        return As[i % copies].sum(1)

    for name, fn in (("torch two kernels", two), ("torch.sum", one)):
        check(name, fn(0), 0)
        record(f"{name}, eager", timed(torch, fn, calls, reps))
        record(f"{name}, eager GPU time", gpu_timed(torch, fn, calls, reps))
        graph = graphed(torch, fn, calls)
        record(f"{name}, CUDA graph", timed(torch, lambda i, g=graph: g.replay(), 1, reps) / calls)

    for rows, split in configs:
        kernel = etc.runtime.load(artifacts / config_name(rows, split))
        B = torch.empty(M, split, device="cuda")

        def launch(i, kernel=kernel, B=B):
            kernel.launch({"A": As[i % copies], "B": B, "C": C}, {"n": M}, sync=False)

        for i in range(copies):
            launch(i)
            kernel.check()
            check(config_name(rows, split), C, i)
        record(f"ETC R={rows} S={split}, eager", timed(torch, launch, calls, reps))
        record(f"ETC R={rows} S={split}, GPU time", gpu_timed(torch, launch, calls, reps))
        # Host cost of one launch, and the same through cuda-python's binding
        # instead of the direct libcuda call (A/B in the same process).
        record(f"ETC R={rows} S={split}, host per launch", host_timed(torch, launch, calls))
        direct, kernel._direct = kernel._direct, None
        record(
            f"ETC R={rows} S={split}, eager via cuda-python",
            timed(torch, launch, calls, reps),
        )
        kernel._direct = direct
    best = min(
        v for k, v in row["variants"].items() if k.startswith("ETC") and k.endswith(", eager")
    )
    row["etc_best_gpu_us"] = min(
        v for k, v in row["variants"].items() if k.startswith("ETC") and "GPU" in k
    )
    row["etc_best_us"] = best
    row["etc_fraction_of_copy_bw"] = floor_us / best
    row["torch_two_kernel_graph_over_etc"] = row["variants"]["torch two kernels, CUDA graph"] / best
    print(
        f"M={M}: ETC best {best:.2f} us eager ({row['etc_best_gpu_us']:.2f} us GPU time) = "
        f"{floor_us / best:.1%} of copy bandwidth; "
        f"torch two kernels (graph) / ETC = {row['torch_two_kernel_graph_over_etc']:.2f}x"
    )
    return row


def run(artifacts: Path, out: Path | None, reps: int) -> dict:
    import torch

    results: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "method": __doc__.split("Method: ")[1].strip(),
        "rows": [],
    }
    copy_bw = copy_bandwidth(torch, reps)
    results["copy_bandwidth_TBps"] = copy_bw / 1e12
    print(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s")

    for M, configs in CONFIGS.items():
        results["rows"].append(bench_size(torch, artifacts, M, configs, copy_bw, reps))
    # The clocks may have changed: measure again, keep the higher bandwidth.
    results["copy_bandwidth_TBps_end"] = copy_bandwidth(torch, reps) / 1e12
    if out:
        out.write_text(json.dumps(results, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=30)


if __name__ == "__main__":
    sys.exit(main())

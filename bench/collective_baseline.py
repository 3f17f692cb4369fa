"""PyTorch + NCCL kernel-by-kernel baseline for tensor-parallel GEMM +
Reduce-Scatter and All-Gather + GEMM on N GPUs of one host (Table 4 shapes).

    python bench/collective_baseline.py --ranks N [--models qwen3-8b,llama3.1-8b,qwen3-32b]
        [--ops gemm_rs,ag_gemm] [--json OUT.json] [--iters 100] [--save-io DIR]

Shapes: S = 8192 tokens, bf16, weights in the (N_out, K) layout.
``gemm_rs`` (row-parallel down projection): rank r holds X_r (S, I/N) and W_r
(H, I/N); P_r = X_r @ W_r^T (S, H); out_r = reduce_scatter_tensor(P) (S/N, H).
``ag_gemm`` (column-parallel up projection): rank r holds A_r (S/N, H) and W_r
(I/N, H); A = all_gather_into_tensor(A_r) (S, H); out_r = A @ W_r^T (S, I/N).

Method: one process per GPU (torch.multiprocessing.spawn, NCCL backend, NVLink
multicast / NVLS off). Per rank and per variant: WARMUP calls, then ITERS
samples; each sample is dist.barrier() + torch.cuda.synchronize(), a sleep
kernel (~5 ms) that holds the stream while the host enqueues, then CALLS
back-to-back calls between two CUDA events, divided by CALLS (GPU time per
step; the loop amortizes the start skew between ranks). The reported value is
the median over samples, then the max over ranks (all_reduce MAX). Variants:
``gemm`` torch.matmul alone (eager); ``collective`` the NCCL collective alone
(eager); ``eager`` GEMM + collective kernel by kernel; ``graph`` GEMM +
collective captured in one torch.cuda.CUDAGraph (warm-up on a side stream),
CALLS replays per sample; ``bound = max(gemm, collective)``, what a perfectly
overlapped kernel could reach. Inputs are torch.randn * 0.05 in bf16, seeded
per rank. Correctness: the graph replay on a small shape (S=256, H=256,
I=512*N) against a float32 reference from all-gathered inputs, and the graph
replay at every timed shape against the eager output; max|out - ref| /
max|ref| <= 2e-2 (max over ranks), else the exit code is 1.
"""

from __future__ import annotations

import os

_NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def no_multicast() -> None:
    """NVLink multicast (NVLS) stays off; call before NCCL initializes."""
    for key, value in _NO_MULTICAST.items():
        os.environ.setdefault(key, value)


no_multicast()

import argparse
import datetime
import json
import socket
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

S = 8192
MODELS = {"qwen3-8b": (4096, 12288), "llama3.1-8b": (4096, 14336), "qwen3-32b": (5120, 25600)}
OPS = ("gemm_rs", "ag_gemm")
SMALL = (256, 256, 512)  # S, H, I per rank (I = 512 * N)
TOLERANCE = 2e-2
WARMUP = 20
SLEEP_CYCLES = 10_000_000
COLUMNS = ("gemm", "collective", "eager", "graph")
METHOD = (
    "per rank: {warmup} warm-up calls, then median over {iters} samples of "
    "(barrier + synchronize, sleep kernel, {calls} back-to-back calls between CUDA events) / "
    "{calls}; max over ranks. gemm: torch.matmul eager; collective: NCCL eager; eager: GEMM + "
    "collective kernel by kernel; graph: GEMM + collective in one CUDA graph, replayed; "
    "bound = max(gemm, collective)"
)


@dataclass
class Problem:
    inputs: dict[str, torch.Tensor]
    out: torch.Tensor
    gemm: Callable[[], object]
    collective: Callable[[], object]
    step: Callable[[], None]


def make_problem(op: str, s: int, h: int, i: int, n: int, seed: int) -> Problem:
    """Fresh inputs and static buffers; `i` is the full intermediate size."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
        return x * 0.05

    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    if op == "gemm_rs":
        ins = {"X": rand(s, i // n), "W": rand(h, i // n)}
        part, out = torch.empty(s, h, **bf16), torch.empty(s // n, h, **bf16)

        def gemm() -> object:
            return torch.matmul(ins["X"], ins["W"].t(), out=part)

        def coll() -> object:
            return dist.reduce_scatter_tensor(out, part)

        order = (gemm, coll)
    else:
        ins = {"A": rand(s // n, h), "W": rand(i // n, h)}
        full, out = torch.empty(s, h, **bf16), torch.empty(s, i // n, **bf16)

        def gemm() -> object:
            return torch.matmul(full, ins["W"].t(), out=out)

        def coll() -> object:
            return dist.all_gather_into_tensor(full, ins["A"])

        order = (coll, gemm)

    def step() -> None:
        for fn in order:
            fn()

    step()  # every buffer holds real data before anything is timed alone
    return Problem(ins, out, gemm, coll, step)


def capture(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """One CUDA graph of `step`, after a warm-up on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    return graph


def median_us(fn: Callable[[], object], rank: int, iters: int, calls: int) -> float:
    for _ in range(WARMUP):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(iters):
        dist.barrier(device_ids=[rank])
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def max_over_ranks(values: list[float]) -> list[float]:
    t = torch.tensor(values, device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def gathered(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.contiguous())
    return parts


def reference(op: str, p: Problem, rank: int, n: int) -> torch.Tensor:
    """float32 result of this rank from all-gathered inputs."""
    if op == "gemm_rs":
        x = torch.cat(gathered(p.inputs["X"], n), dim=1).float()
        w = torch.cat(gathered(p.inputs["W"], n), dim=1).float()
        rows = x.shape[0] // n
        return (x @ w.t())[rank * rows : (rank + 1) * rows]
    a = torch.cat(gathered(p.inputs["A"], n), dim=0).float()
    return a @ p.inputs["W"].float().t()


def check_small(op: str, rank: int, n: int, save_io: Path | None) -> float:
    """Graph replay on the small shape against float32; max error over ranks."""
    s, h, i = SMALL
    p = make_problem(op, s, h, i * n, n, seed=7 + rank)
    graph = capture(p.step)
    p.out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    err = max_over_ranks([rel_err(p.out, reference(op, p, rank, n))])[0]
    if save_io is not None:
        save_io.mkdir(parents=True, exist_ok=True)
        io = {k: v.cpu() for k, v in p.inputs.items()} | {"out": p.out.cpu()}
        torch.save(io, save_io / f"{op}_rank{rank}.pt")
    return err


def bench(model: str, op: str, rank: int, n: int, args: argparse.Namespace) -> tuple[dict, float]:
    h, i = MODELS[model]
    p = make_problem(op, S, h, i, n, seed=1000 * (list(MODELS).index(model) + 1) + rank)
    eager_out = p.out.clone()
    t = {"gemm": median_us(p.gemm, rank, args.iters, args.calls)}
    t["collective"] = median_us(p.collective, rank, args.iters, args.calls)
    t["eager"] = median_us(p.step, rank, args.iters, args.calls)
    graph = capture(p.step)
    p.out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    err = max_over_ranks([rel_err(p.out, eager_out)])[0]
    t["graph"] = median_us(graph.replay, rank, args.iters, args.calls)
    us = max_over_ranks([t[c] for c in COLUMNS])
    row = {"model": model, "op": op, "S": S, "H": h, "I": i}
    row |= {f"{c}_us": v for c, v in zip(COLUMNS, us, strict=True)}
    row["bound_us"] = max(row["gemm_us"], row["collective_us"])
    del graph, p
    torch.cuda.empty_cache()
    return row, err


def worker(rank: int, n: int, args: argparse.Namespace, init_method: str) -> None:
    no_multicast()
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=init_method,
        rank=rank,
        world_size=n,
        device_id=torch.device("cuda", rank),
    )

    def say(line: str) -> None:
        if rank == 0:
            print(line, flush=True)

    checks, results, failed = [], [], False
    for op in args.ops:
        err = check_small(op, rank, n, args.save_io)
        ok = err <= TOLERANCE
        failed |= not ok
        checks.append({"op": op, "S": SMALL[0], "H": SMALL[1], "I": SMALL[2] * n, "rel_err": err})
        say(f"check {op} small shape vs float32: rel err {err:.3g} {'ok' if ok else 'WRONG'}")
    say(f"{'model':12s} {'op':8s}" + "".join(f"{c:>12s}" for c in (*COLUMNS, "bound")) + "  (µs)")
    for model in args.models:
        for op in args.ops:
            row, err = bench(model, op, rank, n, args)
            ok = err <= TOLERANCE
            failed |= not ok
            checks.append({"op": op, "model": model, "vs": "eager", "rel_err": err})
            results.append(row)
            cells = "".join(f"{row[f'{c}_us']:12.1f}" for c in (*COLUMNS, "bound"))
            say(f"{model:12s} {op:8s}{cells}" + ("" if ok else f"  WRONG graph (err {err:.3g})"))
    if rank == 0 and args.json is not None:
        doc = {
            "date": datetime.date.today().isoformat(),
            "ranks": n,
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "nccl": nccl_version(),
            "method": METHOD.format(warmup=WARMUP, iters=args.iters, calls=args.calls),
            "results": results,
            "checks": checks,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        say(f"wrote {args.json}")
    dist.barrier(device_ids=[rank])
    dist.destroy_process_group()
    if failed:
        sys.exit(1)


def nccl_version() -> str:
    import torch.cuda.nccl

    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, required=True, help="GPUs (one process each)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--json", type=Path, help="write the results as JSON")
    p.add_argument("--iters", type=int, default=100, help="timed samples (median)")
    p.add_argument("--calls", type=int, default=10, help="back-to-back calls per sample")
    p.add_argument("--save-io", type=Path, help="save small-shape inputs and outputs here")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.ops = [o for o in args.ops.split(",") if o]
    for name, have, known in (("model", args.models, MODELS), ("op", args.ops, OPS)):
        if bad := [x for x in have if x not in known]:
            p.error(f"unknown {name} {', '.join(bad)}; known: {', '.join(known)}")
    n = args.ranks
    if n < 1 or any(S % n or MODELS[m][1] % n for m in args.models):
        p.error(f"--ranks {n} must be >= 1 and divide S={S} and every I")
    if torch.cuda.device_count() < n:
        print(f"need {n} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        init_method = "env://"
    else:
        init_method = f"tcp://127.0.0.1:{free_port()}"
    try:
        mp.spawn(worker, args=(n, args, init_method), nprocs=n, join=True)
    except mp.ProcessExitedException as exc:
        print(f"a rank failed: {exc}", file=sys.stderr)
        return exc.exit_code if exc.exit_code and exc.exit_code > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

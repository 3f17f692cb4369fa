"""ETC's fused GEMM + Reduce-Scatter and All-Gather + GEMM on N GPUs (Table 4 shapes).

    python bench/tensor_parallel.py --build .device/tp --ranks 2      # CPU: compile
    python bench/tensor_parallel.py --run .device/tp --ranks 2 --json out.json \
        [--nccl-io DIR]                                               # GPU: check, time

``--build`` compiles one artifact per (op, K, schedule): K, the inner dimension, is
compiled in (I/N for GEMM + RS, H for AG + GEMM); the rows per rank and N are symbols.
``--run`` loads each on GPUs 0..N-1 (``etc.runtime.RankGroup``, one process, CUDA peer
access) and, per model, op and schedule:

* checks every rank's output against float32 torch math on the same inputs
  (torch.randn * 0.05 in bf16): max|out - ref| / max|ref| <= 2e-2;
* times it: per sample, a sleep kernel holds every rank's stream while the host
  enqueues CALLS launches of the group, between CUDA events on each rank; the sample is
  the slowest rank's time / CALLS; the median over ITERS samples is reported (GPU time
  per step, the same method as bench/collective_baseline.py, which measures cuBLAS +
  NCCL in the same device session).

``--nccl-io DIR`` (written by ``collective_baseline.py --save-io DIR``): runs ETC on the
baseline's small-shape inputs and compares with NCCL's outputs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

S = 8192
MODELS = {"qwen3-8b": (4096, 12288), "llama3.1-8b": (4096, 14336), "qwen3-32b": (5120, 25600)}
OPS = ("gemm_rs", "ag_gemm")
SCHEDULES = ("static", "dynamic")
# The GEMM tiles' tensor-core path: mma.sync (sm_90) or wgmma (sm_90a), each
# in its best measured configuration (bench/gemm_tc.py, gemm_sweep_wgmma.py).
CORES = ("mma", "wgmma", "tma", "tmaf", "tmao", "tmaou", "tmai", "tmaouc")
# Before session 15 the GEMM tasks ran destination / source chunk outermost, the
# copy and reduce tiles kept one load in flight per thread and All-Gather + GEMM
# read every chunk from the gathered buffer (today's defaults differ: _OLD).
_OLD = dict(gemm_order="rij", loads_in_flight=1, own_first=False)
_TMA = dict(stages=4, core="tma", block_n=256, smem_limit=220 << 10)
CONFIGS = {
    "mma": lambda k: _config(k=k, stages=3, **_OLD),
    "wgmma": lambda k: _config(
        k=k, stages=3, core="wgmma", block_k=64, smem_limit=200 << 10, **_OLD
    ),
    # TMA + mbarrier pipeline, 128 x 256 blocks, 4 stages (bench/gemm_tma.py's best).
    "tma": lambda k: _config(k=k, **_TMA, **_OLD),
    # tma with GEMM + RS's reduction in the own rows' GEMM epilogue (peers' rows first).
    "tmaf": lambda k: _config(k=k, **_TMA, **{**_OLD, "fused_reduce": True}),
    # tma with All-Gather + GEMM's own chunk first, straight from A.
    "tmao": lambda k: _config(k=k, **_TMA, **{**_OLD, "own_first": True}),
    # tmao with 8 loads in flight per copy thread.
    "tmaou": lambda k: _config(k=k, **_TMA, **{**_OLD, "own_first": True, "loads_in_flight": 8}),
    # The destinations interleaved, 8 loads in flight per reduce thread: GEMM + RS's defaults.
    "tmai": lambda k: _config(k=k, **_TMA, gemm_order="ijr", loads_in_flight=8),
    # tmaou with a column block's row blocks innermost: All-Gather + GEMM's defaults.
    "tmaouc": lambda k: _config(k=k, **_TMA, own_first=True, gemm_order="rji", loads_in_flight=8),
}
#: Configurations that change one layer only (the other is not built or run).
ONLY = {
    "tmaf": "gemm_rs", "tmao": "ag_gemm", "tmaou": "ag_gemm", "tmai": "gemm_rs",
    "tmaouc": "ag_gemm",
}  # fmt: skip
# Two CTAs per SM (registers capped at 128): the GEMM + peer-store tile
# otherwise takes 146 and runs one. The TMA tile's 192 KiB ring allows one.
MIN_CTAS_PER_SM = {"mma": 2, "wgmma": 2}  # the TMA tiles: 0


def _config(**kw):
    from etc.models import collective as C

    return C.CollectiveConfig(**kw)


SMALL = (256, 256, 512)  # S, H, I per rank, as collective_baseline.py
TOLERANCE = 2e-2


def dims(op: str, h: int, i: int, ranks: int) -> tuple[int, int]:
    """(K, N) of the per-rank GEMM."""
    return (i // ranks, h) if op == "gemm_rs" else (h, i // ranks)


def artifact_name(op: str, k: int, schedule: str, core: str = "mma") -> str:
    return f"{op}_k{k}_{schedule}" + ("" if core == "mma" else f"_{core}")


def build(
    directory: Path, ranks: int, cores: tuple[str, ...] = CORES, max_pop_chunk: int = 1
) -> None:
    import etc
    from etc.models import collective as C

    wanted = {(op, dims(op, h, i, ranks)[0]) for op in OPS for h, i in MODELS.values()}
    s, h, i = SMALL
    wanted |= {(op, dims(op, h, i * ranks, ranks)[0]) for op in OPS}
    for op, k in sorted(wanted):
        for schedule in SCHEDULES:
            for core in cores:
                if ONLY.get(core, op) != op:
                    continue
                cfg = CONFIGS[core](k)
                builder = C.gemm_reduce_scatter if op == "gemm_rs" else C.allgather_gemm
                out = directory / artifact_name(op, k, schedule, core)
                target = "sm_90" if core == "mma" else "sm_90a"
                # One queue position per claim keeps the CTAs on consecutive
                # GEMM tiles (shared operands stay in L2), as the static order.
                art = etc.compile(
                    builder(cfg), schedule=schedule, target=target, max_pop_chunk=max_pop_chunk,
                    min_ctas_per_sm=MIN_CTAS_PER_SM.get(core, 0),
                )  # fmt: skip
                art.save(out)
                print(f"built {out}")


class Case:
    """Per-rank torch tensors of one op at one shape, and its float32 reference."""

    def __init__(self, op: str, s: int, h: int, i: int, ranks: int, seed: int, given=None):
        import torch

        from etc import runtime

        self.op, self.ranks = op, ranks
        k, n = dims(op, h, i, ranks)
        rows = s // ranks
        self.symbols = {"rows": rows, "N": n}
        self.tensors: list[dict[str, torch.Tensor]] = []
        for r in range(ranks):
            dev = f"cuda:{r}"
            gen = torch.Generator(device=dev)
            gen.manual_seed(seed + r)

            def rand(*shape: int, dev: str = dev, gen=gen) -> torch.Tensor:
                x = torch.randn(shape, generator=gen, device=dev, dtype=torch.bfloat16)
                return x * 0.05

            bf16 = {"device": dev, "dtype": torch.bfloat16}
            if op == "gemm_rs":
                t = {"X": rand(s, k), "W": rand(n, k), "out": torch.zeros(rows, n, **bf16)}
                t["staging"] = torch.zeros(ranks, rows, n, **bf16)
            else:
                t = {"A": rand(rows, k), "W": rand(n, k), "C": torch.zeros(ranks, rows, n, **bf16)}
                t["A_full"] = torch.zeros(s, k, **bf16)
            if given is not None:
                for key, value in given[r].items():
                    if key in t and key not in ("out", "C"):
                        t[key].copy_(value.to(dev))
            self.tensors.append(t)
        buffer = "staging" if op == "gemm_rs" else "A_full"
        tables = runtime.peer_table([t[buffer] for t in self.tensors])
        for r, t in enumerate(self.tensors):
            t[f"{buffer}_peers"] = torch.from_numpy(tables[r]).to(f"cuda:{r}")

    def outputs(self) -> list:
        name = "out" if self.op == "gemm_rs" else "C"
        return [t[name].reshape(-1, t[name].shape[-1]) for t in self.tensors]

    def references(self) -> list:
        import torch

        if self.op == "gemm_rs":
            total = sum((t["X"].float() @ t["W"].float().t()).to("cuda:0") for t in self.tensors)
            return list(torch.chunk(total, self.ranks, dim=0))
        full = torch.cat([t["A"].float().to("cuda:0") for t in self.tensors], dim=0)
        return [full @ t["W"].float().to("cuda:0").t() for t in self.tensors]


def rel_err(out, ref) -> float:
    out = out.float().to(ref.device)
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def time_group(group, case: Case, iters: int, calls: int) -> float:
    """Median over samples of the slowest rank's GPU time per launch (µs)."""
    import torch

    devices = list(range(case.ranks))
    for _ in range(5):
        group.launch(case.tensors, case.symbols)
    samples = []
    for _ in range(iters):
        for d in devices:
            torch.cuda.synchronize(d)
        starts, ends = [], []
        for d in devices:
            with torch.cuda.device(d):
                torch.cuda._sleep(5_000_000)
                starts.append(torch.cuda.Event(enable_timing=True))
                starts[-1].record()
        for _ in range(calls):
            group.launch(case.tensors, case.symbols, sync=False)
        for d in devices:
            with torch.cuda.device(d):
                ends.append(torch.cuda.Event(enable_timing=True))
                ends[-1].record()
        group.check()
        for d in devices:
            torch.cuda.synchronize(d)
        samples.append(max(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)))
    return statistics.median(samples) * 1000 / calls


def run(args: argparse.Namespace) -> int:
    import torch

    from etc import runtime

    ranks = args.ranks
    if torch.cuda.device_count() < ranks:
        print(f"need {ranks} GPUs, found {torch.cuda.device_count()}")
        return 2
    results, checks, failed = [], [], 0
    models = args.models.split(",")
    cores = args.cores.split(",")
    for op in args.ops.split(","):
        op_cores = [c for c in cores if ONLY.get(c, op) == op]
        for schedule, core in [(s, c) for s in SCHEDULES for c in op_cores]:
            for model in models:
                h, i = MODELS[model]
                k = dims(op, h, i, ranks)[0]
                group = runtime.RankGroup(
                    args.run / artifact_name(op, k, schedule, core), devices=range(ranks)
                )
                case = Case(op, S, h, i, ranks, seed=100 * len(results) + 1)
                group.launch(case.tensors, case.symbols)
                err = max(
                    rel_err(o, r) for o, r in zip(case.outputs(), case.references(), strict=True)
                )
                failed += err > TOLERANCE
                us = time_group(group, case, args.iters, args.calls)
                row = {"model": model, "op": op, "schedule": schedule, "core": core}
                row |= {"S": S, "H": h, "I": i}
                row |= {
                    "etc_us": us,
                    "rel_err": err,
                    "grid": group.kernels[0].grid_size({**case.symbols, "rank": 0, "ranks": ranks}),
                }
                results.append(row)
                print(
                    f"{model:12s} {op:8s} {schedule:8s} {core:6s} {us:9.1f} us  rel err {err:.2e}"
                )
                del group, case
                torch.cuda.empty_cache()
        if args.nccl_io is not None:
            s, h, i = SMALL
            k = dims(op, h, i * ranks, ranks)[0]
            saved = [torch.load(args.nccl_io / f"{op}_rank{r}.pt") for r in range(ranks)]
            for schedule, core in [(s, c) for s in SCHEDULES for c in op_cores]:
                group = runtime.RankGroup(
                    args.run / artifact_name(op, k, schedule, core), devices=range(ranks)
                )
                case = Case(op, s, h, i * ranks, ranks, seed=0, given=saved)
                group.launch(case.tensors, case.symbols)
                err = max(
                    rel_err(o, saved[r]["out"].reshape(o.shape).float().to("cuda:0"))
                    for r, o in enumerate(case.outputs())
                )
                failed += err > TOLERANCE
                checks.append(
                    {"op": op, "schedule": schedule, "core": core, "vs": "nccl", "rel_err": err}
                )
                print(f"{op} {schedule} {core}: vs NCCL (small shape) rel err {err:.2e}")
    if args.json:
        out = {
            "date": datetime.date.today().isoformat(),
            "ranks": ranks,
            "device": torch.cuda.get_device_name(0),
            "method": (
                f"per sample: sleep kernel, {args.calls} launches of the group between CUDA "
                f"events on every rank, slowest rank / {args.calls}; median of {args.iters} "
                "samples after 5 warm-up launches"
            ),
            "results": results,
            "checks": checks,
        }
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path, help="compile the artifacts into this directory")
    p.add_argument("--run", type=Path, help="run the artifacts of this directory on the GPUs")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--nccl-io", type=Path)
    p.add_argument(
        "--cores", default=",".join(CORES), help="GEMM cores to build or run: mma,wgmma,tma"
    )
    p.add_argument("--ops", default=",".join(OPS), help="layers to run: gemm_rs,ag_gemm")
    p.add_argument(
        "--max-pop-chunk", type=int, default=1,
        help="build: the dynamic schedule's claim size (1 keeps CTAs on consecutive tiles)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.build:
        build(args.build, args.ranks, tuple(args.cores.split(",")), args.max_pop_chunk)
        return 0
    if args.run:
        return run(args)
    p.error("give --build DIR or --run DIR")
    return 2


if __name__ == "__main__":
    sys.exit(main())

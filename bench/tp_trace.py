"""Where the time goes in the fused tensor-parallel kernels: per-task timelines of
traced launches on every rank (``etc.compile(..., trace=True)``, ``kernel.trace()``).

    python bench/tp_trace.py --build DIR --ranks 2 [--cores tma,tmao]   # CPU: artifacts
    python bench/tp_trace.py --run DIR --ranks 2 --out OUTDIR          # GPU: tables

Qwen3-8B shapes of ``bench/tensor_parallel.py`` in its configurations (``--cores``,
default the TMA ones), both layers and schedules, built as that benchmark builds
them plus tracing: three launches of the group, the last traced, then per rank and
task the instances, median duration, first start and last end (µs after the rank's
first task started; a record starts after the instance's waits and ends after its
closing barrier), the summed busy time and the CTA time spent before the instances
(waits, the schedule's loop). The GEMM + RS ``gemm`` and the All-Gather ``copy``
instances are split by destination: ``[own]`` (this rank's rows) and ``[peer]``.
Tables go to ``OUTDIR/tp_trace.txt`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.moe_trace import format_table, task_table  # noqa: E402
from bench.tensor_parallel import (  # noqa: E402
    CONFIGS,
    MIN_CTAS_PER_SM,
    MODELS,
    ONLY,
    OPS,
    SCHEDULES,
    Case,
    S,
    dims,
)

MODEL = "qwen3-8b"
CORES = ("tma", "tmaf", "tmao", "tmaou", "tmai", "tmaouc")


def name(op: str, schedule: str, core: str) -> str:
    return f"traced_{op}_{schedule}_{core}"


def variants(cores) -> list[tuple[str, str, str]]:
    return [
        (op, schedule, core)
        for op in OPS
        for core in cores
        if ONLY.get(core, op) == op
        for schedule in SCHEDULES
    ]


def build(out: Path, ranks: int, cores) -> None:
    import etc
    from etc.models import collective as C

    h, i = MODELS[MODEL]
    for op, schedule, core in variants(cores):
        builder = C.gemm_reduce_scatter if op == "gemm_rs" else C.allgather_gemm
        cfg = CONFIGS[core](dims(op, h, i, ranks)[0])
        art = etc.compile(
            builder(cfg), schedule=schedule, target="sm_90a", trace=True, max_pop_chunk=1,
            min_ctas_per_sm=MIN_CTAS_PER_SM.get(core, 0),
        )  # fmt: skip
        art.save(out / name(op, schedule, core))
        print("built", name(op, schedule, core))


def run(artifacts: Path, ranks: int, out: Path | None) -> None:
    from etc import runtime
    from etc.models import collective as C

    h, i = MODELS[MODEL]
    lines, tables = [], {}
    for path in sorted(artifacts.glob("traced_*")):
        op = next(o for o in OPS if path.name.startswith(f"traced_{o}_"))
        cfg = CONFIGS[path.name.rsplit("_", 1)[1]](dims(op, h, i, ranks)[0])
        # Where the rank coordinate sits in the tasks' grids.
        at = {"copy": 0, "gemm": (cfg.gemm_order or C.GEMM_ORDER[op]).index("r")}
        group = runtime.RankGroup(path, devices=range(ranks))
        case = Case(op, S, h, i, ranks, seed=7)
        for _ in range(3):
            group.launch(case.tensors, case.symbols)
        for r, kernel in enumerate(group.kernels):
            kernel._ensure_context()

            def split(e: dict, r: int = r, at: dict = at) -> str:
                if e["task"] not in at:
                    return ""
                return "[own]" if e["instance"][at[e["task"]]] == r else "[peer]"

            table = task_table(kernel.trace(), split)
            title = f"{MODEL} {path.name.removeprefix('traced_')} rank {r}"
            tables[title] = table
            lines.append(format_table(title, table))
            print(lines[-1])
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "tp_trace.txt").write_text("\n".join(lines) + "\n")
        (out / "tp_trace.json").write_text(json.dumps(tables, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path)
    p.add_argument("--run", type=Path)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--out", type=Path)
    p.add_argument("--cores", default=",".join(CORES), help="configurations to build")
    args = p.parse_args(argv)
    if args.build:
        build(args.build, args.ranks, args.cores.split(","))
    if args.run:
        run(args.run, args.ranks, args.out)
    if not (args.build or args.run):
        p.error("give --build DIR or --run DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the time goes in the fused tensor-parallel kernels: per-task timelines of
traced launches on every rank (``etc.compile(..., trace=True)``, ``kernel.trace()``).

    python bench/tp_trace.py --build DIR --ranks 2              # CPU: traced artifacts
    python bench/tp_trace.py --run DIR --ranks 2 --out OUTDIR   # GPU: tables

Qwen3-8B shapes of ``bench/tensor_parallel.py`` (its wgmma configuration), both
layers and schedules: three launches of the group, the last traced, then per rank
and task the instances, median duration, first start and last end (µs after the
rank's first task started; a record starts after the instance's waits and ends
after its closing barrier) and the summed busy time. Tables go to
``OUTDIR/tp_trace.txt`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.moe_trace import format_table, task_table  # noqa: E402
from bench.tensor_parallel import CONFIGS, MODELS, OPS, SCHEDULES, Case, S, dims  # noqa: E402

MODEL = "qwen3-8b"


def name(op: str, schedule: str) -> str:
    return f"traced_{op}_{schedule}"


def build(out: Path, ranks: int) -> None:
    import etc
    from etc.models import collective as C

    h, i = MODELS[MODEL]
    for op in OPS:
        builder = C.gemm_reduce_scatter if op == "gemm_rs" else C.allgather_gemm
        cfg = CONFIGS["wgmma"](dims(op, h, i, ranks)[0])
        for schedule in SCHEDULES:
            art = etc.compile(
                builder(cfg), schedule=schedule, target="sm_90a", trace=True, max_pop_chunk=1,
                min_ctas_per_sm=2,
            )  # fmt: skip
            art.save(out / name(op, schedule))
            print("built", name(op, schedule))


def run(artifacts: Path, ranks: int, out: Path | None) -> None:
    from etc import runtime

    h, i = MODELS[MODEL]
    lines, tables = [], {}
    for op in OPS:
        for schedule in SCHEDULES:
            group = runtime.RankGroup(artifacts / name(op, schedule), devices=range(ranks))
            case = Case(op, S, h, i, ranks, seed=7)
            for _ in range(3):
                group.launch(case.tensors, case.symbols)
            for r, kernel in enumerate(group.kernels):
                kernel._ensure_context()
                table = task_table(kernel.trace())
                title = f"{MODEL} {op} {schedule} rank {r}"
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
    args = p.parse_args(argv)
    if args.build:
        build(args.build, args.ranks)
    if args.run:
        run(args.run, args.ranks, args.out)
    if not (args.build or args.run):
        p.error("give --build DIR or --run DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())

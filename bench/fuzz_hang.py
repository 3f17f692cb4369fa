"""Narrows down a fuzz case that hangs on the GPU (test/gpu/test_fuzz_gpu.py:
fuzz5's static artifact gave no result for minutes in the fifty-sixth and
fifty-seventh sessions, with its watchdog at 20M polls).

The graph of a seed is compiled (static schedule) with its drawn deals, with
every ticket and pool turned back into lists, with each one alone kept, and
with each one alone dropped. Each artifact then runs in a process of its own
(test/gpu/fuzz_case.py) at the drawn n and another, over every co-resident
CTA and over a few, with a short watchdog, under a timeout: a deadlock the
watchdog reports (``DeadlockError``), a hang it does not (``timeout``), wrong
values (``failed``) or ``ok``.

    python bench/fuzz_hang.py --build DIR [--seeds 5]        # CPU, with the compiler
    python bench/fuzz_hang.py --artifacts DIR --out FILE     # GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test" / "gpu"))

from fuzz_case import run_isolated, save_variant, variant_args  # noqa: E402
from fuzz_graphs import deal_variants, draw_specs, other_n, random_graph  # noqa: E402


def build(out: Path, seeds: list[int]) -> None:
    for seed in seeds:
        for name, deals in deal_variants(seed).items():
            save_variant(out / f"fuzz{seed}_{name}", seed, deals)
            deals_now = [t.deal for t in random_graph(seed, deals=deals)[0].tasks]
            print(f"fuzz{seed}_{name}: deals {deals_now}", flush=True)


def run(artifacts: Path, out: Path, timeout: float, budget: float, max_polls: int) -> None:
    start = time.perf_counter()
    rows = []
    # The drawn deals first, then each deal dropped, each kept alone, none.
    order = {"drawn": 0, "no": 1, "only": 2, "lists": 3}
    dirs = sorted(
        (p for p in artifacts.iterdir() if (p / "variant.json").exists()),
        key=lambda p: (order[p.name.split("_")[1]], p.name),
    )
    for path in dirs:
        seed = json.loads((path / "variant.json").read_text())["seed"]
        n = draw_specs(seed)[0]
        for size, grid in ((n, None), (other_n(seed, n), None), (n, 8), (n, 1)):
            if time.perf_counter() - start > budget:
                print("budget spent", flush=True)
                break
            args = [*variant_args(path, size), "--max-polls", str(max_polls)]
            args += ["--grid", str(grid)] if grid else []
            t0 = time.perf_counter()
            status, output = run_isolated(args, timeout)
            tail = output.strip().splitlines()[-1:] if status != "ok" else []
            if tail and "DeadlockError" in output:
                status = "deadlock"
            row = {
                "variant": path.name, "n": size, "grid": grid or "all", "status": status,
                "seconds": round(time.perf_counter() - t0, 1), "last_line": tail[0][:300] if tail else "",
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    out.write_text(json.dumps(rows, indent=1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path, help="compile the variants into this directory")
    p.add_argument("--seeds", default="5", help="comma-separated seeds to build")
    p.add_argument("--artifacts", type=Path, help="run the variants in this directory")
    p.add_argument("--out", type=Path, default=Path("fuzz_hang.json"))
    p.add_argument("--timeout", type=float, default=25.0, help="seconds a run may take")
    p.add_argument("--budget", type=float, default=400.0, help="seconds for all runs")
    p.add_argument("--max-polls", type=int, default=1_000_000, help="the watchdog's bound")
    args = p.parse_args()
    if args.build:
        build(args.build, [int(s) for s in args.seeds.split(",")])
    if args.artifacts:
        run(args.artifacts, args.out, args.timeout, args.budget, args.max_polls)
    if not (args.build or args.artifacts):
        p.error("give --build or --artifacts")
    return 0


if __name__ == "__main__":
    sys.exit(main())

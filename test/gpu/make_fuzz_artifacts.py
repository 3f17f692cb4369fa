"""Compiles the random-DAG fuzz artifacts (on a CPU machine with the compiler):

    python test/gpu/make_fuzz_artifacts.py OUT_DIR [--count 20]
    ETC_FUZZ_ARTIFACTS=OUT_DIR pytest test/gpu/test_fuzz_gpu.py

For each seed: ``fuzz<seed>_<static|dynamic|dynamic_late>/`` (the graph of
fuzz_graphs.random_graph(seed) under each schedule) and ``fuzz<seed>/case.npz``
with the symbols (``symbol.n``), inputs (``input.X``), the simulator's static
outputs (``expected.Y<k>``) and the graph's MLIR digest (``mlir_sha256``).
Where a seed draws two or more tickets or pools, also
``fuzz<seed>_only_t<k>_static/`` for each, that deal alone kept (the others
lists; ``fuzz_graphs.deal_variants``), with its ``variant.json``.
Before saving, the dynamic simulator (both push modes, 3 seeds each) must
agree bit for bit with the static one, at ``n`` capped to DYNAMIC_CHECK_N to
bound its cost (the graph is the same for every ``n``).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fuzz_case import save_variant  # noqa: E402
from fuzz_graphs import deals_alone, random_graph  # noqa: E402
from graphs import SCHEDULES  # noqa: E402

import etc  # noqa: E402

DYNAMIC_CHECK_N = 300


def check_dynamic(seed: int, n: int) -> None:
    """The dynamic simulator, both push modes and 3 seeds, equals the static one."""
    g, symbols, inputs = random_graph(seed, n=min(n, DYNAMIC_CHECK_N))
    static = etc.simulate(g, inputs, symbols)
    for early_push in (True, False):
        for k in range(3):
            out = etc.simulate(g, inputs, symbols, "dynamic", seed=k, early_push=early_push)
            for name, value in static.items():
                np.testing.assert_array_equal(
                    out[name], value, err_msg=f"fuzz{seed} {name}: early_push={early_push} seed={k}"
                )


def build_case(seed: int, out: Path) -> str:
    """Compiles and saves seed's three artifacts and its case.npz."""
    start = time.perf_counter()
    g, symbols, inputs = random_graph(seed)
    for suffix, (schedule, early_push) in SCHEDULES.items():
        etc.compile(g, schedule=schedule, early_push=early_push).save(out / f"fuzz{seed}_{suffix}")
    alone = deals_alone(seed)
    for name, deals in alone.items():
        save_variant(out / f"fuzz{seed}_{name}_static", seed, deals)
    expected = etc.simulate(g, inputs, symbols)
    check_dynamic(seed, symbols["n"])
    case = out / f"fuzz{seed}"
    case.mkdir(parents=True, exist_ok=True)
    arrays = {f"symbol.{k}": np.int64(v) for k, v in symbols.items()}
    arrays.update({f"input.{k}": v for k, v in inputs.items()})
    arrays.update({f"expected.{k}": v for k, v in expected.items() if k not in inputs})
    arrays["mlir_sha256"] = np.array(hashlib.sha256(g.to_mlir().encode()).hexdigest())
    np.savez(case / "case.npz", **arrays)
    return (
        f"fuzz{seed}: n={symbols['n']}, {len(g.tasks)} tasks, {len(g.events)} events, "
        f"{len(alone)} deals alone "
        f"({time.perf_counter() - start:.1f} s)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    args = p.parse_args(argv)
    start = time.perf_counter()
    seeds = range(args.count)
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            lines = pool.starmap(build_case, [(s, args.out) for s in seeds])
    else:
        lines = [build_case(s, args.out) for s in seeds]
    print("\n".join(lines))
    print(f"{args.count} cases in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

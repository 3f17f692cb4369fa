"""One fuzz case on the GPU in a process of its own, so that a launch that
never returns (a hang the kernel's watchdog does not catch) fails its case
after a timeout instead of stopping the whole suite.

    python test/gpu/fuzz_case.py check ROOT SEED SCHEDULE
    python test/gpu/fuzz_case.py variant ARTIFACT SEED N [--grid G]
        [--max-polls P] [--deals K=DEAL,...]

``check`` is test_fuzz_gpu.py's case: the saved artifact of ``seed`` and
``schedule`` under ROOT (make_fuzz_artifacts.py) at the saved n against the
saved expected values, then at another n against the simulator. ``variant``
launches any artifact of ``seed``'s graph (``--deals``: the deals it was
compiled with, ``random_graph(deals=...)``) at ``n`` on ``grid`` CTAs with a
watchdog bound of ``max_polls``, against the simulator (bench/fuzz_hang.py).
Both exit 0 on success and print what failed otherwise."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

try:
    import etc
except ImportError:  # a source checkout without an installed package (as conftest.py)
    sys.path.insert(0, str(HERE.parents[1] / "python"))
    import etc

from fuzz_graphs import other_n, random_graph  # noqa: E402


def launch_and_compare(kernel, g: etc.Graph, symbols, inputs, expected, label: str, **launch):
    """Launches ``kernel`` over fresh NaN outputs and compares every output."""
    n = symbols["n"]
    arrays = {t.name: np.full(n, np.nan, np.float32) for t in g.tensors}
    arrays.update({k: np.array(v, np.float32) for k, v in inputs.items()})
    kernel.launch(arrays, symbols, **launch)
    assert expected.keys() == arrays.keys() - inputs.keys()
    for name, want in expected.items():
        np.testing.assert_allclose(
            arrays[name], want, rtol=1e-5, atol=1e-4, err_msg=f"{label}, n={n}: {name}"
        )


def saved_case(root: Path, seed: int) -> tuple[dict, dict, dict, str]:
    """The symbols, inputs, expected outputs and MLIR digest saved for ``seed``."""
    with np.load(root / f"fuzz{seed}" / "case.npz") as z:
        parts: dict[str, dict] = {"symbol": {}, "input": {}, "expected": {}}
        for key in z.files:
            if key != "mlir_sha256":
                kind, name = key.split(".", 1)
                parts[kind][name] = z[key]
        symbols = {k: int(v) for k, v in parts["symbol"].items()}
        return symbols, parts["input"], parts["expected"], str(z["mlir_sha256"])


def simulated_case(seed: int, n: int, deals: dict[int, str] | None = None):
    """Graph, symbols, inputs and simulated outputs of ``seed`` at ``n``."""
    g, symbols, inputs = random_graph(seed, n=n, deals=deals)
    expected = etc.simulate(g, inputs, symbols)
    return g, symbols, inputs, {k: v for k, v in expected.items() if k not in inputs}


def check(root: Path, seed: int, schedule: str) -> None:
    import etc.runtime

    symbols, inputs, expected, digest = saved_case(root, seed)
    g, _, regenerated = random_graph(seed, n=symbols["n"])
    assert hashlib.sha256(g.to_mlir().encode()).hexdigest() == digest, (
        f"fuzz{seed}: fuzz_graphs.py changed since the artifacts were built"
    )
    np.testing.assert_array_equal(regenerated["X"], inputs["X"])
    kernel = etc.runtime.load(root / f"fuzz{seed}_{schedule}")
    label = f"fuzz{seed} {schedule}"
    launch_and_compare(kernel, g, symbols, inputs, expected, label)
    g2, *second = simulated_case(seed, other_n(seed, symbols["n"]))
    launch_and_compare(kernel, g2, *second, label)


def variant(artifact: Path, seed: int, n: int, grid, max_polls, deals) -> None:
    import etc.runtime

    g, symbols, inputs, expected = simulated_case(seed, n, deals)
    kernel = etc.runtime.load(artifact, max_polls=max_polls)
    launch_and_compare(kernel, g, symbols, inputs, expected, f"{artifact.name}", grid=grid)


def save_variant(path: Path, seed: int, deals: dict[int, str]) -> None:
    """Compiles ``seed``'s graph with ``deals`` (static schedule) into ``path``
    with the ``variant.json`` that ``variant`` runs read."""
    etc.compile(random_graph(seed, deals=deals)[0], schedule="static").save(path)
    (path / "variant.json").write_text(json.dumps({"seed": seed, "deals": deals}))


def variant_args(path: Path, n: int) -> list[str]:
    """The ``variant`` command line of the saved variant at ``path`` at ``n``."""
    spec = json.loads((path / "variant.json").read_text())
    deals = ",".join(f"{k}={d}" for k, d in spec["deals"].items())
    return ["variant", str(path), str(spec["seed"]), str(n), *(["--deals", deals] if deals else [])]


def parse_deals(text: str) -> dict[int, str]:
    """``"1=list,5=pool"`` as ``{1: "list", 5: "pool"}``."""
    pairs = (item.split("=") for item in text.split(",") if item)
    return {int(k): deal for k, deal in pairs}


def run_isolated(args: list[str], timeout: float) -> tuple[str, str]:
    """Runs this script with ``args`` in a new process: ``("ok" | "failed" |
    "timeout", its output)``; a timeout kills the process (and its context)."""
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "timeout", out
    return ("ok" if done.returncode == 0 else "failed"), done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("root", type=Path)
    c.add_argument("seed", type=int)
    c.add_argument("schedule")
    v = sub.add_parser("variant")
    v.add_argument("artifact", type=Path)
    v.add_argument("seed", type=int)
    v.add_argument("n", type=int)
    v.add_argument("--grid", type=int)
    v.add_argument("--max-polls", type=int)
    v.add_argument("--deals", type=parse_deals, default={})
    args = p.parse_args(argv)
    if args.command == "check":
        check(args.root, args.seed, args.schedule)
    else:
        variant(args.artifact, args.seed, args.n, args.grid, args.max_polls, args.deals)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

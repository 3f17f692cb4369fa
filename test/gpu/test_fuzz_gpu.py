"""Random DAGs (fuzz_graphs.py) under both schedules on the GPU equal the
simulator, at the case's n and then, with the same artifact, at another n.
Artifacts: ``python test/gpu/make_fuzz_artifacts.py DIR``; ``ETC_FUZZ_ARTIFACTS=DIR``."""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import etc
import etc.runtime

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_graphs import other_n, random_graph  # noqa: E402
from graphs import SCHEDULES  # noqa: E402

ROOT = os.environ.get("ETC_FUZZ_ARTIFACTS")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not ROOT, reason="ETC_FUZZ_ARTIFACTS is not set"),
]


def seeds() -> list[int]:
    cases = Path(ROOT).glob("fuzz*/case.npz") if ROOT else []
    return sorted(int(p.parent.name.removeprefix("fuzz")) for p in cases)


@functools.cache
def case(seed: int) -> tuple[dict, dict, dict, str]:
    """The symbols, inputs, expected outputs and MLIR digest saved for ``seed``."""
    with np.load(Path(ROOT) / f"fuzz{seed}" / "case.npz") as z:
        parts: dict[str, dict] = {"symbol": {}, "input": {}, "expected": {}}
        for key in z.files:
            if key != "mlir_sha256":
                kind, name = key.split(".", 1)
                parts[kind][name] = z[key]
        symbols = {k: int(v) for k, v in parts["symbol"].items()}
        return symbols, parts["input"], parts["expected"], str(z["mlir_sha256"])


@functools.cache
def second_case(seed: int, n: int) -> tuple[dict, dict, dict]:
    """Symbols, inputs and simulated outputs of ``seed``'s graph at another n."""
    g, symbols, inputs = random_graph(seed, n=other_n(seed, n))
    expected = etc.simulate(g, inputs, symbols)
    return symbols, inputs, {k: v for k, v in expected.items() if k not in inputs}


def launch_and_compare(kernel, g: etc.Graph, symbols, inputs, expected, label: str) -> None:
    n = symbols["n"]
    arrays = {t.name: np.full(n, np.nan, np.float32) for t in g.tensors}
    arrays.update({k: np.array(v, np.float32) for k, v in inputs.items()})
    kernel.launch(arrays, symbols)
    assert expected.keys() == arrays.keys() - inputs.keys()
    for name, want in expected.items():
        np.testing.assert_allclose(
            arrays[name], want, rtol=1e-5, atol=1e-4, err_msg=f"{label}, n={n}: {name}"
        )


def test_artifacts_present() -> None:
    assert seeds(), f"no fuzz*/case.npz under {ROOT}"


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("seed", seeds())
def test_fuzz(seed: int, schedule: str) -> None:
    symbols, inputs, expected, digest = case(seed)
    g, _, regenerated = random_graph(seed, n=symbols["n"])
    assert hashlib.sha256(g.to_mlir().encode()).hexdigest() == digest, (
        f"fuzz{seed}: fuzz_graphs.py changed since the artifacts were built"
    )
    np.testing.assert_array_equal(regenerated["X"], inputs["X"])
    kernel = etc.runtime.load(Path(ROOT) / f"fuzz{seed}_{schedule}")
    label = f"fuzz{seed} {schedule}"
    launch_and_compare(kernel, g, symbols, inputs, expected, label)
    launch_and_compare(kernel, g, *second_case(seed, symbols["n"]), label)

"""The examples refuse a bad number on their command line as a usage error
naming the option (exit status 2), before building anything: each of these
once ended in a traceback (``--batch 0``: a numpy reduction of nothing;
``--seed -5``: numpy's seed check) or, for ``--tolerance -1``, in a check no
step could pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "flags", "message"),
    [
        ("llama_decode.py", ["--batch", "0"], "argument --batch: 0 is below 1"),
        ("llama_decode.py", ["--prompt", "0"], "argument --prompt: 0 is below 1"),
        ("llama_decode.py", ["--steps", "-1"], "argument --steps: -1 is below 0"),
        ("llama_decode.py", ["--seed", "-5"], "argument --seed: -5 is below 0"),
        ("llama_decode.py", ["--batch", "two"], "argument --batch: 'two' is not an int"),
        ("llama_decode.py", ["--tolerance", "-1"], "argument --tolerance: -1.0 is not above 0"),
        ("llama_serve.py", ["--max-batch", "0"], "argument --max-batch: 0 is below 1"),
        ("moe.py", ["--tokens", "1,0"], "argument --tokens: 0 is below 1"),
        ("gemm.py", ["--block", "128"], "argument --block: '128' is not 2 ints joined by 'x'"),
        ("gemm.py", ["--shapes", "1x64,3"], "argument --shapes: '3' is not 2 ints joined by 'x'"),
        ("splitk_rowsum.py", ["--sizes", "3,x"], "argument --sizes: 'x' is not an int"),
        ("symbolic_batch.py", ["--eps", "0"], "argument --eps: 0.0 is not above 0"),
        ("gemm_reduce_scatter.py", ["--ranks", "0"], "argument --ranks: 0 is below 1"),
        ("splitk_rowsum.py", ["--timeout", "-1"], "argument --timeout: -1.0 is below 0"),
        ("moe.py", ["--timeout", "soon"], "argument --timeout: 'soon' is not a number"),
    ],
)
def test_a_bad_number_is_a_usage_error_naming_the_option(script, flags, message) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--simulate", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_gpu_run_bounds_its_launches(monkeypatch, tmp_path) -> None:
    """Without --simulate an example loads its kernel with --timeout (default
    120 s; 0: no bound), so a hang the watchdog cannot see ends in
    LaunchTimeoutError instead of a process that never returns; a compiled
    artifact's load passes the runtime's options on."""
    import argparse

    from etc import runtime
    from etc.compiler import Artifact

    sys.path.insert(0, str(EXAMPLES.parent))
    from examples._common import load_kernel, parser

    seen = []
    monkeypatch.setattr(runtime, "load", lambda directory, **options: seen.append(options))
    p = parser("test")
    for flags, timeout in (([], 120.0), (["--timeout", "5"], 5.0), (["--timeout", "0"], None)):
        args = p.parse_args(["--artifact", str(tmp_path), *flags])
        load_kernel(None, args)
        assert seen.pop() == {"timeout": timeout}
    assert load_kernel(None, argparse.Namespace(simulate=True)) is None

    class Saved(Artifact):
        def __init__(self) -> None:
            pass

        def save(self, out):
            return out

        kernel_name = "k"

    Saved().load(tmp_path, timeout=3.0, max_polls=7)
    assert seen.pop() == {"timeout": 3.0, "max_polls": 7}

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
        ("llama_serve.py", ["--target", "sm_80"], "argument --target: invalid choice: 'sm_80'"),
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


def _example(script: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("script", "flags", "message"),
    [
        ("moe.py", ["--emit-ptx", "{missing}/x.ptx"], "argument --emit-ptx: directory '{missing}'"),
        ("llama_decode.py", ["--simulate", "--artifact", "{tmp}"], "--simulate runs none"),
        ("gemm.py", ["--artifact", "{tmp}", "--emit-ptx", "{tmp}/g.ptx"], "compile here"),
        ("splitk_rowsum.py", ["--artifact", "{tmp}", "--save-artifact", "{tmp}/a"], "compile here"),
    ],
)
def test_an_option_that_would_be_ignored_or_fail_late_is_a_usage_error(
    script, flags, message, tmp_path
) -> None:
    """--emit-ptx into a missing directory fails before compiling (it once
    compiled for seconds, then ended in a traceback); --artifact beside
    --simulate, --emit-ptx or --save-artifact was silently ignored."""
    paths = {"tmp": str(tmp_path), "missing": str(tmp_path / "missing")}
    done = _example(script, *(f.format(**paths) for f in flags))
    assert done.returncode == 2, done.stderr
    assert message.format(**paths) in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "g.ptx").exists()


def test_an_unreadable_artifact_is_one_error_line(tmp_path) -> None:
    """A saved artifact that cannot be read ends the example with one line
    naming the file (exit status 1), not a traceback; so does a file the
    example cannot write."""
    done = _example("gemm.py", "--artifact", str(tmp_path / "none"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: LaunchError: ") and "Traceback" not in done.stderr
    assert (
        f"{tmp_path / 'none' / 'manifest.json'}: cannot read the artifact manifest" in done.stderr
    )
    (tmp_path / "file").write_text("")  # a directory path through a file
    done = _example("symbolic_batch.py", "--save-artifact", str(tmp_path / "file" / "art"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr
    assert str(tmp_path / "file") in done.stderr

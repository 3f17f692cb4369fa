"""`etc run` and `etc bench` on a real GPU, as commands, over artifacts from
``$ETC_ARTIFACTS`` (``python test/gpu/make_artifacts.py DIR --only
splitk$,broken$,symbolic_batch,moe_small_static$,splitk_traced_static$``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("ETC_ARTIFACTS"), reason="ETC_ARTIFACTS is not set"),
]
REPO = Path(__file__).resolve().parents[2]


def artifact(name: str) -> str:
    return str(Path(os.environ["ETC_ARTIFACTS"]) / name)


def etc_command(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "python"), env.get("PYTHONPATH")) if p
    )
    return subprocess.run(
        [sys.executable, "-m", "etc", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_run_an_artifact_on_made_up_inputs(tmp_path):
    done = etc_command(
        "run", artifact("splitk"), "--symbols", "n=1000", "--save-inputs",
        str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ran on the GPU with n=1000:")
    a = np.load(tmp_path / "in.npz")["A"]
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(out["C"], a.sum(1), rtol=1e-4, atol=1e-4)

    # Against a reference computed here: the same inputs pass, a changed one fails.
    np.savez(tmp_path / "ref.npz", C=a.astype(np.float64).sum(1).astype(np.float32))
    again = [
        "run", artifact("splitk"), "--symbols", "n=1000", "--inputs", str(tmp_path / "in.npz"),
        "--expect", str(tmp_path / "ref.npz"),
    ]  # fmt: skip
    done = etc_command(*again)
    assert done.returncode == 0 and "  C: matches" in done.stdout, done.stdout + done.stderr
    bad = a.copy()
    bad[17] += 1
    np.savez(tmp_path / "in.npz", A=bad)
    done = etc_command(*again)
    assert done.returncode == 1
    assert "C: 1 of 1000 elements differ" in done.stdout and "first at (17,)" in done.stdout


def test_run_writes_a_traced_artifacts_timeline(tmp_path):
    done = etc_command(
        "run", artifact("splitk_traced_static"), "--symbols", "n=100", "--trace",
        str(tmp_path / "t.json"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path / 't.json'}: 500 task instances (0 dropped)" in done.stdout
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = [e["name"] for e in events if e.get("ph") == "X"]
    assert names.count("final_sum") == 100 and len(names) == 500


def test_a_deadlock_is_one_error_line_and_the_command_ends(tmp_path):
    n = 64
    np.savez(tmp_path / "in.npz", T=np.full(n, 5, np.int32))  # 4 notifications arrive
    done = etc_command(
        "run", artifact("broken"), "--symbols", f"n={n}", "--inputs", str(tmp_path / "in.npz"),
        "--max-polls", "100000",
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("etc: ") and done.stderr.count("\n") == 1, done.stderr
    assert "'E'" in done.stderr


def test_run_a_bf16_moe_layer_with_made_up_weights(tmp_path):
    done = etc_command(
        "run", artifact("moe_small_static"), "--symbols", "T=7", "--scale", "0.1",
        "-o", str(tmp_path / "out.npz"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = np.load(tmp_path / "out.npz")
    assert out["topk_ids"].shape[0] == 7 and out["Out"].dtype == np.uint16
    assert out["counts"].sum() == out["topk_ids"].size  # every routed pair counted
    assert "NaN" not in done.stdout


def test_bench_an_artifact(tmp_path):
    figures = tmp_path / "f.json"
    done = etc_command(
        "bench", artifact("splitk"), "--symbols", "n=4096", "--reps", "5", "--calls", "5",
        "--json", str(figures),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    f = json.loads(figures.read_text())
    (one,) = f["sources"]
    gpu, eager = one["gpu"]["mean_us"], one["launch_to_launch"]["mean_us"]
    assert 0 < gpu < 10_000 and eager > 0.5 * gpu and f["passes"] == 1
    assert len(one["samples"][0]["gpu"]["samples_us"]) == 5
    assert f["copy_bandwidth_Bps"] > 2e11 and one["tensor_bytes"] == 4096 * (256 + 4 + 1) * 4
    assert f["sets"] >= 1 and "GPU alone" in done.stdout
    assert one["source"].endswith("splitk") and "CUDA events" in f["method"] and f["date"]


def test_bench_compares_two_artifacts_in_rotated_passes(tmp_path):
    """The same kernel twice (one traced): two passes, each timing both."""
    figures = tmp_path / "f.json"
    done = etc_command(
        "bench", artifact("splitk"), artifact("splitk_traced_static"), "--symbols", "n=4096",
        "--reps", "5", "--passes", "2", "--json", str(figures),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    f = json.loads(figures.read_text())
    assert [len(s["gpu"]["pass_medians_us"]) for s in f["sources"]] == [2, 2]
    assert "x the first (" in done.stdout and "of 2 pass(es)" in done.stdout


def test_bench_a_symbolic_batch_and_refuse_a_bad_symbol(tmp_path):
    done = etc_command(
        "bench", artifact("symbolic_batch"), "--symbols", "b=8", "--symbols", "b=512",
        "--reps", "3", "--json", str(tmp_path / "f.json"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = json.loads((tmp_path / "f.json").read_text())
    assert [r["symbols"] for r in runs] == [{"b": 8}, {"b": 512}]
    assert runs[1]["sources"][0]["tensor_bytes"] > runs[0]["sources"][0]["tensor_bytes"]
    done = etc_command("bench", artifact("symbolic_batch"), "--symbols", "c=8")
    assert done.returncode == 1 and done.stderr.startswith("etc: ") and "'c'" in done.stderr


@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_launch_past_its_timeout_is_one_error_line_and_the_command_ends(command, tmp_path):
    """A launch stuck in its waits until the watchdog's 10^6 polls run out
    (~0.5 s) against a 1 µs bound: the command reports the timeout and
    exits without waiting for the stream. (A kernel that merely runs can
    end before the first look at the stream: the moe_small layer did, once.)"""
    np.savez(tmp_path / "in.npz", T=np.full(64, 5, np.int32))  # 4 notifications arrive
    done = etc_command(
        command, artifact("broken"), "--symbols", "n=64", "--inputs", str(tmp_path / "in.npz"),
        "--max-polls", "1000000", "--timeout", "1e-6",
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr.startswith("etc: "), done.stdout + done.stderr
    assert "did not finish within 1e-06 s" in done.stderr and done.stderr.count("\n") == 1

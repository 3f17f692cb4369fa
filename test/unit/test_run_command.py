"""`etc run` and `etc bench` without a GPU: the simulator's runs, made-up
and given inputs, comparisons, and every refusal (`etc.runner`,
`etc.runtime.timing`); their GPU runs are in test/gpu/test_cli_gpu.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from unit_helpers import REPO

import etc
from etc import cli, runner
from etc.runtime import timing

SPLITK = str(REPO / "examples" / "splitk_rowsum.py") + ":build"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["run", SPLITK, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_simulated_run_computes_the_graph_on_made_up_inputs(tmp_path, capsys):
    code, out, _ = run(
        capsys, "--symbols", "n=37", "--simulate", "-o", str(tmp_path / "o.npz"),
        "--save-inputs", str(tmp_path / "i.npz"),
    )  # fmt: skip
    assert code == 0
    assert out.startswith("simulated (static schedule) with n=37:")
    assert "  C: f32 (37,) min " in out
    got, given = np.load(tmp_path / "o.npz"), np.load(tmp_path / "i.npz")
    assert set(got.files) == {"A", "B", "C"}
    a = given["A"]
    assert a.shape == (37, 256) and -1 <= a.min() and a.max() < 1 and a.std() > 0.5
    np.testing.assert_allclose(got["C"], a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["B"], a.reshape(37, 4, 64).sum(2), rtol=1e-5, atol=1e-5)

    # The seed picks the inputs; the saved inputs give the same run back.
    run(capsys, "--symbols", "n=37", "--simulate", "--seed", "3", "-o", str(tmp_path / "s.npz"))
    assert not np.array_equal(np.load(tmp_path / "s.npz")["A"], a)
    code, out, _ = run(
        capsys, "--symbols", "n=37", "--simulate", "--schedule", "dynamic", "--inputs",
        str(tmp_path / "i.npz"), "--expect", str(tmp_path / "o.npz"),
    )  # fmt: skip
    assert code == 0 and "simulated (dynamic schedule)" in out
    assert "  C: matches, max |error|" in out and "  A: matches, max |error| 0 " in out


def test_a_tensor_that_differs_from_the_reference_fails_the_run(tmp_path, capsys):
    run(capsys, "--symbols", "n=9", "--simulate", "-o", str(tmp_path / "o.npz"))
    ref = dict(np.load(tmp_path / "o.npz"))
    ref["C"] = ref["C"].copy()
    ref["C"][4] += 0.5
    np.savez(tmp_path / "bad.npz", **ref)
    code, out, _ = run(
        capsys, "--symbols", "n=9", "--simulate", "--expect", str(tmp_path / "bad.npz")
    )
    assert code == 1
    compared = out.split("against the reference:\n")[1]
    line = next(x for x in compared.splitlines() if x.startswith("  C:"))
    assert "1 of 9 elements differ" in line and "first at (4,)" in line
    # Only the tensors asked for are compared.
    code, out, _ = run(
        capsys, "--symbols", "n=9", "--simulate", "--expect", str(tmp_path / "bad.npz"),
        "--compare", "A,B",
    )  # fmt: skip
    assert code == 0 and "  C:" not in out.split("against the reference:")[1]
    # A looser tolerance lets the difference pass.
    code, _, _ = run(
        capsys, "--symbols", "n=9", "--simulate", "--expect", str(tmp_path / "bad.npz"),
        "--atol", "0.6",
    )  # fmt: skip
    assert code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--symbols", "m=3", "--simulate"], "graph 'splitk' has no symbol 'm'"),
        (["--simulate"], "no value given for symbol 'n'"),
        (["--symbols", "n=3", "--simulate", "--compare", "C"], "names tensors of --check or"),
        (["--symbols", "n=3", "--simulate", "--check"], "not with --simulate"),
        (["--symbols", "n=3", "--check", "--compare", "Z"], "'Z' is no tensor of the kernel"),
        (["--symbols", "n=3", "--simulate", "--inputs", "missing.npz"], "cannot read it as an"),
        (["--symbols", "n=3", "--simulate", "--seed", "-1"], "the seed must be an int >= 0"),
        (["--symbols", "n=3", "--simulate", "--trace", "t.json"], "records a GPU launch"),
        (["--symbols", "n=3", "--simulate", "--scale", "inf"], "the scale must be a finite"),
    ],
)
def test_bad_run_options_are_one_error_line(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 1 and out == "" and err.startswith("etc: ") and message in err


def test_files_that_are_no_npz_are_named(tmp_path, capsys):
    np.save(tmp_path / "one.npy", np.zeros(3))
    (tmp_path / "text.npz").write_text("not a zip")
    np.savez(tmp_path / "objects.npz", A=np.array([{}], dtype=object))
    for name, message in [
        ("one.npy", "one array, not an .npz of named arrays"),
        ("text.npz", "cannot read it as an .npz of arrays"),
        ("objects.npz", "cannot read it as an .npz of arrays"),
    ]:
        code, out, err = run(
            capsys, "--symbols", "n=3", "--simulate", "--inputs", str(tmp_path / name)
        )
        assert code == 1 and out == "" and message in err and err.count("\n") == 1
    # -o writes the very path given, suffix or not.
    code, _, _ = run(capsys, "--symbols", "n=3", "--simulate", "-o", str(tmp_path / "plain"))
    assert code == 0 and set(np.load(tmp_path / "plain").files) == {"A", "B", "C"}


def test_inputs_of_the_wrong_shape_type_or_name_are_named(tmp_path, capsys):
    for name, array, message in [
        (
            "A",
            np.zeros((3, 255), np.float32),
            "input 'A': shape (3, 255), the kernel takes (3, 256)",
        ),
        ("A", np.zeros((3, 256), np.float64), "input 'A': dtype float64, the kernel takes f32"),
        ("Q", np.zeros(3, np.float32), "inputs name 'Q', which the kernel does not take"),
    ]:
        np.savez(tmp_path / "i.npz", **{name: array})
        code, _, err = run(
            capsys, "--symbols", "n=3", "--simulate", "--inputs", str(tmp_path / "i.npz")
        )
        assert code == 1 and message in err
    np.savez(tmp_path / "ref.npz", C=np.zeros(3, np.float32))
    code, out, err = run(
        capsys,
        "--symbols",
        "n=3",
        "--simulate",
        "--expect",
        str(tmp_path / "ref.npz"),
        "--compare",
        "B",
    )
    assert code == 1 and out == "" and "the reference has no 'B'" in err


def test_a_negative_dimension_is_one_error_line(tmp_path, capsys):
    """Was numpy's ValueError traceback from the made-up inputs."""
    (tmp_path / "neg.py").write_text(
        "import etc\n"
        "from etc.tiles import rowsum\n"
        "def build():\n"
        "    g = etc.Graph('neg')\n"
        "    n = g.symbol('n')\n"
        "    x, y = g.tensor('x', (n - 5, 4), 'f32'), g.tensor('y', (n - 5,), 'f32')\n"
        "    g.task(rowsum.final_sum(1, 4), grid=(n - 5,), args=(x, y))\n"
        "    return g\n"
    )
    code = cli.main(["run", f"{tmp_path / 'neg.py'}:build", "--symbols", "n=2", "--simulate"])
    err = capsys.readouterr().err
    assert code == 1 and "tensor 'x': dimension 0" in err and "evaluates to -3" in err
    assert err.count("\n") == 1


def test_sources_and_options_that_do_not_go_together(tmp_path, capsys):
    with pytest.raises(SystemExit, match="neither an artifact directory nor MODULE:FUNCTION"):
        cli.main(["run", str(tmp_path / "none"), "--symbols", "n=1"])
    with pytest.raises(SystemExit, match="--schedule is for a graph"):
        cli.main(["run", str(tmp_path), "--schedule", "dynamic"])
    with pytest.raises(SystemExit, match="--timeout must be seconds >= 0"):
        cli.main(["run", SPLITK, "--timeout", "-1"])
    with pytest.raises(SystemExit, match="--timeout must be seconds >= 0"):
        cli.main(["bench", SPLITK, "--timeout", "nan"])
    with pytest.raises(SystemExit, match="--max-polls must be >= 1, got 0"):
        cli.main(["bench", SPLITK, "--max-polls", "0"])
    with pytest.raises(SystemExit, match="no --device with it"):
        cli.main(["run", SPLITK, "--simulate", "--device", "1"])
    with pytest.raises(SystemExit, match="returned str, not a Graph"):
        cli.main(["run", "os:getcwd"])  # a callable that is no builder
    capsys.readouterr()
    assert cli.main(["run", str(tmp_path), "--symbols", "n=1", "--simulate"]) == 1
    assert "--simulate needs a graph" in capsys.readouterr().err


def test_made_up_inputs_by_element_type():
    buffers = [
        runner.Buffer("w", "bf16", (3, 5)),
        runner.Buffer("x", "f32", (1000,)),
        runner.Buffer("ids", "i32", (4,)),
        runner.Buffer("count", "f32", (2,), kept_zero=True),
    ]
    a = runner.make_inputs(buffers, seed=1, scale=0.25)
    assert a["w"].dtype == np.uint16 and a["x"].dtype == np.float32
    w = etc.bf16_to_f32(a["w"])
    assert -0.25 <= w.min() and w.max() <= 0.25 and np.unique(w).size > 5
    assert -0.25 <= a["x"].min() and a["x"].max() < 0.25
    assert not a["ids"].any() and not a["count"].any()
    again = runner.make_inputs(buffers, seed=1, scale=0.25)
    assert all(np.array_equal(a[k], again[k]) for k in a)
    # A tensor given keeps the others' values; bf16 given as floats is rounded.
    given = runner.make_inputs(
        buffers, {"w": np.full((3, 5), 1.00390625, np.float32)}, seed=1, scale=0.25
    )
    assert np.array_equal(given["x"], a["x"])
    assert (given["w"] == etc.f32_to_bf16(np.float32(1.0))).all()


def test_made_up_inputs_in_chunks_match_one_draw(monkeypatch):
    b = [runner.Buffer("x", "f32", (10, 7))]
    whole = runner.make_inputs(b, seed=5)["x"]
    monkeypatch.setattr(runner, "_CHUNK", 16)
    chunked = runner.make_inputs(b, seed=5)["x"]
    assert np.array_equal(chunked, whole) and np.unique(whole).size == 70


def test_comparison_by_element_type():
    buffers = [runner.Buffer("f", "f32", (4,)), runner.Buffer("i", "i32", (2,))]
    got = {"f": np.array([1, np.nan, 3, 4], np.float32), "i": np.array([1, 2], np.int32)}
    lines, problems = runner.compare(got, {"f": got["f"] * 1.00001, "i": got["i"]}, buffers)
    assert problems == [] and lines[0].startswith("f: matches")  # NaN matches NaN
    _, problems = runner.compare(got, {"i": np.array([1, 3], np.int32)}, buffers)
    assert problems == ["i: 1 of 2 elements differ; first at (1,): 2 against 3"]
    _, problems = runner.compare(got, {"f": np.array([1, 2, 3, 4], np.float32)}, buffers)
    assert problems and problems[0].startswith("f: 1 of 4 elements differ")
    _, problems = runner.compare(got, {"i": np.zeros(3, np.int32)}, buffers)
    assert problems == ["i: the reference's shape (3,) is not (2,)"]


def test_an_artifact_runs_only_where_a_gpu_is(tmp_path, capsys):
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    from etc.runtime import driver

    if driver.device_count():
        pytest.skip("a GPU is here: test/gpu/test_cli_gpu.py runs the artifact")
    assert cli.main(["compile", SPLITK, "-o", str(tmp_path / "art")]) == 0
    capsys.readouterr()
    for command in ("run", "bench"):
        assert cli.main([command, str(tmp_path / "art"), "--symbols", "n=4"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("etc: cuInit: no CUDA driver") and err.count("\n") == 1
    # A timeline needs an artifact that records one.
    assert cli.main(["run", str(tmp_path / "art"), "--symbols", "n=4", "--trace", "t.json"]) == 1
    assert "compiled without trace=True, so it records no timeline" in capsys.readouterr().err
    # The artifact's symbols are checked before any device is asked for.
    assert cli.main(["run", str(tmp_path / "art"), "--symbols", "k=4"]) == 1
    assert "symbol" in capsys.readouterr().err


def test_a_bucketed_artifact_gives_the_buffers_of_the_kernel_its_symbols_pick(tmp_path):
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    from unit_helpers import bucketed_rowsum

    bucketed_rowsum(tmp_path)
    source = runner.Source(directory=tmp_path)
    assert [(b.name, b.shape) for b in source.buffers({"n": 3})] == [("x", (3, 4)), ("y", (3,))]
    # Past the first kernel's bound of 4: the second kernel's manifest checks it.
    assert [b.shape for b in source.buffers({"n": 9})] == [(9, 4), (9,)]
    with pytest.raises(etc.ShapeError, match="'n' = 9 is above 4"):
        runner.Source(directory=tmp_path / "bucket0").buffers({"n": 9})
    with pytest.raises(etc.LaunchError, match="symbol 'n' picks the kernel"):
        source.buffers({})


def test_bench_checks_every_symbol_set_before_timing_any(capsys):
    code = cli.main(["bench", SPLITK, "--symbols", "n=3", "--symbols", "m=2"])
    assert code == 1 and "graph 'splitk' has no symbol 'm'" in capsys.readouterr().err


def test_bench_grid_reaches_the_runner_and_a_bad_one_is_one_line(capsys):
    code = cli.main(["bench", SPLITK, "--symbols", "n=3", "--grid", "0"])
    err = capsys.readouterr().err
    assert code == 1 and err.strip() == "etc: bench: grid must be >= 1 CTA, got 0"


def test_bench_refuses_bad_counts_before_loading_anything():
    source = runner.Source(directory=REPO / "nowhere")
    for kwargs, message in [
        ({"reps": 0}, "reps must be >= 1"),
        ({"calls": 0}, "calls must be >= 1"),
        ({"warmup": -1}, "warmup must be >= 0"),
        ({"sets": 0}, "sets must be in 1..64"),
        ({"spin_ms": 0}, "the spin must be > 0 ms"),
        ({"passes": 0}, "passes must be >= 1"),
        ({"grid": 0}, "grid must be >= 1 CTA"),
    ]:
        with pytest.raises(etc.EtcError, match=message):
            runner.bench(source, {"n": 1}, **kwargs)
    with pytest.raises(etc.EtcError, match="sources must be >= 1"):
        runner.bench([], {"n": 1})


class _FakeStream:
    """Events that say each round took `ms`; spins recorded."""

    def __init__(self, ms: float) -> None:
        self.ms, self.spins = ms, []

    def time(self, enqueue, after):
        enqueue()
        after()
        return self.ms

    def spin(self, ns):
        self.spins.append(ns)


def test_time_launches_takes_a_sample_a_round():
    launched, checks = [], []
    stream = _FakeStream(2.0)
    gpu, host = timing.time_launches(launched.append, lambda: checks.append(1), stream, 4, 3, 2)
    assert launched == list(range(20)) and len(checks) == 5  # 2 warm-up rounds, 3 timed
    assert gpu.us == (500.0, 500.0, 500.0) and gpu.median == 500.0 and len(host.us) == 3
    assert stream.spins == []
    gpu, _ = timing.time_launches(launched.append, lambda: None, stream, 4, 3, 0, spin_ns=10**9)
    assert stream.spins == [10**9] * 3
    s = timing.Samples((5.0, 1.0, 3.0, 2.0, 4.0))
    assert s.median == 3.0 and s.quantile(0.0) == 1.0 and s.quantile(1.0) == 5.0
    assert s.as_dict()["p90_us"] == 5.0 and s.as_dict()["min_us"] == 1.0


def test_a_round_that_outlasts_the_spin_is_refused():
    import time

    def slow(i):
        time.sleep(0.002)

    with pytest.raises(etc.LaunchError, match="longer than the 1 ms spin"):
        timing.time_launches(slow, lambda: None, _FakeStream(1.0), 2, 1, 0, spin_ns=10**6)


def test_the_runner_imports_neither_the_compiler_nor_the_bindings():
    code = (
        "import sys, etc.runner, etc.runtime.timing; "
        "bad = [m for m in sys.modules if m.startswith(('etc.compiler', 'etc._mlir_libs'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_times_the_kernel_that_nested_buckets_pick():
    from etc.runtime.buckets import BucketedKernel

    small, middle, large = object(), object(), object()
    inner = BucketedKernel("L", [1024, None], [small, middle])
    outer = BucketedKernel("B", [1, None], [inner, large])
    assert runner.leaf_kernel(outer, {"B": 1, "L": 2000}) is middle
    assert runner.leaf_kernel(outer, {"B": 1, "L": 5}) is small
    assert runner.leaf_kernel(outer, {"B": 9, "L": 5}) is large
    assert runner.leaf_kernel(small, {}) is small


class _FakeKernel:
    """Stands in for the GPU: computes the split-K sums itself, one of C's
    rows wrong when `wrong` is set."""

    def __init__(self, wrong: bool) -> None:
        self.wrong, self.launched = wrong, []

    def launch(self, arrays, symbols):
        self.launched.append(dict(symbols))
        a = arrays["A"]
        arrays["B"][...] = a.reshape(a.shape[0], 4, -1).sum(2)
        arrays["C"][...] = arrays["B"].sum(1) + (1.0 if self.wrong else 0.0) * (
            np.arange(a.shape[0]) == 2
        )


@pytest.mark.parametrize("wrong", [False, True])
def test_check_compares_the_gpu_run_with_the_simulator(monkeypatch, capsys, wrong):
    kernel = _FakeKernel(wrong)
    loads = []

    def load(self, device, timeout, max_polls):
        loads.append((self.schedule, self.trace, device, timeout, max_polls))
        return kernel

    monkeypatch.setattr(runner.Source, "load", load)
    code, out, _ = run(
        capsys, "--symbols", "n=5", "--check", "--schedule", "dynamic", "--device", "0",
        "--max-polls", "99",
    )  # fmt: skip
    assert loads == [("dynamic", False, 0, 120.0, 99)] and kernel.launched == [{"n": 5}]
    assert out.startswith("ran on the GPU with n=5:") and "against the simulator:" in out
    assert code == int(wrong)
    c_line = next(x for x in out.split("against the simulator:\n")[1].splitlines() if "C:" in x)
    assert ("1 of 5 elements differ" in c_line and "first at (2,)" in c_line) == wrong


def test_bench_rotates_the_sources_from_pass_to_pass_and_compares_with_the_first(monkeypatch):
    """The GPU stood in for: each source's kernel takes a fixed time a launch,
    the order of the timed rounds is recorded."""
    from types import SimpleNamespace

    from etc.runtime import driver

    device = SimpleNamespace(ordinal=0, name="Fake GPU")
    pace = {"a": 100.0, "b": 90.0, "c": 120.0}
    order, allocated, launched, grids = [], [], [], set()

    class Kernel:
        def __init__(self, name):
            self.name, self.device = name, device

        def launch(self, ptrs, symbols, **kwargs):
            assert set(ptrs) == {"A", "B", "C"} and symbols == {"n": 3}
            launched.append(self.name)
            grids.add(kwargs.get("grid"))

        def check(self, timeout=None):
            pass

    def time_launches(launch, check, stream, calls, reps, warmup=1, spin_ns=0):
        launch(0)  # which source's round this is
        order.append((launched[-1], bool(spin_ns)))
        us = timing.Samples((pace[launched[-1]],) * reps)
        return us, timing.Samples((5.0,) * reps)

    class Buffer:
        def __init__(self, nbytes):
            self.ptr, self.nbytes = len(allocated) + 1, nbytes
            allocated.append(self)

        def release(self):
            self.ptr = 0

    stream = SimpleNamespace(handle=7, idle=lambda: True, close=lambda: None)
    monkeypatch.setattr(timing, "free_bytes", lambda: 1 << 40)
    monkeypatch.setattr(timing, "l2_bytes", lambda dev: 1 << 20)
    monkeypatch.setattr(timing, "Stream", lambda dev: stream)
    monkeypatch.setattr(timing, "time_launches", time_launches)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda s: 3e12)
    monkeypatch.setattr(driver, "DeviceBuffer", Buffer)
    monkeypatch.setattr(driver, "htod", lambda *a: None)
    sources = [runner.Source(cli._graph(SPLITK), schedule=name) for name in ("a", "b", "c")]
    monkeypatch.setattr(runner.Source, "load", lambda self, *a: Kernel(self.schedule))
    lines = []
    f = runner.bench(sources, {"n": 3}, reps=3, passes=3, sets=2, say=lines.append)
    names = [name for name, spin in order if not spin]
    assert names == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # rotated each pass
    assert [spin for _, spin in order] == [False, True] * 9
    assert len(allocated) == 3 * 2 * 3  # three sources, two sets, three tensors
    assert [s["gpu"]["mean_us"] for s in f["sources"]] == [100.0, 90.0, 120.0]
    assert f["sources"][1]["gpu"]["pass_medians_us"] == [90.0] * 3 and f["passes"] == 3
    text = "\n".join(lines)
    assert "0.9000x the first (-10.0 %), faster in 3 of 3 pass(es)" in text
    assert "1.2000x the first (+20.0 %), faster in 0 of 3 pass(es)" in text
    assert all(b.ptr == 0 for b in allocated)  # released once the stream was idle
    assert grids == {None} and f["grid"] is None
    # A forced grid reaches every launch, the checked one included, and the figures.
    f = runner.bench(sources[:1], {"n": 3}, reps=3, sets=1, grid=4, say=lines.append)
    assert grids == {None, 4} and f["grid"] == 4
    assert any(line.endswith("; grid 4 CTAs") for line in lines)

"""The runtime on a real GPU, with artifacts from ``$ETC_ARTIFACTS`` (``splitk/``, ``broken/``).

Both artifacts implement the split-K row sum: A (n, 256) f32, B (n, 4) f32, C (n,) f32 with
C = A.sum(1); ``broken`` reads its wait counts from a tensor T, which the test sets to 5 where
only 4 notifications arrive. Build them with ``python test/gpu/make_artifacts.py DIR``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import etc.runtime
from etc.errors import DeadlockError, LaunchError, ShapeError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("ETC_ARTIFACTS"), reason="ETC_ARTIFACTS is not set"),
]
SIZES = [1, 7, 64, 1000]


def artifact(name: str) -> Path:
    return Path(os.environ["ETC_ARTIFACTS"]) / name


@pytest.fixture(scope="module")
def splitk() -> etc.runtime.Kernel:
    return etc.runtime.load(artifact("splitk"))


def inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + n)
    return {
        "A": rng.standard_normal((n, 256)).astype(np.float32),
        "B": np.full((n, 4), np.nan, np.float32),  # poisoned: every element must be written
        "C": np.full((n,), np.nan, np.float32),
    }


def expect(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a64 = a.astype(np.float64)
    return a64.reshape(len(a), 4, 64).sum(2), a64.sum(1)


@pytest.mark.parametrize("n", [0, *SIZES])
def test_splitk_numpy(splitk: etc.runtime.Kernel, n: int) -> None:
    t = inputs(n)
    splitk.launch(t, {"n": n})
    b, c = expect(t["A"])
    np.testing.assert_allclose(t["B"], b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t["C"], c, rtol=1e-5, atol=1e-4)


def test_grid(splitk: etc.runtime.Kernel) -> None:
    assert splitk.num_ctas >= splitk.device.sm_count
    assert splitk.grid_size({"n": 0}) == 1
    assert splitk.grid_size({"n": 1}) == min(5, splitk.num_ctas)
    assert splitk.grid_size({"n": 100_000}) == splitk.num_ctas


@pytest.mark.parametrize("grid", [1, 3])
def test_small_grids(splitk: etc.runtime.Kernel, grid: int) -> None:
    t = inputs(64)
    splitk.launch(t, {"n": 64}, grid=grid)
    np.testing.assert_allclose(t["C"], expect(t["A"])[1], rtol=1e-5, atol=1e-4)


def test_module_loaded_once(splitk: etc.runtime.Kernel) -> None:
    again = etc.runtime.load(artifact("splitk"))
    assert int(again.function) == int(splitk.function)


def test_deadlock_then_recovery(splitk: etc.runtime.Kernel) -> None:
    broken = etc.runtime.load(artifact("broken"))
    n = 7
    for _ in range(2):  # repeatable: the context survives
        t = inputs(n)
        if any(spec.name == "T" for spec in broken.manifest.tensors):
            # Compiled artifact: the wait counts are data, one too high.
            t["T"] = np.full((n,), 5, np.int32)
        start = time.perf_counter()
        with pytest.raises(DeadlockError) as info:
            broken.launch(t, {"n": n}, max_polls=100_000)
        assert time.perf_counter() - start < 30
        e = info.value
        assert e.event == "E" and e.task == "final_sum"
        assert e.counter == 4 and e.wait_count == 5
        assert len(e.coordinate) == 1 and 0 <= e.coordinate[0] < n
        assert e.instance == e.coordinate
        assert "'E'" in str(e) and "final_sum" in str(e)
    t = inputs(n)
    splitk.launch(t, {"n": n})
    np.testing.assert_allclose(t["C"], expect(t["A"])[1], rtol=1e-5, atol=1e-4)


def test_a_failed_launch_zeroes_its_kept_zero_tensors() -> None:
    """``broken_kept`` declares its partials B kept zero: the partial sums
    write B, then final_sum's wait gives up. After the DeadlockError B is
    zero again, on the device (torch, sync and async launches) and in the
    numpy array given, while C keeps what it held; then the kernel runs."""
    torch = pytest.importorskip("torch")
    broken = etc.runtime.load(artifact("broken_kept"))
    assert [t.name for t in broken.manifest.tensors if t.kept_zero] == ["B"]
    n = 33
    a = torch.randn(n, 256, device="cuda")
    t = {
        "A": a,
        "B": torch.zeros(n, 4, device="cuda"),
        "C": torch.full((n,), 7.0, device="cuda"),
        "T": torch.full((n,), 5, dtype=torch.int32, device="cuda"),
    }
    with pytest.raises(DeadlockError):
        broken.launch(t, {"n": n}, max_polls=100_000)
    assert not t["B"].any() and bool((t["C"] == 7).all())
    broken.launch(t, {"n": n}, sync=False, max_polls=100_000)
    with pytest.raises(DeadlockError):
        broken.check()
    assert not t["B"].any()
    host = {k: v.cpu().numpy() for k, v in t.items()}
    with pytest.raises(DeadlockError):
        broken.launch(host, {"n": n}, max_polls=100_000)
    assert not host["B"].any() and (host["C"] == 7).all()
    t["T"].fill_(4)  # and the counts right: the sums, B's partials left as the graph writes them
    broken.launch(t, {"n": n})
    torch.testing.assert_close(t["C"], a.sum(1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(t["B"], a.reshape(n, 4, 64).sum(2), rtol=1e-5, atol=1e-4)


def test_timeout_bounds_the_wait_for_a_launch(splitk: etc.runtime.Kernel) -> None:
    """With a timeout the launch polls its stream: a normal launch gives the
    same results, and one that runs past it raises LaunchTimeoutError while
    the kernel goes on; here the kernel's watchdog ends it later, which the
    next check reports, and the context stays usable."""
    t = inputs(1000)
    splitk.launch(t, {"n": 1000}, timeout=30)
    np.testing.assert_allclose(t["C"], expect(t["A"])[1], rtol=1e-5, atol=1e-4)

    broken = etc.runtime.load(artifact("broken"))
    n = 7
    t = inputs(n)
    if any(spec.name == "T" for spec in broken.manifest.tensors):
        t["T"] = np.full((n,), 5, np.int32)
    start = time.perf_counter()
    with pytest.raises(etc.LaunchTimeoutError, match="did not finish within 0.2 s"):
        broken.launch(t, {"n": n}, max_polls=3_000_000, timeout=0.2)
    assert time.perf_counter() - start < 5
    with pytest.raises(DeadlockError):
        broken.check(timeout=120)  # the watchdog's 3M polls run out meanwhile
    t = inputs(n)
    splitk.launch(t, {"n": n})
    np.testing.assert_allclose(t["C"], expect(t["A"])[1], rtol=1e-5, atol=1e-4)


def test_counters_reset_by_the_kernel(splitk: etc.runtime.Kernel) -> None:
    """No host memset between launches: the last CTA of each launch zeroes the
    counters, so back-to-back launches of changing sizes stay correct."""
    for i, n in enumerate([64, 7, 1000, 1, 64, 333] * 5):
        t = inputs(n, seed=i)
        splitk.launch(t, {"n": n})
        np.testing.assert_allclose(t["C"], expect(t["A"])[1], rtol=1e-5, atol=1e-4)


def test_failure_is_sticky_and_rearmed() -> None:
    """A deadlock in an unchecked async launch is reported by the next check();
    the same kernel then runs correctly (counters were reset by the aborted
    launch, the status record re-armed by reading it)."""
    torch = pytest.importorskip("torch")
    broken = etc.runtime.load(artifact("broken"))
    if not any(spec.name == "T" for spec in broken.manifest.tensors):
        pytest.skip("needs the compiled broken artifact (wait counts from T)")
    n = 33
    a = torch.randn(n, 256, device="cuda")
    t = {"A": a, "B": torch.empty(n, 4, device="cuda"), "C": torch.empty(n, device="cuda")}
    t["T"] = torch.full((n,), 5, dtype=torch.int32, device="cuda")
    broken.launch(t, {"n": n}, sync=False, max_polls=100_000)
    broken.launch(t, {"n": n}, sync=False, max_polls=100_000)  # fails fast
    with pytest.raises(DeadlockError):
        broken.check()
    broken.check()  # re-armed: nothing more to report
    t["T"].fill_(4)
    broken.launch(t, {"n": n})
    torch.testing.assert_close(t["C"], a.sum(1), rtol=1e-5, atol=1e-4)


def test_torch_tensors(splitk: etc.runtime.Kernel) -> None:
    torch = pytest.importorskip("torch")
    for n in SIZES:
        a = torch.randn(n, 256, device="cuda")
        b = torch.full((n, 4), float("nan"), device="cuda")
        c = torch.full((n,), float("nan"), device="cuda")
        splitk.launch({"A": a, "B": b, "C": c}, {"n": n})
        torch.testing.assert_close(c, a.double().sum(1).float(), rtol=1e-5, atol=1e-4)
        # Raw device pointers, on torch's stream, asynchronously.
        c.fill_(float("nan"))
        ptrs = {k: v.data_ptr() for k, v in {"A": a, "B": b, "C": c}.items()}
        splitk.launch(ptrs, {"n": n}, stream=torch.cuda.current_stream(), sync=False)
        splitk.check()
        torch.testing.assert_close(c, a.double().sum(1).float(), rtol=1e-5, atol=1e-4)


def test_torch_side_stream(splitk: etc.runtime.Kernel) -> None:
    torch = pytest.importorskip("torch")
    n = 64
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.randn(n, 256, device="cuda")
        b, c = torch.empty(n, 4, device="cuda"), torch.empty(n, device="cuda")
        splitk.launch({"A": a, "B": b, "C": c}, {"n": n}, sync=False)  # torch's current stream: s
        ref = a.sum(1)
    splitk.check()
    s.synchronize()
    torch.testing.assert_close(c, ref, rtol=1e-5, atol=1e-4)


def test_torch_validation(splitk: etc.runtime.Kernel) -> None:
    torch = pytest.importorskip("torch")
    n = 8
    good = {
        "A": torch.zeros(n, 256, device="cuda"),
        "B": torch.zeros(n, 4, device="cuda"),
        "C": torch.zeros(n, device="cuda"),
    }
    with pytest.raises(ShapeError, match="'A'.*shape"):
        splitk.launch({**good, "A": torch.zeros(n, 255, device="cuda")}, {"n": n})
    with pytest.raises(ShapeError, match="'B'.*dtype"):
        splitk.launch(
            {**good, "B": torch.zeros(n, 4, device="cuda", dtype=torch.float16)}, {"n": n}
        )
    with pytest.raises(ShapeError, match="'B'.*contiguous"):
        splitk.launch({**good, "B": torch.zeros(4, n, device="cuda").t()}, {"n": n})
    with pytest.raises(LaunchError, match="'C'.*cpu"):
        splitk.launch({**good, "C": torch.zeros(n)}, {"n": n})


def test_hot_launch_cost(splitk: etc.runtime.Kernel) -> None:
    torch = pytest.importorskip("torch")
    n = 64
    t = {
        "A": torch.randn(n, 256, device="cuda"),
        "B": torch.empty(n, 4, device="cuda"),
        "C": torch.empty(n, device="cuda"),
    }
    sym = {"n": n}
    for _ in range(20):
        splitk.launch(t, sym, sync=False)
    torch.cuda.synchronize()
    reps = 1000
    start = time.perf_counter()
    for _ in range(reps):
        splitk.launch(t, sym, sync=False)
    host_us = (time.perf_counter() - start) / reps * 1e6
    splitk.check()
    print(f"hot launch host time: {host_us:.2f} us ({splitk.image})")
    torch.testing.assert_close(t["C"], t["A"].sum(1), rtol=1e-5, atol=1e-4)
    assert host_us < 100  # loose: catches a rebuilt parameter array or a hidden sync


def test_launch_from_another_thread(splitk: etc.runtime.Kernel) -> None:
    import threading

    n = 7
    t = inputs(n)
    errors: list[BaseException] = []

    def run() -> None:  # a new thread has no current CUDA context
        try:
            splitk.launch(t, {"n": n})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    assert not errors, errors
    np.testing.assert_allclose(t["C"], expect(t["A"])[1], rtol=1e-5, atol=1e-4)


def test_pointers_from_another_thread(splitk: etc.runtime.Kernel) -> None:
    import threading

    torch = pytest.importorskip("torch")
    n = 64
    a = torch.randn(n, 256, device="cuda")
    b, c = torch.empty(n, 4, device="cuda"), torch.empty(n, device="cuda")
    torch.cuda.synchronize()
    ptrs = {"A": a.data_ptr(), "B": b.data_ptr(), "C": c.data_ptr()}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            splitk.launch(ptrs, {"n": n}, stream=0)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    assert not errors, errors
    torch.testing.assert_close(c, a.sum(1), rtol=1e-5, atol=1e-4)


def _copy_artifact(src: Path, dst: Path, **replace: bytes) -> Path:
    import hashlib
    import json
    import shutil

    shutil.copytree(src, dst)
    data = json.loads((dst / "manifest.json").read_text())
    for name, blob in replace.items():
        (dst / name.replace("_", ".")).write_bytes(blob)
        data["sha256"][name.replace("_", ".")] = hashlib.sha256(blob).hexdigest()
    (dst / "manifest.json").write_text(json.dumps(data))
    return dst


def test_bad_cubin_falls_back_to_ptx(tmp_path: Path) -> None:
    src = artifact("splitk")
    if not (src / "kernel.cubin").exists():
        pytest.skip("the artifact has no cubin")
    # A cubin that hashes correctly but is not an image: the driver rejects it, PTX loads.
    k = etc.runtime.load(_copy_artifact(src, tmp_path / "a", kernel_cubin=b"\x7fELF not a cubin"))
    assert k.image == "ptx"
    t = inputs(7)
    k.launch(t, {"n": 7})
    np.testing.assert_allclose(t["C"], expect(t["A"])[1], rtol=1e-5, atol=1e-4)


def test_broken_images_are_launch_errors(tmp_path: Path) -> None:
    src = artifact("splitk")
    ptx = (src / "kernel.ptx").read_bytes()
    cut = ptx.index(b".entry") + 200  # keeps the entry line, drops the body
    replace = {"kernel_ptx": ptx[:cut]}
    if (src / "kernel.cubin").exists():
        replace["kernel_cubin"] = b"garbage"
    with pytest.raises(LaunchError, match="cannot load kernel"):
        etc.runtime.load(_copy_artifact(src, tmp_path / "b", **replace))

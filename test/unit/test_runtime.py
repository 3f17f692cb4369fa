"""etc.runtime without a GPU: manifests, static queues, parameter packing, argument checks."""

from __future__ import annotations

import enum
import hashlib
import json
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
try:
    import etc.runtime  # noqa: F401
except ImportError:  # a source checkout without an installed package
    sys.path.insert(0, str(ROOT / "python"))

import etc.runtime  # noqa: E402
from etc.errors import DeadlockError, LaunchError, ShapeError  # noqa: E402
from etc.runtime import args, kernel, manifest, params, queue  # noqa: E402

PTX = b"//\n.version 8.0\n.target sm_90\n.address_size 64\n.visible .entry splitk(\n\t.param .u64 p0\n)\n{\n\tret;\n}\n"


def splitk_manifest() -> dict:
    return {
        "format": "etc-artifact/5",
        "graph": "splitk",
        "kernel": "splitk",
        "module": "splitk_kernels",
        "schedule": "static",
        "target": "sm_90",
        "block_size": 256,
        "watchdog_polls": 20_000_000,
        "ptx": "kernel.ptx",
        "cubin": None,
        "sha256": {"kernel.ptx": hashlib.sha256(PTX).hexdigest()},
        "symbols": ["n"],
        "tensors": [
            {"name": "A", "shape": ["n", 256], "dtype": "f32"},
            {"name": "B", "shape": ["n", 4], "dtype": "f32"},
            {"name": "C", "shape": ["n"], "dtype": "f32"},
        ],
        "events": [{"name": "E", "shape": ["n"], "wait_count": 4}],
        "tasks": [
            {"index": 0, "name": "partial_sum", "grid": ["n", 4]},
            {"index": 1, "name": "final_sum", "grid": ["n"]},
        ],
        "params": [
            {"kind": "symbol", "name": "n"},
            {"kind": "tensor", "name": "A", "rank": 2},
            {"kind": "tensor", "name": "B", "rank": 2},
            {"kind": "tensor", "name": "C", "rank": 1},
            {"kind": "counters"},
            {"kind": "queue"},
            {"kind": "status"},
            {"kind": "max_polls"},
        ],
        "status_words": 8,
    }


def write_artifact(
    d: Path, data: dict | None = None, ptx: bytes = PTX, cubin: bytes | None = None
) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    data = splitk_manifest() if data is None else data
    (d / "kernel.ptx").write_bytes(ptx)
    if cubin is not None:
        (d / "kernel.cubin").write_bytes(cubin)
        data["cubin"] = "kernel.cubin"
        data["sha256"]["kernel.cubin"] = hashlib.sha256(cubin).hexdigest()
    (d / "manifest.json").write_text(json.dumps(data))
    return d


# -- manifest validation ------------------------------------------------------------------


def test_manifest_loads(tmp_path: Path) -> None:
    m = manifest.load_manifest(write_artifact(tmp_path, cubin=b"\x7fELF fake cubin"))
    assert (m.graph, m.kernel, m.schedule, m.block_size) == ("splitk", "splitk", "static", 256)
    assert m.symbols == ("n",)
    assert m.tensor("A").shape == ("n", 256) and m.tensor("C").dtype == "f32"
    assert [t.name for t in m.tasks] == ["partial_sum", "final_sum"]
    assert m.events[0].wait_count == 4
    assert m.ptx_bytes == PTX and m.cubin_bytes == b"\x7fELF fake cubin"
    assert m.bind(m.tensor("A").shape, {"n": 7}) == (7, 256)


REQUIRED = [
    "format",
    "graph",
    "kernel",
    "schedule",
    "block_size",
    "watchdog_polls",
    "ptx",
    "cubin",
    "sha256",
    "symbols",
    "tensors",
    "events",
    "tasks",
    "params",
    "status_words",
]


@pytest.mark.parametrize("key", REQUIRED)
def test_manifest_missing_key(tmp_path: Path, key: str) -> None:
    data = splitk_manifest()
    del data[key]
    with pytest.raises(LaunchError, match=f"manifest field {key}: is missing"):
        manifest.load_manifest(write_artifact(tmp_path, data))


def _set(path: str, value: object) -> dict:
    data = splitk_manifest()
    obj: dict | list = data
    parts = path.split(".")
    for p in parts[:-1]:
        obj = obj[int(p)] if isinstance(obj, list) else obj[p]
    last = parts[-1]
    if isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("format", "etc-artifact/9", "format"),
        ("format", "etc-artifact/3", "expected 'etc-artifact/5'"),
        ("block_size", "256", "block_size: expected int"),
        ("block_size", True, "block_size: expected int"),
        ("block_size", 2048, "block_size: must be in 1..1024"),
        ("watchdog_polls", -1, "watchdog_polls"),
        ("status_words", 4, "status_words"),
        ("symbols", "n", "symbols: expected list"),
        ("symbols", ["n", "n"], "duplicate name 'n'"),
        ("tensors.0.shape", ["m", 256], r"tensors\[0\].shape\[0\]"),
        ("tensors.0.shape", [-1, 256], r"tensors\[0\].shape\[0\]"),
        ("tensors.0.shape", "n", r"tensors\[0\].shape"),
        ("tensors.1.dtype", "f8", "unsupported dtype 'f8'"),
        ("tensors.1.name", "A", "duplicate name 'A'"),
        ("events.0.wait_count", "k", "not a declared symbol"),
        ("events.0.wait_count", {"table": "Z"}, "wait_count"),
        ("events.0.wait_count", {"table": "A"}, "i32/i64 tensor"),
        ("events.0.wait_count", 1.5, "wait_count: expected"),
        ("tasks.1.index", 0, "index order"),
        ("tasks.0.grid", ["n", "q"], r"tasks\[0\].grid\[1\]"),
        ("params.1.rank", 3, "has rank 2, param says 3"),
        ("params.1.name", "Z", "not a declared tensor"),
        ("params.0.name", "z", "not a declared symbol"),
        ("params.2", {"kind": "tensor", "name": "A", "rank": 2}, "passed twice"),
        ("params.4", {"kind": "queue"}, "exactly one 'counters'"),
        ("params.4", {"kind": "bogus"}, "unknown kind 'bogus'"),
        ("params.4", "counters", r"params\[4\]"),
        ("ptx", "../kernel.ptx", "inside the artifact directory"),
        ("ptx", "/etc/passwd", "inside the artifact directory"),
        ("sha256", {"kernel.ptx": "abc"}, "64-digit hex"),
        ("sha256", {}, "64-digit hex"),
        ("sm_deal", "random", "manifest field sm_deal: expected 'spread' or 'pairs'"),
        ("sm_slices", "yes", "manifest field sm_slices: expected a bool"),
        ("tensors.1.kept_zero", 1, r"tensors\[1\].kept_zero: expected bool"),
    ],
)
def test_manifest_bad_field(tmp_path: Path, path: str, value: object, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        manifest.load_manifest(write_artifact(tmp_path, _set(path, value)))


def test_failed_launch_zeroes_the_kept_zero_tensors(tmp_path: Path, monkeypatch) -> None:
    """A kept-zero tensor (``kept_zero`` in the manifest) is zeroed after a
    failed launch: its bytes at the launch's shape on the device (one memset
    each, ordered on the launch's stream, then a synchronisation) and the
    numpy array it came from; the other tensors are left alone."""
    data = splitk_manifest()
    data["tensors"][1]["kept_zero"] = True
    m = manifest.load_manifest(write_artifact(tmp_path, data))
    assert [t.kept_zero for t in m.tensors] == [False, True, False]
    calls = []

    class FakeCu:
        @staticmethod
        def cuMemsetD8Async(ptr, value, nbytes, stream):
            calls.append(("memset", ptr, value, nbytes, stream))
            return (None,)

    monkeypatch.setattr(kernel, "_cu", FakeCu)
    monkeypatch.setattr(kernel.driver, "check", lambda result, what: None)
    monkeypatch.setattr(kernel.driver, "synchronize", lambda s, *a: calls.append(("sync", s)))
    k = kernel.Kernel.__new__(kernel.Kernel)
    k._kept_zero = [(i, t) for i, t in enumerate(m.inputs) if t.kept_zero]
    plan = types.SimpleNamespace(shapes={"A": (7, 256), "B": (7, 4), "C": (7,)})
    host = {n: np.ones(shape, np.float32) for n, shape in plan.shapes.items()}
    bound = [args.BoundTensor(n, args.NUMPY, 0, a, a.nbytes) for n, a in host.items()]
    k._zero_kept(5, plan, [0x1000, 0x2000, 0x3000], bound)
    assert calls == [("memset", 0x2000, 0, 7 * 4 * 4, 5), ("sync", 5)]
    assert not host["B"].any() and host["A"].all() and host["C"].all()
    calls.clear()
    k._kept_zero = []  # nothing kept zero: no device work at all
    k._zero_kept(5, plan, [0x1000, 0x2000, 0x3000], bound)
    assert calls == []


def test_manifest_format_4_still_loads(tmp_path: Path) -> None:
    """Format 5 only added tensor maps: a format-4 artifact loads as is."""
    m = manifest.load_manifest(write_artifact(tmp_path, _set("format", "etc-artifact/4")))
    assert [t.name for t in m.inputs] == ["A", "B", "C"]


def test_manifest_not_json(tmp_path: Path) -> None:
    d = write_artifact(tmp_path)
    text = (d / "manifest.json").read_text()
    (d / "manifest.json").write_text(text[: len(text) // 2])  # truncated
    with pytest.raises(LaunchError, match="not valid JSON"):
        manifest.load_manifest(d)
    (d / "manifest.json").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(LaunchError, match="cannot read"):
        manifest.load_manifest(d)
    (d / "manifest.json").write_text("[1, 2]")
    with pytest.raises(LaunchError, match="expected an object"):
        manifest.load_manifest(d)


def test_manifest_directory_missing(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="cannot read the artifact manifest"):
        manifest.load_manifest(tmp_path / "nowhere")


def test_tampered_and_truncated_images(tmp_path: Path) -> None:
    d = write_artifact(tmp_path, cubin=b"\x7fELF fake cubin")
    (d / "kernel.ptx").write_bytes(PTX[:-10])  # truncated
    with pytest.raises(LaunchError, match="does not match its sha256"):
        manifest.load_manifest(d)
    (d / "kernel.ptx").write_bytes(PTX.replace(b"ret", b"bra"))  # tampered, same length
    with pytest.raises(LaunchError, match="'kernel.ptx' does not match its sha256"):
        manifest.load_manifest(d)
    (d / "kernel.ptx").write_bytes(PTX)
    (d / "kernel.cubin").write_bytes(b"\x7fELF other cubin")
    with pytest.raises(LaunchError, match="'kernel.cubin' does not match its sha256"):
        manifest.load_manifest(d)
    (d / "kernel.cubin").unlink()
    with pytest.raises(LaunchError, match="cannot read kernel image 'kernel.cubin'"):
        manifest.load_manifest(d)


def test_ptx_without_entry(tmp_path: Path) -> None:
    ptx = PTX.replace(b"splitk", b"other")
    data = splitk_manifest()
    data["sha256"]["kernel.ptx"] = hashlib.sha256(ptx).hexdigest()
    with pytest.raises(LaunchError, match="no entry point 'splitk'"):
        manifest.load_manifest(write_artifact(tmp_path, data, ptx=ptx))


def test_wait_count_forms(tmp_path: Path) -> None:
    data = splitk_manifest()
    data["symbols"].append("k")
    data["tensors"].append({"name": "W", "shape": ["n"], "dtype": "i32"})
    data["events"] += [
        {"name": "F", "shape": ["n"], "wait_count": "k"},
        {"name": "G", "shape": ["n"], "wait_count": {"table": "W"}},
    ]
    m = manifest.load_manifest(write_artifact(tmp_path, data))
    assert [e.wait_count for e in m.events] == [4, "k", {"table": "W"}]


def test_dtype_names() -> None:
    for name in ("f32", "float32", "torch.float32"):
        assert manifest.canonical_dtype(name) == "f32"
    assert manifest.canonical_dtype("torch.bfloat16") == "bf16"
    assert manifest.canonical_dtype("uint8") == "u8"
    assert manifest.canonical_dtype("complex64") is None


def test_torch_dtypes_match_the_element_types() -> None:
    torch = pytest.importorskip("torch")
    from etc.dtypes import dtype, torch_dtype

    # bf16 is torch's own type, not the uint16 numpy stores it in.
    assert torch_dtype("bf16") is torch.bfloat16
    for name, want in (("f32", torch.float32), ("f16", torch.float16), ("i32", torch.int32),
                       ("i64", torch.int64), ("half", torch.float16)):  # fmt: skip
        assert torch_dtype(name) is want
        # The round trip through the runtime's names.
        assert manifest.canonical_dtype(str(want)) == dtype(name).name


# -- static queues ---------------------------------------------------------------------------


def naive_queue(counts: list[int], grid: int) -> list[int]:
    per_cta: list[list[int]] = [[] for _ in range(grid)]
    p = 0
    for task, count in enumerate(counts):
        for i in range(count):
            per_cta[p % grid].append(task << 48 | i)
            p += 1
    header = [grid + 1]
    for entries in per_cta:
        header.append(header[-1] + len(entries))
    return header + [e for entries in per_cta for e in entries]


@pytest.mark.parametrize(
    ("counts", "grid"),
    [
        ([4, 1], 1),
        ([4, 1], 5),
        ([4, 1], 132),
        ([0, 0], 1),
        ([0, 3], 2),
        ([28, 7], 3),
        ([256, 64], 132),
        ([7, 0, 5, 11], 4),
        ([1], 1),
        ([4000, 1000, 3], 264),
        ([5, 5, 5], 15),
        ([5, 5, 5], 16),
    ],
)
def test_queue_matches_naive(counts: list[int], grid: int) -> None:
    q = queue.build_static_queue(counts, grid)
    assert q.dtype == np.int64
    assert q.tolist() == naive_queue(counts, grid)


@pytest.mark.parametrize("grid", [1, 2, 3, 7, 132])
def test_queue_is_linear_extension(grid: int) -> None:
    counts = [12, 3, 9, 1]
    per_cta = queue.decode(queue.build_static_queue(counts, grid))
    assert sum(map(len, per_cta)) == sum(counts)
    for entries in per_cta:
        tasks = [t for t, _ in entries]
        assert tasks == sorted(tasks), "a CTA must run tasks in task-index order"
        for t in set(tasks):
            inst = [i for tt, i in entries if tt == t]
            assert inst == sorted(inst)
    everything = sorted((t, i) for entries in per_cta for t, i in entries)
    assert everything == [(t, i) for t, c in enumerate(counts) for i in range(c)]


def test_queue_is_fast_for_millions() -> None:
    start = time.perf_counter()
    q = queue.build_static_queue([4_000_000, 1_000_000], 1056)
    elapsed = time.perf_counter() - start
    assert len(q) == 1057 + 5_000_000
    assert q[q[0]] == 0 and q[q[0] + 1] == 1056 and q[q[1]] == 1  # CTA 0: positions 0, 1056, ...
    assert elapsed < 2.0, f"{elapsed:.2f} s"


def test_queue_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        queue.build_static_queue([1], 0)
    with pytest.raises(ValueError):
        queue.build_static_queue([-1], 1)


def _per_sm(per_cta: list, sm_of: np.ndarray, task: int) -> np.ndarray:
    """How many of ``task``'s instances each SM received."""
    counts = np.zeros(sm_of.max() + 1, dtype=int)
    for c, entries in enumerate(per_cta):
        counts[sm_of[c]] += sum(t == task for t, _ in entries)
    return counts


@pytest.mark.parametrize("how", queue.SM_DEALS)
def test_sm_deal_is_a_linear_extension_by_sm(how: str) -> None:
    # 2 CTAs on each of 12 SMs, placed in a scrambled order as the hardware does.
    sm_of = np.random.default_rng(1).permutation(np.repeat(np.arange(12), 2))
    counts = [20, 14, 2, 24, 50, 7]
    per_cta = queue.decode(
        queue._queue_of(
            queue.global_order(counts),
            queue.sm_deal(queue.global_order(counts), 24, sm_of, how),
            24,
        )
    )
    everything = sorted((t, i) for entries in per_cta for t, i in entries)
    assert everything == [(t, i) for t, c in enumerate(counts) for i in range(c)]
    for entries in per_cta:  # global order within each CTA: the deadlock argument holds
        assert entries == sorted(entries)
    # 20 of 24: whole SMs, none beside an idle CTA of its SM.
    assert sorted(_per_sm(per_cta, sm_of, 0).tolist()) == [0, 0] + [2] * 10
    spread = how == "spread"
    # 2 (at most one per SM when spread) and 14 (more than the SMs: whole SMs either way).
    assert sorted(_per_sm(per_cta, sm_of, 2).tolist()) == [0] * (10 if spread else 11) + (
        [1, 1] if spread else [2]
    )
    assert sorted(_per_sm(per_cta, sm_of, 1).tolist()) == [0] * 5 + [2] * 7
    # 50: two whole rounds, then 2 more.
    assert sum(len([e for e in entries if e[0] == 4]) >= 2 for entries in per_cta) == 24
    # 7, odd: three whole SMs and one CTA, or seven SMs.
    assert sorted(_per_sm(per_cta, sm_of, 5).tolist())[-4:] == (
        [1, 1, 1, 1] if spread else [1, 2, 2, 2]
    )


def test_sm_deal_moves_the_idle_sms_along() -> None:
    sm_of = np.repeat(np.arange(4), 2)  # CTAs 2s, 2s+1 on SM s
    entries = queue.global_order([6, 6, 6])
    per_cta = queue.decode(queue._queue_of(entries, queue.sm_deal(entries, 8, sm_of, "pairs"), 8))
    idle = [{int(s) for s in np.flatnonzero(_per_sm(per_cta, sm_of, t) == 0)} for t in range(3)]
    assert idle == [{3}, {2}, {1}]


def test_placement_of_the_recorded_sms() -> None:
    assert queue.placement_of(np.array([1, 0, 0, 1]), 2).tolist() == [1, 0, 0, 1]
    # Not as many CTAs on every SM, an SM id out of range, no record (zeros), a partial grid.
    assert queue.placement_of(np.array([1, 0, 0, 0]), 2) is None
    assert queue.placement_of(np.array([2, 0, 1, 1]), 2) is None
    assert queue.placement_of(np.zeros(4, np.int64), 2) is None
    assert queue.placement_of(np.array([0, 1, 0]), 2) is None


def test_sm_deal_rejects_bad_input() -> None:
    entries = queue.global_order([4])
    with pytest.raises(ValueError, match="3 SM ids for a grid of 4"):
        queue.sm_deal(entries, 4, [0, 0, 1])
    with pytest.raises(ValueError, match="how must be one of"):
        queue.build_static_queue([4], 4, sm_of_cta=[0, 0, 1, 1], how="random")


def test_queue_dealt_by_a_placement() -> None:
    """With the SM each CTA ran on, a task's remainder lands on whole SMs."""
    sm_of = np.array([3, 0, 1, 2, 0, 1, 2, 3])  # 2 CTAs on each of 4 SMs
    counts = [6, 4]
    q = queue.build_static_queue(counts, 8, sm_of_cta=sm_of, how="pairs")
    per_cta = queue.decode(q)
    assert sorted(e for entries in per_cta for e in entries) == [
        (t, i) for t, c in enumerate(counts) for i in range(c)
    ]
    assert sorted(_per_sm(per_cta, sm_of, 0).tolist()) == [0, 2, 2, 2]
    assert queue.build_static_queue(counts, 8).tolist() == naive_queue(counts, 8)


# -- parameter packing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "strides"),
    [((), ()), ((5,), (1,)), ((3, 4), (4, 1)), ((2, 3, 4), (12, 4, 1)), ((0, 3), (3, 1))],
)
def test_contiguous_strides(shape: tuple, strides: tuple) -> None:
    assert params.contiguous_strides(shape) == strides


def test_param_pack_layout() -> None:
    specs = [
        manifest.ParamSpec("symbol", "n"),
        manifest.ParamSpec("tensor", "S", 0),
        manifest.ParamSpec("tensor", "V", 1),
        manifest.ParamSpec("tensor", "M", 2),
        manifest.ParamSpec("tensor", "T", 3),
        manifest.ParamSpec("counters"),
        manifest.ParamSpec("queue"),
        manifest.ParamSpec("status"),
        manifest.ParamSpec("max_polls"),
    ]
    pack = params.ParamPack(specs)
    assert pack.size == 1 + 3 + 5 + 7 + 9 + 5 + 5 + 5 + 1
    pack.set_symbol("n", 7)
    pack.set_memref("tensor", "S", 0x1000, ())
    pack.set_memref("tensor", "V", 0x2000, (7,))
    pack.set_memref("tensor", "M", 0x3000, (7, 256))
    pack.set_memref("tensor", "T", 0x4000, (2, 3, 4))
    pack.set_memref("counters", None, 0x5000, (7,))
    pack.set_memref("queue", None, 0x6000, (44,))
    pack.set_memref("status", None, 0x7000, (8,))
    pack.set_max_polls(1 << 40)
    assert pack.words() == [
        7,
        0x1000,
        0x1000,
        0,
        0x2000,
        0x2000,
        0,
        7,
        1,
        0x3000,
        0x3000,
        0,
        7,
        256,
        256,
        1,
        0x4000,
        0x4000,
        0,
        2,
        3,
        4,
        12,
        4,
        1,
        0x5000,
        0x5000,
        0,
        7,
        1,
        0x6000,
        0x6000,
        0,
        44,
        1,
        0x7000,
        0x7000,
        0,
        8,
        1,
        1 << 40,
    ]
    # The void*[] points at each 8-byte value in order.
    base = pack.values.ctypes.data
    assert pack.argv[: pack.size].tolist() == [base + 8 * i for i in range(pack.size)]
    assert pack.address == pack.argv.ctypes.data
    slots = pack.pointer_slots([("tensor", "M"), ("status", None)])
    assert slots.tolist() == [9, 10, 35, 36]


def test_param_pack_takes_full_u64() -> None:
    pack = params.ParamPack([manifest.ParamSpec("tensor", "X", 1), manifest.ParamSpec("max_polls")])
    pack.set_memref("tensor", "X", (1 << 64) - 256, (3,))
    pack.set_max_polls((1 << 63) - 1)
    assert pack.words() == [(1 << 64) - 256, (1 << 64) - 256, 0, 3, 1, (1 << 63) - 1]


# -- argument validation -----------------------------------------------------------------------


@pytest.fixture
def m(tmp_path: Path) -> manifest.Manifest:
    return manifest.load_manifest(write_artifact(tmp_path))


def good(n: int) -> dict[str, np.ndarray]:
    return {
        "A": np.zeros((n, 256), np.float32),
        "B": np.zeros((n, 4), np.float32),
        "C": np.zeros(n, np.float32),
    }


def shapes(m: manifest.Manifest, n: int) -> dict[str, tuple[int, ...]]:
    return args.bound_shapes(m, {"n": n})


def test_symbols(m: manifest.Manifest) -> None:
    assert args.bind_symbols(m, {"n": 7}) == (7,)
    assert args.bind_symbols(m, {"n": np.int64(3)}) == (3,)
    with pytest.raises(LaunchError, match="missing symbol 'n'"):
        args.bind_symbols(m, {})
    with pytest.raises(LaunchError, match="unknown symbol 'm'"):
        args.bind_symbols(m, {"n": 1, "m": 2})
    with pytest.raises(ShapeError, match="'n' must be an int >= 0, got -1"):
        args.bind_symbols(m, {"n": -1})
    for bad in (True, 2.0, "3", None):
        with pytest.raises(ShapeError, match="'n' must be an int"):
            args.bind_symbols(m, {"n": bad})


def test_a_symbol_above_its_max_is_refused(tmp_path: Path) -> None:
    data = splitk_manifest()
    data["symbol_max"] = {"n": 16}
    m = manifest.load_manifest(write_artifact(tmp_path / "ok", data))
    assert m.symbol_max == {"n": 16}
    assert args.bind_symbols(m, {"n": 16}) == (16,)
    with pytest.raises(ShapeError, match="splitk: symbol 'n' = 17 is above 16, the largest"):
        args.bind_symbols(m, {"n": 17})
    for bad in ({"m": 3}, {"n": -1}, {"n": "16"}):
        data["symbol_max"] = bad
        with pytest.raises(LaunchError, match="symbol_max"):
            manifest.load_manifest(write_artifact(tmp_path / "bad", data))


def test_a_requirement_the_symbols_break_is_refused(tmp_path: Path) -> None:
    """``Graph.require``'s entries: each size must be >= 0 at launch, or
    bind_symbols raises naming the message and the values; a malformed
    entry is refused when the manifest is read, naming the field."""
    data = splitk_manifest()
    data["requirements"] = [{"size": "n - 3", "message": "n must be at least 3"}]
    m = manifest.load_manifest(write_artifact(tmp_path / "ok", data))
    assert [(str(s), msg) for s, msg in m.requirements] == [("n - 3", "n must be at least 3")]
    assert args.bind_symbols(m, {"n": 3}) == (3,)
    with pytest.raises(
        ShapeError, match=r"splitk: n must be at least 3 \(n - 3 = -1 < 0 for n=2\)"
    ):
        args.bind_symbols(m, {"n": 2})
    for bad, field in (
        ([{"size": "k - 1", "message": "x"}], "requirements.0..size"),
        ([{"size": "n"}], "requirements.0..message"),
        (["n"], "requirements.0."),
    ):
        data["requirements"] = bad
        with pytest.raises(LaunchError, match=field):
            manifest.load_manifest(write_artifact(tmp_path / "bad", data))


def test_bind_numpy_and_pointers(m: manifest.Manifest) -> None:
    t = good(7)
    t["C"] = 0xABC000
    bound = args.bind_tensors(m, shapes(m, 7), t)
    assert [(b.name, b.kind, b.nbytes) for b in bound] == [
        ("A", "numpy", 7 * 256 * 4),
        ("B", "numpy", 28 * 4),
        ("C", "pointer", 28),
    ]
    assert bound[2].ptr == 0xABC000
    # Zero-size tensors may have a null pointer.
    assert args.bind_tensors(m, shapes(m, 0), {"A": 0, "B": 0, "C": 0})[0].ptr == 0


@pytest.mark.parametrize(
    ("name", "value", "error", "message"),
    [
        (
            "A",
            np.zeros((7, 255), np.float32),
            ShapeError,
            r"'A' has shape \(7, 255\), expected \(7, 256\) = \(n, 256\) \(dim 1 differ",
        ),
        ("A", np.zeros((7, 256, 1), np.float32), ShapeError, "'A' .*rank 3 instead of 2"),
        ("C", np.zeros(8, np.float32), ShapeError, r"'C' has shape \(8,\), expected \(7,\)"),
        (
            "B",
            np.zeros((7, 4), np.float64),
            ShapeError,
            "'B' has dtype numpy float64, expected f32",
        ),
        ("B", np.zeros((7, 4), np.int32), ShapeError, "'B' has dtype numpy int32"),
        (
            "C",
            [0.0] * 7,
            LaunchError,
            "'C': expected a torch CUDA tensor, a numpy array or a device pointer",
        ),
        ("C", True, LaunchError, "'C': expected"),
        ("C", 0, LaunchError, "'C': null device pointer"),
        ("C", -5, LaunchError, "'C': device pointer"),
        ("C", 1 << 64, LaunchError, "'C': device pointer"),
    ],
)
def test_bind_errors_name_the_tensor(
    m: manifest.Manifest, name: str, value: object, error: type, message: str
) -> None:
    t: dict[str, object] = dict(good(7))
    t[name] = value
    with pytest.raises(error, match=message):
        args.bind_tensors(m, shapes(m, 7), t)


def test_bind_missing_and_unknown(m: manifest.Manifest) -> None:
    t: dict[str, object] = dict(good(7))
    del t["B"]
    with pytest.raises(LaunchError, match="missing tensor 'B'"):
        args.bind_tensors(m, shapes(m, 7), t)
    t["B"], t["Z"] = good(7)["B"], good(7)["B"]
    with pytest.raises(LaunchError, match="unknown tensor 'Z'"):
        args.bind_tensors(m, shapes(m, 7), t)


def test_bind_dtypes(tmp_path: Path) -> None:
    data = splitk_manifest()
    data["tensors"][1]["dtype"] = "bf16"
    data["tensors"][2]["dtype"] = "int64"  # numpy-style names are accepted in manifests too
    m = manifest.load_manifest(write_artifact(tmp_path, data))
    assert m.tensor("C").dtype == "i64"
    t = {
        "A": np.zeros((3, 256), np.float32),
        "B": np.zeros((3, 4), np.uint16),
        "C": np.zeros(3, np.int64),
    }
    bound = args.bind_tensors(m, shapes(m, 3), t)  # bf16 as raw uint16 bits, like etc.dtypes
    assert [b.nbytes for b in bound] == [3 * 256 * 4, 3 * 4 * 2, 3 * 8]
    t["B"] = np.zeros((3, 4), np.float16)
    with pytest.raises(ShapeError, match="'B' has dtype numpy float16, expected bf16"):
        args.bind_tensors(m, shapes(m, 3), t)


@pytest.mark.parametrize(
    "text, message",
    [
        ("__import__('os')", "Call is not allowed"),
        ("n.real", "Attribute is not allowed"),
        ("n ** m", "constant right-hand side"),
        ("n ** 9", "exponents must be in 0..8"),
        ("n // -2", "constant right-hand side"),
        ("k + 1", "'k' is not a declared symbol"),
        ("n if m else 1", "IfExp is not allowed"),
    ],
)
def test_size_expressions_refuse_all_but_integer_arithmetic(text: str, message: str) -> None:
    from etc.runtime.sizes import parse_size

    with pytest.raises(ValueError, match=message):
        parse_size(text, ["n", "m"])


def test_size_expressions_evaluate_as_integer_arithmetic() -> None:
    """The checked tree, compiled once, gives Python's integer results; a
    zero divisor and a missing symbol fail as before."""
    from etc.runtime.sizes import parse_size

    size = parse_size("(n + 7)//8 - 2*m**2 + n % 3 + -m", ["n", "m"])
    for n, m in ((0, 0), (13, 2), (4096, 17), (2**40, 3)):
        assert size.evaluate({"n": np.int64(n), "m": m}) == (n + 7) // 8 - 2 * m**2 + n % 3 - m
    with pytest.raises(ZeroDivisionError, match="non-positive constant"):
        parse_size("n // 0", ["n"]).evaluate({"n": 3})
    with pytest.raises(KeyError):
        size.evaluate({"n": 1})


def test_a_size_text_is_parsed_once_per_set_of_symbols() -> None:
    """Kernels of one artifact repeat their split counts: the same text over
    the same symbols is the same parsed expression; over other symbols it is
    checked again (and refused if it names one they lack)."""
    from etc.runtime.sizes import parse_size

    text = "(L + 63)//64*B + 1"
    assert parse_size(text, ["B", "L"]) is parse_size(text, ("L", "B"))
    # Shared, it remembers its last evaluation: repeated and alternating
    # values give the right counts (the key is every symbol it names).
    size = parse_size(text, ["B", "L"])
    for B, L in ((2, 100), (2, 100), (3, 100), (2, 100), (2, 64), (2, 65)):
        assert size.evaluate({"B": B, "L": L, "S": 7}) == (L + 63) // 64 * B + 1
    with pytest.raises(ValueError, match="'L' is not a declared symbol"):
        parse_size(text, ["B"])


def test_sizes_must_fit(m: manifest.Manifest) -> None:
    with pytest.raises(ShapeError, match="'A'.*more bytes than a 64-bit index"):
        args.bound_shapes(m, {"n": 1 << 60})


def test_a_negative_dimension_is_named(tmp_path: Path) -> None:
    """A dimension such as ``n - 5`` below zero is refused as the simulator
    refuses it (it reached numpy and the driver as a negative size)."""
    data = splitk_manifest()
    data["tensors"][0]["shape"] = ["n - 5", 256]
    m = manifest.load_manifest(write_artifact(tmp_path, data))
    assert args.bound_shapes(m, {"n": 7})["A"] == (2, 256)
    with pytest.raises(
        ShapeError, match=r"tensor 'A': dimension 0 \(n - 5\) evaluates to -3 for n=2"
    ):
        args.bound_shapes(m, {"n": 2})


def test_fast_binder_defers_to_slow_path(m: manifest.Manifest) -> None:
    fast = args.FastBinder(m, shapes(m, 7), device=0)
    assert fast({"A": 0x1000, "B": 0x2000, "C": 0x3000}) == ([0x1000, 0x2000, 0x3000], False)
    assert fast(good(7)) is None  # numpy arrays take the slow path
    assert fast({"A": 0x1000, "B": 0x2000}) is None
    assert fast({"A": 0x1000, "B": 0x2000, "C": 0}) is None  # the slow path reports it
    # Not a mapping (a cached plan's launch): the slow path names it.
    for given in ([0x1000, 0x2000, 0x3000], 7):
        assert fast(given) is None
        with pytest.raises(LaunchError, match="tensors must map names to values, got"):
            args.bind_tensors(m, shapes(m, 7), given)
    with pytest.raises(LaunchError, match="symbols must map names to values, got list"):
        args.bind_symbols(m, [7])


# -- status records -----------------------------------------------------------------------------


def status(*words: int) -> np.ndarray:
    return np.array(list(words) + [0] * (8 - len(words)), np.int32)


def test_status_ok(m: manifest.Manifest) -> None:
    assert kernel.status_error(m, {"n": 7}, status(0), 100) is None


def test_status_deadlock(m: manifest.Manifest) -> None:
    # state, event, task, counter, wait count, instance, CTA, coordinate
    err = kernel.status_error(m, {"n": 7}, status(1, 0, 1, 4, 5, 6, 3, 6), 100)
    assert isinstance(err, DeadlockError)
    assert (err.event, err.coordinate, err.task, err.instance) == ("E", (6,), "final_sum", (6,))
    assert (err.counter, err.wait_count) == (4, 5)
    text = str(err)
    assert (
        "splitk" in text
        and "'E'" in text
        and "final_sum" in text
        and "CTA 3" in text
        and "n=7" in text
    )


def test_status_deadlock_2d_instance(m: manifest.Manifest) -> None:
    err = kernel.status_error(m, {"n": 7}, status(1, 0, 0, 0, 1, 9, 0, 2), 100)
    assert isinstance(err, DeadlockError)
    assert err.task == "partial_sum" and err.instance == (2, 1)  # 9 = 2 * 4 + 1


def test_status_garbage_is_reported_not_crashing(m: manifest.Manifest) -> None:
    err = kernel.status_error(m, {"n": 7}, status(1, 9, 9, 0, 1, 99, 0, 99), 100)
    assert isinstance(err, DeadlockError) and err.event == "#9" and err.task == "#9"
    err = kernel.status_error(m, {"n": 7}, status(2, 0, 17), 100)
    assert isinstance(err, LaunchError) and "bad task descriptor" in str(err) and "17" in str(err)
    err = kernel.status_error(m, {"n": 7}, status(3, 0, 0, 5, 5, 2), 100)
    assert isinstance(err, LaunchError) and "ready queue full (slot 5 of 5)" in str(err)
    err = kernel.status_error(m, {"n": 7}, status(1, -1, -1, 9, 12, -1, 3, -1), 100)
    assert isinstance(err, DeadlockError) and "ready-queue position 9 of 12" in str(err)
    err = kernel.status_error(m, {"n": 7}, status(7, 1), 100)
    assert isinstance(err, LaunchError) and "unknown status state 7" in str(err)


def test_delinearize() -> None:
    assert kernel.delinearize(0, ()) == ()
    assert kernel.delinearize(23, (2, 3, 4)) == (1, 2, 3)
    assert kernel.delinearize(24, (2, 3, 4)) is None


def test_total_instances(m: manifest.Manifest) -> None:
    assert kernel.total_instances(m, {"n": 7}) == [28, 7]


def test_unknown_schedule_is_refused(tmp_path: Path) -> None:
    data = splitk_manifest()
    data["schedule"] = "round-robin"
    with pytest.raises(LaunchError, match="schedule: expected one of static, dynamic"):
        etc.runtime.load(write_artifact(tmp_path, data))


def test_dynamic_manifest_fields(tmp_path: Path) -> None:
    data = splitk_manifest()
    data["schedule"] = "dynamic"
    data["tasks"][0]["ready_at_start"] = True
    m = manifest.load_manifest(write_artifact(tmp_path, data))
    assert m.schedule == "dynamic" and [t.ready_at_start for t in m.tasks] == [True, False]
    data["tasks"][1]["ready_at_start"] = "yes"
    with pytest.raises(LaunchError, match=r"tasks\[1\]\.ready_at_start: expected a bool"):
        manifest.load_manifest(write_artifact(tmp_path, data))


def test_load_without_gpu_is_a_launch_error(tmp_path: Path) -> None:
    from etc.runtime import driver

    if driver.device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(LaunchError):
        etc.runtime.load(write_artifact(tmp_path))


# -- importability ------------------------------------------------------------------------------


def test_import_without_extension_or_torch() -> None:
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.startswith(("etc._mlir_libs", "torch", "mlir")):
                    raise ImportError("blocked: " + name)
                return None
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, {str(ROOT / "python")!r})
        import etc.runtime
        from etc.runtime import load, Kernel
        assert not any(m.startswith(("etc._mlir_libs", "torch")) for m in sys.modules)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_parts_that_wait_for_each_other_never_share_a_cta() -> None:
    """A task whose blocks' parts spin for each other (``meets``): a deal by
    SM that would put two parts of one block on one CTA (here the remainder
    past a whole round lands on the CTA of the block's first part) gives
    way to round-robin, which never does; more parts than CTAs is an
    error."""
    counts, grid, sm = [6], 5, [1, 1, 2, 2, 0]  # CTA 4 alone on SM 0
    by_sm = queue.decode(queue.build_static_queue(counts, grid, None, None, sm, "spread"))
    assert (0, 5) in by_sm[4] and (0, 4) in by_sm[4]  # block {4, 5} on one CTA
    safe = queue.build_static_queue(counts, grid, None, None, sm, "spread", [2])
    assert safe.tolist() == queue.build_static_queue(counts, grid).tolist()
    entries = queue.global_order(counts, None)
    ctas = queue.sm_deal(entries, grid, sm, "spread")
    assert not queue.parts_apart(entries, ctas, [2], grid)
    assert queue.parts_apart(entries, np.arange(6) % grid, [2], grid)
    # A deal that keeps the parts apart is kept.
    kept = queue.build_static_queue([4], 5, None, None, sm, "spread", [2])
    assert kept.tolist() == queue.build_static_queue([4], 5, None, None, sm, "spread").tolist()
    with pytest.raises(ValueError, match="4 parts that wait for each other need as many CTAs"):
        queue.build_static_queue([8], 3, meets=[4])


class _FakeDriver:
    """The few ``cuda.bindings.driver`` names ``driver.synchronize`` uses: the
    stream reports ``NOT_READY`` for ``busy`` queries, then ``final``."""

    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_NOT_READY = 600
        CUDA_ERROR_LAUNCH_FAILED = 719

    def __init__(self, busy: float, final: int = 0) -> None:
        self.busy, self.final, self.queries, self.synchronized = busy, final, 0, 0

    def cuStreamQuery(self, stream):
        self.queries += 1
        if self.queries <= self.busy:
            return (self.CUresult.CUDA_ERROR_NOT_READY,)
        return (self.CUresult(self.final),)

    def cuStreamSynchronize(self, stream):
        self.synchronized += 1
        return (self.CUresult.CUDA_SUCCESS,)

    def cuGetErrorName(self, err):
        return (self.CUresult.CUDA_SUCCESS, self.CUresult(err).name.encode())

    def cuGetErrorString(self, err):
        return (self.CUresult.CUDA_SUCCESS, b"described")


def test_synchronize_with_a_timeout_polls_and_gives_up(monkeypatch):
    """A launch the watchdog cannot stop (a barrier hang) leaves the caller
    waiting in cuStreamSynchronize; with a timeout the stream is polled and
    LaunchTimeoutError names the graph. Without one nothing is polled."""
    from etc.errors import LaunchTimeoutError
    from etc.runtime import driver

    hung = _FakeDriver(busy=float("inf"))
    monkeypatch.setattr(driver, "cu", hung)
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError, match=r"fuzz5: the launch did not finish within 0.05 s"):
        driver.synchronize(7, 0.05, "fuzz5")
    assert 0.05 <= time.monotonic() - start < 1.0 and hung.queries > 3
    assert issubclass(LaunchTimeoutError, LaunchError)

    done = _FakeDriver(busy=3)
    monkeypatch.setattr(driver, "cu", done)
    driver.synchronize(7, 10.0, "g")
    assert done.queries == 4 and done.synchronized == 0
    driver.synchronize(7)
    assert done.synchronized == 1

    failed = _FakeDriver(busy=1, final=719)
    monkeypatch.setattr(driver, "cu", failed)
    with pytest.raises(LaunchError, match="CUDA_ERROR_LAUNCH_FAILED") as e:
        driver.synchronize(7, 10.0, "g")
    assert not isinstance(e.value, LaunchTimeoutError)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "5", True])
def test_a_bad_timeout_is_refused_before_anything_loads(bad, tmp_path):
    with pytest.raises(LaunchError, match="timeout must be a number of seconds > 0 or None"):
        etc.runtime.load(tmp_path / "missing", timeout=bad)

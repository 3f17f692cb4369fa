"""What ``etc run`` and ``etc bench`` do: run or time a graph or a saved
artifact on inputs made up from a seed (or read from an ``.npz``), and
compare what it computed with the simulator's or a saved reference.

A graph (``MODULE:FUNCTION``) runs in the CPU simulator (``simulate=True``)
or is compiled and run on the GPU; an artifact directory runs on the GPU
with the runtime alone, so this module imports neither the compiler nor the
GPU runtime until a source needs it.

Made-up inputs: floating-point tensors uniform in ``[-scale, scale)``,
integer tensors and kept-zero tensors zeros (an index of zero is in every
buffer). ``bf16`` tensors are uint16 bits in memory and in ``.npz`` files; an
``.npz`` may give them as floats, which are rounded.
"""

from __future__ import annotations

import datetime
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .dtypes import bf16_to_f32, dtype, f32_to_bf16
from .errors import EtcError, LaunchError, ShapeError

#: Default tolerances of a comparison, by element type: ``(rtol, atol)``;
#: integers must be equal.
TOLERANCES = {
    "f64": (1e-9, 1e-12),
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-3),
    "bf16": (2e-2, 1e-2),
}

#: Elements drawn at a time when making up a large input.
_CHUNK = 1 << 24


@dataclass(frozen=True)
class Buffer:
    """A tensor a launch is given, its shape bound."""

    name: str
    dtype: str  # ETC's name (``bf16``, ``f32``, ``i32``, ...)
    shape: tuple[int, ...]
    kept_zero: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype(self.dtype).itemsize


def graph_buffers(graph: Any, symbols: Mapping[str, int]) -> list[Buffer]:
    """The buffers of ``graph`` (not its TMA maps) under ``symbols``, which
    are checked as the simulator checks them."""
    from .simulator import _concrete_shape, bind_symbols

    if graph.rank is not None:
        raise EtcError(
            f"graph '{graph.name}' spans ranks; run it with etc.simulate_ranks or "
            "etc.runtime.RankGroup"
        )
    env = bind_symbols(graph, symbols)
    return [
        Buffer(
            t.name, t.dtype.name, _concrete_shape(t.shape, env, f"tensor '{t.name}'"), t.kept_zero
        )
        for t in graph.tensors
        if t.map_of is None
    ]


def artifact_manifest(directory: Path, symbols: Mapping[str, int]) -> Any:
    """The manifest of the artifact in ``directory``, or of the kernel of a
    bucketed one that ``symbols`` pick."""
    from .runtime.buckets import load_buckets
    from .runtime.manifest import load_manifest

    path = Path(directory)
    while (path / "buckets.json").exists():
        path = load_buckets(path, lambda p: p).kernel_for(symbols)
    return load_manifest(path)


def manifest_buffers(manifest: Any, symbols: Mapping[str, int]) -> list[Buffer]:
    """The buffers a launch of ``manifest``'s kernel takes under ``symbols``,
    which are checked as a launch checks them."""
    from .runtime.args import bind_symbols, bound_shapes

    if manifest.ranked:
        raise EtcError(
            f"{manifest.graph}: the kernel spans ranks; launch it with etc.runtime.RankGroup"
        )
    bind_symbols(manifest, symbols)
    shapes = bound_shapes(manifest, symbols)
    return [Buffer(t.name, t.dtype, shapes[t.name], t.kept_zero) for t in manifest.inputs]


def make_inputs(
    buffers: Sequence[Buffer],
    given: Mapping[str, Any] | None = None,
    seed: int = 0,
    scale: float = 1.0,
) -> dict[str, np.ndarray]:
    """An array per buffer: ``given[name]`` where given (checked and, for a
    ``bf16`` buffer given floats, rounded), else made up (see the module)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise EtcError(f"the seed must be an int >= 0, got {seed!r}")
    if not math.isfinite(scale):
        raise EtcError(f"the scale must be a finite number, got {scale!r}")
    given = dict(given or {})
    known = {b.name for b in buffers}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ShapeError(
            f"inputs name {', '.join(map(repr, unknown))}, which the kernel does not take "
            f"(it takes {', '.join(sorted(known))})"
        )
    rng = np.random.default_rng(seed)
    arrays = {}
    for b in buffers:  # every buffer draws, given or not, so a name's values follow the seed
        made = _made_up(b, rng, scale)
        arrays[b.name] = made if b.name not in given else _given(b, given[b.name])
    return arrays


def _made_up(b: Buffer, rng: np.random.Generator, scale: float) -> np.ndarray:
    d = dtype(b.dtype)
    out = np.zeros(b.shape, dtype=d.numpy)
    if d.is_integer or b.kept_zero:
        return out
    flat = out.reshape(-1)
    for start in range(0, flat.size, _CHUNK):
        chunk = rng.random(min(_CHUNK, flat.size - start), dtype=np.float32) * 2 - 1
        chunk *= np.float32(scale)
        flat[start : start + chunk.size] = f32_to_bf16(chunk) if b.dtype == "bf16" else chunk
    return out


def _given(b: Buffer, value: Any) -> np.ndarray:
    a = np.asarray(value)
    if tuple(a.shape) != b.shape:
        raise ShapeError(f"input '{b.name}': shape {tuple(a.shape)}, the kernel takes {b.shape}")
    d = dtype(b.dtype)
    if b.dtype == "bf16" and a.dtype.kind == "f":
        return f32_to_bf16(a)
    if a.dtype != d.numpy:
        raise ShapeError(
            f"input '{b.name}': dtype {a.dtype}, the kernel takes {b.dtype} "
            f"({d.numpy} in an .npz{', or floats' if b.dtype == 'bf16' else ''})"
        )
    return np.ascontiguousarray(a)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The named arrays of an ``.npz`` file (``np.savez``)."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise EtcError(f"{path}: one array, not an .npz of named arrays (np.savez)")
        with data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as e:
        raise EtcError(f"{path}: cannot read it as an .npz of arrays: {e}") from None


def values(b: Buffer, a: np.ndarray) -> np.ndarray:
    """The array's values as numbers (``bf16`` bits widened to float32)."""
    return bf16_to_f32(a) if b.dtype == "bf16" else a


def summary(b: Buffer, a: np.ndarray) -> str:
    """One line: the tensor's type and shape and its values' range."""
    v = values(b, a)
    head = f"{b.name}: {b.dtype} {b.shape}"
    if v.size == 0:
        return f"{head} (empty)"
    if v.dtype.kind == "f":
        finite = np.isfinite(v)
        bad = int(v.size - np.count_nonzero(finite))
        if bad == v.size:
            return f"{head} all {v.size} values are NaN or infinite"
        v = v[finite]
        tail = f", {bad} NaN or infinite" if bad else ""
        return f"{head} min {v.min():.6g} max {v.max():.6g} mean {v.mean():.6g}{tail}"
    return f"{head} min {v.min()} max {v.max()} nonzero {np.count_nonzero(v)}"


def compare(
    got: Mapping[str, np.ndarray],
    want: Mapping[str, np.ndarray],
    buffers: Sequence[Buffer],
    names: Sequence[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> tuple[list[str], list[str]]:
    """Compares ``got`` with ``want`` tensor by tensor (``names``, default
    every tensor ``want`` has): ``(lines, problems)``, a line per compared
    tensor and a problem per one that differs (elements past the tolerances
    of its type, :data:`TOLERANCES`, or ``rtol``/``atol``; NaN matches NaN)."""
    by_name = {b.name: b for b in buffers}
    names = check_names(buffers, want, names)
    lines, problems = [], []
    for name in names:
        b = by_name[name]
        ref = np.asarray(want[name])
        if b.dtype == "bf16" and ref.dtype.kind == "f":
            ref = f32_to_bf16(ref)
        if tuple(ref.shape) != b.shape:
            problems.append(f"{name}: the reference's shape {tuple(ref.shape)} is not {b.shape}")
            continue
        g, w = values(b, got[name]), values(b, ref)
        if b.dtype not in TOLERANCES:  # integers
            bad = g != w
            detail = ""
        else:
            r, a = TOLERANCES[b.dtype]
            r, a = (r if rtol is None else rtol), (a if atol is None else atol)
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            bad = ~np.isclose(g64, w64, rtol=r, atol=a, equal_nan=True)
            both = np.isfinite(g64) & np.isfinite(w64)
            err = np.abs(g64 - w64)[both]
            detail = f", max |error| {err.max() if err.size else 0:.3g} (rtol {r:g}, atol {a:g})"
        count = int(np.count_nonzero(bad))
        if not count:
            lines.append(f"{name}: matches{detail}")
            continue
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        message = (
            f"{name}: {count} of {bad.size} elements differ{detail}; first at {first}: "
            f"{_number(g[first])} against {_number(w[first])}"
        )
        lines.append(message)
        problems.append(message)
    return lines, problems


def _number(v: Any) -> str:
    return f"{v.item():.8g}" if np.asarray(v).dtype.kind == "f" else str(v.item())


def check_names(
    buffers: Sequence[Buffer], want: Mapping[str, Any], names: Sequence[str] | None
) -> list[str]:
    """The tensors to compare (``names``, default all of ``want``'s), each
    a tensor of the kernel that ``want`` has."""
    known = {b.name for b in buffers}
    names = list(want) if names is None else list(names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise EtcError(
            f"compare: {', '.join(map(repr, unknown))} is no tensor of the kernel "
            f"(it has {', '.join(sorted(known))})"
        )
    absent = [n for n in names if n not in want]
    if absent:
        raise EtcError(f"compare: the reference has no {', '.join(map(repr, absent))}")
    return names


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Writes ``arrays`` to exactly ``path`` (``np.savez`` alone would add
    ``.npz`` to a name without it)."""
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@dataclass
class Source:
    """What to run: a graph (``graph``) or an artifact directory
    (``directory``)."""

    graph: Any = None
    directory: Path | None = None
    schedule: str | None = None
    target: str = "sm_90"
    #: Compile a graph with ``trace=True`` (an artifact keeps its own).
    trace: bool = False

    @property
    def label(self) -> str:
        if self.graph is not None:
            return f"graph '{self.graph.name}' ({self.schedule or 'static'} schedule)"
        return str(self.directory)

    def buffers(self, symbols: Mapping[str, int], manifest: Any = None) -> list[Buffer]:
        """The buffers under ``symbols``: the graph's, or those of the
        artifact's ``manifest`` for them (read here unless given)."""
        if self.graph is not None:
            return graph_buffers(self.graph, symbols)
        return manifest_buffers(manifest or artifact_manifest(self.directory, symbols), symbols)

    def load(self, device: int | None, timeout: float | None, max_polls: int | None) -> Any:
        """The GPU kernel: the artifact's, or the graph's compiled now."""
        from .runtime import driver, load

        if self.graph is None:
            return load(self.directory, device=device, timeout=timeout, max_polls=max_polls)
        driver.get_device(device or 0)  # no GPU: say so before compiling
        from .compiler import compile as compile_graph

        artifact = compile_graph(
            self.graph, schedule=self.schedule or "static", target=self.target, trace=self.trace
        )
        return artifact.load(device=device, timeout=timeout, max_polls=max_polls)


def leaf_kernel(kernel: Any, symbols: Mapping[str, int]) -> Any:
    """The kernel that runs ``symbols``: ``kernel`` itself, or the one a
    bucketed kernel (buckets within buckets too) picks."""
    while hasattr(kernel, "kernel_for"):
        kernel = kernel.kernel_for(symbols)
    return kernel


def run(
    source: Source,
    symbols: Mapping[str, int],
    *,
    inputs: Mapping[str, Any] | None = None,
    seed: int = 0,
    scale: float = 1.0,
    simulate: bool = False,
    check: bool = False,
    expect: Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    device: int | None = None,
    timeout: float | None = None,
    max_polls: int | None = None,
    save_inputs: Path | None = None,
    output: Path | None = None,
    trace: Path | None = None,
    say: Callable[[str], None] = print,
) -> int:
    """``etc run``: runs once, prints each tensor's summary and, with
    ``check`` (the simulator's result, graphs only) or ``expect`` (a saved
    reference), the comparison; with ``trace``, writes the launch's
    timeline there (Chrome/Perfetto JSON); returns 1 when a compared tensor
    differs."""
    if simulate and source.graph is None:
        raise EtcError("--simulate needs a graph (MODULE:FUNCTION), not an artifact directory")
    if check and simulate:
        raise EtcError("--check compares a GPU run with the simulator's: not with --simulate")
    if check and source.graph is None:
        raise EtcError(
            "--check simulates the graph, so it needs MODULE:FUNCTION; for an artifact, "
            "compare with a saved reference (--expect REF.npz)"
        )
    if trace is not None and simulate:
        raise EtcError("--trace records a GPU launch: not with --simulate")
    manifest = None
    if trace is not None and source.graph is None:
        manifest = artifact_manifest(source.directory, symbols)
        if not manifest.traced:
            raise EtcError(
                f"{source.directory}: compiled without trace=True, so it records no timeline "
                "(etc.compile(g, trace=True))"
            )
    buffers = source.buffers(symbols, manifest)
    if names is not None and not (check or expect is not None):
        raise EtcError("compare: names tensors of --check or --expect; give one")
    if names is not None:  # before anything runs
        check_names(buffers, {b.name: None for b in buffers}, names)
    if expect is not None:
        check_names(buffers, expect, names)
    arrays = make_inputs(buffers, inputs, seed, scale)
    if save_inputs is not None:
        write_npz(save_inputs, arrays)
    from .simulator import simulate as run_simulator

    reference = None
    if check:  # the simulator's copy, before the run writes into the arrays
        reference = run_simulator(source.graph, arrays, symbols, schedule="static")
    timeline = None
    if simulate:
        result = run_simulator(source.graph, arrays, symbols, schedule=source.schedule or "static")
        where = f"simulated ({source.schedule or 'static'} schedule)"
    else:
        kernel = source.load(device, timeout, max_polls)
        kernel.launch(arrays, symbols)  # numpy arrays: synchronous, outputs copied back
        result = arrays
        where = "ran on the GPU"
        timeline = kernel.trace() if trace is not None else None
    say(f"{where} with {', '.join(f'{k}={v}' for k, v in symbols.items()) or 'no symbols'}:")
    for b in buffers:
        say("  " + summary(b, result[b.name]))
    problems: list[str] = []
    for label, want in (("the simulator", reference), ("the reference", expect)):
        if want is None:
            continue
        lines, found = compare(result, want, buffers, names, rtol, atol)
        say(f"against {label}:")
        for line in lines:
            say("  " + line)
        problems += found
    if output is not None:
        write_npz(output, {b.name: result[b.name] for b in buffers})
    if timeline is not None:
        timeline.to_chrome(trace)
        say(f"{trace}: {len(timeline)} task instances ({timeline.dropped} dropped)")
    return 1 if problems else 0


@dataclass
class _Timed:
    """A source ready to time: its kernel, its input sets on the device and
    each pass's samples."""

    source: Source
    kernel: Any
    per_set: int
    sets: list[dict[str, int]] = field(default_factory=list)
    passes: list[dict[str, Any]] = field(default_factory=list)

    def pass_medians(self, what: str) -> list[float]:
        return [p[what].median for p in self.passes]

    def mean(self, what: str) -> float:
        return statistics.fmean(self.pass_medians(what))


def bench(
    sources: Source | Sequence[Source],
    symbols: Mapping[str, int],
    *,
    inputs: Mapping[str, Any] | None = None,
    seed: int = 0,
    scale: float = 1.0,
    device: int | None = None,
    timeout: float | None = None,
    max_polls: int | None = None,
    warmup: int = 2,
    reps: int = 20,
    calls: int = 10,
    sets: int | None = None,
    spin_ms: float = 20.0,
    passes: int = 1,
    grid: int | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """``etc bench``: times launches on the GPU (see :mod:`etc.runtime.timing`)
    over ``sets`` copies of the inputs taken in turn (by default enough to
    span twice the L2, at most 8, within half the free memory), after one
    checked launch on each; returns and prints the figures. Several sources
    (kernels to compare on the same inputs) are timed in ``passes`` rounds,
    each pass timing every source, the order rotated from pass to pass, so a
    drift of the GPU's pace over the run falls on all of them alike; each
    is compared with the first by the mean of its passes' medians. ``grid``:
    every launch on that many CTAs (``Kernel.launch(grid=...)``: within the
    co-resident ones, whole clusters), to see what a kernel loses or gains
    with fewer."""
    from .runtime import driver, timing

    sources = [sources] if isinstance(sources, Source) else list(sources)
    for what, v, low in (
        ("warmup", warmup, 0), ("reps", reps, 1), ("calls", calls, 1), ("passes", passes, 1),
        ("sources", len(sources), 1),
    ):  # fmt: skip
        if v < low:
            raise EtcError(f"bench: {what} must be >= {low}, got {v}")
    if sets is not None and not 1 <= sets <= 64:
        raise EtcError(f"bench: sets must be in 1..64, got {sets}")
    if not spin_ms > 0:
        raise EtcError(f"bench: the spin must be > 0 ms, got {spin_ms}")
    if grid is not None and grid < 1:
        raise EtcError(f"bench: grid must be >= 1 CTA, got {grid}")
    buffers = [s.buffers(symbols) for s in sources]  # every source checked before any loads
    timed = [
        _Timed(s, s.load(device, timeout, max_polls), sum(b.nbytes for b in bufs))
        for s, bufs in zip(sources, buffers, strict=True)
    ]
    dev, *others = (leaf_kernel(t.kernel, symbols).device for t in timed)
    devices = sorted({d.ordinal for d in (dev, *others)})
    if len(devices) > 1:
        raise LaunchError(f"bench: the sources loaded on different devices {devices}")
    all_sets = sum(t.per_set for t in timed)
    free = timing.free_bytes()
    if all_sets > free:
        raise LaunchError(
            f"bench: the inputs take {all_sets / 1e9:.3g} GB and the device has "
            f"{free / 1e9:.3g} GB free"
        )
    if sets is None:
        largest = max(max(t.per_set for t in timed), 1)
        sets = max(1, min(8, math.ceil(2 * timing.l2_bytes(dev) / largest)))
        sets = max(1, min(sets, free // 2 // max(all_sets, 1)))
    owned: list[Any] = []
    stream = timing.Stream(dev)
    try:
        for t, bufs in zip(timed, buffers, strict=True):
            for k in range(sets):
                arrays = make_inputs(bufs, inputs, seed + k, scale)
                ptrs = {}
                for b in bufs:
                    buf = driver.DeviceBuffer(b.nbytes)
                    owned.append(buf)
                    host = np.ascontiguousarray(arrays[b.name])
                    driver.htod(buf.ptr, host.ctypes.data, b.nbytes)
                    ptrs[b.name] = buf.ptr
                t.sets.append(ptrs)
                t.kernel.launch(
                    ptrs, symbols, stream=stream.handle, timeout=timeout, grid=grid
                )  # checked
        for p in range(passes):
            for i in range(len(timed)):
                t = timed[(i + p) % len(timed)]

                def launch(j: int, t: _Timed = t) -> None:
                    t.kernel.launch(
                        t.sets[j % sets], symbols, stream=stream.handle, sync=False, grid=grid
                    )

                def check(t: _Timed = t) -> None:
                    t.kernel.check(timeout)

                eager, host = timing.time_launches(launch, check, stream, calls, reps, warmup)
                gpu, _ = timing.time_launches(
                    launch, check, stream, calls, reps, warmup=1, spin_ns=int(spin_ms * 1e6)
                )
                t.passes.append({"launch_to_launch": eager, "gpu": gpu, "host_enqueue": host})
        copy_bps = timing.copy_bandwidth(stream)
    finally:
        # A launch still running (a timeout past the watchdog) keeps its
        # buffers and stream: freeing them would wait for it, forever.
        if stream.idle():
            for buf in owned:
                buf.release()
            stream.close()
        else:
            for buf in owned:
                buf.ptr = 0
    kinds = ("launch_to_launch", "gpu", "host_enqueue")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": (
            f"CUDA events around {calls} launches back to back, median of {reps} rounds "
            f"after {warmup}, in {passes} pass(es) over the sources, the order rotated; "
            f"'gpu': behind a {spin_ms:g} ms spin kernel; inputs made up (seed {seed}, scale "
            f"{scale:g}) or given, {sets} set(s) in turn; a figure is the mean of the passes' "
            "medians"
        ),
        "symbols": dict(symbols),
        "grid": grid,
        "device": dev.name,
        "calls": calls,
        "reps": reps,
        "sets": sets,
        "passes": passes,
        "copy_bandwidth_Bps": copy_bps,
        "sources": [
            {
                "source": t.source.label,
                "tensor_bytes": t.per_set,
                **{k: {"mean_us": t.mean(k), "pass_medians_us": t.pass_medians(k)} for k in kinds},
                "samples": [{k: p[k].as_dict() for k in kinds} for p in t.passes],
            }
            for t in timed
        ],
    }
    where = ", ".join(f"{k}={v}" for k, v in symbols.items()) or "no symbols"
    say(
        f"{dev.name}, {where}: {reps} rounds of {calls} launches, median a round; "
        f"{passes} pass(es) over {len(timed)} source(s)"
        + (", mean of the passes' medians" if passes > 1 else "")
        + (f"; grid {grid} CTAs" if grid is not None else "")
    )
    first, indent = timed[0], "    " if len(timed) > 1 else "  "
    labels = ("launch to launch", "GPU alone", "host enqueue")
    for n, t in enumerate(timed):
        if len(timed) > 1:
            say(f"  {t.source.label}:")
        for label, kind in zip(labels, kinds, strict=True):
            extra = ""
            if passes > 1:
                extra = "  (passes: " + ", ".join(f"{m:.2f}" for m in t.pass_medians(kind)) + ")"
            if n and kind == "gpu":
                mine, theirs = t.pass_medians(kind), first.pass_medians(kind)
                ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
                mean = statistics.fmean(ratios)
                extra += (
                    f"; {mean:.4f}x the first ({(mean - 1) * 100:+.1f} %), faster in "
                    f"{sum(r < 1 for r in ratios)} of {passes} pass(es)"
                )
            say(f"{indent}{label:16} {t.mean(kind):10.2f} µs{extra}")
        say(
            f"{indent}tensors: {t.per_set / 1e6:.3f} MB a launch, {sets} input set(s) in turn; "
            f"once over them per GPU time: {t.per_set / t.mean('gpu') / 1e3:.1f} GB/s"
        )
    say(f"  device copy: {copy_bps / 1e9:.1f} GB/s measured now")
    return result

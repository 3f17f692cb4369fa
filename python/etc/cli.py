"""The `etc` and `etc-opt` commands.

etc compile MODULE:FUNCTION -o DIR [--schedule static|dynamic] [--no-early-push]
    build the graph returned by FUNCTION() in MODULE (a file or an
    importable module), compile it and save the artifact in DIR
etc info DIR [--full]
    print an artifact's manifest summary (of each kernel of a bucketed
    one, under the ranges that pick it); long size expressions are
    shortened unless --full
etc dot MODULE:FUNCTION [-o FILE]
    write the graph returned by FUNCTION() as Graphviz DOT (stdout by
    default; render with `dot -Tsvg FILE`)
etc trace RAW.npz -o OUT.json [--png OUT.png]
    convert a saved trace (`kernel.trace().save(...)`) to a Chrome /
    Perfetto timeline (one track per SM) and optionally a PNG
etc run SOURCE --symbols NAME=N,... [--simulate] [--check] [--expect REF.npz]
    run a graph (MODULE:FUNCTION: in the simulator, or compiled and on the
    GPU) or an artifact directory (GPU) once on made-up or given inputs;
    print each tensor's range, compare with the simulator or a reference
    (exit status 1 when a tensor differs), save the tensors (-o OUT.npz)
etc bench SOURCE [SOURCE...] --symbols NAME=N,... [--symbols ...] [--passes N] [--json FILE]
    time launches on the GPU with CUDA events: launch to launch as a Python
    loop sees it, the GPU's time alone, the host's enqueue cost, and the
    device's copy bandwidth measured in the same run; several sources are
    compared with the first in passes whose order rotates; several
    --symbols are timed in turn (the JSON then a list, one entry each)
etc-opt ARGS...     the bundled optimizer driver (same as build/bin/etc-opt)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import re
import sys
from pathlib import Path
from typing import Any


def _load_builder(spec: str) -> Any:
    module_name, _, function = spec.rpartition(":")
    if not module_name or not function:
        raise SystemExit(f"etc: expected MODULE:FUNCTION, got {spec!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        path = Path(module_name)
        loader = importlib.util.spec_from_file_location(path.stem, path)
        if loader is None or not path.exists():
            raise SystemExit(f"etc: no such file {path}")
        module = importlib.util.module_from_spec(loader)
        sys.modules[path.stem] = module
        # As when running the file as a script: its directory is importable.
        sys.path.insert(0, str(path.resolve().parent))
        try:
            loader.loader.exec_module(module)
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise SystemExit(f"etc: cannot import {module_name!r} ({e})") from None
    if not hasattr(module, function):
        raise SystemExit(f"etc: {module_name} has no {function!r}")
    return getattr(module, function)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="etc", description="ETC, the Event Tensor Compiler")
    commands = parser.add_subparsers(dest="command", required=True)
    comp = commands.add_parser("compile", help="compile a graph to an artifact directory")
    comp.add_argument("builder", help="MODULE:FUNCTION returning an etc.Graph")
    comp.add_argument("-o", "--output", required=True, type=Path)
    comp.add_argument("--schedule", choices=("static", "dynamic"), default="static")
    comp.add_argument("--no-early-push", dest="early_push", action="store_false")
    comp.add_argument("--target", default="sm_90")
    comp.add_argument(
        "--min-ctas-per-sm", type=int, default=0, help="resident CTAs per SM to ask ptxas for"
    )
    comp.add_argument(
        "--outline",
        metavar="TASKS",
        help="tasks whose tiles the kernel calls instead of inlining: 'all' or task,task,...",
    )
    info = commands.add_parser("info", help="summarise an artifact")
    info.add_argument("artifact", type=Path)
    info.add_argument(
        "--full", action="store_true", help="print long size expressions whole, not shortened"
    )
    info.add_argument(
        "--symbols",
        metavar="NAME=N,...",
        type=_symbol_values,
        default={},
        help="bind symbols: only the kernel of a bucketed artifact that runs them, with every "
        "tensor's shape and task's grid as numbers (e.g. B=8,L=4096,S=4097)",
    )
    dot = commands.add_parser("dot", help="draw a graph's tasks and events as Graphviz DOT")
    dot.add_argument("builder", help="MODULE:FUNCTION returning an etc.Graph")
    dot.add_argument("-o", "--output", type=Path, help="the DOT file (default: stdout)")
    trace = commands.add_parser("trace", help="timeline of a saved trace")
    trace.add_argument("raw", type=Path)
    trace.add_argument("-o", "--output", required=True, type=Path)
    trace.add_argument("--png", type=Path)
    run = commands.add_parser(
        "run",
        help="run a graph or an artifact once on made-up or given inputs",
        parents=[_source_options()],
    )
    run.add_argument("--simulate", action="store_true", help="run a graph in the CPU simulator")
    run.add_argument(
        "--check",
        action="store_true",
        help="compare the GPU's result with the simulator's (a graph only)",
    )
    run.add_argument("--expect", type=Path, metavar="REF.npz", help="compare with these arrays")
    run.add_argument(
        "--compare",
        metavar="T,...",
        type=_names,
        help="the tensors to compare (default: all of the reference's)",
    )
    run.add_argument("--rtol", type=float, help="relative tolerance (default: by element type)")
    run.add_argument("--atol", type=float, help="absolute tolerance (default: by element type)")
    run.add_argument("--save-inputs", type=Path, metavar="IN.npz", help="write the inputs used")
    run.add_argument("-o", "--output", type=Path, metavar="OUT.npz", help="write every tensor")
    run.add_argument(
        "--trace", type=Path, metavar="OUT.json",
        help="write the launch's timeline (Chrome/Perfetto JSON; a graph is compiled with "
        "trace=True, an artifact must have been)",
    )  # fmt: skip
    bench = commands.add_parser(
        "bench", help="time a graph's or an artifact's launches on the GPU (or compare several)",
        parents=[_source_options(several=True)],
    )  # fmt: skip
    bench.add_argument("--warmup", type=int, default=2, help="untimed rounds first (2)")
    bench.add_argument("--reps", type=int, default=20, help="timed rounds, one sample each (20)")
    bench.add_argument("--calls", type=int, default=10, help="launches a round (10)")
    bench.add_argument(
        "--sets",
        type=int,
        help="copies of the inputs launched in turn (default: enough to span twice the L2)",
    )
    bench.add_argument(
        "--spin-ms", type=float, default=20.0,
        help="how long a spin kernel holds the stream while a round is enqueued (20)",
    )  # fmt: skip
    bench.add_argument(
        "--passes", type=int,
        help="rounds over all the sources, the order rotated (default: 1, or 4 for several)",
    )  # fmt: skip
    bench.add_argument(
        "--grid", type=int, metavar="CTAS",
        help="launch on this many CTAs instead of every co-resident one (whole clusters)",
    )  # fmt: skip
    bench.add_argument("--json", type=Path, metavar="FILE", help="write the figures as JSON")
    args = parser.parse_args(argv)

    import etc

    try:
        if args.command == "compile":
            graph = _graph(args.builder)
            outline: bool | tuple[str, ...] = False
            if args.outline == "all":
                outline = True
            elif args.outline is not None:
                outline = tuple(t for t in args.outline.split(",") if t)
            artifact = etc.compile(
                graph,
                schedule=args.schedule,
                target=args.target,
                early_push=args.early_push,
                min_ctas_per_sm=args.min_ctas_per_sm,
                outline=outline,
            )
            path = artifact.save(args.output)
            print(f"{path}: kernel {artifact.kernel_name!r}, {args.schedule} schedule")
            for warning in artifact.warnings:
                print(f"etc: warning: {warning}", file=sys.stderr)
            return 0
        if args.command in ("run", "bench"):
            return _run_or_bench(args)
        if args.command == "dot":
            graph = _graph(args.builder)
            text = graph.to_dot()
            if args.output is None:
                sys.stdout.write(text)
            else:
                args.output.write_text(text)
                print(f"{args.output}: {len(graph.tasks)} tasks, {len(graph.events)} events")
            return 0
        if args.command == "trace":
            from etc.runtime.trace import Trace

            timeline = Trace.load(args.raw)
            timeline.to_chrome(args.output)
            if args.png:
                timeline.to_png(args.png)
            print(f"{args.output}: {len(timeline)} task instances ({timeline.dropped} dropped)")
            return 0
        _info_any(args.artifact, full=args.full, symbols=args.symbols)
        return 0
    except (etc.EtcError, OSError) as e:  # an OSError names the file it could not write
        print(f"etc: {e}", file=sys.stderr)
        return 1


def _graph(spec: str) -> Any:
    """The graph that ``MODULE:FUNCTION`` returns."""
    import etc

    graph = _load_builder(spec)()
    if not isinstance(graph, etc.Graph):
        raise SystemExit(f"etc: {spec} returned {type(graph).__name__}, not a Graph")
    return graph


def _source_options(several: bool = False) -> argparse.ArgumentParser:
    """The options ``etc run`` and ``etc bench`` share."""
    p = argparse.ArgumentParser(add_help=False)
    what = "an artifact directory, or MODULE:FUNCTION returning a graph"
    if several:
        p.add_argument("sources", nargs="+", metavar="source", help=f"{what}; several: compared")
        p.add_argument(
            "--symbols", metavar="NAME=N,...", type=_symbol_values, action="append",
            help="every symbol's value (e.g. n=1000); given again, each set in turn",
        )  # fmt: skip
    else:
        p.add_argument("source", help=what)
        p.add_argument(
            "--symbols", metavar="NAME=N,...", type=_symbol_values, default={},
            help="every symbol's value (e.g. n=1000)",
        )  # fmt: skip
    p.add_argument("--inputs", type=Path, metavar="IN.npz", help="arrays for some tensors")
    p.add_argument("--seed", type=int, default=0, help="seed of the made-up inputs (0)")
    p.add_argument(
        "--scale", type=float, default=1.0,
        help="made-up floats are uniform in [-scale, scale) (1)",
    )  # fmt: skip
    p.add_argument(
        "--schedule", choices=("static", "dynamic"),
        help="a graph's schedule (static); an artifact keeps its own",
    )  # fmt: skip
    p.add_argument("--target", default="sm_90", help="a graph's target (sm_90)")
    p.add_argument("--device", type=int, help="the CUDA device (0)")
    p.add_argument(
        "--timeout", type=float, default=120.0,
        help="seconds a launch may take (120; 0: no bound)",
    )  # fmt: skip
    p.add_argument(
        "--max-polls", type=int,
        help="the watchdog's bound on every wait (default: the artifact's)",
    )  # fmt: skip
    return p


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected tensor names, e.g. C,logits")
    return names


def _run_or_bench(args: argparse.Namespace) -> int:
    from etc import runner

    if not 0 <= args.timeout < math.inf:
        raise SystemExit(f"etc: --timeout must be seconds >= 0 (0: no bound), got {args.timeout}")
    if args.max_polls is not None and args.max_polls < 1:
        raise SystemExit(f"etc: --max-polls must be >= 1, got {args.max_polls}")
    trace = getattr(args, "trace", None) is not None
    specs = args.sources if args.command == "bench" else [args.source]
    sources = [_source(spec, args.schedule, args.target, trace) for spec in specs]
    inputs = runner.read_npz(args.inputs) if args.inputs else None
    common = dict(
        inputs=inputs, seed=args.seed, scale=args.scale, device=args.device,
        timeout=args.timeout or None, max_polls=args.max_polls,
    )  # fmt: skip
    if args.command == "bench":
        passes = args.passes if args.passes is not None else (1 if len(sources) == 1 else 4)
        for symbols in args.symbols or [{}]:  # every set checked before any is timed
            for source in sources:
                source.buffers(symbols)
        figures = [
            runner.bench(
                sources, symbols, warmup=args.warmup, reps=args.reps, calls=args.calls,
                sets=args.sets, spin_ms=args.spin_ms, passes=passes, grid=args.grid, **common,
            )
            for symbols in args.symbols or [{}]
        ]  # fmt: skip
        if args.json:
            import json

            doc = figures[0] if len(figures) == 1 else figures
            args.json.write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    if args.simulate and args.device is not None:
        raise SystemExit("etc: --simulate runs on the CPU: no --device with it")
    expect = runner.read_npz(args.expect) if args.expect else None
    return runner.run(
        sources[0], args.symbols, simulate=args.simulate, check=args.check, expect=expect,
        names=args.compare, rtol=args.rtol, atol=args.atol, save_inputs=args.save_inputs,
        output=args.output, trace=args.trace, **common,
    )  # fmt: skip


def _source(spec: str, schedule: str | None, target: str, trace: bool) -> Any:
    """What ``etc run`` or ``etc bench`` runs: an artifact directory or a
    graph builder."""
    from etc import runner

    path = Path(spec)
    if path.is_dir():
        if schedule is not None:
            raise SystemExit(
                f"etc: --schedule is for a graph; the artifact {path} has its schedule"
            )
        return runner.Source(directory=path, target=target)
    if ":" in spec:
        return runner.Source(_graph(spec), schedule=schedule, target=target, trace=trace)
    raise SystemExit(f"etc: {spec!r} is neither an artifact directory nor MODULE:FUNCTION")


def _symbol_values(text: str) -> dict[str, int]:
    """An argparse ``type``: ``NAME=N`` pairs joined by commas."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            number: int | None = int(value)  # no "=": value "" is no int either
        except ValueError:
            number = None
        if number is None or not name.strip():
            raise argparse.ArgumentTypeError(f"{part!r} is not NAME=INT")
        out[name.strip()] = number
    return out


def _info_any(
    artifact: Path,
    ranges: tuple[str, ...] = (),
    top: Path | None = None,
    full: bool = False,
    symbols: dict[str, int] | None = None,
) -> None:
    """``etc info`` of an artifact, or of every kernel of a bucketed one
    (buckets within buckets too), each under the ranges that pick it; with
    ``symbols``, only the kernels whose ranges hold them."""
    from etc.runtime.buckets import load_buckets

    if not (artifact / "buckets.json").exists():
        _info(artifact, full, symbols)
        return
    table = load_buckets(artifact, lambda path: path)
    picked = table.kernel_for(symbols) if symbols and table.symbol in symbols else None
    for k, (bound, path) in enumerate(zip(table.bounds, table.kernels, strict=True)):
        if picked is not None and path != picked:
            continue
        low = table.bounds[k - 1] + 1 if k else None
        where = " and ".join(
            ([f"{table.symbol} >= {low}"] if low else [])
            + ([f"{table.symbol} <= {bound}"] if bound is not None else [])
        )
        here = (*ranges, where or f"any {table.symbol}")
        if (path / "buckets.json").exists():
            _info_any(path, here, top or artifact, full, symbols)
            continue
        print(f"{path.relative_to(top or artifact)} ({', '.join(here)}):")
        _info(path, full, symbols)


#: Size expressions longer than this are shortened by ``etc info`` (the
#: decoder's tiered split counts run to thousands of characters).
_SHORT_SIZE = 80


def _size(expr: object, full: bool) -> str:
    text = str(expr)
    if full or len(text) <= _SHORT_SIZE:
        return text
    names = sorted(set(re.findall(r"[A-Za-z_]\w*", text)))
    return f"<{len(text)}-character expression of {', '.join(names)}; --full prints it>"


def _info(artifact: Path, full: bool = False, symbols: dict[str, int] | None = None) -> None:
    """Print what the artifact's manifest says (``etc info``); with
    ``symbols`` every size as its number (a size of a symbol not given, or a
    value past a symbol's bound, is said instead)."""
    from etc.errors import EtcError
    from etc.runtime.args import symbol_value
    from etc.runtime.manifest import bind_size, load_manifest

    m = load_manifest(artifact)
    size = _size
    if symbols:
        unknown = sorted(set(symbols) - set(m.symbols))
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            raise EtcError(f"{artifact}: --symbols: {names} is none of its symbols")
        for name, value in symbols.items():  # the runtime's check of a launch's values
            symbol_value(m, name, value)

        def size(expr: object, full: bool) -> int | str:  # the number instead
            try:
                return bind_size(expr, symbols)
            except KeyError as e:
                return f"<needs {e.args[0]}>"

    print(f"{m.graph}: kernel {m.kernel!r} for {m.target}, {m.schedule} schedule")
    bounds = {n: f"{n} (<= {b})" for n, b in m.symbol_max.items()}
    print(f"  symbols: {', '.join(bounds.get(n, n) for n in m.symbols) or '-'}")
    if m.ranks is not None:
        print(f"  spans ranks: rank '{m.ranks[0]}' of '{m.ranks[1]}' (etc.runtime.RankGroup)")
    if m.dynamic_shared_memory:
        print(f"  dynamic shared memory: {m.dynamic_shared_memory} bytes")
    for t in m.tensors:
        if t.tensor_map is not None:
            src, box, chunk = t.tensor_map
            layout = f", 8-row groups of {chunk}-wide chunks" if chunk else ""
            print(f"  tensor {t.name}: TMA map of {src!r}, box {box}{layout} (encoded at launch)")
            continue
        kept = ", kept zero (zeroed after a failed launch)" if t.kept_zero else ""
        print(f"  tensor {t.name}: {t.dtype} {tuple(size(d, full) for d in t.shape)}{kept}")
    for task in m.tasks:
        kind, v = task.phase
        phase = (
            ""
            if task.phase == ("const", 0)
            else (f", phase: grid dimension {v}" if kind == "dim" else f", phase {v}")
        )
        grid = tuple(size(d, full) for d in task.grid)
        count = ""
        if symbols and all(isinstance(d, int) for d in grid):
            n = math.prod(grid)
            count = f" = {n} instance{'' if n == 1 else 's'}"
        print(f"  task {task.index} {task.name}: grid {grid}{count}{phase}")


def etc_opt() -> None:
    """Runs the `etc-opt` binary installed next to the bindings."""
    binary = Path(__file__).resolve().parent / "_mlir_libs" / "etc-opt"
    if not binary.exists():
        raise SystemExit(f"etc-opt: not installed at {binary} (build the package first)")
    os.execv(binary, [str(binary), *sys.argv[1:]])

"""Command-line plumbing shared by the examples: every example checks its
result and takes --simulate, --schedule static|dynamic and --emit-ptx FILE."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def count(low: int = 1) -> Callable[[str], int]:
    """An argparse ``type``: an int of at least ``low``; anything else is a
    usage error naming the option (exit status 2), not a traceback."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    parse.__name__ = f"int >= {low}"  # argparse names the type in its message
    return parse


def counts(low: int = 1, sep: str = ",", length: int | None = None) -> Callable[[str], list[int]]:
    """An argparse ``type``: ints of at least ``low`` joined by ``sep``
    (``1,7,16``, or ``128x64`` with ``sep="x"``), ``length`` of them if given."""
    one = count(low)

    def parse(text: str) -> list[int]:
        values = [one(part) for part in text.split(sep)]
        if length is not None and len(values) != length:
            raise argparse.ArgumentTypeError(f"{text!r} is not {length} ints joined by {sep!r}")
        return values

    parse.__name__ = f"{sep}-separated ints >= {low}"
    return parse


def pairs(text: str) -> list[list[int]]:
    """An argparse ``type``: ``AxB`` pairs of ints >= 1 joined by commas."""
    pair = counts(sep="x", length=2)
    return [pair(part) for part in text.split(",")]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def seconds(text: str) -> float | None:
    """An argparse ``type``: a number of seconds >= 0, where 0 is None (no bound)."""
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0")
    return value or None


def positive(text: str) -> float:
    """An argparse ``type``: a float above 0."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not above 0")
    return value


def output_file(text: str) -> str:
    """An argparse ``type``: a file to write, whose directory exists (checked
    before anything is compiled, not after)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"directory {folder!r} does not exist")
    return text


class _Parser(argparse.ArgumentParser):
    """Refuses the shared options' combinations that would silently ignore
    one of them: --simulate compiles and loads nothing, so --artifact would
    go unused; --emit-ptx and --save-artifact compile here, so they cannot
    take a kernel compiled elsewhere."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed = super().parse_args(args, namespace)
        if getattr(parsed, "artifact", None):
            if parsed.simulate:
                self.error("--artifact runs a saved kernel on the GPU; --simulate runs none")
            if parsed.emit_ptx or parsed.save_artifact:
                self.error("--emit-ptx and --save-artifact compile here; --artifact loads a kernel")
        return parsed


def cli(main: Callable[..., int], *args: Any) -> int:
    """``main(*args)``'s exit code, with an ETC error (a launch that failed, a
    saved artifact that cannot be read) or a file that cannot be written
    printed as one ``error:`` line naming it (exit status 1) instead of a
    traceback. Anything else is a bug and keeps its traceback."""
    import etc

    try:
        return main(*args)
    except (etc.EtcError, OSError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def parser(description: str) -> argparse.ArgumentParser:
    from etc.compiler import TARGETS

    p = _Parser(description=description)
    p.add_argument("--simulate", action="store_true", help="run on the CPU simulator")
    p.add_argument("--schedule", choices=("static", "dynamic"), default="static")
    p.add_argument(
        "--no-early-push",
        dest="early_push",
        action="store_false",
        help="dynamic schedule: push consumers on completion, not on dispatch",
    )
    p.add_argument(
        "--emit-ptx", metavar="FILE", type=output_file,
        help="write the compiled PTX to FILE and exit",
    )  # fmt: skip
    p.add_argument("--print-ir", action="store_true", help="print the graph's MLIR first")
    p.add_argument(
        "--save-artifact", metavar="DIR", help="compile, save the artifact to DIR and exit"
    )
    p.add_argument(
        "--artifact",
        metavar="DIR",
        help="run a saved artifact (compiled elsewhere) instead of compiling here",
    )
    p.add_argument(
        "--target", choices=TARGETS, default="sm_90",
        help="the chip to compile for (examples whose tiles need wgmma or TMA take sm_90a)",
    )  # fmt: skip
    p.add_argument("--seed", type=count(0), default=0)
    p.add_argument(
        "--timeout",
        type=seconds,
        default=120.0,
        metavar="SECONDS",
        help="GPU: a launch that has not finished after this long stops the example with "
        "LaunchTimeoutError (a hang the kernel's watchdog cannot see); 0: wait without bound "
        "(default 120)",
    )
    return p


def shape_of(tensor: Any, symbols: Mapping[str, int]) -> tuple[int, ...]:
    """The concrete shape of a graph tensor once the symbols are bound."""
    return tuple(d if isinstance(d, int) else d.evaluate(symbols) for d in tensor.shape)


def run_case(
    g: Any,
    kernel: Any,
    args: argparse.Namespace,
    inputs: Mapping[str, np.ndarray],
    symbols: Mapping[str, int],
) -> dict[str, np.ndarray]:
    """Every tensor after one run: in the simulator when `kernel` is None,
    else on the GPU (outputs start zeroed, inputs are copied)."""
    import etc

    if kernel is None:
        return etc.simulate(
            g, inputs, symbols, schedule=args.schedule, seed=args.seed, early_push=args.early_push
        )
    # Every buffer but the TMA tensor maps, which the runtime encodes itself.
    outputs = {
        t.name: np.zeros(shape_of(t, symbols), t.dtype.numpy) for t in g.tensors if t.map_of is None
    }
    outputs.update({k: v.copy() for k, v in inputs.items()})
    kernel.launch(outputs, symbols)
    return outputs


def compile_graph(g: Any, args: argparse.Namespace) -> Any:
    import etc

    return etc.compile(
        g,
        schedule=args.schedule,
        target=args.target,
        early_push=args.early_push,
        min_ctas_per_sm=getattr(args, "min_ctas_per_sm", 0),
        outline=getattr(args, "outline", False),
    )


def compile_only(
    g: Any,
    args: argparse.Namespace,
    compile: Callable[[], Any] | None = None,
    ptx_names: Sequence[str] | None = None,
) -> int | None:
    """--print-ir, then --emit-ptx / --save-artifact: compile and return the
    exit code (0); None when the example should go on and run. ``g``: a
    graph, or a list of them (each printed); ``compile`` makes the artifact
    (``compile_graph(g, args)`` unless given); with ``ptx_names`` it is
    bucketed and each kernel's PTX (``artifact.leaves()``'s order) goes to
    ``FILE.<name>.ptx``."""
    for one in g if isinstance(g, list) else [g]:
        if args.print_ir:
            print(one.to_mlir())
    compile = compile or (lambda: compile_graph(g, args))
    if args.emit_ptx:
        artifact = compile()
        if ptx_names is None:
            files = [(args.emit_ptx, artifact)]
        else:
            stem = args.emit_ptx.removesuffix(".ptx")
            # Every kernel, in launch order (a bucket's own buckets included).
            kernels = [leaf for _, leaf in artifact.leaves()]
            files = [
                (f"{stem}.{name}.ptx", kernel)
                for name, kernel in zip(ptx_names, kernels, strict=True)
            ]
        for path, kernel in files:
            with open(path, "w") as f:
                f.write(kernel.ptx)
            print(f"wrote {path} ({len(kernel.ptx)} bytes of PTX)")
        return 0
    if args.save_artifact:
        print(f"saved {compile().save(args.save_artifact)}")
        return 0
    return None


def load_kernel(g: Any, args: argparse.Namespace, compile: Callable[[], Any] | None = None) -> Any:
    """The GPU kernel (--artifact, else compiled here: ``compile()`` if
    given, else ``compile_graph(g, args)``); None with --simulate."""
    if args.simulate:
        return None
    if args.artifact:
        from etc import runtime

        return runtime.load(args.artifact, timeout=args.timeout)
    return (compile or (lambda: compile_graph(g, args)))().load(timeout=args.timeout)


def run(
    g: Any,
    args: argparse.Namespace,
    cases: list[tuple[Mapping[str, int], Mapping[str, np.ndarray]]],
    expect: Callable[[Mapping[str, int], Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    decode: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
) -> int:
    """Runs every (symbols, inputs) case on the simulator or the GPU and
    compares the named outputs with ``expect`` (``decode[name]`` first turns
    an output into what ``expect`` gives, e.g. bf16 bits into floats).
    Returns a process exit code."""

    done = compile_only(g, args)
    if done is not None:
        return done
    kernel = load_kernel(g, args)
    failures = 0
    for symbols, inputs in cases:
        outputs = run_case(g, None if args.simulate else kernel, args, inputs, symbols)
        for name, want in expect(symbols, inputs).items():
            got = (decode or {}).get(name, np.asarray)(outputs[name])
            ok = np.allclose(got, want, rtol=rtol, atol=atol)
            err = float(np.max(np.abs(got - want))) if want.size else 0.0
            print(f"{'ok  ' if ok else 'FAIL'} {dict(symbols)} {name}: max abs error {err:.3g}")
            failures += not ok
    where = "simulator" if args.simulate else "GPU"
    print(f"{len(cases) - failures}/{len(cases)} cases match numpy on the {where}")
    return 1 if failures else 0


def decoder_options(p: argparse.ArgumentParser) -> None:
    """The decoder examples' own flags: the tiny model on the GPU too, and
    the check of every step against the numpy model (its tolerance, or off)."""
    p.add_argument("--tiny", action="store_true", help="the tiny configuration on the GPU too")
    p.add_argument(
        "--tolerance",
        type=positive,
        help="largest relative error (default: 2e-2, or 3e-2 for a model of 16 layers or more)",
    )
    p.add_argument("--no-check", dest="check", action="store_false")


def check_decode_step(
    cfg: Any,
    before: Mapping[str, np.ndarray],
    out: Mapping[str, np.ndarray],
    L: int,
    tolerance: float | None,
) -> tuple[bool, str]:
    """A decoder step's outputs ``out`` against the numpy model over the
    arrays ``before`` it (``etc.models.llama.reference_step``, same
    rounding): whether the logits' relative error is within ``tolerance``,
    and a line giving it and whether the greedy tokens agree.

    By default 2e-2, or 3e-2 for a model of 16 layers or more: sixteen
    random bf16 layers put two correct implementations 2-3e-2 apart (HF's
    own bf16 model is 2.6e-2 / 3.3e-2 from its float32 one, docs/decoder.md),
    and Llama-3.2-1B over a paged cache came to 2.02e-2 on the H200."""
    if tolerance is None:
        tolerance = 3e-2 if cfg.layers >= 16 else 2e-2
    from etc.dtypes import bf16_to_f32
    from etc.models import llama

    ref = llama.reference_step(cfg, before, L)
    got = bf16_to_f32(out["logits"])
    err = float(np.linalg.norm(got - ref["logits"]) / np.linalg.norm(ref["logits"]))
    same = np.array_equal(out["next_tokens"], ref["next_tokens"])
    tokens = "equal" if same else "differ (a near-tie)"
    return err <= tolerance, f"logits rel err {err:.2e}, greedy tokens {tokens}"

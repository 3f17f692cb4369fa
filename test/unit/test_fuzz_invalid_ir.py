"""Mutation fuzzing: etc-opt and the bindings reject invalid IR, never abort.

A seeded corpus of mutants of the lit test inputs (each file split at
``// -----``) goes through the verifier, both schedules, the GPU lowering and
the PTX pipelines. Every run must end with exit status 0 or 1 (never a
signal, an assertion or an LLVM crash report), and every failure must print an
``error:`` with a source location.

The test runs a fixed sample (480 mutants x 6 pipelines in 360 etc-opt runs,
240 through the bindings: about 15 s on two cores); the lit cases it mutates
include every crasher found so far. A larger campaign, to hunt for crashes,
runs the same generator from the command line::

    python test/unit/test_fuzz_invalid_ir.py --mutants 1500 --rounds 6 --seed 7

(``--rounds`` feeds the mutants that still verify back into the corpus, so
later rounds get past the parser into the passes) and writes each crasher to
``--out`` (default /tmp/etc-fuzz).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unit_helpers import REPO, find_etc_opt  # noqa: E402

PIPELINES = (
    "--etensor-verify-graph",
    "--etensor-static-schedule",
    "--etensor-dynamic-schedule",
    "--convert-etensor-to-gpu",
    "--etc-static-to-ptx",
    "--etc-dynamic-to-ptx",
)
# Seed and size of the sample the test runs: each mutant goes through every
# pipeline, CASES_PER_RUN mutants per etc-opt invocation.
SEED = 20250611
MUTANTS = 480
CASES_PER_RUN = 8
BINDINGS_MUTANTS = 240
TIMEOUT_S = 60
SPLIT = "// -----"

# -- corpus -------------------------------------------------------------------


def corpus(root: Path = REPO / "test") -> list[str]:
    """Every `// -----` case of the lit inputs, without comment lines."""
    cases = []
    for sub in ("Dialect", "Conversion", "Pipelines"):
        for path in sorted((root / sub).rglob("*.mlir")):
            for chunk in re.split(r"^// -----.*$", path.read_text(), flags=re.M):
                lines = [ln for ln in chunk.splitlines() if not ln.lstrip().startswith("//")]
                text = "\n".join(lines).strip()
                if text:
                    cases.append(text + "\n")
    return cases


# -- mutations ----------------------------------------------------------------

TOKEN = re.compile(r"%[\w.$#-]+|@[\w.$-]+|!?[A-Za-z_][\w.$]*|-?\d+|->|\S")
SSA = re.compile(r"%[A-Za-z_$.\d][\w.$-]*")
INT = re.compile(r"(?<![\w%@#.])-?\d+(?![\w.])")
SHAPED = re.compile(r"(memref|!etensor\.event|vector|tensor)<([^<>]*)>")
MAP = re.compile(r"\(([^()]*)\) -> \(([^()]*)\)")
SYMBOL = re.compile(r"@[\w.$-]+")
EXTREMES = (
    "-1",
    "0",
    "1",
    "2",
    "1024",
    "65535",
    "2147483647",
    "2147483648",
    "4294967296",
    "281474976710656",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "99999999999999999999",
)
TYPES = (
    "!etensor.event<>",
    "!etensor.event<?>",
    "!etensor.event<4>",
    "!etensor.event<0>",
    "!etensor.event<?x?>",
    "!etensor.event<2x3>",
    "!etensor.event<?x4x?>",
    "!etensor.queue",
    "memref<?xi32>",
    "memref<4xi32>",
    "memref<?x4xf32>",
    "memref<?xf32>",
    "memref<4x?xi64>",
    "memref<?xi32, 3>",
    "memref<1xi64, #gpu.address_space<workgroup>>",
    "memref<*xf32>",
    "index",
    "i1",
    "i32",
    "f32",
)
SWAPS = (
    ("ins", "outs"),
    ("static", "dynamic"),
    ("wait", "notify"),
    ("push", "pop"),
    ("count", "count from"),
    ("index", "i64"),
    ("i32", "f32"),
    ("task", "dispatch"),
    ("func.func", "etensor.graph"),
    ("etensor.graph", "func.func"),
    ("return", "etensor.yield"),
    ("grid", "grid [2, 2]"),
    ("-> i1", ""),
    ("]", ", %c0]"),
)


def _pick(rng: random.Random, pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(pattern.finditer(text))
    return rng.choice(matches) if matches else None


def _splice(text: str, m: re.Match[str], new: str) -> str:
    return text[: m.start()] + new + text[m.end() :]


def delete_line(rng, text, _):
    lines = text.splitlines()
    del lines[rng.randrange(len(lines))]
    return "\n".join(lines) + "\n"


def duplicate_line(rng, text, _):
    lines = text.splitlines()
    k = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[k])
    return "\n".join(lines) + "\n"


def foreign_line(rng, text, others):
    """A line of another case: new ops, names that do not resolve."""
    lines = text.splitlines()
    donor = rng.choice(others).splitlines()
    lines.insert(rng.randrange(len(lines) + 1), rng.choice(donor))
    return "\n".join(lines) + "\n"


def delete_token(rng, text, _):
    m = _pick(rng, TOKEN, text)
    return _splice(text, m, "") if m else text


def duplicate_token(rng, text, _):
    m = _pick(rng, TOKEN, text)
    return _splice(text, m, m.group() + " " + m.group()) if m else text


def swap_ssa(rng, text, _):
    """Two uses of different SSA values trade places."""
    uses = list(SSA.finditer(text))
    if len(uses) < 2:
        return text
    a, b = rng.sample(uses, 2)
    if a.group() == b.group():
        return text
    if a.start() > b.start():
        a, b = b, a
    return text[: a.start()] + b.group() + text[a.end() : b.start()] + a.group() + text[b.end() :]


def rename_ssa_everywhere(rng, text, _):
    names = sorted(set(SSA.findall(text)))
    if len(names) < 2:
        return text
    a, b = rng.sample(names, 2)
    return re.sub(re.escape(a) + r"(?![\w.$-])", b, text)


def replace_int(rng, text, _):
    m = _pick(rng, INT, text)
    return _splice(text, m, rng.choice(EXTREMES)) if m else text


def toggle_dim(rng, text, _):
    """`?` to a number or a number to `?` inside a shaped type."""
    m = _pick(rng, SHAPED, text)
    if not m:
        return text
    dims = m.group(2).split("x") if m.group(2) else []
    if not dims:
        dims = ["?"]
    elif rng.random() < 0.2:
        dims.insert(rng.randrange(len(dims) + 1), rng.choice(["?", "4", "1"]))
    elif rng.random() < 0.2:
        del dims[rng.randrange(len(dims))]
    else:
        k = rng.randrange(len(dims))
        dims[k] = (
            rng.choice(["0", "1", "3", "4", "8", "1048577", "4294967296"])
            if dims[k] == "?"
            else "?"
        )
    return _splice(text, m, f"{m.group(1)}<{'x'.join(dims)}>")


def replace_type(rng, text, _):
    m = _pick(rng, re.compile(r"!etensor\.\w+(<[^<>]*>)?|memref<[^<>]*>|\bindex\b|\bi\d+\b"), text)
    return _splice(text, m, rng.choice(TYPES)) if m else text


def mutate_map(rng, text, _):
    """Drop or add a map dimension or result, or make a result non-trivial."""
    m = _pick(rng, MAP, text)
    if not m:
        return text
    dims = [d.strip() for d in m.group(1).split(",") if d.strip()]
    results = [r.strip() for r in m.group(2).split(",") if r.strip()]
    choice = rng.randrange(7)
    if choice == 0 and dims:
        del dims[rng.randrange(len(dims))]
    elif choice == 1:
        dims.append(f"x{len(dims)}")
    elif choice == 2 and results:
        del results[rng.randrange(len(results))]
    elif choice == 3:
        results.append(rng.choice(dims) if dims else "0")
    elif choice == 4 and results:
        k = rng.randrange(len(results))
        results[k] = rng.choice(["0", "1", "-1", "5", "1000000"])
    elif choice == 5 and results and dims:
        k = rng.randrange(len(results))
        d = rng.choice(dims)
        results[k] = rng.choice(
            [f"{d} + 1", f"{d} * 2", f"{d} floordiv 2", f"{d} mod 3", f"{d} - 7"]
        )
    elif results and dims:
        results = [rng.choice(dims) for _ in results]
    return _splice(text, m, f"({', '.join(dims)}) -> ({', '.join(results)})")


ODD_SYMBOLS = ("@missing", "@gpu.x", '@"a b"', '@"1x"', '@"x@y"', "@x.y", "@main_kernels")


def rename_symbol(rng, text, _):
    """One reference to another symbol, or every reference to a new name
    (which keeps the case valid: odd kernel and function names)."""
    m = _pick(rng, SYMBOL, text)
    if not m:
        return text
    if rng.random() < 0.5:
        new = rng.choice(ODD_SYMBOLS)
        return re.sub(re.escape(m.group()) + r"(?![\w.$-])", new, text)
    names = sorted(set(SYMBOL.findall(text)) | set(ODD_SYMBOLS))
    return _splice(text, m, rng.choice(names))


def remove_terminator(rng, text, _):
    m = _pick(
        rng, re.compile(r"^\s*(return|etensor\.yield|scf\.yield|gpu\.return|\})\s*$", re.M), text
    )
    return _splice(text, m, "") if m else text


def swap_keyword(rng, text, _):
    old, new = rng.choice(SWAPS)
    hits = [m for m in re.finditer(re.escape(old), text)]
    return _splice(text, rng.choice(hits), new) if hits else text


def move_line(rng, text, _):
    """Reorders the body: waits after the call, uses before definitions."""
    lines = text.splitlines()
    line = lines.pop(rng.randrange(len(lines)))
    lines.insert(rng.randrange(len(lines) + 1), line)
    return "\n".join(lines) + "\n"


def _defined(text: str, pattern: str) -> list[str]:
    return re.findall(r"(%[\w.$-]+)(?:, %[\w.$-]+)* = " + pattern, text)


def insert_op(rng, text, _):
    """A schedule- or graph-level op on the values the case defines."""
    events = _defined(text, r"etensor\.event") or ["%e"]
    queues = _defined(text, r"etensor\.queue") or ["%q"]
    indices = sorted(set(re.findall(r"(%[\w.$-]+): index", text))) or ["%i"]
    indices += _defined(text, r"arith\.constant \d+ : index")
    callees = re.findall(r"func\.func (?:private )?(@[\w.$-]+)", text) or ["@tile"]
    e, q, i, j, f = (
        rng.choice(events),
        rng.choice(queues),
        rng.choice(indices),
        rng.choice(indices),
        rng.choice(callees),
    )
    ty = rng.choice(("!etensor.event<?>", "!etensor.event<4>", "!etensor.event<?x4>"))
    op = rng.choice(
        (
            f"etensor.wait {e}[{i}] : {ty}",
            f"etensor.notify {e}[{i}] : {ty}",
            f"%done = etensor.notify {e}[{i}] : {ty} -> i1",
            f"etensor.push {q}[{rng.choice(('0', '1', '7'))}, {i}] : !etensor.queue",
            f"etensor.push {q}[0, {i}] count {j} : !etensor.queue",
            f"%v, %t, %k = etensor.pop {q} : !etensor.queue",
            f"%q = etensor.queue capacity {i} : !etensor.queue",
            f"%e = etensor.event({i}) count {rng.choice(('1', j))} : !etensor.event<?>",
            f"func.call {f}({i}) : (index) -> ()",
            f"etensor.task {f} grid [{i}] outs({e}[(i) -> (i)] : {ty})",
            f"etensor.task {f} grid [{i}, 2] ins({e}[(i, j) -> (j)] : {ty})",
            f"etensor.dispatch {rng.randrange(4)} grid [{i}] {{\n^bb0(%x: index):\n}}",
            "etensor.worker static {\n}",
            f"etensor.worker dynamic({q} : !etensor.queue) {{\n}}",
            "etensor.yield",
        )
    )
    lines = text.splitlines()
    lines.insert(rng.randrange(1, len(lines) + 1), op)
    return "\n".join(lines) + "\n"


def prepend_arguments(rng, text, _):
    """Shifts a graph's symbols: `%n` stops being symbol 0 (or 63)."""
    m = _pick(rng, re.compile(r"etensor\.graph @[\w.$-]+\("), text)
    if not m:
        return text
    count = rng.choice((1, 2, 3, 64))
    pads = "".join(f"%pad{k}: index, " for k in range(count))
    return _splice(text, m, m.group() + pads).replace(", )", ")")


def wrap_in_cast(rng, text, _):
    """`%x = ... : T` gains a cast `%x.c`, which one later use takes."""
    defs = list(re.finditer(r"^(\s*)(%[\w$-]+) = [^\n]*: (\S+)$", text, re.M))
    if not defs:
        return text
    d = rng.choice(defs)
    indent, name, ty = d.groups()
    uses = [m for m in re.finditer(re.escape(name) + r"(?![\w.$-])", text) if m.start() > d.end()]
    if not uses:
        return text
    u = rng.choice(uses)
    cast = f"\n{indent}{name}.c = builtin.unrealized_conversion_cast {name} : {ty} to {ty}"
    text = text[: u.start()] + name + ".c" + text[u.end() :]
    return text[: d.end()] + cast + text[d.end() :]


MUTATIONS: tuple[Callable[[random.Random, str, list[str]], str], ...] = (
    delete_line,
    duplicate_line,
    foreign_line,
    delete_token,
    duplicate_token,
    swap_ssa,
    rename_ssa_everywhere,
    replace_int,
    replace_int,
    toggle_dim,
    toggle_dim,
    replace_type,
    mutate_map,
    mutate_map,
    rename_symbol,
    remove_terminator,
    swap_keyword,
    move_line,
    insert_op,
    insert_op,
    prepend_arguments,
    wrap_in_cast,
)


def mutants(seed: int, count: int, cases: list[str] | None = None) -> list[str]:
    """`count` mutants, each one to three mutations of a corpus case."""
    cases = cases if cases is not None else corpus()
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        text = rng.choice(cases)
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
            text = rng.choice(MUTATIONS)(rng, text, cases)
        if SPLIT not in text and text.strip():
            out.append(text)
    return out


# -- running ------------------------------------------------------------------

LOCATED_ERROR = re.compile(r"^(?!<unknown>)\S.*:\d+:\d+: error: ", re.M)


def problem(returncode: int, stderr: str) -> str | None:
    """Why one etc-opt run is a bug, or None when it ended properly."""
    if returncode < 0 or returncode >= 128:
        return f"killed by a signal (exit status {returncode})"
    if "PLEASE submit a bug report" in stderr or "Assertion" in stderr:
        return "crashed (assertion or crash report)"
    if returncode not in (0, 1):
        return f"exit status {returncode}"
    # Upstream conversions may add an `<unknown>:0: error:` (a memref memory
    # space the LLVM type converter cannot map), so only ask for one located
    # error, the one that explains the failure.
    if returncode == 1 and not LOCATED_ERROR.search(stderr):
        return "failed without an error: diagnostic at a source location"
    return None


def run_etc_opt(tool: str, texts: list[str], pipeline: str, timeout: int = TIMEOUT_S):
    """One etc-opt invocation over `texts` (split input); (rc, stderr)."""
    text = f"\n{SPLIT}\n".join(texts)
    try:
        done = subprocess.run(
            [tool, "-", "-split-input-file", pipeline, "-o", os.devnull],
            input=text,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s"
    return done.returncode, done.stderr


def find_problems(
    tool: str, texts: list[str], pipelines: Iterable[str], per_run: int, jobs: int
) -> list[tuple[str, str, str]]:
    """(pipeline, mutant, why) for each bad run; a bad batch is re-run one
    mutant at a time to name the culprit."""
    batches = [
        (p, texts[i : i + per_run]) for p in pipelines for i in range(0, len(texts), per_run)
    ]

    def check(batch):
        pipeline, group = batch
        rc, err = run_etc_opt(tool, group, pipeline)
        why = problem(rc, err)
        if why is None:
            return []
        if rc == 124:
            return [(pipeline, "\n// -----\n".join(group), why)]
        found = []
        for text in group if len(group) > 1 else []:
            rc1, err1 = run_etc_opt(tool, [text], pipeline)
            why1 = problem(rc1, err1)
            if why1:
                found.append((pipeline, text, f"{why1}\n{err1[:4000]}"))
        return found or [(pipeline, "\n// -----\n".join(group), f"{why}\n{err[:4000]}")]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return [p for found in pool.map(check, batches) for p in found]


BINDINGS_SCRIPT = r"""
import sys, json
from etc import ir
from etc.passmanager import PassManager
cases = json.load(open(sys.argv[1]))
pipelines = json.load(open(sys.argv[2]))
rejected = 0
for k, text in enumerate(cases):
    pipeline = pipelines[k % len(pipelines)]
    with ir.Context() as ctx:
        ctx.attach_diagnostic_handler(lambda d: True)
        try:
            module = ir.Module.parse(text)
            PassManager.parse(pipeline).run(module.operation)
        except ir.MLIRError:
            rejected += 1
    print(k, flush=True)
print("done", rejected, flush=True)
"""


def format_problems(found: list[tuple[str, str, str]]) -> str:
    return "\n\n".join(
        f"== etc-opt - -split-input-file {p}: {why}\n{text}" for p, text, why in found[:5]
    )


# -- tests --------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample() -> list[str]:
    return mutants(SEED, MUTANTS)


def test_corpus_is_the_lit_inputs():
    cases = corpus()
    assert len(cases) > 40
    assert any("etensor.graph" in c for c in cases)
    assert mutants(SEED, 5) == mutants(SEED, 5), "the sample must be reproducible"


def test_etc_opt_never_aborts(sample):
    tool = find_etc_opt()
    if tool is None:
        pytest.skip("etc-opt not found (set ETC_OPT or build ./build/bin/etc-opt)")
    found = find_problems(tool, sample, PIPELINES, CASES_PER_RUN, jobs=os.cpu_count() or 2)
    assert not found, format_problems(found)


def test_bindings_never_abort(sample, tmp_path):
    """Module.parse + PassManager.run in a subprocess: it must exit normally
    (an MLIRError is fine)."""
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    import json

    pipelines = [f"builtin.module({p.lstrip('-')})" for p in PIPELINES]
    cases, names = tmp_path / "cases.json", tmp_path / "pipelines.json"
    cases.write_text(json.dumps(sample[:BINDINGS_MUTANTS]))
    names.write_text(json.dumps(pipelines))
    done = subprocess.run(
        [sys.executable, "-c", BINDINGS_SCRIPT, str(cases), str(names)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = done.stdout.split()[-1:] or ["-1"]
    crashed_at = int(last[0]) + 1 if last[0].lstrip("-").isdigit() else None
    culprit = sample[crashed_at] if crashed_at is not None and crashed_at < len(sample) else ""
    assert done.returncode == 0 and "done" in done.stdout, (
        f"exit status {done.returncode}\n{done.stderr[-3000:]}\n"
        f"pipeline {pipelines[(crashed_at or 0) % len(pipelines)]} on:\n{culprit}"
    )


# -- campaign -----------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mutants", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="feed valid mutants back")
    parser.add_argument("--per-run", type=int, default=8)
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--pipeline", action="append", help="default: all six")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "etc-fuzz")
    args = parser.parse_args()
    tool = find_etc_opt()
    if tool is None:
        print("etc-opt not found", file=sys.stderr)
        return 2
    pool, found, total = corpus(), [], 0
    for round_ in range(args.rounds):
        texts = mutants(args.seed * 1000 + round_, args.mutants, pool)
        total += len(texts)
        found += find_problems(tool, texts, args.pipeline or PIPELINES, args.per_run, args.jobs)
        # Mutants that still verify seed the next round: their mutants get
        # past the parser and the verifier into the passes more often.
        valid = [t for t in texts if run_etc_opt(tool, [t], "--mlir-print-op-generic")[0] == 0]
        pool += valid
        print(f"round {round_}: {len(found)} problems so far, {len(valid)} valid mutants kept")
    args.out.mkdir(parents=True, exist_ok=True)
    for k, (pipeline, text, why) in enumerate(found):
        path = args.out / f"crash-{args.seed}-{k}.mlir"
        path.write_text(f"// {pipeline}\n// " + why.replace("\n", "\n// ") + "\n" + text)
        print(f"{path}: {pipeline}: {why.splitlines()[0]}")
    print(f"{len(found)} problems in {total} mutants x {len(args.pipeline or PIPELINES)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

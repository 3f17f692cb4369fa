"""The Python tile builder (etc.tilebuilder): IR every helper emits, operator
overloading, errors, the builder split-K tiles in the simulator and through
the compiler, and cta_reduce through the PTX pipeline."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")

from unit_helpers import ptx_from_module  # noqa: E402

import etc  # noqa: E402
from etc import ir  # noqa: E402
from etc.tilebuilder import TileBuilder, Val, f32, i32, memref_type, tile  # noqa: E402
from etc.tiles import rowsum, rowsum_builder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ROWS = memref_type((None, 256), f32)
PAIR = memref_type((None, 4), f32)
OP = re.compile(r"^\s*(?:%[\w, %#]+=\s*)?([a-z_]+\.[a-z_.]+)")


def ops_of(source: str) -> collections.Counter[str]:
    """How many times each op appears in MLIR text."""
    return collections.Counter(m.group(1) for line in source.splitlines() if (m := OP.match(line)))


def reparse(source: str) -> None:
    """The device function's text parses and verifies in a fresh context."""
    with ir.Context():
        ir.Module.parse(source).operation.verify()


def single_graph(fn: etc.DeviceFunction, *shapes: tuple) -> etc.Graph:
    """One task over grid (n,) with f32 tensors of the given shapes (n = symbol)."""
    g = etc.Graph("g")
    n = g.symbol("n")
    tensors = [
        g.tensor(f"T{k}", tuple(n if d is None else d for d in shape), "f32")
        for k, shape in enumerate(shapes)
    ]
    g.task(fn, grid=(n,), args=tuple(tensors))
    return g


def ptx_via_etc_opt(etc_opt, g: etc.Graph, tmp_path: Path) -> str:
    result = etc_opt(g.to_mlir(), "--etc-static-to-ptx")
    assert result.returncode == 0, result.stderr
    return ptx_from_module(result.stdout)


def assemble(ptx: str, tmp_path: Path) -> None:
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not found")
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    done = subprocess.run(
        [ptxas, "-arch=sm_90", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------
# Every helper
# ---------------------------------------------------------------------------


def every_helper(t: TileBuilder, i: Val, X: Val, Y: Val) -> None:
    tid, lane, warp = t.thread_id(), t.lane_id(), t.warp_id()
    assert (t.block_size, t.num_warps) == (256, 8)
    n = t.dim(X, 0)
    assert isinstance(t.dim(X, 1), Val)  # static: a constant
    col = (tid % 64) * 4
    x = t.load_vec(X, [i, col], width=4)  # vector<4xf32>
    y = t.fma(x, x, t.zeros(4)) * 0.5 + t.broadcast(t.f32(1.0), 4)
    t.store_vec(t.max(y, 0.0), Y, [i, col])
    first = t.extract(y, 0)
    biggest = t.vector_reduce(y, "max")
    smallest = t.vector_reduce(y, "min")
    # A loop with two carried values and one without.
    loop = t.range(0, 4, carry=[t.f32(0.0), t.index(0)])
    for k, acc, count in loop:
        loop.yield_(acc + t.load(X, [i, k]), count + 1)
    total, count = loop.results
    for k in t.range(lane, 8, 32):
        t.store(t.cast(k, f32), Y, [i, k])
    scaled = total / t.cast(count, "f32") + t.cast(t.i32(3), f32) - t.cast(t.cast(total, i32), f32)
    m = t.exp(scaled) + t.log(t.abs(first) + 1.0) + t.sqrt(t.abs(biggest)) + t.tanh(smallest)
    m = t.rsqrt(t.abs(m) + 1.0)
    m = t.select(warp < t.num_warps, m, t.min(m, -m))
    w = t.warp_reduce(m, "add") + t.warp_reduce(m, "max") - t.warp_reduce(m, "min")
    w = w + t.cast(t.warp_reduce(t.cast(lane, i32), "add"), f32)
    c = t.cta_reduce(w, "add") + t.cta_reduce(w, "max")
    scratch = t.shared([t.num_warps], f32, name="scratch")
    t.barrier()
    with t.if_((lane == 0) & (i < n)):
        t.store(c, scratch, [warp])
    t.barrier()
    with t.if_(tid == 0):
        t.store(t.load(scratch, [0]), Y, [i, 0])
    # Raw binding ops mix in; val() wraps their results.
    from etc.dialects import arith

    t.val(arith.addi(i, t.index(1)))


def test_every_helper_emits_verifying_ir(capfd):
    fn = tile(grid_rank=1, args=[ROWS, ROWS])(every_helper)
    assert isinstance(fn, etc.DeviceFunction)
    assert fn.name == "every_helper" and fn.block_size == 256
    assert fn.params == ("index", "memref<?x256xf32>", "memref<?x256xf32>")
    assert fn.defines == ("every_helper",)
    # Arguments print under their Python names; no module wrapper.
    assert "func.func @every_helper(%i: index, %X: memref<?x256xf32>, %Y: memref<?x256xf32>)" in (
        fn.source
    )
    assert not fn.source.lstrip().startswith("module")
    reparse(fn.source)
    ops = ops_of(fn.source)
    for op in (
        "gpu.thread_id",
        "gpu.lane_id",
        "gpu.barrier",
        "gpu.shuffle",
        "memref.dim",
        "memref.load",
        "memref.store",
        "memref.get_global",
        "memref.global",
        "vector.load",
        "vector.store",
        "vector.fma",
        "vector.broadcast",
        "vector.extract",
        "vector.reduction",
        "scf.for",
        "scf.if",
        "scf.yield",
        "arith.select",
        "arith.uitofp",
        "arith.fptoui",
        "arith.index_castui",
        "arith.maximumf",
        "arith.minimumf",
        "arith.negf",
        "math.exp",
        "math.log",
        "math.sqrt",
        "math.rsqrt",
        "math.tanh",
        "math.absf",
    ):
        assert ops[op], f"{op} missing from\n{fn.source}"
    assert ops["gpu.barrier"] == 6  # 2 per cta_reduce, 2 around the scratch buffer
    assert {op.split(".")[0] for op in ops} <= {
        "func",
        "arith",
        "scf",
        "memref",
        "vector",
        "gpu",
        "math",
    }
    assert "alignment = 16 : i64" in fn.source
    assert not re.search(r"vector<\d+x\d+x", fn.source)  # vectors stay 1-D
    assert capfd.readouterr() == ("", "")


def test_every_helper_lowers_to_ptx(etc_opt, tmp_path):
    fn = tile(grid_rank=1, args=[ROWS, ROWS])(every_helper)
    ptx = ptx_via_etc_opt(etc_opt, single_graph(fn, (None, 256), (None, 256)), tmp_path)
    # Both buffers are used by the one tile: side by side in the kernel's
    # shared buffer.
    assert ".shared .align 16 .b8 __etc_workgroup[64]" in ptx
    assert "shfl.sync.bfly.b32" in ptx
    assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", ptx)
    assemble(ptx, tmp_path)


def test_constants_and_thread_ids_are_hoisted_once():
    @tile(grid_rank=1, args=[PAIR])
    def hoisted(t, i, A):
        for k in t.range(0, 4):
            with t.if_(t.thread_id() == k):
                t.store(t.f32(2.0) * t.load(A, [i, k]), A, [i, k])
        t.store(t.f32(2.0), A, [i, t.thread_id() % 4])

    ops = ops_of(hoisted.source)
    assert ops["gpu.thread_id"] == 1
    assert hoisted.source.count("arith.constant 2.000000e+00 : f32") == 1
    body = hoisted.source.split("scf.for")[0]
    assert "gpu.thread_id" in body and "2.000000e+00" in body  # before the loop


# ---------------------------------------------------------------------------
# Operator overloading
# ---------------------------------------------------------------------------


def test_operator_overloading_types():
    seen: dict[str, str] = {}

    @tile(grid_rank=2, args=[ROWS])
    def ops(t, i, j, A):
        x = t.load(A, [i, j])
        v = t.load_vec(A, [i, j * 4])
        cases = {
            "i+1": i + 1,
            "2*i": 2 * i,
            "3-i": 3 - i,
            "i//j": i // j,
            "i%4": i % 4,
            "i<j": i < j,
            "i>=1": i >= 1,
            "i==j": i == j,
            "i!=j": i != j,
            "x+1": x + 1,
            "1.5*x": 1.5 * x,
            "x/2": x / 2,
            "2/x": 2 / x,
            "-x": -x,
            "x<0.5": x < 0.5,
            "x==x": x == x,
            "x!=x": x != x,
            "v+x": v + x,
            "v*2": v * 2.0,
            "v<x": v < x,
            "and": (i < j) & (x > 0.0),
            "or": (i < j) | (i > j),
            "not": ~(i < j),
            "i32^": t.i32(5) ^ 3,
        }
        for key, value in cases.items():
            assert isinstance(value, Val), key
            seen[key] = str(value.type)

    index, f, b = "index", "f32", "i1"
    assert seen == {
        "i+1": index,
        "2*i": index,
        "3-i": index,
        "i//j": index,
        "i%4": index,
        "i<j": b,
        "i>=1": b,
        "i==j": b,
        "i!=j": b,
        "x+1": f,
        "1.5*x": f,
        "x/2": f,
        "2/x": f,
        "-x": f,
        "x<0.5": b,
        "x==x": b,
        "x!=x": b,
        "v+x": "vector<4xf32>",
        "v*2": "vector<4xf32>",
        "v<x": "vector<4xi1>",
        "and": b,
        "or": b,
        "not": b,
        "i32^": "i32",
    }
    src = ops.source
    # Integers are unsigned; float comparisons ordered (unordered for !=).
    for text in (
        "arith.addi %i, %c1 : index",
        "arith.subi %c3, %i : index",  # a reflected operator keeps the operand order
        "arith.divui %i, %j : index",
        "arith.remui %i, %c4 : index",
        "arith.cmpi ult, %i, %j : index",
        "arith.cmpi uge, %i, %c1 : index",
        "arith.cmpf olt",
        "arith.cmpf oeq",
        "arith.cmpf une",
        "arith.divf %cst",  # 2 / x
        "arith.negf",
        "vector.broadcast",
        "arith.andi",
        "arith.ori",
        "arith.xori",
    ):
        assert text in src, f"{text!r} not in\n{src}"
    reparse(src)


def test_vals_hash_like_their_values_and_have_no_truth_value():
    @tile(grid_rank=1, args=[PAIR])
    def hashing(t, i, A):
        assert len({i, i}) == 1
        assert repr(i).startswith("Val(%i")
        with pytest.raises(etc.GraphError, match=r"tile 'hashing': .*no Python truth value"):
            if i < 2:
                pass

    assert hashing.name == "hashing"


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def _bad_body(kind: str):
    def body(t, i, A):
        if kind == "rank":
            t.load(A, [i])
        elif kind == "store_type":
            t.store(t.index(1), A, [i, 0])
        elif kind == "mix":
            _ = i + t.f32(1.0)
        elif kind == "index_type":
            t.load(A, [i, t.f32(0.0)])
        elif kind == "not_memref":
            t.load(i, [i])
        elif kind == "no_yield":
            loop = t.range(0, 4, carry=[t.f32(0.0)])
            for _k, _acc in loop:
                pass
        elif kind == "yield_count":
            loop = t.range(0, 4, carry=[t.f32(0.0)])
            for _k, acc in loop:
                loop.yield_(acc, acc)
        elif kind == "yield_type":
            loop = t.range(0, 4, carry=[t.f32(0.0)])
            for k, _acc in loop:
                loop.yield_(k)
        elif kind == "after_yield":
            loop = t.range(0, 4, carry=[t.f32(0.0)])
            for k, acc in loop:
                loop.yield_(acc + 1.0)
                t.load(A, [i, k])
        elif kind == "break":
            for _k in t.range(0, 4):
                break
        elif kind == "break_in_if":
            with t.if_(i == 0):
                for _k in t.range(0, 4):
                    break
        elif kind == "iterate_twice":
            loop = t.range(0, 4)
            for _k in loop:
                pass
            for _k in loop:
                pass
        elif kind == "if_type":
            with t.if_(i):
                pass
        elif kind == "shuffle_type":
            t.warp_reduce(i)
        elif kind == "kind":
            t.cta_reduce(t.f32(1.0), "mul")
        elif kind == "vec_width":
            t.load_vec(A, [i, 0], width=3)
        elif kind == "float_floordiv":
            _ = t.f32(1.0) // 2
        elif kind == "float_mod":
            _ = t.f32(1.0) % 2
        elif kind == "int_truediv":
            _ = i / 2
        elif kind == "untyped":
            t.select(i < 2, 1.0, 2.0)
        elif kind == "div_zero":
            _ = i // 0
        elif kind == "mod_zero":
            _ = i % 0
        elif kind == "shared_size":
            t.shared([64, 1024])
        elif kind == "returns":
            return 3
        return None

    return body


@pytest.mark.parametrize(
    "kind, message",
    [
        ("rank", r"load from A: 1 index\(es\) for a rank-2 memref"),
        ("store_type", r"store into A: the value is index but the memref holds f32"),
        ("mix", r"'\+': the operands have different types, index \(i\) and f32"),
        ("index_type", r"load from A: index #1 must be an index value, got f32"),
        ("not_memref", r"load from: i is not a memref"),
        ("no_yield", r"a t.range loop with 1 carried value\(s\) must end with loop.yield_"),
        ("yield_count", r"loop.yield_ got 2 value\(s\) for 1 carried value\(s\)"),
        ("yield_type", r"loop.yield_ value #0 has type index but the carried value has type f32"),
        ("after_yield", r"loop.yield_\(\.\.\.\) must be the last statement"),
        ("break", r"a t.range loop was left early"),
        ("break_in_if", r"a t.range loop was left early"),
        ("iterate_twice", r"a t.range loop can be iterated only once"),
        ("if_type", r"t.if_ condition must be i1, got index"),
        ("shuffle_type", r"warp_reduce reduces f32 or i32 values, got index"),
        ("kind", r"cta_reduce: kind must be one of add, max, min, got 'mul'"),
        (
            "vec_width",
            r"load_vec from A: the last dimension 8 is not a multiple of the vector width 3",
        ),
        ("float_floordiv", r"'//' is not supported on f32 values \(use / for float division\)"),
        ("float_mod", r"'%' is not supported on f32 values"),
        ("int_truediv", r"'/' is not supported on index values \(use // "),
        ("untyped", r"select: cannot tell the MLIR type of the Python number 1.0"),
        ("div_zero", r"'//' by the constant 0"),
        ("mod_zero", r"'%' by the constant 0"),
        (
            "shared_size",
            r"shared: shape \[64, 1024\] of f32 takes 262144 bytes; a CTA has at most 232448",
        ),
        ("returns", r"the body must not return a value"),
    ],
)
def test_errors_name_the_tile_and_the_argument(kind, message, capfd):
    body = _bad_body(kind)
    with pytest.raises(etc.GraphError, match=f"^tile '{kind}': {message}"):
        tile(grid_rank=1, args=[memref_type((None, 8), f32)], name=kind)(body)
    assert capfd.readouterr() == ("", "")


def test_signature_errors():
    def two(t, i, A):
        pass

    with pytest.raises(etc.GraphError, match=r"tile 'two': the body takes 3 positional .* with 4"):
        tile(grid_rank=2, args=[ROWS])(two)
    with pytest.raises(etc.GraphError, match=r"tile 'two': the body takes 3 .* with 2"):
        tile(grid_rank=0, args=[ROWS])(two)
    with pytest.raises(
        etc.GraphError, match=r"tile 'two': argument 'A' \(args\[0\]\) must be a memref, got f32"
    ):
        tile(grid_rank=1, args=["f32"])(two)
    with pytest.raises(
        etc.GraphError, match=r"tile 'two': argument 'A' \(args\[0\]\) must be a memref_type"
    ):
        tile(grid_rank=1, args=[42])(two)
    with pytest.raises(
        etc.GraphError, match=r"tile 'two': argument 'A' \(args\[0\]\): cannot parse"
    ):
        tile(grid_rank=1, args=["memref<?x"])(two)
    with pytest.raises(etc.GraphError, match=r"tile 'two': block_size must be a multiple of 32"):
        tile(grid_rank=1, args=[ROWS], block_size=100)(two)
    with pytest.raises(
        etc.GraphError, match=r"tile 'bad name': the name must be a valid MLIR symbol"
    ):
        tile(grid_rank=1, args=[ROWS], name="bad name")(two)
    with pytest.raises(etc.GraphError, match=r"memref_type: dimension -1"):
        memref_type((-1, 4))
    with pytest.raises(etc.GraphError, match=r"unknown element type 'f7'"):
        memref_type((4,), "f7")
    # Args may also be MLIR type text; *args bodies take anything.
    fn = tile(grid_rank=1, args=["memref<?x256xf32>"], name="text")(lambda t, *a: None)
    assert fn.params == ("index", "memref<?x256xf32>")


def test_verifier_failure_reports_the_diagnostic_and_python_line(capfd):
    def escapes(t, i, A):
        for k in t.range(0, 4):
            v = t.load(A, [i, k])
        t.store(v, A, [i, 0])  # v is defined inside the loop

    with pytest.raises(etc.GraphError) as info:
        tile(grid_rank=1, args=[PAIR])(escapes)
    text = str(info.value)
    assert text.startswith("tile 'escapes': the generated MLIR does not verify")
    assert "does not dominate this use" in text
    assert f'"{__file__}"' in text  # the location is the Python line
    assert capfd.readouterr() == ("", "")


def test_user_exceptions_propagate_and_leave_the_bindings_usable():
    def fails(t, i, A):
        for _k in t.range(0, 4):
            with t.if_(i == 0):
                raise KeyError("inside")

    def fails_in_loop(t, i, A):
        with t.if_(i == 0):
            for _k in t.range(0, 4):
                raise KeyError("inside")

    for body in (fails, fails_in_loop):
        with pytest.raises(KeyError):
            tile(grid_rank=1, args=[PAIR])(body)

    @tile(grid_rank=1, args=[PAIR])
    def after(t, i, A):
        t.store(t.load(A, [i, 0]) * 2.0, A, [i, 1])

    reparse(after.source)


def test_import_etc_does_not_load_the_bindings():
    code = (
        "import sys, etc; assert 'etc.tilebuilder' not in sys.modules; "
        "assert 'etc._mlir_libs._mlir' not in sys.modules; "
        "assert etc.tile is __import__('etc.tilebuilder').tilebuilder.tile; print(etc.f32)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "f32"


# ---------------------------------------------------------------------------
# Split-K tiles written with the builder
# ---------------------------------------------------------------------------

CONFIGS = [(8, 4, 256), (3, 2, 200), (1, 3, 12)]


def splitk(lib, R: int, S: int, K: int) -> etc.Graph:
    g = etc.Graph("splitk")
    n = g.symbol("n")
    m = (n + R - 1) // R
    A, B, C = g.tensor("A", (n, K), "f32"), g.tensor("B", (n, S), "f32"), g.tensor("C", (n,), "f32")
    E = g.event((m,), wait_count=S, name="E")
    g.task(lib.partial_sum(R, S, K), grid=(m, S), args=(A, B), out_edges={E: "ij->i"})
    g.task(lib.final_sum(R, S), grid=(m,), args=(B, C), in_edges={E: "i->i"})
    return g


@pytest.mark.parametrize("R, S, K", CONFIGS)
def test_builder_splitk_matches_numpy_and_the_mlir_tiles(R, S, K):
    rng = np.random.default_rng(R + S)
    for n in (1, 2 * R + 1):
        A = rng.standard_normal((n, K)).astype(np.float32)
        built = etc.simulate(splitk(rowsum_builder, R, S, K), {"A": A}, {"n": n})
        text = etc.simulate(splitk(rowsum, R, S, K), {"A": A}, {"n": n})
        np.testing.assert_allclose(
            built["C"], A.astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-4
        )
        np.testing.assert_array_equal(built["C"], text["C"])


@pytest.mark.parametrize("R, S, K", CONFIGS)
def test_builder_splitk_tiles_match_the_mlir_text_tiles(R, S, K):
    for built, text in (
        (rowsum_builder.partial_sum(R, S, K), rowsum.partial_sum(R, S, K)),
        (rowsum_builder.final_sum(R, S), rowsum.final_sum(R, S)),
    ):
        assert (built.name, built.params, built.block_size) == (
            text.name,
            text.params,
            text.block_size,
        )
        reparse(built.source)
        a, b = ops_of(built.source), ops_of(text.source)
        for op in (
            "gpu.shuffle",
            "vector.load",
            "vector.reduction",
            "scf.for",
            "scf.if",
            "memref.store",
            "memref.load",
        ):
            assert a[op] == b[op], (op, built.source)
    assert rowsum_builder.partial_sum(8, 4, 256, name="ps2").name == "ps2"
    with pytest.raises(etc.GraphError, match="K=250 is not divisible by k_split=4"):
        rowsum_builder.partial_sum(8, 4, 250)


def test_builder_splitk_compiles_and_ptxas_accepts_the_cubin():
    artifact = etc.compile(splitk(rowsum_builder, 8, 4, 256))
    assert "shfl.sync.bfly.b32" in artifact.ptx
    assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", artifact.ptx)
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas not found")
    assert artifact.cubin is not None and artifact.cubin[:4] == b"\x7fELF"


def test_example_runs_the_builder_tiles():
    sys.path.insert(0, str(REPO))
    from examples import splitk_rowsum

    assert splitk_rowsum.main(["--simulate", "--tiles", "builder", "--sizes", "1,9"]) == 0


# ---------------------------------------------------------------------------
# cta_reduce
# ---------------------------------------------------------------------------


def two_reductions(block_size: int) -> etc.DeviceFunction:
    @tile(grid_rank=1, args=[ROWS, memref_type((None, 2), f32)], block_size=block_size)
    def norms(t, i, X, Y):
        x = t.load(X, [i, t.thread_id() % 256])
        total = t.cta_reduce(x * x, "add")
        peak = t.cta_reduce(t.abs(x), "max")
        with t.if_(t.thread_id() == 0):
            t.store(total, Y, [i, 0])
            t.store(peak, Y, [i, 1])

    return norms


@pytest.mark.parametrize("block_size", [256, 96, 32])
def test_cta_reduce_twice_in_one_tile_compiles(block_size, etc_opt, tmp_path):
    fn = two_reductions(block_size)
    ops = ops_of(fn.source)
    warps = block_size // 32
    if warps == 1:  # one warp: shuffles only
        assert ops["gpu.barrier"] == 0 and "memref.global" not in fn.source
    else:
        # One shared buffer of one slot per warp, reused: a barrier before
        # each write guards the previous reduction's readers.
        assert fn.source.count("memref.global") == 1
        assert f"memref<{warps}xf32, #gpu.address_space<workgroup>>" in fn.source
        assert ops["gpu.barrier"] == 4
    ptx = ptx_via_etc_opt(etc_opt, single_graph(fn, (None, 256), (None, 2)), tmp_path)
    if warps > 1:
        assert f".shared .align 16 .b8 __etc_workgroup[{4 * warps}]" in ptx
    assemble(ptx, tmp_path)

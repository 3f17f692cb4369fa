"""MLIR text fragments shared by the hand-written tiles."""

from __future__ import annotations

import numpy as np

from ..errors import GraphError

#: `gpu.shuffle xor` offsets of a 32-lane butterfly reduction.
SHUFFLE_OFFSETS = (16, 8, 4, 2, 1)

#: try_wait polls before an mbarrier wait gives up (each suspends up to a
#: hardware-defined time): a wait that can never complete traps (a launch
#: error) instead of hanging the GPU.
MBAR_POLLS = 1 << 22

#: Inline PTX waiting until the mbarrier at shared address ``$0`` completes
#: the phase of parity ``$1``, or trapping after ``MBAR_POLLS`` polls. Labels
#: inside braces are local to each copy.
MBAR_WAIT = (
    "{ .reg .pred p; .reg .b32 n; mov.b32 n, 0; "
    "LAB_WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1; @p bra DONE; "
    f"add.u32 n, n, 1; setp.lt.u32 p, n, {MBAR_POLLS}; @p bra LAB_WAIT; trap; DONE: }}"
)

#: :data:`MBAR_WAIT` with acquire at cluster scope: for bytes other CTAs of
#: the cluster completed on the mbarrier (``st.async``).
MBAR_WAIT_CLUSTER = MBAR_WAIT.replace(
    "mbarrier.try_wait.parity.shared", "mbarrier.try_wait.parity.acquire.cluster.shared"
)

#: Inline PTX polling the u32 at global address ``$0`` (acquire, GPU scope)
#: until it is at most ``$1`` (a split-K part waiting for its block's count
#: to be reset: ``etc.tiles.gemm_tc.share_fragments``), or trapping after
#: ``MBAR_POLLS`` polls.
SPIN_UNTIL_AT_MOST = (
    "{ .reg .pred p; .reg .b32 n, c; mov.b32 n, 0; "
    "LAB_SPIN: ld.acquire.gpu.global.u32 c, [$0]; setp.le.u32 p, c, $1; @p bra DONE; "
    f"add.u32 n, n, 1; setp.lt.u32 p, n, {MBAR_POLLS}; @p bra LAB_SPIN; trap; DONE: }}"
)


def asm_line(text: str, operands: list[tuple[str, str]], memory: bool = False) -> str:
    """A side-effecting ``llvm.inline_asm`` of PTX ``text`` on ``operands``
    (value, ``i32``/``i64``/``f32``), no result; ``memory``: with a memory
    clobber, so the compiler moves no load or store across it."""
    kinds = {"i32": "r", "i64": "l", "f32": "f"}
    cons = ",".join([kinds[ty] for _, ty in operands] + ["~{memory}"] * memory)
    vals = ", ".join(v for v, _ in operands)
    types = ", ".join(ty for _, ty in operands)
    return (
        f'llvm.inline_asm has_side_effects asm_dialect = att "{text}", "{cons}" {vals} '
        f": ({types}) -> ()"
    )


def read_timer(timer: str) -> str:
    """A side-effecting ``llvm.inline_asm`` that reads ``%<timer>``
    (``clock64`` or ``globaltimer``) into an ``i64``: the clock stamps'."""
    return (
        f'llvm.inline_asm has_side_effects asm_dialect = att "mov.u64 $0, %{timer};", "=l" '
        ": () -> i64"
    )


def l2_policy(priority: str) -> str:
    """The op (its text after ``%x = ``) making an L2 cache policy of
    ``priority`` (``"evict_first"``, ``"evict_last"``) for every access: the
    i64 that ``.L2::cache_hint`` copies and prefetches take."""
    return (
        'llvm.inline_asm asm_dialect = att "createpolicy.fractional.'
        f'L2::{priority}.b64 $0, 1.0;", "=l" : () -> i64'
    )


def cache_hint(policy: str | None, operand: int) -> tuple[str, str, list[tuple[str, str]]]:
    """What a copy's inline asm gains from an L2 ``policy`` (an i64 made by
    :func:`l2_policy`, or None): its ``.L2::cache_hint`` qualifier, the
    ``, $<operand>`` after its last operand, and that operand; all empty
    without a policy."""
    if policy is None:
        return "", "", []
    return ".L2::cache_hint", f", ${operand}", [(policy, "i64")]


def shuffle_constants(indent: str = "  ") -> str:
    """`%c<o>_i32` for every shuffle offset (the tile defines `%c32_i32`, the width)."""
    return "\n".join(f"{indent}%c{o}_i32 = arith.constant {o} : i32" for o in SHUFFLE_OFFSETS)


def warp_sum(value: str, indent: str) -> tuple[str, str]:
    """A butterfly sum of f32 `value` over the warp; every lane gets it.
    Returns (the ops, the name of the result)."""
    lines = []
    for k, offset in enumerate(SHUFFLE_OFFSETS):
        lines.append(
            f"{indent}%sh{k}, %ok{k} = gpu.shuffle xor {value}, %c{offset}_i32, %c32_i32 : f32\n"
            f"{indent}%red{k} = arith.addf {value}, %sh{k} : f32"
        )
        value = f"%red{k}"
    return "\n".join(lines), value


def row_sum(buffer: str, buffer_type: str, row: str, length: int, result: str, indent: str) -> str:
    """`result = sum(buffer[row, 0:length])` (f32), with 16-byte vector loads
    when `length` is a multiple of 4. Needs %c0, %c1, %c4, %cS (= length),
    %zero (vector<4xf32> zeros) and %fzero (f32 zero) in scope."""
    if length % 4 == 0:
        return f"""\
{indent}%acc = scf.for %k = %c0 to %cS step %c4 iter_args(%part = %zero) -> (vector<4xf32>) {{
{indent}  %v = vector.load {buffer}[{row}, %k] {{alignment = 16 : i64}} : {buffer_type}, vector<4xf32>
{indent}  %next = arith.addf %part, %v : vector<4xf32>
{indent}  scf.yield %next : vector<4xf32>
{indent}}}
{indent}{result} = vector.reduction <add>, %acc : vector<4xf32> into f32"""
    return f"""\
{indent}{result} = scf.for %k = %c0 to %cS step %c1 iter_args(%part = %fzero) -> (f32) {{
{indent}  %v = memref.load {buffer}[{row}, %k] : {buffer_type}
{indent}  %next = arith.addf %part, %v : f32
{indent}  scf.yield %next : f32
{indent}}}"""


def positive(name: str, **values: int) -> None:
    """Raises GraphError naming tile ``name`` and the first argument that is
    not a positive int."""
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GraphError(f"tile '{name}': {key} must be a positive int, got {value!r}")


def non_negative(name: str, **values: int) -> None:
    """Raises GraphError naming tile ``name`` and the first argument that is
    not an int >= 0."""
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise GraphError(f"tile '{name}': {key} must be an int >= 0, got {value!r}")


def check_eps(name: str, eps: float) -> None:
    """Raises GraphError naming tile ``name`` unless ``eps`` is a number in [0, 1)."""
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 <= eps < 1:
        raise GraphError(f"tile '{name}': eps must be a float in [0, 1), got {eps!r}")


def check_block(name: str, block_size: int) -> int:
    """The warps of a ``block_size``-thread CTA (a multiple of 32, at most 1024)."""
    positive(name, block_size=block_size)
    if block_size % 32 or block_size > 1024:
        raise GraphError(
            f"tile '{name}': block_size={block_size} must be a multiple of 32 in [32, 1024]"
        )
    return block_size // 32


def warp_argmax(val: str, idx: str, indent: str, tag: str = "") -> tuple[str, str, str]:
    """Butterfly arg-max of (f32 `val`, i32 `idx`) over the warp; ties go to the
    lower index. Every lane gets the result. Returns (ops, value, index);
    `tag` makes the SSA names unique when a function holds several."""
    lines = []
    for k, off in enumerate(SHUFFLE_OFFSETS):
        n = f"{tag}{k}"
        lines.append(
            f"{indent}%av{n}, %avok{n} = gpu.shuffle xor {val}, %c{off}_i32, %c32_i32 : f32\n"
            f"{indent}%ai{n}, %aiok{n} = gpu.shuffle xor {idx}, %c{off}_i32, %c32_i32 : i32\n"
            f"{indent}%agt{n} = arith.cmpf ogt, %av{n}, {val} : f32\n"
            f"{indent}%aeq{n} = arith.cmpf oeq, %av{n}, {val} : f32\n"
            f"{indent}%alt{n} = arith.cmpi slt, %ai{n}, {idx} : i32\n"
            f"{indent}%atie{n} = arith.andi %aeq{n}, %alt{n} : i1\n"
            f"{indent}%atake{n} = arith.ori %agt{n}, %atie{n} : i1\n"
            f"{indent}%abv{n} = arith.select %atake{n}, %av{n}, {val} : f32\n"
            f"{indent}%abi{n} = arith.select %atake{n}, %ai{n}, {idx} : i32"
        )
        val, idx = f"%abv{n}", f"%abi{n}"
    return "\n".join(lines), val, idx


#: Sums of squares for the folded RMSNorms are kept as fixed-point i64
#: (value * 2**SUM_BITS): integer atomic adds are associative, so a step's
#: result does not depend on the order the tiles add their parts in (float
#: atomics made the same launch's logits differ from run to run). 28 bits:
#: a part of 8 squares near 1e-3 keeps ~1e-6 of relative precision, and a
#: row's sum may reach 2**35 (3.4e10) before the i64 overflows.
SUM_BITS = 28
#: The sums' buffer type (slots x rows).
SUMS_TYPE = "memref<?x?xi64>"
#: The folded argmax's buffer type: one i64 key a row of logits
#: (:func:`etc.tiles.gemv_layer.argmax_keys`). A row's keys in 32 slots
#: instead (LM head block ``j`` into slot ``j % 32``, one warp reducing
#: them) ran 4-5 µs slower at B = 1 on an H100 (``bench/RESULTS.md`` item 272).
KEYS_TYPE = "memref<?xi64>"


def to_fixed(value: str, prefix: str, indent: str = "  ") -> tuple[str, str]:
    """Ops turning f32 ``value`` into its fixed-point i64 (truncated toward
    zero, as :func:`fixed_reference` does). Returns (ops, result name)."""
    return (
        f"{indent}%{prefix}_sc = arith.constant {float(2**SUM_BITS):.1f} : f32\n"
        f"{indent}%{prefix}_x = arith.mulf {value}, %{prefix}_sc : f32\n"
        f"{indent}%{prefix}_i = arith.fptosi %{prefix}_x : f32 to i64",
        f"%{prefix}_i",
    )


def from_fixed(value: str, prefix: str, indent: str = "  ") -> tuple[str, str]:
    """Ops turning fixed-point i64 ``value`` into f32. Returns (ops, name)."""
    return (
        f"{indent}%{prefix}_f = arith.sitofp {value} : i64 to f32\n"
        f"{indent}%{prefix}_sc = arith.constant {2.0**-SUM_BITS!r} : f32\n"
        f"{indent}%{prefix}_v = arith.mulf %{prefix}_f, %{prefix}_sc : f32",
        f"%{prefix}_v",
    )


def fixed_reference(values: np.ndarray) -> np.ndarray:
    """numpy's :func:`to_fixed`: f32 values to fixed-point i64."""
    scaled = np.asarray(values, dtype=np.float32) * np.float32(2**SUM_BITS)
    return np.trunc(scaled).astype(np.int64)


def unfixed_reference(values: np.ndarray) -> np.ndarray:
    """numpy's :func:`from_fixed`: fixed-point i64 to f32."""
    return np.asarray(values).astype(np.float32) * np.float32(2.0**-SUM_BITS)


#: Sequence positions (``lengths=True`` attention tiles): ``lens[b]`` is
#: sequence ``b``'s position, the graph's ``L`` the longest.
LENGTHS_TYPE = "memref<?xi32>"


def with_lengths(source: str, name: str, reference, at: int):
    """An attention tile for sequences at their own positions: ``(source,
    reference)`` rewritten. ``@<name>`` and ``@<name>__prefetch`` take the
    graph's ``L`` as ``%Lmax`` and the positions as a last buffer ``%lens``
    (argument ``at``, before any tensor map), and define ``%L``, sequence
    ``%b``'s position, as ``min(lens[b], Lmax)`` (a position past the
    graph's ``L`` would outgrow the splits it sized); ``reference``
    (coordinates ``l, b, g, s``, then ``L``, then buffers) reads it
    likewise."""
    headers = (f"func.func @{name}(", f"func.func @{name}__prefetch(")
    lines = source.splitlines(keepends=True)
    changed = 0
    for i, line in enumerate(lines):
        if not line.startswith(headers):
            continue
        head, brace = line.rstrip().rsplit(") {", 1)
        assert head.count("%L: index, ") == 1 and not brace, line
        head = head.replace("%L: index, ", "%Lmax: index, ", 1)
        maps = head.find(", %kc_map: ")
        maps = len(head) if maps < 0 else maps
        lines[i] = (
            f"{head[:maps]}, %lens: {LENGTHS_TYPE}{head[maps:]}) {{\n"
            f"  %lens_b = memref.load %lens[%b] : {LENGTHS_TYPE}\n"
            "  %lens_i = arith.index_cast %lens_b : i32 to index\n"
            "  %L = arith.minui %lens_i, %Lmax : index\n"
        )
        changed += 1
    assert changed, f"no function @{name} in the source"

    def ragged(*args):
        b, L, lens = args[1], args[4], args[at]
        position = min(int(lens[b]), int(L))
        return reference(*args[:4], position, *args[5:at], *args[at + 1 :])

    return "".join(lines), ragged

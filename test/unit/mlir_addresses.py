"""The global addresses a generated tile copies and loads, evaluated on the CPU.

The GEMM tiles' MLIR computes every weight address with plain index
arithmetic from the thread id, the tile's coordinates and the loop's
induction variable. This module follows each ``cp.async`` source and each
``vector.load`` of a weight back through its SSA definitions and evaluates
them for one thread, so a test can compare two generated tiles address by
address (e.g. a tile with chunked weights against the same tile without)
without a GPU. Only what those chains use is understood: integer constants,
``arith`` add/sub/mul/div/rem/min/and/xor, unsigned compares and selects, casts,
``gpu.thread_id``, base pointers (given per memref), ``memref.load`` and
``memref.dim`` (given as callbacks);
anything else raises ``KeyError`` naming the op. Of an ``scf.if`` with an
``else``, only the branch its condition takes counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_DEF = re.compile(r"^\s*(%[\w]+)(?::\d+)? = ([\w.]+)\s*(.*)$")
_COMPARE = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "ult": lambda a, b: a < b,
    "ule": lambda a, b: a <= b,
    "ugt": lambda a, b: a > b,
    "uge": lambda a, b: a >= b,
}
_FOR = re.compile(r"scf\.for (%\w+) = (%\w+) to (%\w+) step (%\w+)")
_BINARY = {
    "arith.addi": lambda a, b: a + b,
    "arith.subi": lambda a, b: a - b,
    "arith.muli": lambda a, b: a * b,
    "arith.divui": lambda a, b: a // b,
    "arith.remui": lambda a, b: a % b,
    "arith.minui": min,
    "arith.andi": lambda a, b: a & b,
    "arith.xori": lambda a, b: a ^ b,
}
_IF = re.compile(r"scf\.if (%\w+) \{")


def functions(source: str) -> dict[str, str]:
    """``{name: body}`` of each ``func.func`` in ``source``."""
    parts = re.split(r"^\s*func\.func @", source, flags=re.M)[1:]
    return {p.split("(", 1)[0]: p for p in parts}


class Evaluator:
    """Evaluates SSA values of one function body for one set of inputs:
    ``env`` (block arguments and the loop variable by name, ``"tid"``),
    ``bases`` (memref -> base address), ``load(memref, indices)`` and
    ``dim(memref, axis)``."""

    def __init__(
        self,
        body: str,
        env: Mapping[str, int],
        bases: Mapping[str, int],
        load: Callable[[str, list[int]], int] = lambda m, i: 0,
        dim: Callable[[str, int], int] = lambda m, a: 1 << 20,
    ) -> None:
        self.defs: dict[str, tuple[str, str]] = {}
        for line in body.splitlines():
            m = _DEF.match(line)
            if m:
                self.defs[m.group(1)] = (m.group(2), m.group(3))
        self.env, self.bases, self.load, self.dim = dict(env), bases, load, dim
        self.memo: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        if name in self.env:
            return self.env[name]
        if name not in self.memo:
            self.memo[name] = self._eval(name)
        return self.memo[name]

    def _eval(self, name: str) -> int:
        if name not in self.defs:
            raise KeyError(f"{name}: not defined here and not given")
        op, rest = self.defs[name]
        operands = re.findall(r"%\w+", rest.split(":")[0])
        if op == "arith.constant":
            return int(rest.split(":")[0].strip())
        if op in _BINARY:
            return _BINARY[op](self(operands[0]), self(operands[1]))
        if op in ("arith.index_cast", "llvm.inttoptr"):
            return self(operands[0])
        if op == "arith.cmpi":
            predicate = rest.split(",")[0].strip()
            return int(_COMPARE[predicate](self(operands[0]), self(operands[1])))
        if op == "arith.select":
            return self(operands[1]) if self(operands[0]) else self(operands[2])
        if op == "gpu.thread_id":
            return self.env["tid"]
        if op == "memref.extract_aligned_pointer_as_index":
            return self.bases.get(operands[0], 0)
        if op == "memref.load":
            return self.load(operands[0], [self(x) for x in operands[1:]])
        if op == "memref.dim":
            return self.dim(operands[0], self(operands[1]))
        raise KeyError(f"{name} = {op}: not an op this evaluator knows")

    def invalidate_loop(self) -> None:
        """Forget the values computed so far (the loop variable changed)."""
        self.memo.clear()


def copy_sources(body: str, ev: Evaluator) -> list[int]:
    """The source address of every ``cp.async`` of the body for the
    evaluator's thread, in program order, each one in the loop once per
    iteration (the loop's bounds read from its ``scf.for``)."""
    return [source for _, source in copy_pairs(body, ev)]


def copy_pairs(body: str, ev: Evaluator) -> list[tuple[int, int]]:
    """``(shared destination, global source)`` of every ``cp.async`` of
    the body for the evaluator's thread, as :func:`copy_sources`."""
    items = [
        (m.start(), (m.group(1), m.group(2)))
        for m in re.finditer(r"nvvm\.cp\.async\.shared\.global (%\w+), (%\w+)", body)
    ]
    return _per_iteration(body, ev, items, lambda item: (ev(item[0]), ev(item[1])))


def weight_loads(body: str, ev: Evaluator, memref: str, dims: tuple[int, ...]) -> list[int]:
    """The element offset (row-major over ``dims``) of every ``vector.load``
    from ``memref``, in program order, per loop iteration as above."""
    strides = [1] * len(dims)
    for a in range(len(dims) - 2, -1, -1):
        strides[a] = strides[a + 1] * dims[a + 1]
    pattern = rf"%\w+ = vector\.load {re.escape(memref)}\[([^\]]*)\]"
    items = [
        (m.start(), [x.strip() for x in m.group(1).split(",")]) for m in re.finditer(pattern, body)
    ]

    def offset(index: list[str]) -> int:
        return sum(ev(x) * s for x, s in zip(index, strides, strict=True))

    return _per_iteration(body, ev, items, offset)


_ASM = re.compile(
    r'llvm\.inline_asm has_side_effects asm_dialect = att "([^"]*)", "[^"]*" ([^:]*) :'
)


def tma_copies(body: str, ev: Evaluator, tensor: bool = True) -> list[tuple[str, list[int]]]:
    """Every TMA box copy or L2 prefetch (``cp.async.bulk[.prefetch].tensor``;
    with ``tensor=False`` the plain bulk copies instead) of the body for the
    evaluator's thread, in program order, each one in a loop once per
    iteration: ``(instruction, [operand values])``."""
    items = []
    for m in _ASM.finditer(body):
        text, operands = m.group(1), m.group(2)
        if text.startswith("cp.async.bulk") and (".tensor." in text) == tensor:
            names = [x.strip() for x in operands.split(",")]
            items.append((m.start(), (text.split(" ")[0], names)))
    return _per_iteration(body, ev, items, lambda item: (item[0], [ev(x) for x in item[1]]))


def _closing(body: str, start: int) -> int:
    """The position of the brace closing the one at ``start``."""
    depth = 0
    for pos in range(start, len(body)):
        depth += {"{": 1, "}": -1}.get(body[pos], 0)
        if depth == 0:
            return pos
    return len(body)


def _branches(body: str) -> list[tuple[int, int, int, str]]:
    """``(then start, else start, else end, condition)`` of every ``scf.if``
    with an ``else`` region."""
    out = []
    for m in _IF.finditer(body):
        then_end = _closing(body, m.end() - 1)
        rest = body[then_end:]
        if re.match(r"\}\s*else\s*\{", rest):
            else_start = then_end + rest.index("{")
            out.append((m.end(), else_start, _closing(body, else_start), m.group(1)))
    return out


def _taken(ev: Evaluator, pos: int, branches) -> bool:
    """Whether the code at ``pos`` runs: in no untaken branch."""
    for then_start, else_start, else_end, cond in branches:
        if then_start <= pos < else_start and not ev(cond):
            return False
        if else_start <= pos <= else_end and ev(cond):
            return False
    return True


def _loops(body: str) -> list[tuple[int, int, re.Match]]:
    """``(start, end, match)`` of every ``scf.for`` region of the body."""
    spans = []
    for m in _FOR.finditer(body):
        spans.append((m.start(), _closing(body, body.index("{", m.end())), m))
    return spans


def _per_iteration(body, ev, items, evaluate):
    """``evaluate(item)`` for ``(position, item)`` pairs in program order,
    those inside an ``scf.for`` once per iteration (its variable bound)."""
    loops = _loops(body)
    branches = _branches(body)
    items = [(pos, item) for pos, item in items if _taken(ev, pos, branches)]
    out = []
    pending: list = []  # a loop's items, evaluated when the loop ends

    def flush(loop) -> None:
        _, _, m = loop
        var = m.group(1)
        for value in range(*(ev(m.group(i)) for i in (2, 3, 4))):
            ev.env[var] = value
            ev.invalidate_loop()
            out.extend(evaluate(item) for item in pending)
        ev.env.pop(var, None)
        ev.invalidate_loop()
        pending.clear()

    current = None
    for pos, item in sorted(items, key=lambda p: p[0]):
        loop = next((lp for lp in loops if lp[0] <= pos <= lp[1]), None)
        if current is not None and loop is not current:
            flush(current)
        current = loop
        if loop is None:
            out.append(evaluate(item))
        else:
            pending.append(item)
    if current is not None:
        flush(current)
    return out

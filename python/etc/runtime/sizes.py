"""Symbolic sizes in manifests: ``"n"``, ``"(n + 7)//8"``, ``"4*n + 1"``.

The compiler writes sizes as the text of the graph's symbol expressions. They
are parsed here with :mod:`ast` and checked against a whitelist of integer
operations (``+ - * // %`` and ``**`` by a constant, parentheses, ints,
declared symbols) before anything else, so a tampered manifest cannot run
code. The checked tree is then compiled once: it holds nothing but that
arithmetic on the symbols' values, and the runtime evaluates the sizes of
every new shape (a decode step's new context length), where walking a
decoder's ~18 K-character split counts node by node took milliseconds.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType

_OPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Pow)
#: Longer texts are refused (a parse bound for untrusted manifests); the
#: decoder's attention split counts (their batch tiers, capped: sums of
#: products the normal form multiplies out) take up to ~18 K characters.
_MAX_TEXT = 65536


@dataclass(frozen=True)
class SizeExpr:
    """A validated integer expression over symbol names."""

    text: str
    tree: ast.expr
    names: frozenset[str] = field(compare=False, repr=False)
    code: CodeType = field(compare=False, repr=False)
    #: The last ``(symbol values, result)``: a launch evaluates the same
    #: split count for several shapes and grids (one tuple, swapped whole).
    _last: list = field(default_factory=lambda: [None], compare=False, repr=False)

    def evaluate(self, symbols: Mapping[str, int]) -> int:
        values = {name: int(symbols[name]) for name in self.names}
        key = tuple(sorted(values.items()))
        last = self._last[0]
        if last is not None and last[0] == key:
            return last[1]
        try:
            result = eval(self.code, {"__builtins__": {}}, values)  # noqa: S307 (checked tree)
        except ZeroDivisionError:  # a divisor is a constant, so 0 (- never parses as one)
            raise ZeroDivisionError(
                "division by a non-positive constant in a size expression"
            ) from None
        self._last[0] = (key, result)
        return result

    def __str__(self) -> str:
        return self.text


def parse_size(text: str, symbols: Sequence[str]) -> SizeExpr:
    """Parses ``text``; raises ValueError naming what is not allowed.

    Parsed once per process for each text and set of symbols: a manifest
    repeats its split counts in several shapes and grids, and the kernels
    of a bucketed artifact share them (the decoder's four took 0.29 s to
    load on a 2-core machine, parsing the same ~9 K-character text 20
    times)."""
    return _parse_size(text, frozenset(symbols))


@functools.lru_cache(maxsize=1024)
def _parse_size(text: str, symbols: frozenset[str]) -> SizeExpr:
    if len(text) > _MAX_TEXT:
        raise ValueError(f"size expression longer than {_MAX_TEXT} characters")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(f"{text!r} is not a size expression") from None
    _check(tree, symbols)
    names = frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    return SizeExpr(text, tree, names, compile(ast.Expression(tree), "<size>", "eval"))


def _check(node: ast.expr, symbols: frozenset[str]) -> None:
    if isinstance(node, ast.Name):
        if node.id not in symbols:
            raise ValueError(f"{node.id!r} is not a declared symbol")
    elif isinstance(node, ast.Constant):
        if not isinstance(node.value, int) or isinstance(node.value, bool):
            raise ValueError(f"constant {node.value!r} is not an int")
    elif isinstance(node, ast.BinOp) and isinstance(node.op, _OPS):
        if isinstance(node.op, (ast.FloorDiv, ast.Mod, ast.Pow)) and not (
            isinstance(node.right, ast.Constant) and isinstance(node.right.value, int)
        ):
            raise ValueError("//, % and ** need a constant right-hand side")
        if isinstance(node.op, ast.Pow) and not 0 <= node.right.value <= 8:
            raise ValueError("exponents must be in 0..8")
        _check(node.left, symbols)
        _check(node.right, symbols)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        _check(node.operand, symbols)
    else:
        raise ValueError(f"{type(node).__name__} is not allowed in a size expression")

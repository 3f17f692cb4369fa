"""Symbolic sizes: graph symbols and integer expressions over them.

An expression is a polynomial with integer coefficients whose variables are
*atoms*: graph symbols, and floor divisions / remainders of a polynomial by a
positive constant. Polynomials are kept in a canonical form, so two
expressions are equal exactly when their canonical forms are equal; this is
what the graph checks use to compare a wait count with a fan-in symbolically
(``n*4 == 4*n``, ``(4*n + 7)//4 == n + 1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import GraphError

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["SymExpr", "Symbol", "Size", "as_size", "evaluate"]

# A monomial is a sorted tuple of (atom key, power); () is the constant term.
_Key = tuple
_Monomial = tuple[tuple[_Key, int], ...]

# Every atom ever built, by key. Keys name their graph, so symbols of two
# graphs never collide; the table only grows by the atoms users create.
_ATOMS: dict[_Key, _Atom] = {}


class _Atom:
    """A variable of the polynomial: a symbol, or ``inner // c`` / ``inner % c``."""

    key: _Key

    def evaluate(self, env: Mapping[str, int]) -> int:
        raise NotImplementedError

    def symbols(self) -> set[Symbol]:
        raise NotImplementedError

    def text(self) -> str:
        raise NotImplementedError


class _SymbolAtom(_Atom):
    def __init__(self, symbol: Symbol, key: _Key) -> None:
        self.symbol = symbol
        self.key = key

    def evaluate(self, env: Mapping[str, int]) -> int:
        try:
            return int(env[self.symbol.name])
        except KeyError:
            raise GraphError(f"no value for symbol '{self.symbol.name}'") from None

    def symbols(self) -> set[Symbol]:
        return {self.symbol}

    def text(self) -> str:
        return self.symbol.name


class _DivAtom(_Atom):
    """``floor(inner / divisor)`` (``op == "//"``) or ``inner mod divisor`` (``"%"``)."""

    def __init__(self, op: str, inner: SymExpr, divisor: int) -> None:
        self.op = op
        self.inner = inner
        self.divisor = divisor
        self.key = (op, inner._key(), divisor)

    def evaluate(self, env: Mapping[str, int]) -> int:
        value = self.inner.evaluate(env)
        return value // self.divisor if self.op == "//" else value % self.divisor

    def symbols(self) -> set[Symbol]:
        return self.inner.symbols()

    def text(self) -> str:
        inner = str(self.inner)
        simple = len(self.inner._terms) == 1 and 1 in self.inner._terms.values()
        if not (simple and len(next(iter(self.inner._terms))) == 1):
            inner = f"({inner})"
        return f"{inner}{self.op}{self.divisor}"


def _atom(atom: _Atom) -> _Key:
    _ATOMS.setdefault(atom.key, atom)
    return atom.key


class SymExpr:
    """An integer expression over graph symbols (immutable, hashable).

    Supports ``+``, ``-``, ``*``, ``**`` (non-negative int exponent) with ints
    and other expressions, and ``//`` / ``%`` by a positive int.
    """

    __slots__ = ("_terms",)

    def __init__(self, terms: Mapping[_Monomial, int] | None = None) -> None:
        self._terms: dict[_Monomial, int] = {m: c for m, c in (terms or {}).items() if c != 0}

    # -- construction ----------------------------------------------------
    @staticmethod
    def constant(value: int) -> SymExpr:
        return SymExpr({(): int(value)})

    @staticmethod
    def _lift(value: Any) -> SymExpr:
        if isinstance(value, SymExpr):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return SymExpr.constant(value)
        if hasattr(value, "__index__") and not isinstance(value, bool):
            return SymExpr.constant(value.__index__())
        return NotImplemented  # type: ignore[return-value]

    def _key(self) -> _Key:
        return tuple(sorted(self._terms.items()))

    # -- queries ---------------------------------------------------------
    def as_int(self) -> int | None:
        """The value when the expression is a constant, else ``None``."""
        if not self._terms:
            return 0
        if len(self._terms) == 1 and () in self._terms:
            return self._terms[()]
        return None

    @property
    def degree(self) -> int:
        """Polynomial degree in the atoms (0 for constants, 1 for affine forms)."""
        return max((sum(p for _, p in m) for m in self._terms), default=0)

    def symbols(self) -> set[Symbol]:
        """Every graph symbol the expression mentions."""
        out: set[Symbol] = set()
        for monomial in self._terms:
            for key, _ in monomial:
                out |= _ATOMS[key].symbols()
        return out

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value for concrete symbol values ``env`` (name -> int)."""
        total = 0
        for monomial, coeff in self._terms.items():
            term = coeff
            for key, power in monomial:
                term *= _ATOMS[key].evaluate(env) ** power
            total += term
        return total

    # -- arithmetic --------------------------------------------------------
    def __add__(self, other: Any) -> SymExpr:
        rhs = SymExpr._lift(other)
        if rhs is NotImplemented:
            return NotImplemented
        terms = dict(self._terms)
        for m, c in rhs._terms.items():
            terms[m] = terms.get(m, 0) + c
        return SymExpr(terms)

    __radd__ = __add__

    def __neg__(self) -> SymExpr:
        return SymExpr({m: -c for m, c in self._terms.items()})

    def __pos__(self) -> SymExpr:
        return self

    def __sub__(self, other: Any) -> SymExpr:
        rhs = SymExpr._lift(other)
        if rhs is NotImplemented:
            return NotImplemented
        return self + (-rhs)

    def __rsub__(self, other: Any) -> SymExpr:
        lhs = SymExpr._lift(other)
        if lhs is NotImplemented:
            return NotImplemented
        return lhs - self

    def __mul__(self, other: Any) -> SymExpr:
        rhs = SymExpr._lift(other)
        if rhs is NotImplemented:
            return NotImplemented
        terms: dict[_Monomial, int] = {}
        for m1, c1 in self._terms.items():
            for m2, c2 in rhs._terms.items():
                m = _mul_monomials(m1, m2)
                terms[m] = terms.get(m, 0) + c1 * c2
        return SymExpr(terms)

    __rmul__ = __mul__

    def __pow__(self, exponent: Any) -> SymExpr:
        if not isinstance(exponent, int) or isinstance(exponent, bool) or exponent < 0:
            raise GraphError(f"'{self}' ** {exponent!r}: the exponent must be a non-negative int")
        result = SymExpr.constant(1)
        for _ in range(exponent):
            result = result * self
        return result

    def __floordiv__(self, other: Any) -> SymExpr:
        return self._divide("//", other)

    def __mod__(self, other: Any) -> SymExpr:
        return self._divide("%", other)

    def _divide(self, op: str, other: Any) -> SymExpr:
        if isinstance(other, SymExpr):
            value = other.as_int()
            if value is None:
                raise GraphError(
                    f"'{self}' {op} '{other}': only division by a constant is supported"
                )
            other = value
        if not isinstance(other, int) or isinstance(other, bool) or other <= 0:
            raise GraphError(f"'{self}' {op} {other!r}: the divisor must be a positive int")
        # Terms divisible by `other` leave the floor/remainder unchanged, so
        # split them off: (4n + 7)//4 == n + 7//4 == n + 1, (4n + 7) % 4 == 3.
        exact = {m: c for m, c in self._terms.items() if c % other == 0}
        rest = SymExpr({m: c for m, c in self._terms.items() if c % other != 0})
        rest_value = rest.as_int()
        if op == "//":
            quotient = SymExpr({m: c // other for m, c in exact.items()})
            if rest_value is not None:
                return quotient + rest_value // other
            return quotient + SymExpr({((_atom(_DivAtom("//", rest, other)), 1),): 1})
        if rest_value is not None:
            return SymExpr.constant(rest_value % other)
        return SymExpr({((_atom(_DivAtom("%", rest, other)), 1),): 1})

    # -- comparison and printing ----------------------------------------------
    def __eq__(self, other: object) -> bool:
        rhs = SymExpr._lift(other)
        if rhs is NotImplemented:
            return NotImplemented
        return self._terms == rhs._terms

    def __hash__(self) -> int:
        value = self.as_int()
        return hash(value) if value is not None else hash(self._key())

    def __bool__(self) -> bool:
        # Truth is ambiguous for symbolic values; only constants have one.
        value = self.as_int()
        if value is None:
            raise GraphError(f"the truth value of '{self}' is not known before launch")
        return value != 0

    def __str__(self) -> str:
        if not self._terms:
            return "0"
        pieces: list[str] = []
        # Highest degree first, constant last.
        order = sorted(self._terms, key=lambda m: (-sum(p for _, p in m), m == (), m))
        for i, monomial in enumerate(order):
            coeff = self._terms[monomial]
            sign = "-" if coeff < 0 else "+"
            magnitude = abs(coeff)
            factors = [_factor_text(k, p) for k, p in monomial]
            if len(factors) > 1 or (factors and magnitude != 1):
                # Parenthesise divisions inside products: 8*((n + 7)//8).
                factors = [f"({f})" if "//" in f or "%" in f else f for f in factors]
            if not factors:
                body = str(magnitude)
            elif magnitude == 1:
                body = "*".join(factors)
            else:
                body = "*".join([str(magnitude), *factors])
            if i == 0:
                pieces.append(("-" if sign == "-" else "") + body)
            else:
                pieces.append(f" {sign} {body}")
        return "".join(pieces)

    def __repr__(self) -> str:
        return f"SymExpr({self})"

    # -- used by the MLIR emitter -------------------------------------------
    def terms(self) -> list[tuple[list[tuple[_Atom, int]], int]]:
        """Canonically ordered ``(factors, coefficient)`` pairs; the constant last."""
        order = sorted(self._terms, key=lambda m: (m == (), m))
        return [([(_ATOMS[k], p) for k, p in m], self._terms[m]) for m in order]


Size = int | SymExpr
"""An extent: a non-negative int or a symbolic expression."""


def _factor_text(key: _Key, power: int) -> str:
    text = _ATOMS[key].text()
    if power == 1:
        return text
    if isinstance(_ATOMS[key], _DivAtom):
        text = f"({text})"
    return f"{text}**{power}"


def _mul_monomials(a: _Monomial, b: _Monomial) -> _Monomial:
    powers: dict[_Key, int] = dict(a)
    for key, power in b:
        powers[key] = powers.get(key, 0) + power
    return tuple(sorted(powers.items()))


_SERIAL = [0]


class Symbol(SymExpr):
    """A symbolic size of a graph (``g.symbol("n")``), bound at launch."""

    __slots__ = ("name", "graph", "_atom_key", "max")

    def __init__(self, name: str, graph: Graph, max: int | None = None) -> None:  # noqa: A002
        _SERIAL[0] += 1
        key = _atom(_SymbolAtom(self, ("sym", _SERIAL[0], name)))
        super().__init__({((key, 1),): 1})
        self.name = name
        self.graph = graph
        self._atom_key = key
        #: The largest value the graph's tiles take (None: any); a launch or
        #: a simulation with a larger one is refused.
        self.max = max

    def __repr__(self) -> str:
        return f"Symbol({self.name!r})"


def as_size(value: Any) -> Size:
    """Normalise an extent: an int, or a SymExpr that is not a constant."""
    if isinstance(value, SymExpr):
        constant = value.as_int()
        return value if constant is None else constant
    if isinstance(value, bool):
        raise TypeError("bool is not a size")
    if isinstance(value, int):
        return value
    if hasattr(value, "__index__"):
        return value.__index__()
    raise TypeError(f"{value!r} is not a size (int or symbolic expression)")


def evaluate(value: Size, env: Mapping[str, int]) -> int:
    """The concrete value of an int or expression."""
    if isinstance(value, SymExpr):
        return value.evaluate(env)
    return int(value)

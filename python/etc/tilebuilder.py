"""Write tile functions in Python: a small DSL over the MLIR Python bindings.

``@tile`` builds ``func.func @name(coords..., buffers...)`` in a fresh module
by running a Python body that emits upstream ops (arith, scf, memref,
vector, gpu, math) through :class:`TileBuilder`, verifies the module and
returns an :class:`etc.DeviceFunction`::

    from etc import f32, memref_type, tile

    @tile(grid_rank=1, args=[memref_type((None, 4), f32), memref_type((None,), f32)])
    def row_sum(t, i, B, C):
        loop = t.range(0, 4, carry=[t.f32(0.0)])
        for k, acc in loop:
            loop.yield_(acc + t.load(B, [i, k]))
        with t.if_(t.thread_id() == 0):
            t.store(loop.result, C, [i])

Values are :class:`Val` (an ``ir.Value`` with arithmetic operators, in the
spirit of upstream ``nvdsl.py``'s ``ArithValue``). Integer and ``index``
values are treated as non-negative, as tile coordinates, thread ids and
offsets are: ``//``, ``%``, comparisons, ``t.min``/``t.max`` and casts use
the unsigned ops (``divui``, ``cmpi ult``, ``uitofp``, ...), which lets
LLVM turn division by powers of two into shifts.

Every mistake the builder can see (a type mismatch, a wrong number of
indices or arguments, IR that does not verify) raises
:class:`etc.GraphError` naming the tile; nothing is printed.
"""

from __future__ import annotations

import inspect
import math as _math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partialmethod
from types import TracebackType
from typing import Any

from . import ir
from .device import DeviceFunction
from .dialects import arith, func, gpu, math, memref, scf, vector
from .dtypes import DType, dtype
from .errors import GraphError

__all__ = [
    "tile",
    "TileBuilder",
    "Val",
    "Loop",
    "MemRefSpec",
    "memref_type",
    "f64",
    "f32",
    "f16",
    "bf16",
    "i64",
    "i32",
    "i16",
    "i8",
    "i1",
]

f64, f32, f16, bf16 = dtype("f64"), dtype("f32"), dtype("f16"), dtype("bf16")
i64, i32, i16, i8, i1 = dtype("i64"), dtype("i32"), dtype("i16"), dtype("i8"), dtype("i1")

WARP_SIZE = 32
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*\Z")
_THIS_FILE = os.path.normcase(os.path.abspath(__file__))


class _Active(threading.local):
    """Per thread, the builders whose bodies are running (a body may build another tile)."""

    def __init__(self) -> None:
        self.stack: list[TileBuilder] = []


_ACTIVE = _Active()

Number = int | float | bool
Operand = Any  # a Val, an ir.Value or a Python number


# ----------------------------------------------------------------------------
# Buffer types
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MemRefSpec:
    """A buffer parameter: ``shape`` (``None`` = dynamic) and element type."""

    shape: tuple[int | None, ...]
    dtype: DType

    @property
    def mlir(self) -> str:
        dims = "".join(("?" if d is None else str(d)) + "x" for d in self.shape)
        return f"memref<{dims}{self.dtype.mlir}>"

    def __str__(self) -> str:
        return self.mlir


def memref_type(shape: Sequence[int | None], element: DType | str = "f32") -> MemRefSpec:
    """``memref_type((None, 256), f32)`` is ``memref<?x256xf32>``."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise GraphError(f"memref_type: shape {shape!r} must be a sequence") from None
    for d in dims:
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 0):
            raise GraphError(
                f"memref_type: dimension {d!r} must be a non-negative int or None (dynamic)"
            )
    return MemRefSpec(dims, dtype(element))


# ----------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------


def _active() -> TileBuilder:
    if not _ACTIVE.stack:
        raise GraphError("a tile Val was used outside the body of the tile that made it")
    return _ACTIVE.stack[-1]


#: Shared memory one CTA may have on sm_90 (227 KB).
SHARED_BYTES = 227 * 1024


def _element(t: ir.Type) -> ir.Type:
    return t.element_type if isinstance(t, ir.VectorType) else t


def _element_bytes(t: ir.Type) -> int:
    """Bytes an element of scalar type ``t`` takes in memory (``index`` 8)."""
    if isinstance(t, ir.IndexType):
        return 8
    return max(1, t.width // 8)


def _is_float(t: ir.Type) -> bool:
    return isinstance(_element(t), ir.FloatType)


def _is_int(t: ir.Type) -> bool:
    """Integer-like: a signless integer or ``index`` (or a vector of them)."""
    return isinstance(_element(t), (ir.IntegerType, ir.IndexType))


def _binary(lhs: Any, rhs: Any, op: str) -> Val:
    return _active()._arith(op, lhs, rhs)


def _rbinary(rhs: Any, lhs: Any, op: str) -> Val:
    return _active()._arith(op, lhs, rhs)


class Val(ir.Value):
    """An SSA value with Python operators that emit ``arith`` ops.

    ``+ - * // % /`` and ``< <= > >= == !=`` dispatch on the type (integer
    or ``index`` vs float, scalar or vector); a Python number on either
    side becomes a constant of the other side's type, and a scalar meeting
    a vector is broadcast. ``& | ^ ~`` work on integers and ``i1``.
    Comparisons give ``i1`` values, which have no Python truth value: use
    :meth:`TileBuilder.if_` or :meth:`TileBuilder.select`.
    """

    def __init__(self, value: ir.Value, name: str | None = None) -> None:
        super().__init__(value)
        # The Python parameter name of a tile argument, for error messages.
        self.name = name

    __add__ = partialmethod(_binary, op="add")
    __sub__ = partialmethod(_binary, op="sub")
    __mul__ = partialmethod(_binary, op="mul")
    __floordiv__ = partialmethod(_binary, op="floordiv")
    __truediv__ = partialmethod(_binary, op="truediv")
    __mod__ = partialmethod(_binary, op="mod")
    __and__ = partialmethod(_binary, op="and")
    __or__ = partialmethod(_binary, op="or")
    __xor__ = partialmethod(_binary, op="xor")
    __radd__ = partialmethod(_rbinary, op="add")
    __rsub__ = partialmethod(_rbinary, op="sub")
    __rmul__ = partialmethod(_rbinary, op="mul")
    __rfloordiv__ = partialmethod(_rbinary, op="floordiv")
    __rtruediv__ = partialmethod(_rbinary, op="truediv")
    __rmod__ = partialmethod(_rbinary, op="mod")
    __rand__ = partialmethod(_rbinary, op="and")
    __ror__ = partialmethod(_rbinary, op="or")
    __rxor__ = partialmethod(_rbinary, op="xor")
    __lt__ = partialmethod(_binary, op="lt")
    __le__ = partialmethod(_binary, op="le")
    __gt__ = partialmethod(_binary, op="gt")
    __ge__ = partialmethod(_binary, op="ge")
    __eq__ = partialmethod(_binary, op="eq")  # type: ignore[assignment]
    __ne__ = partialmethod(_binary, op="ne")  # type: ignore[assignment]
    # Overriding __eq__ would drop hashing; a Val still hashes as its Value.
    __hash__ = ir.Value.__hash__

    def __neg__(self) -> Val:
        return _active()._negate(self)

    def __invert__(self) -> Val:
        return _active()._arith("xor", self, -1 if not _is_i1(self.type) else True)

    def __bool__(self) -> bool:
        raise GraphError(
            f"tile '{_active().name}': a value of type {self.type} has no Python truth value "
            "(it is known only on the GPU); use t.if_(cond) or t.select(cond, a, b), "
            "and & | ~ instead of and/or/not"
        )

    def __repr__(self) -> str:
        return f"Val({self.get_name(use_name_loc_as_prefix=True)}: {self.type})"


def _is_i1(t: ir.Type) -> bool:
    e = _element(t)
    return isinstance(e, ir.IntegerType) and e.width == 1


# Integer ops are the unsigned ones (see the module docstring).
_INT_OPS: dict[str, Callable[..., ir.Value]] = {
    "add": arith.addi,
    "sub": arith.subi,
    "mul": arith.muli,
    "floordiv": arith.divui,
    "mod": arith.remui,
    "and": arith.andi,
    "or": arith.ori,
    "xor": arith.xori,
    "min": arith.minui,
    "max": arith.maxui,
}
_FLOAT_OPS: dict[str, Callable[..., ir.Value]] = {
    "add": arith.addf,
    "sub": arith.subf,
    "mul": arith.mulf,
    "truediv": arith.divf,
    "min": arith.minimumf,
    "max": arith.maximumf,
}
_COMPARISONS = {
    "lt": ("ult", "olt"),
    "le": ("ule", "ole"),
    "gt": ("ugt", "ogt"),
    "ge": ("uge", "oge"),
    "eq": ("eq", "oeq"),
    "ne": ("ne", "une"),
}
_SYMBOLS = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "floordiv": "//",
    "truediv": "/",
    "mod": "%",
    "and": "&",
    "or": "|",
    "xor": "^",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
    "min": "min",
    "max": "max",
}
_REDUCTIONS = ("add", "max", "min")
_VECTOR_KINDS = {
    ("add", False): vector.CombiningKind.ADD,
    ("add", True): vector.CombiningKind.ADD,
    ("max", False): vector.CombiningKind.MAXUI,
    ("max", True): vector.CombiningKind.MAXIMUMF,
    ("min", False): vector.CombiningKind.MINUI,
    ("min", True): vector.CombiningKind.MINIMUMF,
}


# ----------------------------------------------------------------------------
# Structured control flow
# ----------------------------------------------------------------------------


class _Scope:
    """An insertion point the builder entered; closed in order, even on errors."""

    def __init__(self, builder: TileBuilder, block: ir.Block, what: str) -> None:
        self.builder, self.block, self.what = builder, block, what
        self._ip = ir.InsertionPoint(block)
        self.terminated = False  # set by Loop.yield_: nothing may follow

    def open(self) -> None:
        self._ip.__enter__()
        self.builder._scopes.append(self)

    def check_innermost(self) -> None:
        # Only a loop can stay open (an if is a `with`): the body left it.
        inner = self.builder._scopes[-1]
        if inner is not self:
            raise self.builder.error(
                f"{inner.what} was left early (break or return inside a t.range loop "
                "is not supported)"
            )

    def close(self) -> None:
        self.check_innermost()
        self.builder._scopes.pop()
        self._ip.__exit__(None, None, None)


class Loop:
    """An ``scf.for`` being built; iterate it exactly once to emit its body.

    Without carried values the iteration gives the induction variable::

        for k in t.range(lo, hi, step): ...

    With ``carry=[init, ...]`` it gives ``(k, *carried)``; the body must end
    with :meth:`yield_` and the loop's results are then :attr:`results`::

        loop = t.range(0, n, carry=[t.f32(0.0)])
        for k, acc in loop:
            loop.yield_(acc + t.load(A, [k]))
        total = loop.result
    """

    def __init__(self, builder: TileBuilder, op: Any, num_carried: int) -> None:
        self._builder = builder
        self._op = op
        self._num_carried = num_carried
        self._scope = _Scope(builder, op.body, "a t.range loop")
        self._state = "new"  # -> "body" -> "done"
        self._yielded = False

    def __iter__(self) -> Iterator[Any]:
        if self._state != "new":
            raise self._builder.error("a t.range loop can be iterated only once")
        return self

    def __next__(self) -> Any:
        if self._state == "new":
            self._state = "body"
            self._scope.open()
            iv = Val(self._op.induction_variable)
            carried = tuple(Val(v) for v in self._op.inner_iter_args)
            return (iv, *carried) if carried else iv
        if self._state == "body":
            self._finish()
        raise StopIteration

    def _finish(self) -> None:
        b = self._builder
        if not self._yielded:
            if self._num_carried:
                self._scope.close()
                self._state = "done"
                raise GraphError(
                    f"tile '{b.name}': a t.range loop with {self._num_carried} carried "
                    "value(s) must end with loop.yield_(...)"
                )
            self._scope.check_innermost()
            with b._loc():
                scf.yield_([])
        self._scope.close()
        self._state = "done"

    def yield_(self, *values: Operand) -> None:
        """End the body, passing the next carried values."""
        b = self._builder
        if self._state != "body" or b._scopes[-1] is not self._scope:
            raise GraphError(
                f"tile '{b.name}': loop.yield_ must be called inside this loop's own "
                "body (not in a nested loop or if)"
            )
        if self._yielded:
            raise GraphError(f"tile '{b.name}': loop.yield_ was called twice")
        if len(values) != self._num_carried:
            raise GraphError(
                f"tile '{b.name}': loop.yield_ got {len(values)} value(s) for "
                f"{self._num_carried} carried value(s)"
            )
        out = []
        for k, (value, arg) in enumerate(zip(values, self._op.inner_iter_args, strict=True)):
            v = b._as_val(value, arg.type, f"loop.yield_ value #{k}")
            if v.type != arg.type:
                raise GraphError(
                    f"tile '{b.name}': loop.yield_ value #{k} has type {v.type} but the "
                    f"carried value has type {arg.type}"
                )
            out.append(v)
        with b._loc():
            scf.yield_(out)
        self._yielded = True
        self._scope.terminated = True

    @property
    def results(self) -> tuple[Val, ...]:
        """The carried values after the last iteration."""
        if self._state != "done":
            raise GraphError(
                f"tile '{self._builder.name}': a loop's results exist only after its body"
            )
        return tuple(Val(r) for r in self._op.results)

    @property
    def result(self) -> Val:
        """The single carried value after the last iteration."""
        if self._num_carried != 1:
            raise GraphError(
                f"tile '{self._builder.name}': the loop carries {self._num_carried} "
                "values; use loop.results"
            )
        return self.results[0]


class _If:
    """``with t.if_(cond):`` -- an ``scf.if`` without results or else branch."""

    def __init__(self, builder: TileBuilder, op: Any) -> None:
        self._builder = builder
        self._op = op
        self._scope = _Scope(builder, op.then_block, "a t.if_ block")

    def __enter__(self) -> None:
        self._scope.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            return  # build_tile closes every open scope
        self._scope.check_innermost()
        with self._builder._loc():
            scf.yield_([])
        self._scope.close()


# ----------------------------------------------------------------------------
# The builder
# ----------------------------------------------------------------------------


class TileBuilder:
    """Emits the body of one tile function; passed to the body as ``t``.

    The body runs on one CTA of :attr:`block_size` threads (1-D). Helpers
    return :class:`Val`; Python numbers are accepted wherever a value is.
    Raw binding ops (``etc.dialects.*``) may be mixed in: the insertion
    point is the ambient one; wrap their results with :meth:`val`.
    """

    def __init__(self, name: str, block_size: int, grid_rank: int) -> None:
        self.name = name
        self.block_size = block_size
        self.num_warps = block_size // WARP_SIZE
        self.grid_rank = grid_rank
        self.module: Any = None
        self._entry: Any = None
        self._scopes: list[_Scope] = []
        self._hoisted: dict[tuple[str, ...], Val] = {}
        self._num_hoisted = 0
        self._shared: dict[str, Val] = {}
        self._globals: set[str] = set()

    # -- errors and locations -------------------------------------------------

    def error(self, message: str) -> GraphError:
        """A :class:`GraphError` about this tile."""
        return GraphError(f"tile '{self.name}': {message}")

    def _loc(self) -> ir.Location:
        """The location of the user's line that is emitting ops."""
        if self._scopes and self._scopes[-1].terminated:
            raise self.error("loop.yield_(...) must be the last statement of the loop body")
        frame = sys._getframe(1)
        while frame is not None and os.path.normcase(frame.f_code.co_filename) == _THIS_FILE:
            frame = frame.f_back
        if frame is None:
            return ir.Location.unknown()
        return ir.Location.file(frame.f_code.co_filename, frame.f_lineno, 0)

    @staticmethod
    def _describe(value: Any) -> str:
        name = getattr(value, "name", None)
        if name:
            return name
        if isinstance(value, ir.Value):
            return f"a value of type {value.type}"
        return repr(value)

    # -- values and constants -------------------------------------------------

    def val(self, value: ir.Value | ir.OpView | ir.Operation) -> Val:
        """Wrap the result of a raw binding op."""
        if isinstance(value, (ir.OpView, ir.Operation)):
            results = value.results
            if len(results) != 1:
                raise self.error(f"val() needs an op with one result, got {len(results)}")
            value = results[0]
        if not isinstance(value, ir.Value):
            raise self.error(f"val() needs an MLIR value, got {value!r}")
        return value if isinstance(value, Val) else Val(value)

    def _type(self, spec: Any) -> ir.Type:
        """An MLIR type from an ETC dtype name, ``"index"`` or an ``ir.Type``."""
        if isinstance(spec, ir.Type):
            return spec
        if spec == "index":
            return ir.IndexType.get()
        try:
            return ir.Type.parse(dtype(spec).mlir)
        except GraphError as e:
            raise self.error(str(e)) from None

    def _hoist(self, key: tuple[str, ...], build: Callable[[], ir.Value]) -> Val:
        """Emit a pure op once, at the top of the function (so it dominates every use)."""
        if key in self._hoisted:
            return self._hoisted[key]
        ops = self._entry.operations
        if self._num_hoisted < len(ops):
            ip = ir.InsertionPoint(ops[self._num_hoisted])
        else:
            ip = ir.InsertionPoint(self._entry)
        with ip, ir.Location.unknown():
            value = Val(build())
        self._num_hoisted += 1
        self._hoisted[key] = value
        return value

    def const(self, value: Number, type: Any) -> Val:
        """``arith.constant`` of ``type`` (a scalar type, or a vector for a splat)."""
        t = self._type(type)
        e = _element(t)
        if isinstance(e, ir.FloatType):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise self.error(f"cannot make a constant of type {t} from {value!r}")
            attr = ir.FloatAttr.get(e, float(value))
            key = (str(t), repr(float(value)))
        elif isinstance(e, (ir.IntegerType, ir.IndexType)):
            if not isinstance(value, int):
                raise self.error(f"cannot make a constant of type {t} from {value!r}")
            attr = ir.IntegerAttr.get(e, int(value))
            key = (str(t), str(int(value)))
        else:
            raise self.error(f"cannot make constants of type {t}")
        if isinstance(t, ir.VectorType):
            attr = ir.DenseElementsAttr.get_splat(t, attr)
        return self._hoist(("const", *key), lambda: arith.constant(t, attr))

    def index(self, value: int) -> Val:
        """An ``index`` constant."""
        return self.const(value, "index")

    def f32(self, value: float) -> Val:
        """An ``f32`` constant."""
        return self.const(value, "f32")

    def i32(self, value: int) -> Val:
        """An ``i32`` constant."""
        return self.const(value, "i32")

    def full(self, width: int, value: Number, element: Any = "f32") -> Val:
        """A constant ``vector<width x element>`` with every lane ``value``."""
        return self.const(value, ir.VectorType.get([self._width(width)], self._type(element)))

    def zeros(self, width: int, element: Any = "f32") -> Val:
        """A constant zero ``vector<width x element>``."""
        return self.full(width, 0, element)

    def _width(self, width: Any) -> int:
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise self.error(f"a vector width must be a positive int, got {width!r}")
        return width

    def _as_val(self, value: Any, like: ir.Type | None, what: str) -> Val:
        """A Val from a Val/Value, or a constant of type ``like`` from a number."""
        if isinstance(value, Val):
            return value
        if isinstance(value, ir.Value):
            return Val(value)
        if isinstance(value, (int, float)):
            if like is None:
                raise self.error(
                    f"{what}: cannot tell the MLIR type of the Python number {value!r}; "
                    "use t.index(...), t.f32(...) or t.const(...)"
                )
            if isinstance(value, bool) and not _is_i1(like):
                raise self.error(f"{what}: a bool cannot be a {like} value")
            return self.const(int(value) if isinstance(value, bool) else value, like)
        raise self.error(f"{what}: expected an MLIR value or a number, got {value!r}")

    def _index(self, value: Any, what: str) -> Val:
        v = self._as_val(value, ir.IndexType.get(), what)
        if not isinstance(v.type, ir.IndexType):
            raise self.error(f"{what} must be an index value, got {v.type} (use t.cast)")
        return v

    def _pair(self, lhs: Any, rhs: Any, what: str) -> tuple[Val, Val]:
        """Two operands of one type: numbers take the other side's type,
        a scalar is broadcast to the other side's vector type."""
        lt = lhs.type if isinstance(lhs, ir.Value) else None
        rt = rhs.type if isinstance(rhs, ir.Value) else None
        a = self._as_val(lhs, rt, what)
        b = self._as_val(rhs, lt, what)
        if a.type == b.type:
            return a, b
        if isinstance(a.type, ir.VectorType) and a.type.element_type == b.type:
            return a, self._broadcast(b, a.type)
        if isinstance(b.type, ir.VectorType) and b.type.element_type == a.type:
            return self._broadcast(a, b.type), b
        raise self.error(
            f"{what}: the operands have different types, {a.type} ({self._describe(a)}) and "
            f"{b.type} ({self._describe(b)}); convert one with t.cast"
        )

    def _broadcast(self, scalar: Val, to: ir.Type) -> Val:
        with self._loc():
            return Val(vector.broadcast(to, scalar))

    # -- arithmetic -------------------------------------------------------------

    def _arith(self, op: str, lhs: Any, rhs: Any) -> Val:
        what = f"'{_SYMBOLS[op]}'"
        if op in ("floordiv", "mod") and type(rhs) in (int, float) and rhs == 0:
            # divui/remui by zero is undefined: LLVM may fold it to anything.
            raise self.error(f"{what} by the constant 0")
        a, b = self._pair(lhs, rhs, what)
        t = a.type
        with self._loc():
            if op in _COMPARISONS:
                int_pred, float_pred = _COMPARISONS[op]
                if _is_float(t):
                    return Val(arith.cmpf(getattr(arith.CmpFPredicate, float_pred.upper()), a, b))
                if _is_int(t):
                    return Val(arith.cmpi(getattr(arith.CmpIPredicate, int_pred), a, b))
            elif _is_float(t) and op in _FLOAT_OPS:
                return Val(_FLOAT_OPS[op](a, b))
            elif _is_int(t) and op in _INT_OPS:
                return Val(_INT_OPS[op](a, b))
        hint = ""
        if op == "truediv" and _is_int(t):
            hint = " (use // for integer division)"
        elif op == "floordiv" and _is_float(t):
            hint = " (use / for float division)"
        elif op == "mod" and _is_float(t):
            hint = " (arith.remf does not lower on NVPTX)"
        raise self.error(f"{what} is not supported on {t} values{hint}")

    def _negate(self, v: Val) -> Val:
        with self._loc():
            if _is_float(v.type):
                return Val(arith.negf(v))
        return self._arith("sub", 0, v)

    def min(self, a: Operand, b: Operand) -> Val:
        """Elementwise minimum (``minui``, or ``minimumf`` which propagates NaN)."""
        return self._arith("min", a, b)

    def max(self, a: Operand, b: Operand) -> Val:
        """Elementwise maximum (``maxui``, or ``maximumf`` which propagates NaN)."""
        return self._arith("max", a, b)

    def select(self, cond: Operand, a: Operand, b: Operand) -> Val:
        """``arith.select``: ``a`` where ``cond`` holds, else ``b``."""
        c = self._as_val(cond, ir.IntegerType.get_signless(1), "select condition")
        if not _is_i1(c.type):
            raise self.error(f"select condition must be i1, got {c.type}")
        x, y = self._pair(a, b, "select")
        with self._loc():
            return Val(arith.select(c, x, y))

    def cast(self, value: Operand, to: Any) -> Val:
        """Convert between ``index``, integers and floats (unsigned for integers)."""
        v = self._as_val(value, None, "cast")
        target = self._type(to)
        src = _element(v.type)
        if isinstance(v.type, ir.VectorType):
            shape = v.type.shape
            full = ir.VectorType.get(shape, target)
            vec = lambda e: ir.VectorType.get(shape, e)  # noqa: E731
        else:
            full = target
            vec = lambda e: e  # noqa: E731
        if src == target:
            return v
        i64_t = ir.IntegerType.get_signless(64)
        with self._loc():
            if isinstance(src, ir.IndexType) and isinstance(target, ir.IntegerType):
                return Val(arith.index_castui(full, v))
            if isinstance(src, ir.IntegerType) and isinstance(target, ir.IndexType):
                return Val(arith.index_castui(full, v))
            if isinstance(src, ir.IntegerType) and isinstance(target, ir.IntegerType):
                if src.width < target.width:
                    return Val(arith.extui(full, v))
                return Val(arith.trunci(full, v))
            if isinstance(src, ir.IndexType) and isinstance(target, ir.FloatType):
                return Val(arith.uitofp(full, arith.index_castui(vec(i64_t), v)))
            if isinstance(src, ir.IntegerType) and isinstance(target, ir.FloatType):
                return Val(arith.uitofp(full, v))
            if isinstance(src, ir.FloatType) and isinstance(target, ir.IntegerType):
                return Val(arith.fptoui(full, v))
            if isinstance(src, ir.FloatType) and isinstance(target, ir.IndexType):
                return Val(arith.index_castui(full, arith.fptoui(vec(i64_t), v)))
            if isinstance(src, ir.FloatType) and isinstance(target, ir.FloatType):
                if src.width < target.width:
                    return Val(arith.extf(full, v))
                return Val(arith.truncf(full, v))
        raise self.error(f"cannot cast {v.type} to {target}")

    def _float_unary(self, fn: Callable[..., ir.Value], v: Operand, what: str) -> Val:
        x = self._as_val(v, None, what)
        if not _is_float(x.type):
            raise self.error(f"{what} needs a float value, got {x.type}")
        with self._loc():
            return Val(fn(x))

    def exp(self, v: Operand) -> Val:
        """``math.exp``."""
        return self._float_unary(math.exp, v, "exp")

    def log(self, v: Operand) -> Val:
        """``math.log``."""
        return self._float_unary(math.log, v, "log")

    def sqrt(self, v: Operand) -> Val:
        """``math.sqrt``."""
        return self._float_unary(math.sqrt, v, "sqrt")

    def rsqrt(self, v: Operand) -> Val:
        """``math.rsqrt`` (``rsqrt.approx.f32`` on NVPTX)."""
        return self._float_unary(math.rsqrt, v, "rsqrt")

    def tanh(self, v: Operand) -> Val:
        """``math.tanh``."""
        return self._float_unary(math.tanh, v, "tanh")

    def abs(self, v: Operand) -> Val:
        """``math.absf``."""
        return self._float_unary(math.absf, v, "abs")

    def fma(self, a: Operand, b: Operand, c: Operand) -> Val:
        """``a * b + c`` rounded once (``vector.fma`` / ``math.fma``)."""
        x, y = self._pair(a, b, "fma")
        x, z = self._pair(x, c, "fma")
        x, y = self._pair(x, y, "fma")
        if not _is_float(x.type):
            raise self.error(f"fma needs float values, got {x.type}")
        with self._loc():
            if isinstance(x.type, ir.VectorType):
                return Val(vector.fma(x, y, z))
            return Val(math.fma(x, y, z))

    # -- threads --------------------------------------------------------------

    def thread_id(self) -> Val:
        """``gpu.thread_id x``: this thread's index in the CTA."""
        # No upper_bound: the kernel runs with the graph's block size, which
        # can exceed this tile's; the kernel's known_block_size bounds it.
        return self._hoist(("thread_id",), lambda: gpu.thread_id(gpu.Dimension.x))

    def lane_id(self) -> Val:
        """``gpu.lane_id``: this thread's lane in its warp (0..31)."""
        return self._hoist(("lane_id",), lambda: gpu.lane_id(upper_bound=WARP_SIZE))

    def warp_id(self) -> Val:
        """``thread_id // 32``: this thread's warp in the CTA."""
        tid, c32 = self.thread_id(), self.index(WARP_SIZE)
        return self._hoist(("warp_id",), lambda: arith.divui(tid, c32))

    def barrier(self) -> None:
        """``gpu.barrier``: every thread of the CTA must reach it."""
        with self._loc():
            gpu.barrier()

    # -- control flow -----------------------------------------------------------

    def range(
        self,
        start: Operand,
        stop: Operand | None = None,
        step: Operand = 1,
        *,
        carry: Sequence[Operand] = (),
    ) -> Loop:
        """``scf.for`` from ``start`` to ``stop`` by ``step`` (like Python's range).

        ``carry`` holds the initial loop-carried values (``iter_args``); see
        :class:`Loop`. Bounds are ``index`` values or ints.
        """
        if stop is None:
            start, stop = 0, start
        if isinstance(step, int) and not isinstance(step, bool) and step <= 0:
            raise self.error(f"t.range step must be positive, got {step}")
        lo = self._index(start, "t.range start")
        hi = self._index(stop, "t.range stop")
        st = self._index(step, "t.range step")
        if isinstance(carry, (ir.Value, int, float)):
            raise self.error("t.range carry must be a list of initial values")
        inits = []
        for k, c in enumerate(carry):
            if not isinstance(c, ir.Value):
                raise self.error(
                    f"t.range carry #{k} ({c!r}) must be an MLIR value such as t.f32(0.0), "
                    "so that its type is known"
                )
            inits.append(self._as_val(c, None, f"t.range carry #{k}"))
        with self._loc():
            op = scf.ForOp(lo, hi, st, inits)
        return Loop(self, op, len(inits))

    def if_(self, cond: Operand) -> _If:
        """``with t.if_(cond):`` runs the block where the ``i1`` ``cond`` holds."""
        c = self._as_val(cond, ir.IntegerType.get_signless(1), "t.if_ condition")
        if not (isinstance(c.type, ir.IntegerType) and c.type.width == 1):
            raise self.error(f"t.if_ condition must be i1, got {c.type}")
        with self._loc():
            op = scf.IfOp(c)
        return _If(self, op)

    # -- memory ---------------------------------------------------------------

    def _memref(self, buf: Any, what: str) -> Val:
        if not isinstance(buf, ir.Value) or not isinstance(buf.type, ir.MemRefType):
            raise self.error(f"{what}: {self._describe(buf)} is not a memref")
        return buf if isinstance(buf, Val) else Val(buf)

    def _indices(self, buf: Val, indices: Any, what: str) -> list[Val]:
        if isinstance(indices, (ir.Value, int)):
            indices = [indices]
        indices = list(indices)
        rank = buf.type.rank
        if len(indices) != rank:
            raise self.error(
                f"{what} {self._describe(buf)}: {len(indices)} index(es) for a rank-{rank} memref"
            )
        return [
            self._index(x, f"{what} {self._describe(buf)}: index #{k}")
            for k, x in enumerate(indices)
        ]

    def dim(self, buf: Val, axis: int) -> Val:
        """The size of ``buf`` along ``axis`` (``memref.dim``, or a constant if static)."""
        b = self._memref(buf, "dim")
        if not isinstance(axis, int) or not 0 <= axis < b.type.rank:
            raise self.error(f"dim of {self._describe(b)}: axis {axis!r} is out of range")
        size = b.type.shape[axis]
        if size != ir.ShapedType.get_dynamic_size():
            return self.index(size)
        c = self.index(axis)
        with self._loc():
            return Val(memref.dim(b, c))

    def load(self, buf: Val, indices: Sequence[Operand]) -> Val:
        """``memref.load buf[indices]``: one element."""
        b = self._memref(buf, "load from")
        idx = self._indices(b, indices, "load from")
        with self._loc():
            return Val(memref.load(b, idx))

    def store(self, value: Operand, buf: Val, indices: Sequence[Operand]) -> None:
        """``memref.store value, buf[indices]``."""
        b = self._memref(buf, "store into")
        elem = b.type.element_type
        v = self._as_val(value, elem, f"store into {self._describe(b)}")
        if v.type != elem:
            raise self.error(
                f"store into {self._describe(b)}: the value is {v.type} but the memref holds {elem}"
            )
        idx = self._indices(b, indices, "store into")
        with self._loc():
            memref.store(v, b, idx)

    def _vector_access(self, b: Val, width: int, what: str) -> tuple[ir.VectorType, int]:
        elem = b.type.element_type
        width = self._width(width)
        last = b.type.shape[-1] if b.type.rank else None
        if b.type.rank == 0:
            raise self.error(f"{what} {self._describe(b)}: a rank-0 memref has no vectors")
        if last != ir.ShapedType.get_dynamic_size() and last % width:
            raise self.error(
                f"{what} {self._describe(b)}: the last dimension {last} is not a multiple "
                f"of the vector width {width}"
            )
        bits = elem.width if hasattr(elem, "width") else 64
        # The natural alignment of the vector, at most 16 bytes (the widest
        # PTX access): this is what turns the access into one ld/st.v4.
        return ir.VectorType.get([width], elem), min(width * bits // 8, 16)

    def load_vec(self, buf: Val, indices: Sequence[Operand], width: int = 4) -> Val:
        """``vector.load``: ``width`` consecutive elements along the last axis.

        Promises alignment to ``min(width * itemsize, 16)`` bytes: the last
        index must be a multiple of ``width`` and rows must keep that
        alignment (the buffer's base address is 16-byte aligned).
        """
        b = self._memref(buf, "load_vec from")
        vt, align = self._vector_access(b, width, "load_vec from")
        idx = self._indices(b, indices, "load_vec from")
        with self._loc():
            return Val(vector.load(vt, b, idx, alignment=align))

    def store_vec(self, value: Val, buf: Val, indices: Sequence[Operand]) -> None:
        """``vector.store`` of a 1-D vector along the last axis (see :meth:`load_vec`)."""
        b = self._memref(buf, "store_vec into")
        v = self._as_val(value, None, f"store_vec into {self._describe(b)}")
        if not isinstance(v.type, ir.VectorType) or v.type.rank != 1:
            raise self.error(
                f"store_vec into {self._describe(b)}: the value must be a 1-D vector, got {v.type}"
            )
        vt, align = self._vector_access(b, v.type.shape[0], "store_vec into")
        if vt != v.type:
            raise self.error(
                f"store_vec into {self._describe(b)}: the value is {v.type} but the memref "
                f"holds {b.type.element_type}"
            )
        idx = self._indices(b, indices, "store_vec into")
        with self._loc():
            vector.store(v, b, idx, alignment=align)

    def broadcast(self, value: Operand, width: int) -> Val:
        """``vector.broadcast`` of a scalar to ``vector<width x type>``."""
        v = self._as_val(value, None, "broadcast")
        if isinstance(v.type, ir.VectorType):
            raise self.error(f"broadcast needs a scalar, got {v.type}")
        return self._broadcast(v, ir.VectorType.get([self._width(width)], v.type))

    def extract(self, vec: Val, position: int) -> Val:
        """``vector.extract`` of lane ``position`` (a Python int)."""
        v = self._as_val(vec, None, "extract")
        if not isinstance(v.type, ir.VectorType) or v.type.rank != 1:
            raise self.error(f"extract needs a 1-D vector, got {v.type}")
        if not isinstance(position, int) or not 0 <= position < v.type.shape[0]:
            raise self.error(f"extract position {position!r} is out of range for {v.type}")
        with self._loc():
            return Val(vector.extract(v, [], [position]))

    def vector_reduce(self, vec: Val, kind: str = "add") -> Val:
        """``vector.reduction <kind>`` of a 1-D vector into a scalar."""
        v = self._as_val(vec, None, "vector_reduce")
        if not isinstance(v.type, ir.VectorType) or v.type.rank != 1:
            raise self.error(f"vector_reduce needs a 1-D vector, got {v.type}")
        self._kind(kind, "vector_reduce")
        elem = v.type.element_type
        with self._loc():
            return Val(vector.reduction(elem, _VECTOR_KINDS[kind, _is_float(elem)], v))

    def vector_sum(self, vec: Val) -> Val:
        """``vector.reduction <add>``."""
        return self.vector_reduce(vec, "add")

    def shared(self, shape: Sequence[int], element: Any = "f32", *, name: str | None = None) -> Val:
        """A workgroup (shared) memory buffer of static ``shape``.

        A ``memref.global`` in ``#gpu.address_space<workgroup>`` named
        ``@<tile>__<name>``, read with ``memref.get_global``. Its contents are
        undefined on entry (not zeroed, and possibly left by an earlier call
        of this tile on the same CTA): write before reading, with barriers.
        """
        dims = list(shape)
        if not dims or any(not isinstance(d, int) or isinstance(d, bool) or d < 1 for d in dims):
            raise self.error(f"shared: shape {shape!r} must hold positive ints")
        nbytes = _math.prod(dims) * _element_bytes(self._type(element))
        if nbytes > SHARED_BYTES:
            raise self.error(
                f"shared: shape {shape!r} of {element} takes {nbytes} bytes; a CTA has at most "
                f"{SHARED_BYTES} bytes of shared memory"
            )
        if name is None:
            name = f"smem{len(self._globals)}"
        symbol = f"{self.name}__{name}"
        if not _SYMBOL.match(symbol):
            raise self.error(f"shared: {name!r} does not make a valid symbol name")
        if symbol in self._globals:
            raise self.error(f"shared: a buffer named {name!r} already exists")
        space = ir.Attribute.parse("#gpu.address_space<workgroup>")
        mt = ir.MemRefType.get(dims, self._type(element), memory_space=space)
        with ir.InsertionPoint.at_block_begin(self.module.body), ir.Location.unknown():
            memref.global_(symbol, ir.TypeAttr.get(mt), sym_visibility="private", alignment=16)
        self._globals.add(symbol)
        value = self._hoist(("shared", symbol), lambda: memref.get_global(mt, symbol))
        value.name = symbol
        return value

    # -- reductions -------------------------------------------------------------

    def _kind(self, kind: Any, what: str) -> None:
        if kind not in _REDUCTIONS:
            raise self.error(f"{what}: kind must be one of {', '.join(_REDUCTIONS)}, got {kind!r}")

    def _combine(self, kind: str, a: Val, b: Val) -> Val:
        return self._arith(kind, a, b)

    def _identity(self, kind: str, t: ir.Type) -> Val:
        if kind == "add":
            return self.const(0, t)
        if _is_float(t):
            return self.const(float("-inf") if kind == "max" else float("inf"), t)
        return self.const(0 if kind == "max" else -1, t)  # unsigned: -1 is all ones

    def _shuffle_operand(self, v: Any, what: str) -> Val:
        x = self._as_val(v, None, what)
        t = x.type
        if not (isinstance(t, (ir.F32Type, ir.IntegerType)) and getattr(t, "width", 32) == 32):
            raise self.error(f"{what} reduces f32 or i32 values, got {t}")
        return x

    def warp_reduce(self, value: Operand, kind: str = "add", *, lanes: int = WARP_SIZE) -> Val:
        """Reduce over each aligned group of ``lanes`` lanes; every lane gets the result.

        A ``gpu.shuffle xor`` butterfly (offsets ``lanes/2 .. 1``) on f32 or
        i32. All 32 lanes of the warp must call it (warp-uniform control flow).
        """
        x = self._shuffle_operand(value, "warp_reduce")
        self._kind(kind, "warp_reduce")
        if lanes not in (1, 2, 4, 8, 16, 32):
            raise self.error(f"warp_reduce: lanes must be a power of two <= 32, got {lanes!r}")
        width = self.i32(WARP_SIZE)
        offset = lanes // 2
        while offset:
            off = self.i32(offset)
            with self._loc():
                other = Val(gpu.shuffle(x, off, width, gpu.ShuffleMode.XOR)[0])
            x = self._combine(kind, x, other)
            offset //= 2
        return x

    def cta_reduce(self, value: Operand, kind: str = "add") -> Val:
        """Reduce over the whole CTA; every thread gets the result.

        Each warp reduces with shuffles, lane 0 of every warp writes its
        partial to workgroup memory, then every warp reads all partials and
        reduces them the same way, so the result needs no broadcast step.
        Two barriers: one before the write (an earlier ``cta_reduce`` of
        this CTA may still be reading the buffer) and one after. Every
        thread of the CTA must call it.
        """
        x = self._shuffle_operand(value, "cta_reduce")
        self._kind(kind, "cta_reduce")
        part = self.warp_reduce(x, kind)
        warps = self.num_warps
        if warps == 1:
            return part
        t = x.type
        key = f"cta_reduce_{t}"
        buf = self._shared.get(key)
        if buf is None:
            buf = self._shared[key] = self.shared([warps], t, name=key)
        lane, warp = self.lane_id(), self.warp_id()
        self.barrier()
        # `warp < warps` keeps a kernel whose CTA is larger than this tile's
        # block_size inside the buffer; LLVM folds it away otherwise.
        with self.if_((lane == 0) & (warp < warps)):
            self.store(part, buf, [warp])
        self.barrier()
        if warps & (warps - 1) == 0:
            # Each group of `warps` lanes holds all partials: reduce within it.
            mine = self.load(buf, [lane % warps])
            return self.warp_reduce(mine, kind, lanes=warps)
        mine = self.select(lane < warps, self.load(buf, [lane % warps]), self._identity(kind, t))
        return self.warp_reduce(mine, kind)


# ----------------------------------------------------------------------------
# The decorator
# ----------------------------------------------------------------------------


def _param_names(body: Callable[..., Any], name: str, count: int, what: str) -> list[str]:
    try:
        sig = inspect.signature(body)
    except (TypeError, ValueError):
        return [f"arg{k}" for k in range(count)]
    params = list(sig.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    variadic = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if len(required) > count or (len(positional) < count and not variadic):
        raise GraphError(
            f"tile '{name}': the body takes {len(positional)} positional parameter(s) but "
            f"is called with {count}: {what}"
        )
    names = [p.name for p in positional[:count]]
    return names + [f"arg{k}" for k in range(len(names), count)]


def _arg_type(spec: Any, name: str, param: str, position: int) -> ir.Type:
    text = spec.mlir if isinstance(spec, MemRefSpec) else spec
    if not isinstance(text, str):
        raise GraphError(
            f"tile '{name}': argument '{param}' (args[{position}]) must be a memref_type(...) "
            f"or MLIR memref type text, got {spec!r}"
        )
    try:
        t = ir.Type.parse(text)
    except ir.MLIRError as e:
        raise GraphError(
            f"tile '{name}': argument '{param}' (args[{position}]): cannot parse type "
            f"{text!r}: {_diagnostics(e)}"
        ) from None
    if not isinstance(t, ir.MemRefType):
        raise GraphError(
            f"tile '{name}': argument '{param}' (args[{position}]) must be a memref, got {t}"
        )
    return t


def _diagnostics(error: Any) -> str:
    lines = []
    for d in getattr(error, "error_diagnostics", []):
        lines.append(f"{d.location}: {d.message}")
        lines.extend(f"  note: {n.location}: {n.message}" for n in d.notes)
    return "\n".join(lines) or str(error)


def build_tile(
    body: Callable[..., Any],
    *,
    grid_rank: int,
    args: Sequence[MemRefSpec | str],
    block_size: int = 256,
    reference: Callable[..., Any] | None = None,
    name: str | None = None,
) -> DeviceFunction:
    """Build ``func.func @name`` by running ``body(t, *coords, *buffers)``; see :func:`tile`."""
    name = name if name is not None else getattr(body, "__name__", None)
    if not isinstance(name, str) or not _SYMBOL.match(name):
        raise GraphError(f"tile {name!r}: the name must be a valid MLIR symbol")
    if not isinstance(grid_rank, int) or isinstance(grid_rank, bool) or grid_rank < 0:
        raise GraphError(f"tile '{name}': grid_rank must be a non-negative int, got {grid_rank!r}")
    if isinstance(args, (str, MemRefSpec)):
        args = [args]
    args = list(args)
    # DeviceFunction checks it too, but only after the body ran.
    if (
        not isinstance(block_size, int)
        or isinstance(block_size, bool)
        or not WARP_SIZE <= block_size <= 1024
        or block_size % WARP_SIZE
    ):
        raise GraphError(
            f"tile '{name}': block_size must be a multiple of 32 in [32, 1024], got {block_size!r}"
        )
    count = grid_rank + len(args)
    names = _param_names(
        body,
        name,
        count + 1,
        f"(t, {grid_rank} grid coordinate(s), {len(args)} buffer(s))",
    )[1:]
    t = TileBuilder(name, block_size, grid_rank)
    with ir.Context() as ctx, ir.Location.unknown():
        # Diagnostics become exceptions (ir.MLIRError); never print them.
        handler = ctx.attach_diagnostic_handler(lambda d: True)
        try:
            index = ir.IndexType.get()
            types = [index] * grid_rank + [
                _arg_type(a, name, names[grid_rank + k], k) for k, a in enumerate(args)
            ]
            t.module = ir.Module.create()
            with ir.InsertionPoint(t.module.body):
                fn = func.FuncOp(name, (types, []))
            t._entry = fn.add_entry_block(arg_locs=[ir.Location.name(n) for n in names])
            values = [Val(a, n) for a, n in zip(fn.arguments, names, strict=True)]
            top = _Scope(t, t._entry, f"the body of tile '{name}'")
            _ACTIVE.stack.append(t)
            top.open()
            try:
                result = body(t, *values)
                if result is not None:
                    raise t.error("the body must not return a value; write outputs to its buffers")
                top.check_innermost()
                func.return_([])
            except ir.MLIRError as e:
                raise t.error(f"building the body failed:\n{_diagnostics(e)}") from None
            finally:
                while t._scopes:
                    t._scopes.pop()._ip.__exit__(None, None, None)
                _ACTIVE.stack.pop()
            try:
                t.module.operation.verify()
            except ir.MLIRError as e:
                raise t.error(f"the generated MLIR does not verify:\n{_diagnostics(e)}") from None
            # Top-level ops one by one: no module wrapper to unwrap, and the
            # arguments print under their Python names.
            source = "\n".join(
                op.operation.get_asm(use_name_loc_as_prefix=True) for op in t.module.body.operations
            )
        finally:
            handler.detach()
    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def tile(
    *,
    grid_rank: int,
    args: Sequence[MemRefSpec | str],
    block_size: int = 256,
    reference: Callable[..., Any] | None = None,
    name: str | None = None,
) -> Callable[[Callable[..., Any]], DeviceFunction]:
    """Decorator: turn ``body(t, *coords, *buffers)`` into an :class:`etc.DeviceFunction`.

    ``grid_rank`` is the number of ``index`` grid coordinates, ``args`` the
    buffer types (:func:`memref_type` or memref type text), ``block_size``
    the CTA size the body is written for, ``reference`` the numpy version
    for the simulator and ``name`` the symbol (default: the body's name).
    The body runs once, at decoration time, to emit the IR.
    """

    def decorate(body: Callable[..., Any]) -> DeviceFunction:
        return build_tile(
            body,
            grid_rank=grid_rank,
            args=args,
            block_size=block_size,
            reference=reference,
            name=name,
        )

    return decorate

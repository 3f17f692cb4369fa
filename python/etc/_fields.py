"""Declared types, checked: the model configurations' fields and the tile
builders' arguments.

A configuration dataclass (``LlamaConfig``, ``MoEConfig``,
``CollectiveConfig``) states each field's type. :func:`check_config`
refuses a value of another type with a :class:`etc.GraphError` naming the
field, the type and the value: the scalar fields (bool, int, str) first, so
that no check takes a str for a set flag; the tuples after the class's own
checks, whose messages say what a value means (``(batch, span) pairs``).
When the own checks trip over a tuple field of the wrong type (an int where
they iterate pairs) with a bare ``TypeError``, that field is named
instead.

:func:`checked_arguments` does the same for a tile builder's arguments
(``layer_gemm(block_size=None)`` used to fail deep in its arithmetic).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from .errors import EtcError, GraphError


def is_int(value: Any, low: int | None = None) -> bool:
    """``value`` is an int and not a bool (which Python counts as one), and
    at least ``low`` when given: what an argument that counts things takes."""
    return isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)


def _matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` has type ``hint`` (int, float, bool, str, None, Any,
    unions, ``tuple[X, ...]`` and ``tuple[X, Y]``). A bool is not an int
    here, and an int is a float."""
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(_matches, value, args))
    raise TypeError(f"no check for the field type {hint!r}")  # a new annotation: extend this


def _checkable(hint: Any) -> bool:
    """Whether :func:`_matches` knows ``hint`` (a tile builder's arguments
    also take classes, lists and callables, which are left to the builder)."""
    if hint is Any or hint in _NAMED or hint is None:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType, tuple):
        return all(a is Ellipsis or _checkable(a) for a in args)
    return False


_NAMED = {bool: "a bool", int: "an int", float: "a number", str: "a str", type(None): "None"}


def _spelled(hint: Any) -> str:
    """``hint`` in words (``a bool or None``) or, for a tuple, as the source
    spells it (``tuple[tuple[str, int], ...]``)."""
    if hint in _NAMED:
        return _NAMED[hint]
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(map(repr, typing.get_args(hint)))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_spelled(a) for a in typing.get_args(hint))
    return str(hint).replace("typing.", "").replace("NoneType", "None")


def _scalar(hint: Any) -> bool:
    """Whether ``hint`` is a scalar type or a union of them (no tuple)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return all(map(_scalar, typing.get_args(hint)))
    return hint in _NAMED or hint is Any


def check_field_types(config: Any, scalars_only: bool = False) -> None:
    """Raises GraphError naming the first field of the dataclass instance
    ``config`` whose value is not of its declared type (``scalars_only``:
    among the fields of scalar types)."""
    cls = type(config)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = getattr(config, f.name)
        if scalars_only and not _scalar(hints[f.name]):
            continue
        if not _matches(value, hints[f.name]):
            raise GraphError(
                f"{cls.__name__}: {f.name} must be {_spelled(hints[f.name])}, got {value!r}"
            )


def check_config(config: Any, checks: Callable[[], None]) -> None:
    """Checks the fields of scalar types (a str where a bool belongs would
    pass as set), runs ``checks`` (the class's own), then checks the tuples'
    types; a failure of ``checks`` other than an :class:`etc.EtcError`
    becomes the GraphError naming the field of the wrong type, if there is
    one."""
    check_field_types(config, scalars_only=True)
    try:
        checks()
    except EtcError:
        raise
    except Exception:
        try:
            check_field_types(config)
        except GraphError as named:
            raise named from None
        raise
    check_field_types(config)


def checked_arguments(builder: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates a tile builder: each argument whose annotation
    :func:`_matches` knows must have that type, or GraphError names the tile
    (its ``name`` argument, else the builder), the parameter and the value.
    A numpy integer counts as an int, and reaches the builder as one."""
    signature = inspect.signature(builder)
    hints = {
        name: hint
        for name, hint in typing.get_type_hints(builder).items()
        if name != "return" and hint is not Any and _checkable(hint)
    }

    named = signature.parameters.get("name")
    default_name = named.default if named is not None else builder.__name__

    @functools.wraps(builder)
    def check(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return builder(*args, **kwargs)  # Python names the wrong call itself
        for name, value in bound.arguments.items():
            hint = hints.get(name)
            if hint is None:
                continue
            if _matches(_plain(value), hint):
                bound.arguments[name] = _plain(value)  # the builder's own checks see an int
                continue
            tile = bound.arguments.get("name", default_name)
            tile = tile if isinstance(tile, str) else builder.__name__
            raise GraphError(f"tile '{tile}': {name} must be {_spelled(hint)}, got {value!r}")
        return builder(*bound.args, **bound.kwargs)

    return check


def _plain(value: Any) -> Any:
    """``value`` with a numpy integer as the int it holds."""
    import numpy as np

    if isinstance(value, np.integer):
        return int(value)
    return value

"""The model configurations refuse a field of the wrong type by name
(etc._fields), where their own checks would have passed it or
tripped over it with a bare TypeError."""

from __future__ import annotations

import dataclasses
import typing

import pytest

import etc
from etc._fields import _matches
from etc.models import collective, llama, moe

CONFIGS = [llama.LlamaConfig, moe.MoEConfig, collective.CollectiveConfig]


class _Odd:
    """A value of no declared type."""

    def __repr__(self) -> str:
        return "<odd>"


def _fields(cls):
    hints = typing.get_type_hints(cls)
    return [(cls, f.name, hints[f.name]) for f in dataclasses.fields(cls)]


@pytest.mark.parametrize(
    ("cls", "name", "hint"),
    [x for cls in CONFIGS for x in _fields(cls)],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_every_field_refuses_a_value_of_no_declared_type(cls, name, hint) -> None:
    if hint is typing.Any:
        pytest.skip("any value is of its type")
    # The class's own check may word it (``attn_tile '<odd>' is not one of``);
    # either way the message names the field and the value.
    with pytest.raises(etc.GraphError, match=rf"^{cls.__name__}: .*{name}\b.*<odd>"):
        cls(**{name: _Odd()})


@pytest.mark.parametrize(
    ("value", "hint", "ok"),
    [
        (3, int, True),
        (True, int, False),  # a bool is not a count
        (True, bool | int, True),
        (3, float, True),
        (3.5, int, False),
        (None, int | None, True),
        ((), tuple[int, ...], True),
        ((1, "a"), tuple[int, ...], False),
        ((("a", 1),), tuple[tuple[str, int], ...], True),
        ((("a",),), tuple[tuple[str, int], ...], False),
        ((1.0, 2, 3.0, 4), tuple[float, float, float, int], True),
        ((1.0, 2, 3.0), tuple[float, float, float, int], False),
        ([1], tuple[int, ...], False),  # a list is not a tuple: configs are hashable
        ("x", typing.Any, True),
    ],
)
def test_the_type_check(value, hint, ok) -> None:
    assert _matches(value, hint) is ok


def test_the_presets_pass_their_own_types() -> None:
    for preset in (llama.TINY, llama.LLAMA_3_2_1B, llama.LlamaConfig(), moe.MoEConfig()):
        assert dataclasses.replace(preset) == preset


def test_a_check_tripping_over_a_wrong_type_names_the_field() -> None:
    # LlamaConfig's own checks iterate k_splits' pairs: an int there used to
    # raise "TypeError: 'int' object is not iterable".
    with pytest.raises(
        etc.GraphError,
        match=r"^LlamaConfig: k_splits must be tuple\[tuple\[str, int\], \.\.\.\], got 0\b",
    ):
        llama.LlamaConfig(k_splits=0)


def test_a_wrong_type_the_own_checks_pass_is_refused_after_them() -> None:
    with pytest.raises(
        etc.GraphError, match=r"^LlamaConfig: fuse_combine must be a bool, got 'x'$"
    ):
        llama.LlamaConfig(fuse_combine="x")


def test_the_own_checks_word_a_value_they_understand() -> None:
    with pytest.raises(etc.GraphError, match=r"attn_small_spans=.* must be \(batch, span\)"):
        llama.LlamaConfig(attn_small_spans=[(2, 3)])


# -- tile builders (etc._fields.checked_arguments) ----------------------------


def _builders():
    """Every public tile builder: a function of an etc.tiles module that
    returns a DeviceFunction."""
    import importlib
    import inspect
    import pkgutil

    import etc.tiles as T
    from etc.device import DeviceFunction

    for info in pkgutil.iter_modules(T.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"etc.tiles.{info.name}")
        for name, fn in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(fn):
                continue
            if getattr(fn, "__module__", None) != module.__name__:
                continue
            if typing.get_type_hints(inspect.unwrap(fn)).get("return") is DeviceFunction:
                yield f"{info.name}.{name}", fn


def test_every_tile_builder_checks_its_arguments() -> None:
    builders = dict(_builders())
    assert len(builders) > 40
    unchecked = [name for name, fn in builders.items() if not hasattr(fn, "__wrapped__")]
    assert not unchecked, f"decorate with etc._fields.checked_arguments: {unchecked}"


def test_a_tile_argument_of_the_wrong_type_is_named() -> None:
    from etc.tiles import gemm, gemm_tc

    # Each failed deep inside the builder: a TypeError or a ZeroDivisionError.
    with pytest.raises(
        etc.GraphError, match=r"^tile 'layer_gemm': block_size must be an int, got None$"
    ):
        gemm.layer_gemm(64, 64, 128, 256, layers=2, core="tma", block_size=None)
    with pytest.raises(
        etc.GraphError, match=r"^tile 'gemm_tc': warps must be tuple\[int, int\] or None, got 3$"
    ):
        gemm_tc.gemm(64, 64, 96, warps=3)
    with pytest.raises(
        etc.GraphError, match=r"^tile 'mine': l2_evict_first must be a bool or 'body', got 'all'$"
    ):
        gemm.layer_gemm(16, 64, 128, 256, layers=2, name="mine", l2_evict_first="all")


def test_numpy_integers_pass_as_ints() -> None:
    import numpy as np

    from etc.tiles import rowsum

    assert rowsum.partial_sum(np.int64(1), 4, np.int32(256)).name == "partial_sum"

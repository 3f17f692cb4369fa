"""DeviceFunction.from_mlir: signature reading and errors that name the function."""

from __future__ import annotations

import pytest

import etc
from etc import GraphError

SOURCE = """
// helpers and comments are kept; func.func @commented(%x: f32) is not a function
func.func private @helper(%x: f32) -> f32 {
  return %x : f32
}
func.func @tile(%i: index, %j: index,
                %A: memref<?x256xf32> {llvm.noalias},
                %B : memref<4xbf16>, %C: memref<?x?xf32, strided<[?, 1], offset: ?>> loc("c"))
    attributes {etensor.device} {
  return
}
"""


def test_signature_is_read_textually():
    fn = etc.DeviceFunction.from_mlir(SOURCE, "tile", block_size=128)
    assert fn.params == (
        "index",
        "index",
        "memref<?x256xf32>",
        "memref<4xbf16>",
        "memref<?x?xf32, strided<[?, 1], offset: ?>>",
    )
    assert fn.num_coords == 2 and fn.block_size == 128 and fn.reference is None
    assert set(fn.defines) == {"helper", "tile"}
    assert "func.func private @helper" in fn.source


def test_module_wrapper_is_stripped():
    fn = etc.DeviceFunction.from_mlir(
        'module attributes {x = 1} {\n func.func @"odd name"(%i: index) {\n return\n }\n}',
        "odd name",
    )
    assert fn.params == ("index",)
    assert not fn.source.lstrip().startswith("module")


def test_errors_name_the_function():
    with pytest.raises(
        GraphError,
        match=r"device function 'nope': no 'func.func @nope' in "
        r"the MLIR source \(functions found: @helper, @tile\)",
    ):
        etc.DeviceFunction.from_mlir(SOURCE, "nope")
    with pytest.raises(GraphError, match="device function 'helper' must not return values"):
        etc.DeviceFunction.from_mlir(SOURCE, "helper")
    with pytest.raises(GraphError, match="device function 'f' has no body"):
        etc.DeviceFunction.from_mlir("func.func private @f(%i: index)", "f")
    with pytest.raises(GraphError, match="device function 'f': cannot read argument"):
        etc.DeviceFunction.from_mlir("func.func @f(index) {\n return\n}", "f")
    with pytest.raises(
        GraphError, match="device function 'tile': block_size must be a multiple of 32"
    ):
        etc.DeviceFunction.from_mlir(SOURCE, "tile", block_size=100)
    with pytest.raises(GraphError, match="device function 'tile': reference must be callable"):
        etc.DeviceFunction.from_mlir(SOURCE, "tile", reference=3)
    # A str became the tuple of its characters: params ('i', 'n', 'd', 'e', 'x').
    with pytest.raises(
        GraphError, match="'f': params must be a sequence of MLIR types, got 'index'"
    ):
        etc.DeviceFunction("f", SOURCE, "index")
    with pytest.raises(GraphError, match="'f': defines must be a sequence of symbols, got 'f'"):
        etc.DeviceFunction("f", SOURCE, ("index",), defines="f")

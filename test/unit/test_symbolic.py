"""Symbol expressions: canonical forms, evaluation, printing."""

from __future__ import annotations

import pytest

import etc
from etc import GraphError


@pytest.fixture
def nm():
    g = etc.Graph("g")
    return g.symbol("n"), g.symbol("m")


def test_canonical_equality(nm):
    n, m = nm
    assert n * 4 == 4 * n == n + n + n + n
    assert (n + 1) * (n + 1) == n**2 + 2 * n + 1
    assert (4 * n + 7) // 4 == n + 1
    assert (4 * n + 7) % 4 == 3
    assert (2 * n) // 2 == n
    assert n - n == 0 and (n - n).as_int() == 0
    assert n * m == m * n
    assert n != m and n + 1 != n
    assert hash(n * 4) == hash(4 * n)
    assert {n: 1}[n * 1] == 1  # symbols and equal expressions hash alike


def test_evaluate_and_str(nm):
    n, m = nm
    blocks = (n + 7) // 8
    assert [blocks.evaluate({"n": v}) for v in (0, 1, 8, 9)] == [0, 1, 1, 2]
    assert ((n + 7) % 8).evaluate({"n": 3}) == 2
    assert (n * m - 3).evaluate({"n": 2, "m": 5}) == 7
    assert str(4 * n + 1) == "4*n + 1"
    assert str(-n + 2) == "-n + 2"
    assert str(blocks) == "(n + 7)//8"
    assert str(8 * blocks) == "8*((n + 7)//8)"
    assert str(n * m) == "m*n" or str(n * m) == "n*m"
    # str() is Python over the symbol names (manifests rely on it).
    for expr in (4 * n + 1, blocks * m, (n + 1) ** 2, (n + 3) % 4):
        assert eval(str(expr), {"n": 5, "m": 3}) == expr.evaluate({"n": 5, "m": 3})
    with pytest.raises(GraphError, match="no value for symbol 'm'"):
        (n + m).evaluate({"n": 1})


def test_degree(nm):
    n, m = nm
    assert (n + 3).degree == 1 and (n * m).degree == 2 and etc.SymExpr.constant(3).degree == 0


def test_unsupported_operations(nm):
    n, m = nm
    with pytest.raises(GraphError, match="only division by a constant"):
        n // m
    with pytest.raises(GraphError, match="the divisor must be a positive int"):
        n // 0
    with pytest.raises(GraphError, match="exponent must be a non-negative int"):
        n**-1
    with pytest.raises(GraphError, match="truth value of 'n' is not known before launch"):
        bool(n)
    with pytest.raises(TypeError):
        n + 1.5

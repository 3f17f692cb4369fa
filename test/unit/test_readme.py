"""The README's example runs as written (its GPU lines are comments)."""

from __future__ import annotations

import re

import pytest
from unit_helpers import REPO


def test_readme_example_runs():
    pytest.importorskip("etc._mlir_libs._etcDialects", reason="the MLIR bindings are not built")
    text = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert namespace["artifact"].manifest["kernel"] == "splitk"

"""Shared fixtures of the pure-Python unit tests (no GPU, no compiled extension)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

if importlib.util.find_spec("etc") is None:
    sys.path.insert(0, str(REPO / "python"))

from unit_helpers import find_etc_opt  # noqa: E402  (needs the path above)


@pytest.fixture
def etc_opt() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run etc-opt on MLIR text; skips the test when etc-opt is not built."""
    tool = find_etc_opt()
    if tool is None:
        pytest.skip("etc-opt not found (set ETC_OPT or build ./build/bin/etc-opt)")

    def run(text: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [tool, "-", *flags], input=text, capture_output=True, text=True, timeout=120
        )

    return run

"""GPU tests: marked ``gpu`` and skipped unless a CUDA device is usable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import etc.runtime  # noqa: F401
except ImportError:  # running from a source checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


def _cuda_device_count() -> int:
    try:
        from etc.runtime import driver
    except ImportError:
        return 0
    return driver.device_count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and _cuda_device_count() == 0:
        skip = pytest.mark.skip(reason="no CUDA device (or no cuda-python)")
        for item in gpu_items:
            item.add_marker(skip)

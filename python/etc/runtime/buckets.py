"""Launch the kernel of a bucketed artifact (``etc.compile_buckets``) whose
range holds a symbol's value: e.g. a decoder compiled once for batches of
1-16 and once for more, launched with the same buffers."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from etc.errors import LaunchError

#: The format of ``buckets.json`` (``etc.buckets`` writes it).
FORMAT = "etc-buckets/1"


class BucketedKernel:
    """Kernels of one graph family: ``kernels[i]`` runs launches whose
    ``symbol`` is at most ``bounds[i]`` (the last bound None: no limit).
    Launch, check and trace like a :class:`etc.runtime.Kernel`."""

    def __init__(self, symbol: str, bounds: list[int | None], kernels: list[Any]) -> None:
        self.symbol = symbol
        self.bounds = bounds
        self.kernels = kernels
        self._launched: list[Any] = []  # kernels launched since the last check

    def __repr__(self) -> str:
        ranges, low = [], 1
        for bound in self.bounds:
            ranges.append(f"{self.symbol}={low}..{'' if bound is None else bound}")
            low = (bound or 0) + 1
        return f"<etc.runtime.BucketedKernel {', '.join(ranges)}: {self.kernels}>"

    def kernel_for(self, symbols: Mapping[str, int]) -> Any:
        """The kernel whose range holds ``symbols[symbol]``."""
        if self.symbol not in symbols:
            raise LaunchError(
                f"bucketed kernel: symbol '{self.symbol}' picks the kernel; give its value"
            )
        value = symbols[self.symbol]
        for bound, kernel in zip(self.bounds, self.kernels, strict=True):
            if bound is None or value <= bound:
                return kernel
        raise AssertionError("the last bucket has no bound")

    def launch(
        self, tensors: Mapping[str, Any], symbols: Mapping[str, int] | None = None, **kwargs: Any
    ) -> None:
        """``Kernel.launch`` on :meth:`kernel_for` ``(symbols)``."""
        kernel = self.kernel_for(symbols or {})
        kernel.launch(tensors, symbols, **kwargs)
        if kernel in self._launched:
            self._launched.remove(kernel)
        self._launched.append(kernel)

    def check(self, timeout: float | None = None) -> None:
        """``Kernel.check`` on every kernel launched since the last check."""
        launched, self._launched = self._launched, []
        for kernel in launched:
            kernel.check(timeout)

    def trace(self) -> Any:
        """The timeline of the latest launch (``Kernel.trace``)."""
        if not self._launched:
            raise LaunchError("bucketed kernel: no launch to trace yet")
        return self._launched[-1].trace()


def load_buckets(directory: str | Path, load_one: Any, **kwargs: Any) -> BucketedKernel:
    """Load ``directory/buckets.json`` and every bucket's artifact with
    ``load_one(path, **kwargs)`` (all of them now: no launch loads a module)."""
    path = Path(directory) / "buckets.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise LaunchError(f"{path}: cannot read the bucket table: {e}") from None
    if table.get("format") != FORMAT:
        raise LaunchError(f"{path}: format {table.get('format')!r}, expected {FORMAT!r}")
    entries = table.get("buckets") or []
    bounds = [e.get("max") for e in entries]
    if not entries or bounds[-1] is not None or any(b is None for b in bounds[:-1]):
        raise LaunchError(f"{path}: buckets need increasing bounds and a last one without")
    kernels = [load_one(Path(directory) / e["artifact"], **kwargs) for e in entries]
    return BucketedKernel(table["symbol"], bounds, kernels)

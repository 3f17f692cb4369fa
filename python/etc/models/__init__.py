"""Whole layers built from ETC tiles: graphs, numpy references and inputs.

:mod:`etc.models.moe` is the Qwen3-30B-A3B mixture-of-experts layer
(``docs/moe.md``). Importing it needs only numpy; building the graph needs
the tensor-core tiles of :mod:`etc.tiles.gemm` (or tiles passed in).
"""

from . import moe
from .moe import MoEConfig, build_moe_graph, reference_moe

__all__ = ["moe", "MoEConfig", "build_moe_graph", "reference_moe"]

"""ETC runtime: load a compiled artifact and launch its megakernel from Python.

Pure Python over ``cuda.bindings.driver`` and numpy (torch optional): importing it needs
neither the compiled MLIR extension nor torch, so artifacts compiled on a CPU machine run
on a GPU machine that has only cuda-python, numpy and torch::

    kernel = etc.runtime.load("artifacts/splitk")
    kernel.launch({"A": a, "B": b, "C": c}, {"n": 64})

``etc.runtime.timing`` times launches with CUDA events, also without torch
(what ``etc bench`` uses).
"""

from etc.runtime.buckets import BucketedKernel
from etc.runtime.kernel import Kernel, load
from etc.runtime.manifest import Manifest, load_manifest, parse_manifest
from etc.runtime.queue import build_static_queue
from etc.runtime.ranks import ProcessRank, RankGroup, SymmetricBuffer, peer_table

__all__ = [
    "BucketedKernel",
    "Kernel",
    "Manifest",
    "ProcessRank",
    "RankGroup",
    "SymmetricBuffer",
    "build_static_queue",
    "load",
    "load_manifest",
    "parse_manifest",
    "peer_table",
]

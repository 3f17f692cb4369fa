"""Runs a build script with ``guarded_indptr`` never proven, for A/B timings:
``python bench/build_unguarded.py SCRIPT ARGS...`` compiles what ``SCRIPT ARGS``
would, with every triggered task on the general trigger path (the kernels
before bench/RESULTS.md item 86)."""

from __future__ import annotations

import runpy
import sys

import etc.graph

etc.graph.Graph.guarded_indptr = lambda self, task: False  # type: ignore[method-assign]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

"""Builds mock ``splitk/`` and ``broken/`` artifacts from splitk_mock.cu with nvcc.

    python test/gpu/mock/make_artifacts.py OUT_DIR [--no-cubin]
    ETC_ARTIFACTS=OUT_DIR pytest test/gpu

The manifests follow etc-artifact/1 as the compiler writes it, so the GPU runtime tests can
run before the compiler produces real artifacts (and to tell runtime bugs from compiler bugs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def manifest(wait_count: int, cubin: bool) -> dict:
    return {
        "format": "etc-artifact/1",
        "graph": "splitk",
        "kernel": "splitk",
        "module": "splitk_kernels",
        "schedule": "static",
        "target": "sm_90",
        "block_size": 256,
        "watchdog_polls": 20_000_000,
        "ptx": "kernel.ptx",
        "cubin": "kernel.cubin" if cubin else None,
        "sha256": {},
        "symbols": ["n"],
        "tensors": [
            {"name": "A", "shape": ["n", 256], "dtype": "f32"},
            {"name": "B", "shape": ["n", 4], "dtype": "f32"},
            {"name": "C", "shape": ["n"], "dtype": "f32"},
        ],
        "events": [{"name": "E", "shape": ["n"], "wait_count": wait_count}],
        "tasks": [
            {"index": 0, "name": "partial_sum", "grid": ["n", 4]},
            {"index": 1, "name": "final_sum", "grid": ["n"]},
        ],
        "params": [
            {"kind": "symbol", "name": "n"},
            {"kind": "tensor", "name": "A", "rank": 2},
            {"kind": "tensor", "name": "B", "rank": 2},
            {"kind": "tensor", "name": "C", "rank": 1},
            {"kind": "counters"},
            {"kind": "queue"},
            {"kind": "status"},
            {"kind": "max_polls"},
        ],
        "status_words": 8,
    }


def build(out: Path, cubin: bool = True) -> None:
    for name, wait_count in (("splitk", 4), ("broken", 5)):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        src = HERE / "splitk_mock.cu"
        flags = ["-arch=sm_90", "-O3", f"-DWAIT_COUNT={wait_count}"]
        subprocess.run(["nvcc", *flags, "-ptx", "-o", str(d / "kernel.ptx"), str(src)], check=True)
        m = manifest(wait_count, cubin)
        files = ["kernel.ptx"]
        if cubin:
            subprocess.run(
                ["nvcc", *flags, "-cubin", "-o", str(d / "kernel.cubin"), str(src)], check=True
            )
            files.append("kernel.cubin")
        m["sha256"] = {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in files}
        (d / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--no-cubin", action="store_true", help="PTX only (exercises the driver JIT)")
    a = p.parse_args()
    build(a.out, cubin=not a.no_cubin)

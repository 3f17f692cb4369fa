"""Launches the decode step a few times, for Nsight Compute (GPU machine).

    ncu --clock-control none -k regex:llama --launch-skip 2 --launch-count 1 \\
        --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
        python bench/decode_ncu.py DIR B L

``DIR``: an artifact of ``bench/decode_sweep.py --build`` (or ``bench/decode.py``),
``B`` sequences over a cache of ``L`` positions; random weights, four steps.
A fourth argument names the ``bench/decode_sweep.py`` variant the artifact
was built from (its configuration decides the buffers; default: the
default configuration).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import etc.runtime  # noqa: E402
from etc.models import llama as M  # noqa: E402


def main(artifact: str, B: int, L: int, variant: str | None = None) -> None:
    cfg = M.LLAMA_3_2_1B
    if variant is not None:
        from bench import decode_sweep

        cfg = decode_sweep.config(variant)
    bufs = M.torch_inputs(cfg, M.random_weights_torch(cfg), B, L, L + 1)
    kernel = etc.runtime.load(artifact)
    for _ in range(4):
        kernel.launch(bufs, {"B": B, "L": L, "S": L + 1}, sync=True)
    print("done")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5])

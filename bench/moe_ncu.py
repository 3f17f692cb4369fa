"""Launches one MoE megakernel a few times, for Nsight Compute (GPU machine).

    ncu --clock-control none -k regex:moe_dec --launch-skip 2 --launch-count 1 \
        --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
        python bench/moe_ncu.py dec_pf_gu32 DIR/fused_dec_pf_gu32_occ_static 1

Arguments: a ``bench/moe.py`` configuration, its artifact (built with
``bench/moe.py --build``), and T. Four launches on fresh random tokens.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import etc.runtime  # noqa: E402
from bench import moe as B  # noqa: E402
from etc.models import moe as M  # noqa: E402


def main(key: str, artifact: str, T: int) -> None:
    cfg = B.moe_config(key)
    bufs = M.torch_inputs(cfg, T, M.random_weights_torch(cfg, seed=0))
    kernel = etc.runtime.load(artifact)
    for i in range(4):
        bufs["X"] = M.random_tokens_torch(cfg, T, seed=i)
        kernel.launch(bufs, {"T": T}, sync=True)
    print("done")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

"""GEMM + Reduce-Scatter fused in one megakernel per GPU (the paper's Figures 6 and 11).

Rank r computes its partial product X_r @ W_r^T; each 128x128 block goes to the rank
that owns its rows as soon as it is done (peer stores into that rank's staging slot,
then a system-scope notification of the ranked event ``rs`` there), and the owner's
reduce tile for the block sums the R partials once they have all arrived. Checked
against float32 numpy (sum of the bf16-rounded partials, scattered by rows).

    python examples/gemm_reduce_scatter.py --simulate --ranks 4
    python examples/gemm_reduce_scatter.py --simulate --ranks 8 --schedule dynamic
    python examples/gemm_reduce_scatter.py --save-artifact /tmp/gemm_rs     # compile here
    python examples/gemm_reduce_scatter.py --artifact /tmp/gemm_rs --ranks 2  # 2 GPUs
"""

from __future__ import annotations

import sys

try:
    from examples._common import cli
    from examples._tensor_parallel import GEMM_REDUCE_SCATTER, main
except ImportError:  # run as a script
    from _common import cli
    from _tensor_parallel import GEMM_REDUCE_SCATTER, main

if __name__ == "__main__":
    sys.exit(cli(main, GEMM_REDUCE_SCATTER, __doc__.splitlines()[0]))

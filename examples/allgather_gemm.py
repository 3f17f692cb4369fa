"""All-Gather + GEMM fused in one megakernel per GPU (the paper's Figures 8 and 12).

Every rank holds S/R rows of A. Copy tiles push this rank's rows into every rank's
gathered buffer (peer stores, then a system-scope notification of the ranked event
``ag`` on that rank); a GEMM tile of chunk s waits only for the rows it reads, so the
GEMM on the rows already here runs while the others are in flight. Checked against
float32 numpy (concat(A) @ W_r^T).

    python examples/allgather_gemm.py --simulate --ranks 4
    python examples/allgather_gemm.py --simulate --ranks 8 --schedule dynamic
    python examples/allgather_gemm.py --save-artifact /tmp/ag_gemm     # compile here
    python examples/allgather_gemm.py --artifact /tmp/ag_gemm --ranks 2  # 2 GPUs
"""

from __future__ import annotations

import sys

try:
    from examples._common import cli
    from examples._tensor_parallel import ALLGATHER_GEMM, main
except ImportError:  # run as a script
    from _common import cli
    from _tensor_parallel import ALLGATHER_GEMM, main

if __name__ == "__main__":
    sys.exit(cli(main, ALLGATHER_GEMM, __doc__.splitlines()[0]))

"""Cooperative vs plain launch of the same MoE megakernels (GPU and eager time).

    BENCH_MOE_CONFIGS=dec_pf_gu32,dec_gu24_u1s3 BENCH_MOE_SIZES=1,16 \
        python bench/moe.py --build DIR          # CPU
    python bench/moe_launch_mode.py DIR          # GPU

The runtime launches every kernel with ``cuLaunchCooperativeKernel`` (all
CTAs co-resident, or an error). This swaps in ``cuLaunchKernel`` with the
same arguments, checks the output against float32 torch and times both
(``bench.timing``: medians of 30 x 20 calls, alternating the modes twice).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

import etc.runtime  # noqa: E402
import etc.runtime.kernel as K  # noqa: E402
from bench import moe as B  # noqa: E402
from bench.timing import gpu_timed, timed  # noqa: E402
from etc.models import moe as M  # noqa: E402


def main(artifacts: Path) -> None:
    coop = K._cu.cuLaunchCooperativeKernel
    plain = lambda *a: K._cu.cuLaunchKernel(*a, 0)  # noqa: E731
    for key, art in (
        ("dec_pf_gu32", "fused_dec_pf_gu32_occ_static"),
        ("dec_gu24_u1s3", "fused_dec_gu24_u1s3_occ_static"),
    ):
        cfg = B.moe_config(key)
        W = M.random_weights_torch(cfg, seed=0)
        kernel = etc.runtime.load(artifacts / art)
        for T in (1, 16):
            bufs = M.torch_inputs(cfg, T, {**W, "X": M.random_tokens_torch(cfg, T, seed=3)})
            ref = M.reference_moe_torch(bufs["X"], W["Wr"], W["Wgu"], W["Wd"], cfg.topk)[0]
            launch = lambda i, k=kernel, b=bufs, t=T: k.launch(b, {"T": t}, sync=False)  # noqa: E731
            res = {}
            for mode, fn in (("coop", coop), ("plain", plain), ("coop2", coop), ("plain2", plain)):
                K._cu.cuLaunchCooperativeKernel = fn
                bufs["Out"].zero_()
                launch(0)
                kernel.check()
                err = ((bufs["Out"].float() - ref).abs().max() / ref.abs().max()).item()
                res[mode] = (gpu_timed(torch, launch, 20, 30), timed(torch, launch, 20, 30), err)
            K._cu.cuLaunchCooperativeKernel = coop
            print(
                key,
                "T",
                T,
                {k: (round(a, 2), round(b, 2), f"{e:.3g}") for k, (a, b, e) in res.items()},
                flush=True,
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".device/moe_gu"))

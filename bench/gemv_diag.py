"""Which tensor a tiny decoder on the gemv core gets wrong (session 44):
every graph tensor the step writes, GPU against the simulator.

    python bench/gemv_diag.py --build DIR        # CPU: the variants below
    python bench/gemv_diag.py --artifacts DIR    # GPU: relative error per tensor
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import etc  # noqa: E402
from etc.dtypes import bf16_to_f32  # noqa: E402
from etc.models import llama as M  # noqa: E402

_T = M.TINY
_P = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
_OD = (("o_proj", "gemv"), ("down_proj", "gemv"))
VARIANTS = {
    "od": dataclasses.replace(_T, core_overrides=_OD),
    "od_1layer": dataclasses.replace(_T, core_overrides=_OD, layers=1),
    "od_called": dataclasses.replace(_T, core_overrides=_OD, outline=True),
    "od_nosums": dataclasses.replace(_T, core_overrides=_OD, fold_norms=False),
    "od_dynamic_order": dataclasses.replace(_T, core_overrides=_OD, layers=1, prefetch_ring=False),
}
SCHEDULES = ("static",)


def build(out: Path) -> None:
    for name, cfg in VARIANTS.items():
        g = M.build_decoder_graph(cfg, name="llama_tiny")
        for s in SCHEDULES:
            etc.compile(g, **M.compile_options(cfg, s)).save(out / f"{name}_{s}")
        print("built", name, flush=True)


def run(arts: Path) -> None:
    import torch

    import etc.runtime

    for name, cfg in VARIANTS.items():
        graph = M.build_decoder_graph(cfg, name="llama_tiny")
        weights = M.random_weights(cfg, seed=4)
        for s in SCHEDULES:
            kernel = etc.runtime.load(arts / f"{name}_{s}")
            for B, L in ((1, 0), (3, 7)):
                tokens = np.arange(B, dtype=np.int32) * 7 + 1
                arrays = M.numpy_inputs(cfg, weights, tokens, L, L + 2, seed=B + L)
                sim = etc.simulate(graph, arrays, {"B": B, "L": L, "S": L + 2})
                bufs = {}
                for k, a in arrays.items():
                    t = torch.from_numpy(a.view(np.int16) if a.dtype == np.uint16 else a.copy())
                    bufs[k] = (t.view(torch.bfloat16) if a.dtype == np.uint16 else t).cuda()
                kernel.launch(bufs, {"B": B, "L": L, "S": L + 2})
                kernel.check()
                errs = []
                for k in sorted(sim):
                    if k not in bufs or k in ("embed", "rope", "tokens") or k.startswith("w"):
                        continue
                    t = bufs[k]
                    got = (
                        t.view(torch.int16).cpu().numpy().view(np.uint16)
                        if t.dtype == torch.bfloat16
                        else t.cpu().numpy()
                    )
                    g32 = bf16_to_f32(got) if got.dtype == np.uint16 else got.astype(np.float32)
                    w = sim[k]
                    w32 = bf16_to_f32(w) if w.dtype == np.uint16 else w.astype(np.float32)
                    err = np.linalg.norm(g32 - w32) / (np.linalg.norm(w32) + 1e-30)
                    errs.append(f"{k} {err:.1e}")
                    if k == "sumsq" and err > 1e-3:
                        errs.append(f"sumsq got {got[:, 0].tolist()} want {w[:, 0].tolist()}")
                print(f"{name:18s} {s:8s} B={B} L={L}: " + ", ".join(errs), flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--build", type=Path)
    p.add_argument("--artifacts", type=Path)
    a = p.parse_args()
    if a.build:
        build(a.build)
    if a.artifacts:
        run(a.artifacts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Which tensor a tiny decoder on the gemv core gets wrong (session 44):
every graph tensor the step writes, GPU against the simulator.

    python bench/gemv_diag.py --build DIR        # CPU: the variants below
    python bench/gemv_diag.py --artifacts DIR    # GPU: relative error per tensor

The ``od*`` variants put o_proj and down on the gemv core and inline them
(the tiles ask to be called since, ``DeviceFunction.called``; this script
builds them inlined again), which went wrong under the static schedule
(``bench/RESULTS.md`` item 208). ``GEMV_DIAG_LATE=1`` selected the
variants whose L2-hinted copies faulted under ``dynamic_late``; the gemv
tile takes no hint since, so they ran at commit d9a13fb and are gone.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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
_od = dataclasses.replace(_T, core_overrides=_OD)
VARIANTS = {
    "od": _od,
    "od_1layer": dataclasses.replace(_od, layers=1),
    "od_called": dataclasses.replace(_od, outline=("o_proj", "down")),
    "od_nosums": dataclasses.replace(_od, fold_norms=False),
    "od_nopf": dataclasses.replace(_od, prefetch_ring=False),
    "od_drain": _od,  # + cp.async.wait_group 0 first in o_proj and down (PATCHES)
    "od_bar": _od,  # + a CTA barrier before their activation row's stores
    "gemv_called": dataclasses.replace(_T, gemm_core="gemv", outline=True),
    "od_O0": _od,
    "od_O1": _od,
    "od_O2": _od,
}
SCHEDULES = ("static",)
#: GEMV_DIAG_ONLY=name: that variant alone (a faulting kernel leaves the
#: process's CUDA context unusable).
if os.environ.get("GEMV_DIAG_ONLY"):
    VARIANTS = {os.environ["GEMV_DIAG_ONLY"]: VARIANTS[os.environ["GEMV_DIAG_ONLY"]]}
#: etc.compile's opt_level by variant (default 3).
OPT = {"od_O0": 0, "od_O1": 1, "od_O2": 2}
#: Source edits of the o_proj and down tiles, by variant: (old, new, count).
PATCHES = {
    "od_drain": ("  %tid_", "  nvvm.cp.async.wait.group 0\n  %tid_", 1),
    "od_bar": ("  vector.store", "  gpu.barrier\n  vector.store", 1),
}


def _tiles(name: str, cfg) -> dict:
    """The ``od*`` variants' o_proj and down tiles, inlined (``called``
    off; ``od_called``: left called) and with their ``PATCHES`` edit."""
    if not name.startswith("od") or name == "od_called":
        return {}
    from etc.device import DeviceFunction

    old, new, count = PATCHES.get(name, ("", "", 0))
    out = {}
    for task in ("o_proj", "down"):
        fn = M._tiles(cfg)[task]
        source = fn.source.replace(old, new, count) if old else fn.source
        assert source != fn.source or not old, (name, task)
        inlined = DeviceFunction.from_mlir(source, fn.name, fn.reference, block_size=fn.block_size)
        inlined.prefetch_fills_shared = fn.prefetch_fills_shared
        out[task] = inlined
    return out


def build(out: Path) -> None:
    for name, cfg in VARIANTS.items():
        g = M.build_decoder_graph(cfg, name="llama_tiny", tiles=_tiles(name, cfg))
        for s in SCHEDULES:
            options = {**M.compile_options(cfg, s), "opt_level": OPT.get(name, 3)}
            etc.compile(g, **options).save(out / f"{name}_{s}")
        print("built", name, flush=True)


def run(arts: Path) -> None:
    import torch

    import etc.runtime

    for name, cfg in VARIANTS.items():
        graph = M.build_decoder_graph(cfg, name="llama_tiny")
        weights = M.random_weights(cfg, seed=4)
        for s in SCHEDULES:
            kernel = etc.runtime.load(arts / f"{name}_{s}")
            for B, L in ((1, 0), (3, 7), (17, 8), (2, 30)):
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

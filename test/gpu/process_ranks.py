"""One rank per process (``etc.runtime.ProcessRank``, CUDA IPC), for
``test_collective_gpu.py``: ``run(rank, ranks, port, artifacts, results)``
runs both fused layers at two shapes on GPU ``rank`` and writes, per case,
the relative error against float32 numpy into ``results/<rank>.json``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def run(rank: int, ranks: int, port: int, artifacts: str, results: str) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from graphs import tensor_parallel_small

    from etc import runtime
    from examples._tensor_parallel import ALLGATHER_GEMM, GEMM_REDUCE_SCATTER

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )

    def all_gather(data: bytes) -> list[bytes]:
        out: list = [None] * ranks
        dist.all_gather_object(out, data)
        return out

    cfg = tensor_parallel_small()
    report = []
    for op, example, buffer in (
        ("gemm_rs", GEMM_REDUCE_SCATTER, "staging"),
        ("ag_gemm", ALLGATHER_GEMM, "A_full"),
    ):
        me = runtime.ProcessRank(Path(artifacts) / f"{op}_small_static", rank, ranks, all_gather)
        # The largest shape's bytes: the buffer serves both shapes.
        big = me.symmetric_empty(ranks * 192 * 320 * 2 * (cfg.k if buffer == "A_full" else 1))
        for rows, n in ((64, 64), (192, 320)):
            rng = np.random.default_rng(rows + n)  # every rank draws every rank's inputs
            inputs = example.inputs(rows, n, cfg.k, ranks, rng)
            mine = {
                k: torch.from_numpy(v).to(f"cuda:{rank}", torch.bfloat16)
                for k, v in inputs[rank].items()
            }
            name, want = example.expect(inputs, rows, n)[rank]
            out = torch.zeros(want.size, dtype=torch.bfloat16, device=f"cuda:{rank}")
            tensors = {**mine, name: out.view(*_shape(op, ranks, rows, n)), buffer: big.ptr}
            tensors[f"{buffer}_peers"] = big.peers
            me.launch(tensors, {"rows": rows, "N": n})
            got = out.float().cpu().numpy().reshape(want.shape)
            err = float(np.abs(got - want).max() / np.abs(want).max())
            report.append({"op": op, "rows": rows, "N": n, "rel_err": err})
        me.close()
    Path(results, f"{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def _shape(op: str, ranks: int, rows: int, n: int) -> tuple[int, ...]:
    return (rows, n) if op == "gemm_rs" else (ranks, rows, n)

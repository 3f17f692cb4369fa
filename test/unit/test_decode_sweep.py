"""Every variant of the decoder's sweeps (bench/decode_sweep.py,
decode_gemm.py, decode_attention.py) builds its graphs, so that a device
session's `--build` never stops at one the tiles or the configuration have
moved away from (seventeen had, found in the fifty-fourth session)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import decode_attention, decode_gemm, decode_sweep  # noqa: E402
from etc.models import llama  # noqa: E402


def test_every_sweep_variant_builds_its_kernels_graphs() -> None:
    built: set[str] = set()
    failed = []
    for name in decode_sweep.VARIANTS:
        try:
            kernels = decode_sweep.config(name).kernel_configs()
            for _, _, kernel in kernels:
                if repr(kernel) not in built:  # variants share most kernels
                    llama.build_decoder_graph(kernel)
                    built.add(repr(kernel))
        except Exception as e:  # noqa: BLE001 - name every variant that fails
            failed.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
    assert not failed, "\n".join(failed)
    assert len(built) > 100


def test_every_projection_and_attention_variant_builds_its_graph() -> None:
    failed = []
    for sweep in (decode_gemm, decode_attention):
        for name in sweep.VARIANTS:
            try:
                sweep.graph(name)
            except Exception as e:  # noqa: BLE001 - name every variant that fails
                failed.append(f"{sweep.__name__} {name}: {type(e).__name__}: {str(e)[:200]}")
    assert not failed, "\n".join(failed)

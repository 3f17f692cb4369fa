"""Every variant of the benchmarks' sweeps (bench/decode_sweep.py,
decode_gemm.py, decode_attention.py, moe.py) builds its graphs, so that a
device session's `--build` never stops at one the tiles or the
configurations have moved away from (seventeen had, found in the
fifty-fourth session)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import decode_attention, decode_gemm, decode_sweep  # noqa: E402
from bench import moe as moe_bench  # noqa: E402
from etc.models import llama, moe  # noqa: E402


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


def test_every_moe_configuration_builds_its_graph() -> None:
    failed = []
    for key in moe_bench.CONFIGS:
        if key in moe_bench.AUTOS:  # etc.models.moe.compile_moe's presets: tested there
            continue
        try:
            moe.build_moe_graph(moe_bench.moe_config(key), name=f"moe_{key}")
        except Exception as e:  # noqa: BLE001 - name every configuration that fails
            failed.append(f"{key}: {type(e).__name__}: {str(e)[:200]}")
    assert not failed, "\n".join(failed)

"""The decode attention stage alone: what bounds a split (issue 7).

    python bench/decode_attention.py --build DIR                  # CPU: one artifact per variant
    python bench/decode_attention.py --artifacts DIR --out OUT    # GPU: check, then time

Each variant is one attention task over the 16 layers of Llama-3.2-1B's
KV cache (grid ``(NL, B, KV, P)``, NL = 16 when timed, spans as the decoder picks them: 256
positions up to B=16, 512 beyond) as a one-task graph. On the GPU, for each
(B, L): every variant's output (merged over its splits) and cache write
against the phased tile's with the same heads (the one the decoder's GPU
tests check against the simulator), then the median time of REPS x CALLS
launches, and the K and V bytes over that time against the copy bandwidth
of the same run.

The ``*_g1`` variants give each kv head one query head instead of four
(8 heads, same cache): the bytes stay, the arithmetic per byte drops 4x. If a
tile's time follows the arithmetic, it is bound by its instructions, not by
its loads.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import timed, two_step_main  # noqa: E402

LAYERS, KV, D = 16, 8, 64
# name -> (tile maker, query heads, options)
VARIANTS = {
    "phased": ("attention", 32, {}),
    "online_u2": ("attention_online", 32, {"unroll": 2}),
    "online_u4": ("attention_online", 32, {"unroll": 4}),
    "phased_g1": ("attention", 8, {}),
    "online_u2_g1": ("attention_online", 8, {"unroll": 2}),
    # The tensor-core tile (etc.tiles.attention_mma): 1 or 2 blocks of 16
    # positions per warp and step.
    "mma_b1": ("attention_mma", 32, {"blocks": 1}),
    "mma_b2": ("attention_mma", 32, {"blocks": 2}),
    # The large-batch kernel's tile: K and V rows by TMA into a ring of
    # 2-4 stages of 128 positions, started before the waits; spans of 4096.
    "tma_s2": ("attention_mma", 32, {"blocks": 1, "pipeline": "tma", "stages": 2}),
    "tma_s3": ("attention_mma", 32, {"blocks": 1, "pipeline": "tma", "stages": 3}),
    "tma_s4": ("attention_mma", 32, {"blocks": 1, "pipeline": "tma", "stages": 4}),
    "tma_s2_pf": (
        "attention_mma",
        32,
        {"blocks": 1, "pipeline": "tma", "stages": 2, "prefetch": True},
    ),
}
#: The variant each one's outputs are checked against (same heads).
CHECK_AGAINST = {
    "online_u2": "phased",
    "online_u4": "phased",
    "online_u2_g1": "phased_g1",
    "mma_b1": "phased",
    "mma_b2": "phased",
    **{name: "phased" for name in ("tma_s2", "tma_s3", "tma_s4", "tma_s2_pf")},
}
#: ``ATTN_VARIANTS=a,b`` runs only those (and what they are checked against).
if os.environ.get("ATTN_VARIANTS"):
    _keep = os.environ["ATTN_VARIANTS"].split(",")
    _keep += [CHECK_AGAINST[k] for k in _keep if k in CHECK_AGAINST]
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in _keep}
CASES = ((1, 1024), (64, 1024), (64, 4096))
CALLS = 10
#: ``ATTN_CASES=64x1024,1x1024`` runs only those (B, L), e.g. under ``ncu``.
if os.environ.get("ATTN_CASES"):
    CASES = tuple(tuple(int(x) for x in c.split("x")) for c in os.environ["ATTN_CASES"].split(","))


def span(B: int, name: str = "") -> int:
    """Positions per split: the decoder's large-batch spans for the TMA tile."""
    if name.startswith("tma"):
        return 4096
    return 256 if B <= 16 else 512


def graph(name: str):
    import etc
    from etc.tiles import attention_mma
    from etc.tiles import llama as T

    maker, heads, options = VARIANTS[name]
    module = attention_mma if maker == "attention_mma" else T
    chunk = 4096 if name.startswith("tma") else 512
    tile = getattr(module, maker)(chunk, heads, KV, D, LAYERS, spread=True, **options)
    g = etc.Graph(name)
    B, L, S, P = g.symbol("B"), g.symbol("L"), g.symbol("S"), g.symbol("P")
    NL = g.symbol("NL")  # layers in the grid: 1 for the check, all for timing
    qkv = g.tensor("qkv", (B, (heads + 2 * KV) * D), "bf16")
    rope = g.tensor("rope", (S, D), "f32")
    kc = g.tensor("kc", (LAYERS, B, KV, S, D), "bf16")
    vc = g.tensor("vc", (LAYERS, B, KV, S, D), "bf16")
    op = g.tensor("opart", (B, heads, P, D), "f32")
    mp = g.tensor("mpart", (B, heads, P, 2), "f32")
    g.task(tile, grid=(NL, B, KV, P), args=(L, qkv, rope, kc, vc, op, mp))
    return g


def merged(opart, mpart):
    """The attention output from the splits' partials (what the combine
    tile computes): tiles may cut the positions into splits differently."""
    import torch

    m = mpart[..., 0]
    w = torch.exp(m - m.amax(dim=2, keepdim=True))
    return (opart * w[..., None]).sum(2) / (mpart[..., 1] * w).sum(2)[..., None]


def build(out: Path) -> None:
    import etc

    for name in VARIANTS:
        etc.compile(graph(name), schedule="static", min_ctas_per_sm=2).save(out / name)
        print("built", name, flush=True)


def run(artifacts: Path, out: Path | None, reps: int) -> None:
    import torch

    import etc.runtime
    from bench.splitk import copy_bandwidth
    from etc.tiles import llama as T

    copy_bps = copy_bandwidth(torch, reps)
    print(f"copy bandwidth {copy_bps / 1e12:.2f} TB/s", flush=True)
    kernels = {name: etc.runtime.load(artifacts / name) for name in VARIANTS}
    rows = []
    for B, L in CASES:
        S = L + 1
        rope = torch.from_numpy(T.rope_table(S, D)).cuda()
        kc = (torch.randn(LAYERS, B, KV, S, D, device="cuda")).to(torch.bfloat16)
        vc = (torch.randn(LAYERS, B, KV, S, D, device="cuda")).to(torch.bfloat16)
        nbytes = 2 * LAYERS * B * KV * (L + 1) * D * 2
        outputs = {}
        for name, (_, heads, _) in VARIANTS.items():
            # The decoder's counts: the tensor-core tile (no span held) splits the
            # L cached positions, position L in the last split.
            P = max(1, -(-L // span(B, name))) if name.startswith("tma") else -(-(L + 1) // span(B))
            gen = torch.Generator(device="cuda").manual_seed(B + L + heads)
            qkv = torch.randn(B, (heads + 2 * KV) * D, device="cuda", generator=gen)
            bufs = {
                "qkv": qkv.to(torch.bfloat16),
                "rope": rope,
                "kc": kc.clone(),
                "vc": vc.clone(),
                "opart": torch.zeros(B, heads, P, D, device="cuda"),
                "mpart": torch.zeros(B, heads, P, 2, device="cuda"),
            }
            # One layer for the check: every layer writes the same partials.
            syms = {"B": B, "L": L, "S": S, "P": P, "NL": 1}
            kernels[name].launch(bufs, syms)
            kernels[name].check()
            outputs[name] = (merged(bufs["opart"], bufs["mpart"]), bufs["kc"][0, :, :, L].float())
            syms["NL"] = LAYERS
            err = 0.0
            if name in CHECK_AGAINST:
                ref = outputs[CHECK_AGAINST[name]]
                err = max(
                    float((a - b).norm() / b.norm())
                    for a, b in zip(outputs[name], ref, strict=True)
                )
                if not err < 1e-2:
                    print(f"{name:14s} B={B:3d} L={L:5d}: WRONG, rel err {err:.2e}", flush=True)
                    continue
            us = timed(
                torch,
                lambda i, k=kernels[name], b=bufs, s=syms: k.launch(b, s, sync=False),
                CALLS,
                reps,
            )
            tbps = nbytes / (us * 1e-6) / 1e12
            rows.append(
                {"variant": name, "B": B, "L": L, "splits": P, "us": us, "us_per_layer": us / LAYERS,
                 "TBps": tbps, "of_copy": tbps * 1e12 / copy_bps, "rel_err_vs_phased": err}
            )  # fmt: skip
            print(
                f"{name:14s} B={B:3d} L={L:5d} P={P:2d}: {us:8.1f} us ({us / LAYERS:6.1f} a layer), "
                f"{tbps:5.2f} TB/s ({100 * tbps * 1e12 / copy_bps:4.1f}% of copy)  err {err:.1e}",
                flush=True,
            )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode_attention.json").write_text(
            json.dumps({"copy_TBps": copy_bps / 1e12, "rows": rows}, indent=1)
        )


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=7)


if __name__ == "__main__":
    raise SystemExit(main())

"""Greedy decoding with a whole Llama-style decoder as one ETC graph (issue 7).

Every decode step is one launch of one persistent kernel: embedding, per
layer RMSNorm, fused QKV, RoPE + KV-cache append, grouped-query attention
over the cache (flash-decoding splits), output projection + residual,
RMSNorm, gate/up + SiLU, down projection + residual, final norm, LM head and
greedy argmax (``etc.models.llama``, ``docs/decoder.md``). The batch B, the
context L and the cache capacity S are symbols: one compiled kernel runs
every step, whatever L (the example compiles the kernel of ``--batch``'s
range; ``llama.compile_decoder`` saves all of them as one artifact, which
``--artifact`` loads and which picks a kernel by B at each launch). Each step is checked against the numpy model
(same rounding): relative error of the logits and the greedy tokens.

    python examples/llama_decode.py --simulate                 # tiny model, CPU
    python examples/llama_decode.py --simulate --schedule dynamic --batch 3 --steps 6
    python examples/llama_decode.py --simulate --ragged --batch 3  # sequences joining late
    python examples/llama_decode.py --simulate --page-size 4   # a paged KV cache
    python examples/llama_decode.py --emit-ptx /tmp/llama.ptx  # Llama-3.2-1B PTX
    python examples/llama_decode.py --tiny                     # GPU, tiny model
    python examples/llama_decode.py --batch 4 --prompt 8       # GPU, Llama-3.2-1B

``--ragged`` decodes a ragged batch (``LlamaConfig.ragged``): sequence ``b``
joins ``b`` steps after the first, so the batch's sequences sit at different
positions in every launch (until it joins, a sequence re-reads its first
prompt token at position 0).

``--page-size N`` keeps the KV cache in pages of ``N`` positions
(``LlamaConfig.page_size``), dealt to each sequence as it grows
(``llama.PagePool``) through a block table that each step checks
(``llama.step_symbols(..., check=True)``). On the GPU the tensor-core attention's TMA
boxes take whole swizzle atoms: ``N`` at least 8.

``--simulate`` always uses the tiny configuration (``etc.models.llama.TINY``);
on the GPU the default is Llama-3.2-1B with random weights (the numpy check
then takes a few seconds per step on the CPU; ``--no-check`` skips it).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

import etc
from etc.models import llama as M

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import (  # noqa: E402
    check_decode_step,
    cli,
    compile_only,
    count,
    decoder_options,
    load_kernel,
    parser,
)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=count(1), default=2, help="sequences decoded together (B)")
    p.add_argument(
        "--prompt", type=count(1), default=4, help="prompt tokens fed one step at a time"
    )
    p.add_argument("--steps", type=count(0), default=4, help="greedy tokens generated")
    decoder_options(p)
    p.add_argument("--ragged", action="store_true", help="sequence b joins b steps late")
    p.add_argument("--page-size", type=count(0), default=0, help="a paged KV cache (0: contiguous)")
    p.add_argument(
        "--weight-chunk", type=count(0), default=0,
        help="the layer projections read their weights in 8-row groups of this many k "
        "(LlamaConfig.weight_chunk; 0: nn.Linear rows; 64 with the TMA kernel)",
    )  # fmt: skip
    args = p.parse_args(argv)
    cfg = M.TINY if (args.simulate or args.tiny) else M.LLAMA_3_2_1B
    model = "tiny" if cfg is M.TINY else "Llama-3.2-1B"
    if args.weight_chunk:
        try:
            cfg = dataclasses.replace(cfg, weight_chunk=args.weight_chunk)
        except etc.EtcError as exc:  # a chunk the projections cannot take
            print(f"error: {exc}", file=sys.stderr)
            return 2
    B = args.batch
    lag = np.arange(B) if args.ragged else np.zeros(B, np.int64)  # steps each joins late
    last = args.prompt + args.steps - 2 + int(lag.max())  # the last step's L
    try:
        cfg = dataclasses.replace(cfg, ragged=args.ragged, page_size=args.page_size)
        # The kernel for this batch size and the longest context it decodes
        # (LlamaConfig.batch_buckets, context_buckets; a saved artifact of
        # llama.compile_decoder holds them all and picks by B and L).
        cfg = cfg.kernel_for(args.batch, last)
        g = M.build_decoder_graph(cfg)
    except etc.EtcError as exc:  # a page size the tiles cannot take
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.min_ctas_per_sm = 2
    if cfg.uses_tma:
        args.target = "sm_90a"  # wgmma and TMA
    done = compile_only(g, args)
    if done is not None:
        return done
    kernel = load_kernel(g, args)
    S = last + 2
    t0 = time.perf_counter()
    weights = M.random_weights(cfg, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    prompt = rng.integers(0, cfg.vocab, (B, args.prompt)).astype(np.int32)
    arrays = M.numpy_inputs(cfg, weights, prompt[:, 0], 0, S)
    print(f"{model} weights in {time.perf_counter() - t0:.1f} s")
    pool = M.PagePool(arrays["k_cache"].shape[1], cfg.page_size) if cfg.page_size else None
    failures, generated = 0, [[] for _ in range(B)]
    for L in range(last + 1):  # L: the first sequence's position, the longest
        position = np.maximum(L - lag, 0)  # a sequence not yet joined stays at 0
        if args.ragged:
            arrays["lengths"] = position.astype(np.int32)
        if pool is not None:  # a page more as a sequence reaches it
            for b, p in enumerate(position.tolist()):
                pool.reserve(b, p)
            arrays["block_table"] = pool.table(range(B), arrays["block_table"].shape[1])
        symbols = M.step_symbols(cfg, arrays, L, check=True)  # tokens, positions, table
        # The attention partials have one slot per attention split: they grow with L.
        shapes = M.tensor_shapes(cfg, B, L, S)
        for name in ("opart", "mpart"):
            if arrays[name].shape != shapes[name][0]:
                arrays[name] = np.zeros(shapes[name][0], arrays[name].dtype)
        if args.simulate:
            out = etc.simulate(g, arrays, symbols, schedule=args.schedule, seed=args.seed)
        else:
            out = {k: v.copy() for k, v in arrays.items()}
            kernel.launch(out, symbols)
        if args.check:
            ok, detail = check_decode_step(cfg, arrays, out, L, args.tolerance)
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} L={L:3d} {detail}: {out['next_tokens'].tolist()}")
        arrays["k_cache"], arrays["v_cache"] = out["k_cache"], out["v_cache"]
        tokens = arrays["tokens"].copy()
        for b in range(B):
            if L < lag[b]:  # not joined: its first prompt token at position 0 again
                continue
            nxt = position[b] + 1
            if nxt < args.prompt:
                tokens[b] = prompt[b, nxt]
            else:
                tokens[b] = out["next_tokens"][b]
                generated[b].append(int(out["next_tokens"][b]))
        arrays["tokens"] = tokens
    where = "simulator" if args.simulate else "GPU"
    print(f"generated on the {where}: {[g[: args.steps] for g in generated]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(cli(main))

"""Serving a stream of requests with one compiled decoder: continuous batching
over a paged KV cache (issue 7).

Requests arrive one after another, each with its own prompt and number of
tokens to generate. Every step decodes the requests in flight as one batch,
one launch: each request at its own position (``LlamaConfig.ragged``), its
KV cache in pages (``LlamaConfig.page_size``) that a ``llama.PagePool``
deals as the request grows and takes back when it ends. So the batch size
and the context change from step to step, requests join and leave, and yet
one artifact serves every step: its kernels are picked by B and L at each
launch, nothing is recompiled or captured, and no cache row ever moves
(a request that leaves frees its pages; the others keep theirs).

Every step is checked against the numpy model (``llama.reference_step``,
same rounding): relative error of the logits and the greedy tokens.

    python examples/llama_serve.py --simulate                 # tiny model, CPU
    python examples/llama_serve.py --simulate --schedule dynamic --requests 8 --max-batch 3
    python examples/llama_serve.py --emit-ptx /tmp/serve.ptx  # Llama-3.2-1B kernels' PTX
    python examples/llama_serve.py --tiny                     # GPU, tiny model
    python examples/llama_serve.py --no-check                 # GPU, Llama-3.2-1B

The tiny configuration (``--simulate``, ``--tiny``) takes Llama-3.2-1B's
batch buckets, so a step of one request runs the B = 1 kernel and a step of
several the other. On the GPU the tensor-core attention's TMA boxes take
whole swizzle atoms: ``--page-size`` at least 8.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

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
    run_case,
)


@dataclass
class Request:
    """A request: it arrives at step ``arrival``, feeds its ``prompt`` one
    token a step, then generates ``wants`` tokens greedily."""

    name: int
    arrival: int
    prompt: list[int]
    wants: int
    position: int = 0  # tokens in its cache: the position this step writes
    generated: list[int] = field(default_factory=list)

    @property
    def token(self) -> int:
        """The token this step feeds: the prompt's, then the last generated."""
        return (
            self.prompt[self.position] if self.position < len(self.prompt) else self.generated[-1]
        )


def requests(count: int, vocab: int, seed: int) -> list[Request]:
    """``count`` requests, 0-2 steps apart, prompts of 1-4 tokens, 1-6 wanted."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.integers(0, 3, count))
    return [
        Request(
            name=i,
            arrival=int(arrivals[i]),
            prompt=rng.integers(0, vocab, int(rng.integers(1, 5))).tolist(),
            wants=int(rng.integers(1, 7)),
        )
        for i in range(count)
    ]


def kernel_names(cfg: M.LlamaConfig) -> list[str]:
    """The kernels' ranges, in launch order: ``B1_L0-1087``, ``B1_L1088+``, ``B2+``."""
    names, low_b, low_l, prev = [], 1, 0, None
    for b, lb, _ in cfg.kernel_configs():
        if b != prev and prev is not None:
            low_b, low_l = prev + 1, 0
        batch = f"B{low_b}" + ("+" if b is None else f"-{b}" if b > low_b else "")
        context = (
            "" if lb is None and not low_l else f"_L{low_l}" + ("+" if lb is None else f"-{lb}")
        )
        names.append(batch + context)
        low_l, prev = (lb or 0) + 1, b
    return names


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--requests", type=count(1), default=10, help="requests in the stream")
    p.add_argument("--max-batch", type=count(1), default=4, help="requests in flight at most")
    p.add_argument(
        "--page-size", type=count(0), default=0, help="positions a page (default 4 tiny, 16)"
    )
    decoder_options(p)
    args = p.parse_args(argv)
    tiny = args.simulate or args.tiny
    base = M.TINY if tiny else M.LLAMA_3_2_1B
    if tiny:  # the default's kernels by batch size: B = 1's, and the rest TINY's
        base = dataclasses.replace(
            base, batch_buckets=(M.LLAMA_3_2_1B.batch_buckets[0], (None, ()))
        )
    try:
        cfg = dataclasses.replace(
            base, ragged=True, page_size=args.page_size or (4 if tiny else 16)
        )
        kernels = {k: M.build_decoder_graph(k) for *_, k in cfg.kernel_configs()}
    except etc.EtcError as exc:  # a page size the tiles cannot take
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.min_ctas_per_sm = 2
    if cfg.uses_tma:
        args.target = "sm_90a"

    def compile_all():
        return M.compile_decoder(cfg, args.schedule, early_push=args.early_push)

    done = compile_only(list(kernels.values()), args, compile_all, ptx_names=kernel_names(cfg))
    if done is not None:
        return done
    kernel = load_kernel(None, args, compile_all)

    stream = requests(args.requests, cfg.vocab, args.seed)
    S = max(len(r.prompt) + r.wants for r in stream) + 1  # the longest request's positions
    width = -(-S // cfg.page_size)  # a block table row: any request's pages
    pool = M.PagePool(args.max_batch * width, cfg.page_size)
    weights = M.graph_weights(cfg, M.random_weights(cfg, args.seed))
    pages_shape = M.tensor_shapes(cfg, 1, 0, S, pool.pages, width)["k_cache"][0]
    caches = {k: np.zeros(pages_shape, np.uint16) for k in ("k_cache", "v_cache")}  # bf16 bits
    fixed = {**weights, "rope": M.rope_table(cfg, S)}
    pending, active, finished, dealt = list(stream), [], [], 0
    failures, step = 0, 0
    while pending or active:
        while pending and pending[0].arrival <= step and len(active) < args.max_batch:
            active.append(pending.pop(0))
        if not active:  # nothing in flight until the next arrival
            step += 1
            continue
        before = pool.free
        for r in active:  # a page more when a request's position reaches it
            pool.reserve(r.name, r.position)
        dealt += before - pool.free
        B, positions = len(active), np.array([r.position for r in active], np.int32)
        L = int(positions.max())
        inputs = {
            **fixed,
            **caches,
            "tokens": np.array([r.token for r in active], np.int32),
            "lengths": positions,
            "block_table": pool.table([r.name for r in active], width),
        }
        kernel_cfg = cfg.kernel_for(B, L)
        symbols = M.step_symbols(kernel_cfg, inputs, L, check=True)  # tokens, positions, table
        out = run_case(kernels[kernel_cfg], kernel, args, inputs, symbols)
        line = f"step {step:2d}: B={B} L={L:2d} requests {[r.name for r in active]}"
        if args.check:
            ok, detail = check_decode_step(kernel_cfg, inputs, out, L, args.tolerance)
            failures += not ok
            line = f"{'ok  ' if ok else 'FAIL'} {line}: {detail}"
        print(line)
        caches = {k: out[k] for k in caches}
        for b, r in enumerate(list(active)):
            r.position += 1
            if r.position >= len(r.prompt):  # this step's token is a generated one
                r.generated.append(int(out["next_tokens"][b]))
            if len(r.generated) == r.wants:  # done: its pages go back to the pool
                pool.release(r.name)
                active.remove(r)
                finished.append(r)
        step += 1
    where = "simulator" if args.simulate else "GPU"
    print(
        f"served {len(finished)} requests in {step} steps on the {where}: {dealt} pages dealt "
        f"from a pool of {pool.pages}, all back ({pool.free} free)"
    )
    for r in sorted(finished, key=lambda r: r.name):
        print(f"  request {r.name}: prompt {r.prompt} -> {r.generated}")
    return 1 if failures or pool.free != pool.pages else 0


if __name__ == "__main__":
    sys.exit(cli(main))

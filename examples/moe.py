"""The Qwen3-30B-A3B mixture-of-experts layer as one ETC graph (issue 6).

clear, logits -> topk -> plan -> permute(e) -> gate_up(i, e) -> down(i, e) -> combine in one
persistent kernel (``--route fused``: logits -> route -> permute(e) -> ..., the
routing in one CTA and one hop, for decode: T up to ``--route-max-tokens``;
``--route slots``: logits -> topk -> gate_up(s, j) -> down(s, j) -> combine,
static grids over each token's K expert slots, no tables, for one token);
the expert GEMM tiles are data-dependent (triggered by the plan's tables),
see docs/moe.md. The result is checked against a
float32 numpy reference (max|out - ref| / max|ref| <= 1e-2).

    python examples/moe.py --simulate --hidden 64 --inter 32 --experts 8 --topk 2
    python examples/moe.py --simulate --routing one-expert --tokens 1,7,33
    python examples/moe.py --save-artifact /tmp/moe_static          # compile here
    python examples/moe.py --artifact /tmp/moe_static               # run on the GPU
    python examples/moe.py --preset decode --save-artifact /tmp/moe  # tuned tiles
    python examples/moe.py --simulate --route fused --hidden 64 --inter 32 --experts 8 --topk 2

``--preset single|few|mid|prefill|prefill_large`` takes the tile
configuration measured best for T <= 2, 3-8, 9-896, 897-2048 and above
(``decode``, once best for 6-8, is kept; ``etc.models.moe.PRESETS``: mid
and the prefills are TMA tiles, sm_90a) and compiles with its target,
``min_ctas_per_sm`` and called tiles; ``--block-*`` then do not apply. ``--preset auto``
compiles the five into one artifact (``etc.models.moe.compile_moe``;
``--schedule`` applies to mid and the prefills, the slot presets single
and few stay static): each
launch runs the kernel of T's range (``PRESET_BUCKETS``), no recompiling;
``--emit-ptx FILE`` then writes one file per kernel (``FILE.<preset>.ptx``)
and ``--simulate`` runs each T's graph.

``--weight-chunk C`` has the expert tiles read the weights in 8-row groups
of C-wide k chunks (``etc.tiles.gemm.chunk_weights``; the example converts
them; the TMA tiles take 64).

``--routing``: ``uniform`` (random router), ``one-expert`` (every token
picks expert 0: a bias column in the router weights), ``few-experts``
(tokens only pick the first 2K experts; the others stay empty), ``top1``
(topk = 1).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

import etc
from etc.models import moe as M
from etc.tiles import moe as moe_tiles

try:
    from examples._common import (
        cli,
        compile_only,
        count,
        counts,
        load_kernel,
        parser,
        positive,
        run_case,
    )
except ImportError:  # run as a script
    from _common import cli, compile_only, count, counts, load_kernel, parser, positive, run_case


def config(
    hidden: int = 2048,
    inter: int = 768,
    experts: int = 128,
    topk: int = 8,
    routing: str = "uniform",
    block_m: int = 64,
    block_n_gu: int = 64,
    block_n_dn: int = 128,
    router_block: int = 32,
    router_experts: int = 2,
) -> M.MoEConfig:
    return M.MoEConfig(
        hidden=hidden,
        inter=inter,
        experts=experts,
        topk=topk,
        block_m=block_m,
        block_n_gu=min(block_n_gu, inter),
        block_n_dn=min(block_n_dn, hidden),
        router_block=router_block,
        router_experts=router_experts if experts % router_experts == 0 else 1,
        topk_block=8 if router_block % 8 == 0 else router_block,
    ).with_routing(routing)


def build(**kwargs) -> etc.Graph:
    """The layer's graph (defaults: the real sizes), for `etc compile`/`etc dot`."""
    return M.build_moe_graph(config(**kwargs))


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--tokens", type=counts(), default="1,7,16,33", help="values of T to run")
    p.add_argument("--hidden", type=count(1), default=2048)
    p.add_argument("--inter", type=count(1), default=768)
    p.add_argument("--experts", type=count(1), default=128)
    p.add_argument("--topk", type=count(1), default=8)
    p.add_argument("--block-m", type=count(1), default=64)
    p.add_argument("--block-n-gu", type=count(1), default=64)
    p.add_argument("--block-n-dn", type=count(1), default=128)
    p.add_argument(
        "--router-block",
        type=count(1),
        help="tokens per router block (default 32, or the preset's)",
    )
    p.add_argument(
        "--router-experts",
        type=count(1),
        help="experts per logits CTA, EC (default 2, or the preset's)",
    )
    p.add_argument("--routing", choices=M.ROUTINGS, default="uniform")
    p.add_argument(
        "--route", choices=M.ROUTES,
        help="the routing after the logits: split (top-k, plan: parallel; the default), fused "
        "(one CTA) or slots (no tables: static grids of each token's expert slots)",
    )  # fmt: skip
    p.add_argument(
        "--slot-logits", action="store_true",
        help="--route slots: the gate/up tiles pick their experts from the logits themselves",
    )  # fmt: skip
    p.add_argument(
        "--route-max-tokens", type=count(1), default=64, help="the largest T of --route fused"
    )
    p.add_argument(
        "--gather", action="store_true",
        help="gate/up tiles read X through perm (no permuted copy; TMA tiles: --preset prefill, "
        "whose gate/up rings are then refilled by waiting)",
    )  # fmt: skip
    p.add_argument(
        "--combine", choices=M.COMBINES,
        help="task (a combine task sums Yp's rows) or atomic: down tiles add their rows into "
        "sums (TMA tiles; --preset prefill's own choice, with f16 sums); default: the preset's",
    )  # fmt: skip
    p.add_argument(
        "--combine-dtype", choices=("f32", "f16"),
        help="the sums of --combine atomic (f32, the default, or f16: half the bytes, overflow "
        "past 65504)",
    )  # fmt: skip
    p.add_argument(
        "--weight-chunk", type=count(0), default=0,
        help="the expert tiles read Wgu/Wd in 8-row groups of this many k (etc.tiles.gemm."
        "chunk_weights; 0: nn.Linear rows; the TMA tiles take 64)",
    )  # fmt: skip
    p.add_argument("--tolerance", type=positive, default=1e-2, help="largest relative error")
    p.add_argument(
        "--preset", choices=(*M.PRESETS, "auto"),
        help="the tuned tile configuration (real sizes); auto: one artifact, a preset per T",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.preset == "auto":
        return run_family(args)
    router = {
        k: v
        for k, v in (("router_block", args.router_block), ("router_experts", args.router_experts))
        if v is not None
    }
    if args.preset:
        try:
            cfg = M.preset(
                args.preset, hidden=args.hidden, inter=args.inter, experts=args.experts,
                topk=args.topk, **router,
            ).with_routing(args.routing)  # fmt: skip
        except etc.EtcError as exc:  # sizes the preset's tiles cannot take
            print(f"error: {exc}", file=sys.stderr)
            return 2
        args.min_ctas_per_sm = M.PRESET_MIN_CTAS_PER_SM[args.preset]
        args.target = M.PRESET_TARGETS[args.preset]
        args.outline = M.PRESET_OUTLINE.get(args.preset, ())
    else:
        cfg = config(
            args.hidden, args.inter, args.experts, args.topk, args.routing,
            args.block_m, args.block_n_gu, args.block_n_dn, router.get("router_block", 32),
            router.get("router_experts", 2),
        )  # fmt: skip
    # The flags given change the configuration (a preset keeps its own otherwise).
    given = {
        "route": args.route, "combine": args.combine, "combine_dtype": args.combine_dtype,
        "gather": args.gather or None, "slot_logits": args.slot_logits or None,
    }  # fmt: skip
    if args.gather:  # gathered rows: thread 0 refills by waiting (refill="test" takes none)
        given["gate_up_options"] = tuple(o for o in cfg.gate_up_options if o[0] != "refill")
    try:
        cfg = replace(
            cfg, route_max_tokens=args.route_max_tokens,
            **{k: v for k, v in given.items() if v is not None},
        )  # fmt: skip
        if args.weight_chunk:
            cfg = cfg.with_weight_chunk(args.weight_chunk)
        g = M.build_moe_graph(cfg)
    except etc.EtcError as exc:  # a configuration the tiles cannot take
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = compile_only(g, args)
    if done is not None:
        return done
    kernel = load_kernel(g, args)
    return check_sizes(cfg, args, lambda T: (g, kernel))


def check_sizes(cfg: M.MoEConfig, args, graph_and_kernel) -> int:
    """Runs every ``--tokens`` T (``graph_and_kernel(T)``: the graph to
    simulate and the GPU kernel) against the float32 reference; an exit code."""
    weights = M.random_weights(cfg, args.seed, args.routing)
    failures = 0
    sizes = args.tokens
    for T in sizes:
        x = M.random_tokens(cfg, T, args.seed, args.routing)
        g, kernel = graph_and_kernel(T)
        try:
            out = run_case(g, kernel, args, M.numpy_inputs(cfg, x, weights), {"T": T})
        except etc.ShapeError as exc:  # e.g. T past the fused route's bound
            print(f"error: {exc}", file=sys.stderr)
            return 2
        ref = M.reference_moe(x, weights["Wr"], weights["Wgu"], weights["Wd"], cfg.topk)
        err = M.rel_err(out["Out"], ref)
        # A near-tie in the router may pick another expert than numpy did:
        # then compare with the kernel's own routing and say so.
        ids_ref, _ = moe_tiles.router_reference_rows(x, weights["Wr"], cfg.topk)
        same = np.array_equal(np.sort(out["topk_ids"], 1), np.sort(ids_ref, 1))
        note = "" if same else " (routing differs from numpy in a near-tie)"
        if not same:
            own = (out["topk_ids"], out["topk_w"])
            ref = M.reference_moe(
                x, weights["Wr"], weights["Wgu"], weights["Wd"], cfg.topk, routing=own
            )
            err = M.rel_err(out["Out"], ref)
        ok = err <= args.tolerance
        empty = cfg.experts - len(np.unique(out["topk_ids"]))
        print(
            f"{'ok  ' if ok else 'FAIL'} T={T} routing={args.routing}: rel err {err:.3g}, "
            f"{empty}/{cfg.experts} experts empty{note}"
        )
        failures += not ok
    where = "simulator" if args.simulate else "GPU"
    print(f"{len(sizes) - failures}/{len(sizes)} cases match numpy on the {where}")
    return 1 if failures else 0


def run_family(args) -> int:
    """``--preset auto``: every preset in one artifact, a kernel per range of T."""
    tuned = {
        "--route": args.route is not None,
        "--slot-logits": args.slot_logits,
        "--gather": args.gather,
        "--combine": args.combine is not None,
        "--combine-dtype": args.combine_dtype is not None,
    }
    if any(tuned.values()):  # each preset keeps its own tiles
        flags = ", ".join(k for k, v in tuned.items() if v)
        print(f"error: {flags} apply to one --preset, not to --preset auto", file=sys.stderr)
        return 2
    sizes = dict(hidden=args.hidden, inter=args.inter, experts=args.experts, topk=args.topk)
    if args.routing == "top1":
        sizes["topk"] = 1
    try:
        family = M.preset_family(weight_chunk=args.weight_chunk, **sizes)
        graphs = [(bound, M.build_moe_graph(cfg, name=f"moe_{n}")) for bound, n, cfg in family]
    except etc.EtcError as exc:  # sizes the presets' tiles cannot take
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def compile_family():
        return M.compile_moe(schedule=args.schedule, weight_chunk=args.weight_chunk, **sizes)

    names = [name for _, name, _ in family]
    done = compile_only([g for _, g in graphs], args, compile_family, ptx_names=names)
    if done is not None:
        return done
    kernel = load_kernel(None, args, compile_family)

    def graph_and_kernel(T: int):
        graph = next(g for bound, g in graphs if bound is None or T <= bound)
        return graph, kernel

    return check_sizes(family[-1][2], args, graph_and_kernel)


if __name__ == "__main__":
    sys.exit(cli(main))

"""Compiles the artifacts the GPU tests and benchmarks run (on a CPU machine with
the compiler; the GPU machine needs only the runtime):

    python test/gpu/make_artifacts.py OUT_DIR
    ETC_ARTIFACTS=OUT_DIR pytest test/gpu

- ``splitk/``: the split-K row sum, A (n, 256) f32 -> B (n, 4) partials -> C (n,).
- ``broken/``: the same graph whose wait counts are read from a tensor ``T``
  (data-dependent, so no compile-time check can reject it); the tests set
  ``T`` one too high and expect a DeadlockError naming the event.
- ``broken_kept/``: ``broken`` with its partials ``B`` declared kept zero
  (``Graph.tensor(kept_zero=True)``), which the runtime zeroes after the
  DeadlockError.
- ``symbolic_batch/``: the Figure 4 example's graph.
- ``trigger_table[_unguarded]_<schedule>/``: a data-dependent trigger over a
  table the launch hands in (``trigger_table_graph`` in ``graphs.py``): good
  tables run, bad ones stop with TriggerRangeError.
- ``<graph>_<schedule>/`` for every graph of ``graphs.py`` (diamond, wide
  fan-in, skewed, empty tasks, chain) and schedule (static, dynamic with and
  without early push), and the same for split-K and broken.
- ``llama_tiny[_fused_aring]_<schedule>/``: the whole decoder
  (`etc.models.llama.TINY`, and with fused norms and activations through the
  weight ring: ``llama_tiny_variants()`` in ``graphs.py``);
- ``moe_small_family_<schedule>/``: the MoE presets at small sizes in one
  bucketed artifact (``etc.models.moe.compile_moe``);
- ``moe_small_<schedule>/``: the MoE layer (data-dependent triggers and
  wait-count tables) at small sizes, ``MOE_SMALL`` in ``graphs.py``;
  ``moe_small_tma_<schedule>/`` the same on the TMA GEMM tiles (sm_90a),
  ``moe_small_ring_<schedule>/`` on the decode preset's weight ring,
  ``moe_small_route[_tma|_unguarded]_<schedule>/`` with the fused route tile
  (``_unguarded``: gate/up tiles without the tables' in-edge).
- ``gemm_meet[3|2]_<schedule>/``, ``gemm_meet[2]_share_static/``: the dense TMA tile with parts of k
  meeting in the tile (``GEMM_MEETS`` in ``graphs.py``, sm_90a);
- ``gemm_rs_small_<schedule>/``, ``ag_gemm_small_<schedule>/``: the multi-GPU
  GEMM + Reduce-Scatter and All-Gather + GEMM graphs (ranked events),
  ``tensor_parallel_small()`` in ``graphs.py``, and ``<variant>_small_<schedule>/``
  for its ``TENSOR_PARALLEL_VARIANTS``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import etc  # noqa: E402
from etc.tiles import rowsum  # noqa: E402
from examples.splitk_rowsum import build as build_splitk  # noqa: E402

sys.path.insert(0, str(REPO / "test" / "gpu"))
from graphs import (  # noqa: E402
    GEMM_MEET_SHARES,
    GEMM_MEETS,
    GRAPHS,
    MOE_FAMILY_SIZES,
    MOE_GRAPH_OPTIONS,
    MOE_SMALL,
    MOE_SMALL_ATOMIC,
    MOE_SMALL_ATOMIC16,
    MOE_SMALL_BULK_PERMUTE,
    MOE_SMALL_CHUNK,
    MOE_SMALL_GATHER,
    MOE_SMALL_GATHER_TMA,
    MOE_SMALL_RING,
    MOE_SMALL_RING_PREFETCH,
    MOE_SMALL_RINGPF_CHUNK,
    MOE_SMALL_ROUTE,
    MOE_SMALL_ROUTE_ATOMIC,
    MOE_SMALL_ROUTE_ATOMIC16,
    MOE_SMALL_ROUTE_GATHER,
    MOE_SMALL_ROUTE_TMA,
    MOE_SMALL_SLOTS,
    MOE_SMALL_SLOTS_BULK,
    MOE_SMALL_SLOTS_CHUNK,
    MOE_SMALL_SLOTS_FUSED,
    MOE_SMALL_SLOTS_GEMV,
    MOE_SMALL_SLOTS_GEMV_CHUNK,
    MOE_SMALL_SLOTS_GEMV_LAST,
    MOE_SMALL_SLOTS_L2,
    MOE_SMALL_SLOTS_LOGITS,
    MOE_SMALL_SLOTS_RING,
    MOE_SMALL_SPLIT,
    MOE_SMALL_SUB,
    MOE_SMALL_TICKET,
    MOE_SMALL_TMA,
    MOE_SMALL_TMA_CHUNK,
    MOE_SMALL_TMA_REFILL,
    MOE_SMALL_TMA_RING,
    MOE_SMALL_TMA_RING_DIRECT,
    MOE_SMALL_TMA_SHORT,
    MOE_SMALL_TMA_TICKET,
    MOE_SMALL_TMA_TOPK,
    SCHEDULES,
    TENSOR_PARALLEL_VARIANTS,
    TRIGGER_TABLE_GRAPHS,
    gemm_meet,
    llama_1b_large_close,
    llama_1b_large_variants,
    llama_tiny_variants,
    splitk_pooled,
    tensor_parallel_variant,
)


def build_broken(K: int = 256, k_split: int = 4, kept_zero: bool = False) -> etc.Graph:
    g = etc.Graph("splitk")
    n = g.symbol("n")
    A = g.tensor("A", (n, K), "f32")
    B = g.tensor("B", (n, k_split), "f32", kept_zero=kept_zero)
    C = g.tensor("C", (n,), "f32")
    T = g.tensor("T", (n,), "i32")
    E = g.event((n,), wait_count=T, name="E")
    g.task(
        rowsum.partial_sum(1, k_split, K), grid=(n, k_split), args=(A, B), out_edges={E: "ij->i"}
    )
    g.task(rowsum.final_sum(1, k_split), grid=(n,), args=(B, C), in_edges={E: "i->i"})
    return g


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument(
        "--only",
        default="",
        help="build only the artifacts whose name starts with one of these (comma-separated; "
        "a trailing $: that name exactly)",
    )
    args = p.parse_args(argv)
    wants = args.only.split(",")

    def wanted(name: str) -> bool:
        return any(name == w[:-1] if w.endswith("$") else name.startswith(w) for w in wants)

    graphs = {
        "splitk": build_splitk(K=256, k_split=4, rows_per_task=1),
        "broken": build_broken(),
        # The partials declared kept zero: a failed launch must zero them.
        "broken_kept": build_broken(kept_zero=True),
    }
    try:
        from examples.symbolic_batch import build as build_batch

        graphs["symbolic_batch"] = build_batch()
    except ImportError:
        pass
    jobs = [(name, g, "static", True) for name, g in graphs.items()]
    for suffix, (schedule, early) in SCHEDULES.items():
        if schedule == "static":
            continue
        jobs += [
            (f"{name}_{suffix}", graphs[name], schedule, early) for name in ("splitk", "broken")
        ]
    for name, build in {**GRAPHS, **TRIGGER_TABLE_GRAPHS}.items():
        g = build()
        jobs += [(f"{name}_{s}", g, schedule, early) for s, (schedule, early) in SCHEDULES.items()]
    jobs += [
        (f"splitk_traced_{suffix}", graphs["splitk"], schedule, early, True)
        for suffix, (schedule, early) in SCHEDULES.items()
    ]
    # The split-K graph with its partial sums dealt at run time: one pool, a pool per row.
    jobs += [
        (f"splitk_{kind}_{suffix}", splitk_pooled(per_row), schedule, early)
        for kind, per_row in (("pool", False), ("poolrow", True))
        for suffix, (schedule, early) in SCHEDULES.items()
    ]
    # The split-K graph with its tiles called instead of inlined (outline=True).
    jobs += [
        (f"splitk_outlined_{suffix}", graphs["splitk"], schedule, early)
        for suffix, (schedule, early) in SCHEDULES.items()
    ]
    from etc.models import moe

    moe_graph = moe.build_moe_graph(MOE_SMALL, name="moe_small")
    jobs += [
        (f"moe_small_{suffix}", moe_graph, schedule, early)
        for suffix, (schedule, early) in SCHEDULES.items()
    ]
    for tiles, cfg in (
        ("ring", MOE_SMALL_RING), ("ringpf", MOE_SMALL_RING_PREFETCH), ("route", MOE_SMALL_ROUTE),
        ("route_unguarded", MOE_SMALL_ROUTE), ("ticket", MOE_SMALL_TICKET),
        ("slots", MOE_SMALL_SLOTS), ("slots_logits", MOE_SMALL_SLOTS_LOGITS),
        ("slots_l2", MOE_SMALL_SLOTS_L2), ("slots_ring", MOE_SMALL_SLOTS_RING),
        ("slots_fused", MOE_SMALL_SLOTS_FUSED), ("slots_gemv", MOE_SMALL_SLOTS_GEMV),
        ("slots_gemv_chunk", MOE_SMALL_SLOTS_GEMV_CHUNK),
        ("slots_gemv_last", MOE_SMALL_SLOTS_GEMV_LAST),
        ("chunk", MOE_SMALL_CHUNK), ("ringpf_chunk", MOE_SMALL_RINGPF_CHUNK),
        ("slots_chunk", MOE_SMALL_SLOTS_CHUNK), ("slots_bulk_chunk", MOE_SMALL_SLOTS_BULK),
    ):  # fmt: skip
        moe_ring = moe.build_moe_graph(
            cfg, name=f"moe_small_{tiles}", **MOE_GRAPH_OPTIONS.get(f"_{tiles}", {})
        )
        jobs += [
            (f"moe_small_{tiles}_{suffix}", moe_ring, schedule, early)
            for suffix, (schedule, early) in SCHEDULES.items()
        ]
    options: dict[str, dict] = {}  # more etc.compile options, by artifact
    for tiles, cfg in (
        ("tma", MOE_SMALL_TMA), ("split", MOE_SMALL_SPLIT), ("sub", MOE_SMALL_SUB),
        ("route_tma", MOE_SMALL_ROUTE_TMA), ("gather", MOE_SMALL_GATHER),
        ("route_gather", MOE_SMALL_ROUTE_GATHER), ("atomic", MOE_SMALL_ATOMIC),
        ("route_atomic", MOE_SMALL_ROUTE_ATOMIC), ("atomic16", MOE_SMALL_ATOMIC16),
        ("route_atomic16", MOE_SMALL_ROUTE_ATOMIC16), ("tma_ticket", MOE_SMALL_TMA_TICKET),
        ("tma_short", MOE_SMALL_TMA_SHORT), ("tma_chunk", MOE_SMALL_TMA_CHUNK),
        ("gather_tma", MOE_SMALL_GATHER_TMA), ("tma_refill", MOE_SMALL_TMA_REFILL),
        ("bulk_permute", MOE_SMALL_BULK_PERMUTE), ("tma_ring", MOE_SMALL_TMA_RING),
        ("tma_ring_direct", MOE_SMALL_TMA_RING_DIRECT), ("tma_topk", MOE_SMALL_TMA_TOPK),
    ):  # fmt: skip
        moe_tma = moe.build_moe_graph(cfg, name=f"moe_small_{tiles}")
        for suffix, (schedule, early) in SCHEDULES.items():
            jobs.append((f"moe_small_{tiles}_{suffix}", moe_tma, schedule, early))
            options[f"moe_small_{tiles}_{suffix}"] = {"target": "sm_90a"}
    for meet in GEMM_MEETS:
        for suffix, (schedule, early) in SCHEDULES.items():
            jobs.append((f"{meet}_{suffix}", gemm_meet(meet), schedule, early))
            options[f"{meet}_{suffix}"] = {"target": "sm_90a"}
    for meet in GEMM_MEET_SHARES:  # parts that wait for each other: static lists only
        jobs.append((f"{meet}_static", gemm_meet(meet), "static", True))
        options[f"{meet}_static"] = {"target": "sm_90a"}
    from etc.models import llama

    bucketed = []  # (name, configuration, schedule, early push): one artifact, two kernels
    for prefix, cfg in llama_tiny_variants().items():
        decoder = llama.build_decoder_graph(cfg, name="llama_tiny")
        for suffix, (schedule, early) in SCHEDULES.items():
            if cfg.batch_buckets or cfg.uses_tma:  # compile_decoder's options per schedule
                bucketed.append((f"{prefix}_{suffix}", cfg, schedule, early))
                continue
            jobs.append((f"{prefix}_{suffix}", decoder, schedule, early))
            options[f"{prefix}_{suffix}"] = llama.compile_options(cfg, schedule)
    for name, cfg, schedule, early in bucketed:
        if wanted(name):
            art = llama.compile_decoder(cfg, schedule, name="llama_tiny", early_push=early)
            art.save(args.out / name)
            print(
                f"{name}: {args.out / name} ({schedule}, {len(art.leaves()) if hasattr(art, 'leaves') else 1} kernels)"
            )
    # Llama-3.2-1B's large-batch kernel, and the same with projections on
    # different TMA stage counts (their rings and barriers overlay otherwise):
    # the tiny decoder did not reproduce the missing mbarrier.inval, this did.
    for name, cfg in {**llama_1b_large_variants(), **llama_1b_large_close()}.items():
        if wanted(name):
            llama.compile_decoder(cfg, "static").save(args.out / name)
            print(f"{name}: {args.out / name} (static)")
    # The MoE presets in one artifact, a kernel per range of T (compile_moe),
    # and the same with every kernel's expert weights chunked.
    for schedule in ("static", "dynamic"):
        for chunk, tag in ((0, ""), (64, "_ch64")):
            name = f"moe_small_family{tag}_{schedule}"
            if wanted(name):
                artifact = moe.compile_moe(
                    schedule=schedule, weight_chunk=chunk, **MOE_FAMILY_SIZES
                )
                artifact.save(args.out / name)
                print(f"{name}: {args.out / name} ({schedule}, {len(moe.PRESET_BUCKETS)} kernels)")
    from etc.models import collective

    for variant in ("gemm_rs", "ag_gemm", *TENSOR_PARALLEL_VARIANTS):
        layer, cfg, compile_options = tensor_parallel_variant(variant)
        build = collective.gemm_reduce_scatter if layer == "gemm_rs" else collective.allgather_gemm
        g = build(cfg, name=variant)
        for suffix, (schedule, early) in SCHEDULES.items():
            jobs.append((f"{variant}_small_{suffix}", g, schedule, early))
            options[f"{variant}_small_{suffix}"] = compile_options
    for suffix in SCHEDULES:
        options[f"splitk_outlined_{suffix}"] = {"outline": True}
    for name, g, schedule, early, *traced in jobs:
        if not wanted(name):
            continue
        kw = {"schedule": schedule, **options.get(name, {})}
        artifact = etc.compile(g, early_push=early, trace=bool(traced), **kw)
        artifact.save(args.out / name)
        print(
            f"{name}: {args.out / name} ({schedule}, {'cubin' if artifact.cubin else 'ptx only'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

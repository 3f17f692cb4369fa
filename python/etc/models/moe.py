"""The Qwen3-30B-A3B mixture-of-experts layer as one ETC graph (issue 6).

Eight tasks, one persistent kernel (``docs/moe.md``)::

    clear --cleared--> logits(i, j) --scored[i]--> topk(i, j) --routed--> plan(p)
        --planned--> permute(e) --gu_ready[e]--> gate_up(i, e) --h_ready[e]--> down(i, e)
        --down_done--> combine

With ``MoEConfig(route="fused")`` (decode) the routing is one hop::

    logits(i, j) --scored--> route --planned--> permute(e) ...

With ``MoEConfig(route="slots")`` (a few tokens) there are no tables and no
triggers: static grids over the ``T * topk`` slots, each slot's tiles
reading their expert from ``topk_ids`` (``etc.tiles.gemm.moe_gate_up(
slots=K)``)::

    logits --scored--> topk --routed--> gate_up(s, j) --h_ready[s]--> down(s, j)
        --down_done--> combine

(with ``slot_logits`` the gate/up tiles pick their experts from the logits
themselves and wait for ``scored``; the down tiles also wait for ``routed``;
``gemm="gemv"`` puts the slots on :mod:`etc.tiles.gemv`'s CUDA-core tiles,
the ``single`` and ``few`` presets; ``fuse_down`` drops the down task: each
gate/up tile adds its columns' down projection into ``Out32``, then ``cast``).

With ``MoEConfig(combine="atomic")`` the down tiles add their weighted rows
into float32 sums ``Out32`` (half-precision ``Out16`` with
``combine_dtype="f16"``; cleared by a ``zero`` task the routing's last
task waits for), and ``cast`` replaces ``combine``::

    zero(i) --zeroed--> plan (or route) ... down(i, e) --down_done--> cast

``gate_up`` and ``down`` are *triggered* tasks: expert e's tiles are the
global tile indices ``[gu_indptr[e], gu_indptr[e+1])`` (a table the plan
writes), released when ``gu_ready[e]`` (resp. ``h_ready[e]``) completes.

What is here: :class:`MoEConfig`, :func:`build_moe_graph`,
:func:`build_unfused_graphs` (each task as its own graph, for the unfused
baseline), :func:`reference_moe` (float32 numpy), :func:`random_weights`,
:func:`random_tokens`, the launch inputs for the simulator
(:func:`numpy_inputs`) and the GPU (:func:`torch_inputs`), and numpy
references of the two expert GEMM tiles (:func:`gate_up_reference`,
:func:`down_reference`) with :func:`run_tile_references`, which chains every
tile's reference in graph order without the scheduler.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .._fields import check_config, is_int
from ..device import DeviceFunction
from ..dtypes import bf16_to_f32, dtype, f32_to_bf16, torch_dtype
from ..errors import GraphError
from ..graph import DEALS, Graph
from ..tiles import _mma
from ..tiles import gemv as gemv_tiles
from ..tiles import moe as moe_tiles

__all__ = [
    "MoEConfig",
    "SCRATCH",
    "PRESETS",
    "PREFILL_YP",
    "SLOT_MMA_PRESETS",
    "PRESET_BUCKETS",
    "PRESET_MIN_CTAS_PER_SM",
    "PRESET_OUTLINE",
    "PRESET_TARGETS",
    "preset",
    "preset_family",
    "compile_moe",
    "expert_gemm_tiles",
    "ROUTINGS",
    "UNFUSED_TASKS",
    "build_moe_graph",
    "build_unfused_graphs",
    "has_trigger_api",
    "reference_moe",
    "random_weights",
    "random_tokens",
    "random_weights_torch",
    "random_tokens_torch",
    "reference_moe_torch",
    "numpy_inputs",
    "torch_inputs",
    "weight_chunks",
    "kernel_weights",
    "tensor_shapes",
    "gate_up_reference",
    "down_reference",
    "run_tile_references",
    "rel_err",
]

_TMA_OPTIONS = (("smem_limit", 220 << 10), ("stages", 4), ("core", "tma"))

_PREFILL = dict(
    gemm="tc",
    block_m=128,
    block_n_gu=128,
    block_n_dn=256,
    router="tc",
    router_block=128,
    router_experts=128,
    router_splits=4,
    gate_up_options=_TMA_OPTIONS,
    down_options=_TMA_OPTIONS,
)
#: The prefill down tiles' 512 columns in two passes of 256 through one ring
#: (``sub_ring``: the second pass's first k-tiles load during the first's
#: epilogue), staged in halves beside the 4-stage ring under 226 KiB.
_DOWN_RING = (("sub_n", 256), ("sub_ring", True), ("smem_limit", 226 << 10))
_SPLIT_OPTIONS = (("smem_limit", 220 << 10), ("stages", 5), ("core", "tma"), ("split_n", True))
_SLOT_DOWN = (("warps", (1, 4, 2)), ("stages", 4), ("unroll", 2), ("rotate_k", True))
_SINGLE_MMA = dict(
    route="slots",
    slot_logits=True,
    block_m=16,
    block_n_gu=32,
    block_n_dn=64,
    gate_up_options=(("stages", 4), ("unroll", 2), ("rotate_k", True)),
    down_options=(*_SLOT_DOWN, ("prefetch_ring", True)),
)
#: The ``single`` and ``few`` presets on the ``mma.sync`` slot tiles
#: (``gemm="reg"``), as they were until the GEMV tiles replaced them
#: (``bench/RESULTS.md``, MoE, item 103): kept for comparisons.
SLOT_MMA_PRESETS: dict[str, dict[str, Any]] = {
    "single": _SINGLE_MMA,
    "few": dict(_SINGLE_MMA, slot_logits=False, down_options=_SLOT_DOWN),
}
_SINGLE = dict(
    _SINGLE_MMA,
    gemm="gemv",
    block_n_gu=24,
    combine="last",
    gate_up_options=(("stages", 12),),
    down_options=(("stages", 8), ("prefetch_ring", True)),
)

#: Tile configurations measured best on an H200 (``bench/RESULTS.md``):
#:
#: * ``single`` (T <= 2): no routing tables (``route="slots"``): static
#:   grids of (token's k-th expert, column block) tiles, each gate/up tile
#:   picking its expert from the router logits itself (``slot_logits``):
#:   the first weight is read two hops after the logits instead of five. The
#:   tiles are :mod:`etc.tiles.gemv`'s (``gemm="gemv"``: CUDA cores, whole
#:   128-byte lines per warp copy, 12 / 8 ring slots; 6-12 % faster than the
#:   ``mma.sync`` slot tiles of :data:`SLOT_MMA_PRESETS`). No ring prefetch
#:   before the gate/up waits (no expert is known then): the down tiles fill
#:   their ring's first chunks once the top-k is done, before they wait for
#:   their slot's rows (``Graph.task(prefetch_after=1)``). 24-column gate/up
#:   blocks (256 tiles at T = 1 for 264 CTAs), and the last of a token's
#:   down tiles of a column block sums the block (``combine="last"``: no
#:   combine task); one expert per router CTA (128 logits CTAs, ~0.5 µs
#:   sooner).
#: * ``few`` (T 3-8): ``single`` with the experts read from the top-k
#:   task's ``topk_ids`` (a top-k per tile costs more than the hop once
#:   each CTA runs several slot tiles), 32-column gate/up blocks.
#: * ``decode`` (T 6-8 until the GEMV ``few`` took them; in no bucket now):
#:   16-row tiles, narrow column blocks so a few active experts still fill
#:   the GPU (32-column gate/up: one wave of 192 instances at T = 1),
#:   weights through a per-thread ``cp.async`` ring of 4 stages whose first
#:   groups the tiles' prefetch functions fill once an instance knows its
#:   expert, before it waits for the expert's rows; k loops rotated per tile.
#: * ``prefill`` (T > 896): 128-row ``etc.tiles.gemm_tc`` tiles fed by
#:   TMA, gate/up 128 and down 256 columns, 4 stages refilled once free
#:   (``refill="test"``), and the router's logits on the same tile, its k
#:   loop in 4 parts; the down tiles add their weighted rows into
#:   half-precision sums (``combine="atomic"``, ``combine_dtype="f16"``: no
#:   ``Yp``, a cast of 32 tokens a CTA instead of the combine; sums past
#:   65504 overflow to infinity). −4 to −5 % at T = 4096, −1 to −2 % at
#:   1024 against the ``Yp`` path (``PREFILL_YP``; ``bench/RESULTS.md``, MoE
#:   item 140).
#: * ``mid`` (T from 9 to 896: a few row blocks per expert): ``prefill``
#:   on 64-row tiles whose two warpgroups split the columns (``split_n``),
#:   5 stages, the GEMM tiles dealt by ticket (``gemm_deal``).
#:
#: Compile for ``PRESET_TARGETS`` (TMA and wgmma are sm_90a) with
#: ``PRESET_MIN_CTAS_PER_SM``.
PRESETS: dict[str, dict[str, Any]] = {
    "decode": dict(
        block_m=16,
        block_n_gu=32,
        block_n_dn=64,
        gate_up_options=(
            ("stages", 4),
            ("unroll", 2),
            ("rotate_k", True),
            ("prefetch_ring", True),
        ),
        down_options=(
            ("warps", (1, 4, 2)),
            ("stages", 4),
            ("unroll", 2),
            ("rotate_k", True),
            ("prefetch_ring", True),
        ),
    ),  # fmt: skip
    "single": dict(_SINGLE, router_experts=1),
    "few": dict(_SINGLE, slot_logits=False, block_n_gu=32),
    "prefill": dict(
        _PREFILL,
        gate_up_options=(*_TMA_OPTIONS, ("refill", "test")),
        down_options=(*_TMA_OPTIONS, ("refill", "test")),
        combine="atomic",
        combine_dtype="f16",
        combine_block=32,
        combine_unroll=8,
    ),
    "mid": dict(
        _PREFILL,
        block_m=64,
        gate_up_options=_SPLIT_OPTIONS,
        down_options=_SPLIT_OPTIONS,
        gemm_deal="ticket",
    ),  # fmt: skip
}
#: ``prefill`` past T = 2048 (``PRESET_BUCKETS``): top-k blocks of 32 tokens
#: (128 CTAs at T = 4096 instead of 512) and the permute by bulk copies
#: through 48 slots a CTA (``permute_slots``): −0.6..−0.8 % at T = 3072 and
#: 4096 and +1 % at T = 1024 in one run (``bench/RESULTS.md``, MoE item 145);
#: and down tiles of 512 columns in two passes of 256 through one ring
#: (``_DOWN_RING``): −0.8..−1.1 % at T = 4096, ±0.5 % at 1024-3072 (MoE item 159).
PRESETS["prefill_large"] = dict(
    PRESETS["prefill"], topk_block=32, permute_slots=48, block_n_dn=512,
    down_options=(*PRESETS["prefill"]["down_options"], *_DOWN_RING),
)  # fmt: skip
#: The ``prefill`` preset as it was through the thirty-second session: the
#: down tiles write ``Yp`` and a combine task sums each token's rows in
#: float32 (no overflow past 65504; 4-5 % slower at T = 4096).
PREFILL_YP: dict[str, Any] = dict(_PREFILL)
#: The target each preset needs (wgmma and TMA are sm_90a).
PRESET_TARGETS = {
    "single": "sm_90", "few": "sm_90", "decode": "sm_90", "prefill": "sm_90a", "mid": "sm_90a",
    "prefill_large": "sm_90a",
}  # fmt: skip
#: ``etc.compile(min_ctas_per_sm=...)`` for the presets: the decode kernel
#: otherwise takes its hungriest tile's 255 registers (one CTA per SM); the
#: TMA tiles' rings of 192-200 KiB allow one CTA per SM anyway (0: no cap).
PRESET_MIN_CTAS_PER_SM = {
    "single": 2, "few": 2, "decode": 2, "prefill": 0, "mid": 0, "prefill_large": 0,
}  # fmt: skip
#: ``etc.compile(outline=...)`` for the presets: the tasks whose tiles stay
#: called functions (the others are inlined). ``prefill_large``'s top-k: its
#: registers its own, the kernel's spills 28 -> 12 bytes, −0.2..−1.2 % at T =
#: 1024-4096 (``bench/RESULTS.md``, MoE item 165); ``prefill`` has no spills
#: to lose and did not move.
PRESET_OUTLINE: dict[str, tuple[str, ...]] = {"prefill_large": ("topk",)}


#: The presets by token count for one artifact (:func:`compile_moe`):
#: ``(largest T, preset)``, increasing, the last without a bound. From the
#: H200 measurements (``bench/RESULTS.md``, items 91, 95-99 and 104):
#: ``single`` up to T = 2, ``few`` to T = 8 (2-8 % ahead of ``decode`` at
#: 5-8; ``mid`` ahead from 9), ``mid`` from T = 9 to 896 (2-10 % ahead of
#: ``prefill`` at 256, 512, 640, 768, 896), ``prefill`` from 1024 to 2048
#: and ``prefill_large`` past it (item 145; session 35).
PRESET_BUCKETS: tuple[tuple[int | None, str], ...] = (
    (2, "single"),
    (8, "few"),
    (896, "mid"),
    (2048, "prefill"),
    (None, "prefill_large"),
)


def preset(name: str, **overrides: Any) -> MoEConfig:
    """The :data:`PRESETS` configuration ``name``, with fields overridden
    (and block widths that no longer divide an overridden size narrowed)."""
    if name not in PRESETS:
        raise GraphError(f"MoE preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    known = {f.name for f in dataclasses.fields(MoEConfig)}
    unknown = [key for key in overrides if key not in known]
    if unknown:
        raise GraphError(
            f"MoE preset {name!r}: {unknown[0]!r} is not a MoEConfig field "
            f"({', '.join(sorted(known))})"
        )
    fields = {**PRESETS[name], **overrides}
    if fields.get("router") == "tc" and "router_experts" not in overrides:
        # Expert blocks that still divide an overridden expert count.
        experts = fields.get("experts", MoEConfig.experts)
        fields["router_experts"] = math.gcd(fields["router_experts"], experts)
    inter = fields.get("inter", MoEConfig.inter)
    if (
        fields.get("gemm") == "gemv"
        and "block_n_gu" not in overrides
        and inter % fields["block_n_gu"]
    ):
        # single's 24 columns divide Qwen3's 768: elsewhere the widest
        # multiple of 4 below it that divides inter (16 for 512).
        fits = [n for n in range(4, fields["block_n_gu"] + 1, 4) if inter % n == 0]
        fields["block_n_gu"] = fits[-1] if fits else fields["block_n_gu"]
    hidden = fields.get("hidden", MoEConfig.hidden)
    block_n_dn = fields.get("block_n_dn", MoEConfig.block_n_dn)
    if "block_n_dn" not in overrides and hidden % block_n_dn:
        # prefill's 512 down columns: halved until they divide hidden, the
        # ring's passes (sub_n) no wider than the block.
        while block_n_dn > 8 and hidden % block_n_dn:
            block_n_dn //= 2
        fields["block_n_dn"] = block_n_dn
        fields["down_options"] = tuple(
            (key, min(value, block_n_dn) if key == "sub_n" else value)
            for key, value in fields.get("down_options", ())
        )
    return MoEConfig(**fields)


#: The graphs of :func:`build_unfused_graphs`, in launch order (``route="split"``;
#: :func:`unfused_tasks` for any configuration).
UNFUSED_TASKS = ("clear", "logits", "topk", "plan", "permute", "gate_up", "down", "combine")
#: ``MoEConfig.route`` values.
ROUTES = ("split", "fused", "slots")
#: ``MoEConfig.combine`` values.
COMBINES = ("task", "atomic", "last")


def unfused_tasks(cfg: MoEConfig) -> tuple[str, ...]:
    """The task names of :func:`build_unfused_graphs` for ``cfg``, in launch order."""
    if cfg.route == "fused":
        tasks = ("logits", "route", "permute", "gate_up", "down", "combine")
    elif cfg.route == "slots":
        if cfg.fuse_down:  # the gate/up tiles add their down projections
            return ("zero", "logits", "topk", "gate_up", "cast")
        if cfg.combine == "last":  # the down tiles combine
            return ("logits", "topk", "gate_up", "down")
        return ("logits", "topk", "gate_up", "down", "combine")
    else:
        tasks = UNFUSED_TASKS
    if cfg.combine == "atomic":  # the down tiles add into Out32, zeroed first
        tasks = ("zero",) + tuple("cast" if x == "combine" else x for x in tasks)
    # A gathering gate/up tile needs no permute (release has no work alone).
    return tuple(x for x in tasks if x != "permute") if cfg.gather else tasks


#: Routings the examples and benchmarks know (see :func:`random_weights`).
ROUTINGS = ("uniform", "one-expert", "few-experts", "top1")


#: The scratch buffers a configuration may declare without using them
#: (``MoEConfig.extra_buffers``): the permuted rows, the down tiles' rows,
#: and the atomic combine's float32 and half-precision sums.
SCRATCH = ("Xp", "Yp", "Out32", "Out16")


@dataclass(frozen=True)
class MoEConfig:
    """Sizes of one MoE layer (defaults: Qwen3-30B-A3B) and its tile sizes.

    ``block_m`` rows per expert GEMM tile, ``block_n_gu`` columns of I per
    gate/up tile, ``block_n_dn`` columns of H per down tile; ``router_block``
    tokens per router block (a logits CTA computes them for
    ``router_experts`` experts; a top-k CTA takes ``topk_block`` of them),
    ``combine_block`` tokens per combine CTA. The token count T is the graph
    symbol ``T``.
    """

    hidden: int = 2048
    inter: int = 768
    experts: int = 128
    topk: int = 8
    block_m: int = 64
    block_n_gu: int = 64
    block_n_dn: int = 128
    router_block: int = 32
    router_experts: int = 2
    topk_block: int = 8
    combine_block: int = 4
    block_size: int = 256
    #: (row, chunk) pairs a permute thread moves per step, and (token, chunk)
    #: pairs a combine (or cast) thread sums per step: the loads each thread
    #: keeps in flight (``etc.tiles.moe.permute`` / ``combine`` / ``cast_rows``).
    permute_unroll: int = moe_tiles.PERMUTE_UNROLL
    combine_unroll: int = 1
    #: Tokens a top-k warp selects at a time, their loads and atomics issued
    #: together (``etc.tiles.moe.router_topk(unroll=...)``): for top-k blocks
    #: of several tokens a warp.
    topk_unroll: int = 1
    #: > 0: the permute moves whole rows by bulk copies through this many
    #: shared-memory slots (one copying thread each) instead of 16-byte
    #: loads (``etc.tiles.moe.permute(slots=...)``; sm_90).
    permute_slots: int = 0
    #: > 0: the static schedule deals the permute (or release) instances, one
    #: per expert, over the first this many CTAs only (``Graph.task(ctas=...)``),
    #: so those copy the experts' rows in expert order while the other CTAs
    #: start the first experts' gate/up tiles; 0: over every CTA.
    permute_ctas: int = 0
    #: Pipeline stages of the router's TMA tile (``router="tc"``).
    router_stages: int = 4
    #: ``router="tc"``: the logits' k loop split over this many CTAs per
    #: block (partial sums, added by the top-k tile in part order): one
    #: block's logits took 17 µs on one CTA, 32 k-tiles in a row.
    router_splits: int = 1
    #: GEMM tiles: "reg" (etc.tiles.gemm, fragments streamed from global
    #: memory: decode), "tc" (etc.tiles.gemm_tc, cp.async + ldmatrix
    #: pipeline: prefill) or, with ``route="slots"``, "gemv" (etc.tiles.gemv:
    #: CUDA-core slot tiles streaming whole 128-byte lines), with extra
    #: keyword options for each tile.
    gemm: str = "reg"
    gate_up_options: tuple[tuple[str, Any], ...] = ()
    down_options: tuple[tuple[str, Any], ...] = ()
    #: Router logits: "simt" (``etc.tiles.moe.router_logits``, CUDA cores;
    #: ``router_experts`` experts per CTA, good for few tokens) or "tc" (the
    #: TMA + wgmma GEMM tile of ``etc.tiles.gemm_tc``, float32 out: one CTA per
    #: 128 tokens and ``router_experts`` experts; needs ``router_block=128``,
    #: ``router_experts`` a multiple of 8 and sm_90a).
    router: str = "simt"
    #: The routing between the logits and the permute: "split" (``clear``,
    #: ``topk`` and ``plan``: parallel tiles, three dependent hops) or "fused"
    #: (one ``route`` CTA, a warp per token at a time: one hop, for decode;
    #: ``T`` then has the bound ``route_max_tokens``) or "slots" (no tables:
    #: a static grid of ``T * topk`` slots whose gate/up and down tiles read
    #: their expert from ``topk_ids``, every slot streaming its own expert's
    #: weights: two hops fewer before the first weight, for T = 1; needs
    #: ``gemm="reg"`` and ``combine="task"``).
    route: str = "split"
    route_max_tokens: int = moe_tiles.ROUTE_MAX_TOKENS
    #: The gate/up tiles read their rows from the tokens (``X[perm[r] //
    #: topk]``, each thread's ``cp.async``) instead of a permuted copy ``Xp``:
    #: no ``Xp`` (T * topk rows written, then read), and the permute task
    #: becomes ``release``, which only releases each expert. Needs the TMA
    #: gate/up tile (``gemm="tc"``, ``core="tma"``, not ``split_n``).
    gather: bool = False
    #: How each token's K expert rows are summed: "task" (the down tiles
    #: write the permuted rows ``Yp`` in bf16; a ``combine`` task gathers
    #: and sums them in float32) or "atomic" (the down tiles add their
    #: weighted rows into the float32 sums ``Out32`` with L2 reductions; a
    #: ``zero`` task clears ``Out32`` first, ``zero_block`` tokens per CTA,
    #: and a ``cast`` task, ``combine_block`` tokens per CTA, writes ``Out``;
    #: no ``Yp``; the add order varies between launches, so the sums may
    #: differ in their last float32 bits). "atomic" needs the TMA down tile
    #: (``gemm="tc"``, ``core="tma"``, not ``split_n``). "last" (``route=
    #: "slots"``, ``gemm="gemv"``): the last of a token's slot down tiles of
    #: a column block sums the block's rows into ``Out`` (the combine task's
    #: sum) and no task follows them; counters in ``Ycount``, which return
    #: to zero after every launch (start them at zero; the runtime zeroes
    #: them after a failed launch: ``Graph.tensor(kept_zero=True)``).
    combine: str = "task"
    zero_block: int = 32
    #: The sums of an atomic combine: "f32" (``Out32``) or "f16" (``Out16``:
    #: each weighted row rounded to half precision and added in 16-byte
    #: chunks, a quarter of float32's L2 reductions; sums past 65504
    #: overflow to infinity).
    combine_dtype: str = "f32"
    #: How the static schedule deals the gate/up and down tiles
    #: (``Graph.task(deal=...)``): "list" (each CTA runs the tiles its list
    #: names) or "ticket" (each of a CTA's slots runs the next tile no CTA
    #: has claimed, so the GEMM phases end evenly across CTAs).
    gemm_deal: str = "list"
    #: Rows of the ``logits`` buffer per token (0: ``router_splits``). The
    #: kernels of one artifact share their buffers (:func:`compile_moe`), so
    #: each declares the family's largest ``router_splits``; a kernel with
    #: fewer parts leaves the spare rows unused and its top-k takes T from
    #: ``topk_ids``.
    logits_parts: int = 0
    #: Scratch buffers the graph declares although its tasks use none of them
    #: (any of :data:`SCRATCH`): the kernels of one artifact take one set of
    #: buffers, so :func:`preset_family` gives each the family's others
    #: (``prefill``'s ``Out16`` to the presets that write ``Yp``, and back).
    extra_buffers: tuple[str, ...] = ()
    #: ``route="slots"``: the gate/up tiles pick their own experts from the
    #: router logits (every warp repeats the top-k, ~0.5 µs) instead of
    #: reading ``topk_ids`` after the top-k task: one hop fewer.
    slot_logits: bool = False
    #: ``route="slots"`` with ``slot_logits`` and ``combine="atomic"``: each
    #: gate/up tile also projects its own columns down and adds them, with
    #: the routing weight, into ``Out32`` (``moe_gate_up(fuse_down=True)``):
    #: no down task, so no CTA waits for a whole slot's gate/up rows and
    #: each tile streams its gate/up rows and its slice of the down weights
    #: back to back. ``zero`` clears ``Out32`` first and ``cast`` rounds it.
    fuse_down: bool = False

    def weight_name(self, key: str) -> str:
        """The graph's tensor for expert weight ``key`` (``Wgu`` or ``Wd``):
        ``<key>_c<chunk>`` when the tiles read it chunked (``weight_chunk``),
        so a launch given nn.Linear weights under the plain name is refused
        instead of computing with them."""
        chunk = weight_chunks(self).get(key, 0)
        return f"{key}_c{chunk}" if chunk else key

    def __post_init__(self) -> None:
        check_config(self, self._check)

    def _check(self) -> None:
        """The checks of the fields' values (:func:`check_config` adds their types)."""
        if not isinstance(self.extra_buffers, tuple) or not set(self.extra_buffers) <= set(SCRATCH):
            raise GraphError(
                f"MoEConfig: extra_buffers must be a tuple of {', '.join(SCRATCH)}, "
                f"got {self.extra_buffers!r}"
            )
        for key in (
            "hidden",
            "inter",
            "experts",
            "topk",
            "block_m",
            "block_n_gu",
            "block_n_dn",
            "router_block",
            "router_experts",
            "topk_block",
            "combine_block",
            "zero_block",
            "block_size",
            "permute_unroll",
            "combine_unroll",
            "topk_unroll",
            "router_stages",
            "router_splits",
            "route_max_tokens",
        ):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GraphError(f"MoEConfig: {key} must be a positive int, got {value!r}")
        slots = self.permute_slots
        if (
            not isinstance(slots, int)
            or isinstance(slots, bool)
            or not 0 <= slots <= self.block_size
        ):
            raise GraphError(
                f"MoEConfig: permute_slots must be an int from 0 to block_size={self.block_size}, "
                f"got {slots!r}"
            )
        if self.gemm not in ("reg", "tc", "gemv"):
            raise GraphError(f"MoEConfig: gemm must be 'reg', 'tc' or 'gemv', got {self.gemm!r}")
        if self.route not in ROUTES:
            raise GraphError(
                f"MoEConfig: route must be one of {', '.join(map(repr, ROUTES))}, got {self.route!r}"
            )
        if not isinstance(self.slot_logits, bool):
            raise GraphError(f"MoEConfig: slot_logits must be a bool, got {self.slot_logits!r}")
        if self.slot_logits and self.route != "slots":
            raise GraphError(
                f"MoEConfig: slot_logits picks the slot tiles' experts; it needs route='slots', "
                f"got route={self.route!r}"
            )
        if not isinstance(self.fuse_down, bool):
            raise GraphError(f"MoEConfig: fuse_down must be a bool, got {self.fuse_down!r}")
        if self.fuse_down and not (
            self.route == "slots" and self.slot_logits and self.combine == "atomic"
            and self.combine_dtype == "f32"
        ):  # fmt: skip
            raise GraphError(
                "MoEConfig: fuse_down adds the slot gate/up tiles' down projections into float32 "
                "sums; it needs route='slots', slot_logits=True, combine='atomic' and "
                f"combine_dtype='f32'; got route={self.route!r}, slot_logits={self.slot_logits!r}, "
                f"combine={self.combine!r}, combine_dtype={self.combine_dtype!r}"
            )
        slot_combine = ("atomic",) if self.fuse_down else ("task", "last")
        if self.route == "slots" and (
            self.gemm not in ("reg", "gemv") or self.combine not in slot_combine or self.gather
        ):
            raise GraphError(
                "MoEConfig: route='slots' needs gemm='reg' or 'gemv', combine "
                f"{' or '.join(map(repr, slot_combine))} "
                f"and no gather; got gemm={self.gemm!r}, combine={self.combine!r}, "
                f"gather={self.gather!r}"
            )
        if self.gemm == "gemv" and (self.route != "slots" or self.fuse_down):
            raise GraphError(
                "MoEConfig: gemm='gemv' is the slot tiles' CUDA-core GEMV (etc.tiles.gemv): it "
                f"needs route='slots' and no fuse_down; got route={self.route!r}, "
                f"fuse_down={self.fuse_down!r}"
            )
        if self.combine == "last" and (self.route != "slots" or self.gemm != "gemv"):
            raise GraphError(
                "MoEConfig: combine='last' sums a token's rows in the slot GEMV down tiles: it "
                f"needs route='slots' and gemm='gemv'; got route={self.route!r}, "
                f"gemm={self.gemm!r}"
            )
        if self.router not in ("simt", "tc"):
            raise GraphError(f"MoEConfig: router must be 'simt' or 'tc', got {self.router!r}")
        if self.router == "tc" and (
            self.router_block != self.block_size // 2
            or self.router_experts % 8
            or self.router_experts > 256
            or self.hidden % 64
        ):
            raise GraphError(
                "MoEConfig: router='tc' needs router_block = block_size / 2 "
                f"({self.block_size // 2}), router_experts a multiple of 8 up to 256 and "
                f"hidden a multiple of 64; got router_block={self.router_block}, "
                f"router_experts={self.router_experts}, hidden={self.hidden}"
            )
        if self.router_splits > 1 and (
            self.router != "tc" or self.hidden % (64 * self.router_splits)
        ):
            raise GraphError(
                f"MoEConfig: router_splits={self.router_splits} needs router='tc' and hidden a "
                f"multiple of 64 x router_splits; got router={self.router!r}, "
                f"hidden={self.hidden}"
            )
        if (
            not isinstance(self.logits_parts, int)
            or isinstance(self.logits_parts, bool)
            or (self.logits_parts and self.logits_parts < self.router_splits)
            or self.logits_parts < 0
        ):
            raise GraphError(
                f"MoEConfig: logits_parts={self.logits_parts!r} must be 0 or an int of at least "
                f"router_splits={self.router_splits}"
            )
        if not is_int(self.permute_ctas, 0):
            raise GraphError(
                f"MoEConfig: permute_ctas must be an int >= 0, got {self.permute_ctas!r}"
            )
        if self.gemm_deal not in DEALS:
            raise GraphError(
                f"MoEConfig: gemm_deal must be one of {', '.join(map(repr, DEALS))}, "
                f"got {self.gemm_deal!r}"
            )
        if self.combine not in COMBINES:
            raise GraphError(
                f"MoEConfig: combine must be one of {', '.join(map(repr, COMBINES))}, "
                f"got {self.combine!r}"
            )
        dn = dict(self.down_options)
        if (
            self.combine == "atomic"
            and not self.fuse_down
            and (self.gemm != "tc" or dn.get("core") != "tma" or dn.get("split_n"))
        ):
            raise GraphError(
                "MoEConfig: combine='atomic' needs the TMA down tile (gemm='tc', down_options "
                f"core='tma', no split_n); got gemm={self.gemm!r}, down_options={dn!r}"
            )
        if self.combine_dtype not in moe_tiles.SUMS:
            raise GraphError(
                f"MoEConfig: combine_dtype must be one of {', '.join(map(repr, moe_tiles.SUMS))}, "
                f"got {self.combine_dtype!r}"
            )
        if self.combine_dtype != "f32" and self.combine != "atomic":
            raise GraphError(
                f"MoEConfig: combine_dtype={self.combine_dtype!r} is the type of an atomic "
                f"combine's sums; it needs combine='atomic', got combine={self.combine!r}"
            )
        if not isinstance(self.gather, bool):
            raise GraphError(f"MoEConfig: gather must be a bool, got {self.gather!r}")
        gu = dict(self.gate_up_options)
        if self.gather and (self.gemm != "tc" or gu.get("core") != "tma" or gu.get("split_n")):
            raise GraphError(
                "MoEConfig: gather=True needs the TMA gate/up tile (gemm='tc', gate_up_options "
                f"core='tma', no split_n); got gemm={self.gemm!r}, gate_up_options={gu!r}"
            )
        if self.gather and gu.get("refill", "wait") != "wait":
            raise GraphError(
                "MoEConfig: gather=True refills the gate/up rings by waiting; drop "
                f"refill={gu['refill']!r} from gate_up_options"
            )
        if self.permute_slots and (self.gather or self.route == "slots"):
            raise GraphError(
                f"MoEConfig: permute_slots={self.permute_slots} shapes the permute task, which "
                f"this layer does not have (gather={self.gather!r}, route={self.route!r})"
            )
        if self.topk > self.experts:
            raise GraphError(f"MoEConfig: topk={self.topk} exceeds experts={self.experts}")
        if self.inter % self.block_n_gu:
            raise GraphError(f"MoEConfig: inter={self.inter} % block_n_gu={self.block_n_gu} != 0")
        if self.hidden % self.block_n_dn:
            raise GraphError(f"MoEConfig: hidden={self.hidden} % block_n_dn={self.block_n_dn} != 0")
        if self.hidden % 8:
            raise GraphError(f"MoEConfig: hidden={self.hidden} must be a multiple of 8")
        if self.experts % self.router_experts:
            raise GraphError(
                f"MoEConfig: experts={self.experts} % router_experts={self.router_experts} != 0"
            )
        if self.router_block % self.topk_block:
            raise GraphError(
                f"MoEConfig: router_block={self.router_block} % topk_block={self.topk_block} != 0"
            )

    @property
    def max_tokens(self) -> int | None:
        """The largest ``T`` the layer's graph takes (the fused route tile's
        bound), or None."""
        return self.route_max_tokens if self.route == "fused" else None

    @property
    def logit_rows(self) -> int:
        """Rows of ``logits`` per token (``logits_parts`` or ``router_splits``)."""
        return self.logits_parts or self.router_splits

    @property
    def n_gu(self) -> int:
        """Gate/up tiles per row block (``I / block_n_gu``)."""
        return self.inter // self.block_n_gu

    @property
    def n_dn(self) -> int:
        """Down tiles per row block (``H / block_n_dn``)."""
        return self.hidden // self.block_n_dn

    def with_weight_chunk(self, gate_up: int, down: int | None = None) -> MoEConfig:
        """This configuration with its expert tiles reading ``Wgu`` in chunks
        of ``gate_up`` and ``Wd`` in chunks of ``down`` (default: the same;
        the tiles' ``weight_chunk`` option, :func:`weight_chunks`)."""
        down = gate_up if down is None else down
        return replace(
            self,
            gate_up_options=(*self.gate_up_options, ("weight_chunk", gate_up)),
            down_options=(*self.down_options, ("weight_chunk", down)),
        )

    def with_routing(self, routing: str) -> MoEConfig:
        """``top1`` routes each token to one expert (topk = 1); the others keep topk."""
        return replace(self, topk=1) if routing == "top1" else self

    def row_blocks(self, T: int) -> int:
        """Upper bound of the row blocks ``sum_e ceil(cnt[e]/BM)`` for T tokens:
        ``floor((T*K + (BM-1) * min(E, T*K)) / BM)`` (the triggered grids)."""
        n = T * self.topk
        return (n + (self.block_m - 1) * min(self.experts, n)) // self.block_m

    def gu_tiles(self, T: int) -> int:
        """Upper bound of ``gu_indptr[E]`` for T tokens (the triggered grid)."""
        return self.row_blocks(T) * self.n_gu

    def dn_tiles(self, T: int) -> int:
        return self.row_blocks(T) * self.n_dn

    def active_weight_bytes(self, T: int) -> int:
        """Bytes of expert + router weights a layer touches (bf16) for T tokens,
        assuming uniform routing: min(E, T*K) experts (the floor's numerator)."""
        active = min(self.experts, T * self.topk)
        per_expert = 3 * self.hidden * self.inter * 2
        return active * per_expert + self.experts * self.hidden * 2

    def flops(self, T: int) -> int:
        """Multiply-adds x 2 of the router and the T*K expert rows."""
        rows = T * self.topk
        return 2 * T * self.hidden * self.experts + 2 * rows * 3 * self.hidden * self.inter


def has_trigger_api() -> bool:
    """Whether ``etc.Graph.task`` takes ``triggered_by`` (data-dependent triggers)."""
    return "triggered_by" in inspect.signature(Graph.task).parameters


def _spec(cfg: MoEConfig, T: Any) -> dict[str, tuple[tuple[Any, ...], str]]:
    H, II, E, K = cfg.hidden, cfg.inter, cfg.experts, cfg.topk
    N = T * K
    # The scratch buffers (SCRATCH): a configuration's own, or extra_buffers.
    scratch = {"Xp": ((N, H), "bf16"), "Yp": ((N, H), "bf16")}
    scratch |= {name: ((T, H), dtype) for dtype, (name, _) in moe_tiles.SUMS.items()}
    spec = {
        "X": ((T, H), "bf16"),
        "Wr": ((E, H), "bf16"),
        cfg.weight_name("Wgu"): ((E, 2 * II, H), "bf16"),
        cfg.weight_name("Wd"): ((E, H, II), "bf16"),
        "logits": ((cfg.logit_rows * T, E), "f32"),
        "topk_ids": ((T, K), "i32"),
        "topk_w": ((T, K), "f32"),
        "counts": ((E,), "i32"),
        "pos": ((T, K), "i32"),
        "row_off": ((E + 1,), "i32"),
        "gu_indptr": ((E + 1,), "i32"),
        "dn_indptr": ((E + 1,), "i32"),
        "h_wait": ((E,), "i32"),
        "dn_total": ((1,), "i32"),
        "perm": ((N,), "i32"),
        "inv": ((N,), "i32"),
        "Xp": scratch["Xp"],
        "Hb": ((N, II), "bf16"),
        "Yp": scratch["Yp"],
        "Out": ((T, H), "bf16"),
        # combine="last": the slot down tiles' counters (every configuration
        # declares them, so one set of buffers serves a preset family).
        "Ycount": ((T, H // gemv_tiles.COUNT_COLUMNS), "i32"),
    }
    if cfg.route == "fused":  # the route tile keeps each slot's position to itself
        del spec["pos"]
    if cfg.gather:  # the gate/up tiles read X through perm
        del spec["Xp"]
    if cfg.combine == "atomic":  # the down tiles add into the sums
        del spec["Yp"]
        spec[_sums(cfg)] = scratch[_sums(cfg)]
    for name in cfg.extra_buffers:
        spec.setdefault(name, scratch[name])
    return spec


def tensor_shapes(cfg: MoEConfig, T: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of every graph tensor for T tokens (the spec's table)."""
    return _spec(cfg, T)


def _tensors(g: Graph, cfg: MoEConfig, T: Any, names: list[str] | None = None) -> dict[str, Any]:
    spec = _spec(cfg, T)
    return {
        n: g.tensor(n, s, d, kept_zero=n == "Ycount")  # counters the down tiles reset
        for n, (s, d) in spec.items()
        if names is None or n in names
    }


def expert_gemm_tiles(cfg: MoEConfig) -> tuple[DeviceFunction, DeviceFunction]:
    """``cfg``'s expert GEMM tiles ``(gate_up, down)``, as its layer graph
    takes them (``bench/gemm_grouped.py`` runs them alone)."""
    return _gemm_tiles(cfg, None)


def _gemm_tiles(cfg: MoEConfig, gemm_tiles: Any) -> tuple[DeviceFunction, DeviceFunction]:
    """(gate_up, down): from ``gemm_tiles`` (a pair, or a module with
    ``moe_gate_up`` / ``moe_down``), else from :mod:`etc.tiles.gemm`."""
    if gemm_tiles is None:
        # The tensor-core tiles of cfg.gemm (or the slot GEMV tiles).
        if cfg.gemm == "tc":
            from ..tiles import gemm_tc as gemm_tiles
        elif cfg.gemm == "gemv":
            from ..tiles import gemv as gemm_tiles
        else:
            from ..tiles import gemm as gemm_tiles
    if isinstance(gemm_tiles, (tuple, list)):
        gate_up, down = gemm_tiles
        return gate_up, down
    kw = {"experts": cfg.experts, "block_size": cfg.block_size}
    gu_kw = {"gather_topk": cfg.topk} if cfg.gather else {}
    if cfg.route == "slots":
        kw["slots"] = cfg.topk
        # The parts the router writes (spare logits rows stay unused).
        gu_kw = {"slot_logits": cfg.router_splits if cfg.slot_logits else 0}
        if cfg.fuse_down:
            gu_kw["fuse_down"] = True
    dn_kw = {}
    if cfg.combine == "last":
        dn_kw = {"combine_topk": cfg.topk}
    if cfg.combine == "atomic" and cfg.route != "slots":
        dn_kw = {"combine_topk": cfg.topk, "combine_dtype": cfg.combine_dtype}
    gate_up = gemm_tiles.moe_gate_up(
        cfg.block_m, cfg.block_n_gu, cfg.hidden, cfg.inter, **kw, **gu_kw,
        **dict(cfg.gate_up_options),
    )  # fmt: skip
    down = gemm_tiles.moe_down(
        cfg.block_m, cfg.block_n_dn, cfg.hidden, cfg.inter, **kw, **dn_kw,
        **dict(cfg.down_options),
    )  # fmt: skip
    return gate_up, down


def _small_tiles(cfg: MoEConfig) -> dict[str, DeviceFunction]:
    """The non-GEMM tiles of ``cfg``'s graph, by task name."""
    H, E, K, bs = cfg.hidden, cfg.experts, cfg.topk, cfg.block_size
    RB, TB = cfg.router_block, cfg.topk_block
    tiles = {"logits": _router_tile(cfg)}
    if cfg.combine == "atomic":
        dt = cfg.combine_dtype
        tiles["zero"] = moe_tiles.zero_rows(cfg.zero_block, H, dtype=dt, block_size=bs)
        tiles["cast"] = moe_tiles.cast_rows(
            cfg.combine_block, H, dtype=dt, unroll=cfg.combine_unroll, block_size=bs
        )
    elif cfg.combine == "task":
        tiles["combine"] = moe_tiles.combine(
            cfg.combine_block, K, H, unroll=cfg.combine_unroll, direct=cfg.route == "slots",
            block_size=bs,
        )  # fmt: skip
    spare = cfg.logit_rows != cfg.router_splits  # T from topk_ids, not the logits' rows
    if cfg.route == "fused":
        tiles["route"] = moe_tiles.route(
            E, K, cfg.block_m, cfg.n_gu, cfg.n_dn, max_tokens=cfg.route_max_tokens,
            splits=cfg.router_splits, tokens_from_ids=spare, block_size=bs,
        )  # fmt: skip
    else:
        # Slot grids keep no tables: no counts, no clear, no plan.
        slots = cfg.route == "slots"
        tiles["topk"] = moe_tiles.router_topk(
            RB, TB, E, K, splits=cfg.router_splits, tokens_from_ids=spare, counts=not slots,
            unroll=cfg.topk_unroll, block_size=bs,
        )  # fmt: skip
        if not slots:
            tiles["clear"] = moe_tiles.clear_counts(E, block_size=bs)
            tiles["plan"] = moe_tiles.plan(cfg.block_m, cfg.n_gu, cfg.n_dn, E, K, block_size=bs)
    if cfg.route != "slots":  # the task between the tables and the gate/up tiles
        if cfg.gather:
            tiles["release"] = moe_tiles.release(E, block_size=bs)
        else:
            tiles["permute"] = moe_tiles.permute(
                E, K, H, unroll=cfg.permute_unroll, slots=cfg.permute_slots, block_size=bs
            )
    return tiles


def _release_task(cfg: MoEConfig) -> tuple[str, tuple[str, ...]]:
    """The task between the tables and the gate/up tiles (an instance per
    expert) and its tensors: ``permute``, or ``release`` when the gate/up
    tiles gather their rows themselves."""
    if cfg.gather:
        return "release", ("row_off",)
    return "permute", ("X", "row_off", "perm", "Xp")


def _gate_up_args(cfg: MoEConfig) -> tuple[str, ...]:
    """The gate/up task's tensors, in order (a gathering tile reads ``X`` via ``perm``)."""
    w = cfg.weight_name("Wgu")
    if cfg.gather:
        return ("X", w, "row_off", "gu_indptr", "perm", "Hb")
    return ("Xp", w, "row_off", "gu_indptr", "Hb")


def _sums(cfg: MoEConfig) -> str:
    """The tensor an atomic combine adds into: ``Out32`` or ``Out16``."""
    return moe_tiles.SUMS[cfg.combine_dtype][0]


def _down_args(cfg: MoEConfig) -> tuple[str, ...]:
    """The down task's tensors, in order (an atomic combine adds into the sums)."""
    w = cfg.weight_name("Wd")
    if cfg.combine == "atomic":
        return ("Hb", w, "row_off", "dn_indptr", "perm", "topk_w", _sums(cfg))
    return ("Hb", w, "row_off", "dn_indptr", "Yp")


def _zero_task(g: Graph, cfg: MoEConfig, T: Any, t: dict[str, Any], tiles) -> Any:
    """``zero(i)`` clearing the sums for the adding down tiles; returns its
    event (one coordinate), which the routing's last task waits for, so
    every down tile runs after it. Added first, so it comes first in the
    static lists (at T = 4096 its 33 MB delayed the logits by ~17 µs:
    ``bench/RESULTS.md``, item 84)."""
    blocks = (T + cfg.zero_block - 1) // cfg.zero_block
    zeroed = g.event((1,), wait_count=blocks, name="zeroed")
    g.task(
        tiles["zero"],
        grid=(blocks,),
        args=(t[_sums(cfg)],),
        out_edges={zeroed: "i->0"},
        name="zero",
    )
    return zeroed


def _router_tile(cfg: MoEConfig) -> DeviceFunction:
    H, E, bs = cfg.hidden, cfg.experts, cfg.block_size
    if cfg.router == "simt":
        return moe_tiles.router_logits(cfg.router_block, cfg.router_experts, E, H, block_size=bs)
    from ..tiles import gemm_tc

    # Logits = X @ Wr^T in float32, a 128-token x EC-expert block per CTA
    # (the refill the layer was measured with; "test" is not measured here).
    return gemm_tc.gemm(
        cfg.router_block, cfg.router_experts, H, name="moe_logits_tc", block_size=bs,
        core="tma", stages=cfg.router_stages, smem_limit=220 << 10, out_dtype="f32",
        k_splits=cfg.router_splits, refill="wait",
    )  # fmt: skip


def _require_trigger_api() -> None:
    if not has_trigger_api():
        raise GraphError(
            "this etc.Graph.task has no 'triggered_by' parameter (data-dependent "
            "triggers); the MoE graph needs it"
        )


#: The step of :func:`_min_const`: exact while T*K < 2**31 (the tables are i32).
_STEP = 2**31


def _min_const(a: Any, b: int) -> Any:
    """``min(a, b)`` for an expression ``a`` in ``[0, b + 2**31)`` with only
    the ops symbol expressions have (``+ - * //``, no min): ``a - (a - b) *
    step`` where ``step = (a - b + 2**31) // 2**31`` is 0 below b and 1 from b
    on. Plain ints give plain ints."""
    step = (a - b + _STEP) // _STEP
    return a - (a - b) * step


def _bounds(cfg: MoEConfig, T: Any) -> tuple[Any, Any]:
    # sum_e ceil(cnt[e]/BM) <= sum over the A experts with rows of (cnt[e] + BM-1)/BM
    # = (T*K + (BM-1)*A)/BM, with A <= min(E, T*K): at T=1, K=8 that is 8 row
    # blocks (the old ceil(T*K/BM) + E gave 129). See MoEConfig.row_blocks.
    n = T * cfg.topk
    blocks = (n + (cfg.block_m - 1) * _min_const(n, cfg.experts)) // cfg.block_m
    return blocks * cfg.n_gu, blocks * cfg.n_dn


#: The plan's arguments, in order.
_PLAN_ARGS = (
    "topk_ids", "pos", "counts", "row_off", "gu_indptr", "dn_indptr", "h_wait", "dn_total",
    "perm", "inv",
)  # fmt: skip
#: The top-k tile's arguments, in order.
_TOPK_ARGS = ("logits", "topk_ids", "topk_w", "counts", "pos")


def _topk_args(cfg: MoEConfig) -> tuple[str, ...]:
    """The top-k task's tensors (no tables with ``route="slots"``)."""
    return _TOPK_ARGS[:3] if cfg.route == "slots" else _TOPK_ARGS


def _router_tasks(g: Graph, cfg: MoEConfig, T: Any, t: dict[str, Any], tiles, routed) -> None:
    """clear --cleared--> logits(i, j) --scored[i] (E/EC)--> topk(i, j)
    --routed--> (the caller's event).

    The logits wait for ``clear`` (not the top-k, which counts into
    ``counts``): an edge from a one-coordinate event next to ``scored[i]``
    would give every top-k instance a ready counter under the dynamic
    schedule, and ``clear``'s completion would update them one after the
    other (430 µs at T = 4096 on an H200); alone, it releases the logits'
    grid as one range. It costs the logits one hop at the start (~1 µs)."""
    RB, EC, TB, E = cfg.router_block, cfg.router_experts, cfg.topk_block, cfg.experts
    blocks = (T + RB - 1) // RB
    cleared = g.event((1,), wait_count=1, name="cleared")
    g.task(
        tiles["clear"], grid=(1,), args=(t["counts"],), out_edges={cleared: "i->0"},
        name="clear",
    )  # fmt: skip
    scored = g.event((blocks,), wait_count=E // EC * cfg.router_splits, name="scored")
    _logits_task(g, cfg, blocks, t, tiles, after=cleared, scored=(scored, "i"))
    g.task(
        tiles["topk"],
        grid=(blocks, RB // TB),
        args=tuple(t[n] for n in _TOPK_ARGS),
        in_edges={scored: "ij->i"},
        out_edges={routed: "ij->0"} if routed is not None else None,
        name="topk",
    )


#: The route tile's arguments, in order.
_ROUTE_ARGS = (
    "logits", "topk_ids", "topk_w", "counts", "row_off", "gu_indptr", "dn_indptr", "h_wait",
    "dn_total", "perm", "inv",
)  # fmt: skip


def _fused_route_tasks(g: Graph, cfg: MoEConfig, T: Any, t: dict[str, Any], tiles, zeroed=None):
    """logits(i, j) --scored--> route --planned-->; returns ``planned``.

    No ``clear``: the route tile counts in workgroup memory, so the logits
    start at once. With an atomic combine the route also waits for ``zero``."""
    blocks = (T + cfg.router_block - 1) // cfg.router_block
    scored = g.event((1,), wait_count=math.prod(_logits_grid(cfg, blocks)), name="scored")
    _logits_task(g, cfg, blocks, t, tiles, after=None, scored=(scored, "0"))
    in_edges = {scored: "i->0"}
    if zeroed is not None:
        in_edges[zeroed] = "i->0"
    planned = g.event((1,), wait_count=1, name="planned")
    g.task(
        tiles["route"],
        grid=(1,),
        args=tuple(t[n] for n in _ROUTE_ARGS),
        in_edges=in_edges,
        out_edges={planned: "i->0"},
        name="route",
    )
    return planned


def _logits_task(
    g: Graph, cfg: MoEConfig, blocks: Any, t: dict[str, Any], tiles, *, after, scored
) -> None:
    """The logits task over ``blocks`` token blocks: after one-coordinate
    event ``after`` (or none), notifying ``scored = (event, coordinate)``
    (``"i"``: the token block's, ``"0"``: the only one)."""
    dims = "ij" if cfg.router_splits == 1 else "ijs"
    g.task(
        tiles["logits"],
        grid=_logits_grid(cfg, blocks),
        args=(t["X"], t["Wr"], t["logits"]),
        in_edges={after: f"{dims}->0"} if after is not None else None,
        out_edges={scored[0]: f"{dims}->{scored[1]}"},
        name="logits",
    )


def _logits_grid(cfg: MoEConfig, blocks: Any) -> tuple[Any, ...]:
    """(token blocks, expert blocks[, k parts]) of the logits task."""
    grid = (blocks, cfg.experts // cfg.router_experts)
    return grid if cfg.router_splits == 1 else (*grid, cfg.router_splits)


def build_moe_graph(
    cfg: MoEConfig,
    gemm_tiles: Any = None,
    *,
    name: str = "moe",
    gate_up_waits_tables: bool = True,
) -> Graph:
    """The whole layer as one graph (the spec's tasks, events and edges).

    ``gemm_tiles``: None (use :mod:`etc.tiles.gemm`), a module with
    ``moe_gate_up(BM, BN_GU, H, I)`` / ``moe_down(BM, BN_DN, H, I)``, or a
    ``(gate_up, down)`` pair of DeviceFunctions (tests use numpy-only ones).

    ``gate_up_waits_tables=False`` drops the gate/up tiles' in-edge on
    ``planned``: their trigger's count is 1, so only their lookup and ring
    prefetch may then read a table still being written, and the static
    lowering checks the range it prefetched for and prefetches again when it
    moved (``docs/scheduling.md``). Slower (a stale guess waits for every
    expert); it exists for the GPU tests of that path.
    """
    _require_trigger_api()
    gate_up, down = _gemm_tiles(cfg, gemm_tiles)
    tiles = _small_tiles(cfg)
    E, RB, TB, CB = cfg.experts, cfg.router_block, cfg.topk_block, cfg.combine_block
    g = Graph(name, block_size=cfg.block_size)
    T = g.symbol("T", max=cfg.max_tokens)
    t = _tensors(g, cfg, T)
    if cfg.route == "slots":
        _slot_tasks(g, cfg, T, t, tiles, gate_up, down)
        return g
    gu_ready = g.event((E,), wait_count=1, name="gu_ready")
    h_ready = g.event((E,), wait_count=t["h_wait"], name="h_ready")
    gu_bound, dn_bound = _bounds(cfg, T)
    zeroed = _zero_task(g, cfg, T, t, tiles) if cfg.combine == "atomic" else None
    if cfg.route == "fused":
        planned = _fused_route_tasks(g, cfg, T, t, tiles, zeroed)
    else:
        routed = g.event((1,), wait_count=(T + RB - 1) // RB * (RB // TB), name="routed")
        plans = moe_tiles.plan_grid(T, cfg.topk)
        planned = g.event((1,), wait_count=plans, name="planned")
        _router_tasks(g, cfg, T, t, tiles, routed)
        in_edges = {routed: "i->0"}
        if zeroed is not None:
            in_edges[zeroed] = "i->0"
        g.task(
            tiles["plan"],
            grid=(plans,),
            args=tuple(t[n] for n in _PLAN_ARGS),
            in_edges=in_edges,
            out_edges={planned: "i->0"},
            name="plan",
        )
    release, release_args = _release_task(cfg)
    g.task(
        tiles[release],
        grid=(E,),
        args=tuple(t[n] for n in release_args),
        in_edges={planned: "e->0"},
        out_edges=[(gu_ready, "e->e"), (h_ready, "e->e")],
        name=release,
        ctas=cfg.permute_ctas or None,
    )
    g.task(
        gate_up,
        grid=(gu_bound,),
        args=tuple(t[n] for n in _gate_up_args(cfg)),
        triggered_by=(gu_ready, t["gu_indptr"]),
        in_edges={planned: "ie->0"} if gate_up_waits_tables else None,
        out_edges={h_ready: "ie->e"},
        name="gate_up",
        deal=cfg.gemm_deal,
    )
    down_done = g.event((1,), wait_count=t["dn_total"], name="down_done")
    g.task(
        down,
        grid=(dn_bound,),
        args=tuple(t[n] for n in _down_args(cfg)),
        triggered_by=(h_ready, t["dn_indptr"]),
        in_edges={planned: "ie->0"},
        out_edges={down_done: "ie->0"},
        name="down",
        deal=cfg.gemm_deal,
    )
    last, last_args = _last_task(cfg)
    g.task(
        tiles[last],
        grid=((T + CB - 1) // CB,),
        args=tuple(t[n] for n in last_args),
        # `planned` first: down_done's count (dn_total) is a table the plan
        # writes, and a static-schedule wait reads it when it starts.
        in_edges=[(planned, "i->0"), (down_done, "i->0")],
        name=last,
    )
    return g


def _slot_gate_up_down_args(cfg: MoEConfig) -> tuple[str, ...]:
    """A ``fuse_down`` gate/up task's tensors: the gate/up tile's, then the
    down weights and the sums."""
    return (*_slot_gate_up_args(cfg), cfg.weight_name("Wd"), _sums(cfg))


def _slot_down_args(cfg: MoEConfig) -> tuple[str, ...]:
    """The slot down task's tensors, in order (with ``combine="last"``, what
    the tiles' combine reads and writes)."""
    last = ("topk_w", "Ycount", "Out") if cfg.combine == "last" else ()
    return ("Hb", "topk_ids", cfg.weight_name("Wd"), "Yp", *last)


def _slot_gate_up_args(cfg: MoEConfig) -> tuple[str, ...]:
    """The slot gate/up task's tensors: its experts from ``topk_ids`` or,
    with ``slot_logits``, from the router logits."""
    return ("X", "logits" if cfg.slot_logits else "topk_ids", cfg.weight_name("Wgu"), "Hb")


def _slot_tasks(g: Graph, cfg: MoEConfig, T: Any, t: dict[str, Any], tiles, gate_up, down):
    """``route="slots"``: the logits and a top-k without tables (every
    token's, after every logit: for a few tokens), then static grids of
    ``(slot, column block)`` tiles and the combine over slot-ordered ``Yp``.
    Each down tile waits for its slot's gate/up tiles alone (and for the
    top-k when the gate/up tiles did not)."""
    RB, TB, CB, S = cfg.router_block, cfg.topk_block, cfg.combine_block, T * cfg.topk
    blocks = (T + RB - 1) // RB
    zeroed = _zero_task(g, cfg, T, t, tiles) if cfg.fuse_down else None
    scored = g.event((1,), wait_count=math.prod(_logits_grid(cfg, blocks)), name="scored")
    _logits_task(g, cfg, blocks, t, tiles, after=None, scored=(scored, "0"))
    routed = g.event((1,), wait_count=blocks * (RB // TB), name="routed")
    g.task(
        tiles["topk"],
        grid=(blocks, RB // TB),
        args=tuple(t[n] for n in _topk_args(cfg)),
        in_edges={scored: "ij->0"},
        out_edges={routed: "ij->0"},
        name="topk",
    )
    if cfg.fuse_down:
        # Each tile adds its down projection: the cast waits for them all,
        # and for the top-k (its outputs, topk_ids and topk_w, are then
        # complete with the layer's).
        done = g.event((1,), wait_count=S * cfg.n_gu, name="summed")
        g.task(
            gate_up,
            grid=(S, cfg.n_gu),
            args=tuple(t[n] for n in _slot_gate_up_down_args(cfg)),
            in_edges=[(zeroed, "sj->0"), (scored, "sj->0")],
            out_edges={done: "sj->0"},
            name="gate_up",
        )
        last_waits = [(routed, "i->0"), (done, "i->0")]
    else:
        h_ready = g.event((S,), wait_count=cfg.n_gu, name="h_ready")
        # A slot tile's prefetch reads topk_ids: it runs after the top-k's wait.
        g.task(
            gate_up,
            grid=(S, cfg.n_gu),
            args=tuple(t[n] for n in _slot_gate_up_args(cfg)),
            in_edges={scored if cfg.slot_logits else routed: "sj->0"},
            out_edges={h_ready: "sj->s"},
            name="gate_up",
            prefetch_after=1 if gate_up.prefetch else 0,
        )
        # With combine="last" the down tiles write Out: no task follows them.
        combines = cfg.combine == "last"
        done = None if combines else g.event((1,), wait_count=S * cfg.n_dn, name="down_done")
        # The down tiles wait for the top-k first (unless the gate/up tiles
        # did, before them), so their prefetch may read topk_ids before they
        # wait for their slot's rows (and their combine reads topk_w).
        waits_routed = cfg.slot_logits or down.prefetch is not None or combines
        g.task(
            down,
            grid=(S, cfg.n_dn),
            args=tuple(t[n] for n in _slot_down_args(cfg)),
            in_edges=([(routed, "sj->0")] if waits_routed else []) + [(h_ready, "sj->s")],
            out_edges={} if combines else {done: "sj->0"},
            name="down",
            prefetch_after=1 if down.prefetch else 0,
        )
        if combines:
            return
        last_waits = [(done, "i->0")]
    last, last_args = _last_task(cfg)
    g.task(
        tiles[last],
        grid=((T + CB - 1) // CB,),
        args=tuple(t[n] for n in last_args),
        in_edges=last_waits,
        name=last,
    )


def _last_task(cfg: MoEConfig) -> tuple[str, tuple[str, ...]]:
    """The task after the down tiles and its tensors: ``combine`` (gathers
    the rows of ``Yp``) or, with an atomic combine, ``cast`` (the sums to
    bf16)."""
    if cfg.combine == "atomic":
        return "cast", (_sums(cfg), "Out")
    if cfg.route == "slots":  # Yp in slot order
        return "combine", ("topk_w", "Yp", "Out")
    return "combine", ("topk_w", "inv", "Yp", "Out")


def preset_family(
    buckets: tuple[tuple[int | None, str], ...] = PRESET_BUCKETS,
    *,
    weight_chunk: int = 0,
    **overrides: Any,
) -> list[tuple[int | None, str, MoEConfig]]:
    """``(largest T, preset name, configuration)`` of each kernel of
    :func:`compile_moe`: the preset with ``overrides``, its ``logits``
    buffer sized for the family's largest ``router_splits`` so that one set
    of buffers (:func:`numpy_inputs` / :func:`torch_inputs` of any member)
    serves every kernel. ``weight_chunk`` (0 or 64, what the TMA tiles
    take): every preset's expert tiles read ``Wgu``/``Wd`` in
    :func:`etc.tiles.gemm.chunk_weights`' layout."""
    if not buckets:
        raise GraphError("preset_family: no buckets")
    for entry in buckets:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str)):
            raise GraphError(
                f"preset_family: bucket {entry!r} is not (largest T or None, preset name)"
            )
    if not is_int(weight_chunk, 0):
        raise GraphError(f"preset_family: weight_chunk must be an int >= 0, got {weight_chunk!r}")
    configs = [(bound, name, preset(name, **overrides)) for bound, name in buckets]
    if weight_chunk:
        configs = [(b, name, cfg.with_weight_chunk(weight_chunk)) for b, name, cfg in configs]
    layouts = {name: weight_chunks(cfg) for _, name, cfg in configs}
    if len({tuple(v.items()) for v in layouts.values()}) > 1:
        raise GraphError(
            "preset_family: the kernels of one artifact share their weights, but their tiles "
            f"read them in different layouts (weight_chunk per preset: {layouts})"
        )
    parts = max(cfg.router_splits for _, _, cfg in configs)
    own = {name: set(_spec(cfg, 1)) & set(SCRATCH) for _, name, cfg in configs}
    every = set().union(*own.values())
    return [
        (
            bound,
            name,
            replace(cfg, logits_parts=parts, extra_buffers=tuple(sorted(every - own[name]))),
        )
        for bound, name, cfg in configs
    ]


def compile_moe(
    buckets: tuple[tuple[int | None, str], ...] = PRESET_BUCKETS,
    *,
    schedule: str = "static",
    name: str = "moe",
    weight_chunk: int = 0,
    slot_schedule: str = "static",
    compile_options: dict[str, Any] | None = None,
    **overrides: Any,
) -> Any:
    """The layer as one artifact for every T (``etc.compile_buckets``): a
    kernel per range of T, each the preset measured best there
    (:data:`PRESET_BUCKETS`), compiled for its own target,
    ``min_ctas_per_sm`` and ``outline``. ``etc.runtime.load`` of the saved artifact launches
    the kernel whose range holds T, with no recompilation; its buffers are
    those of :func:`preset_family`'s configurations. ``overrides``: sizes
    (``hidden``, ``experts``, ...) for every preset; ``weight_chunk``: see
    :func:`preset_family`; ``compile_options``: more ``etc.compile`` options
    for every kernel (``check_counts=False``, say).

    ``schedule`` applies to the table-driven presets; the slot presets
    (``route="slots"``: static grids, no data-dependent work) are compiled
    with ``slot_schedule``, static unless asked: their dynamic kernel has
    nothing to balance and measured 2.4× slower at T = 1 (69 against 29 µs;
    its down tiles' two in-edges, the whole top-k's ``routed`` next to their
    slot's ``h_ready``, give every instance a ready counter; ``docs/moe.md``)."""
    from ..buckets import compile_buckets

    graphs = [
        (
            bound,
            build_moe_graph(cfg, name=f"{name}_{preset_name}"),
            {
                "target": PRESET_TARGETS[preset_name],
                "min_ctas_per_sm": PRESET_MIN_CTAS_PER_SM[preset_name],
                "outline": PRESET_OUTLINE.get(preset_name, ()),
                **({"schedule": slot_schedule} if cfg.route == "slots" else {}),
            },
        )
        for bound, preset_name, cfg in preset_family(
            buckets, weight_chunk=weight_chunk, **overrides
        )
    ]
    return compile_buckets("T", graphs, schedule=schedule, **(compile_options or {}))


def build_unfused_graphs(
    cfg: MoEConfig, gemm_tiles: Any = None, *, prefix: str = "moe"
) -> list[tuple[str, Graph]]:
    """Each task of :func:`build_moe_graph` as its own one-task graph, in
    launch order (:data:`UNFUSED_TASKS`): the
    unfused baseline, launched back to back on one stream. A triggered task
    keeps its trigger table, on an event of wait count 0 (ready at start
    under the static schedule). Each graph takes only the tensors its task
    uses, by the same names, so one dict of buffers serves all of them."""
    _require_trigger_api()
    gate_up, down = _gemm_tiles(cfg, gemm_tiles)
    tiles = _small_tiles(cfg)
    E, RB, CB = cfg.experts, cfg.router_block, cfg.combine_block
    TB = cfg.topk_block
    out: list[tuple[str, Graph]] = []

    fused, slots = cfg.route == "fused", cfg.route == "slots"

    def graph(task: str, names: list[str]) -> tuple[Graph, Any, dict[str, Any]]:
        g = Graph(f"{prefix}_unfused_{task}", block_size=cfg.block_size)
        T = g.symbol("T", max=cfg.max_tokens)
        return g, T, _tensors(g, cfg, T, names)

    if cfg.combine == "atomic":
        g, T, t = graph("zero", [_sums(cfg)])
        zb = cfg.zero_block
        g.task(tiles["zero"], grid=((T + zb - 1) // zb,), args=(t[_sums(cfg)],), name="zero")
        out.append(("zero", g))
    if not fused and not slots:
        g, T, t = graph("clear", ["counts"])
        g.task(tiles["clear"], grid=(1,), args=(t["counts"],), name="clear")
        out.append(("clear", g))
    g, T, t = graph("logits", ["X", "Wr", "logits"])
    g.task(
        tiles["logits"],
        grid=_logits_grid(cfg, (T + RB - 1) // RB),
        args=(t["X"], t["Wr"], t["logits"]),
        name="logits",
    )
    out.append(("logits", g))
    if fused:
        g, T, t = graph("route", list(_ROUTE_ARGS))
        g.task(tiles["route"], grid=(1,), args=tuple(t[n] for n in _ROUTE_ARGS), name="route")
        out.append(("route", g))
    else:
        g, T, t = graph("topk", list(_topk_args(cfg)))
        g.task(
            tiles["topk"],
            grid=((T + RB - 1) // RB, RB // TB),
            args=tuple(t[n] for n in _topk_args(cfg)),
            name="topk",
        )
        out.append(("topk", g))
    if not fused and not slots:
        g, T, t = graph("plan", list(_PLAN_ARGS))
        g.task(
            tiles["plan"], grid=(moe_tiles.plan_grid(T, cfg.topk),),
            args=tuple(t[n] for n in _PLAN_ARGS), name="plan",
        )  # fmt: skip
        out.append(("plan", g))
    release, release_args = _release_task(cfg)
    if release == "permute" and not slots:  # release alone has no work
        g, T, t = graph(release, list(release_args))
        g.task(tiles[release], grid=(E,), args=tuple(t[n] for n in release_args), name=release)
        out.append((release, g))
    for task, fn, names, indptr in (
        ("gate_up", gate_up, list(_gate_up_args(cfg)), "gu_indptr"),
        ("down", down, list(_down_args(cfg)), "dn_indptr"),
    ):
        if slots and cfg.fuse_down and task == "down":
            continue  # the gate/up tiles did it
        if slots:
            names = list(
                (_slot_gate_up_down_args(cfg) if cfg.fuse_down else _slot_gate_up_args(cfg))
                if task == "gate_up"
                else _slot_down_args(cfg)
            )
            g, T, t = graph(task, names)
            columns = cfg.n_gu if task == "gate_up" else cfg.n_dn
            g.task(fn, grid=(T * cfg.topk, columns), args=tuple(t[n] for n in names), name=task)
            out.append((task, g))
            continue
        g, T, t = graph(task, names)
        trigger = g.event((E,), wait_count=0, name="trigger")
        bound = _bounds(cfg, T)[0 if task == "gate_up" else 1]
        g.task(
            fn,
            grid=(bound,),
            args=tuple(t[n] for n in names),
            triggered_by=(trigger, t[indptr]),
            name=task,
        )
        out.append((task, g))
    if slots and cfg.combine == "last":
        return out  # the down tiles combined
    last, last_args = _last_task(cfg)
    g, T, t = graph(last, list(last_args))
    g.task(tiles[last], grid=((T + CB - 1) // CB,), args=tuple(t[n] for n in last_args), name=last)
    out.append((last, g))
    return out


# ----------------------------------------------------------------------------
# numpy references
# ----------------------------------------------------------------------------
def _f32(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32, copy=False)


def _silu(g: np.ndarray) -> np.ndarray:
    return g / (np.float32(1) + np.exp(-g))


def reference_moe(
    x: np.ndarray,
    wr: np.ndarray,
    wgu: np.ndarray,
    wd: np.ndarray,
    topk: int,
    *,
    routing: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """The layer in float32 numpy: router logits ``x @ wr^T``, softmax over
    all experts, top-``topk`` (ties: lower expert first), weights
    renormalised to sum to 1, per expert ``silu(x @ Wg^T) * (x @ Wu^T) @ Wd^T``,
    weighted sum. Arrays are float32 or bf16 bits (uint16). ``routing``
    (ids, weights) overrides the router (to check the experts alone)."""
    xf, wdf = _f32(x), wd
    ids, weights = routing if routing is not None else moe_tiles.router_reference_rows(x, wr, topk)
    T, H = xf.shape
    E, I2, _ = wgu.shape
    inter = I2 // 2
    out = np.zeros((T, H), np.float32)
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)
        xe = xf[tok]
        gu = xe @ _f32(wgu[e]).T
        h = _silu(gu[:, :inter]) * gu[:, inter:]
        y = h @ _f32(wdf[e]).T
        out[tok] += weights[tok, slot][:, None] * y
    return out


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max|got - want| / max|want| (got may be bf16 bits)."""
    got, want = _f32(got), _f32(want)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    if scale == 0.0:
        return float(np.max(np.abs(got))) if got.size else 0.0
    return float(np.max(np.abs(got - want))) / scale


def gate_up_reference(
    BM: int, BN: int, H: int, inter: int, gather_topk: int | None = None
) -> Callable[..., None]:
    """Numpy reference of the gate/up tile ``(i, e)`` (the spec's decomposition;
    the tiles' own, ``etc.tiles._mma.gate_up_reference``); with
    ``gather_topk=K`` on ``(X, Wgu, row_off, gu_indptr, perm, Hb)``, row ``r``
    being ``X[perm[r] // K]``."""
    return _mma.gate_up_reference(BM, BN, inter, gather_topk=gather_topk)


def down_reference(
    BM: int, BN: int, H: int, inter: int, combine_topk: int | None = None
) -> Callable[..., None]:
    """Numpy reference of the down tile ``(i, e)`` (``etc.tiles._mma.down_reference``);
    with ``combine_topk=K`` on ``(Hb, Wd, row_off, dn_indptr, perm, topk_w,
    Out32)`` (or ``Out16``), adding its weighted rows into the sums."""
    return _mma.down_reference(BM, BN, combine_topk=combine_topk)


def run_tile_references(
    cfg: MoEConfig,
    arrays: Mapping[str, np.ndarray],
    gemm_tiles: tuple[DeviceFunction, DeviceFunction] | None = None,
) -> dict[str, np.ndarray]:
    """Every tile's numpy reference in graph order, without events (each
    triggered task over its expert ranges). ``arrays`` as from
    :func:`numpy_inputs`; returns updated copies."""
    a = {k: np.array(v, copy=True) for k, v in arrays.items()}
    tiles = _small_tiles(cfg)
    chunks = weight_chunks(cfg)
    if gemm_tiles is None and cfg.route == "slots":
        gu_ref = _mma.slot_reference(
            "gate_up", cfg.block_n_gu, cfg.inter, cfg.topk,
            cfg.router_splits if cfg.slot_logits else 0, chunk=chunks["Wgu"],
            fuse_down=cfg.fuse_down,
        )  # fmt: skip
        dn_ref = _mma.slot_reference(
            "down", cfg.block_n_dn, cfg.inter, cfg.topk, chunk=chunks["Wd"]
        )
    elif gemm_tiles is None:
        gu_ref = _mma.gate_up_reference(
            cfg.block_m, cfg.block_n_gu, cfg.inter,
            gather_topk=cfg.topk if cfg.gather else None, chunk=chunks["Wgu"],
        )  # fmt: skip
        dn_ref = _mma.down_reference(
            cfg.block_m, cfg.block_n_dn,
            combine_topk=cfg.topk if cfg.combine == "atomic" else None, chunk=chunks["Wd"],
        )  # fmt: skip
    else:
        gu_ref, dn_ref = (f.reference for f in gemm_tiles)
    T, E = a["X"].shape[0], cfg.experts
    RB, EC, TB = cfg.router_block, cfg.router_experts, cfg.topk_block
    if cfg.combine == "atomic":
        for i in range(-(-T // cfg.zero_block)):
            tiles["zero"].reference(i, a[_sums(cfg)])
    for i in range(-(-T // RB)):
        for j in range(E // EC):
            for s in range(cfg.router_splits):
                coords = (i, j) if cfg.router_splits == 1 else (i, j, s)
                tiles["logits"].reference(*coords, a["X"], a["Wr"], a["logits"])
    if cfg.route == "fused":
        tiles["route"].reference(0, *(a[n] for n in _ROUTE_ARGS))
    else:
        if "clear" in tiles:
            tiles["clear"].reference(0, a["counts"])
        for i in range(-(-T // RB)):
            for j in range(RB // TB):
                tiles["topk"].reference(i, j, *(a[n] for n in _topk_args(cfg)))
    if cfg.route == "slots":  # static (slot, column block) grids
        slot_grids = [(dn_ref, _slot_down_args(cfg), cfg.n_dn)]
        if cfg.fuse_down:
            slot_grids = []
        for ref, names, columns in (
            (gu_ref, _slot_gate_up_down_args(cfg) if cfg.fuse_down else _slot_gate_up_args(cfg),
             cfg.n_gu),
            *slot_grids,
        ):  # fmt: skip
            for s in range(T * cfg.topk):
                for j in range(columns):
                    ref(s, j, *(a[n] for n in names))
    else:
        if cfg.route != "fused":
            for i in range(moe_tiles.plan_grid(T, cfg.topk)):
                tiles["plan"].reference(i, *(a[n] for n in _PLAN_ARGS))
        release, release_args = _release_task(cfg)
        for e in range(E):
            tiles[release].reference(e, *(a[n] for n in release_args))
        gu_args = [a[n] for n in _gate_up_args(cfg)]
        for e in range(E):
            for i in range(int(a["gu_indptr"][e]), int(a["gu_indptr"][e + 1])):
                gu_ref(i, e, *gu_args)
        dn_args = [a[n] for n in _down_args(cfg)]
        for e in range(E):
            for i in range(int(a["dn_indptr"][e]), int(a["dn_indptr"][e + 1])):
                dn_ref(i, e, *dn_args)
    last, last_args = _last_task(cfg)
    for i in range(-(-T // cfg.combine_block)):
        tiles[last].reference(i, *(a[n] for n in last_args))
    return a


# ----------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------
_BIAS = 3.0  # router logit bias of the favoured experts (skewed routings)
_LOGIT_STD = 0.3  # std of the random part of the logits


def random_weights(
    cfg: MoEConfig, seed: int = 0, routing: str = "uniform", *, router_only: bool = False
) -> dict[str, np.ndarray]:
    """bf16 (uint16 bits) weights ``Wr, Wgu, Wd``, scaled so activations stay O(1).

    Skewed routings come from column 0 of Wr, a per-expert bias that meets
    the constant 1 that :func:`random_tokens` puts in column 0 of X:
    ``one-expert``: expert 0 gets +3 (every token picks it; the random part
    of the logits has std 0.3, so the margin is ~7 sigma); ``few-experts``:
    experts ``[0, min(E, 2K))`` get +3 (most experts stay empty); ``top1``
    and ``uniform``: no bias (top1 is ``cfg.with_routing('top1')``, K = 1).
    ``router_only`` skips Wgu and Wd (they are large at the real sizes;
    :func:`random_weights_torch` makes them on the GPU).
    """
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    rng = np.random.default_rng(seed)
    H, II, E = cfg.hidden, cfg.inter, cfg.experts
    wr = rng.standard_normal((E, H), np.float32) * np.float32(_LOGIT_STD / np.sqrt(H))
    if routing == "uniform" or routing == "top1":
        wr *= np.float32(1 / _LOGIT_STD)  # logits ~ N(0, 1)
    else:
        favoured = 1 if routing == "one-expert" else min(E, 2 * cfg.topk)
        wr[:, 0] = 0
        wr[:favoured, 0] = _BIAS
    if router_only:
        return {"Wr": f32_to_bf16(wr)}
    wgu = rng.standard_normal((E, 2 * II, H), np.float32) * np.float32(1 / np.sqrt(H))
    wd = rng.standard_normal((E, H, II), np.float32) * np.float32(1 / np.sqrt(II))
    return {"Wr": f32_to_bf16(wr), "Wgu": f32_to_bf16(wgu), "Wd": f32_to_bf16(wd)}


def random_tokens(cfg: MoEConfig, T: int, seed: int = 0, routing: str = "uniform") -> np.ndarray:
    """bf16 bits of X (T, H) ~ N(0, 1); column 0 is 1 under the skewed routings."""
    if not is_int(T, 0):
        raise GraphError(f"random_tokens: T must be an int >= 0, got {T!r}")
    if routing not in ROUTINGS:
        raise GraphError(f"random_tokens: routing {routing!r} is not one of {', '.join(ROUTINGS)}")
    x = np.random.default_rng(seed + 1_000_003).standard_normal((T, cfg.hidden), np.float32)
    if routing in ("one-expert", "few-experts"):
        x[:, 0] = 1.0
    return f32_to_bf16(x)


def weight_chunks(cfg: MoEConfig) -> dict[str, int]:
    """The layout the configuration's expert tiles read ``Wgu`` and ``Wd``
    in: their ``weight_chunk`` option (0: nn.Linear rows; else
    :func:`etc.tiles.gemm.chunk_weights`' layout)."""
    return {
        "Wgu": int(dict(cfg.gate_up_options).get("weight_chunk", 0)),
        "Wd": int(dict(cfg.down_options).get("weight_chunk", 0)),
    }


def kernel_weights(cfg: MoEConfig, weights: Mapping[str, Any]) -> dict[str, Any]:
    """``weights`` (nn.Linear rows, numpy arrays or torch tensors) as the
    configuration's kernel reads them: ``Wgu``/``Wd`` chunked where its
    tiles take ``weight_chunk`` (a copy, under :meth:`MoEConfig.weight_name`),
    every other entry as given. The references (:func:`reference_moe`) take
    the weights as given here."""
    out = dict(weights)
    for name, chunk in weight_chunks(cfg).items():
        if chunk and name in out:
            out[cfg.weight_name(name)] = _mma.chunk_weights(out.pop(name), chunk)
    return out


def numpy_inputs(
    cfg: MoEConfig, x: np.ndarray, weights: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Every graph tensor for ``x`` (bf16 bits, (T, H)): inputs copied (the
    weights in the layout the kernel reads, :func:`kernel_weights`),
    intermediates and the output zeroed, with their dtypes (bf16 as uint16)."""
    T = x.shape[0]
    arrays = {}
    for name, (shape, dt) in tensor_shapes(cfg, T).items():
        arrays[name] = np.zeros(shape, dtype(dt).numpy)
    arrays["X"][...] = x
    laid_out = kernel_weights(cfg, {k: weights[k] for k in ("Wr", "Wgu", "Wd")})
    for k, value in laid_out.items():
        arrays[k][...] = value
    return arrays


def torch_inputs(
    cfg: MoEConfig, T: int, weights: Mapping[str, Any] | None = None, device: str = "cuda"
) -> dict[str, Any]:
    """Every graph tensor on ``device`` (torch; bf16 as torch.bfloat16),
    intermediates zeroed. ``weights``: numpy bf16 bits or torch tensors for
    any of X, Wr, Wgu, Wd (else left zero), nn.Linear rows (laid out as the
    kernel reads them: :func:`kernel_weights`)."""
    import torch

    out = {}
    for name, (shape, dt) in tensor_shapes(cfg, T).items():
        out[name] = torch.zeros(shape, dtype=torch_dtype(dt), device=device)
    for name, value in kernel_weights(cfg, weights or {}).items():
        if isinstance(value, np.ndarray):
            if value.dtype == np.uint16:
                value = torch.from_numpy(value.astype(np.int16)).view(torch.bfloat16)
            else:
                value = torch.from_numpy(value)
        out[name].copy_(value.to(out[name].dtype) if value.dtype != out[name].dtype else value)
    return out


def random_weights_torch(
    cfg: MoEConfig, seed: int = 0, routing: str = "uniform", device: str = "cuda"
) -> dict[str, Any]:
    """Like :func:`random_weights` but torch bf16 on ``device`` (Wr from
    :func:`random_weights`, the expert weights drawn by torch)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    H, II, E = cfg.hidden, cfg.inter, cfg.experts
    wr = random_weights(cfg, seed, routing, router_only=True)["Wr"]
    out = {"Wr": torch.from_numpy(wr.astype(np.int16)).view(torch.bfloat16).to(device)}
    for name, shape, fan_in in (("Wgu", (E, 2 * II, H), H), ("Wd", (E, H, II), II)):
        w = torch.empty(shape, dtype=torch.bfloat16, device=device)
        w.normal_(0.0, float(fan_in) ** -0.5, generator=gen)
        out[name] = w
    return out


def random_tokens_torch(
    cfg: MoEConfig, T: int, seed: int = 0, routing: str = "uniform", device: str = "cuda"
) -> Any:
    """X (T, H) bf16 on ``device`` ~ N(0, 1); column 0 is 1 under the skewed routings."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed + 1_000_003)
    x = torch.empty((T, cfg.hidden), dtype=torch.float32, device=device).normal_(generator=gen)
    if routing in ("one-expert", "few-experts"):
        x[:, 0] = 1.0
    return x.to(torch.bfloat16)


def reference_moe_torch(x: Any, wr: Any, wgu: Any, wd: Any, topk: int) -> tuple[Any, Any, Any]:
    """:func:`reference_moe` in float32 torch on the tensors' device; returns
    ``(out, topk_ids, topk_w)``."""
    import torch

    xf = x.float()
    logits = xf @ wr.float().t()
    probs = torch.softmax(logits, dim=1)
    # Stable sort of the negated logits: ties go to the lower expert index.
    order = torch.sort(-logits, dim=1, stable=True).indices[:, :topk]
    weights = torch.gather(probs, 1, order)
    weights = weights / weights.sum(1, keepdim=True)
    out = torch.zeros_like(xf)
    inter = wgu.shape[1] // 2
    for e in torch.unique(order).tolist():
        tok, slot = torch.nonzero(order == e, as_tuple=True)
        gu = xf[tok] @ wgu[e].float().t()
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        out.index_add_(0, tok, weights[tok, slot][:, None] * (h @ wd[e].float().t()))
    return out, order.int(), weights

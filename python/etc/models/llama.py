"""A whole Llama-style decoder as one ETC graph: one launch per decode step (issue 7).

Every layer repeats the same tasks (eight with the norm stages shown here);
a task's grid has the layer as its dimension 0 and its ``phase``, so the
static schedule runs layer by layer and one tile serves all layers (weights
are stacked ``(layers, ...)``)::

    embed --layer_in[0]--> norm1(l) --normed1[l]--> qkv(l) --qkv_done[l]-->
    attention(l, b, g, s) --attended[l]--> combine(l) --combined[l]--> o_proj(l)
    --o_done[l]--> norm2(l) --normed2[l]--> gate_up(l) --gu_done[l]--> down(l)
    --layer_in[l + 1]--> norm1(l + 1) ...  layer_in[layers] --> final_norm
    --final_normed--> lm_head --logits_done--> argmax

By default (``LlamaConfig.fold_norms``) norm1 and norm2 are folded into the
projections that follow them (their weights multiplied into ``wqkv_folded``
and ``wgu_folded``, the rows scaled in the GEMM epilogues), so qkv waits on
``layer_in[l]`` and gate_up on ``o_done[l]``.
``down(l)`` notifies the next layer through the shifted out-edge ``(l, i, j)
-> (l + 1)`` (loop-carried: it does not order the tasks). The attention of
layer ``l`` splits the context into spans (flash-decoding); ``combine``
merges the splits. The residual stream ``h`` is updated in place by the
``o_proj`` and ``down`` epilogues.

Symbols: ``B`` (batch: sequences decoded together), ``L`` (tokens already in
the cache: the new token's position, the same for every sequence) and ``S``
(cache capacity, ``S > L``). One artifact serves every ``(B, L, S)``.

What is here: :class:`LlamaConfig` (``LLAMA_3_2_1B``, ``TINY``),
:func:`build_decoder_graph`, :func:`random_weights` (numpy) and
:func:`random_weights_torch`, :func:`rope_table`, :func:`reference_step`
(numpy, the rounding of Hugging Face's bf16 ``LlamaForCausalLM``),
:func:`numpy_inputs` / :func:`torch_inputs`, :func:`hf_state_dict` (the same
weights in ``LlamaForCausalLM``'s layout) and its inverse
:func:`from_hf_state_dict` (a checkpoint's weights for the graph),
:func:`config_from_hf` and :func:`torch_decode_step` (a minimal PyTorch
decode step over the same buffers: the baseline).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._fields import check_config, is_int
from ..device import CLUSTER_SIZES
from ..dtypes import bf16_to_f32, f32_to_bf16, torch_dtype
from ..errors import GraphError
from ..graph import Graph

__all__ = [
    "LlamaConfig",
    "LLAMA_3_2_1B",
    "TINY",
    "build_decoder_graph",
    "compile_options",
    "compile_decoder",
    "LARGE_BATCH",
    "SMALL_BATCH",
    "FEW_SEQUENCES",
    "DECODER_TASKS",
    "tensor_shapes",
    "random_weights",
    "random_weights_torch",
    "rope_table",
    "reference_step",
    "numpy_inputs",
    "torch_inputs",
    "graph_weights",
    "hf_config",
    "hf_state_dict",
    "from_hf_state_dict",
    "config_from_hf",
    "torch_decode_step",
    "weight_bytes",
    "kv_bytes",
    "check_tokens",
    "check_lengths",
    "check_block_table",
    "step_symbols",
    "page_table",
    "to_pages",
    "from_pages",
    "PagePool",
]

#: The decode GEMM tiles' options (``etc.tiles.gemm.layer_gemm``), the best
#: of ``bench/decode_sweep.py`` on an H200 (``bench/RESULTS.md``).
#: The weights that ``fold_norms`` multiplies the layer norms into.
_FOLDED = ("wqkv", "wgu")
#: The layer projections' weights, which ``weight_chunk`` lays out in chunks.
_CHUNKED = ("wqkv", "wo", "wgu", "wd")
#: Larger than any batch: ``(B + _BIG - k) // _BIG`` is ``B >= k`` as 0 or 1.
_BIG = 2**31


def _lt(a: Any, b: Any) -> Any:
    """1 if ``a < b`` else 0, for sizes (ints or symbolic, |a - b| < 2**31):
    the symbolic sizes have no comparisons."""
    return (b - a + _BIG - 1) // _BIG


def _min(a: Any, b: Any) -> Any:
    return a + (b - a) * _lt(b, a)


def _max(a: Any, b: Any) -> Any:
    return a + (b - a) * _lt(a, b)


#: ``LlamaConfig.attn_tile`` values.
ATTENTION_TILES = ("phased", "online", "mma")
#: The tile changes of the decoder's kernel for large batches: every
#: projection on TMA + wgmma in 64-row blocks (``gemm_core="tma"``, split-K
#: by ``k_splits``: -4.5 % at B=32, -19 % at B=64 on an H200 against the
#: 32-row mma.sync tiles, session 13), 64-column qkv/o/down blocks and
#: 64-column gate/up blocks in 2 parts of k (32 columns whole until the
#: thirty-third session: −2..−3.4 % at B = 32, even at B = 64), the
#: tensor-core attention fed by TMA (session 16), the
#: whole-row argmax and 128-column LM head blocks, no shared regions
#: (its TMA tiles and attention would not fit two CTAs per SM apart), every
#: tile a called function, and the attention's ring stages given back once
#: read (together −1.7..−4 % at B = 32 and 64 on an H200, session 30), and
#: down_proj's split-K sums shared by each block's last 2 parts to arrive
#: (``tma_meet_share``: −0.8..−1.4 % at L = 1024, −0.1..−0.5 % at 4096,
#: session 35; qkv's, o_proj's and gate/up's cost 1-4 %), and both streams
#: read once a step, the weight boxes and the KV ring, L2 evict-first
#: (``weights_evict_first``, ``attn_kv_evict_first``: −3.3..−5.2 % at
#: L = 1024 and −1.5..−2.2 % at 4096, B = 32-64; either alone ±1 %, forty-third
#: session, item 200).
LARGE_BATCH = (
    ("block_m", 32),
    ("row_warps", 1),
    ("attn_tile", "mma"),
    ("attn_unroll", 1),
    ("attn_pipeline", "auto"),
    ("argmax_whole", True),
    ("gemm_core", "tma"),
    ("bn_qkv", 64),
    ("bn_o", 64),
    ("bn_gu", 64),
    ("bn_down", 64),
    ("bn_lm", 128),
    ("shared_regions", ()),
    ("outline", True),
    ("attn_tma_release", "read_early"),
    ("sm_deal", "spread"),
    ("tma_meet_share", (("down_proj", 2),)),
    ("weights_evict_first", True),
    ("attn_kv_evict_first", True),
)
#: The changes of the decoder's B = 9..16 kernel (and B = 2..8's,
#: :data:`FEW_SEQUENCES`): its CTAs skip a wait on the coordinate their
#: last completed wait saw (``wait_memo``; -0.7..-1.8 %
#: at B = 8-16, even at B = 2 and 4 on an H200, fortieth session, item 183;
#: the B = 1 kernel, its tiles inlined, was 3.5-5 % slower with it), and
#: its weight copies are L2 evict-first (``weights_evict_first``; -1.6..-3.7 %
#: at B = 2-16, forty-second session, item 198), its KV ring too
#: (``attn_kv_evict_first``: -0.4 % on average over B = 8-16, L = 1024-4096,
#: 12 of 16 pairs faster, forty-third session, item 202). Its projections
#: stream on the gemv core, 16 rows a tile on ``mma.sync`` with the weights
#: as the A operand (16-column o_proj and down blocks: a warp takes 16
#: weight rows; -2.6..-3.1 % at B = 12-16 on an H200, forty-fifth
#: session, items 210-213); the weights' hint then marks nothing (the gemv core
#: takes none). Its queues are dealt by SM (``sm_deal``: -0.1..-0.6 % at
#: B = 8, -0.9..-2.6 % at B = 12, item 215). The last split of each
#: (sequence, kv head) merges the splits in its attention instance, with no
#: combine stage (``fuse_combine``: -1..-2 % at B = 2-8, forty-sixth
#: session, item 222). Each warp's weight copies read whole 128-byte lines,
#: shared among its lanes through the ring (``gemv_whole_lines``: -2..-3.6 %
#: at B = 2-16, L = 1024 and 4096, forty-seventh session, item 227).
#: :data:`FEW_SEQUENCES` is its B = 2..8 kernel.
SMALL_BATCH = (
    ("wait_memo", True),
    ("weights_evict_first", True),
    ("attn_kv_evict_first", True),
    ("gemm_core", "gemv"),
    ("gemv_block", 16),
    ("bn_o", 16),
    ("bn_down", 16),
    ("gemm_options", (("stages", 4),)),
    ("gemv_short_path", False),
    ("sm_deal", "spread"),
    ("fuse_combine", True),
    ("gemv_whole_lines", True),
)
#: The decoder's B = 2..8 kernel: :data:`SMALL_BATCH` on 8-row gemv tiles,
#: which load half the activations and run half the mmas of a 16-row tile
#: (-6.8..-7.7 % at B = 2-8 against the mma.sync core, item 213; -1.3..-2 %
#: against 16-row tiles taking their 8-row loop, item 212); its LM head in
#: 128-column blocks, one k slice a warp (-0.5..-1.5 % at B = 4, -0.8 % on
#: average at B = 8, L = 4096 over five passes, forty-sixth session, item 226);
#: its embedding tile called, not inlined (-2.0..-2.6 % at B = 2 and 8 on an
#: H100, sixty-second session, item 278).
FEW_SEQUENCES = (
    *SMALL_BATCH,
    ("gemv_block", 8),
    ("bn_lm", 128),
    ("outline", ("attention", "embed")),
)
#: The tile changes of the decoder's B = 1 kernel: the phased attention
#: (one sequence's short spans: the tensor-core tile's loop steps are 128
#: positions) in loop steps of 64 positions, so ``attn_single_span``'s
#: spans hold (-6 % on an H200, tenth session), inlined; its LM head and
#: argmax called (-1.3 %, thirtieth session); every projection on CUDA
#: cores, one row a tile, whole weight lines through an 8-slot per-thread
#: ring (``gemm_core="gemv"``, called: -12.6 % at L = 1024, -10.4 % at
#: L = 4096 on an H200 with 4 slots, forty-fourth session, item 207); the
#: last of each kv head's 17 splits to finish merges them, with no combine
#: stage (``fuse_combine``: -1.9 %, forty-sixth session, item 219); o_proj
#: in 16-column blocks, whose 128 instances the static deal gives to the
#: 128 CTAs after the attention's 136, which fill their rings while it runs
#: (-0.6 % on average at L = 1024 and 4096, forty-seventh session, item 231).
SINGLE_SEQUENCE = (
    ("attn_tile", "phased"),
    ("attn_unroll", 2),
    ("attn_pipeline", "none"),
    ("attn_tma_release", "math"),
    ("outline", ("lm_head", "argmax", "argmax_merge")),
    ("gemm_core", "gemv"),
    ("gemm_options", (("stages", 8),)),
    ("fuse_combine", True),
    ("bn_o", 16),
)
#: The changes of the B = 1 kernel past :data:`SINGLE_SEQUENCE_CONTEXT`:
#: the B = 2..16 kernel's tensor-core attention (TMA ring, ``read_early``,
#: called), the other tiles as :data:`SINGLE_SEQUENCE`'s. Its 128-position
#: loop steps take B = 1's 64-position spans half empty at L = 1024
#: (+0.4..+1.7 %), but once the spans outgrow one 64-position step of the
#: phased tile it pays: -1.3..-1.6 % at L = 1152-1408, -2.4..-3.4 % at
#: L = 4096 on an H200 (forty-second session, items 191-192). Its weights
#: were evict-first (-0.4 %, item 198) until the projections moved to the
#: gemv core, which takes no L2 hint (forty-fourth session, item 208). Its
#: greedy argmax folded into the LM head, with the embedding tile called so
#: that the main function spills no more than without the fold (44 bytes;
#: 80 with the fold and embed inlined): -1.0 % at L = 4096 on an H100
#: (sixty-second session, item 278; +1.8 % with the spills, item 272).
SINGLE_SEQUENCE_LONG = (
    ("attn_tile", "mma"),
    ("fuse_combine", False),
    ("attn_unroll", 1),
    ("attn_pipeline", "auto"),
    ("attn_tma_release", "read_early"),
    ("outline", ("attention", "lm_head", "argmax", "embed")),
    ("argmax_fused", True),
)
#: The largest L the B = 1 kernel runs with the phased attention: the last
#: whose splits (``attn_single_splits`` = 17 of ``attn_single_span`` = 64
#: positions, L + 1 in all) each fit one 64-position loop step of it.
SINGLE_SEQUENCE_CONTEXT = 17 * 64 - 1
#: The changes of the B = 1 kernel up to :data:`SINGLE_SEQUENCE_CONTEXT`: its
#: phased tile sized to the 64-position splits (``attn_phased_span``; -1.5 %
#: alone: a split is one loop step), whose cached K and V rows its prefetch
#: function copies into shared memory (16 KB) before the instance waits for
#: the QKV projection (``attn_prefetch_kv``; together -2.3..-3.2 % at L = 512
#: and 1024 on an H200, forty-seventh session, item 232); its greedy argmax
#: folded into the LM head (``argmax_fused``: -0.8 % and -1.2 % at L = 1024
#: on two H100s, sixty-first and sixty-second sessions, items 272 and 275;
#: the tensor-core kernel past L = 1087 folds too, with its embedding called).
SINGLE_SEQUENCE_SHORT = (
    ("attn_phased_span", 64),
    ("attn_prefetch_kv", True),
    ("argmax_fused", True),
)
#: The default B = 1 kernel: a kernel per context range (``context_buckets``).
SINGLE_SEQUENCE_BY_CONTEXT = (
    *SINGLE_SEQUENCE,
    (
        "context_buckets",
        ((SINGLE_SEQUENCE_CONTEXT, SINGLE_SEQUENCE_SHORT), (None, SINGLE_SEQUENCE_LONG)),
    ),
)
_GEMM_OPTIONS = (("stages", 4), ("unroll", 2), ("rotate_k", True))
#: The fields that set the attention's split counts (``LlamaConfig.splits``),
#: so the shape of its partials: one value for an artifact's kernels.
_SPLIT_FIELDS = {
    "attn_chunk",
    "attn_phased_chunk",
    "attn_small_batch",
    "attn_small_span",
    "attn_small_spans",
    "attn_single_span",
    "attn_single_splits",
    "attn_single_tiers",
    "attn_cached_splits",
}
_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
#: The task that runs each layer projection's tiles.
_PROJECTION_TASKS = {
    "qkv_proj": "qkv",
    "o_proj": "o_proj",
    "gate_up_proj": "gate_up",
    "down_proj": "down",
}
#: The decoder's task names (``LlamaConfig.shared_regions`` keys).
DECODER_TASKS = (
    "embed",
    "norm1",
    "qkv",
    "attention",
    "combine",
    "o_proj",
    "norm2",
    "gate_up",
    "down",
    "final_norm",
    "lm_head",
    "argmax",
    "argmax_merge",
    "l2_prefetch",
)
#: The options ``LlamaConfig.projection_options`` may set per projection.
PROJECTION_OPTIONS = ("stages", "unroll", "prefetch_ring", "bulk_ring", "refill", "l2_evict_first")
#: ``gemm_core`` values (``etc.tiles.gemm.LAYER_CORES``).
_CORES = ("sync", "bulk", "tma", "gemv")
#: The projections ``k_splits`` may split, and the field holding their ``k``.
_SPLIT_INPUTS = (
    ("qkv_proj", "hidden"),
    ("o_proj", "attn_width"),
    ("gate_up_proj", "hidden"),
    ("down_proj", "inter"),
)
#: Each split projection's row of ``split_count``.
_COUNTER_ROWS = {"qkv_proj": 0, "o_proj": 1, "gate_up_proj": 2, "down_proj": 3}


def _one_of(key: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise GraphError(f"LlamaConfig: {key} {value!r} is not one of {', '.join(options)}")


def _check_pairs(where: str, entries: Any, names: tuple[str, ...], what: str) -> None:
    """Raises GraphError naming ``where`` unless ``entries`` is a tuple of
    ``(name, value)`` pairs whose names are in ``names``."""
    if not isinstance(entries, tuple) or not all(
        isinstance(e, tuple) and len(e) == 2 for e in entries
    ):
        raise GraphError(
            f"LlamaConfig: {where} must be a tuple of ({what}, value) pairs, got {entries!r}"
        )
    for name, _ in entries:
        if name not in names:
            raise GraphError(f"LlamaConfig: {where} names {name!r}, not one of {', '.join(names)}")


def _int_field(key: str, value: Any, low: int, high: int | None = None) -> None:
    """Raises GraphError naming field ``key`` unless ``value`` is an int in
    ``low..high`` (``high`` None: no upper bound)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and (high is None or value <= high):
        return
    want = f"an int >= {low}" if high is None else f"an int in {low}..{high}"
    raise GraphError(f"LlamaConfig: {key} must be {want}, got {value!r}")


@dataclass(frozen=True)
class LlamaConfig:
    """Model sizes (defaults: Llama-3.2-1B) and the decode tile sizes.

    ``block_m`` rows (sequences) per GEMM tile; ``bn_*`` output columns per
    tile of each projection; ``attn_chunk`` cached positions per attention
    instance. The embedding and the LM head are tied (as in Llama-3.2-1B).
    ``rope_scaling``: Llama 3's frequency scaling ``(factor, low_freq_factor,
    high_freq_factor, original_max_position)`` or None."""

    hidden: int = 2048
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 64
    inter: int = 8192
    vocab: int = 128256
    eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: tuple[float, float, float, int] | None = (32.0, 1.0, 4.0, 8192)
    block_size: int = 256
    block_m: int = 16
    bn_qkv: int = 16
    bn_o: int = 8
    #: 32: one wave of gate/up tiles on 264 CTAs (B=1 -37 µs against 16).
    bn_gu: int = 32
    bn_down: int = 8
    bn_lm: int = 64
    #: The attention span past ``attn_small_batch`` sequences (the
    #: tensor-core tile of the large-batch kernel: one split of 4096
    #: positions: -7 % at B=32/64 and L=1024, -17..-19 % at L=4096 on an
    #: H200 against 512; ``bench/RESULTS.md``, item 44).
    attn_chunk: int = 4096
    #: The phased tile's buffers: the longest span it holds (its scores in
    #: shared memory), and its tuned loop layout. A kernel that may run more
    #: than ``attn_small_batch`` sequences with it spans ``min(attn_chunk,
    #: attn_phased_chunk)`` (:attr:`attn_large_span`).
    attn_phased_chunk: int = 512
    #: Batches of at most this many sequences split the attention into spans
    #: of about ``attn_small_span`` positions (more, shorter instances: a
    #: few sequences leave most CTAs idle); larger ones into spans of at
    #: most ``attn_chunk`` (fewer instances, each one's fixed cost paid
    #: once). The splits share the positions evenly in whole loop steps
    #: (``attention(spread=True)``). 0: ``attn_chunk`` spans at every batch.
    attn_small_batch: int = 16
    attn_small_span: int = 256
    #: Spans by batch size up to ``attn_small_batch`` sequences, instead of
    #: ``attn_small_span``: ``(b, span)`` or ``(b, span, most)``, up to
    #: ``b`` sequences ``max(1, ceil(L / span))`` splits (the cached
    #: positions; position L rides in the split that reaches it), at most
    #: ``most``: past ``most * span`` positions the spans grow with L, which
    #: only the tensor-core tile holds. Batches past the last ``b`` take
    #: ``attn_small_span``'s, B = 1 its own tier. Chosen so that the
    #: instances fill about one round of the 264 CTAs at any context
    #: (``b * kv_heads * most`` <= 264): with the phased tile's uncapped
    #: tiers of 128 to 384 positions B = 8, L = 4096 ran 1024 instances in
    #: four rounds, each paying its fixed cost (19 % slower; item 174). At
    #: B = 5..8 spans of 512 (half a round at L = 1024: an instance's fixed
    #: cost, ~3 µs, paid half as often) beat 256 by 2 % at B = 8, L = 1024
    #: (items 176, 220). Empty: ``attn_small_span``'s ``ceil((L + 1) / span)``.
    attn_small_spans: tuple[tuple[int, ...], ...] = (
        (2, 128, 16), (4, 128, 8), (8, 512, 4), (11, 384, 3), (16, 256, 2),
    )  # fmt: skip
    #: The shortest span when one sequence is decoded (B=1; 0: as larger
    #: batches): up to ``attn_single_splits`` splits of at least this many
    #: positions, and never fewer splits than ``attn_small_span`` gives. At
    #: L=1024, 17 splits of 64 keep 136 CTAs busy instead of 40 (5 of 256);
    #: at L=4096, 17 of 256 as before (65 splits of 64 were 6 % slower). A
    #: tile whose loop step is longer rounds the span up to whole steps (the
    #: B=1 kernel of ``batch_buckets`` takes steps of 64 positions). Every
    #: kernel of an artifact shares the split count: a field of the
    #: artifact, not of one bucket.
    attn_single_span: int = 64
    attn_single_splits: int = 17
    #: B = 1's split counts by context, before ``attn_single_span`` and
    #: ``attn_single_splits``: ``(context, span, most)`` triples, increasing
    #: contexts; for L up to ``context`` (and past the previous tier's), at
    #: most ``most`` splits of at least ``span`` positions (never fewer than
    #: B = 2 would take), past the last tier the two fields'. A context
    #: bucket's kernel may then take other splits than the next bucket's:
    #: ``((575, 64, 17), (1151, 128, 9))`` gives L = 576..1151 nine splits of
    #: up to 128 (the merge half as long) and the long kernel past it its 17
    #: (a split count for the whole artifact gave the long kernel 9 up to L
    #: = 2303, +1.1..+1.8 % at L = 2048; forty-eighth session, item 239).
    #: A span of 0 gives exactly ``most`` splits at every L of the tier
    #: (:attr:`attn_cluster`'s groups; trailing ones empty at short L).
    attn_single_tiers: tuple[tuple[int, int, int], ...] = ()
    gemm_options: tuple[tuple[str, Any], ...] = field(default=_GEMM_OPTIONS)
    #: Warps along the rows of a GEMM tile (0: ``plan_warps``' default). With
    #: 1 every warp holds all ``block_m`` rows and reuses each weight fragment
    #: for all of them: the weights are read once however large the batch.
    row_warps: int = 0
    #: The GEMM tiles' run-time row paths (``layer_gemm(row_paths=...)``) of
    #: the projections in ``row_path_projections`` (empty: all), whose tiles
    #: then cover ``max(row_paths)`` rows (the others ``block_m``, and
    #: embed as many as down_proj's, since both notify ``layer_in``):
    #: with ``row_paths=(16, 32, 64)`` a batch of 1..16 runs the
    #: 16-row loop and a batch of 64 one 64-row block per weight block
    #: instead of four, from the same artifact. Empty: one path of block_m.
    row_paths: tuple[int, ...] = ()
    row_path_projections: tuple[str, ...] = ()
    #: GEMM grids ordered (layer, column block, row block): the row blocks of
    #: a weight block run together and share it through L2 (B > block_m).
    columns_first: bool = True
    #: GEMM tiles prefetch their weight rows into L2 before waiting for
    #: their activations (``layer_gemm(prefetch_weights=True)``). Off: on
    #: an H200 it cost 2-3 % (``bench/RESULTS.md``): the stages wait ~0.5 µs
    #: for each other, the tiles are slow in themselves.
    prefetch_weights: bool = False
    #: With ``prefetch_weights``: the static kernel calls the weight
    #: prefetch of each CTA's *next* instance before running the current one
    #: (``etc.compile(prefetch_next=True)``, see :func:`compile_options`), so
    #: the next tile's weights stream into L2 during this tile.
    prefetch_next: bool = False
    #: The RMSNorms computed inside the GEMM that follows them
    #: (``layer_gemm(rmsnorm=...)``): no norm stages, two fewer waits per
    #: layer. Same rounding. Off: on an H200 the step was 13-23 % slower (each
    #: tile recomputes its rows' statistics before its k loop).
    fuse_norms: bool = False
    #: With ``fuse_norms``: the tasks that write the residual stream (embed,
    #: o_proj, down) add each row's sum of squares to ``sumsq`` and the
    #: normalising GEMMs read it (``layer_gemm(norm_sums=True, sums_out=...)``)
    #: instead of each tile computing the statistics in a prologue.
    norm_sums: bool = False
    #: The attention's last split of each (sequence, kv head) merges the
    #: splits (``attention(combine=True)`` or ``attention_mma(combine=True)``,
    #: split counters in ``attn_count`` that embed zeroes): no combine stage.
    #: B = 1's phased kernel and the B = 2..16 ones take it
    #: (:data:`SINGLE_SEQUENCE`, :data:`SMALL_BATCH`; −1.9 % and −1..−2 % on an
    #: H200, forty-sixth session).
    fuse_combine: bool = False
    #: Whether the graph declares ``attn_count``, the fused combine's split
    #: counters. None: whether any kernel of the artifact fuses its combine
    #: (:attr:`split_counters`): every kernel of an artifact takes the same
    #: buffers, so those that do not fuse declare the counters too.
    attn_counters: bool | None = None
    #: The GEMM tiles' main loop (``layer_gemm(core=...)``): "sync" (per-thread
    #: ``cp.async`` ring, ``gemm_options``) or "bulk" (``cp.async.bulk`` ring
    #: whose first chunks load before each instance's waits, ``bulk_options``),
    #: "tma" (TMA + wgmma, split-K) or "gemv" (whole weight lines through a
    #: per-thread ring: ``gemv_block`` rows a tile).
    gemm_core: str = "sync"
    #: Rows of a gemv-core tile: 1 (on CUDA cores) or 8 / 16 / 32 / 64
    #: (``mma.sync`` with the weights as the A operand; its weight blocks
    #: hold multiples of 16 rows: ``bn_*`` 16 or more, gate/up's 8). 32 and
    #: 64 rows were not faster than the tma core at B = 24-64 on an H200
    #: (forty-ninth session, ``bench/RESULTS.md`` items 244-248; 64 rows
    #: spill in gate/up, down and the LM head).
    gemv_block: int = 1
    #: ``gemv_block`` = 16: a tile of at most 8 rows takes an 8-row loop
    #: (``layer_gemm(short_path=...)``); off in a kernel whose B never
    #: leaves a row block so short (:data:`SMALL_BATCH`'s, B = 9..16).
    gemv_short_path: bool = True
    #: ``gemv_block`` 8 to 64: each warp's weight copies read whole 128-byte
    #: lines (``layer_gemm(whole_lines=True)``), the lanes sharing them
    #: through shared memory, instead of half lines into per-lane slots.
    gemv_whole_lines: bool = False
    #: Per-projection cores overriding ``gemm_core``: ``(("down_proj", "bulk"),)``.
    #: Projections: qkv_proj, o_proj, gate_up_proj, down_proj, lm_head.
    core_overrides: tuple[tuple[str, str], ...] = ()
    #: Per-projection options (keys: :data:`PROJECTION_OPTIONS`), e.g.
    #: ``(("gate_up_proj", (("prefetch_ring", 1),)),)``: on the sync core
    #: they override ``gemm_options`` and ``prefetch_ring``; on the tma core
    #: ``stages`` and ``prefetch_ring`` override ``tma_stages`` and
    #: ``tma_prefetch`` (``unroll`` does not apply), and ``refill="test"``
    #: refills each ring stage once it tests free instead of thread 0
    #: waiting for it (``etc.tiles.gemm_tc.gemm``'s option).
    projection_options: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    bulk_options: tuple[tuple[str, Any], ...] = (("rotate_k", True),)
    #: The attention tile copies its whole chunk of K and V into shared
    #: memory with ``cp.async`` first (``attention(stage_kv=True)``). Off:
    #: on an H200 its instances ran 22 % faster but the step did not.
    attn_stage_kv: bool = False
    #: The attention tile's K/V copies issued by its prefetch function,
    #: before the instance waits for the QKV projection
    #: (``attention(stage_kv=True, prefetch_kv=True)``): the cache is read
    #: while the projection runs. Not with ``prefetch_next``. ``"l2"``: the
    #: prefetch function only asks the L2 for those rows
    #: (``attention(prefetch_kv="l2")``, no shared memory).
    attn_prefetch_kv: bool | str = False
    #: The attention tile copies its span's V into shared memory with
    #: ``cp.async`` at the start (``attention(stage_v=True)``): the values
    #: load while the scores and the softmax run.
    attn_stage_v: bool = False
    #: The attention tile: "phased" (:func:`etc.tiles.llama.attention`: RoPE,
    #: scores, softmax and values as CTA-wide phases, with the ``attn_stage*``
    #: options and ``fuse_combine``), "online" (:func:`etc.tiles.llama.
    #: attention_online`: one online-softmax pass per warp on the CUDA cores)
    #: or "mma" (:func:`etc.tiles.attention_mma.attention_mma`: the same pass
    #: on the tensor cores). The last two take none of the phased options.
    #: "mma" by default, every kernel but B = 1's (``batch_buckets``): from
    #: 2 to 16 sequences it streams a span about twice as fast, and with
    #: ``attn_small_spans``' capped split counts B = 8, L = 4096 was 19 %
    #: faster on an H200, B = 16 32 % (``bench/RESULTS.md`` item 174).
    attn_tile: str = "mma"
    #: Loads in flight per loop step: row groups per lane ("phased" and
    #: "online", ``unroll``) or 16-position blocks per warp ("mma",
    #: ``blocks``). A split's span is a whole number of loop steps.
    attn_unroll: int = 1
    #: The tensor-core attention loads each step's K and V during the
    #: previous step's arithmetic (``attention_mma(pipeline=...)``): "none",
    #: "registers" (carried in the loop), "smem" (``cp.async`` into
    #: per-lane slots of a two-stage workgroup buffer) or "tma" (thread 0
    #: copies each step's K and V rows by TMA into a ring of
    #: ``attn_tma_stages`` stages; head_dim 64). "auto": "tma" where the
    #: head dimension is 64, else "none". "mma" only.
    attn_pipeline: str = "auto"
    #: Ring stages of ``attn_pipeline="tma"`` (2: −4..−7 % at B = 32 and 64
    #: on an H200 against the per-lane loads; 3 was 1-3 % slower than 2).
    attn_tma_stages: int = 2
    #: The TMA-fed attention starts its ring in its prefetch function, before
    #: it waits for the QKV projection (``attention_mma(prefetch=True)``;
    #: −0.3..−1.6 % at B = 32 and 64 on an H200).
    attn_tma_prefetch: bool = True
    #: When the TMA-fed attention's warps give a ring stage back
    #: (``attention_mma(release=...)``): "math" (after the step's
    #: arithmetic), "read" (once their vectors are in registers; thread 0
    #: refills it after its arithmetic: one step more in flight)
    #: or "read_early" (refilled before thread 0's arithmetic). On an H200
    #: (twenty-ninth session) "read_early" was 1.5 % faster at L = 4096 and
    #: 0.5-2 % slower at L = 1024 (choosing by span at run time: 3-6 % slower);
    #: with the attention called (``outline``, thirtieth session) faster at
    #: both, so every kernel with this tile takes it.
    attn_tma_release: str = "read_early"
    #: Past ``attn_small_batch``, the attention splits the ``L`` cached
    #: positions (``max(1, ceil(L / span))`` splits, position ``L`` in the
    #: last) instead of ``L + 1``: for the tensor-core tile, which holds no
    #: span (at ``L = 4096``, one split instead of two). None: when every
    #: kernel that may run past ``attn_small_batch`` has the tensor-core
    #: tile; :meth:`bucket_configs` gives every kernel the artifact's value.
    attn_cached_splits: bool | None = None
    #: With the tensor-core tile, a grid of one split per (sequence, kv head)
    #: writes the attention output itself (``attention_mma(direct=True)``)
    #: and the combine's grid is empty: it runs only past one split. One
    #: stage less per layer at B >= 17 up to L = 4096. The attention
    #: instances then also count on ``combined`` (its wait count: theirs plus
    #: the combine's), so no count is ever 0, which the dynamic schedule
    #: would never release.
    attn_direct: bool = True
    #: A measuring aid (off): the attention writes thread 0's clock at points
    #: of each instance into the graph tensor ``attn_stamps`` ``(layers, B,
    #: kv_heads, splits, words)`` i64 (``bench/decode_trace.py``): the
    #: tensor-core tile's ``attention_mma.STAMPS`` (``stamps=True``), the
    #: phased tile's ``llama.PHASED_STAMPS``.
    attn_stamps: bool = False
    #: A measuring aid (off): the layer projections on the tma core write
    #: thread 0's clock at points of each instance
    #: (``gemm_layer_tma.STAMPS``: after the waits, the k loop's end, the
    #: split-K meeting, the end) into the graph tensor ``gemm_stamps``
    #: ``(layers, 4, 1024 * ceil(B / 64), words)`` i64, row ``r`` of
    #: projection ``r`` of qkv, o_proj, gate/up, down (``bench/decode_trace.py``).
    gemm_stamps: bool = False
    #: Sequences at their own positions (a ragged batch, as a serving engine
    #: batches requests): the graph takes ``lengths`` ``(B,)`` i32, sequence
    #: ``b``'s position (its cached tokens), and the symbol ``L`` is the
    #: longest, which sizes the attention's splits and picks a context
    #: bucket. Sequence ``b`` reads its RoPE row, writes its cache row and
    #: attends over its positions ``0..lengths[b]`` (a position past ``L``
    #: is taken as ``L``: :func:`check_lengths` refuses it on the host).
    ragged: bool = False
    #: A paged KV cache (0: contiguous), as a serving engine allocates it:
    #: ``k_cache`` and ``v_cache`` are a pool ``(layers, pages, kv_heads,
    #: page_size, head_dim)`` and the graph takes ``block_table`` ``(B,
    #: max_pages)`` i32, sequence ``b``'s pages in position order (sequences
    #: may share pages they only read). ``pages`` and ``max_pages`` are
    #: symbols; :func:`check_block_table` checks a table on the host. A power
    #: of two; with the TMA-fed tensor-core attention a multiple of its loop
    #: step (128 positions in Llama's kernels).
    page_size: int = 0
    #: The phased attention's steps 2-4 as one pass of each warp over its
    #: own rows, the warps' states merged after one barrier
    #: (``llama.attention(one_pass=True)``): two barriers fewer.
    attn_one_pass: bool = False
    #: (sequence, kv head) items per tensor-core attention instance
    #: (``attention_mma(items=...)``; TMA pipeline only): the grid's kv-head
    #: dimension is ``kv_heads / attn_items`` and each instance attends its
    #: items one after the other on one TMA ring, so a CTA that would run
    #: two instances of a layer pays one wait, one call and one ring start.
    #: 1 in every kernel: in the large-batch kernel on an H200, 2 items were
    #: 0.5-1 % faster at B = 48-64, L = 1024, slower at L = 4096 and much
    #: slower at B <= 32 (``bench/RESULTS.md`` items 185, 189).
    attn_items: int = 1
    #: The tensor-core attention's TMA ring copies (the KV cache, read once
    #: a step) carry an L2 evict-first policy
    #: (``attention_mma(kv_evict_first=True)``). It marks nothing where the
    #: attention has no TMA ring (``attention_pipeline`` not "tma"), as
    #: ``weights_evict_first`` marks nothing on the bulk core: a bucket's
    #: changes then compose with any base attention. On in
    #: the large-batch kernel, with its weights' (:data:`LARGE_BATCH`: either
    #: alone was ±1 %, both −1.5..−5.2 %; forty-third session, item 200), and
    #: the B = 2..16 one (:data:`SMALL_BATCH`, −0.4 %, item 202).
    attn_kv_evict_first: bool = False
    #: The decoder's kernels by batch size: ``((largest B, field changes),
    #: ...)`` in increasing order, the last bound None (no limit).
    #: :func:`compile_decoder` compiles this configuration with each entry's
    #: changes into one artifact (``etc.compile_buckets``); every launch runs
    #: the kernel whose range holds ``B``. Empty: one kernel. The default, from
    #: the sweeps on an H200 (``bench/RESULTS.md``, tenth session):
    #: :data:`SINGLE_SEQUENCE` at B=1, B=2..8 and B=9..16 with the tiles above
    #: and :data:`FEW_SEQUENCES` or :data:`SMALL_BATCH` (split in the
    #: forty-fifth session), and :data:`LARGE_BATCH` from B=17 (-8 % at
    #: B=32, -19 % at B=64).
    batch_buckets: tuple[tuple[int | None, tuple[tuple[str, Any], ...]], ...] = (
        (1, SINGLE_SEQUENCE_BY_CONTEXT),
        (8, FEW_SEQUENCES),
        (16, SMALL_BATCH),
        (None, LARGE_BATCH),
    )
    #: The same for the context length ``L``: ``(largest L, changes)``,
    #: bounds increasing, the last None. Set in a batch bucket's changes
    #: (the default's B = 1 kernel: the phased attention up to L =
    #: :data:`SINGLE_SEQUENCE_CONTEXT` = 1087, the tensor-core one past it), it
    #: splits that bucket again (``etc.compile_buckets``' nested buckets).
    #: The kernels share their buffers, so changes to the attention's split
    #: counts are refused. Empty: one kernel.
    context_buckets: tuple[tuple[int | None, tuple[tuple[str, Any], ...]], ...] = ()
    #: The layers' RMSNorms folded into the projections that follow them:
    #: the graph's ``wqkv`` and ``wgu`` hold the norm weights multiplied
    #: into their columns (:func:`graph_weights`, applied by
    #: :func:`numpy_inputs` and :func:`torch_inputs`), the residual writers
    #: (embed, o_proj, down) add each row's sum of squares to ``sumsq``, and
    #: qkv and gate_up scale their rows by ``rsqrt(mean + eps)`` in the
    #: epilogue (``layer_gemm(row_scale=...)``): no norm stages, a plain k
    #: loop. The final norm stays a stage (the LM head shares the embedding).
    #: On: −54 µs at B=1 on an H200 (``bench/RESULTS.md``, session 8).
    fold_norms: bool = True
    #: The layer projections' weights (``wqkv``, ``wo``, ``wgu``, ``wd``) in
    #: :func:`etc.tiles.gemm.chunk_weights`' layout with chunks of this many
    #: k (0: nn.Linear rows): each k step of a warp's 8-row fragment reads
    #: one contiguous piece. :func:`graph_weights` converts them (their
    #: tensors get a ``_c<chunk>`` suffix, so unconverted weights are refused
    #: at launch). Needs the sync core for those projections in every kernel,
    #: or the tma core with chunks of 64 (one TMA box's k: a 4-D map), and
    #: the same value in every batch bucket (the kernels share their
    #: weights). Off: on an H200 every chunk width made the step slower
    #: (``bench/RESULTS.md``, MoE section, twenty-fifth session).
    weight_chunk: int = 0
    #: The GEMM tiles issue their weight ring's first groups before they
    #: wait for their activations (``layer_gemm(prefetch_ring=True)``; the
    #: bulk core's tiles always do); an int: that many groups, not all
    #: ``stages - 1``. On: −81 µs at B=1, −75 at B=16, −114 at B=64.
    prefetch_ring: bool | int = True
    #: The projections' weight copies carry an L2 evict-first policy
    #: (``layer_gemm(l2_evict_first=True)``; the sync core's ``cp.async``
    #: copies, the tma core's weight boxes; not the bulk core): weights read
    #: once a step no longer push out of the L2 what is read again, or the
    #: lines the kernel wrote (written back otherwise: item 205). On in
    #: the B = 2..16 kernel and B = 1's past L = 1087 (:data:`SMALL_BATCH`,
    #: :data:`SINGLE_SEQUENCE_LONG`; forty-second session, items 197-198).
    #: On the tma core (the large-batch kernel, :data:`LARGE_BATCH`) it pays
    #: only with ``attn_kv_evict_first`` (item 200).
    weights_evict_first: bool = False
    #: Tasks in shared-memory regions other than 0 (``Graph.task(
    #: shared_region=...)``), e.g. ``(("o_proj", 1), ("down", 1))``: their
    #: tiles' shared memory is apart from the other tasks', and the static
    #: kernel runs a CTA's next instance's prefetch (its weight ring's first
    #: groups) before the current instance's waits when the regions differ.
    shared_regions: tuple[tuple[str, int], ...] = ()
    #: Weights asked into L2 while each layer's attention runs, when the HBM
    #: is nearly idle (:func:`etc.tiles.prefetch.l2_prefetch`, a task after
    #: the QKV projection): ``((weight, eighths, layer_offset), ...)`` with
    #: weight one of ``wqkv``, ``wo``, ``wgu``, ``wd``; ``eighths`` of every 8
    #: rows (8: all), of layer ``l + layer_offset``. Empty: no such task.
    l2_prefetch: tuple[tuple[str, int, int], ...] = ()
    #: Parts of ``k`` per projection on the tma core: ``(("down_proj", 8),
    #: ...)`` (:mod:`etc.tiles.gemm_layer_tma`). A field of the artifact:
    #: every kernel shares the split-K workspace it sizes (``split_parts``,
    #: ``split_count``); a kernel whose projection is on another core ignores
    #: its entry.
    k_splits: tuple[tuple[str, int], ...] = (
        ("qkv_proj", 4),
        ("o_proj", 4),
        ("gate_up_proj", 2),
        ("down_proj", 8),
    )
    #: k-tiles of 64 in flight in a tma-core tile.
    tma_stages: int = 4
    #: Before their waits the tma-core tiles load their first stages' weight
    #: boxes into the ring ("shared": barriers initialised in the prefetch
    #: function, activations after the wait; −1..−2 % at B = 17..64 on an
    #: H200 under the static schedule, seventeenth session) or ask the L2
    #: for them (True; an int: that many k-tiles), or "shared_l2": the ring's
    #: stages and the part's later weight boxes asked into L2
    #: (``layer_gemm(core="tma", prefetch_ring=...)``). :func:`compile_decoder`
    #: gives the dynamic schedule True (the ring prefetch was 2-4 % slower there).
    tma_prefetch: bool | int | str = "shared"
    #: The tma-core tiles start their k loops at k-tile ``j`` (their column
    #: block) and wrap around (``layer_gemm(core="tma", rotate_k=True)``), so
    #: a stage's tiles do not all read the same activation boxes at once.
    tma_rotate_k: bool = False
    #: The tma-core tiles issue their epilogue's loads that do not depend on
    #: the product (a folded norm's row sums, the residual) before the k
    #: loop, off the split-K meeting's path (``layer_gemm(epilogue_ahead=True)``;
    #: −0.2..−1.2 % at B = 32 and 64, L = 1024 on an H200, twenty-ninth session).
    tma_epilogue_ahead: bool = True
    #: How a split projection's parts meet in the workspace
    #: (``layer_gemm(meeting=...)``): ``"rows"`` (each product at its row and
    #: column, 8-byte accesses) or ``"fragments"`` (in the accumulators'
    #: fragment order, 16-byte accesses, the last part's own products from
    #: its registers; the workspace then holds ``parts * 64 * ceil(B / 64)``
    #: rows). The same bits either way; ``"fragments"`` −1.8..−2.2 % at B = 64
    #: and −0.5..−1.6 % at B = 32 on an H200 (thirty-fourth session,
    #: ``bench/RESULTS.md`` items 147-148). ``"cluster"``: a projection split
    #: in an even number of parts meets in pairs on thread-block clusters of
    #: 2 first (the odd part's products read over distributed shared memory,
    #: no L2 round trip), then the pairs as ``"fragments"`` do; an odd split
    #: meets as ``"fragments"``. Static kernels only (:func:`compile_decoder`
    #: gives the dynamic ones ``"fragments"``); the pair sums add in another
    #: order, so the step is close to, not bit-equal with, ``"fragments"``'.
    tma_meeting: str = "fragments"
    #: Per split projection, how many of its last parts to arrive share the
    #: meeting's sums, at most its parts (:meth:`meet_share`;
    #: ``layer_gemm(meet_share=...)``: each loads and stores a
    #: share of the block; the earlier sharers spin until the last arrives,
    #: so only the static schedule runs it, and :func:`compile_decoder` drops
    #: it for the dynamic one): ``(("down_proj", 4), ...)``; needs
    #: ``tma_meeting="fragments"``. Empty: the last part alone. The sums are
    #: the same (part order) but a sharer adds its fragments' squares to the
    #: next norm's fixed-point row sums itself, which can round them apart
    #: from the last part's whole-row add: deterministic, not bit-equal to
    #: the unshared kernel. ``LARGE_BATCH`` shares down_proj's by 2.
    tma_meet_share: tuple[tuple[str, int], ...] = ()
    #: Splits each lane of the attention's merge (fused or the grouped
    #: combine) loads before folding any (``merge_unroll``): one L2 round
    #: trip for up to ``lanes * attn_merge_unroll`` splits instead of one
    #: per ``lanes`` (B = 1 merges 17 splits on 8 lanes an item). 2 was
    #: +0.4..+1.4 % at B = 1, L = 1024 and even elsewhere, 4 slower
    #: everywhere (forty-seventh session, item 234).
    attn_merge_unroll: int = 1
    #: Rows per activation box of a tma-core tile (16, 32 or 64): the boxes
    #: past the batch are skipped, not filled with zeros.
    tma_a_box: int = 64
    #: Query heads per combine instance (``attention_combine(group=...)``:
    #: grid ``(layers, B, heads / combine_group)``, the splits shared among
    #: each item's threads); 0: one instance merges a whole row (one CTA's
    #: chain of L2 round trips: 4.4 µs a layer at B=1 on an H200 against 2.1
    #: with 4 heads; the step B=1 945 vs 954 µs, B=8 1207 vs 1259).
    combine_group: int = 8
    #: The greedy argmax in this many instances per sequence, each over a
    #: part of the vocabulary, and a one-warp merge (``argmax(parts=...)``,
    #: ``argmax_merge``; at most 32); 0: one CTA per sequence (~12 µs over
    #: 128K logits on an H200, on the critical path of every step).
    argmax_parts: int = 16
    #: This kernel takes the whole-row argmax even with ``argmax_parts`` (the
    #: artifact still has the part buffers, which every kernel must share).
    #: The large-batch kernel's: there the part tiles made ptxas spill more
    #: in the tensor-core attention, +90 µs at B=64 on an H200.
    argmax_whole: bool = False
    #: The greedy argmax folded into the LM head's epilogue: each warp's
    #: largest logit, as an i64 key (its bits made to order, then the
    #: column's complement), goes into ``argmax_key[b]`` by one atomic
    #: maximum, and one thread a sequence reads the token and resets the key
    #: after the last LM head instance (``layer_gemm(argmax_key=True)``,
    #: ``argmax_take``): no pass over the logits after the LM head. The keys
    #: must be 0 before the first launch (``numpy_inputs`` and
    #: ``torch_inputs`` zero them) and a completed launch leaves them 0;
    #: after a launch that failed the runtime zeroes them
    #: (:data:`KEPT_ZERO`). (Zeroed by embed every launch, they cost the
    #: B = 1 long-context kernel 32 bytes more spills.) Needs the LM head on
    #: the gemv core (the B = 1..16 kernels'). On in the default's B = 1 kernels (:data:`SINGLE_SEQUENCE_SHORT`,
    #: :data:`SINGLE_SEQUENCE_LONG`); even or lost at B = 2..16 (items 272,
    #: 278).
    argmax_fused: bool = False
    #: Whether the graph declares ``argmax_key``. None: whether any kernel
    #: of the artifact folds its argmax (:attr:`key_buffer`): every kernel of
    #: an artifact takes the same buffers.
    argmax_keys: bool | None = None
    #: The tasks (:data:`DECODER_TASKS`) whose tiles this kernel calls
    #: instead of inlining (``etc.compile(outline=...)``); True: every task.
    #: A called tile gets its own register allocation, so the other tiles'
    #: pressure does not spill it and its own does not spill them; each call
    #: passes ~60 parameters. The large-batch kernel's: all (−0.5..−1.5 % at B
    #: = 32 and 64 on an H200, and its attention's ``read_early`` then gains
    #: at every context); the B = 1 kernel's LM head and argmax (−1.3 %; all
    #: its tiles +1.4 %, the attention alone +1.8 %; thirtieth session); the
    #: B = 2..16 kernel's tensor-core attention.
    outline: bool | tuple[str, ...] = ("attention",)
    #: Static schedule: the kernel's CTAs take their lists by the SM they run
    #: on, so each stage's last partial round fills whole SMs
    #: (``etc.compile(sm_slices=True)``, ``docs/scheduling.md``, "Dealt by
    #: SM"). Off: on an H200 the large-batch kernel with it ran as fast as
    #: without (the deal's 4-6 % over round-robin in the same kernel went to
    #: the code that finds the SM), and the inlined small-batch kernels 17 %
    #: slower (``bench/RESULTS.md`` item 135).
    sm_slices: bool = False
    #: Static schedule: each CTA loads its next queue entry as the current
    #: instance starts (``etc.compile(queue_ahead=True)``) and skips a wait
    #: on the coordinate its last completed wait saw (``wait_memo``). Off
    #: but in :data:`SMALL_BATCH`'s kernel: on an H200 the B = 1 kernel (tiles
    #: inlined) was 3.5-8 % slower with either, ``queue_ahead`` 1-2 % slower
    #: elsewhere, ``wait_memo`` even at B = 32 and 64 and −0.7..−1.8 % at B =
    #: 8-16 (``bench/RESULTS.md`` items 182-183).
    queue_ahead: bool = False
    wait_memo: bool = False
    #: Static schedule: how the runtime deals the kernel's queues by SM once
    #: it has read where the CTAs ran (``etc.compile(sm_deal=...)``; None:
    #: round-robin). :data:`LARGE_BATCH` takes ``"spread"`` (−3.9 % at B =
    #: 64, L = 1024, −2.3 % at L = 4096, −1 % at B = 32 on an H200), and
    #: :data:`SMALL_BATCH` since the forty-fifth session (item 215); the
    #: B = 1 kernel was 1 % slower with it (``bench/RESULTS.md`` item 135).
    sm_deal: str | None = None
    #: The tasks (:data:`DECODER_TASKS`) the static schedule deals at run time
    #: (``Graph.task(deal="pool")``): each layer's instances go to whichever
    #: CTA is free, not to fixed lists.
    pool: tuple[str, ...] = ()
    #: Static schedule, round-robin lists: ``((task, n), ...)``, each layer's
    #: instances of ``task`` take at least ``n`` positions of the deal
    #: (``Graph.task(deal_slots=n)``), so the stages after it land on the
    #: same CTAs whatever its instance count (a B = 1 attention of fewer
    #: splits than the layout the deal was tuned for).
    deal_slots: tuple[tuple[str, int], ...] = ()
    #: The largest batch this configuration's kernel runs (set by
    #: :meth:`bucket_configs` from ``batch_buckets``; None: any). A kernel
    #: that never runs more than ``attn_small_batch`` sequences never sees a
    #: span of ``attn_chunk``, so its phased attention tile need not hold one
    #: (:attr:`attn_large_span`).
    max_batch: int | None = None
    #: The largest L this configuration's kernel runs (set from
    #: ``context_buckets``; None: any): its graph's ``L`` symbol's ``max``, so
    #: a kernel launched past it on its own is refused, naming ``L``.
    max_context: int | None = None
    #: At most how long a split the phased attention tile of a one-sequence
    #: kernel bounded in ``L`` (``max_batch`` 1, ``max_context``) holds
    #: (:attr:`phased_tile_span`; 0: ``min(attn_chunk, attn_phased_chunk)``).
    #: Its buffers, and ``attn_stage_kv``'s copies of a whole split, shrink to
    #: it: B = 1 up to L = 1087 runs 17 splits of 64 positions. Checked
    #: against every L up to ``max_context``.
    attn_phased_span: int = 0
    #: A one-sequence kernel bounded in L (as :attr:`attn_phased_span`):
    #: each kv head's splits meet on a thread-block cluster of this many CTAs,
    #: handing their partials to rank 0 through distributed shared memory
    #: instead of a count and the L2 (``attention(cluster=...)``; 0: off).
    #: Needs the phased tile with ``fuse_combine`` and exactly this many
    #: splits at every L up to ``max_context`` (an ``attn_single_tiers`` tier
    #: of span 0), and the static schedule, whose lists put a group on one
    #: cluster; the whole kernel then launches in clusters, which holds fewer
    #: CTAs: with B = 1's block 240 in clusters of 8 and 248 in clusters of 4
    #: against 264 on an H100. There B = 1 at L = 1024 was 8.6 % slower on
    #: clusters of 8 (sixty-fifth session, ``bench/RESULTS.md`` item 294):
    #: off in every kernel.
    attn_cluster: int = 0
    #: The prefetch task's instances per layer (each of ``block_size`` threads).
    l2_prefetch_ctas: int = 64
    #: The prefetched lines get L2's evict-last priority.
    l2_prefetch_evict_last: bool = False
    #: How the prefetch task asks (``l2_prefetch(mode=...)``): "bulk" (one
    #: ``cp.async.bulk.prefetch.L2`` per run of rows) or "lines" (one
    #: ``prefetch.global.L2`` per 128-byte line).
    l2_prefetch_mode: str = "bulk"

    def __post_init__(self) -> None:
        check_config(self, self._check)

    def _check(self) -> None:
        """The checks of the fields' values (:func:`check_config` adds their types)."""
        for key in ("hidden", "layers", "heads", "kv_heads", "head_dim", "inter", "vocab"):
            _int_field(key, getattr(self, key), 1)
        if self.prefetch_next and not self.prefetch_weights:
            raise GraphError(
                "LlamaConfig: prefetch_next needs prefetch_weights (the tiles' prefetch)"
            )
        projections = _PROJECTIONS
        for proj in self.row_path_projections:
            if proj not in projections:
                raise GraphError(
                    f"LlamaConfig: row_path_projections names {proj!r}, not one of "
                    f"{', '.join(projections)}"
                )
        cores = [("gemm_core", self.gemm_core)]
        from ..tiles.gemv_layer import BLOCK_ROWS

        if self.gemv_block not in BLOCK_ROWS:
            raise GraphError(
                f"LlamaConfig: gemv_block must be one of {', '.join(map(str, BLOCK_ROWS))}, "
                f"got {self.gemv_block!r}"
            )
        for key in ("core_overrides", "projection_options"):
            _check_pairs(key, getattr(self, key), projections, "projection")
        for proj, core in self.core_overrides:
            cores.append((f"core_overrides[{proj!r}]", core))
        for proj, options in self.projection_options:
            _check_pairs(f"projection_options[{proj!r}]", options, PROJECTION_OPTIONS, "key")
            if dict(options).get("bulk_ring") and (
                self.core(proj) != "sync" or self.weight_chunk != 32 or proj == "lm_head"
            ):
                raise GraphError(
                    f"LlamaConfig: projection_options[{proj!r}] bulk_ring needs a layer "
                    f"projection on the sync core and weight_chunk=32 (core {self.core(proj)!r}, "
                    f"weight_chunk={self.weight_chunk})"
                )
            from ..tiles.gemm_tc import REFILLS

            refill = dict(options).get("refill", "wait")
            if refill not in REFILLS or (refill != "wait" and self.core(proj) != "tma"):
                raise GraphError(
                    f"LlamaConfig: projection_options[{proj!r}] refill={refill!r}: 'wait' or "
                    f"'test', and 'test' on the tma core only (core {self.core(proj)!r})"
                )
        _check_pairs("shared_regions", self.shared_regions, DECODER_TASKS, "task")
        if not isinstance(self.outline, bool):
            if not isinstance(self.outline, tuple) or any(
                t not in DECODER_TASKS for t in self.outline
            ):
                raise GraphError(
                    f"LlamaConfig: outline must be a bool or a tuple of task names "
                    f"({', '.join(DECODER_TASKS)}), got {self.outline!r}"
                )
        if not isinstance(self.pool, tuple) or any(t not in DECODER_TASKS for t in self.pool):
            raise GraphError(
                f"LlamaConfig: pool must be a tuple of task names ({', '.join(DECODER_TASKS)}), "
                f"got {self.pool!r}"
            )
        if not isinstance(self.deal_slots, tuple) or any(
            not (isinstance(p, tuple) and len(p) == 2 and p[0] in DECODER_TASKS)
            or isinstance(p[1], bool)
            or not isinstance(p[1], int)
            or p[1] < 1
            or p[0] in self.pool
            for p in self.deal_slots
        ):
            raise GraphError(
                "LlamaConfig: deal_slots must be ((task, n), ...) pairs of a task name "
                f"({', '.join(DECODER_TASKS)}) not in pool and an int n >= 1, got "
                f"{self.deal_slots!r}"
            )
        if self.shared_regions and self.prefetch_next:
            raise GraphError(
                "LlamaConfig: shared_regions and prefetch_next exclude each other (both run "
                "the next instance's prefetch early; with regions only across regions)"
            )
        for task_name, region in self.shared_regions:
            _int_field(f"shared_regions[{task_name!r}]", region, 0)
        for key, core in cores:
            if core not in _CORES:
                raise GraphError(
                    f"LlamaConfig: {key} must be one of {', '.join(_CORES)}, got {core!r}"
                )
        if "bulk" in dict(cores).values() and (self.prefetch_weights or self.row_warps):
            raise GraphError("LlamaConfig: the bulk core takes no prefetch_weights or row_warps")
        normed = ("qkv_proj", "gate_up_proj", "lm_head")
        if self.fuse_norms and any(self.core(p) != "sync" for p in normed):
            raise GraphError(
                "LlamaConfig: fuse_norms needs the sync core for qkv_proj, gate_up_proj and lm_head"
            )
        if self.norm_sums and not self.fuse_norms:
            raise GraphError("LlamaConfig: norm_sums feeds the fused norms: set fuse_norms")
        if self.norm_sums and {self.core("o_proj"), self.core("down_proj")} != {"sync"}:
            raise GraphError("LlamaConfig: norm_sums needs the sync core for o_proj and down_proj")
        if self.fold_norms and self.fuse_norms:
            raise GraphError("LlamaConfig: give fold_norms or fuse_norms, not both")
        if self.fold_norms and any(
            self.core(p) == "bulk" for p in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
        ):
            raise GraphError(
                "LlamaConfig: fold_norms needs the sync or tma core for the layer projections"
            )
        if self.prefetch_ring and self.prefetch_weights:
            raise GraphError(
                "LlamaConfig: give prefetch_ring (the weight ring's first groups) or "
                "prefetch_weights (an L2 prefetch), not both"
            )
        if self.attn_prefetch_kv not in (False, True, "l2"):
            raise GraphError(
                "LlamaConfig: attn_prefetch_kv must be a bool or 'l2', got "
                f"{self.attn_prefetch_kv!r}"
            )
        if self.attn_prefetch_kv is True and self.prefetch_next:
            raise GraphError(
                "LlamaConfig: attn_prefetch_kv fills shared memory before the waits; "
                "prefetch_next would run it for the next instance"
            )
        _one_of("attn_tile", self.attn_tile, ATTENTION_TILES)
        phased_only = [
            key
            for key in ("attn_stage_kv", "attn_prefetch_kv", "attn_stage_v")
            if getattr(self, key)
        ]
        from ..tiles.attention_mma import PIPELINES, RELEASES

        _one_of("attn_pipeline", self.attn_pipeline, (*PIPELINES, "auto"))
        _one_of("attn_tma_release", self.attn_tma_release, RELEASES)
        if self.attn_pipeline != "none" and self.attn_tile != "mma":
            raise GraphError(
                f"LlamaConfig: attn_pipeline applies to attn_tile='mma', not {self.attn_tile!r}"
            )
        if self.attn_one_pass is True and self.attn_tile != "phased":
            raise GraphError(
                f"LlamaConfig: attn_one_pass applies to attn_tile='phased', not {self.attn_tile!r}"
            )
        if self.attn_stamps is True and self.attn_tile not in ("mma", "phased"):
            raise GraphError(
                "LlamaConfig: attn_stamps applies to attn_tile='mma' or 'phased', not "
                f"{self.attn_tile!r}"
            )
        if self.fuse_combine and self.attn_tile == "online":
            raise GraphError(
                "LlamaConfig: fuse_combine applies to attn_tile='phased' or 'mma', not 'online'"
            )
        if self.fuse_combine and self.attn_items > 1:
            raise GraphError(
                f"LlamaConfig: fuse_combine counts one kv head an attention instance: "
                f"attn_items={self.attn_items} must be 1"
            )
        if self.attn_tile != "phased" and phased_only:
            raise GraphError(
                f"LlamaConfig: {', '.join(phased_only)} apply to attn_tile='phased', "
                f"not {self.attn_tile!r}"
            )
        _int_field("attn_items", self.attn_items, 1)
        if self.attn_items > 1:
            if self.kv_heads % self.attn_items:
                raise GraphError(
                    f"LlamaConfig: attn_items={self.attn_items} does not divide "
                    f"kv_heads={self.kv_heads}"
                )
            tma = self.attention_pipeline == "tma" and self.attn_tma_prefetch
            if self.attn_tile != "mma" or not tma:
                raise GraphError(
                    f"LlamaConfig: attn_items={self.attn_items} needs attn_tile='mma' with the "
                    f"TMA pipeline and attn_tma_prefetch (attn_tile={self.attn_tile!r}, "
                    f"attn_pipeline={self.attn_pipeline!r})"
                )
        _int_field("attn_small_batch", self.attn_small_batch, 0)
        _int_field("attn_tma_stages", self.attn_tma_stages, 2)
        for name in (
            "attn_tma_prefetch", "tma_rotate_k", "tma_epilogue_ahead", "attn_direct", "attn_stamps",
            "queue_ahead", "wait_memo", "weights_evict_first", "attn_kv_evict_first",
            "gemv_whole_lines", "attn_one_pass", "gemm_stamps", "ragged",
        ):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise GraphError(f"LlamaConfig: {name} must be a bool, got {getattr(self, name)!r}")
        if self.page_size:
            _int_field("page_size", self.page_size, 1)
            if self.page_size & (self.page_size - 1):
                raise GraphError(
                    f"LlamaConfig: page_size={self.page_size} must be a power of two (or 0)"
                )
        from ..tiles.gemm_layer_tma import MEETINGS

        if self.tma_meeting not in MEETINGS:
            raise GraphError(
                f"LlamaConfig: tma_meeting must be one of {MEETINGS}, got {self.tma_meeting!r}"
            )
        if self.tma_meeting == "cluster" and self.sm_slices:
            raise GraphError(
                "LlamaConfig: tma_meeting='cluster' puts a block's parts on one cluster's "
                "CTAs, which lists taken by SM (sm_slices) cannot: drop one"
            )
        for name in ("attn_counters", "attn_cached_splits", "argmax_keys"):  # None: the default
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise GraphError(f"LlamaConfig: {name} must be None or a bool, got {value!r}")
        if self.argmax_fused and self.argmax_keys is False:
            raise GraphError(
                "LlamaConfig: argmax_fused leaves its keys in argmax_key: argmax_keys=False "
                "leaves it out of the graph"
            )
        if self.argmax_fused and self.core("lm_head") != "gemv":
            raise GraphError(
                "LlamaConfig: argmax_fused folds the argmax into the LM head's gemv tiles: "
                f"the LM head runs on core {self.core('lm_head')!r} (give gemm_core='gemv')"
            )
        if self.fuse_combine and self.attn_counters is False:
            raise GraphError(
                "LlamaConfig: fuse_combine counts the splits in attn_count: attn_counters=False "
                "leaves it out of the graph"
            )
        if self.attn_cached_splits and not self._takes_cached_splits:
            raise GraphError(
                f"LlamaConfig: attn_cached_splits makes splits longer than attn_chunk, which "
                f"only attn_tile='mma' takes (attn_tile={self.attn_tile!r} holds one span)"
            )
        _int_field("attn_phased_chunk", self.attn_phased_chunk, 1)
        _int_field("attn_merge_unroll", self.attn_merge_unroll, 1)
        # The longest span the attention tile holds.
        hold, holder = self.attn_chunk, f"attn_chunk={self.attn_chunk}"
        if self.attn_tile == "phased" and self.attn_phased_chunk < hold:
            hold, holder = self.attn_phased_chunk, f"attn_phased_chunk={self.attn_phased_chunk}"
        if not isinstance(self.attn_single_span, int) or not (0 <= self.attn_single_span <= hold):
            raise GraphError(
                f"LlamaConfig: attn_single_span={self.attn_single_span!r} must be in "
                f"0..{hold} (the attention's buffers hold {holder})"
            )
        _int_field("attn_single_splits", self.attn_single_splits, 1)
        self._check_single_tiers(hold, holder)
        if self.attn_small_batch and not 0 < self.attn_small_span <= hold:
            raise GraphError(
                f"LlamaConfig: attn_small_span={self.attn_small_span} must be in "
                f"1..{hold} (the attention's buffers hold {holder})"
            )
        self._check_small_spans(hold, holder)
        self._check_phased_span()
        self._check_attn_cluster()
        if self.heads % self.kv_heads:
            raise GraphError(
                f"LlamaConfig: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}"
            )
        self._check_l2_prefetch()
        self._check_weight_chunk()
        _int_field("argmax_parts", self.argmax_parts, 0, 32)
        if self.max_batch is not None and (
            not isinstance(self.max_batch, int) or self.max_batch < 1
        ):
            raise GraphError(
                f"LlamaConfig: max_batch must be None or an int >= 1, got {self.max_batch!r}"
            )
        if (
            not isinstance(self.combine_group, int)
            or self.combine_group < 0
            or (self.combine_group and self.heads % self.combine_group)
        ):
            raise GraphError(
                f"LlamaConfig: combine_group={self.combine_group!r} must be 0 or a divisor of "
                f"heads={self.heads}"
            )
        self._check_buckets("batch_buckets")
        self._check_buckets("context_buckets")
        self._check_k_splits()
        for key, total in (
            ("bn_qkv", self.qkv_width),
            ("bn_o", self.hidden),
            ("bn_gu", self.inter),
            ("bn_down", self.hidden),
            ("bn_lm", self.vocab),
        ):
            _int_field(key, getattr(self, key), 1)
            if total % getattr(self, key):
                raise GraphError(f"LlamaConfig: {key}={getattr(self, key)} does not divide {total}")

    @property
    def attention_pipeline(self) -> str:
        """``attn_pipeline`` with "auto" resolved: "tma" for 64-dim heads (a
        128-byte cache row, what the TMA maps copy), else "none"."""
        if self.attn_pipeline != "auto":
            return self.attn_pipeline
        return "tma" if self.head_dim == 64 else "none"

    def core(self, projection: str) -> str:
        """The GEMM core of ``projection`` (``core_overrides``, else ``gemm_core``)."""
        return dict(self.core_overrides).get(projection, self.gemm_core)

    def k_split(self, projection: str) -> int:
        """The parts of ``k`` of ``projection``'s tiles: its ``k_splits`` on the
        tma core, else 1 (``embed``: down_proj's, which shares its event)."""
        projection = "down_proj" if projection == "embed" else projection
        return dict(self.k_splits).get(projection, 1) if self.core(projection) == "tma" else 1

    def meeting(self, projection: str) -> str:
        """How ``projection``'s split-K parts meet: :attr:`tma_meeting`, but
        ``"fragments"`` for ``"cluster"`` where the parts are odd."""
        if self.tma_meeting == "cluster" and self.k_split(projection) % 2:
            return "fragments"
        return self.tma_meeting

    def meet_share(self, projection: str) -> int:
        """How many of ``projection``'s last parts share its split-K sums:
        its ``tma_meet_share``, at most its parts (1: not split)."""
        return min(dict(self.tma_meet_share).get(projection, 1), self.k_split(projection))

    @property
    def uses_tma(self) -> bool:
        """Whether a kernel of the artifact (any bucket) has tma-core tiles,
        which need ``target="sm_90a"``."""
        return any(c.core(p) == "tma" for *_, c in self.kernel_configs() for p in _PROJECTIONS)

    def _check_single_tiers(self, hold: int, holder: str) -> None:
        tiers = self.attn_single_tiers
        if tiers == ():
            return
        well_formed = isinstance(tiers, tuple) and all(
            isinstance(t, tuple)
            and len(t) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) for v in t)
            for t in tiers
        )
        bounds = [t[0] for t in tiers] if well_formed else []
        if not (
            well_formed
            and bounds == sorted(set(bounds))
            and bounds[0] >= 0
            and all(0 <= span <= hold and most >= 1 for _, span, most in tiers)
        ):
            raise GraphError(
                f"LlamaConfig: attn_single_tiers={tiers!r} must be (context, span, most) "
                f"triples with increasing contexts >= 0, spans in 0..{hold} (the attention's "
                f"buffers hold {holder}; 0: exactly most splits) and most at least 1; () for "
                "attn_single_span's and attn_single_splits' count at every L"
            )
        if not self.attn_single_span:
            raise GraphError(
                f"LlamaConfig: attn_single_tiers={tiers!r} tiers B = 1's split count, which "
                "attn_single_span=0 turns off (B = 1 takes B = 2's splits)"
            )

    def _check_small_spans(self, hold: int, holder: str) -> None:
        tiers = self.attn_small_spans
        if not self.attn_small_batch or tiers == ():
            return
        well_formed = isinstance(tiers, tuple) and all(
            isinstance(t, tuple)
            and len(t) in (2, 3)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in t)
            for t in tiers
        )
        # The B = 1 kernel of a single-sequence tier never runs the tiers:
        # their spans need not fit its tile, capped or not.
        first = 2 if self.attn_single_span else 1
        runs_tiers = self.max_batch is None or self.max_batch >= first
        bounds = [t[0] for t in tiers] if well_formed else []
        if not (
            well_formed
            and bounds == sorted(set(bounds))
            and bounds[0] >= 1
            and all(0 < t[1] and (t[1] < hold or not runs_tiers) and t[2:] != (0,) for t in tiers)
        ):
            raise GraphError(
                f"LlamaConfig: attn_small_spans={tiers!r} must be (batch, span) pairs or "
                f"(batch, span, most) triples with increasing batches, spans in 1..{hold - 1} "
                f"(the attention's buffers hold {holder}, and position L one more) and most "
                "at least 1; () for spans of attn_small_span"
            )
        # A cap makes the spans grow with L: only a tile that holds no span
        # may run the tiers.
        capped = [t for t in tiers if len(t) == 3]
        if capped and runs_tiers and self.attn_tile != "mma":
            raise GraphError(
                f"LlamaConfig: attn_small_spans={tiers!r} caps the split count "
                f"({capped[0]!r}: at most {capped[0][2]} splits), so spans grow with L, which "
                f"only attn_tile='mma' holds, not {self.attn_tile!r}; give (batch, span) pairs"
            )

    def _check_k_splits(self) -> None:
        widths = dict(_SPLIT_INPUTS)
        for proj, parts in self.k_splits:
            if proj not in widths:
                raise GraphError(
                    f"LlamaConfig: k_splits names {proj!r}, not one of {', '.join(widths)}"
                )
            _int_field(f"k_splits[{proj!r}]", parts, 1, 64)
            k = getattr(self, widths[proj])
            if k % (64 * parts):
                raise GraphError(
                    f"LlamaConfig: k_splits[{proj!r}]={parts}: k={k} is not {parts} parts of a "
                    "multiple of 64"
                )
        _int_field("tma_stages", self.tma_stages, 2)
        for item in self.tma_meet_share:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise GraphError(
                    f"LlamaConfig: tma_meet_share takes (projection, share) pairs, got {item!r}"
                )
            proj, share = item
            if proj not in _PROJECTIONS[:4]:
                raise GraphError(
                    f"LlamaConfig: tma_meet_share names {proj!r}, not one of "
                    f"{', '.join(_PROJECTIONS[:4])}"
                )
            if share not in (1, 2, 4, 8) or isinstance(share, bool):
                raise GraphError(
                    f"LlamaConfig: tma_meet_share[{proj!r}]={share!r} must be 1, 2, 4 or 8"
                )
            share = self.meet_share(proj)
            if share > 1 and self.tma_meeting != "fragments":
                raise GraphError(
                    f"LlamaConfig: tma_meet_share[{proj!r}]={share} needs tma_meeting='fragments'"
                )
            task = _PROJECTION_TASKS[proj]
            if share > 1 and task in self.pool:
                raise GraphError(
                    f"LlamaConfig: tma_meet_share[{proj!r}]={share} makes task '{task}''s parts "
                    "wait for each other, which a pooled task (pool) cannot: drop one"
                )
        if self.tma_a_box not in (16, 32, 64):
            raise GraphError(f"LlamaConfig: tma_a_box must be 16, 32 or 64, got {self.tma_a_box!r}")
        parts = self.k_split("down_proj")
        if self.bn_down % parts or (self.bn_down // parts) % 8:
            raise GraphError(
                f"LlamaConfig: the embedding's tiles match down_proj's instances, "
                f"bn_down={self.bn_down} / {parts} parts each: not a multiple of 8 columns"
            )

    @property
    def split_workspace(self) -> tuple[int, int, int] | None:
        """``(parts, columns, counter columns)`` of the split-K workspace that
        every kernel of the artifact shares (``k_splits``), or None."""
        split = [(p, s) for p, s in self.k_splits if s > 1]
        if not split:
            return None
        widths = {"qkv_proj": self.qkv_width, "o_proj": self.hidden, "down_proj": self.hidden}
        widths["gate_up_proj"] = 2 * self.inter
        cols = max(widths[p] for p, _ in split)
        return max(s for _, s in split), cols, cols // 8

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def attn_width(self) -> int:
        return self.heads * self.head_dim

    @classmethod
    def from_changes(
        cls, changes: Mapping[str, Any], base: LlamaConfig | None = None
    ) -> LlamaConfig:
        """``base`` (Llama-3.2-1B) with ``changes`` applied, as a JSON round
        trip leaves them (lists where the fields hold tuples)."""

        def tuples(v: Any) -> Any:
            return tuple(tuples(x) for x in v) if isinstance(v, list) else v

        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise GraphError(f"LlamaConfig has no field {', '.join(map(repr, unknown))}")
        return dataclasses.replace(base or cls(), **{k: tuples(v) for k, v in changes.items()})

    def bucket_configs(self) -> list[tuple[int | None, LlamaConfig]]:
        """``(largest B, configuration)`` of each kernel :func:`compile_decoder`
        compiles (``batch_buckets``; one kernel of this configuration when
        empty). The configurations have no buckets of their own."""
        if not self.batch_buckets:
            return [(None, self)]
        configs = [
            (bound, dataclasses.replace(self, **dict(changes), batch_buckets=(), max_batch=bound))
            for bound, changes in self.batch_buckets
        ]
        # One set of buffers serves every kernel: all take the split counts
        # of the last one (the largest batches), which the others never run,
        # and the split counters if any kernel fuses its combine.
        span = configs[-1][1].attn_large_span
        cached = self.attn_cached_splits
        if cached is None:
            cached = all(k._takes_cached_splits for _, c in configs for _, k in c.context_configs())
        shared = dict(
            attn_chunk=span, attn_cached_splits=cached, attn_counters=self.split_counters,
            argmax_keys=self.key_buffer,
        )  # fmt: skip
        return [(bound, dataclasses.replace(c, **shared)) for bound, c in configs]

    def kernel_configs(self) -> list[tuple[int | None, int | None, LlamaConfig]]:
        """``(largest B, largest L, configuration)`` of every kernel
        :func:`compile_decoder` compiles, in launch order (None: no bound)."""
        batches = self.bucket_configs() if self.batch_buckets else [(None, self)]
        return [(b, lb, k) for b, c in batches for lb, k in c.context_configs()]

    def kernel_for(self, B: int, L: int) -> LlamaConfig:
        """The configuration of the kernel that runs batch ``B`` at context ``L``."""
        for b, lb, k in self.kernel_configs():
            if (b is None or B <= b) and (lb is None or L <= lb):
                return k
        raise AssertionError("the last kernel has no bounds")

    def context_configs(self) -> list[tuple[int | None, LlamaConfig]]:
        """``(largest L, configuration)`` of each kernel of this (batch
        bucket's) configuration by context (``context_buckets``; this
        configuration alone when empty)."""
        if not self.context_buckets:
            return [(None, self)]
        return [
            (bound, self._context_kernel(changes, bound)) for bound, changes in self.context_buckets
        ]

    def _context_kernel(
        self, changes: tuple[tuple[str, Any], ...], bound: int | None
    ) -> LlamaConfig:
        # One set of buffers: every kernel keeps this one's split counts
        # (a tile's own default would differ: the tensor-core one holds no span).
        fixed = {
            "attn_chunk": self.attn_large_span,
            "attn_cached_splits": self.cached_splits,
            "attn_counters": self.split_counters,
            "argmax_keys": self.key_buffer,
        }
        bound = dict(max_context=bound) if bound is not None else {}
        return dataclasses.replace(self, **dict(changes), context_buckets=(), **fixed, **bound)

    @property
    def split_counters(self) -> bool:
        """Whether the graph declares ``attn_count``: ``attn_counters``, by
        default whether any kernel of the artifact fuses its combine."""
        return self._declares("attn_counters", "fuse_combine")

    @property
    def key_buffer(self) -> bool:
        """Whether the graph declares ``argmax_key``: ``argmax_keys``, by
        default whether any kernel of the artifact folds its argmax."""
        return self._declares("argmax_keys", "argmax_fused")

    def _declares(self, given: str, field: str) -> bool:
        """The bool field ``given`` where set, else whether any kernel of
        the artifact (every batch and context bucket) sets ``field``."""
        if getattr(self, given) is not None:
            return getattr(self, given)
        buckets = [dict(changes) for _, changes in self.batch_buckets] or [{}]
        for changes in buckets:
            value = changes.get(field, getattr(self, field))
            contexts = changes.get("context_buckets", self.context_buckets) or ((None, ()),)
            if any(dict(c).get(field, value) for _, c in contexts):
                return True
        return False

    @property
    def direct_attention(self) -> bool:
        """Whether a single split writes the attention output (``attn_direct``
        with the tensor-core tile)."""
        return self.attn_direct and self.attn_tile == "mma"

    @property
    def cached_splits(self) -> bool:
        """``attn_cached_splits``; by default whether every kernel of the
        artifact that may run past ``attn_small_batch`` has the tensor-core
        tile."""
        if self.attn_cached_splits is not None:
            return self.attn_cached_splits
        if self.batch_buckets:
            return bool(self.bucket_configs()[-1][1].attn_cached_splits)
        return self.attn_tile == "mma"

    @property
    def _takes_cached_splits(self) -> bool:
        """Whether this kernel's tile takes ``attn_cached_splits``' longer
        splits: the tensor-core tile, or a kernel bounded to the small tier."""
        small_only = (
            self.max_batch is not None
            and self.attn_small_batch > 0
            and self.max_batch <= self.attn_small_batch
        )
        return self.attn_tile == "mma" or small_only

    @property
    def phased_tile_span(self) -> int:
        """The longest split the phased attention tile holds (its ``chunk``):
        ``min(attn_chunk, attn_phased_chunk)``, at most ``attn_phased_span``."""
        hold = min(self.attn_chunk, self.attn_phased_chunk)
        return min(self.attn_phased_span, hold) if self.attn_phased_span else hold

    @property
    def attn_large_span(self) -> int:
        """The attention span past ``attn_small_batch`` sequences. With
        ``batch_buckets``, the artifact's (its last kernel's, which runs the
        largest batches). Else ``attn_chunk``, or ``attn_phased_chunk`` if
        shorter and this kernel may run such batches with the phased tile
        (its buffers hold one span)."""
        if self.batch_buckets:
            return self.bucket_configs()[-1][1].attn_large_span
        phased_large = self.attn_tile == "phased" and (
            self.max_batch is None
            or not self.attn_small_batch
            or self.max_batch > self.attn_small_batch
        )
        return min(self.attn_chunk, self.attn_phased_chunk) if phased_large else self.attn_chunk

    @property
    def kernel_max_batch(self) -> int | None:
        """The largest B this configuration's own graph takes (its symbol's
        ``max``): ``max_batch``; for a configuration with ``batch_buckets``
        whose own phased tile cannot hold the artifact's large-batch span,
        ``attn_small_batch`` (its graph is the small-batch kernel; the
        artifact of :func:`compile_decoder` takes every batch)."""
        if self.max_batch is not None:
            return self.max_batch
        if self.batch_buckets and self.attn_tile == "phased":
            if min(self.attn_chunk, self.attn_phased_chunk) < self.attn_large_span:
                return self.attn_small_batch or None
        return None

    def _check_weight_chunk(self) -> None:
        _int_field("weight_chunk", self.weight_chunk, 0)
        chunk = self.weight_chunk
        if not chunk:
            return
        ks = {"hidden": self.hidden, "attn_width": self.attn_width, "inter": self.inter}
        if chunk % 8 or any(k % chunk for k in ks.values()):
            raise GraphError(
                f"LlamaConfig: weight_chunk={chunk} must be a multiple of 8 dividing the layer "
                f"projections' k ({', '.join(f'{n}={k}' for n, k in ks.items())})"
            )
        other = [
            f"{p} ({self.core(p)})"
            for p in _PROJECTIONS[:4]
            if self.core(p) == "bulk" or (self.core(p) == "tma" and chunk != 64)
        ]
        if other:
            raise GraphError(
                f"LlamaConfig: weight_chunk={chunk} needs the sync core for the layer "
                f"projections, or the tma core with chunks of 64; {', '.join(other)} do not take it"
            )

    def _check_l2_prefetch(self) -> None:
        weights = ("wqkv", "wo", "wgu", "wd")
        for entry in self.l2_prefetch:
            if not (isinstance(entry, tuple) and len(entry) == 3):
                raise GraphError(
                    f"LlamaConfig: l2_prefetch entry {entry!r} is not (weight, eighths, "
                    "layer_offset)"
                )
            weight, eighths, offset = entry
            if weight not in weights:
                raise GraphError(
                    f"LlamaConfig: l2_prefetch names {weight!r}, not one of {', '.join(weights)}"
                )
            if not isinstance(eighths, int) or not 1 <= eighths <= 8:
                raise GraphError(
                    f"LlamaConfig: l2_prefetch[{weight!r}] eighths={eighths!r} is not in 1..8"
                )
            if not isinstance(offset, int) or not 0 <= offset < self.layers:
                raise GraphError(
                    f"LlamaConfig: l2_prefetch[{weight!r}] layer_offset={offset!r} is not in "
                    f"0..{self.layers - 1}"
                )
        from ..tiles.prefetch import MODES

        _one_of("l2_prefetch_mode", self.l2_prefetch_mode, MODES)
        _int_field("l2_prefetch_ctas", self.l2_prefetch_ctas, 1)

    def _check_phased_span(self) -> None:
        """``attn_phased_span``: a one-sequence kernel's phased tile, bounded
        in L, whose splits all fit it (``splits(L, 1)`` of at most this many
        positions hold ``L + 1``, for every L up to ``max_context``)."""
        _int_field("attn_phased_span", self.attn_phased_span, 0)
        if not self.attn_phased_span:
            return
        where = f"LlamaConfig: attn_phased_span={self.attn_phased_span}"
        if self.attn_tile != "phased" or self.max_batch != 1 or self.max_context is None:
            raise GraphError(
                f"{where} sizes the phased attention of a kernel of one sequence and bounded "
                f"L (a batch bucket B <= 1, a context bucket): attn_tile={self.attn_tile!r}, "
                f"max_batch={self.max_batch}, max_context={self.max_context}"
            )
        span = self.phased_tile_span
        step = self.block_size // (self.head_dim // 8) * self.attn_unroll
        if span > step and span % step:
            raise GraphError(
                f"{where} must be a multiple of the tile's loop step ({step} positions)"
            )
        for L in range(self.max_context + 1):
            if self.splits(L, 1) * span < L + 1:
                raise GraphError(
                    f"{where}: at L = {L} the {self.splits(L, 1)} splits of at most {span} "
                    f"positions do not hold the {L + 1} positions (L <= {self.max_context})"
                )

    def _check_attn_cluster(self) -> None:
        """``attn_cluster``: a phased, fused-combine kernel of one sequence and
        bounded L whose split count is the cluster at every L."""
        _int_field("attn_cluster", self.attn_cluster, 0)
        if not self.attn_cluster:
            return
        where = f"LlamaConfig: attn_cluster={self.attn_cluster}"
        if self.attn_cluster not in CLUSTER_SIZES:
            raise GraphError(
                f"{where}: a thread-block cluster of {', '.join(map(str, CLUSTER_SIZES))} CTAs"
            )
        if (
            self.attn_tile != "phased"
            or not self.fuse_combine
            or self.attn_one_pass
            or self.max_batch != 1
            or self.max_context is None
        ):
            raise GraphError(
                f"{where} meets a kv head's splits on a cluster in the phased attention with "
                "fuse_combine, not attn_one_pass, of a kernel of one sequence and bounded L (a "
                f"batch bucket B <= 1, a context bucket): attn_tile={self.attn_tile!r}, "
                f"fuse_combine={self.fuse_combine}, attn_one_pass={self.attn_one_pass}, "
                f"max_batch={self.max_batch}, max_context={self.max_context}"
            )
        for L in range(self.max_context + 1):
            if self.splits(L, 1) != self.attn_cluster:
                raise GraphError(
                    f"{where}: at L = {L} B = 1 takes {self.splits(L, 1)} splits, not "
                    f"{self.attn_cluster} (give attn_single_tiers a tier of span 0 and "
                    f"most {self.attn_cluster} up to L = {self.max_context})"
                )

    def _check_buckets(self, field: str) -> None:
        """``batch_buckets`` or ``context_buckets``: increasing bounds, a last
        None, changes that name fields and make a valid kernel."""
        buckets = getattr(self, field)
        if not buckets:
            return
        if not isinstance(buckets, tuple) or not all(
            isinstance(b, tuple) and len(b) == 2 and isinstance(b[1], tuple) for b in buckets
        ):
            raise GraphError(
                f"LlamaConfig: {field} must be ((bound, changes), ...), got {buckets!r}"
            )
        bounds = [b for b, _ in buckets]
        ok = bounds[-1] is None and all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bounds[:-1]
        )
        if not ok or any(x >= y for x, y in zip(bounds[:-2], bounds[1:-1], strict=True)):
            raise GraphError(
                f"LlamaConfig: {field}' bounds must be increasing ints >= 1 and a last "
                f"None, got {bounds}"
            )
        symbol, kind = ("B", "batch") if field == "batch_buckets" else ("L", "context")
        # Every kernel takes the same buffers: the weights' layout, the split
        # counters and, within a batch bucket, the attention's split counts
        # (its partials' shape).
        shared = {"weight_chunk", "attn_counters", "argmax_keys", "ragged", "page_size"} | (
            _SPLIT_FIELDS if field == "context_buckets" else set()
        )
        fields = {f.name for f in dataclasses.fields(self)} - {field, "max_batch", "max_context"}
        for bound, changes in buckets:
            which = (
                f"{kind} bucket {symbol} <= {bound}"
                if bound is not None
                else f"the last {kind} bucket"
            )
            unknown = [k for k, _ in changes if k not in fields]
            if unknown:
                raise GraphError(
                    f"LlamaConfig: {which} changes {unknown}: not fields of the kernel's tiles"
                )
            fixed = sorted(shared & set(dict(changes)))
            if fixed:
                raise GraphError(
                    f"LlamaConfig: {which} changes {', '.join(fixed)}, but the kernels share "
                    f"their buffers: set {'it' if len(fixed) == 1 else 'them'} on the "
                    "configuration"
                )
            if field == "context_buckets" and "batch_buckets" in dict(changes):
                raise GraphError(f"LlamaConfig: {which} changes batch_buckets: split by B first")
            try:
                if field == "batch_buckets":
                    dataclasses.replace(self, **dict(changes), batch_buckets=(), max_batch=bound)
                else:
                    self._context_kernel(changes, bound)
            except GraphError as e:
                raise GraphError(
                    f"{e} (in the kernel of {which}: {dict(changes)}; change {field}, "
                    f"or {field}=() for one kernel)"
                ) from None

    def weight_name(self, key: str) -> str:
        """The graph's tensor for weight ``key``: ``wqkv_folded`` and
        ``wgu_folded`` under ``fold_norms`` (the norms multiplied in, made by
        :func:`graph_weights`), so a buffer of Hugging Face's weights passed
        under the old name is refused at launch instead of used; with
        ``weight_chunk`` the layer projections' weights end in ``_c<chunk>``."""
        name = f"{key}_folded" if self.fold_norms and key in _FOLDED else key
        return f"{name}_c{self.weight_chunk}" if self.weight_chunk and key in _CHUNKED else name

    @property
    def split_argmax(self) -> int:
        """Argmax instances per sequence in this kernel (0: one, whole row
        or folded into the LM head)."""
        return 0 if self.argmax_whole or self.argmax_fused else self.argmax_parts

    @property
    def combine_instances(self) -> int:
        """Combine instances per sequence (``combine_group``)."""
        return self.heads // self.combine_group if self.combine_group else 1

    @property
    def sums(self) -> bool:
        """Whether the residual writers add up the rows' sums of squares."""
        return self.norm_sums or self.fold_norms

    def has_row_paths(self, projection: str) -> bool:
        """Whether ``projection``'s tiles branch between ``row_paths``."""
        return bool(self.row_paths) and (
            not self.row_path_projections or projection in self.row_path_projections
        )

    def gemm_block(self, projection: str) -> int:
        """Rows per tile of ``projection`` (``embed``: those of down_proj; 64
        on the tma core, ``gemv_block`` on the gemv core)."""
        projection = "down_proj" if projection == "embed" else projection
        if self.core(projection) == "tma":
            return 64
        if self.core(projection) == "gemv":
            return self.gemv_block
        return max(self.row_paths) if self.has_row_paths(projection) else self.block_m

    def row_blocks(self, B: Any, projection: str = "embed") -> Any:
        block = self.gemm_block(projection)
        return (B + block - 1) // block

    def splits(self, L: Any, B: Any) -> Any:
        """Attention instances per (sequence, kv head): ceil((L + 1) / span)
        with span ``attn_small_span`` for ``B <= attn_small_batch`` (or
        ``attn_small_spans``' spans by batch over the cached positions), else
        ``attn_chunk``; for B = 1 at most ``attn_single_splits`` of
        ``attn_single_span`` (and no fewer than spans of ``attn_small_span``
        give). A symbolic
        expression of ``B`` and ``L``; a zero field skips its tier. Past
        ``attn_small_batch``, when the artifact's large-batch tile is the
        tensor-core one (which holds no span; ``attn_cached_splits``),
        ``max(1, ceil(L / span))``: the cached positions' spans, position ``L``
        in the last one (at ``L = 4096`` one split of 4097 positions, not two
        of ~2048)."""
        span = self.attn_large_span
        if self.cached_splits:
            splits = below = _max(1, (L + span - 1) // span)
        else:
            splits = below = (L + span) // span
        if self.attn_small_batch:
            below = small = (L + self.attn_small_span) // self.attn_small_span
            if self.attn_small_spans:
                small, tiered = 0, 0  # tiered: [B <= the previous tier's bound]
                for bound, span, *most in self.attn_small_spans:
                    bound = min(bound, self.attn_small_batch)
                    upto = 1 - (B + _BIG - (bound + 1)) // _BIG  # [B <= bound]
                    count = (L + span - 1) // span
                    if most:  # at most most[0] splits: spans grow past span
                        count = _min(count, most[0])
                    small = small + (upto - tiered) * count
                    tiered = upto
                # ceil(L / span) is 0 only at L = 0, which takes one split;
                # batches past the last tier take attn_small_span's count.
                small = small + tiered * (1 - (L + _BIG - 1) // _BIG) + (1 - tiered) * below
            # 1 for 1 <= B <= attn_small_batch, else 0 (B < 2**31).
            is_small = 1 - (B + _BIG - (self.attn_small_batch + 1)) // _BIG
            splits = splits + is_small * (small - splits)
        if self.attn_single_span:
            # ``below``: the count B = 1 would have without this tier.
            def capped(span: int, most: int) -> Any:
                if not span:  # exactly `most` (attn_cluster's groups)
                    return most
                return _max(below, _min((L + span) // span, most))

            # The context tiers, then the two fields' count past the last.
            single, covered = 0, 0  # covered: [L <= the previous tier's bound]
            for bound, span, most in self.attn_single_tiers:
                upto = _lt(L, bound + 1)
                single = single + (upto - covered) * capped(span, most)
                covered = upto
            single = single + (1 - covered) * capped(self.attn_single_span, self.attn_single_splits)
            is_one = 1 - (B + _BIG - 2) // _BIG
            splits = splits + is_one * (single - splits)
        return splits

    @property
    def attn_spread(self) -> bool:
        """Whether the attention tiles share each split count's positions
        evenly (``attention(spread=True)``): any span but ``attn_chunk``."""
        return bool(self.attn_small_batch or self.attn_single_span)


LLAMA_3_2_1B = LlamaConfig()
#: A configuration small enough for the CPU simulator.
TINY = LlamaConfig(
    hidden=256,
    layers=2,
    heads=8,
    kv_heads=2,
    head_dim=32,
    inter=512,
    vocab=1024,
    rope_theta=10000.0,
    rope_scaling=None,
    attn_chunk=8,
    attn_small_batch=0,  # spans of attn_chunk: one loop step of the tiny tile
    attn_single_span=0,
    # The phased attention, inlined (the tensor-core tile: attn_tile="mma").
    attn_tile="phased",
    attn_unroll=4,
    attn_pipeline="none",
    attn_tma_release="math",
    outline=False,
    bn_o=16,
    bn_down=16,
    # k = 256: two iterations per warp slice.
    gemm_options=(("stages", 3), ("unroll", 1), ("rotate_k", True)),
    batch_buckets=(),
)


def compile_options(cfg: LlamaConfig, schedule: str = "static") -> dict[str, Any]:
    """The ``etc.compile`` options of the decoder: two CTAs per SM (128
    registers a thread), the tiles ``cfg.outline`` names called instead of
    inlined (per kernel of an artifact: :func:`compile_decoder`); under the static
    schedule ``prefetch_next``, ``queue_ahead`` and ``wait_memo`` as ``cfg`` says; under the dynamic one no
    pop-ahead (every stage waits for the previous one: a position claimed
    by a busy CTA would hold up the next stage)."""
    options = {"schedule": schedule, "min_ctas_per_sm": 2, "outline": cfg.outline}
    if cfg.uses_tma:
        options["target"] = "sm_90a"  # wgmma and TMA
    if schedule == "static":
        options["prefetch_next"] = cfg.prefetch_next
        options["queue_ahead"] = cfg.queue_ahead
        options["wait_memo"] = cfg.wait_memo
    else:
        options["pop_ahead"] = False
    return options


def compile_decoder(
    cfg: LlamaConfig = LLAMA_3_2_1B,
    schedule: str = "static",
    *,
    name: str = "llama",
    **options: Any,
) -> Any:
    """The decoder's artifact: ``etc.compile`` of :func:`build_decoder_graph`
    with :func:`compile_options` (and ``options`` over them), or, with
    ``cfg.batch_buckets``, ``etc.compile_buckets`` of one graph per batch
    range (:meth:`LlamaConfig.bucket_configs`): ``etc.runtime.load`` then
    picks the kernel by ``B`` at each launch."""
    import etc

    if schedule == "dynamic" and cfg.tma_prefetch in ("shared", "shared_l2"):
        # Loading the weight stages into the rings before the waits made the
        # dynamic kernel 2-4 % slower at B = 32 and 64 on an H200 (seventeenth
        # session): its tiles ask the L2 instead, as before.
        cfg = dataclasses.replace(cfg, tma_prefetch=True)
    opts = {**compile_options(cfg, schedule), **options}

    def outline(c: LlamaConfig, g: Graph) -> bool | tuple[str, ...]:
        # The caller's choice for every kernel, else the tasks of c.outline
        # this kernel's graph has (argmax_merge, for one, only with the
        # argmax in parts).
        if "outline" in options:
            return options["outline"]
        if isinstance(c.outline, bool):
            return c.outline
        names = {task.name for task in g.tasks}
        return tuple(t for t in c.outline if t in names)

    def per_kernel(c: LlamaConfig, g: Graph) -> dict[str, Any]:
        static = schedule == "static"
        sm_slices = options.get("sm_slices", c.sm_slices) and static
        sm_deal = options.get("sm_deal", c.sm_deal) if static else None
        lists = {
            key: options.get(key, getattr(c, key)) and static
            for key in ("queue_ahead", "wait_memo")
        }
        return {"outline": outline(c, g), "sm_slices": sm_slices, "sm_deal": sm_deal, **lists}

    def entry(bound: int | None, c: LlamaConfig) -> tuple:
        # (bound, graph, its options), or a bucket split again by L.
        if c.context_buckets:
            return (bound, ("L", [entry(b, k) for b, k in c.context_configs()]))
        if schedule == "dynamic":
            # Sharers spin for their block's other parts, which only the
            # static lists guarantee to run at once: the last part meets
            # alone. Clusters likewise: only the static lists put a group on
            # one, so split-K pairs and attention splits meet through the L2.
            c = dataclasses.replace(
                c,
                tma_meet_share=(),
                tma_meeting="fragments" if c.tma_meeting == "cluster" else c.tma_meeting,
                attn_cluster=0,
            )
        g = build_decoder_graph(c, name=name)
        return (bound, g, per_kernel(c, g))

    entries = [entry(bound, c) for bound, c in cfg.bucket_configs()]
    if len(entries) == 1 and len(entries[0]) == 3:  # one kernel
        _, g, more = entries[0]
        return etc.compile(g, **{**opts, **more})
    if len(entries) == 1:  # one batch bucket, split by L
        return etc.compile_buckets("L", entries[0][1][1], **opts)
    return etc.compile_buckets("B", entries, **opts)


def weight_bytes(cfg: LlamaConfig) -> int:
    """Bytes of weights a decode step reads (bf16; the tied LM head once)."""
    H, NL = cfg.hidden, cfg.layers
    per_layer = cfg.qkv_width * H + H * cfg.attn_width + 3 * cfg.inter * H + 2 * H
    return 2 * (NL * per_layer + cfg.vocab * H + H)


def kv_bytes(cfg: LlamaConfig, B: int, L: int) -> int:
    """Bytes of KV cache a decode step reads at context ``L`` (bf16)."""
    return 2 * 2 * cfg.layers * B * cfg.kv_heads * L * cfg.head_dim


def tensor_shapes(
    cfg: LlamaConfig, B: Any, L: Any, S: Any, pages: Any = None, max_pages: Any = None
) -> dict[str, tuple[tuple, str]]:
    """Every tensor of the graph: name -> (shape, dtype). With
    ``cfg.page_size`` the caches are a pool of ``pages`` and the block table
    ``max_pages`` wide (defaults: enough for ``S`` positions a sequence, and
    a pool of ``B`` such rows)."""
    H, NL, NH, KV, D = cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim
    P = cfg.splits(L, B)
    cache = (NL, B, KV, S, D)
    if cfg.page_size:
        if max_pages is None:
            max_pages = (S + cfg.page_size - 1) // cfg.page_size
        if pages is None:
            pages = B * max_pages
        cache = (NL, pages, KV, cfg.page_size, D)
    return {
        "tokens": ((B,), "i32"),
        "embed": ((cfg.vocab, H), "bf16"),
        "norms": ((2 * NL + 1, H), "bf16"),
        cfg.weight_name("wqkv"): ((NL, cfg.qkv_width, H), "bf16"),
        cfg.weight_name("wo"): ((NL, H, cfg.attn_width), "bf16"),
        cfg.weight_name("wgu"): ((NL, 2 * cfg.inter, H), "bf16"),
        cfg.weight_name("wd"): ((NL, H, cfg.inter), "bf16"),
        "rope": ((S, D), "f32"),
        "k_cache": (cache, "bf16"),
        "v_cache": (cache, "bf16"),
        "h": ((B, H), "bf16"),
        "x": ((B, H), "bf16"),
        "qkv": ((B, cfg.qkv_width), "bf16"),
        "opart": ((B, NH, P, D), "f32"),
        "mpart": ((B, NH, P, 2), "f32"),
        "attn": ((B, cfg.attn_width), "bf16"),
        "act": ((B, cfg.inter), "bf16"),
        "logits": ((B, cfg.vocab), "bf16"),
        "next_tokens": ((B,), "i32"),
        **({"sumsq": ((2 * NL + 1, B), "i64")} if cfg.sums else {}),
        **(
            {
                "argmax_val": ((B, cfg.argmax_parts), "f32"),
                "argmax_idx": ((B, cfg.argmax_parts), "i32"),
            }
            if cfg.argmax_parts
            else {}
        ),
        **({"attn_count": ((NL, B, cfg.kv_heads), "i32")} if cfg.split_counters else {}),
        **({"argmax_key": ((B,), "i64")} if cfg.key_buffer else {}),
        **({"attn_stamps": ((NL, B, KV, P, _stamp_words(cfg)), "i64")} if cfg.attn_stamps else {}),
        **({"gemm_stamps": (_gemm_stamps_shape(cfg, B), "i64")} if cfg.gemm_stamps else {}),
        **({"block_table": ((B, max_pages), "i32")} if cfg.page_size else {}),
        **({"lengths": ((B,), "i32")} if cfg.ragged else {}),
        **_split_tensors(cfg, B),
    }


def _stamp_words(cfg: LlamaConfig) -> int:
    from ..tiles import llama
    from ..tiles.attention_mma import STAMPS

    return len(llama.PHASED_STAMPS if cfg.attn_tile == "phased" else STAMPS)


def _gemm_stamps_shape(cfg: LlamaConfig, B: Any) -> tuple:
    """``gemm_stamps``: a row of slots per projection (``_COUNTER_ROWS``) and
    layer, :data:`~etc.tiles.gemm_layer_tma.STAMP_SLOTS` a 64-row block."""
    from ..tiles.gemm_layer_tma import STAMP_SLOTS, STAMPS

    return (cfg.layers, len(_COUNTER_ROWS), STAMP_SLOTS * ((B + 63) // 64), len(STAMPS))


#: The counters the decoder's tiles return to zero themselves (the folded
#: argmax's keys, the split-K meetings' counts): zero before the first
#: launch, zeroed by the runtime after a failed one (``Graph.tensor(
#: kept_zero=True)``). Not ``attn_count``: embed zeroes it at the start of
#: every launch, and the fused combine leaves it counted.
KEPT_ZERO = frozenset({"argmax_key", "split_count"})


def _split_tensors(cfg: LlamaConfig, B: Any) -> dict[str, tuple[tuple, str]]:
    """The split-K workspace (:attr:`LlamaConfig.split_workspace`): float32
    parts, and one counter row per projection (zero between launches)."""
    space = cfg.split_workspace
    if space is None:
        return {}
    parts, cols, counters = space
    row_blocks = (B + 63) // 64
    # In fragment order a part holds whole 64-row blocks.
    rows = parts * row_blocks * 64 if cfg.tma_meeting != "rows" else parts * B
    return {
        "split_parts": ((rows, cols), "f32"),
        "split_count": ((len(_COUNTER_ROWS), row_blocks * counters), "i32"),
    }


def _attention_tile(cfg: LlamaConfig, layers: int, block_size: int) -> Any:
    """The "online" or "mma" attention tile of ``cfg``."""
    from ..tiles import llama
    from ..tiles.attention_mma import attention_mma

    shape = (cfg.attn_chunk, cfg.heads, cfg.kv_heads, cfg.head_dim, layers)
    common = {
        "block_size": block_size, "spread": cfg.attn_spread, "lengths": cfg.ragged,
        "page_size": cfg.page_size,
    }  # fmt: skip
    if cfg.attn_tile == "mma":
        return attention_mma(
            *shape, blocks=cfg.attn_unroll, pipeline=cfg.attention_pipeline,
            stages=cfg.attn_tma_stages,
            prefetch=cfg.attn_tma_prefetch and cfg.attention_pipeline == "tma",
            release=cfg.attn_tma_release if cfg.attention_pipeline == "tma" else "math",
            direct=cfg.direct_attention, stamps=cfg.attn_stamps, items=cfg.attn_items,
            combine=cfg.fuse_combine, merge_unroll=cfg.attn_merge_unroll,
            kv_evict_first=cfg.attn_kv_evict_first and cfg.attention_pipeline == "tma", **common,
        )  # fmt: skip
    return llama.attention_online(*shape, unroll=cfg.attn_unroll, **common)


def _sync_options(cfg: LlamaConfig, projection: str) -> dict[str, Any]:
    """``projection``'s sync-core loop options: ``gemm_options`` and
    ``prefetch_ring`` with its ``projection_options``."""
    return {
        **dict(cfg.gemm_options),
        "prefetch_ring": cfg.prefetch_ring,
        "l2_evict_first": cfg.weights_evict_first,
        **dict(dict(cfg.projection_options).get(projection, ())),
    }


def _tiles(cfg: LlamaConfig) -> dict[str, Any]:
    from ..tiles import gemm, llama

    H, NL, bs = cfg.hidden, cfg.layers, cfg.block_size

    def proj(
        bn: int, n: int, k: int, epilogue: str, name: str, layers: int | None = NL, norm=None,
        sums_out=None, argmax_key: bool = False,
    ):  # fmt: skip
        folded = cfg.fold_norms and norm is not None and layers is not None
        if cfg.core(name) == "bulk":
            core = {"core": "bulk", **dict(cfg.bulk_options)}
        elif cfg.core(name) == "gemv":
            # weights_evict_first marks nothing here, as on the bulk core:
            # the gemv tile takes no L2 hint (bench/RESULTS.md item 208).
            own = _sync_options(cfg, name)
            core = dict(
                core="gemv", stages=own.get("stages"), prefetch_ring=own["prefetch_ring"],
                short_path=cfg.gemv_short_path,
                whole_lines=cfg.gemv_whole_lines and cfg.gemv_block > 1,
                row_scale=(*norm, cfg.eps) if folded else None,
                sums_out=sums_out if cfg.sums else None,
                **({"argmax_key": True} if argmax_key else {}),
            )  # fmt: skip
        elif cfg.core(name) == "tma":
            own = dict(dict(cfg.projection_options).get(name, ()))
            core = dict(
                core="tma", stages=own.get("stages", cfg.tma_stages), k_splits=cfg.k_split(name),
                l2_evict_first=own.get("l2_evict_first", cfg.weights_evict_first),
                counter_row=_COUNTER_ROWS.get(name, 0),
                prefetch_ring=own.get("prefetch_ring", cfg.tma_prefetch),
                a_box=cfg.tma_a_box, rotate_k=cfg.tma_rotate_k,
                epilogue_ahead=cfg.tma_epilogue_ahead, meeting=cfg.meeting(name),
                meet_share=cfg.meet_share(name), refill=own.get("refill", "wait"),
                stamps=cfg.gemm_stamps and layers is not None,
                row_scale=(*norm, cfg.eps) if folded else None,
                sums_out=sums_out if cfg.sums else None,
                weight_chunk=cfg.weight_chunk if layers is not None else 0,
            )  # fmt: skip
        else:
            warps = None
            if cfg.row_warps:
                wn = math.gcd(bs // 32 // cfg.row_warps, bn // 8)
                warps = (cfg.row_warps, wn, bs // 32 // (cfg.row_warps * wn))
            core = dict(
                warps=warps, prefetch_weights=cfg.prefetch_weights,
                rmsnorm=(*norm, cfg.eps) if cfg.fuse_norms and norm else None,
                norm_sums=cfg.norm_sums and norm is not None,
                row_scale=(*norm, cfg.eps) if folded else None,
                row_paths=cfg.row_paths if cfg.has_row_paths(name) else None,
                sums_out=sums_out if cfg.sums else None, **_sync_options(cfg, name),
                weight_chunk=cfg.weight_chunk if layers is not None else 0,
            )  # fmt: skip
        return gemm.layer_gemm(
            cfg.gemm_block(name), bn, n, k, layers=layers, epilogue=epilogue, name=name,
            block_size=bs,
            columns_first=cfg.columns_first, **core,
        )  # fmt: skip

    # Each norm's weight row in `norms`: stride * layer + offset.
    rows = {"norm1": (2, 0), "norm2": (2, 1), "final_norm": (0, 2 * NL)}
    staged = ("final_norm",) if cfg.fold_norms else () if cfg.fuse_norms else tuple(rows)
    norm_tiles = {
        name: llama.rmsnorm(H, *rows[name], cfg.eps, name=name, block_size=bs) for name in staged
    }
    return {
        "embed": llama.embed(
            cfg.gemm_block("embed"),
            cfg.bn_down // cfg.k_split("embed"),
            H,
            block_size=bs,
            sums=cfg.sums,
            counters=cfg.fuse_combine,
        ),  # fmt: skip
        **norm_tiles,
        "qkv": proj(cfg.bn_qkv, cfg.qkv_width, H, "store", "qkv_proj", norm=rows["norm1"]),
        "attention": _attention_tile(cfg, NL, bs)
        if cfg.attn_tile != "phased"
        else llama.attention(
            cfg.phased_tile_span,
            cfg.heads,
            cfg.kv_heads,
            cfg.head_dim,
            NL,
            unroll=cfg.attn_unroll,
            block_size=bs,
            stage_kv=cfg.attn_stage_kv or cfg.attn_prefetch_kv is True,
            stage_v=cfg.attn_stage_v,
            prefetch_kv=cfg.attn_prefetch_kv,
            combine=cfg.fuse_combine,
            spread=cfg.attn_spread,
            merge_unroll=cfg.attn_merge_unroll,
            stamps=cfg.attn_stamps,
            one_pass=cfg.attn_one_pass,
            lengths=cfg.ragged,
            page_size=cfg.page_size,
            cluster=cfg.attn_cluster,
        ),  # fmt: skip
        **(
            {}
            if cfg.fuse_combine
            else {
                "combine": llama.attention_combine(
                    cfg.heads,
                    cfg.head_dim,
                    block_size=bs,
                    group=cfg.combine_group or None,
                    merge_unroll=cfg.attn_merge_unroll,
                )
            }
        ),
        # The sums of squares of layer l's norm2 input and of layer l+1's norm1
        # input: the slots of the norm weights (2l + 1, 2l + 2).
        "o_proj": proj(cfg.bn_o, H, cfg.attn_width, "residual", "o_proj", sums_out=(2, 1)),
        "gate_up": proj(cfg.bn_gu, cfg.inter, H, "swiglu", "gate_up_proj", norm=rows["norm2"]),
        "down": proj(cfg.bn_down, H, cfg.inter, "residual", "down_proj", sums_out=(2, 2)),
        "lm_head": proj(
            cfg.bn_lm,
            cfg.vocab,
            H,
            "store",
            "lm_head",
            layers=None,
            norm=rows["final_norm"],
            argmax_key=cfg.argmax_fused,
        ),
        "argmax": llama.argmax_take(block_size=bs)
        if cfg.argmax_fused
        else llama.argmax(cfg.vocab, block_size=bs, parts=cfg.split_argmax or None),
        **(
            {"argmax_merge": llama.argmax_merge(cfg.vocab, cfg.argmax_parts, block_size=bs)}
            if cfg.split_argmax
            else {}
        ),
        **({"l2_prefetch": _prefetch_tile(cfg)} if cfg.l2_prefetch else {}),
    }


def _prefetch_tile(cfg: LlamaConfig) -> Any:
    """The ``l2_prefetch`` task's tile: ``cfg.l2_prefetch``'s weights."""
    from ..tiles.prefetch import Region, l2_prefetch

    shapes = tensor_shapes(cfg, 1, 1, 1)
    regions = []
    for weight, eighths, offset in cfg.l2_prefetch:
        _, rows, cols = shapes[cfg.weight_name(weight)][0]
        regions.append(Region(rows, cols, eighths, offset, cfg.l2_prefetch_evict_last))
    return l2_prefetch(
        regions, cfg.l2_prefetch_ctas, layers=cfg.layers, block_size=cfg.block_size,
        mode=cfg.l2_prefetch_mode,
    )  # fmt: skip


def build_decoder_graph(
    cfg: LlamaConfig = LLAMA_3_2_1B, tiles: Mapping[str, Any] | None = None, *, name: str = "llama"
) -> Graph:
    """The whole decode step as one graph (module docstring). ``tiles``
    overrides any of the device functions by task name (tests pass
    numpy-only ones)."""
    tiles = {**_tiles(cfg), **(tiles or {})}
    NL, KV = cfg.layers, cfg.kv_heads
    g = Graph(name, block_size=cfg.block_size)
    B, L = g.symbol("B", max=cfg.kernel_max_batch), g.symbol("L", max=cfg.max_context)
    S = g.symbol("S")
    pool = (g.symbol("pages"), g.symbol("max_pages")) if cfg.page_size else ()
    t = {
        n: g.tensor(n, shape, dt, kept_zero=n in KEPT_ZERO)
        for n, (shape, dt) in tensor_shapes(cfg, B, L, S, *pool).items()
    }
    # The step reads RoPE row L and writes cache row L: refused at launch past them.
    g.require(S - L - 1, "position L must be below S, the rows of the RoPE table and the cache")
    if cfg.page_size:
        g.require(
            pool[1] * cfg.page_size - L - 1,
            f"position L must be below max_pages * {cfg.page_size}, the positions a block "
            "table row holds",
        )
    rb = cfg.row_blocks(B)
    regions = dict(cfg.shared_regions)

    def task(function: Any, **kw: Any) -> Any:
        deal = "pool" if kw["name"] in cfg.pool else "list"
        slots = dict(cfg.deal_slots).get(kw["name"])
        return g.task(
            function, shared_region=regions.get(kw["name"], 0), deal=deal, deal_slots=slots, **kw
        )

    def tiles_of(bn: int, n: int, projection: str) -> Any:
        return cfg.row_blocks(B, projection) * (n // bn) * cfg.k_split(projection)

    def gemm_grid(bn: int, n: int, projection: str) -> tuple:
        rows = cfg.row_blocks(B, projection)
        grid = (n // bn, rows) if cfg.columns_first else (rows, n // bn)
        parts = cfg.k_split(projection)
        return (*grid, parts) if parts > 1 else grid

    def split_args(projection: str) -> tuple[str, ...]:
        """The split-K workspace (split projections), then the stamps (tma core)."""
        split = ("split_parts", "split_count") if cfg.k_split(projection) > 1 else ()
        stamped = cfg.gemm_stamps and cfg.core(projection) == "tma"
        return split + (("gemm_stamps",) if stamped else ())

    def gemm_phase(projection: str) -> str:
        return "lijs->l" if cfg.k_split(projection) > 1 else "lij->l"

    sums = ("sumsq",) if cfg.sums else ()
    counts = ("attn_count",) if cfg.fuse_combine else ()
    fused_out = ("attn",) if cfg.fuse_combine or cfg.direct_attention else ()
    stamps = ("attn_stamps",) if cfg.attn_stamps else ()
    positions = ("lengths",) if cfg.ragged else ()  # a ragged batch's
    table = ("block_table",) if cfg.page_size else ()  # a paged cache's
    attn_extras = (*counts, *fused_out, *stamps, *table, *positions)
    # 1 past one split, else 0 with direct attention (a single split wrote the
    # output itself): the factor of the combine's grid and count.
    combines = (cfg.splits(L, B) + _BIG - 2) // _BIG if cfg.direct_attention else 1
    # A clustered attention's groups need a constant extent (the splits'
    # count there, checked by LlamaConfig).
    attn_grid = (B, KV // cfg.attn_items, cfg.attn_cluster or cfg.splits(L, B))
    attn_instances = attn_grid[0] * attn_grid[1] * attn_grid[2]
    layer_in = g.event(
        (NL + 1,), wait_count=tiles_of(cfg.bn_down, cfg.hidden, "down_proj"), name="layer_in"
    )
    fused = cfg.fuse_norms
    no_stages = fused or cfg.fold_norms  # no norm stages in the layers
    ev = {
        "normed1": None if no_stages else g.event((NL,), wait_count=B, name="normed1"),
        "qkv_done": g.event(
            (NL,), wait_count=tiles_of(cfg.bn_qkv, cfg.qkv_width, "qkv_proj"), name="qkv_done"
        ),
        "attended": g.event((NL,), wait_count=attn_instances, name="attended"),
        "combined": None
        if cfg.fuse_combine
        else g.event(
            (NL,),
            wait_count=B * combines * cfg.combine_instances
            + (attn_instances if cfg.direct_attention else 0),
            name="combined",
        ),
        "o_done": g.event(
            (NL,), wait_count=tiles_of(cfg.bn_o, cfg.hidden, "o_proj"), name="o_done"
        ),
        "normed2": None if no_stages else g.event((NL,), wait_count=B, name="normed2"),
        "gu_done": g.event(
            (NL,), wait_count=tiles_of(cfg.bn_gu, cfg.inter, "gate_up_proj"), name="gu_done"
        ),
    }
    final_normed = None if fused else g.event((1,), wait_count=B, name="final_normed")
    logits_done = g.event(
        (1,), wait_count=tiles_of(cfg.bn_lm, cfg.vocab, "lm_head"), name="logits_done"
    )

    task(
        tiles["embed"],
        grid=(rb, cfg.hidden // cfg.bn_down * cfg.k_split("embed")),
        args=(t["tokens"], t["embed"], t["h"], *[t[n] for n in sums + counts]),
        out_edges={layer_in: "ij->0"},
        name="embed",
    )

    def layer_task(key, grid, args, wait, notify, map_in, map_out=None):
        """A per-layer task; ``notify``: an event or a list of them."""
        notified = notify if isinstance(notify, list) else [notify]
        task(
            tiles[key],
            grid=(NL, *grid),
            args=tuple(t[a] if isinstance(a, str) else a for a in args),
            in_edges={wait: map_in},
            out_edges={e: map_out or map_in for e in notified},
            name=key,
            phase=map_in,
        )

    if not no_stages:
        layer_task("norm1", (B,), ("h", "norms", "x"), layer_in, ev["normed1"], "lb->l")

    def normed_args(weight: str, out: str) -> tuple[str, ...]:
        if cfg.fold_norms:
            return ("h", "sumsq", weight, out)
        return ("h", "norms", *sums, weight, out) if fused else ("x", weight, out)

    layer_task(
        "qkv",
        gemm_grid(cfg.bn_qkv, cfg.qkv_width, "qkv_proj"),
        (*normed_args(cfg.weight_name("wqkv"), "qkv"), *split_args("qkv_proj")),
        layer_in if no_stages else ev["normed1"],
        ev["qkv_done"],
        gemm_phase("qkv_proj"),
    )
    # With direct attention the instances also count on ``combined``: at one
    # split they are all it waits for (the combine's grid is empty).
    layer_task(
        "attention",
        attn_grid,
        (L, "qkv", "rope", "k_cache", "v_cache", "opart", "mpart", *attn_extras),
        ev["qkv_done"],
        [ev["attended"]] + ([ev["combined"]] if ev["combined"] and cfg.direct_attention else []),
        "lbgs->l",
    )
    if cfg.l2_prefetch:
        # While the attention reads its few MB of cache, the next stages'
        # weights stream into L2; the task waits for what the attention does.
        task(
            tiles["l2_prefetch"],
            grid=(NL, cfg.l2_prefetch_ctas),
            args=tuple(t[cfg.weight_name(w)] for w, _, _ in cfg.l2_prefetch),
            in_edges={ev["qkv_done"]: "lp->l"},
            name="l2_prefetch",
            phase="lp->l",
        )
    if not cfg.fuse_combine:
        grid, phase = (
            ((B * combines, cfg.combine_instances), "lbg->l")
            if cfg.combine_group
            else ((B * combines,), "lb->l")
        )
        layer_task(
            "combine", grid, ("opart", "mpart", "attn"), ev["attended"], ev["combined"], phase
        )
    layer_task(
        "o_proj",
        gemm_grid(cfg.bn_o, cfg.hidden, "o_proj"),
        ("attn", cfg.weight_name("wo"), "h", *sums, *split_args("o_proj")),
        ev["attended"] if cfg.fuse_combine else ev["combined"],
        ev["o_done"],
        gemm_phase("o_proj"),
    )
    if not no_stages:
        layer_task("norm2", (B,), ("h", "norms", "x"), ev["o_done"], ev["normed2"], "lb->l")
    layer_task(
        "gate_up",
        gemm_grid(cfg.bn_gu, cfg.inter, "gate_up_proj"),
        (*normed_args(cfg.weight_name("wgu"), "act"), *split_args("gate_up_proj")),
        ev["o_done"] if no_stages else ev["normed2"],
        ev["gu_done"],
        gemm_phase("gate_up_proj"),
    )
    layer_task(
        "down",
        gemm_grid(cfg.bn_down, cfg.hidden, "down_proj"),
        ("act", cfg.weight_name("wd"), "h", *sums, *split_args("down_proj")),
        ev["gu_done"],
        layer_in,
        gemm_phase("down_proj"),
        "(l, i, j, s) -> (l + 1)" if cfg.k_split("down_proj") > 1 else "(l, i, j) -> (l + 1)",
    )
    if not fused:
        task(
            tiles["final_norm"],
            grid=(1, B),
            args=(t["h"], t["norms"], t["x"]),
            in_edges={layer_in: f"(o, b) -> ({NL})"},
            out_edges={final_normed: "ob->0"},
            name="final_norm",
            phase=NL,
        )
    task(
        tiles["lm_head"],
        grid=gemm_grid(cfg.bn_lm, cfg.vocab, "lm_head"),
        args=(
            *((t["h"], t["norms"], *[t[n] for n in sums]) if fused else (t["x"],)),
            t["embed"],
            t["logits"],
            *((t["argmax_key"],) if cfg.argmax_fused else ()),
        ),
        in_edges={layer_in: f"(j, i) -> ({NL})"} if fused else {final_normed: "ij->0"},
        out_edges={logits_done: "ij->0"},
        name="lm_head",
        phase=NL,
    )
    if cfg.split_argmax:
        parts_done = g.event((1,), wait_count=B * cfg.argmax_parts, name="argmax_parts_done")
        task(
            tiles["argmax"],
            grid=(B, cfg.argmax_parts),
            args=(t["logits"], t["argmax_val"], t["argmax_idx"]),
            in_edges={logits_done: "bp->0"},
            out_edges={parts_done: "bp->0"},
            name="argmax",
            phase=NL,
        )
        task(
            tiles["argmax_merge"],
            grid=(B,),
            args=(t["argmax_val"], t["argmax_idx"], t["next_tokens"]),
            in_edges={parts_done: "b->0"},
            name="argmax_merge",
            phase=NL,
        )
        return g
    task(
        tiles["argmax"],
        grid=(B,),
        args=(t["argmax_key"] if cfg.argmax_fused else t["logits"], t["next_tokens"]),
        in_edges={logits_done: "b->0"},
        name="argmax",
        phase=NL,
    )
    return g


# -- weights ---------------------------------------------------------------------


def inv_freq(cfg: LlamaConfig) -> np.ndarray:
    """RoPE inverse frequencies (float32), with Llama 3's scaling as
    Hugging Face computes it."""
    D = cfg.head_dim
    base = 1.0 / (cfg.rope_theta ** (np.arange(0, D, 2, dtype=np.int64).astype(np.float32) / D))
    base = base.astype(np.float32)
    if cfg.rope_scaling is None:
        return base
    factor, low, high, old = cfg.rope_scaling
    wavelen = 2 * math.pi / base
    low_wavelen, high_wavelen = old / low, old / high
    scaled = np.where(wavelen > low_wavelen, base / factor, base)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_table(cfg: LlamaConfig, S: int) -> np.ndarray:
    """``(S, head_dim)`` float32: row p = [cos(p f), sin(p f)], rounded to
    bf16 values (Hugging Face casts cos/sin to the model's dtype)."""
    freqs = np.arange(S, dtype=np.float32)[:, None] * inv_freq(cfg)[None, :]
    table = np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1).astype(np.float32)
    return bf16_to_f32(f32_to_bf16(table))


_STD = 0.02  # Hugging Face's initializer_range


def _norm_weights(rng: np.random.Generator, cfg: LlamaConfig) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal((2 * cfg.layers + 1, cfg.hidden))).astype(np.float32)


def _std(cfg: LlamaConfig, name: str) -> float:
    """N(0, 0.02) (Hugging Face's initializer_range), the projections that
    write the residual stream scaled by 1/sqrt(2 layers) (GPT-2's
    initialisation): without it sixteen random layers amplify bf16 rounding
    differences into percent-level logit differences between two correct
    implementations, which would hide real errors."""
    return _STD / math.sqrt(2 * cfg.layers) if name in ("wo", "wd") else _STD


def _weight_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    H, NL, II = cfg.hidden, cfg.layers, cfg.inter
    return {
        "embed": (cfg.vocab, H),
        "wqkv": (NL, cfg.qkv_width, H),
        "wo": (NL, H, cfg.attn_width),
        "wgu": (NL, 2 * II, H),
        "wd": (NL, H, II),
    }


def _graph_weights_checked(cfg: LlamaConfig, weights: Mapping[str, Any], caller: str) -> dict:
    """:func:`graph_weights`, after checking that ``weights`` holds every
    weight the graph reads (under its raw or its graph name): an input
    builder would leave a missing one zeroed, a model of silent zeros."""
    if not isinstance(weights, Mapping):
        raise GraphError(
            f"{caller}: weights must map names to arrays, got {type(weights).__name__}"
        )
    missing = [
        k
        for k in (*_weight_shapes(cfg), "norms")
        if k not in weights and cfg.weight_name(k) not in weights
    ]
    if missing:
        name = cfg.weight_name(missing[0])
        also = f" (nor {name!r})" if name != missing[0] else ""
        raise GraphError(
            f"{caller}: weights has no {missing[0]!r}{also}; it holds "
            f"{', '.join(map(repr, weights)) or 'nothing'}"
        )
    return graph_weights(cfg, weights)


def random_weights(cfg: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """bf16 (uint16 bits) weights in the graph's layout: normal matrices
    (:func:`_std`) and norm weights 1 + N(0, 0.1)."""
    rng = np.random.default_rng(seed)
    out = {
        name: f32_to_bf16((rng.standard_normal(shape) * _std(cfg, name)).astype(np.float32))
        for name, shape in _weight_shapes(cfg).items()
    }
    out["norms"] = f32_to_bf16(_norm_weights(rng, cfg))
    return out


def random_weights_torch(cfg: LlamaConfig, seed: int = 0, device: str = "cuda") -> dict[str, Any]:
    """:func:`random_weights`' distributions drawn by torch on ``device`` (bf16)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in _weight_shapes(cfg).items():
        out[name] = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(
            0.0, _std(cfg, name), generator=gen
        )
    norms = torch.empty((2 * cfg.layers + 1, cfg.hidden), dtype=torch.float32, device=device)
    out["norms"] = (1.0 + 0.1 * norms.normal_(generator=gen)).to(torch.bfloat16)
    return out


def graph_weights(cfg: LlamaConfig, weights: Mapping[str, Any]) -> dict[str, Any]:
    """``weights`` (numpy bf16 bits or torch bf16 tensors, Hugging Face's
    semantics) as the graph takes them: with ``cfg.fold_norms`` each layer's
    norm weights multiplied into ``wqkv`` (norm1) and ``wgu`` (norm2), in
    new arrays named ``wqkv_folded`` and ``wgu_folded``; with
    ``cfg.weight_chunk`` the layer projections' weights then chunked
    (:func:`etc.tiles.gemm.chunk_weights`), named with ``_c<chunk>``
    (:meth:`LlamaConfig.weight_name`); otherwise ``weights`` unchanged.
    Weights already converted (under the graph's names, not the raw ones)
    are kept, so a caller may convert once and pass the result to every
    :func:`torch_inputs`."""
    out = dict(weights)
    NL = cfg.layers
    for key, first in zip(_FOLDED, (0, 1), strict=True):
        folded_name = f"{key}_folded"
        if not cfg.fold_norms or key not in weights:
            continue  # nothing to fold, or folded already (under a graph name)
        gamma = weights["norms"][first : 2 * NL : 2][:, None, :]  # (NL, 1, H)
        w = weights[key]
        if isinstance(w, np.ndarray):
            from ..tiles.gemm import fold_norm

            folded = fold_norm(w, gamma)
        else:  # torch: the product rounded to bf16 once, as fold_norm does
            folded = (w.float() * gamma.float()).to(w.dtype)
        del out[key]
        out[folded_name] = folded
    if cfg.weight_chunk:
        from ..tiles.gemm import chunk_weights

        for key in _CHUNKED:
            plain = f"{key}_folded" if cfg.fold_norms and key in _FOLDED else key
            if plain in out:
                out[cfg.weight_name(key)] = chunk_weights(out.pop(plain), cfg.weight_chunk)
    return out


def _row_weight(cfg: LlamaConfig, arrays: Mapping[str, Any], key: str) -> Any:
    """The graph's weight ``key`` as nn.Linear rows (``weight_chunk`` undone)."""
    w = arrays[cfg.weight_name(key)]
    if cfg.weight_chunk and key in _CHUNKED:
        from ..tiles.gemm import unchunk_weights

        return unchunk_weights(w, cfg.weight_chunk)
    return w


# -- numpy reference -------------------------------------------------------------


def _r(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 values (kept as float32)."""
    return bf16_to_f32(f32_to_bf16(np.asarray(x, np.float32)))


def _rmsnorm(h: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    r = 1.0 / np.sqrt((h * h).mean(axis=1, keepdims=True) + np.float32(eps))
    return _r(gamma[None, :] * _r(h * r.astype(np.float32)))


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    c, s = np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1)
    return _r(x * c + rot * s)


def reference_step(
    cfg: LlamaConfig, arrays: Mapping[str, np.ndarray], L: int
) -> dict[str, np.ndarray]:
    """One decode step in numpy with the graph's rounding: returns ``logits``
    (float32 of the bf16 values), ``next_tokens`` and the caches with
    position ``L`` written (copies; ``arrays`` is not modified). ``arrays``
    holds the graph's weights (:func:`graph_weights`): with
    ``cfg.fold_norms`` the layer norms are folded into ``wqkv_folded`` and
    ``wgu_folded`` and each row is scaled after the product, as the graph
    does. With ``cfg.ragged`` sequence ``b`` is at position
    ``min(arrays["lengths"][b], L)``; with ``cfg.page_size`` the caches are
    paged (read through ``block_table``, returned paged)."""
    if cfg.page_size:
        return _paged_reference_step(cfg, arrays, L)
    NL, NH, KV, D, II = cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.inter
    G = NH // KV
    f = {
        k: bf16_to_f32(_row_weight(cfg, arrays, k))
        for k in ("embed", "norms", "wqkv", "wo", "wgu", "wd")
    }
    from ..tiles.llama import clamped_tokens

    kc, vc = arrays["k_cache"].copy(), arrays["v_cache"].copy()
    tokens = clamped_tokens(arrays["tokens"], cfg.vocab)  # as the embedding tile reads them
    B = len(tokens)
    at = _positions(cfg, arrays, L)
    cos, sin = (x[:, None] for x in np.split(arrays["rope"][at], 2, axis=1))
    h = f["embed"][tokens]

    def normed_matmul(h: np.ndarray, slot: int, w: np.ndarray) -> np.ndarray:
        if not cfg.fold_norms:
            return _rmsnorm(h, f["norms"][slot], cfg.eps) @ w.T
        r = 1.0 / np.sqrt((h * h).mean(axis=1, keepdims=True) + np.float32(cfg.eps))
        return (h @ w.T) * r.astype(np.float32)

    for layer in range(NL):
        qkv = _r(normed_matmul(h, 2 * layer, f["wqkv"][layer]))
        q = _rope(qkv[:, : NH * D].reshape(B, NH, D), cos, sin)
        k = _rope(qkv[:, NH * D : (NH + KV) * D].reshape(B, KV, D), cos, sin)
        v = qkv[:, (NH + KV) * D :].reshape(B, KV, D)
        out = np.empty((B, NH, D), np.float32)
        for b, p_b in enumerate(at):
            kc[layer, b, :, p_b] = f32_to_bf16(k[b])
            vc[layer, b, :, p_b] = f32_to_bf16(v[b])
            keys = bf16_to_f32(kc[layer, b : b + 1, :, : p_b + 1])  # (1, KV, p_b + 1, D)
            vals = bf16_to_f32(vc[layer, b : b + 1, :, : p_b + 1])
            for hd in range(NH):
                s = np.einsum("bd,bpd->bp", q[b : b + 1, hd], keys[:, hd // G])
                s = s / np.float32(math.sqrt(D))
                p = np.exp(s - s.max(axis=1, keepdims=True))
                out[b, hd] = np.einsum(
                    "bp,bpd->bd", p / p.sum(axis=1, keepdims=True), vals[:, hd // G]
                )[0]
        attn = _r(out.reshape(B, NH * D))
        h = _r(_r(attn @ f["wo"][layer].T) + h)
        gu = normed_matmul(h, 2 * layer + 1, f["wgu"][layer])
        g, u = _r(gu[:, :II]), _r(gu[:, II:])
        act = _r(_r(g / (1 + np.exp(-g))) * u)
        h = _r(_r(act @ f["wd"][layer].T) + h)
    x = _rmsnorm(h, f["norms"][2 * NL], cfg.eps)
    logits = _r(x @ f["embed"].T)
    return {
        "logits": logits,
        "next_tokens": logits.argmax(axis=1).astype(np.int32),
        "k_cache": kc,
        "v_cache": vc,
    }


def _positions(cfg: LlamaConfig, arrays: Mapping[str, Any], L: int) -> np.ndarray:
    """Each sequence's position in a step at context ``L``: a ragged batch's
    ``min(lengths[b], L)`` (as the kernel clamps it), else ``L``."""
    if cfg.ragged:
        return np.minimum(arrays["lengths"], L)
    return np.full(len(arrays["tokens"]), L)


def _paged_reference_step(
    cfg: LlamaConfig, arrays: Mapping[str, np.ndarray], L: int
) -> dict[str, np.ndarray]:
    """:func:`reference_step` over a paged cache: the contiguous step on its
    gathered view, each sequence's new row written back to its page."""
    table, P = arrays["block_table"], cfg.page_size
    views = {k: from_pages(arrays[k], table) for k in ("k_cache", "v_cache")}
    out = reference_step(dataclasses.replace(cfg, page_size=0), {**arrays, **views}, L)
    for k in views:
        pool = arrays[k].copy()
        for b, p in enumerate(_positions(cfg, arrays, L).tolist()):
            pool[:, table[b, p // P], :, p % P] = out[k][:, b, :, p]
        out[k] = pool
    return out


def check_tokens(tokens: Any, vocab: int) -> None:
    """Raises GraphError naming the first token outside ``0..vocab - 1``
    (the kernel would read the embedding's last row for it instead).
    ``tokens``: ints, a numpy array or a torch tensor."""
    if hasattr(tokens, "detach"):  # a torch tensor: its values, on the host
        tokens = tokens.detach().cpu().numpy()
    tok = np.asarray(tokens)
    if tok.ndim != 1 or not np.issubdtype(tok.dtype, np.integer):
        raise GraphError(
            f"tokens must be one int per sequence (a 1-D integer array), got {tok.dtype} of "
            f"shape {tok.shape}"
        )
    bad = np.flatnonzero((tok < 0) | (tok >= vocab))
    if len(bad):
        raise GraphError(
            f"tokens[{int(bad[0])}] = {int(tok[bad[0]])} is not in the vocabulary 0..{vocab - 1}"
        )


def check_lengths(lengths: Any, B: int, L: int) -> np.ndarray:
    """A ragged batch's positions (``LlamaConfig.ragged``) as int32, after
    checking them: ``B`` of them, each in ``0..L`` (the graph's ``L`` is the
    longest). Raises GraphError naming ``lengths`` otherwise. ``lengths``: a
    sequence of ints, a numpy array or a torch tensor (on any device)."""
    if hasattr(lengths, "detach"):  # a torch tensor: its values, on the host
        lengths = lengths.detach().cpu().numpy()
    at = np.asarray(lengths)
    if at.shape != (B,) or not np.issubdtype(at.dtype, np.integer):
        raise GraphError(
            f"lengths: expected {B} integer positions (one a sequence), got shape "
            f"{at.shape} of {at.dtype}"
        )
    if B and (at.min() < 0 or at.max() > L):
        bad = int(np.flatnonzero((at < 0) | (at > L))[0])
        raise GraphError(
            f"lengths[{bad}] = {int(at[bad])} is not in 0..L = 0..{L}: L, the graph's "
            "symbol, must be the longest sequence's position"
        )
    return at.astype(np.int32)


def page_table(B: int, max_pages: int, seed: int = 1) -> np.ndarray:
    """A block table ``(B, max_pages)`` int32 dealing a pool of ``B *
    max_pages`` pages to the sequences at random (as pages freed and reused
    in any order come back)."""
    rng = np.random.default_rng(seed + 7)
    return rng.permutation(B * max_pages).astype(np.int32).reshape(B, max_pages)


def to_pages(cache: Any, table: Any, page_size: int, pages: int | None = None) -> Any:
    """A contiguous cache ``(layers, B, KV, S, D)`` (numpy or torch) moved
    into a pool of ``pages`` (default: the table's largest page + 1)
    through ``table`` ``(B, max_pages)``: its positions past ``S`` up to the
    table's width zero."""
    NL, B, KV, S, D = cache.shape
    M = table.shape[1]
    width = M * page_size
    if hasattr(cache, "permute"):  # torch, on the cache's device
        import torch

        zeros = cache.new_zeros
        index = torch.as_tensor(np.asarray(table).reshape(-1), device=cache.device).long()
    else:
        zeros = lambda shape: np.zeros(shape, cache.dtype)  # noqa: E731
        index = np.asarray(table).reshape(-1)
    padded = zeros((NL, B, KV, width, D))
    padded[:, :, :, : min(S, width)] = cache[:, :, :, :width]
    blocks = padded.reshape(NL, B, KV, M, page_size, D).swapaxes(2, 3)
    pool = zeros((NL, int(index.max()) + 1 if pages is None else pages, KV, page_size, D))
    pool[:, index] = blocks.reshape(NL, B * M, KV, page_size, D)
    return pool


def from_pages(pool: np.ndarray, table: np.ndarray) -> np.ndarray:
    """A paged cache's contiguous view ``(layers, B, KV, max_pages *
    page_size, D)`` (a copy): sequence ``b``'s pages in table order."""
    NL, _, KV, P, D = pool.shape
    B, M = table.shape
    return pool[:, table].transpose(0, 1, 3, 2, 4, 5).reshape(NL, B, KV, M * P, D)


def check_block_table(table: Any, page_size: int, pages: int, positions: Any) -> np.ndarray:
    """A paged cache's block table (``LlamaConfig.page_size``) as int32, after
    checking it for sequences at ``positions`` (one a sequence: ``L`` or a
    ragged batch's): each sequence's pages up to its position listed, in
    ``0..pages - 1`` and distinct, and the page it writes (its position's)
    nobody else's. Pages below the position may be shared (a common
    prefix). Raises GraphError naming the entry otherwise. The kernel
    clamps what it looks up, so a bad table gives wrong values, not a
    fault; check each new table before its launch."""
    if hasattr(table, "detach"):  # a torch tensor: its values, on the host
        table = table.detach().cpu().numpy()
    tab, at = np.asarray(table), np.asarray(positions).reshape(-1)
    B = len(at)
    if tab.ndim != 2 or tab.shape[0] != B or not np.issubdtype(tab.dtype, np.integer):
        raise GraphError(
            f"block_table: expected an integer table of {B} rows (one a sequence), got shape "
            f"{tab.shape} of {tab.dtype}"
        )
    used = {}
    for b, p in enumerate(at.tolist()):
        need = p // page_size + 1
        if need > tab.shape[1]:
            raise GraphError(
                f"block_table: sequence {b} at position {p} needs {need} pages of {page_size}; "
                f"the table holds {tab.shape[1]}"
            )
        row = tab[b, :need].tolist()
        for i, page in enumerate(row):
            if not 0 <= page < pages:
                raise GraphError(
                    f"block_table[{b}, {i}] = {page} is not a page of the pool (0..{pages - 1})"
                )
        if len(set(row)) < need:
            dup = next(x for x in row if row.count(x) > 1)
            raise GraphError(f"block_table: sequence {b} lists page {dup} twice")
        used[b] = set(row)
    for b, p in enumerate(at.tolist()):
        written = int(tab[b, p // page_size])
        other = next((c for c in range(B) if c != b and written in used[c]), None)
        if other is not None:
            raise GraphError(
                f"block_table: page {written}, which sequence {b} writes (position {p}), is also "
                f"sequence {other}'s: a page written in a step belongs to one sequence"
            )
    return tab.astype(np.int32)


class PagePool:
    """A paged cache's pages dealt to sequences as they grow and taken back
    when they end (a free list; ``LlamaConfig.page_size``). A sequence is
    any hashable key. :meth:`table` writes the launch's ``block_table``.

    >>> pool = PagePool(pages=4, page_size=16)
    >>> pool.reserve("a", 20)       # positions 0..20: two pages
    >>> pool.table(["a"], 3).tolist()
    [[0, 1, -1]]
    """

    def __init__(self, pages: int, page_size: int) -> None:
        for name, value in (("pages", pages), ("page_size", page_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise GraphError(f"PagePool: {name} must be an int >= 1, got {value!r}")
        self.pages, self.page_size = pages, page_size
        self._free = list(range(pages - 1, -1, -1))  # pop() deals page 0 first
        self._held: dict[Any, list[int]] = {}

    @property
    def free(self) -> int:
        """Pages no sequence holds."""
        return len(self._free)

    def held(self, sequence: Any) -> list[int]:
        """``sequence``'s pages, in position order."""
        return list(self._held.get(sequence, ()))

    def reserve(self, sequence: Any, position: int) -> None:
        """Give ``sequence`` the pages that positions ``0..position`` need
        (the step writes ``position``). Raises GraphError, taking nothing,
        when the pool cannot."""
        if not is_int(position, 0):
            raise GraphError(
                f"PagePool: sequence {sequence!r}'s position must be an int >= 0, got {position!r}"
            )
        try:
            hash(sequence)
        except TypeError:
            raise GraphError(f"PagePool: sequence {sequence!r} is not hashable") from None
        held = self._held.setdefault(sequence, [])
        need = position // self.page_size + 1 - len(held)
        if need > len(self._free):
            raise GraphError(
                f"PagePool: sequence {sequence!r} at position {position} needs {need} more "
                f"pages of {self.page_size}; {len(self._free)} of {self.pages} are free"
            )
        held.extend(self._free.pop() for _ in range(max(need, 0)))

    def release(self, sequence: Any) -> None:
        """Take back every page of ``sequence`` (one that has ended)."""
        self._free.extend(reversed(self._held.pop(sequence, [])))

    def table(self, sequences: Any, width: int) -> np.ndarray:
        """The block table ``(len(sequences), width)`` int32 of a batch, row
        ``b`` the pages of ``sequences[b]`` and -1 past them (never read:
        the kernel looks up no page past a sequence's position)."""
        if isinstance(sequences, str) or not isinstance(sequences, Iterable):
            # A str would be its characters' sequences.
            raise GraphError(f"PagePool.table: sequences must be a list, got {sequences!r}")
        if not is_int(width, 0):
            raise GraphError(f"PagePool.table: width must be an int >= 0, got {width!r}")
        rows = [self._held.get(s, []) for s in sequences]
        longest = max((len(r) for r in rows), default=0)
        if longest > width:
            raise GraphError(f"PagePool.table: a sequence holds {longest} pages; width={width}")
        out = np.full((len(rows), width), -1, np.int32)
        for b, row in enumerate(rows):
            out[b, : len(row)] = row
        return out


def step_symbols(
    cfg: LlamaConfig, arrays: Mapping[str, Any], L: int, *, check: bool = False
) -> dict[str, int]:
    """The graph's symbols for a step at context ``L`` over ``arrays`` (the
    batch from ``tokens``, the capacity from ``rope``, a paged cache's pool
    and table width from ``k_cache`` and ``block_table``). ``check``: first
    check the step's data as the kernel cannot (:func:`check_tokens`,
    :func:`check_lengths`, :func:`check_block_table`), raising GraphError
    naming the bad entry; it reads them on the host, so a GPU tensor costs
    a copy and a synchronisation."""
    symbols = {"B": len(arrays["tokens"]), "L": L, "S": arrays["rope"].shape[0]}
    if cfg.page_size:
        symbols["pages"] = arrays["k_cache"].shape[1]
        symbols["max_pages"] = arrays["block_table"].shape[1]
    if check:
        B = symbols["B"]
        check_tokens(arrays["tokens"], cfg.vocab)
        at = check_lengths(arrays["lengths"], B, L) if cfg.ragged else np.full(B, L)
        if cfg.page_size:
            check_block_table(arrays["block_table"], cfg.page_size, symbols["pages"], at)
    return symbols


def _input_lengths(cfg: LlamaConfig, lengths: Any, B: int, L: int, caller: str) -> Any:
    """The positions an input builder writes: ``lengths`` checked (default
    ``L`` for every sequence) with ``cfg.ragged``, else None; ``lengths``
    without ``cfg.ragged`` is refused, naming ``caller``."""
    if cfg.ragged:
        return check_lengths([L] * B if lengths is None else lengths, B, L)
    if lengths is not None:
        raise GraphError(f"{caller}: lengths are a ragged batch's (LlamaConfig.ragged)")
    return None


def numpy_inputs(
    cfg: LlamaConfig,
    weights: Mapping[str, np.ndarray],
    tokens: np.ndarray,
    L: int,
    S: int,
    seed: int = 1,
    lengths: Any = None,
) -> dict[str, np.ndarray]:
    """Every graph tensor for a step at context ``L`` (capacity ``S``): the
    weights, ``tokens``, the rope table, caches holding random keys and
    values at positions ``< L``, the rest zeroed (bf16 as uint16). With
    ``cfg.ragged``, ``lengths`` (default: ``L`` for every sequence; checked
    by :func:`check_lengths`) and the caches random below each sequence's
    position only. With ``cfg.page_size``, the same values in a pool of
    ``B * ceil(S / page_size)`` pages dealt at random (:func:`page_table`)."""
    B = len(tokens)
    check_tokens(tokens, cfg.vocab)
    for key, value, low in (("S", S, 1), ("L", L, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise GraphError(f"numpy_inputs: {key} must be an int >= {low}, got {value!r}")
    if L >= S:
        raise GraphError(f"numpy_inputs: position L={L} is past the cache's capacity S={S}")
    if cfg.page_size:  # the contiguous config's values, moved to pages
        plain = dataclasses.replace(cfg, page_size=0)
        arrays = numpy_inputs(plain, weights, tokens, L, S, seed, lengths)
        arrays["block_table"] = page_table(B, -(-S // cfg.page_size), seed)
        for k in ("k_cache", "v_cache"):
            arrays[k] = to_pages(arrays[k], arrays["block_table"], cfg.page_size)
        return arrays
    storage = {"bf16": np.uint16, "i32": np.int32, "i64": np.int64, "f32": np.float32}
    arrays = {
        n: np.zeros(shape, storage[dt]) for n, (shape, dt) in tensor_shapes(cfg, B, L, S).items()
    }
    for k, v in _graph_weights_checked(cfg, weights, "numpy_inputs").items():
        arrays[k][...] = v
    arrays["tokens"][...] = tokens
    arrays["rope"][...] = rope_table(cfg, S)
    rng = np.random.default_rng(seed)
    for k in ("k_cache", "v_cache"):
        arrays[k][:, :, :, :L] = f32_to_bf16(
            rng.standard_normal(arrays[k][:, :, :, :L].shape).astype(np.float32)
        )
    at = _input_lengths(cfg, lengths, B, L, "numpy_inputs")
    if at is not None:
        arrays["lengths"][...] = at
        for b, p in enumerate(at):
            arrays["k_cache"][:, b, :, p:] = arrays["v_cache"][:, b, :, p:] = 0
    return arrays


def torch_inputs(
    cfg: LlamaConfig,
    weights: Mapping[str, Any],
    B: int,
    L: int,
    S: int,
    device: str = "cuda",
    *,
    fill_cache: bool = True,
    seed: int = 1,
    lengths: Any = None,
) -> dict[str, Any]:
    """Every graph tensor on ``device`` for a step at context ``L``: the
    (torch) weights shared, not copied, except that under ``cfg.fold_norms``
    raw ``wqkv``/``wgu`` are folded into new tensors on every call (pass
    :func:`graph_weights`' result to fold once); caches random at positions
    ``< L`` when ``fill_cache``; tokens random; the rest zeroed. With
    ``cfg.ragged``, ``lengths`` (default ``L`` for every sequence, checked by
    :func:`check_lengths`). With ``cfg.page_size`` a pool of ``B *
    ceil(S / page_size)`` pages dealt at random, every page random."""
    import torch

    at = _input_lengths(cfg, lengths, B, L, "torch_inputs")

    weights = _graph_weights_checked(cfg, weights, "torch_inputs")
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, Any] = {}
    for name, (shape, dt) in tensor_shapes(cfg, B, L, S).items():
        if name in weights:
            out[name] = weights[name]
        elif name == "rope":
            out[name] = torch.from_numpy(rope_table(cfg, S)).to(device)
        else:
            out[name] = torch.zeros(shape, dtype=torch_dtype(dt), device=device)
    out["tokens"].random_(0, cfg.vocab, generator=gen)
    if at is not None:
        out["lengths"].copy_(torch.from_numpy(at))
    if cfg.page_size:
        table = page_table(B, out["block_table"].shape[1], seed)
        out["block_table"].copy_(torch.from_numpy(table))
    if fill_cache and L:
        for k in ("k_cache", "v_cache"):
            # A paged pool: every page random (a sequence reads its own rows below L).
            rows = out[k] if cfg.page_size else out[k][:, :, :, :L]
            rows.normal_(generator=gen)
    return out


# -- PyTorch: Hugging Face's model and a minimal decode step ------------------------


def hf_config(cfg: LlamaConfig, max_positions: int = 131072) -> Any:
    """``transformers.LlamaConfig`` with these sizes (tied embeddings)."""
    from transformers import LlamaConfig as HFConfig

    scaling = None
    if cfg.rope_scaling is not None:
        factor, low, high, old = cfg.rope_scaling
        scaling = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": old,
        }
    return HFConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.inter,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.eps,
        rope_theta=cfg.rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        torch_dtype="bfloat16",
    )


def hf_state_dict(cfg: LlamaConfig, weights: Mapping[str, Any]) -> dict[str, Any]:
    """The graph's (torch) weights under ``LlamaForCausalLM``'s names."""
    H, NH, KV, D, II = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.inter
    sd = {"model.embed_tokens.weight": weights["embed"], "lm_head.weight": weights["embed"]}
    norms = weights["norms"]
    for layer in range(cfg.layers):
        p = f"model.layers.{layer}."
        wqkv = weights["wqkv"][layer]
        sd[p + "self_attn.q_proj.weight"] = wqkv[: NH * D]
        sd[p + "self_attn.k_proj.weight"] = wqkv[NH * D : (NH + KV) * D]
        sd[p + "self_attn.v_proj.weight"] = wqkv[(NH + KV) * D :]
        sd[p + "self_attn.o_proj.weight"] = weights["wo"][layer]
        sd[p + "mlp.gate_proj.weight"] = weights["wgu"][layer][:II]
        sd[p + "mlp.up_proj.weight"] = weights["wgu"][layer][II:]
        sd[p + "mlp.down_proj.weight"] = weights["wd"][layer]
        sd[p + "input_layernorm.weight"] = norms[2 * layer]
        sd[p + "post_attention_layernorm.weight"] = norms[2 * layer + 1]
    sd["model.norm.weight"] = norms[2 * cfg.layers]
    assert all(v.shape[-1] in (H, NH * D, II) for v in sd.values())
    return sd


def from_hf_state_dict(cfg: LlamaConfig, sd: Mapping[str, Any]) -> dict[str, Any]:
    """A ``LlamaForCausalLM`` state dict (numpy or torch tensors) in the
    graph's layout: the inverse of :func:`hf_state_dict`. Per-layer weights
    are stacked; a missing ``lm_head.weight`` means tied embeddings. An
    untied LM head that differs from the embedding is refused (the graph's
    LM head is the embedding)."""

    def stack(parts: list[Any]) -> Any:
        if hasattr(parts[0], "detach"):
            import torch

            return torch.stack([p.detach() for p in parts])
        return np.stack(parts)

    def cat(parts: list[Any]) -> Any:
        if hasattr(parts[0], "detach"):
            import torch

            return torch.cat([p.detach() for p in parts])
        return np.concatenate(parts)

    def get(name: str) -> Any:
        if name not in sd:
            raise GraphError(f"state dict has no '{name}' (a Llama with {cfg.layers} layers?)")
        return sd[name]

    layers = range(cfg.layers)
    p = "model.layers.{}."
    out = {
        "embed": get("model.embed_tokens.weight"),
        "wqkv": stack(
            [cat([get(p.format(i) + f"self_attn.{x}_proj.weight") for x in "qkv"]) for i in layers]
        ),
        "wo": stack([get(p.format(i) + "self_attn.o_proj.weight") for i in layers]),
        "wgu": stack(
            [
                cat([get(p.format(i) + f"mlp.{x}_proj.weight") for x in ("gate", "up")])
                for i in layers
            ]
        ),
        "wd": stack([get(p.format(i) + "mlp.down_proj.weight") for i in layers]),
        "norms": stack(
            [
                get(p.format(i) + f"{x}_layernorm.weight")
                for i in layers
                for x in ("input", "post_attention")
            ]
            + [get("model.norm.weight")]
        ),
    }
    head = sd.get("lm_head.weight")
    if head is not None and head is not out["embed"]:
        same = (head == out["embed"]).all()
        if not bool(same):
            raise GraphError(
                "lm_head.weight differs from the embedding: the graph's LM head is the "
                "(tied) embedding, as in Llama-3.2-1B"
            )
    for name, shape in {**_weight_shapes(cfg), "norms": (2 * cfg.layers + 1, cfg.hidden)}.items():
        if tuple(out[name].shape) != shape:
            raise GraphError(
                f"state dict gives {name} of shape {tuple(out[name].shape)}, the configuration "
                f"needs {shape}"
            )
    return out


def config_from_hf(hf: Any, **tiles: Any) -> LlamaConfig:
    """A :class:`LlamaConfig` from a ``transformers.LlamaConfig`` or its
    ``config.json`` as a dict (sizes, eps, RoPE theta and Llama 3 scaling);
    ``tiles`` override tile sizes. A missing size is a GraphError naming it."""
    if isinstance(hf, Mapping):
        from types import SimpleNamespace

        hf = SimpleNamespace(**hf)
    for key in (
        "num_attention_heads", "hidden_size", "num_hidden_layers", "intermediate_size",
        "vocab_size", "rms_norm_eps",
    ):  # fmt: skip
        if getattr(hf, key, None) is None:
            raise GraphError(f"config_from_hf: the Hugging Face config has no {key!r}")
    scaling = getattr(hf, "rope_scaling", None)
    rope = None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "llama3":
            raise GraphError(f"RoPE scaling {kind!r} is not supported (only 'llama3' or none)")
        rope = (
            float(scaling["factor"]),
            float(scaling["low_freq_factor"]),
            float(scaling["high_freq_factor"]),
            int(scaling["original_max_position_embeddings"]),
        )
    heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    tiles.setdefault("combine_group", math.gcd(LlamaConfig.combine_group, heads))
    return LlamaConfig(
        hidden=hf.hidden_size,
        layers=hf.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        inter=hf.intermediate_size,
        vocab=hf.vocab_size,
        eps=hf.rms_norm_eps,
        rope_theta=float(getattr(hf, "rope_theta", 10000.0)),
        rope_scaling=rope,
        **tiles,
    )


def torch_decode_step(cfg: LlamaConfig, t: Mapping[str, Any], L: int) -> Any:
    """A minimal PyTorch decode step over the graph's buffers (the baseline):
    reads ``tokens``, writes the caches at ``L``, ``logits`` and
    ``next_tokens``, returns the next tokens.
    Same math and rounding points as the graph (bf16 ops, fp32 softmax). With
    ``cfg.fold_norms`` the buffers hold ``wqkv_folded`` and ``wgu_folded``
    (:func:`torch_inputs`), so the layer norms apply no weight. ``k_cache``
    and ``v_cache`` may also be lists of one cache a layer (what
    ``torch.compile`` updates in place: a layer's slice of one buffer it
    rewrites whole). With ``cfg.ragged`` sequence ``b`` is at position
    ``min(lengths[b], L)``: its RoPE row and cache row, and a mask over the
    positions past it."""
    import torch
    import torch.nn.functional as F

    if cfg.page_size:
        raise GraphError(
            f"torch_decode_step: page_size={cfg.page_size}: the PyTorch baseline reads a "
            "contiguous cache (compare a paged kernel with the simulator or reference_step)"
        )
    NH, KV, D, II = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.inter
    B = t["tokens"].shape[0]
    mask = None
    if cfg.ragged:  # per sequence: (B, D) rows, a (B, 1, 1, L + 1) mask
        at = t["lengths"].long().clamp(max=L)
        cos, sin = t["rope"][at].to(torch.bfloat16).chunk(2, dim=-1)
        positions = torch.arange(L + 1, device=at.device)
        mask = (positions[None, :] <= at[:, None])[:, None, None, :]
    else:
        cos, sin = t["rope"][L].to(torch.bfloat16).chunk(2)
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    # q is (B, NH, 1, D) and k (B, KV, D): a sequence's row broadcast to each.
    q_cs = (cos[:, None, None], sin[:, None, None]) if cfg.ragged else (cos, sin)
    k_cs = (cos[:, None], sin[:, None]) if cfg.ragged else (cos, sin)

    def norm(h, w):
        hf = h.float()
        x = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + cfg.eps)).to(h.dtype)
        return x if w is None else w * x

    # fold_norms: the buffers' wqkv and wgu hold the layer norms' weights.
    layer_norms = None if cfg.fold_norms else t["norms"]

    def rope(x, cs):
        rot = torch.cat([-x[..., D // 2 :], x[..., : D // 2]], dim=-1)
        return x * cs[0] + rot * cs[1]

    w = {k: _row_weight(cfg, t, k) for k in _CHUNKED}  # nn.Linear rows (copies if chunked)
    h = t["embed"][t["tokens"].long()]
    for layer in range(cfg.layers):
        x = norm(h, None if layer_norms is None else layer_norms[2 * layer])
        qkv = x @ w["wqkv"][layer].t()
        q = rope(qkv[:, : NH * D].view(B, NH, 1, D), q_cs)
        k = rope(qkv[:, NH * D : (NH + KV) * D].view(B, KV, D), k_cs)
        v = qkv[:, (NH + KV) * D :].view(B, KV, D)
        kc, vc = t["k_cache"][layer], t["v_cache"][layer]
        if mask is None:
            kc[:, :, L] = k
            vc[:, :, L] = v
        else:
            rows = torch.arange(B, device=at.device)
            kc[rows, :, at] = k
            vc[rows, :, at] = v
        keys = kc[:, :, : L + 1]
        vals = vc[:, :, : L + 1]
        o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=True)
        h = h + o.reshape(B, NH * D) @ w["wo"][layer].t()
        x = norm(h, None if layer_norms is None else layer_norms[2 * layer + 1])
        gu = x @ w["wgu"][layer].t()
        h = h + (F.silu(gu[:, :II]) * gu[:, II:]) @ w["wd"][layer].t()
    x = norm(h, t["norms"][2 * cfg.layers])
    torch.matmul(x, t["embed"].t(), out=t["logits"])
    nxt = t["logits"].argmax(dim=-1)
    t["next_tokens"].copy_(nxt)
    return nxt

"""Decoder tiles of a Llama-style model (ETC issue 7): embedding, RMSNorm,
grouped-query decode attention (flash-decoding splits), the split combine
and the greedy arg-max.

Device functions written as MLIR text (one CTA of ``block_size`` threads,
upstream dialects only) with numpy references that round as the tiles do.
bf16 tensors are ``uint16`` bit patterns in numpy (:mod:`etc.dtypes`); all
arithmetic is fp32 (``arith.extf`` / ``arith.truncf``, round to nearest even).

* ``embed(BM, BN, H)``, grid ``(ceil(B/BM), ceil(H/BN))``:
  ``h[r, c] = E[tokens[r], c]``.
* ``rmsnorm(H, gamma_stride, gamma_offset, eps)``, grid ``(layers, B)``:
  Hugging Face's ``LlamaRMSNorm`` of row ``b`` with gamma row
  ``gamma_stride * l + gamma_offset``.
* ``attention(chunk, NH, KV, D, layers)``, grid ``(layers, B, KV,
  ceil((L+1)/chunk))``: RoPE of the new token's q and k, the cache write of
  k and v (split 0), and one split of the softmax attention of the ``G =
  NH/KV`` query heads of a kv head over positions ``[s*chunk,
  min(s*chunk + chunk, L+1))``: unnormalised output, max and sum.
* ``attention_combine(NH, D)``, grid ``(layers, B)``: merges the splits into
  ``attn[b, h*D + d]`` (bf16).
* ``argmax(V)``, grid ``(B,)``: the first index of the largest logit.

Buffers are row-major and 16-byte aligned (H, D and V multiples of 8).
"""

from __future__ import annotations

import math
import textwrap

import numpy as np

from .._fields import checked_arguments
from ..device import CLUSTER_SIZES, DeviceFunction
from ..dtypes import bf16_to_f32, f32_to_bf16
from ..errors import GraphError
from . import _paged, _text

__all__ = [
    "embed",
    "rmsnorm",
    "attention",
    "attention_online",
    "attention_combine",
    "argmax",
    "argmax_merge",
    "rope_table",
    "rope_bf16",
    "PHASED_STAMPS",
]

_WG = "#gpu.address_space<workgroup>"
#: Shared memory one attention tile may use.
ATTENTION_SMEM_LIMIT = 40 * 1024
#: The max an empty attention split reports (its sum and output are 0).
EMPTY_MAX = -1.0e30
#: ``attention(stamps=True)``: what each of a split's stamp words holds
#: (thread 0's ``%clock64``, then ``%globaltimer`` in ns, then a count).
PHASED_STAMPS = (
    "entry",  # the body's entry (after the waits and the join; K and V copies issued)
    "roped",  # step 1's barrier: the queries, k and v roped into workgroup memory
    "scored",  # step 2's barrier: the scores in workgroup memory
    "softmaxed",  # step 3's barrier: exponentials, max and sum written
    "valued",  # step 4's barrier: every warp's output sums in workgroup memory
    "partials",  # thread 0's share of the output partials stored
    "counted",  # (combine) the count's atomic seen by the whole CTA
    "merge_loaded",  # (the merging split) thread 0's splits loaded and folded
    "merge_folded",  # (the merging split) thread 0's lanes merged by shuffles
    "k_ready",  # thread 0's K copies awaited (stage_kv), before its scores
    "end",  # after a barrier closing the body (and the merge, if this split merged)
    "entry_ns",
    "end_ns",
    "count",  # (combine) the count this split brought the group to (= splits: it merged)
)


_positive = _text.positive
_check_block = _text.check_block


def _multiple_of_8(name: str, **values: int) -> None:
    for key, value in values.items():
        if value % 8:
            raise GraphError(
                f"tile '{name}': {key}={value} must be a multiple of 8 (16-byte bf16 loads)"
            )


def _f32(value: float) -> str:
    """An f32 MLIR literal that round-trips exactly."""
    return f"{float(np.float32(value)):.9e}"


def _warp_reduce(value: str, kind: str, offsets, prefix: str, indent: str) -> tuple[str, str]:
    """A butterfly reduction of f32 `value` over `gpu.shuffle xor` offsets
    (`%c<o>_i32` must exist for each, and `%c32_i32`). `kind` is the arith
    op (addf / maximumf). Returns (ops, result)."""
    lines = []
    for k, off in enumerate(offsets):
        lines.append(
            f"{indent}%{prefix}s{k}, %{prefix}ok{k} = gpu.shuffle xor {value}, %c{off}_i32, "
            f"%c32_i32 : f32\n"
            f"{indent}%{prefix}r{k} = arith.{kind} {value}, %{prefix}s{k} : f32"
        )
        value = f"%{prefix}r{k}"
    return "\n".join(lines), value


def _offset_constants(offsets) -> str:
    return "\n".join(f"  %c{o}_i32 = arith.constant {o} : i32" for o in sorted(set(offsets)))


# ----------------------------------------------------------------------------
# embed
# ----------------------------------------------------------------------------
@checked_arguments
def embed(
    block_m: int,
    block_n: int,
    hidden: int,
    *,
    name: str = "embed",
    block_size: int = 256,
    sums: bool = False,
    counters: bool = False,
) -> DeviceFunction:
    """Tile ``(i, j)``: ``h[r, c] = E[tokens[r], c]`` for rows ``[i*BM,
    min((i+1)*BM, B))`` and columns ``[j*BN, min((j+1)*BN, H))``.

    The CTA walks (row, 8-column chunk) pairs, one 16-byte load and store per
    thread per step. Args: ``tokens: memref<?xi32>``, ``E: memref<?xHxbf16>``,
    ``h: memref<?xHxbf16>``. A token outside ``0..V-1`` (``V`` the rows of
    ``E``) is taken as ``V - 1``, so a bad one never reads past the table.

    ``sums``: one more arg ``S: memref<?x?xi64>`` (slots x rows, fixed
    point: :data:`etc.tiles._text.SUM_BITS`); the tiles of each row block
    store each row's sum of squares of ``h`` in ``S[0, r]`` (a warp per
    row, the rows dealt over the tiles) and zero ``S[1:, r]``, which the
    layers' residual epilogues then add to (``layer_gemm(sums_out=...)``).

    ``counters``: one more arg (after ``S``) ``C: memref<?x?x?xi32>``
    (layers x rows x kv heads); the column-0 tile zeroes ``C[:, r, :]`` of
    its rows: the split counters of ``attention(combine=True)``, reset at
    the start of every step.
    """
    _check_block(name, block_size)
    _positive(name, block_m=block_m, block_n=block_n, hidden=hidden)
    _multiple_of_8(name, hidden=hidden, block_n=block_n)
    BM, BN, H = block_m, block_n, hidden
    t_t, x_t = "memref<?xi32>", f"memref<?x{H}xbf16>"
    s_t = _text.SUMS_TYPE
    c_t = "memref<?x?x?xi32>"
    extra_args = (f", %S: {s_t}" if sums else "") + (f", %C: {c_t}" if counters else "")
    col_tiles = -(-H // BN)  # the tiles of a row block with columns
    extra_lines = _embed_sums(block_size, H, x_t, t_t, s_t, col_tiles) if sums else ""
    if counters:
        extra_lines += _embed_zero_counters(block_size, c_t)
    source = f"""\
// {name}: h[r, c] = E[tokens[r], c], {BM} rows x {BN} columns (hidden {H}) per CTA of {block_size}.
func.func @{name}(%i: index, %j: index, %tok: {t_t}, %E: {x_t}, %h: {x_t}{extra_args}) {{
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %cBS = arith.constant {block_size} : index
  %cBM = arith.constant {BM} : index
  %cBN = arith.constant {BN} : index
  %cH = arith.constant {H} : index
  %tid = gpu.thread_id x
  %B = memref.dim %h, %c0 : {x_t}
  // A token outside the vocabulary (a negative one included) reads the last
  // row: wrong, but never a read past the table (llama.check_tokens).
  %vocab = memref.dim %E, %c0 : {x_t}
  %c1v = arith.constant 1 : index
  %vlast = arith.subi %vocab, %c1v : index
  %r0 = arith.muli %i, %cBM : index
  %r1a = arith.addi %r0, %cBM : index
  %r1b = arith.minui %r1a, %B : index
  %r1 = arith.maxui %r1b, %r0 : index
  %nr = arith.subi %r1, %r0 : index
  %col0 = arith.muli %j, %cBN : index
  %col1a = arith.addi %col0, %cBN : index
  %col1b = arith.minui %col1a, %cH : index
  %col1 = arith.maxui %col1b, %col0 : index
  %ncols = arith.subi %col1, %col0 : index
  %nch = arith.divui %ncols, %c8 : index
  %total = arith.muli %nr, %nch : index
  scf.for %q = %tid to %total step %cBS {{
    %dr = arith.divui %q, %nch : index
    %ch = arith.remui %q, %nch : index
    %cc = arith.muli %ch, %c8 : index
    %col = arith.addi %col0, %cc : index
    %r = arith.addi %r0, %dr : index
    %t_i32 = memref.load %tok[%r] : {t_t}
    %t_u = arith.index_castui %t_i32 : i32 to index
    %t = arith.minui %t_u, %vlast : index
    %v = vector.load %E[%t, %col] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>
    vector.store %v, %h[%r, %col] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>
  }}
{extra_lines}  return
}}
"""

    def reference(i: int, j: int, tok: np.ndarray, E: np.ndarray, h: np.ndarray, *extra) -> None:
        tok = clamped_tokens(tok, E.shape[0])
        r0, r1 = i * BM, min((i + 1) * BM, h.shape[0])
        c0, c1 = j * BN, min((j + 1) * BN, H)
        if r0 >= r1 or c0 >= c1:
            return
        h[r0:r1, c0:c1] = E[tok[r0:r1].astype(np.int64), c0:c1]
        if sums:
            warps = block_size // 32
            mine = [r for r in range(r0, r1) if ((r - r0) // warps) % col_tiles == j]
            rows = bf16_to_f32(E[tok[mine].astype(np.int64)])
            extra[0][0, mine] = _text.fixed_reference((rows * rows).sum(axis=1, dtype=np.float32))
            extra[0][1:, mine] = 0
        if counters and j == 0:
            extra[-1][:, r0:r1, :] = 0

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def clamped_tokens(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """The rows :func:`embed` reads for ``tokens``: a token outside
    ``0..vocab-1`` (as unsigned, so a negative one too) is ``vocab - 1``."""
    unsigned = np.asarray(tokens).astype(np.int64) & 0xFFFFFFFF
    return np.minimum(unsigned, vocab - 1)


def _embed_zero_counters(block_size: int, c_t: str) -> str:
    """Lines of :func:`embed` with ``counters``: tile column 0 zeroes
    ``C[:, r, :]`` for its rows (thread per (layer, kv head) pair)."""
    return f"""\
  %zj0 = arith.cmpi eq, %j, %c0 : index
  scf.if %zj0 {{
    %z_c1 = arith.constant 1 : index
    %z_c2 = arith.constant 2 : index
    %z_zero = arith.constant 0 : i32
    %z_nl = memref.dim %C, %c0 : {c_t}
    %z_kv = memref.dim %C, %z_c2 : {c_t}
    %z_per = arith.muli %z_nl, %z_kv : index
    %z_all = arith.muli %z_per, %nr : index
    scf.for %zq = %tid to %z_all step %cBS {{
      %z_row = arith.divui %zq, %z_per : index
      %z_rest = arith.remui %zq, %z_per : index
      %z_l = arith.divui %z_rest, %z_kv : index
      %z_g = arith.remui %z_rest, %z_kv : index
      %z_r = arith.addi %r0, %z_row : index
      memref.store %z_zero, %C[%z_l, %z_r, %z_g] : {c_t}
    }}
  }}
"""


def _embed_sums(block_size: int, H: int, x_t: str, t_t: str, s_t: str, col_tiles: int) -> str:
    """Lines of :func:`embed` with ``sums``: a warp per row, the rows of a
    row block dealt over its ``col_tiles`` tiles with columns (tile ``j``'s
    warp ``w`` takes rows ``j * warps + w + m * col_tiles * warps``), so no
    warp walks more than one row while there are enough tiles (one tile
    walking 64 rows, 8 a warp, took 17 µs of a B = 64 step on an H200)."""
    warps = block_size // 32
    red, total = _text.warp_sum("%part", "      ")
    fixed_ops, fixed = _text.to_fixed(total, "sfx", "        ")
    return f"""\
  %s_tiles = arith.constant {col_tiles} : index
  %sj0 = arith.cmpi ult, %j, %s_tiles : index
  scf.if %sj0 {{
    %s_warps = arith.constant {warps} : index
    %s_c1 = arith.constant 1 : index
    %c32 = arith.constant 32 : index
    %s_c256 = arith.constant 256 : index
    %s_zero = arith.constant 0.0 : f32
    %s_zero64 = arith.constant 0 : i64
    %c32_i32 = arith.constant 32 : i32
{_text.shuffle_constants("    ")}
    %s_slots = memref.dim %S, %c0 : {s_t}
    %s_wp = arith.divui %tid, %c32 : index
    %s_lane = arith.remui %tid, %c32 : index
    %s_k0 = arith.muli %s_lane, %c8 : index
    %s_jw = arith.muli %j, %s_warps : index
    %s_first = arith.addi %s_jw, %s_wp : index
    %s_step = arith.muli %s_tiles, %s_warps : index
    scf.for %sr = %s_first to %nr step %s_step {{
      %r = arith.addi %r0, %sr : index
      %t_i32 = memref.load %tok[%r] : {t_t}
      %t_u = arith.index_castui %t_i32 : i32 to index
      %t = arith.minui %t_u, %vlast : index
      %part = scf.for %k = %s_k0 to %cH step %s_c256 iter_args(%acc = %s_zero) -> (f32) {{
        %v = vector.load %E[%t, %k] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>
        %f = arith.extf %v : vector<8xbf16> to vector<8xf32>
        %sq = arith.mulf %f, %f : vector<8xf32>
        %red = vector.reduction <add>, %sq : vector<8xf32> into f32
        %next = arith.addf %acc, %red : f32
        scf.yield %next : f32
      }}
{red}
      %lane0 = arith.cmpi eq, %s_lane, %c0 : index
      scf.if %lane0 {{
{fixed_ops}
        memref.store {fixed}, %S[%c0, %r] : {s_t}
      }}
      %zs = arith.addi %s_lane, %s_c1 : index
      scf.for %slot = %zs to %s_slots step %c32 {{
        memref.store %s_zero64, %S[%slot, %r] : {s_t}
      }}
    }}
  }}
"""


# ----------------------------------------------------------------------------
# rmsnorm
# ----------------------------------------------------------------------------
@checked_arguments
def rmsnorm(
    hidden: int,
    gamma_stride: int = 1,
    gamma_offset: int = 0,
    eps: float = 1e-5,
    *,
    name: str = "rmsnorm",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``(l, b)``: ``x[b] = bf16(gamma[row] * bf16(h[b] * rsqrt(mean(h[b]**2) + eps)))``
    with ``row = gamma_stride * l + gamma_offset`` (Hugging Face's
    ``LlamaRMSNorm`` rounding; fp32 statistics).

    One CTA per row: 16-byte loads, a shuffle butterfly per warp, per-warp
    sums in workgroup memory (``@<name>__warp_sums``) that every thread adds
    up, then the row is read again (from L1/L2) and scaled. ``math.rsqrt``
    lowers to ``rsqrt.approx.f32``. Args: ``h, gamma, x: memref<?xHxbf16>``.
    """
    warps = _check_block(name, block_size)
    _positive(name, hidden=hidden)
    _multiple_of_8(name, hidden=hidden)
    _text.non_negative(name, gamma_stride=gamma_stride, gamma_offset=gamma_offset)
    _text.check_eps(name, eps)
    H = hidden
    x_t = f"memref<?x{H}xbf16>"
    sm_t = f"memref<{warps}xf32, {_WG}>"
    shuffles, total = _text.warp_sum("%sq", "  ")
    source = f"""\
// {name}: x[b] = gamma[{gamma_stride}*l + {gamma_offset}] * rmsnorm(h[b]) (hidden {H}, eps {eps!r}), one CTA of {block_size}.
memref.global "private" @{name}__warp_sums : {sm_t} {{alignment = 16 : i64}}
func.func @{name}(%l: index, %b: index, %h: {x_t}, %gamma: {x_t}, %x: {x_t}) {{
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %c32 = arith.constant 32 : index
  %cH = arith.constant {H} : index
  %cStride = arith.constant {8 * block_size} : index
  %cGS = arith.constant {gamma_stride} : index
  %cGO = arith.constant {gamma_offset} : index
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %zero8 = arith.constant dense<0.0> : vector<8xf32>
  %fH = arith.constant {_f32(H)} : f32
  %eps = arith.constant {_f32(eps)} : f32
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_lane0 = arith.cmpi eq, %lane, %c0 : index
  %gl = arith.muli %l, %cGS : index
  %row = arith.addi %gl, %cGO : index
  %first = arith.muli %tid, %c8 : index
  %acc = scf.for %k = %first to %cH step %cStride iter_args(%part = %zero8) -> (vector<8xf32>) {{
    %v = vector.load %h[%b, %k] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>
    %f = arith.extf %v : vector<8xbf16> to vector<8xf32>
    %next = vector.fma %f, %f, %part : vector<8xf32>
    scf.yield %next : vector<8xf32>
  }}
  %sq = vector.reduction <add>, %acc : vector<8xf32> into f32
{shuffles}
  %ws = memref.get_global @{name}__warp_sums : {sm_t}
  // A previous call on this CTA may still be reading the warp sums.
  gpu.barrier
  scf.if %is_lane0 {{
    memref.store {total}, %ws[%warp] : {sm_t}
  }}
  gpu.barrier
  %parts = vector.load %ws[%c0] {{alignment = 16 : i64}} : {sm_t}, vector<{warps}xf32>
  %ss = vector.reduction <add>, %parts : vector<{warps}xf32> into f32
  %mean = arith.divf %ss, %fH : f32
  %shifted = arith.addf %mean, %eps : f32
  %inv = math.rsqrt %shifted : f32
  %inv8 = vector.broadcast %inv : f32 to vector<8xf32>
  scf.for %k = %first to %cH step %cStride {{
    %v = vector.load %h[%b, %k] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>
    %f = arith.extf %v : vector<8xbf16> to vector<8xf32>
    %n = arith.mulf %f, %inv8 : vector<8xf32>
    %nb = arith.truncf %n : vector<8xf32> to vector<8xbf16>
    %nf = arith.extf %nb : vector<8xbf16> to vector<8xf32>
    %g = vector.load %gamma[%row, %k] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>
    %gf = arith.extf %g : vector<8xbf16> to vector<8xf32>
    %y = arith.mulf %gf, %nf : vector<8xf32>
    %yb = arith.truncf %y : vector<8xf32> to vector<8xbf16>
    vector.store %yb, %x[%b, %k] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>
  }}
  return
}}
"""
    eps32 = np.float32(eps)

    def reference(l: int, b: int, h: np.ndarray, gamma: np.ndarray, x: np.ndarray) -> None:  # noqa: E741
        hf = bf16_to_f32(h[b])
        mean = np.float32(np.dot(hf, hf)) / np.float32(H)
        inv = np.float32(1) / np.sqrt(np.float32(mean + eps32))
        normed = bf16_to_f32(f32_to_bf16(hf * inv))
        x[b] = f32_to_bf16(bf16_to_f32(gamma[gamma_stride * l + gamma_offset]) * normed)

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


# ----------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------
def rope_table(positions: int, head_dim: int, theta: float = 500000.0) -> np.ndarray:
    """The ``rope`` buffer of :func:`attention` for positions ``[0, positions)``:
    row p = ``[cos(p*f_0..f_{D/2-1}), sin(p*f_0..f_{D/2-1})]`` with ``f_i =
    theta**(-2i/D)``, rounded to bf16 values, stored as float32. (Plain RoPE;
    Llama 3.2's frequency scaling would change ``f`` only.)"""
    half = head_dim // 2
    freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
    ang = np.arange(positions, dtype=np.float64)[:, None] * freq[None, :]
    table = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    return bf16_to_f32(f32_to_bf16(table))


def rope_bf16(x: np.ndarray, cos_sin: np.ndarray) -> np.ndarray:
    """RoPE (rotate_half) of bf16 bits ``x`` (..., D) with one row of the
    rope table, computed in float32 and rounded to bf16 as the tile does."""
    xf = bf16_to_f32(x)
    half = xf.shape[-1] // 2
    c = cos_sin[:half].astype(np.float32)
    sn = cos_sin[half:].astype(np.float32)
    lo, hi = xf[..., :half], xf[..., half:]
    out = np.concatenate([lo * c - hi * sn, hi * c + lo * sn], axis=-1)
    return f32_to_bf16(out)


@checked_arguments
def attention(
    chunk: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    layers: int,
    *,
    unroll: int = 4,
    name: str = "attention",
    block_size: int = 256,
    stage_kv: bool = False,
    stage_v: bool = False,
    prefetch_kv: bool | str = False,
    combine: bool = False,
    spread: bool = False,
    merge_unroll: int = 1,
    stamps: bool = False,
    one_pass: bool = False,
    lengths: bool = False,
    page_size: int = 0,
    cluster: int = 0,
) -> DeviceFunction:
    """Tile ``(l, b, g, s)``: split ``s`` of the decode attention of kv head
    ``g``'s ``G = heads/kv_heads`` query heads (flash-decoding).

    Args: ``L: index`` (cached tokens = the new token's position), ``qkv:
    memref<?xQxbf16>`` (Q = (NH + 2 KV) D), ``rope: memref<?xDxf32>``,
    ``kc, vc: memref<LAYERSx?xKVx?xDxbf16>``, ``opart: memref<?xNHx?xDxf32>``,
    ``mpart: memref<?xNHx?x2xf32>``.

    1. RoPE of the G query heads and of k (fp32 from bf16, rounded to bf16)
       into workgroup memory with v; split 0 writes k and v to the caches at
       position L. A thread takes 8 dims of a row and their rotate-half
       partners (16-byte loads, all issued at once: one round trip).
    2. Scores: a row of K (D bf16 = D/8 16-byte chunks) is read by D/8
       adjacent lanes, so each warp load instruction reads 32/(D/8) whole
       rows (coalesced); each lane keeps its 8 dims of the G queries in
       registers, the D/8 lanes of a row add their partial dots with
       shuffles. ``unroll`` row groups are loaded before any is used (more
       loads in flight). Position L uses the k computed in step 1, never the
       cache (another instance is writing it). Scores go to workgroup memory.
    3. Softmax: warp t (of each G) takes head t: max, ``exp(score - max)``
       in place, sum; lane 0 writes ``mpart``.
    4. Output: V rows read as K; each lane accumulates ``e_p * v_p`` for its
       8 dims and G heads, warps reduce their row groups with shuffles and
       sum across warps through workgroup memory into ``opart``.

    An empty split (``s*chunk > L``) writes max -1e30, sum 0, output 0.
    Workgroup memory: ``4 * ((G+2) D + G chunk + warps G D)`` bytes.

    ``stage_kv``: before step 1 every thread issues ``cp.async`` copies of
    all the K and V vectors it will read (two groups, into slots of
    workgroup memory only it reads back, so no barrier), and steps 2 and 4
    wait for them: the whole chunk (``2 chunk D`` bytes more workgroup
    memory) is in flight at once, behind the RoPE, instead of ``unroll`` row
    groups at a time.

    ``stage_v``: the same for V alone (``chunk D`` bytes): the values, which
    do not depend on the scores, load while the scores and the softmax run,
    and K keeps the register path.

    ``combine``: two more args, ``count: memref<LAYERSx?xKVxi32>`` (zero at
    the start of the step) and ``attn: memref<?x(NH*D)xbf16>``. After its
    partials, thread 0 of every instance adds 1 to ``count[l, b, g]``
    (acquire-release); the instance that brings it to the number of splits
    merges all splits of the group's ``G`` heads into ``attn`` (what
    ``attention_combine`` does for a whole row), so no combine stage is needed.
    Each lane of the merge loads ``merge_unroll`` of its splits at once
    (:func:`_shared_merge`).

    ``spread``: the grid's ``P`` splits (``opart``'s dim 2) share the ``L``
    cached positions evenly and position ``L`` rides in the split that
    reaches it: split ``s`` covers ``[s*w, min((s+1)*w, L))`` with ``w =
    ceil(L/P)`` rounded up to a multiple of the loop step (``32 * warps /
    (D/8) * unroll`` rows, or ``chunk`` if smaller: a split's cost is its
    number of steps), at most ``chunk`` (the workgroup buffers' capacity:
    ``P >= ceil((L+1)/chunk)`` and ``chunk`` a multiple of the step), and
    the one whose end reaches ``L`` runs to ``L + 1`` (unless ``w`` is
    ``chunk``: then the next split holds position ``L`` alone). So ``P =
    L / w`` splits of whole steps take the new token without a split of
    one position. Trailing splits may be empty. A graph then
    picks ``P`` from the batch size, many short splits for a few sequences
    and few long ones for many, from one artifact.

    ``one_pass``: steps 2-4 as one pass of each warp over its own rows
    (flash-decoding inside the CTA): per loop step a warp's scores, their
    running max and sum over the warp (shuffles across its row groups) and
    each lane's ``e_p * v_p``, rescaled as the max grows; after the loop
    each warp leaves its max, sum and output in workgroup memory, and one
    barrier later thread ``i`` merges the warps' states for its (head, dim)
    into the partials. Two barriers fewer than the phases, no scores in
    workgroup memory, every warp busy in the softmax.

    ``cluster`` (with ``combine``; 2, 4 or 8): a group's splits meet on a
    thread-block cluster of that many CTAs instead of through the L2
    (:attr:`etc.DeviceFunction.cluster`: the grid's last dimension, the
    partials' split count, must be ``cluster``, and the static lists put a
    group's splits on one cluster, split ``s`` on the CTA of rank ``s``).
    The CTA of rank 0 initialises an mbarrier expecting the other splits'
    partial bytes, and every CTA arrives on the cluster barrier; after the
    scores (by then the barrier has usually completed) each CTA waits on it,
    and the others push their softmax states and partial outputs into rank
    0's shared memory with ``st.async`` (each completing bytes on that
    mbarrier) while rank 0 keeps its own there. Rank 0 waits for the bytes,
    merges the splits from its shared memory (:func:`_shared_merge`) and
    invalidates the mbarrier; ``%op``, ``%mp`` and ``%cnt`` are not
    touched (the reference still counts and merges through them). No
    atomic and no L2 round trip between the splits and the merge. The
    other CTAs leave once they have pushed.

    ``stamps`` (a measuring aid, off in every kernel) adds a last argument
    ``stamps: memref<?x?x?x?x14xi64>`` (indexed ``[l, b, g, s]``) into which
    thread 0 writes its clock at :data:`PHASED_STAMPS`' points.

    ``lengths``: sequences at their own positions (a ragged batch). A last
    argument ``lens: memref<?xi32>`` holds them, and sequence ``b`` takes
    position ``min(lens[b], L)`` wherever the tile reads ``L``: its RoPE row,
    the cache row it writes and the positions its splits share. The
    graph's ``L`` is the longest and sizes the splits, so a shorter
    sequence's trailing splits are empty (:func:`etc.tiles._text.with_lengths`).

    ``page_size``: a paged cache (:mod:`etc.tiles._paged`): ``kc`` and ``vc``
    are ``memref<LAYERSxPAGESxKVxPAGE_SIZExDxbf16>`` and a block table
    ``pages: memref<?x?xi32>`` follows the other buffers (before ``lens``):
    position ``p`` of sequence ``b`` is row ``p % page_size`` of page
    ``pages[b, p / page_size]``. 0: the contiguous cache.

    ``prefetch_kv`` (with ``stage_kv``): those copies move into the tile's
    prefetch function ``@<name>__prefetch``, which the kernel runs before the
    instance waits for ``qkv``: the cached positions (all but ``L``) are
    written by earlier steps, so they load while the QKV projection runs.
    ``prefetch_kv="l2"`` (without ``stage_kv``): the prefetch function only
    asks the L2 for the split's cached K and V rows (``prefetch.global.L2``,
    one lane per row), no shared memory: the body's loads, after the wait,
    find them there instead of in HBM.

    Measured on an H200 (Llama-3.2-1B heads, batch 64, L = 4095, one layer,
    attention alone, dynamic schedule): about 310 us for the 537 MB of K and
    V, 1.7 TB/s, with chunk 256 and unroll 2 or 4 (unroll 8: 450 us);
    280 us (1.9 TB/s) with chunk 512 and unroll 4. A
    software-pipelined variant (the next step's rows loaded before the
    current ones are used, the first ones before step 1) needed 160-240
    registers and was no faster, so it is not used.
    """
    warps = _check_attention(
        name, block_size, chunk, heads, kv_heads, head_dim, layers, unroll=unroll
    )
    _paged.check_page_size(name, page_size)
    NH, KV, D, G, U = heads, kv_heads, head_dim, heads // kv_heads, unroll
    if cluster and (cluster not in CLUSTER_SIZES or not combine or one_pass):
        raise GraphError(
            f"tile '{name}': cluster={cluster!r} merges a group's splits on a thread-block "
            f"cluster of {', '.join(map(str, CLUSTER_SIZES))} CTAs, which needs combine=True "
            f"and one_pass=False (combine={combine!r}, one_pass={one_pass!r})"
        )
    if cluster and G * D > block_size:
        raise GraphError(
            f"tile '{name}': cluster={cluster} pushes one partial output a thread: the group's "
            f"{G} heads of {D} must be at most block_size={block_size}"
        )
    RL = D // 8  # lanes per row
    if 32 % RL:
        raise GraphError(
            f"tile '{name}': head_dim={D} must be 8, 16, 32, 64, 128 or 256 "
            "(D/8 lanes read one row)"
        )
    smem = 4 * ((G + 2) * D + G * chunk + warps * G * D)
    if smem > ATTENTION_SMEM_LIMIT:
        raise GraphError(
            f"tile '{name}': chunk={chunk} needs {smem} bytes of workgroup memory "
            f"(more than {ATTENTION_SMEM_LIMIT}); use a smaller chunk"
        )
    RW = 32 // RL  # rows per warp per load
    RC = warps * RW  # rows per CTA per load
    Q = (NH + 2 * KV) * D
    half = D // 2
    RV = min(8, half)  # dims a RoPE item (within a half: its partner is the other half's)
    rv_bf, rv_f = f"vector<{RV}xbf16>", f"vector<{RV}xf32>"
    scale = 1.0 / math.sqrt(D)
    qkv_t, rope_t = f"memref<?x{Q}xbf16>", f"memref<?x{D}xf32>"
    c_t = f"memref<{layers}x?x{KV}x?x{D}xbf16>"
    op_t, mp_t = f"memref<?x{NH}x?x{D}xf32>", f"memref<?x{NH}x?x2xf32>"
    qk_t = f"memref<{(G + 2) * D}xf32, {_WG}>"
    p_t = f"memref<{G * chunk}xf32, {_WG}>"
    o_t = f"memref<{warps * G * D}xf32, {_WG}>"
    in_row = [RL >> (k + 1) for k in range(RL.bit_length() - 1)]  # RL/2 .. 1
    across = [o for o in (1, 2, 4, 8, 16) if o >= RL]  # row groups of a warp
    consts = _offset_constants(in_row + across + list(_text.SHUFFLE_OFFSETS))

    # -- stage_kv / stage_v: per-thread cp.async slots of K (phase 0) and V (phase 1) --
    R = -(-chunk // RC)  # row loads per thread and phase
    if stage_kv and stage_v:
        raise GraphError(f"tile '{name}': give stage_kv (K and V) or stage_v, not both")
    if prefetch_kv not in (False, True, "l2"):
        raise GraphError(f"tile '{name}': prefetch_kv must be a bool or 'l2', got {prefetch_kv!r}")
    l2 = prefetch_kv == "l2"
    if l2 and (stage_kv or stage_v):
        raise GraphError(
            f"tile '{name}': prefetch_kv='l2' asks the L2 for the rows the body loads itself; "
            "it takes no stage_kv or stage_v"
        )
    staged = (0, 1) if stage_kv else (1,) if stage_v else ()
    slot0 = {phase: q * R for q, phase in enumerate(staged)}  # first slot of each phase
    kv_t = f"memref<{max(len(staged), 1) * R * block_size * 4}xi32, {_WG}>"

    def row_load(x: str, phase: int, cache: str, u: int) -> str:
        """Row group ``u`` of a step (``x`` = k or v): this lane's row
        ``%{x}r<u>``, whether it is in the split ``%{x}ok<u>``, its position
        ``%{x}p<u>`` (``p0`` past the split) and its 8 values ``%{x}b<u>``,
        from ``cache`` or (``stage_kv``) from this thread's slot."""
        rows = (
            f"      %{x}r{u}a = arith.addi %base, %rowt : index\n"
            f"      %{x}r{u} = arith.addi %{x}r{u}a, %cU{u} : index\n"
            f"      %{x}ok{u} = arith.cmpi ult, %{x}r{u}, %n : index\n"
            f"      %{x}p{u}a = arith.addi %p0, %{x}r{u} : index\n"
            f"      %{x}p{u} = arith.select %{x}ok{u}, %{x}p{u}a, %p0 : index\n"
        )
        if phase in staged:
            return rows + staged_load(f"{x}b{u}", phase, u)
        return rows + (
            f"      %{x}b{u} = vector.load {cache}[%l, %b, %g, %{x}p{u}, %d0] "
            f"{{alignment = 16 : i64}} : {c_t}, vector<8xbf16>"
        )

    def staged_load(out: str, phase: int, u: int) -> str:
        """Row load ``base / RC + u`` of ``phase`` from this thread's slot
        (clamped: rows past the split are masked by the caller)."""
        return (
            f"      %{out}r = arith.divui %base, %cRC : index\n"
            f"      %{out}q = arith.addi %{out}r, %cU{u}r : index\n"
            f"      %{out}c = arith.minui %{out}q, %cRlast : index\n"
            f"      %{out}s = arith.addi %{out}c, %cPh{phase} : index\n"
            f"      %{out}m = arith.muli %{out}s, %cSlot : index\n"
            f"      %{out}i = arith.addi %{out}m, %tid4 : index\n"
            f"      %{out}w = vector.load %kvbuf[%{out}i] {{alignment = 16 : i64}} "
            f": {kv_t}, vector<4xi32>\n"
            f"      %{out} = vector.bitcast %{out}w : vector<4xi32> to vector<8xbf16>"
        )

    def cache_row(phase: int, r: int, keep: tuple[str, str], then: str) -> str:
        """This thread's row load ``r`` of ``phase`` (K 0, V 1): where it
        lies in the cache (``%sgi<phase>_<r>``, i64), and ``then`` done with
        it if it is in the split and ``keep = (lines, i1)`` holds."""
        x, base = f"{phase}_{r}", ("%kbase", "%vbase")[phase]
        row, lines = f"%sp{x}", []
        if page_size:  # the row in the position's page (%kbase holds no rows then)
            lines, row = _paged.row(f"pgs{x}", row, "%g", KV)
        address = "".join(f"    {line}\n" for line in lines) + (
            f"    %sa{x} = arith.muli {row}, %cRowBytes : index\n"
            f"    %sg{x} = arith.addi {base}, %sa{x} : index\n"
            f"    %sgi{x} = arith.index_cast %sg{x} : index to i64\n"
        )
        return (
            f"  %sr{x} = arith.addi %rowt, %cRow{r} : index\n"
            f"  %sin{x} = arith.cmpi ult, %sr{x}, %n : index\n"
            f"  %sp{x} = arith.addi %p0, %sr{x} : index\n"
            f"{keep[0]}"
            f"  %sok{x} = arith.andi %sin{x}, {keep[1]} : i1\n"
            f"  scf.if %sok{x} {{\n"
            f"{address}{then}"
            f"  }}"
        )

    stage_lines = []
    for phase in (0, 1) if l2 else staged:
        for r in range(R):
            x = f"{phase}_{r}"
            if l2:  # one lane per row asks the L2 for it (no slots, no shared memory)
                prefetch = _text.asm_line("prefetch.global.L2 [$0];", [(f"%sgi{x}", "i64")])
                stage_lines.append(cache_row(phase, r, ("", "%is_sub0"), f"    {prefetch}\n"))
                continue
            # Position L comes from step 1 (split 0 is writing it).
            old = (f"  %sold{x} = arith.cmpi ne, %sp{x}, %L : index\n", f"%sold{x}")
            copy = (
                f"    %sgp{x} = llvm.inttoptr %sgi{x} : i64 to !llvm.ptr<1>\n"
                f"    %sd{x} = arith.addi %kvaddr, %cSlotB{slot0[phase] + r} : index\n"
                f"    %sdi{x} = arith.index_cast %sd{x} : index to i64\n"
                f"    %sdp{x} = llvm.inttoptr %sdi{x} : i64 to !llvm.ptr<3>\n"
                f"    nvvm.cp.async.shared.global %sdp{x}, %sgp{x}, 16, "
                f"cache = cg : !llvm.ptr<3>, !llvm.ptr<1>\n"
            )
            stage_lines.append(cache_row(phase, r, old, copy))
        if not l2:
            stage_lines.append("  nvvm.cp.async.commit.group")
    if staged or l2:
        # Byte address of this thread's (l, b, g, position 0, d0) in each cache.
        slots = (
            f"\n  %kvbuf = memref.get_global @{name}__kv : {kv_t}\n"
            f"  %kvp = memref.extract_aligned_pointer_as_index %kvbuf : {kv_t} -> index\n"
            f"  %tid16 = arith.muli %tid, %c16 : index\n"
            f"  %kvaddr = arith.addi %kvp, %tid16 : index"
            if staged
            else ""
        )
        stage_lines.insert(
            0,
            f"  %nb = memref.dim %kc, %c1 : {c_t}\n"
            f"  %ns = memref.dim %kc, %c3 : {c_t}\n"
            f"  %lb0 = arith.muli %l, %nb : index\n"
            f"  %lb = arith.addi %lb0, %b : index\n"
            f"  %lbg0 = arith.muli %lb, %cKV : index\n"
            f"  %lbg = arith.addi %lbg0, %g : index\n"
            f"  %rows0 = arith.muli %lbg, %ns : index\n"
            f"  %rowsb = arith.muli %rows0, %cRowBytes : index\n"
            f"  %d0b = arith.muli %d0, %c2 : index\n"
            # A paged cache's rows are found per position (cache_row).
            f"  %kvoff = arith.addi {'%c0' if page_size else '%rowsb'}, %d0b : index\n"
            f"  %kptr = memref.extract_aligned_pointer_as_index %kc : {c_t} -> index\n"
            f"  %vptr = memref.extract_aligned_pointer_as_index %vc : {c_t} -> index\n"
            f"  %kbase = arith.addi %kptr, %kvoff : index\n"
            f"  %vbase = arith.addi %vptr, %kvoff : index" + slots,
        )
    stage_consts = "\n".join(
        [
            f"  %cRC = arith.constant {RC} : index",
            f"  %cRlast = arith.constant {R - 1} : index",
            "  %cPh0 = arith.constant 0 : index",
            f"  %cPh1 = arith.constant {slot0.get(1, 0)} : index",
            f"  %cSlot = arith.constant {block_size * 4} : index",
            f"  %cKV = arith.constant {KV} : index",
            f"  %cRowBytes = arith.constant {2 * D} : index",
            "  %c2 = arith.constant 2 : index",
            "  %c3 = arith.constant 3 : index",
            "  %c4 = arith.constant 4 : index",
            "  %c16 = arith.constant 16 : index",
        ]
        + [f"  %cU{u}r = arith.constant {u} : index" for u in range(U)]
        + [f"  %cRow{r} = arith.constant {r * RC} : index" for r in range(R)]
        + [f"  %cSlotB{q} = arith.constant {q * block_size * 16} : index" for q in range(2 * R)]
    )

    def score_row(u: int) -> list[str]:
        """Row group ``u``'s scores ``%sc<u>_<t>`` of the G heads (after its
        ``row_load`` of K): its key (position L's from step 1), the dot
        products, summed over the row's lanes and scaled."""
        lines = [
            f"      %kf{u} = arith.extf %kb{u} : vector<8xbf16> to vector<8xf32>\n"
            f"      %knew{u} = arith.cmpi eq, %kp{u}, %L : index\n"
            f"      %k{u} = arith.select %knew{u}, %kn, %kf{u} : vector<8xf32>"
        ]
        for t in range(G):
            red, val = _warp_reduce(f"%dp{u}_{t}", "addf", in_row, f"k{u}_{t}", "      ")
            lines.append(
                f"      %pr{u}_{t} = arith.mulf %q{t}, %k{u} : vector<8xf32>\n"
                f"      %dp{u}_{t} = vector.reduction <add>, %pr{u}_{t} : vector<8xf32> into f32"
                + (f"\n{red}" if red else "")
                + f"\n      %sc{u}_{t} = arith.mulf {val}, %scale : f32"
            )
        return lines

    def value_row(u: int) -> str:
        """Row group ``u``'s values ``%v<u>`` (after its ``row_load`` of V):
        position L's from step 1, zero past the split."""
        return (
            f"      %vf{u} = arith.extf %vb{u} : vector<8xbf16> to vector<8xf32>\n"
            f"      %vnew{u} = arith.cmpi eq, %vp{u}, %L : index\n"
            f"      %vs{u} = arith.select %vnew{u}, %vn, %vf{u} : vector<8xf32>\n"
            f"      %v{u} = arith.select %vok{u}, %vs{u}, %zero8 : vector<8xf32>"
        )

    # -- step 2: scores ------------------------------------------------------
    score_lines = [row_load("k", 0, "%kc", u) for u in range(U)]
    for u in range(U):
        score_lines += score_row(u)
        stores = "\n".join(
            f"        %si{u}_{t} = arith.addi %kr{u}, %cT{t}chunk : index\n"
            f"        memref.store %sc{u}_{t}, %pbuf[%si{u}_{t}] : {p_t}"
            for t in range(G)
        )
        score_lines.append(
            f"      %kw{u} = arith.andi %kok{u}, %is_sub0 : i1\n"
            f"      scf.if %kw{u} {{\n{stores}\n      }}"
        )

    # -- step 4: values ------------------------------------------------------
    acc_names = [f"%a{t}" for t in range(G)]
    value_lines = [row_load("v", 1, "%vc", u) for u in range(U)]
    for u in range(U):
        value_lines.append(
            value_row(u) + f"\n      %vi{u} = arith.select %vok{u}, %vr{u}, %c0 : index"
        )
        for t in range(G):
            prev = acc_names[t]
            value_lines.append(
                f"      %ei{u}_{t} = arith.addi %vi{u}, %cT{t}chunk : index\n"
                f"      %el{u}_{t} = memref.load %pbuf[%ei{u}_{t}] : {p_t}\n"
                f"      %e{u}_{t} = arith.select %vok{u}, %el{u}_{t}, %fzero : f32\n"
                f"      %eb{u}_{t} = vector.broadcast %e{u}_{t} : f32 to vector<8xf32>\n"
                f"      %na{u}_{t} = vector.fma %eb{u}_{t}, %v{u}, {prev} : vector<8xf32>"
            )
            acc_names[t] = f"%na{u}_{t}"
    acc_init = ", ".join(f"%a{t} = %zero8" for t in range(G))
    acc_types = ", ".join("vector<8xf32>" for _ in range(G))
    reduce_lines = []
    for t in range(G):
        elems = []
        for e in range(8):
            red, val = _warp_reduce(f"%o{t}_{e}", "addf", across, f"x{t}_{e}", "  ")
            reduce_lines.append(
                f"  %o{t}_{e} = vector.extract %acc#{t}[{e}] : f32 from vector<8xf32>"
            )
            if red:
                reduce_lines.append(red)
            elems.append(val)
        reduce_lines.append(
            f"  %ov{t} = vector.from_elements {', '.join(elems)} : vector<8xf32>\n"
            f"  %oi{t}a = arith.addi %wo, %cT{t}D : index\n"
            f"  %oi{t} = arith.addi %oi{t}a, %d0 : index"
        )
    o_stores = "\n".join(
        f"    vector.store %ov{t}, %obuf[%oi{t}] {{alignment = 16 : i64}} : {o_t}, vector<8xf32>"
        for t in range(G)
    )
    warp_sum_lines = []
    prev = "%fzero"
    for w in range(warps):
        warp_sum_lines.append(
            f"    %ow{w}i = arith.addi %i, %cW{w}GD : index\n"
            f"    %ow{w} = memref.load %obuf[%ow{w}i] : {o_t}\n"
            f"    %os{w} = arith.addf {prev}, %ow{w} : f32"
        )
        prev = f"%os{w}"
    osum = prev
    max_red, max_val = _warp_reduce("%mx", "maximumf", _text.SHUFFLE_OFFSETS, "mx", "    ")
    sum_red, sum_val = _warp_reduce("%sm", "addf", _text.SHUFFLE_OFFSETS, "sm", "    ")

    index_consts = "\n".join(
        [f"  %cU{u} = arith.constant {u * RC} : index" for u in range(U)]
        + [f"  %cT{t}chunk = arith.constant {t * chunk} : index" for t in range(G)]
        + [f"  %cT{t}D = arith.constant {t * D} : index" for t in range(G)]
        + [f"  %cW{w}GD = arith.constant {w * G * D} : index" for w in range(warps)]
    )
    q_loads = "\n".join(
        f"  %q{t}i = arith.addi %d0, %cT{t}D : index\n"
        f"  %q{t} = vector.load %qk[%q{t}i] {{alignment = 16 : i64}} : {qk_t}, vector<8xf32>"
        for t in range(G)
    )

    align = min(RC * U, chunk)  # spans round up to whole loop steps
    if spread and chunk % align:
        raise GraphError(
            f"tile '{name}': spread splits are whole loop steps of {align} rows: "
            f"chunk={chunk} must be a multiple of {align}"
        )
    split_lines = _split_lines(spread, align, op_t)
    cnt_t, a_t = f"memref<{layers}x?x{KV}xi32>", f"memref<?x{NH * D}xbf16>"
    combine_args = f", %cnt: {cnt_t}, %attn: {a_t}" if combine else ""
    st_t = f"memref<?x?x?x?x{len(PHASED_STAMPS)}xi64>"

    def stamp(*words: str, value: str = "") -> str:
        """Thread 0 writes its clock (``*_ns`` words: the ``%globaltimer``;
        ``value``: that i64) at ``words``; nothing without ``stamps``."""
        if not stamps:
            return ""
        lines = []
        for word in words:
            k = PHASED_STAMPS.index(word)
            timer = "globaltimer" if word.endswith("_ns") else "clock64"
            v = value or f"%st{k}"
            if not value:
                lines.append(f"  %st{k} = {_text.read_timer(timer)}")
            lines.append(
                f"  scf.if %stamp_t0 {{\n"
                f"    %stw{k} = arith.constant {k} : index\n"
                f"    memref.store {v}, %stamps[%l, %b, %g, %s, %stw{k}] : {st_t}\n"
                f"  }}"
            )
        return "\n".join(lines) + "\n"

    stamp_args = f", %stamps: {st_t}" if stamps else ""

    def counted_stamps(count: str, define: str) -> str:
        """The merging split's stamps once it has counted: the clock, then
        ``count`` (an i64 that ``define`` makes) in the count word."""
        return stamp("counted") + define + stamp("count", value=count) if stamps else ""

    merge_stamps = (stamp("merge_loaded"), stamp("merge_folded"))  # "" without stamps
    combine_global = _fused_combine_global(name) + "\n" if combine else ""
    combine_lines = ""
    if combine:
        _check_fused_combine(name, G, D, block_size, merge_unroll)
    if combine and not cluster:
        # The grid's split count is the partials' (capped or spread splits
        # are not ceil((L + 1) / chunk)).
        counted = counted_stamps(
            "%fc_done64", "  %fc_done64 = arith.index_cast %fc_done : index to i64\n"
        )
        combine_lines = (
            f"  %fc_c2 = arith.constant 2 : index\n"
            f"  %fc_splits = memref.dim %op, %fc_c2 : {op_t}\n"
            + _fused_combine(
                name,
                G,
                D,
                KV,
                block_size,
                layers,
                "%g",
                "%fc_splits",
                NH,
                merge_unroll,
                after_count=counted,
                merge_stamps=merge_stamps,
            )
            + "\n"
        )
    if cluster:
        meeting = _ClusterMeeting(name, cluster, G, D)
        ml_stores = meeting.push([max_val, sum_val], "%clm_", head="%t")
        out_store = meeting.push([osum], "%clo_", at="%i")
        # Rank 0 merges: its count word says so, as the last to count does.
        counted = counted_stamps("%cl_count64", f"  %cl_count64 = arith.constant {cluster} : i64\n")
        combine_global = meeting.globals()
        combine_lines = meeting.merge(
            _shared_merge(
                "%qh0", G * D // 8, _merge_lanes(G * D // 8, block_size), "%cl_splits", D,
                op_t, mp_t, a_t, p="fc_", unroll=merge_unroll,
                stamps=merge_stamps, slots=meeting.slots(),
            ),
            counted,
        )  # fmt: skip
    else:
        ml_stores = (
            "      %h = arith.addi %qh0, %t : index\n"
            f"      memref.store {max_val}, %mp[%b, %h, %s, %c0] : {mp_t}\n"
            f"      memref.store {sum_val}, %mp[%b, %h, %s, %c1] : {mp_t}"
        )
        out_store = f"    memref.store {osum}, %op[%b, %oh, %s, %od] : {op_t}"
    if prefetch_kv is True and not stage_kv:
        raise GraphError(f"tile '{name}': prefetch_kv issues the stage_kv copies: give stage_kv")
    kv_global = (
        f'memref.global "private" @{name}__kv : {kv_t} {{alignment = 16 : i64}}\n' if staged else ""
    )
    ml_global = (
        f'memref.global "private" @{name}__ml : memref<{warps * G * 2}xf32, {_WG}> '
        "{alignment = 16 : i64}\n"
        if one_pass
        else ""
    )
    phases_text = f"""\
  {"nvvm.cp.async.wait.group 1" if stage_kv else ""}
{stamp("k_ready") if stage_kv else ""}  scf.for %base = %c0 to %n step %cStep {{
{chr(10).join(score_lines)}
  }}
  gpu.barrier
{meeting.arrived() if cluster else ""}{stamp("scored")}  // 3. Softmax of head t by warps t, t + {warps}, ...
  scf.for %t = %warp to %cG step %cWarps {{
    %tb = arith.muli %t, %cChunk : index
    %mx = scf.for %j = %lane to %n step %c32 iter_args(%m = %empty) -> (f32) {{
      %ji = arith.addi %tb, %j : index
      %v = memref.load %pbuf[%ji] : {p_t}
      %m2 = arith.maximumf %m, %v : f32
      scf.yield %m2 : f32
    }}
{max_red}
    %sm = scf.for %j = %lane to %n step %c32 iter_args(%a = %fzero) -> (f32) {{
      %ji = arith.addi %tb, %j : index
      %v = memref.load %pbuf[%ji] : {p_t}
      %dv = arith.subf %v, {max_val} : f32
      %e = math.exp %dv : f32
      memref.store %e, %pbuf[%ji] : {p_t}
      %a2 = arith.addf %a, %e : f32
      scf.yield %a2 : f32
    }}
{sum_red}
    scf.if %is_lane0 {{
{ml_stores}
    }}
  }}
  gpu.barrier
{stamp("softmaxed")}  // 4. Output: e_p * v_p per lane, then over the warp's row groups and the warps.
  {"nvvm.cp.async.wait.group 0" if staged else ""}
  %acc:{G} = scf.for %base = %c0 to %n step %cStep iter_args({acc_init}) -> ({acc_types}) {{
{chr(10).join(value_lines)}
    scf.yield {", ".join(acc_names)} : {acc_types}
  }}
{chr(10).join(reduce_lines)}
  scf.if %is_grp0 {{
{o_stores}
  }}
  gpu.barrier
{stamp("valued")}  scf.for %i = %tid to %cGD step %cBS {{
{chr(10).join(warp_sum_lines)}
    %ot = arith.divui %i, %cD : index
    %od = arith.remui %i, %cD : index
    %oh = arith.addi %qh0, %ot : index
{out_store}
  }}
"""
    if one_pass:
        phases_text = (
            (f"  nvvm.cp.async.wait.group 0\n{stamp('k_ready')}" if staged else "")
            + _one_pass(
                name, G, D, U, warps, (row_load, score_row, value_row), across, op_t, mp_t,
                after_loop=stamp("scored", "softmaxed"), after_join=stamp("valued"),
                single_step=chunk <= RC * U,
            )
        )  # fmt: skip
    source = f"""\
// {name}: decode attention split, {NH} heads / {KV} kv heads of {D}, chunk {chunk}, {layers} layers, one CTA of {block_size}.
memref.global "private" @{name}__qkv : {qk_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__p : {p_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__o : {o_t} {{alignment = 16 : i64}}
{kv_global}{combine_global}{ml_global}func.func @{name}(%l: index, %b: index, %g: index, %s: index, %L: index, %qkv: {qkv_t}, %rope: {rope_t}, %kc: {c_t}, %vc: {c_t}, %op: {op_t}, %mp: {mp_t}{combine_args}{stamp_args}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %c32 = arith.constant 32 : index
  %cBS = arith.constant {block_size} : index
  %cWarps = arith.constant {warps} : index
  %cRL = arith.constant {RL} : index
  %cRW = arith.constant {RW} : index
  %cStep = arith.constant {RC * U} : index
  %cChunk = arith.constant {chunk} : index
  %cD = arith.constant {D} : index
  %cHalf = arith.constant {half} : index
  %cG = arith.constant {G} : index
  %cG1 = arith.constant {G + 1} : index
  %cRV = arith.constant {RV} : index
  %cRowItems = arith.constant {D // RV} : index
  %cRItems = arith.constant {(G + 2) * D // RV} : index
  %cGD = arith.constant {G * D} : index
  %cQcol = arith.constant {NH * D} : index
  %cVcol = arith.constant {(NH + KV) * D} : index
{index_consts}
{stage_consts if staged or l2 else ""}
{consts}
  %c32_i32 = arith.constant 32 : i32
  %zero8 = arith.constant dense<0.0> : vector<8xf32>
  %fzero = arith.constant 0.0 : f32
  %empty = arith.constant {_f32(EMPTY_MAX)} : f32
  %scale = arith.constant {_f32(scale)} : f32
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_lane0 = arith.cmpi eq, %lane, %c0 : index
{"  %stamp_t0 = arith.cmpi eq, %tid, %c0 : index" if stamps else ""}
  %grp = arith.divui %lane, %cRL : index
  %sub = arith.remui %lane, %cRL : index
  %is_sub0 = arith.cmpi eq, %sub, %c0 : index
  %is_grp0 = arith.cmpi eq, %grp, %c0 : index
  %d0 = arith.muli %sub, %c8 : index
  %wrow = arith.muli %warp, %cRW : index
  %rowt = arith.addi %wrow, %grp : index
  %wo = arith.muli %warp, %cGD : index
{"  %tid4 = arith.muli %tid, %c4 : index" if staged else ""}
  %qk = memref.get_global @{name}__qkv : {qk_t}
  %pbuf = memref.get_global @{name}__p : {p_t}
  %obuf = memref.get_global @{name}__o : {o_t}
  %first_split = arith.cmpi eq, %s, %c0 : index
{split_lines}
  %qh0 = arith.muli %g, %cG : index
  %qcol0 = arith.muli %qh0, %cD : index
  %kvcol = arith.muli %g, %cD : index
  %kcol0 = arith.addi %cQcol, %kvcol : index
  %vcol0 = arith.addi %cVcol, %kvcol : index
  // A previous call on this CTA may still be reading the workgroup buffers.
  gpu.barrier
{chr(10).join(stage_lines)}
{meeting.prologue() if cluster else ""}{stamp("entry", "entry_ns")}  // 1. RoPE: rows 0..G-1 of qk are the queries, G is k, G+1 is v (bf16 values).
  // Item t is {RV} dims of a row, with its rotate-half partner's: one load
  // round trip for the whole step.
  scf.for %t = %tid to %cRItems step %cBS {{
    %j = arith.divui %t, %cRowItems : index
    %dc = arith.remui %t, %cRowItems : index
    %d = arith.muli %dc, %cRV : index
    %is_k = arith.cmpi eq, %j, %cG : index
    %is_v = arith.cmpi eq, %j, %cG1 : index
    %jd = arith.muli %j, %cD : index
    %qcol = arith.addi %qcol0, %jd : index
    %colk = arith.select %is_k, %kcol0, %qcol : index
    %col = arith.select %is_v, %vcol0, %colk : index
    %lo = arith.cmpi ult, %d, %cHalf : index
    %dh = arith.remui %d, %cHalf : index
    %dpa = arith.addi %d, %cHalf : index
    %dpb = arith.subi %d, %cHalf : index
    %dp = arith.select %lo, %dpa, %dpb : index
    %xi = arith.addi %col, %d : index
    %xpi = arith.addi %col, %dp : index
    %si = arith.addi %dh, %cHalf : index
    %xb = vector.load %qkv[%b, %xi] {{alignment = {2 * RV} : i64}} : {qkv_t}, {rv_bf}
    %xpb = vector.load %qkv[%b, %xpi] {{alignment = {2 * RV} : i64}} : {qkv_t}, {rv_bf}
    %cs = vector.load %rope[%L, %dh] {{alignment = {2 * RV} : i64}} : {rope_t}, {rv_f}
    %sn = vector.load %rope[%L, %si] {{alignment = {2 * RV} : i64}} : {rope_t}, {rv_f}
    %x = arith.extf %xb : {rv_bf} to {rv_f}
    %xp = arith.extf %xpb : {rv_bf} to {rv_f}
    %xc = arith.mulf %x, %cs : {rv_f}
    %xs = arith.mulf %xp, %sn : {rv_f}
    %rlo = arith.subf %xc, %xs : {rv_f}
    %rhi = arith.addf %xc, %xs : {rv_f}
    %rot = arith.select %lo, %rlo, %rhi : {rv_f}
    %rb = arith.truncf %rot : {rv_f} to {rv_bf}
    %ob = arith.select %is_v, %xb, %rb : {rv_bf}
    %of = arith.extf %ob : {rv_bf} to {rv_f}
    %qi = arith.muli %t, %cRV : index
    vector.store %of, %qk[%qi] {{alignment = {4 * RV} : i64}} : {qk_t}, {rv_f}
    %kvj = arith.cmpi uge, %j, %cG : index
    %wr = arith.andi %first_split, %kvj : i1
    scf.if %wr {{
      scf.if %is_v {{
        vector.store %ob, %vc[%l, %b, %g, %L, %d] {{alignment = {2 * RV} : i64}} : {c_t}, {rv_bf}
      }} else {{
        vector.store %ob, %kc[%l, %b, %g, %L, %d] {{alignment = {2 * RV} : i64}} : {c_t}, {rv_bf}
      }}
    }}
  }}
  gpu.barrier
{stamp("roped")}  // 2. Scores: D/8 lanes per K row, {U} row groups in flight per lane.
{q_loads}
  %kni = arith.addi %d0, %cGD : index
  %kn = vector.load %qk[%kni] {{alignment = 16 : i64}} : {qk_t}, vector<8xf32>
  %vni0 = arith.addi %d0, %cGD : index
  %vni = arith.addi %vni0, %cD : index
  %vn = vector.load %qk[%vni] {{alignment = 16 : i64}} : {qk_t}, vector<8xf32>
{phases_text}{stamp("partials")}{combine_lines}{"  gpu.barrier" + chr(10) if stamps else ""}{stamp("end", "end_ns")}  return
}}
"""

    split = _split_reference(name, chunk, spread, align, NH, KV, D)

    def reference(
        l: int,  # noqa: E741
        b: int,
        g: int,
        s: int,
        L: int,
        qkv: np.ndarray,
        rope: np.ndarray,
        kc: np.ndarray,
        vc: np.ndarray,
        opart: np.ndarray,
        mpart: np.ndarray,
        *fused: np.ndarray,
    ) -> None:
        split(l, b, g, s, L, qkv, rope, kc, vc, opart, mpart)
        if combine:  # (the stamps, if any, are not the reference's)
            _fused_combine_reference(l, b, g, opart, mpart, *fused[:2], G, D)

    if prefetch_kv:
        source = _move_staging_to_prefetch(source, name, stage_lines[0], "\n".join(stage_lines[1:]))
    # The table, then the positions, after the cnt and attn, and stamps.
    source, reference = _paged.paged_and_ragged(
        source, name, reference, 11 + 2 * combine + stamps, page_size, lengths, c_t
    )
    fn = DeviceFunction.from_mlir(source, name, reference, block_size=block_size)
    fn.prefetch_fills_shared = prefetch_kv is True
    fn.cluster = cluster
    return fn


def _one_pass(
    name: str, G: int, D: int, U: int, warps: int, rows, across: list[int], op_t: str,
    mp_t: str, after_loop: str = "", after_join: str = "", single_step: bool = False,
) -> str:  # fmt: skip
    """Steps 2-4 of :func:`attention` as one pass (``one_pass=True``): the
    MLIR text from the loop over the split's rows to the partials' stores.
    ``rows`` are the tile's own ``(row_load, score_row, value_row)`` (row
    group ``u`` of a loop step: its loads, its G scores, its values);
    ``across`` the shuffle offsets over a warp's row groups; ``after_loop`` and
    ``after_join`` are stamps' text. ``single_step`` (the split is at most
    one loop step): straight-line code from constant initial states, so no
    running state is live through the scores (fewer registers). The warps'
    states meet in :func:`_warp_merge`, as the online tile's do."""
    row_load, score_row, value_row = rows
    f32s, vecs = ", ".join(["f32"] * G), ", ".join(["vector<8xf32>"] * G)
    body = [row_load("k", 0, "%kc", u) for u in range(U)]
    for u in range(U):
        body += score_row(u)
        body += [
            f"      %ks{u}_{t} = arith.select %kok{u}, %sc{u}_{t}, %empty : f32" for t in range(G)
        ]
    for t in range(G):  # the step's max over the warp's rows, the running max, the rescale
        top = f"%ks0_{t}"
        for u in range(1, U):
            body.append(f"      %sx{u}_{t} = arith.maximumf {top}, %ks{u}_{t} : f32")
            top = f"%sx{u}_{t}"
        red, smx = _warp_reduce(top, "maximumf", across, f"sm{t}", "      ")
        body += [red] if red else []
        body.append(
            f"      %mn{t} = arith.maximumf %m{t}, {smx} : f32\n"
            f"      %rd{t} = arith.subf %m{t}, %mn{t} : f32\n"
            f"      %rs{t} = math.exp %rd{t} : f32"
        )
        lsum = f"%lr{t}"
        body.append(f"      %lr{t} = arith.mulf %l{t}, %rs{t} : f32")
        for u in range(U):
            body.append(
                f"      %ed{u}_{t} = arith.subf %ks{u}_{t}, %mn{t} : f32\n"
                f"      %ee{u}_{t} = math.exp %ed{u}_{t} : f32\n"
                f"      %e{u}_{t} = arith.select %kok{u}, %ee{u}_{t}, %fzero : f32\n"
                f"      %ls{u}_{t} = arith.addf {lsum}, %e{u}_{t} : f32"
            )
            lsum = f"%ls{u}_{t}"
    body += [row_load("v", 1, "%vc", u) for u in range(U)]
    body += [value_row(u) for u in range(U)]
    accs = []
    for t in range(G):
        body.append(
            f"      %rb{t} = vector.broadcast %rs{t} : f32 to vector<8xf32>\n"
            f"      %ar{t} = arith.mulf %a{t}, %rb{t} : vector<8xf32>"
        )
        acc = f"%ar{t}"
        for u in range(U):
            body.append(
                f"      %eb{u}_{t} = vector.broadcast %e{u}_{t} : f32 to vector<8xf32>\n"
                f"      %an{u}_{t} = vector.fma %eb{u}_{t}, %v{u}, {acc} : vector<8xf32>"
            )
            acc = f"%an{u}_{t}"
        accs.append(acc)
    yields = [f"%mn{t}" for t in range(G)] + [f"%ls{U - 1}_{t}" for t in range(G)] + accs
    inits = (
        [f"%m{t} = %empty" for t in range(G)]
        + [f"%l{t} = %fzero" for t in range(G)]
        + [f"%a{t} = %zero8" for t in range(G)]
    )
    if single_step:
        res = yields
        loop = "\n".join(
            [f"  %m{t} = arith.constant {_f32(EMPTY_MAX)} : f32" for t in range(G)]
            + [f"  %l{t} = arith.constant 0.0 : f32" for t in range(G)]
            + [f"  %a{t} = arith.constant dense<0.0> : vector<8xf32>" for t in range(G)]
            + ["  %base = arith.constant 0 : index"]
            + [line[4:] for line in "\n".join(body).split("\n")]
        )
    else:
        res = [f"%st#{k}" for k in range(3 * G)]
        loop = (
            f"  %st:{3 * G} = scf.for %base = %c0 to %n step %cStep iter_args("
            f"{', '.join(inits)}) -> ({f32s}, {f32s}, {vecs}) {{\n"
            + "\n".join(body)
            + f"\n    scf.yield {', '.join(yields)} : {f32s}, {f32s}, {vecs}\n  }}"
        )
    after = []  # the warp's sums over its row groups; its state into workgroup memory
    ml_t, o_t = f"memref<{warps * G * 2}xf32, {_WG}>", f"memref<{warps * G * D}xf32, {_WG}>"
    stores = []
    for t in range(G):
        red, lw = _warp_reduce(res[G + t], "addf", across, f"lw{t}", "  ")
        after += [red] if red else []
        elems = []
        for e in range(8):
            after.append(
                f"  %ox{t}_{e} = vector.extract {res[2 * G + t]}[{e}] : f32 from vector<8xf32>"
            )
            red, val = _warp_reduce(f"%ox{t}_{e}", "addf", across, f"ox{t}_{e}", "  ")
            after += [red] if red else []
            elems.append(val)
        after.append(
            f"  %ov{t} = vector.from_elements {', '.join(elems)} : vector<8xf32>\n"
            f"  %oi{t}a = arith.addi %wo, %cT{t}D : index\n"
            f"  %oi{t} = arith.addi %oi{t}a, %d0 : index\n"
            f"  %mi{t}a = arith.muli %warp, %c{G}x2 : index\n"
            f"  %mi{t} = arith.addi %mi{t}a, %c{t}x2 : index\n"
            f"  %li{t} = arith.addi %mi{t}, %c1 : index"
        )
        stores.append(
            f"    vector.store %ov{t}, %obuf[%oi{t}] {{alignment = 16 : i64}} : {o_t}, vector<8xf32>"
        )
        stores.append(
            f"    scf.if %is_lane0 {{\n"
            f"      memref.store {res[t]}, %mbuf[%mi{t}] : {ml_t}\n"
            f"      memref.store {lw}, %mbuf[%li{t}] : {ml_t}\n"
            f"    }}"
        )
    consts = sorted({G, *range(G)})
    nl = "\n"
    return f"""\
  // 2-4. One pass: each warp's rows' scores, online softmax and values.
{loop}
{after_loop}{nl.join(f"  %c{k}x2 = arith.constant {2 * k} : index" for k in consts)}
  %mbuf = memref.get_global @{name}__ml : {ml_t}
{nl.join(after)}
  scf.if %is_grp0 {{
{nl.join(stores)}
  }}
  gpu.barrier
{after_join}{_warp_merge(warps, G, D, o_t, ml_t, op_t, mp_t)}
"""


@checked_arguments
def attention_online(
    chunk: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    layers: int,
    *,
    unroll: int = 4,
    name: str = "attention",
    block_size: int = 256,
    spread: bool = False,
    lengths: bool = False,
    page_size: int = 0,
) -> DeviceFunction:
    """:func:`attention`'s tile ``(l, b, g, s)`` with the same arguments,
    outputs and numpy reference, as one pass per warp (an online softmax)
    instead of four CTA-wide phases.

    Each group of ``D/8`` lanes (a *row group*) owns rows ``base + u*RC +
    rowt`` of the split's cached positions, as in :func:`attention`, and
    keeps for each of the ``G`` heads a running max ``m``, sum ``l`` and
    output ``acc`` (its 8 dims) in registers. A loop step issues its
    ``unroll`` K rows *and* V rows together (V does not wait for the
    scores), then folds them in: ``m' = max(m, s_u)``, ``l' = l e^(m-m') +
    sum e^(s_u-m')``, ``acc' = acc e^(m-m') + sum e^(s_u-m') v_u``. No
    barrier until the end, where the row groups of a warp merge with
    shuffles and the warps through workgroup memory (two barriers).

    The queries are roped in registers before the loop: a lane holds dims
    ``[8r, 8r + 8)`` and the rotation partner ``d +- D/2`` sits in lane ``r
    xor D/16`` of its row group (one shuffle per 4 bf16 pairs). Position
    ``L``, if the split holds it, is not read from the cache (split 0 is
    writing it): after the loop every lane ropes k the same way and the
    first row group of warp 0 folds ``(k, v)`` in, then writes them to the
    caches in split 0. The new token's k and v are thus not live across the
    loop. Workgroup memory: ``4 * warps * G * (D + 2)`` bytes.

    Measured on an H200 in the Llama-3.2-1B decoder (``bench/RESULTS.md``,
    tenth session): no faster than :func:`attention`. Its instances take the
    same 13 us at B=64, L=1024 whatever the loads in flight, and the
    tile needs 150-220 registers, so the kernel spills at 128. Kept as an
    option (``LlamaConfig.attn_online``).
    """
    warps = _check_attention(
        name, block_size, chunk, heads, kv_heads, head_dim, layers, unroll=unroll
    )
    _paged.check_page_size(name, page_size)
    NH, KV, D, G, U = heads, kv_heads, head_dim, heads // kv_heads, unroll
    RL = D // 8  # lanes per row
    if D < 16 or 32 % RL:
        raise GraphError(
            f"tile '{name}': head_dim={D} must be 16, 32, 64, 128 or 256 "
            "(D/8 lanes read one row; the RoPE partner of a lane is lane xor D/16)"
        )
    RW = 32 // RL  # rows per warp per load
    RC = warps * RW  # rows per CTA per load
    align = min(RC * U, chunk)  # spans round up to whole loop steps
    if spread and chunk % align:
        raise GraphError(
            f"tile '{name}': spread splits are whole loop steps of {align} rows: "
            f"chunk={chunk} must be a multiple of {align}"
        )
    Q = (NH + 2 * KV) * D
    half = D // 2
    qkv_t, rope_t = f"memref<?x{Q}xbf16>", f"memref<?x{D}xf32>"
    c_t = f"memref<{layers}x?x{KV}x?x{D}xbf16>"
    op_t, mp_t = f"memref<?x{NH}x?x{D}xf32>", f"memref<?x{NH}x?x2xf32>"
    o_t = f"memref<{warps * G * D}xf32, {_WG}>"
    m_t = f"memref<{warps * G * 2}xf32, {_WG}>"
    in_row = [RL >> (k + 1) for k in range(RL.bit_length() - 1)]  # RL/2 .. 1
    across = [o for o in (1, 2, 4, 8, 16) if o >= RL]  # row groups of a warp
    consts = _offset_constants(in_row + across)

    def v8(t: str) -> str:
        return f"vector<8x{t}>"

    lines: list[str] = []  # `emit` appends here; each part clears it
    emit = lines.append

    def roped(x: str, col: str, cos: str = "%cosv", sin: str = "%sinv") -> None:
        """``%{x}`` (f32) = bf16(RoPE(qkv[b, col + d0 .. +8])), ``%{x}b`` its bf16."""
        emit(f"  %{x}c = arith.addi {col}, %d0 : index")
        emit(
            f"  %{x}r = vector.load %qkv[%b, %{x}c] {{alignment = 16 : i64}} : {qkv_t}, {v8('bf16')}"
        )
        emit(f"  %{x}w = vector.bitcast %{x}r : {v8('bf16')} to vector<4xi32>")
        parts = []
        for e in range(4):
            emit(f"  %{x}w{e} = vector.extract %{x}w[{e}] : i32 from vector<4xi32>")
            emit(
                f"  %{x}s{e}, %{x}sok{e} = gpu.shuffle xor %{x}w{e}, %c{RL // 2}_i32, "
                f"%c32_i32 : i32"
            )
            parts.append(f"%{x}s{e}")
        emit(f"  %{x}pw = vector.from_elements {', '.join(parts)} : vector<4xi32>")
        emit(f"  %{x}pb = vector.bitcast %{x}pw : vector<4xi32> to {v8('bf16')}")
        emit(f"  %{x}f = arith.extf %{x}r : {v8('bf16')} to {v8('f32')}")
        emit(f"  %{x}pf = arith.extf %{x}pb : {v8('bf16')} to {v8('f32')}")
        emit(f"  %{x}xc = arith.mulf %{x}f, {cos} : {v8('f32')}")
        emit(f"  %{x}xs = arith.mulf %{x}pf, {sin} : {v8('f32')}")
        emit(f"  %{x}lo = arith.subf %{x}xc, %{x}xs : {v8('f32')}")
        emit(f"  %{x}hi = arith.addf %{x}xc, %{x}xs : {v8('f32')}")
        emit(f"  %{x}rot = arith.select %lo_half, %{x}lo, %{x}hi : {v8('f32')}")
        emit(f"  %{x}b = arith.truncf %{x}rot : {v8('f32')} to {v8('bf16')}")
        emit(f"  %{x} = arith.extf %{x}b : {v8('bf16')} to {v8('f32')}")

    def online_update(rows: list[tuple[str, str, str]], state, p: str, indent: str):
        """Fold ``rows`` (k, v: vector<8xf32>; ok: i1) into the running
        ``state`` (per head: m, l, acc); names start with ``p``. Returns the
        new state."""
        scores = {}
        for u, (k, _, ok) in enumerate(rows):
            for t in range(G):
                x = f"{p}{u}_{t}"
                red, val = _warp_reduce(f"%dp{x}", "addf", in_row, f"r{x}", indent)
                emit(
                    f"{indent}%pr{x} = arith.mulf %q{t}, {k} : {v8('f32')}\n"
                    f"{indent}%dp{x} = vector.reduction <add>, %pr{x} : {v8('f32')} into f32"
                    + (f"\n{red}" if red else "")
                    + f"\n{indent}%sc{x} = arith.mulf {val}, %scale : f32\n"
                    f"{indent}%s{x} = arith.select {ok}, %sc{x}, %empty : f32"
                )
                scores[u, t] = f"%s{x}"
        new_state = []
        for t, (m, lsum, acc) in enumerate(state):
            x = f"{p}{t}"
            mx = m
            for u in range(len(rows)):
                emit(f"{indent}%mx{x}_{u} = arith.maximumf {mx}, {scores[u, t]} : f32")
                mx = f"%mx{x}_{u}"
            emit(
                f"{indent}%dm{x} = arith.subf {m}, {mx} : f32\n"
                f"{indent}%cr{x} = math.exp %dm{x} : f32\n"
                f"{indent}%crb{x} = vector.broadcast %cr{x} : f32 to {v8('f32')}\n"
                f"{indent}%ls{x} = arith.mulf {lsum}, %cr{x} : f32\n"
                f"{indent}%as{x} = arith.mulf {acc}, %crb{x} : {v8('f32')}"
            )
            lsum, acc = f"%ls{x}", f"%as{x}"
            for u, (_, v, ok) in enumerate(rows):
                y = f"{x}_{u}"
                emit(
                    f"{indent}%ds{y} = arith.subf {scores[u, t]}, {mx} : f32\n"
                    f"{indent}%ex{y} = math.exp %ds{y} : f32\n"
                    f"{indent}%e{y} = arith.select {ok}, %ex{y}, %fzero : f32\n"
                    f"{indent}%ln{y} = arith.addf {lsum}, %e{y} : f32\n"
                    f"{indent}%eb{y} = vector.broadcast %e{y} : f32 to {v8('f32')}\n"
                    f"{indent}%an{y} = vector.fma %eb{y}, {v}, {acc} : {v8('f32')}"
                )
                lsum, acc = f"%ln{y}", f"%an{y}"
            new_state.append((mx, lsum, acc))
        return new_state

    for t in range(G):
        emit(f"  %qc{t}0 = arith.addi %qcol0, %cT{t}D : index")
        roped(f"q{t}", f"%qc{t}0")
    rope_lines = "\n".join(lines)

    # -- the loop step: U cached rows of K and V, then the online update ----
    lines.clear()
    rows = []
    for u in range(U):
        emit(
            f"      %r{u}a = arith.addi %base, %rowt : index\n"
            f"      %r{u} = arith.addi %r{u}a, %cU{u} : index\n"
            f"      %ok{u} = arith.cmpi ult, %r{u}, %ncache : index\n"
            f"      %pos{u}a = arith.addi %p0, %r{u} : index\n"
            f"      %pos{u} = arith.select %ok{u}, %pos{u}a, %p0 : index\n"
            f"      %kb{u} = vector.load %kc[%l, %b, %g, %pos{u}, %d0] "
            f"{{alignment = 16 : i64}} : {c_t}, {v8('bf16')}\n"
            f"      %vb{u} = vector.load %vc[%l, %b, %g, %pos{u}, %d0] "
            f"{{alignment = 16 : i64}} : {c_t}, {v8('bf16')}"
        )
    for u in range(U):
        emit(
            f"      %k{u} = arith.extf %kb{u} : {v8('bf16')} to {v8('f32')}\n"
            f"      %v{u} = arith.extf %vb{u} : {v8('bf16')} to {v8('f32')}"
        )
        rows.append((f"%k{u}", f"%v{u}", f"%ok{u}"))
    loop_state = [(f"%m{t}", f"%l{t}", f"%a{t}") for t in range(G)]
    after = online_update(rows, loop_state, "u", "      ")
    step_lines = "\n".join(lines)
    init = [f"%m{t} = %empty" for t in range(G)] + [f"%l{t} = %fzero" for t in range(G)]
    init += [f"%a{t} = %zero8" for t in range(G)]
    types = ["f32"] * (2 * G) + [v8("f32")] * G
    out = [m for m, _, _ in after] + [lsum for _, lsum, _ in after] + [a for _, _, a in after]

    # -- the new token: roped k and v from qkv, folded in by one row group ---
    lines.clear()
    # cos and sin loaded again: not live across the loop.
    for v, at in (("cosn", "%dh0"), ("sinn", "%dsin")):
        emit(
            f"  %{v} = vector.load %rope[%L, {at}] {{alignment = 16 : i64}} : {rope_t}, {v8('f32')}"
        )
    roped("kn", "%kcol0", "%cosn", "%sinn")
    emit("  %vnc = arith.addi %vcol0, %d0 : index")
    emit(f"  %vnb = vector.load %qkv[%b, %vnc] {{alignment = 16 : i64}} : {qkv_t}, {v8('bf16')}")
    emit(f"  %vn = arith.extf %vnb : {v8('bf16')} to {v8('f32')}")
    loop_out = [(f"%st#{t}", f"%st#{G + t}", f"%st#{2 * G + t}") for t in range(G)]
    with_new = online_update([("%kn", "%vn", "%foldL")], loop_out, "n", "  ")
    new_lines = "\n".join(lines)

    # -- merge the warp's row groups (butterfly over `across`) ---------------
    lines.clear()
    merged = {}
    for t in range(G):
        m, lsum, acc = with_new[t]
        for k, off in enumerate(across):
            x = f"g{t}_{k}"
            emit(
                f"  %{x}m, %{x}mok = gpu.shuffle xor {m}, %c{off}_i32, %c32_i32 : f32\n"
                f"  %{x}l, %{x}lok = gpu.shuffle xor {lsum}, %c{off}_i32, %c32_i32 : f32"
            )
            elems = []
            for e in range(8):
                emit(
                    f"  %{x}x{e} = vector.extract {acc}[{e}] : f32 from {v8('f32')}\n"
                    f"  %{x}o{e}, %{x}ok{e} = gpu.shuffle xor %{x}x{e}, %c{off}_i32, "
                    f"%c32_i32 : f32"
                )
                elems.append(f"%{x}o{e}")
            emit(
                f"  %{x}ao = vector.from_elements {', '.join(elems)} : {v8('f32')}\n"
                f"  %{x}M = arith.maximumf {m}, %{x}m : f32\n"
                f"  %{x}d1 = arith.subf {m}, %{x}M : f32\n"
                f"  %{x}w1 = math.exp %{x}d1 : f32\n"
                f"  %{x}d2 = arith.subf %{x}m, %{x}M : f32\n"
                f"  %{x}w2 = math.exp %{x}d2 : f32\n"
                f"  %{x}l1 = arith.mulf {lsum}, %{x}w1 : f32\n"
                f"  %{x}L = math.fma %{x}l, %{x}w2, %{x}l1 : f32\n"
                f"  %{x}w1b = vector.broadcast %{x}w1 : f32 to {v8('f32')}\n"
                f"  %{x}w2b = vector.broadcast %{x}w2 : f32 to {v8('f32')}\n"
                f"  %{x}a1 = arith.mulf {acc}, %{x}w1b : {v8('f32')}\n"
                f"  %{x}A = vector.fma %{x}ao, %{x}w2b, %{x}a1 : {v8('f32')}"
            )
            m, lsum, acc = f"%{x}M", f"%{x}L", f"%{x}A"
        emit(
            f"  %wo{t}a = arith.addi %wo, %cT{t}D : index\n"
            f"  %wo{t} = arith.addi %wo{t}a, %d0 : index\n"
            f"  %wm{t} = arith.addi %wm, %cT{t}x2 : index\n"
            f"  %wl{t} = arith.addi %wm{t}, %c1 : index"
        )
        merged[t] = (m, lsum, acc)
    merge_lines = "\n".join(lines)
    o_stores = "\n".join(
        f"    vector.store {merged[t][2]}, %obuf[%wo{t}] {{alignment = 16 : i64}} : {o_t}, "
        f"{v8('f32')}"
        for t in range(G)
    )
    m_stores = "\n".join(
        f"      memref.store {merged[t][0]}, %mbuf[%wm{t}] : {m_t}\n"
        f"      memref.store {merged[t][1]}, %mbuf[%wl{t}] : {m_t}"
        for t in range(G)
    )

    index_consts = "\n".join(
        [f"  %cU{u} = arith.constant {u * RC} : index" for u in range(U)]
        + [f"  %cT{t}D = arith.constant {t * D} : index" for t in range(G)]
        + [f"  %cT{t}x2 = arith.constant {t * 2} : index" for t in range(G)]
    )
    loop = f"""\
  %st:{3 * G} = scf.for %base = %c0 to %ncache step %cStep iter_args({", ".join(init)}) -> ({", ".join(types)}) {{
{step_lines}
    scf.yield {", ".join(out)} : {", ".join(types)}
  }}"""
    source = f"""\
// {name}: decode attention split (online softmax per warp), {NH} heads / {KV} kv heads of {D}, chunk {chunk}, {layers} layers, one CTA of {block_size}.
memref.global "private" @{name}__o : {o_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__m : {m_t} {{alignment = 16 : i64}}
func.func @{name}(%l: index, %b: index, %g: index, %s: index, %L: index, %qkv: {qkv_t}, %rope: {rope_t}, %kc: {c_t}, %vc: {c_t}, %op: {op_t}, %mp: {mp_t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c8 = arith.constant 8 : index
  %c32 = arith.constant 32 : index
  %cBS = arith.constant {block_size} : index
  %cRL = arith.constant {RL} : index
  %cRW = arith.constant {RW} : index
  %cStep = arith.constant {RC * U} : index
  %cChunk = arith.constant {chunk} : index
  %cD = arith.constant {D} : index
  %cHalf = arith.constant {half} : index
  %cG = arith.constant {G} : index
  %cGD = arith.constant {G * D} : index
  %cG2 = arith.constant {G * 2} : index
  %cQcol = arith.constant {NH * D} : index
  %cVcol = arith.constant {(NH + KV) * D} : index
{index_consts}
{consts}
  %c32_i32 = arith.constant 32 : i32
  %zero8 = arith.constant dense<0.0> : {v8("f32")}
  %fzero = arith.constant 0.0 : f32
  %empty = arith.constant {_f32(EMPTY_MAX)} : f32
  %scale = arith.constant {_f32(1.0 / math.sqrt(D))} : f32
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %grp = arith.divui %lane, %cRL : index
  %sub = arith.remui %lane, %cRL : index
  %is_sub0 = arith.cmpi eq, %sub, %c0 : index
  %is_grp0 = arith.cmpi eq, %grp, %c0 : index
  %is_warp0 = arith.cmpi eq, %warp, %c0 : index
  %d0 = arith.muli %sub, %c8 : index
  %wrow = arith.muli %warp, %cRW : index
  %rowt = arith.addi %wrow, %grp : index
  %wo = arith.muli %warp, %cGD : index
  %wm = arith.muli %warp, %cG2 : index
  %obuf = memref.get_global @{name}__o : {o_t}
  %mbuf = memref.get_global @{name}__m : {m_t}
  %first_split = arith.cmpi eq, %s, %c0 : index
{_split_lines(spread, align, op_t)}
  %qh0 = arith.muli %g, %cG : index
  %qcol0 = arith.muli %qh0, %cD : index
  %kvcol = arith.muli %g, %cD : index
  %kcol0 = arith.addi %cQcol, %kvcol : index
  %vcol0 = arith.addi %cVcol, %kvcol : index
  // RoPE of the G queries and k in registers (cos at dim d mod D/2, sin D/2 later).
  %dh0 = arith.remui %d0, %cHalf : index
  %dsin = arith.addi %dh0, %cHalf : index
  %cosv = vector.load %rope[%L, %dh0] {{alignment = 16 : i64}} : {rope_t}, {v8("f32")}
  %sinv = vector.load %rope[%L, %dsin] {{alignment = 16 : i64}} : {rope_t}, {v8("f32")}
  %lo_half = arith.cmpi ult, %d0, %cHalf : index
{rope_lines}
  // Position L (the split's last, if it holds it) comes from qkv, after the loop.
  %pend = arith.addi %p0, %n : index
  %endsL = arith.cmpi eq, %pend, %Lp1 : index
  %nonempty = arith.cmpi ugt, %n, %c0 : index
  %hasL = arith.andi %endsL, %nonempty : i1
  %nm1 = arith.subi %n, %c1 : index
  %ncache = arith.select %hasL, %nm1, %n : index
  // Each row group's running (max, sum, output) of each head over its rows.
{loop}
  %w0g0 = arith.andi %is_warp0, %is_grp0 : i1
  %foldL = arith.andi %hasL, %w0g0 : i1
{new_lines}
  %wr = arith.andi %first_split, %w0g0 : i1
  scf.if %wr {{
    vector.store %knb, %kc[%l, %b, %g, %L, %d0] {{alignment = 16 : i64}} : {c_t}, {v8("bf16")}
    vector.store %vnb, %vc[%l, %b, %g, %L, %d0] {{alignment = 16 : i64}} : {c_t}, {v8("bf16")}
  }}
{merge_lines}
  // A previous call on this CTA may still be reading the workgroup buffers.
  gpu.barrier
  scf.if %is_grp0 {{
{o_stores}
    scf.if %is_sub0 {{
{m_stores}
    }}
  }}
  gpu.barrier
{_warp_merge(warps, G, D, o_t, m_t, op_t, mp_t)}
  return
}}
"""
    split = _split_reference(name, chunk, spread, align, NH, KV, D)
    c_t = f"memref<{layers}x?x{KV}x?x{D}xbf16>"
    source, split = _paged.paged_and_ragged(source, name, split, 11, page_size, lengths, c_t)
    return DeviceFunction.from_mlir(source, name, split, block_size=block_size)


def _warp_merge(
    warps: int, G: int, D: int, o_t: str, m_t: str, op_t: str, mp_t: str,
    direct: str | None = None,
) -> str:  # fmt: skip
    """MLIR text: the flash-decoding merge of the ``warps`` partial states
    that the warps left in ``%obuf`` (``[warp][head][dim]``, f32) and
    ``%mbuf`` (``[warp][head]`` max and sum) into this split's ``%op`` and
    ``%mp``: thread ``i`` takes head ``i / D``, dim ``i % D``. Needs
    ``%tid``, ``%b``, ``%s``, ``%qh0``, ``%obuf``, ``%mbuf``, ``%empty``,
    ``%fzero``, ``%c0`` and ``%c1``. ``direct`` (the type of
    ``%attn``; needs ``%nsplit``): when the grid has one split, the merge
    is the attention's output, ``attn[b, h*D + d] = bf16(o / l)``, stored
    there instead of the partials (no combine needed)."""
    lines = [
        f"  %wm_bs = arith.constant {warps * 32} : index",
        f"  %wm_gd = arith.constant {G * D} : index",
        f"  %wm_d = arith.constant {D} : index",
        "  %wm_two = arith.constant 2 : index",
        "  scf.for %i = %tid to %wm_gd step %wm_bs {",
        "    %ft = arith.divui %i, %wm_d : index",
        "    %fdim = arith.remui %i, %wm_d : index",
        "    %ti2 = arith.muli %ft, %wm_two : index",
    ]
    M = "%empty"
    for w in range(warps):
        lines.append(
            f"    %fm{w}i = arith.addi %ti2, %wm_c{w * G * 2} : index\n"
            f"    %fm{w} = memref.load %mbuf[%fm{w}i] : {m_t}\n"
            f"    %fM{w} = arith.maximumf {M}, %fm{w} : f32"
        )
        M = f"%fM{w}"
    total, num = "%fzero", "%fzero"
    for w in range(warps):
        lines.append(
            f"    %fl{w}i = arith.addi %fm{w}i, %c1 : index\n"
            f"    %fl{w} = memref.load %mbuf[%fl{w}i] : {m_t}\n"
            f"    %fo{w}i = arith.addi %i, %wm_c{w * G * D} : index\n"
            f"    %fo{w} = memref.load %obuf[%fo{w}i] : {o_t}\n"
            f"    %fd{w} = arith.subf %fm{w}, {M} : f32\n"
            f"    %fw{w} = math.exp %fd{w} : f32\n"
            f"    %fs{w} = math.fma %fl{w}, %fw{w}, {total} : f32\n"
            f"    %fn{w} = math.fma %fo{w}, %fw{w}, {num} : f32"
        )
        total, num = f"%fs{w}", f"%fn{w}"
    consts = sorted({w * G * 2 for w in range(warps)} | {w * G * D for w in range(warps)})
    lines[0:0] = [f"  %wm_c{c} = arith.constant {c} : index" for c in consts]
    partials = f"""\
    memref.store {num}, %op[%b, %fh, %s, %fdim] : {op_t}
    %fdim0 = arith.cmpi eq, %fdim, %c0 : index
    scf.if %fdim0 {{
      memref.store {M}, %mp[%b, %fh, %s, %c0] : {mp_t}
      memref.store {total}, %mp[%b, %fh, %s, %c1] : {mp_t}
    }}"""
    if direct is not None:
        partials = f"""\
    %single = arith.cmpi eq, %nsplit, %c1 : index
    scf.if %single {{
      %fout = arith.divf {num}, {total} : f32
      %fbf = arith.truncf %fout : f32 to bf16
      %fcol0 = arith.muli %fh, %wm_d : index
      %fcol = arith.addi %fcol0, %fdim : index
      memref.store %fbf, %attn[%b, %fcol] : {direct}
    }} else {{
{textwrap.indent(partials, "  ")}
    }}"""
    lines.append(f"    %fh = arith.addi %qh0, %ft : index\n{partials}\n  }}")
    return "\n".join(lines)


def _check_attention(
    name: str, block_size: int, chunk: int, heads: int, kv_heads: int, head_dim: int,
    layers: int, **steps: int,
) -> int:  # fmt: skip
    """The checks every attention tile makes of its arguments (``steps``:
    its loads per loop step, by name); returns the warps of the CTA."""
    warps = _check_block(name, block_size)
    _positive(
        name, chunk=chunk, heads=heads, kv_heads=kv_heads, head_dim=head_dim, layers=layers,
        **steps,
    )  # fmt: skip
    if heads % kv_heads:
        raise GraphError(f"tile '{name}': heads={heads} is not a multiple of kv_heads={kv_heads}")
    _multiple_of_8(name, head_dim=head_dim)
    return warps


def _split_lines(spread: bool, align: int, op_t: str, bounded: bool = True) -> str:
    """MLIR text: ``%p0`` and ``%n``, the positions ``[p0, p0 + n)`` of split
    ``%s`` (see :func:`_split_positions`). Needs ``%L``, ``%s``, ``%op``,
    ``%c1`` and ``%cChunk``. ``bounded=False``, for a tile that holds no
    span: a spread split is not cut at ``chunk``, and the last split of
    chunks runs to ``L + 1``."""
    lp1 = "  %Lp1 = arith.addi %L, %c1 : index"
    dims = f"""\
{lp1}
  %cSplitDim = arith.constant 2 : index
  %nsplit = memref.dim %op, %cSplitDim : {op_t}"""
    if spread:
        ext = (
            "  %sp_ext = arith.cmpi ult, %span, %cChunk : index"
            if bounded
            else "  %sp_ext = arith.constant true"
        )
        cut = (
            "\n  // The buffers hold chunk positions (the graph keeps the span below it).\n"
            "  %n = arith.minui %nall, %cChunk : index"
            if bounded
            else ""
        )
        return f"""\
  // Positions [p0, p0 + n) of this split: the grid's splits share the L
  // cached positions evenly, and position L rides in the split reaching it.
{dims}
  %cAlign = arith.constant {align} : index
  %cAlignM1 = arith.constant {align - 1} : index
  %spa = arith.addi %L, %nsplit : index
  %spb = arith.subi %spa, %c1 : index
  %spc = arith.divui %spb, %nsplit : index
  // Rounded up to whole loop steps: a split's last step is never a sliver.
  %spd = arith.addi %spc, %cAlignM1 : index
  %spe = arith.divui %spd, %cAlign : index
  %span = arith.muli %spe, %cAlign : index
  %sp_p0r = arith.muli %s, %span : index
  %sp_endr = arith.addi %sp_p0r, %span : index
  // Position L rides in the split that reaches it, if that one has room
  // (a span of chunk cannot take one more): the next split is then empty.
{ext}
  %sp_pastL = arith.cmpi ugt, %sp_p0r, %L : index
  %sp_atL = arith.cmpi eq, %sp_p0r, %L : index
  %sp_atLx = arith.andi %sp_atL, %sp_ext : i1
  %sp_late = arith.ori %sp_pastL, %sp_atLx : i1
  %sp_cS0 = arith.constant 0 : index
  %sp_notFirst = arith.cmpi ne, %s, %sp_cS0 : index
  %sp_empty = arith.andi %sp_late, %sp_notFirst : i1
  %p0 = arith.select %sp_empty, %Lp1, %sp_p0r : index
  %sp_reachL = arith.cmpi uge, %sp_endr, %L : index
  %sp_take = arith.andi %sp_reachL, %sp_ext : i1
  %sp_p1e = arith.select %sp_take, %Lp1, %sp_endr : index
  %sp_p1b = arith.minui %sp_p1e, %Lp1 : index
  %p1 = arith.maxui %sp_p1b, %p0 : index
  {"%nall" if bounded else "%n"} = arith.subi %p1, %p0 : index{cut}"""
    last = ""
    if not bounded:  # the last split runs to L + 1
        last = """
  %lastS = arith.subi %nsplit, %c1 : index
  %isLast = arith.cmpi eq, %s, %lastS : index
  %p1e = arith.select %isLast, %Lp1, %p1a : index"""
    return f"""\
  // Positions [p0, p0 + n) of this split.
{lp1 if bounded else dims}
  %p0 = arith.muli %s, %cChunk : index
  %p1a = arith.addi %p0, %cChunk : index{last}
  %p1b = arith.minui {"%p1e" if last else "%p1a"}, %Lp1 : index
  %p1 = arith.maxui %p1b, %p0 : index
  %n = arith.subi %p1, %p0 : index"""


def _split_reference(
    name: str, chunk: int, spread: bool, align: int, NH: int, KV: int, D: int,
    bounded: bool = True,
):  # fmt: skip
    """The numpy reference of one attention split (both attention tiles):
    ``split(l, b, g, s, L, qkv, rope, kc, vc, opart, mpart, attn=None)``;
    with ``attn`` and one split, the output itself (``_warp_merge``'s
    ``direct``)."""
    G = NH // KV
    scale = 1.0 / math.sqrt(D)

    def split(l, b, g, s, L, qkv, rope, kc, vc, opart, mpart, attn=None) -> None:  # noqa: E741
        cos_sin = rope[L]
        k_new = rope_bf16(qkv[b, NH * D + g * D : NH * D + (g + 1) * D], cos_sin)
        v_new = qkv[b, (NH + KV) * D + g * D : (NH + KV) * D + (g + 1) * D]
        heads_of_g = slice(g * G, (g + 1) * G)
        q = bf16_to_f32(rope_bf16(qkv[b, g * G * D : (g + 1) * G * D].reshape(G, D), cos_sin))
        p0, p1 = _split_positions(name, chunk, spread, s, L, opart.shape[2], align, bounded)
        # Positions < L from the cache, L from this tile (read before the write below).
        keys = bf16_to_f32(kc[l, b, g, p0 : min(p1, L)])
        vals = bf16_to_f32(vc[l, b, g, p0 : min(p1, L)])
        if p0 <= L < p1:
            keys = np.concatenate([keys, bf16_to_f32(k_new)[None]])
            vals = np.concatenate([vals, bf16_to_f32(v_new)[None]])
        if s == 0:
            kc[l, b, g, L] = k_new
            vc[l, b, g, L] = v_new
        if p0 >= p1:
            opart[b, heads_of_g, s] = 0
            mpart[b, heads_of_g, s, 0] = np.float32(EMPTY_MAX)
            mpart[b, heads_of_g, s, 1] = 0
            return
        scores = (q @ keys.T).astype(np.float32) * np.float32(scale)  # (G, n)
        m = scores.max(axis=1)
        e = np.exp(scores - m[:, None]).astype(np.float32)
        o = (e @ vals).astype(np.float32)
        total = e.sum(axis=1, dtype=np.float32)
        if attn is not None and opart.shape[2] == 1:
            out = (o / total[:, None]).astype(np.float32).reshape(-1)
            attn[b, g * G * D : (g + 1) * G * D] = f32_to_bf16(out)
            return
        opart[b, heads_of_g, s] = o
        mpart[b, heads_of_g, s, 0] = m
        mpart[b, heads_of_g, s, 1] = total

    return split


def _split_positions(
    name: str, chunk: int, spread: bool, s: int, L: int, splits: int, step: int,
    bounded: bool = True,
) -> tuple[int, int]:  # fmt: skip
    """Positions ``[p0, p1)`` of split ``s`` of :func:`attention`. A tile
    that holds no span (``bounded=False``) takes splits past ``chunk``: a
    spread split as long as the count makes it, the last of the chunks up
    to ``L + 1``."""
    if not spread:
        end = L + 1 if not bounded and s == splits - 1 else s * chunk + chunk
        return min(s * chunk, L + 1), max(min(end, L + 1), min(s * chunk, L + 1))
    even = -(-L // splits)  # ceil(L / splits): the cached positions
    span = -(-even // step) * step  # in whole loop steps
    if span > chunk and bounded:
        raise GraphError(
            f"tile '{name}': {splits} splits of L + 1 = {L + 1} positions are longer than "
            f"chunk={chunk}: the grid needs at least {-(-(L + 1) // chunk)} splits"
        )
    # Position L rides in the split that reaches it, if that one has room.
    ext = span < chunk or not bounded
    p0, end = s * span, s * span + span
    if s and (p0 > L or (p0 == L and ext)):
        p0 = L + 1
    p1 = L + 1 if ext and end >= L else min(end, L + 1)
    return p0, max(p1, p0)


_JOIN = (
    "  // A previous call on this CTA may still be reading the workgroup buffers.\n  gpu.barrier\n"
)


def _move_staging_to_prefetch(source: str, name: str, addresses: str, copies: str) -> str:
    """The attention source with its ``stage_kv`` copies moved from the body
    into ``@<name>__prefetch``: the body's constants and split positions, the
    join with the previous instance, the slot ``addresses`` and the
    ``copies``. The body keeps the addresses (it reads the slots)."""
    head, rest = source.split(_JOIN, 1)
    staging = addresses + "\n" + copies
    assert rest.startswith(staging), "the staging copies follow the join"
    signature_at = head.index(f"func.func @{name}(")
    preamble = head[signature_at:].replace(
        f"func.func @{name}(", f"func.func @{name}__prefetch(", 1
    )
    body = head + _JOIN + addresses + rest[len(staging) :]
    return body + preamble + _JOIN + staging + "\n  return\n}\n"


# ----------------------------------------------------------------------------
# attention_combine
# ----------------------------------------------------------------------------
@checked_arguments
def attention_combine(
    heads: int,
    head_dim: int,
    *,
    name: str = "attention_combine",
    block_size: int = 256,
    group: int | None = None,
    merge_unroll: int = 1,
) -> DeviceFunction:
    """Tile ``(l, b)``: ``attn[b, h*D + d] = bf16(sum_s w_s opart[b, h, s, d] /
    sum_s w_s mpart[b, h, s, 1])`` with ``w_s = exp(mpart[b, h, s, 0] - M)``,
    ``M = max_s mpart[b, h, s, 0]``; ``l`` is unused (it orders the task by
    layer). Each thread takes 8 dims of a head: one pass over the splits for
    M, one for the sums (32-byte loads of opart, 16-byte stores).
    Args: ``opart: memref<?xNHx?xDxf32>``, ``mpart: memref<?xNHx?x2xf32>``,
    ``attn: memref<?x(NH*D)xbf16>``.

    ``group`` (a divisor of ``heads``): tile ``(l, b, g)`` merges heads
    ``[g*group, (g+1)*group)`` only, and the splits are shared too: each
    8-dim item gets ``lanes`` consecutive threads (``block_size`` over the
    items, a power of two up to 32), lane ``k`` folds splits ``k, k +
    lanes, ...`` into a running max, sum and output (online softmax) and
    a shuffle butterfly merges the lanes (each lane loading ``merge_unroll``
    of its splits before folding any). One CTA walking all the splits of
    a whole row is a chain of dependent L2 round trips (4 µs a layer for
    one sequence on an H200); this is a few."""
    _check_block(name, block_size)
    _positive(name, heads=heads, head_dim=head_dim)
    _multiple_of_8(name, head_dim=head_dim)
    NH, D = heads, head_dim
    op_t, mp_t = f"memref<?x{NH}x?x{D}xf32>", f"memref<?x{NH}x?x2xf32>"
    a_t = f"memref<?x{NH * D}xbf16>"
    _positive(name, merge_unroll=merge_unroll)
    if group is not None:
        return _combine_grouped(name, NH, D, group, block_size, op_t, mp_t, a_t, merge_unroll)
    source = f"""\
// {name}: merge the attention splits of {NH} heads of {D}, one CTA of {block_size}.
func.func @{name}(%l: index, %b: index, %op: {op_t}, %mp: {mp_t}, %attn: {a_t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c8 = arith.constant 8 : index
  %cBS = arith.constant {block_size} : index
  %cD = arith.constant {D} : index
  %cDC = arith.constant {D // 8} : index
  %cItems = arith.constant {NH * D // 8} : index
  %zero8 = arith.constant dense<0.0> : vector<8xf32>
  %fzero = arith.constant 0.0 : f32
  %lowest = arith.constant {_f32(-3.0e38)} : f32
  %tid = gpu.thread_id x
  %ns = memref.dim %op, %c2 : {op_t}
{_combine_loop("%c0", "%cItems", "%ns", op_t, mp_t, a_t)}
  return
}}
"""

    def reference(l: int, b: int, op: np.ndarray, mp: np.ndarray, attn: np.ndarray) -> None:  # noqa: E741
        attn[b] = _merge_splits(op, mp, b, slice(None), mp.shape[2])

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def _combine_grouped(
    name: str, NH: int, D: int, group: int, block_size: int, op_t: str, mp_t: str, a_t: str,
    merge_unroll: int,
) -> DeviceFunction:  # fmt: skip
    """:func:`attention_combine` with ``group``: heads and splits shared out."""
    _positive(name, group=group)
    if NH % group:
        raise GraphError(f"tile '{name}': group={group} does not divide heads={NH}")
    items = group * D // 8
    if items > block_size:
        raise GraphError(
            f"tile '{name}': group={group} heads of {D} are {items} items of 8 dims, more than "
            f"block_size={block_size} threads"
        )
    lanes = _merge_lanes(items, block_size)
    source = f"""\
// {name}: merge the attention splits of {group} of {NH} heads of {D}: {items} items x
// {lanes} lanes of a CTA of {block_size}.
func.func @{name}(%l: index, %b: index, %g: index, %op: {op_t}, %mp: {mp_t}, %attn: {a_t}) {{
  %c2 = arith.constant 2 : index
  %cG = arith.constant {group} : index
  %tid = gpu.thread_id x
  %ns = memref.dim %op, %c2 : {op_t}
  %h0 = arith.muli %g, %cG : index
{_shared_merge("%h0", items, lanes, "%ns", D, op_t, mp_t, a_t, unroll=merge_unroll)}
  return
}}
"""
    heads_of = group

    def reference(l: int, b: int, g: int, op: np.ndarray, mp: np.ndarray, attn: np.ndarray) -> None:  # noqa: E741
        h0 = g * heads_of
        attn[b, h0 * D : (h0 + heads_of) * D] = _merge_splits(
            op, mp, b, slice(h0, h0 + heads_of), mp.shape[2]
        )

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def _check_fused_combine(name: str, G: int, D: int, block_size: int, unroll: int) -> None:
    _positive(name, merge_unroll=unroll)
    if G * D // 8 > block_size:
        raise GraphError(
            f"tile '{name}': combine merges {G} heads of {D} as {G * D // 8} items of 8 dims, "
            f"more than block_size={block_size} threads"
        )


_FLAG_T = f"memref<1xi32, {_WG}>"


def _fused_combine_global(name: str) -> str:
    """The workgroup word through which thread 0 tells the CTA its count."""
    return f'memref.global "private" @{name}__last : {_FLAG_T} {{alignment = 4 : i64}}'


def _fused_combine(
    name: str, G: int, D: int, KV: int, block_size: int, layers: int, g: str, splits: str,
    NH: int, unroll: int, after_count: str = "", merge_stamps: tuple[str, str] = ("", ""),
) -> str:  # fmt: skip
    """MLIR text of an attention split's fused combine (``combine=True`` of
    both attention tiles): after the partials are written, thread 0 adds 1
    to ``%cnt[%l, %b, g]`` (acquire-release, so the other splits' partials
    are visible to the CTA after the barrier), and the CTA whose count
    completes ``splits`` merges the splits of heads ``%qh0 ..`` into
    ``%attn`` (:func:`_shared_merge`). Needs ``%tid``, ``%l``, ``%b``,
    ``%qh0``, ``%c0``, ``%c1``, ``%op``, ``%mp``, ``%cnt`` and ``%attn``."""
    cnt_t = f"memref<{layers}x?x{KV}xi32>"
    op_t, mp_t = f"memref<?x{NH}x?x{D}xf32>", f"memref<?x{NH}x?x2xf32>"
    a_t = f"memref<?x{NH * D}xbf16>"
    items = G * D // 8
    merge = _shared_merge(
        "%qh0",
        items,
        _merge_lanes(items, block_size),
        splits,
        D,
        op_t,
        mp_t,
        a_t,
        p="fc_",
        unroll=unroll,
        stamps=merge_stamps,
    )
    return f"""\
  // Fused combine: the last of the group's splits to count merges them all.
  gpu.barrier
  %fc_flag = memref.get_global @{name}__last : {_FLAG_T}
  %fc_t0 = arith.cmpi eq, %tid, %c0 : index
  scf.if %fc_t0 {{
    %fc_c4 = arith.constant 4 : index
    %fc_kv = arith.constant {KV} : index
    %fc_nb = memref.dim %cnt, %c1 : {cnt_t}
    %fc_i0 = arith.muli %l, %fc_nb : index
    %fc_i1 = arith.addi %fc_i0, %b : index
    %fc_i2 = arith.muli %fc_i1, %fc_kv : index
    %fc_i3 = arith.addi %fc_i2, {g} : index
    %fc_off = arith.muli %fc_i3, %fc_c4 : index
    %fc_base = memref.extract_aligned_pointer_as_index %cnt : {cnt_t} -> index
    %fc_at = arith.addi %fc_base, %fc_off : index
    %fc_at64 = arith.index_cast %fc_at : index to i64
    %fc_old = llvm.inline_asm has_side_effects "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;", "=r,l" %fc_at64 : (i64) -> i32
    memref.store %fc_old, %fc_flag[%c0] : {_FLAG_T}
  }}
  gpu.barrier
  %fc_seen = memref.load %fc_flag[%c0] : {_FLAG_T}
  %fc_seen_x = arith.index_cast %fc_seen : i32 to index
  %fc_done = arith.addi %fc_seen_x, %c1 : index
  %fc_last = arith.cmpi eq, %fc_done, {splits} : index
{after_count}  scf.if %fc_last {{
{merge}
  }}"""


def _fused_combine_reference(
    layer: int, b: int, g: int, op: np.ndarray, mp: np.ndarray, count: np.ndarray,
    attn: np.ndarray, G: int, D: int,
) -> None:  # fmt: skip
    """Reference of :func:`_fused_combine`: count the split; the one that
    completes the partials' split count merges kv head ``g``'s ``G`` heads."""
    count[layer, b, g] += 1
    splits = op.shape[2]
    if count[layer, b, g] == splits:
        heads = slice(g * G, (g + 1) * G)
        attn[b, g * G * D : (g + 1) * G * D] = _merge_splits(op, mp, b, heads, splits)


class _ClusterMeeting:
    """MLIR text of the phased attention's cluster meeting
    (``attention(cluster=...)``): a group's ``cluster`` splits on one
    thread-block cluster hand their partials to the CTA of rank 0 through
    distributed shared memory. A split's slot holds ``G * D`` outputs
    (head-major) and then ``G`` (max, sum) pairs: ``floats`` words. Names
    start with ``cl``; the text needs ``%tid``, ``%s``, ``%c0`` and
    ``%qh0``."""

    def __init__(self, name: str, cluster: int, G: int, D: int) -> None:
        self.name, self.cluster, self.G, self.D = name, cluster, G, D
        self.floats = G * D + 2 * G
        self.slots_t = f"memref<{cluster * self.floats}xf32, {_WG}>"
        self.bar_t = f"memref<1xi64, {_WG}>"

    def globals(self) -> str:
        return (
            f'memref.global "private" @{self.name}__cm : {self.slots_t} {{alignment = 16 : i64}}\n'
            f'memref.global "private" @{self.name}__cbar : {self.bar_t} {{alignment = 8 : i64}}\n'
        )

    def slots(self) -> tuple[str, str, int, int]:
        """:func:`_shared_merge`'s ``slots``."""
        return "%cl_cm", self.slots_t, self.floats, self.G * self.D

    def prologue(self) -> str:
        """Rank 0's thread 0 makes the mbarrier that counts the other
        splits' bytes (a fresh one each instance: the words are other tiles'
        in between), then every thread arrives on the cluster barrier, which
        publishes it; the other CTAs push only after waiting there."""
        tx = (self.cluster - 1) * self.floats * 4
        asm = _text.asm_line
        return f"""\
  // The cluster meeting: rank 0 takes the group's partials in @{self.name}__cm.
  %cl_cm = memref.get_global @{self.name}__cm : {self.slots_t}
  %cl_cmp = memref.extract_aligned_pointer_as_index %cl_cm : {self.slots_t} -> index
  %cl_cm32 = arith.index_cast %cl_cmp : index to i32
  %cl_barm = memref.get_global @{self.name}__cbar : {self.bar_t}
  %cl_barp = memref.extract_aligned_pointer_as_index %cl_barm : {self.bar_t} -> index
  %cl_bar = arith.index_cast %cl_barp : index to i32
  %cl_rank = llvm.inline_asm has_side_effects asm_dialect = att "mov.u32 $0, %cluster_ctarank;", "=r" : () -> i32
  %cl_zero = arith.constant 0 : i32
  %cl_lead = arith.cmpi eq, %cl_rank, %cl_zero : i32
  %cl_remote = llvm.inline_asm asm_dialect = att "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r" %cl_cm32, %cl_zero : (i32, i32) -> i32
  %cl_rbar = llvm.inline_asm asm_dialect = att "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r" %cl_bar, %cl_zero : (i32, i32) -> i32
  %cl_cFloats = arith.constant {self.floats} : index
  %cl_c4 = arith.constant 4 : index
  %cl_splits = arith.constant {self.cluster} : index
  %cl_slot0 = arith.muli %s, %cl_cFloats : index
  %cl_t0 = arith.cmpi eq, %tid, %c0 : index
  %cl_init = arith.andi %cl_lead, %cl_t0 : i1
  scf.if %cl_init {{
    %cl_tx = arith.constant {tx} : i32
    {asm("mbarrier.init.shared::cta.b64 [$0], 1;", [("%cl_bar", "i32")], memory=True)}
    {asm("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", [("%cl_bar", "i32"), ("%cl_tx", "i32")], memory=True)}
    {asm("fence.mbarrier_init.release.cluster;", [], memory=True)}
  }}
  {asm("barrier.cluster.arrive.release.aligned;", [], memory=True)}
"""

    def arrived(self) -> str:
        """Every CTA of the cluster has arrived (rank 0's mbarrier is ready)."""
        return f"  {_text.asm_line('barrier.cluster.wait.acquire.aligned;', [], memory=True)}\n"

    def push(
        self, values: list[str], p: str, head: str | None = None, at: str | None = None
    ) -> str:
        """Store ``values`` (f32, consecutive words) at this split's slot:
        rank 0 into its own workgroup memory, the others into rank 0's by
        ``st.async`` completing their bytes on its mbarrier. ``head``: head
        ``head``'s (max, sum) pair; ``at``: output word ``at``."""
        offset, off = "", at  # the values' first word within the slot
        if head is not None:
            offset = (
                f"      {p}c2 = arith.constant 2 : index\n"
                f"      {p}cOuts = arith.constant {self.G * self.D} : index\n"
                f"      {p}h2 = arith.muli {head}, {p}c2 : index\n"
                f"      {p}off = arith.addi {p}h2, {p}cOuts : index\n"
            )
            off = f"{p}off"
        n = len(values)
        vec = ".v2" if n == 2 else ""
        regs = "{" + ", ".join(f"${q + 1}" for q in range(n)) + "}" if n > 1 else "$1"
        local = "\n".join(
            (
                f"        {p}c{q} = arith.constant {q} : index\n"
                f"        {p}i{q} = arith.addi {p}at, {p}c{q} : index\n"
                if q
                else ""
            )
            + f"        memref.store {v}, %cl_cm[{f'{p}i{q}' if q else f'{p}at'}] : {self.slots_t}"
            for q, v in enumerate(values)
        )
        remote = _text.asm_line(
            f"st.async.shared::cluster.mbarrier::complete_tx::bytes{vec}.f32 [$0], {regs}, "
            f"[${n + 1}];",
            [(f"{p}addr", "i32"), *[(v, "f32") for v in values], ("%cl_rbar", "i32")],
            memory=True,
        )
        return f"""\
{offset}      {p}at = arith.addi %cl_slot0, {off} : index
      scf.if %cl_lead {{
{local}
      }} else {{
        {p}b = arith.muli {p}at, %cl_c4 : index
        {p}b32 = arith.index_cast {p}b : index to i32
        {p}addr = arith.addi %cl_remote, {p}b32 : i32
        {remote}
      }}"""

    def merge(self, merge: str, counted: str) -> str:
        """Rank 0: wait for the other splits' bytes (trapping as
        ``MBAR_WAIT`` does if they never come), then ``merge`` from the
        slots; the mbarrier is given up once every thread is past it."""
        wait = _text.asm_line(_text.MBAR_WAIT_CLUSTER, [("%cl_bar", "i32"), ("%cl_zero", "i32")])
        inval = _text.asm_line("mbarrier.inval.shared::cta.b64 [$0];", [("%cl_bar", "i32")])
        return f"""\
  // Rank 0 merges the group once the other splits' partials are in.
  scf.if %cl_lead {{
    {wait}
    gpu.barrier
    scf.if %cl_t0 {{
      {inval}
    }}
{counted}{merge}
  }}
"""


def _merge_lanes(items: int, block_size: int) -> int:
    """Lanes per 8-dim item of :func:`_shared_merge`: a power of two up to 32."""
    lanes = 1
    while lanes * 2 <= min(32, block_size // items):
        lanes *= 2
    return lanes


def _shared_merge(
    first_head: str, items: int, lanes: int, splits: str, D: int, op_t: str, mp_t: str, a_t: str,
    p: str = "", unroll: int = 1, stamps: tuple[str, str] = ("", ""),
    slots: tuple[str, str, int, int] | None = None,
) -> str:  # fmt: skip
    """The flash-decoding merge of ``items`` 8-dim items of heads
    ``first_head ..`` of row ``%b`` with the splits shared out: item ``tid /
    lanes`` gets ``lanes`` consecutive threads, lane ``k`` folds splits ``k,
    k + lanes, ...`` (below ``splits``) into a running max, sum and output
    (online softmax), and a shuffle butterfly merges the lanes; lane 0 stores
    ``%attn[%b, h*D + d .. +8]``. One thread walking all the splits is a chain
    of dependent L2 round trips, and so is a lane walking several: a lane
    loads ``unroll`` of its splits (those past ``splits`` read its first one
    and count as empty) before folding any, one round trip for up to
    ``lanes * unroll`` splits. ``stamps``: text after the lanes' loop and
    after their shuffles (a measuring aid). Needs ``%tid``; names start with
    ``p``. ``slots = (memref, type, floats, outputs)``: the partials are in
    workgroup memory instead, split ``s``'s from float ``s * floats``: its
    ``outputs`` partial outputs (head-major), then its (max, sum) pairs, as
    :class:`_ClusterMeeting` leaves them."""

    def vec_shuffle(v: str, off: int, q: str) -> tuple[list[str], str]:
        ops, parts = [], []
        for e in range(8):
            ops += [
                f"    %{q}x{e} = vector.extract {v}[{e}] : f32 from vector<8xf32>",
                f"    %{q}y{e}, %{q}k{e} = gpu.shuffle xor %{q}x{e}, %{p}c{off}_i32, %{p}c32_i32 : f32",
            ]
            parts.append(f"%{q}y{e}")
        ops.append(f"    %{q}v = vector.from_elements {', '.join(parts)} : vector<8xf32>")
        return ops, f"%{q}v"

    def merge(m: str, z: str, a: str, mo: str, zo: str, ao: str, q: str) -> list[str]:
        """Two (max, sum, output) states into one: the online softmax's merge."""
        return [
            f"    %{q}m = arith.maximumf {m}, {mo} : f32",
            f"    %{q}d0 = arith.subf {m}, %{q}m : f32",
            f"    %{q}d1 = arith.subf {mo}, %{q}m : f32",
            f"    %{q}e0 = math.exp %{q}d0 : f32",
            f"    %{q}e1 = math.exp %{q}d1 : f32",
            f"    %{q}z0 = arith.mulf {z}, %{q}e0 : f32",
            f"    %{q}z = math.fma {zo}, %{q}e1, %{q}z0 : f32",
            f"    %{q}b0 = vector.broadcast %{q}e0 : f32 to vector<8xf32>",
            f"    %{q}b1 = vector.broadcast %{q}e1 : f32 to vector<8xf32>",
            f"    %{q}a0 = arith.mulf {a}, %{q}b0 : vector<8xf32>",
            f"    %{q}a = math.fma {ao}, %{q}b1, %{q}a0 : vector<8xf32>",
        ]

    body = []
    m, z, a = f"%{p}m", f"%{p}z", f"%{p}acc"
    off = lanes // 2
    while off:
        q = f"{p}s{off}_"
        body += [
            f"    %{q}mo, %{q}mk = gpu.shuffle xor {m}, %{p}c{off}_i32, %{p}c32_i32 : f32",
            f"    %{q}zo, %{q}zk = gpu.shuffle xor {z}, %{p}c{off}_i32, %{p}c32_i32 : f32",
        ]
        ops, ao = vec_shuffle(a, off, q)
        body += ops + merge(m, z, a, f"%{q}mo", f"%{q}zo", ao, q)
        m, z, a = f"%{q}m", f"%{q}z", f"%{q}a"
        off //= 2
    shuffle_consts = "\n".join(
        f"  %{p}c{o}_i32 = arith.constant {o} : i32" for o in (1, 2, 4, 8, 16) if o < lanes
    )
    loads, loop = [], []
    state = (f"%{p}m0", f"%{p}z0", f"%{p}a0")
    for u in range(unroll):  # every load of the step first, then the folds
        q = f"{p}u{u}_"
        at = f"%{p}s"
        if u:
            loads += [
                f"    %{q}s = arith.addi %{p}s, %{p}cStep{u} : index",
                f"    %{q}ok = arith.cmpi ult, %{q}s, {splits} : index",
                f"    %{q}at = arith.select %{q}ok, %{q}s, %{p}s : index",
            ]
            at = f"%{q}at"
        if slots:
            buf, buf_t, _, _ = slots
            loads += [
                f"    %{q}sb = arith.muli {at}, %{p}cFloats : index",
                f"    %{q}mi = arith.addi %{q}sb, %{p}mofs : index",
                f"    %{q}si = arith.addi %{q}mi, %{p}c1 : index",
                f"    %{q}oi = arith.addi %{q}sb, %{p}oofs : index",
                f"    %{q}ms = memref.load {buf}[%{q}mi] : {buf_t}",
                f"    %{q}ss = memref.load {buf}[%{q}si] : {buf_t}",
                f"    %{q}o = vector.load {buf}[%{q}oi] {{alignment = 16 : i64}} : "
                f"{buf_t}, vector<8xf32>",
            ]
        else:
            loads += [
                f"    %{q}ms = memref.load %mp[%b, %{p}h, {at}, %{p}c0] : {mp_t}",
                f"    %{q}ss = memref.load %mp[%b, %{p}h, {at}, %{p}c1] : {mp_t}",
                f"    %{q}o = vector.load %op[%b, %{p}h, {at}, %{p}d] {{alignment = 16 : i64}} : "
                f"{op_t}, vector<8xf32>",
            ]
        got = (f"%{q}ms", f"%{q}ss", f"%{q}o")
        if u:  # past the splits: the empty state (max lowest, sum 0, output 0)
            loads += [
                f"    %{q}mv = arith.select %{q}ok, %{q}ms, %{p}lowest : f32",
                f"    %{q}sv = arith.select %{q}ok, %{q}ss, %{p}fzero : f32",
                f"    %{q}ov = arith.select %{q}ok, %{q}o, %{p}zero8 : vector<8xf32>",
            ]
            got = (f"%{q}mv", f"%{q}sv", f"%{q}ov")
        loop += merge(*state, *got, f"{q}f_")
        state = (f"%{q}f_m", f"%{q}f_z", f"%{q}f_a")
    loop = loads + loop
    step_consts = "\n".join(
        f"  %{p}cStep{u} = arith.constant {u * lanes} : index" for u in range(1, unroll)
    )
    nl = "\n"
    slot_lines = ""
    if slots:  # this thread's (max, sum) and output offsets within a split's slot
        slot_lines = f"""
    %{p}cTwo = arith.constant 2 : index
    %{p}cFloats = arith.constant {slots[2]} : index
    %{p}cOuts = arith.constant {slots[3]} : index
    %{p}hq2 = arith.muli %{p}hq, %{p}cTwo : index
    %{p}mofs = arith.addi %{p}cOuts, %{p}hq2 : index
    %{p}hqD = arith.muli %{p}hq, %{p}cD : index
    %{p}oofs = arith.addi %{p}hqD, %{p}d : index"""
    return f"""\
  %{p}c0 = arith.constant 0 : index
  %{p}c1 = arith.constant 1 : index
  %{p}c8 = arith.constant 8 : index
  %{p}cD = arith.constant {D} : index
  %{p}cDC = arith.constant {D // 8} : index
  %{p}cLanes = arith.constant {lanes} : index
  %{p}cStride = arith.constant {lanes * unroll} : index
  %{p}cItems = arith.constant {items} : index
{step_consts}
  %{p}c32_i32 = arith.constant 32 : i32
{shuffle_consts}
  %{p}zero8 = arith.constant dense<0.0> : vector<8xf32>
  %{p}fzero = arith.constant 0.0 : f32
  %{p}lowest = arith.constant {_f32(-3.0e38)} : f32
  %{p}item = arith.divui %tid, %{p}cLanes : index
  %{p}lane = arith.remui %tid, %{p}cLanes : index
  %{p}active = arith.cmpi ult, %{p}item, %{p}cItems : index
  scf.if %{p}active {{
    %{p}hq = arith.divui %{p}item, %{p}cDC : index
    %{p}h = arith.addi {first_head}, %{p}hq : index
    %{p}dc = arith.remui %{p}item, %{p}cDC : index
    %{p}d = arith.muli %{p}dc, %{p}c8 : index{slot_lines}
    %{p}m, %{p}z, %{p}acc = scf.for %{p}s = %{p}lane to {splits} step %{p}cStride
        iter_args(%{p}m0 = %{p}lowest, %{p}z0 = %{p}fzero, %{p}a0 = %{p}zero8) -> (f32, f32, vector<8xf32>) {{
{nl.join(loop)}
    scf.yield {", ".join(state)} : f32, f32, vector<8xf32>
    }}
{stamps[0]}{nl.join(body)}
{stamps[1]}    %{p}first = arith.cmpi eq, %{p}lane, %{p}c0 : index
    scf.if %{p}first {{
      %{p}den = vector.broadcast {z} : f32 to vector<8xf32>
      %{p}r = arith.divf {a}, %{p}den : vector<8xf32>
      %{p}rb = arith.truncf %{p}r : vector<8xf32> to vector<8xbf16>
      %{p}hd = arith.muli %{p}h, %{p}cD : index
      %{p}col = arith.addi %{p}hd, %{p}d : index
      vector.store %{p}rb, %attn[%b, %{p}col] {{alignment = 16 : i64}} : {a_t}, vector<8xbf16>
    }}
  }}"""


def _combine_loop(first_head: str, items: str, splits: str, op_t: str, mp_t: str, a_t: str,
                  p: str = "") -> str:  # fmt: skip
    """The flash-decoding merge of heads ``first_head + q / (D/8)`` of row
    ``%b``: thread ``%tid`` takes items ``q = tid, tid + BS, ...`` below
    ``items`` (8 dims of a head each) over the first ``splits`` slots of
    ``%op``/``%mp`` and stores ``%attn[%b, h*D + d .. +8]``. Needs ``%tid``,
    ``%cBS``, ``%cDC`` (D/8), ``%cD``, ``%c0``, ``%c1``, ``%c8``,
    ``%lowest``, ``%zero8``, ``%fzero`` in scope; names start with ``p``."""
    return f"""\
  scf.for %{p}q = %tid to {items} step %cBS {{
    %{p}hq = arith.divui %{p}q, %cDC : index
    %{p}h = arith.addi {first_head}, %{p}hq : index
    %{p}dc = arith.remui %{p}q, %cDC : index
    %{p}d = arith.muli %{p}dc, %c8 : index
    %{p}M = scf.for %{p}s = %c0 to {splits} step %c1 iter_args(%{p}m = %lowest) -> (f32) {{
      %{p}ms = memref.load %mp[%b, %{p}h, %{p}s, %c0] : {mp_t}
      %{p}m2 = arith.maximumf %{p}m, %{p}ms : f32
      scf.yield %{p}m2 : f32
    }}
    %{p}acc, %{p}den = scf.for %{p}s = %c0 to {splits} step %c1 iter_args(%{p}a = %zero8, %{p}z = %fzero) -> (vector<8xf32>, f32) {{
      %{p}ms = memref.load %mp[%b, %{p}h, %{p}s, %c0] : {mp_t}
      %{p}ss = memref.load %mp[%b, %{p}h, %{p}s, %c1] : {mp_t}
      %{p}dm = arith.subf %{p}ms, %{p}M : f32
      %{p}w = math.exp %{p}dm : f32
      %{p}o = vector.load %op[%b, %{p}h, %{p}s, %{p}d] {{alignment = 16 : i64}} : {op_t}, vector<8xf32>
      %{p}wb = vector.broadcast %{p}w : f32 to vector<8xf32>
      %{p}wo = arith.mulf %{p}wb, %{p}o : vector<8xf32>
      %{p}a2 = arith.addf %{p}a, %{p}wo : vector<8xf32>
      %{p}ws = arith.mulf %{p}w, %{p}ss : f32
      %{p}z2 = arith.addf %{p}z, %{p}ws : f32
      scf.yield %{p}a2, %{p}z2 : vector<8xf32>, f32
    }}
    %{p}denb = vector.broadcast %{p}den : f32 to vector<8xf32>
    %{p}r = arith.divf %{p}acc, %{p}denb : vector<8xf32>
    %{p}rb = arith.truncf %{p}r : vector<8xf32> to vector<8xbf16>
    %{p}hd = arith.muli %{p}h, %cD : index
    %{p}col = arith.addi %{p}hd, %{p}d : index
    vector.store %{p}rb, %attn[%b, %{p}col] {{alignment = 16 : i64}} : {a_t}, vector<8xbf16>
  }}"""


def _merge_splits(op: np.ndarray, mp: np.ndarray, b: int, heads: slice, splits: int) -> np.ndarray:
    """Reference of :func:`_combine_loop`: the merged bf16 output of ``heads``
    of row ``b`` over the first ``splits`` slots."""
    m = mp[b, heads, :splits, 0].astype(np.float32)  # (H, S)
    M = np.maximum(m.max(axis=1), np.float32(-3.0e38))
    w = np.exp(m - M[:, None]).astype(np.float32)
    num = (w[:, :, None] * op[b, heads, :splits]).sum(axis=1, dtype=np.float32)  # (H, D)
    den = (w * mp[b, heads, :splits, 1]).sum(axis=1, dtype=np.float32)
    return f32_to_bf16((num / den[:, None]).reshape(-1))


# ----------------------------------------------------------------------------
# argmax
# ----------------------------------------------------------------------------
@checked_arguments
def argmax(
    vocab: int,
    *,
    unroll: int = 8,
    name: str = "argmax",
    block_size: int = 256,
    parts: int | None = None,
) -> DeviceFunction:
    """Tile ``(b,)``: ``out[b]`` = the smallest ``k`` with ``logits[b, k] ==
    max(logits[b])`` (``torch.argmax``, NaN aside: the tile ignores NaNs).

    Each thread streams 16-byte chunks (``unroll`` loads in flight), keeping
    the first largest of each of the ``unroll`` streams in its own registers
    (independent compare chains: one chain over all of a thread's values
    made the tile latency-bound, 17 µs for a 128K vocabulary on an H200),
    then merges them; a shuffle butterfly per warp (ties to the lower index),
    then thread 0 merges the warps' winners from workgroup memory
    (``@<name>__val``, ``@<name>__idx``). Args: ``logits: memref<?xVxbf16>``,
    ``out: memref<?xi32>``.

    ``parts`` (at most 32): tile ``(b, p)`` takes part ``p`` of the row (``C
    = ceil(V / parts)`` rounded up to 8 logits) and stores its first largest
    in ``val[b, p]`` and ``idx[b, p]`` (args ``logits``, ``val:
    memref<?xPxf32>``, ``idx: memref<?xPxi32>``); :func:`argmax_merge`
    picks the row's. One CTA over a whole 128K-logit row takes ~12 µs on an
    H200, on the critical path of every step; the parts run side by side."""
    warps = _check_block(name, block_size)
    _positive(name, vocab=vocab, unroll=unroll)
    _multiple_of_8(name, vocab=vocab)
    if vocab >= 2**31 - 1:
        raise GraphError(f"tile '{name}': vocab={vocab} does not fit an i32 index")
    if parts is not None and not (isinstance(parts, int) and 1 <= parts <= 32):
        raise GraphError(f"tile '{name}': parts={parts!r} must be an int in 1..32")
    V, U = vocab, unroll
    P = parts or 1
    C = (-(-V // P) + 7) // 8 * 8 if parts else V  # logits per part, a multiple of 8
    lg_t, out_t = f"memref<?x{V}xbf16>", "memref<?xi32>"
    v_t, i_t = f"memref<{warps}xf32, {_WG}>", f"memref<{warps}xi32, {_WG}>"
    body = []
    for u in range(U):
        body.append(
            f"      %k{u} = arith.addi %k, %cU{u} : index\n"
            f"      %ok{u} = arith.cmpi ult, %k{u}, %end : index\n"
            f"      %ks{u} = arith.select %ok{u}, %k{u}, %c0 : index\n"
            f"      %x{u} = vector.load %lg[%b, %ks{u}] {{alignment = 16 : i64}} : {lg_t}, vector<8xbf16>"
        )
    vals, idxs = [], []
    for u in range(U):
        val, idx = f"%bv{u}", f"%bi{u}"
        body.append(
            f"      %xf{u} = arith.extf %x{u} : vector<8xbf16> to vector<8xf32>\n"
            f"      %ki{u} = arith.index_cast %k{u} : index to i32"
        )
        for e in range(8):
            p = f"{u}_{e}"
            body.append(
                f"      %y{p} = vector.extract %xf{u}[{e}] : f32 from vector<8xf32>\n"
                f"      %yi{p} = arith.addi %ki{u}, %cE{e}_i32 : i32\n"
                f"      %gt{p} = arith.cmpf ogt, %y{p}, {val} : f32\n"
                f"      %eq{p} = arith.cmpf oeq, %y{p}, {val} : f32\n"
                f"      %lt{p} = arith.cmpi slt, %yi{p}, {idx} : i32\n"
                f"      %tie{p} = arith.andi %eq{p}, %lt{p} : i1\n"
                f"      %bt{p} = arith.ori %gt{p}, %tie{p} : i1\n"
                f"      %tk{p} = arith.andi %bt{p}, %ok{u} : i1\n"
                f"      %nv{p} = arith.select %tk{p}, %y{p}, {val} : f32\n"
                f"      %ni{p} = arith.select %tk{p}, %yi{p}, {idx} : i32"
            )
            val, idx = f"%nv{p}", f"%ni{p}"
        vals.append(val)
        idxs.append(idx)
    # The streams' winners merged into the thread's (ties to the lower index).
    lines = []
    wv, wi = "%tv#0", "%tv#1"
    for u in range(1, U):
        v, i = f"%tv#{2 * u}", f"%tv#{2 * u + 1}"
        lines.append(
            f"  %mgt{u} = arith.cmpf ogt, {v}, {wv} : f32\n"
            f"  %meq{u} = arith.cmpf oeq, {v}, {wv} : f32\n"
            f"  %mlt{u} = arith.cmpi slt, {i}, {wi} : i32\n"
            f"  %mtie{u} = arith.andi %meq{u}, %mlt{u} : i1\n"
            f"  %mtake{u} = arith.ori %mgt{u}, %mtie{u} : i1\n"
            f"  %mv{u} = arith.select %mtake{u}, {v}, {wv} : f32\n"
            f"  %mi{u} = arith.select %mtake{u}, {i}, {wi} : i32"
        )
        wv, wi = f"%mv{u}", f"%mi{u}"
    bfly, wv, wi = _text.warp_argmax(wv, wi, "  ")
    lines.append(bfly)
    u_consts = "\n".join(
        f"  %cU{u} = arith.constant {u * 8 * block_size} : index" for u in range(U)
    )
    e_consts = "\n".join(f"  %cE{e}_i32 = arith.constant {e} : i32" for e in range(8))
    if parts:
        pv_t, pi_t = f"memref<?x{P}xf32>", f"memref<?x{P}xi32>"
        signature = f"%b: index, %p: index, %lg: {lg_t}, %val: {pv_t}, %idx: {pi_t}"
        range_lines = (
            f"  %cC = arith.constant {C} : index\n"
            "  %start = arith.muli %p, %cC : index\n"
            "  %end0 = arith.addi %start, %cC : index\n"
            "  %end = arith.minui %end0, %cV : index"
        )
        store = (
            f"    memref.store %fv, %val[%b, %p] : {pv_t}\n"
            f"    memref.store %fi, %idx[%b, %p] : {pi_t}"
        )
    else:
        signature = f"%b: index, %lg: {lg_t}, %out: {out_t}"
        range_lines = f"  %start = arith.constant 0 : index\n  %end = arith.constant {V} : index"
        store = f"    memref.store %fi, %out[%b] : {out_t}"
    inits = ", ".join(f"%bv{u} = %ninf, %bi{u} = %cV_i32" for u in range(U))
    types = ", ".join(["f32, i32"] * U)
    source = f"""\
// {name}: first index of the largest of {V} bf16 logits, one CTA of {block_size}.
memref.global "private" @{name}__val : {v_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__idx : {i_t} {{alignment = 16 : i64}}
func.func @{name}({signature}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %c32 = arith.constant 32 : index
  %cV = arith.constant {V} : index
  %cWarps = arith.constant {warps} : index
  %cStep = arith.constant {8 * block_size * U} : index
{u_consts}
{e_consts}
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %cV_i32 = arith.constant {V} : i32
  %ninf = arith.constant 0xFF800000 : f32
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_lane0 = arith.cmpi eq, %lane, %c0 : index
  %is_thread0 = arith.cmpi eq, %tid, %c0 : index
{range_lines}
  %t8 = arith.muli %tid, %c8 : index
  %first = arith.addi %start, %t8 : index
  // A thread's best (value, index); index V means none yet (any -inf beats it).
  %tv:{2 * U} = scf.for %k = %first to %end step %cStep iter_args({inits}) -> ({types}) {{
{chr(10).join(body)}
      scf.yield {", ".join(x for pair in zip(vals, idxs, strict=True) for x in pair)} : {types}
  }}
{chr(10).join(lines)}
  %vals = memref.get_global @{name}__val : {v_t}
  %idxs = memref.get_global @{name}__idx : {i_t}
  // Thread 0 of this CTA's previous call may still be reading.
  gpu.barrier
  scf.if %is_lane0 {{
    memref.store {wv}, %vals[%warp] : {v_t}
    memref.store {wi}, %idxs[%warp] : {i_t}
  }}
  gpu.barrier
  scf.if %is_thread0 {{
    %fv, %fi = scf.for %w = %c0 to %cWarps step %c1 iter_args(%cv = %ninf, %ci = %cV_i32) -> (f32, i32) {{
      %v = memref.load %vals[%w] : {v_t}
      %i = memref.load %idxs[%w] : {i_t}
      %gt = arith.cmpf ogt, %v, %cv : f32
      %eq = arith.cmpf oeq, %v, %cv : f32
      %lt = arith.cmpi slt, %i, %ci : i32
      %tie = arith.andi %eq, %lt : i1
      %take = arith.ori %gt, %tie : i1
      %nv = arith.select %take, %v, %cv : f32
      %ni = arith.select %take, %i, %ci : i32
      scf.yield %nv, %ni : f32, i32
    }}
{store}
  }}
  return
}}
"""

    if parts:

        def reference(b: int, p: int, lg: np.ndarray, val: np.ndarray, idx: np.ndarray) -> None:
            row = bf16_to_f32(lg[b, p * C : min((p + 1) * C, V)])
            if not len(row):
                val[b, p], idx[b, p] = -np.inf, V
                return
            k = int(np.argmax(row))
            val[b, p], idx[b, p] = row[k], p * C + k

    else:

        def reference(b: int, lg: np.ndarray, out: np.ndarray) -> None:
            out[b] = np.int32(np.argmax(bf16_to_f32(lg[b])))

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


@checked_arguments
def argmax_merge(
    vocab: int, parts: int, *, name: str = "argmax_merge", block_size: int = 256
) -> DeviceFunction:
    """Tile ``(b,)``: ``out[b]`` = the index of the first largest of the
    parts' winners ``val[b, :]`` (``idx[b, :]``; ties to the lower index),
    as :func:`argmax` with ``parts`` left them. One warp: lane ``p`` loads
    part ``p`` (one L2 round trip), a shuffle butterfly merges. Args
    ``val: memref<?xPxf32>``, ``idx: memref<?xPxi32>``, ``out:
    memref<?xi32>``."""
    _check_block(name, block_size)
    _positive(name, vocab=vocab)
    if not (isinstance(parts, int) and 1 <= parts <= 32):
        raise GraphError(f"tile '{name}': parts={parts!r} must be an int in 1..32")
    P = parts
    pv_t, pi_t, out_t = f"memref<?x{P}xf32>", f"memref<?x{P}xi32>", "memref<?xi32>"
    lines = []
    wv, wi = "%v0", "%i0"
    bfly, wv, wi = _text.warp_argmax(wv, wi, "    ")
    lines.append(bfly)
    source = f"""\
// {name}: the first largest of {P} parts' winners (vocabulary {vocab}), one warp.
func.func @{name}(%b: index, %val: {pv_t}, %idx: {pi_t}, %out: {out_t}) {{
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %cP = arith.constant {P} : index
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %cV_i32 = arith.constant {vocab} : i32
  %ninf = arith.constant 0xFF800000 : f32
  %tid = gpu.thread_id x
  %warp0 = arith.cmpi ult, %tid, %c32 : index
  scf.if %warp0 {{
    %mine = arith.cmpi ult, %tid, %cP : index
    %v0, %i0 = scf.if %mine -> (f32, i32) {{
      %v = memref.load %val[%b, %tid] : {pv_t}
      %i = memref.load %idx[%b, %tid] : {pi_t}
      scf.yield %v, %i : f32, i32
    }} else {{
      scf.yield %ninf, %cV_i32 : f32, i32
    }}
{chr(10).join(lines)}
    %is_thread0 = arith.cmpi eq, %tid, %c0 : index
    scf.if %is_thread0 {{
      memref.store {wi}, %out[%b] : {out_t}
    }}
  }}
  return
}}
"""

    def reference(b: int, val: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
        # Parts are in index order, so the first largest part holds the first largest logit.
        out[b] = idx[b, int(np.argmax(val[b]))]

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


@checked_arguments
def argmax_take(*, name: str = "argmax", block_size: int = 256) -> DeviceFunction:
    """Tile ``(b,)``: ``out[b]`` = the token row ``b``'s key names, the key
    the LM head's ``argmax_key`` epilogue left in ``keys[b]`` (the first
    largest logit; :func:`etc.tiles.gemv_layer.argmax_keys`), and
    ``keys[b] = 0`` for the next step, in one atomic exchange by thread 0.
    Runs after every LM head instance of the step (their atomic maxima are
    the only writers). Args ``keys: memref<?xi64>``, ``out: memref<?xi32>``."""
    from .gemv_layer import argmax_key_reference

    _check_block(name, block_size)
    source = f"""\
// {name}: the token of row b's folded-argmax key; the key reset to 0.
func.func @{name}(%b: index, %keys: {_text.KEYS_TYPE}, %out: memref<?xi32>) {{
  %c0 = arith.constant 0 : index
  %none = arith.constant 0 : i64
  %tid = gpu.thread_id x
  %is_thread0 = arith.cmpi eq, %tid, %c0 : index
  scf.if %is_thread0 {{
    %key = memref.atomic_rmw assign %none, %keys[%b] : (i64, {_text.KEYS_TYPE}) -> i64
    %low = arith.trunci %key : i64 to i32
    %ones = arith.constant -1 : i32
    %token = arith.xori %low, %ones : i32
    %held = arith.cmpi ne, %key, %none : i64
    %zero = arith.constant 0 : i32
    %out_token = arith.select %held, %token, %zero : i32
    memref.store %out_token, %out[%b] : memref<?xi32>
  }}
  return
}}
"""

    def reference(b: int, keys: np.ndarray, out: np.ndarray) -> None:
        out[b] = argmax_key_reference(keys[b : b + 1])[0]
        keys[b] = 0

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)

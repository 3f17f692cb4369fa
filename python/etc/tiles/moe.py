"""Mixture-of-experts tiles: router, plan, permute and combine (ETC issue 6).

The MoE layer of ``docs/moe.md`` as device functions (MLIR text, one CTA of
``block_size`` threads, upstream dialects only) with numpy references. bf16
tensors are ``uint16`` bit patterns in numpy (:mod:`etc.dtypes`); all
arithmetic is fp32 (``arith.extf`` / ``arith.truncf``, round to nearest even).

* ``router_logits(RB, EC, E, H)``, grid ``(ceil(T/RB), E/EC)``: fp32 logits
  ``L = X @ Wr^T`` of RB tokens x EC experts (the router's read of Wr is
  spread over E/EC CTAs).
* ``router_topk(RB, TB, E, K)``, grid ``(ceil(T/RB), RB/TB)``: top-K of TB
  tokens' logits (ties: lower expert first), weights ``softmax``
  renormalised over the K chosen (``exp(l_k - l_max) / sum``, which equals
  the softmax over all E followed by renormalisation).
* ``plan(BM, NT, ND, E, K)``, grid ``(1,)``: per-expert counts (workgroup
  atomics), prefix sums by warp 0 (shuffle-up scan), the tables ``row_off,
  gu_indptr, dn_indptr, h_wait, dn_total`` and the row permutation ``perm``
  (rows grouped by expert) with its inverse ``inv``.
* ``permute(E, K, H)``, grid ``(E,)``: expert e gathers its rows
  ``Xp[r] = X[perm[r] // K]`` with 16-byte loads.
* ``combine(CB, K, H)``, grid ``(ceil(T/CB),)``:
  ``Out[t] = sum_k topk_w[t, k] * Yp[inv[t*K + k]]`` in fp32, stored bf16.

Buffers are row-major and 16-byte aligned (H a multiple of 8).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..device import DeviceFunction
from ..dtypes import bf16_to_f32, f32_to_bf16
from ..errors import GraphError
from . import _text

__all__ = [
    "router_logits",
    "router_topk",
    "plan",
    "permute",
    "combine",
    "router_reference_rows",
    "topk_from_logits",
    "plan_tables",
]

_WG = "#gpu.address_space<workgroup>"


_positive = _text.positive
_check_block = _text.check_block


def _check_hidden(name: str, H: int) -> None:
    if H % 8:
        raise GraphError(f"tile '{name}': hidden={H} must be a multiple of 8 (16-byte bf16 loads)")


def _warp_argmax(val: str, idx: str, indent: str) -> tuple[str, str, str]:
    """Butterfly arg-max of (f32 `val`, i32 `idx`) over the warp; ties go to the
    lower index. Every lane gets the result. Returns (ops, value, index)."""
    lines = []
    for k, off in enumerate(_text.SHUFFLE_OFFSETS):
        lines.append(
            f"{indent}%av{k}, %avok{k} = gpu.shuffle xor {val}, %c{off}_i32, %c32_i32 : f32\n"
            f"{indent}%ai{k}, %aiok{k} = gpu.shuffle xor {idx}, %c{off}_i32, %c32_i32 : i32\n"
            f"{indent}%agt{k} = arith.cmpf ogt, %av{k}, {val} : f32\n"
            f"{indent}%aeq{k} = arith.cmpf oeq, %av{k}, {val} : f32\n"
            f"{indent}%alt{k} = arith.cmpi slt, %ai{k}, {idx} : i32\n"
            f"{indent}%atie{k} = arith.andi %aeq{k}, %alt{k} : i1\n"
            f"{indent}%atake{k} = arith.ori %agt{k}, %atie{k} : i1\n"
            f"{indent}%abv{k} = arith.select %atake{k}, %av{k}, {val} : f32\n"
            f"{indent}%abi{k} = arith.select %atake{k}, %ai{k}, {idx} : i32"
        )
        val, idx = f"%abv{k}", f"%abi{k}"
    return "\n".join(lines), val, idx


# ----------------------------------------------------------------------------
# router: logits, then top-k
# ----------------------------------------------------------------------------
def topk_from_logits(logits: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """(topk_ids int32, topk_w float32) of fp32 router logits (T, E): top-K
    (ties: lower expert first), softmax weights renormalised over the K."""
    logits = np.asarray(logits, np.float32)
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :topk].astype(np.int32)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = shifted / shifted.sum(axis=1, keepdims=True)
    chosen = np.take_along_axis(probs, ids, axis=1)
    weights = (chosen / chosen.sum(axis=1, keepdims=True)).astype(np.float32)
    return ids, weights


def router_reference_rows(x: np.ndarray, wr: np.ndarray, topk: int) -> tuple[np.ndarray, ...]:
    """(topk_ids int32, topk_w float32) of rows `x` (float32 or bf16 bits)."""
    xf = bf16_to_f32(x) if x.dtype == np.uint16 else np.asarray(x, np.float32)
    wf = bf16_to_f32(wr) if wr.dtype == np.uint16 else np.asarray(wr, np.float32)
    return topk_from_logits(xf @ wf.T, topk)


def router_logits(
    RB: int, EC: int, E: int, H: int, *, name: str = "moe_logits", block_size: int = 256
) -> DeviceFunction:
    """Tile ``(i, j)``, grid ``(ceil(T/RB), E/EC)``: fp32 logits
    ``L[t, e] = X[t] . Wr[e]`` of tokens ``[i*RB, min((i+1)*RB, T))`` and
    experts ``[j*EC, (j+1)*EC)``.

    The W warps split as S = max(1, W/EC) slices of H per expert: warp w
    takes experts ``w % EC, w % EC + W, ...`` and slice ``w // EC`` (lane l
    reads columns ``(slice*32 + l)*8 + k*S*256``), so at EC=2 all 8 warps
    stream the CTA's two rows of Wr. Tokens go in sub-blocks of RS =
    min(8, RB): each 16-byte load of Wr feeds RS fused multiply-adds (rows
    past T repeat row T-1 and are dropped). Warp sums go to workgroup memory;
    after a barrier thread q adds the S slices of (token, expert) q in slice
    order and stores the logit.
    """
    warps = _check_block(name, block_size)
    _positive(name, RB=RB, EC=EC, E=E, H=H)
    _check_hidden(name, H)
    if E % EC:
        raise GraphError(f"tile '{name}': experts={E} is not a multiple of EC={EC}")
    if EC < warps and warps % EC:
        raise GraphError(
            f"tile '{name}': EC={EC} must divide the {warps} warps or be at least {warps}"
        )
    RS = min(8, RB)
    if RB % RS:
        raise GraphError(f"tile '{name}': RB={RB} must be at most 8 or a multiple of 8")
    S = max(1, warps // EC)
    x_t, w_t, l_t = f"memref<?x{H}xbf16>", f"memref<{E}x{H}xbf16>", f"memref<?x{E}xf32>"
    sm_t = f"memref<{RB * EC * S}xf32, {_WG}>"
    row_consts = "\n".join(f"  %c{r}_r = arith.constant {r} : index" for r in range(RS))
    rows = "\n".join(
        f"    %tok{r} = arith.addi %r0, %c{r}_r : index\n"
        f"    %row{r} = arith.minui %tok{r}, %Tm1 : index"
        for r in range(RS)
    )
    zeros = ", ".join(f"%a{r} = %zero8" for r in range(RS))
    acc_types = ", ".join("vector<8xf32>" for _ in range(RS))
    fmas = "\n".join(
        f"        %xv{r} = vector.load %X[%row{r}, %k] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>\n"
        f"        %xf{r} = arith.extf %xv{r} : vector<8xbf16> to vector<8xf32>\n"
        f"        %n{r} = vector.fma %xf{r}, %wf, %a{r} : vector<8xf32>"
        for r in range(RS)
    )
    yields = ", ".join(f"%n{r}" for r in range(RS))
    reductions = []
    for r in range(RS):
        shuffles, value = _text.warp_sum(f"%s{r}", "      ")
        for old in ("%sh", "%ok", "%red"):
            shuffles = shuffles.replace(old, f"{old}{r}_")
        value = value.replace("%red", f"%red{r}_")
        reductions.append(
            f"      %s{r} = vector.reduction <add>, %acc#{r} : vector<8xf32> into f32\n"
            f"{shuffles}\n"
            f"      %q{r} = arith.addi %rb, %c{r}_r : index\n"
            f"      %qe{r} = arith.muli %q{r}, %cEC : index\n"
            f"      %qx{r} = arith.addi %qe{r}, %el : index\n"
            f"      %qs{r} = arith.muli %qx{r}, %cS : index\n"
            f"      %slot{r} = arith.addi %qs{r}, %slice : index\n"
            f"      scf.if %is_lane0 {{\n"
            f"        memref.store {value}, %part[%slot{r}] : {sm_t}\n"
            f"      }}"
        )
    sums = ["    %p0 = memref.load %part[%base] : " + sm_t]
    for s in range(1, S):
        sums.append(
            f"    %pi{s} = arith.addi %base, %c{s}_s : index\n"
            f"    %pv{s} = memref.load %part[%pi{s}] : {sm_t}\n"
            f"    %p{s} = arith.addf %p{s - 1}, %pv{s} : f32"
        )
    slice_consts = "\n".join(f"  %c{s}_s = arith.constant {s} : index" for s in range(1, S))
    source = f"""\
// {name}: fp32 router logits of {RB} tokens x {EC} of {E} experts (hidden {H}), one CTA of {block_size}.
memref.global "private" @{name}__part : {sm_t} {{alignment = 16 : i64}}
func.func @{name}(%i: index, %j: index, %X: {x_t}, %Wr: {w_t}, %L: {l_t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %c32 = arith.constant 32 : index
  %cW = arith.constant {warps} : index
  %cEC = arith.constant {EC} : index
  %cS = arith.constant {S} : index
  %cH = arith.constant {H} : index
  %cRB = arith.constant {RB} : index
  %cRS = arith.constant {RS} : index
  %cBS = arith.constant {block_size} : index
  %cKstep = arith.constant {S * 256} : index
{row_consts}
{slice_consts}
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %zero8 = arith.constant dense<0.0> : vector<8xf32>
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_lane0 = arith.cmpi eq, %lane, %c0 : index
  %slice = arith.divui %warp, %cEC : index
  %el0 = arith.remui %warp, %cEC : index
  %T = memref.dim %X, %c0 : {x_t}
  %Tm1 = arith.subi %T, %c1 : index
  %t0 = arith.muli %i, %cRB : index
  %t1a = arith.addi %t0, %cRB : index
  %t1 = arith.minui %t1a, %T : index
  %e0 = arith.muli %j, %cEC : index
  %ks = arith.muli %slice, %c32 : index
  %kl = arith.addi %ks, %lane : index
  %kfirst = arith.muli %kl, %c8 : index
  %part = memref.get_global @{name}__part : {sm_t}
  // The previous call of this tile on this CTA may still be reading the partial sums.
  gpu.barrier
  scf.for %r0 = %t0 to %t1 step %cRS {{
    %rb = arith.subi %r0, %t0 : index
{rows}
    scf.for %el = %el0 to %cEC step %cW {{
      %e = arith.addi %e0, %el : index
      %acc:{RS} = scf.for %k = %kfirst to %cH step %cKstep iter_args({zeros}) -> ({acc_types}) {{
        %wv = vector.load %Wr[%e, %k] {{alignment = 16 : i64}} : {w_t}, vector<8xbf16>
        %wf = arith.extf %wv : vector<8xbf16> to vector<8xf32>
{fmas}
        scf.yield {yields} : {acc_types}
      }}
{chr(10).join(reductions)}
    }}
  }}
  gpu.barrier
  %n = arith.subi %t1, %t0 : index
  %nq = arith.muli %n, %cEC : index
  scf.for %q = %tid to %nq step %cBS {{
    %r = arith.divui %q, %cEC : index
    %el = arith.remui %q, %cEC : index
    %base = arith.muli %q, %cS : index
{chr(10).join(sums)}
    %t = arith.addi %t0, %r : index
    %e = arith.addi %e0, %el : index
    memref.store %p{S - 1}, %L[%t, %e] : {l_t}
  }}
  return
}}
"""

    def reference(i: int, j: int, X: np.ndarray, Wr: np.ndarray, L: np.ndarray) -> None:
        t0, t1 = i * RB, min((i + 1) * RB, X.shape[0])
        if t0 >= t1:
            return
        e0 = j * EC
        L[t0:t1, e0 : e0 + EC] = bf16_to_f32(X[t0:t1]) @ bf16_to_f32(Wr[e0 : e0 + EC]).T

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def router_topk(
    RB: int, TB: int, E: int, K: int, *, name: str = "moe_topk", block_size: int = 256
) -> DeviceFunction:
    """Tile ``(i, j)``, grid ``(ceil(T/RB), RB/TB)``: top-K of the fp32
    logits of tokens ``[i*RB + j*TB, +TB)`` (those below T).

    The CTA copies the TB x E logits to workgroup memory; warp w takes
    tokens ``w, w+W, ...``: K rounds of a warp arg-max (lane l owns experts
    ``l, l+32, ...``, so it alone reads and clears them; ties go to the lower
    expert), weights ``exp(l_k - l_0)`` normalised by their sum (softmax over
    all E, renormalised over the K).
    """
    warps = _check_block(name, block_size)
    _positive(name, RB=RB, TB=TB, E=E, K=K)
    if K > E:
        raise GraphError(f"tile '{name}': topk={K} exceeds experts={E}")
    if RB % TB:
        raise GraphError(f"tile '{name}': RB={RB} is not a multiple of TB={TB}")
    l_t = f"memref<?x{E}xf32>"
    ids_t, tw_t = f"memref<?x{K}xi32>", f"memref<?x{K}xf32>"
    sm_t = f"memref<{TB * E}xf32, {_WG}>"
    argmax, best_v, best_i = _warp_argmax("%lv", "%li", "          ")
    source = f"""\
// {name}: top-{K} of {E} router logits for {TB} tokens, one CTA of {block_size}.
memref.global "private" @{name}__logits : {sm_t} {{alignment = 16 : i64}}
func.func @{name}(%i: index, %j: index, %L: {l_t}, %ids: {ids_t}, %tw: {tw_t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c32 = arith.constant 32 : index
  %cW = arith.constant {warps} : index
  %cE = arith.constant {E} : index
  %cK = arith.constant {K} : index
  %cRB = arith.constant {RB} : index
  %cTB = arith.constant {TB} : index
  %cBS = arith.constant {block_size} : index
  %cTBE = arith.constant {TB * E} : index
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %cE_i32 = arith.constant {E} : i32
  %ninf = arith.constant 0xFF800000 : f32
  %fzero = arith.constant 0.0 : f32
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_lane0 = arith.cmpi eq, %lane, %c0 : index
  %T = memref.dim %L, %c0 : {l_t}
  %ti = arith.muli %i, %cRB : index
  %tj = arith.muli %j, %cTB : index
  %t0 = arith.addi %ti, %tj : index
  %any = arith.cmpi ult, %t0, %T : index
  // Uniform over the CTA: instances past T do nothing.
  scf.if %any {{
    %Tm1 = arith.subi %T, %c1 : index
    %logits = memref.get_global @{name}__logits : {sm_t}
    // The previous call of this tile on this CTA may still be reading the logits.
    gpu.barrier
    scf.for %q = %tid to %cTBE step %cBS {{
      %qr = arith.divui %q, %cE : index
      %qe = arith.remui %q, %cE : index
      %qt = arith.addi %t0, %qr : index
      %qtc = arith.minui %qt, %Tm1 : index
      %qv = memref.load %L[%qtc, %qe] : {l_t}
      memref.store %qv, %logits[%q] : {sm_t}
    }}
    gpu.barrier
    scf.for %r = %warp to %cTB step %cW {{
      %t = arith.addi %t0, %r : index
      %live = arith.cmpi ult, %t, %T : index
      scf.if %live {{
        %base = arith.muli %r, %cE : index
        %sum:2 = scf.for %k = %c0 to %cK step %c1 iter_args(%ssum = %fzero, %mprev = %fzero) -> (f32, f32) {{
          %lv, %li = scf.for %e = %lane to %cE step %c32 iter_args(%bv = %ninf, %bi = %cE_i32) -> (f32, i32) {{
            %slot = arith.addi %base, %e : index
            %v = memref.load %logits[%slot] : {sm_t}
            %better = arith.cmpf ogt, %v, %bv : f32
            %e_i32 = arith.index_cast %e : index to i32
            %nv = arith.select %better, %v, %bv : f32
            %ni = arith.select %better, %e_i32, %bi : i32
            scf.yield %nv, %ni : f32, i32
          }}
{argmax}
          %best = arith.index_cast {best_i} : i32 to index
          %owner = arith.remui %best, %c32 : index
          %mine = arith.cmpi eq, %owner, %lane : index
          scf.if %mine {{
            %bslot = arith.addi %base, %best : index
            memref.store %ninf, %logits[%bslot] : {sm_t}
          }}
          // Round 0 finds the largest logit m: weight exp(l_k - m), normalised below.
          %first = arith.cmpi eq, %k, %c0 : index
          %m = arith.select %first, {best_v}, %mprev : f32
          %d = arith.subf {best_v}, %m : f32
          %p = math.exp %d : f32
          scf.if %is_lane0 {{
            memref.store {best_i}, %ids[%t, %k] : {ids_t}
            memref.store %p, %tw[%t, %k] : {tw_t}
          }}
          %next = arith.addf %ssum, %p : f32
          scf.yield %next, %m : f32, f32
        }}
        scf.if %is_lane0 {{
          scf.for %k = %c0 to %cK step %c1 {{
            %pk = memref.load %tw[%t, %k] : {tw_t}
            %wk = arith.divf %pk, %sum#0 : f32
            memref.store %wk, %tw[%t, %k] : {tw_t}
          }}
        }}
      }}
    }}
  }}
  return
}}
"""

    def reference(i: int, j: int, L: np.ndarray, ids: np.ndarray, tw: np.ndarray) -> None:
        t0 = i * RB + j * TB
        t1 = min(t0 + TB, L.shape[0])
        if t0 >= t1:
            return
        ids[t0:t1], tw[t0:t1] = topk_from_logits(L[t0:t1], K)

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


# ----------------------------------------------------------------------------
# plan
# ----------------------------------------------------------------------------
def plan_tables(ids: np.ndarray, BM: int, NT: int, ND: int, E: int) -> dict[str, np.ndarray]:
    """The plan's tables for ``topk_ids`` (T, K), with ``perm`` stable
    (rows of an expert in token-slot order). The tile's order inside an
    expert may differ (any order is valid)."""
    flat = np.asarray(ids, np.int64).reshape(-1)
    counts = np.bincount(flat, minlength=E)[:E].astype(np.int64)
    blocks = (counts + BM - 1) // BM
    row_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    gu = np.concatenate([[0], np.cumsum(blocks * NT)]).astype(np.int32)
    dn = np.concatenate([[0], np.cumsum(blocks * ND)]).astype(np.int32)
    perm = np.argsort(flat, kind="stable").astype(np.int32)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=np.int32)
    return {
        "row_off": row_off,
        "gu_indptr": gu,
        "dn_indptr": dn,
        "h_wait": (blocks * NT + 1).astype(np.int32),
        "dn_total": np.array([dn[-1]], np.int32),
        "perm": perm,
        "inv": inv,
    }


#: Tokens a plan thread reads per step: their ``PLAN_UNROLL * K`` expert ids
#: are loaded before the first atomic, so a thread has that many in flight.
PLAN_UNROLL = 4


def _plan_slots(K: int, block_size: int, ids_t: str, claim: Callable[[str, str, int], str]) -> str:
    """The body of a plan pass over tokens ``%t0 + u * block_size``: every
    token's K ids are loaded first (tokens past T clamped to T - 1), then
    ``claim(e, t, k)`` runs for each id of the tokens that exist."""
    loads, uses = [], []
    for u in range(PLAN_UNROLL):
        loads.append(
            f"    %t_{u} = arith.addi %t0, %cTU{u} : index\n"
            f"    %tc_{u} = arith.minui %t_{u}, %Tlast : index"
        )
        body = []
        for k in range(K):
            loads.append(f"    %e{k}_{u}_i32 = memref.load %ids[%tc_{u}, %ck{k}] : {ids_t}")
            body.append(
                f"      %e{k}_{u} = arith.index_cast %e{k}_{u}_i32 : i32 to index\n"
                + claim(f"%e{k}_{u}", f"%t_{u}", k)
            )
        uses.append(
            f"    %ok_{u} = arith.cmpi ult, %t_{u}, %T : index\n"
            f"    scf.if %ok_{u} {{\n" + "\n".join(body) + "\n    }"
        )
    return "\n".join(loads + uses)


def plan(
    BM: int, NT: int, ND: int, E: int, K: int, *, name: str = "moe_plan", block_size: int = 256
) -> DeviceFunction:
    """Tile ``(i,)`` (grid ``(1,)``): the routing tables of all T*K token slots.

    Counts per expert with workgroup ``atomic_rmw addi``; warp 0 scans the
    counts and the row-block counts ``ceil(cnt/BM)`` (each lane a contiguous
    run of ``ceil(E/32)`` experts, then a shuffle-up scan) and writes
    ``row_off``, ``gu_indptr`` (``NT`` tiles per row block), ``dn_indptr``
    (``ND``), ``h_wait`` (gate/up tiles + 1) and ``dn_total``; then every
    slot claims its row with an atomic on a per-expert cursor (so the order
    inside an expert is arbitrary) and writes ``perm`` and ``inv``.
    """
    _check_block(name, block_size)
    _positive(name, BM=BM, NT=NT, ND=ND, E=E, K=K)
    chunk = -(-E // 32)
    ids_t, e1_t, e_t = f"memref<?x{K}xi32>", f"memref<{E + 1}xi32>", f"memref<{E}xi32>"
    one_t, vec_t = "memref<1xi32>", "memref<?xi32>"
    sm_t = f"memref<{E}xi32, {_WG}>"
    scans = []
    for k, off in enumerate((1, 2, 4, 8, 16)):
        cprev = "%csum" if k == 0 else f"%cs{k - 1}"
        mprev = "%msum" if k == 0 else f"%ms{k - 1}"
        scans.append(
            f"    %cu{k}, %cuok{k} = gpu.shuffle up {cprev}, %c{off}_i32, %c32_i32 : i32\n"
            f"    %mu{k}, %muok{k} = gpu.shuffle up {mprev}, %c{off}_i32, %c32_i32 : i32\n"
            f"    %in{k} = arith.cmpi uge, %lane, %c{off}_l : index\n"
            f"    %cadd{k} = arith.select %in{k}, %cu{k}, %c0_i32 : i32\n"
            f"    %madd{k} = arith.select %in{k}, %mu{k}, %c0_i32 : i32\n"
            f"    %cs{k} = arith.addi {cprev}, %cadd{k} : i32\n"
            f"    %ms{k} = arith.addi {mprev}, %madd{k} : i32"
        )
    lane_consts = "\n".join(f"  %c{o}_l = arith.constant {o} : index" for o in (1, 2, 4, 8, 16))
    lane_consts += "\n" + "\n".join(
        f"  %cTU{u} = arith.constant {u * block_size} : index" for u in range(PLAN_UNROLL)
    )
    lane_consts += "\n" + "\n".join(f"  %ck{k} = arith.constant {k} : index" for k in range(K))
    count_body = _plan_slots(
        K, block_size, ids_t,
        lambda e, t, k: f"      %old{e[1:]} = memref.atomic_rmw addi %c1_i32, %count[{e}] : "
        f"(i32, {sm_t}) -> i32",
    )  # fmt: skip

    def claim(e: str, t: str, k: int) -> str:
        v = e[1:]
        return (
            f"      %r{v}_i32 = memref.atomic_rmw addi %c1_i32, %cursor[{e}] : (i32, {sm_t}) -> i32\n"
            f"      %r{v} = arith.index_cast %r{v}_i32 : i32 to index\n"
            f"      %s{v}0 = arith.muli {t}, %cK : index\n"
            f"      %s{v} = arith.addi %s{v}0, %ck{k} : index\n"
            f"      %s{v}_i32 = arith.index_cast %s{v} : index to i32\n"
            f"      memref.store %s{v}_i32, %perm[%r{v}] : {vec_t}\n"
            f"      memref.store %r{v}_i32, %inv[%s{v}] : {vec_t}"
        )

    claim_body = _plan_slots(K, block_size, ids_t, claim)
    source = f"""\
// {name}: MoE routing tables for {E} experts, top-{K}, row blocks of {BM}, one CTA of {block_size}.
memref.global "private" @{name}__count : {sm_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__cursor : {sm_t} {{alignment = 16 : i64}}
func.func @{name}(%i: index, %ids: {ids_t}, %row_off: {e1_t}, %gu: {e1_t}, %dn: {e1_t}, %hw: {e_t}, %dt: {one_t}, %perm: {vec_t}, %inv: {vec_t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c31 = arith.constant 31 : index
  %c32 = arith.constant 32 : index
  %cBS = arith.constant {block_size} : index
  %cE = arith.constant {E} : index
  %cK = arith.constant {K} : index
  %cChunk = arith.constant {chunk} : index
  %cTSTEP = arith.constant {PLAN_UNROLL * block_size} : index
{lane_consts}
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %c0_i32 = arith.constant 0 : i32
  %cBM1_i32 = arith.constant {BM - 1} : i32
  %cBM_i32 = arith.constant {BM} : i32
  %cNT_i32 = arith.constant {NT} : i32
  %cND_i32 = arith.constant {ND} : i32
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_warp0 = arith.cmpi eq, %warp, %c0 : index
  %T = memref.dim %ids, %c0 : {ids_t}
  %Tlast = arith.subi %T, %c1 : index
  %count = memref.get_global @{name}__count : {sm_t}
  %cursor = memref.get_global @{name}__cursor : {sm_t}
  // A previous call on this CTA may still be reading the workgroup buffers.
  gpu.barrier
  scf.for %e = %tid to %cE step %cBS {{
    memref.store %c0_i32, %count[%e] : {sm_t}
  }}
  gpu.barrier
  scf.for %t0 = %tid to %T step %cTSTEP {{
{count_body}
  }}
  gpu.barrier
  scf.if %is_warp0 {{
    %lo0 = arith.muli %lane, %cChunk : index
    %lo = arith.minui %lo0, %cE : index
    %hi0 = arith.addi %lo, %cChunk : index
    %hi = arith.minui %hi0, %cE : index
    %csum, %msum = scf.for %e = %lo to %hi step %c1 iter_args(%ca = %c0_i32, %ma = %c0_i32) -> (i32, i32) {{
      %c = memref.load %count[%e] : {sm_t}
      %cb = arith.addi %c, %cBM1_i32 : i32
      %mb = arith.divui %cb, %cBM_i32 : i32
      %ca2 = arith.addi %ca, %c : i32
      %ma2 = arith.addi %ma, %mb : i32
      scf.yield %ca2, %ma2 : i32, i32
    }}
{chr(10).join(scans)}
    %cx = arith.subi %cs4, %csum : i32
    %mx = arith.subi %ms4, %msum : i32
    %r1, %r2 = scf.for %e = %lo to %hi step %c1 iter_args(%cr = %cx, %mr = %mx) -> (i32, i32) {{
      %c = memref.load %count[%e] : {sm_t}
      %cb = arith.addi %c, %cBM1_i32 : i32
      %mb = arith.divui %cb, %cBM_i32 : i32
      memref.store %cr, %row_off[%e] : {e1_t}
      memref.store %cr, %cursor[%e] : {sm_t}
      %g = arith.muli %mr, %cNT_i32 : i32
      memref.store %g, %gu[%e] : {e1_t}
      %d = arith.muli %mr, %cND_i32 : i32
      memref.store %d, %dn[%e] : {e1_t}
      %gt = arith.muli %mb, %cNT_i32 : i32
      %h = arith.addi %gt, %c1_i32 : i32
      memref.store %h, %hw[%e] : {e_t}
      %cr2 = arith.addi %cr, %c : i32
      %mr2 = arith.addi %mr, %mb : i32
      scf.yield %cr2, %mr2 : i32, i32
    }}
    %last = arith.cmpi eq, %lane, %c31 : index
    scf.if %last {{
      memref.store %cs4, %row_off[%cE] : {e1_t}
      %gT = arith.muli %ms4, %cNT_i32 : i32
      memref.store %gT, %gu[%cE] : {e1_t}
      %dT = arith.muli %ms4, %cND_i32 : i32
      memref.store %dT, %dn[%cE] : {e1_t}
      memref.store %dT, %dt[%c0] : {one_t}
    }}
  }}
  gpu.barrier
  scf.for %t0 = %tid to %T step %cTSTEP {{
{claim_body}
  }}
  return
}}
"""

    def reference(
        i: int,
        ids: np.ndarray,
        row_off: np.ndarray,
        gu: np.ndarray,
        dn: np.ndarray,
        hw: np.ndarray,
        dt: np.ndarray,
        perm: np.ndarray,
        inv: np.ndarray,
    ) -> None:
        tables = plan_tables(ids, BM, NT, ND, E)
        for array, key in (
            (row_off, "row_off"),
            (gu, "gu_indptr"),
            (dn, "dn_indptr"),
            (hw, "h_wait"),
            (dt, "dn_total"),
            (perm, "perm"),
            (inv, "inv"),
        ):
            array[...] = tables[key]

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


# ----------------------------------------------------------------------------
# permute
# ----------------------------------------------------------------------------
#: (row, chunk) pairs a permute thread moves per step, loads first.
PERMUTE_UNROLL = 8


def permute(
    E: int, K: int, H: int, *, name: str = "moe_permute", block_size: int = 256
) -> DeviceFunction:
    """Tile ``(e,)``: ``Xp[r] = X[perm[r] // K]`` for r in ``[row_off[e], row_off[e+1])``.

    The CTA walks (row, 8-column chunk) pairs, UNROLL of them per thread per
    step: all their 16-byte loads are issued before the stores, so each
    thread has UNROLL loads in flight (past the end, the pair index is
    clamped for the load and the store is skipped).
    """
    _check_block(name, block_size)
    _positive(name, E=E, K=K, H=H)
    _check_hidden(name, H)
    x_t, e1_t, vec_t = f"memref<?x{H}xbf16>", f"memref<{E + 1}xi32>", "memref<?xi32>"
    loads, stores = [], []
    for u in range(PERMUTE_UNROLL):
        loads.append(
            f"    %q_{u} = arith.addi %qs, %cU{u} : index\n"
            f"    %qc_{u} = arith.minui %q_{u}, %last : index\n"
            f"    %dr_{u} = arith.divui %qc_{u}, %cHC : index\n"
            f"    %ch_{u} = arith.remui %qc_{u}, %cHC : index\n"
            f"    %col_{u} = arith.muli %ch_{u}, %c8 : index\n"
            f"    %r_{u} = arith.addi %r0, %dr_{u} : index\n"
            f"    %slot_i32_{u} = memref.load %perm[%r_{u}] : {vec_t}\n"
            f"    %slot_{u} = arith.index_cast %slot_i32_{u} : i32 to index\n"
            f"    %src_{u} = arith.divui %slot_{u}, %cK : index\n"
            f"    %v_{u} = vector.load %X[%src_{u}, %col_{u}] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>"
        )
        stores.append(
            f"    %ok_{u} = arith.cmpi ult, %q_{u}, %total : index\n"
            f"    scf.if %ok_{u} {{\n"
            f"      vector.store %v_{u}, %Xp[%r_{u}, %col_{u}] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>\n"
            f"    }}"
        )
    unroll_consts = "\n".join(
        f"  %cU{u} = arith.constant {u * block_size} : index" for u in range(PERMUTE_UNROLL)
    )
    loads, stores = "\n".join(loads), "\n".join(stores)
    source = f"""\
// {name}: gather expert e's rows of X (hidden {H}, top-{K}) into Xp, one CTA of {block_size}.
func.func @{name}(%e: index, %X: {x_t}, %row_off: {e1_t}, %perm: {vec_t}, %Xp: {x_t}) {{
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %cSTEP = arith.constant {PERMUTE_UNROLL * block_size} : index
{unroll_consts}
  %cK = arith.constant {K} : index
  %cHC = arith.constant {H // 8} : index
  %tid = gpu.thread_id x
  %e1 = arith.addi %e, %c1 : index
  %r0_i32 = memref.load %row_off[%e] : {e1_t}
  %r1_i32 = memref.load %row_off[%e1] : {e1_t}
  %r0 = arith.index_cast %r0_i32 : i32 to index
  %r1 = arith.index_cast %r1_i32 : i32 to index
  %n = arith.subi %r1, %r0 : index
  %total = arith.muli %n, %cHC : index
  %last = arith.subi %total, %c1 : index
  scf.for %qs = %tid to %total step %cSTEP {{
{loads}
{stores}
  }}
  return
}}
"""

    def reference(e: int, X: np.ndarray, row_off: np.ndarray, perm: np.ndarray, Xp: np.ndarray):
        r0, r1 = int(row_off[e]), int(row_off[e + 1])
        Xp[r0:r1] = X[perm[r0:r1] // K]

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


# ----------------------------------------------------------------------------
# combine
# ----------------------------------------------------------------------------
def combine(
    CB: int, K: int, H: int, *, name: str = "moe_combine", block_size: int = 256
) -> DeviceFunction:
    """Tile ``(i,)``: ``Out[t] = bf16(sum_k topk_w[t, k] * Yp[inv[t*K + k]])``
    for tokens ``[i*CB, min((i+1)*CB, T))``; fp32 sum in k order, K unrolled,
    16-byte loads and stores."""
    _check_block(name, block_size)
    _positive(name, CB=CB, K=K, H=H)
    _check_hidden(name, H)
    x_t, tw_t, vec_t = f"memref<?x{H}xbf16>", f"memref<?x{K}xf32>", "memref<?xi32>"
    k_consts = "\n".join(f"  %c{k}_k = arith.constant {k} : index" for k in range(K))
    terms = []
    acc = "%zero8"
    for k in range(K):
        terms.append(
            f"    %w{k} = memref.load %tw[%t, %c{k}_k] : {tw_t}\n"
            f"    %s{k} = arith.addi %slot0, %c{k}_k : index\n"
            f"    %ri{k} = memref.load %inv[%s{k}] : {vec_t}\n"
            f"    %r{k} = arith.index_cast %ri{k} : i32 to index\n"
            f"    %y{k} = vector.load %Yp[%r{k}, %col] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>\n"
            f"    %yf{k} = arith.extf %y{k} : vector<8xbf16> to vector<8xf32>\n"
            f"    %wb{k} = vector.broadcast %w{k} : f32 to vector<8xf32>\n"
            f"    %acc{k} = vector.fma %wb{k}, %yf{k}, {acc} : vector<8xf32>"
        )
        acc = f"%acc{k}"
    source = f"""\
// {name}: weighted sum of each token's {K} expert rows (hidden {H}), {CB} tokens per CTA of {block_size}.
func.func @{name}(%i: index, %tw: {tw_t}, %inv: {vec_t}, %Yp: {x_t}, %Out: {x_t}) {{
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %cBS = arith.constant {block_size} : index
  %cCB = arith.constant {CB} : index
  %cK = arith.constant {K} : index
  %cHC = arith.constant {H // 8} : index
{k_consts}
  %zero8 = arith.constant dense<0.0> : vector<8xf32>
  %tid = gpu.thread_id x
  %T = memref.dim %Out, %c0 : {x_t}
  %t0 = arith.muli %i, %cCB : index
  %t1a = arith.addi %t0, %cCB : index
  %t1 = arith.minui %t1a, %T : index
  %n = arith.subi %t1, %t0 : index
  %total = arith.muli %n, %cHC : index
  scf.for %q = %tid to %total step %cBS {{
    %dt = arith.divui %q, %cHC : index
    %ch = arith.remui %q, %cHC : index
    %col = arith.muli %ch, %c8 : index
    %t = arith.addi %t0, %dt : index
    %slot0 = arith.muli %t, %cK : index
{chr(10).join(terms)}
    %o = arith.truncf {acc} : vector<8xf32> to vector<8xbf16>
    vector.store %o, %Out[%t, %col] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>
  }}
  return
}}
"""

    def reference(i: int, tw: np.ndarray, inv: np.ndarray, Yp: np.ndarray, Out: np.ndarray):
        t0, t1 = i * CB, min((i + 1) * CB, Out.shape[0])
        if t0 >= t1:
            return
        acc = np.zeros((t1 - t0, Out.shape[1]), np.float32)
        for k in range(K):
            rows = inv[np.arange(t0, t1) * K + k]
            acc += tw[t0:t1, k : k + 1] * bf16_to_f32(Yp[rows])
        Out[t0:t1] = f32_to_bf16(acc)

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)

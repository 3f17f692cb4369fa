"""Mixture-of-experts tiles: router, plan, permute and combine (ETC issue 6).

The MoE layer of ``docs/moe.md`` as device functions (MLIR text, one CTA of
``block_size`` threads, upstream dialects only) with numpy references. bf16
tensors are ``uint16`` bit patterns in numpy (:mod:`etc.dtypes`); all
arithmetic is fp32 (``arith.extf`` / ``arith.truncf``, round to nearest even).

* ``router_logits(RB, EC, E, H)``, grid ``(ceil(T/RB), E/EC)``: fp32 logits
  ``L = X @ Wr^T`` of RB tokens x EC experts (the router's read of Wr is
  spread over E/EC CTAs).
* ``clear_counts(E)``, grid ``(1,)``: ``counts[:] = 0`` for this launch.
* ``router_topk(RB, TB, E, K)``, grid ``(ceil(T/RB), RB/TB)``: top-K of TB
  tokens' logits (ties: lower expert first), weights ``softmax``
  renormalised over the K chosen (``exp(l_k - l_max) / sum``, which equals
  the softmax over all E followed by renormalisation); each chosen expert's
  count is incremented atomically, the old value being the slot's position
  ``pos[t, k]`` among the expert's rows.
* ``plan(BM, NT, ND, E, K)``, grid ``(ceil(T*K / PLAN_SLOTS),)``: prefix
  sums of the counts by warp 0 (shuffle-up scan), the tables ``row_off,
  gu_indptr, dn_indptr, h_wait, dn_total`` (instance 0) and, for the
  instance's slots, the row permutation ``perm`` (rows grouped by expert)
  with its inverse ``inv``.
* ``route(E, K, BM, NT, ND)``, grid ``(1,)``: clear, top-k and plan in one
  CTA for at most ``max_tokens`` tokens (decode: one hop instead of three;
  the counts live in workgroup memory).
* ``permute(E, K, H)``, grid ``(E,)``: expert e gathers its rows
  ``Xp[r] = X[perm[r] // K]`` with 16-byte loads (``slots=S``: whole rows
  by bulk copies through S shared-memory slots).
* ``combine(CB, K, H)``, grid ``(ceil(T/CB),)``:
  ``Out[t] = sum_k topk_w[t, k] * Yp[inv[t*K + k]]`` in fp32, stored bf16.
* ``zero_rows(ZB, H)`` and ``cast_rows(CB, H)``, grids ``(ceil(T/ZB),)``
  and ``(ceil(T/CB),)``: ``Out32 = 0`` before, and ``Out = bf16(Out32)``
  after, down tiles that add their weighted rows into the float32 sums
  ``Out32`` themselves (``MoEConfig(combine="atomic")``; ``dtype="f16"``:
  the half-precision sums ``Out16``).

Buffers are row-major and 16-byte aligned (H a multiple of 8).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from .._fields import checked_arguments
from ..device import DeviceFunction
from ..dtypes import bf16_to_f32, f32_to_bf16
from ..errors import GraphError
from . import _text
from ._mma import SUMS
from .gemm import MAX_SHARED_BYTES

__all__ = [
    "clear_counts",
    "zero_rows",
    "cast_rows",
    "router_logits",
    "router_topk",
    "plan",
    "plan_grid",
    "permute",
    "release",
    "combine",
    "router_reference_rows",
    "topk_from_logits",
    "plan_tables",
    "route",
]

_WG = "#gpu.address_space<workgroup>"


_positive = _text.positive
_check_block = _text.check_block


def _check_hidden(name: str, H: int) -> None:
    if H % 8:
        raise GraphError(f"tile '{name}': hidden={H} must be a multiple of 8 (16-byte bf16 loads)")


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


#: ``router_logits`` unrolls its k loop when it has at most this many steps.
_LOGITS_UNROLL = 4


@checked_arguments
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

    def k_step(tag: str, k: str, acc: list[str], ind: str) -> tuple[list[str], list[str]]:
        """One k step at ``k`` (names suffixed by ``tag``): its loads (Wr,
        then the RS rows of X) and its math (extensions, FMAs into ``acc``)."""
        loads = [
            f"{ind}%wv{tag} = vector.load %Wr[%e, {k}] {{alignment = 16 : i64}} : {w_t}, vector<8xbf16>"
        ]
        math = [f"{ind}%wf{tag} = arith.extf %wv{tag} : vector<8xbf16> to vector<8xf32>"]
        for r in range(RS):
            loads.append(
                f"{ind}%xv{tag}{r} = vector.load %X[%row{r}, {k}] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>"
            )
            math.append(
                f"{ind}%xf{tag}{r} = arith.extf %xv{tag}{r} : vector<8xbf16> to vector<8xf32>\n"
                f"{ind}%n{tag}{r} = vector.fma %xf{tag}{r}, %wf{tag}, {acc[r]} : vector<8xf32>"
            )
        return loads, math

    trips, rest = divmod(H, S * 256)
    if not rest and trips <= _LOGITS_UNROLL:
        # Few k steps (decode: 2 at H=2048): straight-line code, the loads of
        # every step first, so all of Wr and X is in flight at once (one round
        # trip, not `trips`).
        loads, math = [f"      %c{u}_u = arith.constant {u} : index" for u in range(trips)], []
        acc = ["%zero8"] * RS
        for u in range(trips):
            loads.append(
                f"      %ko{u} = arith.muli %cKstep, %c{u}_u : index\n"
                f"      %k{u} = arith.addi %kfirst, %ko{u} : index"
            )
            step_loads, step_math = k_step(f"{u}_", f"%k{u}", acc, "      ")
            loads += step_loads
            math += step_math
            acc = [f"%n{u}_{r}" for r in range(RS)]
        k_loop, acc_names = "\n".join(loads + math), acc
    else:
        step_loads, step_math = k_step("", "%k", [f"%a{r}" for r in range(RS)], "        ")
        # Each row's load next to its FMA, as before the unrolled form existed.
        body = [step_loads[0], step_math[0]]
        for load, fma in zip(step_loads[1:], step_math[1:], strict=True):
            body += [load, fma]
        yields = ", ".join(f"%n{r}" for r in range(RS))
        k_loop = "\n".join(
            [
                f"      %acc:{RS} = scf.for %k = %kfirst to %cH step %cKstep iter_args({zeros}) -> ({acc_types}) {{",
                *body,
                f"        scf.yield {yields} : {acc_types}",
                "      }",
            ]
        )
        acc_names = [f"%acc#{r}" for r in range(RS)]
    reductions = []
    for r in range(RS):
        shuffles, value = _text.warp_sum(f"%s{r}", "      ")
        for old in ("%sh", "%ok", "%red"):
            shuffles = shuffles.replace(old, f"{old}{r}_")
        value = value.replace("%red", f"%red{r}_")
        reductions.append(
            f"      %s{r} = vector.reduction <add>, {acc_names[r]} : vector<8xf32> into f32\n"
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
{k_loop}
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


def _check_topk(name: str, E: int, K: int) -> None:
    """A warp's top-K of E logits: lane k holds choice k."""
    if K > E:
        raise GraphError(f"tile '{name}': topk={K} exceeds experts={E}")
    if K > 32:
        raise GraphError(f"tile '{name}': topk={K} exceeds 32 (lane k writes choice k)")


def _summed_logits(L: np.ndarray, splits: int, t0: int, t1: int, T: int) -> np.ndarray:
    """numpy's logits of tokens ``[t0, t1)`` of T from ``splits`` partial sums
    (part ``p`` in rows ``p*T ...``), added in part order as the tiles do."""
    logits = L[t0:t1].copy()
    for p in range(1, splits):
        logits += L[p * T + t0 : p * T + t1]
    return logits


def _topk_select(E: int, K: int, splits: int, l_t: str, ind: str) -> tuple[str, str, str, str, str]:
    """The top-K of logits row ``%t`` (``%L``, ``splits`` parts added in part
    order) by one warp: lane l loads experts ``l, l+32, ...`` (one L2 round
    trip), then K unrolled warp arg-max rounds (ties: the lower expert), the
    winner's register cleared after each. Needs ``%t``, ``%lane``, ``%cE``,
    ``%cEm1``, ``%ninf``, the shuffle constants and, with splits, ``%tS<p>``
    (:func:`_logit_rows`). Returns (ops, constants, lane k's expert (i32) and
    unnormalised weight ``exp(l_k - l_0)`` for lanes k < K, their sum)."""
    loads, select, consts, pick_id, pick_p, total = _topk_select_parts(E, K, splits, l_t, ind)
    return f"{loads}\n{select}", consts, pick_id, pick_p, total


def _topk_select_parts(
    E: int, K: int, splits: int, l_t: str, ind: str
) -> tuple[str, str, str, str, str, str]:
    """:func:`_topk_select` with its ops in two: the logits' loads, then the
    selection (so several tokens' loads can go out together)."""
    per_lane = -(-E // 32)
    lines = []

    def logit(out: str, q: int, col: str) -> None:
        """``out`` = the logit of row %t, expert ``col``: the parts' sum in part order."""
        first = out if splits == 1 else f"%l{q}_0"
        lines.append(f"{ind}{first} = memref.load %L[%t, {col}] : {l_t}")
        total = first
        for p in range(1, splits):
            added = out if p == splits - 1 else f"%ls{q}_{p}"
            lines.append(
                f"{ind}%row{q}_{p} = arith.addi %t, %tS{p} : index\n"
                f"{ind}%l{q}_{p} = memref.load %L[%row{q}_{p}, {col}] : {l_t}\n"
                f"{ind}{added} = arith.addf {total}, %l{q}_{p} : f32"
            )
            total = added

    # This lane's logits: expert lane + 32q (past E: -inf, never chosen).
    for q in range(per_lane):
        lines.append(
            f"{ind}%e{q} = arith.addi %lane, %cQ{q} : index\n"
            f"{ind}%e{q}_i32 = arith.index_cast %e{q} : index to i32"
        )
        if 32 * (q + 1) <= E:
            logit(f"%v0_{q}", q, f"%e{q}")
        else:
            lines.append(
                f"{ind}%in{q} = arith.cmpi ult, %e{q}, %cE : index\n"
                f"{ind}%ec{q} = arith.minui %e{q}, %cEm1 : index"
            )
            logit(f"%raw{q}", q, f"%ec{q}")
            lines.append(f"{ind}%v0_{q} = arith.select %in{q}, %raw{q}, %ninf : f32")
    loads, lines = "\n".join(lines), []
    probs, chosen = [], []
    for k in range(K):
        # This lane's best (strict >: the lower expert on ties), then the warp's.
        bv, bi = f"%v{k}_0", "%e0_i32"
        for q in range(1, per_lane):
            lines.append(
                f"{ind}%gt{k}_{q} = arith.cmpf ogt, %v{k}_{q}, {bv} : f32\n"
                f"{ind}%bv{k}_{q} = arith.select %gt{k}_{q}, %v{k}_{q}, {bv} : f32\n"
                f"{ind}%bi{k}_{q} = arith.select %gt{k}_{q}, %e{q}_i32, {bi} : i32"
            )
            bv, bi = f"%bv{k}_{q}", f"%bi{k}_{q}"
        ops, best_v, best_i = _text.warp_argmax(bv, bi, ind, tag=f"r{k}_")
        lines.append(ops)
        if k + 1 < K:
            for q in range(per_lane):
                lines.append(
                    f"{ind}%hit{k}_{q} = arith.cmpi eq, %e{q}_i32, {best_i} : i32\n"
                    f"{ind}%v{k + 1}_{q} = arith.select %hit{k}_{q}, %ninf, %v{k}_{q} : f32"
                )
        # Round 0 finds the largest logit m: weight exp(l_k - m).
        if k == 0:
            m = best_v
        lines.append(
            f"{ind}%d{k} = arith.subf {best_v}, {m} : f32\n{ind}%p{k} = math.exp %d{k} : f32"
        )
        probs.append(f"%p{k}")
        chosen.append(best_i)
    total = probs[0]
    for k in range(1, K):
        lines.append(f"{ind}%sum{k} = arith.addf {total}, {probs[k]} : f32")
        total = f"%sum{k}"
    # Lane k < K keeps choice k (its stores then coalesce).
    lines.append(f"{ind}%kl_i32 = arith.index_cast %lane : index to i32")
    pick_id, pick_p = chosen[0], "%p0"
    for k in range(1, K):
        lines.append(
            f"{ind}%is{k} = arith.cmpi eq, %kl_i32, %c{k}_k : i32\n"
            f"{ind}%pid{k} = arith.select %is{k}, {chosen[k]}, {pick_id} : i32\n"
            f"{ind}%pp{k} = arith.select %is{k}, %p{k}, {pick_p} : f32"
        )
        pick_id, pick_p = f"%pid{k}", f"%pp{k}"
    consts = "\n".join(f"  %cQ{q} = arith.constant {32 * q} : index" for q in range(per_lane))
    consts += "\n" + "\n".join(f"  %c{k}_k = arith.constant {k} : i32" for k in range(1, K))
    return loads, "\n".join(lines), consts, pick_id, pick_p, total


def _renamed(parts: tuple[str, ...], suffix: str, renames: dict[str, str]) -> list[str]:
    """The ``parts`` of one body with every SSA value they define suffixed by
    ``suffix`` and the outer values in ``renames`` replaced (one unrolled
    copy of the body; a part may use what an earlier one defines)."""
    defined = {
        name
        for ops in parts
        for line in ops.split("\n")
        if (m := re.match(r"\s*((?:%[\w.]+, )*%[\w.]+) = ", line))
        for name in m.group(1).split(", ")
    }
    table = {name: name + suffix for name in defined} | renames
    return [re.sub(r"%[\w.]+", lambda m: table.get(m.group(0), m.group(0)), ops) for ops in parts]


def _topk_unrolled(
    E: int,
    K: int,
    splits: int,
    l_t: str,
    warps: int,
    unroll: int,
    counts: bool,
    ids_t: str,
    tw_t: str,
    c_t: str,
) -> str:
    """:func:`router_topk`'s token loop with ``unroll`` tokens a warp at a
    time: every token's loads, then every selection, then the stores, the
    atomics (all issued before any old value is stored) and ``pos``."""
    ind = "    "
    loads, select, _, pick_id, pick_p, total = _topk_select_parts(E, K, splits, l_t, ind)
    head, body_loads, body_select, writes, atomics, positions = [], [], [], [], [], []
    for u in range(unroll):
        x = f"_u{u}"
        head.append(
            f"    %ru{u} = arith.addi %r, %cWu{u} : index\n"
            f"    %t{x} = arith.addi %t0, %ru{u} : index\n"
            f"    %inb{u} = arith.cmpi ult, %ru{u}, %cTB : index\n"
            f"    %intok{u} = arith.cmpi ult, %t{x}, %T : index\n"
            f"    %live{x} = arith.andi %inb{u}, %intok{u} : i1\n"
            f"    %tc{x} = arith.minui %t{x}, %Tm1 : index"
        )
        copy_loads, copy_select = _renamed((loads, select), x, {"%t": f"%tc{x}"})
        body_loads.append(copy_loads)
        body_select.append(copy_select)
        pid, pp, tot = pick_id + x, pick_p + x, total + x
        writes.append(
            f"      scf.if %live{x} {{\n"
            f"        %wmine{x} = arith.divf {pp}, {tot} : f32\n"
            f"        memref.store {pid}, %ids[%t{x}, %lane] : {ids_t}\n"
            f"        memref.store %wmine{x}, %tw[%t{x}, %lane] : {tw_t}\n"
            "      }"
        )
        if counts:
            atomics.append(
                f"      %pmine{x} = scf.if %live{x} -> (i32) {{\n"
                f"        %emine{x} = arith.index_cast {pid} : i32 to index\n"
                f"        %old{x} = memref.atomic_rmw addi %c1_i32, %counts[%emine{x}] : "
                f"(i32, {c_t}) -> i32\n"
                f"        scf.yield %old{x} : i32\n"
                "      } else {\n"
                "        scf.yield %c0_i32 : i32\n"
                "      }"
            )
            positions.append(
                f"      scf.if %live{x} {{\n"
                f"        memref.store %pmine{x}, %pos[%t{x}, %lane] : {ids_t}\n"
                "      }"
            )
    steps = "\n".join(f"  %cWu{u} = arith.constant {u * warps} : index" for u in range(unroll))
    return f"""\
{steps}
  %cWU = arith.constant {unroll * warps} : index
  %c0_i32 = arith.constant 0 : i32
  %c1_ = arith.constant 1 : index
  %Tm1 = arith.subi %T, %c1_ : index
  scf.for %r = %warp to %cTB step %cWU {{
{chr(10).join(head)}
{chr(10).join(body_loads)}
{chr(10).join(body_select)}
    scf.if %writer {{
{chr(10).join(writes + atomics + positions)}
    }}
  }}"""


def _logit_rows(splits: int, l_t: str, ids_t: str | None = None) -> str:
    """``%T`` (tokens) from the logits' rows over the parts, or with
    ``ids_t`` from the rows of ``%ids`` (the logits may have spare rows);
    part p's rows start at ``%tS<p>``."""
    if ids_t is not None:
        tokens = f"  %T = memref.dim %ids, %c0 : {ids_t}\n"
    elif splits == 1:
        return f"  %T = memref.dim %L, %c0 : {l_t}"
    else:
        tokens = (
            f"  %Lrows = memref.dim %L, %c0 : {l_t}\n"
            f"  %cS = arith.constant {splits} : index\n"
            "  %T = arith.divui %Lrows, %cS : index\n"
        )
    return tokens + "\n".join(
        f"  %c{p}_s = arith.constant {p} : index\n  %tS{p} = arith.muli %T, %c{p}_s : index"
        for p in range(1, splits)
    )


@checked_arguments
def router_topk(
    RB: int,
    TB: int,
    E: int,
    K: int,
    *,
    splits: int = 1,
    tokens_from_ids: bool = False,
    counts: bool = True,
    unroll: int = 1,
    name: str = "moe_topk",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``(i, j)``, grid ``(ceil(T/RB), RB/TB)``: top-K of the fp32
    logits of tokens ``[i*RB + j*TB, +TB)`` (those below T).

    Warp w takes tokens ``w, w+W, ...``; lane l loads the logits of experts
    ``l, l+32, ...`` into registers (all at once: one L2 round trip). Then K
    unrolled rounds of a warp arg-max (ties go to the lower expert), the
    owner lane clearing the winner's register; the weights ``exp(l_k -
    l_0)`` stay in registers until they are normalised by their sum (softmax
    over all E, renormalised over the K). No shared memory, no barrier: a
    round costs a few compares and five shuffles. Lane k < K then writes
    choice k and increments its expert's ``counts[e]`` atomically (one
    warp-wide atomic); the old value is the slot's position among expert
    e's rows (``pos[t, k]``, for :func:`plan`).

    ``splits=S``: the logits come in ``S`` partial sums (``L`` is ``S*T x
    E``, part ``s`` in rows ``s*T ...``: a split-K router), added in part
    order as they are loaded. ``tokens_from_ids``: T is the rows of ``ids``,
    not of ``L`` over S (``L`` may have spare rows: one buffer for kernels
    with other splits). ``counts=False``: no ``counts`` and ``pos`` (a
    routing without tables: ``etc.models.moe``'s ``route="slots"``); the
    tile takes ``(L, ids, tw)``.

    ``unroll=U``: a warp takes U tokens at a time (``w, w+W, ...`` of each
    group of ``U*W``), their logits' loads issued together, then their
    selections, stores and atomics, so a warp with several tokens pays one
    L2 round trip and one atomic round trip a group instead of a token
    (tokens past T load row T-1 and store nothing).
    """
    warps = _check_block(name, block_size)
    _positive(name, RB=RB, TB=TB, E=E, K=K, splits=splits, unroll=unroll)
    _check_topk(name, E, K)
    if RB % TB:
        raise GraphError(f"tile '{name}': RB={RB} is not a multiple of TB={TB}")
    l_t, c_t = f"memref<?x{E}xf32>", f"memref<{E}xi32>"
    ids_t, tw_t = f"memref<?x{K}xi32>", f"memref<?x{K}xf32>"
    ind = "        "
    body, consts, pick_id, pick_p, total = _topk_select(E, K, splits, l_t, ind)
    stores = (
        f"{ind}  %wmine = arith.divf {pick_p}, {total} : f32\n"
        f"{ind}  memref.store {pick_id}, %ids[%t, %lane] : {ids_t}\n"
        f"{ind}  memref.store %wmine, %tw[%t, %lane] : {tw_t}"
    )
    if counts:
        stores += (
            f"\n{ind}  %emine = arith.index_cast {pick_id} : i32 to index\n"
            f"{ind}  %pmine = memref.atomic_rmw addi %c1_i32, %counts[%emine] : (i32, {c_t}) -> i32\n"
            f"{ind}  memref.store %pmine, %pos[%t, %lane] : {ids_t}"
        )
    tables = f", %counts: {c_t}, %pos: {ids_t}" if counts else ""
    rows = _logit_rows(splits, l_t, ids_t if tokens_from_ids else None)
    loop = (
        f"""\
  scf.for %r = %warp to %cTB step %cW {{
    %t = arith.addi %t0, %r : index
    %live = arith.cmpi ult, %t, %T : index
    scf.if %live {{
{body}
      scf.if %writer {{
{stores}
      }}
    }}
  }}"""
        if unroll == 1
        else _topk_unrolled(E, K, splits, l_t, warps, unroll, counts, ids_t, tw_t, c_t)
    )
    source = f"""\
// {name}: top-{K} of {E} router logits for {TB} tokens, one CTA of {block_size}.
func.func @{name}(%i: index, %j: index, %L: {l_t}, %ids: {ids_t}, %tw: {tw_t}{tables}) {{
  %c0 = arith.constant 0 : index
  %c32 = arith.constant 32 : index
  %cW = arith.constant {warps} : index
  %cE = arith.constant {E} : index
  %cEm1 = arith.constant {E - 1} : index
  %cK = arith.constant {K} : index
  %cRB = arith.constant {RB} : index
  %cTB = arith.constant {TB} : index
{consts}
{_text.shuffle_constants()}
  %c32_i32 = arith.constant 32 : i32
  %ninf = arith.constant 0xFF800000 : f32
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %writer = arith.cmpi ult, %lane, %cK : index
{rows}
  %ti = arith.muli %i, %cRB : index
  %tj = arith.muli %j, %cTB : index
  %t0 = arith.addi %ti, %tj : index
{loop}
  return
}}
"""

    def reference(i: int, j: int, L: np.ndarray, ids: np.ndarray, tw: np.ndarray, *tables) -> None:
        T = ids.shape[0]
        t0 = i * RB + j * TB
        t1 = min(t0 + TB, T)
        if t0 >= t1:
            return
        ids[t0:t1], tw[t0:t1] = topk_from_logits(_summed_logits(L, splits, t0, t1, T), K)
        if not tables:
            return
        cnt, pos = tables
        for t in range(t0, t1):
            for k in range(K):
                pos[t, k] = cnt[ids[t, k]]
                cnt[ids[t, k]] += 1

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


#: Token slots one plan instance places (the plan's grid is
#: ``ceil(T*K / PLAN_SLOTS)``).
PLAN_SLOTS = 2048
#: Slots a plan thread reads per step: their ids and positions are loaded
#: before the first store, so a thread has that many pairs in flight.
PLAN_UNROLL = 8


#: The index constants :func:`_scan_ops` compares the lane with.
_SCAN_CONSTS = "\n".join(f"  %c{o}_l = arith.constant {o} : index" for o in (1, 2, 4, 8, 16))


def _scan_ops() -> str:
    """Warp 0's inclusive shuffle-up scans of its lanes' token counts
    (``%csum``) and row-block counts (``%msum``) over experts: ``%cs4`` and
    ``%ms4`` (the totals up to this lane's run of experts). Needs
    ``%lane``, :data:`_SCAN_CONSTS`, ``%c0_i32`` and the shuffle constants."""
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
    return "\n".join(scans)


def _table_consts(BM: int, NT: int, ND: int) -> str:
    """The i32 constants of :func:`_warp0_tables` (and the shuffles' width)."""
    return (
        "  %c32_i32 = arith.constant 32 : i32\n"
        "  %c0_i32 = arith.constant 0 : i32\n"
        f"  %cBM1_i32 = arith.constant {BM - 1} : i32\n"
        f"  %cBM_i32 = arith.constant {BM} : i32\n"
        f"  %cNT_i32 = arith.constant {NT} : i32\n"
        f"  %cND_i32 = arith.constant {ND} : i32"
    )


def _warp0_tables(
    counts: str,
    counts_t: str,
    cursor_t: str,
    e1_t: str,
    e_t: str,
    one_t: str,
    *,
    tables: str | None,
    counts_out: str | None,
) -> str:
    """``scf.if %is_warp0``: the expert offsets from ``counts`` (each lane a
    run of ``%cChunk`` experts, then :func:`_scan_ops`) into ``%cursor[e]``
    (expert e's first row) and, under ``scf.if <tables>`` (None: always), the
    tables ``%row_off``, ``%gu``, ``%dn``, ``%hw``, ``%dt`` (and the counts
    into ``counts_out``, a memref of type ``e_t``, when given)."""
    ind = "      " if tables is None else "        "
    table_ops = ([f"memref.store %c, {counts_out}[%e] : {e_t}"] if counts_out else []) + [
        f"memref.store %cr, %row_off[%e] : {e1_t}",
        "%g = arith.muli %mr, %cNT_i32 : i32",
        f"memref.store %g, %gu[%e] : {e1_t}",
        "%d = arith.muli %mr, %cND_i32 : i32",
        f"memref.store %d, %dn[%e] : {e1_t}",
        "%gt = arith.muli %mb, %cNT_i32 : i32",
        "%h = arith.addi %gt, %c1_i32 : i32",
        f"memref.store %h, %hw[%e] : {e_t}",
    ]
    table_text = "\n".join(ind + op for op in table_ops)
    if tables is not None:
        table_text = f"      scf.if {tables} {{\n{table_text}\n      }}"
    last = "%last" if tables is None else "%write_last"
    last_def = (
        "    %last = arith.cmpi eq, %lane, %c31 : index"
        if tables is None
        else "    %last = arith.cmpi eq, %lane, %c31 : index\n"
        f"    %write_last = arith.andi %last, {tables} : i1"
    )
    return f"""\
  scf.if %is_warp0 {{
    %lo0 = arith.muli %lane, %cChunk : index
    %lo = arith.minui %lo0, %cE : index
    %hi0 = arith.addi %lo, %cChunk : index
    %hi = arith.minui %hi0, %cE : index
    %csum, %msum = scf.for %e = %lo to %hi step %c1 iter_args(%ca = %c0_i32, %ma = %c0_i32) -> (i32, i32) {{
      %c = memref.load {counts}[%e] : {counts_t}
      %cb = arith.addi %c, %cBM1_i32 : i32
      %mb = arith.divui %cb, %cBM_i32 : i32
      %ca2 = arith.addi %ca, %c : i32
      %ma2 = arith.addi %ma, %mb : i32
      scf.yield %ca2, %ma2 : i32, i32
    }}
{_scan_ops()}
    %cx = arith.subi %cs4, %csum : i32
    %mx = arith.subi %ms4, %msum : i32
    %r1, %r2 = scf.for %e = %lo to %hi step %c1 iter_args(%cr = %cx, %mr = %mx) -> (i32, i32) {{
      %c = memref.load {counts}[%e] : {counts_t}
      %cb = arith.addi %c, %cBM1_i32 : i32
      %mb = arith.divui %cb, %cBM_i32 : i32
      memref.store %cr, %cursor[%e] : {cursor_t}
{table_text}
      %cr2 = arith.addi %cr, %c : i32
      %mr2 = arith.addi %mr, %mb : i32
      scf.yield %cr2, %mr2 : i32, i32
    }}
{last_def}
    scf.if {last} {{
      memref.store %cs4, %row_off[%cE] : {e1_t}
      %gT = arith.muli %ms4, %cNT_i32 : i32
      memref.store %gT, %gu[%cE] : {e1_t}
      %dT = arith.muli %ms4, %cND_i32 : i32
      memref.store %dT, %dn[%cE] : {e1_t}
      memref.store %dT, %dt[%c0] : {one_t}
    }}
  }}"""


@checked_arguments
def clear_counts(E: int, *, name: str = "moe_clear", block_size: int = 256) -> DeviceFunction:
    """Tile ``(i,)`` (grid ``(1,)``): ``counts[:] = 0``, before any top-k
    instance counts its tokens (every launch starts from zero, whatever the
    buffer held)."""
    _check_block(name, block_size)
    _positive(name, E=E)
    c_t = f"memref<{E}xi32>"
    source = f"""\
// {name}: zero the {E} per-expert token counts, one CTA of {block_size}.
func.func @{name}(%i: index, %counts: {c_t}) {{
  %cE = arith.constant {E} : index
  %cBS = arith.constant {block_size} : index
  %c0_i32 = arith.constant 0 : i32
  %tid = gpu.thread_id x
  scf.for %e = %tid to %cE step %cBS {{
    memref.store %c0_i32, %counts[%e] : {c_t}
  }}
  return
}}
"""

    def reference(i: int, counts: np.ndarray) -> None:
        counts[...] = 0

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def plan_grid(T: Any, K: int) -> Any:
    """Instances of :func:`plan` for T tokens (an int or a symbol expression)."""
    return (T * K + PLAN_SLOTS - 1) // PLAN_SLOTS


@checked_arguments
def plan(
    BM: int, NT: int, ND: int, E: int, K: int, *, name: str = "moe_plan", block_size: int = 256
) -> DeviceFunction:
    """Tile ``(i,)``, grid :func:`plan_grid`: the routing tables, from the
    per-expert ``counts`` and each slot's ``pos`` within its expert (the
    top-k tile's atomic counts).

    Every instance scans the counts (warp 0: each lane a contiguous run of
    ``ceil(E/32)`` experts, then a shuffle-up scan) into workgroup row
    offsets; instance 0 also writes ``row_off``, ``gu_indptr`` (``NT``
    tiles per row block), ``dn_indptr`` (``ND``), ``h_wait`` (gate/up tiles
    + 1) and ``dn_total``. Instance i then places slots ``[i*PLAN_SLOTS,
    (i+1)*PLAN_SLOTS)``: ``r = row_off[e] + pos[s]``, ``perm[r] = s``,
    ``inv[s] = r`` (the order inside an expert is the atomics' order).
    """
    _check_block(name, block_size)
    _positive(name, BM=BM, NT=NT, ND=ND, E=E, K=K)
    chunk = -(-E // 32)
    ids_t, e1_t, e_t = f"memref<?x{K}xi32>", f"memref<{E + 1}xi32>", f"memref<{E}xi32>"
    one_t, vec_t = "memref<1xi32>", "memref<?xi32>"
    sm_t = f"memref<{E}xi32, {_WG}>"
    consts = (
        _SCAN_CONSTS
        + "\n"
        + "\n".join(
            f"  %cU{u} = arith.constant {u * block_size} : index" for u in range(PLAN_UNROLL)
        )
    )
    loads, stores = [], []
    for u in range(PLAN_UNROLL):
        loads.append(
            f"    %s_{u} = arith.addi %s0, %cU{u} : index\n"
            f"    %sc_{u} = arith.minui %s_{u}, %slast : index\n"
            f"    %t_{u} = arith.divui %sc_{u}, %cK : index\n"
            f"    %k_{u} = arith.remui %sc_{u}, %cK : index\n"
            f"    %e_{u}_i32 = memref.load %ids[%t_{u}, %k_{u}] : {ids_t}\n"
            f"    %p_{u} = memref.load %pos[%t_{u}, %k_{u}] : {ids_t}"
        )
        stores.append(
            f"    %ok_{u} = arith.cmpi ult, %s_{u}, %s1 : index\n"
            f"    scf.if %ok_{u} {{\n"
            f"      %e_{u} = arith.index_cast %e_{u}_i32 : i32 to index\n"
            f"      %base_{u} = memref.load %cursor[%e_{u}] : {sm_t}\n"
            f"      %r_{u}_i32 = arith.addi %base_{u}, %p_{u} : i32\n"
            f"      %r_{u} = arith.index_cast %r_{u}_i32 : i32 to index\n"
            f"      %slot_{u} = arith.index_cast %s_{u} : index to i32\n"
            f"      memref.store %slot_{u}, %perm[%r_{u}] : {vec_t}\n"
            f"      memref.store %r_{u}_i32, %inv[%s_{u}] : {vec_t}\n"
            f"    }}"
        )
    loads, stores = "\n".join(loads), "\n".join(stores)
    source = f"""\
// {name}: MoE routing tables for {E} experts, top-{K}, row blocks of {BM}, {PLAN_SLOTS} slots per CTA of {block_size}.
memref.global "private" @{name}__cursor : {sm_t} {{alignment = 16 : i64}}
func.func @{name}(%i: index, %ids: {ids_t}, %pos: {ids_t}, %counts: {e_t}, %row_off: {e1_t}, %gu: {e1_t}, %dn: {e1_t}, %hw: {e_t}, %dt: {one_t}, %perm: {vec_t}, %inv: {vec_t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c31 = arith.constant 31 : index
  %c32 = arith.constant 32 : index
  %cBS = arith.constant {block_size} : index
  %cE = arith.constant {E} : index
  %cK = arith.constant {K} : index
  %cChunk = arith.constant {chunk} : index
  %cSlots = arith.constant {PLAN_SLOTS} : index
  %cSTEP = arith.constant {PLAN_UNROLL * block_size} : index
{consts}
{_text.shuffle_constants()}
{_table_consts(BM, NT, ND)}
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_warp0 = arith.cmpi eq, %warp, %c0 : index
  %tables = arith.cmpi eq, %i, %c0 : index
  %T = memref.dim %ids, %c0 : {ids_t}
  %N = arith.muli %T, %cK : index
  %cursor = memref.get_global @{name}__cursor : {sm_t}
  // A previous call on this CTA may still be reading the row offsets.
  gpu.barrier
{_warp0_tables("%counts", e_t, sm_t, e1_t, e_t, one_t, tables="%tables", counts_out=None)}
  gpu.barrier
  %first = arith.muli %i, %cSlots : index
  %end = arith.addi %first, %cSlots : index
  %s1 = arith.minui %end, %N : index
  %slast = arith.subi %s1, %c1 : index
  %sfirst = arith.addi %first, %tid : index
  scf.for %s0 = %sfirst to %s1 step %cSTEP {{
{loads}
{stores}
  }}
  return
}}
"""

    def reference(
        i: int,
        ids: np.ndarray,
        pos: np.ndarray,
        counts: np.ndarray,
        row_off: np.ndarray,
        gu: np.ndarray,
        dn: np.ndarray,
        hw: np.ndarray,
        dt: np.ndarray,
        perm: np.ndarray,
        inv: np.ndarray,
    ) -> None:
        counts64 = counts.astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts64)])
        if i == 0:
            blocks = (counts64 + BM - 1) // BM
            row_off[...] = offsets
            gu[...] = np.concatenate([[0], np.cumsum(blocks * NT)])
            dn[...] = np.concatenate([[0], np.cumsum(blocks * ND)])
            hw[...] = blocks * NT + 1
            dt[0] = dn[-1]
        s = np.arange(i * PLAN_SLOTS, min((i + 1) * PLAN_SLOTS, ids.size))
        flat_ids, flat_pos = ids.reshape(-1)[s], pos.reshape(-1)[s]
        r = offsets[flat_ids] + flat_pos
        perm[r] = s
        inv[s] = r

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


# ----------------------------------------------------------------------------
# permute
# ----------------------------------------------------------------------------
#: (row, chunk) pairs a permute thread moves per step, loads first.
PERMUTE_UNROLL = 8


@checked_arguments
def permute(
    E: int,
    K: int,
    H: int,
    *,
    unroll: int = PERMUTE_UNROLL,
    slots: int = 0,
    name: str = "moe_permute",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``(e,)``: ``Xp[r] = X[perm[r] // K]`` for r in ``[row_off[e], row_off[e+1])``.

    The CTA walks (row, 8-column chunk) pairs, ``unroll`` of them per thread per
    step: all their 16-byte loads are issued before the stores, so each
    thread has UNROLL loads in flight (past the end, the pair index is
    clamped for the load and the store is skipped).

    ``slots=S`` (sm_90): whole rows by bulk copies instead (:func:`_bulk_permute`):
    thread ``s < S`` moves rows ``row_off[e] + s, + 2S, ...`` through its
    own shared-memory slot of ``2H`` bytes, so a CTA keeps ``S`` rows in
    flight whatever its registers.
    """
    _check_block(name, block_size)
    _positive(name, E=E, K=K, H=H, unroll=unroll)
    _check_hidden(name, H)
    if slots:
        return _bulk_permute(E, K, H, slots, name, block_size)
    x_t, e1_t, vec_t = f"memref<?x{H}xbf16>", f"memref<{E + 1}xi32>", "memref<?xi32>"
    loads, stores = [], []
    for u in range(unroll):
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
        f"  %cU{u} = arith.constant {u * block_size} : index" for u in range(unroll)
    )
    loads, stores = "\n".join(loads), "\n".join(stores)
    source = f"""\
// {name}: gather expert e's rows of X (hidden {H}, top-{K}) into Xp, one CTA of {block_size}.
func.func @{name}(%e: index, %X: {x_t}, %row_off: {e1_t}, %perm: {vec_t}, %Xp: {x_t}) {{
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %cSTEP = arith.constant {unroll * block_size} : index
{unroll_consts}
  %cK = arith.constant {K} : index
  %cHC = arith.constant {H // 8} : index
  %tid = gpu.thread_id x
{_expert_rows(e1_t)}
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

    return DeviceFunction.from_mlir(source, name, _permute_reference(K), block_size=block_size)


def _expert_rows(e1_t: str) -> str:
    """MLIR text: ``%r0, %r1`` = expert ``%e``'s rows ``row_off[e], row_off[e + 1]``
    (``%row_off: e1_t``; needs ``%c1``)."""
    return f"""\
  %e1 = arith.addi %e, %c1 : index
  %r0_i32 = memref.load %row_off[%e] : {e1_t}
  %r1_i32 = memref.load %row_off[%e1] : {e1_t}
  %r0 = arith.index_cast %r0_i32 : i32 to index
  %r1 = arith.index_cast %r1_i32 : i32 to index"""


def _permute_reference(K: int) -> Callable[..., None]:
    """The permute tiles' reference: expert ``e``'s rows ``Xp[r] = X[perm[r] // K]``."""

    def reference(e: int, X: np.ndarray, row_off: np.ndarray, perm: np.ndarray, Xp: np.ndarray):
        r0, r1 = int(row_off[e]), int(row_off[e + 1])
        Xp[r0:r1] = X[perm[r0:r1] // K]

    return reference


def _bulk_permute(E: int, K: int, H: int, S: int, name: str, block_size: int) -> DeviceFunction:
    """:func:`permute` with ``slots=S``. Each of threads ``0..S-1`` owns a
    slot of one row (``2H`` bytes, 128-byte aligned) and an mbarrier; per
    row it waits until its previous row's store has read the slot
    (``cp.async.bulk.wait_group.read``), loads the row with one bulk copy
    that completes on the barrier, waits for it, and stores it with another
    (``bulk_group``). At the end every store has completed and is fenced
    from the async proxy before the CTA's notification; the barriers are
    invalidated (tiles share shared memory)."""
    row_bytes = 2 * H
    if isinstance(S, bool) or not isinstance(S, int) or not 1 <= S <= block_size:
        raise GraphError(
            f"tile '{name}': slots={S!r} must be an int from 1 to block_size={block_size} "
            "(one copying thread per slot)"
        )
    if S * row_bytes > MAX_SHARED_BYTES:
        raise GraphError(
            f"tile '{name}': {S} slots of {row_bytes} bytes (hidden {H}) exceed the "
            f"{MAX_SHARED_BYTES} bytes of shared memory"
        )
    x_t, e1_t, vec_t = f"memref<?x{H}xbf16>", f"memref<{E + 1}xi32>", "memref<?xi32>"
    slots_t = f"memref<{S * row_bytes // 4}xi32, #gpu.address_space<workgroup>>"
    bars_t = f"memref<{2 * S}xi32, #gpu.address_space<workgroup>>"

    asm, wait = _text.asm_line, _text.MBAR_WAIT  # a copy that never lands traps
    source = f"""// {name}: gather expert e's rows of X (hidden {H}, top-{K}) into Xp by bulk copies
// through {S} slots of {row_bytes} bytes, one CTA of {block_size}.
memref.global "private" @{name}__slots : {slots_t} {{alignment = 128 : i64}}
memref.global "private" @{name}__bars : {bars_t} {{alignment = 8 : i64}}
func.func @{name}(%e: index, %X: {x_t}, %row_off: {e1_t}, %perm: {vec_t}, %Xp: {x_t}) {{
  %c1 = arith.constant 1 : index
  %cS = arith.constant {S} : index
  %cK = arith.constant {K} : index
  %cRB = arith.constant {row_bytes} : index
  %c8 = arith.constant 8 : index
  %rb32 = arith.constant {row_bytes} : i32
  %ph0 = arith.constant 0 : i32
  %one = arith.constant 1 : i32
  %tid = gpu.thread_id x
{_expert_rows(e1_t)}
  // The slots may hold another tile's generic writes.
  {asm("fence.proxy.async.shared::cta;", [])}
  gpu.barrier
  %mine = arith.cmpi ult, %tid, %cS : index
  scf.if %mine {{
    %sg = memref.get_global @{name}__slots : {slots_t}
    %sp = memref.extract_aligned_pointer_as_index %sg : {slots_t} -> index
    %so = arith.muli %tid, %cRB : index
    %sa = arith.addi %sp, %so : index
    %slot = arith.index_cast %sa : index to i32
    %bg = memref.get_global @{name}__bars : {bars_t}
    %bp = memref.extract_aligned_pointer_as_index %bg : {bars_t} -> index
    %bo = arith.muli %tid, %c8 : index
    %ba = arith.addi %bp, %bo : index
    %bar = arith.index_cast %ba : index to i32
    {asm("mbarrier.init.shared::cta.b64 [$0], 1;", [("%bar", "i32")])}
    {asm("fence.mbarrier_init.release.cluster;", [])}
    %xp = memref.extract_aligned_pointer_as_index %X : {x_t} -> index
    %xpp = memref.extract_aligned_pointer_as_index %Xp : {x_t} -> index
    %first = arith.addi %r0, %tid : index
    %last = scf.for %r = %first to %r1 step %cS iter_args(%ph = %ph0) -> (i32) {{
      %slot_i32 = memref.load %perm[%r] : {vec_t}
      %sl = arith.index_cast %slot_i32 : i32 to index
      %tok = arith.divui %sl, %cK : index
      %srco = arith.muli %tok, %cRB : index
      %srca = arith.addi %xp, %srco : index
      %src = arith.index_cast %srca : index to i64
      %dsto = arith.muli %r, %cRB : index
      %dsta = arith.addi %xpp, %dsto : index
      %dst = arith.index_cast %dsta : index to i64
      // The slot's previous row has left it (its store read it).
      {asm("cp.async.bulk.wait_group.read 0;", [])}
      {asm("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", [("%bar", "i32"), ("%rb32", "i32")])}
      {asm("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];", [("%slot", "i32"), ("%src", "i64"), ("%rb32", "i32"), ("%bar", "i32")])}
      {asm(wait, [("%bar", "i32"), ("%ph", "i32")])}
      {asm("cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;", [("%dst", "i64"), ("%slot", "i32"), ("%rb32", "i32")])}
      {asm("cp.async.bulk.commit_group;", [])}
      %nph = arith.xori %ph, %one : i32
      scf.yield %nph : i32
    }}
    // Every store has landed; fenced from the async proxy before the
    // CTA's notification (its readers may use either proxy).
    {asm("cp.async.bulk.wait_group 0;", [])}
    {asm("fence.proxy.async.global;", [])}
    {asm("mbarrier.inval.shared::cta.b64 [$0];", [("%bar", "i32")])}
  }}
  return
}}
"""

    return DeviceFunction.from_mlir(source, name, _permute_reference(K), block_size=block_size)


@checked_arguments
def release(E: int, *, name: str = "moe_release", block_size: int = 256) -> DeviceFunction:
    """Tile ``(e,)``: no work. It stands where :func:`permute` does when the
    gate/up tiles gather their rows from ``X`` themselves (``MoEConfig.gather``),
    so that expert ``e``'s trigger and its ``h_ready`` count keep their
    producer (an instance per expert, after the tables)."""
    _check_block(name, block_size)
    _positive(name, E=E)
    e1_t = f"memref<{E + 1}xi32>"
    source = f"""\
// {name}: releases expert e's gate/up tiles once the tables are written ({E} experts).
func.func @{name}(%e: index, %row_off: {e1_t}) {{
  return
}}
"""

    def reference(e: int, row_off: np.ndarray) -> None:
        return None

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


def _token_rows_loop(
    name: str, what: str, ZB: int, H: int, block_size: int, args: str, body: Callable[[str], str],
    sums: tuple[str, str] = ("%Out32", "f32"), unroll: int = 1,
) -> str:  # fmt: skip
    """A tile ``(i,)`` over tokens ``[i*ZB, min((i+1)*ZB, T))`` (T: dim 0 of
    the sums ``(argument, element type)``), a thread per 8-column chunk:
    ``body(u)`` with ``%t{u}``, ``%col{u}`` (``u``: ``""`` without unroll,
    else ``"_0"``, ``"_1"``, ...).
    ``unroll``: a thread takes that many chunks per step, their bodies' loads
    before any store (``body(u)`` returns ``(loads, stores)`` then; past the
    end the chunk is clamped for the loads and the stores are skipped)."""
    index = """\
    %dt{u} = arith.divui %q{u}, %cHC : index
    %ch{u} = arith.remui %q{u}, %cHC : index
    %t{u} = arith.addi %t0, %dt{u} : index
    %col{u} = arith.muli %ch{u}, %c8 : index"""
    if unroll == 1:
        step = index.format(u="") + "\n" + body("")
    else:
        heads, loads, stores = [], [], []
        for k in range(unroll):
            u = f"_{k}"
            heads.append(
                f"    %qu{u} = arith.addi %q, %cU{k} : index\n"
                f"    %q{u} = arith.minui %qu{u}, %last : index\n" + index.format(u=u)
            )
            got, put = body(u)
            loads.append(got)
            put = "\n".join("  " + line for line in put.splitlines())
            stores.append(
                f"    %ok{u} = arith.cmpi ult, %qu{u}, %total : index\n"
                f"    scf.if %ok{u} {{\n{put}\n    }}"
            )
        consts = "\n".join(
            f"  %cU{u} = arith.constant {u * block_size} : index" for u in range(unroll)
        )
        step = "\n".join(heads + loads + stores)
    head = (
        ""
        if unroll == 1
        else f"""\
{consts}
  %c1 = arith.constant 1 : index
"""
    )
    last = "" if unroll == 1 else "\n  %last = arith.subi %total, %c1 : index"
    return f"""\
// {name}: {what} ({ZB} tokens of hidden {H} per CTA of {block_size}{
        f", {unroll} chunks a thread per step" if unroll > 1 else ""
    }).
func.func @{name}(%i: index, {args}) {{
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %cZB = arith.constant {ZB} : index
  %cHC = arith.constant {H // 8} : index
  %cBS = arith.constant {block_size * unroll} : index
{head}  %tid = gpu.thread_id x
  %T = memref.dim {sums[0]}, %c0 : memref<?x{H}x{sums[1]}>
  %t0 = arith.muli %i, %cZB : index
  %t1a = arith.addi %t0, %cZB : index
  %t1 = arith.minui %t1a, %T : index
  %n = arith.subi %t1, %t0 : index
  %total = arith.muli %n, %cHC : index{last}
  scf.for %q = %tid to %total step %cBS {{
{step}
  }}
  return
}}
"""


def _sums(name: str, dtype: str) -> str:
    if dtype not in SUMS:
        raise GraphError(
            f"tile '{name}': dtype must be one of {', '.join(map(repr, SUMS))}, got {dtype!r}"
        )
    return SUMS[dtype][0]


@checked_arguments
def zero_rows(
    ZB: int, H: int, *, dtype: str = "f32", name: str = "moe_zero", block_size: int = 256
) -> DeviceFunction:
    """Tile ``(i,)``: ``Out32[t] = 0`` (``Out16`` for ``dtype="f16"``) for
    tokens ``[i*ZB, min((i+1)*ZB, T))`` (16-byte stores): the sums that down
    tiles with an atomic combine add into (``MoEConfig(combine="atomic")``)
    start at zero."""
    _check_block(name, block_size)
    _positive(name, ZB=ZB, H=H)
    _check_hidden(name, H)
    arg = _sums(name, dtype)
    f_t = f"memref<?x{H}x{dtype}>"

    def body(u: str) -> str:
        return f"""\
    %zero{u} = arith.constant dense<0.0> : vector<8x{dtype}>
    vector.store %zero{u}, %{arg}[%t{u}, %col{u}] {{alignment = 16 : i64}} : {f_t}, vector<8x{dtype}>"""

    source = _token_rows_loop(
        name, f"zero the {SUMS[dtype][1]} sums", ZB, H, block_size, f"%{arg}: {f_t}", body,
        (f"%{arg}", dtype),
    )  # fmt: skip

    def reference(i: int, sums: np.ndarray) -> None:
        sums[i * ZB : (i + 1) * ZB] = 0

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


@checked_arguments
def cast_rows(
    CB: int, H: int, *, dtype: str = "f32", unroll: int = 1, name: str = "moe_cast",
    block_size: int = 256,
) -> DeviceFunction:  # fmt: skip
    """Tile ``(i,)``: ``Out[t] = bf16(Out32[t])`` (``Out16`` for
    ``dtype="f16"``) for tokens ``[i*CB, min((i+1)*CB, T))``: the layer's
    output from the sums of an atomic combine (16-byte stores). A thread
    issues ``unroll`` chunks' loads before their stores: the loads in flight
    set the tile's bandwidth."""
    _check_block(name, block_size)
    _positive(name, CB=CB, H=H, unroll=unroll)
    _check_hidden(name, H)
    arg = _sums(name, dtype)
    f_t, x_t = f"memref<?x{H}x{dtype}>", f"memref<?x{H}xbf16>"

    def body(u: str):
        load = (
            f"vector.load %{arg}[%t{u}, %col{u}] {{alignment = 16 : i64}} : {f_t}, "
            f"vector<8x{dtype}>"
        )
        if dtype == "f16":  # widening is exact: one rounding, to bf16
            load = f"%s{u} = {load}\n    %v{u} = arith.extf %s{u} : vector<8xf16> to vector<8xf32>"
        else:
            load = f"%v{u} = {load}"
        store = f"""\
    %o{u} = arith.truncf %v{u} : vector<8xf32> to vector<8xbf16>
    vector.store %o{u}, %Out[%t{u}, %col{u}] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>"""
        return f"    {load}\n{store}" if unroll == 1 else (f"    {load}", store)

    source = _token_rows_loop(
        name, "the output in bf16", CB, H, block_size, f"%{arg}: {f_t}, %Out: {x_t}", body,
        (f"%{arg}", dtype), unroll,
    )  # fmt: skip

    def reference(i: int, sums: np.ndarray, Out: np.ndarray) -> None:
        Out[i * CB : (i + 1) * CB] = f32_to_bf16(sums[i * CB : (i + 1) * CB].astype(np.float32))

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


#: Tokens a :func:`route` tile is written for, unless told otherwise (its
#: workgroup copies of the choices hold ``max_tokens * K`` of them).
ROUTE_MAX_TOKENS = 64


@checked_arguments
def route(
    E: int,
    K: int,
    BM: int,
    NT: int,
    ND: int,
    *,
    max_tokens: int = ROUTE_MAX_TOKENS,
    splits: int = 1,
    tokens_from_ids: bool = False,
    name: str = "moe_route",
    block_size: int = 256,
) -> DeviceFunction:
    """Tile ``(i,)``, grid ``(1,)``: the routing of a few tokens (at most
    ``max_tokens``) in one CTA and one hop after the logits, the work of
    :func:`clear_counts`, :func:`router_topk` and :func:`plan` (three
    dependent hops).

    Each warp selects a token's top-K at a time (:func:`router_topk`'s warp
    arg-max) and writes ``topk_ids``/``topk_w``; its lanes count the choices
    per expert with workgroup atomics, the old value being the slot's
    position among the expert's rows (the order inside an expert is the
    atomics' order, as with :func:`router_topk`). Warp 0 scans the counts
    (:func:`plan`'s scan) into ``counts`` and the tables, and every thread
    then places slots: ``perm[r] = s``, ``inv[s] = r``. Nothing needs
    clearing first (the counts live in workgroup memory).

    One warp takes ``ceil(T / warps)`` tokens one after another: for
    decode (a few tokens), not prefill (see ``docs/moe.md``). ``splits``:
    the logits come in that many partial sums (as in :func:`router_topk`;
    ``tokens_from_ids`` too)."""
    warps = _check_block(name, block_size)
    _positive(name, E=E, K=K, BM=BM, NT=NT, ND=ND, max_tokens=max_tokens, splits=splits)
    _check_topk(name, E, K)
    slots = max_tokens * K
    smem = 4 * (2 * slots + 2 * E)  # choices, positions, counts, offsets
    if smem > MAX_SHARED_BYTES:
        raise GraphError(
            f"tile '{name}': max_tokens={max_tokens} x topk={K} choices need {smem} bytes of "
            f"workgroup memory (> {MAX_SHARED_BYTES}, what an sm_90 CTA can have); use "
            "the split route for that many tokens"
        )
    l_t, ids_t, tw_t = f"memref<?x{E}xf32>", f"memref<?x{K}xi32>", f"memref<?x{K}xf32>"
    e_t, e1_t, one_t, vec_t = (
        f"memref<{E}xi32>",
        f"memref<{E + 1}xi32>",
        "memref<1xi32>",
        "memref<?xi32>",
    )
    s_t, c_t = f"memref<{slots}xi32, {_WG}>", f"memref<{E}xi32, {_WG}>"
    body, consts, pick_id, pick_p, total = _topk_select(E, K, splits, l_t, "      ")
    source = f"""\
// {name}: MoE routing of up to {max_tokens} tokens ({E} experts, top-{K}, row blocks
// of {BM}): top-k, counts, tables and the row permutation; one CTA of {block_size}.
memref.global "private" @{name}__ids : {s_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__pos : {s_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__cnt : {c_t} {{alignment = 16 : i64}}
memref.global "private" @{name}__cursor : {c_t} {{alignment = 16 : i64}}
func.func @{name}(%i: index, %L: {l_t}, %ids: {ids_t}, %tw: {tw_t}, %counts: {e_t}, %row_off: {e1_t}, %gu: {e1_t}, %dn: {e1_t}, %hw: {e_t}, %dt: {one_t}, %perm: {vec_t}, %inv: {vec_t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c31 = arith.constant 31 : index
  %c32 = arith.constant 32 : index
  %cW = arith.constant {warps} : index
  %cBS = arith.constant {block_size} : index
  %cE = arith.constant {E} : index
  %cEm1 = arith.constant {E - 1} : index
  %cK = arith.constant {K} : index
  %cChunk = arith.constant {-(-E // 32)} : index
{consts}
{_SCAN_CONSTS}
{_text.shuffle_constants()}
{_table_consts(BM, NT, ND)}
  %ninf = arith.constant 0xFF800000 : f32
  %tid = gpu.thread_id x
  %warp = arith.divui %tid, %c32 : index
  %lane = arith.remui %tid, %c32 : index
  %is_warp0 = arith.cmpi eq, %warp, %c0 : index
  %writer = arith.cmpi ult, %lane, %cK : index
{_logit_rows(splits, l_t, ids_t if tokens_from_ids else None)}
  %N = arith.muli %T, %cK : index
  %ids_s = memref.get_global @{name}__ids : {s_t}
  %pos_s = memref.get_global @{name}__pos : {s_t}
  %cnt_s = memref.get_global @{name}__cnt : {c_t}
  %cursor = memref.get_global @{name}__cursor : {c_t}
  // A previous call on this CTA may still be reading the workgroup tables.
  gpu.barrier
  scf.for %x = %tid to %cE step %cBS {{
    memref.store %c0_i32, %cnt_s[%x] : {c_t}
  }}
  gpu.barrier
  scf.for %t = %warp to %T step %cW {{
{body}
    scf.if %writer {{
      %wmine = arith.divf {pick_p}, {total} : f32
      memref.store {pick_id}, %ids[%t, %lane] : {ids_t}
      memref.store %wmine, %tw[%t, %lane] : {tw_t}
      %st = arith.muli %t, %cK : index
      %s = arith.addi %st, %lane : index
      %en = arith.index_cast {pick_id} : i32 to index
      %p = memref.atomic_rmw addi %c1_i32, %cnt_s[%en] : (i32, {c_t}) -> i32
      memref.store {pick_id}, %ids_s[%s] : {s_t}
      memref.store %p, %pos_s[%s] : {s_t}
    }}
  }}
  gpu.barrier
  // Warp 0: the expert offsets, the tables.
{_warp0_tables("%cnt_s", c_t, c_t, e1_t, e_t, one_t, tables=None, counts_out="%counts")}
  gpu.barrier
  // Every slot's row: its expert's offset plus its position there.
  scf.for %s = %tid to %N step %cBS {{
    %e_i32 = memref.load %ids_s[%s] : {s_t}
    %e = arith.index_cast %e_i32 : i32 to index
    %base = memref.load %cursor[%e] : {c_t}
    %p = memref.load %pos_s[%s] : {s_t}
    %r_i32 = arith.addi %base, %p : i32
    %r = arith.index_cast %r_i32 : i32 to index
    %s_i32 = arith.index_cast %s : index to i32
    memref.store %s_i32, %perm[%r] : {vec_t}
    memref.store %r_i32, %inv[%s] : {vec_t}
  }}
  return
}}
"""

    def reference(
        i: int, L: np.ndarray, ids: np.ndarray, tw: np.ndarray, counts: np.ndarray,
        row_off: np.ndarray, gu: np.ndarray, dn: np.ndarray, hw: np.ndarray, dt: np.ndarray,
        perm: np.ndarray, inv: np.ndarray,
    ) -> None:  # fmt: skip
        T = ids.shape[0]
        ids[...], tw[...] = topk_from_logits(_summed_logits(L, splits, 0, T, T), K)
        tables = plan_tables(ids, BM, NT, ND, E)
        counts[...] = np.diff(tables["row_off"])
        for key, out in (
            ("row_off", row_off), ("gu_indptr", gu), ("dn_indptr", dn), ("h_wait", hw),
            ("dn_total", dt), ("perm", perm), ("inv", inv),
        ):  # fmt: skip
            out[...] = tables[key]

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)


# ----------------------------------------------------------------------------
# combine
# ----------------------------------------------------------------------------
@checked_arguments
def combine(
    CB: int, K: int, H: int, *, unroll: int = 1, direct: bool = False, name: str = "moe_combine",
    block_size: int = 256,
) -> DeviceFunction:  # fmt: skip
    """Tile ``(i,)``: ``Out[t] = bf16(sum_k topk_w[t, k] * Yp[inv[t*K + k]])``
    for tokens ``[i*CB, min((i+1)*CB, T))``; fp32 sum in k order, K unrolled,
    16-byte loads and stores. ``direct``: ``Yp`` is in slot order (``Yp[t*K +
    k]``, the slot tiles' rows) and the tile takes no ``inv``.

    A thread takes ``unroll`` (token, 8-column chunk) pairs per step and
    issues all their ``unroll * K`` row loads before the first sum: the
    rows come from HBM, so the loads in flight per thread set the tile's
    bandwidth (past the end the pair index is clamped for the loads and the
    store is skipped)."""
    _check_block(name, block_size)
    _positive(name, CB=CB, K=K, H=H, unroll=unroll)
    _check_hidden(name, H)
    x_t, tw_t, vec_t = f"memref<?x{H}xbf16>", f"memref<?x{K}xf32>", "memref<?xi32>"
    k_consts = "\n".join(f"  %c{k}_k = arith.constant {k} : index" for k in range(K))
    u_consts = "\n".join(
        f"  %cU{u} = arith.constant {u * block_size} : index" for u in range(unroll)
    )
    loads, sums = [], []
    for u in range(unroll):
        loads.append(
            f"    %q_{u} = arith.addi %qs, %cU{u} : index\n"
            f"    %qc_{u} = arith.minui %q_{u}, %last : index\n"
            f"    %dt_{u} = arith.divui %qc_{u}, %cHC : index\n"
            f"    %ch_{u} = arith.remui %qc_{u}, %cHC : index\n"
            f"    %col_{u} = arith.muli %ch_{u}, %c8 : index\n"
            f"    %t_{u} = arith.addi %t0, %dt_{u} : index\n"
            f"    %slot0_{u} = arith.muli %t_{u}, %cK : index"
        )
        for k in range(K):
            loads.append(
                f"    %s{k}_{u} = arith.addi %slot0_{u}, %c{k}_k : index\n"
                + (
                    f"    %r{k}_{u} = arith.addi %s{k}_{u}, %c0 : index\n"
                    if direct
                    else f"    %ri{k}_{u} = memref.load %inv[%s{k}_{u}] : {vec_t}\n"
                    f"    %r{k}_{u} = arith.index_cast %ri{k}_{u} : i32 to index\n"
                )
                + f"    %y{k}_{u} = vector.load %Yp[%r{k}_{u}, %col_{u}] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>"
            )
        acc = "%zero8"
        for k in range(K):
            sums.append(
                f"    %w{k}_{u} = memref.load %tw[%t_{u}, %c{k}_k] : {tw_t}\n"
                f"    %yf{k}_{u} = arith.extf %y{k}_{u} : vector<8xbf16> to vector<8xf32>\n"
                f"    %wb{k}_{u} = vector.broadcast %w{k}_{u} : f32 to vector<8xf32>\n"
                f"    %acc{k}_{u} = vector.fma %wb{k}_{u}, %yf{k}_{u}, {acc} : vector<8xf32>"
            )
            acc = f"%acc{k}_{u}"
        sums.append(
            f"    %o_{u} = arith.truncf {acc} : vector<8xf32> to vector<8xbf16>\n"
            f"    %ok_{u} = arith.cmpi ult, %q_{u}, %total : index\n"
            f"    scf.if %ok_{u} {{\n"
            f"      vector.store %o_{u}, %Out[%t_{u}, %col_{u}] {{alignment = 16 : i64}} : {x_t}, vector<8xbf16>\n"
            f"    }}"
        )
    inv_arg = "" if direct else f"%inv: {vec_t}, "
    source = f"""\
// {name}: weighted sum of each token's {K} expert rows (hidden {H}), {CB} tokens per CTA of {block_size}.
func.func @{name}(%i: index, %tw: {tw_t}, {inv_arg}%Yp: {x_t}, %Out: {x_t}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %cSTEP = arith.constant {unroll * block_size} : index
  %cCB = arith.constant {CB} : index
  %cK = arith.constant {K} : index
  %cHC = arith.constant {H // 8} : index
{k_consts}
{u_consts}
  %zero8 = arith.constant dense<0.0> : vector<8xf32>
  %tid = gpu.thread_id x
  %T = memref.dim %Out, %c0 : {x_t}
  %t0 = arith.muli %i, %cCB : index
  %t1a = arith.addi %t0, %cCB : index
  %t1 = arith.minui %t1a, %T : index
  %n = arith.subi %t1, %t0 : index
  %total = arith.muli %n, %cHC : index
  %last = arith.subi %total, %c1 : index
  scf.for %qs = %tid to %total step %cSTEP {{
{chr(10).join(loads)}
{chr(10).join(sums)}
  }}
  return
}}
"""

    def reference(i: int, tw: np.ndarray, *rest: np.ndarray) -> None:
        inv, Yp, Out = (None, *rest) if direct else rest
        t0, t1 = i * CB, min((i + 1) * CB, Out.shape[0])
        if t0 >= t1:
            return
        acc = np.zeros((t1 - t0, Out.shape[1]), np.float32)
        for k in range(K):
            slots = np.arange(t0, t1) * K + k
            rows = slots if direct else inv[slots]
            acc += tw[t0:t1, k : k + 1] * bf16_to_f32(Yp[rows])
        Out[t0:t1] = f32_to_bf16(acc)

    return DeviceFunction.from_mlir(source, name, reference, block_size=block_size)

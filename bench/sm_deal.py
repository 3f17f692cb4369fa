"""Static queues dealt by SM (``Kernel.deal_by_sm``) against round-robin, on
the traced default decoder: where each CTA ran comes from a trace's records.

    python bench/sm_deal.py --build DIR                  # CPU: the decoders below
    python bench/sm_deal.py --artifacts DIR --out OUT    # GPU: placement, A/B timings, windows
    SM_DEAL_UNTRACED=1 python bench/sm_deal.py --artifacts DIR --out OUT   # GPU: sm_slices A/B

Per batch size (``SM_DEAL_BATCHES``, context ``SM_DEAL_CONTEXT``): three
traced launches, each CTA's SM read from each (is the placement the same
from launch to launch?); then, alternating, round-robin (``cta``) and each
``etc.runtime.queue.SM_DEALS`` deal by the placement of the last launch:
CUDA-event medians of back-to-back traced launches, how many CTAs ran on
another SM than the deal assumed, and the stage windows of layer 8
(``bench/trace_analysis.py placement``'s view) from the last launch of each.
The trace's own cost is in every variant alike.

``SM_DEAL_UNTRACED=1``: the decoder with its large-batch kernel compiled
with ``sm_slices`` (each CTA takes its list by SM) and the default decoder
(its kernels record their CTAs' SMs at exit, and the runtime deals the
launches after the first synchronised one by that record), each dealt by SM
and round-robin, untraced. (In the first run of this mode, 2026-12-02, the
first was the default, named ``default``.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import timed, two_step_main  # noqa: E402
from etc.models import llama as M  # noqa: E402
from etc.runtime.queue import SM_DEALS  # noqa: E402

CFG = M.LLAMA_3_2_1B
BATCHES = tuple(int(b) for b in os.environ.get("SM_DEAL_BATCHES", "1,8,64").split(","))
L = int(os.environ.get("SM_DEAL_CONTEXT", "1024"))
CALLS = 10
LAYER = 8


def build(out: Path) -> None:
    # Without sm_slices: the trace-placement deal needs kernels that run list
    # c on CTA c.
    M.compile_decoder(CFG, "static", trace=True).save(out / "traced")
    # The default decoder with its large-batch kernel compiled with
    # sm_slices, and the default, for the untraced A/B (``SM_DEAL_UNTRACED=1``).
    large = (None, (*M.LARGE_BATCH, ("sm_slices", True)))
    slices = dataclasses.replace(CFG, batch_buckets=(*CFG.batch_buckets[:-1], large))
    M.compile_decoder(slices, "static").save(out / "slices")
    M.compile_decoder(CFG, "static").save(out / "no_slices")


def untraced(artifacts: Path, torch, weights, reps: int, say) -> list[dict]:
    """The artifact whose large-batch kernel has sm_slices, dealt by SM and
    round-robin (``deal_by_sm(None)``), and the default (no sm_slices),
    alternating, two passes."""
    import etc.runtime

    kernels = {n: etc.runtime.load(artifacts / n) for n in ("slices", "no_slices")}
    rows = []
    for B in BATCHES:
        bufs = M.torch_inputs(CFG, weights, B, L, L + 1)
        syms = {"B": B, "L": L, "S": L + 1}
        ref = None
        variants = [("slices", "spread"), ("slices", None), ("no_slices", "spread")]
        for name, how in [*variants, ("no_slices", None)] * 2:
            kernel = kernels[name].kernel_for(syms)
            kernel.deal_by_sm(how)  # no_slices/spread: by the first launch's record
            kernel.launch(bufs, syms)
            tokens = bufs["next_tokens"].clone()
            ref = tokens if ref is None else ref
            us = timed(
                torch, lambda i, k=kernel, b=bufs, s=syms: k.launch(b, s, sync=False), CALLS, reps
            )
            kernel.check()
            label = (
                f"{name}/{how or 'cta'}" if kernel.manifest.sm_slices else f"{name}/no sm_slices"
            )
            say(
                f"B={B:3d} L={L} {label:20s} {us:8.1f} us  tokens as the first's: "
                f"{bool(torch.equal(tokens, ref))}"
            )
            rows.append({"B": B, "L": L, "variant": label, "us": us})
        del bufs
        torch.cuda.empty_cache()
    return rows


def sm_of_ctas(trace) -> np.ndarray:
    """The SM of each CTA in a trace (every CTA of a full grid ran something)."""
    sm: dict[int, int] = {}
    for e in trace.events():
        sm.setdefault(e["cta"], e["sm"])
    return np.array([sm[c] for c in range(max(sm) + 1)], dtype=np.int64)


def run(artifacts: Path, out: Path | None, reps: int) -> None:
    import torch

    import etc.runtime
    from bench.trace_analysis import placement as placement_view  # puts python/ first: GPU side

    weights = M.random_weights_torch(CFG)
    rows, lines = [], []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    if os.environ.get("SM_DEAL_UNTRACED") == "1":
        rows = untraced(artifacts, torch, weights, reps, say)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"sm_slices_L{L}.json").write_text(json.dumps(rows, indent=1))
            (out / f"sm_slices_L{L}.txt").write_text("\n".join(lines) + "\n")
        return
    bucketed = etc.runtime.load(artifacts / "traced")

    for B in BATCHES:
        bufs = M.torch_inputs(CFG, weights, B, L, L + 1)
        syms = {"B": B, "L": L, "S": L + 1}
        kernel = bucketed.kernel_for(syms)
        seen = []
        for _ in range(3):
            kernel.launch(bufs, syms)
            seen.append(sm_of_ctas(kernel.trace()))
        kernel.check()
        same = all(len(s) == len(seen[0]) and (s == seen[0]).all() for s in seen)
        say(f"== B={B} L={L}: {len(seen[0])} CTAs, placement the same in 3 launches: {same}")
        ref = None
        for deal in ["cta", *SM_DEALS] * 2:
            kernel.deal_by_sm(
                None if deal == "cta" else seen[-1], "spread" if deal == "cta" else deal
            )
            us = timed(
                torch, lambda i, k=kernel, b=bufs, s=syms: k.launch(b, s, sync=False), CALLS, reps
            )
            kernel.launch(bufs, syms)
            trace = kernel.trace()
            kernel.check()
            moved = int((sm_of_ctas(trace) != seen[-1]).sum())
            tokens = bufs["next_tokens"].clone()
            ref = tokens if ref is None else ref
            say(
                f"B={B:3d} {deal:7s} {us:8.1f} us (traced)  CTAs on another SM than dealt for: "
                f"{moved}  tokens as round-robin's: {bool(torch.equal(tokens, ref))}"
            )
            for line in placement_view(trace, LAYER)[2:]:
                say(f"    {line}")
            head = [e for e in trace.events() if e["task"] == "lm_head"]
            if head:
                t0 = min(e["start_ns"] for e in head)
                ends = [(e["end_ns"] - t0) / 1e3 for e in head]
                say(f"    lm_head window {max(ends):.2f} (median end {np.median(ends):.2f})")
            rows.append({"B": B, "L": L, "deal": deal, "us": us, "moved": moved})
        kernel.deal_by_sm(None)
        del bufs
        torch.cuda.empty_cache()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"sm_deal_L{L}.json").write_text(json.dumps(rows, indent=1))
        (out / f"sm_deal_L{L}.txt").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    return two_step_main(__doc__.splitlines()[0], build, run, argv, reps=7)


if __name__ == "__main__":
    raise SystemExit(main())

"""Llama-3.2-1B decode (issue 7): one ETC launch per step against PyTorch.

Two steps, because the GPU machine has no compiler:

    python bench/decode.py --build DIR                    # CPU: compile (timed)
    python bench/decode.py --artifacts DIR --out OUTDIR   # GPU: check, time, warm up

Correctness (before any timing): random bf16 weights (N(0, 0.02), the
residual-stream projections scaled by 1/sqrt(2 layers), norm weights
1 + N(0, 0.1), tied embeddings), a random prompt of PROMPT tokens (B=2)
fed one decode step at a time (filling the caches), then GENERATED greedy
steps. Every step's logits are compared with Hugging Face's
``LlamaForCausalLM`` built from a ``LlamaConfig`` with the same weights, in
bf16 and in float32, run over the same token sequence (relative error
||etc - hf|| / ||hf|| per sequence and step; max and mean), and ETC's
greedy tokens with ``model.generate(do_sample=False)``'s (steps for which
both sequences agree). HF bf16 against HF float32 is reported too: the
bf16 rounding noise of the model itself. Random weights give nearly flat
logits, so free-running sequences part at near-ties; step by step over the
same tokens the check also reports how often the greedy tokens agree and,
where they do not, the reference's margin between its token and ETC's in
standard deviations of its logits, beside ETC's mean logit error in the
same units (a disagreement within that error is a tie at bf16 precision).
The last step is then launched REPEATS more times over the same inputs: its
logits must be bit-identical (``bitwise_repeatable``).

Timing: batch B in BATCHES, context L in CONTEXTS (the caches hold L random
tokens; the step writes position L). ETC static and dynamic (one launch per
step), PyTorch eager (:func:`etc.models.llama.torch_decode_step`, the same
math over the same buffers), the same step replayed from one CUDA graph, and
``torch.compile(mode="reduce-overhead")`` (at ``--compile-batches`` and
``--compile-contexts``, B = 1 and 64 at L = 1024 by default: each shape
compiles anew). Medians of REPS repetitions of CALLS back-to-back steps
between CUDA events after a warm-up; the device copy bandwidth (2 GiB copy)
in the same run. Achieved bandwidth = (weights + KV cache read) / time.

The artifact holds one kernel per batch range (``LlamaConfig.batch_buckets``:
B=1, 2..16 and 17.. by default, :func:`etc.models.llama.compile_decoder`),
loaded together and picked at each launch by B.

Warm-up: in fresh processes, ETC's imports, then artifact load + first step
(B=1) and a second batch size (B=64, no recompilation), against PyTorch
capturing CUDA graphs of the minimal step for 52 batch sizes (1..512).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from etc.models import llama as M  # noqa: E402

BATCHES = (1, 8, 32, 64)
#: ``DECODE_BATCHES=8`` times only those.
if os.environ.get("DECODE_BATCHES"):
    BATCHES = tuple(int(b) for b in os.environ["DECODE_BATCHES"].split(","))
CONTEXTS = (1024, 4096)
PROMPT, GENERATED = 16, 32
TOLERANCE = 2e-2
CALLS = 10
CAPTURE_SIZES = sorted({1, 2, 4, 12} | set(range(8, 257, 8)) | set(range(272, 513, 16)))
SCHEDULES = ("static", "dynamic")


def _changes(artifacts: Path) -> dict:
    """The LlamaConfig fields the artifacts were built with (``build``)."""
    ct = artifacts / "compile_times.json"
    return json.loads(ct.read_text()).get("config_changes", {}) if ct.exists() else {}


def build(out: Path, cfg: M.LlamaConfig = M.LLAMA_3_2_1B) -> dict:
    t0 = time.perf_counter()
    M.build_decoder_graph(cfg)
    times = {"graph_s": time.perf_counter() - t0, "kernels": len(cfg.kernel_configs())}
    for schedule in SCHEDULES:
        # Graph construction and compilation of every batch range's kernel.
        t0 = time.perf_counter()
        art = M.compile_decoder(cfg, schedule)
        times[f"compile_{schedule}_s"] = time.perf_counter() - t0
        art.save(out / schedule)
    times["config_changes"] = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if getattr(cfg, f.name) != getattr(M.LLAMA_3_2_1B, f.name)
    }
    (out / "compile_times.json").write_text(json.dumps(times, indent=1, default=str))
    print(json.dumps(times))
    return times


# -- GPU ---------------------------------------------------------------------------


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


#: Launches of one step over the same inputs in the reproducibility check.
REPEATS = 8


def _prefix(a, b) -> int:
    """Steps for which every row of two (B, steps) token tensors agrees."""
    return int((a == b).all(dim=0).long().cumprod(0).sum())


def _argmax_margins(torch, logits, ref, name) -> dict:
    """Step by step over the same tokens: how often ETC's greedy token is the
    reference's, and where not, how near a tie the reference had: its best
    logit minus its logit of ETC's token, in units of the row's standard
    deviation, beside ETC's typical logit error in the same units."""
    agree, margins, errors = 0, [], []
    for k, etc_logits in enumerate(logits):
        for b in range(etc_logits.shape[0]):
            mine, theirs = etc_logits[b].float(), ref[b, k].float()
            scale = theirs.std()
            errors.append(float((mine - theirs).abs().mean() / scale))
            pick = int(mine.argmax())
            if pick == int(theirs.argmax()):
                agree += 1
            else:
                margins.append(float((theirs.max() - theirs[pick]) / scale))
    return {
        f"argmax_agree_vs_{name}": agree / len(errors),
        f"disagree_margin_max_vs_{name}": max(margins, default=0.0),
        f"logit_error_vs_{name}": sum(errors) / len(errors),
    }


def check(torch, kernels, cfg, weights, log) -> dict:
    """Prompt + greedy decode with ETC, compared with Hugging Face's model in
    bf16 and in float32 (the same bf16 weights upcast)."""
    from transformers import LlamaForCausalLM

    # DECODE_CHECK_BATCH=1: the B = 1 kernel's check (default B = 2: the
    # B = 2..16 kernel's).
    B, S = int(os.environ.get("DECODE_CHECK_BATCH", "2")), PROMPT + GENERATED
    models = {}
    for name, dtype in (("hf_bf16", torch.bfloat16), ("hf_fp32", torch.float32)):
        hf = LlamaForCausalLM(M.hf_config(cfg)).to(dtype=dtype, device="cuda").eval()
        sd = {k: v.to(dtype) for k, v in M.hf_state_dict(cfg, weights).items()}
        missing = hf.load_state_dict(sd, strict=False)
        assert not missing.unexpected_keys, missing
        models[name] = hf
    gen = torch.Generator(device="cuda").manual_seed(7)
    prompt = torch.randint(0, cfg.vocab, (B, PROMPT), device="cuda", generator=gen)
    greedy = {}
    with torch.no_grad():
        for name, hf in models.items():
            greedy[name] = hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=GENERATED,
                min_new_tokens=GENERATED,
                do_sample=False,
                pad_token_id=0,
            )[:, PROMPT:]
    result = {"hf_bf16_vs_fp32_greedy_identical": _prefix(greedy["hf_bf16"], greedy["hf_fp32"])}
    for schedule, kernel in kernels.items():
        bufs = M.torch_inputs(cfg, weights, B, 0, S, fill_cache=False)
        seq, logits = [prompt[:, k] for k in range(PROMPT)], []
        # The step at position L consumes seq[L]; from the prompt's last
        # token on, its logits and greedy token are the generated ones.
        for L in range(PROMPT + GENERATED - 1):
            bufs["tokens"].copy_(seq[L])
            kernel.launch(bufs, {"B": B, "L": L, "S": S})
            kernel.check()
            if L >= PROMPT - 1:
                logits.append(bufs["logits"].clone())
                seq.append(bufs["next_tokens"].long().clone())
        tokens = torch.stack(seq, dim=1)  # prompt + GENERATED
        # The last step again, REPEATS times over the same inputs: bit-identical
        # logits, whatever order the tiles' atomic adds land in.
        last = PROMPT + GENERATED - 2
        bufs["tokens"].copy_(seq[last])
        again = []
        for _ in range(REPEATS):
            kernel.launch(bufs, {"B": B, "L": last, "S": S})
            again.append(bufs["logits"].clone())
        kernel.check()
        repeatable = all(torch.equal(again[0], a) for a in again[1:])
        refs = {}
        with torch.no_grad():
            for name, hf in models.items():
                refs[name] = hf(tokens[:, : PROMPT + GENERATED - 1]).logits[:, PROMPT - 1 :]
        row = {}
        for name, ref in refs.items():
            errs = [_rel(logits[k][b], ref[b, k]) for k in range(GENERATED) for b in range(B)]
            row[f"rel_err_vs_{name}_max"] = max(errs)
            row[f"rel_err_vs_{name}_mean"] = sum(errs) / len(errs)
        errs = [
            _rel(refs["hf_bf16"][b, k], refs["hf_fp32"][b, k])
            for k in range(GENERATED)
            for b in range(B)
        ]
        row["hf_bf16_rel_err_vs_hf_fp32_max"] = max(errs)
        row["hf_bf16_rel_err_vs_hf_fp32_mean"] = sum(errs) / len(errs)
        for name, ref in refs.items():
            row.update(_argmax_margins(torch, logits, ref, name))
        for name in models:
            row[f"greedy_identical_vs_{name}"] = _prefix(tokens[:, PROMPT:], greedy[name])
        row["of"] = GENERATED
        row["bitwise_repeatable"] = repeatable
        result[schedule] = row
        log(f"{schedule}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()))
    log(
        f"HF bf16 vs HF fp32 greedy identical for {result['hf_bf16_vs_fp32_greedy_identical']} steps"
    )
    del models
    torch.cuda.empty_cache()
    return result


#: The caches the compiled step keeps as one buffer a layer.
_CACHES = ("k_cache", "v_cache")


def _StepModule(cfg, bufs, L):
    """The step as a module whose buffers are ``bufs``, each cache split into
    one buffer a layer (copies: session 37 found inductor rewriting the
    whole 16-layer buffer for each layer's one-position write)."""
    import torch

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, value in bufs.items():
                if name in _CACHES:
                    for layer in range(cfg.layers):
                        self.register_buffer(
                            f"{name}{layer}", value[layer].clone(), persistent=False
                        )
                else:
                    self.register_buffer(name, value, persistent=False)

        def forward(self):
            t = {n: getattr(self, n) for n in bufs if n not in _CACHES}
            for name in _CACHES:
                t[name] = [getattr(self, f"{name}{layer}") for layer in range(cfg.layers)]
            return M.torch_decode_step(cfg, t, L)

    return Step()


def time_all(
    torch, kernels, cfg, weights, reps, log, compile_batches, compile_contexts=(1024,)
) -> list:
    from bench.splitk import copy_bandwidth
    from bench.timing import gpu_timed, timed

    copy_bps = copy_bandwidth(torch, reps)
    log(f"copy bandwidth {copy_bps / 1e12:.3f} TB/s")
    weights = M.graph_weights(cfg, weights)  # folded once, shared by every shape's buffers
    rows = []
    for L in CONTEXTS:
        for B in BATCHES:
            S = L + 1
            bufs = M.torch_inputs(cfg, weights, B, L, S)
            nbytes = M.weight_bytes(cfg) + M.kv_bytes(cfg, B, L)
            row = {"B": B, "L": L, "bytes": nbytes, "floor_us": nbytes / copy_bps * 1e6}
            # Correctness first: ETC's tokens against the PyTorch step's.
            with torch.no_grad():
                want = M.torch_decode_step(cfg, bufs, L).clone()
            for schedule, kernel in kernels.items():
                kernel.launch(bufs, {"B": B, "L": L, "S": S})
                kernel.check()
                agree = float((bufs["next_tokens"].long() == want).float().mean())
                row[f"etc_{schedule}_token_agreement"] = agree

                def step(i, kernel=kernel, bufs=bufs, B=B, L=L, S=S):
                    kernel.launch(bufs, {"B": B, "L": L, "S": S}, sync=False)

                row[f"etc_{schedule}_us"] = timed(torch, step, CALLS, reps)
                row[f"etc_{schedule}_gpu_us"] = gpu_timed(torch, step, CALLS, reps)

            def eager(i, bufs=bufs, L=L):
                with torch.no_grad():
                    M.torch_decode_step(cfg, bufs, L)

            row["torch_eager_us"] = timed(torch, eager, CALLS, reps)
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.no_grad():
                for _ in range(3):
                    M.torch_decode_step(cfg, bufs, L)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph), torch.no_grad():
                M.torch_decode_step(cfg, bufs, L)
            row["torch_graph_us"] = timed(torch, lambda i, g=graph: g.replay(), CALLS, reps)
            del graph
            if L in compile_contexts and B in compile_batches:
                try:
                    t0 = time.perf_counter()
                    # The buffers as a module's buffers: inductor's CUDA
                    # graphs accept mutations of those (the cache writes),
                    # not of plain inputs; the caches a buffer a layer
                    # (one 16-layer buffer made the step slower than eager
                    # at B > 1: bench/RESULTS.md item 169).
                    compiled = torch.compile(_StepModule(cfg, bufs, L), mode="reduce-overhead")
                    with torch.no_grad():
                        for _ in range(3):
                            compiled()
                    torch.cuda.synchronize()
                    row["torch_compile_s"] = time.perf_counter() - t0

                    def comp(i, compiled=compiled):
                        with torch.no_grad():
                            compiled()

                    row["torch_compile_us"] = timed(torch, comp, CALLS, reps)
                except Exception as exc:  # noqa: BLE001
                    row["torch_compile_us"] = f"failed: {exc}"[:300]
            torch_best = min(
                v
                for k, v in row.items()
                if k.startswith("torch_") and k.endswith("_us")
                if isinstance(v, float)
            )
            etc_best = min(row[f"etc_{s}_us"] for s in kernels)
            row["speedup_vs_best_torch"] = torch_best / etc_best
            row["etc_bandwidth_fraction"] = row["floor_us"] / etc_best
            log(
                f"B={B:3d} L={L:5d} floor {row['floor_us']:7.1f} | "
                + " ".join(
                    f"{k[:-3]} {v:7.1f}"
                    for k, v in row.items()
                    if k.endswith("_us") and k != "floor_us" and isinstance(v, float)
                )
                + f" | x{row['speedup_vs_best_torch']:.2f} vs best torch, "
                f"{100 * row['etc_bandwidth_fraction']:.0f}% of copy-bandwidth floor, "
                + " ".join(
                    f"{s} tokens agree {row[f'etc_{s}_token_agreement']:.2f}" for s in kernels
                )
            )
            rows.append(row)
            del bufs
            torch.cuda.empty_cache()
    return rows


_ETC_WARMUP = r"""
import sys, time, json
t0 = time.perf_counter()
import torch
import etc.runtime
from etc.models import llama as M
t_import = time.perf_counter() - t0
cfg = M.LlamaConfig.from_changes(json.loads(sys.argv[2]))
weights = M.random_weights_torch(cfg)
torch.cuda.synchronize()
out = {"imports_s": t_import}
t0 = time.perf_counter()
kernel = etc.runtime.load(sys.argv[1])
out["load_s"] = time.perf_counter() - t0
for B in (1, 64):
    bufs = M.torch_inputs(cfg, weights, B, 1024, 1025)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    kernel.launch(bufs, {"B": B, "L": 1024, "S": 1025})
    kernel.check()
    out[f"first_step_B{B}_s"] = time.perf_counter() - t1
    if B == 1:
        out["load_and_first_step_s"] = time.perf_counter() - t0
print(json.dumps(out))
"""

_TORCH_WARMUP = r"""
import sys, time, json
t0 = time.perf_counter()
import torch
from etc.models import llama as M
t_import = time.perf_counter() - t0
cfg = M.LLAMA_3_2_1B
weights = M.random_weights_torch(cfg)
sizes = json.loads(sys.argv[1])
L = 1024
big = M.torch_inputs(cfg, weights, max(sizes), L, L + 1, fill_cache=False)
torch.cuda.synchronize()
t0 = time.perf_counter()
graphs = {}
pool = None
for B in sorted(sizes, reverse=True):
    bufs = dict(big)
    for k in ("tokens", "h", "x", "qkv", "attn", "act", "logits", "next_tokens", "opart", "mpart"):
        bufs[k] = big[k][:B]
    bufs["k_cache"] = big["k_cache"][:, :B]
    bufs["v_cache"] = big["v_cache"][:, :B]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        M.torch_decode_step(cfg, bufs, L)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool), torch.no_grad():
        M.torch_decode_step(cfg, bufs, L)
    pool = g.pool()
    graphs[B] = g
graphs[1].replay()
torch.cuda.synchronize()
print(json.dumps({"imports_s": t_import, "captures": len(graphs),
                  "capture_and_first_step_s": time.perf_counter() - t0}))
"""


def warmup(artifacts: Path, log) -> dict:
    import os

    env = {**os.environ, "PYTHONPATH": f"{REPO / 'python'}:{REPO}"}
    out = {}
    for name, code, *args in (
        ("etc_static", _ETC_WARMUP, str(artifacts / "static"), json.dumps(_changes(artifacts))),
        ("torch_graphs", _TORCH_WARMUP, json.dumps(CAPTURE_SIZES)),
    ):
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=400,
        )
        if done.returncode:
            out[name] = f"failed: {done.stderr[-800:]}"
        else:
            out[name] = json.loads(done.stdout.strip().splitlines()[-1])
        log(f"warm-up {name}: {out[name]}")
    return out


def run(
    artifacts: Path,
    out: Path | None,
    reps: int,
    parts: list[str],
    compile_batches,
    compile_contexts=(1024,),
) -> None:
    import torch

    import etc.runtime

    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    cfg = M.LlamaConfig.from_changes(_changes(artifacts))
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "method": __doc__,
    }
    ct = artifacts / "compile_times.json"
    if ct.exists():
        results["compile"] = json.loads(ct.read_text())
    kernels = {s: etc.runtime.load(artifacts / s) for s in SCHEDULES}
    weights = M.random_weights_torch(cfg)
    if "check" in parts:
        results["check"] = check(torch, kernels, cfg, weights, log)
    if "time" in parts:
        results["timing"] = time_all(
            torch, kernels, cfg, weights, reps, log, compile_batches, compile_contexts
        )
    if "warmup" in parts:
        del kernels, weights
        torch.cuda.empty_cache()
        results["warmup"] = warmup(artifacts, log)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "decode.txt").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", type=Path, help="compile the artifacts into this directory")
    p.add_argument("--artifacts", type=Path, help="run with the artifacts in this directory")
    p.add_argument("--out", type=Path, help="write decode.json / decode.txt here")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--parts", default="check,time,warmup")
    p.add_argument("--compile-batches", default="1,64", help="torch.compile at these B")
    p.add_argument("--compile-contexts", default="1024", help="... and these L")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="build: a LlamaConfig field (Python literal), e.g. prefetch_next=True",
    )
    args = p.parse_args(argv)
    if not (args.build or args.artifacts):
        p.error("give --build DIR and/or --artifacts DIR")
    if args.build:
        changes = {}
        for item in args.set:
            field, _, value = item.partition("=")
            if field not in {f.name for f in dataclasses.fields(M.LlamaConfig)}:
                p.error(f"--set {item}: LlamaConfig has no field {field!r}")
            try:
                changes[field] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                p.error(f"--set {item}: {value!r} is not a Python literal")
        build(args.build, dataclasses.replace(M.LLAMA_3_2_1B, **changes))
    if args.artifacts:
        batches = [int(b) for b in args.compile_batches.split(",") if b]
        contexts = [int(c) for c in args.compile_contexts.split(",") if c]
        run(args.artifacts, args.out, args.reps, args.parts.split(","), batches, contexts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
